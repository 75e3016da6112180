"""dropout (``dropout``/``native_dropout`` in training with 0 < p < 1; at p = 0 or in eval a view): the mask is
drawn per call from a seed mixed from (run seed, forward-pass counter, op) (``dropout_seed``), saved as uint8
and read by the backward. Never recomputed (a re-run would draw another mask).
"""
from __future__ import annotations

from port.ir.types import ROLE_ACTIVATION, numel
from port.ops import register
from port.ops.base import F32, U8, Encoded, OpRecord, arg, float32, fwd, unit_float


def dropout_seed(base_seed: int, counter: int, op: int) -> int:
    """Per-call dropout seed: a 64-bit mix of (run seed, forward-pass counter, op id) (splitmix64)."""
    z = (base_seed * 0x9E3779B97F4A7C15 + counter * 0xBF58476D1CE4E5B9 + op * 0x94D049BB133111EB + 1) \
        & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def _capture(ctx):
    """native_dropout(x, p, train) -> (y, mask); dropout(x, p, train) -> y."""
    from port.ir import capture as C
    n = ctx.node
    x = ctx.t(n.args[0])
    p, train = float(arg(n, 1, "p")), arg(n, 2, "train", True)
    if not train or p == 0.0:
        if n.target._overloadpacket.__name__ == "native_dropout":
            ctx.multi[n.name] = {0: x}
            return None
        return ctx.alias(x)
    if not float32(ctx, x) or not 0.0 < p < 1.0:
        return False
    v = C.val_of(n)
    y = ctx.out(val=v[0] if isinstance(v, (tuple, list)) else v)
    mask = ctx.b.tensor(f"{ctx.opname}:mask", ctx.shape(y), U8, ROLE_ACTIVATION)
    if isinstance(v, (tuple, list)):
        ctx.multi[n.name] = {0: y}
    return fwd(ctx, "dropout", dict(p=p), (x,), (y, mask), 0, 2 * numel(ctx.shape(y)))


def _shapes(k, attrs, I, O, at):
    x = at(I, 0, "input 0 (x)" if k == "dropout" else "input 0 (dy)")
    unit_float(attrs, "p")
    if k == "dropout":
        return [(x, F32)], [(x, F32), (x, U8)]
    return [(x, F32), (x, U8)], [(x, F32)]


def _encode(kind, a, IS, OS, I, O, variant, call):
    if kind == "dropout":
        return Encoded("port_dropout_forward", (O[0], O[1], I[0]), (numel(OS[0]),), (float(a["p"]),), True)
    return Encoded("port_dropout_backward", (O[0], I[0], I[1]), (numel(OS[0]),), (float(a["p"]),))


def _torch(kind, a, I, O, env):
    torch = env.torch
    pr = float(a["p"])
    scale = 1.0 / (1.0 - pr)
    if kind == "dropout.grad_input":
        dy, m = I
        dx = O[0]

        def run():
            torch.mul(dy, m, out=dx)
            dx.mul_(scale)
        return run
    x = I[0]
    y, m = O
    st, op = env.state, env.op
    gen = torch.Generator(device=x.device)

    def run():
        gen.manual_seed(dropout_seed(st.seed, st.dropout_counter, op) & 0x7FFFFFFFFFFFFFFF)
        keep = torch.rand(x.shape, generator=gen, device=x.device) >= pr
        m.copy_(keep)
        torch.mul(x, keep, out=y)
        y.mul_(scale)
    return run


register(OpRecord(
    kind="dropout", family="random",
    kernels={"dropout": ("port_dropout_forward",), "dropout.grad_input": ("port_dropout_backward",)},
    shapes=_shapes, torch=_torch, encode=_encode, aten=("dropout", "native_dropout"), capture=_capture,
    saved=lambda f, gi, gw, w: (f.outputs[1],), grad_input_reads=lambda f: (f.outputs[1],),
    bwd_vector_flops=lambda f, T: numel(T[f.outputs[0]].shape), tags=frozenset({"not_recomputable"}), doc=__doc__))
