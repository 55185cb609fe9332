#!/usr/bin/env python3
"""add_server_history.py -- a crash history of RPC mode, for the linearizability checker.

    add_server_history.py history-test --server BIN --pool POOL --history DIR
        [--mode sim] [--rounds 30] [--clients 6] [--threads 2] [--keys 4]
        [--add-pct 50] [--min-ms 30] [--max-ms 200] [--quiet]

Starts add_server (examples/rpc_add) on a fresh pool, and CLIENTS connections
that ADD to and GET a few shared counters, closed loop, while the server is
SIGKILLed after a random MIN-MS..MAX-MS and restarted, ROUNDS times (sim mode:
a kill is a power failure, and unflushed data is dropped). After the last
kill one client reads every counter from a last server. Each client logs every
invocation before it sends it and every answer once received, in the format
of tests/linearizability/history.go:

    DIR/client-<server pid>-<client>.log
    I <opid> <client> <counter> ADD <delta> <t_ns>    or    ... GET 0 <t_ns>
    R <opid> <value> <t_ns>

An operation cut off by a kill has no R line (its outcome is unknown). Times
are CLOCK_MONOTONIC. With few workers for the clients (--threads), answers are
held while their commands become durable, so the history checks that held
answers (ADDs, and GETs of counters with ADDs in flight) report nothing a
crash can lose, and keep real-time order. Exit status 0, or 1 on a failure of
the harness itself (the server did not start, a client saw a protocol error).
"""
import argparse
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time


def parse_args():
    ap = argparse.ArgumentParser(description="a crash history of add_server for the linearizability checker")
    ap.add_argument("command", choices=["history-test"])
    ap.add_argument("--server", required=True, help="the add_server binary")
    ap.add_argument("--pool", required=True, help="pool file (removed first)")
    ap.add_argument("--history", required=True, help="history folder (emptied first)")
    ap.add_argument("--mode", default="sim", help="add_server --mode (default sim)")
    ap.add_argument("--rounds", type=int, default=30, help="kills (default 30)")
    ap.add_argument("--clients", type=int, default=6, help="connections (default 6)")
    ap.add_argument("--threads", type=int, default=2, help="add_server --threads (default 2)")
    ap.add_argument("--keys", type=int, default=4, help="counters used (default 4)")
    ap.add_argument("--add-pct", type=int, default=50, help="%% of ADDs (default 50)")
    ap.add_argument("--min-ms", type=int, default=30, help="shortest run before a kill (default 30)")
    ap.add_argument("--max-ms", type=int, default=200, help="longest run before a kill (default 200)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)")
    ap.add_argument("--quiet", action="store_true", help="no line per round")
    a = ap.parse_args()
    if a.rounds < 1 or a.clients < 1 or a.threads < 1 or a.keys < 1 or not 0 <= a.add_pct <= 100 \
            or not 0 < a.min_ms <= a.max_ms:
        ap.error("bad numbers: rounds, clients, threads, keys >= 1; 0 <= add-pct <= 100; 0 < min-ms <= max-ms")
    return a


class Harness:
    def __init__(self, a):
        self.a = a
        self.proc = None
        self.port = None
        self.failures = []

    def start(self):
        self.proc = subprocess.Popen(
            [self.a.server, "--pool", self.a.pool, "--mode", self.a.mode, "--threads", str(self.a.threads)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("add_server: listening on"):
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            raise RuntimeError("add_server did not start: %r %r" % (line, err))
        self.port = int(line.split()[3].rsplit(":", 1)[1])

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def frame(payload):
    return struct.pack("<I", len(payload)) + payload


def recv_exact(s, n):
    d = b""
    while len(d) < n:
        k = s.recv(n - len(d))
        if not k:
            raise ConnectionError("closed")
        d += k
    return d


def client_round(h, idx, log, rnd, stop, next_opid):
    """Runs operations against the current server until it dies or stop is
    set. Returns the next operation id."""
    a = h.a
    try:
        s = socket.create_connection(("127.0.0.1", h.port), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        return next_opid  # the server died before we connected: nothing sent
    try:
        while not stop.is_set():
            key = rnd.randrange(a.keys)
            opid = next_opid
            next_opid += 1
            if rnd.randrange(100) < a.add_pct:
                delta = rnd.randint(1, 3)
                log.write("I %d %d %d ADD %d %d\n" % (opid, idx, key, delta, time.monotonic_ns()))
                req = frame(b"A" + struct.pack("<Iq", key, delta))
            else:
                log.write("I %d %d %d GET 0 %d\n" % (opid, idx, key, time.monotonic_ns()))
                req = frame(b"G" + struct.pack("<I", key))
            log.flush()
            s.sendall(req)
            (n,) = struct.unpack("<I", recv_exact(s, 4))
            if n != 8:
                h.failures.append("client %d: a %d-byte answer" % (idx, n))
                return next_opid
            (v,) = struct.unpack("<q", recv_exact(s, 8))
            log.write("R %d %d %d\n" % (opid, v, time.monotonic_ns()))
    except (OSError, ConnectionError):
        pass  # killed: the operation in flight stays without an answer
    finally:
        s.close()
    return next_opid


def main():
    a = parse_args()
    seed = a.seed if a.seed is not None else time.time_ns()
    rng = random.Random(seed)
    shutil.rmtree(a.history, ignore_errors=True)
    os.makedirs(a.history)
    if os.path.exists(a.pool):
        os.unlink(a.pool)
    h = Harness(a)
    opids = [1] * a.clients
    rnds = [random.Random(seed + 1 + i) for i in range(a.clients)]
    t0 = time.monotonic()
    for r in range(a.rounds + 1):
        h.start()
        pid = h.proc.pid
        logs = [open(os.path.join(a.history, "client-%d-%d.log" % (pid, i)), "w") for i in range(a.clients)]
        stop = threading.Event()
        if r < a.rounds:
            ts = []
            for i in range(a.clients):
                def run(i=i):
                    opids[i] = client_round(h, i, logs[i], rnds[i], stop, opids[i])
                ts.append(threading.Thread(target=run))
            for t in ts:
                t.start()
            time.sleep(rng.uniform(a.min_ms, a.max_ms) / 1000.0)
            h.kill()
            stop.set()
            for t in ts:
                t.join(30)
                if t.is_alive():
                    h.failures.append("a client did not notice the kill")
        else:
            # The last server: read every counter once, then stop it.
            s = socket.create_connection(("127.0.0.1", h.port), timeout=10)
            for key in range(a.keys):
                opid = opids[0]
                opids[0] += 1
                logs[0].write("I %d 0 %d GET 0 %d\n" % (opid, key, time.monotonic_ns()))
                s.sendall(frame(b"G" + struct.pack("<I", key)))
                (n,) = struct.unpack("<I", recv_exact(s, 4))
                (v,) = struct.unpack("<q", recv_exact(s, n))
                logs[0].write("R %d %d %d\n" % (opid, v, time.monotonic_ns()))
            s.close()
            h.proc.send_signal(signal.SIGTERM)
            h.proc.communicate(timeout=60)
        for f in logs:
            f.close()
        if not a.quiet:
            print("round %d: server %d" % (r + 1, pid), flush=True)
    ops = sum(opids) - len(opids)
    print("add_server_history: %d rounds, %d clients, %d operations, %.1f s, seed %d"
          % (a.rounds, a.clients, ops, time.monotonic() - t0, seed))
    for f in h.failures:
        print("add_server_history: " + f, file=sys.stderr)
    return 1 if h.failures else 0


if __name__ == "__main__":
    sys.exit(main())
