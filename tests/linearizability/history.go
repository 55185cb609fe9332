// Package main checks kvstore histories recorded across kill -9 crashes
// (`kvstore history-test`) for linearizability with Porcupine.
//
// A history is a folder of client logs, DIR/client-<pid>-<t>.log, one line per
// event (see examples/kvstore/kv_history.c):
//
//	I <opid> <client> <key> <PUT|GET|ADD> <value-id|delta> <t_ns>   invocation
//	R <opid> <result> <t_ns>                                       return
//
// The model is one register per key (initially 0, "never written"); PUT sets
// it to the write's unique value id, GET returns it. A PUT of 0 is a delete
// (the Redis crash test, redis/tests/redis_crash_clients.c, logs DEL, HDEL and
// a MULTI that deletes both keys of a pair so): the register is nil again.
// ADD adds its delta to the register and returns the sum (RPC mode's counter
// server, tests/rpc/add_server_history.py); a history uses PUT or ADD on a
// key, not both.
// Porcupine checks each key on its own (Partition), which is sound for
// registers: a history of independent objects is linearizable iff each
// object's sub-history is.
package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/anishathalye/porcupine"
)

// tornValue is what a GET that read bytes no PUT wrote returns: no PUT has it,
// so such a read is never linearizable.
const tornValue = math.MaxUint64

type kvInput struct {
	Put   bool
	Add   bool // ADD: Value is the delta
	Key   int
	Value uint64 // PUT: the value id written
	Proc  int    // the worker process, numbered 1, 2, ... in start order
}

// writes says whether the operation changes the register.
func (in kvInput) writes() bool { return in.Put || in.Add }

// kvState is one key's register and the latest process whose operation on the
// key has been linearized so far.
type kvState struct {
	Value uint64
	Proc  int
}

type kvOutput struct {
	Value   uint64 // GET: the value id read (0: never written)
	Unknown bool   // the operation was cut off by a crash
}

// describeValue prints a value id as epoch.client.n (see kv_history.c), or a
// counter's sum as a number.
func describeValue(v uint64) string {
	switch v {
	case 0:
		return "empty"
	case tornValue:
		return "TORN"
	}
	if v < 1<<40 { // kv_history.c's epochs start at 1: a counter's sum (ADD)
		return fmt.Sprintf("%d", v)
	}
	return fmt.Sprintf("e%d.c%d.%d", v>>40, (v>>32)&0xff, v&0xffffffff)
}

// KVModel is a register per key, partitioned by key.
var KVModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[int][]porcupine.Operation{}
		var keys []int
		for _, op := range history {
			k := op.Input.(kvInput).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Ints(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() interface{} { return kvState{} },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		st := state.(kvState)
		in := input.(kvInput)
		out := output.(kvOutput)
		if in.Proc < st.Proc {
			// Linearized after an operation of a later process, i.e. after
			// the crash that ended this one's process. Only a PUT cut off
			// by that crash can be here (a completed operation returned
			// before the later process started), and then it did not take
			// effect: the crash ended it. See parseLog.
			return in.writes() && out.Unknown, st
		}
		st.Proc = in.Proc
		if in.Put {
			st.Value = in.Value
			return true, st
		}
		if in.Add {
			st.Value += in.Value
			return out.Unknown || out.Value == st.Value, st
		}
		return out.Value == st.Value, st
	},
	Equal: func(a, b interface{}) bool { return a.(kvState) == b.(kvState) },
	Hash: func(s interface{}) uint64 {
		st := s.(kvState)
		return st.Value ^ uint64(st.Proc)*0x9e3779b97f4a7c15
	},
	DescribeOperation: func(input, output interface{}) string {
		in := input.(kvInput)
		out := output.(kvOutput)
		if in.Put && in.Value == 0 { // a delete (the Redis crash test)
			if out.Unknown {
				return fmt.Sprintf("p%d del(k%d) -> ? (cut by crash)", in.Proc, in.Key)
			}
			return fmt.Sprintf("p%d del(k%d)", in.Proc, in.Key)
		}
		if in.Put {
			if out.Unknown {
				return fmt.Sprintf("p%d put(k%d, %s) -> ? (cut by crash)", in.Proc, in.Key,
					describeValue(in.Value))
			}
			return fmt.Sprintf("p%d put(k%d, %s)", in.Proc, in.Key, describeValue(in.Value))
		}
		if in.Add {
			if out.Unknown {
				return fmt.Sprintf("p%d add(k%d, %d) -> ? (cut by crash)", in.Proc, in.Key, in.Value)
			}
			return fmt.Sprintf("p%d add(k%d, %d) -> %d", in.Proc, in.Key, in.Value, out.Value)
		}
		return fmt.Sprintf("p%d get(k%d) -> %s", in.Proc, in.Key, describeValue(out.Value))
	},
	DescribeState: func(s interface{}) string { return describeValue(s.(kvState).Value) },
	DescribeOperationMetadata: func(m interface{}) string {
		if m == nil {
			return ""
		}
		return m.(string)
	},
}

