"""The one op registry: how each graph op runs, for the executor and the profiler alike.

    op_calls(graph, op, variant, backend)    -> the calls that run ``op`` under ``variant`` (kernel name,
                                                outputs, inputs, attributes); lowering emits exactly these
    workspace_bytes(spec, in_shapes, out_shapes) -> scratch bytes of one call (the kernel's own query)
    bind(call, ctx)                          -> a zero-argument callable running one call on ``ctx``'s
                                                buffers; ``.entry`` names the kernel entry point it calls
    available(backend)                       -> (present on this machine, why not)

``ctx`` gives ``ptr(tid)``, ``view(tid)``, ``shape(tid)``, ``ws_ptr(call)``, ``ws_view(call)`` and the run-time
``state``: the executor's arena (port.exec.executor.BindContext) or the profiler's scratch buffers
(port.cost.measure). Backends (port.exec.backends.c, port.exec.backends.torch_backend) hold the per-kernel
bindings; nothing else dispatches ops. Importing this module loads neither torch nor the C library: lowering
uses ``op_calls`` and ``workspace_bytes`` and stays pure.

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
from port.lower.program import GRAD_SCALE_ID  # the loss-gradient scale (1 / micro-batches): a constant slot
from port.plan import variants as V

BACKENDS = ("c", "torch-cpu", "torch-cuda")

# Python kernel name (what a Call runs) -> the C entry points the ``c`` backend calls for it, by variant
# (plain/direct/fused: the first; patch<T>: the patch kernel; batch norm: train, eval). The one table of how
# names in Python map to names in kernels/include/port_kernels.h; tests/e2e/test_registry.py checks every
# binding the executor makes against it.
C_ENTRIES: dict[str, tuple[str, ...]] = {
    "conv2d": ("port_conv2d_forward", "port_conv2d_patch_forward"),
    "conv2d.grad_input": ("port_conv2d_backward_input", "port_conv2d_patch_backward_input"),
    "conv2d.grad_weight": ("port_conv2d_backward_weight", "port_conv2d_patch_backward_weight",
                           "port_conv2d_backward_weight_overwrite"),
    "conv2d_bn_relu": ("port_conv2d_bn_relu_forward_train",),
    "batch_norm2d": ("port_batchnorm2d_forward_train", "port_batchnorm2d_forward_eval"),
    "batch_norm2d.grad_input": ("port_batchnorm2d_backward_input", "port_batchnorm2d_backward_input_eval"),
    "batch_norm2d.grad_weight": ("port_batchnorm2d_backward_weight", "port_batchnorm2d_backward_weight_eval"),
    "batch_norm2d.grad_input_from_output": ("port_batchnorm2d_backward_input_from_output",),
    "batch_norm2d.grad_weight_from_output": ("port_batchnorm2d_backward_weight_from_output",),
    "relu": ("port_relu_forward",), "relu.grad_input": ("port_relu_backward",),
    "relu6": ("port_relu6_forward",), "relu6.grad_input": ("port_relu6_backward",),
    "hardswish": ("port_hardswish_forward",), "hardswish.grad_input": ("port_hardswish_backward",),
    "add": ("port_add",), "grad_accumulate": ("port_add",),
    "dropout": ("port_dropout_forward",), "dropout.grad_input": ("port_dropout_backward",),
    "max_pool2d": ("port_maxpool2d_forward",), "max_pool2d.grad_input": ("port_maxpool2d_backward_input",),
    "avg_pool2d": ("port_avgpool2d_forward",), "avg_pool2d.grad_input": ("port_avgpool2d_backward_input",),
    "global_avg_pool2d": ("port_global_avgpool_forward",),
    "global_avg_pool2d.grad_input": ("port_global_avgpool_backward_input",),
    "linear": ("port_linear_forward",), "linear.grad_input": ("port_linear_backward_input",),
    "linear.grad_weight": ("port_linear_backward_weight",),
    "cross_entropy": ("port_softmax_xent_forward",), "cross_entropy.grad_input": ("port_softmax_xent_backward",),
    "update": ("port_sgd_step", "port_adamw_step"),
    # sequence models (port.ir.seqops)
    "embedding": ("port_embedding_forward",), "embedding.grad_weight": ("port_embedding_backward_weight",),
    "layer_norm": ("port_layernorm_forward",), "layer_norm.grad_input": ("port_layernorm_backward_input",),
    "layer_norm.grad_weight": ("port_layernorm_backward_weight",),
    "gelu": ("port_gelu_forward",), "gelu.grad_input": ("port_gelu_backward",),
    "tanh": ("port_tanh_forward",), "tanh.grad_input": ("port_tanh_backward",),
    "softmax": ("port_softmax_forward",), "softmax.grad_input": ("port_softmax_backward",),
    "scale": ("port_scale",), "scale.grad_input": ("port_scale",),
    "permute": ("port_permute",), "permute.grad_input": ("port_permute",),
    "matmul": ("port_bmm",), "matmul.grad_input": ("port_bmm",),
    "attention": ("port_attention_forward",), "attention.grad_input": ("port_attention_backward",),
    "add_bcast": ("port_add_broadcast",), "add_bcast.grad_input": ("port_sum_rows",),
    "mean_mid": ("port_mean_mid_forward",), "mean_mid.grad_input": ("port_mean_mid_backward",),
    "arange": ("port_arange_i64",), "ne_scalar": ("port_ne_scalar_i64",),
}
ATTENTION_KERNELS = ("attention", "attention.grad_input")
ATTN_ALGO = {"plain": 0, "tiled": 1}     # PORT_ATTN_PLAIN, PORT_ATTN_TILED
NO_CALL_KINDS = ("reshape", "reshape.grad_input", "add.grad_input")   # views: zero-copy, no kernel
CONV_KERNELS = ("conv2d", "conv2d.grad_input", "conv2d.grad_weight", "conv2d_bn_relu")
CONV_ALGO = {"plain": 1, "direct": 2, "fused": 0, "winograd": 3}   # PORT_CONV_IM2COL, _DIRECT, _AUTO, _WINOGRAD


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
    of a fused chain (the conv's fused call computes them), one otherwise."""
    if op.kind in NO_CALL_KINDS:
        return ()
    if variant == "fused" and op.kind != "conv2d":
        if V.fused_into(graph, op) is None:
            raise PlanError(f"op {op.name!r}: variant 'fused' without a fused chain")
        return ()
    attrs = dict(op.attrs)
    outs, ins, kernel = op.outputs, op.inputs, op.kind
    covers: tuple[int, ...] = ()
    if op.kind == "conv2d" and variant == "fused":
        chain = V.fusion_chain(graph, op)
        if chain is None:
            raise PlanError(f"op {op.name!r}: variant 'fused' is not legal here")
        bn, act = graph.ops[chain[1]], graph.ops[chain[2]]
        # outputs: y (relu), z (conv out), stats; read-modify-write: running mean/var
        outs = (act.outputs[0], op.outputs[0], bn.outputs[1], bn.inputs[3], bn.inputs[4])
        ins = (op.inputs[0], op.inputs[1], bn.inputs[1], bn.inputs[2], bn.inputs[3], bn.inputs[4])
        attrs.update(eps=bn.attr("eps"), momentum=bn.attr("momentum"))
        kernel, covers = "conv2d_bn_relu", chain[1:]
    elif op.kind == "batch_norm2d" and attrs.get("training"):
        outs = outs + (op.inputs[3], op.inputs[4])     # running statistics are updated
    elif variant == "inplace" and op.kind in ("batch_norm2d.grad_input", "batch_norm2d.grad_weight"):
        # the forward overwrote x with y: rebuild x-hat from y, gamma, beta
        bn = graph.ops[op.forward_op]
        y, gamma, beta = bn.outputs[0], bn.inputs[1], bn.inputs[2]
        if op.kind == "batch_norm2d.grad_input":
            kernel, ins = "batch_norm2d.grad_input_from_output", (op.inputs[0], y, bn.outputs[1], gamma, beta)
        else:
            kernel, ins = "batch_norm2d.grad_weight_from_output", (op.inputs[0], y, gamma, beta)
    elif may_overwrite(op.kind, backend, variant) and overwrites_gradients(graph, op):
        attrs["overwrite"] = True
    elif op.kind == "cross_entropy.grad_input":
        ins = ins + (GRAD_SCALE_ID,)
    elif op.kind == "matmul.grad_input":     # one batched GEMM per operand that needs a gradient
        gy, a, b = ins
        base = {k: v for k, v in attrs.items() if k != "grads"}
        return tuple(CallSpec(kernel, variant, backend, (g,), (gy, b if i == 0 else a),
                              tuple(sorted((base | {"operand": i}).items())))
                     for i, g in zip(attrs["grads"], outs))
    return (CallSpec(kernel, variant, backend, tuple(outs), tuple(ins), tuple(sorted(attrs.items())), covers),)


