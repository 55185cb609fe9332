#!/usr/bin/env python3
"""kv_bench.py -- durable vs non-durable throughput of the Mangosteen kvstore.

Runs `kvstore run` (closed-loop PUT/GET load) for every (threads, update %)
cell, once per mode, with the modes interleaved inside each cell so that
machine drift (frequency scaling, noisy neighbours) hits all modes alike.
Each run uses a fresh pool file, deleted before and after.

Outputs in --out DIR:
  results.csv          one row per run, every field `kvstore run` prints
                       plus the requested mode and the repetition number
  results.md           machine description and a side-by-side table
                       (median over --repeat runs)
  kv_throughput.png    ops/s vs update %, one line per (mode, threads)
  kv_ratio.png         durable / none throughput ratio vs update %
(the PNGs need matplotlib; without it they are skipped with a message)

Exit status: 0 success; 1 a run failed or --check-rows did not match;
2 usage error.
"""

import argparse
import csv
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ALL_MODES = ("none", "emulated", "fs", "fs-inline", "fs-unkeyed", "sim", "auto")
# Modes that are another mode plus environment and kvstore options: fs-inline
# is fs with MANGO_PIPELINE=0 (each batch synced by its combiner under the
# write lock); fs-unkeyed is fs with GETs that do not name their key
# (--read-keys off: each waits for every PUT in flight, as before keys).
MODE_AS = {"fs-inline": ("fs", {"MANGO_PIPELINE": "0"}, []),
           "fs-unkeyed": ("fs", {}, ["--read-keys", "off"])}
DURABLE_DIR = {"emulated": "/dev/shm", "sim": "/dev/shm", "auto": "/dev/shm", "none": "/dev/shm"}
# Fields printed by `kvstore run`, in order; the CSV adds a few of its own first.
RUN_FIELDS = ["mode", "status", "threads", "update_pct", "zipf", "seconds", "ops", "ops_per_sec",
              "puts", "batches", "mean_batch", "syncs_per_batch", "log_bytes_per_update",
              "log_full_waits", "commit_us"]
CSV_FIELDS = ["req_mode", "rep", "order"] + RUN_FIELDS + ["wall_s"]


def int_list(s):
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated integers, got %r" % s)
    if not v:
        raise argparse.ArgumentTypeError("empty list")
    return v


def mode_list(s):
    v = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in v if x not in ALL_MODES]
    if bad or not v:
        raise argparse.ArgumentTypeError("modes must be from %s, got %r" % (",".join(ALL_MODES), s))
    return v


