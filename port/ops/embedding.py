"""embedding: rows of a weight [V, D] picked by int64 indices (dense gradient). The weight gradient
scatters-adds dy into the picked rows (none into row ``padding_idx`` where set:
port_embedding_backward_weight_pad); it saves the indices. ``table[idx]`` (aten index.Tensor with one int64
index tensor) of a 2-d parameter is the same op: Swin's relative-position bias, a table picked by a constant
index buffer (indices are non-negative there; the C kernel refuses one outside [0, V)).
"""
from __future__ import annotations

from port.ir.types import numel
from port.ops import register
from port.ops.base import F32, I64, CallShapeError, Encoded, OpRecord, arg, fwd, rank


def _capture(ctx):
    n = ctx.node
    if n.target._overloadpacket.__name__ == "index":        # table[idx]: index(table, [idx])
        wa, ids = n.args[0], n.args[1]
        if (not isinstance(ids, (list, tuple)) or len(ids) != 1 or not hasattr(ids[0], "name")
                or not ctx.is_param(wa) or len(ctx.shape(ctx.t(wa))) != 2 or ctx.dtype(ctx.t(ids[0])) != I64):
            return False
        return fwd(ctx, "embedding", {}, (ctx.t(ids[0]),), (ctx.out(),), params={"weight": ctx.t(wa)})
    wa, ia = n.args[0], n.args[1]
    pad = arg(n, 2, "padding_idx", -1)
    if (arg(n, 3, "scale_grad_by_freq", False) or arg(n, 4, "sparse", False) or not ctx.is_param(wa)
            or ctx.dtype(ctx.t(ia)) != I64):
        return False
    attrs = {"padding_idx": int(pad) % ctx.shape(ctx.t(wa))[0]} if pad is not None and pad != -1 else {}
    return fwd(ctx, "embedding", attrs, (ctx.t(ia),), (ctx.out(),), params={"weight": ctx.t(wa)})


def _shapes(k, attrs, I, O, at):
    pad = attrs.get("padding_idx")
    if pad is not None and type(pad) is not int:
        raise CallShapeError(f"attribute padding_idx={pad!r}: expected an int")
    if k == "embedding":
        idx, w = at(I, 0, "input 0 (idx)"), rank(at(I, 1, "input 1 (weight)"), 2, "weight")
        return [(idx, I64), (w, F32)], [(tuple(idx) + (w[1],), F32)]
    dy, idx = at(I, 0, "input 0 (dy)"), at(I, 1, "input 1 (idx)")
    if tuple(dy[:-1]) != tuple(idx):
        raise CallShapeError(f"dy {list(dy)} does not match the indices {list(idx)}")
    return [(dy, F32), (idx, I64)], [(at(O, 0, "output 0 (dw)"), F32)]


def _encode(kind, a, IS, OS, I, O, variant, call):
    if kind == "embedding":
        return Encoded("port_embedding_forward", (O[0], I[0], I[1]), (numel(IS[0]), IS[1][0], IS[1][1]))
    pad = a.get("padding_idx")
    if pad is not None:
        return Encoded("port_embedding_backward_weight_pad", (O[0], I[0], I[1]),
                       (numel(IS[1]), OS[0][0], OS[0][1], pad))
    return Encoded("port_embedding_backward_weight", (O[0], I[0], I[1]), (numel(IS[1]), OS[0][0], OS[0][1]))


def _torch(kind, a, I, O, env):
    torch = env.torch
    if kind == "embedding":
        return lambda: torch.index_select(I[1], 0, I[0].reshape(-1), out=O[0].view(-1, I[1].shape[1]))
    dy, idx = I
    dw = O[0]
    d = dw.shape[1]
    pad = a.get("padding_idx")
    if pad is None:
        return lambda: dw.index_add_(0, idx.reshape(-1), dy.reshape(-1, d))

    def run():        # the padding row gets no gradient (as PyTorch's embedding backward)
        i = idx.reshape(-1)
        keep = i != pad
        dw.index_add_(0, i[keep], dy.reshape(-1, d)[keep])
    return run


register(OpRecord(
    kind="embedding", family="embedding",
    kernels={"embedding": ("port_embedding_forward",), "embedding.grad_weight": ("port_embedding_backward_weight",
                                                                           "port_embedding_backward_weight_pad")},
    shapes=_shapes, torch=_torch, encode=_encode, aten=("embedding", "index"), capture=_capture,
    saved=lambda f, gi, gw, wanted: (f.x[0],) if gw else (), grad_weight_reads=lambda f: (f.x[0],), doc=__doc__))
