"""Locate and load PORT's C kernel library (libport_kernels) with ctypes.

Search order: $PORT_KERNELS_LIB (e.g. the ASan build), then the file built by
`pip install -e .` next to this module (port/_port_kernels*.so).  OpenBLAS from
the scipy-openblas32 wheel is pre-loaded RTLD_GLOBAL so the library resolves
its `scipy_cblas_*` symbols from the installed wheel.

One thread pool.  The library is linked without an OpenMP runtime (setup.py);
before loading it, the OpenMP runtime that torch uses is loaded RTLD_GLOBAL
(the one already mapped into the process, else torch/lib/libgomp*.so*, else the
system libgomp.so.1), so PORT's parallel regions, torch's intra-op threads and
`omp_set_num_threads`/`torch.set_num_threads` all act on the same pool.
OpenBLAS is pre-loaded with OPENBLAS_NUM_THREADS=1 (no pthread pool is created)
and kept single-threaded by the library.

Wait policy.  A parallel region's workers wait for the next region by spinning, then sleeping.  PORT leaves
libgomp's defaults (spin ~300k iterations, a few ms, then sleep): the same policy as PyTorch's own ops in the same
process, so PORT never slows the torch-backend ops it hosts.  Measured side by side on a 2-vCPU VM
(bench/train.py, 2026-11-23), the alternatives were worse: passive waiting (sleep at once) costs every 2-thread
region a futex wake-up, ~150 us, tens of ms per training step (PyTorch eager ResNet-18 batch 8: 305 ms with the
defaults, 420 ms passive); a bounded spin (GOMP_SPINCOUNT=30000, ~0.3-1 ms) was no faster on a quiet machine
and 1.4-3.6x slower with a CPU-bound process beside the steps (a sleeping worker waits for a scheduler slice to
be woken).  Two pools never spin against each other: OpenBLAS is single-threaded and PORT splits GEMMs over the
one OpenMP pool.  ``configure_openmp_env()`` applies PORT_OMP_WAIT_POLICY=passive|active|bounded (bounded:
GOMP_SPINCOUNT=30000) unless the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT; it only has an effect if called
before the OpenMP runtime is loaded, i.e. before ``import torch`` (port.exec.kernels calls it first thing).
"""
from __future__ import annotations

import ctypes
import glob
import os
import re
import sys

_lib: ctypes.CDLL | None = None
_path: str | None = None


def library_path() -> str:
    env = os.environ.get("PORT_KERNELS_LIB")
    if env:
        if not os.path.isfile(env):
            raise ImportError(f"PORT_KERNELS_LIB={env!r} does not exist")
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    cands = sorted(glob.glob(os.path.join(here, "_port_kernels*.so")) +
                   glob.glob(os.path.join(here, "_port_kernels*.dylib")) +
                   glob.glob(os.path.join(here, "_port_kernels*.pyd")))
    if not cands:
        raise ImportError("PORT C kernels are not built: run `pip install -c constraints.txt -e .` "
                          "(or `make install`) in the repository root")
    return cands[0]


def _preload_openblas() -> None:
    # `import scipy_openblas32` already loads the library (its constructor sizes the pthread pool from
    # OPENBLAS_NUM_THREADS then): PORT calls OpenBLAS single-threaded, so the import runs with the variable at 1
    # and no pool is created (a pool's threads spin ~0.1 s after start, beside PORT's first steps).  If another
    # module imported it first, its pool exists; it is set to one thread below and stays idle.
    prev = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        try:
            import scipy_openblas32 as ob
        except ImportError:
            return
        libdir = ob.get_lib_dir()
        for name in (f"lib{ob.get_library()}.so", f"lib{ob.get_library()}.dylib"):
            path = os.path.join(libdir, name)
            if os.path.exists(path):
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                for fn in ("scipy_openblas_set_num_threads", "openblas_set_num_threads"):
                    if hasattr(lib, fn):
                        getattr(lib, fn)(1)
                        break
                return
    finally:
        if prev is None:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = prev


_OMP_RE = re.compile(r"/lib(gomp|iomp5|omp)[-.][^/]*\.so[^/]*$|/lib(gomp|iomp5|omp)\.so[^/]*$")
_omp_path: str | None = None


def _mapped_openmp() -> str | None:
    """Path of an OpenMP runtime already mapped into this process (Linux), else None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and _OMP_RE.search(parts[5].strip()):
                    return parts[5].strip()
    except OSError:
        pass
    return None


SPINCOUNT = "30000"   # PORT_OMP_WAIT_POLICY=bounded


def configure_openmp_env() -> None:
    """Apply PORT_OMP_WAIT_POLICY (passive | active | bounded; unset or "default": libgomp's defaults) if no OpenMP
    runtime is loaded yet and the user set no OMP_WAIT_POLICY / GOMP_SPINCOUNT (see the module docstring)."""
    choice = os.environ.get("PORT_OMP_WAIT_POLICY", "").lower()
    if choice in ("", "default"):
        return
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    if "torch" in sys.modules or _mapped_openmp() is not None:
        return  # too late: the runtime has read its environment already
    if choice in ("passive", "active"):
        os.environ["OMP_WAIT_POLICY"] = choice.upper()
    elif choice == "bounded":
        os.environ["GOMP_SPINCOUNT"] = SPINCOUNT


def _torch_openmp() -> str | None:
    """Torch's OpenMP runtime, found by path without importing torch (lowering queries workspaces through the
    library and must stay torch-free). Its SONAME is the system's (libgomp.so.1), so when torch loads later
    the dynamic loader reuses this very copy: one pool."""
    mapped = _mapped_openmp()
    if mapped:
        return mapped
    import importlib.util
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    tdir = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    cands = sorted(glob.glob(os.path.join(tdir, "libgomp*.so*")) +
                   glob.glob(os.path.join(tdir, "libiomp5*.so*")))
    return cands[0] if cands else None


def _preload_openmp() -> None:
    """Load torch's OpenMP runtime (else the system libgomp) RTLD_GLOBAL: the library's GOMP_*/omp_* symbols
    resolve to it, so PORT and torch share one thread pool."""
    global _omp_path
    if not sys.platform.startswith("linux"):
        return  # elsewhere the library links its OpenMP runtime itself
    configure_openmp_env()
    path = _mapped_openmp() or _torch_openmp()
    for cand in ([path] if path else []) + ["libgomp.so.1"]:
        try:
            ctypes.CDLL(cand, mode=ctypes.RTLD_GLOBAL)
            _omp_path = cand
            return
        except OSError:
            continue


def openmp_runtime() -> str | None:
    """The OpenMP runtime PORT's kernels use (after load())."""
    return _omp_path


def load() -> ctypes.CDLL:
    global _lib, _path
    if _lib is None:
        _preload_openmp()
        _preload_openblas()
        _path = library_path()
        _lib = ctypes.CDLL(_path)
    return _lib


def build_id() -> str:
    """A digest of the kernel library file (16 hex digits) and the GEMM setting (``-blas`` / ``-vendored`` /
    ``-auto``: the default depends on the CPU and on OpenBLAS's core, see port_kernels.h): profiles record it, and
    entries measured with another build of the kernels or another GEMM are not reused."""
    import hashlib
    try:
        with open(library_path(), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
    except (OSError, ImportError):
        return ""
    try:
        from port.exec.kernels import get_gemm_backend
        return f"{digest}-{get_gemm_backend()}"
    except (OSError, ImportError):
        return digest


def loaded_path() -> str | None:
    return _path
