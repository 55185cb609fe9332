#!/bin/bash
# run_without_bc.sh CMD [ARG...] -- run CMD where bc cannot be run, as on a
# fresh Debian 12 (scripts/setup.sh does not install it): /usr/bin/bc is
# covered in a private mount namespace. Needs root and unshare -m; exit 77
# (skipped) without them.
set -euo pipefail
if ! unshare -m true 2>/dev/null; then
    echo "SKIP: needs root and unshare -m"
    exit 77
fi
exec unshare -m bash -c '
    if [ -e /usr/bin/bc ]; then mount --bind /dev/null /usr/bin/bc; fi
    exec "$@"' run_without_bc "$@"
