"""The test tiers' own machinery (issue 55): pytest-xdist workers share the CPUs (tests/conftest.py) and run
`make` one at a time (tests/buildlock.py)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from buildlock import build_lock

TESTS = Path(__file__).resolve().parents[1]


def test_each_worker_gets_its_share_of_the_threads():
    # the value conftest set (not one the user exported): 2 threads alone, cpus // workers (>= 1) on xdist
    if os.environ.get("OMP_NUM_THREADS") != os.environ.get("PORT_TESTS_OMP_DEFAULT"):
        return      # the user's OMP_NUM_THREADS is kept as given
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    assert os.environ["OMP_NUM_THREADS"] == str(max(1, min(2, (os.cpu_count() or 1) // workers)))


def test_the_build_lock_excludes_another_process():
    probe = ("import fcntl, sys; f = open(sys.argv[1], 'a')\n"
             "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    sys.exit(3)\n")
    lock = TESTS.parent / "kernels" / "build" / ".make.lock"
    with build_lock():
        held = subprocess.run([sys.executable, "-c", probe, str(lock)], timeout=60)
    assert held.returncode == 3         # another worker's make waits
    free = subprocess.run([sys.executable, "-c", probe, str(lock)], timeout=60)
    assert free.returncode == 0


def test_every_make_in_the_tests_holds_the_build_lock():
    """A `make` a test runs in the checkout goes through buildlock (make() or `with build_lock():` just above)."""
    bad = []
    for f in sorted(TESTS.rglob("*.py")):
        if f.name == "buildlock.py":
            continue
        lines = f.read_text().splitlines()
        for i, ln in enumerate(lines):
            if re.search(r"""\[\s*["']make["']""", ln) and '"-n"' not in ln:     # make -n: a dry run builds nothing
                if not any("build_lock()" in p for p in lines[max(0, i - 2):i]):
                    bad.append(f"{f.relative_to(TESTS)}:{i + 1}: {ln.strip()}")
    assert not bad, "run make through tests/buildlock.py (make(...) or `with build_lock():`):\n" + "\n".join(bad)


def test_the_cli_in_this_process_answers_as_a_fresh_one_and_leaves_no_trace(tmp_path):
    """tests/portcli.py: port_inprocess gives a command's exit code and output as port_cli does (a user mistake:
    exit 2, named), and restores the working directory, sys.path, umask and COLUMNS it changed."""
    from portcli import port_cli, port_inprocess
    args = ("inspect", "--model", "mlp", "--input", "axb")
    cwd, path, cols = os.getcwd(), list(sys.path), os.environ.get("COLUMNS")
    mask = os.umask(0o022)
    try:
        here = port_inprocess(*args, cwd=tmp_path, umask=0o077, columns=123)
        assert (os.getcwd(), sys.path, os.environ.get("COLUMNS")) == (cwd, path, cols)
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(mask)
    fresh = port_cli(*args, cwd=tmp_path)
    assert here.returncode == fresh.returncode == 2
    assert "per-sample shape" in here.stderr and "per-sample shape" in fresh.stderr and "Traceback" not in here.stderr


def test_test_modules_have_unique_basenames():
    """pytest imports test modules by basename (no packages under tests/): two files of one name in different
    folders make the second fail to collect ('import file mismatch'), and only when both are collected."""
    seen: dict[str, list[str]] = {}
    for p in TESTS.rglob("test_*.py"):
        seen.setdefault(p.name, []).append(str(p.relative_to(TESTS)))
    assert {n: ps for n, ps in seen.items() if len(ps) > 1} == {}
