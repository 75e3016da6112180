"""Input-dependent attention masks (issue 54): what HF's attention_mask becomes before attention, on C.

HF turns ``attention_mask`` (int64 [B, K]) into a boolean [B, 1, Q, K] mask: a cast to bool (``_to_copy``), the
gather ``mask[batch_idx, kv_idx]`` by two broadcast int64 index tensors (``index.Tensor``), an ``and`` with a
causal mask, an ``expand``. These records take those nodes where the operands are masks (bool, one byte per
element in the arena, as torch stores them), int64 or float32: ``mask_cast`` (to bool or float32),
``mask_logic`` (and / or / xor of two bool masks, broadcast on every axis, and not), ``mask_compare`` (eq .. ge
of float32 tensors or a tensor and a number into a mask), ``expand_mask`` (a bool expand) and
``mask_index2`` (a 2-D bool tensor gathered by two int64 index tensors). Masks are not differentiated
(``no_grad``): a float result of a cast from a mask or int64 carries no gradient back. C kernels in
kernels/src/mask.c (port-rt ids 122-127). ``where`` (cond ? a : b, float32, port-rt ids 128-129) reads a mask
and differentiates its two value operands.
"""
from __future__ import annotations

from port.ir.types import numel
from port.ops import register
from port.ops.base import F32, I64, CallShapeError, Encoded, OpRecord, fwd

BOOL = "bool"
I32 = "int32"
_DT = {F32: 0, BOOL: 1, I64: 2, I32: 3}
_LOGIC = {"__and__": 0, "bitwise_and": 0, "logical_and": 0, "__or__": 1, "bitwise_or": 1, "logical_or": 1,
          "__xor__": 2, "bitwise_xor": 2, "logical_xor": 2}
_NOT = ("logical_not", "bitwise_not")
_CMP = {"eq": 0, "ne": 1, "lt": 2, "le": 3, "gt": 4, "ge": 5}
_RANK = 6         # PORT_BINARY_MAX_RANK


def _packet(ctx) -> str:
    return getattr(ctx.node.target, "__name__", str(ctx.node.target)).split(".")[0]


def _pad(dims):
    return (*dims, *[1] * (_RANK - len(dims)))


# ---- mask_cast: bool/int64/int32/float32 -> bool, bool/int64/int32 -> float32, bool -> int32 -----------------
def _cast_capture(ctx):
    n = ctx.node
    xa = n.args[0] if n.args else None
    if not hasattr(xa, "name"):
        return False
    x, y = ctx.t(xa), ctx.out()
    xd, yd = ctx.dtype(x), ctx.dtype(y)
    dev = n.kwargs.get("device")
    if xd not in _DT or not _cast_ok(xd, yd) or ctx.shape(x) != ctx.shape(y) or \
            (dev is not None and getattr(dev, "type", dev) not in ("cpu", "meta")) or ctx.is_param(xa):
        return False
    return fwd(ctx, "mask_cast", {"x_dtype": xd, "y_dtype": yd}, (x,), (y,), 0, numel(ctx.shape(y)))


def _cast_ok(xd, yd) -> bool:
    """float32 / bool outputs of any other dtype; int32 the 0/1 of a bool mask (HF's pooling of seqcls models)."""
    return xd in _DT and xd != yd and (yd in (F32, BOOL) or (yd == I32 and xd == BOOL))


def _cast_shapes(k, attrs, I, O, at):
    xd, yd = attrs.get("x_dtype"), attrs.get("y_dtype")
    if not _cast_ok(xd, yd):
        raise CallShapeError(f"attributes x_dtype={xd!r}, y_dtype={yd!r}: expected x_dtype among {sorted(_DT)}, "
                             f"y_dtype float32 or bool (int32 from bool), the two different")
    x = at(I, 0, "input 0 (x)")
    return [(x, xd)], [(x, yd)]


def _cast_encode(kind, a, IS, OS, I, O, variant, call):
    return Encoded("port_mask_cast", (O[0], I[0]), (_DT[a["y_dtype"]], _DT[a["x_dtype"]], numel(OS[0])))


def _cast_torch(kind, a, I, O, env):
    return lambda: O[0].copy_(I[0] != 0 if a["y_dtype"] == BOOL else I[0])


