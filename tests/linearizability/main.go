// Command linearizability checks a kvstore history folder with Porcupine.
//
//	go run . [-timeout 120s] [-explain-timeout D] [-viz PATH] DIR
//
// It prints "ops=N pending=P keys=K linearizable=true|false" last. Exit
// status: 0 linearizable, 1 not (the visualization is written to DIR/viz.html
// or -viz), 2 error or the check timed out.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/anishathalye/porcupine"
)

func main() {
	timeout := flag.Duration("timeout", 120*time.Second, "give up (exit 2) after this long")
	explainTimeout := flag.Duration("explain-timeout", 0, "time for the verbose pass that explains a history "+
		"found not linearizable (default: -timeout); the verdict stands either way")
	viz := flag.String("viz", "", "where to write the visualization on failure (default DIR/viz.html)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: %s [-timeout D] [-explain-timeout D] [-viz PATH] DIR\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	dir := flag.Arg(0)
	t0 := time.Now()
	h, err := LoadHistory(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "linearizability: %v\n", err)
		os.Exit(2)
	}
	loaded := time.Since(t0)
	t1 := time.Now()
	// A plain check first: it stops at the first key whose history is not
	// linearizable, where the verbose one goes on computing every partial
	// linearization (for the explanation and the visualization), which can
	// take minutes on a bad history.
	res := porcupine.CheckOperationsTimeout(KVModel, h.Ops, *timeout)
	checked := time.Since(t1)
	fmt.Printf("processes=%d files=%d cut_lines=%d pending_gets=%d torn_reads=%d load=%.2fs check=%.2fs result=%s\n",
		h.Procs, h.Files, h.PartialLines, h.PendingGets, h.Torn, loaded.Seconds(), checked.Seconds(), res)
	switch res {
	case porcupine.Ok:
		fmt.Printf("ops=%d pending=%d keys=%d linearizable=true\n", len(h.Ops), h.Pending, h.Keys)
		return
	case porcupine.Illegal:
		// The verbose pass, for the explanation and the visualization only:
		// the verdict stands even if it runs out of time.
		budget := *explainTimeout
		if budget <= 0 {
			budget = *timeout
		}
		vres, info := porcupine.CheckOperationsVerbose(KVModel, h.Ops, budget)
		if vres == porcupine.Illegal {
			for _, line := range Explain(h, info) {
				fmt.Println(line)
			}
			path := *viz
			if path == "" {
				path = filepath.Join(dir, "viz.html")
			}
			if err := porcupine.VisualizePath(KVModel, info, path); err != nil {
				fmt.Fprintf(os.Stderr, "linearizability: visualization: %v\n", err)
			} else {
				fmt.Printf("visualization: %s\n", path)
			}
		} else {
			fmt.Printf("no explanation: the verbose pass ended with %s (budget %s)\n", vres, budget)
		}
		fmt.Printf("ops=%d pending=%d keys=%d linearizable=false\n", len(h.Ops), h.Pending, h.Keys)
		os.Exit(1)
	default:
		fmt.Printf("ops=%d pending=%d keys=%d linearizable=unknown (timed out after %s)\n",
			len(h.Ops), h.Pending, h.Keys, *timeout)
		os.Exit(2)
	}
}
