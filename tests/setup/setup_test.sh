#!/bin/bash
# setup_test.sh -- scripts/setup.sh against stub apt-get, dpkg-query, id and
# python3, in a private mount namespace (unshare -m, needs root) where
# /usr/local/go and /usr/lib/go-1.19 are hidden and /usr/sbin (policy-rc.d)
# is a scratch tmpfs, so no Go toolchain is found and nothing is installed.
#
#   1. not root, every pinned package installed, Go missing: setup asks for
#      root and names golang-1.19-go, without running apt-get (the Go
#      install ran apt-get without the root check and without apt-get
#      update; found by a review)
#   2. root, a package and Go missing, every install failing: one update,
#      then golang-1.19-go in the same pinned install, "pinned install
#      failed; retrying unpinned", then "apt-get install failed" and exit 1
#      (the retry message blamed a pin for any failure, and a failed retry
#      gave no message)
#   3. root, the pinned install failing and the unpinned one working: exit 0
#
# Usage: setup_test.sh path/to/scripts/setup.sh  (exit 77: cannot run here)
set -euo pipefail
setup=${1:?usage: setup_test.sh path/to/scripts/setup.sh}
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
    echo "SKIP: needs root and unshare -m"
    exit 77
fi
tmp=$(mktemp -d /tmp/mango-setup-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin"
cat > "$tmp/bin/dpkg-query" <<'STUB'
#!/bin/sh
# dpkg-query -W -f=... PKG: installed unless PKG is in $STUB_MISSING
pkg=$(eval echo \${$#})
case " $STUB_MISSING " in *" $pkg "*) exit 1 ;; esac
printf 'install ok installed'
STUB
cat > "$tmp/bin/id" <<'STUB'
#!/bin/sh
echo "$STUB_UID"
STUB
cat > "$tmp/bin/apt-get" <<'STUB'
#!/bin/sh
# logs its arguments; install fails when pinned (an =) or if $STUB_FAIL=all
echo "apt-get $*" >> "$STUB_LOG"
[ "$1" = update ] && exit 0
case "$*" in *=*) exit 100 ;; esac
[ "$STUB_FAIL" = all ] && exit 100
exit 0
STUB
cat > "$tmp/bin/python3" <<'STUB'
#!/bin/sh
exit 0
STUB
chmod +x "$tmp/bin/"*

# run NAME UID MISSING FAIL: setup.sh's exit status in $tmp/NAME.rc, its
# stderr in $tmp/NAME.err, the apt-get calls in $tmp/NAME.log
run() {
    : > "$tmp/$1.log"
    set +e
    STUB_UID=$2 STUB_MISSING=$3 STUB_FAIL=$4 STUB_LOG=$tmp/$1.log \
        PATH=$tmp/bin:/usr/bin:/bin unshare -m bash -c '
        for d in /usr/local/go /usr/lib/go-1.19 /usr/sbin; do
            if [ -d "$d" ]; then mount -t tmpfs none "$d" || exit 99; fi
        done
        exec bash "$0"' "$setup" 2> "$tmp/$1.err"
    echo $? > "$tmp/$1.rc"
    set -e
    cat "$tmp/$1.err" "$tmp/$1.log"
}
fail() { echo "FAIL: $*" >&2; exit 1; }

run non_root 1000 "" ok
[ "$(cat "$tmp/non_root.rc")" = 1 ] || fail "not root: exit $(cat "$tmp/non_root.rc"), expected 1"
grep -q 'missing packages (golang-1.19-go=.*); run as root' "$tmp/non_root.err" ||
    fail "not root: golang-1.19-go not named as missing"
[ ! -s "$tmp/non_root.log" ] || fail "not root: apt-get ran"

run no_network 0 "clang-16" all
[ "$(cat "$tmp/no_network.rc")" = 1 ] || fail "failing installs: exit $(cat "$tmp/no_network.rc"), expected 1"
[ "$(head -n 1 "$tmp/no_network.log")" = "apt-get update -qq" ] || fail "failing installs: no apt-get update first"
sed -n 2p "$tmp/no_network.log" | grep -q 'install .*clang-16=.* golang-1.19-go=' ||
    fail "failing installs: golang-1.19-go not in the pinned install"
[ "$(grep -c 'install' "$tmp/no_network.log")" = 2 ] || fail "failing installs: expected two installs"
grep -q '^setup: pinned install failed; retrying unpinned$' "$tmp/no_network.err" ||
    fail "failing installs: no retry message"
grep -q '^setup: apt-get install failed (network or apt sources?)$' "$tmp/no_network.err" ||
    fail "failing installs: no failure message"

run unpinned 0 "clang-16" pinned
[ "$(cat "$tmp/unpinned.rc")" = 0 ] || fail "unpinned install: exit $(cat "$tmp/unpinned.rc"), expected 0"
tail -n 1 "$tmp/unpinned.log" | grep -q 'install .* clang-16 golang-1.19-go$' ||
    fail "unpinned install: not retried without versions"
echo "setup_test: PASS"