def may_overwrite(kernel: str, backend: str, variant: str) -> bool:
    """The calls that can carry attribute ``overwrite`` (port_conv2d_backward_weight_overwrite): the C backend's
    whole-tensor conv weight gradient; every other call accumulates into its gradients."""
    return kernel == "conv2d.grad_weight" and backend == "c" and not variant.startswith("patch")


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
def conv_geometry(kernel: str, in_shapes, out_shapes) -> tuple[tuple[int, ...], int]:
    """(x shape, C_out) of a conv call from its slot shapes."""
    if kernel in ("conv2d", "conv2d_bn_relu"):
        return tuple(in_shapes[0]), in_shapes[1][0]
    if kernel == "conv2d.grad_input":
        return tuple(out_shapes[0]), in_shapes[0][1]
    if kernel == "conv2d.grad_weight":
        return tuple(in_shapes[1]), in_shapes[0][1]
    raise KeyError(kernel)


def conv_params(capi, x_shape, c_out: int, attrs: dict):
    n, c, h, w = x_shape
    kh, kw = attrs["kernel"]
    sh, sw = attrs["stride"]
    ph, pw = attrs["padding"]
    return capi.Conv2dParams(n, c, h, w, c_out, kh, kw, sh, sw, ph, pw, attrs["groups"])


