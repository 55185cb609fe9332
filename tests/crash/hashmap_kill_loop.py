#!/usr/bin/env python3
"""Kill -9 loop for the hash-map variant of the kvstore example.

Each round runs `kvstore hashmap` (random PUT/DEL/GET on a resizable chained
hash map with variable-size values, all on the durable heap), kills it with
SIGKILL at a random moment, then reopens the pool: recovery must restore a map
whose every node hashes to its bucket, whose count matches its chains, and
whose every value is intact (`kvstore hashmap --ops 0` checks all three).
One round in four also kills the recovery itself before checking again.
"""
import argparse
import os
import random
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
    if os.path.exists(a.pool):
        os.unlink(a.pool)
    base = [a.kvstore, "hashmap", "--pool", a.pool, "--mode", a.mode, "--values", str(a.keys)]
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
        line = v.stdout.strip().splitlines()[0] if v.stdout.strip() else ""
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
    print(f"rounds={a.rounds} failed={failures}")
    if os.path.exists(a.pool):
        os.unlink(a.pool)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
