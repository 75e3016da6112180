"""roll and constant zero pad along one dim: range copies (port_slice_copy), so Swin's shifted windows
(torch.roll over two dims) and its padding to whole windows (F.pad of an NHWC map) run on C and in port-rt.

``roll`` (attributes ``dim``, ``shift`` in [1, size), ``size``): y = torch.roll(x, shift, dim), two range copies
(attribute ``part`` 0: y[shift:] = x[:size - shift], part 1: y[:shift] = x[size - shift:]); its gradient is the roll
back, the same two copies the other way round. ``pad`` (``dim``, ``before``, ``after`` >= 0, ``size``: x's extent):
zeros before and after x along ``dim``, one copy that zeroes the rest of y (narrow's gradient); its gradient copies
dy's middle range out (narrow). A roll or pad of several dims is captured as a chain of one-dim ops (dims whose
shift or padding is 0 left out; none left: the node is its input). Neither saves anything. Other pads (a value other than 0, reflect / replicate,
negative padding: a crop) and rolls of the flattened tensor stay torch_ops.

A strided slice ``x[..., s::k, ...]`` of a dim whose extent n is a multiple of k, s < k (Swin's patch merging,
``x[:, 0::2, 1::2, :]``) is a view of x as [..., n / k, k, ...] and a narrow of item s of the new dim (C, no new
op kind); other strided slices stay torch_ops.
"""
from __future__ import annotations

from dataclasses import replace

from port.ir.types import numel
from port.ops import register
from port.ops.base import F32, CallShapeError, Encoded, OpRecord, arg, float32, fwd


def _chain(ctx, x: int, steps: list, kind: str) -> list:
    """One ``kind`` op per (attrs, output shape) of ``steps`` from ``x``, each reading the previous one's output;
    the last writes the node's output."""
    import torch
    out = []
    for k, (attrs, shape) in enumerate(steps):
        last = k == len(steps) - 1
        y = ctx.out() if last else ctx.out(f"{kind}{k}", torch.empty(shape, device="meta"))
        f = fwd(ctx, kind, attrs, (x,), (y,), 0, numel(shape))
        out.append(f if last else replace(f, name=f"{f.name}:{kind}{k}"))
        x = y
    return out


def _same(ctx, x: int) -> None:
    """A roll by whole turns or a pad by nothing (Swin's patch merging on even maps): the node names x."""
    ctx.env[ctx.node.name] = x
    return None


def _roll_capture(ctx):
    n = ctx.node
    xa = n.args[0]
    if not hasattr(xa, "name") or ctx.is_param(xa) or ctx.is_buffer(xa):
        return False
    x = ctx.t(xa)
    xs = tuple(ctx.shape(x))
    shifts, dims = arg(n, 1, "shifts"), arg(n, 2, "dims", [])
    shifts = list(shifts) if isinstance(shifts, (list, tuple)) else [shifts]
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    if not float32(ctx, x) or not xs or len(shifts) != len(dims) or not dims:
        return False               # (a roll of the flattened tensor: a torch_op)
    steps = []
    for s, d in zip(shifts, dims):
        d = int(d) % len(xs)
        s = int(s) % xs[d]
        if s:
            steps.append((dict(dim=d, shift=s, size=xs[d]), xs))
    return _chain(ctx, x, steps, "roll") if steps else _same(ctx, x)


