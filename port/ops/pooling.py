"""Pooling and means: max_pool2d (dilation, ceil_mode; saves its argmax indices), avg_pool2d (ceil_mode,
count_include_pad; no divisor_override),
global_avg_pool2d (adaptive average pooling to 1x1, or the mean over dims 2 and 3, then a view to the node's
shape) and mean_mid (the mean over one dim that is not the last).
"""
from __future__ import annotations

from port.ir.types import ROLE_ACTIVATION, numel
from port.ops import register
from port.ops.base import F32, I64, CallShapeError, Encoded, OpRecord, arg, attr_pair, float32, fwd, pair, rank


def _pool_args(ctx):
    """(x, kernel, stride, padding) of an aten pool call, or None where PORT's pool kernels do not apply (not a
    float32 [N, C, H, W] input, or padding over half the kernel)."""
    n = ctx.node
    x = ctx.t(n.args[0])
    k = pair(n.args[1])
    s = pair(arg(n, 2, "stride", []) or k)
    p = pair(arg(n, 3, "padding", 0))
    if len(ctx.shape(x)) != 4 or 2 * p[0] > k[0] or 2 * p[1] > k[1] or not float32(ctx, x):
        return None
    return x, k, s, p


def _max_capture(ctx):
    """max_pool2d, with dilation and ceil_mode (attributes only when not the defaults)."""
    n, a = ctx.node, _pool_args(ctx)
    if a is None:
        return False
    x, k, s, p = a
    dil, ceil = pair(arg(n, 4, "dilation", 1)), bool(arg(n, 5, "ceil_mode", False))
    y = ctx.out()
    idx = ctx.b.tensor(f"{ctx.opname}:indices", ctx.shape(y), I64, ROLE_ACTIVATION)
    attrs = dict(kernel=k, stride=s, padding=p) | ({"dilation": dil} if dil != (1, 1) else {}) \
        | ({"ceil_mode": True} if ceil else {})
    return fwd(ctx, "max_pool2d", attrs, (x,), (y, idx), 0, numel(ctx.shape(y)) * k[0] * k[1])


def _avg_capture(ctx):
    """avg_pool2d, with ceil_mode and count_include_pad (attributes only when not the defaults); a divisor_override
    stays torch's."""
    n, a = ctx.node, _pool_args(ctx)
    if a is None or arg(n, 6, "divisor_override") is not None:
        return False
    x, k, s, p = a
    ceil, include = bool(arg(n, 4, "ceil_mode", False)), bool(arg(n, 5, "count_include_pad", True))
    y = ctx.out()
    attrs = dict(kernel=k, stride=s, padding=p) | ({"ceil_mode": True} if ceil else {}) \
        | ({"count_include_pad": False} if not include else {})
    return fwd(ctx, "avg_pool2d", attrs, (x,), (y,), 0, numel(ctx.shape(y)) * k[0] * k[1])


