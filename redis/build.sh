#!/bin/bash
# redis/build.sh -- build a durable redis-server (Redis 7.0.15 from Debian's
# source package + Mangosteen's patch and adapter, compiled with mango-cc).
#
# Idempotent; run as root on Debian 12. Steps:
#   1. make sure deb-src entries exist (derived from this machine's own `deb`
#      entries for the release's suites; no mirror is named here), apt-get update
#   2. apt-get source redis=<pinned version> into $REDIS_WORK
#   3. copy the tree, apply redis/mango.patch, copy redis/mango_adapter.[ch]
#      and redis/mango_release.c, redis/mango_functions.c, redis/mango_heap_check.c,
#      redis/mango_snapshot.c, redis/mango_replication.c, redis/mango_sd_notify.c
#   4. make MALLOC=libc CC=mango-cc (no jemalloc: Mangosteen interposes malloc;
#      no LTO; -O2)
#   5. install the binary as $REDIS_DURABLE_OUT
#
# Environment:
#   REDIS_WORK          work dir                 (default /tmp/redis-work)
#   REDIS_DURABLE_OUT   output binary            (default $REDIS_WORK/redis-server-durable)
#   REDIS_DEB_VERSION   Debian source version    (default 5:7.0.15-1~deb12u10)
#   MANGO_BUILD_DIR     Mangosteen build dir     (default <repo>/build)
#   MANGO_CC            the compiler driver      (default $MANGO_BUILD_DIR/bin/mango-cc)
#   REDIS_SKIP_APT=1    do not touch apt (source must already be in $REDIS_WORK)
#   JOBS                make -j                  (default nproc)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
work=${REDIS_WORK:-/tmp/redis-work}
out=${REDIS_DURABLE_OUT:-$work/redis-server-durable}
version=${REDIS_DEB_VERSION:-5:7.0.15-1~deb12u10}
upstream=7.0.15
mango_build=${MANGO_BUILD_DIR:-$repo/build}
mango_cc=${MANGO_CC:-$mango_build/bin/mango-cc}
jobs=${JOBS:-$(nproc)}

say() { printf '[redis/build] %s\n' "$*"; }
die() { printf '[redis/build] ERROR: %s\n' "$*" >&2; exit 1; }

[ -x "$mango_cc" ] || die "mango-cc not found at $mango_cc (build Mangosteen first: bash scripts/build.sh)"
mkdir -p "$work"

# ---- 1. deb-src entries ------------------------------------------------
ensure_deb_src() {
    . /etc/os-release
    local codename=${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}
    local list=/etc/apt/sources.list.d/mango-deb-src.list
    local tmp
    tmp=$(mktemp)
    # one-line format: "deb [opts] URI SUITE COMPONENTS..."
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        [ "$f" = "$list" ] && continue
        awk -v c="$codename" '
            $1 == "deb" {
                i = 2; opts = ""
                if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) { opts = opts " " $i; i++ } opts = opts " " $i; i++ }
                uri = $i; suite = $(i+1)
                if (suite != c && index(suite, c "-") != 1) next
                line = "deb-src" opts " " uri " " suite
                for (j = i + 2; j <= NF; j++) line = line " " $j
                print line
            }' "$f" >>"$tmp"
    done
    # deb822 format: stanzas with "Types:" lacking deb-src
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk -v c="$codename" '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && types !~ /deb-src/ && enabled != "no") {
                    n = split(suites, s, " ")
                    for (k = 1; k <= n; k++) {
                        if (s[k] != c && index(s[k], c "-") != 1) continue
                        nu = split(uris, u, " ")
                        for (m = 1; m <= nu; m++) {
                            o = signed != "" ? " [signed-by=" signed "]" : ""
                            print "deb-src" o " " u[m] " " s[k] " " comps
                        }
                    }
                }
                types = uris = suites = comps = signed = enabled = ""
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            { key = $1; sub(/:$/, "", key); val = $0; sub(/^[^:]*:[ \t]*/, "", val) }
            key == "Types" { types = val }
            key == "URIs" { uris = val }
            key == "Suites" { suites = val }
            key == "Components" { comps = val }
            key == "Signed-By" { signed = val }
            key == "Enabled" { enabled = tolower(val) }
            END { flush() }' "$f" >>"$tmp"
    done
    sort -u "$tmp" -o "$tmp"
    if [ ! -s "$tmp" ]; then
        rm -f "$tmp"
        die "no 'deb' entry for suite $codename found in /etc/apt/sources.list{,.d}; cannot derive deb-src"
    fi
    if [ -f "$list" ] && cmp -s "$tmp" "$list"; then
        say "deb-src entries already present ($list)"
        rm -f "$tmp"
        return 1   # unchanged
    fi
    install -m 0644 "$tmp" "$list"
    rm -f "$tmp"
    say "wrote $list:"
    sed 's/^/    /' "$list"
    return 0
}

