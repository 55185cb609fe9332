#!/usr/bin/env bash
# demo.sh -- set up, build, and show a durable key-value store surviving kill -9.
# No special hardware: the pool is an emulated persistent-memory file on tmpfs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
KV=build/examples/kvstore/kvstore
POOL=/dev/shm/mango-demo.pool
ACK=/dev/shm/mango-demo.ack
rm -f "$POOL" "$ACK"

echo; echo "== 1. a fresh durable store: 4 threads, 4000 PUTs, clean shutdown"
$KV demo --pool "$POOL"
echo; echo "== 2. start it again: the state comes back from the pool"
$KV demo --pool "$POOL"
echo; echo "== 3. kill -9 under load, 20 times, checking every acknowledged PUT each time"
$KV crash-test --pool /dev/shm/mango-demo-crash.pool --ack "$ACK" --rounds 20 --threads 4 \
    --values 8192 --quiet
echo; echo "== 4. what is in the pool"
build/tools/mango/mango inspect "$POOL" 2>/dev/null | head -30 || true
rm -f "$POOL" "$ACK" /dev/shm/mango-demo-crash.pool
