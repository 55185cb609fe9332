"""I/O fault injection (MANGO_FAULT_SYNC, MANGO_FAULT_SHORT_WRITES).

PostgreSQL's fsyncgate lesson: a failed sync must never be acknowledged and
must not be retried as if the data were safe. Here the N-th sync of the process
fails (writing nothing); whichever thread hits it (the combiner's commit or the
backend's mirror/head sync), the worker's next command must fail with a clear
error, no later write may be acknowledged, and recovery must keep every PUT
that was acknowledged before the failure.
"""
import os
import re
import subprocess
import tempfile

import pytest

KV = os.environ.get("KVSTORE", "kvstore")
COMMON = ["--threads", "4", "--values", "4096", "--update-pct", "80"]


@pytest.fixture
def files():
    d = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    yield os.path.join(d, "kv.pool"), os.path.join(d, "kv.ack")
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)


def run(args, env=None, timeout=120):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([KV, *args], capture_output=True, text=True, env=e, timeout=timeout)


def verify(pool, ack, mode):
    v = run(["verify", "--pool", pool, "--ack", ack, "--mode", mode, *COMMON])
    assert v.returncode == 0, v.stdout + v.stderr
    m = re.search(r"lost=(\d+) torn=(\d+)", v.stdout)
    assert m and m.group(1) == "0" and m.group(2) == "0", v.stdout
    return v.stdout


@pytest.mark.parametrize("mode", ["emulated", "sim", "fs"])
@pytest.mark.parametrize("nth", [3, 7, 20, 57, 150, 401])
def test_failed_sync_stops_writes_and_loses_nothing(files, mode, nth):
    pool, ack = files
    w = run(["worker", "--pool", pool, "--ack", ack, "--mode", mode, "--seconds", "30", *COMMON],
            env={"MANGO_FAULT_SYNC": str(nth)})
    # The worker stops on the first failed command (exit 2) with a clear message.
    assert w.returncode == 2, (w.returncode, w.stderr)
    assert re.search(r"sync of the (redo log|mirror|log head) failed|accepts no more writes|"
                     r"stopped accepting writes|I/O error", w.stderr), w.stderr
    out = verify(pool, ack, mode)
    assert "RECOVERED" in out or nth <= 3, out


def test_enospc_is_reported_as_such(files):
    pool, ack = files
    w = run(["worker", "--pool", pool, "--ack", ack, "--mode", "sim", "--seconds", "30", *COMMON],
            env={"MANGO_FAULT_SYNC": "40:ENOSPC"})
    assert w.returncode == 2 and "No space left on device" in w.stderr, w.stderr
    verify(pool, ack, "sim")


def test_short_writes_are_completed(files):
    pool, ack = files
    c = run(["crash-test", "--pool", pool, "--ack", ack, "--mode", "sim", "--rounds", "6", "--quiet",
             *COMMON], env={"MANGO_FAULT_SHORT_WRITES": "1"}, timeout=300)
    assert c.returncode == 0, c.stdout + c.stderr
    assert re.search(r"lost=0 torn=0", c.stdout), c.stdout


def test_no_write_is_acknowledged_after_a_failure(files):
    """After the failed sync, reads and writes alike are refused (reads could
    otherwise observe state that is not durable)."""
    pool, ack = files
    r = run(["run", "--pool", pool, "--mode", "emulated", "--seconds", "1", "--threads", "1",
             "--values", "1000", "--update-pct", "50"], env={"MANGO_FAULT_SYNC": "30"})
    assert r.returncode == 2
    assert "ops_per_sec" not in r.stdout  # the run did not complete normally


