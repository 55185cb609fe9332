#!/bin/bash
# The A/B runs of README.md: ab.sh BINARY... runs redis_bench.py once per
# binary named (built into /tmp/ab), in the order given, into <i>-<binary>/.
#   ab.sh old new new old
cd /work/main
out=bench/results/2026-11-27/queue-reads
i=0
for b in "$@"; do
  i=$((i+1))
  /usr/bin/python3 bench/redis/redis_bench.py --durable /tmp/ab/$b --systems durable-fs,stock-aof-always \
    --mixes A,U10 --clients 32 --records 50000 --seconds 5 --repeat 2 --queue-rate 500 --out $out/$i-$b
done
