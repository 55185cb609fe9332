#!/bin/bash
# Read-mostly YCSB with and without 100 keys with a TTL (the fast expire
# cycle's batch in every pass); /tmp/ab/new is session 28's build, /tmp/ab/old
# HEAD 612e75e (before it).
cd /work/main
out=bench/results/2026-11-27/ttl-empty-batches
for run in new-vol0:new:0 new-vol100:new:100 old-vol100:old:100 new-vol100b:new:100 new-vol0b:new:0; do
  IFS=: read name bin vol <<< "$run"
  /usr/bin/python3 bench/redis/redis_bench.py --durable /tmp/ab/$bin --systems durable-fs,durable-emulated \
    --mixes C,U10 --clients 32 --records 50000 --seconds 5 --repeat 2 --volatile-keys $vol --out $out/$name
done
