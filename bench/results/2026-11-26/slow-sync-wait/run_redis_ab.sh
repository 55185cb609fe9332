#!/bin/bash
# fs mode U10 32 clients, MANGO_REDIS_SLOW_SYNC_US variants, vs stock AOF-always
Y=${BUILD:-build}/bench/ycsb/ycsb_redis
B=${BUILD:-build}/redis-work/redis-server-durable
MIX=${MIX:---update-pct 10}
one() { # label slow_us|aof
  rm -rf /var/tmp/slw; mkdir -p /var/tmp/slw
  if [ "$2" = aof ]; then /usr/bin/redis-server --port 7705 --save "" --appendonly yes --appendfsync always --dir /var/tmp/slw >/dev/null 2>&1 &
  else MANGO_REDIS_SLOW_SYNC_US=$2 MANGO_POOL=/var/tmp/slw/p.pool MANGO_MODE=fs $B --port 7705 --save "" --appendonly no >/dev/null 2>&1 & fi
  pid=$!; $Y ping --port 7705 >/dev/null 2>&1
  $Y load --port 7705 --recordcount 50000 --clients 32 >/dev/null 2>&1
  out=$($Y run --port 7705 --recordcount 50000 --clients 32 --seconds ${SECS:-8} $MIX 2>&1 | tail -1)
  info=$(redis-cli -p 7705 info mangosteen 2>/dev/null | grep -E "slow_sync" | tr -d '\r' | tr '\n' ' ')
  kill $pid; wait $pid 2>/dev/null
  echo "$1 $(echo "$out" | grep -o 'ops_per_sec=[0-9.]*\|p99_us=[0-9.]*\|update_p99_us=[0-9.]*\|read_p99_us=[0-9.]*' | tr '\n' ' ') $info"
}
for i in $(seq ${REPS:-2}); do
  one aof aof
  one fs-off 0
  one fs-slow1000 1000
  one fs-slow500 500
done
rm -rf /var/tmp/slw
