"""The one Python module that knows PORT's C ABI (kernels/include/port_kernels.h, port_rt.h), without torch:
loading the library, the OpenMP environment, constants, param structs, the signature table (parsed from the
headers' PORT_API prototypes when the library is loaded: no hand-written copy), the raw functions
(``raw.port_<name>`` and the short alias ``raw.<name>``), status checking and the library's settings (threads,
GEMM backend).

Raw path: ``raw.<c_function>(...)`` are ctypes function objects with argtypes from ``SIGNATURES``. Pointer
arguments are plain integer addresses (e.g. ``arena_base + offset``), param structs are
``Conv2dParams``/``BatchNormParams``/... instances (build them once, reuse them). Every kernel returns an int
status (0 == PORT_OK); ``check(status, "name")`` raises. No validation beyond what C does. The executor's
backends, lowering's workspace queries (pure functions of shapes, no torch) and port-rt's Python engine use it;
the torch-tensor wrappers the kernel tests use live in tests/kernels/checked.py.

Loading. Importing this module loads nothing: the library is loaded and ``raw`` bound on first use (``load()``,
or any ``raw.<name>``). Search order: $PORT_KERNELS_LIB (e.g. the ASan build), then the file built by
`pip install -e .` next to this module (port/exec/_port_kernels*.so). OpenBLAS from the scipy-openblas32 wheel
is pre-loaded RTLD_GLOBAL so the library resolves its `scipy_cblas_*` symbols from the installed wheel.

One thread pool. The library is linked without an OpenMP runtime (setup.py); before loading it, the OpenMP
runtime that torch uses is loaded RTLD_GLOBAL (the one already mapped into the process, else
torch/lib/libgomp*.so*, else the system libgomp.so.1), so PORT's parallel regions, torch's intra-op threads and
`omp_set_num_threads`/`torch.set_num_threads` all act on the same pool. OpenBLAS is pre-loaded with
OPENBLAS_NUM_THREADS=1 (no pthread pool is created) and kept single-threaded by the library.

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
before the OpenMP runtime is loaded, i.e. before ``import torch`` (``import port`` calls it first thing).

Gradient semantics follow the header: weight gradients ACCUMULATE (+=) into the given buffers, input gradients
OVERWRITE.
"""
from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import re
import sys
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_int64, c_size_t, c_uint64, c_void_p

from port.errors import InternalError as _PortErrorBase
from port.errors import PortError as _UserError

# --------------------------------------------------------------------------- constants
PORT_OK, PORT_ERR_NULL, PORT_ERR_SHAPE, PORT_ERR_ARG, PORT_ERR_WORKSPACE, PORT_ERR_UNSUPPORTED, \
    PORT_ERR_ALIAS = range(7)
GEMM_BLAS, GEMM_VENDORED, GEMM_AUTO = 0, 1, 2
# the most kernel threads any setting may ask for (a device YAML describes another machine: its schema takes up to
# this); the OpenMP runtime crashes (SIGSEGV) when asked for ~100k threads. On this machine max_threads() applies.
MAX_THREADS = 1024
CONV_AUTO, CONV_IM2COL, CONV_DIRECT, CONV_WINOGRAD = 0, 1, 2, 3
ATTN_PLAIN, ATTN_TILED = 0, 1
_ALGOS = {"auto": CONV_AUTO, "im2col": CONV_IM2COL, "direct": CONV_DIRECT, "winograd": CONV_WINOGRAD}


# --------------------------------------------------------------------------- param structs
class Conv2dParams(ctypes.Structure):
    _fields_ = [(f, c_int64) for f in ("n", "c_in", "h", "w", "c_out", "kh", "kw", "stride_h",
                                       "stride_w", "pad_h", "pad_w", "groups", "h_out", "w_out")]


class BatchNormParams(ctypes.Structure):
    _fields_ = [("n", c_int64), ("c", c_int64), ("h", c_int64), ("w", c_int64), ("eps", c_float),
                ("momentum", c_float)]


class Pool2dParams(ctypes.Structure):
    _fields_ = [(f, c_int64) for f in ("n", "c", "h", "w", "kh", "kw", "stride_h", "stride_w",
                                       "pad_h", "pad_w", "h_out", "w_out", "dilation_h", "dilation_w",
                                       "ceil_mode", "exclude_pad")]


UPSAMPLE_MODES = {"nearest": 0, "bilinear": 1}     # PORT_UPSAMPLE_NEAREST, _BILINEAR


