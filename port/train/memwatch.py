"""The process's own memory as the OS sees it (Linux /proc; getrusage elsewhere): what a device running PORT
really spends, next to the arena accounting of the plan.

    rss_bytes()     resident set size now (fast: one pread of /proc/self/statm, ~5 us; safe to call per op)
    peak_bytes()    VmHWM: the high-water mark of the resident set since start or the last reset_peak()
    reset_peak()    reset VmHWM to the current RSS (/proc/self/clear_refs); False where the OS cannot
    status_bytes()  VmRSS, VmHWM, RssAnon, RssFile in bytes (Linux; {} elsewhere)
    release_freed_heap()  hand glibc's freed heap pages back to the OS
    keep_freed_heap()     keep freed temporaries' pages mapped (glibc): no page faults re-touching them each step
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


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 32 << 20     # glibc's own ceiling for its dynamic threshold (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD_BYTES = 64 << 20
_kept: bool | None = None


def keep_freed_heap() -> bool:
    """Keep the pages of freed temporaries mapped: glibc's mmap threshold fixed at 32 MiB and its trim threshold at
    64 MiB (mallopt), process-wide, once. PyTorch's kernels (torch-backend ops) allocate their outputs and
    workspaces per call and free them; with glibc's defaults a multi-MiB temporary is mmap'ed and unmapped, or
    the heap top trimmed, and every step page-faults it in again (ResNet-18 b8 with 65 torch ops: 13.7k minor
    faults, ~8% of the step, and layer4's weight gradient 2.5x its fault-free time). An op timed alone in a
    loop often reuses its buffer without faults, so the profile did not price them. What stays mapped was live
    at some point of the step: the process's peak (VmHWM, what a budget bounds) is unchanged. Returns whether
    the setting is in effect (False: not glibc, or PORT_KEEP_HEAP=0)."""
    global _kept
    if _kept is None:
        _kept = False
        if os.environ.get("PORT_KEEP_HEAP", "1") != "0":
            try:
                import ctypes
                libc = ctypes.CDLL(None)
                libc.gnu_get_libc_version        # glibc only: other C libraries have other knobs
                _kept = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and \
                    bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
            except (OSError, AttributeError):
                pass
    return _kept
