#!/usr/bin/env bash
# bench.ycsb_smoke: start a throwaway redis-server (no persistence) on a free
# loopback port, load 1000 records, run YCSB workload A for 2 s with 8 clients
# and --check, and check that ops_per_sec > 0, errors = 0 and, on Linux, that
# the client-thread scheduling keys are present and in range.
# Usage: ycsb_smoke.sh YCSB_REDIS [REDIS_SERVER]. Exits 77 (skip) without redis-server.
set -u
ycsb=${1:?usage: ycsb_smoke.sh YCSB_REDIS [REDIS_SERVER]}
server=${2:-}
if [ -z "$server" ] || [ ! -x "$server" ]; then
  server=$(command -v redis-server || true)
fi
if [ -z "$server" ]; then
  echo "SKIP: redis-server is not installed (Debian: apt-get install redis-server)"
  exit 77
fi

tmp=$(mktemp -d /tmp/ycsb_smoke.XXXXXX)
pid=""
cleanup() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A random port that nothing listens on; retry if the server fails to bind it.
port=""
for attempt in $(seq 1 10); do
  p=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
  if "$ycsb" ping --port "$p" --timeout 0.05 >/dev/null 2>&1; then
    continue # something already answers there
  fi
  "$server" --port "$p" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
    --dir "$tmp" --logfile "$tmp/redis.log" &
  pid=$!
  if "$ycsb" ping --port "$p" --timeout 5 >/dev/null && kill -0 "$pid" 2>/dev/null; then
    port=$p
    break
  fi
  echo "redis-server did not come up on port $p (attempt $attempt):"
  tail -n 3 "$tmp/redis.log" 2>/dev/null
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  pid=""
done
if [ -z "$port" ]; then
  echo "FAIL: could not start redis-server on a free port"
  exit 1
fi
echo "redis-server $("$server" --version | awk '{print $3}') on 127.0.0.1:$port (pid $pid)"

"$ycsb" load --port "$port" -r 1000 -c 8 --progress 0 >"$tmp/load.out"
rc=$?
cat "$tmp/load.out"
if [ $rc -ne 0 ]; then echo "FAIL: load exited with $rc"; exit 1; fi

