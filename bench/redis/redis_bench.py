#!/usr/bin/env python3
"""redis_bench.py -- durable Redis (Mangosteen) vs stock Redis, YCSB side by side.

Issue #5 acceptance benchmark. For every cell (client count x workload mix) it
runs every system once, in an order rotated from cell to cell so that machine
drift hits all systems alike. Each run starts the server fresh (new pool file,
new AOF directory), loads --records YCSB records with ycsb_redis, runs the mix
for --seconds in a closed loop and kills the server.

Systems (--systems):
  durable-emulated   redis-server-durable, MANGO_MODE=emulated, pool on /dev/shm
  durable-fs         redis-server-durable, MANGO_MODE=fs, pool in --fs-dir
  durable-fs-inline  the same with MANGO_PIPELINE=0: each pass's batch synced by
                     the event loop itself, as AOF-always does (not default)
  durable-fs-nogather  durable-fs with MANGO_REDIS_GATHER_US=0: no batch kept
                     open past its pass under load (not default; docs/redis.md,
                     "Gathering a batch under load")
  durable-fs-blocks  durable-fs with MANGO_DATA_RANGES=0: large stores logged as
                     32-byte blocks, as before data ranges (not default)
  durable-fs-always-pipelined  durable-fs with MANGO_REDIS_INLINE_IDLE=0: every
                     batch goes to the sync thread, even when the loop has
                     nothing else to do (not default; docs/redis.md)
  durable-none       the durable binary with MANGO_MODE=none: no pool, no
                     capture; the same build as the durable systems (clang,
                     libc malloc), so the baseline of the emulated goals
                     without Debian's build differences (gcc, jemalloc)
  stock-none         /usr/bin/redis-server, --save "" --appendonly no
  stock-aof-always   appendonly yes, appendfsync always, AOF in --fs-dir
  stock-aof-everysec appendonly yes, appendfsync everysec, AOF in --fs-dir
  stock-aof-always-shm  AOF always with the AOF on /dev/shm (tmpfs; fair
                     comparison for durable-emulated, not durable itself)

Mixes (--mixes): YCSB A (50/50 read/update), B (95/5), C (read only),
F (50 read / 50 read-modify-write) and U<P> (P% updates, the rest reads).
A is the same mix as U50, C as U0, B as U5: the update-ratio plot uses them.

Recovery (--recovery-gb G > 0): loads about G GB of record payload (G*1e6
records of 10 x 100 bytes), then measures the time from exec to the first
PING answer of (a) the durable server after SIGKILL (its pool in
/dev/shm and in --fs-dir), once per --recovery-methods value (MANGO_RESTORE:
map = the heap mapped copy-on-write from the pool, copy = copied), (b) stock
Redis loading an AOF (appendonly yes, everysec, written by the load; SIGKILL,
restart), (c) stock Redis loading an RDB (SAVE, SIGKILL, restart with
appendonly no). Page cache is warm. After each PING it measures what a lazy
restore defers: a pipelined HGETALL of --recovery-sample random records, a full
scan (DEBUG DIGEST, twice: cold and warm; the digests must all agree), the
sample again, and the server's anonymous / file-backed RSS.
--recovery-emulated-from-fs loads only the fs pool and restarts the emulated
server from a copy of it on /dev/shm (for datasets whose DRAM heap plus tmpfs
pool would not fit in memory at once).

Outputs in --out: results.csv, results.md, fig5_update_ratio.png,
fig6_clients_A.png (matplotlib), recovery.csv and (with --recovery-only)
recovery.md (with --recovery-gb).

--pin SERVER:CLIENT: CPU lists (as for taskset -c, e.g. 1:0 or 2-3:0-1) to
pin every server (all its threads) and every ycsb_redis run to; by default
both float over all CPUs and share them. Pinning takes the scheduler's
placement out of the comparison: on a 2-vCPU VM the spread between
back-to-back runs of one system shrinks; the durable server's background
threads (backend, sync) then share the server's CPUs.

Disk probe: before and after the grid, one second of 8 KiB O_DSYNC writes in
--fs-dir (bench/fs/dsync_writers, one writer, --dsync-probe) measures the
disk's sync speed; results.md reports it. AOF-always's throughput follows it,
and on a VM it varies from day to day, so the fs / AOF-always ratios of two
runs compare only with it in view. --dsync-probe "" skips the probe.

--replica: every server gets a replica, Debian's stock redis-server, attached
after the load (diskless full sync) and caught up before the run; the run then
measures a master streaming its writes. results.csv records how far the
replica trailed during the run (replica_lag_kb_mean/_max: sampled every 50 ms),
how long it took to catch up after the run and how many MB the run streamed.

--quick: the CTest smoke (2 systems, workload A, 4 clients, 2000 records,
1 s); exits 77 (skip) when stock redis-server is missing.
Exit status: 0 ok; 1 a run failed or had errors; 2 usage; 77 skipped.
"""

import argparse
import csv
import json
import math
import datetime
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

ALL_SYSTEMS = ["durable-emulated", "durable-fs", "durable-fs-inline", "durable-fs-nogather", "durable-fs-blocks",
               "durable-fs-always-pipelined", "durable-fs-paced", "durable-none",
               "stock-none", "stock-aof-always",
               "stock-aof-everysec", "stock-aof-always-shm"]
DEFAULT_SYSTEMS = ["durable-emulated", "durable-fs", "stock-none", "stock-aof-always", "stock-aof-everysec"]
MIX_UPDATE_PCT = {"A": 50, "B": 5, "C": 0, "F": None}  # F: 50% RMW
CSV_FIELDS = ["rep", "clients", "mix", "update_pct", "system", "order", "status",
              "ops", "seconds", "ops_per_sec", "p50_us", "p99_us", "p999_us", "mean_us",
              "errors", "load_seconds", "load_ops_per_sec", "cpu_idle_pct", "cpu_steal_pct",
              "client_wait_pct", "client_cpu_us_per_op", "read_p99_us", "update_p99_us",
              "target_ops_per_sec", "intended_p99_us", "intended_unstarted", "wall_s", "server_cpu_us_per_op",
              "queue_pushes", "queue_pops", "replica_catchup_s", "replica_stream_mb",
              "replica_lag_kb_mean", "replica_lag_kb_max", "settle_s", "aof_rewrites_in_run",
              "disk_flushes_per_kop", "disk_flush_us", "disk_write_us", "ops_per_log_sync"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def csv_list(s):
    return [x.strip() for x in s.split(",") if x.strip()]


def int_list(s):
    return [int(x) for x in csv_list(s)]


def cpu_list(s):
    """A taskset-style CPU list ("0", "1-3", "0,2") as a set of ints."""
    cpus = set()
    for part in csv_list(s):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise argparse.ArgumentTypeError("bad CPU list %r" % s)
        a, b = int(lo), int(hi or lo)
        if b < a:
            raise argparse.ArgumentTypeError("bad CPU range %r" % part)
        cpus.update(range(a, b + 1))
    if not cpus:
        raise argparse.ArgumentTypeError("empty CPU list %r" % s)
    return cpus


def pin_spec(s):
    """SERVER:CLIENT CPU lists -> (set, set), both within this process's CPUs."""
    server, sep, client = s.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError("--pin wants SERVER:CLIENT CPU lists, e.g. 1:0")
    pin = (cpu_list(server), cpu_list(client))
    allowed = os.sched_getaffinity(0)
    for cpus in pin:
        if not cpus <= allowed:
            raise argparse.ArgumentTypeError("--pin %s: CPUs %s are not available (allowed: %s)" % (
                s, ",".join(map(str, sorted(cpus - allowed))), ",".join(map(str, sorted(allowed)))))
    return pin


def pinned_to(cpus):
    """preexec_fn for subprocess: run the child on cpus (None: unchanged)."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def mix_update_pct(mix):
    if mix in MIX_UPDATE_PCT:
        return MIX_UPDATE_PCT[mix]
    return int(mix[1:])


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def ping_once(port, timeout=0.2):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            data = s.recv(64)
            return data.startswith(b"+PONG")
    except OSError:
        return False


def resp_request(*args):
    """A command in RESP (an array of bulk strings)."""
    req = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        req += b"$%d\r\n%s\r\n" % (len(a), a)
    return req


def redis_cmd(port, *args, timeout=600):
    """One command over RESP, returns the raw reply line (simple/int/error/bulk header)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(resp_request(*args))
        return reply_line(s)


def reply_line(s):
    """The first line of the reply waiting on socket s (simple/int/error/bulk header)."""
    buf = b""
    while b"\r\n" not in buf:
        d = s.recv(4096)
        if not d:
            break
        buf += d
    return buf.split(b"\r\n")[0].decode(errors="replace")


class QueueLoad:
    """--queue-rate: a queue beside the YCSB run. One producer LPUSHes to
    queue:0 at a steady rate (its own connection), one consumer waits in
    BLPOP queue:0 (1 s timeout) and pops each element, so Redis serves a
    blocked client after most pushes (handleClientsBlockedOnKeys), as with
    workers on a job queue. Counts pushes and pops."""

    def __init__(self, port, rate):
        self.port, self.rate = port, rate
        self.stop = threading.Event()
        self.pushes = self.pops = 0
        self.error = None
        self.threads = [threading.Thread(target=self._guard, args=(f,), daemon=True)
                        for f in (self._consume, self._produce)]

    def start(self):
        for t in self.threads:
            t.start()
        time.sleep(0.05)  # the consumer blocked before the first push

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(10)
        if self.error:
            raise RuntimeError("queue load: %s" % self.error)
        return self.pushes, self.pops

    def _guard(self, fn):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
                fn(sock, sock.makefile("rb"))
        except Exception as e:  # reported by finish()
            self.error = self.error or "%s: %s" % (fn.__name__, e)
            self.stop.set()

    def _consume(self, sock, f):
        while not self.stop.is_set():
            sock.sendall(resp_request("BLPOP", "queue:0", "1"))
            head = f.readline()
            if head.startswith(b"*2"):
                for _ in range(4):  # $len, key, $len, value
                    f.readline()
                self.pops += 1
            elif not head.startswith(b"*-1"):
                raise RuntimeError("BLPOP answered %r" % head)

    def _produce(self, sock, f):
        t0 = time.monotonic()
        while not self.stop.is_set():
            sock.sendall(resp_request("LPUSH", "queue:0", "job"))
            head = f.readline()
            if not head.startswith(b":"):
                raise RuntimeError("LPUSH answered %r" % head)
            self.pushes += 1
            delay = t0 + self.pushes / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def info_section(port, section):
    """INFO <section> of the server on port, as a dict of its fields."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sk:
        sk.sendall(resp_request("INFO", section))
        f = sk.makefile("rb")
        head = f.readline()
        if not head.startswith(b"$"):
            raise RuntimeError("INFO %s answered %r" % (section, head))
        body = f.read(int(head[1:]) + 2).decode(errors="replace")
    return dict(line.split(":", 1) for line in body.split("\r\n") if ":" in line)


def info_replication(port):
    return info_section(port, "replication")


def file_sha256(path):
    import hashlib
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return "n/a"
    return h.hexdigest()[:16]


def build_identity(args):
    """What ran, so that a result can be tied to a build (a benchmark audit,
    session 37): the repository's commit (and whether its tree had changes),
    hashes of the binaries, the MANGO_* variables passed through."""
    def git(*a):
        r = subprocess.run(["git", "-C", REPO] + list(a), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return r.stdout.strip() if r.returncode == 0 else "n/a"
    return dict(commit=git("rev-parse", "--short=12", "HEAD"),
                tree_changed=git("status", "--porcelain", "--untracked-files=no") not in ("", "n/a"),
                durable_sha256=file_sha256(args.durable), stock_sha256=file_sha256(args.stock),
                ycsb_sha256=file_sha256(args.ycsb),
                mango_env={k: v for k, v in os.environ.items() if k.startswith("MANGO_")})


def settle_after_load(srv, timeout=600):
    """--settle: each system starts its run as a long-running server would be,
    not with the load's leftovers. Stock Redis with an AOF: the load leaves a
    base file of a few bytes and 60 MB of appended commands, so its automatic
    rewrite (100 % growth over 64 MB) started 0.6-1.3 s into a run (found by
    a benchmark audit, session 37): a BGREWRITEAOF after the load, waited
    for. Durable Redis: its backend's backlog of applying the load's log to
    the pool, waited for until the log is applied. Returns the seconds it
    took."""
    t0 = time.monotonic()
    aof = srv.system.startswith("stock-aof")
    if aof:
        # The load may have set off Redis's own rewrite (AOF-everysec loads
        # fast enough to pass 64 MB): wait for it, then rewrite what came
        # after it (session 41: "already in progress" failed every such run).
        while True:
            reply = redis_cmd(srv.port, "BGREWRITEAOF")
            if "already in progress" not in reply:
                break
            if time.monotonic() - t0 > timeout:
                raise RuntimeError("%s: an AOF rewrite still in progress after %d s" % (srv.system, timeout))
            time.sleep(0.05)
        if reply.startswith("-"):
            raise RuntimeError("%s: BGREWRITEAOF answered %r" % (srv.system, reply))
    elif not srv.system.startswith("durable"):
        return 0.0
    while time.monotonic() - t0 < timeout:
        if aof:
            p = info_section(srv.port, "persistence")
            if p.get("aof_rewrite_in_progress") == "0" and p.get("aof_rewrite_scheduled") == "0":
                return time.monotonic() - t0
        elif int(info_section(srv.port, "mangosteen").get("mango_log_unapplied_bytes", "0")) == 0:
            return time.monotonic() - t0
        time.sleep(0.05)
    raise RuntimeError("%s: not settled after the load within %d s" % (srv.system, timeout))


def aof_rewrites(srv):
    """Rewrites stock Redis made so far ("" for durable systems and no AOF)."""
    if not srv.system.startswith("stock-aof"):
        return ""
    return int(info_section(srv.port, "persistence").get("aof_rewrites", "0"))


class Replica:
    """--replica: a stock redis-server replicating from a server under test
    (diskless full sync), with its own directory; nothing persisted."""

    def __init__(self, args, master_port, workdir, tag):
        self.port = free_port()
        self.dir = os.path.join(workdir, "replica-%s" % tag)
        os.makedirs(self.dir, exist_ok=True)
        self.keep = args.keep
        reply = redis_cmd(master_port, "CONFIG", "SET", "repl-diskless-sync-delay", "0")
        if not reply.startswith("+OK"):
            raise RuntimeError("CONFIG SET repl-diskless-sync-delay answered %r" % reply)
        cmd = [args.stock, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--daemonize", "no", "--dir", self.dir, "--logfile", os.path.join(self.dir, "replica.log"),
               "--replicaof", "127.0.0.1", str(master_port)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT, preexec_fn=pinned_to(args.pin and args.pin[0]))

    def catch_up(self, master_port, timeout=300):
        """Seconds until the replica's link is up and it has the master's whole stream."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError("the replica exited; log %s" % os.path.join(self.dir, "replica.log"))
            if ping_once(self.port):
                mine = info_replication(self.port)
                if mine.get("master_link_status") == "up" and \
                        mine.get("slave_repl_offset") == info_replication(master_port)["master_repl_offset"]:
                    return time.monotonic() - t0
            time.sleep(0.01)
        raise RuntimeError("the replica did not catch up within %ss" % timeout)

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)


