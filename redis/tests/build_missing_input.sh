#!/bin/bash
# build_missing_input.sh -- redis/build.sh stops with a message naming the
# missing input when one of the files it hashes is absent (a Mangosteen build
# without the capture plugin, say). It used to exit 1 silently: the hash's
# `cat ... 2>/dev/null | sha256sum` failed under pipefail inside an
# assignment, which set -e ended without a word.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/build/bin" "$tmp/work/src-pkg/redis-7.0.15"
printf '#!/bin/sh\nexit 1\n' >"$tmp/build/bin/mango-cc"
chmod +x "$tmp/build/bin/mango-cc"
# no $tmp/build/lib/MangoCapture.so
out=$(MANGO_BUILD_DIR="$tmp/build" REDIS_WORK="$tmp/work" REDIS_SKIP_APT=1 bash "$here/build.sh" 2>&1)
rc=$?
if [ "$rc" = 0 ]; then
    echo "FAIL: build.sh succeeded without MangoCapture.so"; exit 1
fi
if ! grep -q "MangoCapture.so" <<<"$out"; then
    echo "FAIL: build.sh exited $rc without naming the missing input; output:"; echo "$out"; exit 1
fi
[ -d "$tmp/work/redis-7.0.15" ] && { echo "FAIL: build.sh prepared a tree anyway"; exit 1; }
echo "ok: $out"
