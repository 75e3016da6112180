"""Shape ops: ``reshape`` (every aten op whose result is its input's bytes: view, reshape, flatten,
(un)squeeze, clone, a full slice, a same-dtype copy; a view, no call), ``permute`` (transpose, permute, t: a
copy, the kernels read contiguous tensors), and the integer ops ``arange`` and ``ne_scalar`` (x != value:
attention masks from token ids).
"""
from __future__ import annotations

from port.ir.types import DTYPE_BYTES, ROLE_ACTIVATION, TensorSpec, numel
from port.ops import register
from port.ops.base import F32, I64, CallShapeError, Encoded, Fwd, OpRecord, arg, float32, fwd, rank

# aten ops whose result is their input's bytes (PORT's tensors are contiguous, so a reshape is free)
ALIAS_OPS = ("view", "_unsafe_view", "reshape", "flatten", "unsqueeze", "squeeze", "alias", "clone",
             "contiguous", "lift_fresh_copy", "view_as")


def view_fwd(b, name: str, layer: str, x: int, y: int) -> Fwd:
    """A reshape op making ``y`` a view of ``x``'s bytes."""
    t = b.tensors[y]
    b.tensors[y] = TensorSpec(t.id, t.name, t.shape, t.dtype, t.role, alias_of=x)
    return Fwd(name, layer, "reshape", dict(shape=t.shape), (x,), {}, {}, (y,), 0, 0)


def _reshape_capture(ctx):
    from port.ir import capture as C
    n = ctx.node
    packet = n.target._overloadpacket.__name__
    v = C.val_of(n)
    if packet == "copy":      # aten.copy(self, src) (functionalized slice assignment): self's shape, src's values
        dst, src = ctx.t(n.args[0]), ctx.t(n.args[1])
        if ctx.shape(dst) == ctx.shape(src) and ctx.dtype(dst) == ctx.dtype(src):
            return ctx.alias(src)
        return False
    x = ctx.t(n.args[0])
    if packet == "slice":      # a slice over the whole dim
        if tuple(v.shape) == ctx.shape(x) and arg(n, 4, "step", 1) == 1:
            return ctx.alias(x)
        return False
    if packet in ("_to_copy", "to"):
        return ctx.alias(x) if C.dtype_name(v.dtype) == ctx.dtype(x) else False
    if numel(tuple(v.shape)) != numel(ctx.shape(x)) or C.dtype_name(v.dtype) != ctx.dtype(x):
        return False
    return ctx.alias(x)


def _reshape_backward(bc, f, fo, gy, xs_needing, trained):
    if xs_needing:
        x = f.x[0]
        g = bc.view_grad(x, gy)
        bc.op(f"{f.name}.grad_input", f.layer, "reshape.grad_input", dict(shape=bc.T[x].shape), (gy,), (g,),
              forward_op=fo.id)
        bc.contribute(x, g, f.layer)


def _no_shapes(k, attrs, I, O, at):
    raise CallShapeError(f"{k} is a view: no call runs it")


# ---------------------------------------------------------------------------------------------
# permute
# ---------------------------------------------------------------------------------------------
def inverse_perm(perm) -> tuple[int, ...]:
    """The permutation that undoes ``perm`` (a permute's gradient permutes back with it)."""
    inv = [0] * len(perm)
    for i, j in enumerate(perm):
        inv[j] = i
    return tuple(inv)


def _permute_capture(ctx):
    n = ctx.node
    x = ctx.t(n.args[0])
    r = len(ctx.shape(x))
    packet = n.target._overloadpacket.__name__
    if packet == "permute":
        perm = [d % r for d in n.args[1]]
    else:
        d0, d1 = (n.args[1], n.args[2]) if packet == "transpose" else (0, 1)
        perm = list(range(r))
        perm[d0 % r], perm[d1 % r] = perm[d1 % r], perm[d0 % r]
    if perm == list(range(r)):
        return ctx.alias(x)
    if r > 6 or not float32(ctx, x):
        return False
    return fwd(ctx, "permute", dict(perm=tuple(perm)), (x,), (ctx.out(),))


def _perm_attr(attrs: dict, r: int) -> tuple[int, ...]:
    p = attrs.get("perm")
    if not isinstance(p, tuple) or sorted(p) != list(range(r)) or not 1 <= r <= 6:
        raise CallShapeError(f"attribute perm={p!r}: expected a permutation of 0..{r - 1} (rank <= 6)")
    return p


