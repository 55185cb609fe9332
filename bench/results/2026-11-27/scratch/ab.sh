#!/bin/bash
# A/B of README.md: ab.sh BINARY... runs redis_bench.py once per binary
# (built into /tmp/ab), in the order given, into <i>-<binary>/.
#   ab.sh old new new old
cd /work/main
out=bench/results/2026-11-27/scratch
i=0
for b in "$@"; do
  i=$((i+1))
  /usr/bin/python3 bench/redis/redis_bench.py --durable /tmp/ab/$b --systems durable-fs,durable-emulated,stock-aof-always \
    --mixes A,U10,U100 --clients 32 --records 50000 --seconds 5 --repeat 2 --out $out/$i-$b
done