class ReplicaLag(threading.Thread):
    """--replica: how far the replica trails its master during the run.
    Every 50 ms: the replica's slave_repl_offset, then the master's
    master_repl_offset (in that order, so the few bytes fed between the two
    reads count as lag: an overestimate, the same for every system). On a
    durable master the INFO reply itself waits for the batches in flight."""

    def __init__(self, master_port, replica_port):
        super().__init__(daemon=True)
        self.master_port, self.replica_port = master_port, replica_port
        self.stop = threading.Event()
        self.samples = []
        self.error = None

    def run(self):
        try:
            while not self.stop.wait(0.05):
                mine = int(info_replication(self.replica_port).get("slave_repl_offset", 0))
                master = int(info_replication(self.master_port)["master_repl_offset"])
                self.samples.append(max(0, master - mine))
        except Exception as e:  # reported by finish()
            self.error = e

    def finish(self):
        """(mean, max) lag in KB, as strings for results.csv."""
        self.stop.set()
        self.join()
        if self.error:
            raise RuntimeError("sampling the replica's lag: %s" % self.error)
        if not self.samples:
            return "", ""
        return ("%.1f" % (sum(self.samples) / len(self.samples) / 1e3), "%.1f" % (max(self.samples) / 1e3))


class Server:
    """One server instance of a system, with its own files."""

    def __init__(self, args, system, workdir, tag, pool_size=None):
        self.args, self.system = args, system
        self.port = free_port()
        self.sock = None  # --transport unix: the clients' Unix-domain socket
        self.dir = os.path.join(workdir, "%s-%s" % (system, tag))
        fsdir = os.path.join(args.fs_dir, "mango-redis-bench-%d" % os.getpid())
        shmdir = os.path.join(args.shm_dir, "mango-redis-bench-%d" % os.getpid())
        self.env = dict(os.environ)
        self.extra = []
        self.cleanup_paths = [self.dir]
        self.pool = None
        if system.startswith("durable"):
            self.binary = args.durable
            base = shmdir if system in ("durable-emulated", "durable-none") else fsdir
            os.makedirs(base, exist_ok=True)
            self.pool = os.path.join(base, "%s-%s.pool" % (system, tag))
            self.env["MANGO_POOL"] = self.pool
            self.env["MANGO_MODE"] = {"durable-emulated": "emulated", "durable-none": "none"}.get(system, "fs")
            self.env.pop("MANGO_PIPELINE", None)  # from the caller's environment: not for durable-fs
            self.env.pop("MANGO_REDIS_GATHER_US", None)
            self.env.pop("MANGO_DATA_RANGES", None)
            self.env.pop("MANGO_REDIS_INLINE_IDLE", None)
            if system == "durable-fs-inline":
                self.env["MANGO_PIPELINE"] = "0"
            if system == "durable-fs-nogather":
                self.env["MANGO_REDIS_GATHER_US"] = "0"
            if system == "durable-fs-blocks":
                self.env["MANGO_DATA_RANGES"] = "0"
            if system == "durable-fs-always-pipelined":
                self.env["MANGO_REDIS_INLINE_IDLE"] = "0"
            if pool_size or args.pool_size:
                self.env["MANGO_POOL_SIZE"] = pool_size or args.pool_size
            if args.log_size:
                self.env["MANGO_LOG_SIZE"] = args.log_size
            self.cleanup_paths.append(self.pool)
            self.extra = ["--appendonly", "no"]
        else:
            self.binary = args.stock
            if system == "stock-none":
                self.extra = ["--appendonly", "no"]
            else:
                base = shmdir if system.endswith("-shm") else fsdir
                self.dir = os.path.join(base, "%s-%s" % (system, tag))
                self.cleanup_paths = [self.dir]
                fsync = "everysec" if "everysec" in system else "always"
                self.extra = ["--appendonly", "yes", "--appendfsync", fsync]
        self.proc = None
        self.remove_files()
        os.makedirs(self.dir, exist_ok=True)

    def remove_files(self):
        for p in self.cleanup_paths:
            if os.path.isdir(p):
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.exists(p):
                os.unlink(p)

    def start(self, extra=None, logname="server.log", timeout=600):
        """Starts the server; returns seconds from exec to the first PING answer."""
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--daemonize", "no", "--dir", self.dir,
               "--logfile", os.path.join(self.dir, logname)] + (extra if extra is not None else self.extra)
        if getattr(self.args, "transport", "tcp") == "unix":
            self.sock = os.path.join(self.dir, "redis.sock")
            cmd += ["--unixsocket", self.sock, "--unixsocketperm", "700"]
        t0 = self.t0 = time.monotonic()
        errpath = os.path.join(self.dir, logname + ".stderr")
        with open(errpath, "wb") as err:
            self.proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=err, stderr=subprocess.STDOUT,
                                         preexec_fn=pinned_to(self.args.pin and self.args.pin[0]))
        while True:
            if ping_once(self.port):
                return time.monotonic() - t0
            if self.proc.poll() is not None:
                tail = ""
                for path in (os.path.join(self.dir, logname), errpath):
                    try:
                        tail += " | ".join(open(path, errors="replace").read().splitlines()[-6:]) + " || "
                    except OSError:
                        pass
                raise RuntimeError("%s exited with %s at start; log %s: %s" % (
                    self.system, self.proc.returncode, os.path.join(self.dir, logname), tail))
            if time.monotonic() - t0 > timeout:
                raise RuntimeError("%s did not answer PING within %ss" % (self.system, timeout))
            time.sleep(0.002)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def close(self):
        self.kill()
        if not self.args.keep:
            self.remove_files()


def out_workdir(args):
    """Makes args.out absolute (the servers chdir into their --dir) and
    creates it; returns the folder for the servers' files inside it."""
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    return os.path.join(args.out, "work")


