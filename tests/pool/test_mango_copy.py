"""`mango copy POOL DEST`: a backup of a pool no process has open.

The copy is byte-for-byte the pool (holes and zero chunks read back as the
zeros they stand for), sparse, checked before it gets its name, and taken
with the pool's big-batch file; a pool left by a crash copies as well as a
closed one, and the copy recovers. It refuses a pool in use, a missing or
bad pool, and an existing DEST or DEST.bigbatch, leaving nothing behind and
the source unchanged.

Pools are made by the kvstore example and tests/unit/test_big_batch.c, as in
test_bad_pools.py, whose helpers this file uses (same environment).
"""

import fcntl
import os
import re
import subprocess

import pytest

from test_bad_pools import (BIG_BATCH, FRAME_HEADER, KVSTORE, MANGO, check, flip_bit, inspect_json,
                            make_pending_big_batch, make_pending_pool, make_pool, reopen, run, sha256,
                            workdir)  # noqa: F401 (workdir: the fixture)

pytestmark = pytest.mark.skipif(
    not (KVSTORE and MANGO and os.access(KVSTORE, os.X_OK) and os.access(MANGO, os.X_OK)),
    reason="set KVSTORE_BIN and MANGO_BIN to the built kvstore and mango binaries",
)


def copy(*args):
    return run(MANGO, "copy", *args)


def leftovers(d, keep):
    """Files in d other than those named in keep (a failed copy leaves none)."""
    return sorted(set(os.listdir(d)) - set(keep))


def test_a_pool_left_by_a_crash_copies_exactly_and_the_copy_recovers(workdir):
    p, info = make_pending_pool(workdir)
    before = sha256(p)
    dest = os.path.join(workdir, "copy")
    r = copy(p, dest)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert re.search(r" -> .*copy: 32 MiB pool, .* written in [\d.]+ s; the copy checks ok", r.stdout), r.stdout
    assert sha256(p) == before, "copying modified the pool"
    assert sha256(dest) == before, "the copy differs from the pool"
    assert os.stat(dest).st_blocks <= os.stat(p).st_blocks  # sparse
    assert os.stat(dest).st_mode & 0o777 == os.stat(p).st_mode & 0o777
    assert inspect_json(dest)["log"]["committed_frames"] == info["log"]["committed_frames"]
    assert leftovers(workdir, ["pending", "ack", "copy"]) == []
    k = reopen(dest)  # the copy recovers: replays the pending frames
    assert k.returncode == 0 and "RECOVERED" in k.stdout, (k.stdout, k.stderr)
    assert sha256(p) == before


@pytest.mark.skipif(not (BIG_BATCH and os.access(BIG_BATCH, os.X_OK)),
                    reason="set BIG_BATCH_BIN to the built test_big_batch")
def test_the_big_batch_file_comes_along(workdir):
    p = make_pending_big_batch(workdir)
    dest = os.path.join(workdir, "copy")
    r = copy(p, dest)
    assert r.returncode == 0 and "(with its big-batch file)" in r.stdout, (r.stdout, r.stderr)
    assert sha256(dest) == sha256(p) and sha256(dest + ".bigbatch") == sha256(p + ".bigbatch")
    c = check(dest)  # names the copy's own big-batch file
    assert c.returncode == 0 and "1 committed frame pending replay" in c.stdout, (c.stdout, c.stderr)
    k = run(BIG_BATCH, "verify", "emulated", dest, "0", "-")
    assert k.returncode in (0, 20), (k.returncode, k.stdout, k.stderr)  # 20: it replayed the big batch