def find_kvstore():
    cands = []
    for b in ("build", "build-release", "cmake-build-release", "/tmp/bbench"):
        d = b if os.path.isabs(b) else os.path.join(REPO, b)
        cands.append(os.path.join(d, "examples", "kvstore", "kvstore"))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    w = shutil.which("kvstore")
    if w:
        return w
    sys.exit("kv_bench: cannot find the kvstore binary (looked in %s); pass --kvstore PATH"
             % ", ".join(cands))


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="kv_bench.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compare the durable kvstore with the same store with durability off "
                    "(--mode none), side by side, over a grid of thread counts and update "
                    "percentages. Writes results.csv, results.md and (with matplotlib) "
                    "kv_throughput.png and kv_ratio.png.",
        epilog="modes: none = durability off (baseline); emulated = pool on tmpfs (/dev/shm), "
               "flushes/syncs cost ~nothing; fs = pool file in --fs-dir, synced with the "
               "file system (numbers depend on the disk); fs-inline = fs with MANGO_PIPELINE=0 "
               "(each batch synced under the write lock, as before pipelined combining); "
               "fs-unkeyed = fs with GETs that do not name their key (--read-keys off: each "
               "waits for every PUT in flight); sim/auto are passed through.\n\n"
               "example: bench/kv_bench.py --kvstore build/examples/kvstore/kvstore "
               "--repeat 3 --out /tmp/kv")
    p.add_argument("--kvstore", metavar="PATH",
                   help="kvstore binary (default: examples/kvstore/kvstore in build/ or "
                        "/tmp/bbench, else $PATH)")
    p.add_argument("--modes", type=mode_list, default=mode_list("none,emulated"),
                   metavar="M1,M2", help="modes to compare (default none,emulated; "
                   "one of %s each)" % ",".join(ALL_MODES))
    p.add_argument("--threads", type=int_list, default=[1, 2, 4], metavar="N,...",
                   help="client thread counts (default 1,2,4)")
    p.add_argument("--updates", type=int_list, default=[0, 10, 50, 90, 100], metavar="P,...",
                   help="update (PUT) percentages (default 0,10,50,90,100)")
    p.add_argument("--seconds", type=float, default=2.0, help="seconds per run (default 2)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="runs per (mode, threads, update) cell; the table reports the "
                        "median (default 1)")
    p.add_argument("--values", type=int, default=None,
                   help="number of values in the store (default: kvstore's, 100000)")
    p.add_argument("--value-size", type=int, default=None, metavar="BYTES",
                   help="bytes per value (default: kvstore's, 64)")
    p.add_argument("--pool-size", default=None, metavar="BYTES",
                   help="passed to kvstore --pool-size (default: kvstore's, 256M)")
    p.add_argument("--log-size", default=None, metavar="BYTES",
                   help="passed to kvstore --log-size (default: kvstore's, 64M)")
    p.add_argument("--fs-dir", default="/var/tmp", metavar="DIR",
                   help="directory for the pool file in fs mode (default /var/tmp)")
    p.add_argument("--out", metavar="DIR",
                   help="output directory (default bench/results/<YYYY-MM-DD>)")
    p.add_argument("--check-rows", type=int, default=None, metavar="N",
                   help="after the run, exit 1 unless results.csv has exactly N data rows "
                        "(used by the CTest smoke test)")
    p.add_argument("--replot", action="store_true",
                   help="run nothing: redraw the PNGs from DIR/results.csv (same --modes, "
                        "--threads, --updates, --seconds, --repeat)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="kill a run after S seconds (default: 5 x --seconds + 30)")
    a = p.parse_args(argv)
    if a.seconds <= 0:
        p.error("--seconds must be > 0")
    if a.repeat < 1:
        p.error("--repeat must be >= 1")
    if any(t < 1 or t > 64 for t in a.threads):
        p.error("--threads values must be 1..64")
    if any(u < 0 or u > 100 for u in a.updates):
        p.error("--updates values must be 0..100")
    if len(set(a.modes)) != len(a.modes):
        p.error("--modes has duplicates")
    if any(m.startswith("fs") for m in a.modes) and not os.path.isdir(a.fs_dir):
        p.error("--fs-dir %s is not a directory" % a.fs_dir)
    a.kvstore = a.kvstore or find_kvstore()
    if not (os.path.isfile(a.kvstore) and os.access(a.kvstore, os.X_OK)):
        p.error("--kvstore %s is not an executable file" % a.kvstore)
    if not a.out:
        a.out = os.path.join(HERE, "results", datetime.date.today().isoformat())
    if a.timeout is None:
        a.timeout = 5 * a.seconds + 30
    return a


def pool_path(args, mode):
    d = args.fs_dir if mode.startswith("fs") else DURABLE_DIR.get(mode, "/dev/shm")
    if not os.path.isdir(d):
        d = "/tmp"
    return os.path.join(d, "kv_bench-%d-%s.pool" % (os.getpid(), mode))


def remove_pool(path):
    # The pool file and anything the runtime may have put beside it with the
    # same name as prefix (only files this process created: the name has our pid).
    d, base = os.path.split(path)
    try:
        names = os.listdir(d)
    except OSError:
        return
    for n in names:
        if n == base or n.startswith(base + "."):
            try:
                os.unlink(os.path.join(d, n))
            except OSError:
                pass


def run_one(args, mode, threads, upd):
    pool = pool_path(args, mode)
    remove_pool(pool)
    run_mode, extra_env, extra_args = MODE_AS.get(mode, (mode, {}, []))
    env = dict(os.environ)
    env.pop("MANGO_PIPELINE", None)  # from the caller's environment: only fs-inline sets it
    env.update(extra_env)
    cmd = [args.kvstore, "run", "--pool", pool, "--mode", run_mode, "--threads", str(threads),
           "--update-pct", str(upd), "--seconds", "%g" % args.seconds] + extra_args
    if args.values is not None:
        cmd += ["--values", str(args.values)]
    if args.value_size is not None:
        cmd += ["--value-size", str(args.value_size)]
    if args.pool_size is not None:
        cmd += ["--pool-size", str(args.pool_size)]
    if args.log_size is not None:
        cmd += ["--log-size", str(args.log_size)]
    t0 = time.monotonic()
    try:
        pr = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        remove_pool(pool)
        raise RuntimeError("timed out after %gs: %s" % (args.timeout, " ".join(cmd)))
    finally:
        remove_pool(pool)
    wall = time.monotonic() - t0
    if pr.returncode != 0:
        raise RuntimeError("exit %d: %s\n%s%s" % (pr.returncode, " ".join(cmd), pr.stdout, pr.stderr))
    line = next((l for l in pr.stdout.splitlines() if l.startswith("mode=")), None)
    if line is None:
        raise RuntimeError("no result line from: %s\n%s" % (" ".join(cmd), pr.stdout))
    rec = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
    missing = [f for f in RUN_FIELDS if f not in rec]
    if missing:
        raise RuntimeError("result line lacks %s: %s" % (",".join(missing), line))
    # Every field `kvstore run` prints goes into the CSV (zipf and commit_us
    # were dropped until session 39): a new one must be added to RUN_FIELDS.
    extra = [f for f in rec if f not in RUN_FIELDS]
    if extra:
        raise RuntimeError("result line has fields the CSV does not keep (add them to RUN_FIELDS): %s: %s"
                           % (",".join(extra), line))
    rec["wall_s"] = "%.2f" % wall
    return rec


def fmt_ops(x):
    if x >= 1e6:
        return "%.2f M" % (x / 1e6)
    if x >= 1e5:
        return "%.0f k" % (x / 1e3)
    if x >= 1e3:
        return "%.1f k" % (x / 1e3)
    return "%.0f" % x


def fmt_ratio(r):
    return "%.2f" % r if r >= 0.1 else "%.2g" % r


def fmt_mops(x):
    m = x / 1e6
    return "%.2f" % m if m >= 0.1 else "%.2g" % m


def machine_info():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for l in f:
                if l.startswith("model name"):
                    cpu = l.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = "%.1f GiB" % (kb / 2**20)
    except (OSError, ValueError, IndexError):
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "machine": platform.machine(), "mem": mem}


