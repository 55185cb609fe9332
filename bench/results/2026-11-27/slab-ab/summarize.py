#!/usr/bin/env python3
"""summarize.py: the A/B table of run_ab.sh's rounds (ops/s and p99 per
cell, medians over rounds, and the ratios the issue's goals use)."""
import csv, glob, os, statistics, sys

here = os.path.dirname(os.path.abspath(__file__))
cells = {}  # (label, mix) -> list of (ops, p99)
for path in sorted(glob.glob(os.path.join(here, "round*-*/results.csv"))):
    label = os.path.basename(os.path.dirname(path)).split("-", 1)[1]
    for row in csv.DictReader(open(path)):
        if row["status"] != "ok":
            continue
        cells.setdefault((label, row["mix"]), []).append((float(row["ops_per_sec"]), float(row["p99_us"])))
mixes = sorted({m for _, m in cells}, key=lambda m: (len(m), m))
labels = ["emulated-old", "emulated-new", "stock-none", "fs-old", "fs-new", "aof-always"]
med = lambda xs: statistics.median(xs) if xs else float("nan")
print("| mix | " + " | ".join(labels) + " |")
print("|---|" + "---|" * len(labels))
for m in mixes:
    row = []
    for l in labels:
        v = cells.get((l, m), [])
        row.append("%.1f k (%s), p99 %.0f" % (med([o for o, _ in v]) / 1e3,
                   " / ".join("%.1f" % (o / 1e3) for o, _ in v), med([p for _, p in v])) if v else "")
    print("| %s | %s |" % (m, " | ".join(row)))
print()
print("| mix | emulated / none, old | new | fs / AOF-always, old | new | p99 fs / AOF-always, old | new |")
print("|---|---|---|---|---|---|---|")
for m in mixes:
    g = lambda l, i: med([x[i] for x in cells.get((l, m), [])])
    print("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
        m, g("emulated-old", 0) / g("stock-none", 0), g("emulated-new", 0) / g("stock-none", 0),
        g("fs-old", 0) / g("aof-always", 0), g("fs-new", 0) / g("aof-always", 0),
        g("fs-old", 1) / g("aof-always", 1), g("fs-new", 1) / g("aof-always", 1)))
