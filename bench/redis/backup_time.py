#!/usr/bin/env python3
"""backup_time.py -- backing up a running durable Redis, and restoring it:
MANGOSNAPSHOT (a pool) vs BGSAVE (an RDB file), side by side in one run.

For each mode, one durable server on a new pool gets --keys keys of
--value-size bytes (DEBUG POPULATE), then a probe client writes (SET, closed
loop) throughout while the server takes, in turn, a BGSAVE and a
MANGOSNAPSHOT (order alternating between repetitions). For each: the time
until it is done (polled every 5 ms), the write side's pause (MANGOSNAPSHOT:
mango_snapshot_last_pause_ms; BGSAVE: latest_fork_usec), and the probe's
throughput and slowest SET while it ran. Then the restores: a server started
on the snapshot pool (recovered, no import) and one started on a new pool
beside the RDB file (imported), each timed from exec to the first PING and
checked with DBSIZE, then given a burst of writes (redis-benchmark SET, 32
clients, --sets-after-restore requests; skipped without redis-benchmark): a
restored server should write as fast as one on a new pool.

Outputs in --out: backup.csv (one row per backup or restore) and backup.md
(medians). Exit status: 0 ok; 1 a backup or restore failed; 2 usage; 77 no
server binary.

Example:
  python3 bench/redis/backup_time.py --keys 1000000 --out bench/results/DATE/backup
"""
import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

try:
    from redis import Redis
except ImportError:
    sys.exit("backup_time: redis-py is not importable by %s (apt-get install python3-redis)" % sys.executable)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from redis_bench import free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SERVER = os.path.join(HERE, "..", "..", "build", "redis-work", "redis-server-durable")


def log(*a):
    print("backup_time:", *a, file=sys.stderr, flush=True)