def pool_out_hw(x_shape, attrs: dict) -> tuple[int, int]:
    """Output rows and columns of a pool: PyTorch's rule, with ``dilation`` and ``ceil_mode`` (a last window
    must start inside the input or its left padding)."""
    kh, kw = attr_pair(attrs, "kernel", 1)
    sh, sw = attr_pair(attrs, "stride", 1)
    ph, pw = attr_pair(attrs, "padding", 0)
    dh, dw = 1, 1
    if "dilation" in attrs:
        dh, dw = attr_pair(attrs, "dilation", 1)
    ceil = attrs.get("ceil_mode", False)
    if not isinstance(ceil, bool):
        raise CallShapeError(f"attribute ceil_mode={ceil!r}: expected a bool")
    if 2 * ph > kh or 2 * pw > kw:
        raise CallShapeError(f"padding {(ph, pw)} exceeds half the kernel {(kh, kw)}")

    def out(size, k, s, p, d):
        span = size + 2 * p - d * (k - 1) - 1
        if span < 0:
            raise CallShapeError(f"kernel {(kh, kw)} (dilation {(dh, dw)}) with padding {(ph, pw)} does not fit the "
                                 f"input {x_shape[2]}x{x_shape[3]}")
        o = -(-span // s) + 1 if ceil else span // s + 1
        if ceil and (o - 1) * s >= size + p:
            o -= 1
        return o
    return out(x_shape[2], kh, sh, ph, dh), out(x_shape[3], kw, sw, pw, dw)


def _pool_shapes(k, attrs, I, O, at):
    x = rank(at(I, 0, "input 0 (x)") if "." not in k else at(O, 0, "output 0 (dx)"), 4, "x")
    attr_pair(attrs, "stride", 1)
    cip = attrs.get("count_include_pad")
    if cip is not None and (cip is not False or not k.startswith("avg_pool2d")):
        raise CallShapeError(f"attribute count_include_pad={cip!r}: an average pool's False (True is the default, "
                             f"not written)")
    if k.startswith("avg_pool2d") and "dilation" in attrs:
        raise CallShapeError(f"attribute dilation={attrs['dilation']!r}: average pools take none")
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


def _pool_encode(kind, a, IS, OS, I, O, variant, call):
    n, c, h, w = IS[0] if "." not in kind else OS[0]
    y_shape = OS[0] if "." not in kind else IS[0]
    iv = (n, c, h, w, *a["kernel"], *a["stride"], *a["padding"], y_shape[2], y_shape[3])
    mp = (*a.get("dilation", (1, 1)), int(bool(a.get("ceil_mode", False))))   # max pools: dilation, ceil_mode
    if kind == "max_pool2d":
        return Encoded("port_maxpool2d_forward", (O[0], O[1], I[0]), iv + mp)
    if kind == "max_pool2d.grad_input":
        return Encoded("port_maxpool2d_backward_input", (O[0], I[0], I[1]), iv + mp)
    # average pools: no dilation, ceil_mode, exclude_pad (count_include_pad=False); none past the defaults' 12 ints
    ap = (0, 0, int(bool(a.get("ceil_mode", False))), int(not a.get("count_include_pad", True)))
    ap = ap if any(ap) else ()
    if kind == "avg_pool2d":
        return Encoded("port_avgpool2d_forward", (O[0], I[0]), iv + ap)
    return Encoded("port_avgpool2d_backward_input", (O[0], I[0]), iv + ap)


def _pool_torch(kind, a, I, O, env):
    aten = env.aten
    k, s, p = list(a["kernel"]), list(a["stride"]), list(a["padding"])
    dil, ceil = list(a.get("dilation", (1, 1))), bool(a.get("ceil_mode", False))
    if kind == "max_pool2d":
        x = I[0]
        y, idx = O
        return lambda: aten.max_pool2d_with_indices.out(x, k, s, p, dil, ceil, out=y, indices=idx)   # into the arena
    if kind == "max_pool2d.grad_input":
        dy, idx = I
        dx = O[0]
        return lambda: aten.max_pool2d_with_indices_backward.grad_input(dy, dx, k, s, p, dil, ceil, idx,
                                                                        grad_input=dx)
    include = bool(a.get("count_include_pad", True))
    if kind == "avg_pool2d":
        x, y = I[0], O[0]
        return lambda: aten.avg_pool2d.out(x, k, s, p, ceil, include, None, out=y)
    dy, dx = I[0], O[0]
    return lambda: aten.avg_pool2d_backward.grad_input(dy, dx, k, s, p, ceil, include, None, grad_input=dx)


# ---------------------------------------------------------------------------------------------
# global_avg_pool2d, mean_mid
# ---------------------------------------------------------------------------------------------
def _global_pool(ctx, x: int):
    """The spatial mean of [N, C, H, W] as global_avg_pool2d ([N, C, 1, 1]), then a view to the node's shape."""
    from port.ir import capture as C
    from port.ops.shape import view_fwd
    v = C.val_of(ctx.node)
    n_, c = ctx.shape(x)[:2]
    y = ctx.b.tensor(f"{ctx.opname}:out", (n_, c, 1, 1), F32, ROLE_ACTIVATION)
    f = fwd(ctx, "global_avg_pool2d", {}, (x,), (y,), 0, numel(ctx.shape(x)))
    if tuple(v.shape) == (n_, c, 1, 1):
        return f
    return [f, view_fwd(ctx.b, f"{ctx.opname}.view", ctx.scope, y, ctx.b.tensor(
        f"{ctx.opname}.view:out", tuple(v.shape), F32, ROLE_ACTIVATION))]


def _adaptive_capture(ctx):
    x = ctx.t(ctx.node.args[0])
    if len(ctx.shape(x)) != 4 or pair(ctx.node.args[1]) != (1, 1) or not float32(ctx, x):
        return False
    return _global_pool(ctx, x)


def _mean_capture(ctx):
    n = ctx.node
    if n.target._overloadpacket.__name__ == "adaptive_avg_pool2d":
        return _adaptive_capture(ctx)
    x = ctx.t(n.args[0])
    xs = ctx.shape(x)
    dims = arg(n, 1, "dim")
    keep = bool(arg(n, 2, "keepdim", False))
    if dims is None or n.kwargs.get("dtype") is not None or not float32(ctx, x):
        return False
    dims = sorted(d % len(xs) for d in (dims if isinstance(dims, (list, tuple)) else [dims]))
    if len(xs) == 4 and dims == [2, 3]:
        return _global_pool(ctx, x)
    if len(dims) == 1 and not keep and dims[0] != len(xs) - 1 and len(xs) >= 2:
        return fwd(ctx, "mean_mid", dict(dim=dims[0]), (x,), (ctx.out(),), 0, numel(xs))
    return False


def _gap_shapes(k, attrs, I, O, at):
    if k in SE_KERNELS:
        return _se_shapes(k, attrs, I, O, at)
    x = rank(at(I, 0, "input 0 (x)") if "." not in k else at(O, 0, "output 0 (dx)"), 4, "x")
    y = ((x[0], x[1], 1, 1), F32)
    return ([(x, F32)], [y]) if "." not in k else ([y], [(x, F32)])


def _gap_encode(kind, a, IS, OS, I, O, variant, call):
    if kind == "se":
        return Encoded("port_se_forward", tuple(O) + tuple(I), _se_iv(kind, a, IS, OS))
    if kind == "se.grad_weight":
        entry = "port_se_backward_weight_overwrite" if a.get("overwrite") else "port_se_backward_weight"
        return Encoded(entry, tuple(O) + tuple(I), _se_iv(kind, a, IS, OS))
    if kind == "se.grad_input":
        return Encoded("port_se_backward_input", (O[0],) + tuple(I), _se_iv(kind, a, IS, OS))
    n, c, h, w = IS[0] if kind == "global_avg_pool2d" else OS[0]
    entry = "port_global_avgpool_forward" if kind == "global_avg_pool2d" else "port_global_avgpool_backward_input"
    return Encoded(entry, (O[0], I[0]), (n, c, h * w))


def _gap_torch(kind, a, I, O, env):
    if kind in SE_KERNELS:
        return _se_torch(kind, a, I, O, env)
    if kind == "global_avg_pool2d":
        x, y = I[0], O[0]
        return lambda: y.copy_(x.mean((2, 3)).view(y.shape))
    dy, dx = I[0], O[0]
    n, c, h, w = dx.shape
    return lambda: dx.copy_((dy.reshape(n, c, 1, 1) / (h * w)).expand(n, c, h, w))


# Squeeze-excitation fused (issue 54): the fused variant of a global_avg_pool2d -> conv 1x1 -> act -> conv 1x1 ->
# gate -> mul chain (port.plan.variants.FUSIONS "se"); kernels of the global_avg_pool2d record, emitted for the
# chain's calls only (never captured as an op). attrs: act (relu | silu), gate (sigmoid | hardsigmoid).
SE_KERNELS = {"se": ("port_se_forward",),
              "se.grad_weight": ("port_se_backward_weight", "port_se_backward_weight_overwrite"),
              "se.grad_input": ("port_se_backward_input",)}
SE_ACTS, SE_GATES = ("relu", "silu"), ("sigmoid", "hardsigmoid")


def _se_dims(k, I, O, at):
    """(n, c, s, hw, x shape) of an SE call: x from input 0 (se) or 1 (se.grad_weight), dx output 0 (grad_input);
    s from w1's rows (se) or h (se.grad_weight) or dh (se.grad_input)."""
    if k == "se":
        x, s = rank(at(I, 0, "input 0 (x)"), 4, "x"), at(I, 1, "input 1 (w1)")[0]
    elif k == "se.grad_weight":
        x, s = rank(at(I, 1, "input 1 (x)"), 4, "x"), at(I, 3, "input 3 (h)")[1]
    else:
        x, s = rank(at(O, 0, "output 0 (dx)"), 4, "dx"), at(I, 3, "input 3 (dh)")[1]
    return x[0], x[1], s, x[2] * x[3], tuple(x)


def _se_shapes(k, attrs, I, O, at):
    """se: (y, h, z) from (x, w1, b1, w2, b2); se.grad_weight: (dw1, db1, dw2, db2, dh) from (dy, x, w2, h, z);
    se.grad_input: dx from (dy, z, w1, dh)."""
    if attrs.get("act") not in SE_ACTS or attrs.get("gate") not in SE_GATES:
        raise CallShapeError(f"attributes act={attrs.get('act')!r}, gate={attrs.get('gate')!r}: expected act in "
                             f"{SE_ACTS}, gate in {SE_GATES}")
    n, c, s, _, x = _se_dims(k, I, O, at)
    w1, w2, h, z = ((s, c, 1, 1), F32), ((c, s, 1, 1), F32), ((n, s, 1, 1), F32), ((n, c, 1, 1), F32)
    if k == "se":
        return [(x, F32), w1, ((s,), F32), w2, ((c,), F32)], [(x, F32), h, z]
    if k == "se.grad_weight":
        return [(x, F32), (x, F32), w2, h, z], [w1, ((s,), F32), w2, ((c,), F32), h]
    return [(x, F32), z, w1, h], [(x, F32)]


def _se_iv(k, a, IS, OS):
    x = OS[0] if k == "se.grad_input" else IS[0]
    s = IS[1][0] if k == "se" else IS[3][1]
    return (x[0], x[1], s, x[2] * x[3], SE_ACTS.index(a["act"]), SE_GATES.index(a["gate"]))


def _se_workspace(kernel, variant, attrs, IS, OS) -> int:
    if kernel not in SE_KERNELS:
        return 0
    from port.exec import capi
    n, c, s = _se_iv(kernel, attrs, IS, OS)[:3]
    return int(capi.raw.port_se_workspace_bytes(n, c, s, tuple(SE_KERNELS).index(kernel)))


def _se_torch(kind, a, I, O, env):
    """PyTorch's float32 kernels for the SE calls (the same maths; not the C kernels' bits: those are the plain C
    members')."""
    torch, F = env.torch, env.F
    act = {"relu": F.relu, "silu": F.silu}[a["act"]]
    gate = {"sigmoid": torch.sigmoid, "hardsigmoid": F.hardsigmoid}[a["gate"]]

    def dgate(z, g):
        if a["gate"] == "sigmoid":
            t = torch.sigmoid(z)
            return g * (1 - t) * t
        return torch.where((z > -3) & (z < 3), g / 6, torch.zeros_like(g))

    def dact(h, g):
        if a["act"] == "relu":
            return torch.where(h > 0, g, torch.zeros_like(g))
        t = torch.sigmoid(h)
        return g * t * (1 + h * (1 - t))

    def run():
        if kind == "se":
            x, w1, b1, w2, b2 = I
            n, c = x.shape[:2]
            h = x.mean((2, 3)) @ w1.reshape(w1.shape[0], c).T + b1
            z = act(h) @ w2.reshape(c, -1).T + b2
            O[1].copy_(h.view(O[1].shape)), O[2].copy_(z.view(O[2].shape))
            O[0].copy_(x * gate(z).view(n, c, 1, 1))
        elif kind == "se.grad_weight":
            dy, x, w2, h, z = I
            n, c = x.shape[:2]
            hh, zz = h.reshape(n, -1), z.reshape(n, c)
            dz = dgate(zz, (dy * x).sum((2, 3)))
            O[2].add_((dz.T @ act(hh)).view(O[2].shape)), O[3].add_(dz.sum(0))
            dh = dact(hh, dz @ w2.reshape(c, -1))
            O[0].add_((dh.T @ x.mean((2, 3))).view(O[0].shape)), O[1].add_(dh.sum(0))
            O[4].copy_(dh.view(O[4].shape))
        else:
            dy, z, w1, dh = I
            n, c, hgt, wid = dy.shape
            dm = dh.reshape(n, -1) @ w1.reshape(-1, c)
            O[0].copy_(dy * gate(z) + (dm / (hgt * wid)).view(n, c, 1, 1))
    return run


def _mid(x, d):
    return numel(x[:d]), x[d], numel(x[d + 1:])


def _mean_shapes(k, attrs, I, O, at):
    x = at(I, 0, "input 0 (x)") if k == "mean_mid" else at(O, 0, "output 0 (dx)")
    d = attrs.get("dim")
    if type(d) is not int or not 0 <= d < len(x) - 1:
        raise CallShapeError(f"attribute dim={d!r}: expected a non-last dim of {list(x)}")
    y = tuple(x[:d]) + tuple(x[d + 1:])
    return ([(x, F32)], [(y, F32)]) if k == "mean_mid" else ([(y, F32)], [(x, F32)])


def _mean_encode(kind, a, IS, OS, I, O, variant, call):
    if kind == "mean_mid":
        return Encoded("port_mean_mid_forward", (O[0], I[0]), _mid(IS[0], a["dim"]))
    return Encoded("port_mean_mid_backward", (O[0], I[0]), _mid(OS[0], a["dim"]))


def _mean_torch(kind, a, I, O, env):
    if kind == "mean_mid":
        return lambda: env.torch.mean(I[0], a["dim"], out=O[0])
    return lambda: O[0].copy_((I[0].unsqueeze(a["dim"]) / O[0].shape[a["dim"]]).expand(O[0].shape))


def _x_numel(f, T):
    return numel(T[f.x[0]].shape)


register(
    OpRecord(kind="max_pool2d", family="pooling",
             kernels={"max_pool2d": ("port_maxpool2d_forward",),
                      "max_pool2d.grad_input": ("port_maxpool2d_backward_input",)},
             shapes=_pool_shapes, torch=_pool_torch, encode=_pool_encode, aten=("max_pool2d",), capture=_max_capture,
             saved=lambda f, gi, gw, w: (f.outputs[1],), grad_input_reads=lambda f: (f.outputs[1],),
             bwd_vector_flops=lambda f, T: numel(T[f.outputs[0]].shape), tags=frozenset({"checkpoint"}),
             doc=__doc__),
    OpRecord(kind="avg_pool2d", family="pooling",
             kernels={"avg_pool2d": ("port_avgpool2d_forward",),
                      "avg_pool2d.grad_input": ("port_avgpool2d_backward_input",)},
             shapes=_pool_shapes, torch=_pool_torch, encode=_pool_encode, aten=("avg_pool2d",), capture=_avg_capture,
             bwd_vector_flops=_x_numel, tags=frozenset({"checkpoint"}), doc=__doc__),
    OpRecord(kind="global_avg_pool2d", family="pooling",
             kernels={"global_avg_pool2d": ("port_global_avgpool_forward",),
                      "global_avg_pool2d.grad_input": ("port_global_avgpool_backward_input",)} | SE_KERNELS,
             shapes=_gap_shapes, torch=_gap_torch, encode=_gap_encode, aten=("adaptive_avg_pool2d", "mean"),
             capture=_mean_capture, bwd_vector_flops=_x_numel, workspace=_se_workspace, tags=frozenset({"checkpoint"}),
             doc=__doc__),
    OpRecord(kind="mean_mid", family="pooling",
             kernels={"mean_mid": ("port_mean_mid_forward",), "mean_mid.grad_input": ("port_mean_mid_backward",)},
             shapes=_mean_shapes, torch=_mean_torch, encode=_mean_encode, aten=("mean",), capture=_mean_capture,
             bwd_vector_flops=_x_numel, doc=__doc__),
)


# ---------------------------------------------------------------------------------------------
# reduce_mean, reduce_sum: over any dims (keepdim or not) where the C kernels' forms do not apply (RMSNorm's
# mean over the last dim, token means); PyTorch's kernels. The gradient broadcasts dy back (/ count for mean).
# ---------------------------------------------------------------------------------------------
def _reduce_capture(kind: str):
    def rule(ctx):
        n = ctx.node
        x = ctx.t(n.args[0])
        xs = ctx.shape(x)
        dims = arg(n, 1, "dim")
        if dims is None or not xs or n.kwargs.get("dtype") is not None or not float32(ctx, x):
            return False
        dims = tuple(sorted({d % len(xs) for d in (dims if isinstance(dims, (list, tuple)) else [dims])}))
        if not dims:
            return False
        y = ctx.out()
        return fwd(ctx, kind, dict(dims=dims, keepdim=bool(arg(n, 2, "keepdim", False))), (x,), (y,), 0, numel(xs))
    return rule


def _reduced(x, attrs: dict) -> tuple[int, ...]:
    dims, keep = attrs.get("dims"), attrs.get("keepdim")
    if not isinstance(dims, tuple) or not dims or any(type(d) is not int or not 0 <= d < len(x) for d in dims) \
            or list(dims) != sorted(set(dims)) or not isinstance(keep, bool):
        raise CallShapeError(f"attributes dims={dims!r}, keepdim={keep!r}: expected increasing dims of {list(x)}")
    return tuple(1 if i in dims else s for i, s in enumerate(x)) if keep else \
        tuple(s for i, s in enumerate(x) if i not in dims)


def _reduce_shapes(k, attrs, I, O, at):
    x = at(I, 0, "input 0 (x)") if "." not in k else at(O, 0, "output 0 (dx)")
    y = _reduced(tuple(x), attrs)
    return ([(tuple(x), F32)], [(y, F32)]) if "." not in k else ([(y, F32)], [(tuple(x), F32)])


def _reduce_torch(kind, a, I, O, env):
    torch = env.torch
    dims, keep = list(a["dims"]), a["keepdim"]
    mean = kind.startswith("reduce_mean")
    if "." not in kind:
        fn = torch.mean if mean else torch.sum
        return lambda: fn(I[0], dims, keep, out=O[0])
    dy, dx = I[0], O[0]
    kshape = tuple(1 if i in a["dims"] else s for i, s in enumerate(dx.shape))
    count = numel(tuple(dx.shape[d] for d in a["dims"]))
    scale = 1.0 / count if mean else 1.0
    return lambda: dx.copy_(dy.reshape(kshape).expand(dx.shape)).mul_(scale)


register(*(OpRecord(
    kind=k, family="pooling", kernels={k: (), f"{k}.grad_input": ()}, shapes=_reduce_shapes, torch=_reduce_torch,
    aten=(p,), capture=_reduce_capture(k), bwd_vector_flops=_x_numel, tags=frozenset({"checkpoint"}),
    doc=f"{k}: {p} over ``dims`` (``keepdim``) where global_avg_pool2d and mean_mid do not apply; saves nothing; "
        f"the gradient broadcasts dy back{' / count' if p == 'mean' else ''}. PyTorch's kernels (no C kernel yet).")
    for k, p in (("reduce_mean", "mean"), ("reduce_sum", "sum"))))


# ---------------------------------------------------------------------------------------------
# adaptive_avg_pool2d to any size, upsample (interpolate nearest / bilinear)
# ---------------------------------------------------------------------------------------------
def _adaptive_any_capture(ctx):
    n = ctx.node
    x = ctx.t(n.args[0])
    if len(ctx.shape(x)) != 4 or not float32(ctx, x):
        return False
    y = ctx.out()
    return fwd(ctx, "adaptive_avg_pool2d", dict(size=tuple(ctx.shape(y)[2:])), (x,), (y,), 0, numel(ctx.shape(x)))


def _adaptive_shapes(k, attrs, I, O, at):
    x = rank(at(I, 0, "input 0 (x)") if "." not in k else at(O, 0, "output 0 (dx)"), 4, "x")
    size = attr_pair(attrs, "size", 1)
    y = ((x[0], x[1]) + tuple(size), F32)
    return ([(x, F32)], [y]) if "." not in k else ([y], [(x, F32)])


def _adaptive_encode(kind, a, IS, OS, I, O, variant, call):
    x, y = (IS[0], OS[0]) if "." not in kind else (OS[0], IS[0])
    entry = "port_adaptive_avgpool2d_forward" if "." not in kind else "port_adaptive_avgpool2d_backward_input"
    return Encoded(entry, (O[0], I[0]), (*x, y[2], y[3]))


def _upsample_encode(kind, a, IS, OS, I, O, variant, call):
    """port_upsample2d_forward / _backward_input: iv n, c, h, w, ho, wo, mode, align_corners; fv the source
    step per output pixel as PyTorch computes it from the call's scale factors, (float)(1.0 / s), or 0 (from the
    sizes; align_corners ignores the scales)."""
    import ctypes
    from port.exec.capi import UPSAMPLE_MODES
    x, y = (IS[0], OS[0]) if "." not in kind else (OS[0], IS[0])
    align = bool(a.get("align_corners", False))
    sc = a.get("scales")
    fv = (0.0, 0.0) if sc is None or align else tuple(ctypes.c_float(1.0 / s).value for s in sc)
    entry = "port_upsample2d_forward" if "." not in kind else "port_upsample2d_backward_input"
    return Encoded(entry, (O[0], I[0]), (*x, y[2], y[3], UPSAMPLE_MODES[a["mode"]], int(align)), fv)


def _adaptive_torch(kind, a, I, O, env):
    aten = env.aten
    if "." not in kind:
        return lambda: O[0].copy_(aten._adaptive_avg_pool2d(I[0], list(a["size"])))
    dy, dx = I[0], O[0]
    return lambda: dx.copy_(aten._adaptive_avg_pool2d_backward(dy, dx))   # (dx: its input's shape only)


def _upsample_capture(ctx):
    """upsample_nearest2d.vec(x, output_size, scale_factors), upsample_bilinear2d.vec(x, output_size,
    align_corners, scale_factors): the call's own size or scales kept (they pick the source pixels)."""
    n = ctx.node
    packet = n.target._overloadpacket.__name__
    x = ctx.t(n.args[0])
    if len(ctx.shape(x)) != 4 or not float32(ctx, x) or not str(n.target).endswith(".vec"):
        return False
    size = n.args[1]
    bilinear = packet == "upsample_bilinear2d"
    scales = arg(n, 3 if bilinear else 2, "scale_factors")
    y = ctx.out()
    attrs = dict(mode="bilinear" if bilinear else "nearest", size=tuple(ctx.shape(y)[2:]),
                 scales=tuple(float(v) for v in scales) if scales is not None and size is None else None)
    if bilinear:
        attrs["align_corners"] = bool(n.args[2])
    return fwd(ctx, "upsample", attrs, (x,), (y,), 0, (8 if bilinear else 1) * numel(ctx.shape(y)))


def _upsample_shapes(k, attrs, I, O, at):
    if attrs.get("mode") not in ("nearest", "bilinear") or (attrs["mode"] == "bilinear") != ("align_corners" in attrs):
        raise CallShapeError(f"attribute mode={attrs.get('mode')!r}: expected 'nearest' or 'bilinear' "
                             f"(with align_corners)")
    sc = attrs.get("scales")
    if sc is not None and (not isinstance(sc, tuple) or len(sc) != 2 or not all(isinstance(v, float) and v > 0
                                                                                for v in sc)):
        raise CallShapeError(f"attribute scales={sc!r}: expected two positive floats or None")
    return _adaptive_shapes(k, attrs, I, O, at)


def _upsample_torch(kind, a, I, O, env):
    aten = env.aten
    size, sc = list(a["size"]), a.get("scales")
    bil = a["mode"] == "bilinear"
    if "." not in kind:
        x, y = I[0], O[0]
        if bil:
            return lambda: y.copy_(aten.upsample_bilinear2d.vec(x, None if sc else size, a["align_corners"],
                                                                list(sc) if sc else None))
        return lambda: y.copy_(aten.upsample_nearest2d.vec(x, None if sc else size, list(sc) if sc else None))
    dy, dx = I[0], O[0]
    sh, sw = sc if sc else (None, None)
    if bil:
        return lambda: aten.upsample_bilinear2d_backward.grad_input(dy, size, list(dx.shape), a["align_corners"], sh,
                                                                    sw, grad_input=dx)
    return lambda: aten.upsample_nearest2d_backward.grad_input(dy, size, list(dx.shape), sh, sw, grad_input=dx)


register(
    OpRecord(kind="adaptive_avg_pool2d", family="pooling",
             kernels={"adaptive_avg_pool2d": ("port_adaptive_avgpool2d_forward",),
                      "adaptive_avg_pool2d.grad_input": ("port_adaptive_avgpool2d_backward_input",)},
             shapes=_adaptive_shapes, torch=_adaptive_torch, encode=_adaptive_encode, aten=("adaptive_avg_pool2d",),
             capture=_adaptive_any_capture, bwd_vector_flops=_x_numel, tags=frozenset({"checkpoint"}),
             doc="adaptive_avg_pool2d to an output ``size`` other than 1x1 (global_avg_pool2d takes that); saves "
                 "nothing. C kernels port_adaptive_avgpool2d_*."),
    OpRecord(kind="upsample", family="pooling",
             kernels={"upsample": ("port_upsample2d_forward",),
                      "upsample.grad_input": ("port_upsample2d_backward_input",)},
             shapes=_upsample_shapes, torch=_upsample_torch, encode=_upsample_encode,
             aten=("upsample_nearest2d", "upsample_bilinear2d"), capture=_upsample_capture,
             bwd_vector_flops=lambda f, T: 2 * numel(T[f.outputs[0]].shape), tags=frozenset({"checkpoint"}),
             doc="upsample: F.interpolate nearest or bilinear (``align_corners`` either way) to ``size`` (or by the "
                 "call's ``scales``); saves nothing. C kernels port_upsample2d_*."),
)
