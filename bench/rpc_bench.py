#!/usr/bin/env python3
"""rpc_bench.py -- RPC mode: add_server under add_bench, modes side by side.

For every (clients, update %) cell it runs add_server once per mode, with the
modes in a rotated order per cell and repetition, a fresh pool each run, and
add_bench against it (closed loop, one request in flight per connection).

Modes: none (durability off), emulated (pool on /dev/shm), fs (pool in
--fs-dir), fs-inline (fs with MANGO_PIPELINE=0: each batch synced under the
write lock), fs-unkeyed (fs with add_server --unkeyed-reads: GETs do not name
their counter, so each waits for every ADD in flight), fs-unix (fs over a
Unix-domain socket instead of TCP loopback: add_server --unix). The server gets one
worker per CPU (--threads = os.cpu_count()) unless --server-threads says
otherwise (a number, or clients for one worker per connection):
a worker holds responses while their commands become durable, so it need not
be one per client (fs-inline is the exception: there a worker waits for each
write's sync under the lock, as every worker did before 2026-11-25).

Outputs in --out DIR: results.csv (one row per run: add_bench's ops/s and
p50/p99/p999/max latency in µs, measured however long) and results.md (medians
over --repeat, and each mode's ratio to none, fs / fs-inline and
fs / fs-unkeyed).
Exit status: 0; 1 if a run failed; 2 usage error. A run fails if add_bench
fails or completes no request, or if add_server does not stop cleanly after
SIGTERM (a failed final drain or shutdown exits 1): the message gives its exit
status and the tail of its stderr.
"""
import argparse
import csv
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MODES = ("none", "emulated", "fs", "fs-inline", "fs-unkeyed", "fs-unix")


def find(name, given):
    if given:
        return given
    p = os.path.join(REPO, "build", "examples", "rpc_add", name)
    return p if os.path.exists(p) else shutil.which(name)


