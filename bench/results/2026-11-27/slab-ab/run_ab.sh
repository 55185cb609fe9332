#!/bin/bash
# run_ab.sh: the durable heap before slabs (OLD, a build of 282cc87) against
# with slabs (NEW, this commit's build), alternately, ROUNDS rounds; each
# round runs both builds' emulated mode (and stock Redis, no persistence)
# over MIXES at 32 clients, then both builds' fs mode and AOF-always.
# Usage: OLD=/path/redis-server-durable NEW=/path/redis-server-durable \
#        ROUNDS=3 MIXES=C,U10,U100 bench/results/2026-11-27/slab-ab/run_ab.sh
set -euo pipefail
cd "$(dirname "$0")"
ROUNDS=${ROUNDS:-3}; MIXES=${MIXES:-C,U10,U100}
B=../../../redis/redis_bench.py
common=(--records 50000 --seconds 5 --repeat 1 --clients 32 --mixes "$MIXES")
for r in $(seq 1 "$ROUNDS"); do
  for order in old new; do
    bin=$OLD; [ "$order" = new ] && bin=$NEW
    /usr/bin/python3 "$B" "${common[@]}" --durable "$bin" --systems durable-emulated \
        --out "round$r-emulated-$order" > "round$r-emulated-$order.log" 2>&1
  done
  /usr/bin/python3 "$B" "${common[@]}" --systems stock-none --out "round$r-stock-none" > "round$r-stock-none.log" 2>&1
  for order in new old; do
    bin=$OLD; [ "$order" = new ] && bin=$NEW
    /usr/bin/python3 "$B" "${common[@]}" --durable "$bin" --systems durable-fs \
        --out "round$r-fs-$order" > "round$r-fs-$order.log" 2>&1
  done
  /usr/bin/python3 "$B" "${common[@]}" --systems stock-aof-always --out "round$r-aof-always" > "round$r-aof-always.log" 2>&1
  echo "round $r done $(date +%T)"
done
