"""Atomic file writes: a crash mid-write leaves the previous file intact (tmp file + fsync + os.replace).

Files are created with the user's umask like any ``open(path, "w")`` would (``0o666 & ~umask``), not with
``mkstemp``'s private 0600: plans, profiles, checkpoints and reports are meant to be shared."""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Iterator


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux: /proc/self/status)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)     # elsewhere: the classic set-and-restore (not thread-safe, but brief)
    os.umask(old)
    return old


def default_file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: 0o666 & ~umask."""
    return 0o666 & ~current_umask()


def apply_default_mode(path: str | os.PathLike) -> None:
    """chmod ``path`` to :func:`default_file_mode` (for files another writer created with mkstemp)."""
    os.chmod(path, default_file_mode())


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def clean_stale_temps(path: str | os.PathLike, min_age_s: float = 300.0) -> list[Path]:
    """Remove the temporary files a killed writer of ``path`` left beside it (``.<name>.p<pid>.XXXX.tmp``):
    those of a process that no longer runs, and unnamed-writer ones (``.<name>.XXXX.tmp``, older PORTs) older
    than ``min_age_s``. Temporary files of a live writer are kept. Returns the removed paths."""
    path = Path(path)
    pat = re.compile(r"^\." + re.escape(path.name) + r"\.(?:p(\d+)\.)?[A-Za-z0-9_]+\.tmp$")
    removed = []
    try:
        names = os.listdir(path.parent)
    except OSError:
        return removed
    now = time.time()
    for n in names:
        m = pat.match(n)
        if not m:
            continue
        q = path.parent / n
        try:
            if m.group(1) is not None:
                stale = not _pid_alive(int(m.group(1)))
            else:
                stale = now - q.stat().st_mtime > min_age_s
            if stale and q.is_file():
                q.unlink()
                removed.append(q)
        except OSError:
            continue
    return removed


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Write ``path`` through a temporary file in the same folder; on success it is fsynced and renamed over
    ``path`` (then the folder is fsynced); on any error the temporary file is removed and ``path`` is untouched.
    The new file gets the user's umask (0o666 & ~umask), like a plain ``open(path, "w")``. Temporary files that
    a killed writer of ``path`` left behind are removed first (:func:`clean_stale_temps`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.p{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), default_file_mode())
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_writer(path) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())