def int_list(s):
    try:
        return [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError("expected a comma list of integers, got %r" % s)


def server_threads(spec, clients):
    """--server-threads: a number, "cpus" (the default) or "clients"."""
    if spec == "clients":
        return clients
    if spec == "cpus":
        return os.cpu_count() or 2
    return int(spec)


def threads_spec(s):
    if s in ("cpus", "clients"):
        return s
    try:
        if int(s) > 0:
            return s
    except ValueError:
        pass
    raise argparse.ArgumentTypeError("expected a positive number, cpus or clients, not %r" % s)


def run_one(args, mode, clients, upd):
    base = args.fs_dir if mode.startswith("fs") else "/dev/shm"
    d = tempfile.mkdtemp(prefix="rpc_bench-", dir=base)
    env = dict(os.environ)
    env.pop("MANGO_PIPELINE", None)
    if mode == "fs-inline":
        env["MANGO_PIPELINE"] = "0"
    threads = server_threads(args.server_threads, clients)
    extra = ["--unkeyed-reads"] if mode == "fs-unkeyed" else []
    unix_path = os.path.join(d, "sock") if mode == "fs-unix" else None
    if unix_path:
        extra += ["--unix", unix_path]
    srv = subprocess.Popen([args.server, "--pool", os.path.join(d, "pool"),
                            "--mode", mode.split("-")[0], "--threads", str(threads)] + extra,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = srv.stdout.readline()
        if not line.startswith("add_server: listening on"):
            raise RuntimeError("add_server did not start: %s%s" % (line, srv.stderr.read()))
        where = ["--unix", unix_path] if unix_path else ["--port", line.split()[3].rsplit(":", 1)[1]]
        p = subprocess.run([args.bench] + where + ["--clients", str(clients), "--seconds",
                            "%g" % args.seconds, "--update-pct", str(upd)],
                           capture_output=True, text=True, timeout=args.seconds * 5 + 30)
        if p.returncode != 0:
            raise RuntimeError("add_bench failed: %s%s" % (p.stdout, p.stderr))
        rec = dict(kv.split("=", 1) for kv in p.stdout.split() if "=" in kv)
        if int(rec.get("ops", 0)) <= 0 or any(k not in rec for k in ("p50_us", "p99_us", "p999_us")):
            raise RuntimeError("add_bench completed no request (an empty run): %s%s" % (p.stdout, p.stderr))
    finally:
        srv.terminate()
        try:
            _, err = srv.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
            _, err = srv.communicate()
            err += "(killed: still running 30 s after SIGTERM)\n"
        shutil.rmtree(d, ignore_errors=True)
    if srv.returncode != 0:
        raise RuntimeError("add_server exited with status %d after SIGTERM (its final drain or shutdown failed); "
                           "its stderr ends:\n%s" % (srv.returncode, "\n".join(err.splitlines()[-10:])))
    rec.update(mode=mode, server_threads=threads)
    return rec


def fmt(x):
    return "%.1f k" % (x / 1e3) if x >= 1e3 else "%.0f" % x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example: bench/rpc_bench.py --clients 4,16 --updates 10,50,100 --repeat 3")
    ap.add_argument("--server", help="add_server binary (default: build/examples/rpc_add/add_server)")
    ap.add_argument("--bench", help="add_bench binary (default: next to add_server)")
    ap.add_argument("--modes", default="none,emulated,fs,fs-inline", help="comma list of %s" % ",".join(MODES))
    ap.add_argument("--clients", type=int_list, default=[4, 16], help="connections (default 4,16)")
    ap.add_argument("--updates", type=int_list, default=[10, 50, 100], help="ADD %% (default 10,50,100)")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per run (default 3)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell and mode (median shown)")
    ap.add_argument("--server-threads", type=threads_spec, default="cpus",
                    help="add_server --threads: a number, cpus (default: the CPU count) or clients "
                         "(one worker per connection)")
    ap.add_argument("--fs-dir", default="/var/tmp", help="directory of the fs-mode pools (default /var/tmp)")
    ap.add_argument("--out", help="output directory (default bench/results/<date>/rpc)")
    a = ap.parse_args()
    a.modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in a.modes if m not in MODES]
    if bad or not a.modes:
        ap.error("--modes: unknown %s (choose from %s)" % (",".join(bad), ",".join(MODES)))
    if a.repeat < 1 or a.seconds <= 0 or any(u < 0 or u > 100 for u in a.updates) or any(c < 1 for c in a.clients):
        ap.error("--repeat >= 1, --seconds > 0, --updates 0..100, --clients >= 1")
    a.server = find("add_server", a.server)
    a.bench = a.bench or (os.path.join(os.path.dirname(a.server), "add_bench") if a.server else None)
    if not a.server or not os.path.exists(a.server) or not a.bench or not os.path.exists(a.bench):
        ap.error("add_server/add_bench not found: build them (cmake --build build) or pass --server/--bench")
    a.out = a.out or os.path.join(HERE, "results", datetime.date.today().isoformat(), "rpc")
    os.makedirs(a.out, exist_ok=True)

    rows, t0 = [], time.monotonic()
    cells = [(c, u) for c in a.clients for u in a.updates]
    total = len(cells) * a.repeat * len(a.modes)
    n = 0
    for rep in range(a.repeat):
        for ci, (c, u) in enumerate(cells):
            k = (ci + rep) % len(a.modes)
            for mode in a.modes[k:] + a.modes[:k]:
                n += 1
                print("[%d/%d %.0fs] %-9s clients=%-3d update=%3d%% ..." % (n, total, time.monotonic() - t0, mode, c, u),
                      end=" ", flush=True)
                try:
                    r = run_one(a, mode, c, u)
                except Exception as e:
                    print("FAILED\n%s" % e, file=sys.stderr)
                    return 1
                r["rep"] = rep
                rows.append(r)
                print("%s ops/s p99 %s us" % (fmt(float(r["ops_per_sec"])), r["p99_us"]))
    fields = ["rep", "mode", "clients", "server_threads", "update_pct", "seconds", "ops", "ops_per_sec",
              "p50_us", "p99_us", "p999_us", "max_us"]
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)

    def med(mode, c, u, key):
        v = [float(r[key]) for r in rows if r["mode"] == mode and int(r["clients"]) == c and int(r["update_pct"]) == u]
        return statistics.median(v) if v else None

    L = ["# RPC mode: add_server under add_bench -- %s" % datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "",
         "- command: `%s`" % " ".join(["bench/rpc_bench.py"] + sys.argv[1:]),
         "- machine: %d cores, kernel %s; server and load generator share the cores (loopback TCP)"
         % (os.cpu_count() or 0, os.uname().release),
         "- closed loop, one request in flight per connection, %g s per run, median of %d; add_server --threads "
         "= %s; fs pools in `%s`" % (a.seconds, a.repeat, a.server_threads if a.server_threads != "cpus" else os.cpu_count() or 2, a.fs_dir),
         "- %.0f s in all" % (time.monotonic() - t0), ""]
    head = ["clients", "ADD %"] + ["%s ops/s" % m for m in a.modes] + ["%s p99 µs" % m for m in a.modes]
    ratios = []
    if "none" in a.modes:
        ratios += [(m, "none") for m in a.modes if m != "none"]
    for other in ("fs-inline", "fs-unkeyed"):
        if "fs" in a.modes and other in a.modes:
            ratios.append(("fs", other))
    head += ["%s / %s" % r for r in ratios]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "---|" * len(head))
    for c, u in cells:
        ops = [med(m, c, u, "ops_per_sec") for m in a.modes]
        p99 = [med(m, c, u, "p99_us") for m in a.modes]
        cols = [str(c), str(u)] + [fmt(x) for x in ops] + ["%.0f" % x for x in p99]
        for x, y in ratios:
            cols.append("%.2f" % (med(x, c, u, "ops_per_sec") / med(y, c, u, "ops_per_sec")))
        L.append("| " + " | ".join(cols) + " |")
    L.append("")
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write("\n".join(L))
    print("\n".join(L))
    print("rpc_bench: wrote %s/results.csv and results.md" % a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
