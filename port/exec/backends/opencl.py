"""The ``opencl`` backend (reached through port.exec.registry): the CNN zoo's ops as OpenCL kernels
(port/exec/backends/opencl_kernels.cl) through pyopencl, on any OpenCL 1.2+ device: PoCL's CPU device in tests
and CI (``pocl-binary-distribution``, the ``opencl`` extra), a phone or desktop GPU on a device.

Memory: a tensor is its host allocation wrapped once as a ``CL_MEM_USE_HOST_PTR`` buffer (the executor's
arena: one buffer for the whole arena; the profiler's scratch tensors: one each) plus a byte offset. On a device
with unified memory (``host_unified_memory``: PoCL, integrated GPUs) the kernels work on the arena's own bytes,
so both engines share one arena and a hand-off is a synchronisation (port.exec.handoff), no copy. A discrete
device, or a device YAML that gives the engine its own memory (``memory: own``), runs a program lowered with
its own arena (port.lower.memories): one device buffer of that arena's size (``device_arena``, created without
USE_HOST_PTR, so PoCL too keeps its own bytes), operands at their offsets there, and copy hand-offs
(``copy_fn``) between it and the host arena.

Asynchrony: a bound call enqueues its kernels on the engine's in-order queue and returns; ``Engine.finish``
waits for them, ``Engine.flush`` submits them without waiting. Each launch of a bound call has its own kernel
object whose arguments stay set between steps (``Engine.run``): the host's time to issue a call (what the
makespan charges the host thread, OpCost.issue_ms) is then mostly the enqueue (ResNet-8 b8 on PoCL: a weight
gradient 0.31 -> 0.10 ms, an SGD update 0.094 -> 0.025 ms). The executor waits at hand-offs (a lowered
``handoff`` call), before a host call that touches bytes a queued call uses, and at the end of a pass; other host
calls run while the queue works (port.exec.handoff.drain_before). The profiler waits after each timed run
(``sync``).

Kernels: conv2d via im2col + a register-blocked GEMM (several images per launch; the column matrices live in an
engine scratch buffer outside the arena, reused by every call), depthwise conv direct, batch norm (train/eval),
relu, relu6, hardswish, max/avg/global-average pools, linear, add, gradient accumulation, softmax cross-entropy, SGD and
AdamW updates, forward and backward. Ops without a kernel here (``kernels()`` lists the ones with) stay on the
other engines: ``supports(kind, attrs)`` is what port.plan.variants asks.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable

from port.errors import ProgramError

SOURCE = Path(__file__).with_name("opencl_kernels.cl")
ACT = {"relu": 0, "relu6": 1, "hardswish": 2}
GEMM_TILE = 16
GEMM_ROWS = 8            # gemm_n8's rows per work-item (GR in the kernel source)
GEMM_N8_WG = 8           # its work-group: 8 work-items of 8 columns
SCRATCH_IMAGES_BYTES = 8 << 20   # a convolution's column matrices per launch: at most this (one image at least)
BN_WG = 64


def supports(kind: str, attrs: dict) -> bool:
    """The opencl backend has kernels for a call of ``kind`` with ``attrs``."""
    if kind not in BINDERS:
        return False
    if kind.startswith("cross_entropy") and "ignore_index" in attrs:
        return False          # token-level losses: the other engines
    if kind.startswith("max_pool2d") or kind.startswith("avg_pool2d"):   # (its average pools count the padding)
        return tuple(attrs.get("dilation", (1, 1))) == (1, 1) and not attrs.get("ceil_mode", False) and \
            attrs.get("count_include_pad", True)
    return True


def kernels() -> tuple[str, ...]:
    return tuple(sorted(BINDERS))


# ---------------------------------------------------------------------------------------------------------
# the engine: context, queue, program, buffers
# ---------------------------------------------------------------------------------------------------------
class Engine:
    """One OpenCL device with its context, in-order queue and built program. ``PORT_OPENCL_DEVICE`` picks the
    device: an index into all platforms' devices, or a substring of '<platform> <device>' (default: the first
    GPU, else the first device)."""

    def __init__(self) -> None:
        import numpy as np
        import pyopencl as cl
        self.cl, self.np = cl, np
        devs = [(p, d) for p in cl.get_platforms() for d in p.get_devices()]
        if not devs:
            raise RuntimeError("no OpenCL device (no platform reports one; pip install pocl-binary-distribution "
                               "for PoCL's CPU device)")
        want = os.environ.get("PORT_OPENCL_DEVICE", "").strip()
        if want.isdigit():
            if int(want) >= len(devs):
                raise RuntimeError(f"PORT_OPENCL_DEVICE={want}: only {len(devs)} OpenCL devices")
            p, d = devs[int(want)]
        elif want:
            hit = [(p, d) for p, d in devs if want.lower() in f"{p.name} {d.name}".lower()]
            if not hit:
                raise RuntimeError(f"PORT_OPENCL_DEVICE={want!r} names none of "
                                   f"{[f'{p.name} {d.name}' for p, d in devs]}")
            p, d = hit[0]
        else:
            gpus = [(p, d) for p, d in devs if d.type & cl.device_type.GPU]
            p, d = (gpus or devs)[0]
        self.device = d
        self.name = f"{p.name.strip()}: {d.name.strip()}"
        self.unified = bool(d.host_unified_memory)
        self.cpu = bool(d.type & cl.device_type.CPU)     # PoCL's CPU device: it computes on the host's cores
        self.ctx = cl.Context(devices=[d])
        self.queue = cl.CommandQueue(self.ctx)
        self.prg = cl.Program(self.ctx, SOURCE.read_text()).build()
        self.k = {kn.function_name: kn for kn in self.prg.all_kernels()}
        self._scratch = None
        self.none = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, 64)   # stands in for absent operands
        self.pending = 0          # calls enqueued since the last finish
        self._site: list | None = None   # the bound call whose kernels run() enqueues now (bind_site), or None
        self._slot = 0

    def check_unified(self) -> None:
        if not self.unified:
            raise ProgramError(f"OpenCL device {self.name} has discrete memory: the executor's opencl engine "
                               f"needs unified host memory (one arena, CL_MEM_USE_HOST_PTR); a device arena with "
                               f"copying hand-offs is not implemented")

    def device_arena(self, nbytes: int):
        """A device buffer of its own (not the host's bytes): an own-memory program's arena."""
        return self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE, max(int(nbytes), 64))

    def copy(self, host, dev, off: int, to_host: bool) -> None:
        """Copy host tensor ``host`` (contiguous bytes) to or from ``dev`` at byte ``off``; blocking (the in-order
        queue runs every kernel enqueued before it first)."""
        h = host.numpy()
        if to_host:
            self.cl.enqueue_copy(self.queue, h, dev, src_offset=off, is_blocking=True)
        else:
            self.cl.enqueue_copy(self.queue, dev, h, dst_offset=off, is_blocking=True)
        self.pending = 0 if to_host else self.pending

    def zero(self, dev, off: int, nbytes: int) -> None:
        import numpy as np
        self.cl.enqueue_fill_buffer(self.queue, dev, np.uint8(0), off, nbytes)
        self.pending += 1

    def buffer_of(self, t, cache: dict) -> tuple[Any, int]:
        """(cl.Buffer over ``t``'s whole host allocation, byte offset of ``t`` in it). ``cache``: the buffers of
        one bind context (an executor's arena: one buffer), alive as long as the calls bound with them."""
        st = t.untyped_storage()
        base, nb = st.data_ptr(), st.nbytes()
        key = (base, nb)
        b = cache.get(key)
        if b is None:
            import torch
            host = torch.empty(0, dtype=torch.uint8).set_(st).numpy() if nb else self.np.zeros(64, self.np.uint8)
            b = self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE | self.cl.mem_flags.USE_HOST_PTR,
                               hostbuf=host)
            b._port_keep = (st, host)     # the host bytes stay alive as long as the buffer
            cache[key] = b
        return b, t.data_ptr() - base

    def scratch(self, nbytes: int):
        """The engine's scratch buffer (im2col columns), at least ``nbytes``; calls on the in-order queue take
        turns on it. Outside the arena: device memory the engine keeps (like cuDNN's workspace)."""
        if self._scratch is None or self._scratch.size < nbytes:
            self.finish()
            self._scratch = self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE, max(nbytes, 64))
        return self._scratch

    def flush(self) -> None:
        """Submit the enqueued kernels to the device without waiting for them."""
        if self.pending:
            self.queue.flush()

    def finish(self) -> None:
        if self.pending:
            self.queue.finish()
            self.pending = 0

    def run(self, name: str, gsize, lsize, *args) -> None:
        """Enqueue kernel ``name``. Inside a bound call (:meth:`in_site`) each of its launches has a kernel object
        of its own whose arguments stay set between steps: only those that changed are set again (an update's
        learning rate, its first-step flag). Setting a kernel's arguments costs the host far more than enqueueing
        it (PoCL, an SGD update's 13 arguments: 63 us set, 8 us enqueued, 2026-11-29, under load): the host's
        time to issue a queued call (OpCost.issue_ms) is the executor's cost of overlapping it."""
        site = self._site
        if site is None:
            self.k[name](self.queue, gsize, lsize, *args)
        else:
            i = self._slot
            self._slot = i + 1
            if i == len(site):
                site.append([None, None, None])
            s = site[i]
            if s[0] != name:
                s[0], s[1], s[2] = name, self.cl.Kernel(self.prg, name), None
            k, prev = s[1], s[2]
            if prev is None or len(prev) != len(args):
                k.set_args(*args)
            elif args != prev:
                for j, (x, y) in enumerate(zip(args, prev)):
                    if not (x is y or x == y):
                        k.set_arg(j, x)
            s[2] = args
            self.cl.enqueue_nd_range_kernel(self.queue, k, gsize, lsize)
        self.pending += 1

    def in_site(self, site: list, run: Callable[[], None]) -> None:
        """``run()`` (a bound call's launches) with ``site`` (a list the call keeps: its kernels and their last
        arguments, filled on the first run) as :meth:`run`'s place for them."""
        self._site, self._slot = site, 0
        try:
            run()
        finally:
            self._site = None


_ENGINE: Engine | None = None
_ENGINE_ERR: str | None = None
_PIN: tuple[tuple[int, ...], tuple[int, ...]] | None = None   # (engine cpus, host cpus): set by available()
_PINNED: tuple[tuple[int, ...] | None, str] = (None, "")       # (the cpus the engine was created on, why not)


def engine() -> Engine:
    """This process's engine, created on first use (by the profiler, the executor, a test: all come here).
    Where a device YAML gave the engine cpus of its own (:func:`available`), it is created pinned: see
    :func:`_pinned_engine`."""
    global _ENGINE, _ENGINE_ERR
    if _ENGINE is None:
        if _ENGINE_ERR is not None:
            raise RuntimeError(_ENGINE_ERR)
        try:
            _ENGINE = _pinned_engine(_PIN) if _PIN else Engine()
        except Exception as e:  # noqa: BLE001 - import, platform or build failures: named once
            _ENGINE_ERR = f"{type(e).__name__}: {e}"
            raise RuntimeError(_ENGINE_ERR) from e
    return _ENGINE


def _pinned_engine(pin: tuple[tuple[int, ...], tuple[int, ...]]) -> Engine:
    """The engine created with the calling thread's CPU affinity set to ``pin[0]`` (Linux threads inherit their
    creator's: PoCL's worker threads, started while the device and context are created, run there only), then the
    calling (host) thread set to ``pin[1]`` (the host engines' cpus; none given: its affinity before). The split
    host's enqueue of a 0.4 ms kernel returned in 0.43 ms with PoCL's worker and the host thread unpinned (they
    often shared one core) and in 0.02 ms pinned apart (2026-11-29). A no-op (why: :func:`pin_note`) where the
    OS has no sched_setaffinity or this process may not run on every CPU named."""
    global _PINNED
    cpus, host = pin
    if not hasattr(os, "sched_setaffinity"):
        _PINNED = (None, "this OS has no sched_setaffinity")
        return Engine()
    allowed = os.sched_getaffinity(0)
    if not set(cpus) | set(host) <= allowed:
        _PINNED = (None, f"cpus {sorted(set(cpus) | set(host))} named, this process may run on {sorted(allowed)}")
        return Engine()
    os.sched_setaffinity(0, cpus)
    try:
        e = Engine()
        e.run("act_fwd", (1,), None, e.none, _L(0), e.none, _L(0), _L(0), _I(0))   # workers started lazily: now
        e.finish()
    finally:
        os.sched_setaffinity(0, host or allowed)
    _PINNED = (tuple(cpus), "")
    return e


# PoCL's CPU (pthread) device reads its thread count from these once, when a process first loads it: PoCL <= 3
# POCL_MAX_PTHREAD_COUNT, PoCL >= 4 POCL_CPU_MAX_CU_COUNT. (Device fission, clCreateSubDevices, does not do it:
# PoCL 3.0's sub-device of one compute unit still ran its kernels on both worker threads, 2026-11-29.)
POCL_THREAD_ENV = ("POCL_MAX_PTHREAD_COUNT", "POCL_CPU_MAX_CU_COUNT")


def available(threads: int | None = None, cpus: tuple[int, ...] | None = None,
              host_cpus: tuple[int, ...] = ()) -> tuple[bool, str]:
    """(usable, why not). ``threads``: the compute threads a CPU OpenCL device should run (a device YAML's
    ``threads``: host-opencl-split.yaml gives PoCL one core and the C kernels the other), set through PoCL's
    environment before the engine is created (unless the environment sets them already); :func:`thread_note`
    says when this process's engine runs another count (PoCL reads it once a process). A GPU ignores it.
    ``cpus``, ``host_cpus``: the YAML's cpus of this engine and of the host engines: the engine, if not created
    yet, is created pinned to ``cpus`` and the host thread then pinned to ``host_cpus`` (:func:`_pinned_engine`;
    :func:`pin_note` says where it was not)."""
    global _PIN
    try:
        import pyopencl  # noqa: F401
    except ImportError:
        return False, "pyopencl is not installed (pip install -c constraints.txt '.[opencl]')"
    if threads is not None and _ENGINE is None:
        for k in POCL_THREAD_ENV:
            os.environ.setdefault(k, str(int(threads)))
    if cpus and _ENGINE is None:
        _PIN = (tuple(cpus), tuple(host_cpus))
    try:
        engine()
    except RuntimeError as err:
        return False, f"no usable OpenCL device ({err})"
    return True, ""


def thread_note(threads: int) -> str:
    """Why this process's engine (a CPU device) does not run ``threads`` compute threads, or ""."""
    e = _ENGINE
    if e is None or not e.cpu or e.device.max_compute_units == int(threads):
        return ""
    return (f"{e.name} runs {e.device.max_compute_units} compute threads in this process, not the YAML's {threads} "
            f"(PoCL reads {'/'.join(POCL_THREAD_ENV)} once a process: load the YAML in a process of its own)")


def pin_note(cpus: tuple[int, ...] | None) -> str:
    """Why this process's engine was not created on ``cpus`` (a device YAML's), or ""."""
    if not cpus or _ENGINE is None or _PINNED[0] == tuple(cpus):
        return ""
    why = _PINNED[1] or "the engine existed before this YAML was loaded (created unpinned or on other cpus)"
    return f"{_ENGINE.name} not pinned to cpus {list(cpus)}: {why}"


def handoff_probe(t, to_host: bool) -> Callable[[], None]:
    """A hand-off of host tensor ``t`` as the executor runs one (port.exec.handoff), for ``port profile``: to the
    host, a kernel on the queue writing its first element, then the wait; from the host, nothing (the queue reads
    the arena as it is when the reader is enqueued)."""
    e = engine()
    x = Operand(*e.buffer_of(t.view(-1)[:1], {}), (1,))

    def run():
        e.run("act_fwd", (1,), None, *x.a(), *x.a(), _L(1), _I(0))
        e.finish()
    return run if to_host else (lambda: None)


def join_probe(t) -> Callable[[], float]:
    """The host's join of a drained queue (Plan.joins: a ``join`` call, ``Engine.finish``), for ``port profile``:
    one sample enqueues a kernel writing ``t``'s first element and waits for the queue outside the engine's count
    (its pending kernel stays counted, as after the executor's enqueues), then times ``finish()``; returns ms."""
    import time
    e = engine()
    x = Operand(*e.buffer_of(t.view(-1)[:1], {}), (1,))

    def run() -> float:
        e.run("act_fwd", (1,), None, *x.a(), *x.a(), _L(1), _I(0))
        e.queue.finish()
        t0 = time.perf_counter()
        e.finish()
        return (time.perf_counter() - t0) * 1e3
    return run


def copy_probe(t, to_host: bool) -> Callable[[], None]:
    """A copy hand-off of host tensor ``t`` between the host and the engine's own memory, as the executor runs
    one for a program with an own arena (port.exec.handoff.bind_copy), for ``port profile``."""
    e = engine()
    dev = e.device_arena(t.numel() * t.element_size())
    host = t.view(-1).view(__import__("torch").uint8)

    def run():
        e.copy(host, dev, 0, to_host)
    run.keep = dev
    return run


def _g(n: int, wg: int = 64) -> tuple[int]:
    """A 1-D global size covering ``n`` work-items, a multiple of ``wg``."""
    return (max(wg, (int(n) + wg - 1) // wg * wg),)


def _L(v) -> Any:
    import numpy as np
    return np.int64(v)


def _I(v) -> Any:
    import numpy as np
    return np.int32(v)


def _F(v) -> Any:
    import numpy as np
    return np.float32(v)


# ---------------------------------------------------------------------------------------------------------
# binders: (engine, call, attrs, I, O, ctx) -> run. I/O are Operands in the order of the op records' torch
# bindings (port.ops); a kernel takes each operand as (buffer, byte offset): ``x.a()`` (``x.a(k)``: k floats in)
# ---------------------------------------------------------------------------------------------------------
class Operand:
    __slots__ = ("m", "o", "s")

    def __init__(self, m, o: int, s: tuple[int, ...]) -> None:
        self.m, self.o, self.s = m, int(o), s

    def a(self, k: int = 0) -> tuple:
        """Kernel arguments: the buffer and the byte offset of float element ``k``."""
        import numpy as np
        return self.m, np.int64(self.o + 4 * k)


def _absent(e) -> tuple:
    """An operand the kernel does not touch (offset -1)."""
    import numpy as np
    return e.none, np.int64(-1)


def _numel(shape) -> int:
    return math.prod(int(s) for s in shape)


def _elementwise(e, call, a, I, O, ctx):
    y = O[0]
    n = _numel(y.s)
    if call.kernel in ("add", "grad_accumulate"):
        return lambda: e.run("add", _g(n), None, *y.a(), *I[0].a(), *I[1].a(), _L(n))
    if call.kernel in ACT:
        k = ACT[call.kernel]
        return lambda: e.run("act_fwd", _g(n), None, *y.a(), *I[0].a(), _L(n), _I(k))
    k = ACT[call.kernel.split(".")[0]]
    return lambda: e.run("act_bwd", _g(n), None, *y.a(), *I[0].a(), *I[1].a(), _L(n), _I(k))


def _gemm(e, C, A, B, m, n, k, sam, sak, sbk, sbn, scm, scn, beta) -> None:
    """C[m, n] (+)= A[m, k] @ B[k, n] with element strides; A, B, C: kernel argument pairs."""
    if sbn == 1 and scn == 1:
        _gemm_n8(e, C, A, B, m, n, k, sam, sak, sbk, scm, beta)
        return
    gs = ((m + GEMM_TILE - 1) // GEMM_TILE * GEMM_TILE, (n + GEMM_TILE - 1) // GEMM_TILE * GEMM_TILE)
    e.run("gemm", gs, (GEMM_TILE, GEMM_TILE), *C, *A, *B, _I(m), _I(n), _I(k), _I(sam), _I(sak), _I(sbk),
          _I(sbn), _I(scm), _I(scn), _I(beta))


def _gemm_n8(e, C, A, B, m, n, k, sam, sak, sbk, scm, beta, batch=1, sz=(0, 0, 0), summed=False) -> None:
    """C[z] (+)= A[z] @ B[z] for ``batch`` products (A[z]: A + z * sz[0] floats; B, C alike) in one launch,
    B and C contiguous along n; ``summed``: C (+)= the sum of the ``batch`` products instead (one C)."""
    blocks = -(-n // 8)
    gs = (-(-blocks // GEMM_N8_WG) * GEMM_N8_WG, -(-m // GEMM_ROWS), 1 if summed else batch)
    e.run("gemm_n8", gs, (GEMM_N8_WG, 1, 1), *C, *A, *B, _I(m), _I(n), _I(k), _I(sam), _I(sak), _I(sbk),
          _I(scm), _I(beta), *(_L(v) for v in sz), _I(batch if summed else 1))


def _conv(e, call, a, I, O, ctx):
    """conv2d and its gradients: depthwise (groups == C_in) direct; else im2col of up to SCRATCH_IMAGES_BYTES of
    images per launch into the engine's scratch buffer (none for a 1x1 stride-1 unpadded conv's forward and
    input gradient: its column matrix is the image) and one batched GEMM per group (gemm_n8): the forward
    y[i, j] = W[j] @ col_i ([cog, K] @ [K, P]), the input gradient col_i = W[j]^T @ dy[i, j] then col2im, the
    weight gradient dW[j] += sum_i dy[i, j] @ col_i^T (the columns written transposed, [P, K])."""
    kind = call.kernel
    g = int(a["groups"])
    gr: dict = {}
    if kind == "conv2d":
        x, wt, y = I[0], I[1], O[0]
        b = I[2] if a.get("bias") else None
    elif kind == "conv2d.grad_input":
        y, wt = I          # y: dy
        x = O[0]           # x: dx
    else:
        y, x = I           # dy, x
        gr = dict(zip(a["grads"], O))
    n, c, h, w = (int(v) for v in x.s)
    co, ho, wo = int(y.s[1]), int(y.s[2]), int(y.s[3])
    kh, kw = (int(v) for v in a["kernel"])
    sh, sw = (int(v) for v in a["stride"])
    ph, pw = (int(v) for v in a["padding"])
    P = ho * wo
    dwg, bg = gr.get("weight"), gr.get("bias")
    if g == c and g > 1:                       # depthwise: direct kernels
        geom = tuple(_I(v) for v in (n, c, h, w, co, kh, kw, sh, sw, ph, pw, ho, wo))
        if kind == "conv2d":
            def run():
                e.run("dw_fwd", _g(n * co * P), None, *y.a(), *x.a(), *wt.a(), *geom)
                if b is not None:
                    e.run("bias_add", _g(n * co * P), None, *y.a(), *b.a(), _I(co), _L(P), _L(n * co * P))
            return run
        if kind == "conv2d.grad_input":
            return lambda: e.run("dw_bwd_input", _g(n * c * h * w), None, *x.a(), *y.a(), *wt.a(), *geom)

        def run():
            if dwg is not None:
                e.run("dw_bwd_weight", _g(co * kh * kw), None, *dwg.a(), *y.a(), *x.a(), *geom)
            if bg is not None:
                e.run("bias_grad", _g(co), None, *bg.a(), *y.a(), _I(n), _I(co), _L(P))
        return run
    cg, cog = c // g, co // g
    K = cg * kh * kw
    zc = max(1, min(n, SCRATCH_IMAGES_BYTES // (4 * K * P)))      # images per launch
    pointwise = (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0)    # col_i is x[i] itself ([C, H*W], K = cg)
    col = (e.scratch(4 * K * P * zc), _L(0)) if not (pointwise and kind != "conv2d.grad_weight") else None
    cgeom = tuple(_I(v) for v in (cg, h, w, kh, kw, sh, sw, ph, pw, ho, wo))
    chunks = [(i, min(zc, n - i)) for i in range(0, n, zc)]

    def im2col(i, z, j, transposed):
        sr, sp = (1, K) if transposed else (P, 1)
        e.run("im2col", (ho, K, z), None, *col, *x.a((i * c + j * cg) * h * w), *cgeom, _L(sr), _L(sp),
              _L(c * h * w), _L(K * P))
    if kind == "conv2d":
        def run():
            for i, z in chunks:
                for j in range(g):
                    if pointwise:
                        src, sb = x.a((i * c + j * cg) * P), c * P
                    else:
                        im2col(i, z, j, False)
                        src, sb = col, K * P
                    _gemm_n8(e, y.a((i * co + j * cog) * P), wt.a(j * cog * K), src, cog, P, K, K, 1, P, P, 0,
                             z, (0, sb, co * P))
            if b is not None:
                e.run("bias_add", _g(n * co * P), None, *y.a(), *b.a(), _I(co), _L(P), _L(n * co * P))
        return run
    if kind == "conv2d.grad_input":
        def run():
            for i, z in chunks:
                for j in range(g):
                    dx = x.a((i * c + j * cg) * h * w)
                    dst, sc = (dx, c * P) if pointwise else (col, K * P)
                    _gemm_n8(e, dst, wt.a(j * cog * K), y.a((i * co + j * cog) * P), K, P, cog, 1, K, P, P, 0,
                             z, (0, co * P, sc))
                    if not pointwise:
                        e.run("col2im", (h, cg, z), None, *dx, *col, *cgeom, _L(c * h * w), _L(K * P))
        return run

    def run():
        if dwg is not None:
            for i, z in chunks:
                for j in range(g):
                    im2col(i, z, j, True)
                    _gemm_n8(e, dwg.a(j * cog * K), y.a((i * co + j * cog) * P), col, cog, K, P, P, 1, K, K, 1,
                             z, (co * P, K * P, 0), summed=True)
        if bg is not None:
            e.run("bias_grad", _g(co), None, *bg.a(), *y.a(), _I(n), _I(co), _L(P))
    return run


def _linear(e, call, a, I, O, ctx):
    """y = x W^T + b (W [out, in]; ``weight_t``: W stored [in, out]); rows: every leading dim."""
    t = bool(a.get("weight_t"))
    kind = call.kernel
    if kind == "linear":
        x, wt, y = I[0], I[1], O[0]
        b = I[2] if a.get("bias") else None
    elif kind == "linear.grad_input":
        y, wt = I
        x = O[0]
    else:
        y, x = I
    fin, fout = int(x.s[-1]), int(y.s[-1])
    rows = _numel(x.s) // fin
    if kind == "linear":
        sk, sn = (fout, 1) if t else (1, fin)        # B[k=in, n=out] = W^T

        def run():
            _gemm(e, y.a(), x.a(), wt.a(), rows, fout, fin, fin, 1, sk, sn, fout, 1, 0)
            if b is not None:
                e.run("bias_add", _g(rows * fout), None, *y.a(), *b.a(), _I(fout), _L(1), _L(rows * fout))
        return run
    if kind == "linear.grad_input":
        sk, sn = (1, fout) if t else (fin, 1)        # B[k=out, n=in] = W
        return lambda: _gemm(e, x.a(), y.a(), wt.a(), rows, fin, fout, fout, 1, sk, sn, fin, 1, 0)
    gr = dict(zip(a["grads"], O))
    dw, db = gr.get("weight"), gr.get("bias")

    def run():
        if dw is not None:    # dW[out, in] += dy^T @ x   (weight_t: dW[in, out] += x^T @ dy)
            if t:
                _gemm(e, dw.a(), x.a(), y.a(), fin, fout, rows, 1, fin, fout, 1, fout, 1, 1)
            else:
                _gemm(e, dw.a(), y.a(), x.a(), fout, fin, rows, 1, fout, fin, 1, fin, 1, 1)
        if db is not None:
            e.run("bias_grad", _g(fout), None, *db.a(), *y.a(), _I(rows), _I(fout), _L(1))
    return run


def _bn(e, call, a, I, O, ctx):
    kind = call.kernel
    eps, mom = float(a["eps"]), float(a["momentum"])
    no = _absent(e)
    wg = (BN_WG,)
    if kind == "batch_norm2d":
        x, w, b, rm, rv = I
        n, c, hw = int(x.s[0]), int(x.s[1]), _numel(x.s[2:])
        y = O[0]
        if a.get("training"):
            st = O[1]
            rerun = 1 if a.get("recompute") else 0     # a re-run: the running statistics do not move again
            return lambda: e.run("bn_fwd_train", (c * BN_WG,), wg, *y.a(), *st.a(), *x.a(), *w.a(), *b.a(),
                                 *rm.a(), *rv.a(), _I(n), _I(c), _L(hw), _F(eps), _F(mom), _I(rerun))
        tot = _numel(x.s)
        return lambda: e.run("bn_fwd_eval", _g(tot), None, *y.a(), *x.a(), *w.a(), *b.a(), *rm.a(), *rv.a(),
                             _I(c), _L(hw), _F(eps), _L(tot))
    if kind == "batch_norm2d.grad_input":
        dx = O[0]
        if a.get("training"):
            dy, x, st, w = I
            xa, sa, rva, ev = x.a(), st.a(), no, 0
        else:
            dy, w, rv = I
            xa, sa, rva, ev = dy.a(), dy.a(), rv.a(), 1     # eval: dx = dy * w * invstd(running var)
        n, c, hw = int(dy.s[0]), int(dy.s[1]), _numel(dy.s[2:])
        return lambda: e.run("bn_bwd", (c * BN_WG,), wg, *dx.a(), *no, *no, *dy.a(), *xa, *sa, *w.a(), *rva,
                             _I(n), _I(c), _L(hw), _F(eps), _I(ev))
    gr = dict(zip(a["grads"], O))
    ga = gr["weight"].a() if "weight" in gr else no
    ba = gr["bias"].a() if "bias" in gr else no
    if a.get("training"):
        dy, x, st = I
        sa, rva, ev = st.a(), no, 0
    else:
        dy, x, rm, rv = I
        sa, rva, ev = rm.a(), rv.a(), 1
    n, c, hw = int(dy.s[0]), int(dy.s[1]), _numel(dy.s[2:])
    return lambda: e.run("bn_bwd", (c * BN_WG,), wg, *no, *ga, *ba, *dy.a(), *x.a(), *sa, *no, *rva, _I(n), _I(c),
                         _L(hw), _F(eps), _I(ev))


def _pool(e, call, a, I, O, ctx):
    kind = call.kernel
    kh, kw = (int(v) for v in a["kernel"])
    sh, sw = (int(v) for v in a["stride"])
    ph, pw = (int(v) for v in a["padding"])
    fwd = kind in ("max_pool2d", "avg_pool2d")
    x, y = (I[0], O[0]) if fwd else (O[0], I[0])        # backward: x is dx, y is dy
    h, w, ho, wo = int(x.s[2]), int(x.s[3]), int(y.s[2]), int(y.s[3])
    geom = tuple(_I(v) for v in (h, w, kh, kw, sh, sw, ph, pw, ho, wo))
    ny, nx = _numel(y.s), _numel(x.s)
    if kind == "max_pool2d":
        idx = O[1]
        return lambda: e.run("maxpool_fwd", _g(ny), None, *y.a(), *idx.a(), *x.a(), *geom, _L(ny))
    if kind == "max_pool2d.grad_input":
        idx = I[1]
        return lambda: e.run("maxpool_bwd", _g(nx), None, *x.a(), *y.a(), *idx.a(), *geom, _L(nx))
    if kind == "avg_pool2d":
        return lambda: e.run("avgpool_fwd", _g(ny), None, *y.a(), *x.a(), *geom, _L(ny))
    return lambda: e.run("avgpool_bwd", _g(nx), None, *x.a(), *y.a(), *geom, _L(nx))


def _gap(e, call, a, I, O, ctx):
    if call.kernel == "global_avg_pool2d":
        x, y = I[0], O[0]
        hw, planes = _numel(x.s[2:]), _numel(x.s[:2])
        return lambda: e.run("gap_fwd", _g(planes), None, *y.a(), *x.a(), _L(hw), _L(planes))
    dy, dx = I[0], O[0]
    hw, nx = _numel(dx.s[2:]), _numel(dx.s)
    return lambda: e.run("gap_bwd", _g(nx), None, *dx.a(), *dy.a(), _L(hw), _L(nx))


def _xent(e, call, a, I, O, ctx):
    ls = float(a.get("label_smoothing", 0.0))
    if call.kernel == "cross_entropy":
        z, lab = I
        loss, probs = O
        n, k = int(z.s[0]), int(z.s[1])
        rows = Operand(e.cl.Buffer(e.ctx, e.cl.mem_flags.READ_WRITE, max(4 * n, 64)), 0, (n,))  # per-row losses

        def run():
            e.run("xent_rows", _g(n), None, *rows.a(), *probs.a(), *z.a(), *lab.a(), _I(k), _F(ls), _I(n))
            e.run("xent_mean", (1,), None, *loss.a(), *rows.a(), _I(n))
        run.keep = rows
        return run
    p, lab, scale = I
    dl = O[0]
    n, k = int(p.s[0]), int(p.s[1])
    return lambda: e.run("xent_bwd", _g(n * k), None, *dl.a(), *p.a(), *lab.a(), *scale.a(), _I(k), _F(ls),
                         _L(n * k))


def _update(e, call, a, I, O, ctx):
    st = ctx.state
    opt = a.get("optimizer")
    if opt in ("sgd", "sgd_momentum"):
        p, g = I[0], I[1]
        buf = I[2].a() if opt == "sgd_momentum" else _absent(e)
        n = _numel(p.s)

        def run():
            o = st.opt
            e.run("sgd", _g(n), None, *p.a(), *g.a(), *buf, _L(n), _F(o.lr), _F(o.weight_decay),
                  _F(getattr(o, "momentum", 0.0) or 0.0), _F(getattr(o, "dampening", 0.0) or 0.0),
                  _I(1 if getattr(o, "nesterov", False) else 0), _I(1 if st.step == 0 else 0))
        return run
    if opt == "adamw":
        p, g, m1, m2 = I
        n = _numel(p.s)

        def run():
            o = st.opt
            step = st.step + 1
            b1, b2 = o.betas
            e.run("adamw", _g(n), None, *p.a(), *g.a(), *m1.a(), *m2.a(), _L(n), _F(o.lr), _F(o.weight_decay),
                  _F(b1), _F(b2), _F(o.eps), _F(1.0 - b1 ** step), _F(math.sqrt(1.0 - b2 ** step)))
        return run
    raise ProgramError(f"call {call.index} ({call.name}, update): unknown optimizer {opt!r}")


BINDERS: dict[str, Callable] = {}
for _k in ("add", "grad_accumulate", "relu", "relu6", "hardswish", "relu.grad_input", "relu6.grad_input",
           "hardswish.grad_input"):
    BINDERS[_k] = _elementwise
for _k in ("conv2d", "conv2d.grad_input", "conv2d.grad_weight"):
    BINDERS[_k] = _conv
for _k in ("linear", "linear.grad_input", "linear.grad_weight"):
    BINDERS[_k] = _linear
for _k in ("batch_norm2d", "batch_norm2d.grad_input", "batch_norm2d.grad_weight"):
    BINDERS[_k] = _bn
for _k in ("max_pool2d", "max_pool2d.grad_input", "avg_pool2d", "avg_pool2d.grad_input"):
    BINDERS[_k] = _pool
for _k in ("global_avg_pool2d", "global_avg_pool2d.grad_input"):
    BINDERS[_k] = _gap
for _k in ("cross_entropy", "cross_entropy.grad_input"):
    BINDERS[_k] = _xent
BINDERS["update"] = _update


class OpenCLBackend:
    name = "opencl"

    def bind(self, call, ctx) -> Callable[[], None]:
        where = f"call {call.index} ({call.name}, {call.kernel})"
        a = dict(call.attrs)
        if call.variant not in ("plain", "inplace"):
            raise ProgramError(f"{where}: variant {call.variant!r} is not available on opencl")
        if not supports(call.kernel, a):
            raise ProgramError(f"{where}: the opencl backend has no kernel for {call.kernel!r} with these "
                               f"attributes; such ops stay on the other engines")
        e = engine()
        cache = getattr(ctx, "_opencl_buffers", None)
        if cache is None:
            cache = {}
            ctx._opencl_buffers = cache
        own = getattr(ctx, "own_arena", None)       # (the profiler's bind contexts have no own arenas)
        dev = own("opencl") if own is not None else None
        if dev is None:
            e.check_unified()

        def operand(tid):
            if dev is not None:       # own memory: the tensor's place in the engine's arena
                return Operand(dev, ctx.own_offset("opencl", tid), ctx.shape(tid))
            v = ctx.view(tid)
            if v.device.type != "cpu":
                raise ProgramError(f"{where}: tensor {tid} is in {v.device.type} memory; the opencl engine works "
                                   f"on host memory (unified) only")
            b, off = e.buffer_of(v, cache)
            return Operand(b, off, tuple(int(d) for d in v.shape))
        I = [operand(t) for t in call.inputs]
        O = [operand(t) for t in call.outputs]
        run = BINDERS[call.kernel](e, call, a, I, O, ctx)
        keep = (I, O, getattr(run, "keep", None))

        site: list = []             # this call's kernel objects, their arguments set once (Engine.run)

        def fn():
            e.in_site(site, run)
        fn.keep = keep
        fn.entry = f"opencl:{call.kernel}"
        fn.sync = e.finish
        return fn