@pytest.mark.parametrize("mode", ["emulated", "sim", "fs"])
@pytest.mark.parametrize("site,message", [
    ("pool.create_sync", r"cannot sync new pool \S+\.tmp\.\d+: "),
    ("pool.create_dir_sync", r"cannot sync the directory of new pool \S+: "),
])
@pytest.mark.parametrize("fault,error", [("1", "Input/output error"), ("1:ENOSPC", "No space left on device")])
def test_failed_pool_creation_sync_leaves_nothing(files, mode, site, message, fault, error):
    """Pool creation's syncs (the new file's, then its directory's, after the
    rename) are not counted by MANGO_FAULT_SYNC: they fail only at the site
    MANGO_FAULT_SYNC_SITE names. Either failing fails the start with a
    clear error and leaves neither the pool nor its temporary file; the next
    start creates the pool."""
    pool, ack = files
    d = os.path.dirname(pool)
    r = run(["run", "--pool", pool, "--mode", mode, "--seconds", "1", "--threads", "1", "--values", "100"],
            env={"MANGO_FAULT_SYNC": fault, "MANGO_FAULT_SYNC_SITE": site}, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert re.search(message + re.escape(error), r.stderr), r.stderr
    assert "ops_per_sec" not in r.stdout
    assert os.listdir(d) == [], os.listdir(d)
    r = run(["run", "--pool", pool, "--mode", mode, "--seconds", "0.2", "--threads", "1", "--values", "100"])
    assert r.returncode == 0 and "ops_per_sec" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("mode", ["emulated", "sim", "fs"])
@pytest.mark.parametrize("site,message", [
    ("big_batch.create", r"cannot make the big-batch file \S+ durable: "),
    ("big_batch.create_dir", r"cannot make the big-batch file \S+ durable: "),
])
def test_failed_big_batch_file_sync_is_reported(files, mode, site, message):
    """A batch larger than half the log goes through the pool's big-batch
    file, made (and its directory synced) at the first such batch. A failed
    sync there fails that command with a clear error, nothing after it is
    acknowledged, and the next start recovers the pool and runs (session
    41: big_batch.create_dir was injectable but untested)."""
    pool, ack = files
    big = ["--pool", pool, "--mode", mode, "--pool-size", "64M", "--log-size", "64K", "--value-size", "65536",
           "--values", "16", "--threads", "1", "--update-pct", "100"]
    r = run(["run", *big, "--seconds", "1"], env={"MANGO_FAULT_SYNC": "1:ENOSPC", "MANGO_FAULT_SYNC_SITE": site},
            timeout=60)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert re.search(message + re.escape("No space left on device"), r.stderr), r.stderr
    assert "ops_per_sec" not in r.stdout
    r = run(["run", *big, "--seconds", "0.2"], timeout=60)
    assert r.returncode == 0 and "status=RECOVERED" in r.stdout and "ops_per_sec" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("name,value", [
    ("MANGO_FAULT_SYNC", "3x"),            # was read as 3
    ("MANGO_FAULT_SYNC", "1:ENOSPACE"),    # was read as 1 with EIO
    ("MANGO_FAULT_SYNC", "-2"),            # was read as off
    ("MANGO_FAULT_SYNC", " 4"),
    ("MANGO_SIM_SYNC_DELAY_US", "2ms"),    # was read as 2
    ("MANGO_SIM_SYNC_DELAY_US", "99999999999"),
    ("MANGO_FAULT_SHORT_WRITES", "yes"),
    ("MANGO_FAULT_SYNC_SITE", "x" * 100),  # was cut to 63 characters: no site matched
])
def test_a_test_hook_it_cannot_mean_stops_the_process(files, name, value):
    """A fault hook set to something it cannot mean ends the process with its
    name, instead of being read loosely: "3x" used to be 3, "-2" and a site
    name too long to match used to turn the fault off, so a test with a typo
    passed without the fault it was written for."""
    pool, ack = files
    env = {name: value}
    if name == "MANGO_FAULT_SYNC_SITE":
        env["MANGO_FAULT_SYNC"] = "1"
    w = run(["worker", "--pool", pool, "--ack", ack, "--mode", "sim", "--seconds", "1", *COMMON], env=env)
    assert w.returncode == 2, (w.returncode, w.stdout, w.stderr)
    assert "test hook %s='%s': expected" % (name, value) in w.stderr, w.stderr


@pytest.mark.parametrize("value", ["0", "7", "7:EIO", "7:ENOSPC"])
def test_fault_sync_values_it_documents_are_taken(files, value):
    """The forms docs/environment.md names are accepted (0: off)."""
    pool, ack = files
    w = run(["worker", "--pool", pool, "--ack", ack, "--mode", "sim", "--seconds", "1", *COMMON],
            env={"MANGO_FAULT_SYNC": value})
    assert "test hook" not in w.stderr, w.stderr
    if value == "0":
        assert w.returncode == 0, (w.returncode, w.stderr)
    elif value.endswith("ENOSPC"):
        assert w.returncode == 2 and "No space left on device" in w.stderr, w.stderr
    else:
        assert w.returncode == 2 and "No space left on device" not in w.stderr, w.stderr
        assert re.search(r"sync of the (redo log|mirror|log head) failed|I/O error", w.stderr), w.stderr
