#!/usr/bin/env python3
"""snapshot_bench: what an online snapshot (mango_snapshot) costs a writer,
side by side with the offline backup (stop, `mango copy`, start).

For each mode and durable heap size, `snapshot_cost run` fills the heap,
runs one closed-loop writer and takes a snapshot a third of the way in
(see bench/snapshot_cost.c); then `mango copy` copies the same pool, which
the run left stopped, the way an operator without snapshots would back it
up (the writer's outage is at least that copy's time). Writes results.csv,
results.md and, with matplotlib, snapshot.png (pause and duration against
heap size) to --out.
"""
import argparse
import csv
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time


def parse_kv(line):
    return dict(f.split("=", 1) for f in line.split())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", default="build/bench/snapshot_cost", help="the snapshot_cost binary")
    ap.add_argument("--mango", default="build/tools/mango/mango", help="the mango CLI (for mango copy)")
    ap.add_argument("--modes", default="emulated,fs", help="comma-separated: emulated (pool in /dev/shm), fs")
    ap.add_argument("--heap-mb", default="64,256,1024", help="comma-separated durable heap sizes, MiB")
    ap.add_argument("--seconds", type=float, default=6.0, help="writer run per case (default 6)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per case; tables show the median (default 1)")
    ap.add_argument("--fs-dir", default="/var/tmp", help="where fs pools and every snapshot go")
    ap.add_argument("--out", default=None, help="output folder (default bench/results/<date>/snapshot)")
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    bad = [m for m in a.modes.split(",") if m not in ("emulated", "fs")]
    if bad:
        ap.error("--modes takes emulated and fs, not %s" % ",".join(bad))
    out = a.out or os.path.join("bench", "results", datetime.date.today().isoformat(), "snapshot")
    os.makedirs(out, exist_ok=True)
    rows = []
    modes = a.modes.split(",")
    sizes = [int(x) for x in a.heap_mb.split(",")]
    for rep in range(a.repeat):
        for mb in sizes:
            for mode in modes:
                if mode not in ("emulated", "fs"):
                    sys.exit("snapshot_bench: unknown mode %r" % mode)
                pool = os.path.join("/dev/shm" if mode == "emulated" else a.fs_dir, "snapbench-%d.pool" % os.getpid())
                snap = os.path.join(a.fs_dir, "snapbench-%d.snap" % os.getpid())
                copy = os.path.join(a.fs_dir, "snapbench-%d.copy" % os.getpid())
                try:
                    print("snapshot_bench: %s, %d MiB heap, run %d ..." % (mode, mb, rep + 1), file=sys.stderr, flush=True)
                    r = subprocess.run([a.tool, "run", mode, pool, snap, str(mb), str(a.seconds)],
                                       capture_output=True, text=True)
                    if r.returncode != 0:
                        sys.exit("snapshot_bench: %s failed: %s" % (a.tool, r.stderr.strip()))
                    row = parse_kv(r.stdout.strip().splitlines()[-1])
                    t0 = time.monotonic()
                    c = subprocess.run([a.mango, "copy", "--quiet", pool, copy], capture_output=True, text=True)
                    if c.returncode != 0:
                        sys.exit("snapshot_bench: mango copy failed: %s" % c.stderr.strip())
                    row["mango_copy_s"] = "%.3f" % (time.monotonic() - t0)
                    row["rep"] = rep
                    rows.append(row)
                finally:
                    for f in (pool, snap, copy):
                        if os.path.exists(f):
                            os.unlink(f)
    fields = list(rows[0].keys())
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)

    def med(mode, mb, key):
        v = [float(r[key]) for r in rows if r["mode"] == mode and int(r["heap_mb"]) == mb]
        return statistics.median(v)

    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = ["# Online snapshot (mango_snapshot) vs offline copy", "",
             "Machine: %d CPUs, %s; git %s; %s s writer runs, %d repetition(s) (medians)." %
             (os.cpu_count(), platform.release(), rev, a.seconds, a.repeat), "",
             "Command: `%s`" % " ".join(sys.argv), "",
             "| mode | heap MiB | pause ms | snapshot s | writer ops/s before | during | after | "
             "slowest update before ms | during ms | open snapshot s | mango copy s (offline) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for mb in sizes:
        for mode in modes:
            lines.append("| %s | %d | %.1f | %.2f | %.0f | %.0f | %.0f | %.1f | %.1f | %.3f | %.2f |" % (
                mode, mb, med(mode, mb, "pause_ms"), med(mode, mb, "snapshot_s"), med(mode, mb, "before_ops_s"),
                med(mode, mb, "during_ops_s"), med(mode, mb, "after_ops_s"), med(mode, mb, "slowest_before_ms"),
                med(mode, mb, "slowest_during_ms"), med(mode, mb, "open_s"), med(mode, mb, "mango_copy_s")))
    lines += ["", "pause: the write side held (every batch durable, the log's unapplied bits read, fork). "
              "snapshot: the whole call, until the new pool is durable. The offline copy needs the writer "
              "stopped for at least its time, plus a restart."]
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("snapshot_bench: matplotlib not installed; skipping the plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for mode in modes:
        ax[0].plot(sizes, [med(mode, mb, "pause_ms") for mb in sizes], marker="o", label=mode)
        ax[1].plot(sizes, [med(mode, mb, "snapshot_s") for mb in sizes], marker="o", label="%s snapshot" % mode)
        ax[1].plot(sizes, [med(mode, mb, "mango_copy_s") for mb in sizes], marker="x", linestyle="--",
                   label="%s mango copy (offline)" % mode)
    ax[0].set_title("write side held (ms)")
    ax[1].set_title("time to a durable backup (s)")
    for x in ax:
        x.set_xlabel("durable heap (MiB)")
        x.set_xscale("log", base=2)
        x.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "snapshot.png"), dpi=100)


if __name__ == "__main__":
    main()
