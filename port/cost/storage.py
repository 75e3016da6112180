"""Storage figures for paging: measured on the spill location by ``port profile``, or the device config's.

``measure_storage(path)`` writes and reads a few MB in a scratch file beside where the spill files go
(port.exec.spill), the way the spill file's page calls will: with ``cached=False`` (a device config with
``storage.drop_cache``: every page-out synced and dropped from the page cache) bypassing the page cache, O_DIRECT
where the file system allows it, else buffered I/O with fdatasync and posix_fadvise(DONTNEED) before reading
back (write throughput includes the fdatasync: the bytes are on the device when it returns; latency is the median
of small (4 KiB) synced writes and direct reads); with ``cached=True`` (the default spill file: buffered writes
the OS page cache keeps, reads served from it) plain buffered ``pwrite``/``preadv`` as the spill file issues
them. Pricing a cached spill file at the disk's synced speed over-predicted a ResNet-18 plan that pages 12
momenta by 24%. Bounded: about ``max_s`` seconds (~1 s) whatever the disk.

Recorded in ``Profile.storage`` as (key, value) pairs: ``bandwidth_gbps`` and ``latency_ms`` (what the solver
and simulator price: one page-out plus one page-in costs 2 * (latency_ms + bytes / bandwidth), so the combined
bandwidth is the harmonic mean of write and read and the latency their mean) plus the measured parts
``write_gbps``, ``read_gbps``, ``write_latency_ms``, ``read_latency_ms`` and ``measured`` (1.0).
"""
from __future__ import annotations

import mmap
import os
import statistics
import time
import uuid
from pathlib import Path

from port.config import DeviceConfig

MB = 1 << 20
BLOCK = 4096
MAX_GBPS = 1000.0      # 1 TB/s: above any storage or memory bus this project targets


def _open_scratch(directory: Path, cached: bool = False) -> tuple[int, bool]:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"port-storage-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}.bin"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    direct = 0 if cached else getattr(os, "O_DIRECT", 0)
    fd = -1
    if direct:
        try:
            fd = os.open(path, flags | direct, 0o600)
        except OSError:       # tmpfs and some others refuse O_DIRECT
            fd = -1
    ok_direct = fd >= 0
    if fd < 0:
        fd = os.open(path, flags, 0o600)
    try:
        os.unlink(path)
    except OSError:
        pass
    return fd, ok_direct


def _drop(fd: int, off: int, n: int) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, off, n, os.POSIX_FADV_DONTNEED)


