#!/usr/bin/env python3
"""memory.py -- what a dataset costs in memory: durable Redis vs stock Redis.

For every --datasets entry and every --systems entry (the same systems and
files as redis_bench.py), a fresh server loads the dataset; then the script
reads, side by side:

  used_memory        INFO memory: what Redis itself counts (the usable size
                     of each allocation), in every system
  in use             what the dataset added to the allocator's bytes in use
                     (after the load less before it), size-class rounding
                     and headers included: stock, jemalloc's
                     allocator_allocated; durable, the durable heap's
                     mango_heap_allocated_bytes (the heap holds the state;
                     transient allocations are not in it)
  extent             what the dataset added to: stock, jemalloc's
                     allocator_active (pages holding allocations); durable,
                     mango_heap_carved_bytes (the heap from its start to its
                     top: allocations, free space and allocator metadata,
                     and what recovery copies)
  RSS                the server's resident memory from /proc: anonymous,
                     and file or shared (durable: the pool's mirror and log,
                     mapped; in emulated mode they live in /dev/shm)
  pool on disk       durable: the pool file's allocated bytes (fs: the whole
                     pool, allocated when it is made, whatever the data;
                     emulated: tmpfs memory, also in RSS file)

Datasets:
  ycsb               --records YCSB records (ycsb_redis load): hashes of 10
                     fields of 100 bytes, as in redis_bench.py
  strings            --keys SETs of key:<n> to a --value-size byte value
  small-hashes       --keys HSETs of h:<n> with 5 fields of 8 bytes (a
                     listpack: one allocation per hash)

The ratio columns divide the durable heap's figures by stock Redis's (the
first stock system in --systems). Repetitions (--repeat) are whole passes
over the grid; the tables show medians.

Outputs in --out: memory.csv, memory.md and memory.png (matplotlib: what
the load added, in use and extent, per dataset and system).
Exit status: 0 ok; 1 a run failed; 2 usage; 77 stock Redis missing.

Example:
  python3 bench/redis/memory.py --out bench/results/DATE/memory
"""
import argparse
import csv
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import redis_bench as rb  # noqa: E402  (Server, log, csv_list, ...)

DEFAULT_SYSTEMS = ["stock-none", "durable-emulated", "durable-fs"]
ALL_SYSTEMS = ["stock-none", "stock-aof-always", "durable-emulated", "durable-fs"]
DATASETS = ["ycsb", "strings", "small-hashes"]
FIELDS = ["rep", "dataset", "system", "keys", "used_memory", "in_use", "extent", "rss_anon", "rss_file",
          "pool_on_disk", "seconds_to_load"]


def positive_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a whole number" % s)
    if v < 1:
        raise argparse.ArgumentTypeError("%r must be at least 1" % s)
    return v


