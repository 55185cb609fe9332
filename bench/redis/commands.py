#!/usr/bin/env python3
"""commands.py -- Redis's own benchmark tool, command by command: durable vs stock Redis.

The YCSB grid (redis_bench.py) measures HSET/HGET/HGETALL on hashes. This
runs `redis-benchmark` (the tool that ships with Redis) over its common
commands -- SET, GET, INCR, LPUSH, RPUSH, LPOP, RPOP, SADD, HSET, SPOP,
ZADD, ZPOPMIN, LRANGE_100, MSET by default (--tests) -- against a fresh
server of every --systems entry (the same systems and files as
redis_bench.py), --repeat times, in a rotated order per repetition. Each
run is `redis-benchmark -n N -c C -P P -d D -r KEYSPACE -t TESTS --csv`.

It reports, per command, the median requests per second and p99 latency of
each system, and the ratios durable-emulated / stock-none and durable-fs /
stock-aof-always (and / stock-aof-everysec). redis-benchmark is a client
on the same machine: on 2 vCPUs it takes CPU from the server it measures,
as ycsb_redis does.

Outputs in --out: commands.csv (one row per run and command), commands.md
(the tables) and, with matplotlib, commands_ratio.png.
Exit status: 0 ok; 1 a run failed; 2 usage; 77 redis-benchmark or a server
binary is missing (CTest skip).

With --pin SERVER:CLIENT the server (all its threads) and redis-benchmark
run on separate CPUs, closer to a client on another machine; unpinned, the
scheduler mixes them, and fs mode's sync thread then often waits for the
CPU the client keeps busy (docs/redis.md).

Examples:
  python3 bench/redis/commands.py --out bench/results/DATE/commands
  python3 bench/redis/commands.py --pin 1:0 --out bench/results/DATE/commands-pinned
  python3 bench/redis/commands.py --tests set,lpush --clients 8 --pipeline 16 --out /tmp/c
"""
import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import redis_bench as rb  # noqa: E402  (Server, csv_list, log, ...)

DEFAULT_SYSTEMS = ["durable-emulated", "durable-fs", "stock-none", "stock-aof-always", "stock-aof-everysec"]
DEFAULT_TESTS = "set,get,incr,lpush,rpush,lpop,rpop,sadd,hset,spop,zadd,zpopmin,lrange_100,mset"
SYSTEMS_OK = ("durable-emulated", "durable-fs", "durable-fs-blocks", "stock-none", "stock-aof-always",
              "stock-aof-everysec", "stock-aof-always-shm")
FIELDS = ["rep", "system", "order", "test", "rps", "avg_ms", "p50_ms", "p99_ms", "max_ms", "wall_s"]


def parse_csv(text):
    """redis-benchmark --csv output -> list of (test, rps, avg, p50, p99, max)."""
    rows = []
    for rec in csv.reader(text.splitlines()):
        if not rec or rec[0] == "test" or len(rec) < 8:
            continue
        try:
            rows.append((rec[0], float(rec[1]), float(rec[2]), float(rec[4]), float(rec[6]), float(rec[7])))
        except ValueError:
            continue
    return rows


