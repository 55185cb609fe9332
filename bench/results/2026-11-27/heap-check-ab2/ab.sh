#!/bin/bash
# The A/B runs of README.md: ab.sh PREFIX BINARY... runs redis_bench.py once
# per binary named (built into /tmp/ab), in the order given, into
# PREFIX-<i>-<binary>/.
#   series 1: ab.sh run old new new old old new new old
#   series 2: ab.sh mend new2 old old new2 new2 old old new2
cd /work/main
out=bench/results/2026-11-27/heap-check-ab2
prefix=$1
shift
i=0
for b in "$@"; do
  i=$((i+1))
  /usr/bin/python3 bench/redis/redis_bench.py --durable /tmp/ab/$b --systems durable-emulated,stock-none \
    --mixes U10,U100 --clients 32 --records 50000 --seconds 5 --repeat 1 --out $out/$prefix-$i-$b
done