def attention_params(capi, kernel: str, attrs: dict, in_shapes):
    """port_attention_params of an attention call from its slot shapes (q is input 0 of the forward, 1 of the
    backward, whose input 0 is the output gradient)."""
    q = in_shapes[0] if kernel == "attention" else in_shapes[1]
    k = in_shapes[1] if kernel == "attention" else in_shapes[2]
    n, h, tq, d = q
    return capi.AttentionParams(n * h, h, tq, k[2], d, int(bool(attrs.get("causal"))), float(attrs["scale"]))


def workspace_bytes(kernel: str, variant: str, backend: str, attrs: dict, in_shapes, out_shapes) -> int:
    if backend == "c" and kernel in ATTENTION_KERNELS:
        from port.exec import capi
        p = attention_params(capi, kernel, attrs, in_shapes)
        return int(capi.raw.port_attention_workspace_bytes(ctypes.byref(p), ATTN_ALGO.get(variant, 0),
                                                           int(kernel != "attention")))
    if backend != "c" or kernel not in CONV_KERNELS:
        return 0
    from port.exec import capi
    x, co = conv_geometry(kernel, in_shapes, out_shapes)
    p = conv_params(capi, x, co, attrs)
    pr = ctypes.byref(p)
    tile = V.patch_tile_hw(variant, capi.raw.port_conv2d_out_h(pr), capi.raw.port_conv2d_out_w(pr))
    if tile is not None:
        return int(capi.raw.port_conv2d_patch_workspace_bytes(pr, *tile))
    return int(capi.raw.port_conv2d_workspace_bytes(pr, CONV_ALGO.get(variant, 0)))


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
            from port.exec import capi  # noqa: F401
        except Exception as e:  # noqa: BLE001 - ImportError, OSError from the loader
            return False, f"C kernels not built or not loadable ({type(e).__name__}: {e})"
        return True, ""
    return False, "modeled accelerator (not present on this machine)"


def dropout_seed(base_seed: int, counter: int, op: int) -> int:
    """Per-call dropout seed: a 64-bit mix of (run seed, forward-pass counter, op id) (splitmix64)."""
    z = (base_seed * 0x9E3779B97F4A7C15 + counter * 0xBF58476D1CE4E5B9 + op * 0x94D049BB133111EB + 1) \
        & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


# ---------------------------------------------------------------------------------------------
# the per-kernel shape rule: what every input and output of a call must look like, from its attributes and
# the shape of the tensor that fixes its geometry. port.lower.arena.check_program compares it with the
# program's slots (lowering runs that check on every program it emits); the C backend passes the output dims
# it implies to the kernels, which refuse others (port_conv2d_params / port_pool2d_params h_out, w_out).
# ---------------------------------------------------------------------------------------------
F32, I64, U8 = "float32", "int64", "uint8"
HOST_KERNELS = ("page_out", "page_in")
OPT_STATES = {"sgd": 0, "sgd_momentum": 1, "adamw": 2}


