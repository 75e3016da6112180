"""Activations: element-wise relu, relu6 (``hardtanh(0, 6)``), hardswish, gelu (exact or tanh), tanh, sigmoid,
hardsigmoid, silu, and the softmax over the last dim.

Saved (autograd's choice): relu, tanh, sigmoid and softmax their output; relu6, hardswish, gelu, hardsigmoid and
silu their input. relu and relu6 have an ``inplace`` forward; the input gradients of relu, relu6, gelu, tanh,
sigmoid, hardsigmoid and silu may write dx over dy.
"""
from __future__ import annotations

from port.ir.types import numel
from port.ops import register
from port.ops.base import F32, CallShapeError, Encoded, OpRecord, arg, float32, fwd, same_shape


def unary_capture(kind: str, vf: int, **attrs):
    """The capture rule of an element-wise float32 op of one input (``vf`` vector FLOPs per element)."""
    def rule(ctx):
        x = ctx.t(ctx.node.args[0])
        if not float32(ctx, x):
            return False
        y = ctx.out()
        return fwd(ctx, kind, dict(attrs), (x,), (y,), 0, vf * numel(ctx.shape(y)))
    return rule


def _hardtanh(ctx):
    n = ctx.node
    if (float(arg(n, 1, "min_val", -1.0)), float(arg(n, 2, "max_val", 1.0))) != (0.0, 6.0):
        return False
    return unary_capture("relu6", 1)(ctx)


def _relu6(ctx):
    if ctx.node.target._overloadpacket.__name__ == "hardtanh":
        return _hardtanh(ctx)
    return unary_capture("relu6", 1)(ctx)


def _gelu(ctx):
    n = ctx.node
    x = ctx.t(n.args[0])
    approx = n.kwargs.get("approximate", "none")
    if approx not in ("none", "tanh") or not float32(ctx, x):
        return False
    y = ctx.out()
    return fwd(ctx, "gelu", dict(approximate=approx), (x,), (y,), 0, 8 * numel(ctx.shape(y)))


def _softmax(ctx):
    n = ctx.node
    x = ctx.t(n.args[0])
    d = n.args[1]
    packet = n.target._overloadpacket.__name__
    if d % len(ctx.shape(x)) != len(ctx.shape(x)) - 1 or not float32(ctx, x) or \
            (packet == "_softmax" and n.args[2]) or n.kwargs.get("dtype") is not None \
            or (len(n.args) > 2 and packet == "softmax" and n.args[2] is not None):
        return False
    y = ctx.out()
    return fwd(ctx, "softmax", {}, (x,), (y,), 0, 4 * numel(ctx.shape(y)))


def _gelu_shapes(k, attrs, I, O, at):
    if attrs.get("approximate") not in ("none", "tanh"):
        raise CallShapeError(f"attribute approximate={attrs.get('approximate')!r}: expected 'none' or 'tanh'")
    return same_shape(k, attrs, I, O, at)


def _rows(shape):
    return numel(shape) // shape[-1], shape[-1]


_C = {  # kind -> (forward entry, backward entry, extra int parameter from the attributes)
    "relu": ("port_relu_forward", "port_relu_backward"),
    "relu6": ("port_relu6_forward", "port_relu6_backward"),
    "hardswish": ("port_hardswish_forward", "port_hardswish_backward"),
    "tanh": ("port_tanh_forward", "port_tanh_backward"),
    "gelu": ("port_gelu_forward", "port_gelu_backward"),
    "softmax": ("port_softmax_forward", "port_softmax_backward"),
    "sigmoid": ("port_sigmoid_forward", "port_sigmoid_backward"),
    "hardsigmoid": ("port_hardsigmoid_forward", "port_hardsigmoid_backward"),
    "silu": ("port_silu_forward", "port_silu_backward"),
}


# SwiGLU, silu(a) * b (Llama's MLP), the fused variant of a silu -> mul chain (port.plan.variants.FUSIONS
# "swiglu"): kernels of the silu record, emitted for the chain's calls only (never captured as an op)
SWIGLU_KERNELS = {"swiglu": ("port_swiglu_forward",), "swiglu.grad_input": ("port_swiglu_backward",)}


def _swiglu_shapes(k, attrs, I, O, at):
    """swiglu: y from (a, b); swiglu.grad_input: (da, db) from (dy, a, b); every operand a's shape."""
    if k == "swiglu":
        a = at(I, 0, "input 0 (a)")
        return [(a, F32), (a, F32)], [(a, F32)]
    dy = at(I, 0, "input 0 (dy)")
    return [(dy, F32)] * 3, [(dy, F32)] * 2


def _shapes(k, attrs, I, O, at):
    if k in SWIGLU_KERNELS:
        return _swiglu_shapes(k, attrs, I, O, at)
    if k.startswith("gelu"):
        return _gelu_shapes(k, attrs, I, O, at)
    return same_shape(k, attrs, I, O, at)


