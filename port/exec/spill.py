"""The spill file paged tensors go to (plan ``paged``; ``page_out`` / ``page_in`` host calls).

One file per Executor that has page calls, pre-sized to hold every paged tensor at its own 64-byte aligned
offset (``key`` -> (offset, nbytes)). ``page_out`` writes the tensor's arena bytes straight from the arena
(``os.pwrite`` on a zero-copy numpy view of the slot: no host copy of the tensor is allocated), synchronously,
so the write is complete before the arena planner hands the slot to the next tensor; ``page_in`` reads them
back into the new slot with ``os.preadv``. A CUDA arena goes through one host staging buffer (the largest
paged tensor) since the device memory has no file-backed path.

Where: ``directory`` (the device config's ``storage.path``), else ``$PORT_SPILL_DIR``, else the system temp
directory. The file is unlinked as soon as it is created (Linux keeps it until the descriptor closes), so
it disappears with the process however that ends; :meth:`SpillFile.close` (also run by a finalizer) closes it.

Memory: the tensor's arena bytes are reused by the planned lifetimes (the lowering frees the original version
at its ``page_out`` and allocates a new version at its ``page_in``), so paging lowers ``arena_bytes``. The OS
may keep the written bytes in its page cache: that is not the process's RSS (it is reclaimable, written back
under pressure) but it is memory of the machine; ``drop_cache=True`` (``storage.drop_cache`` in the device
config) ``fdatasync``s each write and ``posix_fadvise(DONTNEED)``s the range so the cache is dropped too, at
the cost of waiting for the disk.
"""
from __future__ import annotations

import os
import tempfile
import uuid
import weakref
from pathlib import Path

from port.errors import ProgramError

ALIGN = 64


def spill_directory(directory: str | os.PathLike | None = None) -> Path:
    """The directory spill files go to: ``directory``, else ``$PORT_SPILL_DIR``, else the temp directory
    (``~`` and environment variables expanded)."""
    d = directory or os.environ.get("PORT_SPILL_DIR") or tempfile.gettempdir()
    return Path(os.path.expandvars(os.path.expanduser(str(d))))


def spill_layout(sizes: dict[int, int]) -> tuple[dict[int, tuple[int, int]], int]:
    """({page key: (file offset, bytes)}, file size): every paged tensor at its own ALIGN-aligned place, keys in
    ascending order (the executor's spill file and port-rt's, from a bundle, use the same layout)."""
    layout: dict[int, tuple[int, int]] = {}
    off = 0
    for k in sorted(sizes):
        n = int(sizes[k])
        layout[k] = (off, n)
        off += -(-n // ALIGN) * ALIGN
    return layout, off


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class SpillFile:
    """A pre-sized, already-unlinked file holding paged tensors. ``sizes``: key -> bytes."""

    def __init__(self, sizes: dict[int, int], directory: str | os.PathLike | None = None,
                 drop_cache: bool = False):
        self.directory = spill_directory(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.layout, self.size = spill_layout(sizes)
        self.drop_cache = bool(drop_cache)
        self.path = self.directory / f"port-spill-{os.getpid()}-{uuid.uuid4().hex[:12]}.bin"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            os.unlink(self.path)          # gone with the descriptor, however the process ends
        except OSError:
            pass
        try:
            if self.size:
                try:
                    os.posix_fallocate(self.fd, 0, self.size)   # reserve the blocks: ENOSPC now, not mid-step
                except (OSError, AttributeError):
                    os.ftruncate(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise
        self._finalizer = weakref.finalize(self, _close_fd, self.fd)
        self.bytes_written = self.bytes_read = self.writes = self.reads = 0

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        self._finalizer()

    def file_size(self) -> int:
        """The file's size on its file system (fstat of the open descriptor)."""
        return os.fstat(self.fd).st_size

    def _range(self, key: int, nbytes: int) -> int:
        if self.closed:
            raise ProgramError("the spill file is closed (Executor.close() was called)")
        off, n = self.layout[key]
        if nbytes != n:
            raise ProgramError(f"page key {key}: {nbytes} B, but the spill file reserved {n} B for it")
        return off

    def write(self, key: int, buf: memoryview) -> None:
        """Write ``buf`` (a byte memoryview of the arena) at ``key``'s offset; returns when the bytes are
        in the file (the kernel's page cache at least; on disk too with drop_cache)."""
        n = buf.nbytes
        off = self._range(key, n)
        done = 0
        while done < n:
            w = os.pwrite(self.fd, buf[done:], off + done)
            if w <= 0:
                raise OSError(f"spill file {self.path}: short write at {off + done}")
            done += w
        if self.drop_cache:
            os.fdatasync(self.fd)
            os.posix_fadvise(self.fd, off, n, os.POSIX_FADV_DONTNEED)
        self.bytes_written += n
        self.writes += 1

    def read(self, key: int, buf: memoryview) -> None:
        """Fill ``buf`` (a writable byte memoryview of the arena) from ``key``'s offset."""
        n = buf.nbytes
        off = self._range(key, n)
        done = 0
        while done < n:
            r = os.preadv(self.fd, [buf[done:]], off + done)
            if r <= 0:
                raise OSError(f"spill file {self.path}: short read at {off + done}")
            done += r
        if self.drop_cache:
            os.posix_fadvise(self.fd, off, n, os.POSIX_FADV_DONTNEED)
        self.bytes_read += n
        self.reads += 1

    def counters(self) -> dict:
        return {"path": str(self.path), "size": self.size, "bytes_written": self.bytes_written,
                "bytes_read": self.bytes_read, "writes": self.writes, "reads": self.reads}
