"""A sparse pool (a backup: `mango copy`'s copies and mango_snapshot()'s
snapshots are both sparse) opened for writing on a real file system.

pool_open gives it what pool_create gives a new pool: every block reserved
(a full disk is an error at open, not a SIGBUS in the middle of a batch) and
the log ring written (commits into holes would change file metadata and make
every sync a journal commit). It writes only holes, with zeros, so the pool's
contents are unchanged: a copy with committed, unapplied frames still
recovers every acknowledged write. A pool that cannot get its blocks is
refused with a clear message and left byte-for-byte unchanged, and can still
be checked and copied read-only.

A pool on tmpfs stays sparse; one larger than the tmpfs has room for is
warned about at creation and at each open.

Needs a file system that is not tmpfs (/var/tmp, or MANGO_TEST_FS_DIR)
and, for the full-disk case, root and a loop device (a 16 MiB ext4 image),
for the tmpfs case root (a 16 MiB tmpfs); skipped otherwise. Uses test_bad_pools.py's helpers (same environment).
"""

import os
import re
import shutil
import struct
import subprocess
import tempfile

import pytest

from test_bad_pools import (HDR_FINGERPRINT, KVSTORE, MANGO, check, fix_header_crc, make_pending_pool, read_at, run,
                            sha256, write_at)

pytestmark = pytest.mark.skipif(
    not (KVSTORE and MANGO and os.access(KVSTORE, os.X_OK) and os.access(MANGO, os.X_OK)),
    reason="set KVSTORE_BIN and MANGO_BIN to the built kvstore and mango binaries",
)

# The worker's options in make_pending_pool: verify must use the same.
WORKER = ["--values", "1000", "--value-size", "64", "--threads", "4"]
HDR_LOG_OFFSET = 32


def fs_type(path):
    return subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True).stdout.strip()


@pytest.fixture
def diskdir():
    base = os.environ.get("MANGO_TEST_FS_DIR", "/var/tmp")
    if not os.path.isdir(base) or fs_type(base) == "tmpfs":
        pytest.skip("%s is not a disk file system (set MANGO_TEST_FS_DIR)" % base)
    d = tempfile.mkdtemp(prefix="mango-sparse-", dir=base)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def log_ring(path):
    off, size = [int.from_bytes(read_at(path, HDR_LOG_OFFSET + 8 * i, 8), "little") for i in (0, 1)]
    return off, size


