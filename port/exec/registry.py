"""The one op registry: how each graph op runs, for the executor and the profiler alike.

    op_calls(graph, op, variant, backend)    -> the calls that run ``op`` under ``variant`` (kernel name,
                                                outputs, inputs, attributes); lowering emits exactly these
    workspace_bytes(spec, in_shapes, out_shapes) -> scratch bytes of one call (the kernel's own query)
    bind(call, ctx)                          -> a zero-argument callable running one call on ``ctx``'s
                                                buffers; ``.entry`` names the kernel entry point it calls
    available(backend)                       -> (present on this machine, why not)

``ctx`` gives ``ptr(tid)``, ``view(tid)``, ``shape(tid)``, ``ws_ptr(call)``, ``ws_view(call)`` and the run-time
``state``: the executor's arena (port.exec.executor.BindContext) or the profiler's scratch buffers
(port.cost.measure). What each kernel is (its shape rule, C entry points and call encoding, torch binding,
workspace query) lives in its op record (port.ops); the backends (port.exec.backends.c, .torch_backend) bind
calls through the records, and nothing else dispatches ops. Importing this module loads neither torch nor the
C library: lowering uses ``op_calls`` and ``workspace_bytes`` and stays pure.

Kernel names are graph op kinds, plus three that lowering emits for variants:
``conv2d_bn_relu`` (a fused chain, C ``port_conv2d_bn_relu_forward_train``),
``batch_norm2d.grad_input_from_output`` and ``batch_norm2d.grad_weight_from_output`` (the backward of an
in-place batch norm, C ``port_batchnorm2d_backward_*_from_output``).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable

from port.errors import PlanError
from port.ir.types import Graph, Op, numel
from port.plan import variants as V
from port import ops
from port.ops.attention import ATTENTION_KERNELS, ATTN_ALGO, attention_params  # noqa: F401
from port.ops.base import F32, I64, U8, CallShapeError  # noqa: F401
from port.ops.conv import CONV_ALGO, CONV_KERNELS, conv_geometry, conv_out_hw, conv_params  # noqa: F401
from port.ops.optimizer import OPT_STATES  # noqa: F401
from port.ops.pooling import pool_out_hw  # noqa: F401
from port.ops.random import dropout_seed  # noqa: F401

BACKENDS = ("c", "torch-cpu", "torch-cuda", "opencl")

# Python kernel name (what a Call runs) -> the C entry points the ``c`` backend calls for it (the op records'
# own tables, port.ops; kernels/include/port_kernels.h). tests/e2e/test_registry.py checks every binding the
# executor makes against it.
C_ENTRIES: dict[str, tuple[str, ...]] = {k: ops.c_entries(k) for k in ops.kernels() if ops.c_entries(k)}
NO_CALL_KINDS = tuple(k for r in ops.RECORDS.values() for k in r.views)   # views: zero-copy, no kernel


@dataclass(frozen=True)
class CallSpec:
    """One kernel call of an op (tensor ids are graph ids; lowering maps them to versions and slots)."""
    kernel: str
    variant: str
    backend: str
    outputs: tuple[int, ...]
    inputs: tuple[int, ...]
    attrs: tuple = ()
    covers: tuple[int, ...] = ()     # ops of a fused chain this call computes besides its own

    def attr_dict(self) -> dict:
        return dict(self.attrs)


def op_calls(graph: Graph, op: Op, variant: str, backend: str) -> tuple[CallSpec, ...]:
    """The calls that run ``op`` with ``variant`` on ``backend``: none for views and for the batch norm and relu
    of a fused chain (the conv's fused call computes them); what the op's record says where it maps an op to
    other calls (``OpRecord.calls``: the fused chain, read-modify-write statistics, one GEMM per operand); else
    one call of the op's kind."""
    if op.kind in NO_CALL_KINDS:
        return ()
    if variant == "fused":
        ch = V.chain_of(graph, op)
        if ch is None:
            raise PlanError(f"op {op.name!r}: variant 'fused' without a fused chain")
        if ch.call_of(op.id) != op.id:
            return ()
        custom = ch.fusion.emit(graph, ch, op)
    else:
        r = ops.record(op.kind)
        custom = r.calls(graph, op, variant) if r.calls is not None else None
    if custom is not None:        # the record's own mapping (a fused chain, read-modify-write, several calls)
        return tuple(CallSpec(k, variant, backend, tuple(o), tuple(i), tuple(sorted(_overwrite(graph, k, o, a, backend,
                                                                                              variant).items())),
                              tuple(cv))
                     for k, o, i, a, cv in custom)
    attrs = dict(op.attrs)
    if may_overwrite(op.kind, backend, variant) and overwrites_gradients(graph, op):
        attrs["overwrite"] = True
    return (CallSpec(op.kind, variant, backend, tuple(op.outputs), tuple(op.inputs), tuple(sorted(attrs.items()))),)


def _overwrite(graph: Graph, kernel: str, outputs, attrs: dict, backend: str, variant: str) -> dict:
    """A fused call's attributes, with ``overwrite`` where its kernel can write its gradients and it is their only
    writer (the squeeze-excitation weight-gradient call: the two fcs' four gradients)."""
    if may_overwrite(kernel, backend, variant) and all(graph.writers(t) == 1 and graph.tensors[t].alias_of is None
                                                       for t in outputs):
        return {**attrs, "overwrite": True}
    return dict(attrs)


def may_overwrite(kernel: str, backend: str, variant: str) -> bool:
    """The calls that can carry attribute ``overwrite``: the C backend's whole-tensor conv weight gradient
    (port_conv2d_backward_weight_overwrite) and the fused squeeze-excitation weight gradient
    (port_se_backward_weight_overwrite); every other call accumulates into its gradients."""
    if backend != "c":
        return False
    return (kernel == "conv2d.grad_weight" and not variant.startswith("patch")) or kernel == "se.grad_weight"


def overwrites_gradients(graph: Graph, op: Op) -> bool:
    """A conv weight-gradient op on the C backend writes its gradients (weight, and bias if it trains) with
    ``port_conv2d_backward_weight_overwrite`` -- no zeroing pass over them before the step -- when it is the
    only op writing them (so the step's first and only write; a parameter used twice gets one partial gradient
    per use and a ``grad_accumulate``). Lowering keeps accumulating (and zeroing) under micro-batching, where a
    step runs the program once per micro-batch (``lower(..., overwrite_gradients=False)``)."""
    grads = op.attr("grads") or ()
    return "weight" in grads and all(graph.writers(t) == 1 and graph.tensors[t].alias_of is None
                                     for t in op.outputs)


# ---------------------------------------------------------------------------------------------
# workspace queries (the C library's own, through port.exec.capi; no torch)
# ---------------------------------------------------------------------------------------------
def workspace_bytes(kernel: str, variant: str, backend: str, attrs: dict, in_shapes, out_shapes) -> int:
    """Scratch bytes of one call: the C kernel's own query (its record's ``workspace``); 0 on torch engines."""
    r = ops.owner(kernel)
    if backend != "c" or r is None or r.workspace is None:
        return 0
    return int(r.workspace(kernel, variant, attrs, in_shapes, out_shapes))


def op_workspace_bytes(graph: Graph, op: Op, variant: str, backend: str = "c") -> int:
    """The largest workspace of the calls ``op`` runs as ``variant`` on ``backend`` (the kernels' queries)."""
    from port.lower.program import GRAD_SCALE_ID
    shape = lambda t: (1,) if t == GRAD_SCALE_ID else tuple(graph.tensors[t].shape)  # noqa: E731
    return max([workspace_bytes(c.kernel, c.variant, c.backend, c.attr_dict(), [shape(t) for t in c.inputs],
                                [shape(t) for t in c.outputs])
                for c in op_calls(graph, op, variant, backend)] + [0])


def c_conv_algo(graph, op, variant: str = "fused") -> str | None:
    """The algorithm the C library runs this conv2d (or conv gradient) op's ``variant`` as -- ``direct``,
    ``winograd`` or ``plain`` (im2col) -- or None where it does not apply. ``fused`` asks PORT_CONV_AUTO (what
    the fused conv+bn+relu kernel runs). The rules live in kernels/src/conv.c (port_conv2d_resolve_algo)."""
    from port.exec import capi
    fwd = graph.ops[op.forward_op] if op.forward_op is not None else op
    x = tuple(graph.tensors[fwd.inputs[0]].shape)
    p = conv_params(capi, x, graph.tensors[fwd.outputs[0]].shape[1], dict(fwd.attrs))
    algo = int(capi.raw.port_conv2d_resolve_algo(ctypes.byref(p), CONV_ALGO[variant]))
    return {v: k for k, v in CONV_ALGO.items() if k != "fused"}.get(algo)


def c_auto_conv_variant(graph, op) -> str:
    """The variant PORT_CONV_AUTO runs this conv op as; the default plan follows it, as the fused kernel does."""
    return c_conv_algo(graph, op, "fused")


# ---------------------------------------------------------------------------------------------
# binding
# ---------------------------------------------------------------------------------------------
_BACKENDS: dict[str, Any] = {}


def backend(name: str):
    b = _BACKENDS.get(name)
    if b is not None:
        return b
    if name == "c":
        from port.exec.backends.c import CBackend
        b = CBackend()
    elif name in ("torch-cpu", "torch-cuda"):
        from port.exec.backends.torch_backend import TorchBackend
        b = TorchBackend(name.split("-")[1])
    elif name == "opencl":
        from port.exec.backends.opencl import OpenCLBackend
        b = OpenCLBackend()
    else:
        raise PlanError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    _BACKENDS[name] = b
    return b


def bind(call, ctx) -> Callable[[], None]:
    """The callable that runs ``call`` (a port.lower.program.Call or anything with its fields) on ``ctx``."""
    fn = backend(call.backend).bind(call, ctx)
    if not hasattr(fn, "entry"):
        try:
            fn.entry = f"{call.backend}:{call.kernel}"
        except AttributeError:       # a builtin: wrap it
            inner = fn

            def fn():
                return inner()
            fn.entry = f"{call.backend}:{call.kernel}"
    return fn


def available(name: str) -> tuple[bool, str]:
    """(present on this machine, why not)."""
    if name == "torch-cpu":
        return True, ""
    if name == "torch-cuda":
        import torch
        return (True, "") if torch.cuda.is_available() else (False, "no CUDA device (torch.cuda.is_available() "
                                                                     "is False)")
    if name == "c":
        try:
            from port.exec import capi
            capi.load()
        except Exception as e:  # noqa: BLE001 - ImportError, OSError from the loader
            return False, f"C kernels not built or not loadable ({type(e).__name__}: {e})"
        return True, ""
    if name == "opencl":
        from port.exec.backends import opencl
        return opencl.available()
    return False, "modeled accelerator (not present on this machine)"


# ---------------------------------------------------------------------------------------------
# the per-kernel shape rule: what every input and output of a call must look like, from its attributes and
# the shape of the tensor that fixes its geometry. port.lower.arena.check_program compares it with the
# program's slots (lowering runs that check on every program it emits); the C backend passes the output dims
# it implies to the kernels, which refuse others (port_conv2d_params / port_pool2d_params h_out, w_out).
# ---------------------------------------------------------------------------------------------
HOST_KERNELS = ("page_out", "page_in", "handoff", "join")


def call_shapes(kernel: str, attrs: dict, in_shapes, out_shapes) -> tuple[list, list]:
    """Expected ``(shape, dtype)`` of every input and output of a call running ``kernel`` with ``attrs``,
    given its slots' shapes (one of which, e.g. the forward's x, fixes the geometry; the rest follow from it
    and the attributes; the kernel's record holds the rule). A shape of None means any. Raises CallShapeError
    on bad attributes or arity."""
    I, O = list(in_shapes), list(out_shapes)

    def at(lst, i, what):
        if i >= len(lst):
            raise CallShapeError(f"{what}: the call has only {len(lst)}")
        return lst[i]

    if kernel == "page_out":
        return [(at(I, 0, "input 0"), None)], []
    if kernel == "page_in":
        return [], [(at(O, 0, "output 0"), None)]
    if kernel == "handoff":
        return [(at(I, 0, "input 0"), None)], []
    if kernel == "join":
        return [], []
    r = ops.owner(kernel)
    if r is None or kernel in r.views:
        raise CallShapeError(f"unknown kernel {kernel!r}")
    return r.shapes(kernel, attrs, I, O, at)


def known_kernel(kernel: str, backend: str, attrs: dict | None = None) -> bool:
    """The backend runs ``kernel`` (with these attributes: some C kernels take only some)."""
    if backend == "host":
        return kernel in HOST_KERNELS
    r = ops.owner(kernel)
    if r is None or kernel in r.views or backend not in BACKENDS:
        return False
    if backend == "opencl":
        from port.exec.backends.opencl import supports
        return supports(kernel, attrs or {})
    return backend != "c" or ops.has_c(kernel, attrs)


def known_variant(kernel: str, variant: str, backend: str) -> bool:
    if not isinstance(variant, str):
        return False
    if backend == "opencl":        # plain kernels, element-wise ones in place too (port.exec.backends.opencl)
        return variant in ("plain", "inplace")
    if variant.startswith("patch"):
        t = variant[5:]
        return backend == "c" and kernel in CONV_KERNELS and kernel != "conv2d_bn_relu" and t.isdigit() \
            and str(int(t)) == t and int(t) in V.PATCH_TILES
    if variant == "fused" or kernel in V.FUSED_KERNELS:
        return variant == "fused" and kernel in V.FUSED_KERNELS
    if variant == "tiled":
        return kernel in ATTENTION_KERNELS and backend == "c"
    return variant in ("plain", "direct", "inplace", "winograd") and (variant not in ("direct", "winograd")
                                                                     or kernel in CONV_KERNELS)


def inplace_pairs(kernel: str, attrs: dict) -> tuple[tuple[int, int], ...]:
    """(output index, input index) pairs that must name the same tensor: read-modify-write arguments (the
    kernel writes the input's bytes: optimizer state, parameters, batch-norm running statistics)."""
    r = ops.owner(kernel)
    return tuple(r.inplace_pairs(kernel, attrs)) if r is not None else ()