# ---- mask_logic: a and/or/xor b of two bool masks, broadcast on every axis ---------------------------------
def _logic_capture(ctx):
    from port.ops.elementwise import broadcast_shape, collapse
    n = ctx.node
    packet = _packet(ctx)
    if packet in _NOT and len(n.args) == 1 and hasattr(n.args[0], "name"):      # not a: op 3, b = a
        op, args = 3, (n.args[0], n.args[0])
    else:
        op, args = _LOGIC.get(packet), n.args
    if op is None or len(args) != 2 or not all(hasattr(a, "name") for a in args):
        return False
    a, b = ctx.t(args[0]), ctx.t(args[1])
    y = ctx.out()
    if ctx.dtype(a) != BOOL or ctx.dtype(b) != BOOL or ctx.dtype(y) != BOOL or \
            broadcast_shape(ctx.shape(a), ctx.shape(b)) != ctx.shape(y):
        return False
    r = len(collapse(ctx.shape(a), ctx.shape(b), ctx.shape(y))[0])
    if r > _RANK:
        return False
    return fwd(ctx, "mask_logic", {"op": op}, (a, b), (y,), 0, numel(ctx.shape(y)))


def _logic_shapes(k, attrs, I, O, at):
    from port.ops.elementwise import broadcast_shape
    if attrs.get("op") not in (0, 1, 2, 3):
        raise CallShapeError(f"attribute op={attrs.get('op')!r}: expected 0 (and), 1 (or), 2 (xor) or 3 (not)")
    a, b, y = at(I, 0, "input 0 (a)"), at(I, 1, "input 1 (b)"), at(O, 0, "output 0 (y)")
    if broadcast_shape(a, b) != tuple(y):
        raise CallShapeError(f"mask_logic of {list(a)} and {list(b)} into {list(y)}: a and b must broadcast to y")
    return [(a, BOOL), (b, BOOL)], [(y, BOOL)]


def _logic_encode(kind, a, IS, OS, I, O, variant, call):
    from port.ops.elementwise import collapse
    dims, ma, mb = collapse(IS[0], IS[1], OS[0])
    return Encoded("port_mask_logic", (O[0], I[0], I[1]), (int(a["op"]), len(dims), ma, mb, *_pad(dims)))


def _logic_torch(kind, a, I, O, env):
    if int(a["op"]) == 3:
        return lambda: env.torch.logical_not(I[0], out=O[0])
    f = (env.torch.logical_and, env.torch.logical_or, env.torch.logical_xor)[int(a["op"])]
    return lambda: f(I[0], I[1], out=O[0])


# ---- expand_mask: a bool mask broadcast to a larger shape (a copy) -------------------------------------------
def _expand_capture(ctx):
    from port.ops.elementwise import broadcast_shape, collapse
    from port.ops.shape import expand_folds
    xa = ctx.node.args[0]
    if not hasattr(xa, "name"):
        return False
    if ctx.dtype(ctx.t(xa)) == BOOL and expand_folds(ctx):
        return None         # read by where / masked_fill, which broadcast it: no copy
    x, y = ctx.t(xa), ctx.out()
    if ctx.dtype(x) != BOOL or broadcast_shape(ctx.shape(x), ctx.shape(y)) != ctx.shape(y) or \
            len(collapse(ctx.shape(x), ctx.shape(y), ctx.shape(y))[0]) > _RANK:
        return False
    return fwd(ctx, "expand_mask", {}, (x,), (y,), 0, 0)


def _expand_shapes(k, attrs, I, O, at):
    from port.ops.elementwise import broadcast_shape
    x, y = at(I, 0, "input 0 (x)"), at(O, 0, "output 0 (y)")
    if broadcast_shape(x, y) != tuple(y):
        raise CallShapeError(f"expand_mask of {list(x)} to {list(y)}: x must broadcast to y")
    return [(x, BOOL)], [(y, BOOL)]


def _expand_encode(kind, a, IS, OS, I, O, variant, call):
    from port.ops.elementwise import collapse
    dims, mx, _ = collapse(IS[0], OS[0], OS[0])
    return Encoded("port_expand_mask", (O[0], I[0]), (len(dims), mx, *_pad(dims)))