srcdir=$work/redis-$upstream
if [ "${REDIS_SKIP_APT:-0}" != 1 ]; then
    [ "$(id -u)" = 0 ] || die "must run as root (apt-get), or set REDIS_SKIP_APT=1 with the source already in $work"
    changed=0
    ensure_deb_src && changed=1
    stamp=$work/.apt-updated
    if [ "$changed" = 1 ] || [ ! -f "$stamp" ]; then
        say "apt-get update"
        apt-get update -qq || die "apt-get update failed"
        touch "$stamp"
    fi
    command -v dpkg-source >/dev/null || { say "installing dpkg-dev"; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dpkg-dev >/dev/null; }
    if [ ! -f "$work/.source-$version" ]; then
        avail=$(apt-cache showsrc redis 2>/dev/null | awk '/^Version:/ {print $2}' | sort -u)
        echo "$avail" | grep -qxF "$version" ||
            die "source package redis=$version not available (apt-cache showsrc redis lists: $(echo $avail)); set REDIS_DEB_VERSION"
        say "apt-get source redis=$version"
        rm -rf "$work/src-pkg"
        mkdir -p "$work/src-pkg"
        (cd "$work/src-pkg" && apt-get source -qq "redis=$version") || die "apt-get source failed"
        touch "$work/.source-$version"
    else
        say "source redis=$version already fetched"
    fi
fi
pkgsrc=$(ls -d "$work"/src-pkg/redis-$upstream 2>/dev/null | head -n1 || true)
[ -n "$pkgsrc" ] && [ -d "$pkgsrc" ] || die "no unpacked source at $work/src-pkg/redis-$upstream"

# ---- 2. our tree: pristine copy + patch + adapter ------------------------
# Rebuilt from scratch whenever the patch, the adapter, the capture plugin or
# its inline header changed (stamp = their hash).
# Every input must exist: the hash below would otherwise fail under pipefail
# inside an assignment, which set -e ends without a word (found by a review).
inputs=("$here/mango.patch" "$here/mango_adapter.c" "$here/mango_adapter.h" "$here/mango_release.c"
    "$here/mango_functions.c" "$here/mango_heap_check.c" "$here/mango_snapshot.c" "$here/mango_replication.c"
    "$here/mango_sd_notify.c" "$here/mango-systemd/systemd/sd-daemon.h" "$mango_build/lib/MangoCapture.so"
    "$repo/include/mango_capture_inline.h" "$repo/include/mango.h")
for f in "${inputs[@]}"; do
    [ -f "$f" ] || die "missing build input $f (build Mangosteen first: bash scripts/build.sh)"
done
inputs_hash=$(cat "${inputs[@]}" | sha256sum | cut -c1-16)
if [ ! -f "$srcdir/.mango-$inputs_hash" ]; then
    say "preparing $srcdir (patch + adapter, inputs $inputs_hash)"
    rm -rf "$srcdir"
    cp -a "$pkgsrc" "$srcdir"
    (cd "$srcdir" && patch -p1 --no-backup-if-mismatch -s <"$here/mango.patch") || die "redis/mango.patch does not apply"
    cp "$here/mango_adapter.c" "$here/mango_adapter.h" "$here/mango_release.c" "$here/mango_functions.c" \
        "$here/mango_heap_check.c" "$here/mango_snapshot.c" "$here/mango_replication.c" "$here/mango_sd_notify.c" "$srcdir/src/"
    cp -r "$here/mango-systemd" "$srcdir/src/"
    touch "$srcdir/.mango-$inputs_hash"
else
    say "tree up to date ($srcdir)"
fi

# ---- 3. build -------------------------------------------------------------
# Redis's Makefile: MALLOC=libc (no jemalloc), OPTIMIZATION=-O2 (no -flto),
# BUILD_TLS=no, USE_SYSTEMD=no (no libsystemd: HAVE_LIBSYSTEMD with our own
# sd_notify, mango_sd_notify.c, compiles Redis's "supervised systemd" in).
# Only redis-server is built. The bundled deps
# (hiredis, lua, hdr_histogram, fpconv) are compiled with mango-cc too, so
# their stores to durable memory are captured.
# Relink when the runtime archive is newer than the binary.
if [ -f "$srcdir/src/redis-server" ] && [ "$mango_build/src/libmango.a" -nt "$srcdir/src/redis-server" ]; then
    rm -f "$srcdir/src/redis-server"
fi
say "make (CC=$mango_cc, -j$jobs)"
make -C "$srcdir/src" -j"$jobs" \
    CC="$mango_cc" LD="$mango_cc" \
    MALLOC=libc OPTIMIZATION=-O2 BUILD_TLS=no USE_SYSTEMD=no V=${V:-} \
    REDIS_CFLAGS="-DHAVE_LIBSYSTEMD -I$srcdir/src/mango-systemd" \
    redis-server >"$work/make.log" 2>&1 || { tail -n 40 "$work/make.log" >&2; die "make failed (log: $work/make.log)"; }
mkdir -p "$(dirname "$out")"
install -m 0755 "$srcdir/src/redis-server" "$out"
say "built $out"