def _pad_capture(ctx):
    n = ctx.node
    packet = n.target._overloadpacket.__name__
    xa = n.args[0]
    if not hasattr(xa, "name") or ctx.is_param(xa) or ctx.is_buffer(xa):
        return False
    x = ctx.t(xa)
    xs = list(ctx.shape(x))
    pads = list(arg(n, 1, "pad", []))
    if packet == "pad":
        mode, value = arg(n, 2, "mode", "constant"), arg(n, 3, "value", None)
    else:                          # constant_pad_nd(x, pad, value=0)
        mode, value = "constant", arg(n, 2, "value", 0)
    if (mode != "constant" or (value is not None and float(value) != 0.0) or not float32(ctx, x)
            or len(pads) % 2 or len(pads) // 2 > len(xs) or any(type(p) is not int or p < 0 for p in pads)):
        return False
    steps = []
    for i in range(len(pads) // 2):
        d = len(xs) - 1 - i
        b, a = pads[2 * i], pads[2 * i + 1]
        if b or a:
            attrs = dict(dim=d, before=b, after=a, size=xs[d])
            xs = xs[:d] + [xs[d] + b + a] + xs[d + 1:]
            steps.append((attrs, tuple(xs)))
    return _chain(ctx, x, steps, "pad") if steps else _same(ctx, x)


def _ints(attrs: dict, keys: tuple, r: int) -> tuple:
    v = tuple(attrs.get(k) for k in keys)
    if not all(type(i) is int for i in v) or not 0 <= v[0] < r:
        raise CallShapeError(f"attributes {dict(zip(keys, v))}: expected ints, dim inside {r} dims")
    return v


def _roll_shapes(k, attrs, I, O, at):
    x = at(I, 0, "input 0 (x)" if k == "roll" else "input 0 (dy)")
    d, s, size = _ints(attrs, ("dim", "shift", "size"), len(x))
    if x[d] != size or not 0 < s < size:
        raise CallShapeError(f"roll of {list(x)}: attributes dim={d}, shift={s}, size={size}: expected "
                             f"0 < shift < size = the extent of dim {d}")
    part = attrs.get("part")
    if part not in (None, 0, 1):
        raise CallShapeError(f"attribute part={part!r}: expected 0 or 1")
    return [(tuple(x), F32)], [(tuple(x), F32)]


def _roll_calls(graph, op, variant):
    """Two calls (attribute ``part``): the two ranges of the roll."""
    base = dict(op.attrs)
    return [(op.kind, op.outputs, op.inputs, base | {"part": i}, ()) for i in (0, 1)]


def _roll_range(kind: str, a: dict) -> tuple[int, int, int]:
    """(y_start, x_start, length) of part ``a["part"]``: the roll by ``shift`` forward, by -shift for its
    gradient (the forward's ranges the other way round)."""
    s, n = a["shift"], a["size"]
    ys, xs, ln = (s, 0, n - s) if a["part"] == 0 else (0, n - s, s)
    return (ys, xs, ln) if kind == "roll" else (xs, ys, ln)


def _roll_encode(kind, a, IS, OS, I, O, variant, call):
    d, n = a["dim"], a["size"]
    ys, xs, ln = _roll_range(kind, a)
    return Encoded("port_slice_copy", (O[0], I[0]), (numel(IS[0][:d]), numel(IS[0][d + 1:]), n, n, ln, ys, xs, 0))


def _roll_torch(kind, a, I, O, env):
    d = a["dim"]
    if "part" not in a:
        sh = a["shift"] if kind == "roll" else -a["shift"]
        return lambda: O[0].copy_(env.torch.roll(I[0], sh, d))
    ys, xs, ln = _roll_range(kind, a)
    y, x = O[0].narrow(d, ys, ln), I[0].narrow(d, xs, ln)
    return lambda: y.copy_(x)


def _pad_shapes(k, attrs, I, O, at):
    if k == "pad":
        x = at(I, 0, "input 0 (x)")
    else:
        x = at(O, 0, "output 0 (dx)")
    d, b, a, size = _ints(attrs, ("dim", "before", "after", "size"), len(x))
    if x[d] != size or b < 0 or a < 0:
        raise CallShapeError(f"pad of {list(x)}: attributes dim={d}, before={b}, after={a}, size={size}: "
                             f"expected padding >= 0 and size = the extent of dim {d}")
    y = tuple(x[:d]) + (size + b + a,) + tuple(x[d + 1:])
    return ([(tuple(x), F32)], [(y, F32)]) if k == "pad" else ([(y, F32)], [(tuple(x), F32)])


def _pad_encode(kind, a, IS, OS, I, O, variant, call):
    """port_slice_copy: x into the middle of y, the rest zeroed (fill); the gradient dy's middle out."""
    d, b, size = a["dim"], a["before"], a["size"]
    full = OS[0] if kind == "pad" else IS[0]
    outer, inner, m = numel(full[:d]), numel(full[d + 1:]), full[d]
    if kind == "pad":
        return Encoded("port_slice_copy", (O[0], I[0]), (outer, inner, m, size, size, b, 0, 1))
    return Encoded("port_slice_copy", (O[0], I[0]), (outer, inner, size, m, size, 0, b, 0))


def _pad_torch(kind, a, I, O, env):
    d, b, size = a["dim"], a["before"], a["size"]
    if kind == "pad":
        y, x = O[0], I[0]
        mid = y.narrow(d, b, size)

        def run():
            y.zero_()
            mid.copy_(x)
        return run
    dx, part = O[0], I[0].narrow(d, b, size)
    return lambda: dx.copy_(part)


register(
    OpRecord(kind="roll", family="shape",
             kernels={"roll": ("port_slice_copy",), "roll.grad_input": ("port_slice_copy",)},
             shapes=_roll_shapes, torch=_roll_torch, encode=_roll_encode, calls=_roll_calls, aten=("roll",),
             capture=_roll_capture, bwd_vector_flops=lambda f, T: numel(T[f.x[0]].shape),
             tags=frozenset({"checkpoint"}), doc=__doc__),
    OpRecord(kind="pad", family="shape",
             kernels={"pad": ("port_slice_copy",), "pad.grad_input": ("port_slice_copy",)},
             shapes=_pad_shapes, torch=_pad_torch, encode=_pad_encode, aten=("pad", "constant_pad_nd"),
             capture=_pad_capture, bwd_vector_flops=lambda f, T: numel(T[f.x[0]].shape),
             tags=frozenset({"checkpoint"}), doc=__doc__),
)


def _strided_slice_capture(ctx):
    """slice(x, dim, start, end, step > 1) over a whole dim of n = k m items from start s < k: view [.., m, k, ..],
    narrow item s of the k-dim (squeezed)."""
    import torch
    from port.ops.shape import is_contiguous_range, view_fwd
    n = ctx.node
    xa = n.args[0]
    k = arg(n, 4, "step", 1)
    if type(k) is not int or k <= 1 or not hasattr(xa, "name") or ctx.is_param(xa) or ctx.is_buffer(xa):
        return False
    x = ctx.t(xa)
    xs = tuple(ctx.shape(x))
    if not xs or not float32(ctx, x):
        return False
    d = arg(n, 1, "dim", 0) % len(xs)
    start, end = arg(n, 2, "start"), arg(n, 3, "end")
    s = 0 if start is None else int(start)
    s = s + xs[d] if s < 0 else s
    e = xs[d] if end is None else min(int(end) + (xs[d] if int(end) < 0 else 0), xs[d])
    m = xs[d] // k
    if xs[d] % k or not 0 <= s < k or len(range(s, e, k)) != m:
        return False
    shape = xs[:d] + (m, k) + xs[d + 1:]
    if is_contiguous_range(shape, d + 1, 1):
        return False
    v = ctx.out("strided", torch.empty(shape, device="meta"))
    y = ctx.out()
    return [view_fwd(ctx.b, f"{ctx.opname}:strided", ctx.scope, x, v),
            fwd(ctx, "narrow", dict(dim=d + 1, start=s, length=1, size=k, squeeze=True), (v,), (y,))]


def _strided_shapes(k, attrs, I, O, at):
    raise CallShapeError("strided_slice is a capture rule only: it makes reshape and narrow ops")


register(OpRecord(kind="strided_slice", family="shape", kernels={}, shapes=_strided_shapes, aten=("slice",),
                  capture=_strided_slice_capture, doc=_strided_slice_capture.__doc__))
