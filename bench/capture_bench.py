#!/usr/bin/env python3
"""Capture benchmarks (issue #3), side by side in one run.

Tables written to OUT/capture.md (raw numbers in OUT/capture.csv):

 1. Per-store cost: the same store loop built without the plugin, built with
    it and run outside any command (the inactive TLS check), and run inside a
    read-write command (capture active: one 4 KiB buffer, or 1 MiB of distinct
    blocks). From bench/capture_cost.c.
 2. 100 KB value fill: memcpy captured as one range (plugin) vs an 8-byte store
    loop captured store by store (plugin) vs the uninstrumented loop (nothing
    captured: the data would be lost).
 3. kvstore throughput: plugin-built (no capture calls in the source) vs the
    same store annotated by hand with mango_capture (bench/kv_explicit).
 4. Intra-batch deduplication on vs off (MANGO_DEDUP=0), uniform and Zipfian
    0.99 keys, at several update ratios, in the given modes.

Each cell is the median of --repeat runs; runs of the compared variants are
interleaved so drift hits both alike.
"""
import argparse
import csv
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys


def parse_kv(line):
    return dict(re.findall(r"(\w+)=([^\s]+)", line))


def run(cmd, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)
    if r.returncode != 0:
        sys.exit(f"capture_bench: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return r.stdout


def kv_run(binary, pool, mode, threads, update, seconds, zipf=0.0, env=None, values=100000):
    if os.path.exists(pool):
        os.unlink(pool)
    out = run([binary, "run", "--pool", pool, "--mode", mode, "--threads", str(threads),
               "--update-pct", str(update), "--seconds", str(seconds), "--values", str(values),
               "--zipf", str(zipf)], env=env)
    if os.path.exists(pool):
        os.unlink(pool)
    return parse_kv(out.strip().splitlines()[-1])


def fmt_ops(x):
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.1f} k"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--build", default="build", help="build directory (default ./build)")
    ap.add_argument("--out", default=None, help="output directory (default bench/results/<date>/capture)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell, median reported (default 3)")
    ap.add_argument("--seconds", type=float, default=2, help="seconds per kvstore run (default 2)")
    ap.add_argument("--threads", default="1,2,4", help="kvstore thread counts (default 1,2,4)")
    ap.add_argument("--updates", default="10,50,100", help="update %% for plugin vs explicit")
    ap.add_argument("--dedup-updates", default="10,50,90,100", help="update %% for dedup on/off")
    ap.add_argument("--dedup-modes", default="emulated:4,fs:8",
                    help="mode:threads pairs for dedup on/off (default emulated:4,fs:8)")
    ap.add_argument("--fs-dir", default="/var/tmp", help="directory for fs-mode pools")
    ap.add_argument("--quick", action="store_true", help="tiny run for the smoke test")
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    if a.quick:
        a.repeat, a.seconds, a.threads, a.updates = 1, 0.2, "1", "50"
        a.dedup_updates, a.dedup_modes = "100", "emulated:2"
    out = a.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                datetime.date.today().isoformat(), "capture")
    os.makedirs(out, exist_ok=True)
    b = os.path.abspath(a.build)
    cc, cc_plain = f"{b}/bench/capture_cost", f"{b}/bench/capture_cost_plain"
    kv, kv_explicit = f"{b}/examples/kvstore/kvstore", f"{b}/bench/kvstore_explicit"
    for f in (cc, cc_plain, kv, kv_explicit):
        if not os.access(f, os.X_OK):
            sys.exit(f"capture_bench: {f} missing: build first (cmake --build {a.build})")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    rows = []
    md = [f"# Capture benchmarks ({datetime.datetime.now():%Y-%m-%d %H:%M})", "",
          f"- machine: {os.cpu_count()} cores, {platform.machine()}, kernel {platform.release()}",
          f"- median of {a.repeat} run(s); kvstore runs {a.seconds} s each, 100000 values of 64 B",
          ""]

    # 1 + 2: capture_cost, plain vs plugin, interleaved.
    print("capture_bench: per-store cost ...", file=sys.stderr)
    res = {"plain": {}, "plugin": {}}
    for r in range(a.repeat):
        for name, binary in (("plain", cc_plain), ("plugin", cc)):
            for line in run([binary, f"{shm}/mango-cc-{os.getpid()}.pool", "3"]).splitlines():
                kvs = parse_kv(line)
                res[name].setdefault(kvs["name"], []).append(float(kvs["ns"]))
                if "log_bytes_per_fill" in kvs:
                    res[name][kvs["name"] + ".log"] = [float(kvs["log_bytes_per_fill"])]
    med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in res.items()}
    for n in med:
        for k, v in med[n].items():
            rows.append({"table": "store_cost", "variant": n, "case": k, "value": v})
    p, q = med["plain"], med["plugin"]
    md += ["## 1. Cost per store (ns)", "",
           "| case | uninstrumented | plugin | plugin - uninstrumented |", "|---|---:|---:|---:|",
           f"| inactive: outside any command | {p['store_transient']:.2f} | {q['store_transient']:.2f} | {q['store_transient'] - p['store_transient']:+.2f} |",
           f"| active: 4 KiB hot buffer (dedup hit) | {p['store_active_hot']:.2f} (not captured) | {q['store_active_hot']:.2f} | {q['store_active_hot'] - p['store_active_hot']:+.2f} |",
           f"| active: 1 MiB once over, new block every 4th store | {p['store_active_wide']:.2f} (not captured) | {q['store_active_wide']:.2f} | {q['store_active_wide'] - p['store_active_wide']:+.2f} |",
           "", "## 2. 100 KB value fill inside a read-write command (commit included)", "",
           "| copy | build | µs per fill | log bytes per fill |", "|---|---|---:|---:|",
           f"| memcpy | plugin: one range capture | {q['fill_memcpy_100k'] / 1e3:.1f} | {q['fill_memcpy_100k.log']:.0f} |",
           f"| 8-byte store loop | plugin: a capture per store | {q['fill_loop_100k'] / 1e3:.1f} | {q['fill_loop_100k.log']:.0f} |",
           f"| memcpy | uninstrumented (libc interceptor) | {p['fill_memcpy_100k'] / 1e3:.1f} | {p['fill_memcpy_100k.log']:.0f} |",
           f"| 8-byte store loop | uninstrumented | {p['fill_loop_100k'] / 1e3:.1f} | {p['fill_loop_100k.log']:.0f} (**not captured: lost on a crash**) |",
           ""]

    # 3: plugin vs explicit.
    md += ["## 3. kvstore: plugin-built vs hand-annotated (emulated mode, ops/s)", "",
           "| threads | update % | plugin | explicit | plugin / explicit | log B/update plugin | explicit |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    for t in a.threads.split(","):
        for u in a.updates.split(","):
            vals = {"plugin": [], "explicit": []}
            logs = {"plugin": [], "explicit": []}
            for r in range(a.repeat):
                for name, binary in (("plugin", kv), ("explicit", kv_explicit)):
                    kvs = kv_run(binary, f"{shm}/mango-cb-{os.getpid()}.pool", "emulated", t, u, a.seconds)
                    vals[name].append(float(kvs["ops_per_sec"]))
                    logs[name].append(float(kvs["log_bytes_per_update"]))
            mp, me = statistics.median(vals["plugin"]), statistics.median(vals["explicit"])
            lp, le = statistics.median(logs["plugin"]), statistics.median(logs["explicit"])
            print(f"capture_bench: t={t} u={u} plugin {fmt_ops(mp)} explicit {fmt_ops(me)}", file=sys.stderr)
            rows.append({"table": "plugin_vs_explicit", "variant": "plugin", "case": f"t{t}u{u}", "value": mp})
            rows.append({"table": "plugin_vs_explicit", "variant": "explicit", "case": f"t{t}u{u}", "value": me})
            md.append(f"| {t} | {u} | {fmt_ops(mp)} | {fmt_ops(me)} | {mp / me:.2f} | {lp:.0f} | {le:.0f} |")
    md.append("")

    # 4: dedup on/off.
    md += ["## 4. Intra-batch deduplication on vs off (ops/s)", "",
           "| mode | threads | keys | update % | dedup on | dedup off | on / off | mean batch | log B/upd on | off |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for pair in a.dedup_modes.split(","):
        mode, t = pair.split(":")
        pooldir = a.fs_dir if mode == "fs" else shm
        for zipf in (0.0, 0.99):
            for u in a.dedup_updates.split(","):
                vals, logs, batch = {1: [], 0: []}, {1: [], 0: []}, []
                for r in range(a.repeat):
                    for d in (1, 0):
                        kvs = kv_run(kv, f"{pooldir}/mango-cd-{os.getpid()}.pool", mode, t, u, a.seconds,
                                     zipf=zipf, env={"MANGO_DEDUP": str(d)})
                        vals[d].append(float(kvs["ops_per_sec"]))
                        logs[d].append(float(kvs["log_bytes_per_update"]))
                        if d:
                            batch.append(float(kvs["mean_batch"]))
                on, off = statistics.median(vals[1]), statistics.median(vals[0])
                keys = "Zipf 0.99" if zipf else "uniform"
                print(f"capture_bench: {mode} t={t} {keys} u={u} dedup on {fmt_ops(on)} off {fmt_ops(off)}",
                      file=sys.stderr)
                rows.append({"table": "dedup", "variant": "on", "case": f"{mode}t{t}z{zipf}u{u}", "value": on})
                rows.append({"table": "dedup", "variant": "off", "case": f"{mode}t{t}z{zipf}u{u}", "value": off})
                md.append(f"| {mode} | {t} | {keys} | {u} | {fmt_ops(on)} | {fmt_ops(off)} | {on / off:.2f} | "
                          f"{statistics.median(batch):.2f} | {statistics.median(logs[1]):.0f} | "
                          f"{statistics.median(logs[0]):.0f} |")
    md.append("")
    with open(os.path.join(out, "capture.md"), "w") as f:
        f.write("\n".join(md))
    with open(os.path.join(out, "capture.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["table", "variant", "case", "value"])
        w.writeheader()
        w.writerows(rows)
    print("\n".join(md))
    print(f"capture_bench: wrote {out}/capture.md and capture.csv", file=sys.stderr)


if __name__ == "__main__":
    main()
