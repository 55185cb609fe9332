#!/bin/bash
# A/B of the session-26 heap check: old = 067268d's adapter, new = 53385d9's.
cd /work/main
out=bench/results/2026-11-27/heap-check-ab2
i=0
for b in old new new old old new new old; do
  i=$((i+1))
  /usr/bin/python3 bench/redis/redis_bench.py --durable /tmp/ab/$b --systems durable-emulated,stock-none \
    --mixes U10,U100 --clients 32 --records 50000 --seconds 5 --repeat 1 --out $out/run-$i-$b > /tmp/ab/run-$i-$b.log 2>&1
  echo "run $i $b rc=$?" >> /tmp/ab/progress
done
echo done >> /tmp/ab/progress