def run_one(args, system, rep, order, workdir):
    srv = rb.Server(args, system, workdir, "r%d" % rep)
    try:
        srv.start()
        cmd = [args.redis_benchmark, "-h", "127.0.0.1", "-p", str(srv.port), "-n", str(args.requests),
               "-c", str(args.clients), "-P", str(args.pipeline), "-d", str(args.data_size),
               "-r", str(args.keyspace), "-t", ",".join(args.tests), "--csv"]
        t0 = time.monotonic()
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=args.timeout, preexec_fn=rb.pinned_to(args.pin and args.pin[1]))
        wall = time.monotonic() - t0
        if r.returncode != 0:
            raise RuntimeError("redis-benchmark exited %d: %s" % (r.returncode, r.stderr.strip()[-300:]))
        rows = parse_csv(r.stdout)
        if not rows:
            raise RuntimeError("redis-benchmark printed no results: %s" % (r.stdout + r.stderr)[-300:])
        if srv.proc.poll() is not None:
            raise RuntimeError("the server exited during the run (code %s)" % srv.proc.returncode)
        return [{"rep": rep, "system": system, "order": order, "test": t, "rps": rps, "avg_ms": avg,
                 "p50_ms": p50, "p99_ms": p99, "max_ms": mx, "wall_s": round(wall, 2)}
                for t, rps, avg, p50, p99, mx in rows]
    finally:
        srv.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--durable", default=os.path.join(rb.REPO, "build/redis-work/redis-server-durable"))
    p.add_argument("--stock", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    p.add_argument("--redis-benchmark", default=shutil.which("redis-benchmark") or "/usr/bin/redis-benchmark")
    p.add_argument("--systems", type=rb.csv_list, default=DEFAULT_SYSTEMS,
                   help="comma list from: " + ",".join(SYSTEMS_OK))
    p.add_argument("--tests", type=rb.csv_list, default=rb.csv_list(DEFAULT_TESTS),
                   help="redis-benchmark -t list (default %s)" % DEFAULT_TESTS)
    p.add_argument("--requests", type=int, default=100000, help="-n per command (default 100000)")
    p.add_argument("--clients", type=int, default=50, help="-c (default 50, redis-benchmark's)")
    p.add_argument("--pipeline", type=int, default=1, help="-P (default 1: no pipelining)")
    p.add_argument("--data-size", type=int, default=3, help="-d value bytes (default 3, redis-benchmark's)")
    p.add_argument("--keyspace", type=int, default=100000, help="-r random keys (default 100000)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--timeout", type=int, default=1800, help="seconds per redis-benchmark run")
    p.add_argument("--fs-dir", default="/var/tmp")
    p.add_argument("--shm-dir", default="/dev/shm")
    p.add_argument("--pool-size", default=None, help="MANGO_POOL_SIZE (default: the runtime's)")
    p.add_argument("--log-size", default=None, help="MANGO_LOG_SIZE (default: the runtime's)")
    p.add_argument("--pin", type=rb.pin_spec, default=None, metavar="SERVER:CLIENT",
                   help="CPU lists for the server (all its threads) and redis-benchmark, e.g. 1:0 "
                        "(default: unpinned)")
    p.add_argument("--out", required=True)
    p.add_argument("--keep", action="store_true", help="keep server dirs, pools and AOFs")
    args = p.parse_args()
    bad = [s for s in args.systems if s not in SYSTEMS_OK]
    if bad:
        p.error("unknown system(s) %s; choose from %s" % (",".join(bad), ",".join(SYSTEMS_OK)))
    for name, v in (("--requests", args.requests), ("--clients", args.clients), ("--pipeline", args.pipeline),
                    ("--data-size", args.data_size), ("--keyspace", args.keyspace), ("--repeat", args.repeat)):
        if v < 1:
            p.error("%s must be >= 1" % name)
    if not args.tests:
        p.error("--tests is empty")
    need = [args.redis_benchmark]
    need += [args.durable] if any(s.startswith("durable") for s in args.systems) else []
    need += [args.stock] if any(s.startswith("stock") for s in args.systems) else []
    missing = [b for b in need if not (b and os.access(b, os.X_OK))]
    if missing:
        rb.log("missing: %s (redis-benchmark and redis-server come with apt-get install redis-server; "
               "the durable server with the redis-durable target)" % ", ".join(missing))
        return 77
    workdir = rb.out_workdir(args)
    rows, failed = [], 0
    t_start = time.monotonic()
    n = len(args.systems)
    for rep in range(args.repeat):
        order = args.systems[rep % n:] + args.systems[:rep % n]
        for k, system in enumerate(order):
            rb.log("rep %d/%d: %s (%d of %d)" % (rep + 1, args.repeat, system, k + 1, n))
            try:
                got = run_one(args, system, rep, k, workdir)
                rows += got
                rb.log("  " + ", ".join("%s %.0f" % (r["test"].split(" ")[0], r["rps"]) for r in got))
            except Exception as e:  # a failed start, a dead server, a failed client
                rb.log("  %s failed: %s" % (system, e))
                failed += 1
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
        rb.remove_pool_dirs(args)
    with open(os.path.join(args.out, "commands.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    write_md(args, rows, time.monotonic() - t_start, failed)
    plot(args, rows)
    print("wrote %s" % os.path.join(args.out, "commands.md"))
    return 1 if failed or not rows else 0


def medians(rows, key):
    out = {}
    for r in rows:
        out.setdefault((r["system"], r["test"]), []).append(r[key])
    return {k: statistics.median(v) for k, v in out.items()}


RATIOS = [("durable-emulated", "stock-none"), ("durable-fs", "stock-aof-always"),
          ("durable-fs", "stock-aof-everysec"), ("durable-fs-blocks", "stock-aof-always")]


def layout(args, rows):
    """The commands in the order run, the systems that have results, and the
    ratio columns among them."""
    tests = []
    for r in rows:
        if r["test"] not in tests:
            tests.append(r["test"])
    systems = [s for s in args.systems if any(r["system"] == s for r in rows)]
    ratios = [(a, b) for a, b in RATIOS if a in systems and b in systems]
    return tests, systems, ratios


def write_md(args, rows, secs, failed):
    rps, p99 = medians(rows, "rps"), medians(rows, "p99_ms")
    tests, systems, ratios = layout(args, rows)
    lines = ["# redis-benchmark, command by command: durable Redis vs stock Redis", "",
             "Generated by `bench/redis/commands.py`; command: `%s`." % " ".join(
                 [os.path.basename(sys.argv[0])] + sys.argv[1:]), "",
             "- `redis-benchmark -n %d -c %d -P %d -d %d -r %d` on the same machine, a fresh server per "
             "system and repetition, %d repetitions in rotated order (median shown); fs pool and AOFs in "
             "`%s`, emulated pool in `%s`; %s; %.0f s in all%s" % (
                 args.requests, args.clients, args.pipeline, args.data_size, args.keyspace, args.repeat,
                 args.fs_dir, args.shm_dir,
                 "server on CPUs %s, redis-benchmark on CPUs %s" % (
                     ",".join(map(str, sorted(args.pin[0]))), ",".join(map(str, sorted(args.pin[1]))))
                 if args.pin else "unpinned (server and client share the CPUs)",
                 secs, "; %d run(s) FAILED" % failed if failed else ""), ""]
    lines += ["Requests per second (thousands):", "",
              "| command | " + " | ".join(systems) + " | " + " | ".join("%s / %s" % r for r in ratios) + " |",
              "|---" * (1 + len(systems) + len(ratios)) + "|"]
    for t in tests:
        cells = [t]
        for s in systems:
            v = rps.get((s, t))
            cells.append("%.1f" % (v / 1000) if v is not None else "-")
        for a, b in ratios:
            x, y = rps.get((a, t)), rps.get((b, t))
            cells.append("%.2fx" % (x / y) if x and y else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "p99 latency (ms, as redis-benchmark reports it):", "",
              "| command | " + " | ".join(systems) + " |", "|---" * (1 + len(systems)) + "|"]
    for t in tests:
        lines.append("| " + " | ".join([t] + ["%.3f" % p99[(s, t)] if (s, t) in p99 else "-"
                                              for s in systems]) + " |")
    with open(os.path.join(args.out, "commands.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def plot(args, rows):
    plt = rb.pyplot("no PNG")
    if plt is None:
        return
    rps = medians(rows, "rps")
    tests, systems, ratios = layout(args, rows)
    if not ratios:
        return
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(tests) * len(ratios) + 1.5))
    h = 0.8 / len(ratios)
    for k, (a, b) in enumerate(ratios):
        ys = [i + k * h for i in range(len(tests))]
        xs = [rps.get((a, t), 0) / rps[(b, t)] if rps.get((b, t)) else 0 for t in tests]
        ax.barh(ys, xs, height=h, label="%s / %s" % (a, b))
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks([i + 0.4 - h / 2 for i in range(len(tests))])
    ax.set_yticklabels([t.split(" (")[0] for t in tests])
    ax.invert_yaxis()
    ax.set_xlabel("throughput ratio (median requests/s)")
    ax.set_title("redis-benchmark -c %d -P %d -d %d" % (args.clients, args.pipeline, args.data_size))
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "commands_ratio.png"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