def info(port, section):
    """INFO <section> as a dict of its fields (strings)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"*2\r\n$4\r\nINFO\r\n$%d\r\n%s\r\n" % (len(section), section.encode()))
        f = s.makefile("rb")
        head = f.readline()
        if not head.startswith(b"$"):
            raise RuntimeError("INFO %s: %r" % (section, head[:80]))
        body = f.read(int(head[1:]) + 2)
    out = {}
    for line in body.decode(errors="replace").splitlines():
        k, sep, v = line.partition(":")
        if sep:
            out[k] = v
    return out


def pipelined(port, commands, batch=1000):
    """Sends RESP commands in batches, reads every reply; returns how many
    replies were errors."""
    errors = 0
    with socket.create_connection(("127.0.0.1", port), timeout=600) as s:
        f = s.makefile("rb")
        for i in range(0, len(commands), batch):
            chunk = commands[i:i + batch]
            req = b"".join(b"*%d\r\n" % len(c) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in c)
                           for c in chunk)
            s.sendall(req)
            for _ in chunk:
                line = f.readline()
                if line.startswith(b"-"):
                    errors += 1
                elif line.startswith(b"$") and int(line[1:]) >= 0:
                    f.read(int(line[1:]) + 2)
    return errors


def load(args, dataset, srv):
    """Fills the server; returns the number of keys it should hold."""
    if dataset == "ycsb":
        cmd = [args.ycsb, "load", "-p", str(srv.port), "-r", str(args.records), "-c", "8", "-t", "2",
               "--progress", "0"]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=3600)
        if p.returncode != 0:
            raise RuntimeError("ycsb_redis load failed: %s" % p.stderr.strip()[-300:])
        return args.records
    if dataset == "strings":
        value = b"x" * args.value_size
        cmds = [(b"SET", b"key:%d" % n, value) for n in range(args.keys)]
    else:
        cmds = [(b"HSET", b"h:%d" % n) + tuple(x for i in range(5) for x in (b"f%d" % i, b"%08d" % n))
                for n in range(args.keys)]
    errors = pipelined(srv.port, cmds)
    if errors:
        raise RuntimeError("%d of %d commands failed" % (errors, len(cmds)))
    return args.keys


def allocator_figures(port, durable):
    """(in use, extent) of the allocator holding the state (see the top)."""
    if durable:
        mango = info(port, "mangosteen")
        if "mango_heap_carved_bytes" not in mango:
            raise RuntimeError("INFO mangosteen has no mango_heap_carved_bytes (an older build?)")
        return int(mango["mango_heap_allocated_bytes"]), int(mango["mango_heap_carved_bytes"])
    # INFO's allocator_* figures are what serverCron sampled last (every
    # 100 ms at the default hz): let it sample the current state.
    time.sleep(0.5)
    mem = info(port, "memory")
    return int(mem["allocator_allocated"]), int(mem["allocator_active"])


def measure(args, rep, dataset, system, workdir):
    srv = rb.Server(args, system, workdir, "%s-%d" % (dataset, rep))
    durable = system.startswith("durable")
    try:
        srv.start()
        in_use0, extent0 = allocator_figures(srv.port, durable)
        t0 = time.monotonic()
        keys = load(args, dataset, srv)
        secs = time.monotonic() - t0
        dbsize = rb.redis_cmd(srv.port, "DBSIZE")
        if dbsize != ":%d" % keys:
            raise RuntimeError("DBSIZE %s, expected %d" % (dbsize, keys))
        in_use, extent = allocator_figures(srv.port, durable)
        mem = info(srv.port, "memory")
        row = {"rep": rep, "dataset": dataset, "system": system, "keys": keys,
               "used_memory": int(mem["used_memory"]), "seconds_to_load": round(secs, 2),
               "in_use": in_use - in_use0, "extent": extent - extent0,
               "pool_on_disk": os.stat(srv.pool).st_blocks * 512 if durable else ""}
        if row["in_use"] <= 0 or row["extent"] < 0:
            raise RuntimeError("implausible figures: the load added %d bytes in use, %d of extent"
                               % (row["in_use"], row["extent"]))
        anon, filed = rb.rss_mb(srv.proc.pid)
        row["rss_anon"], row["rss_file"] = int(anon * 2 ** 20), int(filed * 2 ** 20)
        rb.log("%-13s %-17s #%d keys %d used_memory %.1f MB in use %.1f MB extent %.1f MB" % (
            dataset, system, rep, keys, row["used_memory"] / 1e6, row["in_use"] / 1e6, row["extent"] / 1e6))
        return row
    finally:
        srv.close()


def median_of(rows, dataset, system, field):
    v = [r[field] for r in rows if r["dataset"] == dataset and r["system"] == system and r[field] != ""]
    return statistics.median(v) if v else None


def write_md(args, rows, failures):
    mb = lambda v: "%.1f MB" % (v / 1e6) if v is not None else "-"
    base = next((s for s in args.systems if s.startswith("stock")), None)
    lines = ["# What a dataset costs in memory: durable Redis vs stock Redis", "",
             "Generated by `bench/redis/memory.py`; command: `%s`." % " ".join(
                 [os.path.basename(sys.argv[0])] + sys.argv[1:]), "",
             "- a fresh server per dataset and system, %d repetition%s (medians shown); ycsb: %d records "
             "(10 fields of 100 bytes), strings: %d keys of %d-byte values, small-hashes: %d hashes of 5 "
             "8-byte fields" % (args.repeat, "" if args.repeat == 1 else "s", args.records, args.keys,
                                args.value_size, args.keys),
             "- in use and extent: what the load added (after less before). In use: stock, jemalloc's "
             "`allocator_allocated`; durable, the durable heap's `mango_heap_allocated_bytes`. Extent: "
             "stock, `allocator_active`; durable, `mango_heap_carved_bytes`",
             "- RSS file: for durable servers the pool's mirror and log, mapped (emulated mode: in /dev/shm)",
             "- pool on disk: the pool file's allocated bytes (fs: the whole pool, allocated when it is made, "
             "whatever the data; emulated: tmpfs memory, also in RSS file)", ""]
    for f in failures:
        lines.append("- **failed**: %s" % f)
    if failures:
        lines.append("")
    head = ["dataset", "system", "used_memory", "in use (added)", "extent (added)", "RSS anon", "RSS file",
            "pool on disk"]
    if base:
        head += ["in use / %s" % base, "extent / %s" % base]
    lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for d in args.datasets:
        for s in args.systems:
            g = lambda f: median_of(rows, d, s, f)
            if g("used_memory") is None:
                continue
            cells = [d, s, mb(g("used_memory")), mb(g("in_use")), mb(g("extent")), mb(g("rss_anon")),
                     mb(g("rss_file")), mb(g("pool_on_disk")) if s.startswith("durable") else ""]
            if base:
                for f in ("in_use", "extent"):
                    a, b = g(f), median_of(rows, d, base, f)
                    cells.append("%.2fx" % (a / b) if a and b and s != base else "")
            lines.append("| " + " | ".join(cells) + " |")
    with open(os.path.join(args.out, "memory.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def plot(args, rows):
    plt = rb.pyplot("no memory.png")
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(args.datasets), figsize=(4.5 * len(args.datasets), 4), squeeze=False)
    for ax, d in zip(axes[0], args.datasets):
        systems = [s for s in args.systems if median_of(rows, d, s, "used_memory") is not None]
        x = range(len(systems))
        w = 0.38
        for i, (field, label) in enumerate((("in_use", "in use (what the load added)"),
                                            ("extent", "extent (what the load added)"))):
            ax.bar([j + (i - 0.5) * w for j in x], [median_of(rows, d, s, field) / 1e6 for s in systems], w,
                   label=label)
        ax.set_xticks(list(x))
        ax.set_xticklabels(systems, rotation=15, fontsize=8)
        ax.set_title(d)
        ax.set_ylabel("MB")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(os.path.join(args.out, "memory.png"), dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--durable", default=os.path.join(rb.REPO, "build/redis-work/redis-server-durable"),
                   help="the durable redis-server (default: the build's)")
    p.add_argument("--stock", default="/usr/bin/redis-server", help="stock Redis 7.0.15 (default: %(default)s)")
    p.add_argument("--ycsb", default=os.path.join(rb.REPO, "build/bench/ycsb/ycsb_redis"),
                   help="the load generator (default: the build's ycsb_redis)")
    p.add_argument("--systems", type=rb.csv_list, default=DEFAULT_SYSTEMS,
                   help="comma list from %s (default %s)" % (",".join(ALL_SYSTEMS), ",".join(DEFAULT_SYSTEMS)))
    p.add_argument("--datasets", type=rb.csv_list, default=DATASETS,
                   help="comma list from %s (default: all)" % ",".join(DATASETS))
    p.add_argument("--records", type=positive_int, default=50000, help="YCSB records (default 50000)")
    p.add_argument("--keys", type=positive_int, default=200000,
                   help="keys of the strings and small-hashes datasets (default 200000)")
    p.add_argument("--value-size", type=positive_int, default=16, help="bytes per string value (default 16)")
    p.add_argument("--repeat", type=positive_int, default=1, help="passes over the grid (default 1)")
    p.add_argument("--fs-dir", default="/var/tmp", help="disk directory for fs pools and AOFs (default /var/tmp)")
    p.add_argument("--shm-dir", default="/dev/shm", help="tmpfs directory for emulated pools (default /dev/shm)")
    p.add_argument("--pool-size", default=None, help="MANGO_POOL_SIZE (default: the server's)")
    p.add_argument("--log-size", default=None, help="MANGO_LOG_SIZE (default: the runtime's)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--keep", action="store_true", help="keep server dirs and pools")
    args = p.parse_args()
    args.pin = None
    for s in args.systems:
        if s not in ALL_SYSTEMS:
            p.error("unknown system %r (choose from %s)" % (s, ",".join(ALL_SYSTEMS)))
    for d in args.datasets:
        if d not in DATASETS:
            p.error("unknown dataset %r (choose from %s)" % (d, ",".join(DATASETS)))
    if any(s.startswith("stock") for s in args.systems) and not os.access(args.stock, os.X_OK):
        print("memory.py: stock redis-server %s not found: skipped" % args.stock, file=sys.stderr)
        return 77
    if any(s.startswith("durable") for s in args.systems) and not os.access(args.durable, os.X_OK):
        p.error("durable redis-server %s not found (build it: cmake --build build --target redis-durable)"
                % args.durable)
    if "ycsb" in args.datasets and not os.access(args.ycsb, os.X_OK):
        p.error("load generator %s not found (build it: cmake --build build --target ycsb_redis)" % args.ycsb)
    workdir = rb.out_workdir(args)
    rows, failures = [], []
    try:
        for rep in range(args.repeat):
            for d in args.datasets:
                for s in args.systems:
                    try:
                        rows.append(measure(args, rep, d, s, workdir))
                    except Exception as e:  # a failed start, load or INFO
                        failures.append("%s on %s, repetition %d: %s" % (d, s, rep, e))
                        rb.log(failures[-1])
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
            rb.remove_pool_dirs(args)
    with open(os.path.join(args.out, "memory.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    write_md(args, rows, failures)
    plot(args, rows)
    print("wrote %s" % os.path.join(args.out, "memory.md"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