# run_a NAME ARGS...: workload A with 8 clients into $tmp/NAME.out, shown; a
# failed run fails the test. Then result NAME is its key=value line, and
# key LINE KEY the value of KEY= in it.
run_a() {
  local name=$1; shift
  "$ycsb" run --port "$port" -r 1000 -w A -c 8 "$@" >"$tmp/$name.out"
  local rc=$?
  cat "$tmp/$name.out"
  if [ $rc -ne 0 ]; then echo "FAIL: $name exited with $rc"; exit 1; fi
}
result() { grep '^workload=' "$tmp/$1.out" | tail -n 1; }
key() { printf '%s\n' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

run_a run -s 2 --check --progress 1
line=$(result run)
ops=$(key "$line" ops_per_sec)
errs=$(key "$line" errors)
if [ -z "$ops" ] || [ -z "$errs" ]; then echo "FAIL: no key=value result line"; exit 1; fi
if ! awk -v v="$ops" 'BEGIN { exit !(v > 0) }'; then echo "FAIL: ops_per_sec=$ops"; exit 1; fi
if [ "$errs" != 0 ]; then echo "FAIL: errors=$errs"; exit 1; fi
# The generator's own scheduling (Linux: /proc/thread-self/schedstat).
wait_pct=$(key "$line" client_wait_pct)
cpu_op=$(key "$line" client_cpu_us_per_op)
if [ -r /proc/thread-self/schedstat ]; then
  if [ -z "$wait_pct" ] || [ -z "$cpu_op" ]; then echo "FAIL: no client_wait_pct / client_cpu_us_per_op"; exit 1; fi
  if ! awk -v w="$wait_pct" -v c="$cpu_op" 'BEGIN { exit !(w >= 0 && w <= 100 && c > 0 && c < 10000) }'; then
    echo "FAIL: client_wait_pct=$wait_pct client_cpu_us_per_op=$cpu_op out of range"; exit 1
  fi
fi
# Paced (--target): 2000 ops/s is far below what any server here does, so the
# run must reach it to within 5 % and no faster, and report the intended-start
# p99, which cannot be below the p99 from sending (less the 50 us an operation
# may start early).
run_a paced -s 1.5 --target 2000 --progress 0
pline=$(result paced)
pops=$(key "$pline" ops_per_sec)
pint=$(key "$pline" intended_p99_us)
pp99=$(key "$pline" p99_us)
if ! awk -v v="$pops" 'BEGIN { exit !(v >= 1900 && v <= 2100) }'; then echo "FAIL: paced at 2000 ops/s, got $pops"; exit 1; fi
if [ -z "$pint" ] || ! awk -v i="$pint" -v p="$pp99" 'BEGIN { exit !(i > 0 && i + 60 >= p) }'; then
  echo "FAIL: paced run: intended_p99_us=$pint p99_us=$pp99"; exit 1
fi
# Paced far above what the server does (2 M ops/s for 1 s): the operations
# due before the end that never started count in the intended-start
# histogram too, so it holds every operation of the schedule (2 M, to within
# the 8 connections' last intervals), the ops run plus the unstarted ones.
run_a paced_over -s 1 --target 2000000 --progress 0
oline=$(result paced_over)
oops=$(key "$oline" ops)
oint=$(key "$oline" intended_ops)
ouns=$(key "$oline" intended_unstarted)
if [ -z "$oint" ] || [ -z "$ouns" ] || ! awk -v o="$oops" -v i="$oint" -v u="$ouns" \
    'BEGIN { exit !(i >= 1999990 && i <= 2000010 && u > 0 && o + u == i) }'; then
  echo "FAIL: paced above capacity: ops=$oops intended_ops=$oint intended_unstarted=$ouns"; exit 1
fi
# At 2000 ops/s the server keeps up: at most a stall at the very end leaves
# an operation or two of a connection unstarted (1 % is far more).
puns=$(key "$pline" intended_unstarted)
if [ -z "$puns" ] || [ "$puns" -gt 30 ]; then
  echo "FAIL: paced at 2000 ops/s, the server keeping up: intended_unstarted=$puns"; exit 1
fi
# Paced at a rate far below one operation per connection per 100 ms (8
# clients at 40 ops/s: each starts one every 200 ms): the run still ends at
# --seconds (a connection waiting for its next start is done once the
# deadline passes), so it reports the rate it was paced at.
run_a paced_slow -s 1 --target 40 --progress 0
sline=$(result paced_slow)
sops=$(key "$sline" ops_per_sec)
ssec=$(key "$sline" seconds)
if ! awk -v v="$sops" -v s="$ssec" 'BEGIN { exit !(v >= 36 && v <= 42 && s < 1.1) }'; then
  echo "FAIL: paced at 40 ops/s for 1 s: got $sops ops/s over $ssec s"; exit 1
fi
# SIGINT stops a paced run at once, not at each connection's next intended
# start (8 clients at 1 op/s: one every 8 s), and the results cover the time
# before the signal.
"$ycsb" run --port "$port" -r 1000 -w A -c 8 -s 30 --target 1 --progress 0 >"$tmp/paced_int.out" 2>&1 &
ipid=$!
sleep 0.5
kill -INT "$ipid"
for _ in $(seq 1 30); do kill -0 "$ipid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$ipid" 2>/dev/null; then
  kill -9 "$ipid"; wait "$ipid" 2>/dev/null
  echo "FAIL: a paced run still going 3 s after SIGINT"; exit 1
fi
wait "$ipid"
isec=$(key "$(result paced_int)" seconds)
if ! awk -v s="$isec" 'BEGIN { exit !(s != "" && s < 1.5) }'; then
  cat "$tmp/paced_int.out"; echo "FAIL: a paced run stopped by SIGINT after 0.5 s reports seconds=$isec"; exit 1
fi
echo "PASS: ops_per_sec=$ops errors=$errs client_wait_pct=${wait_pct:-n/a} client_cpu_us_per_op=${cpu_op:-n/a}; paced $pops ops/s (intended p99 $pint us); above capacity $oops of $oint started"