# ---- mask_index2: mask[i0, i1] for a 2-D bool mask and two broadcast int64 index tensors ---------------------
def _index_capture(ctx):
    from port.ops.elementwise import broadcast_shape, collapse
    n = ctx.node
    if len(n.args) != 2 or not hasattr(n.args[0], "name") or not isinstance(n.args[1], (list, tuple)) or \
            len(n.args[1]) != 2 or not all(hasattr(i, "name") for i in n.args[1]):
        return False
    x = ctx.t(n.args[0])
    i0, i1 = (ctx.t(i) for i in n.args[1])
    y = ctx.out()
    s0, s1, sy = ctx.shape(i0), ctx.shape(i1), ctx.shape(y)
    if ctx.dtype(x) != BOOL or len(ctx.shape(x)) != 2 or ctx.dtype(i0) != I64 or ctx.dtype(i1) != I64 or \
            broadcast_shape(s0, s1) != sy or len(collapse(s0, s1, sy)[0]) > _RANK:
        return False
    return fwd(ctx, "mask_index2", {}, (x, i0, i1), (y,), 0, numel(sy))


def _index_shapes(k, attrs, I, O, at):
    from port.ops.elementwise import broadcast_shape
    x, i0, i1 = at(I, 0, "input 0 (x)"), at(I, 1, "input 1 (i0)"), at(I, 2, "input 2 (i1)")
    y = at(O, 0, "output 0 (y)")
    if len(x) != 2 or broadcast_shape(i0, i1) != tuple(y):
        raise CallShapeError(f"mask_index2 of {list(x)} by {list(i0)}, {list(i1)} into {list(y)}: x must be 2-D, "
                             f"the indices broadcast to y")
    return [(x, BOOL), (i0, I64), (i1, I64)], [(y, BOOL)]


def _index_encode(kind, a, IS, OS, I, O, variant, call):
    from port.ops.elementwise import collapse
    dims, m0, m1 = collapse(IS[1], IS[2], OS[0])
    return Encoded("port_mask_index2", (O[0], I[0], I[1], I[2]),
                   (IS[0][0], IS[0][1], len(dims), m0, m1, *_pad(dims)))


# ---- mask_compare: a cmp b of two float32 tensors (broadcast) or of a tensor and a Python number -------------
def _compare_capture(ctx):
    import math

    from port.ops.elementwise import broadcast_shape, collapse
    n = ctx.node
    op = _CMP.get(_packet(ctx))
    if op is None or len(n.args) != 2 or not hasattr(n.args[0], "name") or any(map(ctx.is_param, n.args)):
        return False            # (a parameter compared: left to torch, no trained operand enters a mask record)
    a, y, other = ctx.t(n.args[0]), ctx.out(), n.args[1]
    if ctx.dtype(a) != F32 or ctx.dtype(y) != BOOL:
        return False
    if isinstance(other, (int, float)) and not isinstance(other, bool):
        v = float(other)
        if ctx.shape(a) != ctx.shape(y) or (math.isfinite(float(other)) and abs(v) > 3.4e38):
            return False
        return fwd(ctx, "mask_compare", {"op": op, "scalar": v}, (a,), (y,), 0, numel(ctx.shape(y)))
    if not hasattr(other, "name"):
        return False
    b = ctx.t(other)
    if ctx.dtype(b) != F32 or broadcast_shape(ctx.shape(a), ctx.shape(b)) != ctx.shape(y) or \
            len(collapse(ctx.shape(a), ctx.shape(b), ctx.shape(y))[0]) > _RANK:
        return False
    return fwd(ctx, "mask_compare", {"op": op}, (a, b), (y,), 0, numel(ctx.shape(y)))


def _compare_shapes(k, attrs, I, O, at):
    from port.ops.elementwise import broadcast_shape
    if attrs.get("op") not in range(6):
        raise CallShapeError(f"attribute op={attrs.get('op')!r}: expected 0..5 (eq, ne, lt, le, gt, ge)")
    a, y = at(I, 0, "input 0 (a)"), at(O, 0, "output 0 (y)")
    if "scalar" in attrs:
        if not isinstance(attrs["scalar"], float) or tuple(a) != tuple(y):
            raise CallShapeError(f"mask_compare of {list(a)} with scalar={attrs['scalar']!r} into {list(y)}: "
                                 f"expected a float scalar and y of a's shape")
        return [(a, F32)], [(y, BOOL)]
    b = at(I, 1, "input 1 (b)")
    if broadcast_shape(a, b) != tuple(y):
        raise CallShapeError(f"mask_compare of {list(a)} and {list(b)} into {list(y)}: a and b must broadcast to y")
    return [(a, F32), (b, F32)], [(y, BOOL)]


