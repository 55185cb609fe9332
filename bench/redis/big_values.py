#!/usr/bin/env python3
"""big_values.py -- what one large write costs: durable Redis vs stock Redis.

The YCSB grid (redis_bench.py) writes 100-byte fields. This measures the
other end: a single client SETs values of --sizes (default 1 MB, 10 MB,
100 MB), --repeat times each, on a fresh server of every --systems entry
(the same systems and files as redis_bench.py), and reports the median
wall time of one SET, from sending the command to its +OK, and its ratio
to stock Redis without persistence and with AOF-always. With the durable
server's default logs (64 MiB emulated, 256 MiB on a disk), a value whose
blocks do not fit in a log frame (about 22 MB / 89 MB) is a big batch
through the pool's big-batch file (docs/pool-format.md). A value is logged
as a data range (its bytes once, plus a header), or as 32-byte blocks (48
bytes of log each) with the system durable-fs-blocks (MANGO_DATA_RANGES=0,
not default). The durable rows also say how many big batches and data
ranges the run made and its log bytes (INFO mangosteen).

Outputs in --out: big_values.csv and big_values.md.
Exit status: 0 ok; 1 a run failed; 2 usage.

Example:
  python3 bench/redis/big_values.py --out bench/results/DATE/big-values
"""
import argparse
import csv
import os
import shutil
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import redis_bench as rb  # noqa: E402  (Server, redis_cmd, csv_list, ...)

DEFAULT_SYSTEMS = ["durable-emulated", "durable-fs", "stock-none", "stock-aof-always"]


def size_list(s):
    out = []
    for part in s.split(","):
        p = part.strip().lower()
        mult = {"k": 1000, "m": 1000 ** 2, "g": 1000 ** 3}.get(p[-1:], 1)
        try:
            out.append(int(p[:-1] if mult > 1 else p) * mult)
        except ValueError:
            raise argparse.ArgumentTypeError("bad size %r (e.g. 1m,10m,100m)" % part)
    return out


def timed_set(port, key, value, timeout=600):
    """Seconds from the first byte of SET sent to its reply; the reply line."""
    head = b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(key), key, len(value))
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        t0 = time.monotonic()
        s.sendall(head)
        s.sendall(value)
        s.sendall(b"\r\n")
        line = rb.reply_line(s)
        return time.monotonic() - t0, line


def info_field(port, field):
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"*2\r\n$4\r\nINFO\r\n$10\r\nmangosteen\r\n")
        buf = b""
        s.settimeout(1)
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    break
                buf += d
                if buf.endswith(b"\r\n") and b"mango_gather_holds" in buf:
                    break
        except socket.timeout:
            pass
    for line in buf.decode(errors="replace").splitlines():
        if line.startswith(field + ":"):
            return int(line.split(":", 1)[1])
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--durable", default=os.path.join(rb.REPO, "build/redis-work/redis-server-durable"))
    p.add_argument("--stock", default="/usr/bin/redis-server")
    p.add_argument("--systems", type=rb.csv_list, default=DEFAULT_SYSTEMS)
    p.add_argument("--sizes", type=size_list, default=size_list("1m,10m,100m"))
    p.add_argument("--repeat", type=int, default=3, help="SETs per size and system (default 3)")
    p.add_argument("--fs-dir", default="/var/tmp")
    p.add_argument("--shm-dir", default="/dev/shm")
    p.add_argument("--pool-size", default="2g", help="MANGO_POOL_SIZE (default 2g: room for the values)")
    p.add_argument("--log-size", default=None, help="MANGO_LOG_SIZE (default: the runtime's)")
    p.add_argument("--out", required=True)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    args.pin = None
    if args.repeat < 1 or not args.sizes:
        p.error("--repeat must be >= 1 and --sizes non-empty")
    for s in args.systems:
        if s not in ("durable-emulated", "durable-fs", "durable-fs-blocks", "stock-none", "stock-aof-always",
                     "stock-aof-everysec"):
            p.error("unknown system %r" % s)
    workdir = rb.out_workdir(args)
    rows, failed = [], 0
    for system in args.systems:
        srv = rb.Server(args, system, workdir, "big")
        try:
            srv.start()
            for size in args.sizes:
                for r in range(args.repeat):
                    value = bytes([97 + r % 26]) * size
                    secs, reply = timed_set(srv.port, b"big:%d:%d" % (size, r), value)
                    ok = reply == "+OK"
                    failed += not ok
                    rows.append({"system": system, "size": size, "rep": r, "seconds": round(secs, 4),
                                 "ok": int(ok), "reply": reply})
                    rb.log("%-18s %6.0f MB #%d %.3f s %s" % (system, size / 1e6, r, secs, reply))
            if system.startswith("durable"):
                rows.append({"system": system, "size": 0, "rep": -1, "seconds": 0, "ok": 1,
                             "reply": "big_batches=%s data_ranges=%s data_range_bytes=%s log_bytes=%s" % tuple(
                                 info_field(srv.port, f) for f in (
                                     "mango_big_batches", "mango_log_data_ranges", "mango_log_data_bytes",
                                     "mango_log_bytes"))})
        except Exception as e:  # a failed start or a dropped connection
            rb.log("%s failed: %s" % (system, e))
            failed += 1
        finally:
            srv.close()
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
        rb.remove_pool_dirs(args)
    with open(os.path.join(args.out, "big_values.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["system", "size", "rep", "seconds", "ok", "reply"])
        w.writeheader()
        w.writerows(rows)
    write_md(args, rows)
    print("wrote %s" % os.path.join(args.out, "big_values.md"))
    return 1 if failed else 0


def write_md(args, rows):
    def med(system, size):
        v = [r["seconds"] for r in rows if r["system"] == system and r["size"] == size and r["ok"]]
        return statistics.median(v) if v else None

    systems = args.systems
    lines = ["# One large SET: durable Redis vs stock Redis", "",
             "Generated by `bench/redis/big_values.py`; command: `%s`." % " ".join(
                 [os.path.basename(sys.argv[0])] + sys.argv[1:]), "",
             "- one client, a fresh server per system, %d SETs per size (median shown, seconds from sending "
             "the command to its reply); fs pool and AOF in `%s`, emulated pool in `%s`" % (
                 args.repeat, args.fs_dir, args.shm_dir), ""]
    for r in rows:
        if r["rep"] == -1:
            lines.append("- %s: %s over the run" % (r["system"], r["reply"]))
    lines += ["", "| size | " + " | ".join(systems) + " | " + " | ".join(
        "%s / %s" % (s, b) for s in systems if s.startswith("durable")
        for b in ("stock-none", "stock-aof-always") if b in systems) + " |"]
    ncols = len(systems) + sum(1 for s in systems if s.startswith("durable")
                               for b in ("stock-none", "stock-aof-always") if b in systems)
    lines.append("|---" * (ncols + 1) + "|")
    for size in args.sizes:
        cells = ["%.0f MB" % (size / 1e6)]
        for s in systems:
            m = med(s, size)
            cells.append("%.3f s" % m if m is not None else "failed")
        for s in systems:
            if not s.startswith("durable"):
                continue
            for b in ("stock-none", "stock-aof-always"):
                if b in systems:
                    a, c = med(s, size), med(b, size)
                    cells.append("%.2fx" % (a / c) if a and c else "-")
        lines.append("| " + " | ".join(cells) + " |")
    with open(os.path.join(args.out, "big_values.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