// Explain describes, for each key whose history is not linearizable, where the
// longest linearizable prefix Porcupine found stops: the state it leaves and
// the operation that cannot come next although it returned first.
func Explain(h *History, info porcupine.LinearizationInfo) []string {
	parts := KVModel.Partition(h.Ops)
	partials := info.PartialLinearizations()
	var out []string
	for p, ops := range parts {
		if p >= len(partials) {
			break
		}
		best := []int(nil)
		for _, lin := range partials[p] {
			if len(lin) > len(best) {
				best = lin
			}
		}
		if len(best) == len(ops) {
			continue
		}
		done := make([]bool, len(ops))
		state := KVModel.Init()
		for _, id := range best {
			done[id] = true
			_, state = KVModel.Step(state, ops[id].Input, ops[id].Output)
		}
		stuck := -1
		for id, op := range ops {
			if !done[id] && (stuck < 0 || op.Return < ops[stuck].Return) {
				stuck = id
			}
		}
		key := ops[0].Input.(kvInput).Key
		msg := fmt.Sprintf("key %d: NOT linearizable: longest linearizable prefix has %d of %d ops, "+
			"leaving the register at %s", key, len(best), len(ops), describeValue(state.(kvState).Value))
		if stuck >= 0 {
			op := ops[stuck]
			msg += fmt.Sprintf("; next to return: %s (client %d, call %d, return %d, %s)",
				KVModel.DescribeOperation(op.Input, op.Output), op.ClientId, op.Call, op.Return,
				op.Metadata)
		}
		out = append(out, msg)
	}
	return out
}

// History is what the logs of one folder hold.
type History struct {
	Ops         []porcupine.Operation
	Pending     int // PUTs cut off by a crash (kept, outcome unknown)
	PendingGets int // GETs cut off by a crash (dropped: they constrain nothing)
	Files       int
	Procs       int // worker processes (one per crash, plus the last)
	Keys        int
	Torn        int // GETs that read bytes no PUT wrote
	// Logs whose last line was cut short by the kill (left out).
	PartialLines int
}

type pendingOp struct {
	client int
	input  kvInput
	call   int64
	where  string // file:line of the invocation
}

// parseLog adds one client log's operations to h; proc numbers the process
// that wrote it.
func (h *History) parseLog(path string, proc int, keys map[int]bool) error {
	lines, partial, err := readLines(path)
	if err != nil {
		return err
	}
	if partial {
		h.PartialLines++
	}
	open := map[uint64]pendingOp{}
	var order []uint64
	for i, line := range lines {
		lineNo := i + 1
		fields := strings.Fields(line)
		bad := func(why string) error {
			return fmt.Errorf("%s:%d: %s: %q", path, lineNo, why, line)
		}
		if len(fields) == 0 {
			continue
		}
		num := func(i int) (uint64, error) { return strconv.ParseUint(fields[i], 10, 64) }
		switch fields[0] {
		case "I":
			if len(fields) != 7 {
				return bad("want 7 fields")
			}
			opid, e1 := num(1)
			client, e2 := num(2)
			key, e3 := num(3)
			val, e4 := num(5)
			t, e5 := num(6)
			if e1 != nil || e2 != nil || e3 != nil || e4 != nil || e5 != nil ||
				(fields[4] != "PUT" && fields[4] != "GET" && fields[4] != "ADD") {
				return bad("malformed invocation")
			}
			if _, dup := open[opid]; dup {
				return bad("operation id invoked twice")
			}
			in := kvInput{Put: fields[4] == "PUT", Add: fields[4] == "ADD", Key: int(key), Value: val, Proc: proc}
			open[opid] = pendingOp{client: int(client), input: in, call: int64(t),
				where: fmt.Sprintf("%s:%d", filepath.Base(path), lineNo)}
			order = append(order, opid)
			keys[int(key)] = true
		case "R":
			if len(fields) != 4 {
				return bad("want 4 fields")
			}
			opid, e1 := num(1)
			t, e2 := num(3)
			var res uint64
			var e3 error
			torn := fields[2] == "torn"
			if torn {
				res = tornValue
				h.Torn++
			} else {
				res, e3 = num(2)
			}
			if e1 != nil || e2 != nil || e3 != nil {
				return bad("malformed return")
			}
			p, ok := open[opid]
			if !ok {
				return bad("return without invocation")
			}
			delete(open, opid)
			if int64(t) < p.call {
				return bad("returns before its invocation")
			}
			h.Ops = append(h.Ops, porcupine.Operation{
				ClientId: p.client, Input: p.input, Call: p.call,
				Output: kvOutput{Value: res}, Return: int64(t), Metadata: p.where,
			})
		default:
			return bad("unknown record")
		}
	}
	for _, opid := range order {
		p, ok := open[opid]
		if !ok {
			continue
		}
		if !p.input.writes() {
			// A GET cut off by the crash returned nothing to anybody and
			// changes no state: any linearization stays valid without it.
			h.PendingGets++
			continue
		}
		// A PUT (or ADD) cut off by the crash may or may not have taken effect (it
		// may be in the recovered state or not). Encoding: Return =
		// MaxInt64 and an Output the model accepts whatever the state.
		// Porcupine must place the operation's linearization point between
		// Call and Return; with Return = +inf it may place it anywhere
		// after the invocation, including after every other operation of
		// the history, where it is invisible: that is "did not take
		// effect". Placed earlier, it is "took effect (at that point)".
		// A finite Return, say the kill time, would instead force the PUT
		// to take effect before the crash, which is wrong for a PUT whose
		// log frame never became durable, and would flag correct
		// histories.
		// Return = +inf alone would also let a PUT lost in the crash take
		// effect later, after the next process has read the key without
		// it (a lost write resurrected by a later recovery). The model
		// closes that hole: once an operation of a later process is
		// linearized on the key, an earlier process's cut-off PUT may
		// still be placed, but only as a no-op. So: took effect before
		// the crash, or never.
		h.Pending++
		h.Ops = append(h.Ops, porcupine.Operation{
			ClientId: p.client, Input: p.input, Call: p.call,
			Output: kvOutput{Unknown: true}, Return: math.MaxInt64, Metadata: p.where,
		})
	}
	return nil
}

