#!/bin/bash
cd /work/main
out=bench/results/2026-11-27/maxmemory-reads
for b in new old; do
  bin=/work/main/build/redis-work/redis-server-durable; [ $b = old ] && bin=/tmp/ab/old
  /usr/bin/python3 bench/redis/redis_bench.py --durable $bin --systems durable-fs,stock-aof-always \
    --mixes A,U10 --clients 32 --records 50000 --seconds 5 --repeat 2 --maxmemory 4000000000 --out $out/$b > /tmp/mm-$b.log 2>&1
  echo "$b rc=$?" >> /tmp/mm_progress
done
echo done >> /tmp/mm_progress