def test_refusals_leave_nothing_behind(workdir):
    p = make_pool(workdir)
    before = sha256(p)
    dest = os.path.join(workdir, "copy")
    # usage
    for args, needle in (((), "missing POOL and DEST"), ((p,), "missing DEST"), ((p, dest, "x"), "unexpected"),
                         (("--frobnicate", p, dest), "unknown option")):
        r = copy(*args)
        assert r.returncode == 2 and needle in r.stderr, (args, r.returncode, r.stderr)
    # a missing pool
    r = copy(os.path.join(workdir, "nothing"), dest)
    assert r.returncode == 2 and "cannot open pool" in r.stderr, r.stderr
    # in use: an exclusive lock, as a running process holds
    fd = os.open(p, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = copy(p, dest)
        assert r.returncode == 2 and "in use by another process" in r.stderr and "MANGOSNAPSHOT" in r.stderr, r.stderr
    finally:
        os.close(fd)
    assert leftovers(workdir, ["pool"]) == []
    # DEST or DEST.bigbatch exists: never replaced
    for existing in (dest, dest + ".bigbatch"):
        with open(existing, "w") as f:
            f.write("precious")
        r = copy(p, dest)
        assert r.returncode == 2 and "exists: nothing is replaced" in r.stderr, r.stderr
        with open(existing) as f:
            assert f.read() == "precious"
        os.unlink(existing)
    assert leftovers(workdir, ["pool"]) == []
    assert sha256(p) == before
    # and with all that out of the way, it copies; --quiet prints nothing
    r = copy("--quiet", p, dest)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", (r.stdout, r.stderr)
    assert sha256(dest) == before


def test_a_pool_that_does_not_check_is_not_copied_unless_asked(workdir):
    """A flipped bit in a pending frame followed by committed frames: the
    pool opens (its header is sound) but does not check. The copy is
    refused with exit 1 and nothing at DEST; with --no-check it is made."""
    p, info = make_pending_pool(workdir, min_frames=2)
    f = info["log"]["frames"][0]
    flip_bit(p, f["offset"] + FRAME_HEADER + 16 + 5, 2)
    before = sha256(p)
    dest = os.path.join(workdir, "copy")
    r = copy(p, dest)
    assert r.returncode == 1 and "does not check" in r.stderr and "committed frames follow" in r.stderr, r.stderr
    assert leftovers(workdir, ["pending", "ack"]) == []
    r = copy("--no-check", p, dest)
    assert r.returncode == 0 and "checks ok" not in r.stdout, (r.stdout, r.stderr)
    assert sha256(dest) == before == sha256(p)


def test_permissions_and_what_an_abandoned_copy_left(workdir):
    """DEST gets POOL's permissions whatever the umask; the temporary file of
    a copy whose process is gone (DEST.copying-PID, as a kill -9 leaves it)
    is removed by the next copy to that DEST, and one of a live process is
    left alone."""
    p = make_pool(workdir)
    os.chmod(p, 0o666)
    dest = os.path.join(workdir, "copy")
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = f"{dest}.copying-{gone.pid}"
    live = f"{dest}.copying-{os.getpid()}"
    for f in (stale, stale + ".bigbatch", live):
        with open(f, "w") as fh:
            fh.write("partial")
    old = os.umask(0o077)
    try:
        r = copy(p, dest)
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    assert f"removed {stale}, left by a copy whose process {gone.pid} is gone" in r.stderr, r.stderr
    assert not os.path.exists(stale) and not os.path.exists(stale + ".bigbatch") and os.path.exists(live)
    assert os.stat(dest).st_mode & 0o777 == 0o666


@pytest.mark.parametrize("suffix", [".bigbatch", ".tmp.4242", ".copying-77"])
def test_dest_named_like_a_file_the_pool_owns_is_refused(workdir, suffix):
    """`mango copy POOL POOL.bigbatch` (or POOL.tmp.<pid>, or a name ending
    in .copying-<pid>) made a backup under a name that the pool's next open
    (recovery removes POOL.bigbatch), creation or copy removes (found by a
    review, session 37): refused, exit 2, nothing written."""
    p = make_pool(workdir)
    before = sha256(p)
    dst = p + suffix
    r = copy(p, dst)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "must not end in" in r.stderr and "choose another DEST" in r.stderr, r.stderr
    assert leftovers(workdir, ["pool"]) == []
    assert sha256(p) == before
    # Names that only look alike are fine.
    ok = p + suffix.replace("4242", "x").replace("77", "x").replace("bigbatch", "bigbatch.bak")
    r = copy(p, ok)
    assert r.returncode == 0, r.stderr
    assert reopen(ok).returncode == 0


def test_warnings_name_dest_not_the_temporary_file(workdir):
    """The copy's check warns about a damaged head slot under DEST's name,
    where the copy is once done (it named DEST.copying-PID, a file gone by
    then: found by a review, session 37)."""
    p = make_pool(workdir)
    info = inspect_json(p)
    older = [s_["index"] for s_ in info["head_slots"] if not s_["newest"]][0]
    flip_bit(p, 4096 + 64 * older + 8, 2)  # the older slot's head_lsn: checksum fails
    dst = os.path.join(workdir, "backup")
    r = copy(p, dst)
    assert r.returncode == 0, r.stderr
    assert "warning: %s: log head slot %d is corrupt" % (dst, older) in r.stderr, r.stderr
    assert ".copying-" not in r.stderr, r.stderr


@pytest.mark.parametrize("what", ["symlink-loop", "socket"])
def test_an_unopenable_big_batch_file_is_named_as_the_source(workdir, what):
    """POOL.bigbatch there but not openable (a symlink loop; a socket, which
    open() refuses with ENXIO; as root, file modes would not stop it): the
    copy is refused, exit 2, nothing left behind, and the message names the
    file that could not be read. It said "cannot write
    DEST.copying-PID.bigbatch: ...", blaming the destination, which was
    never opened (found by a review of the mango CLI)."""
    p = make_pool(workdir)
    big = p + ".bigbatch"
    if what == "symlink-loop":
        os.symlink(os.path.basename(big), big)
    else:
        import socket
        s = socket.socket(socket.AF_UNIX)
        s.bind(big)
        s.close()
    before = sha256(p)
    dest = os.path.join(workdir, "copy")
    r = copy(p, dest)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "cannot read %s" % big in r.stderr, r.stderr
    assert "cannot write" not in r.stderr and ".copying-" not in r.stderr, r.stderr
    assert leftovers(workdir, ["pool", "pool.bigbatch"]) == []
    assert sha256(p) == before


@pytest.mark.parametrize("what", ["directory", "fifo"])
def test_a_big_batch_path_that_is_not_a_file_is_named_as_such(workdir, what):
    """A directory or a FIFO at POOL.bigbatch: the copy is refused, exit 2,
    nothing left behind, saying what is there. It said "cannot read
    POOL.bigbatch: Invalid argument" (noted by a review of the mango CLI)."""
    p = make_pool(workdir)
    big = p + ".bigbatch"
    if what == "directory":
        os.mkdir(big)
    else:
        os.mkfifo(big)
    dest = os.path.join(workdir, "copy")
    r = copy(p, dest)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    kind = "a directory" if what == "directory" else "a FIFO"
    assert "%s is not a regular file (%s)" % (big, kind) in r.stderr, r.stderr
    assert "Invalid argument" not in r.stderr, r.stderr
    assert leftovers(workdir, ["pool", "pool.bigbatch"]) == []


@pytest.mark.parametrize("empty", ["POOL", "DEST"])
def test_an_empty_name_is_a_usage_error_before_any_copying(workdir, empty):
    """'' as DEST copied the whole pool (and checked it) before the rename
    failed with "cannot move the copy to : No such file or directory"
    (noted by a review of the mango CLI): now a usage error, at once."""
    p = make_pool(workdir)
    args = ["", os.path.join(workdir, "copy")] if empty == "POOL" else [p, ""]
    r = subprocess.run([os.path.abspath(MANGO), "copy", *args], capture_output=True, text=True, cwd=workdir,
                       timeout=60)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "%s is empty" % empty in r.stderr, r.stderr
    assert not [f for f in os.listdir(workdir) if ".copying-" in f], os.listdir(workdir)
