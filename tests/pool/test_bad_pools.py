"""Bad-pool tests: a damaged, foreign or busy pool is refused with a clear
message and left byte-for-byte unchanged.

Every test builds a fresh pool with the kvstore example, damages it, then runs
  * `mango check POOL`   (read-only validation; exit 1 = bad pool, 2 = cannot
                          read it: missing, in use), and
  * `kvstore demo --pool POOL`  (a real writable open + recovery; exit 2 on
                          any runtime error),
and compares the file's SHA-256 before and after.

Environment: KVSTORE_BIN and MANGO_BIN name the built binaries (CTest sets
them, see CMakeLists.txt). Pools are small (32 MiB, 1 MiB log) sparse files in
a temporary directory under /dev/shm when it exists.
"""

import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import tempfile
import time

import pytest

KVSTORE = os.environ.get("KVSTORE_BIN")
MANGO = os.environ.get("MANGO_BIN")

pytestmark = pytest.mark.skipif(
    not (KVSTORE and MANGO and os.access(KVSTORE, os.X_OK) and os.access(MANGO, os.X_OK)),
    reason="set KVSTORE_BIN and MANGO_BIN to the built kvstore and mango binaries",
)

POOL_SIZE = "32M"
LOG_SIZE = "1M"
TIMEOUT = 30

# ---- on-media layout (src/pool/pool_format.h, src/log/redo_log.h) ----
HDR_MAGIC = 0
HDR_VERSION = 8
HDR_HEADER_SIZE = 12
HDR_POOL_SIZE = 16
HDR_CREATED_MODE = 24
HDR_REGION_COUNT = 28
HDR_LOG_OFFSET = 32
HDR_LOG_SIZE = 40
HDR_HEAP_BASE = 48
HDR_HEAP_CAPACITY = 56
HDR_CREATE_TIME = 64
HDR_FINGERPRINT = 72
HDR_REGION_TABLE_CRC = 80
HDR_FINGERPRINT_TEXT = 88
HDR_HEADER_CRC = HDR_FINGERPRINT_TEXT + 2048  # 2136: CRC of the bytes before it
HEAD_OFFSET = 4096  # two 64-byte slots; each slot's CRC covers its first 36 bytes
SLOT_SIZE = 64
REGIONS_OFFSET = 8192  # pool_region[]: 48 bytes each
REGION_SIZE = 48
FRAME_HEADER = 64  # log_frame; entries (48 bytes each) follow
ENTRY_SIZE = 48


# ---- CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) ----
def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def test_crc32c_known_answer():
    # RFC 3720 / iSCSI check value.
    assert crc32c(b"123456789") == 0xE3069283


# ---- helpers ----
@pytest.fixture
def workdir():
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    d = tempfile.mkdtemp(prefix="mango-badpool-", dir=base)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def run(*args, timeout=TIMEOUT):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout)


def run_env(env, *args, timeout=TIMEOUT):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=env)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def make_pool(d, name="pool"):
    p = os.path.join(d, name)
    r = run(KVSTORE, "demo", "--pool", p, "--mode", "emulated", "--pool-size", POOL_SIZE,
            "--log-size", LOG_SIZE)
    assert r.returncode == 0, r.stderr
    assert "FRESH" in r.stdout
    return p


def read_at(path, off, n):
    with open(path, "rb") as f:
        f.seek(off)
        return f.read(n)


def write_at(path, off, data):
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)


def flip_bit(path, off, bit=0):
    b = read_at(path, off, 1)[0]
    write_at(path, off, bytes([b ^ (1 << bit)]))


def fix_header_crc(path):
    hdr = read_at(path, 0, HDR_HEADER_CRC)
    write_at(path, HDR_HEADER_CRC, struct.pack("<I", crc32c(hdr)))


def inspect_json(path):
    r = run(MANGO, "inspect", "--json", path)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def check(path):
    return run(MANGO, "check", path)


def reopen(path):
    return run(KVSTORE, "demo", "--pool", path, "--mode", "emulated")


def assert_refused(path, *needles, check_status=1):
    """Both the checker and a real open refuse the pool, name the problem
    (every needle, case-insensitively, in both messages), and leave the file
    byte-for-byte unchanged."""
    before = sha256(path)
    size = os.path.getsize(path)
    c = check(path)
    assert c.returncode == check_status, (c.returncode, c.stdout, c.stderr)
    assert c.stderr.startswith("mango: "), c.stderr
    k = reopen(path)
    assert k.returncode == 2, (k.returncode, k.stdout, k.stderr)
    for n in needles:
        assert n.lower() in c.stderr.lower(), (n, c.stderr)
        assert n.lower() in k.stderr.lower(), (n, k.stderr)
    assert os.path.getsize(path) == size
    assert sha256(path) == before, "refusing the pool modified it"
    return c, k


