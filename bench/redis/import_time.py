#!/usr/bin/env python3
"""import_time.py -- moving a dataset in: a new pool importing dump.rdb vs stock Redis loading it.

Makes one RDB file with stock Redis (DEBUG POPULATE --keys keys of
--value-size bytes, then SAVE), then starts each --systems entry on it,
--repeat times in a rotated order, and times the start from exec to the
first PING answer (stock Redis answers LOADING until its load is done; a
durable server on a new pool imports the file first, see docs/redis.md,
"Moving a dataset in"). Every start must then hold all the keys (DBSIZE).

Systems:
  stock-none                 stock Redis 7.0.15 loading the file (no AOF)
  durable-emulated           new pool on --shm-dir, the default bulk import
  durable-emulated-chunked   the same with MANGO_REDIS_IMPORT_BULK=0 (every
                             store captured, committed in batches)
  durable-fs, durable-fs-chunked   the same with the pool on --fs-dir

Outputs in --out: import.csv (one row per start) and import.md (medians).
Exit status: 0 ok; 1 a start failed or lost keys; 2 usage; 77 a server
binary is missing.

Example:
  python3 bench/redis/import_time.py --keys 1000000 --out bench/results/DATE/import
"""
import argparse
import csv
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import redis_bench as rb  # noqa: E402  (Server, redis_cmd, csv_list, log)

SYSTEMS_OK = ("stock-none", "durable-emulated", "durable-emulated-chunked", "durable-fs", "durable-fs-chunked")
FIELDS = ["rep", "order", "system", "first_ping_s", "keys", "import_log"]


def make_rdb(args, workdir):
    """The dataset: stock Redis, DEBUG POPULATE, SAVE. Returns (path, keys)."""
    srv = rb.Server(args, "stock-none", workdir, "maker")
    try:
        srv.start(extra=srv.extra + ["--enable-debug-command", "yes"])
        reply = rb.redis_cmd(srv.port, "DEBUG", "POPULATE", args.keys, "key", args.value_size)
        if reply != "+OK":
            raise RuntimeError("DEBUG POPULATE: %s" % reply)
        reply = rb.redis_cmd(srv.port, "SAVE")
        if reply != "+OK":
            raise RuntimeError("SAVE: %s" % reply)
        keys = int(rb.redis_cmd(srv.port, "DBSIZE")[1:])
        src = os.path.join(srv.dir, "dump.rdb")
        dst = os.path.join(workdir, "dataset.rdb")
        shutil.copyfile(src, dst)
        return dst, keys
    finally:
        srv.close()


def one_start(args, system, rep, order, workdir, rdb, keys):
    base = "durable-emulated" if system.startswith("durable-emulated") else \
        "durable-fs" if system.startswith("durable") else system
    srv = rb.Server(args, base, workdir, "%s-r%d" % (system, rep))
    try:
        if system.endswith("-chunked"):
            srv.env["MANGO_REDIS_IMPORT_BULK"] = "0"
        else:
            srv.env.pop("MANGO_REDIS_IMPORT_BULK", None)
        shutil.copyfile(rdb, os.path.join(srv.dir, "dump.rdb"))
        t = srv.start()
        got = int(rb.redis_cmd(srv.port, "DBSIZE")[1:])
        line = ""
        if system.startswith("durable"):
            with open(os.path.join(srv.dir, "server.log"), errors="replace") as f:
                for ln in f:
                    if "Mangosteen: imported" in ln or "its heap was logged" in ln:
                        line += ln.split("Mangosteen: ", 1)[-1].strip() + " "
        if got != keys:
            raise RuntimeError("%s: %d keys after the start, %d in the file" % (system, got, keys))
        return {"rep": rep, "order": order, "system": system, "first_ping_s": round(t, 3), "keys": got,
                "import_log": line.strip()}
    finally:
        srv.close()