def _permute_shapes(k, attrs, I, O, at):
    x = at(I, 0, "input 0")
    p = _perm_attr(attrs, len(x))
    if k == "permute.grad_input":
        p = inverse_perm(p)
    return [(x, F32)], [(tuple(x[i] for i in p), F32)]


def _permute_encode(kind, a, IS, OS, I, O, variant, call):
    x = IS[0]
    p = list(inverse_perm(a["perm"]) if kind == "permute.grad_input" else a["perm"])
    r = len(x)
    return Encoded("port_permute", (O[0], I[0]), (r, *(list(x) + [1] * (6 - r)), *(p + list(range(r, 6)))))


def _permute_torch(kind, a, I, O, env):
    p = list(inverse_perm(a["perm"]) if kind == "permute.grad_input" else a["perm"])
    x, y = I[0], O[0]
    return lambda: y.copy_(x.permute(p))


# ---------------------------------------------------------------------------------------------
# arange, ne_scalar (integer results: no gradient)
# ---------------------------------------------------------------------------------------------
def _arange_capture(ctx):
    from port.ir import capture as C
    n = ctx.node
    if len(n.args) != 1 or C.dtype_name(C.val_of(n).dtype) != I64:
        return False
    return fwd(ctx, "arange", dict(start=0), (), (ctx.out(),))


def _arange_shapes(k, attrs, I, O, at):
    return [], [(rank(at(O, 0, "output 0"), 1, "y"), I64)]


def _ne_capture(ctx):
    from port.ir import capture as C
    n = ctx.node
    x = ctx.t(n.args[0])
    if n.target._overloadpacket.__name__ in ("_to_copy", "to"):   # int64 -> bool: x != 0
        if ctx.dtype(x) != I64 or C.dtype_name(C.val_of(n).dtype) != "bool":
            return False
        return fwd(ctx, "ne_scalar", dict(value=0), (x,), (ctx.out(),), 0, numel(ctx.shape(x)))
    c = n.args[1]
    if ctx.dtype(x) != I64 or not isinstance(c, int) or isinstance(c, bool):
        return False
    y = ctx.out()
    return fwd(ctx, "ne_scalar", dict(value=int(c)), (x,), (y,), 0, numel(ctx.shape(y)))


def _ne_shapes(k, attrs, I, O, at):
    x = at(I, 0, "input 0")
    if type(attrs.get("value")) is not int:
        raise CallShapeError(f"attribute value={attrs.get('value')!r}: expected an int")
    return [(x, I64)], [(x, "bool")]


register(
    OpRecord(kind="reshape", family="shape", kernels={"reshape": (), "reshape.grad_input": ()}, shapes=_no_shapes,
             aten=ALIAS_OPS + ("slice", "_to_copy", "to", "copy"), capture=_reshape_capture,
             backward=_reshape_backward, views=("reshape", "reshape.grad_input"),
             tags=frozenset({"not_recomputable"}), doc=__doc__),
    OpRecord(kind="permute", family="shape", kernels={"permute": ("port_permute",),
                                                      "permute.grad_input": ("port_permute",)},
             shapes=_permute_shapes, torch=_permute_torch, encode=_permute_encode,
             aten=("transpose", "permute", "t"), capture=_permute_capture, doc=__doc__),
    OpRecord(kind="arange", family="shape", kernels={"arange": ("port_arange_i64",)}, shapes=_arange_shapes,
             torch=lambda k, a, I, O, env: (lambda: env.torch.arange(
                 int(a.get("start", 0)), int(a.get("start", 0)) + O[0].numel(), out=O[0])),
             encode=lambda k, a, IS, OS, I, O, v, call: Encoded("port_arange_i64", (O[0],),
                                                                (numel(OS[0]), int(a.get("start", 0)))),
             aten=("arange",), capture=_arange_capture, tags=frozenset({"no_grad"}), doc=__doc__),
    OpRecord(kind="ne_scalar", family="shape", kernels={"ne_scalar": ("port_ne_scalar_i64",)}, shapes=_ne_shapes,
             torch=lambda k, a, I, O, env: (lambda: env.torch.ne(I[0], int(a["value"]), out=O[0])),
             encode=lambda k, a, IS, OS, I, O, v, call: Encoded("port_ne_scalar_i64", (O[0], I[0]),
                                                                (numel(IS[0]), int(a["value"]))),
             aten=("ne", "_to_copy", "to"), capture=_ne_capture, tags=frozenset({"no_grad"}), doc=__doc__),
)