def remove_pool_dirs(args):
    """The per-process folders Server puts pools and AOFs in (fs and shm)."""
    for base in (args.fs_dir, args.shm_dir):
        shutil.rmtree(os.path.join(base, "mango-redis-bench-%d" % os.getpid()), ignore_errors=True)


def run_ycsb(args, phase, port, clients, extra, timeout, sock=None):
    where = ["--socket", sock] if sock else ["-p", str(port)]
    cmd = [args.ycsb, phase] + where + ["-r", str(args.records_for_phase),
           "-c", str(clients), "-t", str(min(args.ycsb_threads, clients)),
           "--progress", "0"] + extra
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout, preexec_fn=pinned_to(args.pin and args.pin[1]))
    wall = time.monotonic() - t0
    kv = {}
    for line in p.stdout.splitlines():
        if line.startswith("workload="):
            kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
    if not kv:
        raise RuntimeError("ycsb_redis %s: no result line (exit %d): %s" % (
            phase, p.returncode, (p.stderr or p.stdout)[-500:]))
    kv["exit"] = p.returncode
    kv["wall"] = wall
    return kv


def cpu_times():
    """(idle incl. iowait, steal, total) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return v[3] + v[4], v[7], sum(v)


def proc_cpu_seconds(pid):
    """User + system CPU seconds of process pid, all its threads (/proc/<pid>/stat); None if gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def disk_counters(path):
    """(writes, write ms, flushes, flush ms) completed so far by the block device holding path,
    from /sys/dev/block/MAJ:MIN/stat (Documentation/ABI/stable/sysfs-block), or None when path
    is not on a block device (tmpfs) or the kernel does not count flushes. Counts the whole
    device: anything else writing to it during a run is in them too."""
    try:
        dev = os.stat(path).st_dev
        with open("/sys/dev/block/%d:%d/stat" % (os.major(dev), os.minor(dev))) as f:
            v = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return None
    if len(v) < 17:
        return None
    return v[4], v[7], v[15], v[16]


def disk_during(before, after, ops):
    """Per-run disk columns from two disk_counters(): flushes per 1000 operations, and the mean
    time of one flush and of one write (µs; the kernel counts milliseconds summed over requests,
    so a mean over a few thousand requests is good to a few µs). Empty strings where unknown."""
    if before is None or after is None:
        return dict(disk_flushes_per_kop="", disk_flush_us="", disk_write_us="")
    writes, write_ms, flushes, flush_ms = (a - b for a, b in zip(after, before))
    return dict(disk_flushes_per_kop="%.1f" % (1000.0 * flushes / ops) if ops > 0 else "",
                disk_flush_us="%.0f" % (1000.0 * flush_ms / flushes) if flushes > 0 else "",
                disk_write_us="%.0f" % (1000.0 * write_ms / writes) if writes > 0 else "")


def log_syncs(srv):
    """The durable server's log syncs so far (INFO mangosteen), or None for stock Redis."""
    if not srv.system.startswith("durable"):
        return None
    v = info_section(srv.port, "mangosteen").get("mango_log_syncs")
    return int(v) if v is not None else None


def cpu_share(before, after):
    """Idle and steal percentages of the machine between two cpu_times()."""
    total = after[2] - before[2]
    if total <= 0:
        return float("nan"), float("nan")
    return 100.0 * (after[0] - before[0]) / total, 100.0 * (after[1] - before[1]) / total