class Server:
    def __init__(self, binary, mode, workdir, pool, pool_size):
        self.binary, self.mode, self.dir, self.pool, self.pool_size = binary, mode, workdir, pool, pool_size
        self.proc = None
        self.runs = 0

    def start(self):
        """Seconds from exec to the first PING answer."""
        self.runs += 1
        self.port = free_port()
        env = dict(os.environ, MANGO_POOL=self.pool, MANGO_MODE=self.mode, MANGO_POOL_SIZE=self.pool_size)
        env.pop("MANGO_TEST_SNAPSHOT", None)
        self.log = os.path.join(self.dir, "server-%d.log" % self.runs)
        t0 = time.monotonic()
        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.dir, "--logfile", self.log,
                                      "--enable-debug-command", "yes"], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c = Redis(host="127.0.0.1", port=self.port, socket_timeout=600)
        while True:
            if self.proc.poll() is not None:
                sys.exit("backup_time: the server exited (%s):\n%s" % (self.proc.returncode, self.tail()))
            try:
                if c.ping():
                    return time.monotonic() - t0
            except Exception:
                time.sleep(0.002)

    def tail(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def client(self):
        return Redis(host="127.0.0.1", port=self.port, socket_timeout=600)

    def stop(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class Probe:
    """A closed-loop SET client; latencies of the SETs that ended in a window."""

    def __init__(self, server):
        self.c = server.client()
        self.stop = threading.Event()
        self.samples = []  # (end time, latency)
        self.t = threading.Thread(target=self.run)
        self.t.start()

    def run(self):
        i = 0
        while not self.stop.is_set():
            i += 1
            t0 = time.monotonic()
            self.c.set("probe:%d" % (i % 1000), i)
            t1 = time.monotonic()
            self.samples.append((t1, t1 - t0))

    def window(self, t0, t1):
        """SETs per second that ended in [t0, t1], and the slowest SET that overlapped it."""
        ended = sum(1 for (e, _) in self.samples if t0 <= e <= t1)
        overlapping = [l for (e, l) in self.samples if e >= t0 and e - l <= t1]
        return ended / max(t1 - t0, 1e-9), max(overlapping or [0.0])

    def close(self):
        self.stop.set()
        self.t.join()


def sets_per_second(port, n, keyspace, value_size):
    """redis-benchmark's SET throughput at 32 clients on 127.0.0.1:port, or None."""
    exe = shutil.which("redis-benchmark")
    if not exe or n <= 0:
        return None
    r = subprocess.run([exe, "-h", "127.0.0.1", "-p", str(port), "-c", "32", "-n", str(n), "-t", "set",
                        "-r", str(keyspace), "-d", str(value_size), "-q"], capture_output=True, text=True,
                       timeout=3600)
    m = [l for l in r.stdout.replace("\r", "\n").splitlines() if "requests per second" in l]
    if r.returncode != 0 or not m:
        sys.exit("backup_time: redis-benchmark failed: %s" % (r.stdout + r.stderr)[-2000:])
    return float(m[-1].split()[1])


def wait_done(c, field, value, timeout=3600):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if c.info("mangosteen" if field.startswith("mango") else "persistence")[field] == value:
            return
        time.sleep(0.005)
    sys.exit("backup_time: %s did not reach %s" % (field, value))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--durable", default=DEFAULT_SERVER, help="the durable redis-server")
    ap.add_argument("--modes", default="emulated,fs", help="comma-separated: emulated, fs")
    ap.add_argument("--keys", type=int, default=1000000, help="DEBUG POPULATE keys (default 1000000)")
    ap.add_argument("--value-size", type=int, default=100, help="bytes per value (default 100)")
    ap.add_argument("--pool-size", default="4g", help="mango-pool-size (default 4g)")
    ap.add_argument("--repeat", type=int, default=2, help="repetitions (default 2)")
    ap.add_argument("--sets-after-restore", type=int, default=100000,
                    help="SET requests (32 clients) sent to each restored server; 0: none (default 100000)")
    ap.add_argument("--fs-dir", default="/var/tmp", help="fs pools, snapshots and RDB files")
    ap.add_argument("--shm-dir", default="/dev/shm", help="emulated pools")
    ap.add_argument("--out", required=True, help="output folder")
    a = ap.parse_args()
    if not os.access(a.durable, os.X_OK):
        print("backup_time: no server at %s" % a.durable, file=sys.stderr)
        sys.exit(77)
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for mode in a.modes.split(","):
        if mode not in ("emulated", "fs"):
            sys.exit("backup_time: unknown mode %r" % mode)
        work = tempfile.mkdtemp(prefix="mango-backup-", dir=a.fs_dir)
        pooldir = tempfile.mkdtemp(prefix="mango-backup-", dir=a.shm_dir if mode == "emulated" else a.fs_dir)
        s = Server(a.durable, mode, work, os.path.join(pooldir, "redis.pool"), a.pool_size)
        try:
            s.start()
            log(mode, "populating %d keys" % a.keys)
            s.client().execute_command("DEBUG", "POPULATE", a.keys, "key", a.value_size)
            heap = s.client().info("mangosteen")["mango_heap_allocated_bytes"]
            for rep in range(a.repeat):
                order = ["bgsave", "snapshot"] if rep % 2 == 0 else ["snapshot", "bgsave"]
                for what in order:
                    c = s.client()
                    rdb = os.path.join(work, "dump.rdb")
                    snap = os.path.join(work, "backup-%d.pool" % rep)
                    mine = rdb if what == "bgsave" else snap
                    if os.path.exists(mine):
                        os.unlink(mine)
                    probe = Probe(s)
                    time.sleep(1.0)
                    b0 = time.monotonic()
                    before_ops, before_max = probe.window(b0 - 1.0, b0)
                    t0 = time.monotonic()
                    if what == "bgsave":
                        c.bgsave()
                        wait_done(c, "rdb_bgsave_in_progress", 0)
                        ok = c.info("persistence")["rdb_last_bgsave_status"] == "ok"
                        pause_ms = c.info("stats")["latest_fork_usec"] / 1000.0
                    else:
                        c.execute_command("MANGOSNAPSHOT", snap)
                        time.sleep(0.01)
                        wait_done(c, "mango_snapshot_in_progress", 0)
                        info = c.info("mangosteen")
                        ok = info["mango_snapshot_last_status"] == "ok"
                        pause_ms = float(info["mango_snapshot_last_pause_ms"])
                    t1 = time.monotonic()
                    during_ops, during_max = probe.window(t0, t1)
                    probe.close()
                    if not ok:
                        sys.exit("backup_time: %s failed:\n%s" % (what, s.tail()))
                    rows.append(dict(mode=mode, rep=rep, kind="backup", what=what, seconds="%.3f" % (t1 - t0),
                                     pause_ms="%.2f" % pause_ms, ops_before="%.0f" % before_ops,
                                     ops_during="%.0f" % during_ops, slowest_before_ms="%.2f" % (before_max * 1e3),
                                     slowest_during_ms="%.2f" % (during_max * 1e3), heap_bytes=heap, keys="",
                                     sets_after=""))
                    log(mode, rep, what, rows[-1]["seconds"], "s")
                # Restores: the snapshot pool, and a new pool importing the RDB file.
                for what in ("snapshot", "rdb-import"):
                    d = tempfile.mkdtemp(prefix="mango-restore-", dir=a.fs_dir)
                    if what == "snapshot":
                        r = Server(a.durable, mode, d, snap, a.pool_size)
                    else:
                        shutil.copy(rdb, os.path.join(d, "dump.rdb"))
                        pd = tempfile.mkdtemp(prefix="mango-restore-", dir=a.shm_dir if mode == "emulated" else a.fs_dir)
                        r = Server(a.durable, mode, d, os.path.join(pd, "redis.pool"), a.pool_size)
                    secs = r.start()
                    keys = r.client().dbsize()
                    sets_after = sets_per_second(r.port, a.sets_after_restore, a.keys, a.value_size)
                    r.stop()
                    if what != "snapshot":
                        shutil.rmtree(pd, ignore_errors=True)
                    shutil.rmtree(d, ignore_errors=True)
                    if keys < a.keys:
                        sys.exit("backup_time: the %s restore holds %d keys, not %d" % (what, keys, a.keys))
                    rows.append(dict(mode=mode, rep=rep, kind="restore", what=what, seconds="%.3f" % secs,
                                     pause_ms="", ops_before="", ops_during="", slowest_before_ms="",
                                     slowest_during_ms="", heap_bytes=heap, keys=keys,
                                     sets_after="" if sets_after is None else "%.0f" % sets_after))
                    log(mode, rep, "restore", what, "%.3f s" % secs)
            s.stop()
        finally:
            s.stop()
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(pooldir, ignore_errors=True)
    with open(os.path.join(a.out, "backup.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)

    def med(mode, kind, what, key):
        v = [float(r[key]) for r in rows if r["mode"] == mode and r["kind"] == kind and r["what"] == what
             and r[key] != ""]
        return statistics.median(v) if v else float("nan")

    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=HERE).stdout.strip()
    lines = ["# Backing up a running durable Redis: MANGOSNAPSHOT vs BGSAVE", "",
             "git %s; %d keys of %d bytes; %d repetitions (medians); command: `%s`" %
             (rev, a.keys, a.value_size, a.repeat, " ".join(sys.argv)), "",
             "| mode | backup | time s | pause ms | probe SET/s before | during | slowest SET before ms | during ms "
             "| restore from it s | SET/s after restore |", "|---|---|---|---|---|---|---|---|---|---|"]
    for mode in a.modes.split(","):
        for what, restore in (("bgsave", "rdb-import"), ("snapshot", "snapshot")):
            lines.append("| %s | %s | %.2f | %.1f | %.0f | %.0f | %.1f | %.1f | %.3f | %.0f |" % (
                mode, "BGSAVE" if what == "bgsave" else "MANGOSNAPSHOT", med(mode, "backup", what, "seconds"),
                med(mode, "backup", what, "pause_ms"), med(mode, "backup", what, "ops_before"),
                med(mode, "backup", what, "ops_during"), med(mode, "backup", what, "slowest_before_ms"),
                med(mode, "backup", what, "slowest_during_ms"), med(mode, "restore", restore, "seconds"),
                med(mode, "restore", restore, "sets_after")))
    lines += ["", "pause: BGSAVE's fork (latest_fork_usec); MANGOSNAPSHOT's write side held (every batch durable, "
              "fork). Restore: exec to the first PING of a server on the snapshot pool (recovered), or on a new "
              "pool beside the RDB file (imported). SET/s after restore: redis-benchmark, 32 clients, "
              "%d SETs of %d bytes over the data set's key range, on the restored server (nan: not run)." %
              (a.sets_after_restore, a.value_size)]
    with open(os.path.join(a.out, "backup.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