def hole_bytes(path, start, end):
    """Bytes of [start, end) that SEEK_HOLE calls holes (ext4 and xfs count
    unwritten extents too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        total, off = 0, start
        while off < end:
            h = os.lseek(fd, off, os.SEEK_HOLE)
            if h >= end:
                break
            try:
                nxt = min(os.lseek(fd, h, os.SEEK_DATA), end)
            except OSError:  # ENXIO: no data after h
                nxt = end
            total += nxt - h
            off = nxt
        return total
    finally:
        os.close(fd)


def verify(pool, ack, env_extra=None):
    args = [str(a) for a in (KVSTORE, "verify", "--pool", pool, "--ack", ack, "--mode", "fs", *WORKER)]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, env=dict(os.environ, **(env_extra or {})))


def assert_nothing_lost(v):
    assert v.returncode == 0, (v.stdout, v.stderr)
    m = re.search(r"lost=(\d+) torn=(\d+)", v.stdout)
    assert m and m.groups() == ("0", "0"), v.stdout


def test_a_sparse_copy_gets_its_blocks_and_its_ring(diskdir):
    p = os.path.join(diskdir, "pool")
    r = run(KVSTORE, "demo", "--pool", p, "--mode", "fs", "--pool-size", "32M", "--log-size", "8M")
    assert r.returncode == 0 and "FRESH" in r.stdout, (r.stdout, r.stderr)
    dest = os.path.join(diskdir, "copy")
    r = run(MANGO, "copy", p, dest)
    assert r.returncode == 0, (r.stdout, r.stderr)
    off, size = log_ring(dest)
    assert hole_bytes(dest, off, off + size) > size // 2, "the demo's copy should be mostly holes in its ring"
    assert os.stat(dest).st_blocks * 512 < os.path.getsize(dest)
    before = run(KVSTORE, "demo", "--pool", p, "--mode", "fs")  # what the original holds next time
    assert before.returncode == 0, before.stderr

    d = run(KVSTORE, "demo", "--pool", dest, "--mode", "fs")  # the first writable open
    assert d.returncode == 0, (d.stdout, d.stderr)
    first = lambda out: out.splitlines()[0]  # "pool P: RECOVERED, N updates applied so far"
    assert first(d.stdout).replace(dest, p) == first(before.stdout), "the copy does not hold what the original held"
    assert re.search(r"pool .*copy was sparse \(a backup or a copy\): reserved its 32 MiB and wrote "
                     r"[1-8] MiB of its log ring in [\d.]+ s", d.stderr), d.stderr
    assert hole_bytes(dest, off, off + size) == 0, "the ring still has holes"
    assert os.stat(dest).st_blocks * 512 >= os.path.getsize(dest), "blocks not reserved"
    assert check(dest).returncode == 0

    again = run(KVSTORE, "demo", "--pool", dest, "--mode", "fs")  # no holes left: nothing to do or say
    assert again.returncode == 0 and "sparse" not in again.stderr, again.stderr


def test_a_sparse_copy_with_unapplied_frames_recovers_every_acknowledged_write(diskdir):
    p, info = make_pending_pool(diskdir)
    assert info["log"]["committed_frames"] >= 3
    dest = os.path.join(diskdir, "copy")
    assert run(MANGO, "copy", p, dest).returncode == 0
    assert os.stat(dest).st_blocks * 512 < os.path.getsize(dest)
    v = verify(dest, os.path.join(diskdir, "ack"))
    assert_nothing_lost(v)
    assert "RECOVERED" in v.stdout, v.stdout  # (its 1 MiB ring was all written: only blocks reserved)
    assert os.stat(dest).st_blocks * 512 >= os.path.getsize(dest), "blocks not reserved"


def test_a_sparse_copy_refused_for_its_layout_is_not_filled(diskdir):
    """A backup opened by a build with another layout is refused before its
    fill: its ring keeps its holes and its file its size on disk (the fill
    used to run first, then the refusal said the pool was left unchanged)."""
    p = os.path.join(diskdir, "pool")
    r = run(KVSTORE, "demo", "--pool", p, "--mode", "fs", "--pool-size", "32M", "--log-size", "8M")
    assert r.returncode == 0, (r.stdout, r.stderr)
    dest = os.path.join(diskdir, "copy")
    assert run(MANGO, "copy", p, dest).returncode == 0
    write_at(dest, HDR_FINGERPRINT, struct.pack("<Q", 0x0123456789ABCDEF))  # another build's
    fix_header_crc(dest)
    off, size = log_ring(dest)
    holes, blocks, digest = hole_bytes(dest, off, off + size), os.stat(dest).st_blocks, sha256(dest)
    k = run(KVSTORE, "demo", "--pool", dest, "--mode", "fs")
    assert k.returncode == 2 and "different layout" in k.stderr, (k.returncode, k.stderr)
    assert "sparse" not in k.stderr, k.stderr
    assert hole_bytes(dest, off, off + size) == holes and os.stat(dest).st_blocks == blocks, "filled, then refused"
    assert sha256(dest) == digest


def test_a_new_pool_is_not_touched_again(diskdir):
    """A pool made by pool_create on disk already has its blocks and ring:
    its heap's unwritten extents (holes to SEEK_HOLE) are not written."""
    p = os.path.join(diskdir, "new")
    r = run(KVSTORE, "demo", "--pool", p, "--mode", "fs", "--pool-size", "32M", "--log-size", "1M")
    assert r.returncode == 0 and "FRESH" in r.stdout, (r.stdout, r.stderr)
    holes = hole_bytes(p, 0, os.path.getsize(p))
    r = run(KVSTORE, "demo", "--pool", p, "--mode", "fs")
    assert r.returncode == 0 and "sparse" not in r.stderr, (r.stdout, r.stderr)
    assert hole_bytes(p, 0, os.path.getsize(p)) >= holes - (4 << 20)  # the demo's own writes only


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