def disk_probe(args):
    """One second of 8 KiB O_DSYNC writes in --fs-dir from one writer, with the CPUs idle and
    then with two busy spinner threads: {"syncs_per_s": N, "mean_us": M, "p99_us": P,
    "busy": {the same keys}}, or None (no probe binary, or it failed). The busy half shows how
    the sync tail grows when the vCPUs do not idle (docs/redis-benchmarks.md, "The sync tail on a busy VM")."""
    if not args.dsync_probe or not os.access(args.dsync_probe, os.X_OK):
        return None
    try:
        out = subprocess.run([args.dsync_probe, "--dir", args.fs_dir, "--writers", "1", "--spinners", "0,2",
                              "--seconds", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        log("disk probe failed: %s" % e)
        return None
    lines = [dict(t.split("=", 1) for t in line.split() if "=" in t) for line in out.stdout.splitlines()]
    lines = [kv for kv in lines if "syncs_per_s" in kv and "mean_us" in kv]
    if out.returncode != 0 or not lines:
        log("disk probe failed (exit %d): %s" % (out.returncode, (out.stderr or out.stdout).strip()[:200]))
        return None

    def one(kv):
        d = {"syncs_per_s": int(kv["syncs_per_s"]), "mean_us": int(kv["mean_us"])}
        if "p99_us" in kv:
            d["p99_us"] = int(kv["p99_us"])
        return d
    res = one(lines[0])
    if len(lines) > 1:
        res["busy"] = one(lines[1])
    return res


def one_run(args, workdir, system, clients, mix, tag, target=None):
    srv = Server(args, system, workdir, tag)
    replica = None
    try:
        srv.start()
        args.records_for_phase = args.records
        load = run_ycsb(args, "load", srv.port, args.load_clients, [], timeout=3600, sock=srv.sock)
        if int(load.get("errors", 1)) or load["exit"]:
            raise RuntimeError("%s: load had errors: %s" % (system, load))
        if args.maxmemory:  # Redis then checks for evictions before every command
            reply = redis_cmd(srv.port, "CONFIG", "SET", "maxmemory", str(args.maxmemory))
            if not reply.startswith("+OK"):
                raise RuntimeError("%s: CONFIG SET maxmemory answered %r" % (system, reply))
        for i in range(args.volatile_keys):  # keys with a TTL: Redis's expire cycles then run every pass
            reply = redis_cmd(srv.port, "SET", "ttl:%d" % i, "v", "EX", "86400")
            if not reply.startswith("+OK"):
                raise RuntimeError("%s: SET with a TTL answered %r" % (system, reply))
        if args.replica:
            replica = Replica(args, srv.port, workdir, "%s-%s" % (system, tag))
            replica.catch_up(srv.port)
            offset0 = int(info_replication(srv.port)["master_repl_offset"])
        settle_s = "%.2f" % settle_after_load(srv) if args.settle else ""
        rewrites0 = aof_rewrites(srv)
        mixarg = ["-w", mix] if mix in MIX_UPDATE_PCT else ["--update-pct", str(mix_update_pct(mix))]
        syncs0 = log_syncs(srv)
        d0 = disk_counters(args.fs_dir)
        t0 = cpu_times()
        s0 = proc_cpu_seconds(srv.proc.pid)
        if target:
            mixarg += ["--target", "%.0f" % target]
        queue = QueueLoad(srv.port, args.queue_rate) if args.queue_rate > 0 else None
        if queue:
            queue.start()
        lag = ReplicaLag(srv.port, replica.port) if replica else None
        if lag:
            lag.start()
        try:
            res = run_ycsb(args, "run", srv.port, clients, mixarg + ["-s", str(args.seconds)],
                           timeout=args.seconds * 5 + 120, sock=srv.sock)
        finally:
            if queue:
                queue.stop.set()
            lag_mean, lag_max = lag.finish() if lag else ("", "")
        qpush, qpop = queue.finish() if queue else ("", "")
        idle, steal = cpu_share(t0, cpu_times())
        s1 = proc_cpu_seconds(srv.proc.pid)
        disk = disk_during(d0, disk_counters(args.fs_dir), int(res.get("ops", 0) or 0))
        syncs1 = log_syncs(srv)
        ops_per_sync = ("%.1f" % (int(res["ops"]) / (syncs1 - syncs0))
                        if syncs0 is not None and syncs1 is not None and syncs1 > syncs0 else "")
        server_cpu = ("%.2f" % ((s1 - s0) * 1e6 / int(res["ops"]))
                      if s0 is not None and s1 is not None and int(res.get("ops", 0) or 0) > 0 else "")
        rewrites = aof_rewrites(srv)
        rewrites = rewrites - rewrites0 if rewrites != "" else ""
        status = "ok" if (res["exit"] == 0 and int(res.get("errors", 0)) == 0) else "errors"
        catchup = stream_mb = ""
        if replica:  # after the run: how far behind the replica was, and how much it received
            catchup = "%.3f" % replica.catch_up(srv.port, timeout=120)
            stream_mb = "%.1f" % ((int(info_replication(srv.port)["master_repl_offset"]) - offset0) / 1e6)
        return dict(replica_catchup_s=catchup, replica_stream_mb=stream_mb,
                    replica_lag_kb_mean=lag_mean, replica_lag_kb_max=lag_max,
                    status=status, ops=res["ops"], seconds=res["seconds"],
                    ops_per_sec=float(res["ops_per_sec"]), p50_us=float(res["p50_us"]),
                    p99_us=float(res["p99_us"]), p999_us=float(res.get("p999_us", "nan")),
                    mean_us=float(res.get("mean_us", "nan")), errors=int(res.get("errors", 0)),
                    load_seconds=float(load["seconds"]), load_ops_per_sec=float(load["ops_per_sec"]),
                    cpu_idle_pct="%.1f" % idle, cpu_steal_pct="%.1f" % steal,
                    client_wait_pct=res.get("client_wait_pct", ""),
                    client_cpu_us_per_op=res.get("client_cpu_us_per_op", ""),
                    read_p99_us=res.get("read_p99_us", ""), update_p99_us=res.get("update_p99_us", ""),
                    target_ops_per_sec=res.get("target_ops_per_sec", ""),
                    intended_p99_us=res.get("intended_p99_us", ""),
                    intended_unstarted=res.get("intended_unstarted", ""), server_cpu_us_per_op=server_cpu,
                    queue_pushes=qpush, queue_pops=qpop, settle_s=settle_s, aof_rewrites_in_run=rewrites,
                    ops_per_log_sync=ops_per_sync, **disk)
    finally:
        if replica:
            replica.close()
        srv.close()


# ---------------------------------------------------------------- reporting

def med(rows, key):
    v = [float(r[key]) for r in rows if r.get("status") == "ok" and r.get(key) not in (None, "")]
    return statistics.median(v) if v else float("nan")


def cell_value(rows, system, clients, mix, key="ops_per_sec"):
    return med([r for r in rows if r["system"] == system and int(r["clients"]) == clients
                and r["mix"] == mix], key)


def paired_ratios(rows, a, b, clients, mix, key="ops_per_sec"):
    """a/b per repetition (the systems of one repetition ran back to back)."""
    def by_rep(system):
        return {int(r["rep"]): float(r[key]) for r in rows
                if r["system"] == system and int(r["clients"]) == clients and r["mix"] == mix
                and r.get("status") == "ok"}
    ra, rb = by_rep(a), by_rep(b)
    return [ra[k] / rb[k] for k in sorted(ra) if k in rb and rb[k] > 0]


def fmt_spread(v):
    """' (min–max)' of per-repetition ratios; '' with fewer than two."""
    return "" if len(v) < 2 else " (%.2f–%.2f)" % (min(v), max(v))


def fmt_k(x):
    return "–" if x != x else "%.1f" % (x / 1000.0)


def fmt_us(x):
    return "–" if x != x else ("%.0f" % x if x >= 100 else "%.1f" % x)


def fmt_ratio(x):
    return "–" if x != x else "%.2f" % x


def ordered_mixes(mixes):
    return sorted(mixes, key=lambda m: (m not in MIX_UPDATE_PCT, m if m in MIX_UPDATE_PCT else mix_update_pct(m)))


def write_md(args, rows, path, meta, recovery_rows):
    systems = [s for s in ALL_SYSTEMS if any(r["system"] == s for r in rows)]
    clients_l = sorted({int(r["clients"]) for r in rows})
    mixes = ordered_mixes({r["mix"] for r in rows})
    out = []
    out.append("# Durable Redis vs stock Redis (YCSB) — %s\n" % meta["date"])
    out.append("Generated by `bench/redis/redis_bench.py`; command: `%s`.\n" % meta["cmd"])
    pin = getattr(args, "pin", None)
    placement = ("server pinned to CPUs %s, load generator to CPUs %s" % (
        ",".join(map(str, sorted(pin[0]))), ",".join(map(str, sorted(pin[1])))) if pin
        else "server and load generator share the cores")
    out.append("- machine: %s, %d cores, kernel %s; %s (loopback TCP)" % (
        meta["cpu"], os.cpu_count(), platform.release(), placement))
    out.append("- durable: `%s` (Redis 7.0.15 + Mangosteen); stock: `%s` (%s)" % (
        args.durable, args.stock, meta["stock_version"]))
    out.append("- records: %d hashes of 10 x 100-byte fields, Zipfian 0.99, closed loop, no pipelining; "
               "load with %d clients, then %.1f s of run per cell; ycsb_redis threads: %d; "
               "repetitions: %d (median shown)" % (args.records, args.load_clients, args.seconds,
                                                    args.ycsb_threads, args.repeat))
    if getattr(args, "maxmemory", 0):
        out.append("- after the load, `CONFIG SET maxmemory %d` (above what the data needs: nothing is "
                   "evicted, but Redis checks for evictions before every command)" % args.maxmemory)
    if getattr(args, "volatile_keys", 0):
        out.append("- after the load, %d more keys set with a TTL of a day (`ttl:<i>`), so that Redis's "
                   "expire cycles run in every event-loop pass, as in any dataset with TTLs; the workload "
                   "does not touch them" % args.volatile_keys)
    if getattr(args, "queue_rate", 0):
        qrows = [r for r in rows if r.get("status") == "ok" and r.get("queue_pushes") not in (None, "")]
        pushes = sum(int(r["queue_pushes"]) for r in qrows)
        pops = sum(int(r["queue_pops"]) for r in qrows)
        out.append("- during each run a queue beside the workload: one producer LPUSHes at %g/s, one consumer "
                   "waits in BLPOP, so Redis serves a blocked client after most pushes (%d pushes, %d pops "
                   "over the runs shown)" % (args.queue_rate, pushes, pops))
    if getattr(args, "replica", False):
        rrows = [r for r in rows if r.get("status") == "ok" and r.get("replica_catchup_s") not in (None, "")]
        worst = max((float(r["replica_catchup_s"]) for r in rrows), default=float("nan"))
        out.append("- every server had a replica: Debian's stock redis-server, attached after the load "
                   "(diskless full sync, then caught up before the run), so each run streams its writes to "
                   "it; after the run the replica caught up within %.3f s at worst (column "
                   "`replica_catchup_s` of results.csv; `replica_stream_mb`: the stream of the run)" % worst)
        lags = {}
        for r in rrows:
            if r.get("replica_lag_kb_mean") not in (None, ""):
                lags.setdefault(r["system"], []).append((float(r["replica_lag_kb_mean"]),
                                                         float(r["replica_lag_kb_max"])))
        if lags:
            out.append("- how far the replica trailed its master during the runs (sampled every 50 ms; mean "
                       "of the runs' means / largest sample, KB): " + "; ".join(
                           "%s %.1f / %.1f" % (system, sum(m for m, _ in v) / len(v), max(x for _, x in v))
                           for system, v in sorted(lags.items())))
    out.append("- fresh server per run (new pool / new AOF dir); systems interleaved per cell in %s; "
               "fs pool and AOF files in `%s` (%s), emulated pool on `%s`" % (
                   "the order given, the same in every cell (`--fixed-order`)" if getattr(args, "fixed_order", False)
                   else "a rotated order", args.fs_dir, meta["fs_type"], args.shm_dir))
    if getattr(args, "settle", False):
        rw = [int(r["aof_rewrites_in_run"]) for r in rows
              if r.get("status") == "ok" and r.get("aof_rewrites_in_run") not in (None, "")]
        out.append("- after the load each system settled before its run (`--settle`): stock Redis with an "
                   "AOF rewrote it (`BGREWRITEAOF`, waited for; without it the load's 60 MB of appended "
                   "commands over a base of a few bytes set off Redis's automatic rewrite 0.6-1.3 s into "
                   "a run), durable Redis applied its log to the pool (column `settle_s`); automatic AOF "
                   "rewrites during the runs shown: %d" % sum(rw))
    else:
        out.append("- each run started right after the load (`--no-settle`): stock Redis's automatic AOF "
                   "rewrite may run during it")
    b = meta.get("build") or {}
    if b:
        out.append("- build: commit %s%s; durable binary sha256 %s…, stock %s…, ycsb_redis %s…; MANGO_* "
                   "variables passed through: %s" % (
                       b.get("commit"), " (tree with changes)" if b.get("tree_changed") else "",
                       b.get("durable_sha256"), b.get("stock_sha256"), b.get("ycsb_sha256"),
                       ", ".join("%s=%s" % kv for kv in sorted(b.get("mango_env", {}).items())) or "none"))
    out.append("- mixes: A = 50 % read/50 % update (= U50), B = 95/5 (= U5), C = read only (= U0), "
               "F = 50 % read/50 % read-modify-write, U<P> = P % updates. Read = HGETALL, update = "
               "HSET of one field.\n")
    probe = meta.get("disk_probe") or {}
    if probe.get("before") or probe.get("after"):
        def fmt_probe(d):
            if not d:
                return "not measured"
            def p99(x):
                return ", p99 %d µs" % x["p99_us"] if "p99_us" in x else ""
            text = "%d syncs/s (%d µs each%s)" % (d["syncs_per_s"], d["mean_us"], p99(d))
            if d.get("busy"):
                b = d["busy"]
                text += " idle, %d syncs/s (%d µs each%s) with two busy threads" % (
                    b["syncs_per_s"], b["mean_us"], p99(b))
            return text
        out.append("- the disk's sync speed (8 KiB `O_DSYNC` writes in `%s`, one writer, 1 s, "
                   "`dsync_writers`): before the runs %s, after them %s. AOF-always waits for one such "
                   "sync per event-loop pass, so its throughput follows this speed, which on a VM varies "
                   "from day to day; compare fs / AOF-always ratios of different runs with it in view.\n"
                   % (args.fs_dir, fmt_probe(probe.get("before")), fmt_probe(probe.get("after"))))
    steal = [float(r["cpu_steal_pct"]) for r in rows if r.get("cpu_steal_pct") not in (None, "")]
    if steal:
        out.append("- CPU time stolen by the host (hypervisor steal, /proc/stat) during the runs: "
                   "median %.1f %%, highest %.1f %%; %d of %d runs above 2 %%. Runs with steal are "
                   "slower whatever the system; compare the paired ratios. Each run's idle and steal "
                   "share is in the CSV.\n" % (statistics.median(steal), max(steal),
                                               sum(1 for x in steal if x > 2), len(steal)))
    waits = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("client_wait_pct") not in (None, ""):
            waits.setdefault((r["system"], int(r["clients"])), []).append(float(r["client_wait_pct"]))
    if waits:
        out.append("- The load generator's threads, runnable but waiting for a CPU (share of their run "
                   "time, `client_wait_pct` in the CSV; median over the runs): " + "; ".join(
                       "%s %d clients %.1f %%" % (sy, c, statistics.median(v))
                       for (sy, c), v in sorted(waits.items(), key=lambda kv: (kv[0][1], kv[0][0]))) +
                   ". Server and load generator share the CPUs: a client thread that waits holds back "
                   "the replies of all its connections, and the wait is part of their latency, so a "
                   "system that leaves less CPU idle also pays for the load generator's queueing in its "
                   "p99.\n")
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        out.append("**%d run(s) failed or had errors** (excluded from the medians): %s\n" % (
            len(bad), ", ".join("%s/%s/%s: %s" % (r["system"], r["mix"], r["clients"], r["status"]) for r in bad)))

    for c in clients_l:
        out.append("## %d client%s: throughput (kops/s) and p99 (µs)\n" % (c, "" if c == 1 else "s"))
        hdr = "| mix | upd % | " + " | ".join("%s kops/s" % s for s in systems) + " | " + \
              " | ".join("%s p99" % s for s in systems) + " |"
        out.append(hdr)
        out.append("|" + "---|" * (2 + 2 * len(systems)))
        for m in mixes:
            up = mix_update_pct(m)
            cells = [fmt_k(cell_value(rows, s, c, m)) for s in systems] + \
                    [fmt_us(cell_value(rows, s, c, m, "p99_us")) for s in systems]
            out.append("| %s | %s | %s |" % (m, "RMW 50" if up is None else up, " | ".join(cells)))
        out.append("")
        # ratios
        ratio_cols = []
        if "stock-none" in systems:
            ratio_cols += [(s, "stock-none") for s in systems if s != "stock-none"]
        if "durable-fs" in systems and "stock-aof-always" in systems:
            ratio_cols.append(("durable-fs", "stock-aof-always"))
        if "durable-fs" in systems and "stock-aof-everysec" in systems:
            ratio_cols.append(("durable-fs", "stock-aof-everysec"))
        if "durable-fs-inline" in systems and "stock-aof-always" in systems:
            ratio_cols.append(("durable-fs-inline", "stock-aof-always"))
        if "durable-fs-nogather" in systems and "stock-aof-always" in systems:
            ratio_cols.append(("durable-fs-nogather", "stock-aof-always"))
        if "durable-fs-always-pipelined" in systems and "stock-aof-always" in systems:
            ratio_cols.append(("durable-fs-always-pipelined", "stock-aof-always"))
        if "durable-fs-paced" in systems and "stock-aof-always" in systems:
            ratio_cols.append(("durable-fs-paced", "stock-aof-always"))
        if "durable-emulated" in systems and "durable-none" in systems:
            ratio_cols.append(("durable-emulated", "durable-none"))
        if "durable-none" in systems and "stock-none" in systems:
            ratio_cols.append(("durable-none", "stock-none"))
        if "durable-emulated" in systems and "stock-aof-always-shm" in systems:
            ratio_cols.append(("durable-emulated", "stock-aof-always-shm"))
        if ratio_cols:
            out.append("Throughput ratios (%d client%s; ratio of the medians, then in parentheses the "
                       "lowest and highest ratio of one repetition's runs):\n" % (c, "" if c == 1 else "s"))
            out.append("| mix | " + " | ".join("%s / %s" % rc for rc in ratio_cols) +
                       (" | p99 durable-fs / aof-always |" if ("durable-fs", "stock-aof-always") in ratio_cols else " |"))
            n = len(ratio_cols) + (1 if ("durable-fs", "stock-aof-always") in ratio_cols else 0)
            out.append("|---|" + "---|" * n)
            for m in mixes:
                vals = [fmt_ratio(cell_value(rows, a, c, m) / cell_value(rows, b, c, m)) +
                        fmt_spread(paired_ratios(rows, a, b, c, m)) for a, b in ratio_cols]
                if ("durable-fs", "stock-aof-always") in ratio_cols:
                    vals.append(fmt_ratio(cell_value(rows, "durable-fs", c, m, "p99_us") /
                                          cell_value(rows, "stock-aof-always", c, m, "p99_us")) +
                                fmt_spread(paired_ratios(rows, "durable-fs", "stock-aof-always", c, m, "p99_us")))
                out.append("| %s | %s |" % (m, " | ".join(vals)))
            out.append("")
        # The server's own CPU per operation (all its threads: event loop, sync thread, backend):
        # a server that waits (AOF-always's fdatasync) against one that computes. With the loop
        # saturated it is only the inverse of the throughput (bench/README.md).
        if any(not math.isnan(cell_value(rows, sy, c, m, "server_cpu_us_per_op")) for sy in systems for m in mixes):
            out.append("Server CPU per operation (µs of user + system time of the server process, all its "
                       "threads, during the run, per operation; median over the repetitions):\n")
            out.append("| mix | " + " | ".join(systems) + " |")
            out.append("|---|" + "---|" * len(systems))
            for m in mixes:
                out.append("| %s | %s |" % (m, " | ".join(
                    "%.1f" % v if not math.isnan(v) else "-"
                    for v in (cell_value(rows, sy, c, m, "server_cpu_us_per_op") for sy in systems))))
            out.append("")
        # The disk during each run (the device holding --fs-dir, whole-device counts): how many
        # flushes the system asked for per operation, and how long one took. A slow disk in one
        # run shows here as longer flushes (docs/redis-benchmarks.md, session 40).
        if any(not math.isnan(cell_value(rows, sy, c, m, "disk_flush_us")) for sy in systems for m in mixes):
            out.append("The disk during the run (device of --fs-dir): flushes per 1000 operations / mean "
                       "µs per flush; for durable Redis also operations per log sync (medians over the "
                       "repetitions):\n")
            out.append("| mix | " + " | ".join(systems) + " |")
            out.append("|---|" + "---|" * len(systems))
            for m in mixes:
                cells = []
                for sy in systems:
                    fl, us = (cell_value(rows, sy, c, m, k) for k in ("disk_flushes_per_kop", "disk_flush_us"))
                    ps = cell_value(rows, sy, c, m, "ops_per_log_sync")
                    cell = "-" if math.isnan(fl) else "%.0f / %s" % (fl, "-" if math.isnan(us) else "%.0f" % us)
                    cells.append(cell + ("" if math.isnan(ps) else "; %.1f" % ps))
                out.append("| %s | %s |" % (m, " | ".join(cells)))
            out.append("")
        # Which operations make the p99: under AOF-always every reply of a pass waits for the same
        # fsync; in fs mode reads leave at once and updates wait for their sync (docs/redis.md).
        split = [m for m in mixes if any(not math.isnan(cell_value(rows, sy, c, m, "update_p99_us"))
                                         for sy in systems)]
        if split:
            out.append("p99 by operation (µs; median over the repetitions), read / update:\n")
            out.append("| mix | " + " | ".join(systems) + " |")
            out.append("|---|" + "---|" * len(systems))
            for m in split:
                out.append("| %s | %s |" % (m, " | ".join(
                    "%s / %s" % (fmt_us(cell_value(rows, sy, c, m, "read_p99_us")),
                                 fmt_us(cell_value(rows, sy, c, m, "update_p99_us"))) for sy in systems)))
            out.append("")

    out.append("## Goals (issue #5)\n")
    out.extend(goal_lines(rows, clients_l))
    out.append("")
    if recovery_rows:
        out.append("## Recovery time\n")
        out.extend(recovery_md(recovery_rows))
        out.append("")
    out.append("## Figures\n")
    out.append("- `fig5_update_ratio.png`: throughput vs update ratio (C = 0 %, B = 5 %, U10, A = 50 %, "
               "U90, U100), one panel per client count (cf. the paper's Figure 5); `fig5_update_ratio_log.png`: the same, log scale")
    out.append("- `fig6_clients_A.png`: workload A throughput and p99 vs clients (cf. Figure 6)\n")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def goal_lines(rows, clients_l):
    out = []
    def ratio(a, b, c, m, key="ops_per_sec"):
        return cell_value(rows, a, c, m, key) / cell_value(rows, b, c, m, key)
    have = {r["system"] for r in rows}
    mixes = {r["mix"] for r in rows}
    if {"durable-emulated", "stock-none"} <= have:
        for m, goal, label in (("U10", 0.9, "10 % updates"), ("U100", 0.8, "100 % updates")):
            if m not in mixes:
                continue
            parts = []
            for c in clients_l:
                x = ratio("durable-emulated", "stock-none", c, m)
                v = paired_ratios(rows, "durable-emulated", "stock-none", c, m)
                parts.append("%d client%s %.2fx%s (%s)" % (c, "" if c == 1 else "s", x, fmt_spread(v),
                                                           "met" if x >= goal else "MISSED"))
            out.append("- emulated >= %.1fx no-persistence at %s: %s" % (goal, label, "; ".join(parts)))
    if {"durable-fs", "stock-aof-always"} <= have and 32 in clients_l:
        parts = []
        for m in ordered_mixes(mixes):
            x = ratio("durable-fs", "stock-aof-always", 32, m)
            p = ratio("durable-fs", "stock-aof-always", 32, m, "p99_us")
            ok = x >= 1.5 and p <= 1.0
            parts.append("%s %.2fx%s, p99 %.2fx%s (%s)" % (
                m, x, fmt_spread(paired_ratios(rows, "durable-fs", "stock-aof-always", 32, m)), p,
                fmt_spread(paired_ratios(rows, "durable-fs", "stock-aof-always", 32, m, "p99_us")),
                "met" if ok else "MISSED"))
        out.append("- durable-fs >= 1.5x AOF-always at 32 clients with p99 no worse "
                   "(throughput ratio, p99 ratio fs/aof): " + "; ".join(parts))
    if {"durable-fs-paced", "stock-aof-always"} <= have and 32 in clients_l:
        parts = []
        for m in ordered_mixes(mixes):
            x = ratio("durable-fs-paced", "stock-aof-always", 32, m)
            p = ratio("durable-fs-paced", "stock-aof-always", 32, m, "p99_us")
            pi = cell_value(rows, "durable-fs-paced", 32, m, "intended_p99_us") / \
                cell_value(rows, "stock-aof-always", 32, m, "p99_us")
            ok = x >= 1.5 and p <= 1.0
            parts.append("%s %.2fx%s, p99 %.2fx%s, p99 from the intended start %.2fx (%s)" % (
                m, x, fmt_spread(paired_ratios(rows, "durable-fs-paced", "stock-aof-always", 32, m)), p,
                fmt_spread(paired_ratios(rows, "durable-fs-paced", "stock-aof-always", 32, m, "p99_us")), pi,
                "met" if ok else "MISSED"))
        out.append("- the same goal read as fs mode's p99 at 1.5x AOF-always's throughput (durable-fs-paced: "
                   "ycsb_redis --target; throughput ratio, p99 ratio paced fs/aof, both p99s counted from "
                   "sending; then the paced p99 counted from each operation's intended start): " +
                   "; ".join(parts))
    if not out:
        out.append("- (the systems/mixes needed for the goals were not part of this run)")
    return out


def pyplot(no_output, hint=""):
    """matplotlib.pyplot with the Agg backend, or None after saying what is
    not drawn (no_output: "no PNGs", ...). Shared by the Redis benchmarks."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        log("matplotlib not found for %s: %s (Debian's python3-matplotlib serves /usr/bin/python3%s)"
            % (sys.executable, no_output, hint))
        return None


def plot(rows, outdir):
    plt = pyplot("no PNGs", "; run the script with that, or --replot with it later")
    if plt is None:
        return
    systems = [s for s in ALL_SYSTEMS if any(r["system"] == s for r in rows)]
    clients_l = sorted({int(r["clients"]) for r in rows})
    mixes = {r["mix"] for r in rows}
    style = {"durable-emulated": ("tab:blue", "o", "-"), "durable-fs": ("tab:orange", "s", "-"),
             "durable-fs-inline": ("tab:brown", "P", "-"), "durable-fs-nogather": ("tab:olive", "X", "-"),
             "durable-fs-blocks": ("tab:cyan", "*", "-"),
             "durable-fs-always-pipelined": ("tab:pink", "h", "-"),
             "durable-fs-paced": ("tab:gray", "d", "-."), "durable-none": ("dimgray", "1", "--"),
             "stock-none": ("black", "^", "--"), "stock-aof-always": ("tab:red", "v", ":"),
             "stock-aof-everysec": ("tab:green", "D", ":"), "stock-aof-always-shm": ("tab:purple", "x", ":")}
    umixes = sorted([m for m in mixes if mix_update_pct(m) is not None], key=mix_update_pct)
    for logy in (False, True) if umixes else ():
        fig, axes = plt.subplots(1, len(clients_l), figsize=(4.6 * len(clients_l), 3.8), squeeze=False)
        for ax, c in zip(axes[0], clients_l):
            for s in systems:
                xs, ys = [], []
                for m in umixes:
                    v = cell_value(rows, s, c, m)
                    if v == v:
                        xs.append(mix_update_pct(m)); ys.append(v / 1000)
                col, mk, ls = style.get(s, ("tab:gray", "o", "-"))
                ax.plot(xs, ys, marker=mk, linestyle=ls, color=col, label=s)
            ax.set_title("%d client%s" % (c, "" if c == 1 else "s"))
            ax.set_xlabel("update ratio (%)")
            ax.set_ylabel("throughput (kops/s)")
            if logy:
                ax.set_yscale("log")
            else:
                ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        # one panel is too narrow for the title on one line
        fig.suptitle("YCSB on Redis 7.0.15:%sthroughput vs update ratio (Zipfian 0.99)%s" % (
            "\n" if len(clients_l) == 1 else " ", ", log scale" if logy else ""))
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "fig5_update_ratio%s.png" % ("_log" if logy else "")), dpi=110)
        plt.close(fig)
    if "A" in mixes and len(clients_l) >= 1:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for s in systems:
            col, mk, ls = style.get(s, ("tab:gray", "o", "-"))
            axes[0].plot(clients_l, [cell_value(rows, s, c, "A") / 1000 for c in clients_l],
                         marker=mk, linestyle=ls, color=col, label=s)
            axes[1].plot(clients_l, [cell_value(rows, s, c, "A", "p99_us") for c in clients_l],
                         marker=mk, linestyle=ls, color=col, label=s)
        axes[0].set_ylabel("throughput (kops/s)"); axes[0].set_ylim(bottom=0)
        axes[1].set_ylabel("p99 latency (µs)"); axes[1].set_yscale("log")
        for ax in axes:
            ax.set_xlabel("clients"); ax.set_xscale("log", base=2); ax.grid(alpha=0.3)
            ax.set_xticks(clients_l); ax.set_xticklabels([str(c) for c in clients_l])
        axes[0].legend(fontsize=7)
        fig.suptitle("YCSB workload A (50 % updates) vs clients")
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "fig6_clients_A.png"), dpi=110)
        plt.close(fig)


# ---------------------------------------------------------------- recovery

REC_FIELDS = ["system", "restore", "source", "rep", "keys", "expected_keys", "seconds", "init_s",
              "restore_s", "dbsize_s", "sample_keys", "sample_ok", "sample_cold_s", "scan_cold_s",
              "scan_warm_s", "sample_warm_s", "digest", "rss_anon_mb", "rss_file_mb",
              "rss_anon_mb_scanned", "rss_file_mb_scanned", "dataset", "phases_ms"]


def fnvhash64(v):
    """YCSB Utils.fnvhash64 (as bench/ycsb/ycsb_redis.c): FNV-1a over 8 LE bytes, abs."""
    h = 0xCBF29CE484222325
    for _ in range(8):
        h ^= v & 0xff
        v >>= 8
        h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    if h >= 1 << 63:
        h -= 1 << 64
    return -h if h < 0 and h != -(1 << 63) else h


def resp_skip(buf, pos):
    """Position after one complete RESP reply at pos, or None if buf is short."""
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        return None, None
    t, line = buf[pos:pos + 1], buf[pos + 1:eol]
    pos = eol + 2
    if t in (b"+", b"-", b":"):
        return pos, 0
    n = int(line)
    if t == b"$":
        if n < 0:
            return pos, 0
        return (pos + n + 2, 0) if len(buf) >= pos + n + 2 else (None, None)
    if t == b"*":
        for _ in range(max(n, 0)):
            pos, _x = resp_skip(buf, pos)
            if pos is None:
                return None, None
        return pos, n
    raise RuntimeError("bad RESP reply %r" % buf[pos - 10:pos + 10])


def hgetall_sample(port, keys, batch=500):
    """Pipelined HGETALL of keys; returns (seconds, replies with 10 fields)."""
    ok = 0
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=600) as s:
        for i in range(0, len(keys), batch):
            chunk = keys[i:i + batch]
            s.sendall(b"".join(b"*2\r\n$7\r\nHGETALL\r\n$%d\r\n%s\r\n" % (len(k), k) for k in chunk))
            buf, pos, got = b"", 0, 0
            while got < len(chunk):
                nxt, n = resp_skip(buf, pos)
                if nxt is None:
                    d = s.recv(1 << 20)
                    if not d:
                        raise RuntimeError("connection closed during HGETALL sample")
                    buf = buf[pos:] + d
                    pos = 0
                    continue
                ok += n == 20
                pos, got = nxt, got + 1
    return time.monotonic() - t0, ok


def rss_mb(pid):
    """(anonymous, file + shmem) resident MiB of a process."""
    v = {}
    try:
        for line in open("/proc/%d/status" % pid):
            k, _, rest = line.partition(":")
            if k in ("RssAnon", "RssFile", "RssShmem"):
                v[k] = int(rest.split()[0]) / 1024.0
    except OSError:
        return float("nan"), float("nan")
    return v.get("RssAnon", float("nan")), v.get("RssFile", 0.0) + v.get("RssShmem", 0.0)


def trace_times(path, t0):
    """From MANGO_TRACE_RECOVERY lines: (exec -> mango_init done, restore phase) in s,
    and every phase as 'ms since the previous mark  phase' joined by ' | '."""
    init_s = restore_s = float("nan")
    phases, prev = [], t0
    try:
        for line in open(path, errors="replace"):
            f = line.split(None, 4)
            if len(f) < 5 or f[0] != "mango-trace":
                continue
            ts = float(f[2])
            phases.append("%.3f %s" % ((ts - prev) * 1e3, f[4].strip()))
            prev = ts
            if f[4].startswith("init: heap attached"):
                init_s = ts - t0
            if f[4].startswith("restore: heap"):
                restore_s = float(f[3].lstrip("+")) / 1e3
    except OSError:
        pass
    return init_s, restore_s, " | ".join(phases)


def restart_and_probe(args, srv, extra, logname, sample, expected, row):
    """Start srv (after a SIGKILL), time exec -> first PING, then probe the
    deferred cost: DBSIZE, HGETALL of `sample` keys, DEBUG DIGEST (a full scan
    inside the server) twice, the sample again. Kills the server."""
    extra = list(extra) + ["--enable-debug-command", "yes"]
    t = srv.start(extra=extra, logname=logname)
    pid = srv.proc.pid
    row["seconds"] = t
    row["init_s"], row["restore_s"], row["phases_ms"] = trace_times(os.path.join(srv.dir, logname + ".stderr"), srv.t0)
    row["rss_anon_mb"], row["rss_file_mb"] = rss_mb(pid)
    t0 = time.monotonic()
    row["keys"] = redis_cmd(srv.port, "DBSIZE").lstrip(":")
    row["dbsize_s"] = time.monotonic() - t0
    row["expected_keys"] = expected
    row["sample_keys"] = len(sample)
    row["sample_cold_s"], row["sample_ok"] = hgetall_sample(srv.port, sample)
    t0 = time.monotonic()
    row["digest"] = redis_cmd(srv.port, "DEBUG", "DIGEST").lstrip("+")
    row["scan_cold_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    d2 = redis_cmd(srv.port, "DEBUG", "DIGEST").lstrip("+")
    row["scan_warm_s"] = time.monotonic() - t0
    if d2 != row["digest"]:
        raise RuntimeError("%s: DEBUG DIGEST changed between two scans" % row["system"])
    row["sample_warm_s"], _ = hgetall_sample(srv.port, sample)
    row["rss_anon_mb_scanned"], row["rss_file_mb_scanned"] = rss_mb(pid)
    srv.kill()
    log("  %-17s %-5s rep %d: PING after %.3fs (mango_init done %.3fs, restore %.3fs), %s keys; "
        "sample %d: %.3fs cold / %.3fs warm; DEBUG DIGEST %.2fs cold / %.2fs warm; RSS anon %.0f MiB, "
        "file %.0f MiB (after the scan: %.0f / %.0f)" % (
            row["system"], row["restore"], row["rep"], t, row["init_s"], row["restore_s"], row["keys"],
            len(sample), row["sample_cold_s"], row["sample_warm_s"], row["scan_cold_s"],
            row["scan_warm_s"], row["rss_anon_mb"], row["rss_file_mb"], row["rss_anon_mb_scanned"],
            row["rss_file_mb_scanned"]))
    return row


def mem_available():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


skipped = []


def recovery(args, workdir):
    recs = int(args.recovery_gb * 1e6)
    dataset = "%d records x 10 x 100 B (%.2f GB payload)" % (recs, recs * 1000 / 1e9)
    rows = []
    args.records_for_phase = recs
    pool_size = args.recovery_pool_size or "%dg" % max(2, int(args.recovery_gb * 3 + 1.999))
    rnd = __import__("random").Random(42)
    sample = [b"user%d" % fnvhash64(n) for n in rnd.sample(range(recs), min(args.recovery_sample, recs))]

    def keys(port):
        return redis_cmd(port, "DBSIZE").lstrip(":")

    def load(srv):
        t0 = time.monotonic()
        ld = run_ycsb(args, "load", srv.port, args.load_clients, [], timeout=4 * 3600)
        if int(ld.get("errors", 1)) or ld["exit"]:
            raise RuntimeError("%s: load had errors: %s" % (srv.system, ld))
        n = keys(srv.port)
        log("  loaded in %.1fs (%s ops/s), %s keys" % (time.monotonic() - t0, ld["ops_per_sec"], n))
        return n

    def durable_restarts(srv, system, n, source):
        for rep in range(args.recovery_repeat):
            for method in args.recovery_methods:
                if method == "copy" and system == "durable-emulated":
                    # The copy needs the heap twice in DRAM: tmpfs pool + private copy.
                    heap = os.stat(srv.pool).st_blocks * 512
                    need = heap * 1.1 + 4 * 2**30  # + room for everything else on the machine
                    avail = mem_available()
                    if avail < need:
                        log("  %s copy rep %d: SKIPPED, MemAvailable %.1f GiB < %.1f GiB needed for a "
                            "second copy of the heap" % (system, rep, avail / 2**30, need / 2**30))
                        skipped.append("%s/copy: MemAvailable %.1f GiB < %.1f GiB (the pool's %.1f GiB "
                                       "once more as a private copy, plus 4 GiB of room)" % (
                                           system, avail / 2**30, need / 2**30, heap / 2**30))
                        continue
                srv.env["MANGO_RESTORE"] = method
                srv.env["MANGO_TRACE_RECOVERY"] = "1"
                row = dict(system=system, restore=method, source=source, rep=rep, dataset=dataset)
                rows.append(restart_and_probe(args, srv, srv.extra, "restart-%s-%d.log" % (method, rep),
                                              sample, n, row))

    systems = list(args.recovery_systems)
    via_fs = args.recovery_emulated_from_fs and "durable-emulated" in systems
    if via_fs:  # the fs pool is loaded first and copied to /dev/shm for the emulated restarts
        systems = ["durable-fs"] + [s for s in systems if s not in ("durable-fs", "durable-emulated")]
    for system in systems:
        log("recovery: %s, loading %s" % (system, dataset))
        if system.startswith("durable"):
            srv = Server(args, system, workdir, "recovery", pool_size=pool_size)
            try:
                srv.start()
                n = load(srv)
                srv.kill()
                pool_bytes = os.path.getsize(srv.pool)
                if "durable-fs" == system and (via_fs is False or "durable-fs" in args.recovery_systems):
                    durable_restarts(srv, system, n, "pool (%s, %.1f GiB file)" % (args.fs_dir, pool_bytes / 2**30))
                if via_fs:
                    em = Server(args, "durable-emulated", workdir, "recovery", pool_size=pool_size)
                    try:
                        t0 = time.monotonic()
                        subprocess.run(["cp", "--sparse=always", srv.pool, em.pool], check=True)
                        log("  copied the fs pool to %s in %.1fs (emulated restarts from it)" % (
                            em.pool, time.monotonic() - t0))
                        durable_restarts(em, "durable-emulated", n,
                                         "pool (/dev/shm, %.1f GiB file; loaded in fs mode, copied)" % (pool_bytes / 2**30))
                    finally:
                        em.close()
                elif system == "durable-emulated":
                    durable_restarts(srv, system, n, "pool (/dev/shm, %.1f GiB file)" % (pool_bytes / 2**30))
            finally:
                srv.close()
        else:  # stock: AOF and RDB from one load
            srv = Server(args, "stock-aof-everysec", workdir, "recovery")
            try:
                srv.start()
                n = load(srv)
                time.sleep(1.5)  # everysec: let the last second reach the file
                r = redis_cmd(srv.port, "SAVE")
                if r != "+OK":
                    raise RuntimeError("SAVE: %s" % r)
                srv.kill()
                parts = {}  # Redis 7's multi-part AOF: base (.base.rdb or .base.aof) and .incr.aof files
                for dp, _, fs in os.walk(os.path.join(srv.dir, "appendonlydir")):
                    for f in fs:
                        kind = "rdb base" if f.endswith(".base.rdb") else "aof base" if f.endswith(".base.aof") \
                            else "commands" if f.endswith(".incr.aof") else "other"
                        parts[kind] = parts.get(kind, 0) + os.path.getsize(os.path.join(dp, f))
                aof = sum(parts.values())
                # What the file holds, not what its name says: automatic rewrites during the load
                # (aof-use-rdb-preamble yes, Redis's default) leave an RDB base, loaded as an RDB is,
                # and only the commands after the last rewrite are replayed (a benchmark audit,
                # session 37: the label said "no RDB preamble").
                aof_label = "AOF (%.2f GiB: %s)" % (aof / 2**30, ", ".join(
                    "%s %.2f GiB" % (k, v / 2**30) for k, v in sorted(parts.items()) if v))
                rdb = os.path.getsize(os.path.join(srv.dir, "dump.rdb"))
                for rep in range(args.recovery_repeat):
                    row = dict(system="stock", restore="aof", source=aof_label,
                               rep=rep, dataset=dataset)
                    rows.append(restart_and_probe(args, srv, ["--appendonly", "yes", "--appendfsync", "everysec"],
                                                  "aof-%d.log" % rep, sample, n, row))
                    row = dict(system="stock", restore="rdb", source="RDB (%.2f GiB)" % (rdb / 2**30),
                               rep=rep, dataset=dataset)
                    rows.append(restart_and_probe(args, srv, ["--appendonly", "no"], "rdb-%d.log" % rep,
                                                  sample, n, row))
            finally:
                srv.close()
    return rows


def recovery_md(rows):
    """The recovery table (medians over repetitions) for results.md / recovery.md."""
    out = ["Time from exec to the first PING answer (page cache warm: files just written), then the "
           "cost deferred past it: DBSIZE, a pipelined HGETALL of %s random records before and after "
           "a full scan, and the full scan itself (`DEBUG DIGEST`: every key and value) run twice. "
           "Medians over %s repetition(s). Dataset: %s.\n" % (
               rows[0].get("sample_keys", "?"), len({r["rep"] for r in rows}), rows[0]["dataset"])]
    out.append("| system | restore | source | keys | exec → PING s | mango_init done s | heap restore s "
               "| sample cold s | first full scan s | second full scan s | sample warm s | RSS anon / file MiB at PING "
               "| after the scan |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    groups = []
    for r in rows:
        k = (r["system"], r["restore"])
        if k not in groups:
            groups.append(k)

    def m(rs, key, fmt="%.3f"):
        v = [float(r[key]) for r in rs if r.get(key) not in (None, "")]
        v = [x for x in v if x == x]
        return fmt % statistics.median(v) if v else "–"
    for k in groups:
        rs = [r for r in rows if (r["system"], r["restore"]) == k]
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s | %s / %s |" % (
            k[0], k[1], rs[0]["source"], rs[0]["keys"], m(rs, "seconds"), m(rs, "init_s"),
            m(rs, "restore_s"), m(rs, "sample_cold_s"), m(rs, "scan_cold_s", "%.2f"),
            m(rs, "scan_warm_s", "%.2f"), m(rs, "sample_warm_s"), m(rs, "rss_anon_mb", "%.0f"),
            m(rs, "rss_file_mb", "%.0f"), m(rs, "rss_anon_mb_scanned", "%.0f"),
            m(rs, "rss_file_mb_scanned", "%.0f")))
    for sk in skipped:
        out.append("")
        out.append("Skipped: %s." % sk)
    digests = {r["digest"] for r in rows if r.get("digest")}
    out.append("")
    out.append("DEBUG DIGEST: %s." % ("identical in every restart (%s)" % next(iter(digests))
                                      if len(digests) == 1 else "**differs between restarts: %s**" %
                                      ", ".join(sorted(digests))))
    return out


# ---------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--durable", default=os.path.join(REPO, "build/redis-work/redis-server-durable"),
                   help="the durable redis-server (default: the build's, from redis/build.sh)")
    p.add_argument("--stock", default=shutil.which("redis-server") or "/usr/bin/redis-server",
                   help="stock Redis 7.0.15 for the none / AOF systems (default: redis-server on PATH)")
    p.add_argument("--ycsb", default=os.path.join(REPO, "build/bench/ycsb/ycsb_redis"),
                   help="the load generator (default: the build's ycsb_redis)")
    p.add_argument("--systems", type=csv_list, default=DEFAULT_SYSTEMS,
                   help="comma list from: " + ",".join(ALL_SYSTEMS))
    p.add_argument("--fixed-order", action="store_true",
                   help="run the systems in the order --systems gives in every cell (default: rotated from "
                        "cell to cell, so no system always runs first); durable-fs-paced still runs right "
                        "after stock-aof-always. For experiments on the order itself")
    p.add_argument("--paced-factor", type=float, default=1.51,
                   help="durable-fs-paced: ycsb_redis --target is this factor times the ops/s that "
                        "stock-aof-always reached in the same cell and repetition, which runs just before "
                        "it (default 1.51: the issue-#5 goal of 1.5, with room for the pacing falling a little "
                        "short): fs mode's p99 at that throughput")
    p.add_argument("--mixes", type=csv_list, default=["A", "B", "C", "F", "U10", "U90", "U100"],
                   help="A,B,C,F and/or U<P> (default A,B,C,F,U10,U90,U100)")
    p.add_argument("--clients", type=int_list, default=[1, 8, 32],
                   help="comma list of closed-loop client counts, one cell each (default 1,8,32)")
    p.add_argument("--records", type=int, default=100000,
                   help="YCSB records loaded into each fresh server (10 fields of 100 bytes; default 100000)")
    p.add_argument("--load-clients", type=int, default=32, help="clients of the load phase (default 32)")
    p.add_argument("--seconds", type=float, default=5.0, help="run seconds per cell (default 5)")
    p.add_argument("--repeat", type=int, default=1,
                   help="repetitions of the whole grid; tables show medians and ranges (default 1)")
    p.add_argument("--ycsb-threads", type=int, default=2,
                   help="ycsb_redis threads sharing the clients (default 2)")
    p.add_argument("--fs-dir", default="/var/tmp", help="disk directory for the fs pool and AOFs")
    p.add_argument("--transport", choices=("tcp", "unix"), default="tcp",
                   help="how ycsb_redis reaches the servers: TCP loopback (default) or a "
                        "Unix-domain socket (--unixsocket); the recovery benchmark always uses TCP")
    p.add_argument("--pin", type=pin_spec, default=None, metavar="SERVER:CLIENT",
                   help="pin servers and ycsb_redis to these CPU lists (e.g. 1:0); default: unpinned")
    p.add_argument("--shm-dir", default="/dev/shm",
                   help="tmpfs directory for emulated-mode pools and stock-aof-always-shm (default /dev/shm)")
    p.add_argument("--dsync-probe", default=os.path.join(REPO, "build/bench/dsync_writers"),
                   help="dsync_writers binary for the disk probe before and after the grid (\"\" = none)")
    p.add_argument("--pool-size", default=None, help="MANGO_POOL_SIZE (default: the runtime's)")
    p.add_argument("--log-size", default=None, help="MANGO_LOG_SIZE")
    p.add_argument("--recovery-gb", type=float, default=0.0,
                   help="recovery benchmark dataset size in GB of payload (0 = skip; e.g. 1)")
    p.add_argument("--recovery-only", action="store_true", help="skip the YCSB grid")
    p.add_argument("--recovery-systems", type=csv_list,
                   default=["durable-emulated", "durable-fs", "stock"],
                   help="comma list of systems restarted by the recovery benchmark "
                        "(default durable-emulated,durable-fs,stock)")
    p.add_argument("--recovery-methods", type=csv_list, default=["map", "copy"],
                   help="durable restarts: MANGO_RESTORE values to measure, each on the same pool "
                        "(map = copy-on-write mapping of the pool, copy = the heap copied; default both)")
    p.add_argument("--recovery-repeat", type=int, default=1, help="restarts per system and method")
    p.add_argument("--recovery-sample", type=int, default=10000,
                   help="records read with HGETALL right after the restart (cold) and after the scan")
    p.add_argument("--recovery-pool-size", default=None,
                   help="MANGO_POOL_SIZE of the recovery pools (default 3 x GB + 2, at least 2g)")
    p.add_argument("--recovery-emulated-from-fs", action="store_true",
                   help="load once, into the durable-fs pool, and restart durable-emulated from a copy of "
                        "that pool on /dev/shm (halves the memory: a 4 GB load in emulated mode needs the "
                        "DRAM heap and the tmpfs pool at once)")
    p.add_argument("--out", default=os.path.join(os.getcwd(), "redis-bench-results"),
                   help="output directory: results.csv, results.md, PNG figures (default ./redis-bench-results)")
    p.add_argument("--replot", action="store_true", help="only redo results.md and PNGs from results.csv")
    p.add_argument("--maxmemory", type=int, default=0, metavar="BYTES",
                   help="after each load, CONFIG SET maxmemory BYTES on every server (set it above what the "
                        "data needs: Redis then checks for evictions before every command; default 0: unset)")
    p.add_argument("--volatile-keys", type=int, default=0, metavar="N",
                   help="after each load, SET N more keys with a TTL of a day, so that Redis's expire "
                        "cycles run in every event-loop pass, as in any dataset with TTLs (default 0)")
    p.add_argument("--queue-rate", type=float, default=0, metavar="PUSHES_PER_S",
                   help="during each run, a queue beside the workload: one producer LPUSHes this many "
                        "times a second and one consumer pops in BLPOP, so Redis serves a blocked client "
                        "after most pushes (default 0: none)")
    p.add_argument("--replica", action="store_true",
                   help="give every server a replica: Debian's stock redis-server (--stock), attached after the "
                        "load with a diskless full sync and caught up before the run, so the run streams its "
                        "writes to it; results.csv records how long it took to catch up after the run")
    p.add_argument("--settle", action=argparse.BooleanOptionalAction, default=True,
                   help="after the load, let each system settle before its run: stock Redis with an AOF "
                        "rewrites it (BGREWRITEAOF, waited for), durable Redis applies its log to the pool "
                        "(default on; --no-settle: run right after the load, as before session 37)")
    p.add_argument("--keep", action="store_true", help="keep server dirs, pools and AOFs")
    p.add_argument("--quick", action="store_true", help="CTest smoke run (< 60 s)")
    args = p.parse_args()

    if args.quick:
        args.systems = ["durable-emulated", "stock-none"]
        args.mixes, args.clients = ["A"], [4]
        args.records, args.seconds, args.load_clients, args.repeat = 2000, 1.0, 4, 1
        args.recovery_gb = 0
        args.pool_size = args.pool_size or "256m"
    bad = [s for s in args.systems if s not in ALL_SYSTEMS]
    bad += [m for m in args.mixes if not (m in MIX_UPDATE_PCT or (m[:1] == "U" and m[1:].isdigit()))]
    if bad:
        p.error("unknown system/mix: %s" % ",".join(bad))
    if "durable-fs-paced" in args.systems and "stock-aof-always" not in args.systems:
        p.error("durable-fs-paced is paced at stock-aof-always's rate: list stock-aof-always too")
    if not args.paced_factor > 0:
        p.error("--paced-factor must be above 0")
    for name in ("records", "load_clients", "repeat", "ycsb_threads"):
        if getattr(args, name) < 1:
            p.error("--%s must be at least 1" % name.replace("_", "-"))
    if not args.seconds > 0:
        p.error("--seconds must be above 0")
    if any(c < 1 for c in args.clients):
        p.error("--clients: every count must be at least 1")
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "results.csv")
    rec_path = os.path.join(args.out, "recovery.csv")

    meta = dict(date=datetime.date.today().isoformat(), cmd=" ".join(["redis_bench.py"] + sys.argv[1:]))
    try:
        meta["cpu"] = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
    except Exception:
        meta["cpu"] = platform.processor() or "?"
    try:
        meta["fs_type"] = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "--target", args.fs_dir], stdout=subprocess.PIPE,
                                         text=True).stdout.strip()
    except Exception:
        meta["fs_type"] = "?"

    meta["stock_version"] = subprocess.run([args.stock, "--version"], stdout=subprocess.PIPE, text=True).stdout.strip() \
        if os.access(args.stock, os.X_OK) else "n/a"
    if not args.replot:
        meta["build"] = build_identity(args)
    run_json = os.path.join(args.out, "run.json")
    if args.replot:
        if os.path.exists(run_json):  # the grid's settings and description, not this command's
            saved = json.load(open(run_json))
            meta.update(saved["meta"])
            args.settle = False  # runs saved before --settle existed ran right after the load
            for k, v in saved["args"].items():
                setattr(args, k, v)
        rows = list(csv.DictReader(open(csv_path)))
        rec = list(csv.DictReader(open(rec_path))) if os.path.exists(rec_path) else []
        write_md(args, rows, os.path.join(args.out, "results.md"), meta, rec)
        plot(rows, args.out)
        return 0

    need_stock = any(not s.startswith("durable") for s in args.systems) or \
        (args.recovery_gb > 0 and "stock" in args.recovery_systems)
    need_durable = any(s.startswith("durable") for s in args.systems) or args.recovery_gb > 0
    for what, path, needed in (("ycsb_redis", args.ycsb, True), ("durable redis-server", args.durable, need_durable),
                               ("stock redis-server", args.stock, need_stock)):
        if needed and not (path and os.access(path, os.X_OK)):
            log("%s not found at %s" % (what, path))
            return 77 if args.quick else 2

    workdir = tempfile.mkdtemp(prefix="mango-redis-bench.")
    rows, rec_rows, failed = [], [], 0
    t_start = time.monotonic()
    try:
        if not args.recovery_only:
            if not args.quick:
                meta["disk_probe"] = {"before": disk_probe(args)}
            with open(run_json, "w") as f:
                saved_args = {k: getattr(args, k) for k in (
                    "records", "seconds", "load_clients", "ycsb_threads", "repeat", "fs_dir", "shm_dir",
                    "durable", "stock", "volatile_keys", "maxmemory", "queue_rate", "replica", "settle",
                    "fixed_order")}
                saved_args["pin"] = [sorted(c) for c in args.pin] if args.pin else None
                json.dump(dict(meta=meta, args=saved_args), f, indent=1)
            ncell = len(args.clients) * len(args.mixes) * args.repeat
            i = 0
            with open(csv_path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
                w.writeheader()
                for rep in range(args.repeat):
                    for c in args.clients:
                        for m in args.mixes:
                            rot = 0 if args.fixed_order else i % len(args.systems)
                            order = args.systems[rot:] + args.systems[:rot]
                            if "durable-fs-paced" in order:  # paced at AOF-always's rate: run after it
                                order.remove("durable-fs-paced")
                                order.insert(order.index("stock-aof-always") + 1, "durable-fs-paced")
                            i += 1
                            aof_rate = None
                            for k, s in enumerate(order):
                                t0 = time.monotonic()
                                row = dict(rep=rep, clients=c, mix=m, update_pct=mix_update_pct(m),
                                           system=s, order=k)
                                try:
                                    if s == "durable-fs-paced" and not aof_rate:
                                        raise RuntimeError("no AOF-always rate to pace at in this cell")
                                    row.update(one_run(args, workdir, s, c, m, "r%d" % i,
                                                       target=args.paced_factor * aof_rate
                                                       if s == "durable-fs-paced" else None))
                                except Exception as e:  # keep going; report
                                    row["status"] = "failed: %s" % str(e)[:200].replace("\n", " ")
                                if s == "stock-aof-always" and row.get("status") == "ok":
                                    aof_rate = row["ops_per_sec"]
                                row["wall_s"] = "%.1f" % (time.monotonic() - t0)
                                if row["status"] != "ok":
                                    failed += 1
                                rows.append(row)
                                w.writerow(row)
                                f.flush()
                                log("[%d/%d %.0fs] %-20s %-4s c=%-3d %s ops/s=%s p99=%s load=%ss" % (
                                    i, ncell, time.monotonic() - t_start, s, m, c, row["status"],
                                    row.get("ops_per_sec", "-"), row.get("p99_us", "-"), row.get("load_seconds", "-")))
            if "disk_probe" in meta:
                meta["disk_probe"]["after"] = disk_probe(args)
                saved = json.load(open(run_json))
                saved["meta"] = meta
                with open(run_json, "w") as f:
                    json.dump(saved, f, indent=1)
        if args.recovery_gb > 0:
            rec_rows = recovery(args, workdir)
            with open(rec_path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=REC_FIELDS, extrasaction="ignore")
                w.writeheader()
                w.writerows(rec_rows)
            for r in rec_rows:
                if str(r["keys"]) != str(r["expected_keys"]):
                    log("recovery: %s/%s has %s keys, expected %s" % (r["system"], r["source"], r["keys"], r["expected_keys"]))
                    failed += 1
                if r["sample_ok"] != r["sample_keys"]:
                    log("recovery: %s/%s: %s of %s sampled records had 10 fields" % (
                        r["system"], r["restore"], r["sample_ok"], r["sample_keys"]))
                    failed += 1
            if len({r["digest"] for r in rec_rows}) > 1:
                log("recovery: DEBUG DIGEST differs between restarts")
                failed += 1
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
            remove_pool_dirs(args)
    if not rec_rows and os.path.exists(rec_path):  # from an earlier --recovery-only run
        rec_rows = list(csv.DictReader(open(rec_path)))
    if not rows and os.path.exists(csv_path) and args.recovery_only:
        rows = list(csv.DictReader(open(csv_path)))
    if rows:
        write_md(args, rows, os.path.join(args.out, "results.md"), meta, rec_rows)
        plot(rows, args.out)
        print(open(os.path.join(args.out, "results.md")).read())
    elif rec_rows:
        text = "# Durable Redis recovery vs stock Redis — %s\n\nGenerated by `bench/redis/redis_bench.py`; " \
               "command: `%s`. Machine: %s, %d cores.\n\n" % (meta["date"], meta["cmd"], meta["cpu"], os.cpu_count())
        text += "\n".join(recovery_md(rec_rows)) + "\n"
        with open(os.path.join(args.out, "recovery.md"), "w") as f:
            f.write(text)
        print(text)
    log("done in %.0fs, %d failed" % (time.monotonic() - t_start, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
