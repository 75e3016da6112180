"""Atomic file writes: a crash mid-write leaves the previous file intact (tmp file + fsync + os.replace); a full
disk is a port.errors.DiskFullError naming the file (the previous one kept). ``dir_lock``: one writer per folder.

Files are created with the user's umask like any ``open(path, "w")`` would (``0o666 & ~umask``), not with
``mkstemp``'s private 0600: plans, profiles, checkpoints and reports are meant to be shared."""
from __future__ import annotations

import contextlib
import errno
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
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.p{os.getpid()}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise_if_disk_full(e, path, existed)
        raise
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), default_file_mode())
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):
            raise_if_disk_full(e, path, existed)
        raise
    try:  # make the rename durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def raise_if_disk_full(e: OSError, path: str | os.PathLike, existed: bool = True, kept: str | None = None) -> None:
    """Re-raise a no-space OSError (ENOSPC, EDQUOT) of writing ``path`` as port.errors.DiskFullError naming the
    file, what was kept (``kept``, or for an atomic write: the previous file, if ``existed``) and the fix; anything
    else returns (the caller re-raises it)."""
    from port.errors import DiskFullError
    if isinstance(e, DiskFullError) or e.errno not in DISK_FULL:
        return
    path = Path(path)
    if kept is None:
        kept = (f"the previous {path.name} is kept unchanged" if existed
                else f"no {path.name} was written (no partial file is left)")
    what = "no space left on the device" if e.errno == errno.ENOSPC else "disk quota exceeded"
    raise DiskFullError(path, e.errno, f"{path}: {what} while writing it; {kept}. Fix: free some space in "
                                       f"{path.parent.resolve()} (or write elsewhere) and run the command "
                                       f"again") from e


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_writer(path) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


LOCK_NAME = ".port.lock"


@contextlib.contextmanager
def dir_lock(folder: str | os.PathLike, what: str = "port train") -> Iterator[Path]:
    """Hold ``folder``'s lock (``folder/.port.lock``, an exclusive ``flock`` with the holder's PID written in it)
    for the block; another holder makes it raise port.errors.LockedError naming ``folder`` and that PID.

    The kernel drops a ``flock`` when its holder exits, however it exits (SIGKILL too): the lock file a dead
    process left (its PID still in it) is simply taken over. The file is never removed (removing it would let
    two processes lock two different files). Platforms without ``fcntl`` (Windows) do not lock."""
    from port.errors import LockedError
    folder = Path(folder)
    lock = folder / LOCK_NAME
    try:
        import fcntl
    except ImportError:       # pragma: no cover - Windows
        yield lock
        return
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, default_file_mode())
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _lock_holder(fd)
            who = f"PID {pid}" if pid is not None else "a process whose PID is not written yet"
            raise LockedError(f"{folder}: another `{what}` ({who}) is using this directory (lock file {lock}); "
                              f"wait for it to finish (or stop it), or write elsewhere (e.g. --out another "
                              f"folder)", pid) from None
        try:      # the PID is for the message only: a full disk does not stop the lock
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass
        try:
            yield lock
        finally:
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _lock_holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
