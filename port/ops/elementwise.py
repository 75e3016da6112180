"""Element-wise arithmetic: ``add`` of two same-shape tensors, ``add_bcast`` (the second operand's shape a
suffix of the first's: a bias over the last dims), ``scale`` (times or divided by a Python number) and
``grad_accumulate`` (the sum of two partial gradients, emitted by backward assembly).

Nothing is saved: add's input gradients are views of its output gradient (``add.grad_input``, no call); the
broadcast operand's gradient sums the output gradient over the leading dims.
"""
from __future__ import annotations

from port.ir.types import numel
from port.ops import register
from port.ops.base import F32, CallShapeError, Encoded, OpRecord, arg, float32, fwd, same_shape


# ---------------------------------------------------------------------------------------------
# add, add_bcast
# ---------------------------------------------------------------------------------------------
def _add_capture(ctx):
    n = ctx.node
    a, c = n.args[0], n.args[1]
    if not hasattr(a, "name") or not hasattr(c, "name") or arg(n, 2, "alpha", 1) != 1:
        return False
    ta, tc = ctx.t(a), ctx.t(c)
    if not float32(ctx, ta, tc):
        return False
    sa, sc = ctx.shape(ta), ctx.shape(tc)
    if sa == sc:
        return fwd(ctx, "add", {}, (ta, tc), (ctx.out(),), 0, numel(sa))
    if len(sc) > len(sa):
        ta, tc, sa, sc = tc, ta, sc, sa
    if sc and len(sc) < len(sa) and tuple(sa[len(sa) - len(sc):]) == tuple(sc):
        return fwd(ctx, "add_bcast", {}, (ta, tc), (ctx.out(),), 0, numel(sa))
    return False


def _add_backward(bc, f, fo, gy, xs_needing, trained):
    outs = [(x, bc.view_grad(x, gy)) for x in xs_needing]
    if outs:
        bc.op(f"{f.name}.grad_input", f.layer, "add.grad_input", {}, (gy,), tuple(g for _, g in outs),
              forward_op=fo.id)
        for x, g in outs:
            bc.contribute(x, g, f.layer)


def _add_bcast_backward(bc, f, fo, gy, xs_needing, trained):
    a, c = f.x
    if a in xs_needing:            # the full-shape operand: the output gradient itself (a view)
        g = bc.view_grad(a, gy)
        bc.op(f"{f.name}.grad_input", f.layer, "add.grad_input", {}, (gy,), (g,), forward_op=fo.id)
        bc.contribute(a, g, f.layer)
    if c in xs_needing:            # the broadcast operand: summed over the leading dims
        g = bc.new_grad(c, "")
        bc.op(f"{f.name}.grad_input", f.layer, "add_bcast.grad_input", {}, (gy,), (g,),
              vector_flops=numel(bc.T[f.outputs[0]].shape), forward_op=fo.id)
        bc.contribute(c, g, f.layer)


def _add_shapes(k, attrs, I, O, at):
    return same_shape(k, attrs, I, O, at, n_in=2)


def _add_encode(kind, a, IS, OS, I, O, variant, call):
    return Encoded("port_add", (O[0], I[0], I[1]), (numel(OS[0]),))


def _add_torch(kind, a, I, O, env):
    p, q = I
    y = O[0]
    return lambda: env.torch.add(p, q, out=y)


def _bcast_shapes(k, attrs, I, O, at):
    if k == "add_bcast":
        a, b = at(I, 0, "input 0 (a)"), at(I, 1, "input 1 (b)")
        if not b or len(b) >= len(a) or tuple(a[len(a) - len(b):]) != tuple(b):
            raise CallShapeError(f"broadcast add of {list(a)} and {list(b)}: b must be a suffix of a")
        return [(a, F32), (b, F32)], [(a, F32)]
    dy, db = at(I, 0, "input 0 (dy)"), at(O, 0, "output 0 (db)")
    if not db or len(db) >= len(dy) or tuple(dy[len(dy) - len(db):]) != tuple(db):
        raise CallShapeError(f"broadcast add gradient {list(db)} of {list(dy)}: expected a suffix")
    return [(dy, F32)], [(db, F32)]