def write_md(args, rows, path, keys, rdb_bytes, meta):
    by = {}
    for r in rows:
        by.setdefault(r["system"], []).append(r["first_ping_s"])
    stock = statistics.median(by["stock-none"]) if by.get("stock-none") else None
    with open(path, "w") as f:
        f.write("# Importing dump.rdb into a new pool vs stock Redis loading it\n\n")
        f.write("%d keys (`DEBUG POPULATE %d key %d`), RDB file %.1f MB; %s.\n\n"
                % (keys, args.keys, args.value_size, rdb_bytes / 1e6, meta))
        f.write("| system | first PING, s (each start) | median | / stock load |\n|---|---|---|---|\n")
        for s in args.systems:
            v = by.get(s, [])
            if not v:
                continue
            m = statistics.median(v)
            ratio = "%.2fx" % (m / stock) if stock else ""
            f.write("| %s | %s | %.2f | %s |\n" % (s, " / ".join("%.2f" % x for x in v), m, ratio))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--durable", default=os.path.join(rb.REPO, "build/redis-work/redis-server-durable"))
    p.add_argument("--stock", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    p.add_argument("--systems", type=rb.csv_list, default=list(SYSTEMS_OK),
                   help="comma list from: " + ",".join(SYSTEMS_OK))
    p.add_argument("--keys", type=int, default=1000000, help="keys in the file (default 1000000)")
    p.add_argument("--value-size", type=int, default=100, help="bytes per value (default 100)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--fs-dir", default="/var/tmp")
    p.add_argument("--shm-dir", default="/dev/shm")
    p.add_argument("--pool-size", default=None, help="MANGO_POOL_SIZE (default: the runtime's)")
    p.add_argument("--log-size", default=None, help="MANGO_LOG_SIZE (default: the runtime's)")
    p.add_argument("--out", required=True)
    p.add_argument("--keep", action="store_true", help="keep server dirs and pools")
    args = p.parse_args()
    args.pin = None
    args.transport = "tcp"
    bad = [s for s in args.systems if s not in SYSTEMS_OK]
    if bad:
        p.error("unknown system(s) %s; choose from %s" % (",".join(bad), ",".join(SYSTEMS_OK)))
    for name, v in (("--keys", args.keys), ("--value-size", args.value_size), ("--repeat", args.repeat)):
        if v < 1:
            p.error("%s must be >= 1" % name)
    missing = [b for b in (args.stock, args.durable) if not (b and os.access(b, os.X_OK))]
    if missing:
        rb.log("missing: %s (stock Redis: apt-get install redis-server; the durable server: the redis-durable "
               "target)" % ", ".join(missing))
        return 77
    workdir = rb.out_workdir(args)
    os.makedirs(workdir, exist_ok=True)
    t_start = time.monotonic()
    rb.log("making the RDB file: %d keys of %d bytes" % (args.keys, args.value_size))
    rdb, keys = make_rdb(args, workdir)
    rdb_bytes = os.path.getsize(rdb)
    rows, failed = [], 0
    n = len(args.systems)
    for rep in range(args.repeat):
        for i in range(n):
            system = args.systems[(i + rep) % n]
            try:
                row = one_start(args, system, rep, i, workdir, rdb, keys)
                rows.append(row)
                rb.log("rep %d %s: first PING after %.2f s" % (rep, system, row["first_ping_s"]))
            except Exception as e:  # noqa: BLE001  (reported, counted, the run goes on)
                failed += 1
                rb.log("rep %d %s: FAILED: %s" % (rep, system, e))
    with open(os.path.join(args.out, "import.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    meta = "%d repetitions, %s, %.0f s" % (args.repeat, time.strftime("%Y-%m-%d"), time.monotonic() - t_start)
    write_md(args, rows, os.path.join(args.out, "import.md"), keys, rdb_bytes, meta)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
        rb.remove_pool_dirs(args)
    rb.log("wrote %s" % os.path.join(args.out, "import.md"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
