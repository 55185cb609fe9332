#!/bin/bash
# footprint.sh BINARY LABEL [records]: load YCSB records (default 50 000) into a
# fresh server (durable binaries: emulated mode, pool in /dev/shm) and print its
# memory figures; for durable ones also `mango check` of the pool after
# SHUTDOWN NOSAVE (the heap carved and in use). MANGO_CLI: the mango tool that
# reads that build's pools.
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)
BIN=$1; LABEL=$2; N=${3:-50000}; PORT=$((7300 + RANDOM % 500))
D=$(mktemp -d /tmp/fp.XXXX)
if [[ $BIN == *durable* ]]; then
  export MANGO_POOL=/dev/shm/fp-$$.pool MANGO_MODE=emulated
fi
$BIN --port $PORT --bind 127.0.0.1 --save "" --appendonly no --dir $D --logfile $D/log --daemonize no >/dev/null 2>&1 &
PID=$!
$REPO/build/bench/ycsb/ycsb_redis ping -p $PORT >/dev/null 2>&1
$REPO/build/bench/ycsb/ycsb_redis load -p $PORT -r $N -c 8 >/dev/null 2>&1
echo "== $LABEL"
redis-cli -p $PORT INFO memory | grep -E "^used_memory:|^allocator_allocated:|^allocator_active:" | tr -d '\r'
redis-cli -p $PORT INFO mangosteen 2>/dev/null | grep -iE "heap" | tr -d '\r'
redis-cli -p $PORT DBSIZE
if [[ $BIN == *durable* ]]; then
  redis-cli -p $PORT SHUTDOWN NOSAVE >/dev/null 2>&1; wait $PID 2>/dev/null
  ${MANGO_CLI:-$REPO/build/tools/mango/mango} check $MANGO_POOL
else kill -9 $PID; wait $PID 2>/dev/null; fi
rm -rf $D /dev/shm/fp-$$.pool*
