"""Functional tests of the durable kvstore example, driven through its CLI."""
import os
import re
import shutil
import subprocess
import tempfile

import pytest

KV = os.environ.get("KVSTORE", "kvstore")


def kv(*args, env=None, check=True):
    e = dict(os.environ)
    if env:
        e.update(env)
    r = subprocess.run([KV, *args], capture_output=True, text=True, env=e, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"kvstore {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture
def pool():
    d = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    p = os.path.join(d, "kv.pool")
    yield p
    shutil.rmtree(d)


def test_demo_fresh_then_recovered(pool):
    first = kv("demo", "--pool", pool).stdout
    assert "FRESH, 0 updates" in first
    second = kv("demo", "--pool", pool).stdout
    assert "RECOVERED, 4000 updates" in second
    third = kv("demo", "--pool", pool).stdout
    assert "RECOVERED, 8000 updates" in third


def test_demo_uses_MANGO_POOL(pool):
    out = kv("demo", env={"MANGO_POOL": pool}).stdout
    assert "FRESH" in out and os.path.exists(pool)


@pytest.mark.parametrize("mode", ["emulated", "fs", "sim"])
def test_run_then_reopen_keeps_every_put(pool, mode):
    out = kv("run", "--pool", pool, "--mode", mode, "--threads", "3", "--update-pct", "60",
             "--seconds", "0.3", "--values", "3000").stdout
    assert "status=FRESH" in out
    m = re.search(r"puts=(\d+)", out)
    assert m and int(m.group(1)) > 0
    out2 = kv("run", "--pool", pool, "--mode", mode, "--threads", "1", "--update-pct", "0",
              "--seconds", "0.05", "--values", "3000").stdout
    assert "status=RECOVERED" in out2


def test_pool_options_mismatch_is_an_error(pool):
    kv("run", "--pool", pool, "--values", "1000", "--seconds", "0.05")
    r = kv("run", "--pool", pool, "--values", "2000", "--seconds", "0.05", check=False)
    assert r.returncode == 2 and "holds 1000 values" in r.stderr


def test_hashmap_survives_restart(pool):
    a = kv("hashmap", "--pool", pool, "--ops", "50000", "--values", "5000").stdout
    assert "FRESH" in a and "check ok" in a
    n = int(re.search(r"after 50000 ops: (\d+) keys", a).group(1))
    b = kv("hashmap", "--pool", pool, "--ops", "0", "--values", "5000").stdout
    assert f"RECOVERED with {n} keys" in b and "check ok" in b


def test_durability_off_mode_keeps_nothing(pool):
    kv("run", "--pool", pool, "--mode", "none", "--seconds", "0.05")
    assert not os.path.exists(pool)


def test_aslr_off_reexec_is_required_for_recovery(pool):
    """Without the re-exec, libraries land elsewhere: the pool must be refused
    with a layout error and left unchanged."""
    # Skipped on what the machine says, not on the result under test: a
    # broken layout check also exits 0 (found by a review, session 36).
    with open("/proc/sys/kernel/randomize_va_space") as f:
        if f.read().strip() == "0":
            pytest.skip("ASLR is off on this machine: layouts match even without the re-exec")
    kv("demo", "--pool", pool)
    before = open(pool, "rb").read(1 << 20)
    r = kv("demo", "--pool", pool, env={"MANGO_NO_REEXEC": "1"}, check=False)
    assert r.returncode == 2 and "different layout" in r.stderr, (r.returncode, r.stderr)
    assert open(pool, "rb").read(1 << 20) == before


def test_help_and_bad_usage():
    r = kv("--help")
    assert "crash-test" in r.stdout and "Exit status" in r.stdout
    r = kv("bogus", check=False)
    assert r.returncode == 2 and "unknown command" in r.stderr
    r = kv("run", "--mode", "warp", check=False)
    assert r.returncode == 2 and "unknown mode" in r.stderr


def test_tiny_log_wraps_and_fills(pool):
    """A 256 KiB log under 4 writers wraps thousands of times and fills up:
    the combiner must wait for the backend (log_full_waits) and nothing may be
    lost across the waits and the PAD frames."""
    out = kv("run", "--pool", pool, "--mode", "emulated", "--threads", "4", "--update-pct", "100",
             "--seconds", "0.5", "--values", "1000", "--log-size", "256K").stdout
    puts = int(re.search(r"puts=(\d+)", out).group(1))
    log_bytes = float(re.search(r"log_bytes_per_update=([\d.]+)", out).group(1)) * puts
    assert log_bytes > 20 * 256 * 1024, out  # wrapped many times
    assert int(re.search(r"log_full_waits=(\d+)", out).group(1)) > 0, out
    out2 = kv("run", "--pool", pool, "--mode", "emulated", "--threads", "1", "--update-pct", "0",
              "--seconds", "0.05", "--values", "1000", "--log-size", "256K").stdout
    assert "status=RECOVERED" in out2


@pytest.mark.parametrize("opt,val", [
    ("--threads", "4294967297"),  # wrapped to 1 by an (unsigned) cast
    ("--threads", "65"),
    ("--values", "4294967296"),   # wrapped to 0
    ("--values", "16G"),
    ("--seconds", "abc"),         # atof: 0 s
    ("--seconds", "-1"),
    ("--seconds", "nan"),
    ("--update-pct", "-5"),
    ("--value-size", "8"),
    ("--zipf", "abc"),
    ("--think-us", "1x"),
    ("--pool-size", "99999999999G"),  # overflowed by the suffix's shift
])
def test_numeric_options_are_range_checked(pool, opt, val):
    r = kv("run", "--pool", pool, opt, val, "--seconds" if opt != "--seconds" else "--quiet",
           *(["0.05"] if opt != "--seconds" else []), check=False)
    assert r.returncode == 2, (opt, val, r.returncode, r.stdout, r.stderr)
    assert opt in r.stderr and repr(val) in r.stderr, r.stderr
    assert not os.path.exists(pool)


def test_empty_pool_path_is_refused(pool):
    """--pool "" ran on the default pool, silently (session 41)."""
    r = kv("run", "--pool", "", "--seconds", "0.05", check=False)
    assert r.returncode == 2 and "--pool needs a path" in r.stderr, (r.returncode, r.stdout, r.stderr)


def test_help_gives_the_ranges():
    out = kv("--help").stdout
    assert "1-64" in out and "0-100" in out and "[0, 1)" in out and "16-1G" in out


@pytest.mark.parametrize("cmd", ["crash-test", "history-test"])
def test_kill_tests_refuse_mode_none(pool, cmd):
    """Their workers used to run with --mode auto (fully durable), so
    `--mode none` reported lost=0 for a store that keeps nothing."""
    extra = ["--ack", pool + ".ack"] if cmd == "crash-test" else ["--history", pool + ".hist"]
    r = kv(cmd, "--mode", "none", "--pool", pool, *extra, "--rounds", "1", "--min-ms", "10",
           "--max-ms", "10", "--seconds", "0.05", "--quiet", check=False)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "--mode none" in r.stderr and cmd in r.stderr, r.stderr
    assert "rounds=" not in r.stdout


def test_hashmap_refuses_a_pool_of_the_fixed_size_store(pool):
    """Every command shared one default pool, and hashmap on a demo's pool
    followed a NULL map (SIGSEGV)."""
    kv("demo", "--pool", pool)
    r = kv("hashmap", "--pool", pool, "--ops", "10", check=False)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "holds the fixed-size store (made by 'kvstore demo')" in r.stderr, r.stderr
    assert pool in r.stderr and "--pool" in r.stderr
    assert "RECOVERED, 4000 updates" in kv("demo", "--pool", pool).stdout  # left as it was


@pytest.mark.parametrize("cmd", ["demo", "run"])
def test_fixed_size_commands_refuse_a_hashmap_pool(pool, cmd):
    kv("hashmap", "--pool", pool, "--ops", "100", "--values", "100")
    r = kv(cmd, "--pool", pool, "--seconds", "0.05", check=False)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "holds the hash map (made by 'kvstore hashmap')" in r.stderr, r.stderr
    assert "check ok" in kv("hashmap", "--pool", pool, "--ops", "0", "--values", "100").stdout


def test_demo_on_a_pool_of_run_says_what_to_do(pool):
    """demo forced 1000 values, so a pool `run` made could not be opened
    whatever the options; the refusal now names the way out, which works."""
    kv("run", "--pool", pool, "--values", "2000", "--seconds", "0.05")
    r = kv("demo", "--pool", pool, check=False)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "made by 'kvstore run'" in r.stderr and "--values 2000 --value-size 64" in r.stderr, r.stderr
    assert "--pool PATH" in r.stderr and "remove " + pool in r.stderr
    out = kv("demo", "--pool", pool, "--values", "2000").stdout
    assert "RECOVERED" in out


def test_hashmap_has_its_own_default_pool(tmp_path):
    """With neither --pool nor $MANGO_POOL, demo and hashmap no longer share
    /dev/shm/mango-<exe>.pool. A copy of the binary with a unique name keeps
    the default pools away from anyone else's."""
    exe = tmp_path / f"kvstore-t{os.getpid()}"
    shutil.copy(KV, exe)
    pools = [f"/dev/shm/mango-{exe.name}.pool", f"/dev/shm/mango-{exe.name}-hashmap.pool"]
    env = {k: v for k, v in os.environ.items() if k != "MANGO_POOL"}
    try:
        for p in pools:
            assert not os.path.exists(p)
        for args in (["demo"], ["hashmap", "--ops", "100", "--values", "100"]):
            r = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=120)
            assert r.returncode == 0, (args, r.returncode, r.stdout, r.stderr)
        assert all(os.path.exists(p) for p in pools)
    finally:
        for p in pools + [p + ".bigbatch" for p in pools]:
            if os.path.exists(p):
                os.unlink(p)


