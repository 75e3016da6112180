"""Attention: ``matmul`` (batched [B.., M, K] @ [B.., K, N]; bmm, matmul) and ``attention`` (scaled dot-product
attention over [N, H, T, d], causal or with a boolean key mask [N, 1, 1, Tk]; saves q, k, v, o and the
row log-sum-exp). One gradient op writes the gradients of every operand that needs one (``grads``). Attention
has a ``tiled`` variant on the C backend (flash-style, a workspace per thread).
"""
from __future__ import annotations

import ctypes
import math

from port.ir.types import ROLE_ACTIVATION, numel
from port.ops import register
from port.ops.base import F32, CallShapeError, Encoded, OpRecord, float32, fwd, public_attrs, rank

ATTN_ALGO = {"plain": 0, "tiled": 1}     # PORT_ATTN_PLAIN, PORT_ATTN_TILED
ATTENTION_KERNELS = ("attention", "attention.grad_input")


def multi_grad_backward(rec, bc, f, fo, gy, xs_needing, trained):
    """One ``<kind>.grad_input`` op writing the gradients of the operands among the first three that need one."""
    need = tuple(i for i, t in enumerate(f.x[:3]) if t in xs_needing)
    if not need:
        return
    outs = [(f.x[i], bc.new_grad(f.x[i], "")) for i in need]
    fl = (f.flops // 2) * len(need) if f.kind == "matmul" else f.flops * 10 // 4
    bc.op(f"{f.name}.grad_input", f.layer, f"{f.kind}.grad_input", public_attrs(f) | {"grads": need},
          (gy,) + rec.grad_input_reads(f), tuple(g for _, g in outs), flops=fl,
          vector_flops=rec.bwd_vector_flops(f, bc.T), forward_op=fo.id)
    for x, g in outs:
        bc.contribute(x, g, f.layer)


# ---------------------------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------------------------
def _mm_capture(ctx):
    a, c = ctx.t(ctx.node.args[0]), ctx.t(ctx.node.args[1])
    sa, sc = ctx.shape(a), ctx.shape(c)
    if len(sa) < 2 or len(sa) != len(sc) or sa[:-2] != sc[:-2] or sa[-1] != sc[-2] or not float32(ctx, a, c):
        return False
    return fwd(ctx, "matmul", {}, (a, c), (ctx.out(),), 2 * numel(sa[:-2]) * sa[-2] * sc[-1] * sa[-1], 0)


def _mm_saved(f, gi, gw, wanted):
    a, c = f.x
    return tuple(t for t, need in ((c, a in wanted), (a, c in wanted)) if need)


def _mm_shapes(k, attrs, I, O, at):
    if k == "matmul":
        a, b = at(I, 0, "input 0 (a)"), at(I, 1, "input 1 (b)")
        if len(a) < 2 or len(a) != len(b) or tuple(a[:-2]) != tuple(b[:-2]) or a[-1] != b[-2]:
            raise CallShapeError(f"matmul of {list(a)} and {list(b)}: expected [B.., M, K] and [B.., K, N]")
        return [(a, F32), (b, F32)], [(tuple(a[:-1]) + (b[-1],), F32)]
    gy, other = at(I, 0, "input 0 (dy)"), at(I, 1, "input 1 (the other operand)")
    op_i = attrs.get("operand")
    if op_i not in (0, 1) or len(gy) < 2 or len(other) != len(gy):
        raise CallShapeError(f"matmul gradient call: operand={op_i!r}, dy {list(gy)}, other {list(other)}")
    out = (tuple(gy[:-1]) + (other[-2],)) if op_i == 0 else (tuple(gy[:-2]) + (other[-1], gy[-1]))
    return [(gy, F32), (other, F32)], [(out, F32)]


def _mm_encode(kind, a, IS, OS, I, O, variant, call):
    if kind == "matmul":
        A, B = IS
        return Encoded("port_bmm", (O[0], I[0], I[1]), (numel(A[:-2]), A[-2], B[-1], A[-1], 0, 0), (1.0, 0.0))
    gy, other = IS
    bt = numel(gy[:-2])
    if a["operand"] == 0:      # da [M, K] = dy [M, N] b^T (b is [K, N])
        return Encoded("port_bmm", (O[0], I[0], I[1]), (bt, gy[-2], other[-2], gy[-1], 0, 1), (1.0, 0.0))
    # db [K, N] = a^T [K, M] dy [M, N] (a is [M, K])
    return Encoded("port_bmm", (O[0], I[1], I[0]), (bt, other[-1], gy[-1], gy[-2], 1, 0), (1.0, 0.0))


def _mm_torch(kind, a, I, O, env):
    torch = env.torch
    if kind == "matmul":
        return lambda: torch.matmul(I[0], I[1], out=O[0])
    gy, other = I
    out = O[0]
    if a["operand"] == 0:
        return lambda: torch.matmul(gy, other.transpose(-1, -2), out=out)
    return lambda: torch.matmul(other.transpose(-1, -2), gy, out=out)


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------
def _sdpa_capture(ctx):
    n = ctx.node
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    a = dict(zip(names, n.args)) | dict(n.kwargs)
    if float(a.get("dropout_p", 0.0) or 0.0) != 0.0 or a.get("enable_gqa"):
        return False
    q, k, v = (ctx.t(a[x]) for x in ("query", "key", "value"))
    sq, sk, sv = ctx.shape(q), ctx.shape(k), ctx.shape(v)
    if len(sq) != 4 or sk != sv or sq[:2] != sk[:2] or sq[3] != sk[3] or not float32(ctx, q, k, v):
        return False
    n_, h, tq, d = sq
    tk = sk[2]
    scale = a.get("scale")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    ins = (q, k, v)
    mask = a.get("attn_mask")
    if mask is not None:
        m = ctx.t(mask)
        if ctx.dtype(m) != "bool" or tuple(ctx.shape(m)) != (n_, 1, 1, tk):
            return False
        ins = ins + (m,)
    y = ctx.out()
    lse = ctx.b.tensor(f"{ctx.opname}:lse", (n_, h, tq), F32, ROLE_ACTIVATION)
    attrs = dict(causal=bool(a.get("is_causal", False)), scale=scale, masked=mask is not None)
    return fwd(ctx, "attention", attrs, ins, (y, lse), 4 * n_ * h * tq * tk * d, 6 * n_ * h * tq * tk)


def _attn_reads(f):
    return f.x[:3] + f.outputs + f.x[3:]        # (q, k, v, o, lse[, mask])


def _attn_shapes(k, attrs, I, O, at):
    q = rank(at(I, 0 if k == "attention" else 1, "q"), 4, "q")
    kk = rank(at(I, 1 if k == "attention" else 2, "k"), 4, "k")
    if kk[:2] != q[:2] or kk[3] != q[3] or not isinstance(attrs.get("scale"), float):
        raise CallShapeError(f"attention of q {list(q)}, k {list(kk)} (scale={attrs.get('scale')!r})")
    Q, K_, lse = (q, F32), (kk, F32), ((q[0], q[1], q[2]), F32)
    mask = [((q[0], 1, 1, kk[2]), "bool")] if attrs.get("masked") else []
    if k == "attention":
        return [Q, K_, K_] + mask, [Q, lse]
    g = attrs.get("grads")
    if not isinstance(g, tuple) or not g or any(i not in (0, 1, 2) for i in g) or list(g) != sorted(set(g)):
        raise CallShapeError(f"attribute grads={g!r}: expected increasing operand indices among 0 (q), 1, 2")
    return [Q, Q, K_, K_, Q, lse] + mask, [(Q, K_, K_)[i] for i in g]


def attention_params(capi, kernel: str, attrs: dict, in_shapes):
    """port_attention_params of an attention call from its slot shapes (q is input 0 of the forward, 1 of the
    backward, whose input 0 is the output gradient)."""
    q = in_shapes[0] if kernel == "attention" else in_shapes[1]
    k = in_shapes[1] if kernel == "attention" else in_shapes[2]
    n, h, tq, d = q
    return capi.AttentionParams(n * h, h, tq, k[2], d, int(bool(attrs.get("causal"))), float(attrs["scale"]))


def _attn_workspace(kernel, variant, attrs, in_shapes, out_shapes) -> int:
    from port.exec import capi
    p = attention_params(capi, kernel, attrs, in_shapes)
    return int(capi.raw.port_attention_workspace_bytes(ctypes.byref(p), ATTN_ALGO.get(variant, 0),
                                                       int(kernel != "attention")))


def _attn_encode(kind, a, IS, OS, I, O, variant, call):
    backward = kind != "attention"
    q, k = (IS[0], IS[1]) if not backward else (IS[1], IS[2])
    n, h, tq, d = q
    iv = (n * h, h, tq, k[2], d, int(bool(a.get("causal"))), ATTN_ALGO.get(variant, 0))
    fv = (float(a["scale"]),)
    masked = bool(a.get("masked"))
    if not backward:
        return Encoded("port_attention_forward", (O[0], O[1], I[0], I[1], I[2], I[3] if masked else None), iv, fv)
    g = dict(zip(a["grads"], O))       # 0: dq, 1: dk, 2: dv (NULL where no gradient is needed)
    return Encoded("port_attention_backward", (g.get(0), g.get(1), g.get(2), I[0], I[1], I[2], I[3], I[4], I[5],
                                               I[6] if masked else None), iv, fv)


def _attn_torch(kind, a, I, O, env):
    torch = env.torch
    scale, causal, masked = float(a["scale"]), bool(a.get("causal")), bool(a.get("masked"))

    def bias(q, k, mask):
        """The additive mask (or None) of the math path: -inf at masked keys and above the causal diagonal."""
        if not masked and not causal:
            return None
        tq, tk = q.shape[2], k.shape[2]
        m = torch.zeros(q.shape[0], 1, tq, tk, dtype=q.dtype, device=q.device)
        if masked:
            m.masked_fill_(~mask.reshape(q.shape[0], 1, 1, tk), float("-inf"))
        if causal:
            m.masked_fill_(torch.ones(tq, tk, dtype=torch.bool, device=q.device).triu(tk - tq + 1), float("-inf"))
        return m

    if kind == "attention":
        q, k, v = I[:3]
        mask = I[3] if masked else None
        o, lse = O

        def run():
            s = torch.matmul(q, k.transpose(-1, -2)) * scale
            bm = bias(q, k, mask)
            if bm is not None:
                s = s + bm
            l = torch.logsumexp(s, -1)
            p = torch.exp(s - l.unsqueeze(-1)).nan_to_num_(0.0)
            torch.matmul(p, v, out=o)
            lse.copy_(l)
        return run
    dout, q, k, v, o, lse = I[:6]
    mask = I[6] if masked else None
    g = dict(zip(a["grads"], O))

    def run():
        s = torch.matmul(q, k.transpose(-1, -2)) * scale
        bm = bias(q, k, mask)
        if bm is not None:
            s = s + bm
        p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num_(0.0)
        dp = torch.matmul(dout, v.transpose(-1, -2))
        ds = p * (dp - (dout * o).sum(-1, keepdim=True))
        if 0 in g:
            torch.matmul(ds, k, out=g[0]).mul_(scale)
        if 1 in g:
            torch.matmul(ds.transpose(-1, -2), q, out=g[1]).mul_(scale)
        if 2 in g:
            torch.matmul(p.transpose(-1, -2), dout, out=g[2])
    return run


def _attn_bwd_vf(f, T):
    q, k = T[f.x[0]].shape, T[f.x[1]].shape
    return 8 * q[0] * q[1] * q[2] * k[2]


def _mm_calls(graph, op, variant):
    """matmul.grad_input: one batched GEMM per operand that needs a gradient (attribute ``operand``)."""
    if op.kind != "matmul.grad_input":
        return None
    gy, a, b = op.inputs
    base = {k: v for k, v in op.attrs if k != "grads"}
    return [(op.kind, (g,), (gy, b if i == 0 else a), base | {"operand": i}, ())
            for i, g in zip(op.attr("grads"), op.outputs)]


_MATMUL = OpRecord(kind="matmul", calls=_mm_calls, family="attention", kernels={"matmul": ("port_bmm",), "matmul.grad_input": ("port_bmm",)},
                   shapes=_mm_shapes, torch=_mm_torch, encode=_mm_encode, aten=("matmul", "bmm"), capture=_mm_capture,
                   saved=_mm_saved, grad_input_reads=lambda f: f.x,
                   backward=lambda *a: multi_grad_backward(_MATMUL, *a), doc=__doc__)
_ATTENTION = OpRecord(kind="attention", family="attention",
                      kernels={"attention": ("port_attention_forward",),
                               "attention.grad_input": ("port_attention_backward",)},
                      shapes=_attn_shapes, torch=_attn_torch, encode=_attn_encode,
                      aten=("scaled_dot_product_attention",), capture=_sdpa_capture,
                      saved=lambda f, gi, gw, w: _attn_reads(f), grad_input_reads=_attn_reads,
                      bwd_vector_flops=_attn_bwd_vf, backward=lambda *a: multi_grad_backward(_ATTENTION, *a),
                      workspace=_attn_workspace, tags=frozenset({"tiled_variant"}), doc=__doc__)
register(_MATMUL, _ATTENTION)