# ---------------------------------------------------------------------------------------------
# cat: a copy along one dim (one port_slice_copy per input); its gradient hands each input its slice of dy
# ---------------------------------------------------------------------------------------------
def _cat_capture(ctx):
    n = ctx.node
    parts, dim = n.args[0], arg(n, 1, "dim", 0)
    if not isinstance(parts, (list, tuple)) or not parts or any(
            not hasattr(p, "name") or ctx.is_param(p) or ctx.is_buffer(p) for p in parts):
        return False
    xs = tuple(ctx.t(p) for p in parts)
    if not float32(ctx, *xs) or len({len(ctx.shape(x)) for x in xs}) != 1:
        return False       # (a legacy empty [0] operand, or not float32: a torch_op)
    y = ctx.out()
    d = dim % len(ctx.shape(y))
    return fwd(ctx, "cat", dict(dim=d, sizes=tuple(ctx.shape(x)[d] for x in xs)), xs, (y,), 0, numel(ctx.shape(y)))


def _cat_backward(bc, f, fo, gy, xs_needing, trained):
    need = tuple(i for i, t in enumerate(f.x) if t in xs_needing)
    if not need:
        return
    outs = [(f.x[i], bc.new_grad(f.x[i], "")) for i in need]
    bc.op(f"{f.name}.grad_input", f.layer, "cat.grad_input", dict(dim=f.attrs["dim"], sizes=f.attrs["sizes"],
                                                                  grads=need),
          (gy,), tuple(g for _, g in outs), vector_flops=sum(numel(bc.T[t].shape) for t, _ in outs),
          forward_op=fo.id)
    for x, g in outs:
        bc.contribute(x, g, f.layer)


def _cat_shapes(k, attrs, I, O, at):
    d, sizes = attrs.get("dim"), attrs.get("sizes")
    if not isinstance(sizes, tuple) or not sizes or any(type(s) is not int or s < 0 for s in sizes):
        raise CallShapeError(f"attribute sizes={sizes!r}: expected a tuple of ints >= 0")
    y = at(O, 0, "output 0") if k == "cat" else at(I, 0, "input 0 (dy)")
    if type(d) is not int or not 0 <= d < len(y) or y[d] != sum(sizes):
        raise CallShapeError(f"attribute dim={d!r}, sizes={sizes!r} do not fit the concatenation {list(y)}")
    part = lambda s: (tuple(y[:d]) + (s,) + tuple(y[d + 1:]), F32)      # noqa: E731
    if "part" in attrs:              # one call per input (_cat_calls)
        i = attrs["part"]
        if type(i) is not int or not 0 <= i < len(sizes):
            raise CallShapeError(f"attribute part={i!r}: expected an input index below {len(sizes)}")
        return ([part(sizes[i])], [(tuple(y), F32)]) if k == "cat" else ([(tuple(y), F32)], [part(sizes[i])])
    if k == "cat":
        return [part(s) for s in sizes], [(tuple(y), F32)]
    g = attrs.get("grads")
    if not isinstance(g, tuple) or not g or any(type(i) is not int or not 0 <= i < len(sizes) for i in g) \
            or list(g) != sorted(set(g)):
        raise CallShapeError(f"attribute grads={g!r}: expected increasing input indices below {len(sizes)}")
    return [(tuple(y), F32)], [part(sizes[i]) for i in g]


def _cat_calls(graph, op, variant):
    """One call per input (attribute ``part``): the forward copies input i into its range of y, the gradient
    copies each wanted input's range of dy out (port_slice_copy)."""
    base = {k: v for k, v in op.attrs if k != "grads"}
    if op.kind == "cat":
        return [("cat", op.outputs, (x,), base | {"part": i}, ()) for i, x in enumerate(op.inputs)]
    return [(op.kind, (g,), op.inputs, base | {"part": i}, ()) for i, g in zip(op.attr("grads"), op.outputs)]


def _outer_inner(shape, d: int) -> tuple[int, int]:
    return numel(shape[:d]), numel(shape[d + 1:])


def _cat_encode(kind, a, IS, OS, I, O, variant, call):
    """port_slice_copy of one part: input ``part`` into its range of y (forward), or that range of dy into the
    part's gradient."""
    d, sizes, i = a["dim"], a["sizes"], a["part"]
    full = OS[0] if kind == "cat" else IS[0]
    outer, inner = _outer_inner(full, d)
    off, n = sum(sizes[:i]), sizes[i]
    if kind == "cat":
        return Encoded("port_slice_copy", (O[0], I[0]), (outer, inner, full[d], n, n, off, 0, 0))
    return Encoded("port_slice_copy", (O[0], I[0]), (outer, inner, n, full[d], n, 0, off, 0))