def _bcast_encode(kind, a, IS, OS, I, O, variant, call):
    if kind == "add_bcast":
        return Encoded("port_add_broadcast", (O[0], I[0], I[1]), (numel(IS[0]) // numel(IS[1]), numel(IS[1])))
    return Encoded("port_sum_rows", (O[0], I[0]), (numel(IS[0]) // numel(OS[0]), numel(OS[0])))


def _bcast_torch(kind, a, I, O, env):
    if kind == "add_bcast":
        return lambda: env.torch.add(I[0], I[1], out=O[0])
    return lambda: O[0].copy_(I[0].reshape(-1, O[0].numel()).sum(0).view(O[0].shape))


# ---------------------------------------------------------------------------------------------
# scale
# ---------------------------------------------------------------------------------------------
def _scale_capture(ctx):
    n = ctx.node
    a, c = n.args[0], n.args[1]
    if not hasattr(a, "name") or hasattr(c, "name") or isinstance(c, bool) or not isinstance(c, (int, float)) \
            or n.kwargs.get("rounding_mode"):
        return False
    x = ctx.t(a)
    if not float32(ctx, x):
        return False
    alpha = float(c) if n.target._overloadpacket.__name__ == "mul" else 1.0 / float(c)
    y = ctx.out()
    return fwd(ctx, "scale", dict(alpha=alpha), (x,), (y,), 0, numel(ctx.shape(y)))


def _scale_shapes(k, attrs, I, O, at):
    if not isinstance(attrs.get("alpha"), float):
        raise CallShapeError(f"attribute alpha={attrs.get('alpha')!r}: expected a float")
    return same_shape(k, attrs, I, O, at, n_grad_in=1)


def _scale_encode(kind, a, IS, OS, I, O, variant, call):
    return Encoded("port_scale", (O[0], I[0]), (numel(IS[0]),), (float(a["alpha"]),))


def _scale_torch(kind, a, I, O, env):
    return lambda: env.torch.mul(I[0], float(a["alpha"]), out=O[0])


register(
    OpRecord(kind="add", family="elementwise", kernels={"add": ("port_add",), "add.grad_input": ()},
             shapes=_add_shapes, torch=_add_torch, encode=_add_encode, aten=("add",), capture=_add_capture,
             backward=_add_backward, views=("add.grad_input",),
             tags=frozenset({"inplace", "rerun_inplace", "checkpoint"}), doc=__doc__),
    OpRecord(kind="add_bcast", family="elementwise",
             kernels={"add_bcast": ("port_add_broadcast",), "add_bcast.grad_input": ("port_sum_rows",)},
             shapes=_bcast_shapes, torch=_bcast_torch, encode=_bcast_encode, aten=("add",), capture=_add_capture,
             backward=_add_bcast_backward, doc=__doc__),
    OpRecord(kind="grad_accumulate", family="elementwise", kernels={"grad_accumulate": ("port_add",)},
             shapes=_add_shapes, torch=_add_torch, encode=_add_encode, doc=__doc__),
    OpRecord(kind="scale", family="elementwise",
             kernels={"scale": ("port_scale",), "scale.grad_input": ("port_scale",)},
             shapes=_scale_shapes, torch=_scale_torch, encode=_scale_encode, aten=("mul", "div"),
             capture=_scale_capture, bwd_vector_flops=lambda f, T: numel(T[f.outputs[0]].shape), doc=__doc__),
)


# ---------------------------------------------------------------------------------------------
# mul, add_nd, sub, div: tensor op tensor with full broadcasting (squeeze-excitation gates, SwiGLU, layer scale)
# ---------------------------------------------------------------------------------------------
def broadcast_shape(a, b) -> tuple[int, ...] | None:
    """numpy/PyTorch broadcasting of two shapes; None when they do not broadcast."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y) if 1 not in (x, y) else x * y)
    return tuple(reversed(out))


# kind -> (aten packet, commutative, forward(torch, a, b, out), gradient of operand i from (dy, a, b, y), the
#          operands each operand's gradient reads)
_BINARY = {
    "mul": ("mul", True, lambda t, a, b, out: t.mul(a, b, out=out),
            (lambda dy, a, b: dy * b, lambda dy, a, b: dy * a), ((1,), (0,))),
    "add_nd": ("add", True, lambda t, a, b, out: t.add(a, b, out=out),
               (lambda dy, a, b: dy, lambda dy, a, b: dy), ((), ())),
    "sub": ("sub", False, lambda t, a, b, out: t.sub(a, b, out=out),
            (lambda dy, a, b: dy, lambda dy, a, b: -dy), ((), ())),
    "div": ("div", False, lambda t, a, b, out: t.div(a, b, out=out),
            (lambda dy, a, b: dy / b, lambda dy, a, b: -dy * a / (b * b)), ((1,), (0, 1))),
}


def collapse(sa, sb, sy) -> tuple[list[int], int, int]:
    """The C kernels' view of a broadcast (port_binary_params): the output's dims with size-1 dims dropped and
    neighbouring dims that broadcast alike merged, and the masks of the dims where a / b have size 1."""
    dims, masks = collapse_n(sy, sa, sb)
    return dims, masks[0], masks[1]


def collapse_n(sy, *shapes) -> tuple[list[int], list[int]]:
    """collapse() for any number of operands broadcast to ``sy``: the merged dims and one mask per operand."""
    r = len(sy)
    full = [(1,) * (r - len(s)) + tuple(s) for s in shapes]
    dims: list[int] = []
    flags: list[tuple[bool, ...]] = []
    for k, d in enumerate(sy):
        if d == 1:
            continue
        f = tuple(s[k] == 1 for s in full)
        if dims and flags[-1] == f:
            dims[-1] *= d
        else:
            dims.append(d)
            flags.append(f)
    if not dims:
        dims, flags = [1], [(False,) * len(shapes)]
    return dims, [sum(1 << i for i, f in enumerate(flags) if f[j]) for j in range(len(shapes))]


_MAX_RANK = 6      # PORT_BINARY_MAX_RANK: a broadcast of more merged dims stays on the torch engines


def _binary_capture(kind: str):
    packet, commutative = _BINARY[kind][:2]

    def rule(ctx):
        n = ctx.node
        a, c = n.args[0], n.args[1]
        if not hasattr(a, "name") or not hasattr(c, "name") \
                or arg(n, 2, "alpha", 1) != 1 or n.kwargs.get("rounding_mode") is not None:
            return False
        held = [ctx.is_param(v) or ctx.is_buffer(v) for v in (a, c)]
        if held[0] and (held[1] or not commutative):
            return False       # weight op weight, or a weight first in sub/div: a torch_op
        ta, tc = ctx.t(a), ctx.t(c)
        if not float32(ctx, ta, tc):
            return False
        y = ctx.out()
        if broadcast_shape(ctx.shape(ta), ctx.shape(tc)) != ctx.shape(y):
            return False
        r = len(collapse(ctx.shape(ta), ctx.shape(tc), ctx.shape(y))[0])
        attrs = {"bcast_rank": r} if r > _MAX_RANK else {}
        if held[0] or held[1]:      # x op gamma (layer scale, position embedding) or x op a buffer (a folded
            x, w = (tc, ta) if held[0] else (ta, tc)     # mask, rotary cos/sin: no gradient)
            if ctx.is_buffer(a if held[0] else c):
                return fwd(ctx, kind, attrs, (x,), (y,), 0, numel(ctx.shape(y)), buffers={"weight": w})
            return fwd(ctx, kind, attrs, (x,), (y,), 0, numel(ctx.shape(y)), params={"weight": w})
        return fwd(ctx, kind, attrs, (ta, tc), (y,), 0, numel(ctx.shape(y)))
    return rule


def _operands(f) -> tuple[int, int]:
    return tuple(f.x) + tuple(f.params.values()) + tuple(f.buffers.values())


def _binary_saved(f, gi, gw, wanted):
    reads = _BINARY[f.kind][4]
    ops_ = _operands(f)
    need = [i for i, t in enumerate(f.x) if t in wanted] + ([1] if gw else [])
    return tuple(dict.fromkeys(ops_[j] for i in need for j in reads[i]))


def _binary_backward(bc, f, fo, gy, xs_needing, trained):
    """``<kind>.grad_input``: the gradients of the activation operands that need one (each summed to its
    operand's shape, overwriting); ``<kind>.grad_weight``: a parameter operand's (accumulating). Attribute
    ``reads``: the operands (0: a, 1: b) the call reads after dy, in that order."""
    reads = _BINARY[f.kind][4]
    n = numel(bc.T[f.outputs[0]].shape)
    ops_ = _operands(f)
    need = tuple(i for i, t in enumerate(f.x) if t in xs_needing)
    w = f.params.get("weight")
    for kind, grads, idx in ((f"{f.kind}.grad_input", need, need),
                             (f"{f.kind}.grad_weight", ("weight",) if w is not None and w in trained else (), (1,))):
        if not grads:
            continue
        rd = tuple(sorted({j for i in idx for j in reads[i]}))
        outs = [(ops_[i], bc.new_grad(ops_[i], "")) for i in idx]
        extra = {"bcast_rank": f.attrs["bcast_rank"]} if "bcast_rank" in f.attrs else {}
        bc.op(f"{f.name}.{kind.split('.')[1]}", f.layer, kind, {"grads": grads, "reads": rd} | extra,
              (gy,) + tuple(ops_[j] for j in rd), tuple(g for _, g in outs), vector_flops=2 * n * len(idx),
              forward_op=fo.id)
        for t, g in outs:
            bc.contribute(t, g, f.layer)


# Rotary position embedding, x cos + rotate_half(x) sin (Llama's q and k), the fused variant of its mul -> narrow/neg
# /cat -> mul -> add chain (port.plan.variants.FUSIONS "rotary"): kernels of the mul record, emitted for the chain's
# calls only (never captured as an op)
ROTARY_KERNELS = {"rotary": ("port_rotary_forward",), "rotary.grad_input": ("port_rotary_backward",)}


def _rotary_shapes(k, attrs, I, O, at):
    """rotary: y from (x, cos, sin); rotary.grad_input: dx from (dy, cos, sin); x [n, heads, seq, d] (d even), the
    tables [1 or n, 1, seq, d]."""
    x = tuple(at(I, 0, "input 0 (x)" if k == "rotary" else "input 0 (dy)"))
    tab = tuple(at(I, 1, "input 1 (cos)"))
    if len(x) != 4 or x[3] % 2 or len(tab) != 4 or tab[0] not in (1, x[0]) or tab[1:] != (1,) + x[2:]:
        raise CallShapeError(f"{k} of {list(x)} with tables {list(tab)}: expected x [n, heads, seq, d] (d even) "
                             f"and tables [1 or n, 1, seq, d]")
    return [(x, F32), (tab, F32), (tab, F32)], [(x, F32)]


def _rotary_encode(kind, a, IS, OS, I, O, variant, call):
    n, heads, seq, d = IS[0]
    return Encoded("port_rotary_forward" if kind == "rotary" else "port_rotary_backward", (O[0], I[0], I[1], I[2]),
                   (n, heads, seq, d, IS[1][0]))


def _rotary_torch(kind, a, I, O, env):
    """The plain chain's operations in its order (the reference the C kernel matches)."""
    torch = env.torch
    x, c, s = I
    h = x.shape[-1] // 2
    if kind == "rotary":
        return lambda: torch.add(x * c, torch.cat((-x[..., h:], x[..., :h]), -1) * s, out=O[0])

    def grad():
        v = x * s
        O[0].copy_(x * c + torch.cat((v[..., h:], -v[..., :h]), -1))
    return grad


def _binary_shapes(k, attrs, I, O, at):
    if k in ROTARY_KERNELS:
        return _rotary_shapes(k, attrs, I, O, at)
    if "." not in k:
        a, b = at(I, 0, "input 0 (a)"), at(I, 1, "input 1 (b)")
        y = broadcast_shape(a, b)
        if y is None:
            raise CallShapeError(f"{k} of {list(a)} and {list(b)}: the shapes do not broadcast")
        return [(a, F32), (b, F32)], [(y, F32)]
    g, rd = attrs.get("grads"), attrs.get("reads")
    if k.endswith(".grad_weight"):
        ok = g == ("weight",)
    else:
        ok = isinstance(g, tuple) and g and all(i in (0, 1) for i in g) and list(g) == sorted(set(g))
    if not ok or not isinstance(rd, tuple) or any(i not in (0, 1) for i in rd) or list(rd) != sorted(set(rd)):
        raise CallShapeError(f"attributes grads={g!r}, reads={rd!r}: expected operand indices among 0, 1 "
                             f"('weight' for a weight gradient)")
    dy = tuple(at(I, 0, "input 0 (dy)"))
    ins = [(dy, F32)] + [(at(I, 1 + j, f"input {1 + j}"), F32) for j in range(len(rd))]
    outs = [(at(O, j, f"output {j}"), F32) for j in range(len(g))]
    for s_, _ in ins[1:] + outs:
        if broadcast_shape(s_, dy) != dy:
            raise CallShapeError(f"{k}: {list(s_)} does not broadcast to dy {list(dy)}")
    return ins, outs


def _binary_encode(kind, a, IS, OS, I, O, variant, call):
    """port_binary_forward (y, a, b) / port_binary_backward (da, db, dy, a, b; NULL where not wanted or not
    read; weight gradients accumulate). An operand the call neither reads nor writes takes the output's shape."""
    from port.exec.capi import BINARY_OPS
    if kind in ROTARY_KERNELS:
        return _rotary_encode(kind, a, IS, OS, I, O, variant, call)
    base = kind.split(".")[0]
    if "." not in kind:
        dims, am, bm = collapse(IS[0], IS[1], OS[0])
        return Encoded("port_binary_forward", (O[0], I[0], I[1]),
                       (BINARY_OPS[base], len(dims), am, bm, *dims, *[1] * (_MAX_RANK - len(dims))))
    wgrad = kind.endswith(".grad_weight")
    idx, rd = ((1,) if wgrad else tuple(a["grads"])), tuple(a["reads"])
    sy = tuple(IS[0])
    shape = {i: tuple(IS[1 + j]) for j, i in enumerate(rd)} | {i: tuple(OS[j]) for j, i in enumerate(idx)}
    dims, am, bm = collapse(shape.get(0, sy), shape.get(1, sy), sy)
    ptr = lambda seq, pos, i: seq[pos.index(i)] if i in pos else None  # noqa: E731
    return Encoded("port_binary_backward",
                   (ptr(O, idx, 0), ptr(O, idx, 1), I[0], ptr(I[1:], rd, 0), ptr(I[1:], rd, 1)),
                   (BINARY_OPS[base], len(dims), am, bm, *dims, *[1] * (_MAX_RANK - len(dims)), int(wgrad)))


def _binary_torch(kind, a, I, O, env):
    if kind in ROTARY_KERNELS:
        return _rotary_torch(kind, a, I, O, env)
    torch = env.torch
    base = kind.split(".")[0]
    fwd_, dfn = _BINARY[base][2], _BINARY[base][3]
    if "." not in kind:
        return lambda: fwd_(torch, I[0], I[1], O[0])
    dy = I[0]
    got = dict(zip(a["reads"], I[1:]))
    idx = (1,) if kind.endswith(".grad_weight") else a["grads"]
    acc = kind.endswith(".grad_weight")      # weight gradients accumulate, input gradients overwrite

    def run():
        for i, d in zip(idx, O):
            p = dfn[i](dy, got.get(0), got.get(1))
            p = p if p.shape == d.shape else p.sum_to_size(d.shape)
            d.add_(p) if acc else d.copy_(p)
    return run


register(*(OpRecord(
    kind=k, family="elementwise",
    kernels={k: ("port_binary_forward",), f"{k}.grad_input": ("port_binary_backward",),
             f"{k}.grad_weight": ("port_binary_backward",)} | (ROTARY_KERNELS if k == "mul" else {}),
    shapes=_binary_shapes, torch=_binary_torch, encode=_binary_encode, aten=(v[0],), capture=_binary_capture(k),
    saved=_binary_saved, backward=_binary_backward, tags=frozenset({"checkpoint"}),
    c_supports=lambda a: a.get("bcast_rank", 0) <= _MAX_RANK,
    doc=f"{k}: {v[0]} of two tensors with full broadcasting (either operand may be a parameter"
        f"{'' if v[1] else ' in second place'}: layer scale, position embeddings; it is then ``weight``); each "
        f"gradient summed to its operand's shape; saves the operands its gradients read. C kernels "
        f"port_binary_forward/backward (up to {_MAX_RANK} merged dims; more stay on PyTorch's kernels).")
    for k, v in _BINARY.items()))


# ---------------------------------------------------------------------------------------------
# unary math (RMSNorm's pow, rsqrt and eps shift; rotary embeddings' cos, sin, neg; exp): one C kernel, an op enum
# ---------------------------------------------------------------------------------------------
# kind -> (aten packet, saves: "x" | "y" | "", forward(torch, x, out, attrs), dx from (dy, saved, attrs), vector
#          FLOPs per element forward, backward)
_UNARY = {
    "neg": ("neg", "", lambda t, x, out, a: t.neg(x, out=out), lambda dy, s, a: -dy, 1, 1),
    "rsqrt": ("rsqrt", "y", lambda t, x, out, a: t.rsqrt(x, out=out), lambda dy, y, a: dy * y.pow(3) * -0.5, 2, 3),
    "exp": ("exp", "y", lambda t, x, out, a: t.exp(x, out=out), lambda dy, y, a: dy * y, 4, 1),
    "cos": ("cos", "x", lambda t, x, out, a: t.cos(x, out=out), lambda dy, x, a: -dy * x.sin(), 4, 5),
    "sin": ("sin", "x", lambda t, x, out, a: t.sin(x, out=out), lambda dy, x, a: dy * x.cos(), 4, 5),
    "pow_scalar": ("pow", "x", lambda t, x, out, a: t.pow(x, a["exponent"], out=out),
                   lambda dy, x, a: dy * a["exponent"] * x.pow(a["exponent"] - 1.0), 2, 3),
    "abs": ("abs", "x", lambda t, x, out, a: t.abs(x, out=out), lambda dy, x, a: dy * x.sign(), 1, 2),
    "shift": ("add", "", lambda t, x, out, a: t.add(x, a["value"], out=out), lambda dy, s, a: dy, 1, 0),
}


def _unary_capture(kind: str):
    packet, _, _, _, vf, _ = _UNARY[kind]

    def rule(ctx):
        n = ctx.node
        xa = n.args[0]
        if not hasattr(xa, "name") or ctx.is_param(xa) or ctx.is_buffer(xa):
            return False
        x = ctx.t(xa)
        if not float32(ctx, x):
            return False
        attrs: dict = {}
        if kind == "pow_scalar":
            e = n.args[1]
            if hasattr(e, "name") or isinstance(e, bool) or not isinstance(e, (int, float)):
                return False
            attrs["exponent"] = float(e)
        elif kind == "shift":          # x + c, x - c (aten add/sub with a Python number)
            c = n.args[1]
            if hasattr(c, "name") or isinstance(c, bool) or not isinstance(c, (int, float)):
                return False
            sign = -1.0 if n.target._overloadpacket.__name__ == "sub" else 1.0
            attrs["value"] = sign * float(c) * float(arg(n, 2, "alpha", 1))
        y = ctx.out()
        return fwd(ctx, kind, attrs, (x,), (y,), 0, vf * numel(ctx.shape(y)))
    return rule


def _unary_shapes(k, attrs, I, O, at):
    base = k.split(".")[0]
    for key in {"pow_scalar": ("exponent",), "shift": ("value",)}.get(base, ()):
        v = attrs.get(key)
        if not isinstance(v, float) or v != v or v in (float("inf"), float("-inf")):
            raise CallShapeError(f"attribute {key}={v!r}: expected a finite float")
    return same_shape(k, attrs, I, O, at, n_grad_in=2 if _UNARY[base][1] else 1)


def _unary_torch(kind, a, I, O, env):
    torch = env.torch
    base = kind.split(".")[0]
    _, saves, fwd_, dfn, _, _ = _UNARY[base]
    if "." not in kind:
        return lambda: fwd_(torch, I[0], O[0], a)
    dy, s = I[0], (I[1] if saves else None)
    dx = O[0]
    return lambda: dx.copy_(dfn(dy, s, a))


def _unary_encode(kind, a, IS, OS, I, O, variant, call):
    """port_unary_forward (y, x) / port_unary_backward (dx, dy, saved x or y; NULL where the op reads neither):
    count, op; the scalar (pow's exponent, shift's constant) as fv[0]."""
    from port.exec.capi import UNARY_OPS
    base = kind.split(".")[0]
    iv, fv = (numel(IS[0]), UNARY_OPS[base]), (float(a.get("exponent", a.get("value", 0.0))),)
    if "." not in kind:
        return Encoded("port_unary_forward", (O[0], I[0]), iv, fv)
    return Encoded("port_unary_backward", (O[0], I[0], I[1] if _UNARY[base][1] else None), iv, fv)


def _unary_c_supports(a: dict) -> bool:
    """The C kernels take the scalar as a float32: a finite one that float32 holds (else PyTorch's kernels)."""
    import struct
    v = a.get("exponent", a.get("value", 0.0))
    try:
        return struct.unpack("f", struct.pack("f", v))[0] not in (float("inf"), float("-inf"))
    except OverflowError:
        return False


def _unary_keep(kind: str):
    saves = _UNARY[kind][1]
    return (lambda f: (f.outputs[0],)) if saves == "y" else (lambda f: (f.x[0],)) if saves == "x" else \
        (lambda f: ())


register(*(OpRecord(
    kind=k, family="elementwise", kernels={k: ("port_unary_forward",), f"{k}.grad_input": ("port_unary_backward",)},
    shapes=_unary_shapes, torch=_unary_torch, encode=_unary_encode, c_supports=_unary_c_supports,
    aten=(v[0],) + (("sub",) if k == "shift" else ()), capture=_unary_capture(k),
    saved=(lambda keep: lambda f, gi, gw, wanted: keep(f))(_unary_keep(k)), grad_input_reads=_unary_keep(k),
    bwd_vector_flops=(lambda m: lambda f, T: m * numel(T[f.outputs[0]].shape))(v[5]), tags=frozenset({"checkpoint"}),
    doc=f"{k}: element-wise ({v[0]}{', with a Python number' if k in ('pow_scalar', 'shift') else ''}); saves "
        f"{({'x': 'its input', 'y': 'its output'}).get(v[1], 'nothing')}. C kernels port_unary_forward/backward (op "
        f"{k}).")
    for k, v in _UNARY.items()))