def _compare_encode(kind, a, IS, OS, I, O, variant, call):
    from port.ops.elementwise import collapse
    if "scalar" in a:
        return Encoded("port_mask_compare_scalar", (O[0], I[0]), (int(a["op"]), numel(OS[0])), (a["scalar"],))
    dims, ma, mb = collapse(IS[0], IS[1], OS[0])
    return Encoded("port_mask_compare", (O[0], I[0], I[1]), (int(a["op"]), len(dims), ma, mb, *_pad(dims)))


def _compare_torch(kind, a, I, O, env):
    f = getattr(env.torch, ("eq", "ne", "lt", "le", "gt", "ge")[int(a["op"])])
    return lambda: f(I[0], a["scalar"] if "scalar" in a else I[1], out=O[0])


# ---- where: cond ? a : b, a and b float32 tensors or numbers, the three broadcast on every axis -------------
# Forward inputs: the tensor operands among a, b (in that order), then cond; attributes a_value / b_value for a
# number operand. Gradient ``where.grad_input`` (inputs dy, cond; outputs the wanted gradients, attribute grads:
# operand indices 0 = a, 1 = b): dy where cond (a) / where not cond (b), each summed to its operand's shape.
def _where_capture(ctx):
    import math

    from port.ops.elementwise import broadcast_shape, collapse_n
    n = ctx.node
    if len(n.args) != 3 or not hasattr(n.args[0], "name"):
        return False
    c, y, attrs, xs, shapes = ctx.t(n.args[0]), ctx.out(), {}, [], []
    for v, key in zip(n.args[1:], ("a_value", "b_value")):
        if hasattr(v, "name"):
            if ctx.is_param(v) or ctx.dtype(ctx.t(v)) != F32:
                return False        # a trained operand: a torch_op (a buffer is read, not differentiated)
            xs.append(ctx.t(v))
            shapes.append(ctx.shape(ctx.t(v)))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(float(v)) and \
                (math.isinf(float(v)) or abs(float(v)) <= 3.4e38):
            attrs[key] = float(v)
        else:
            return False
    sy = ctx.shape(y)
    if ctx.dtype(c) != BOOL or ctx.dtype(y) != F32 or broadcast_shape(ctx.shape(c), sy) != sy or \
            any(broadcast_shape(s, sy) != sy for s in shapes) or len(collapse_n(sy, ctx.shape(c), *shapes)[0]) > _RANK:
        return False
    return fwd(ctx, "where", attrs, tuple(xs), (y,), 0, numel(sy), buffers={"cond": c})


def _where_operands(attrs) -> tuple[int, ...]:
    """The operand indices (0 = a, 1 = b) of the forward's tensor inputs, in input order."""
    return tuple(i for i, key in enumerate(("a_value", "b_value")) if key not in attrs)


def _where_backward(bc, f, fo, gy, xs_needing, trained):
    ops_ = _where_operands(f.attrs)
    idx = tuple(ops_[i] for i, t in enumerate(f.x) if t in xs_needing)
    if not idx:
        return
    outs = [(f.x[ops_.index(i)], bc.new_grad(f.x[ops_.index(i)], "")) for i in idx]
    n = numel(bc.T[f.outputs[0]].shape)
    bc.op(f"{f.name}.grad_input", f.layer, "where.grad_input", {"grads": idx}, (gy, f.buffers["cond"]),
          tuple(g for _, g in outs), vector_flops=n * len(idx), forward_op=fo.id)
    for t, g in outs:
        bc.contribute(t, g, f.layer)