def _cat_torch(kind, a, I, O, env):
    torch, d = env.torch, a["dim"]
    if "part" in a:                  # one input (its range of y; or that range of dy for its gradient)
        i = a["part"]
        off, n = sum(a["sizes"][:i]), a["sizes"][i]
        if kind == "cat":
            return lambda: O[0].narrow(d, off, n).copy_(I[0])
        return lambda: O[0].copy_(I[0].narrow(d, off, n))
    if kind == "cat":
        return lambda: torch.cat(I, d, out=O[0])
    starts = [sum(a["sizes"][:i]) for i in range(len(a["sizes"]))]
    slices = [(o, starts[i], a["sizes"][i]) for i, o in zip(a["grads"], O)]
    dy = I[0]

    def run():
        for o, s, n in slices:
            o.copy_(dy.narrow(d, s, n))
    return run


register(OpRecord(kind="cat", family="shape", kernels={"cat": ("port_slice_copy",),
                                                        "cat.grad_input": ("port_slice_copy",)},
                  shapes=_cat_shapes, torch=_cat_torch, encode=_cat_encode, calls=_cat_calls, aten=("cat",),
                  capture=_cat_capture, backward=_cat_backward, tags=frozenset({"checkpoint"}),
                  c_supports=lambda a: all(s >= 1 for s in a.get("sizes", ())),
                  doc="cat: inputs concatenated along ``dim`` (attribute ``sizes``: each input's extent); the "
                      "gradient copies each input's slice of dy. Saves nothing. One call per input (attribute "
                      "``part``), C kernel port_slice_copy."))


# ---------------------------------------------------------------------------------------------
# narrow: a contiguous range along one dim (slice with step 1, select, the items of split, chunk, unbind); a
# copy (port_slice_copy), or a view (narrow_view: an alias at a byte offset, no call) where the range is one run of
# x's bytes. Either's gradient writes dy into that range of a zeroed dx.
# ---------------------------------------------------------------------------------------------
def _clamp_start(start, size: int) -> int:
    s = 0 if start is None else int(start)
    s = s + size if s < 0 else s
    return min(max(s, 0), size)


def _narrow_capture(ctx):
    """slice.Tensor (step 1), select.int, and an item of split / split_with_sizes / unbind (``ctx.src``)."""
    from port.ir import capture as C
    n = ctx.src if ctx.src is not None else ctx.node
    packet = n.target._overloadpacket.__name__
    xa = n.args[0]
    if not hasattr(xa, "name") or ctx.is_param(xa):
        return False               # a parameter's slice: a torch_op (its gradient accumulates into the weight)
    x = ctx.t(xa)
    xs = ctx.shape(x)
    if not xs:
        return False
    squeeze = False
    if ctx.src is not None:
        i = ctx.index
        if packet == "unbind":
            d = arg(n, 1, "dim", 0) % len(xs)
            start, length, squeeze = i, 1, True
        elif packet in ("split", "split_with_sizes"):
            d = arg(n, 2, "dim", 0) % len(xs)
            sz = n.args[1]
            sizes = list(sz) if isinstance(sz, (list, tuple)) else \
                [min(int(sz), xs[d] - k) for k in range(0, xs[d], int(sz))]
            if i >= len(sizes):
                return False
            start, length = sum(sizes[:i]), sizes[i]
        else:
            return False
    elif packet == "select":
        d = n.args[1] % len(xs)
        idx = int(n.args[2])
        start, length, squeeze = idx + xs[d] if idx < 0 else idx, 1, True
    else:                          # slice(x, dim, start, end, step)
        if arg(n, 4, "step", 1) != 1:
            return False
        d = arg(n, 1, "dim", 0) % len(xs)
        start = _clamp_start(arg(n, 2, "start"), xs[d])
        length = tuple(C.val_of(ctx.node).shape)[d]
    y = ctx.out()
    attrs = dict(dim=d, start=int(start), length=int(length), size=int(xs[d]), squeeze=squeeze)
    if ctx.dtype(x) != F32:        # (int64 position ids: copied as pairs of 4-byte words; other dtypes: torch)
        attrs["dtype"] = ctx.dtype(x)
    kind = "narrow"
    if is_contiguous_range(xs, d, length):
        kind = "narrow_view"
        t = ctx.b.tensors[y]
        ctx.b.tensors[y] = TensorSpec(t.id, t.name, t.shape, t.dtype, t.role, alias_of=x,
                                      alias_offset=int(start) * numel(xs[d + 1:]) * DTYPE_BYTES[ctx.dtype(x)])
    if ctx.is_buffer(xa):          # a slice of a buffer (position ids): no gradient
        return fwd(ctx, kind, attrs, (), (y,), buffers={"in0": x})
    return fwd(ctx, kind, attrs, (x,), (y,))


