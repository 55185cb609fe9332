#!/usr/bin/env bash
# soak.sh -- kill -9 torture with history checking, for long: CAMPAIGNS
# independent campaigns of ROUNDS kills each (fresh pool and history each, so
# Porcupine's work stays bounded), every history checked for linearizability.
#   tests/linearizability/soak.sh [CAMPAIGNS=10] [ROUNDS=50] [BUILD=build] [kv|rpc]
# kv (default): kvstore's local mode. rpc: add_server in RPC mode under
# tests/rpc/add_server_history.py (6 clients, 2 workers, 4 shared counters,
# sim syncs slowed to 2 ms unless MANGO_SIM_SYNC_DELAY_US says otherwise).
set -euo pipefail
campaigns=${1:-10}
rounds=${2:-50}
build=${3:-build}
target=${4:-kv}
here=$(cd "$(dirname "$0")" && pwd)
kv=$build/examples/kvstore/kvstore
server=$build/examples/rpc_add/add_server
check=$build/tests/linearizability/kv_history.lincheck
[ "$target" = rpc ] && check=$build/tests/linearizability/rpc_history.lincheck
case "$target" in
  kv) [ -x "$kv" ] ;;
  rpc) [ -x "$server" ] ;;
  *) echo "soak: the fourth argument is kv or rpc, not '$target'" >&2; exit 2 ;;
esac || { echo "soak: build first (bash scripts/build.sh)" >&2; exit 2; }
if [ ! -x "$check" ]; then
  # The Porcupine checker is built by ctest's history tests; build it here if
  # no ctest ran yet (scripts/build.sh does not), as run_history.cmake does.
  go=$(command -v go || echo /usr/local/go/bin/go)
  [ -x "$go" ] || { echo "soak: $check is missing and there is no go to build it (bash scripts/setup.sh)" >&2; exit 2; }
  echo "soak: building the checker $check"
  mkdir -p "$(dirname "$check")"
  (cd "$here" && "$go" build -buildvcs=false -o "$(cd "$(dirname "$check")" && pwd)/$(basename "$check")" .) ||
    { echo "soak: building the checker failed" >&2; exit 2; }
fi
work=$(mktemp -d /dev/shm/mango-hsoak.XXXXXX)
trap 'rm -rf "$work"' EXIT
total_ops=0; total_pending=0; total_rounds=0
for c in $(seq 1 "$campaigns"); do
  rm -rf "$work/h" "$work/pool"; mkdir -p "$work/h"
  if [ "$target" = kv ]; then
    "$kv" history-test --pool "$work/pool" --history "$work/h" --mode sim --rounds "$rounds" \
        --threads 4 --keys 8 --update-pct 50 --think-us 200 --min-ms 30 --max-ms 300 \
        --pool-size 16M --log-size 4M --quiet > "$work/run.log" 2>&1
  else
    MANGO_SIM_SYNC_DELAY_US=${MANGO_SIM_SYNC_DELAY_US:-2000} "$here/../rpc/add_server_history.py" history-test \
        --server "$server" --pool "$work/pool" --history "$work/h" --mode sim --rounds "$rounds" \
        --clients 6 --threads 2 --keys 4 --quiet > "$work/run.log" 2>&1
  fi
  out=$("$check" "$work/h" | tail -1)
  echo "campaign $c/$campaigns: $out"
  case "$out" in *linearizable=true*) ;; *) echo "soak: NOT linearizable (history kept in $work/h)"; trap - EXIT; exit 1 ;; esac
  ops=$(sed -n 's/.*ops=\([0-9]*\).*/\1/p' <<<"$out"); pend=$(sed -n 's/.*pending=\([0-9]*\).*/\1/p' <<<"$out")
  total_ops=$((total_ops + ops)); total_pending=$((total_pending + pend)); total_rounds=$((total_rounds + rounds))
done
echo "kill_rounds=$total_rounds ops=$total_ops pending=$total_pending linearizable=true"