def _encode(kind, a, IS, OS, I, O, variant, call):
    if kind == "swiglu":
        return Encoded("port_swiglu_forward", (O[0], I[0], I[1]), (numel(OS[0]),))
    if kind == "swiglu.grad_input":
        return Encoded("port_swiglu_backward", (O[0], O[1], I[0], I[1], I[2]), (numel(IS[0]),))
    base = kind.split(".")[0]
    entry = _C[base][0 if kind == base else 1]
    ptrs = (O[0], I[0]) if kind == base else (O[0], I[0], I[1])
    if base == "softmax":
        return Encoded(entry, ptrs, _rows(IS[0]))
    if base == "gelu":
        return Encoded(entry, ptrs, (numel(IS[0]), int(a["approximate"] == "tanh")))
    return Encoded(entry, ptrs, (numel(OS[0]),))


def _torch(kind, a, I, O, env):
    torch, F, aten = env.torch, env.F, env.aten
    if kind == "relu":
        x, y = I[0], O[0]
        return lambda: torch.clamp(x, min=0.0, out=y)
    if kind == "relu6":
        x, y = I[0], O[0]
        return lambda: torch.clamp(x, 0.0, 6.0, out=y)
    if kind == "hardswish":
        x, y = I[0], O[0]
        return lambda: y.copy_(F.hardswish(x))
    if kind == "gelu":
        return lambda: O[0].copy_(F.gelu(I[0], approximate=a["approximate"]))
    if kind == "tanh":
        return lambda: torch.tanh(I[0], out=O[0])
    if kind == "softmax":
        return lambda: torch.softmax(I[0], -1, out=O[0])
    if kind == "sigmoid":
        return lambda: torch.sigmoid(I[0], out=O[0])
    if kind == "hardsigmoid":
        return lambda: aten.hardsigmoid.out(I[0], out=O[0])
    if kind == "silu":
        return lambda: aten.silu.out(I[0], out=O[0])
    if kind == "swiglu":
        return lambda: torch.mul(F.silu(I[0]), I[1], out=O[0])
    if kind == "swiglu.grad_input":
        def swiglu_grad():
            g = I[0] * I[2]
            O[1].copy_(I[0] * F.silu(I[1]))
            aten.silu_backward.grad_input(g, I[1], grad_input=O[0])
        return swiglu_grad
    dy, s = I
    dx = O[0]
    if kind == "relu.grad_input":
        return lambda: aten.threshold_backward.grad_input(dy, s, 0.0, grad_input=dx)
    if kind == "relu6.grad_input":
        return lambda: aten.hardtanh_backward.grad_input(dy, s, 0.0, 6.0, grad_input=dx)
    if kind == "hardswish.grad_input":
        return lambda: aten.hardswish_backward.out(dy, s, out=dx)
    if kind == "gelu.grad_input":
        return lambda: aten.gelu_backward.grad_input(dy, s, approximate=a["approximate"], grad_input=dx)
    if kind == "tanh.grad_input":
        return lambda: aten.tanh_backward.grad_input(dy, s, grad_input=dx)
    if kind == "softmax.grad_input":
        return lambda: aten._softmax_backward_data.out(dy, s, -1, dy.dtype, grad_input=dx)
    if kind == "sigmoid.grad_input":
        return lambda: aten.sigmoid_backward.grad_input(dy, s, grad_input=dx)
    if kind == "hardsigmoid.grad_input":
        return lambda: aten.hardsigmoid_backward.grad_input(dy, s, grad_input=dx)
    if kind == "silu.grad_input":
        return lambda: aten.silu_backward.grad_input(dy, s, grad_input=dx)
    return None


def _record(kind: str, aten: tuple, capture, saves_output: bool, bwd_vf: int, tags=(), shapes=same_shape,
            extra_kernels=None):
    keep = (lambda f: (f.outputs[0],)) if saves_output else (lambda f: (f.x[0],))
    return OpRecord(
        kind=kind, family="activation",
        kernels={kind: (_C[kind][0],), f"{kind}.grad_input": (_C[kind][1],)} | dict(extra_kernels or {}),
        shapes=shapes, torch=_torch, encode=_encode, aten=aten, capture=capture,
        saved=lambda f, gi, gw, wanted: keep(f), grad_input_reads=keep,
        bwd_vector_flops=lambda f, T: bwd_vf * numel(T[f.outputs[0]].shape), tags=frozenset(tags), doc=__doc__)


register(
    _record("relu", ("relu",), unary_capture("relu", 1), True, 1,
            ("inplace", "rerun_inplace", "backward_inplace", "checkpoint")),
    _record("relu6", ("relu6", "hardtanh"), _relu6, False, 2,
            ("inplace", "rerun_inplace", "backward_inplace", "checkpoint")),
    _record("hardswish", ("hardswish",), unary_capture("hardswish", 4), False, 4, ("checkpoint",)),
    _record("gelu", ("gelu",), _gelu, False, 10, ("backward_inplace",), shapes=_gelu_shapes),
    _record("tanh", ("tanh",), unary_capture("tanh", 4), True, 2, ("backward_inplace",)),
    _record("softmax", ("softmax", "_softmax"), _softmax, True, 3),
    _record("sigmoid", ("sigmoid",), unary_capture("sigmoid", 4), True, 2, ("checkpoint", "backward_inplace")),
    _record("hardsigmoid", ("hardsigmoid",), unary_capture("hardsigmoid", 2), False, 1,
            ("checkpoint", "backward_inplace")),
    _record("silu", ("silu",), unary_capture("silu", 5), False, 6, ("checkpoint", "backward_inplace"),
            shapes=_shapes, extra_kernels=SWIGLU_KERNELS),
)
