"""The process's own memory as the OS sees it (Linux /proc; getrusage elsewhere): what a device running PORT
really spends, next to the arena accounting of the plan.

    rss_bytes()     resident set size now (fast: one pread of /proc/self/statm, ~5 us; safe to call per op)
    peak_bytes()    VmHWM: the high-water mark of the resident set since start or the last reset_peak()
    reset_peak()    reset VmHWM to the current RSS (/proc/self/clear_refs); False where the OS cannot
    status_bytes()  VmRSS, VmHWM, RssAnon, RssFile in bytes (Linux; {} elsewhere)
    release_freed_heap()  hand glibc's freed heap pages back to the OS
"""
from __future__ import annotations

import os

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_fd: int | None = None


def rss_bytes() -> int:
    """Resident set size of this process now, in bytes."""
    global _fd
    try:
        if _fd is None:
            _fd = os.open("/proc/self/statm", os.O_RDONLY)
        return int(os.pread(_fd, 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return _status().get("VmRSS", 0) or _maxrss()


def _maxrss() -> int:
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except (ImportError, OSError):
        return 0


def status_bytes() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon (heap, stacks) and RssFile (mapped files: code pages) of this process in bytes."""
    return _status()


def _status() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
                    k, v = line.split(":")
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def peak_bytes() -> int:
    """The resident set's high-water mark (VmHWM) since start or the last successful reset_peak()."""
    return _status().get("VmHWM", 0) or _maxrss()


def reset_peak() -> bool:
    """Reset the high-water mark to the current RSS; False where that is not possible (then peak_bytes() is
    the peak since the process started)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def release_freed_heap(collect: bool = True) -> None:
    """Hand glibc's freed heap pages back to the OS (a no-op on other C libraries); ``collect``: run Python's
    garbage collector first."""
    if collect:
        import gc
        gc.collect()
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