def git_rev():
    try:
        r = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, timeout=5)
        if r.returncode == 0:
            d = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
            return r.stdout.strip() + ("+dirty" if d.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def medians(rows, modes, threads, updates):
    """{(mode, t, u): {field: median}} over repetitions."""
    out = {}
    for m in modes:
        for t in threads:
            for u in updates:
                rs = [r for r in rows if r["req_mode"] == m and int(r["threads"]) == t
                      and int(r["update_pct"]) == u]
                if not rs:
                    continue
                out[(m, t, u)] = {f: statistics.median(float(r[f]) for r in rs)
                                  for f in ("ops_per_sec", "puts", "mean_batch", "syncs_per_batch",
                                            "log_bytes_per_update", "log_full_waits")}
    return out


def write_md(path, args, med, info, started, elapsed):
    modes, durable = args.modes, [m for m in args.modes if m != "none"]
    L = []
    L.append("# kvstore: durable vs durability off")
    L.append("")
    L.append("- date: %s (%.0f s)" % (started, elapsed))
    L.append("- machine: %s cores (nproc), CPU `%s`, %s, kernel %s, %s RAM"
             % (info["nproc"], info["cpu"], info["machine"], info["kernel"], info["mem"]))
    L.append("- source: git %s, binary `%s`" % (git_rev(), os.path.relpath(args.kvstore, REPO)
                                                 if args.kvstore.startswith(REPO) else args.kvstore))
    L.append("- load: `kvstore run`, closed loop, %g s per run, median of %d run(s); values=%s, "
             "value_size=%s" % (args.seconds, args.repeat,
                                args.values if args.values is not None else "100000 (default)",
                                args.value_size if args.value_size is not None else "64 (default)"))
    L.append("- modes: " + ", ".join(
        {"none": "`none` = durability off", "emulated": "`emulated` = pool on tmpfs (/dev/shm)",
         "fs": "`fs` = pool in `%s`" % args.fs_dir,
         "fs-inline": "`fs-inline` = fs with `MANGO_PIPELINE=0` (batches synced under the write lock)",
         "fs-unkeyed": "`fs-unkeyed` = fs with `--read-keys off` (GETs wait for every PUT in flight)"
         }.get(m, "`%s`" % m) for m in modes))
    if max(args.threads) > (info["nproc"] or 1):
        L.append("- note: thread counts above %s oversubscribe the cores" % info["nproc"])
    L.append("")
    head = ["threads", "update %"] + ["%s ops/s" % m for m in modes]
    base = "none" in modes
    for m in durable:
        if base:
            head.append("%s / none" % m)
        head += ["%s batch" % m, "%s syncs/batch" % m, "%s log B/upd" % m, "%s log-full waits" % m]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "|".join("---:" for _ in head) + "|")
    for t in args.threads:
        for u in args.updates:
            row = [str(t), str(u)]
            for m in modes:
                c = med.get((m, t, u))
                row.append(fmt_ops(c["ops_per_sec"]) if c else "-")
            for m in durable:
                c, n = med.get((m, t, u)), med.get(("none", t, u))
                if base:
                    row.append(fmt_ratio(c["ops_per_sec"] / n["ops_per_sec"])
                               if c and n and n["ops_per_sec"] else "-")
                if c and c["puts"] == 0:
                    row += ["-"] * 4  # read-only: no batches, nothing logged
                elif c:
                    row += ["%.2f" % c["mean_batch"], "%.3f" % c["syncs_per_batch"],
                            "%.0f" % c["log_bytes_per_update"], "%.0f" % c["log_full_waits"]]
                else:
                    row += ["-"] * 4
            L.append("| " + " | ".join(row) + " |")
    L.append("")
    L.append("Columns: ops/s = completed GET+PUT per second, all threads; `X / none` = "
             "throughput ratio against durability off (1.00 = durability is free); batch = mean "
             "commands per flat-combining batch; syncs/batch = front-end medium syncs per batch; "
             "log B/upd = redo-log bytes written per PUT; log-full waits = times a combiner "
             "waited for log space; `-` = no updates in that cell. See bench/README.md.")
    L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L))


