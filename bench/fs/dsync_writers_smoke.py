#!/usr/bin/env python3
"""dsync_writers_smoke.py DSYNC_WRITERS DIR -- CTest bench.dsync_writers_smoke.

Runs dsync_writers briefly (one writer, idle and with one spinner) and checks
what it prints: one line per combination, every key present, the latency
percentiles in order and no slow-write count above the number of writes, that
--spinners-yield-after makes a spinner sleep, and that a bad --writer-nice or
--spinners-yield-after is refused (exit 2). Speeds are not judged: this VM's
disk varies from day to day."""
import subprocess
import sys

tool, d = sys.argv[1], sys.argv[2]
out = subprocess.run([tool, "--dir", d, "--writers", "1", "--spinners", "0,1", "--seconds", "0.3"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
assert out.returncode == 0, out.stderr
lines = [dict(t.split("=", 1) for t in line.split()) for line in out.stdout.splitlines()]
assert [(l["writers"], l["spinners"]) for l in lines] == [("1", "0"), ("1", "1")], out.stdout
for l in lines:
    v = {k: float(x) for k, x in l.items()}
    writes = v["syncs_per_s"] * 0.3
    assert writes > 0, l
    assert 1 <= v["p50_us"] <= v["p99_us"] <= v["p999_us"], l  # an O_DSYNC write takes > 1 us
    assert v["p999_us"] <= 1000 or v["over_1ms"] >= 1, l
    assert v["over_1ms"] <= writes * 1.01 + 1, l
    # the mean cannot lie below the median of a distribution with no negative values by more
    # than half of it (Markov): catches a histogram read in the wrong units
    assert v["mean_us"] >= v["p50_us"] / 2, l
bad = subprocess.run([tool, "--writer-nice", "40"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
assert bad.returncode == 2 and "--writer-nice" in bad.stderr, (bad.returncode, bad.stderr)
# --spinners-yield-after: with a 0 us threshold every write in flight makes the
# spinner sleep, so the count must be positive; a bad value is refused.
y = subprocess.run([tool, "--dir", d, "--writers", "1", "--spinners", "1", "--seconds", "0.3",
                    "--spinners-yield-after", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   text=True, timeout=60)
assert y.returncode == 0, y.stderr
ylines = y.stdout.splitlines()
assert len(ylines) == 2 and ylines[0].startswith("writers=1 spinners=1 "), y.stdout
sleeps = int(ylines[1].split()[0].split("=")[1])
assert ylines[1].strip().startswith("spinner_sleeps=") and sleeps > 0, y.stdout
bad = subprocess.run([tool, "--spinners-yield-after", "-5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     text=True)
assert bad.returncode == 2 and "--spinners-yield-after" in bad.stderr, (bad.returncode, bad.stderr)
print("dsync_writers smoke: ok:", out.stdout.strip().replace("\n", " | "))
