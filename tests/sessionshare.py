"""What the pytest-xdist workers of one test session make once and share (a module-scoped fixture is made once per
worker that runs one of the module's tests, and --dist worksteal spreads a module over both): a folder filled
under a lock by the first worker that asks, reused by the others."""
from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path


def _session_dir(tmp_path_factory) -> Path:
    """A folder every pytest-xdist worker of this session shares (the workers' base temps' parent), or this
    process's base temp without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_once(tmp_path_factory, name: str, make) -> Path:
    """A folder that every pytest-xdist worker of this session shares, filled by ``make(folder)`` once: the first
    worker to ask runs it under a lock, the others wait for it and reuse what it wrote. (A module-scoped fixture
    is made once per worker that runs one of the module's tests: worksteal spreads a module over both.) A
    ``make`` that raises leaves no mark, so the next worker to ask makes it again and fails the same way. Tests
    that change what it made work on a copy (copy_of)."""
    root = _session_dir(tmp_path_factory) / f"shared-{name}"
    done = root.parent / f"shared-{name}.done"
    with open(root.parent / f"shared-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                shutil.rmtree(root, ignore_errors=True)
                root.mkdir(parents=True)
                make(root)
                done.touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return root


def copy_of(tmp_path_factory, shared: Path, name: str) -> Path:
    """This worker's own copy of a shared_once folder (a fresh folder under its base temp)."""
    d = tmp_path_factory.mktemp(name)
    shutil.copytree(shared, d, dirs_exist_ok=True, symlinks=True)
    return d
