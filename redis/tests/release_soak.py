#!/usr/bin/env python3
"""release_soak.py -- kill -9 while big objects are being released.

Each round fills the keyspace (hashtable-encoded hashes, a 20 000-member
set and an 8 000-entry stream whose entries are all pending in a consumer
group), removes it with FLUSHALL, FLUSHALL ASYNC, FLUSHDB, DEL or UNLINK,
acknowledges a write after it, and kills the server at a random moment of the
release that follows (in sim mode a kill is a power failure). Half the
restarts slow the release down (MANGO_REDIS_TEST_RELEASE_PER_PASS) and are
killed again in the middle of it. After every restart the acknowledged write
must be there and the removed keys gone. At the end, once everything is
released, the durable heap must hold exactly what a new server's holds
(MANGO_STATS at shutdown): nothing leaked, nothing freed twice (the heap
aborts on a double free).

usage: release_soak.py SERVER [--mode sim] [--rounds 8] [--seed 1] [--dir D]
exit 0 = passed, 1 = a check failed, 2 = usage or setup error.
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from redis_net import free_port, wait_for_ping  # noqa: E402

try:
    from redis import Redis
except ImportError:
    sys.exit("release_soak: redis-py is not importable by %s (install python3-redis)" % sys.executable)

STATS = re.compile(r"heap_chunks=(\d+) heap_payload_bytes=(\d+) graves_pending=(\d+) log_zero_ranges=(\d+)")


class Server:
    def __init__(self, binary, mode, workdir):
        self.binary, self.mode, self.dir = binary, mode, workdir
        self.pool = os.path.join(workdir, "redis.pool")
        self.out = os.path.join(workdir, "server.out")
        self.proc = None

    def start(self, extra_env=None):
        env = dict(os.environ, MANGO_POOL=self.pool, MANGO_MODE=self.mode, MANGO_CHECK_HEAP="1", MANGO_LOG_SIZE="8m",
                   MANGO_STATS="1", **(extra_env or {}))
        env.pop("MANGO_VERIFY_CAPTURE", None)
        for _ in range(5):
            self.port = free_port()
            with open(self.out, "ab") as out:
                self.proc = subprocess.Popen(
                    [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                     "--appendonly", "no", "--dir", self.dir, "--logfile", os.path.join(self.dir, "log"),
                     "--crash-memcheck-enabled", "no"],
                    env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            if wait_for_ping(self.proc, self.port, step=0.01):
                return Redis(host="127.0.0.1", port=self.port, socket_timeout=60)
            self.proc.kill()
            self.proc.wait()
        raise SystemExit("release_soak: the server did not start; see %s" % self.out)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def shutdown(self, r):
        try:
            r.shutdown(nosave=True)
        except Exception:
            pass
        rc = self.proc.wait(timeout=60)
        if rc != 0:
            raise AssertionError("SHUTDOWN NOSAVE: exit status %s" % rc)
        with open(self.out, errors="replace") as f:
            found = STATS.findall(f.read())
        if not found:
            raise AssertionError("no Mangosteen stats line in %s" % self.out)
        return tuple(int(x) for x in found[-1])


def fill(r, rnd, n):
    p = r.pipeline(transaction=False)
    for i in range(n):
        p.hset(f"h{rnd}:{i}", mapping={f"f{j}": "v" * 80 for j in range(20)})
        if i % 200 == 199:
            p.execute()
    p.execute()
    r.sadd(f"big{rnd}", *[f"m{j}" for j in range(20000)])
    p = r.pipeline(transaction=False)  # a stream whose entries are all pending in a group
    for j in range(8000):
        p.xadd(f"st{rnd}", {"f": j})
    p.execute()
    r.xgroup_create(f"st{rnd}", "g", id="0")
    for c in range(4):
        r.xreadgroup("g", f"c{c % 2}", {f"st{rnd}": ">"}, count=2000)
    r.set("marker", rnd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("server")
    ap.add_argument("--mode", default="sim", choices=["emulated", "fs", "sim"])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", help="work directory (default: a new one under /var/tmp for fs, /dev/shm else)")
    a = ap.parse_args()
    if not os.access(a.server, os.X_OK):
        print("release_soak: no server binary at %s" % a.server, file=sys.stderr)
        return 2
    base_dir = "/var/tmp" if a.mode == "fs" else ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    if a.dir:
        os.makedirs(a.dir, exist_ok=True)
    work = a.dir or tempfile.mkdtemp(prefix="mango-release-soak.", dir=base_dir)
    rng = random.Random(a.seed)
    ok = False
    try:
        s = Server(a.server, a.mode, work)
        baseline = s.shutdown(s.start())  # a new server's heap
        r = s.start()
        kills = 0
        for rnd in range(a.rounds):
            fill(r, rnd, rng.randint(500, 2500))
            n = int(r.dbsize())
            op = rng.choice(["FLUSHALL", "FLUSHALL ASYNC", "FLUSHDB", "DEL", "UNLINK"])
            if op.startswith("FLUSH"):
                r.execute_command(*op.split())
            else:
                r.execute_command(op, f"big{rnd}", f"st{rnd}", *[f"h{rnd}:{i}" for i in range(0, n, 3)])
            r.set("after", rnd)
            time.sleep(rng.random() * 0.3)
            s.kill()
            kills += 1
            slow = rng.random() < 0.5
            r = s.start({"MANGO_REDIS_TEST_RELEASE_PER_PASS": "300"} if slow else None)
            if r.get("after") != str(rnd).encode():
                raise AssertionError("round %d (%s): the acknowledged write is missing" % (rnd, op))
            gone = ["marker", f"big{rnd}", f"st{rnd}"] if op.startswith("FLUSH") else [f"big{rnd}", f"st{rnd}", f"h{rnd}:0"]
            if r.exists(*gone):
                raise AssertionError("round %d (%s): removed keys are back" % (rnd, op))
            if slow:  # kill again in the middle of the slowed release
                time.sleep(rng.random() * 0.5)
                s.kill()
                kills += 1
                r = s.start()
            r.flushall()
        fill(r, a.rounds, 2000)  # regrow in freed memory (zero ranges), then release it
        r.flushall()
        deadline = time.time() + 120
        last = None
        while time.time() < deadline:  # wait for the release to finish
            um = r.info("memory")["used_memory"]
            if um == last:
                break
            last = um
            time.sleep(0.5)
        final = s.shutdown(r)
        print("release_soak: mode %s, %d rounds, %d kills; heap of a new server %d allocations / %d bytes, "
              "at the end %d / %d, %d still on the graveyard; the last run logged %d zero ranges"
              % (a.mode, a.rounds, kills, baseline[0], baseline[1], final[0], final[1], final[2], final[3]))
        if final[2] != 0 or final[:2] != baseline[:2]:
            raise AssertionError("the durable heap does not hold what a new server's holds")
        ok = True
    except AssertionError as e:
        print("release_soak: FAILED: %s (work directory kept: %s)" % (e, work), file=sys.stderr)
        return 1
    finally:
        if ok and not a.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