def is_contiguous_range(shape, d: int, length: int) -> bool:
    """Whether the range of ``length`` items along dim ``d`` of a contiguous tensor of ``shape`` is one contiguous
    run of its bytes (every dim before ``d`` is 1: a slice along the outermost non-1 dim, a channel slice of an
    N=1 map, a batch slice, select on dim 0, the items of a split along dim 0; or the range is the whole dim, as
    select on a dim of 1): such a range is a view."""
    return length >= 1 and (numel(shape[:d]) == 1 or length == shape[d])


def _narrow_attrs(attrs: dict, r: int) -> tuple[int, int, int, int, bool]:
    d, s, n, size, sq = (attrs.get(k) for k in ("dim", "start", "length", "size", "squeeze"))
    if not all(type(v) is int for v in (d, s, n, size)) or not 0 <= d < r or not 0 <= s <= s + n <= size \
            or not isinstance(sq, bool) or (sq and n != 1):
        raise CallShapeError(f"attributes dim={d!r}, start={s!r}, length={n!r}, size={size!r}, squeeze={sq!r}: "
                             f"expected a range inside a dim of {r} dims")
    return d, s, n, size, sq


def _narrow_shapes(k, attrs, I, O, at):
    if k in ("narrow", "narrow_view"):
        x = at(I, 0, "input 0 (x)")
        d, s, n, size, sq = _narrow_attrs(attrs, len(x))
        if x[d] != size:
            raise CallShapeError(f"x {list(x)} has {x[d]} along dim {d}, attribute size={size}")
        y = tuple(x[:d]) + (() if sq else (n,)) + tuple(x[d + 1:])
        return [(tuple(x), None)], [(y, None)]
    dx = at(O, 0, "output 0 (dx)")
    d, s, n, size, sq = _narrow_attrs(attrs, len(dx))
    y = tuple(dx[:d]) + (() if sq else (n,)) + tuple(dx[d + 1:])
    if dx[d] != size:
        raise CallShapeError(f"dx {list(dx)} has {dx[d]} along dim {d}, attribute size={size}")
    return [(y, F32)], [(tuple(dx), F32)]


_WORDS = {None: 1, I64: 2}         # 4-byte words per element of the dtypes port_slice_copy moves


def _narrow_encode(kind, a, IS, OS, I, O, variant, call):
    """port_slice_copy: x's range into y (forward); dy into that range of dx, the rest zeroed (fill)."""
    d, s, n, size = a["dim"], a["start"], a["length"], a["size"]
    full = IS[0] if kind == "narrow" else OS[0]
    outer, inner = _outer_inner(full, d)
    inner *= _WORDS[a.get("dtype")]
    if kind == "narrow":
        return Encoded("port_slice_copy", (O[0], I[0]), (outer, inner, n, size, n, 0, s, 0))
    if kind == "narrow_view":
        raise CallShapeError("narrow_view is a view: no call runs it")
    return Encoded("port_slice_copy", (O[0], I[0]), (outer, inner, size, n, n, s, 0, 1))


def _narrow_torch(kind, a, I, O, env):
    d, s, n = a["dim"], a["start"], a["length"]
    if kind == "narrow":
        x, y = I[0], O[0]
        yv = y.unsqueeze(d) if a["squeeze"] else y
        return lambda: yv.copy_(x.narrow(d, s, n))
    dy, dx = I[0], O[0]
    dyv = dy.unsqueeze(d) if a["squeeze"] else dy
    part = dx.narrow(d, s, n)

    def run():
        dx.zero_()
        part.copy_(dyv)
    return run


# ---------------------------------------------------------------------------------------------
# expand: a broadcast materialised (a copy; class tokens expanded over the batch); the gradient sums back. An
# expand only broadcasting ops read (an SE gate, a layer scale, a mask) is no op: they read its input
# ---------------------------------------------------------------------------------------------
_EXPAND_RANK = 6      # PORT_BINARY_MAX_RANK: an expand of more merged dims stays on the torch engines