def _where_shapes(k, attrs, I, O, at):
    from port.ops.elementwise import broadcast_shape
    if k == "where":
        for key in ("a_value", "b_value"):
            if key in attrs and not isinstance(attrs[key], float):
                raise CallShapeError(f"attribute {key}={attrs[key]!r}: expected a float")
        ops_ = _where_operands(attrs)
        xs = [at(I, j, f"input {j} ({'ab'[i]})") for j, i in enumerate(ops_)]
        c = at(I, len(ops_), f"input {len(ops_)} (cond)")
        y = tuple(at(O, 0, "output 0 (y)"))
        if any(broadcast_shape(s, y) != y for s in xs + [c]):
            raise CallShapeError(f"where of cond {list(c)} and {[list(s) for s in xs]} into {list(y)}: every "
                                 f"operand must broadcast to y")
        return [(s, F32) for s in xs] + [(c, BOOL)], [(y, F32)]
    g = attrs.get("grads")
    if g not in ((0,), (1,), (0, 1)):
        raise CallShapeError(f"attribute grads={g!r}: expected (0,), (1,) or (0, 1) (0: a, 1: b)")
    dy, c = tuple(at(I, 0, "input 0 (dy)")), at(I, 1, "input 1 (cond)")
    outs = [at(O, j, f"output {j}") for j in range(len(g))]
    if any(broadcast_shape(s, dy) != dy for s in outs + [c]):
        raise CallShapeError(f"where.grad_input: cond {list(c)} and the gradients {[list(s) for s in outs]} must "
                             f"broadcast to dy {list(dy)}")
    return [(dy, F32), (c, BOOL)], [(s, F32) for s in outs]


def _where_encode(kind, a, IS, OS, I, O, variant, call):
    """port_where_forward (y, cond, a, b; NULL for a number) / port_where_backward (da, db, dy, cond; NULL where
    not wanted). An operand the call does not take has the output's shape."""
    from port.ops.elementwise import collapse_n
    if kind == "where":
        ops_ = _where_operands(a)
        sy, sc = tuple(OS[0]), tuple(IS[len(ops_)])
        shape = {i: tuple(IS[j]) for j, i in enumerate(ops_)}
        dims, (mc, ma, mb) = collapse_n(sy, sc, shape.get(0, sy), shape.get(1, sy))
        ptr = {i: I[j] for j, i in enumerate(ops_)}
        scalars = int("a_value" in a) | 2 * int("b_value" in a)
        return Encoded("port_where_forward", (O[0], I[len(ops_)], ptr.get(0), ptr.get(1)),
                       (len(dims), mc, ma, mb, *_pad(dims), scalars),
                       (float(a.get("a_value", 0.0)), float(a.get("b_value", 0.0))))
    g, sy = tuple(a["grads"]), tuple(IS[0])
    shape = {i: tuple(OS[j]) for j, i in enumerate(g)}
    dims, (mc, ma, mb) = collapse_n(sy, tuple(IS[1]), shape.get(0, sy), shape.get(1, sy))
    out = {i: O[j] for j, i in enumerate(g)}
    return Encoded("port_where_backward", (out.get(0), out.get(1), I[0], I[1]), (len(dims), mc, ma, mb, *_pad(dims)))


def _where_torch(kind, a, I, O, env):
    torch = env.torch
    if kind == "where":
        ops_ = _where_operands(a)
        got = {i: I[j] for j, i in enumerate(ops_)}
        c = I[len(ops_)]
        va, vb = got.get(0, a.get("a_value")), got.get(1, a.get("b_value"))
        return lambda: O[0].copy_(torch.where(c, va, vb))
    dy, c, g = I[0], I[1], tuple(a["grads"])

    def run():
        for i, d in zip(g, O):
            p = torch.where(c, dy, 0.0) if i == 0 else torch.where(c, 0.0, dy)
            d.copy_(p if p.shape == d.shape else p.sum_to_size(d.shape))
    return run


# ---- last-token pooling of HF's sequence classifiers (GPT-2, Llama): int32 (ids != pad) * arange, argmax(-1),
# logits[arange(B), idx] and its gradient ---------------------------------------------------------------------
_INT_OPS = {"add": 0, "sub": 1, "mul": 2}


def _int_binary_capture(ctx):
    from port.ops.base import arg
    from port.ops.elementwise import broadcast_shape, collapse
    n = ctx.node
    op = _INT_OPS.get(_packet(ctx))
    if op is None or len(n.args) < 2 or not all(hasattr(v, "name") for v in n.args[:2]) or \
            arg(n, 2, "alpha", 1) != 1 or any(map(ctx.is_param, n.args[:2])):
        return False
    a, b, y = ctx.t(n.args[0]), ctx.t(n.args[1]), ctx.out()
    dt = ctx.dtype(a)
    if dt not in (I32, I64) or ctx.dtype(b) != dt or ctx.dtype(y) != dt or \
            broadcast_shape(ctx.shape(a), ctx.shape(b)) != ctx.shape(y) or \
            len(collapse(ctx.shape(a), ctx.shape(b), ctx.shape(y))[0]) > _RANK:
        return False
    return fwd(ctx, "int_binary", {"op": op, "dtype": dt}, (a, b), (y,), 0, numel(ctx.shape(y)))


