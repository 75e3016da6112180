"""Tracing of the sequence-model ops (transformers): how an fx node of an embedding, layer norm, GELU, tanh,
softmax, matmul, scaled dot-product attention, permute, scaling, broadcast add, mean, arange or ``!=`` becomes
a forward op of the training graph (port.ir.trace calls these for nodes the CNN rules do not cover).

Kinds and what they save for backward (PyTorch autograd's choice for the plain kernels):

==================  =====================================================  ===========================
kind                inputs -> outputs                                      saved
==================  =====================================================  ===========================
embedding           idx int64 [...], weight [V, D] -> y [..., D]          idx (weight gradient)
layer_norm          x [..., D], weight?, bias? -> y, stats [2, rows]      x, stats, weight
gelu                x -> y (attr approximate: "none" | "tanh")            x
tanh                x -> y                                                 y
softmax             x [..., D] -> y (last dim)                             y
scale               x -> alpha * x                                         (nothing)
permute             x -> x.permute(perm) (a copy: kernels read contiguous) (nothing)
matmul              a [B.., M, K], b [B.., K, N] -> c [B.., M, N]         b (for da), a (for db)
attention           q [N, H, Tq, d], k, v [N, H, Tk, d], mask? [N,1,1,Tk]  q, k, v, o, lse, mask
                    -> o [N, H, Tq, d], lse [N, H, Tq]
add_bcast           a [..., S], b [S] (b's shape a suffix of a's) -> y     (nothing)
mean_mid            x [O, M, I] -> mean over M                             (nothing)
arange              () -> int64 [T]                                        (no gradient)
ne_scalar           x int64 -> bool (x != value)                           (no gradient)
==================  =====================================================  ===========================
"""
from __future__ import annotations

import math
import operator
from typing import Any

from port.ir.types import ROLE_ACTIVATION, numel

MULTI_GRAD_KINDS = ("matmul", "attention")     # one grad_input op writes the gradients of several inputs
NO_GRAD_KINDS = ("arange", "ne_scalar")        # integer outputs


def inverse_perm(perm) -> tuple[int, ...]:
    """The permutation that undoes ``perm`` (a permute's gradient permutes back with it)."""
    inv = [0] * len(perm)
    for i, j in enumerate(perm):
        inv[j] = i
    return tuple(inv)


def _dim(d: int, rank: int) -> int:
    return d % rank if -rank <= d < rank else d


def module_forward(node, mod, path: str, x: int, y: int, b, param, shape, unsupported, Fwd):
    """The _Fwd of a call_module node for the sequence modules, or None when ``mod`` is not one."""
    import torch.nn as nn
    ys = shape(y)
    if isinstance(mod, nn.Embedding):
        if mod.padding_idx is not None or mod.max_norm is not None or mod.sparse or mod.scale_grad_by_freq:
            raise unsupported(node, "embedding with padding_idx, max_norm, sparse or scale_grad_by_freq "
                                    "(mask padding in the loss with ignore_index instead)")
        if b.tensors[x].dtype != "int64":
            raise unsupported(node, f"embedding of a {b.tensors[x].dtype} tensor (token ids must be int64)")
        w = param(path, mod, "weight")
        return Fwd(path, path, "embedding", {}, (x,), {"weight": w}, {}, (y,), 0, 0)
    if isinstance(mod, nn.LayerNorm):
        if len(mod.normalized_shape) != 1 or mod.normalized_shape[0] != ys[-1]:
            raise unsupported(node, f"layer_norm over {tuple(mod.normalized_shape)} (only the last dim is supported)")
        params = {}
        if mod.elementwise_affine:
            params["weight"] = param(path, mod, "weight")
            if getattr(mod, "bias", None) is not None:
                params["bias"] = param(path, mod, "bias")
        rows = numel(ys[:-1])
        stats = b.tensor(f"{path}:stats", (2, rows), "float32", ROLE_ACTIVATION)
        return Fwd(path, path, "layer_norm", dict(eps=float(mod.eps), affine=tuple(params)), (x,), params, {},
                   (y, stats), 0, 8 * numel(ys))
    if isinstance(mod, nn.GELU):
        return Fwd(path, path, "gelu", dict(approximate=str(mod.approximate)), (x,), {}, {}, (y,), 0, 8 * numel(ys))
    if isinstance(mod, nn.Tanh):
        return Fwd(path, path, "tanh", {}, (x,), {}, {}, (y,), 0, 4 * numel(ys))
    if isinstance(mod, nn.Softmax):
        if mod.dim is None or _dim(mod.dim, len(ys)) != len(ys) - 1:
            raise unsupported(node, f"softmax over dim {mod.dim} (only the last dim is supported)")
        return Fwd(path, path, "softmax", {}, (x,), {}, {}, (y,), 0, 4 * numel(ys))
    return None