def plot(outdir, args, med):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("kv_bench: matplotlib not installed; skipping plots (pip install matplotlib)",
              file=sys.stderr)
        return []
    info = machine_info()
    sub = "%s cores, %g s/run, median of %d" % (info["nproc"], args.seconds, args.repeat)
    colors = {"none": "tab:gray", "emulated": "tab:blue", "fs": "tab:red", "fs-inline": "tab:orange",
              "sim": "tab:green",
              "auto": "tab:purple"}
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D"]
    made = []

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=100)
    for m in args.modes:
        for i, t in enumerate(args.threads):
            us = [u for u in args.updates if (m, t, u) in med]
            ys = [med[(m, t, u)]["ops_per_sec"] / 1e6 for u in us]
            if us:
                ax.plot(us, ys, linestyle=styles[i % 4], marker=markers[i % 4],
                        color=colors.get(m), label="%s, %d thr" % (m, t))
    ax.set_xlabel("updates (PUT %)")
    ax.set_ylabel("throughput (M ops/s, log scale)")
    ax.set_title("kvstore throughput vs update share\n(%s)" % sub, fontsize=11)
    ax.set_xticks(args.updates)
    ax.set_yscale("log")  # read-only cells are 10-50x the update-heavy ones
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: "%g" % v))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, ncol=len(args.modes), loc="best")
    fig.tight_layout()
    p = os.path.join(outdir, "kv_throughput.png")
    fig.savefig(p)
    plt.close(fig)
    made.append(p)

    durable = [m for m in args.modes if m != "none"]
    if "none" in args.modes and durable:
        fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=100)
        for m in durable:
            for i, t in enumerate(args.threads):
                us = [u for u in args.updates if (m, t, u) in med and ("none", t, u) in med]
                ys = [med[(m, t, u)]["ops_per_sec"] / med[("none", t, u)]["ops_per_sec"]
                      for u in us]
                if us:
                    ax.plot(us, ys, linestyle=styles[i % 4], marker=markers[i % 4],
                            color=colors.get(m), label="%s / none, %d thr" % (m, t))
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("updates (PUT %)")
        ax.set_ylabel("throughput ratio, durable / none")
        ax.set_title("Cost of durability (1.0 = free)\n(%s)" % sub, fontsize=11)
        ax.set_xticks(args.updates)
        ratios = [med[(m, t, u)]["ops_per_sec"] / med[("none", t, u)]["ops_per_sec"]
                  for (m, t, u) in med if m != "none" and ("none", t, u) in med
                  and med[("none", t, u)]["ops_per_sec"]]
        if ratios and min(ratios) < 0.05:  # e.g. fs mode: syncs to disk, 100-1000x slower
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: "%g" % v))
            ax.set_ylabel("throughput ratio, durable / none (log scale)")
            ax.grid(alpha=0.3, which="both")
        else:
            ax.set_ylim(0, max(1.1, ax.get_ylim()[1]))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        p = os.path.join(outdir, "kv_ratio.png")
        fig.savefig(p)
        plt.close(fig)
        made.append(p)
    return made


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.out, exist_ok=True)
    if args.replot:
        with open(os.path.join(args.out, "results.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        made = plot(args.out, args, medians(rows, args.modes, args.threads, args.updates))
        print("kv_bench: wrote %s" % ", ".join(made) if made else "kv_bench: no plots",
              file=sys.stderr)
        return 0
    cells = [(t, u) for t in args.threads for u in args.updates]
    total = len(cells) * args.repeat * len(args.modes)
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    t_start = time.monotonic()
    print("kv_bench: %s, modes %s, %d runs of %g s -> %s"
          % (args.kvstore, ",".join(args.modes), total, args.seconds, args.out), file=sys.stderr)
    rows, k, failed = [], 0, 0
    for rep in range(args.repeat):
        for (t, u) in cells:
            # Interleave: every mode runs back to back for this cell. Alternate
            # the order each repetition and cell so neither mode always goes first.
            order = list(args.modes)
            if (rep + cells.index((t, u))) % 2:
                order.reverse()
            for m in order:
                k += 1
                print("[%d/%d] %s t=%d u=%d ... " % (k, total, m, t, u), end="", file=sys.stderr,
                      flush=True)
                try:
                    rec = run_one(args, m, t, u)
                except RuntimeError as e:
                    failed += 1
                    print("FAILED\n%s" % e, file=sys.stderr)
                    continue
                rec.update(req_mode=m, rep=rep, order=k)
                rows.append(rec)
                extra = ""
                if m != "none":
                    extra = " (batch %s, log-full waits %s)" % (rec["mean_batch"], rec["log_full_waits"])
                print("%s Mops/s%s" % (fmt_mops(float(rec["ops_per_sec"])), extra), file=sys.stderr)

    csv_path = os.path.join(args.out, "results.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    med = medians(rows, args.modes, args.threads, args.updates)
    elapsed = time.monotonic() - t_start
    md_path = os.path.join(args.out, "results.md")
    write_md(md_path, args, med, machine_info(), started, elapsed)
    made = plot(args.out, args, med)
    print("kv_bench: wrote %s" % ", ".join([csv_path, md_path] + made), file=sys.stderr)

    rc = 0
    if failed:
        print("kv_bench: %d run(s) failed" % failed, file=sys.stderr)
        rc = 1
    if args.check_rows is not None:
        with open(csv_path, newline="") as f:
            n = sum(1 for _ in csv.DictReader(f))
        if n != args.check_rows:
            print("kv_bench: --check-rows: results.csv has %d rows, expected %d"
                  % (n, args.check_rows), file=sys.stderr)
            rc = 1
        else:
            print("kv_bench: --check-rows: %d rows OK" % n, file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
