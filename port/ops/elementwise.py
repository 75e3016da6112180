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
# mul: tensor x tensor with full broadcasting (squeeze-excitation gates, SwiGLU); PyTorch's kernels for now
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


def _mul_capture(ctx):
    n = ctx.node
    a, c = n.args[0], n.args[1]
    if not hasattr(a, "name") or not hasattr(c, "name") or any(ctx.is_param(v) or ctx.is_buffer(v) for v in (a, c)):
        return False       # a parameter operand (layer scale): a torch_op
    ta, tc = ctx.t(a), ctx.t(c)
    if not float32(ctx, ta, tc):
        return False
    y = ctx.out()
    if broadcast_shape(ctx.shape(ta), ctx.shape(tc)) != ctx.shape(y):
        return False
    return fwd(ctx, "mul", {}, (ta, tc), (y,), 0, numel(ctx.shape(y)))


def _mul_saved(f, gi, gw, wanted):
    a, c = f.x       # da reads b, db reads a (autograd saves the other operand of each gradient)
    return tuple(t for t, need in ((c, a in wanted), (a, c in wanted)) if need)


def _mul_backward(bc, f, fo, gy, xs_needing, trained):
    """One ``mul.grad_input`` op: d(operand i) = dy * (the other operand), summed to operand i's shape."""
    need = tuple(i for i, t in enumerate(f.x) if t in xs_needing)
    if not need:
        return
    outs = [(f.x[i], bc.new_grad(f.x[i], "")) for i in need]
    n = numel(bc.T[f.outputs[0]].shape)
    bc.op(f"{f.name}.grad_input", f.layer, "mul.grad_input", {"grads": need},
          (gy,) + tuple(f.x[1 - i] for i in need), tuple(g for _, g in outs), vector_flops=2 * n * len(need),
          forward_op=fo.id)
    for x, g in outs:
        bc.contribute(x, g, f.layer)


def _mul_shapes(k, attrs, I, O, at):
    if k == "mul":
        a, b = at(I, 0, "input 0 (a)"), at(I, 1, "input 1 (b)")
        y = broadcast_shape(a, b)
        if y is None:
            raise CallShapeError(f"mul of {list(a)} and {list(b)}: the shapes do not broadcast")
        return [(a, F32), (b, F32)], [(y, F32)]
    g = attrs.get("grads")
    if not isinstance(g, tuple) or not g or any(i not in (0, 1) for i in g) or list(g) != sorted(set(g)):
        raise CallShapeError(f"attribute grads={g!r}: expected increasing operand indices among 0, 1")
    dy = at(I, 0, "input 0 (dy)")
    ins, outs = [(dy, F32)], []
    for j in range(len(g)):
        other, d = at(I, 1 + j, f"input {1 + j} (the other operand)"), at(O, j, f"output {j}")
        if broadcast_shape(other, d) is None or broadcast_shape(broadcast_shape(other, d), dy) != tuple(dy):
            raise CallShapeError(f"mul gradient {list(d)} from dy {list(dy)} and {list(other)}: no broadcast")
        ins.append((other, F32))
        outs.append((d, F32))
    return ins, outs


def _mul_torch(kind, a, I, O, env):
    torch = env.torch
    if kind == "mul":
        return lambda: torch.mul(I[0], I[1], out=O[0])
    dy = I[0]
    pairs = list(zip(I[1:], O))

    def run():
        for other, d in pairs:
            p = dy * other
            d.copy_(p if p.shape == d.shape else p.sum_to_size(d.shape))
    return run


register(OpRecord(kind="mul", family="elementwise", kernels={"mul": (), "mul.grad_input": ()},
                  shapes=_mul_shapes, torch=_mul_torch, aten=("mul",), capture=_mul_capture, saved=_mul_saved,
                  backward=_mul_backward, tags=frozenset({"checkpoint", "multi_grad"}),
                  doc="mul: a * b with full broadcasting; da = dy * b and db = dy * a, each summed to its "
                      "operand's shape (saves the other operand). PyTorch's kernels (no C kernel yet)."))
