#!/usr/bin/env bash
# setup.sh -- install what Mangosteen needs to build and test on Debian 12.
# Idempotent: installs only what is missing, at the pinned versions below
# (retrying at the suite's current versions if the pinned install fails, e.g.
# because a pin has left the archive).
set -euo pipefail

PINNED=(
  gcc=4:12.2.0-3
  g++=4:12.2.0-3
  make=4.3-4.1
  cmake=3.25.1-1
  ninja-build=1.11.1-2~deb12u1
  python3=3.11.2-1+b1
  python3-pytest=7.2.1-2
  python3-redis=4.3.4-3
  clang-16=1:16.0.6-15~deb12u1
  llvm-16-dev=1:16.0.6-15~deb12u1
  redis-server=5:7.0.15-1~deb12u10
  redis-tools=5:7.0.15-1~deb12u10
  python3-matplotlib=3.6.3-1+b1   # the benchmarks' plots (bench/), not the tests
)

missing=()
for spec in "${PINNED[@]}"; do
  pkg=${spec%%=*}
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$spec")
done

# Go for the linearizability checker (tests/linearizability): Debian's 1.19
# unless a Go toolchain is already on PATH or in /usr/local/go.
if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/local/go/bin/go ] && [ ! -x /usr/lib/go-1.19/bin/go ]; then
  missing+=(golang-1.19-go=1.19.8-2)
fi

if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing packages (${missing[*]}); run as root or install them" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  # Do not let package scripts start services (redis-server would start a
  # system Redis on port 6379): the tests start their own servers.
  created_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    created_policy=1
    trap '[ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get update -qq
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
    echo "setup: pinned install failed; retrying unpinned" >&2
    if ! apt-get install -y -qq --no-install-recommends "${missing[@]%%=*}" >/dev/null; then
      echo "setup: apt-get install failed (network or apt sources?)" >&2
      exit 1
    fi
  fi
fi

# The python3 first on PATH must have pytest (it may not be Debian's).
if ! python3 -c 'import pytest' 2>/dev/null; then
  echo "setup: installing pytest for $(command -v python3)" >&2
  python3 -m pip install -q 'pytest==7.2.1'
fi