def _out_shape(ctx):
    from port.ir import capture as C
    return tuple(C.val_of(ctx.node).shape)


# aten packets that broadcast their tensor operands -> (the argument positions, keywords) an expand may be in
_BROADCASTING = {"mul": ((0, 1), ()), "add": ((0, 1), ()), "sub": ((0, 1), ()), "div": ((0, 1), ()),
                 "where": ((0, 1, 2), ()), "masked_fill": ((1,), ()),
                 "scaled_dot_product_attention": ((3,), ("attn_mask",))}


def _packet_of(node) -> str:
    return getattr(getattr(node.target, "_overloadpacket", None), "__name__", "")


def _least_shape(a) -> tuple[int, ...]:
    """The smallest shape node ``a`` may be read at: an expand's input's (it may be folded too), else its own."""
    from port.ir import capture as C
    if _packet_of(a) == "expand" and hasattr(a.args[0], "name"):
        a = a.args[0]
    return tuple(C.val_of(a).shape)


def _broadcast_result(u) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
    """(the shape reader ``u`` makes of its operands read at their least shapes, the shape it must make): for
    attention the mask's broadcast to [N, H, Tq, Tk]."""
    from port.ir import capture as C
    from port.ops.elementwise import broadcast_shape
    if _packet_of(u) == "scaled_dot_product_attention":
        q, k = tuple(C.val_of(u.args[0]).shape), tuple(C.val_of(u.args[1]).shape)
        mask = u.args[3] if len(u.args) > 3 else u.kwargs.get("attn_mask")
        full = q[:-1] + k[-2:-1]
        return broadcast_shape(_least_shape(mask), full), full
    shape: tuple[int, ...] | None = ()
    for v in u.args:
        if hasattr(v, "name") and shape is not None:
            shape = broadcast_shape(shape, _least_shape(v))
    return shape, tuple(C.val_of(u).shape)


def expand_folds(ctx) -> bool:
    """Whether the expand ``ctx.node`` needs no copy: every reader is an op that broadcasts that operand (mul, add,
    sub, div, where, masked_fill's mask, attention's mask) and makes the same shape from the expand's input (each
    other operand read at its least shape), so it reads the input itself; the reader's gradient sums over the
    broadcast dims, which is the expand's gradient. The node then names its input (the capture makes no op)."""
    n = ctx.node
    if not n.users or not hasattr(n.args[0], "name"):
        return False
    for u in n.users:
        pos, keys = _BROADCASTING.get(_packet_of(u), (None, ()))
        if u.op != "call_function" or pos is None or u.name in ctx.skip or \
                any(getattr(v, "name", None) == n.name for k, v in u.kwargs.items() if k not in keys) or \
                any(getattr(v, "name", None) == n.name for i, v in enumerate(u.args) if i not in pos):
            return False
        made, want = _broadcast_result(u)
        if made != want:
            return False
    ctx.env[n.name] = ctx.t(n.args[0])
    return True


def _expand_capture(ctx):
    from port.ops.elementwise import broadcast_shape, collapse
    n = ctx.node
    xa = n.args[0]
    if not hasattr(xa, "name"):
        return False
    if expand_folds(ctx):
        return None
    x = ctx.t(xa)
    if ctx.shape(x) == _out_shape(ctx) and not ctx.is_param(xa):
        return ctx.alias(x)         # an expand to the same shape (-1 sizes): x itself, any dtype
    if not float32(ctx, x):
        return False
    y = ctx.out()
    if broadcast_shape(ctx.shape(x), ctx.shape(y)) != ctx.shape(y):
        return False
    r = len(collapse(ctx.shape(x), ctx.shape(y), ctx.shape(y))[0])
    attrs = {"bcast_rank": r} if r > _EXPAND_RANK else {}
    if ctx.is_param(xa):
        return fwd(ctx, "expand", attrs, (), (y,), 0, 0, params={"weight": x})
    if ctx.is_buffer(xa):           # a folded constant (a causal mask over the batch): no gradient
        return fwd(ctx, "expand", attrs, (), (y,), 0, 0, buffers={"weight": x})
    return fwd(ctx, "expand", attrs, (x,), (y,))