// LoadHistory reads every DIR/client-*.log.
func LoadHistory(dir string) (*History, error) {
	files, err := filepath.Glob(filepath.Join(dir, "client-*.log"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no client-*.log files", dir)
	}
	sort.Strings(files)
	// Number the worker processes in start order: by the earliest
	// invocation in their logs (the first line of each file).
	first := map[int]int64{}
	for _, f := range files {
		var pid, t int
		if n, _ := fmt.Sscanf(filepath.Base(f), "client-%d-%d.log", &pid, &t); n != 2 {
			return nil, fmt.Errorf("%s: not client-<pid>-<t>.log", f)
		}
		call, ok, err := firstCall(f)
		if err != nil {
			return nil, err
		}
		if old, seen := first[pid]; ok && (!seen || call < old) {
			first[pid] = call
		}
	}
	pids := make([]int, 0, len(first))
	for pid := range first {
		pids = append(pids, pid)
	}
	sort.Slice(pids, func(i, j int) bool { return first[pids[i]] < first[pids[j]] })
	proc := map[int]int{}
	for i, pid := range pids {
		proc[pid] = i + 1
	}
	h := &History{Files: len(files), Procs: len(pids)}
	keys := map[int]bool{}
	for _, f := range files {
		var pid, t int
		fmt.Sscanf(filepath.Base(f), "client-%d-%d.log", &pid, &t)
		if proc[pid] == 0 {
			continue // a process killed before its first operation
		}
		if err := h.parseLog(f, proc[pid], keys); err != nil {
			return nil, err
		}
	}
	h.Keys = len(keys)
	// The process numbering means "ended by the crash before the next one
	// started": processes must not overlap in time.
	last := make([]int64, len(pids)+1)
	for _, op := range h.Ops {
		p := op.Input.(kvInput).Proc
		end := op.Return
		if end == math.MaxInt64 {
			end = op.Call
		}
		if end > last[p] {
			last[p] = end
		}
	}
	for i := 1; i < len(pids); i++ {
		if last[i] >= first[pids[i]] {
			return nil, fmt.Errorf("%s: process %d (pid %d) overlaps the next one (pid %d): not a crash history",
				dir, i, pids[i-1], pids[i])
		}
	}
	return h, nil
}

// readLines returns a log's complete lines. A last line without its newline
// is left out (partial = true): SIGKILL can cut a write(2) short where the
// line crosses a page boundary (the kernel checks for fatal signals between
// pages). Leaving it out is sound: a cut I line means the command was never
// sent (the log is written first); a cut R line leaves the operation pending,
// i.e. of unknown outcome, which is weaker than what happened.
func readLines(path string) (lines []string, partial bool, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, false, err
	}
	lines = strings.Split(string(data), "\n")
	last := len(lines) - 1
	partial = lines[last] != ""
	return lines[:last], partial, nil
}

// firstCall is the time of a log's first invocation (ok false: empty log).
func firstCall(path string) (int64, bool, error) {
	lines, _, err := readLines(path)
	if err != nil || len(lines) == 0 {
		return 0, false, err
	}
	fields := strings.Fields(lines[0])
	if len(fields) != 7 || fields[0] != "I" {
		return 0, false, fmt.Errorf("%s:1: want an invocation: %q", path, lines[0])
	}
	t, err := strconv.ParseInt(fields[6], 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("%s:1: bad time: %q", path, lines[0])
	}
	return t, true, nil
}