def test_a_store_larger_than_the_pool_is_refused(pool):
    """kv_fixed_init abort()ed (exit 134, no message) when the durable heap
    could not hold the store; the empty pool it made is removed, so a retry
    with a larger --pool-size makes a new one."""
    r = kv("run", "--pool", pool, "--values", "10M", "--value-size", "1024", "--seconds", "0.05",
           check=False)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "do not fit in the durable heap" in r.stderr and "--pool-size" in r.stderr, r.stderr
    assert not os.path.exists(pool)
    r = kv("run", "--pool", pool, "--values", "300K", "--value-size", "128", "--pool-size", "32M",
           "--log-size", "4M", "--seconds", "0.05", check=False)
    assert r.returncode == 2 and "do not fit" in r.stderr, (r.returncode, r.stderr)
    out = kv("run", "--pool", pool, "--values", "300K", "--value-size", "128", "--pool-size", "64M",
             "--log-size", "4M", "--seconds", "0.05").stdout
    assert "status=FRESH" in out


def test_readme_names_every_command_and_default_pool():
    """examples/kvstore/README.md stays consistent with `kvstore --help`."""
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "kvstore",
                          "README.md")
    text = open(readme).read()
    help_text = kv("--help").stdout
    commands = help_text.split("Commands:\n")[1].split("\n\n")[0]
    names = re.findall(r"^  (\S+)", commands, re.M)
    assert "hashmap" in names and "history-test" in names
    for name in names:
        assert f"| `{name}` |" in text, name
    for pool in ("/dev/shm/mango-kvstore.pool", "/dev/shm/mango-kvstore-hashmap.pool"):
        assert pool in help_text and pool in text
