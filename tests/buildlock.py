"""One `make` at a time across pytest-xdist workers (and concurrent pytest runs of one checkout).

Two workers that both call `make port-rt` would both link kernels/build/port-rt at once (a torn binary, or
"text file busy" for the one that runs it). Every test that runs `make` in the checkout goes through
``make(...)``, which holds an exclusive flock on kernels/build/.make.lock for the build; the second caller then
finds the target up to date.
"""
from __future__ import annotations

import contextlib
import fcntl
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def build_lock():
    lock = ROOT / "kernels" / "build" / ".make.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def make(*targets: str, **kw) -> subprocess.CompletedProcess:
    """``make -s TARGETS`` in the checkout under the build lock (kw: subprocess.run's, e.g. timeout)."""
    with build_lock():
        return subprocess.run(["make", "-s", *targets], cwd=ROOT, capture_output=True, text=True, **kw)