def make_pending_pool(d, min_frames=3, attempts=15):
    """A pool with committed frames the backend has not applied yet: run the
    crash-test worker and SIGKILL it (retrying until the kill landed between a
    commit and the backend's apply). Returns (path, inspect --json output)."""
    p = os.path.join(d, "pending")
    ack = os.path.join(d, "ack")
    for i in range(attempts):
        for f in (p, ack):
            if os.path.exists(f):
                os.unlink(f)
        w = subprocess.Popen([KVSTORE, "worker", "--pool", p, "--ack", ack, "--mode", "emulated",
                              "--pool-size", POOL_SIZE, "--log-size", LOG_SIZE, "--values", "1000",
                              "--value-size", "64", "--threads", "4", "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # Wait until it is running (acknowledgements appear), then a bit more.
        deadline = time.time() + 5
        while time.time() < deadline and w.poll() is None:
            if os.path.exists(ack) and os.path.getsize(ack) >= 32:
                if struct.unpack("<Q", read_at(ack, 24, 8))[0] > 0:  # total_acked
                    break
            time.sleep(0.01)
        time.sleep(0.2 + 0.05 * (i % 5))
        assert w.poll() is None, w.stderr.read()
        w.send_signal(signal.SIGKILL)
        w.wait()
        w.stderr.close()
        info = inspect_json(p)
        log = info["log"]
        if not log["corrupt"] and log["committed_frames"] >= min_frames:
            return p, info
    pytest.fail("could not catch the worker with %d committed, unapplied frames" % min_frames)


def make_pending_hashmap(d, attempts=15):
    """The hash-map variant (allocations, frees, table growth on the durable
    heap) SIGKILLed with committed frames the backend has not applied yet.
    Returns (path, inspect --json output)."""
    p = os.path.join(d, "hm")
    for i in range(attempts):
        if os.path.exists(p):
            os.unlink(p)
        w = subprocess.Popen([KVSTORE, "hashmap", "--pool", p, "--mode", "emulated", "--pool-size", POOL_SIZE,
                              "--log-size", LOG_SIZE, "--ops", "50000000"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.4 + 0.05 * (i % 5))
        w.send_signal(signal.SIGKILL)
        w.wait()
        info = inspect_json(p)
        if not info["log"]["corrupt"] and info["log"]["committed_frames"] >= 1:
            return p, info
    pytest.fail("could not catch the hash map with committed, unapplied frames")


# ---- good pools ----
def test_good_pool_check_inspect_and_recover(workdir):
    p = make_pool(workdir)
    before = sha256(p)
    c = check(p)
    assert c.returncode == 0, c.stderr
    assert c.stdout.startswith(p + ": ok (") and c.stderr == ""
    m = re.search(r"heap ([\d.]+ \w+) carved, ([\d.]+ \w+) in (\d+) allocations?;", c.stdout)
    assert m and int(m.group(3)) > 0, c.stdout  # the kvstore demo's table
    i = run(MANGO, "inspect", p)
    assert i.returncode == 0, i.stderr
    for word in ("format version   2", "region", "head slots", "fingerprint", "torn tail"):
        assert word in i.stdout
    info = inspect_json(p)
    assert info["header"]["version"] == 2
    assert info["header"]["pool_size"] == os.path.getsize(p)
    assert {r["kind"] for r in info["regions"]} >= {"heap", "data"}
    assert all(s["valid"] for s in info["head_slots"])
    assert info["log"]["committed_frames"] == 0 and not info["log"]["corrupt"]
    assert sha256(p) == before, "check/inspect modified the pool"
    k = reopen(p)
    assert k.returncode == 0, k.stderr
    assert "RECOVERED" in k.stdout


def test_pending_log_is_checked_and_replayed(workdir):
    p, info = make_pending_pool(workdir, min_frames=1)
    before = sha256(p)
    c = check(p)
    assert c.returncode == 0, c.stderr
    assert "needs recovery" in c.stdout
    assert sha256(p) == before
    k = reopen(p)
    assert k.returncode == 0, k.stderr
    assert "RECOVERED" in k.stdout
    assert check(p).returncode == 0


def test_usage_errors(workdir):
    for args in ([], ["--bogus"], ["frobnicate"], ["inspect"], ["check"], ["inspect", "--bogus", "x"],
                 ["check", "--nope", "x"], ["inspect", "a", "b"]):
        r = run(MANGO, *args)
        assert r.returncode == 2, args
        assert r.stderr.startswith("mango"), (args, r.stderr)
        assert "--help" in r.stderr
    for args in (["--help"], ["inspect", "--help"], ["check", "--help"], ["help", "check"]):
        r = run(MANGO, *args)
        assert r.returncode == 0, args
        assert "SYNOPSIS" in r.stdout and "EXIT STATUS" in r.stdout
    r = run(MANGO, "check", os.path.join(workdir, "missing"))
    assert r.returncode == 2 and "No such file" in r.stderr


# ---- truncation ----
@pytest.mark.parametrize("cut", ["zero", "header-only", "below-minimum", "minimum", "half",
                                 "minus-page", "minus-byte"])
def test_truncated(workdir, cut):
    p = make_pool(workdir)
    full = os.path.getsize(p)
    size = {"zero": 0, "header-only": 4096, "below-minimum": 3 * 4096 - 1, "minimum": 3 * 4096,
            "half": full // 2, "minus-page": full - 4096, "minus-byte": full - 1}[cut]
    os.truncate(p, size)
    if size < 3 * 4096:
        assert_refused(p, "not a Mangosteen pool", "only %d bytes" % size)
    else:
        assert_refused(p, "truncated", "%d bytes" % size)


def test_grown_file(workdir):
    """A file longer than its pool is called grown, not truncated (it was
    "(truncated?)" until session 37)."""
    p = make_pool(workdir)
    full = os.path.getsize(p)
    os.truncate(p, full + 4096)
    c, k = assert_refused(p, "%d bytes" % (full + 4096), "grown")
    assert "(truncated?)" not in c.stderr and "(truncated?)" not in k.stderr


def test_option_errors_name_the_option(workdir):
    """An unknown short option inside a cluster is named (it was the
    argument before the cluster: the command's name), and a known long
    option given a value is said to take none (it was called unknown)."""
    p = make_pool(workdir)
    for args, needle in ((["check", "-xq", p], "unknown option '-x'"),
                         (["check", "--quiet", "-xq", p], "unknown option '-x'"),
                         (["copy", "-zq", p, p + ".c"], "unknown option '-z'"),
                         (["inspect", "--json=1", p], "option '--json' takes no value"),
                         (["check", "--no-heap-walk=yes", p], "option '--no-heap-walk' takes no value"),
                         (["check", "--bogus", p], "unknown option '--bogus'")):
        r = run(MANGO, *args)
        assert r.returncode == 2 and needle in r.stderr, (args, r.stderr)
        assert "--help" in r.stderr
    assert not os.path.exists(p + ".c")


def test_not_a_regular_file(workdir):
    """A FIFO: check, inspect and copy waited in open() for a writer forever;
    a directory was "not a Mangosteen pool (only 4096 bytes)". Both are
    refused at once with what they are (exit 2: not a pool that could be
    read), by the CLI and by the runtime."""
    fifo = os.path.join(workdir, "fifo")
    os.mkfifo(fifo)
    for path, what in ((fifo, "a FIFO"), (workdir, "a directory")):
        for args in (["check", path], ["inspect", path], ["inspect", "--json", path],
                     ["copy", path, os.path.join(workdir, "c")]):
            r = run(MANGO, *args, timeout=10)
            assert r.returncode == 2, (args, r.returncode, r.stderr)
            assert "is not a pool file: it is %s" % what in r.stderr, (args, r.stderr)
        k = run(KVSTORE, "demo", "--pool", path, "--mode", "emulated", timeout=10)
        assert k.returncode == 2 and "is not a pool file: it is %s" % what in k.stderr, k.stderr
    assert sorted(os.listdir(workdir)) == ["fifo"]


def test_a_device_is_refused_without_being_opened(workdir):
    """A character device at the pool's path (or a symlink to one) is
    refused, exit 2, before anything opens it: opening a device can act on
    it (a watchdog starts counting). The pool was opened first and its type
    checked after (noted by a review of the CLI with hostile files). The
    device is a private copy of /dev/null, watched with inotify for opens."""
    import ctypes
    import stat
    node = os.path.join(workdir, "dev")
    try:
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs root (CAP_MKNOD)")
    link = os.path.join(workdir, "link")
    os.symlink("dev", link)
    libc = ctypes.CDLL(None, use_errno=True)
    ino = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert ino >= 0 and libc.inotify_add_watch(ino, node.encode(), 0x20) >= 0  # IN_OPEN
    try:
        for path in (node, link):
            for args in (["check", path], ["inspect", path], ["copy", path, os.path.join(workdir, "c")]):
                r = run(MANGO, *args, timeout=10)
                assert r.returncode == 2, (args, r.returncode, r.stderr)
                assert "is not a pool file: it is a character device" in r.stderr, (args, r.stderr)
            k = run(KVSTORE, "demo", "--pool", path, "--mode", "emulated", timeout=10)
            assert k.returncode == 2 and "is not a pool file: it is a character device" in k.stderr, k.stderr
        try:
            events = os.read(ino, 4096)
        except BlockingIOError:
            events = b""
        assert events == b"", "the device was opened %d time(s)" % (len(events) // 16)
        # (The watch works: an open of the device is seen.)
        open(node).close()
        assert len(os.read(ino, 4096)) >= 16
    finally:
        os.close(ino)


def test_a_socket_is_not_a_pool_file(workdir):
    """A Unix socket at the pool's path: open() refuses it with ENXIO, so
    check, inspect, copy and the runtime said "cannot open pool ...: No such
    device or address" (the "it is a socket" message after fstat was never
    reached: found by a review of the CLI with hostile files). Refused at
    once with what it is, exit 2, like a FIFO or a directory."""
    import socket
    sock = os.path.join(workdir, "sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock)
    s.close()
    link = os.path.join(workdir, "link")
    os.symlink("sock", link)
    for path in (sock, link):
        for args in (["check", path], ["inspect", path], ["inspect", "--json", path],
                     ["copy", path, os.path.join(workdir, "c")]):
            r = run(MANGO, *args, timeout=10)
            assert r.returncode == 2, (args, r.returncode, r.stderr)
            assert "is not a pool file: it is a socket" in r.stderr, (args, r.stderr)
            assert "No such device or address" not in r.stderr, (args, r.stderr)
        k = run(KVSTORE, "demo", "--pool", path, "--mode", "emulated", timeout=10)
        assert k.returncode == 2 and "is not a pool file: it is a socket" in k.stderr, k.stderr
    assert sorted(os.listdir(workdir)) == ["link", "sock"]


def test_json_keeps_utf8(workdir):
    """inspect --json writes a UTF-8 path as it is (each byte was escaped as
    a backslash-u escape, which decodes to other characters); a byte that is not UTF-8
    becomes U+FFFD, so the output is still valid JSON."""
    p = make_pool(workdir)
    for name, shown in (("pé-€-𝄞", "pé-€-𝄞"), (b"p\xff\xc3", "p\ufffd\ufffd")):
        q = os.path.join(os.fsencode(workdir), name if isinstance(name, bytes) else name.encode())
        shutil.copyfile(p, q)
        r = subprocess.run([os.fsencode(MANGO), b"inspect", b"--json", q], capture_output=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout.decode("utf-8"))
        assert out["path"] == os.path.join(workdir, shown), out["path"]
        os.unlink(q)


# ---- header damage ----
@pytest.mark.parametrize("off,bit,needle", [
    (HDR_MAGIC, 0, "bad magic"),
    (HDR_MAGIC + 5, 3, "bad magic"),
    (HDR_HEADER_SIZE, 2, "checksum"),
    (HDR_POOL_SIZE + 1, 4, "checksum"),
    (HDR_REGION_COUNT, 1, "checksum"),
    (HDR_LOG_OFFSET + 2, 0, "checksum"),
    (HDR_LOG_SIZE + 3, 7, "checksum"),
    (HDR_HEAP_BASE + 4, 1, "checksum"),
    (HDR_FINGERPRINT, 0, "checksum"),
    (HDR_REGION_TABLE_CRC, 5, "checksum"),
    (HDR_FINGERPRINT_TEXT + 10, 2, "checksum"),
    (HDR_HEADER_CRC, 0, "checksum"),
])
def test_header_bit_flip(workdir, off, bit, needle):
    p = make_pool(workdir)
    flip_bit(p, off, bit)
    assert_refused(p, needle)


def test_header_version_bit_flip_is_refused(workdir):
    """A flipped bit in the version field (checksum NOT fixed) is refused too;
    the version is checked first, so the message names the version."""
    p = make_pool(workdir)
    flip_bit(p, HDR_VERSION, 0)  # 2 -> 3
    assert_refused(p, "version 3")


@pytest.mark.parametrize("version", [0, 1, 3, 0x100])
def test_wrong_version(workdir, version):
    """A well-formed header (checksum recomputed) of another format version is
    reported as a version problem, not as corruption."""
    p = make_pool(workdir)
    write_at(p, HDR_VERSION, struct.pack("<I", version))
    fix_header_crc(p)
    c, k = assert_refused(p, "version %d" % version, "reads version 2")
    assert "checksum" not in c.stderr and "checksum" not in k.stderr


def test_fix_header_crc_is_exact(workdir):
    """Recomputing the CRC of an unmodified header reproduces it (so the tests
    above change only what they mean to)."""
    p = make_pool(workdir)
    before = sha256(p)
    fix_header_crc(p)
    assert sha256(p) == before


def test_foreign_fingerprint(workdir):
    """A pool from a binary with another layout: structurally sound, so
    `mango check` accepts it (it cannot know which program will open it) and
    `inspect` shows the foreign fingerprint; opening it from kvstore is refused
    as a different layout and leaves the file unchanged."""
    p = make_pool(workdir)
    write_at(p, HDR_FINGERPRINT, struct.pack("<Q", 0x0123456789ABCDEF))
    fix_header_crc(p)
    before = sha256(p)
    c = check(p)
    assert c.returncode == 0, c.stderr
    assert inspect_json(p)["header"]["fingerprint"] == "0123456789abcdef"
    k = reopen(p)
    assert k.returncode == 2, k.stdout
    assert "different layout" in k.stderr and "0123456789abcdef" in k.stderr
    assert "left unchanged" in k.stderr
    assert sha256(p) == before


def test_fingerprint_text_with_control_characters_is_shown_escaped(workdir):
    """The layout text in the header is the pool file's, not this program's:
    a crafted one holding a carriage return and terminal escape sequences
    (its header checksum fixed) was written raw by `mango inspect` and by
    the refusal of the open, so on a terminal it could overwrite the lines
    around it (a forged fingerprint line) or drive the terminal (found by a
    review of the CLI with hostile files). Control characters are shown
    escaped; the pool is still refused as a different layout, unchanged."""
    p = make_pool(workdir)
    forged = b"x\r  fingerprint      0000000000000000\x1b[2K\x07\x7f\x00"
    write_at(p, HDR_FINGERPRINT_TEXT, forged)
    write_at(p, HDR_FINGERPRINT, struct.pack("<Q", 0x0123456789ABCDEF))
    fix_header_crc(p)
    before = sha256(p)
    i = run(MANGO, "inspect", p)
    assert i.returncode == 0, i.stderr
    line = [l for l in i.stdout.split("\n") if "fingerprint text" in l][0]
    for c in "\r\x1b\x07\x7f":
        assert c not in i.stdout, (c, i.stdout)
    assert "x\\x0d  fingerprint      0000000000000000\\x1b[2K\\x07\\x7f" in line, line
    assert inspect_json(p)["header"]["fingerprint_text"] == forged[:-1].decode()  # (JSON escapes it)
    k = reopen(p)
    assert k.returncode == 2 and "different layout" in k.stderr, k.stderr
    for c in "\r\x1b\x07\x7f":
        assert c not in k.stderr, (c, k.stderr)
    assert sha256(p) == before


# ---- region table damage ----
@pytest.mark.parametrize("entry,field_off,bit", [(0, 0, 0), (0, 8, 5), (0, 16, 3), (1, 24, 6),
                                                 (1, 8, 0)])
def test_region_table_bit_flip(workdir, entry, field_off, bit):
    p = make_pool(workdir)
    n = inspect_json(p)["header"]["region_count"]
    assert entry < n
    flip_bit(p, REGIONS_OFFSET + entry * REGION_SIZE + field_off, bit)
    assert_refused(p, "region table checksum mismatch")


def test_region_table_malformed_with_valid_crc(workdir):
    """A region table whose checksum matches but whose region reaches past the
    end of the file (e.g. written by a buggy tool) is refused as malformed."""
    p = make_pool(workdir)
    info = inspect_json(p)
    n = info["header"]["region_count"]
    write_at(p, REGIONS_OFFSET + 16, struct.pack("<Q", 1 << 40))  # region 0 size
    table = read_at(p, REGIONS_OFFSET, n * REGION_SIZE)
    write_at(p, HDR_REGION_TABLE_CRC, struct.pack("<I", crc32c(table)))
    fix_header_crc(p)
    assert_refused(p, "region 0 is malformed")


def rewrite_region_table(path, n):
    table = read_at(path, REGIONS_OFFSET, n * REGION_SIZE)
    write_at(path, HDR_REGION_TABLE_CRC, struct.pack("<I", crc32c(table)))
    fix_header_crc(path)


def region_field(i, name):
    """Offset of a pool_region field (kind u32, reserved u32, vaddr, size,
    mirror_offset, bitmap_offset, loader_bytes: u64)."""
    return REGIONS_OFFSET + i * REGION_SIZE + {"vaddr": 8, "size": 16, "mirror_offset": 24,
                                                "bitmap_offset": 32, "loader_bytes": 40}[name]


@pytest.mark.parametrize("case", ["log-size-0", "log-past-the-end", "log-over-the-header",
                                  "region-over-the-log", "bitmap-overflows", "bitmap-unaligned",
                                  "heap-elsewhere", "two-heaps"])
def test_header_fields_no_build_writes(workdir, case):
    """Fields whose checksums match but whose values no build writes (a
    crafted pool, or a bug) are refused with a message, never used: a log of
    0 bytes had passed and recovery then divided by it (SIGFPE), a bitmap
    offset near 2^64 wrapped the bounds check, and a heap region elsewhere
    than the header's heap address, or regions overlapping the log or the
    header, were mapped as they said (found by a review, session 36)."""
    p = make_pool(workdir)
    info = inspect_json(p)
    n = info["header"]["region_count"]
    kinds = [struct.unpack("<I", read_at(p, REGIONS_OFFSET + i * REGION_SIZE, 4))[0] for i in range(n)]
    heap = kinds.index(1)
    data = kinds.index(2)
    log_offset = struct.unpack("<Q", read_at(p, HDR_LOG_OFFSET, 8))[0]
    if case == "log-size-0":
        write_at(p, HDR_LOG_SIZE, struct.pack("<Q", 0))
        fix_header_crc(p)
        assert_refused(p, "log outside the pool")
    elif case == "log-past-the-end":
        write_at(p, HDR_LOG_SIZE, struct.pack("<Q", (1 << 64) - 4096))  # offset + size wraps
        fix_header_crc(p)
        assert_refused(p, "log outside the pool")
    elif case == "log-over-the-header":
        write_at(p, HDR_LOG_OFFSET, struct.pack("<Q", 4096))
        fix_header_crc(p)
        assert_refused(p, "overlaps the pool's header")
    elif case == "region-over-the-log":
        write_at(p, region_field(data, "mirror_offset"), struct.pack("<Q", log_offset))
        rewrite_region_table(p, n)
        assert_refused(p, "the log and the regions overlap")
    elif case == "bitmap-overflows":
        write_at(p, region_field(data, "bitmap_offset"), struct.pack("<Q", (1 << 64) - 64))
        rewrite_region_table(p, n)
        assert_refused(p, f"region {data} is malformed")
    elif case == "bitmap-unaligned":
        # (the backend and recovery read the bitmap in 32- and 64-bit words;
        # every build places it on a page: session 41)
        bm = struct.unpack("<Q", read_at(p, region_field(data, "bitmap_offset"), 8))[0]
        write_at(p, region_field(data, "bitmap_offset"), struct.pack("<Q", bm + 4))
        rewrite_region_table(p, n)
        assert_refused(p, f"region {data} is malformed")
    elif case == "heap-elsewhere":
        vaddr = struct.unpack("<Q", read_at(p, region_field(heap, "vaddr"), 8))[0]
        write_at(p, region_field(heap, "vaddr"), struct.pack("<Q", vaddr + (1 << 20)))
        rewrite_region_table(p, n)
        assert_refused(p, f"region {heap} is malformed")
    else:  # a data region marked as a second heap
        write_at(p, REGIONS_OFFSET + data * REGION_SIZE, struct.pack("<I", 1))
        rewrite_region_table(p, n)
        assert_refused(p, "is malformed")


@pytest.mark.parametrize("case", ["unmapped", "shifted", "smaller"])
def test_data_region_the_process_does_not_have(workdir, case):
    """A data region (checksums fixed) that is not the opening process's
    .data/.bss: at an address where nothing is mapped, over the executable's
    code, or of another size. Structurally sound, so `mango check` accepts it
    (it cannot know which program will open it, as with a foreign
    fingerprint); the open compares the regions with its own before writing
    anything and refuses the pool as a different layout, unchanged. Before,
    recovery rewrote both head slots and then died of SIGSEGV restoring the
    bitmap's bytes at that address (found by a review, session 37). The same
    comparison refuses a binary rebuilt without a build-id
    (test_layout_regions.py)."""
    p = make_pool(workdir)
    n = inspect_json(p)["header"]["region_count"]
    kinds = [struct.unpack("<I", read_at(p, REGIONS_OFFSET + i * REGION_SIZE, 4))[0] for i in range(n)]
    data = kinds.index(2)
    vaddr = struct.unpack("<Q", read_at(p, region_field(data, "vaddr"), 8))[0]
    size = struct.unpack("<Q", read_at(p, region_field(data, "size"), 8))[0]
    if case == "unmapped":
        write_at(p, region_field(data, "vaddr"), struct.pack("<Q", 1 << 32))
    elif case == "shifted":
        write_at(p, region_field(data, "vaddr"), struct.pack("<Q", vaddr - 0x40000))
    else:
        write_at(p, region_field(data, "size"), struct.pack("<Q", size - 32))
    rewrite_region_table(p, n)
    before = sha256(p)
    c = check(p)
    assert c.returncode == 0, (c.stdout, c.stderr)
    k = reopen(p)
    assert k.returncode == 2, (k.returncode, k.stdout, k.stderr)
    assert "different layout" in k.stderr and "data regions" in k.stderr and "left unchanged" in k.stderr, k.stderr
    assert sha256(p) == before, "refusing the pool modified it"


@pytest.mark.parametrize("size", [32, 4096, 8192 + 32])
def test_heap_region_too_small(workdir, size):
    """A heap region (header and table consistent, checksums fixed) too small
    for the allocator's root, or not whole pages, at the file's end: refused
    by `mango check` (with and without the heap walk) and by the open, named,
    unchanged. With 32 bytes, check said ok and recovery read the 1 KiB root
    past the end of the mapping: SIGSEGV (found by a review, session 37)."""
    p = make_pool(workdir)
    info = inspect_json(p)
    n = info["header"]["region_count"]
    kinds = [struct.unpack("<I", read_at(p, REGIONS_OFFSET + i * REGION_SIZE, 4))[0] for i in range(n)]
    heap = kinds.index(1)
    file_size = os.path.getsize(p)
    write_at(p, region_field(heap, "size"), struct.pack("<Q", size))
    write_at(p, region_field(heap, "mirror_offset"), struct.pack("<Q", file_size - size))
    write_at(p, HDR_HEAP_CAPACITY, struct.pack("<Q", size))
    rewrite_region_table(p, n)
    c, _ = assert_refused(p, "the heap, is malformed", "%d bytes" % size)
    r = run(MANGO, "check", "--no-heap-walk", p)
    assert r.returncode == 1 and "the heap, is malformed" in r.stderr, (r.returncode, r.stderr)


def test_regions_overlapping_in_memory(workdir):
    """A data region placed over the heap's addresses (checksums fixed):
    recovery would restore each over the other. Refused by check and open."""
    p = make_pool(workdir)
    info = inspect_json(p)
    n = info["header"]["region_count"]
    kinds = [struct.unpack("<I", read_at(p, REGIONS_OFFSET + i * REGION_SIZE, 4))[0] for i in range(n)]
    data = kinds.index(2)
    write_at(p, region_field(data, "vaddr"), struct.pack("<Q", info["header"]["heap_base"] + 4096))
    rewrite_region_table(p, n)
    assert_refused(p, "overlap in memory")


# ---- in use ----
def test_in_use_flock(workdir):
    """Another process holding the pool's exclusive lock: both refuse with 'in
    use' (check: exit 2, it could not read the pool), nothing is written."""
    p = make_pool(workdir)
    fd = os.open(p, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert_refused(p, "in use by another process", check_status=2)
        # A shared lock (e.g. a concurrent `mango check`) still blocks writers
        # but not other readers.
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        before = sha256(p)
        assert check(p).returncode == 0
        k = reopen(p)
        assert k.returncode == 2 and "in use by another process" in k.stderr
        assert sha256(p) == before
    finally:
        os.close(fd)
    assert reopen(p).returncode == 0


def test_in_use_by_worker(workdir):
    p = make_pool(workdir)
    ack = os.path.join(workdir, "ack")
    w = subprocess.Popen([KVSTORE, "worker", "--pool", p, "--ack", ack, "--mode", "emulated",
                          "--values", "1000", "--value-size", "64", "--threads", "4", "--quiet"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 10
        while time.time() < deadline:
            if os.path.exists(ack) and os.path.getsize(ack) >= 32 and \
                    struct.unpack("<Q", read_at(ack, 24, 8))[0] > 0:
                break
            assert w.poll() is None, w.stderr.read()
            time.sleep(0.01)
        else:
            pytest.fail("worker made no progress")
        c = check(p)
        assert c.returncode == 2 and "in use by another process" in c.stderr, c.stderr
        k = reopen(p)
        assert k.returncode == 2 and "in use by another process" in k.stderr, k.stderr
    finally:
        w.kill()
        w.wait()
        w.stderr.close()
    k = reopen(p)
    assert k.returncode == 0 and "RECOVERED" in k.stdout, k.stderr


# ---- head slots ----
def test_damaged_head_slot(workdir):
    """One corrupt head slot: recovery uses the other one. check warns (exit 0)
    without writing; the demo then recovers."""
    p = make_pool(workdir)
    info = inspect_json(p)
    newest = [s for s in info["head_slots"] if s["newest"]][0]
    flip_bit(p, HEAD_OFFSET + newest["index"] * SLOT_SIZE + 8, 3)  # its head_lsn
    before = sha256(p)
    c = check(p)
    assert c.returncode == 0, c.stderr
    assert "warning" in c.stderr and "slot %d is corrupt" % newest["index"] in c.stderr
    assert "head slot damaged" in c.stdout
    info2 = inspect_json(p)
    assert info2["slot_damaged"] and not info2["head_slots"][newest["index"]]["valid"]
    assert sha256(p) == before
    k = reopen(p)
    assert k.returncode == 0, k.stderr
    assert "RECOVERED" in k.stdout and "4000 updates applied so far" in k.stdout
    c = check(p)
    assert c.returncode == 0 and c.stderr == ""


def test_both_head_slots_damaged(workdir):
    p = make_pool(workdir)
    flip_bit(p, HEAD_OFFSET + 0 * SLOT_SIZE + 0, 0)
    flip_bit(p, HEAD_OFFSET + 1 * SLOT_SIZE + 16, 0)
    assert_refused(p, "both log head slots are corrupt")


def set_slot_head_lsn(path, i, head_lsn):
    """Give head slot i another head_lsn, its checksum recomputed."""
    off = HEAD_OFFSET + i * SLOT_SIZE
    write_at(path, off + 8, struct.pack("<Q", head_lsn))
    write_at(path, off + 36, struct.pack("<I", crc32c(read_at(path, off, 36))))


@pytest.mark.parametrize("which", ["newest", "both"])
def test_unaligned_head_lsn(workdir, which):
    """A head slot (checksum fixed) whose head_lsn is not a multiple of 64,
    with the log ring moved to the end of the file (the file grown to make
    room, checksums fixed) and "MGLF" in the ring's last 8 bytes: the scan
    read a 64-byte frame header at head_lsn % log_size, past the end of the
    mapping, and check, inspect and the open all died of SIGSEGV (found by a
    review, session 37). Such a slot now counts as corrupt: with the other
    slot sound, check warns and the open uses the other one; with both,
    the pool is refused, unchanged."""
    p = make_pool(workdir)
    info = inspect_json(p)
    n = info["header"]["region_count"]
    cap = info["header"]["log_size"]
    old_size = os.path.getsize(p)
    size = old_size + cap
    os.truncate(p, size)
    write_at(p, HDR_POOL_SIZE, struct.pack("<Q", size))
    write_at(p, HDR_LOG_OFFSET, struct.pack("<Q", old_size))
    fix_header_crc(p)
    write_at(p, size - 8, struct.pack("<I", 0x464C474D))
    newest = [s["index"] for s in info["head_slots"] if s["newest"]][0]
    for i in ([newest] if which == "newest" else [0, 1]):
        set_slot_head_lsn(p, i, cap - 8)
    if which == "both":
        assert_refused(p, "both log head slots are corrupt", "multiple of 64")
        return
    assert_other_slot_used(p, newest)


def assert_other_slot_used(p, bad):
    """Head slot `bad` counts as corrupt: check warns (and inspect shows the
    other slot as the newest valid one), both leave the file unchanged, and
    the open recovers from the other slot, after which check is clean."""
    before = sha256(p)
    c = check(p)
    assert c.returncode == 0, (c.returncode, c.stderr)
    assert "slot %d is corrupt" % bad in c.stderr
    i = run(MANGO, "inspect", p)
    assert i.returncode == 0, (i.returncode, i.stderr)
    slots = inspect_json(p)["head_slots"]
    assert not slots[bad]["valid"] and slots[1 - bad]["valid"] and slots[1 - bad]["newest"]
    assert sha256(p) == before
    k = reopen(p)
    assert k.returncode == 0 and "RECOVERED" in k.stdout, (k.returncode, k.stdout, k.stderr)
    c = check(p)
    assert c.returncode == 0 and c.stderr == "", c.stderr


def set_slot_field(path, i, field_offset, value):
    """Give head slot i another u64 at field_offset, its checksum recomputed."""
    off = HEAD_OFFSET + i * SLOT_SIZE
    write_at(path, off + field_offset, struct.pack("<Q", value))
    write_at(path, off + 36, struct.pack("<I", crc32c(read_at(path, off, 36))))


@pytest.mark.parametrize("field", ["head_lsn", "next_seq"])
@pytest.mark.parametrize("which", ["newest", "both"])
def test_head_slot_position_near_2_64(workdir, field, which):
    """A head slot (checksum fixed) whose head_lsn (aligned) or next_seq is
    near 2^64: it was accepted ("ok ... clean shutdown"), the log's tail
    then wrapped past 2^64, the frontend stopped waiting for log space, the
    backend applied nothing while rewriting its head, and after a kill every
    acknowledged write was gone (found by a review, session 39). A slot
    naming a position or sequence beyond 2^62 now counts as corrupt: with
    the other slot sound, check warns and the open uses the other one; with
    both, the pool is refused, unchanged."""
    p = make_pool(workdir)
    info = inspect_json(p)
    newest = [s["index"] for s in info["head_slots"] if s["newest"]][0]
    field_offset = {"head_lsn": 8, "next_seq": 16}[field]
    for i in ([newest] if which == "newest" else [0, 1]):
        set_slot_field(p, i, field_offset, 2**64 - 4096)
    if which == "both":
        assert_refused(p, "both log head slots are corrupt", "beyond 2^62")
        return
    assert_other_slot_used(p, newest)


# ---- log frames ----
def test_corrupt_frame_followed_by_committed_frame(workdir):
    """A flipped bit in the first pending frame's payload, with committed
    frames after it, cannot be a torn write: it is refused as corruption."""
    p, info = make_pending_pool(workdir, min_frames=2)
    f = info["log"]["frames"][0]
    assert f["entries"] > 0
    flip_bit(p, f["offset"] + FRAME_HEADER + 16 + 5, 2)  # first entry's data
    assert_refused(p, "corrupt", "lsn %d" % f["lsn"], "committed frames follow")


def test_corrupt_frame_header_followed_by_committed_frame(workdir):
    p, info = make_pending_pool(workdir, min_frames=2)
    f = info["log"]["frames"][0]
    flip_bit(p, f["offset"] + 8, 0)  # its lsn
    assert_refused(p, "corrupt", "committed frames follow")


def test_corrupt_middle_frame_leaves_pool_unchanged(workdir):
    """Corruption in the second pending frame: refused, and the first frame
    must not have been applied to the mirror either."""
    p, info = make_pending_pool(workdir, min_frames=3)
    frames = info["log"]["frames"]
    f = frames[1]
    flip_bit(p, f["offset"] + FRAME_HEADER + 16, 0)
    assert_refused(p, "corrupt", "committed frames follow")


def test_frame_entry_outside_regions(workdir):
    """A first frame whose checksums are right but whose block address lies
    outside every durable region (a foreign or buggy writer) is refused."""
    p, info = make_pending_pool(workdir, min_frames=1)
    f = info["log"]["frames"][0]
    base = f["offset"]
    hdr = bytearray(read_at(p, base, FRAME_HEADER))
    n = struct.unpack_from("<I", hdr, 32)[0]
    assert n == f["entries"] and n > 0
    write_at(p, base + FRAME_HEADER, struct.pack("<Q", 0x100000))  # entry 0 addr
    payload = read_at(p, base + FRAME_HEADER, n * ENTRY_SIZE)
    struct.pack_into("<I", hdr, 36, crc32c(payload))  # payload_crc
    struct.pack_into("<I", hdr, 60, crc32c(bytes(hdr[:60])))  # header_crc
    write_at(p, base, bytes(hdr))
    assert_refused(p, "outside every durable region", "0x100000")


def test_corrupt_last_frame_is_a_torn_tail(workdir):
    """A flipped bit in the LAST pending frame only is indistinguishable from a
    torn write of a batch whose commit never finished (and so was never
    acknowledged): nothing committed follows it. Recovery succeeds and
    discards that frame; `mango check` accepts the pool with a warning. (A bit
    flip in a genuinely committed last frame therefore loses that batch: the
    log design accepts this, only the last frame can be torn.)"""
    p, info = make_pending_pool(workdir, min_frames=2)
    frames = info["log"]["frames"]
    last = frames[-1]
    flip_bit(p, last["offset"] + FRAME_HEADER + 16 + 3, 6)
    before = sha256(p)
    c = check(p)
    assert c.returncode == 0, c.stderr
    assert "warning" in c.stderr and "torn tail at lsn %d" % last["lsn"] in c.stderr
    assert "payload checksum" in c.stderr
    after = inspect_json(p)["log"]
    assert after["torn_tail"] and after["torn_lsn"] == last["lsn"]
    assert after["committed_frames"] == len(frames) - 1
    assert sha256(p) == before
    k = run_env(dict(os.environ, MANGO_TRACE_RECOVERY="1"), KVSTORE, "demo", "--pool", p, "--mode", "emulated")
    assert k.returncode == 0, k.stderr
    assert "RECOVERED" in k.stdout
    # Recovery says what it discarded (its trace, and mango_stats.recovery_torn_tail in the demo's output).
    assert "replay: torn tail discarded at lsn %d" % last["lsn"] in k.stderr, k.stderr
    assert re.search(r"recovery replayed %d committed batch(es)? from the log and discarded an incomplete last one"
                     % (len(frames) - 1), k.stdout), k.stdout
    assert check(p).returncode == 0
    k = run_env(dict(os.environ, MANGO_TRACE_RECOVERY="1"), KVSTORE, "demo", "--pool", p, "--mode", "emulated")
    assert k.returncode == 0 and "torn tail" not in k.stderr, k.stderr  # the next start has none
    assert "recovery replayed 0 committed batches from the log\n" in k.stdout, k.stdout


def fix_frame_header_crc(path, off):
    hdr = read_at(path, off, 60)
    write_at(path, off + 60, struct.pack("<I", crc32c(hdr)))


def test_torn_frame_with_frames_dropped_after_it(workdir):
    """The first pending frame made a stale frame of the previous lap (its
    lsn minus the ring's size, header checksum fixed) and every later one
    written while it was in flight (durable_lsn = its position): recovery
    drops them all as a torn tail (redo_log.h). check and inspect said "no
    torn tail" (a clean end) while recovery dropped complete frames (found by
    a review, session 37); now both report the torn tail and the dropped
    frames."""
    p, info = make_pending_pool(workdir, min_frames=3)
    cap = info["header"]["log_size"]
    frames = info["log"]["frames"]
    first = frames[0]
    write_at(p, first["offset"] + 8, struct.pack("<Q", first["lsn"] - cap))
    fix_frame_header_crc(p, first["offset"])
    lo, pos, later = info["header"]["log_offset"], first["lsn"] + first["bytes"], 0
    while pos < info["log"]["end_lsn"]:  # every later frame, pad frames included
        off = lo + pos % cap
        write_at(p, off + 48, struct.pack("<Q", first["lsn"]))  # durable_lsn
        fix_frame_header_crc(p, off)
        pos += struct.unpack("<Q", read_at(p, off + 40, 8))[0]  # frame_bytes
        later += 1
    assert later >= len(frames) - 1
    before = sha256(p)
    c = check(p)
    assert c.returncode == 0, c.stderr
    assert "torn tail at lsn %d" % first["lsn"] in c.stderr, c.stderr
    assert "followed by %d complete frame" % later in c.stderr, c.stderr
    assert "no torn tail" not in c.stdout and "torn tail" in c.stdout, c.stdout
    log = inspect_json(p)["log"]
    assert log["torn_tail"] and log["torn_lsn"] == first["lsn"], log
    assert log["dropped_after_torn"] == later and log["committed_frames"] == 0, log
    i = run(MANGO, "inspect", p)
    assert re.search(r"torn tail +yes, at lsn %d" % first["lsn"], i.stdout), i.stdout
    assert re.search(r"dropped after the torn frame +%d complete frame" % later, i.stdout), i.stdout
    assert sha256(p) == before
    k = run_env(dict(os.environ, MANGO_TRACE_RECOVERY="1"), KVSTORE, "demo", "--pool", p, "--mode", "emulated")
    assert k.returncode == 0, k.stderr
    assert "torn tail discarded at lsn %d" % first["lsn"] in k.stderr, k.stderr
    assert "with %d complete frames after it" % later in k.stderr, k.stderr


def test_ring_of_frame_headers_with_bad_payloads_is_scanned_in_linear_time(workdir):
    """A crafted 4 MiB ring (checksums of every header fixed, both head
    slots marked not clean): a frame header at every 64-byte position, each
    of this lap and generation, each reaching to the ring's end, and each
    with a wrong payload checksum. After the bad frame at the head, the
    search for committed frames after it checksummed every candidate's
    payload, up to the ring's end: quadratic in the ring, 16 s for 4 MiB,
    over 2 minutes for 16 MiB, an hour for kvstore's default 64 MiB, in
    `mango check` and in recovery alike (found by a review of the CLI with
    hostile files). A candidate whose header is sound has its extent
    skipped (no frame of the same lap starts inside it), so the search
    reads each byte of the ring once: the torn tail is reported at once,
    and the open recovers from it."""
    p = os.path.join(workdir, "pool")
    r = run(KVSTORE, "demo", "--pool", p, "--mode", "emulated", "--pool-size", POOL_SIZE, "--log-size", "4M")
    assert r.returncode == 0 and "FRESH" in r.stdout, r.stderr
    info = inspect_json(p)
    cap, lo = info["header"]["log_size"], info["header"]["log_offset"]
    head, seq, gen = info["log"]["head_lsn"], info["log"]["head_seq"], info["log"]["generation"]
    ring = bytearray(cap)
    for o in range(0, cap, FRAME_HEADER):
        d = (o - head) % cap
        fb = cap - o
        h = bytearray(FRAME_HEADER)
        struct.pack_into("<IHHQQQIIQQI", h, 0, 0x464C474D, 2, 1, head + d, seq + (1 if d else 0), gen,
                         (fb - FRAME_HEADER) // ENTRY_SIZE, 1, fb, head + d + 64, 0)
        struct.pack_into("<I", h, 60, crc32c(bytes(h[:60])))
        ring[o:o + FRAME_HEADER] = h
    write_at(p, lo, bytes(ring))
    for i in range(2):
        off = HEAD_OFFSET + i * SLOT_SIZE
        write_at(p, off + 32, struct.pack("<I", 0))  # clean = 0: recovery searches too
        write_at(p, off + 36, struct.pack("<I", crc32c(read_at(p, off, 36))))
    before = sha256(p)
    t0 = time.time()
    c = run(MANGO, "check", p, timeout=60)
    took = time.time() - t0
    assert c.returncode == 0 and "torn tail at lsn %d" % head in c.stderr, (c.returncode, c.stderr)
    assert took < 5, "mango check took %.1f s" % took
    assert sha256(p) == before
    t0 = time.time()
    k = run(KVSTORE, "demo", "--pool", p, "--mode", "emulated", timeout=60)
    took = time.time() - t0
    assert k.returncode == 0 and "RECOVERED" in k.stdout, (k.returncode, k.stdout, k.stderr)
    assert took < 5, "recovery took %.1f s" % took


# ---- mirror ----
def test_corrupt_heap_root(workdir):
    p = make_pool(workdir)
    heap = [r for r in inspect_json(p)["regions"] if r["kind"] == "heap"][0]
    flip_bit(p, heap["mirror_offset"] + 16, 4)  # dheap_root.capacity
    assert_refused(p, "heap root")


@pytest.mark.parametrize("field,value", [("small_free2", "past-top"), ("small_free2", "misaligned"),
                                         ("large_free", "past-top"), ("large_free", "below-first")])
def test_heap_free_list_head_out_of_range(workdir, field, value):
    """A free list's head in the heap root past top, misaligned or below the
    first chunk: refused by the root check that every open runs (and by
    `mango check`), the file unchanged. A default open (no heap walk)
    followed it at the first allocation of its class: SIGSEGV (found by
    fuzzing pool files)."""
    p = make_pool(workdir)
    heap = [r for r in inspect_json(p)["regions"] if r["kind"] == "heap"][0]
    (top,) = struct.unpack("<Q", read_at(p, heap["mirror_offset"] + 24, 8))  # dheap_root.top
    at = heap["mirror_offset"] + (40 if field == "large_free" else 48 + 8 * 2)
    u = {"past-top": top + 16 * 4096, "misaligned": top - 4096 - 3, "below-first": 8}[value]
    write_at(p, at, struct.pack("<Q", u))
    assert_refused(p, "heap root")


def reopen_checking_heap(path):
    """A real open that walks the heap's metadata (MANGO_CHECK_HEAP=1)."""
    return subprocess.run([KVSTORE, "demo", "--pool", path, "--mode", "emulated"], capture_output=True,
                          text=True, env=dict(os.environ, MANGO_CHECK_HEAP="1"), timeout=60)


def test_inconsistent_heap_metadata(workdir):
    """A heap root whose in-use byte count is off by 16: the root check that
    recovery always runs accepts it. `mango check` walks the heap's metadata
    (on a private copy) and refuses the pool naming what is wrong;
    --no-heap-walk skips the walk; recovery with MANGO_CHECK_HEAP=1 refuses
    it too, before writing anything: both leave the file byte-for-byte
    unchanged (no replay, no new head generation)."""
    p = make_pool(workdir)
    heap = [r for r in inspect_json(p)["regions"] if r["kind"] == "heap"][0]
    at = heap["mirror_offset"] + 32  # dheap_root.allocated
    (allocated,) = struct.unpack("<Q", read_at(p, at, 8))
    write_at(p, at, struct.pack("<Q", allocated + 16))
    before = sha256(p)
    c = check(p)
    assert c.returncode == 1, (c.stdout, c.stderr)
    assert "dheap_check: root.allocated wrong" in c.stderr, c.stderr
    assert "the durable heap's metadata is inconsistent" in c.stderr, c.stderr
    q = run(MANGO, "check", "--no-heap-walk", p)
    assert q.returncode == 0 and ": ok (" in q.stdout, (q.stdout, q.stderr)
    assert sha256(p) == before
    k = reopen_checking_heap(p)
    assert k.returncode == 2, (k.stdout, k.stderr)
    assert sha256(p) == before, "refusing the pool modified it"
    assert "dheap_check: root.allocated wrong" in k.stderr, k.stderr
    assert "metadata is inconsistent (MANGO_CHECK_HEAP=1)" in k.stderr, k.stderr
    assert "the pool is unchanged" in k.stderr, k.stderr


def test_inconsistent_heap_metadata_in_the_pending_log(workdir):
    """The same inconsistency arriving through a committed, unapplied frame
    (its checksums recomputed, as a buggy writer would leave it): the mirror
    is consistent, the heap as the replay would leave it is not. `mango
    check` and a start with MANGO_CHECK_HEAP=1 both refuse it and leave the
    file unchanged, so the frame was neither applied nor discarded. (A
    checker that walked the mirror before the replay would pass the pool; a
    start that walked it after the replay would have written the pool.)"""
    for _ in range(5):
        p, info = make_pending_hashmap(workdir)
        heap = [r for r in info["regions"] if r["kind"] == "heap"][0]
        block = heap["vaddr"] + 32  # the root's second block: dheap_root.allocated first
        hits = []
        for f in info["log"]["frames"]:
            assert not f.get("big_batch_file"), f
            n = struct.unpack("<I", read_at(p, f["offset"] + 32, 4))[0]
            for i in range(n):
                at = f["offset"] + FRAME_HEADER + i * ENTRY_SIZE
                if struct.unpack("<Q", read_at(p, at, 8))[0] == block:
                    hits.append((f, n, at))
        if hits:
            break
    else:
        pytest.fail("no pending frame wrote the heap root's second block")
    f, n, at = hits[-1]  # the last write of the block wins the replay
    (allocated,) = struct.unpack("<Q", read_at(p, at + 16, 8))
    write_at(p, at + 16, struct.pack("<Q", allocated + 16))
    hdr = bytearray(read_at(p, f["offset"], FRAME_HEADER))
    struct.pack_into("<I", hdr, 36, crc32c(read_at(p, f["offset"] + FRAME_HEADER, n * ENTRY_SIZE)))
    struct.pack_into("<I", hdr, 60, crc32c(bytes(hdr[:60])))
    write_at(p, f["offset"], bytes(hdr))
    before = sha256(p)
    q = run(MANGO, "check", "--no-heap-walk", p)
    assert q.returncode == 0 and "pending replay" in q.stdout, (q.stdout, q.stderr)
    c = check(p)
    assert c.returncode == 1, (c.stdout, c.stderr)
    assert "dheap_check: root.allocated wrong" in c.stderr, c.stderr
    assert "inconsistent after replaying the pending log" in c.stderr, c.stderr
    k = reopen_checking_heap(p)
    assert k.returncode == 2, (k.stdout, k.stderr)
    assert sha256(p) == before, "refusing the pool modified it"
    assert "dheap_check: root.allocated wrong" in k.stderr, k.stderr
    assert "metadata is inconsistent (MANGO_CHECK_HEAP=1) with the pending log applied" in k.stderr, k.stderr
    assert inspect_json(p)["log"]["committed_frames"] == len(info["log"]["frames"])


def test_heap_walk_falls_back_when_its_copy_cannot_be_mapped(workdir):
    """Where the private copy of the heap cannot be mapped (here a limit on
    the address space; strict overcommit charges a writable private mapping
    the whole heap), a start with MANGO_CHECK_HEAP=1 says so and walks the
    restored heap instead, as before session 26: a good pool starts, an
    inconsistent one is still refused (its replay then written)."""
    p = os.path.join(workdir, "big")
    r = run(KVSTORE, "demo", "--pool", p, "--mode", "emulated", "--pool-size", "1G")
    assert r.returncode == 0, r.stderr

    def limited():  # pool (1 GiB) + heap reservation fit; a third GiB-sized mapping does not
        resource.setrlimit(resource.RLIMIT_AS, (2300 << 20, 2300 << 20))

    def start():
        return subprocess.run([KVSTORE, "demo", "--pool", p, "--mode", "emulated"], capture_output=True,
                              text=True, env=dict(os.environ, MANGO_CHECK_HEAP="1"), timeout=60,
                              preexec_fn=limited)

    k = start()
    assert k.returncode == 0 and "RECOVERED" in k.stdout, (k.stdout, k.stderr)
    assert "cannot map a private copy of the durable heap" in k.stderr, k.stderr
    heap = [g for g in inspect_json(p)["regions"] if g["kind"] == "heap"][0]
    at = heap["mirror_offset"] + 32  # dheap_root.allocated
    (allocated,) = struct.unpack("<Q", read_at(p, at, 8))
    write_at(p, at, struct.pack("<Q", allocated + 16))
    k = start()
    assert k.returncode == 2, (k.stdout, k.stderr)
    assert "cannot map a private copy of the durable heap" in k.stderr, k.stderr
    assert "dheap_check: root.allocated wrong" in k.stderr, k.stderr
    assert "metadata is inconsistent (MANGO_CHECK_HEAP=1; walked after the replay" in k.stderr, k.stderr
    k = reopen_checking_heap(p)  # no limit: walked before the replay
    assert k.returncode == 2 and "the pool is unchanged" in k.stderr, k.stderr


def test_heap_walk_replays_the_pending_log(workdir):
    """`mango check` walks the heap as recovery will see it: the hash-map
    variant (allocations, frees, table growth) SIGKILLed with committed
    frames not yet applied; the check replays them onto its copy (whose root
    must then equal the separately replayed root) and finds it consistent."""
    p, _ = make_pending_hashmap(workdir)
    before = sha256(p)
    c = check(p)
    assert c.returncode == 0, (c.stdout, c.stderr)
    assert "pending replay" in c.stdout and "needs recovery" in c.stdout, c.stdout
    assert sha256(p) == before


def test_many_zero_ranges_pending_do_not_exhaust_the_mappings(workdir):
    """A pending frame (checksums fixed) of 40 000 zero ranges, one page
    each, every other page past the hash map's top: every entry valid (a
    calloc of reused memory logs one). The heap walk's copy replaced each
    range's page with an anonymous one, each splitting the copy's mapping,
    until the process had vm.max_map_count (65530) mappings: the walk's own
    bitmap could not be mapped, and `mango check` called the heap
    inconsistent ("no memory for the check"), exit 1, for a pool that
    recovers (found by a review of the CLI with hostile files). Past a
    bound, ranges are cleared in place instead."""
    p = os.path.join(workdir, "hm")
    r = run(KVSTORE, "hashmap", "--pool", p, "--mode", "emulated", "--pool-size", "512M", "--log-size", "4M",
            "--ops", "20000", timeout=120)
    assert r.returncode == 0, r.stderr
    info = inspect_json(p)
    cap, lo = info["header"]["log_size"], info["header"]["log_offset"]
    head, seq, gen = info["log"]["head_lsn"], info["log"]["head_seq"], info["log"]["generation"]
    heap = [x for x in info["regions"] if x["kind"] == "heap"][0]
    n, start = 40000, 16 << 20  # pages 16 MiB .. 328 MiB into the heap, every other one
    assert start + 2 * n * 4096 <= heap["size"]
    ents = b"".join(struct.pack("<QIIQ24x", (1 << 63) | (heap["vaddr"] + start + 8192 * i), 0, 0, 4096)
                    for i in range(n))
    fb = (FRAME_HEADER + len(ents) + 63) // 64 * 64
    assert head % cap + fb <= cap
    h = bytearray(FRAME_HEADER)
    struct.pack_into("<IHHQQQIIQQI", h, 0, 0x464C474D, 2, 1, head, seq, gen, n, crc32c(ents), fb, head, 0)
    struct.pack_into("<I", h, 60, crc32c(bytes(h[:60])))
    write_at(p, lo + head % cap, bytes(h) + ents)
    before = sha256(p)
    c = check(p)
    assert c.returncode == 0, (c.returncode, c.stdout, c.stderr)
    assert "1 committed frame pending replay" in c.stdout, c.stdout
    assert sha256(p) == before
    k = run_env(dict(os.environ, MANGO_CHECK_HEAP="1"), KVSTORE, "hashmap", "--pool", p, "--mode", "emulated",
                "--ops", "10", timeout=60)
    assert k.returncode == 0 and "RECOVERED" in k.stdout, (k.returncode, k.stdout, k.stderr)


@pytest.mark.parametrize("version", [1, 2, 3, 5])
def test_heap_root_of_another_version(workdir, version):
    """A well-formed heap root of another version of the durable heap (1: no
    in-use chunk count; 2: 16-byte chunk headers; 3: no slabs; 5: a future
    one) is refused as a version problem, not as corruption, and the pool is
    left as it was."""
    p = make_pool(workdir)
    heap = [r for r in inspect_json(p)["regions"] if r["kind"] == "heap"][0]
    write_at(p, heap["mirror_offset"] + 8, struct.pack("<Q", version))  # dheap_root.version
    assert_refused(p, "has format version %d, this build reads version 4 only" % version, "durable heap")


# ---- batches larger than a log frame (the big-batch file, POOL.bigbatch) ----
BIG_BATCH = os.environ.get("BIG_BATCH_BIN")


def make_pending_big_batch(d, attempts=10, batches="3"):
    """A pool whose last committed frame names POOL.bigbatch and is not yet
    applied: tests/unit/test_big_batch.c's `die` runs batches 1-3 (3 writes 1
    MiB as 32-byte blocks: a big batch in the 256 KiB log; with batches="6",
    batch 6 writes it as one data range) and SIGKILLs itself at once; the
    backend waits a millisecond before applying, so this nearly always
    lands. Returns the pool's path."""
    p = os.path.join(d, "big")
    for _ in range(attempts):
        for f in (p, p + ".bigbatch"):
            if os.path.exists(f):
                os.unlink(f)
        r = run(BIG_BATCH, "die", p, batches, "-")
        assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
        c = check(p)
        assert c.returncode == 0, c.stderr
        if re.search(r": ok \(.*1 committed frame pending replay", c.stdout):
            return p
    pytest.fail("the big batch was always applied before the kill")


@pytest.mark.skipif(not (BIG_BATCH and os.access(BIG_BATCH, os.X_OK)),
                    reason="set BIG_BATCH_BIN to the built test_big_batch")
def test_big_batch_file_missing_or_damaged(workdir):
    """`mango check` validates a pending big batch against its file: present,
    it passes (and inspect counts the file's blocks); missing, truncated or
    with one flipped byte, the pool is refused naming the file, by the
    checker and by a real open, and left unchanged; there but unreadable, the
    checker exits 2 (could not read) rather than 1 (bad pool)."""
    p = make_pending_big_batch(workdir)
    big = p + ".bigbatch"
    info = inspect_json(p)
    assert info["log"]["committed_frames"] == 1 and info["log"]["blocks"] > 32768, info["log"]
    assert info["log"]["frames"][0]["big_batch_file"] is True, info["log"]
    assert "(the entries are in the big-batch file)" in run(MANGO, "inspect", p).stdout
    saved = os.path.join(workdir, "saved")
    shutil.copyfile(big, saved)

    def refused(*needles):
        before = sha256(p)
        c = check(p)
        assert c.returncode == 1 and c.stderr.startswith("mango: "), (c.returncode, c.stdout, c.stderr)
        k = run(BIG_BATCH, "verify", "emulated", p, "0", "-")
        assert k.returncode == 10, (k.returncode, k.stdout, k.stderr)  # refused: MANGO_EBADPOOL
        for n in ("big-batch file", ".bigbatch") + needles:
            assert n in c.stderr and n in k.stdout, (n, c.stderr, k.stdout)
        assert sha256(p) == before, "refusing the pool modified it"

    os.unlink(big)
    refused("is missing")
    with open(saved, "rb") as f:
        data = f.read()
    with open(big, "wb") as f:
        f.write(data[: len(data) // 2])
    refused("is shorter than its entries")
    flipped = bytearray(data)
    flipped[64 + 48 * 5000 + 7] ^= 0x10
    with open(big, "wb") as f:
        f.write(flipped)
    refused("fails its checksum")
    flipped = bytearray(data)
    flipped[20] ^= 0x01  # header: generation
    with open(big, "wb") as f:
        f.write(flipped)
    refused("damaged header")
    # There but unreadable (a symlink loop; as root, file modes would not
    # stop the read): the pool is not bad, it could not be read. Exit 2 and
    # MANGO_EIO, the pool unchanged (it was exit 1, "bad pool").
    os.unlink(big)
    os.symlink(os.path.basename(big), big)
    before = sha256(p)
    c = check(p)
    assert c.returncode == 2 and "cannot be opened" in c.stderr, (c.returncode, c.stdout, c.stderr)
    k = run(BIG_BATCH, "verify", "emulated", p, "0", "-")
    assert k.returncode == 11, (k.returncode, k.stdout, k.stderr)  # MANGO_EIO, nothing applied
    assert sha256(p) == before, "failing to read the big-batch file modified the pool"
    os.unlink(big)
    shutil.copyfile(saved, big)
    assert check(p).returncode == 0
    v = run(BIG_BATCH, "verify", "emulated", p, "3", "-")
    assert v.returncode == 20, (v.returncode, v.stdout, v.stderr)  # recovered, the big batch replayed
    assert not os.path.exists(big), "recovery leaves the big-batch file behind"


@pytest.mark.skipif(not (BIG_BATCH and os.access(BIG_BATCH, os.X_OK)),
                    reason="set BIG_BATCH_BIN to the built test_big_batch")
def test_inspect_shows_data_ranges(workdir):
    """A pending batch that wrote 1 MiB in one store holds one data range
    (docs/pool-format.md): `mango inspect` counts it, with its bytes, in
    JSON and text; `mango check` validates it; recovery replays it."""
    p = make_pending_big_batch(workdir, batches="6")
    info = inspect_json(p)
    last = info["log"]["frames"][-1]
    assert last["big_batch_file"] is True and last["data_ranges"] == 1, last
    assert last["data_range_bytes"] == 1 << 20, last
    assert all(f["data_ranges"] == 0 for f in info["log"]["frames"][:-1]), info["log"]["frames"]
    text = run(MANGO, "inspect", p).stdout
    assert "(1 data range, 1048576 bytes)" in text, text
    assert check(p).returncode == 0
    v = run(BIG_BATCH, "verify", "emulated", p, "6", "-")
    assert v.returncode == 20, (v.returncode, v.stdout, v.stderr)  # recovered, the big batch replayed


def test_created_mode_is_recorded(workdir):
    """The header's created_mode is the mode the pool was made for: an
    explicit one as given, and with the default mode (auto) what auto picked
    for the file (emulated on tmpfs, fs on a disk file system), not "?" (0),
    which every pool made with the default showed before session 32."""
    p = make_pool(workdir)
    assert inspect_json(p)["header"]["created_mode"] == "emulated"
    q = os.path.join(workdir, "auto")
    r = run(KVSTORE, "demo", "--pool", q, "--pool-size", POOL_SIZE, "--log-size", LOG_SIZE)
    assert r.returncode == 0 and "FRESH" in r.stdout, r.stderr
    fs_type = subprocess.run(["stat", "-f", "-c", "%T", workdir], capture_output=True, text=True).stdout.strip()
    h = inspect_json(q)["header"]
    assert h["created_mode"] == ("emulated" if fs_type == "tmpfs" else "fs"), (fs_type, h)
    assert "created mode     %s" % h["created_mode"] in run(MANGO, "inspect", q).stdout


# ---- the dynamic loader's bytes in the data region (session 40) ----

def loader_part(path):
    """(data region, first byte of .data): the data region starts at the end
    of RELRO, rounded down to 32 bytes, and its first bytes are the
    executable's lazy-binding GOT (.got.plt), which only the dynamic loader
    writes; .data follows it (readelf on the kvstore binary)."""
    info = inspect_json(path)
    d = [r for r in info["regions"] if r["kind"] == "data"][0]
    out = subprocess.run(["readelf", "-SW", KVSTORE], capture_output=True, text=True).stdout
    secs = {}
    for line in out.splitlines():
        m = re.search(r"\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)", line)
        if m:
            secs[m.group(1)] = (int(m.group(2), 16), int(m.group(3), 16))
    if ".got.plt" not in secs or ".data" not in secs:
        pytest.skip("no lazy-binding GOT in this build of kvstore")
    phdrs = subprocess.run(["readelf", "-lW", KVSTORE], capture_output=True, text=True).stdout
    m = re.search(r"GNU_RELRO\s+0x[0-9a-f]+\s+(0x[0-9a-f]+)\s+0x[0-9a-f]+\s+0x[0-9a-f]+\s+(0x[0-9a-f]+)", phdrs)
    assert m, phdrs
    relro_end = int(m.group(1), 16) + int(m.group(2), 16)
    # (the region's vaddr is its address with ASLR off: the binary's, rounded
    # down to 32 bytes, plus the load base)
    base = d["vaddr"] - (relro_end & ~31)
    assert secs[".got.plt"][0] < relro_end < secs[".data"][0], (secs, relro_end)
    return d, base + secs[".data"][0]


def test_bitmap_bit_on_the_loaders_bytes_is_refused(workdir):
    """One flipped bit of a data region's written-bytes bitmap (no checksum
    covers it) marking a byte of the lazy-binding GOT: recovery would copy
    the mirror's zero over a function's address, and the process crashed
    (SIGSEGV, SIGILL) or hung at its next call through it, after recovery
    had written the pool (found by a fuzzing review: 17 of 159 such bits
    crashed, 6 hung). The open now refuses it naming the loader's part, the
    file unchanged; a bit on .data's first byte, just past it, opens.
    `mango check`, which does not run the program, passed such a pool until
    the pool recorded where the loader's part ends (pool_region.loader_bytes,
    session 41): it refuses it now, with the same message."""
    p = make_pool(workdir)
    d, data_start = loader_part(p)
    assert d["loader_bytes"] == data_start - d["vaddr"], (d, data_start)
    with open(p, "rb") as f:
        orig = f.read()
    for off in (0, 7 * 8, 29 * 8, data_start - d["vaddr"] - 1, data_start - d["vaddr"]):
        with open(p, "wb") as f:
            f.write(orig)
        at = d["bitmap_offset"] + off // 8
        write_at(p, at, bytes([read_at(p, at, 1)[0] | (1 << (off % 8))]))
        before = sha256(p)
        c = check(p)
        k = reopen(p)
        if off < data_start - d["vaddr"]:
            assert c.returncode == 1, (off, c.returncode, c.stdout, c.stderr)
            assert "the dynamic loader's" in c.stderr and "bitmap is damaged" in c.stderr, c.stderr
            assert k.returncode == 2, (off, k.returncode, k.stdout, k.stderr)
            assert "the dynamic loader's" in k.stderr and "bitmap is damaged" in k.stderr, k.stderr
            assert sha256(p) == before, "refusing the pool modified it"
        else:
            assert c.returncode == 0, (off, c.returncode, c.stderr)
            assert k.returncode == 0 and "RECOVERED" in k.stdout, (off, k.returncode, k.stderr)


def test_log_block_on_the_loaders_bytes_is_refused(workdir):
    """The same through the log: a pending frame's first entry made a block
    at the data region's first 32 bytes (the GOT), every byte marked, its
    checksums recomputed. The open refuses it before writing anything; it
    crashed after recovery (found by the same review)."""
    p, info = make_pending_pool(workdir)
    d = [r for r in info["regions"] if r["kind"] == "data"][0]
    f = [x for x in info["log"]["frames"] if not x.get("big_batch_file")][0]
    n = struct.unpack("<I", read_at(p, f["offset"] + 32, 4))[0]
    ent = bytearray(read_at(p, f["offset"] + FRAME_HEADER, n * ENTRY_SIZE))
    struct.pack_into("<QII32s", ent, 0, d["vaddr"], 0xFFFFFFFF, 0, b"\0" * 32)
    hdr = bytearray(read_at(p, f["offset"], FRAME_HEADER))
    struct.pack_into("<I", hdr, 36, crc32c(bytes(ent)))
    struct.pack_into("<I", hdr, 60, crc32c(bytes(hdr[:60])))
    write_at(p, f["offset"], bytes(hdr) + bytes(ent))
    before = sha256(p)
    c = check(p)
    assert c.returncode == 1 and "dynamic loader's part of the data segment" in c.stderr, (c.returncode, c.stderr)
    k = reopen(p)
    assert k.returncode == 2, (k.returncode, k.stdout, k.stderr)
    assert "dynamic loader's part of the data segment" in k.stderr, k.stderr
    assert sha256(p) == before, "refusing the pool modified it"


def test_loader_bytes_unrecorded_or_out_of_range(workdir):
    """A pool made before session 41 records no loader_bytes (the field was
    reserved and zero): it opens and checks as before, and the open still
    refuses a bitmap bit on the loader's part, from the running program's
    layout; `mango check` cannot tell and passes it. A loader_bytes past the
    region's size (its table checksum recomputed) is a malformed region."""
    p = make_pool(workdir)
    d, data_start = loader_part(p)
    i, n = d["index"], len(inspect_json(p)["regions"])
    with open(p, "rb") as f:
        orig = f.read()
    write_at(p, region_field(i, "loader_bytes"), struct.pack("<Q", 0))
    rewrite_region_table(p, n)
    assert inspect_json(p)["regions"][i]["loader_bytes"] == 0
    assert "unrecorded" in run(MANGO, "inspect", p).stdout
    c = check(p)
    assert c.returncode == 0, c.stderr
    at = d["bitmap_offset"]
    write_at(p, at, bytes([read_at(p, at, 1)[0] | 1]))
    assert check(p).returncode == 0
    k = reopen(p)
    assert k.returncode == 2 and "bitmap is damaged" in k.stderr, (k.returncode, k.stderr)
    with open(p, "wb") as f:
        f.write(orig)
    write_at(p, region_field(i, "loader_bytes"), struct.pack("<Q", d["size"] + 32))
    rewrite_region_table(p, n)
    assert_refused(p, "region %d is malformed" % i)


def test_inspect_shows_a_damaged_creation_time_as_not_a_date(workdir):
    """A creation time past year 9999 (its header checksum fixed) is printed
    as "not a date" with the raw number, not a made-up date ("109626219-01-00"
    for 2^62, found by fuzzing); the field is informational, so the pool is
    still usable."""
    p = make_pool(workdir)
    for value in (1 << 62, (1 << 64) - 1, 253402300800):
        write_at(p, HDR_CREATE_TIME, struct.pack("<Q", value))
        fix_header_crc(p)
        r = run(MANGO, "inspect", p)
        assert r.returncode == 0, r.stderr
        line = [l for l in r.stdout.splitlines() if "creation time" in l][0]
        assert "not a date (%d)" % value in line, line
    write_at(p, HDR_CREATE_TIME, struct.pack("<Q", 1764400000))
    fix_header_crc(p)
    line = [l for l in run(MANGO, "inspect", p).stdout.splitlines() if "creation time" in l][0]
    assert "2025-11-29" in line, line