class Upsample2dParams(ctypes.Structure):
    _fields_ = [(f, c_int64) for f in ("n", "c", "h", "w", "ho", "wo", "mode", "align_corners")] + \
        [("rh", c_float), ("rw", c_float)]


class LinearParams(ctypes.Structure):
    _fields_ = [("n", c_int64), ("in_features", c_int64), ("out_features", c_int64)]


class AttentionParams(ctypes.Structure):
    _fields_ = [("bh", c_int64), ("heads", c_int64), ("tq", c_int64), ("tk", c_int64), ("dh", c_int64),
                ("causal", c_int64), ("scale", c_float), ("kv_heads", c_int64), ("mask_kind", c_int64),
                ("mask_dims", c_int64 * 4), ("dropout_p", c_float), ("seed", c_uint64), ("stream", c_uint64)]


ATTN_MASK_KEYS, ATTN_MASK_BOOL, ATTN_MASK_ADD = 0, 1, 2     # PORT_ATTN_MASK_*


BINARY_MAX_RANK = 6     # PORT_BINARY_MAX_RANK
BINARY_OPS = {"add_nd": 0, "sub": 1, "mul": 2, "div": 3}     # PORT_BINARY_ADD ... DIV


UNARY_OPS = {"neg": 0, "exp": 1, "rsqrt": 2, "cos": 3, "sin": 4, "pow_scalar": 5, "abs": 6, "shift": 7}  # PORT_UNARY_*


class SliceParams(ctypes.Structure):
    _fields_ = [(n, c_int64) for n in ("outer", "inner", "ny", "nx", "len", "y_start", "x_start", "fill")]


class BinaryParams(ctypes.Structure):
    _fields_ = [("op", c_int64), ("rank", c_int64), ("a_bcast", c_int64), ("b_bcast", c_int64),
                ("dims", c_int64 * BINARY_MAX_RANK)]


RT_MAX_PTRS, RT_MAX_INTS, RT_MAX_FLOATS = 10, 16, 2


class RtCall(ctypes.Structure):
    """port_rt_call (kernels/include/port_rt.h): one compiled kernel call."""
    _fields_ = [("kernel", ctypes.c_int32), ("op", ctypes.c_int32), ("flags", ctypes.c_int32),
                ("reserved", ctypes.c_int32), ("ptr", ctypes.c_int64 * RT_MAX_PTRS),
                ("iv", ctypes.c_int64 * RT_MAX_INTS), ("fv", ctypes.c_double * RT_MAX_FLOATS),
                ("ws_offset", ctypes.c_int64), ("ws_bytes", ctypes.c_int64),
                ("zero_offset", ctypes.c_int64 * 2), ("zero_bytes", ctypes.c_int64 * 2)]


class RtState(ctypes.Structure):
    """port_rt_state: the optimizer's settings and the run's counters."""
    _fields_ = [("optimizer", ctypes.c_int32), ("nesterov", ctypes.c_int32), ("lr", ctypes.c_double),
                ("momentum", ctypes.c_double), ("dampening", ctypes.c_double), ("weight_decay", ctypes.c_double),
                ("beta1", ctypes.c_double), ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("step", ctypes.c_int64), ("seed", ctypes.c_uint64), ("dropout_counter", ctypes.c_int64)]


class Rt(ctypes.Structure):
    """port_rt: a loaded bundle (pointers into the caller's bundle bytes and arena). Its size is checked
    against the library's port_rt_struct_bytes() when loaded (port.exec.rtengine)."""
    _fields_ = [("bundle", c_void_p), ("bundle_bytes", c_uint64), ("arena", c_void_p), ("arena_bytes", c_uint64),
                ("persistent_bytes", c_uint64), ("calls", c_void_p), ("n_train", ctypes.c_uint32),
                ("n_eval", ctypes.c_uint32), ("n_zero", ctypes.c_uint32), ("zero", c_void_p)] + \
        [(f, c_int64) for f in ("input_offset", "input_bytes", "label_offset", "label_bytes", "loss_offset",
                                "logits_offset", "batch", "classes", "eval_input_offset", "eval_logits_offset",
                                "eval_loss_offset", "eval_label_offset")] + \
        [("state", RtState), ("graph_digest", ctypes.c_char * 65), ("plan_digest", ctypes.c_char * 65),
         ("spill_fd", c_int), ("failed_call", ctypes.c_int32), ("bad_label", c_int64), ("bad_label_index", c_int64),
         ("ckpt_table", c_void_p), ("ckpt_fixed", c_void_p), ("ckpt_tensors", c_void_p), ("ckpt_n", ctypes.c_uint32),
         ("ckpt_fixed_len", ctypes.c_uint32), ("ckpt_tensors_len", ctypes.c_uint32), ("ckpt_data_bytes", c_uint64),
         ("input_dtype", ctypes.c_uint32), ("has_ignore_index", ctypes.c_uint32), ("labels_per_sample", c_int64),
         ("ignore_index", c_int64), ("n_extra_inputs", ctypes.c_uint32), ("extra_reserved", ctypes.c_uint32),
         ("extra_inputs", c_void_p), ("inputs_bytes", c_int64)]