def function_forward(node, opname: str, scope: str, b, tensor_arg, out_tensor, shape, unsupported, Fwd, view):
    """The _Fwd of a call_function / call_method node for the sequence ops; "identity" for ops that only
    rename their input (contiguous); None when the node is not one of them."""
    import torch
    import torch.fx as fx
    import torch.nn.functional as F
    tgt = node.target
    is_m = node.op == "call_method"
    args, kw = list(node.args), dict(node.kwargs)

    def is_t(a):
        return isinstance(a, fx.Node)

    if is_m and tgt == "contiguous":
        return "identity"
    if tgt in (torch.unsqueeze, torch.squeeze) or (is_m and tgt in ("unsqueeze", "squeeze")):
        x = tensor_arg(node, args[0]); y = out_tensor(node, opname)
        return view(b, opname, scope, x, y)         # unit dims: the same bytes
    if tgt is F.gelu or (is_m and tgt == "gelu"):
        x = tensor_arg(node, args[0])
        approx = kw.get("approximate", args[1] if len(args) > 1 else "none")
        if approx not in ("none", "tanh"):
            raise unsupported(node, f"gelu with approximate={approx!r}")
        y = out_tensor(node, opname)
        return Fwd(opname, scope, "gelu", dict(approximate=approx), (x,), {}, {}, (y,), 0, 8 * numel(shape(y)))
    if tgt in (torch.tanh, F.tanh) or (is_m and tgt == "tanh"):
        x = tensor_arg(node, args[0]); y = out_tensor(node, opname)
        return Fwd(opname, scope, "tanh", {}, (x,), {}, {}, (y,), 0, 4 * numel(shape(y)))
    if tgt in (F.softmax, torch.softmax) or (is_m and tgt == "softmax"):
        x = tensor_arg(node, args[0])
        d = kw.get("dim", args[1] if len(args) > 1 else None)
        if d is None or _dim(d, len(shape(x))) != len(shape(x)) - 1 or kw.get("dtype") is not None:
            raise unsupported(node, f"softmax over dim {d} (only the last dim, without dtype=, is supported)")
        y = out_tensor(node, opname)
        return Fwd(opname, scope, "softmax", {}, (x,), {}, {}, (y,), 0, 4 * numel(shape(y)))
    if tgt in (torch.matmul, torch.bmm, operator.matmul) or (is_m and tgt in ("matmul", "bmm")):
        a, c = tensor_arg(node, args[0]), tensor_arg(node, args[1])
        sa, sc = shape(a), shape(c)
        if len(sa) < 2 or len(sa) != len(sc) or sa[:-2] != sc[:-2] or sa[-1] != sc[-2]:
            raise unsupported(node, f"matmul of {list(sa)} and {list(sc)} (both operands need the same batch "
                                    f"dims and rank >= 2; no broadcasting)")
        y = out_tensor(node, opname)
        bt, m, k, n = numel(sa[:-2]), sa[-2], sa[-1], sc[-1]
        return Fwd(opname, scope, "matmul", {}, (a, c), {}, {}, (y,), 2 * bt * m * n * k, 0)
    if tgt is F.scaled_dot_product_attention:
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        a = dict(zip(names, args)) | kw
        q, k, v = (tensor_arg(node, a[n]) for n in ("query", "key", "value"))
        if float(a.get("dropout_p", 0.0) or 0.0) != 0.0 or a.get("enable_gqa"):
            raise unsupported(node, "scaled_dot_product_attention with dropout_p > 0 or enable_gqa")
        sq, sk, sv = shape(q), shape(k), shape(v)
        if len(sq) != 4 or sk != sv or sq[:2] != sk[:2] or sq[3] != sk[3]:
            raise unsupported(node, f"scaled_dot_product_attention on q {list(sq)}, k {list(sk)}, v {list(sv)} "
                                    f"(needs [N, heads, T, head_dim] with equal heads and head_dim)")
        n_, h, tq, d = sq
        tk = sk[2]
        causal = bool(a.get("is_causal", False))
        scale = a.get("scale")
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
        ins = (q, k, v)
        mask = a.get("attn_mask")
        if mask is not None:
            m = tensor_arg(node, mask)
            mt = b.tensors[m]
            if mt.dtype != "bool" or tuple(mt.shape) not in ((n_, 1, 1, tk), (n_, tk)):
                raise unsupported(node, f"attn_mask {list(mt.shape)} ({mt.dtype}): only a boolean key-padding "
                                        f"mask [N, 1, 1, Tk] (True = attend) is supported")
            ins = ins + (m,)
        y = out_tensor(node, opname)
        lse = b.tensor(f"{opname}:lse", (n_, h, tq), "float32", ROLE_ACTIVATION)
        attrs = dict(causal=causal, scale=scale, masked=mask is not None)
        return Fwd(opname, scope, "attention", attrs, ins, {}, {}, (y, lse), 4 * n_ * h * tq * tk * d,
                   6 * n_ * h * tq * tk)
    if tgt in (torch.transpose, torch.permute) or (is_m and tgt in ("transpose", "permute")):
        x = tensor_arg(node, args[0])
        r = len(shape(x))
        if tgt in (torch.transpose,) or (is_m and tgt == "transpose"):
            d0, d1 = (kw.get("dim0", args[1] if len(args) > 1 else None), kw.get("dim1", args[2] if len(args) > 2 else None))
            perm = list(range(r))
            perm[_dim(d0, r)], perm[_dim(d1, r)] = perm[_dim(d1, r)], perm[_dim(d0, r)]
        else:
            dims = kw.get("dims", args[1:] if not (len(args) == 2 and isinstance(args[1], (tuple, list))) else args[1])
            perm = [_dim(int(d), r) for d in dims]
        y = out_tensor(node, opname)
        if perm == list(range(r)):
            return view(b, opname, scope, x, y)
        if r > 6:
            raise unsupported(node, f"permute of a {r}-d tensor (at most 6 dims)")
        return Fwd(opname, scope, "permute", dict(perm=tuple(perm)), (x,), {}, {}, (y,), 0, 0)
    if tgt is operator.getitem and is_t(args[0]) and isinstance(args[1], tuple) and all(
            i is None or (isinstance(i, slice) and i == slice(None)) for i in args[1]):
        x = tensor_arg(node, args[0]); y = out_tensor(node, opname)
        return view(b, opname, scope, x, y)         # x[:, None, None, :]: a view adding unit dims
    if tgt in (operator.mul, torch.mul, operator.truediv, torch.div) or (is_m and tgt in ("mul", "div")):
        t_arg, c = (args[0], args[1]) if len(args) == 2 and is_t(args[0]) else (args[-1], args[0])
        if len(args) == 2 and is_t(t_arg) and isinstance(c, (int, float)) and not isinstance(c, bool):
            if tgt in (operator.truediv, torch.div) or (is_m and tgt == "div"):
                if not is_t(args[0]) or kw.get("rounding_mode"):
                    raise unsupported(node, "division of a constant by a tensor, or with rounding_mode")
                c = 1.0 / float(c)
            x = tensor_arg(node, t_arg); y = out_tensor(node, opname)
            if b.tensors[x].dtype != "float32":
                raise unsupported(node, f"scaling a {b.tensors[x].dtype} tensor")
            return Fwd(opname, scope, "scale", dict(alpha=float(c)), (x,), {}, {}, (y,), 0, numel(shape(y)))
        return None
    if tgt in (operator.ne, torch.ne) or (is_m and tgt == "ne"):
        if len(args) == 2 and is_t(args[0]) and isinstance(args[1], int) and not isinstance(args[1], bool):
            x = tensor_arg(node, args[0])
            if b.tensors[x].dtype != "int64":
                raise unsupported(node, "!= on a non-int64 tensor")
            y = out_tensor(node, opname)
            return Fwd(opname, scope, "ne_scalar", dict(value=int(args[1])), (x,), {}, {}, (y,), 0, numel(shape(y)))
        return None
    if tgt is torch.arange:
        if len(args) != 1 or isinstance(args[0], float) or kw.get("dtype") not in (None, torch.int64):
            raise unsupported(node, "arange other than torch.arange(n) of int64")
        y = out_tensor(node, opname)
        return Fwd(opname, scope, "arange", dict(start=0), (), {}, {}, (y,), 0, 0)
    if (is_m and tgt == "mean") or tgt is torch.mean:
        x = tensor_arg(node, args[0])
        xs = shape(x)
        dims = args[1] if len(args) > 1 else kw.get("dim")
        if isinstance(dims, (tuple, list)) and len(dims) == 1:
            dims = dims[0]
        if not isinstance(dims, int) or kw.get("keepdim") or (len(args) > 2 and args[2]) or kw.get("dtype"):
            return None
        d = _dim(dims, len(xs))
        if d == len(xs) - 1 or len(xs) < 2:
            raise unsupported(node, f"mean over the last dim of {list(xs)} (only non-last dims)")
        y = out_tensor(node, opname)
        return Fwd(opname, scope, "mean_mid", dict(dim=d), (x,), {}, {}, (y,), 0, numel(xs))
    return None


def broadcast_add(node, opname: str, scope: str, a: int, c: int, out_tensor, shape, unsupported, Fwd):
    """a + c where one operand's shape is a proper suffix of the other's: add_bcast (the bigger one first)."""
    sa, sc = shape(a), shape(c)
    if len(sc) > len(sa):
        a, c, sa, sc = c, a, sc, sa
    if not sc or len(sc) >= len(sa) or tuple(sa[len(sa) - len(sc):]) != tuple(sc):
        raise unsupported(node, f"broadcasting add {list(shape(a))} + {list(shape(c))} (only an operand whose "
                                f"shape is a suffix of the other's broadcasts)")
    y = out_tensor(node, opname)
    return Fwd(opname, scope, "add_bcast", {}, (a, c), {}, {}, (y,), 0, numel(shape(y)))
