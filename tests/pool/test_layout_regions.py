"""A program rebuilt at the same path without a GNU build-id: the layout
fingerprint (path, load address, build-id of every object) is the same, but
its .data/.bss are not. Recovery must refuse the pool as a different layout
(MANGO_ELAYOUT) and leave it byte-for-byte unchanged, instead of restoring
the old bytes at the old addresses over the new build's variables.

LAYOUT_V1_BIN and LAYOUT_V2_BIN are the two builds (tests/pool/CMakeLists.txt,
layout_regions_prog.c); each run is a copy placed at the same path.
"""

import hashlib
import json
import os
import shutil
import subprocess
import tempfile

import pytest

V1 = os.environ.get("LAYOUT_V1_BIN")
V2 = os.environ.get("LAYOUT_V2_BIN")
MANGO = os.environ.get("MANGO_BIN")

pytestmark = pytest.mark.skipif(not (V1 and V2 and MANGO), reason="set LAYOUT_V1_BIN, LAYOUT_V2_BIN, MANGO_BIN")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run_as(build, prog, pool):
    shutil.copy(build, prog)  # the same path for both builds: the same fingerprint
    return subprocess.run([prog, pool], capture_output=True, text=True, timeout=30)


def fingerprint(pool):
    r = subprocess.run([MANGO, "inspect", "--json", pool], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["header"]["fingerprint"]


def test_rebuilt_binary_without_build_id_is_refused_unchanged():
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    d = tempfile.mkdtemp(prefix="mango-layout-", dir=base)
    try:
        prog, pool = os.path.join(d, "prog"), os.path.join(d, "pool")
        r = run_as(V1, prog, pool)
        assert r.returncode == 0 and "FRESH counter=0" in r.stdout, (r.stdout, r.stderr)
        r = run_as(V1, prog, pool)
        assert r.returncode == 0 and "RECOVERED counter=3" in r.stdout, (r.stdout, r.stderr)
        fp, before = fingerprint(pool), sha256(pool)
        r = run_as(V2, prog, pool)
        assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
        assert "different layout" in r.stderr and "data regions" in r.stderr, r.stderr
        assert "fingerprint matches" in r.stderr and "left unchanged" in r.stderr, r.stderr
        assert sha256(pool) == before, "the refused pool was modified"
        assert fingerprint(pool) == fp
        # The build that wrote it still recovers everything.
        r = run_as(V1, prog, pool)
        assert r.returncode == 0 and "RECOVERED counter=6" in r.stdout, (r.stdout, r.stderr)
        # A new pool by the new build works, and the old build is refused on it.
        pool2 = os.path.join(d, "pool2")
        r = run_as(V2, prog, pool2)
        assert r.returncode == 0 and "FRESH counter=0" in r.stdout, (r.stdout, r.stderr)
        before = sha256(pool2)
        r = run_as(V1, prog, pool2)
        assert r.returncode == 2 and "data regions" in r.stderr, (r.stdout, r.stderr)
        assert sha256(pool2) == before
    finally:
        shutil.rmtree(d, ignore_errors=True)
