#!/bin/bash
# redis/tests/verify_capture.sh -- durable Redis misses no store to durable
# memory: the smoke test (redis/test_smoke.sh: every basic type, TTLs, kill -9,
# SHUTDOWN NOSAVE) under the capture verifier (src/capture/verify.h), which
# diffs durable memory around every batch against what the batch captured.
#
# With MANGO_VERIFY_PAUSED=ignore the adapter's own bookkeeping, written while
# a batch is paused (write_depth, tickets, command statistics), is not
# reported, so every report must end "0 missed block(s)". A second run with
# the default (report) must show misses: the verifier sees those stores, and
# the clean result of the first run is not a verifier that checks nothing.
#
# Globals that Redis's other threads write at any time are named in
# MANGO_VERIFY_IGNORE: the bio threads' mutexes, condition variables and job
# lists (they start while the first batch runs) and zmalloc's used_memory
# (atomic, updated by every thread that allocates). None is durable state.
#
# Usage: redis/tests/verify_capture.sh path/to/redis-server-durable
set -euo pipefail
server=${1:?usage: verify_capture.sh path/to/redis-server-durable}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/mango-verify-capture.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

export MANGO_VERIFY_IGNORE=bio.c:bio_mutex,bio.c:bio_newjob_cond,bio.c:bio_step_cond,bio.c:bio_jobs,bio.c:bio_pending,bio.c:bio_threads,zmalloc.c:used_memory

run() { # $1: MANGO_VERIFY_PAUSED value; the report goes to $tmp/$1.txt
    MANGO_VERIFY_CAPTURE=1 MANGO_VERIFY_PAUSED=$1 MANGO_VERIFY_REPORT=$tmp/$1.txt \
        bash "$here/../test_smoke.sh" "$server" > "$tmp/$1.log" 2>&1 ||
        { cat "$tmp/$1.log" >&2; echo "FAIL: the smoke test failed under the verifier ($1)" >&2; exit 1; }
}

run ignore
# Three server runs; the first ends in kill -9 and writes no total line, so
# misses are counted from the per-batch lines.
starts=$(grep -c "mango-verify: on:" "$tmp/ignore.txt" || true)
[ "$starts" -ge 3 ] || { echo "FAIL: expected the verifier on in each of the 3 server runs, got $starts" >&2; exit 1; }
grep "mango-verify: total:" "$tmp/ignore.txt" || true
batches=$(sed -n 's/.*total: \([0-9]*\) batch.*/\1/p' "$tmp/ignore.txt" | awk '{ n += $1 } END { print n + 0 }')
[ "${batches:-0}" -ge 1000 ] || { echo "FAIL: only ${batches:-0} batches verified by the runs that exit" >&2; exit 1; }
if grep -q "missed store" "$tmp/ignore.txt"; then
    grep "missed store" "$tmp/ignore.txt" | head -20 >&2
    echo "FAIL: the verifier found stores to durable memory that no batch captured" >&2
    exit 1
fi

run report
missed=$(grep -c "missed store" "$tmp/report.txt" || true)
echo "with MANGO_VERIFY_PAUSED=report: $missed missed-store line(s) (stores made while paused)"
[ "$missed" -gt 0 ] || { echo "FAIL: the default mode reported no paused store; is the verifier on?" >&2; exit 1; }
echo "verify_capture: PASS ($batches batches, no missed store)"