def measure_storage(path: str | os.PathLike | None = None, nbytes: int = 8 * MB, max_s: float = 1.0,
                    rounds: int = 8, cached: bool = False) -> dict[str, float]:
    """Write and read throughput (GB/s) and latency (ms) of the storage holding ``path`` (a directory; default
    the spill directory: $PORT_SPILL_DIR or the temp dir), through the page cache (``cached``) or past it. See
    the module docstring."""
    from port.exec.spill import spill_directory
    nbytes = max(BLOCK, nbytes // BLOCK * BLOCK)
    fd, direct = _open_scratch(spill_directory(path), cached)
    sync = (lambda: None) if cached else (lambda: os.fdatasync(fd))
    drop = (lambda off, n: None) if cached or direct else (lambda off, n: _drop(fd, off, n))
    buf = mmap.mmap(-1, nbytes)           # page-aligned, as O_DIRECT wants
    small = mmap.mmap(-1, BLOCK)
    mv = smv = None
    try:
        buf.write(os.urandom(min(nbytes, MB)) * (nbytes // min(nbytes, MB)))
        small.write(os.urandom(BLOCK))
        mv, smv = memoryview(buf), memoryview(small)
        if hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError:
                pass
        chunk = min(nbytes, 2 * MB)
        t_end = time.perf_counter() + max_s
        w_s, r_s, wl, rl = [], [], [], []
        for i in range(max(1, rounds)):
            t0 = time.perf_counter()
            for off in range(0, nbytes, chunk):
                n = os.pwrite(fd, mv[off:off + chunk], off)
                assert n == min(chunk, nbytes - off)
            sync()
            w_s.append(time.perf_counter() - t0)
            drop(0, nbytes)
            t0 = time.perf_counter()
            for off in range(0, nbytes, chunk):
                os.preadv(fd, [mv[off:off + chunk]], off)
            r_s.append(time.perf_counter() - t0)
            # small writes and reads (synced and direct unless cached): the per-call latency
            for j in range(4):
                off = ((i * 4 + j) * 7919 * BLOCK) % nbytes
                t0 = time.perf_counter()
                os.pwrite(fd, smv, off)
                sync()
                wl.append(time.perf_counter() - t0)
                drop(off, BLOCK)
                t0 = time.perf_counter()
                os.preadv(fd, [smv], (off + 13 * BLOCK) % nbytes)
                rl.append(time.perf_counter() - t0)
            if time.perf_counter() > t_end and i >= 1:
                break
    finally:
        os.close(fd)
        for v in (mv, smv):
            if v is not None:
                v.release()
        buf.close()
        small.close()
    lw, lr = statistics.median(wl) * 1e3, statistics.median(rl) * 1e3
    w_gbps = net_gbps(nbytes, statistics.median(w_s), lw / 1e3)
    r_gbps = net_gbps(nbytes, statistics.median(r_s), lr / 1e3)
    return {"bandwidth_gbps": 2.0 / (1.0 / w_gbps + 1.0 / r_gbps), "latency_ms": (lw + lr) / 2,
            "write_gbps": w_gbps, "read_gbps": r_gbps, "write_latency_ms": lw, "read_latency_ms": lr,
            "direct_io": 1.0 if direct else 0.0, "cached": 1.0 if cached else 0.0, "measured": 1.0}


def net_gbps(nbytes: int, total_s: float, latency_s: float) -> float:
    """Throughput (GB/s) of ``nbytes`` moved in ``total_s``, net of one call's ``latency_s`` (the cost model
    adds the latency back once per page call). The small synced writes that give the latency can take as long
    as the whole large transfer (a cheap fdatasync one time, a slow one the next): the net time is then kept at
    no less than half the measured one, so a noisy latency never turns into a near-zero time and an absurd
    bandwidth; and no figure exceeds MAX_GBPS (faster than any memory bus: a timer that read ~0)."""
    total_s = max(float(total_s), 1e-9)
    return min(nbytes / max(total_s - max(float(latency_s), 0.0), 0.5 * total_s) / 1e9, MAX_GBPS)


def declared_storage(dev: DeviceConfig) -> tuple[tuple[str, float], ...]:
    """The device config's storage figures as Profile.storage pairs; () when it has none (no storage, or
    figures left to be measured)."""
    st = dev.storage
    if st is None or st.measured:
        return ()
    return (("bandwidth_gbps", float(st.bandwidth_gbps)), ("latency_ms", float(st.latency_ms)))


def profile_storage(dev: DeviceConfig, measure: bool = True, quick: bool = False,
                    notes: list[str] | None = None) -> tuple[tuple[str, float], ...]:
    """Profile.storage for ``dev``: measured on ``dev.storage.path`` when the device is this machine
    (not modeled), ``measure`` is set and the config leaves the figures out; else the declared figures."""
    st = dev.storage
    if st is None:
        return ()
    if not (st.measured and measure and not dev.modeled):
        return declared_storage(dev)
    try:
        fig = measure_storage(st.path, nbytes=(4 if quick else 8) * MB, max_s=0.3 if quick else 1.0,
                              rounds=2 if quick else 8, cached=not st.drop_cache)
    except OSError as e:
        if notes is not None:
            notes.append(f"storage measurement on {st.path or 'the temp dir'} failed ({e}); no paging")
        return ()
    if notes is not None:
        notes.append(f"storage ({st.path or 'temp dir'}): write {fig['write_gbps']:.2f} GB/s, read "
                     f"{fig['read_gbps']:.2f} GB/s, latency {fig['latency_ms']:.3f} ms"
                     + (" (page cache kept: storage.drop_cache is off)" if fig["cached"]
                        else "" if fig["direct_io"] else " (no O_DIRECT: fadvise)"))
    return tuple(sorted(fig.items()))