def _expand_shapes(k, attrs, I, O, at):
    from port.ops.elementwise import broadcast_shape
    if k == "expand":
        x, y = at(I, 0, "input 0 (x)"), at(O, 0, "output 0 (y)")
    else:
        y, x = at(I, 0, "input 0 (dy)"), at(O, 0, "output 0 (dx)")
        if k == "expand.grad_weight" and attrs.get("grads") != ("weight",):
            raise CallShapeError(f"attribute grads={attrs.get('grads')!r}: expected ('weight',)")
    if broadcast_shape(x, y) != tuple(y):
        raise CallShapeError(f"expand of {list(x)} to {list(y)}: not a broadcast")
    return ([(x, F32)], [(y, F32)]) if k == "expand" else ([(y, F32)], [(x, F32)])


def _expand_encode(kind, a, IS, OS, I, O, variant, call):
    """port_expand (y, x); the gradient port_binary_backward's add sum (dx as a; weights accumulate)."""
    from port.exec.capi import BINARY_OPS
    from port.ops.elementwise import collapse
    x, y = (IS[0], OS[0]) if kind == "expand" else (OS[0], IS[0])
    dims, xm, _ = collapse(x, y, y)
    pad = [1] * (_EXPAND_RANK - len(dims))
    if kind == "expand":
        return Encoded("port_expand", (O[0], I[0]), (len(dims), xm, *dims, *pad))
    return Encoded("port_binary_backward", (O[0], None, I[0], None, None),
                   (BINARY_OPS["add_nd"], len(dims), xm, 0, *dims, *pad, int(kind == "expand.grad_weight")))


def _expand_torch(kind, a, I, O, env):
    if kind == "expand":
        x, y = I[0], O[0]
        return lambda: y.copy_(x.expand(y.shape))
    dy, dx = I[0], O[0]
    if kind == "expand.grad_weight":
        return lambda: dx.add_(dy.sum_to_size(dx.shape))
    return lambda: dx.copy_(dy.sum_to_size(dx.shape))


# ---------------------------------------------------------------------------------------------
# masked_fill: x where a boolean mask (broadcast to x's shape) is false, a scalar where it is true; the gradient
# the same fill of dy with 0. The mask is read, never differentiated (a folded causal mask, a padding mask).
# ---------------------------------------------------------------------------------------------
def _masked_fill_capture(ctx):
    import math

    from port.ops.elementwise import broadcast_shape, collapse
    n = ctx.node
    xa, ma, v = (n.args + (None,) * 3)[:3]
    if not hasattr(xa, "name") or not hasattr(ma, "name") or isinstance(v, bool) or \
            not isinstance(v, (int, float)) or math.isnan(float(v)) or ctx.is_param(xa) or ctx.is_buffer(xa):
        return False
    x, m = ctx.t(xa), ctx.t(ma)
    if not float32(ctx, x) or ctx.dtype(m) != "bool":
        return False
    y = ctx.out()
    if ctx.shape(y) != ctx.shape(x) or broadcast_shape(ctx.shape(m), ctx.shape(x)) != ctx.shape(x):
        return False
    r = len(collapse(ctx.shape(m), ctx.shape(x), ctx.shape(x))[0])
    attrs = {"value": float(v)} | ({"bcast_rank": r} if r > _EXPAND_RANK else {})
    return fwd(ctx, "masked_fill", attrs, (x,), (y,), 0, numel(ctx.shape(y)), buffers={"mask": m})


def _masked_fill_shapes(k, attrs, I, O, at):
    from port.ops.elementwise import broadcast_shape
    x, m = at(I, 0, "input 0 (x or dy)"), at(I, 1, "input 1 (mask)")
    y = at(O, 0, "output 0")
    if tuple(y) != tuple(x) or broadcast_shape(m, x) != tuple(x):
        raise CallShapeError(f"masked_fill of {list(x)} by a mask of {list(m)} into {list(y)}: the mask must "
                             f"broadcast to x's shape, the output have it")
    if not isinstance(attrs.get("value"), float):
        raise CallShapeError(f"attribute value={attrs.get('value')!r}: expected a float")
    return [(x, F32), (m, "bool")], [(y, F32)]


def _masked_fill_encode(kind, a, IS, OS, I, O, variant, call):
    """port_masked_fill (y, x, mask); its gradient the same call on dy with value 0."""
    from port.ops.elementwise import collapse
    dims, mm, _ = collapse(IS[1], IS[0], IS[0])
    pad = [1] * (_EXPAND_RANK - len(dims))
    value = float(a["value"]) if kind == "masked_fill" else 0.0
    return Encoded("port_masked_fill", (O[0], I[0], I[1]), (len(dims), mm, *dims, *pad), (value,))