class RtCallShape(ctypes.Structure):
    """port_rt_call_shape: what a call's parameters imply (operand bytes, element sizes, outputs, workspace)."""
    _fields_ = [("nptrs", ctypes.c_int32), ("nints", ctypes.c_int32), ("nfloats", ctypes.c_int32),
                ("writes", ctypes.c_int32), ("bytes", ctypes.c_int64 * RT_MAX_PTRS),
                ("elem", ctypes.c_int32 * RT_MAX_PTRS), ("may_alias", ctypes.c_int32 * RT_MAX_PTRS),
                ("ws_bytes", ctypes.c_int64)]


class RtCallProblem(ctypes.Structure):
    """port_rt_call_problem: why the call rule refused a call or a bundle (static strings)."""
    _fields_ = [("call", ctypes.c_int32), ("kernel", ctypes.c_int32), ("field", c_char_p), ("what", c_char_p),
                ("value", c_int64), ("bytes", c_int64), ("limit", c_int64)]

    def text(self) -> str:
        """``field: rule (value v, extent b bytes, bound l)``."""
        f = (self.field or b"?").decode()
        w = (self.what or b"refused").decode()
        return f"{f}: {w} (value {self.value}, extent {self.bytes} bytes, bound {self.limit})"


_STRUCTS = {"port_rt_call_shape": RtCallShape, "port_rt_call_problem": RtCallProblem, "port_rt": Rt, "port_rt_call": RtCall, "port_rt_state": RtState, "port_conv2d_params": Conv2dParams, "port_batchnorm_params": BatchNormParams,
            "port_pool2d_params": Pool2dParams, "port_linear_params": LinearParams,
            "port_attention_params": AttentionParams, "port_binary_params": BinaryParams,
            "port_upsample2d_params": Upsample2dParams, "port_slice_params": SliceParams}

# --------------------------------------------------------------------------- signature table
# The C headers are the one definition of the functions' signatures: every `PORT_API` prototype of
# port_kernels.h and port_rt.h is parsed when the library is loaded (signatures()), so a new kernel needs no line
# here. The headers are read from the checkout (kernels/include) or, in a wheel, from the copy setup.py's build_py
# puts into the package (port/exec/include).
HEADERS = ("port_kernels.h", "port_rt.h")
_HERE = os.path.dirname(os.path.abspath(__file__))
_HEADER_DIRS = (os.path.join(_HERE, "include"), os.path.join(os.path.dirname(os.path.dirname(_HERE)), "kernels",
                                                                 "include"))
_PROTO_RE = re.compile(r"\bPORT_API\s+([^;(){}]+?)\s*\(([^;(){}]*)\)\s*;")


class HeaderError(_PortErrorBase, RuntimeError):
    """A header the binding cannot read: missing, or a PORT_API prototype it cannot parse."""


def header_dir() -> str:
    """The folder holding the C headers (the package's copy first, then the checkout's kernels/include)."""
    for d in _HEADER_DIRS:
        if all(os.path.isfile(os.path.join(d, h)) for h in HEADERS):
            return d
    raise HeaderError(f"the PORT C headers {HEADERS} are in none of {list(_HEADER_DIRS)}")


def _c_type(text: str) -> str:
    """A C type as SIGNATURES spells it: single spaces, no space around '*' ("const float *" -> "const float*")."""
    return re.sub(r"\s*\*\s*", "*", " ".join(text.split())).strip()


