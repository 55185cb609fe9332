#!/usr/bin/env bash
# test.sh -- set up, build, and run the whole test suite (CTest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j1 "$@"