def _int_binary_shapes(k, attrs, I, O, at):
    from port.ops.elementwise import broadcast_shape
    if attrs.get("op") not in (0, 1, 2):
        raise CallShapeError(f"attribute op={attrs.get('op')!r}: expected 0 (add), 1 (sub) or 2 (mul)")
    a, b, y = at(I, 0, "input 0 (a)"), at(I, 1, "input 1 (b)"), at(O, 0, "output 0 (y)")
    if broadcast_shape(a, b) != tuple(y):
        raise CallShapeError(f"int_binary of {list(a)} and {list(b)} into {list(y)}: a and b must broadcast to y")
    dt = attrs.get("dtype")
    if dt not in (I32, I64):
        raise CallShapeError(f"attribute dtype={dt!r}: expected int32 or int64")
    return [(a, dt), (b, dt)], [(y, dt)]


def _int_binary_encode(kind, a, IS, OS, I, O, variant, call):
    from port.ops.elementwise import collapse
    dims, ma, mb = collapse(IS[0], IS[1], OS[0])
    return Encoded("port_int_binary", (O[0], I[0], I[1]),
                   (_DT[a["dtype"]], int(a["op"]), len(dims), ma, mb, *_pad(dims)))


def _int_binary_torch(kind, a, I, O, env):
    f = (env.torch.add, env.torch.sub, env.torch.mul)[int(a["op"])]
    return lambda: f(I[0], I[1], out=O[0])


def _argmax_capture(ctx):
    from port.ops.base import arg
    n = ctx.node
    if not n.args or not hasattr(n.args[0], "name"):
        return False
    x, y = ctx.t(n.args[0]), ctx.out()
    shape, dim = ctx.shape(x), arg(n, 1, "dim")
    if ctx.dtype(x) not in _DT or ctx.dtype(y) != I64 or not shape or numel(shape) == 0:
        return False
    if dim is None:                                     # over every element
        rows, cols = 1, numel(shape)
    elif isinstance(dim, int) and dim in (-1, len(shape) - 1):
        rows, cols = numel(shape) // shape[-1], shape[-1]
    else:
        return False
    if numel(ctx.shape(y)) != rows:
        return False
    return fwd(ctx, "argmax_rows", {"x_dtype": ctx.dtype(x), "cols": cols}, (x,), (y,), 0, numel(shape))


def _argmax_shapes(k, attrs, I, O, at):
    x, y = at(I, 0, "input 0 (x)"), at(O, 0, "output 0 (y)")
    xd, cols = attrs.get("x_dtype"), attrs.get("cols")
    if xd not in _DT or type(cols) is not int or cols < 1 or numel(x) % cols or numel(y) != numel(x) // cols:
        raise CallShapeError(f"argmax_rows of {list(x)} ({xd!r}) into {list(y)} with cols={cols!r}: expected a "
                             f"dtype among {sorted(_DT)} and one index per row of cols elements")
    return [(x, xd)], [(y, I64)]