def parse_prototypes(src: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """(name, C return type, (C argument types...)) of every ``PORT_API`` prototype in C source ``src``, in order.
    Comments and preprocessor lines are dropped first; a ``PORT_API`` left that is not a plain prototype (e.g. a
    function pointer argument) raises HeaderError rather than binding a wrong signature."""
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", "", src, flags=re.M)
    out, seen = [], set()
    for m in _PROTO_RE.finditer(src):
        head = _c_type(m.group(1))
        name = re.search(r"(\w+)$", head).group(1)
        ret = _c_type(head[: -len(name)])
        if not ret or name in seen:
            raise HeaderError(f"PORT_API prototype {m.group(0)!r}: no return type or a second declaration")
        args = []
        for a in m.group(2).split(","):
            a = " ".join(a.split())
            if not a or a == "void":
                continue
            am = re.match(r"(.*?[\s*])(\w+)$", a)
            if am is None or not am.group(1).strip():
                raise HeaderError(f"{name}: argument {a!r} is not 'type name'")
            args.append(_c_type(am.group(1)))
        seen.add(name)
        out.append((name, ret, tuple(args)))
    if len(out) != len(re.findall(r"\bPORT_API\b", src)):
        raise HeaderError("a PORT_API declaration in the headers is not a plain prototype 'ret name(type arg, ...);'")
    return out


_signatures: list[tuple[str, str, tuple[str, ...]]] | None = None


def signatures() -> list[tuple[str, str, tuple[str, ...]]]:
    """SIGNATURES: the prototypes of the headers (parsed once)."""
    global _signatures
    if _signatures is None:
        d = header_dir()
        src = ""
        for h in HEADERS:
            with open(os.path.join(d, h)) as f:
                src += f.read() + "\n"
        _signatures = parse_prototypes(src)
    return _signatures


def __getattr__(name: str):
    if name == "SIGNATURES":
        return signatures()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_SCALARS = {"int": c_int, "int64_t": c_int64, "uint64_t": c_uint64, "float": c_float, "int32_t": ctypes.c_int32,
            "uint32_t": ctypes.c_uint32,
            "double": c_double, "size_t": c_size_t, "port_status": c_int, "void": None,
            "const char*": c_char_p}


def ctype_of(ctype: str):
    """ctypes type used for a C type string of SIGNATURES (pointers -> c_void_p)."""
    if ctype in _SCALARS:
        return _SCALARS[ctype]
    if ctype.endswith("*"):
        base = ctype.replace("const ", "").rstrip("*").strip()
        if base in _STRUCTS:
            return POINTER(_STRUCTS[base])
        return c_void_p
    raise TypeError(f"unmapped C type {ctype!r}")


# --------------------------------------------------------------------------- loading the library
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


class _Raw:
    """Namespace of the raw ctypes functions (attributes named like the C functions, with and without the
    ``port_`` prefix). Bound by ``load()``; the first attribute looked up before that loads the library."""

    def __getattr__(self, name: str):
        if _lib is None and not name.startswith("__"):
            load()
            return getattr(self, name)
        raise AttributeError(f"the PORT C library binding has no function {name!r} (see SIGNATURES)")


raw = _Raw()


def load() -> ctypes.CDLL:
    """Load the library (once; torch's OpenMP runtime by path, not torch) and bind ``raw`` from SIGNATURES."""
    global _lib, _path
    if _lib is None:
        _preload_openmp()
        _preload_openblas()
        path = library_path()
        lib = ctypes.CDLL(path)
        bind(lib, signatures(), raw)
        _lib, _path = lib, path
    return _lib


def bind(lib: ctypes.CDLL, sigs, into) -> None:
    """Set restype/argtypes of every function of ``sigs`` in ``lib`` and make it an attribute of ``into`` (with and
    without the ``port_`` prefix). A prototype the library lacks raises AttributeError (a stale build)."""
    for name, ret, args in sigs:
        fn = getattr(lib, name)
        fn.restype = ctype_of(ret)
        fn.argtypes = [ctype_of(a) for a in args]
        setattr(into, name, fn)
        setattr(into, name[len("port_"):], fn)  # short alias, e.g. raw.relu_forward


def build_id() -> str:
    """A digest of the kernel library file (16 hex digits) and the GEMM setting (``-blas`` / ``-vendored`` /
    ``-auto``: the default depends on the CPU and on OpenBLAS's core, see port_kernels.h): profiles record it, and
    entries measured with another build of the kernels or another GEMM are not reused."""
    try:
        with open(library_path(), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
    except (OSError, ImportError):
        return ""
    try:
        return f"{digest}-{get_gemm_backend()}"
    except (OSError, ImportError):
        return digest


def loaded_path() -> str | None:
    return _path


# --------------------------------------------------------------------------- errors
class KernelError(_PortErrorBase, RuntimeError):
    """A C kernel returned a non-OK status."""

    def __init__(self, status: int, where: str):
        self.status = status
        msg = raw.port_status_string(status).decode()
        super().__init__(f"{where}: {msg} (status {status})")


class KernelValueError(KernelError, ValueError):
    """Bad shape / argument / NULL / aliasing reported by C."""


class WorkspaceError(KernelError, ValueError):
    """Workspace smaller than the *_workspace_bytes query."""


class UnsupportedError(KernelError, NotImplementedError):
    """The requested algorithm does not apply to these parameters."""


def check(status: int, where: str = "kernel") -> None:
    """Raise the exception of a non-zero status."""
    if status == PORT_OK:
        return
    if status == PORT_ERR_WORKSPACE:
        raise WorkspaceError(status, where)
    if status == PORT_ERR_UNSUPPORTED:
        raise UnsupportedError(status, where)
    if status in (PORT_ERR_NULL, PORT_ERR_SHAPE, PORT_ERR_ARG, PORT_ERR_ALIAS):
        raise KernelValueError(status, where)
    raise KernelError(status, where)


def status_string(status: int) -> str:
    return raw.port_status_string(status).decode()


# --------------------------------------------------------------------------- settings
class ThreadCountError(_UserError, ValueError):
    """A thread count below 1 or above max_threads()."""


THREADS_PER_CPU, THREADS_FLOOR = 4, 64


def max_threads() -> int:
    """The largest thread count PORT accepts on this machine: 4 x the online CPUs (``os.cpu_count()``), at least 64
    and at most MAX_THREADS (tests
    oversubscribe small machines on purpose); port-rt's --threads takes the same. Past the CPU count threads only
    wait at the parallel regions' barriers, and the OpenMP runtime crashes or hangs trying to start millions."""
    return min(MAX_THREADS, max(THREADS_FLOOR, THREADS_PER_CPU * (os.cpu_count() or 1)))


def check_thread_count(n: object, what: str = "threads") -> int:
    """``n`` as an int in [1, max_threads()], else ThreadCountError naming ``what``, the value and the limit."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise ThreadCountError(f"{what}={n!r}: expected a thread count (an integer >= 1)")
    top = max_threads()
    if not 1 <= n <= top:
        raise ThreadCountError(f"{what}={n}: expected 1..{top} (the larger of {THREADS_FLOOR} and "
                               f"{THREADS_PER_CPU} x this machine's {os.cpu_count() or 1} CPUs; past the CPU count "
                               f"threads only wait at barriers). "
                               f"Fix: {what}={min(max(n, 1), os.cpu_count() or 1)}")
    return n


def set_num_threads(n: int) -> None:
    """One setting for kernel OpenMP threads, BLAS and torch intra-op threads: one shared OpenMP pool
    (OpenBLAS itself stays single-threaded; PORT splits GEMMs over the pool). ``n``: 1..max_threads(), else
    ThreadCountError (a PortError and a ValueError)."""
    n = check_thread_count(n if isinstance(n, bool) else int(n), "set_num_threads: n")
    raw.port_set_num_threads(n)
    import torch  # here, not at the top: importing this module must not load torch (see the module docstring)
    torch.set_num_threads(n)


def get_num_threads() -> int:
    return raw.port_get_num_threads()


_GEMM_NAMES = {"blas": GEMM_BLAS, "vendored": GEMM_VENDORED, "auto": GEMM_AUTO}


def set_gemm_backend(backend: str) -> None:
    """'blas' (OpenBLAS), 'vendored' (built-in blocked SGEMM) or 'auto' (the vendored one, OpenBLAS for small
    products and n <= 16; needs OpenBLAS, see port_kernels.h)."""
    code = _GEMM_NAMES.get(backend)
    if code is None:
        raise ValueError(f"set_gemm_backend: backend must be 'blas', 'vendored' or 'auto', got {backend!r}")
    check(raw.port_set_gemm_backend(code), "set_gemm_backend")


def get_gemm_backend() -> str:
    code = raw.port_get_gemm_backend()
    return next(name for name, c in _GEMM_NAMES.items() if c == code)


def gemm_backend_for(trans_a: bool, trans_b: bool, m: int, n: int, k: int) -> str:
    """The GEMM ('blas' or 'vendored') that runs op(A)[m x k] op(B)[k x n] under the current setting ('auto'
    resolved by shape, kernels/src/common.c port__gemm_pick)."""
    return "vendored" if raw.port_gemm_backend_for(int(trans_a), int(trans_b), m, n, k) == GEMM_VENDORED else "blas"


class gemm_backend:
    """Context manager: ``with gemm_backend('vendored'): ...``"""

    def __init__(self, backend: str):
        self.backend, self.prev = backend, None

    def __enter__(self):
        self.prev = get_gemm_backend()
        set_gemm_backend(self.backend)
        return self

    def __exit__(self, *exc):
        set_gemm_backend(self.prev)