class CallShapeError(ValueError):
    """A call's attributes or tensors do not fit its kernel (the message says which and what was expected)."""


def _pair(attrs: dict, key: str, lo: int) -> tuple[int, int]:
    v = attrs.get(key)
    if (not isinstance(v, tuple) or len(v) != 2 or not all(type(x) is int for x in v)
            or not all(x >= lo for x in v)):
        raise CallShapeError(f"attribute {key}={v!r}: expected a pair of ints >= {lo}")
    return v


def _rank(shape, r: int, what: str) -> tuple[int, ...]:
    if shape is None or len(shape) != r:
        raise CallShapeError(f"{what} has shape {list(shape) if shape is not None else None}: expected {r} dims")
    return tuple(shape)


def conv_out_hw(x_shape, attrs: dict) -> tuple[int, int]:
    kh, kw = _pair(attrs, "kernel", 1)
    sh, sw = _pair(attrs, "stride", 1)
    ph, pw = _pair(attrs, "padding", 0)
    h, w = x_shape[2], x_shape[3]
    if h + 2 * ph < kh or w + 2 * pw < kw:
        raise CallShapeError(f"kernel {(kh, kw)} with padding {(ph, pw)} does not fit the input {h}x{w}")
    return (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1


def pool_out_hw(x_shape, attrs: dict) -> tuple[int, int]:
    kh, kw = _pair(attrs, "kernel", 1)
    ph, pw = _pair(attrs, "padding", 0)
    if 2 * ph > kh or 2 * pw > kw:
        raise CallShapeError(f"padding {(ph, pw)} exceeds half the kernel {(kh, kw)}")
    return conv_out_hw(x_shape, attrs)


def _grads(attrs: dict, shapes: dict) -> list:
    g = attrs.get("grads")
    order = list(shapes)      # outputs in parameter order (weight, bias): the only order lowering emits
    if not isinstance(g, tuple) or not g or any(n not in shapes for n in g) or \
            [order.index(n) for n in g] != sorted({order.index(n) for n in g}):
        raise CallShapeError(f"attribute grads={g!r}: expected distinct names among {order}, in that order")
    return [(shapes[n], F32) for n in g]


def _bn_scalars(attrs: dict) -> None:
    eps, mom = attrs.get("eps"), attrs.get("momentum")
    if not isinstance(eps, float) or not 0.0 < eps < float("inf"):
        raise CallShapeError(f"attribute eps={eps!r}: expected a finite float > 0")
    if not isinstance(mom, float) or not 0.0 <= mom <= 1.0:
        raise CallShapeError(f"attribute momentum={mom!r}: expected a float in [0, 1]")


def call_shapes(kernel: str, attrs: dict, in_shapes, out_shapes) -> tuple[list, list]:
    """Expected ``(shape, dtype)`` of every input and output of a call running ``kernel`` with ``attrs``,
    given its slots' shapes (one of which, e.g. the forward's x, fixes the geometry; the rest follow from it
    and the attributes). A shape of None means any. Raises CallShapeError on bad attributes or arity."""
    I, O = list(in_shapes), list(out_shapes)

    def at(lst, i, what):
        if i >= len(lst):
            raise CallShapeError(f"{what}: the call has only {len(lst)}")
        return lst[i]

    k = kernel

    def geometry(rank: int) -> tuple[tuple, int]:
        """(x shape, output channels/features) of a conv or linear call: the forward reads them from x and the
        weight, the input gradient from dx and the weight, the weight gradient from x and dy."""
        if "." not in k:
            return _rank(at(I, 0, "input 0 (x)"), rank, "x"), _rank(at(I, 1, "input 1 (weight)"), rank, "weight")[0]
        if k.endswith(".grad_input"):
            return _rank(at(O, 0, "output 0 (dx)"), rank, "dx"), _rank(at(I, 1, "input 1 (weight)"), rank, "weight")[0]
        return _rank(at(I, 1, "input 1 (x)"), rank, "x"), _rank(at(I, 0, "input 0 (dy)"), rank, "dy")[1]
    if k in ("conv2d", "conv2d_bn_relu", "conv2d.grad_input", "conv2d.grad_weight"):
        x, co = geometry(4)
        g = attrs.get("groups")
        if type(g) is not int or g < 1 or x[1] % g or co % g:
            raise CallShapeError(f"attribute groups={g!r}: expected an int >= 1 dividing C_in={x[1]} and "
                                 f"C_out={co}")
        kh, kw = _pair(attrs, "kernel", 1)
        ho, wo = conv_out_hw(x, attrs)
        w = ((co, x[1] // g, kh, kw), F32)
        y = ((x[0], co, ho, wo), F32)
        c = ((co,), F32)
        if k == "conv2d":
            return [(x, F32), w] + ([c] if attrs.get("bias") else []), [y]
        if k == "conv2d_bn_relu":
            _bn_scalars(attrs)
            return [(x, F32), w, c, c, c, c], [y, y, ((2, co), F32), c, c]
        if k == "conv2d.grad_input":
            return [y, w], [(x, F32)]
        return [y, (x, F32)], _grads(attrs, {"weight": w[0], "bias": (co,)})
    if k.startswith("batch_norm2d"):
        tr = bool(attrs.get("training"))
        if k == "batch_norm2d":
            x = _rank(at(I, 0, "input 0 (x)"), 4, "x")
        elif k in ("batch_norm2d.grad_input",) and not tr:
            x = _rank(at(O, 0, "output 0 (dx)"), 4, "dx")
        else:
            x = _rank(at(I, 1, "input 1 (x)"), 4, "x")
        _bn_scalars(attrs)
        X, c, st = (x, F32), ((x[1],), F32), ((2, x[1]), F32)
        if k == "batch_norm2d":
            return [X, c, c, c, c], ([X, st, c, c] if tr else [X])
        if k == "batch_norm2d.grad_input":
            return ([X, X, st, c] if tr else [X, c, c]), [X]
        if k == "batch_norm2d.grad_weight":
            return ([X, X, st] if tr else [X, X, c, c]), _grads(attrs, {"weight": c[0], "bias": c[0]})
        if k == "batch_norm2d.grad_input_from_output":
            return [X, X, st, c, c], [X]
        if k == "batch_norm2d.grad_weight_from_output":
            return [X, X, c, c], _grads(attrs, {"weight": c[0], "bias": c[0]})
    if k in ("relu", "relu6", "hardswish"):
        x = at(I, 0, "input 0 (x)")
        return [(x, F32)], [(x, F32)]
    if k in ("relu.grad_input", "relu6.grad_input", "hardswish.grad_input", "add", "grad_accumulate"):
        x = at(I, 0, "input 0")
        return [(x, F32), (x, F32)], [(x, F32)]
    if k == "dropout":
        x = at(I, 0, "input 0 (x)")
        p = attrs.get("p")
        if not isinstance(p, float) or not 0.0 <= p < 1.0:
            raise CallShapeError(f"attribute p={p!r}: expected a float in [0, 1)")
        return [(x, F32)], [(x, F32), (x, U8)]
    if k == "dropout.grad_input":
        x = at(I, 0, "input 0 (dy)")
        p = attrs.get("p")
        if not isinstance(p, float) or not 0.0 <= p < 1.0:
            raise CallShapeError(f"attribute p={p!r}: expected a float in [0, 1)")
        return [(x, F32), (x, U8)], [(x, F32)]
    if k in ("max_pool2d", "avg_pool2d", "max_pool2d.grad_input", "avg_pool2d.grad_input"):
        x = _rank(at(I, 0, "input 0 (x)") if "." not in k else at(O, 0, "output 0 (dx)"), 4, "x")
        _pair(attrs, "stride", 1)
        ho, wo = pool_out_hw(x, attrs)
        y = ((x[0], x[1], ho, wo), F32)
        idx = ((x[0], x[1], ho, wo), I64)
        if k == "max_pool2d":
            return [(x, F32)], [y, idx]
        if k == "avg_pool2d":
            return [(x, F32)], [y]
        if k == "max_pool2d.grad_input":
            return [y, idx], [(x, F32)]
        return [y], [(x, F32)]
    if k in ("global_avg_pool2d", "global_avg_pool2d.grad_input"):
        x = _rank(at(I, 0, "input 0 (x)") if "." not in k else at(O, 0, "output 0 (dx)"), 4, "x")
        y = ((x[0], x[1], 1, 1), F32)
        return ([(x, F32)], [y]) if "." not in k else ([y], [(x, F32)])
    if k in ("linear", "linear.grad_input", "linear.grad_weight"):
        xt = at(I, 0, "input 0 (x)") if k == "linear" else (at(O, 0, "output 0 (dx)") if k.endswith("input")
                                                              else at(I, 1, "input 1 (x)"))
        if xt is None or len(xt) < 2:
            raise CallShapeError(f"x has shape {list(xt) if xt is not None else None}: expected >= 2 dims")
        lead = tuple(xt[:-1])
        fo = (_rank(at(I, 1, "input 1 (weight)"), 2, "weight")[0] if k != "linear.grad_weight"
              else at(I, 0, "input 0 (dy)")[-1])
        x = (lead + (xt[-1],))
        w, y, b = ((fo, x[-1]), F32), (lead + (fo,), F32), ((fo,), F32)
        if k == "linear":
            return [(x, F32), w] + ([b] if attrs.get("bias") else []), [y]
        if k == "linear.grad_input":
            return [y, w], [(x, F32)]
        return [y, (x, F32)], _grads(attrs, {"weight": w[0], "bias": b[0]})
    if k in ("cross_entropy", "cross_entropy.grad_input"):
        z = at(I, 0, "input 0 (logits)")
        if z is None or len(z) != (3 if "ignore_index" in attrs else 2):
            raise CallShapeError(f"logits has shape {list(z) if z is not None else None}: expected "
                                 f"{3 if 'ignore_index' in attrs else 2} dims")
        ls = attrs.get("label_smoothing", 0.0)
        if not isinstance(ls, float) or not 0.0 <= ls <= 1.0:
            raise CallShapeError(f"attribute label_smoothing={ls!r}: expected a float in [0, 1]")
        if "ignore_index" in attrs and type(attrs["ignore_index"]) is not int:
            raise CallShapeError(f"attribute ignore_index={attrs['ignore_index']!r}: expected an int")
        Z, lab = (tuple(z), F32), (tuple(z[:-1]), I64)
        if k == "cross_entropy":
            return [Z, lab], [((), F32), Z]
        return [Z, lab, ((1,), F32)], [Z]
    if k == "update":
        opt = attrs.get("optimizer")
        if opt not in OPT_STATES:
            raise CallShapeError(f"attribute optimizer={opt!r}: expected one of {sorted(OPT_STATES)}")
        p = (at(I, 0, "input 0 (parameter)"), F32)
        n = OPT_STATES[opt]
        return [p] * (2 + n), [p] * (1 + n)
    if k in SEQ_KERNELS:
        return _seq_shapes(k, attrs, I, O, at)
    if k in TORCH_ONLY_KERNELS:      # the aten op itself checks its operands; the graph fixed their shapes
        if not isinstance(attrs.get("call"), str):
            raise CallShapeError(f"attribute call={attrs.get('call')!r}: expected the aten call as JSON")
        return [(s, None) for s in I], [(s, None) for s in O]
    if k == "page_out":
        x = at(I, 0, "input 0")
        return [(x, None)], []
    if k == "page_in":
        x = at(O, 0, "output 0")
        return [], [(x, None)]
    raise CallShapeError(f"unknown kernel {kernel!r}")


# ops that run PyTorch's own kernel and derivative (port.ir.capture): on the torch backends only
TORCH_ONLY_KERNELS = ("torch_op", "torch_op.grad_input", "torch_op.grad_weight")


def known_kernel(kernel: str, backend: str) -> bool:
    if backend == "host":
        return kernel in HOST_KERNELS
    if kernel in TORCH_ONLY_KERNELS:
        return backend in ("torch-cpu", "torch-cuda")
    return backend in BACKENDS and kernel in C_ENTRIES


def known_variant(kernel: str, variant: str, backend: str) -> bool:
    if not isinstance(variant, str):
        return False
    if variant.startswith("patch"):
        t = variant[5:]
        return backend == "c" and kernel in CONV_KERNELS and kernel != "conv2d_bn_relu" and t.isdigit() \
            and str(int(t)) == t and int(t) in V.PATCH_TILES
    if variant == "fused":
        return kernel == "conv2d_bn_relu"
    if kernel == "conv2d_bn_relu":
        return False
    if variant == "tiled":
        return kernel in ATTENTION_KERNELS and backend == "c"
    return variant in ("plain", "direct", "inplace", "winograd") and (variant not in ("direct", "winograd")
                                                                     or kernel in CONV_KERNELS)


def inplace_pairs(kernel: str, attrs: dict) -> tuple[tuple[int, int], ...]:
    """(output index, input index) pairs that must name the same tensor: read-modify-write arguments (the
    kernel writes the input's bytes: optimizer state, parameters, batch-norm running statistics)."""
    if kernel == "update":
        n = OPT_STATES.get(attrs.get("optimizer"), 0)
        return ((0, 0),) + tuple((1 + i, 2 + i) for i in range(n))
    if kernel == "batch_norm2d" and attrs.get("training"):
        return ((2, 3), (3, 4))
    if kernel == "conv2d_bn_relu":
        return ((3, 4), (4, 5))
    return ()


SEQ_KERNELS = ("embedding", "embedding.grad_weight", "layer_norm", "layer_norm.grad_input", "layer_norm.grad_weight",
               "gelu", "gelu.grad_input", "tanh", "tanh.grad_input", "softmax", "softmax.grad_input", "scale",
               "scale.grad_input", "permute", "permute.grad_input", "matmul", "matmul.grad_input", "attention",
               "attention.grad_input", "add_bcast", "add_bcast.grad_input", "mean_mid", "mean_mid.grad_input",
               "arange", "ne_scalar")


def _perm(attrs: dict, rank: int) -> tuple[int, ...]:
    p = attrs.get("perm")
    if not isinstance(p, tuple) or sorted(p) != list(range(rank)) or not 1 <= rank <= 6:
        raise CallShapeError(f"attribute perm={p!r}: expected a permutation of 0..{rank - 1} (rank <= 6)")
    return p


def _seq_shapes(k: str, attrs: dict, I, O, at) -> tuple[list, list]:
    """call_shapes of the sequence-model kernels (port.ir.seqops)."""
    if k == "embedding":
        idx, w = at(I, 0, "input 0 (idx)"), _rank(at(I, 1, "input 1 (weight)"), 2, "weight")
        return [(idx, I64), (w, F32)], [(tuple(idx) + (w[1],), F32)]
    if k == "embedding.grad_weight":
        dy, idx = at(I, 0, "input 0 (dy)"), at(I, 1, "input 1 (idx)")
        if tuple(dy[:-1]) != tuple(idx):
            raise CallShapeError(f"dy {list(dy)} does not match the indices {list(idx)}")
        return [(dy, F32), (idx, I64)], [(at(O, 0, "output 0 (dw)"), F32)]
    if k.startswith("layer_norm"):
        x = at(I, 0, "input 0 (x)") if k == "layer_norm" else at(I, 1, "input 1 (x)")
        eps = attrs.get("eps")
        if k == "layer_norm" and (not isinstance(eps, float) or not 0.0 < eps < float("inf")):
            raise CallShapeError(f"attribute eps={eps!r}: expected a finite float > 0")
        affine = attrs.get("affine", ())
        X, c, st = (tuple(x), F32), ((x[-1],), F32), ((2, numel(x[:-1])), F32)
        if k == "layer_norm":
            return [X] + [c] * len(affine), [X, st]
        if k == "layer_norm.grad_input":
            return [X, X, st] + ([c] if "weight" in affine else []), [X]
        return [X, X, st], _grads(attrs, {n: c[0] for n in affine})
    if k in ("gelu", "tanh", "softmax", "scale", "gelu.grad_input", "tanh.grad_input", "softmax.grad_input",
             "scale.grad_input"):
        x = at(I, 0, "input 0")
        if k in ("gelu", "gelu.grad_input") and attrs.get("approximate") not in ("none", "tanh"):
            raise CallShapeError(f"attribute approximate={attrs.get('approximate')!r}: expected 'none' or 'tanh'")
        if k.startswith("scale") and not isinstance(attrs.get("alpha"), float):
            raise CallShapeError(f"attribute alpha={attrs.get('alpha')!r}: expected a float")
        n_in = 2 if k.endswith("grad_input") and not k.startswith("scale") else 1
        return [(x, F32)] * n_in, [(x, F32)]
    if k in ("permute", "permute.grad_input"):
        x = at(I, 0, "input 0")
        p = _perm(attrs, len(x))
        if k == "permute":
            return [(x, F32)], [(tuple(x[i] for i in p), F32)]
        from port.ir.seqops import inverse_perm
        return [(x, F32)], [(tuple(x[i] for i in inverse_perm(p)), F32)]
    if k == "matmul":
        a, b = at(I, 0, "input 0 (a)"), at(I, 1, "input 1 (b)")
        if len(a) < 2 or len(a) != len(b) or tuple(a[:-2]) != tuple(b[:-2]) or a[-1] != b[-2]:
            raise CallShapeError(f"matmul of {list(a)} and {list(b)}: expected [B.., M, K] and [B.., K, N]")
        return [(a, F32), (b, F32)], [(tuple(a[:-1]) + (b[-1],), F32)]
    if k == "matmul.grad_input":
        gy, other = at(I, 0, "input 0 (dy)"), at(I, 1, "input 1 (the other operand)")
        op_i = attrs.get("operand")
        if op_i not in (0, 1) or len(gy) < 2 or len(other) != len(gy):
            raise CallShapeError(f"matmul gradient call: operand={op_i!r}, dy {list(gy)}, other {list(other)}")
        out = (tuple(gy[:-1]) + (other[-2],)) if op_i == 0 else (tuple(gy[:-2]) + (other[-1], gy[-1]))
        return [(gy, F32), (other, F32)], [(out, F32)]
    if k in ("attention", "attention.grad_input"):
        q = _rank(at(I, 0 if k == "attention" else 1, "q"), 4, "q")
        kk = _rank(at(I, 1 if k == "attention" else 2, "k"), 4, "k")
        if kk[:2] != q[:2] or kk[3] != q[3] or not isinstance(attrs.get("scale"), float):
            raise CallShapeError(f"attention of q {list(q)}, k {list(kk)} (scale={attrs.get('scale')!r})")
        Q, K_, lse = (q, F32), (kk, F32), ((q[0], q[1], q[2]), F32)
        mask = [((q[0], 1, 1, kk[2]), "bool")] if attrs.get("masked") else []
        if k == "attention":
            return [Q, K_, K_] + mask, [Q, lse]
        g = attrs.get("grads")
        if not isinstance(g, tuple) or not g or any(i not in (0, 1, 2) for i in g) or list(g) != sorted(set(g)):
            raise CallShapeError(f"attribute grads={g!r}: expected increasing operand indices among 0 (q), 1, 2")
        return [Q, Q, K_, K_, Q, lse] + mask, [(Q, K_, K_)[i] for i in g]
    if k == "add_bcast":
        a, b = at(I, 0, "input 0 (a)"), at(I, 1, "input 1 (b)")
        if not b or len(b) >= len(a) or tuple(a[len(a) - len(b):]) != tuple(b):
            raise CallShapeError(f"broadcast add of {list(a)} and {list(b)}: b must be a suffix of a")
        return [(a, F32), (b, F32)], [(a, F32)]
    if k == "add_bcast.grad_input":
        dy, db = at(I, 0, "input 0 (dy)"), at(O, 0, "output 0 (db)")
        if not db or len(db) >= len(dy) or tuple(dy[len(dy) - len(db):]) != tuple(db):
            raise CallShapeError(f"broadcast add gradient {list(db)} of {list(dy)}: expected a suffix")
        return [(dy, F32)], [(db, F32)]
    if k in ("mean_mid", "mean_mid.grad_input"):
        x = at(I, 0, "input 0 (x)") if k == "mean_mid" else at(O, 0, "output 0 (dx)")
        d = attrs.get("dim")
        if type(d) is not int or not 0 <= d < len(x) - 1:
            raise CallShapeError(f"attribute dim={d!r}: expected a non-last dim of {list(x)}")
        y = tuple(x[:d]) + tuple(x[d + 1:])
        return ([(x, F32)], [(y, F32)]) if k == "mean_mid" else ([(y, F32)], [(x, F32)])
    if k == "arange":
        y = _rank(at(O, 0, "output 0"), 1, "y")
        return [], [(y, I64)]
    if k == "ne_scalar":
        x = at(I, 0, "input 0")
        if type(attrs.get("value")) is not int:
            raise CallShapeError(f"attribute value={attrs.get('value')!r}: expected an int")
        return [(x, I64)], [(x, "bool")]
    raise CallShapeError(f"unknown kernel {k!r}")
