#!/usr/bin/env python3
"""Crash test of the durable Redis (docs/redis.md, issue #5).

Each round: start redis-server-durable on the pool (the first round creates
it), check the recovered state against every acknowledged write so far, run
concurrent clients (redis_crash_clients: SET/GET, HSET/HGET, INCR on a small
shared key set), SIGKILL the server after a random 100..600 ms, wait for the
clients to notice. After the last round: restart, check once more, then run
the Porcupine linearizability checker (tests/linearizability) over the
history of all rounds (every string key and hash field is a register; the
reads of each check are part of the history).

The check after a restart, per register: the recovered value must be the
value of a write W (acknowledged or of unknown outcome) that no acknowledged
write supersedes: W2 supersedes an acknowledged W if W2 was invoked after W's
reply, and an unknown-outcome W if W2 belongs to a later server epoch. Nil
only if no write was ever acknowledged. Per counter: every acknowledged INCR
result is distinct, the recovered value is >= the largest and <= the number
of INCRs sent.

Prints `rounds=R acked=A lost=L linearizable=true|false` last; exit status 0
if nothing was lost and the history is linearizable, 1 otherwise, 2 on a
setup error. Uses only the Python standard library.
"""
import argparse
import glob
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def log(msg):
    print(f"crash: {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class Server:
    def __init__(self, args, work, env):
        self.args, self.work, self.env = args, work, env
        self.proc = None
        self.port = None

    def start(self, epoch, early_kill_ms=None):
        if early_kill_ms is not None:
            # a crash during start-up (often inside recovery): kill after early_kill_ms
            self.port = free_port()
            self.proc = subprocess.Popen(
                [self.args.server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--daemonize", "no",
                 "--logfile", os.path.join(self.work, f"server-{epoch}-early.log"), "--dir", self.work],
                env=self.env, stdin=subprocess.DEVNULL)
            time.sleep(early_kill_ms / 1000)
            self.kill()
            early = os.path.join(self.work, f"server-{epoch}-early.log")
            self.early_before_restored = not (os.path.exists(early) and "restored" in open(early).read())
        for attempt in range(5):
            self.port = free_port()
            logf = os.path.join(self.work, f"server-{epoch}.log")
            self.logf = logf
            self.proc = subprocess.Popen(
                [self.args.server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--daemonize", "no", "--logfile", logf, "--dir", self.work],
                env=self.env, stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if ping(self.port):
                    return self.state()
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
            self.kill()
            text = open(logf, errors="replace").read() if os.path.exists(logf) else ""
            if "Address already in use" not in text:
                raise SystemExit(f"crash: server did not start (epoch {epoch}):\n{text[-3000:]}")
        raise SystemExit("crash: no free port")

    def state(self):
        text = open(self.logf, errors="replace").read()
        m = re.search(r"mode \w+: (FRESH|RECOVERED)", text)
        return m.group(1) if m else "?"

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc:
            self.proc.wait()
        self.proc = None


class Model:
    """Writes and acknowledgements of all finished epochs."""

    def __init__(self):
        self.writes = {}        # hkey -> {vid: (epoch, call, ret or None)}
        self.max_acked_call = {}  # hkey -> latest invocation time of an acknowledged write
        self.max_acked_epoch = {}  # hkey -> latest epoch with an acknowledged write
        self.acked_rets = {}    # hkey -> [return times of acknowledged writes]
        self.incr_sent = {}     # counter -> INCRs sent
        self.incr_acked = {}    # counter -> [results]
        self.acked = 0

    def add_epoch(self, hist, epoch):
        for path in glob.glob(os.path.join(hist, f"client-{epoch}-*.log")):
            inv = {}
            with open(path) as f:
                for line in f:
                    if not line.endswith("\n"):
                        continue
                    p = line.split()
                    if p[0] == "I" and p[4] == "PUT":
                        inv[p[1]] = (int(p[3]), int(p[5]), int(p[6]))
                    elif p[0] == "R" and p[1] in inv:
                        k, vid, call = inv.pop(p[1])
                        self.writes.setdefault(k, {})[vid] = (epoch, call, int(p[3]))
                        self.max_acked_call[k] = max(self.max_acked_call.get(k, 0), call)
                        self.max_acked_epoch[k] = epoch
                        self.acked_rets.setdefault(k, []).append(int(p[3]))
            for k, vid, call in inv.values():  # no reply: outcome unknown
                self.writes.setdefault(k, {})[vid] = (epoch, call, None)
        for path in glob.glob(os.path.join(hist, f"ack-{epoch}-*.log")):
            with open(path) as f:
                for line in f:
                    p = line.split()
                    if len(p) < 3 or not line.endswith("\n"):
                        continue
                    if p[0] == "N":
                        self.incr_sent[p[2]] = self.incr_sent.get(p[2], 0) + 1
                    elif p[0] == "A":
                        self.acked += 1
                        if p[1] == "INCR":
                            self.incr_acked.setdefault(p[2], []).append(int(p[3]))

    def check_register(self, k, v):
        """Returns (lost acknowledged writes, description) for recovered value v."""
        acked_call = self.max_acked_call.get(k)
        if v == "torn":
            return max(1, self._latest_acked(k)), "a value no write wrote"
        v = int(v)
        if v == 0:
            if acked_call is None:
                return 0, None
            return self._latest_acked(k), "nil, but writes were acknowledged"
        w = self.writes.get(k, {}).get(v)
        if w is None:
            return max(1, self._latest_acked(k)), f"value {v} was never written"
        epoch, call, ret = w
        if ret is not None:
            ok = acked_call is None or acked_call <= ret
        else:
            ok = self.max_acked_epoch.get(k, 0) <= epoch
        if ok:
            return 0, None
        return self._latest_acked(k), f"value {v} (epoch {epoch}) was superseded by an acknowledged write"

    def _latest_acked(self, k):
        # acknowledged writes no other acknowledged write supersedes
        c = self.max_acked_call.get(k)
        return 0 if c is None else sum(1 for r in self.acked_rets[k] if r >= c)

    def check_counter(self, name, v):
        lost, why = 0, []
        results = self.incr_acked.get(name, [])
        dups = len(results) - len(set(results))
        if dups:
            lost += dups
            why.append(f"{dups} acknowledged INCR results repeated (an acknowledged INCR was lost)")
        if v == "bad":
            return lost + max(1, len(results)), "not an integer"
        v = int(v)
        hi = max(results, default=0)
        if v < hi:
            lost += sum(1 for r in results if r > v)
            why.append(f"value {v} < largest acknowledged INCR result {hi}")
        if v > self.incr_sent.get(name, 0):
            lost += 1
            why.append(f"value {v} > {self.incr_sent.get(name, 0)} INCRs sent")
        return lost, "; ".join(why) or None


def client_args(args, port, epoch, hist):
    return ["--port", str(port), "--epoch", str(epoch), "--dir", hist, "--clients", str(args.nclients),
            "--keys", str(args.keys), "--hashes", str(args.hashes), "--fields", str(args.fields),
            "--counters", str(args.counters)]


def verify(args, server, model, epoch, hist):
    out = subprocess.run([args.clients, "dump"] + client_args(args, server.port, epoch, hist),
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise SystemExit(f"crash: dump failed ({out.returncode}): {out.stderr}")
    lost = 0
    for line in out.stdout.splitlines():
        kind, k, v = line.split()
        if kind == "reg":
            n, why = model.check_register(int(k), v)
            name = f"k{k}" if int(k) < 1000 else f"h{(int(k) - 1000) // 100}.f{int(k) % 100}"
        else:
            n, why = model.check_counter(k, v)
            name = k
        if why:
            log(f"epoch {epoch}: LOST on {name}: {why} ({n} acknowledged writes)")
        lost += n
    return lost


def lincheck_binary(args, work):
    if args.lincheck:
        return args.lincheck
    if not args.go:
        return None
    out = os.path.join(work, "lincheck")
    r = subprocess.run([args.go, "build", "-buildvcs=false", "-o", out, "."], cwd=args.lincheck_src)
    if r.returncode != 0:
        raise SystemExit("crash: building the linearizability checker failed")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True, help="redis-server-durable")
    ap.add_argument("--clients", required=True, help="redis_crash_clients")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--mode", default="sim", help="MANGO_MODE (sim: a kill is a power failure)")
    ap.add_argument("--nclients", type=int, default=4)
    ap.add_argument("--keys", type=int, default=8)
    ap.add_argument("--hashes", type=int, default=2)
    ap.add_argument("--fields", type=int, default=4)
    ap.add_argument("--counters", type=int, default=2)
    ap.add_argument("--think-us", type=int, default=100)
    ap.add_argument("--min-ms", type=int, default=100)
    ap.add_argument("--max-ms", type=int, default=600)
    ap.add_argument("--startup-kill-pct", type=int, default=20,
                    help="percent of restarts first killed 0..30 ms after exec (in start-up/recovery)")
    ap.add_argument("--lincheck", help="the checker binary (else built with --go)")
    ap.add_argument("--go", help="go, to build the checker from --lincheck-src")
    ap.add_argument("--lincheck-src", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                            "..", "..", "tests", "linearizability"))
    ap.add_argument("--lincheck-timeout", default="150s")
    ap.add_argument("--pool", help="pool file (default /dev/shm/mango-redis-crash.<pid>.pool); deleted")
    ap.add_argument("--work", help="work folder (default: a new one under /tmp, removed on success)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    for b in (args.server, args.clients):
        if not os.access(b, os.X_OK):
            print(f"crash: no executable {b}", file=sys.stderr)
            return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)

    if args.work:  # reused: clear only what an earlier run left there
        work = args.work
        os.makedirs(work, exist_ok=True)
        shutil.rmtree(os.path.join(work, "history"), ignore_errors=True)
        for f in glob.glob(os.path.join(work, "server-*.log")):
            os.unlink(f)
    else:
        work = tempfile.mkdtemp(prefix="mango-redis-crash.")
    hist = os.path.join(work, "history")
    os.makedirs(hist)
    if args.pool:
        pool = args.pool
    else:
        shm = "/dev/shm"
        pooldir = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else work
        pool = os.path.join(pooldir, f"mango-redis-crash.{os.getpid()}.pool")
    env = dict(os.environ, MANGO_POOL=pool, MANGO_MODE=args.mode)
    env.setdefault("MANGO_POOL_SIZE", "256m")
    env.setdefault("MANGO_LOG_SIZE", "32m")
    if os.path.exists(pool):
        os.unlink(pool)
    checker = lincheck_binary(args, work)
    log(f"server {args.server}, mode {args.mode}, pool {pool}, {args.rounds} rounds, {args.nclients} clients, "
        f"{args.keys} keys + {args.hashes}x{args.fields} hash fields + {args.counters} counters, seed {seed}, "
        f"work {work}")

    server = Server(args, work, env)
    model = Model()
    lost = 0
    ops = 0
    startup_kills = startup_kills_unfinished = 0
    bad_replies = 0
    t_start = time.monotonic()
    try:
        for epoch in range(1, args.rounds + 2):
            early = None
            if epoch > 1 and rng.randrange(100) < args.startup_kill_pct:
                early = rng.uniform(0, 30)
            state = server.start(epoch, early)
            if early is not None:
                startup_kills += 1
                startup_kills_unfinished += server.early_before_restored
            if epoch > 1 and args.mode not in ("none",) and state != "RECOVERED":
                log(f"epoch {epoch}: server log says {state}, not RECOVERED")
            round_lost = verify(args, server, model, epoch, hist)
            lost += round_lost
            if epoch == args.rounds + 1:
                log(f"final restart ({state}): lost={round_lost}")
                break
            cl = subprocess.Popen([args.clients, "run"] + client_args(args, server.port, epoch, hist) +
                                  ["--seconds", "20", "--think-us", str(args.think_us),
                                   "--seed", str(rng.randrange(1 << 62))],
                                  stdout=subprocess.PIPE, text=True)
            delay = rng.uniform(args.min_ms, args.max_ms) / 1000
            time.sleep(delay)
            server.kill()
            try:
                out, _ = cl.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                cl.kill()
                raise SystemExit("crash: the clients did not stop after the kill")
            m = re.search(r"ops=(\d+) acked_writes=(\d+) broken=(\d+) bad_replies=(\d+)", out)
            if not m:
                raise SystemExit(f"crash: unexpected client output: {out!r}")
            ops += int(m.group(1))
            bad_replies += int(m.group(4))
            model.add_epoch(hist, epoch)
            after = " (after a kill at start-up)" if early is not None else ""
            log(f"round {epoch}: start {state}{after}, verify lost={round_lost}, "
                f"killed after {delay * 1000:.0f} ms: ops={m.group(1)} acked_writes={m.group(2)} "
                f"cut_off={m.group(3)}")
    finally:
        server.kill()
        if os.path.exists(pool):
            os.unlink(pool)
    elapsed = time.monotonic() - t_start

    if checker:
        r = subprocess.run([checker, "-timeout", args.lincheck_timeout, hist], capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        lin = {0: "true", 1: "false"}.get(r.returncode, "unknown")
    else:
        log("no checker (neither --lincheck nor --go): history not checked")
        lin = "unchecked"
    ok = lost == 0 and bad_replies == 0 and lin in ("true", "unchecked")
    log(f"{elapsed:.1f} s, ops={ops} bad_replies={bad_replies} startup_kills={startup_kills} "
        f"({startup_kills_unfinished} before recovery finished), logs in {hist}")
    print(f"rounds={args.rounds} acked={model.acked} lost={lost} linearizable={lin}", flush=True)
    if ok and not args.keep and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    elif ok and not args.keep:
        shutil.rmtree(hist, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