def _argmax_encode(kind, a, IS, OS, I, O, variant, call):
    cols = int(a["cols"])
    return Encoded("port_argmax_rows", (O[0], I[0]), (_DT[a["x_dtype"]], numel(IS[0]) // cols, cols))


def _argmax_torch(kind, a, I, O, env):
    cols = int(a["cols"])
    return lambda: O[0].copy_(I[0].reshape(-1, cols).argmax(-1).reshape(O[0].shape))


def _rows_capture(ctx):
    from port.ops.elementwise import broadcast_shape, collapse
    n = ctx.node
    if len(n.args) != 2 or not hasattr(n.args[0], "name") or not isinstance(n.args[1], (list, tuple)) or \
            len(n.args[1]) != 2 or not all(hasattr(i, "name") for i in n.args[1]) or ctx.is_param(n.args[0]) or \
            ctx.is_buffer(n.args[0]):
        return False
    x = ctx.t(n.args[0])
    i0, i1 = (ctx.t(i) for i in n.args[1])
    y, sx = ctx.out(), ctx.shape(x)
    s0, s1 = ctx.shape(i0), ctx.shape(i1)
    sb = broadcast_shape(s0, s1)
    if ctx.dtype(x) != F32 or len(sx) < 2 or ctx.dtype(i0) != I64 or ctx.dtype(i1) != I64 or sb is None or \
            ctx.shape(y) != tuple(sb) + tuple(sx[2:]) or len(collapse(s0, s1, sb)[0]) > _RANK:
        return False
    return fwd(ctx, "index2_rows", {}, (x,), (y,), 0, numel(ctx.shape(y)), buffers={"i0": i0, "i1": i1})


def _rows_shapes(k, attrs, I, O, at):
    from port.ops.elementwise import broadcast_shape
    a, i0, i1, b = at(I, 0, "input 0"), at(I, 1, "input 1 (i0)"), at(I, 2, "input 2 (i1)"), at(O, 0, "output 0")
    x, y = (a, b) if k == "index2_rows" else (b, a)          # the gradient: dy [..., inner] -> dx [rows, cols, ...]
    sb = broadcast_shape(i0, i1)
    if len(x) < 2 or sb is None or tuple(y) != tuple(sb) + tuple(x[2:]):
        raise CallShapeError(f"{k}: {list(x)}[{list(i0)}, {list(i1)}] -> {list(y)}: x needs 2 dims or more, the "
                             f"indices broadcast, y their shape followed by x's dims after the first two")
    return [(a, F32), (i0, I64), (i1, I64)], [(b, F32)]


def _rows_encode(kind, a, IS, OS, I, O, variant, call):
    from port.ops.elementwise import broadcast_shape, collapse
    scatter = int(kind != "index2_rows")
    x = OS[0] if scatter else IS[0]
    dims, m0, m1 = collapse(IS[1], IS[2], broadcast_shape(IS[1], IS[2]))
    return Encoded("port_index2_rows", (O[0], I[0], I[1], I[2]),
                   (x[0], x[1], numel(x[2:]), len(dims), m0, m1, *_pad(dims), scatter))


def _rows_torch(kind, a, I, O, env):
    if kind == "index2_rows":
        return lambda: O[0].copy_(I[0][I[1], I[2]])

    def run():
        O[0].zero_()
        O[0].index_put_((I[1], I[2]), I[0], accumulate=True)
    return run


_NO_GRAD = frozenset({"no_grad", "checkpoint"})


def _gradient_reads(*names: str) -> dict:
    """The fields of a differentiated record whose gradient reads (and so saves) these forward buffers (a mask,
    index tensors); one vector op per output element."""
    def reads(f):
        return tuple(f.buffers[n] for n in names)
    return {"saved": lambda f, gi, gw, wanted: reads(f) if gi else (), "grad_input_reads": reads,
            "bwd_vector_flops": lambda f, T: numel(T[f.outputs[0]].shape), "tags": frozenset({"checkpoint"})}

register(
    OpRecord(kind="mask_cast", family="mask", kernels={"mask_cast": ("port_mask_cast",)}, shapes=_cast_shapes,
             torch=_cast_torch, encode=_cast_encode, aten=("_to_copy", "to"), capture=_cast_capture, tags=_NO_GRAD,
             doc="mask_cast: a cast to bool (x != 0) of a float32/int64/int32/bool tensor, to float32 of a "
                 "bool/int64/int32 one (HF's attention_mask.bool()), or to int32 of a bool one (the non-pad mask of "
                 "HF's sequence classifiers); no gradient. C kernel port_mask_cast."),
    OpRecord(kind="mask_logic", family="mask", kernels={"mask_logic": ("port_mask_logic",)}, shapes=_logic_shapes,
             torch=_logic_torch, encode=_logic_encode, aten=tuple(_LOGIC) + _NOT, capture=_logic_capture, tags=_NO_GRAD,
             doc="mask_logic: and / or / xor / not (attribute op 0..3; not reads a twice) of two bool masks broadcast on every axis (a "
                 "padding mask and a causal mask); no gradient. C kernel port_mask_logic (up to 6 merged dims)."),
    OpRecord(kind="mask_compare", family="mask",
             kernels={"mask_compare": ("port_mask_compare", "port_mask_compare_scalar")}, shapes=_compare_shapes,
             torch=_compare_torch, encode=_compare_encode, aten=tuple(_CMP), capture=_compare_capture, tags=_NO_GRAD,
             doc="mask_compare: eq / ne / lt / le / gt / ge (attribute op 0..5) of two float32 tensors broadcast on "
                 "every axis, or of a tensor and a Python number (attribute scalar), into a bool mask; no gradient. "
                 "C kernels port_mask_compare (up to 6 merged dims), port_mask_compare_scalar."),
    OpRecord(kind="expand_mask", family="mask", kernels={"expand_mask": ("port_expand_mask",)},
             shapes=_expand_shapes, torch=lambda k, a, I, O, env: (lambda: O[0].copy_(I[0].expand(O[0].shape))),
             encode=_expand_encode, aten=("expand",), capture=_expand_capture, tags=_NO_GRAD,
             doc="expand_mask: a bool mask broadcast to a larger shape (a copy); no gradient. C kernel "
                 "port_expand_mask (up to 6 merged dims)."),
    OpRecord(kind="mask_index2", family="mask", kernels={"mask_index2": ("port_mask_index2",)},
             shapes=_index_shapes, torch=lambda k, a, I, O, env: (lambda: O[0].copy_(I[0][I[1], I[2]])),
             encode=_index_encode, aten=("index",), capture=_index_capture, tags=_NO_GRAD,
             doc="mask_index2: a 2-D bool mask gathered by two int64 index tensors broadcast to the output "
                 "(HF's attention_mask[batch_idx, kv_idx]); an index out of range is refused. C kernel "
                 "port_mask_index2."),
    OpRecord(kind="where", family="mask", backward=_where_backward, **_gradient_reads("cond"),
             kernels={"where": ("port_where_forward",), "where.grad_input": ("port_where_backward",)},
             shapes=_where_shapes, torch=_where_torch, encode=_where_encode, aten=("where",), capture=_where_capture,
             doc="where: cond ? a : b of float32 tensors or Python numbers (attributes a_value / b_value; NaN "
                 "refused), cond a bool mask, the three broadcast on every axis (HF's masked scores); the gradient "
                 "dy where cond to a, where not cond to b, each summed to its operand's shape; cond is read, not "
                 "differentiated (saved). A buffer operand is read (HF's mask value); a parameter operand stays a "
                 "torch_op. C kernels "
                 "port_where_forward/backward (up to 6 merged dims)."),
    OpRecord(kind="int_binary", family="mask", kernels={"int_binary": ("port_int_binary",)},
             shapes=_int_binary_shapes, torch=_int_binary_torch, encode=_int_binary_encode,
             aten=tuple(_INT_OPS), capture=_int_binary_capture, tags=_NO_GRAD,
             doc="int_binary: add / sub / mul (attribute op 0..2) of two int32 or int64 tensors (attribute dtype) "
                 "broadcast on every axis, wrapping around as torch (HF's (ids != pad) * arange); "
                 "no gradient. C kernel port_int_binary (up to 6 merged dims)."),
    OpRecord(kind="argmax_rows", family="mask", kernels={"argmax_rows": ("port_argmax_rows",)},
             shapes=_argmax_shapes, torch=_argmax_torch, encode=_argmax_encode, aten=("argmax",),
             capture=_argmax_capture, tags=_NO_GRAD,
             doc="argmax_rows: the int64 index of the first largest element of each row of cols elements (argmax "
                 "over the last axis, or over all elements) of a float32 (NaN the largest), bool, int64 or int32 "
                 "tensor; no gradient. C kernel port_argmax_rows."),
    OpRecord(kind="index2_rows", family="mask", **_gradient_reads("i0", "i1"),
             kernels={"index2_rows": ("port_index2_rows",), "index2_rows.grad_input": ("port_index2_rows",)},
             shapes=_rows_shapes, torch=_rows_torch, encode=_rows_encode, aten=("index",), capture=_rows_capture,
             doc="index2_rows: x[i0, i1] of a float32 x [rows, cols, ...] by two int64 index tensors broadcast "
                 "together (HF's logits[arange(B), last_non_pad]); the gradient scatters dy back into zeros, "
                 "adding in index order (the indices read, not differentiated; saved). C kernel port_index2_rows "
                 "(scatter 0 / 1)."),
)
