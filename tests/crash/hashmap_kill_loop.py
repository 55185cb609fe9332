#!/usr/bin/env python3
"""Kill -9 loop for the hash-map variant of the kvstore example.

Each round runs `kvstore hashmap` (random PUT/DEL/GET on a resizable chained
hash map with variable-size values, all on the durable heap), kills it with
SIGKILL at a random moment, then reopens the pool: recovery must restore a map
whose every node hashes to its bucket, whose count matches its chains, and
whose every value is intact (`kvstore hashmap --ops 0` checks all three),
and in which every acknowledged PUT and DEL is found: both runs keep
`--ack FILE`, where the workload records each key's acknowledged length and
the command in flight (before session 39 only the map's consistency was
checked, and a runtime that never synced its commits passed). One round in
four also kills the recovery itself before checking again. Fails if no
command was acknowledged at all.
"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvstore", required=True)
    ap.add_argument("--pool", required=True)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--mode", default="sim")
    ap.add_argument("--keys", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    print(f"seed={a.seed}", flush=True)
    ack = a.pool + ".ack"
    for path in (a.pool, ack):
        if os.path.exists(path):
            os.unlink(path)
    base = [a.kvstore, "hashmap", "--pool", a.pool, "--mode", a.mode, "--values", str(a.keys), "--ack", ack]
    acked = 0
    failures = 0
    initialised = False
    for r in range(a.rounds):
        p = subprocess.Popen(base + ["--ops", "1000000000", "--seed", str(rnd.randrange(1 << 30))],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        time.sleep(rnd.uniform(0.15, 0.8))
        p.send_signal(signal.SIGKILL)
        out = p.communicate()[0].decode()
        if p.returncode != -signal.SIGKILL:
            print(f"round {r}: workload exited by itself ({p.returncode}):\n{out}")
            failures += 1
            continue
        if rnd.random() < 0.25:
            q = subprocess.Popen(base + ["--ops", "0"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            time.sleep(rnd.uniform(0.0, 0.01))
            q.send_signal(signal.SIGKILL)
            q.wait()
        v = subprocess.run(base + ["--ops", "0"], capture_output=True, text=True)
        lines = v.stdout.strip().splitlines()
        line = lines[0] if lines else ""
        m = re.search(r"acknowledged (\d+) PUT/DEL", v.stdout)
        acked = max(acked, int(m.group(1))) if m else acked
        # The pool may still be FRESH only if no process ever finished
        # mango_init on it (killed during start-up: nothing was acknowledged).
        initialised = initialised or "hashmap:" in out
        ok = v.returncode == 0 and "check ok" in line and (
            "RECOVERED" in line or (not initialised and "FRESH" in line))
        initialised = initialised or v.returncode == 0  # the verify run initialised it
        print(f"round {r}: {line or v.stderr.strip()}", flush=True)
        if not ok:
            print(v.stdout, v.stderr)
            failures += 1
    if acked == 0:
        print("no PUT or DEL was ever acknowledged: nothing was checked")
        failures += 1
    print(f"rounds={a.rounds} acked={acked} failed={failures}")
    for path in (a.pool, ack):
        if os.path.exists(path):
            os.unlink(path)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