def _masked_fill_torch(kind, a, I, O, env):
    x, m, y = I[0], I[1], O[0]
    value = float(a["value"]) if kind == "masked_fill" else 0.0
    return lambda: y.copy_(x.masked_fill(m, value))


register(
    OpRecord(kind="masked_fill", family="shape",
             kernels={"masked_fill": ("port_masked_fill",), "masked_fill.grad_input": ("port_masked_fill",)},
             shapes=_masked_fill_shapes, torch=_masked_fill_torch, encode=_masked_fill_encode,
             aten=("masked_fill",), capture=_masked_fill_capture,
             saved=lambda f, gi, gw, wanted: (f.buffers["mask"],) if gi else (),
             grad_input_reads=lambda f: (f.buffers["mask"],),
             bwd_vector_flops=lambda f, T: numel(T[f.outputs[0]].shape),
             c_supports=lambda a: a.get("bcast_rank", 0) <= _EXPAND_RANK, tags=frozenset({"checkpoint"}),
             doc="masked_fill: x where a boolean mask (broadcast to x's shape) is false, the scalar ``value`` where "
                 "it is true (-inf allowed, NaN not): a causal or padding mask before softmax. The mask is read, "
                 "not differentiated; the gradient is the same fill of dy with 0. Saves the mask. C kernel "
                 "port_masked_fill (up to 6 merged dims; one byte per mask element)."),
)


register(
    OpRecord(kind="narrow", family="shape",
             kernels={"narrow": ("port_slice_copy",), "narrow.grad_input": ("port_slice_copy",)},
             shapes=_narrow_shapes, torch=_narrow_torch, encode=_narrow_encode,
             c_supports=lambda a: a.get("dtype") in _WORDS and a.get("length", 0) >= 1,
             aten=("slice", "select", "split[]", "split_with_sizes[]", "unbind[]"),
             capture=_narrow_capture, bwd_vector_flops=lambda f, T: numel(T[f.x[0]].shape),
             tags=frozenset({"checkpoint"}),
             doc="narrow: the range [start, start + length) of dim ``dim`` (``size`` long), squeezed for select "
                 "and unbind; slice (step 1), select and the items of split and unbind. A copy (where the range is one "
                 "run of x's bytes, is_contiguous_range, the capture makes it a narrow_view instead); its gradient "
                 "zeroes dx and writes dy into the range. Saves nothing. C kernel port_slice_copy (float32; "
                 "int64 buffers as word pairs)."),
    OpRecord(kind="narrow_view", family="shape",
             kernels={"narrow_view": (), "narrow_view.grad_input": ("port_slice_copy",)},
             shapes=_narrow_shapes, torch=_narrow_torch, encode=_narrow_encode, views=("narrow_view",),
             c_supports=lambda a: a.get("dtype") in _WORDS and a.get("length", 0) >= 1,
             bwd_vector_flops=lambda f, T: numel(T[f.x[0]].shape) if f.x else 0,
             tags=frozenset({"not_recomputable"}),
             doc="narrow_view: narrow's range where it is one contiguous run of x's bytes (every dim before "
                 "``dim`` is 1: a batch slice, a channel slice of an N=1 map, select and split along dim 0): a "
                 "view (alias_offset into x's storage), no call. Its gradient is narrow's (zeroed dx, dy written "
                 "into the range: port_slice_copy). Captured by narrow's rule."),
    OpRecord(kind="expand", family="shape",
             kernels={"expand": ("port_expand",), "expand.grad_input": ("port_binary_backward",),
                      "expand.grad_weight": ("port_binary_backward",)},
             shapes=_expand_shapes, torch=_expand_torch, encode=_expand_encode,
             c_supports=lambda a: a.get("bcast_rank", 0) <= _EXPAND_RANK, aten=("expand",), capture=_expand_capture,
             bwd_vector_flops=lambda f, T: numel(T[f.outputs[0]].shape), tags=frozenset({"checkpoint"}),
             doc="expand: x broadcast to the output's shape (a copy; none where every reader broadcasts x itself: "
                 "expand_folds); the gradient sums dy back to x's shape (a "
                 "parameter's accumulates). Saves nothing. C kernels port_expand and port_binary_backward (an add's "
                 "sum; up to 6 merged dims)."),
)