@pytest.fixture
def small_disk():
    """A 16 MiB ext4 file system on a loop device (root only)."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4"):
        pytest.skip("needs root and mkfs.ext4 to mount a small file system")
    d = tempfile.mkdtemp(prefix="mango-smalldisk-", dir="/var/tmp")
    img, mnt = os.path.join(d, "img"), os.path.join(d, "mnt")
    os.mkdir(mnt)
    with open(img, "wb") as f:
        f.truncate(16 << 20)
    ok = (subprocess.run(["mkfs.ext4", "-q", "-F", img], capture_output=True).returncode == 0 and
          subprocess.run(["mount", "-o", "loop", img, mnt], capture_output=True).returncode == 0)
    if not ok:
        shutil.rmtree(d, ignore_errors=True)
        pytest.skip("cannot mount a loop device here")
    yield mnt
    subprocess.run(["umount", mnt], capture_output=True)
    shutil.rmtree(d, ignore_errors=True)


def test_a_sparse_pool_that_does_not_fit_is_refused_at_open_and_left_unchanged(diskdir, small_disk):
    p, _ = make_pending_pool(diskdir)  # 32 MiB, on the large disk
    dest = os.path.join(small_disk, "copy")
    r = run(MANGO, "copy", p, dest)  # fits: only its written bytes
    assert r.returncode == 0, (r.stdout, r.stderr)
    before = sha256(dest)
    free_before = free_bytes(small_disk)
    v = verify(dest, os.path.join(diskdir, "ack"))
    assert v.returncode == 2, (v.returncode, v.stdout, v.stderr)  # a clear error, not a SIGBUS
    refused = (r"cannot reserve the disk blocks of pool .*copy: No space left on device \(the pool is 32 MiB, "
               r"its file holds \d+ MiB, the file system has \d+ MiB free; a sparse pool")
    assert re.search(refused, v.stderr), v.stderr
    assert free_bytes(small_disk) == free_before, "the refused open kept disk space"
    # Past the free-space check (as when metadata or another writer takes the
    # last blocks): the fallocate fails after reserving part of the file, and
    # the open gives that part back.
    v = verify(dest, os.path.join(diskdir, "ack"), env_extra={"MANGO_FAULT_RESERVE_ANYWAY": "1"})
    assert v.returncode == 2 and re.search(refused, v.stderr), (v.returncode, v.stderr)
    assert free_bytes(small_disk) >= free_before - (64 << 10), \
        "a failed reservation kept %d KiB" % ((free_before - free_bytes(small_disk)) >> 10)
    assert sha256(dest) == before, "a refused pool was changed"
    assert check(dest).returncode == 0  # read-only opens still work
    back = os.path.join(diskdir, "back")
    assert run(MANGO, "copy", dest, back).returncode == 0
    assert_nothing_lost(verify(back, os.path.join(diskdir, "ack")))  # and nothing was lost on the way


@pytest.fixture
def small_tmpfs():
    """A 16 MiB tmpfs (root only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    d = tempfile.mkdtemp(prefix="mango-smalltmpfs-")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", d], capture_output=True).returncode:
        os.rmdir(d)
        pytest.skip("cannot mount a tmpfs here")
    yield d
    subprocess.run(["umount", d], capture_output=True)
    os.rmdir(d)


def test_a_tmpfs_pool_larger_than_the_free_memory_is_warned_about(small_tmpfs):
    """tmpfs pools stay sparse (no reservation): a pool whose unbacked part
    exceeds the tmpfs's free space gets a warning at creation and at each
    open; one that fits gets none."""
    big = os.path.join(small_tmpfs, "big")
    r = run(KVSTORE, "demo", "--pool", big, "--mode", "emulated", "--pool-size", "32M", "--log-size", "1M")
    assert r.returncode == 0, (r.stdout, r.stderr)
    warning = (r"warning: pool .*big is on tmpfs, where \d+ MiB of its 32 MiB are not in memory yet, "
               r"and the file system has \d+ MiB free: writing past that kills this process with SIGBUS")
    assert re.search(warning, r.stderr), r.stderr
    again = run(KVSTORE, "demo", "--pool", big, "--mode", "emulated")
    assert again.returncode == 0 and re.search(warning, again.stderr), again.stderr
    os.unlink(big)
    small = os.path.join(small_tmpfs, "small")
    r = run(KVSTORE, "demo", "--pool", small, "--mode", "emulated", "--pool-size", "8M", "--log-size", "1M")
    assert r.returncode == 0 and "warning" not in r.stderr, (r.stdout, r.stderr)
