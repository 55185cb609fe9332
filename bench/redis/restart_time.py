#!/usr/bin/env python3
"""restart_time.py -- clean restarts of durable Redis, page cache cold and warm.

For each server binary given (--durable, repeatable: compare two builds side
by side, e.g. before and after a change), one pool gets --keys keys of
--value-size bytes (DEBUG POPULATE) and a clean SHUTDOWN. Then, --repeat
times, alternating between the binaries: the page cache is dropped (sync;
echo 3 > /proc/sys/vm/drop_caches: root only) and the server is timed from
exec to its first PING answer ("cold"), shut down, and timed again with the
pool in the cache ("warm"); DBSIZE is checked each time.

A restart after a crash is `redis_bench.py --recovery-only`'s job; this is the
restart after SHUTDOWN (an upgrade of the host, a maintenance window), where
recovery replays nothing.

Outputs in --out: restart.csv (one row per start) and restart.md (medians and
ranges). Exit status: 0 ok; 1 a start failed or lost keys; 2 usage; 77 no
server binary, or not root.

Example:
  sudo python3 bench/redis/restart_time.py --durable build/redis-work/redis-server-durable \\
      --keys 1000000 --out bench/results/DATE/restart
"""
import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

try:
    from redis import Redis
except ImportError:
    sys.exit("restart_time: redis-py is not importable by %s (apt-get install python3-redis)" % sys.executable)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from redis_bench import free_port  # noqa: E402


def log(*a):
    print("restart_time:", *a, file=sys.stderr, flush=True)


def start(binary, mode, pool, pool_size, workdir):
    """(process, port, seconds from exec to the first PING answer)."""
    port = free_port()
    env = dict(os.environ, MANGO_POOL=pool, MANGO_MODE=mode, MANGO_POOL_SIZE=pool_size)
    t0 = time.monotonic()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no", "--dir", workdir, "--logfile", os.path.join(workdir, "server.log"),
                             "--enable-debug-command", "yes"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    c = Redis(host="127.0.0.1", port=port, socket_timeout=600)
    while True:
        if proc.poll() is not None:
            sys.exit("restart_time: %s exited (%s); see %s" % (binary, proc.returncode,
                                                              os.path.join(workdir, "server.log")))
        try:
            if c.ping():
                return proc, port, time.monotonic() - t0
        except Exception:
            time.sleep(0.001)


def shutdown(proc, port):
    try:
        Redis(host="127.0.0.1", port=port).shutdown(nosave=True)
    except Exception:
        pass  # the connection closes as the server exits
    proc.wait(timeout=600)


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--durable", action="append", required=True,
                    help="a durable redis-server (repeat to compare builds)")
    ap.add_argument("--mode", default="fs", choices=["fs", "emulated"], help="mango mode (default fs)")
    ap.add_argument("--keys", type=int, default=1000000, help="DEBUG POPULATE keys (default 1000000)")
    ap.add_argument("--value-size", type=int, default=100, help="bytes per value (default 100)")
    ap.add_argument("--pool-size", default="2g", help="mango-pool-size (default 2g)")
    ap.add_argument("--repeat", type=int, default=3, help="cold+warm pairs per binary (default 3)")
    ap.add_argument("--dir", default="/var/tmp", help="where the pools go (default /var/tmp)")
    ap.add_argument("--out", required=True, help="output folder")
    a = ap.parse_args()
    for b in a.durable:
        if not os.access(b, os.X_OK):
            print("restart_time: no server at %s" % b, file=sys.stderr)
            sys.exit(77)
    if os.geteuid() != 0:
        print("restart_time: dropping the page cache needs root", file=sys.stderr)
        sys.exit(77)
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="mango-restart-", dir=a.dir)
    rows = []
    try:
        pools = []
        for i, b in enumerate(a.durable):
            pool = os.path.join(work, "pool-%d" % i)
            proc, port, _ = start(b, a.mode, pool, a.pool_size, work)
            log("build %d: populating %d keys" % (i, a.keys))
            Redis(host="127.0.0.1", port=port, socket_timeout=600).execute_command(
                "DEBUG", "POPULATE", a.keys, "key", a.value_size)
            shutdown(proc, port)
            pools.append(pool)
        for rep in range(a.repeat):
            for i, b in enumerate(a.durable):
                for cache in ("cold", "warm"):
                    if cache == "cold":
                        drop_caches()
                    proc, port, secs = start(b, a.mode, pools[i], a.pool_size, work)
                    keys = Redis(host="127.0.0.1", port=port).dbsize()
                    shutdown(proc, port)
                    if keys != a.keys:
                        sys.exit("restart_time: build %d restarted with %d keys, not %d" % (i, keys, a.keys))
                    rows.append(dict(build=i, binary=b, rep=rep, cache=cache, seconds="%.4f" % secs, keys=keys))
                    log("build %d rep %d %s: %.4f s" % (i, rep, cache, secs))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open(os.path.join(a.out, "restart.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    lines = ["# Clean restarts of durable Redis (%s mode, %d keys of %d bytes)" % (a.mode, a.keys, a.value_size),
             "", "command: `%s`" % " ".join(sys.argv), "",
             "| build | binary | cold: median (range) | warm: median (range) |", "|---|---|---|---|"]
    for i, b in enumerate(a.durable):
        cell = []
        for cache in ("cold", "warm"):
            v = [float(r["seconds"]) for r in rows if r["build"] == i and r["cache"] == cache]
            cell.append("%.3f s (%.3f-%.3f)" % (statistics.median(v), min(v), max(v)))
        lines.append("| %d | `%s` | %s | %s |" % (i, b, cell[0], cell[1]))
    lines += ["", "Seconds from exec to the first PING answer after a clean SHUTDOWN; cold: the page cache "
              "dropped just before."]
    with open(os.path.join(a.out, "restart.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
