package main

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// Value ids as kv_history.c makes them: epoch<<40 | client<<32 | n.
func vid(epoch, client, n uint64) uint64 { return epoch<<40 | client<<32 | n }

// writeHistory writes client logs (file name -> contents) into a fresh folder.
func writeHistory(t *testing.T, logs map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range logs {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func check(t *testing.T, dir string) (porcupine.CheckResult, *History) {
	t.Helper()
	h, err := LoadHistory(dir)
	if err != nil {
		t.Fatal(err)
	}
	res, info := porcupine.CheckOperationsVerbose(KVModel, h.Ops, 10*time.Second)
	if res == porcupine.Illegal {
		for _, line := range Explain(h, info) {
			t.Log(line)
		}
		if err := porcupine.VisualizePath(KVModel, info, filepath.Join(dir, "viz.html")); err != nil {
			t.Errorf("visualization: %v", err)
		}
	}
	return res, h
}

// Two processes (epochs): the first is killed with one PUT per client in
// flight; the second reads. Racing writes, reads in between, one cut-off PUT
// that took effect and one that did not: linearizable.
func TestLinearizableAcrossCrash(t *testing.T) {
	a1, a2 := vid(1, 0, 1), vid(1, 0, 2)
	b1, b2 := vid(1, 1, 1), vid(1, 1, 2)
	dir := writeHistory(t, map[string]string{
		// epoch 1, client 0: put a1 (acked), put a2 (cut off by the kill)
		"client-100-0.log": "I 1 0 0 GET 0 10\nR 1 0 20\n" +
			"I 2 0 0 PUT " + u(a1) + " 30\nR 2 0 60\n" +
			"I 3 0 0 PUT " + u(a2) + " 70\n",
		// epoch 1, client 1: put b1 racing a1, read a1 or b1, put b2 cut off
		"client-100-1.log": "I 1 1 0 PUT " + u(b1) + " 40\nR 1 0 50\n" +
			"I 2 1 0 GET 0 65\nR 2 " + u(a1) + " 68\n" +
			"I 3 1 0 PUT " + u(b2) + " 75\n" +
			"I 4 1 1 GET 0 76\n", // a GET cut off: dropped
		// epoch 2 (after recovery): b2 survived, a2 was lost
		"client-200-0.log": "I 1 0 0 GET 0 1000\nR 1 " + u(b2) + " 1010\n" +
			"I 2 0 1 GET 0 1020\nR 2 0 1030\n",
	})
	res, h := check(t, dir)
	if res != porcupine.Ok {
		t.Fatalf("want Ok, got %s", res)
	}
	if len(h.Ops) != 8 || h.Pending != 2 || h.PendingGets != 1 || h.Keys != 2 || h.Procs != 2 {
		t.Fatalf("parsed ops=%d pending=%d pending_gets=%d keys=%d procs=%d", len(h.Ops), h.Pending,
			h.PendingGets, h.Keys, h.Procs)
	}
}

// A PUT cut off by a crash is lost (the next process reads the value before
// it), then shows up after all: not linearizable. Return = MaxInt64 alone
// would accept this; the model's process numbers reject it.
func TestLostInFlightWriteResurrected(t *testing.T) {
	v1, v2 := vid(1, 0, 1), vid(1, 0, 2)
	logs := map[string]string{
		"client-100-0.log": "I 1 0 2 PUT " + u(v1) + " 10\nR 1 0 20\n" +
			"I 2 0 2 PUT " + u(v2) + " 30\n", // cut off by the kill
		"client-200-0.log": "I 1 0 2 GET 0 1000\nR 1 " + u(v1) + " 1010\n",
		"client-300-0.log": "I 1 0 2 GET 0 2000\nR 1 " + u(v2) + " 2010\n",
	}
	if res, _ := check(t, writeHistory(t, logs)); res != porcupine.Illegal {
		t.Fatalf("resurrected write: want Illegal, got %s", res)
	}
	// Without the second process's read, v2 may have taken effect before
	// the crash: linearizable.
	delete(logs, "client-200-0.log")
	if res, _ := check(t, writeHistory(t, logs)); res != porcupine.Ok {
		t.Fatalf("in-flight write that survived: want Ok, got %s", res)
	}
}

// Worker processes must not overlap in time (each is killed before the next
// starts): otherwise the log is not a crash history.
func TestOverlappingProcessesAreAnError(t *testing.T) {
	dir := writeHistory(t, map[string]string{
		"client-100-0.log": "I 1 0 0 GET 0 10\nR 1 0 50\n",
		"client-200-0.log": "I 1 0 0 GET 0 20\nR 1 0 30\n",
	})
	if _, err := LoadHistory(dir); err == nil {
		t.Fatal("want an error for overlapping processes")
	}
}

// A read returns an older value after a newer write was acknowledged and
// read: a stale read, not linearizable.
func TestStaleReadAfterAcknowledgedWrite(t *testing.T) {
	v1, v2 := vid(1, 0, 1), vid(1, 0, 2)
	dir := writeHistory(t, map[string]string{
		"client-100-0.log": "I 1 0 3 PUT " + u(v1) + " 10\nR 1 0 20\n" +
			"I 2 0 3 PUT " + u(v2) + " 30\nR 2 0 40\n",
		"client-100-1.log": "I 1 1 3 GET 0 50\nR 1 " + u(v1) + " 60\n",
	})
	if res, _ := check(t, dir); res != porcupine.Illegal {
		t.Fatalf("stale read: want Illegal, got %s", res)
	}
}

// An acknowledged PUT is missing after the crash: the next process reads the
// value before it (or nothing). This is what a commit without a sync does.
func TestAcknowledgedWriteLostAcrossCrash(t *testing.T) {
	v1, v2 := vid(1, 0, 1), vid(1, 0, 2)
	for _, after := range []uint64{v1, 0} {
		dir := writeHistory(t, map[string]string{
			"client-100-0.log": "I 1 0 5 PUT " + u(v1) + " 10\nR 1 0 20\n" +
				"I 2 0 5 PUT " + u(v2) + " 30\nR 2 0 40\n" +
				"I 3 0 5 PUT " + u(vid(1, 0, 3)) + " 50\n", // in flight at the kill: may be lost
			"client-200-0.log": "I 1 0 5 GET 0 1000\nR 1 " + u(after) + " 1010\n",
		})
		if res, _ := check(t, dir); res != porcupine.Illegal {
			t.Fatalf("read %s after the crash: want Illegal, got %s", describeValue(after), res)
		}
	}
}

// A read of bytes that no PUT wrote (the worker logs "torn").
func TestTornRead(t *testing.T) {
	dir := writeHistory(t, map[string]string{
		"client-100-0.log": "I 1 0 0 PUT " + u(vid(1, 0, 1)) + " 10\nR 1 0 20\nI 2 0 0 GET 0 30\nR 2 torn 40\n",
	})
	res, h := check(t, dir)
	if res != porcupine.Illegal || h.Torn != 1 {
		t.Fatalf("torn read: want Illegal and 1 torn read, got %s, %d", res, h.Torn)
	}
}

// Why a cut-off PUT gets Return = MaxInt64: with a finite return (the kill
// time) Porcupine must make it take effect before the crash, and a correct
// history in which the PUT was lost is rejected.
func TestPendingPutEncoding(t *testing.T) {
	v1, v2 := vid(1, 0, 1), vid(1, 0, 2)
	ops := []porcupine.Operation{
		{ClientId: 0, Input: kvInput{Put: true, Key: 0, Value: v1, Proc: 1}, Call: 10, Output: kvOutput{}, Return: 20},
		{ClientId: 0, Input: kvInput{Put: true, Key: 0, Value: v2, Proc: 1}, Call: 30, Output: kvOutput{Unknown: true}, Return: math.MaxInt64},
		{ClientId: 1, Input: kvInput{Key: 0, Proc: 2}, Call: 1000, Output: kvOutput{Value: v1}, Return: 1010},
	}
	if !porcupine.CheckOperations(KVModel, ops) {
		t.Fatal("lost in-flight PUT with Return=MaxInt64: want linearizable")
	}
	ops[1].Return = 500 // "it returned by the kill": forces it to take effect
	if porcupine.CheckOperations(KVModel, ops) {
		t.Fatal("with a finite Return the lost PUT must be rejected (this is why it is MaxInt64)")
	}
	// And the in-flight PUT that did take effect is accepted as well.
	ops[1].Return = math.MaxInt64
	ops[2].Output = kvOutput{Value: v2}
	if !porcupine.CheckOperations(KVModel, ops) {
		t.Fatal("in-flight PUT that took effect: want linearizable")
	}
}

// A kill can cut the last line of a log short: it is left out (a cut I line:
// never sent; a cut R line: the operation stays pending).
func TestCutLastLine(t *testing.T) {
	v1, v2 := vid(1, 0, 1), vid(1, 0, 2)
	dir := writeHistory(t, map[string]string{
		"client-100-0.log": "I 1 0 0 PUT " + u(v1) + " 10\nR 1 0 20\nI 2 0 0 PUT " + u(v2) + " 30\nR 2 0",
		"client-100-1.log": "I 1 1 0 GET 0 40\nR 1 " + u(v1) + " 50\nI 2 1 0 G",
		"client-200-0.log": "I 1 0 0 GET 0 1000\nR 1 " + u(v2) + " 1010\n",
	})
	res, h := check(t, dir)
	if res != porcupine.Ok || h.PartialLines != 2 || h.Pending != 1 || len(h.Ops) != 4 {
		t.Fatalf("got %s partial=%d pending=%d ops=%d", res, h.PartialLines, h.Pending, len(h.Ops))
	}
}

func TestMalformedLogIsAnError(t *testing.T) {
	dir := writeHistory(t, map[string]string{"client-1-0.log": "I 1 0 0 PUT 5\n"})
	if _, err := LoadHistory(dir); err == nil {
		t.Fatal("want a parse error")
	}
	dir = writeHistory(t, map[string]string{"client-1-0.log": "R 1 0 5\n"})
	if _, err := LoadHistory(dir); err == nil {
		t.Fatal("want an error for a return without invocation")
	}
}

// A delete is a PUT of 0 (the Redis crash test logs DEL so): the register is
// nil again; a read of the old value after an acknowledged delete, or a delete
// lost across a crash, is not linearizable; a delete cut off by the crash may
// or may not have taken effect.
func TestDeleteIsAPutOfNil(t *testing.T) {
	v1, v2 := vid(1, 0, 1), vid(1, 0, 2)
	for _, c := range []struct {
		name string
		logs map[string]string
		want porcupine.CheckResult
	}{
		{"read nil after delete", map[string]string{
			"client-100-0.log": "I 1 0 7 PUT " + u(v1) + " 10\nR 1 0 20\nI 2 0 7 PUT 0 30\nR 2 0 40\n" +
				"I 3 0 7 GET 0 50\nR 3 0 60\n",
		}, porcupine.Ok},
		{"stale read after delete", map[string]string{
			"client-100-0.log": "I 1 0 7 PUT " + u(v1) + " 10\nR 1 0 20\nI 2 0 7 PUT 0 30\nR 2 0 40\n",
			"client-100-1.log": "I 1 1 7 GET 0 50\nR 1 " + u(v1) + " 60\n",
		}, porcupine.Illegal},
		{"acknowledged delete lost across a crash", map[string]string{
			"client-100-0.log": "I 1 0 7 PUT " + u(v1) + " 10\nR 1 0 20\nI 2 0 7 PUT 0 30\nR 2 0 40\n",
			"client-200-0.log": "I 1 0 7 GET 0 1000\nR 1 " + u(v1) + " 1010\n",
		}, porcupine.Illegal},
		{"delete cut off by the crash, lost", map[string]string{
			"client-100-0.log": "I 1 0 7 PUT " + u(v1) + " 10\nR 1 0 20\nI 2 0 7 PUT 0 30\n",
			"client-200-0.log": "I 1 0 7 GET 0 1000\nR 1 " + u(v1) + " 1010\n",
		}, porcupine.Ok},
		{"delete cut off by the crash, took effect", map[string]string{
			"client-100-0.log": "I 1 0 7 PUT " + u(v1) + " 10\nR 1 0 20\nI 2 0 7 PUT 0 30\n",
			"client-200-0.log": "I 1 0 7 GET 0 1000\nR 1 0 1010\nI 2 0 7 PUT " + u(v2) + " 1020\nR 2 0 1030\n",
		}, porcupine.Ok},
		{"lost delete resurrected", map[string]string{
			"client-100-0.log": "I 1 0 7 PUT " + u(v1) + " 10\nR 1 0 20\nI 2 0 7 PUT 0 30\n",
			"client-200-0.log": "I 1 0 7 GET 0 1000\nR 1 " + u(v1) + " 1010\n",
			"client-300-0.log": "I 1 0 7 GET 0 2000\nR 1 0 2010\n",
		}, porcupine.Illegal},
	} {
		if res, _ := check(t, writeHistory(t, c.logs)); res != c.want {
			t.Errorf("%s: want %s, got %s", c.name, c.want, res)
		}
	}
}

func u(v uint64) string { return strconv.FormatUint(v, 10) }

// Counters (ADD returns the sum, RPC mode's add_server): two processes, the
// first killed with an ADD of each client in flight; one took effect (the
// restart reads it), the other did not. Linearizable.
func TestCounterAcrossCrash(t *testing.T) {
	dir := writeHistory(t, map[string]string{
		"client-100-0.log": "I 1 0 0 ADD 1 10\nR 1 1 20\n" + // 0 -> 1
			"I 2 0 0 ADD 5 30\n", // cut off: took effect (6)
		"client-100-1.log": "I 1 1 0 ADD 2 15\nR 1 3 25\n" + // racing the first: 1 -> 3
			"I 2 1 0 ADD 100 40\n", // cut off: did not take effect
		"client-200-0.log": "I 1 0 0 GET 0 1000\nR 1 8 1010\n", // 3 + 5
	})
	if res, h := check(t, dir); res != porcupine.Ok || h.Pending != 2 {
		t.Fatalf("result %s, pending %d: want ok, 2", res, h.Pending)
	}
}

// An acknowledged ADD missing after the crash: not linearizable.
func TestCounterLostAdd(t *testing.T) {
	dir := writeHistory(t, map[string]string{
		"client-100-0.log": "I 1 0 0 ADD 1 10\nR 1 1 20\nI 2 0 0 ADD 1 30\nR 2 2 40\n",
		"client-200-0.log": "I 1 0 0 GET 0 1000\nR 1 1 1010\n",
	})
	if res, _ := check(t, dir); res != porcupine.Illegal {
		t.Fatalf("result %s: want illegal", res)
	}
}

// A GET that saw a cut-off ADD, which the restart then lost: the ADD took
// effect before the crash (the GET saw it) and after it (it is gone), which
// no linearization allows.
func TestCounterReadOfLostAdd(t *testing.T) {
	dir := writeHistory(t, map[string]string{
		"client-100-0.log": "I 1 0 0 ADD 7 10\n",
		"client-100-1.log": "I 1 1 0 GET 0 20\nR 1 7 30\n",
		"client-200-0.log": "I 1 0 0 GET 0 1000\nR 1 0 1010\n",
	})
	if res, _ := check(t, dir); res != porcupine.Illegal {
		t.Fatalf("result %s: want illegal", res)
	}
}
