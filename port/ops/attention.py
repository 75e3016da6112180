"""Attention: ``matmul`` (batched [B.., M, K] @ [B.., K, N]; bmm, matmul; and ``einsum``, a capture rule: a
two-operand einsum that is a batched matrix product, such as MaxViT's, becomes permute, reshape and matmul ops)
and ``attention``
(scaled_dot_product_attention over q [N, H, Tq, d], k and v [N, Hkv, Tk, d]: causal (``is_causal`` with Tq == Tk;
otherwise torch's mask aligns top left, the kernel's bottom right: left to torch) and/or with a boolean or
additive ``attn_mask`` of any shape that broadcasts to [N, H, Tq, Tk] (attribute ``mask``: "bool" or "add",
``mask_dims``: its extents padded to 4 dims), grouped-query attention (``enable_gqa``: Hkv divides H; attribute
``kv_heads``), and ``dropout_p`` (attribute ``p``: the probabilities dropped with PORT's generator,
port/ops/random.py, at element (n H + h) Tq Tk + i Tk + j of the forward's stream; the backward draws the mask
again: attribute ``rng_op`` = the forward op). Saves q, k, v, o, the row log-sum-exp and the mask. One gradient
op writes the gradients of every operand that needs one (``grads``). Attention has a ``tiled`` variant on the C
backend (flash-style, a workspace per thread).
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, replace

from port.ir.types import ROLE_ACTIVATION, numel
from port.ops import register
from port.ops.base import F32, CallShapeError, Encoded, OpRecord, arg, float32, fwd, public_attrs, rank, unit_float

ATTN_ALGO = {"plain": 0, "tiled": 1}     # PORT_ATTN_PLAIN, PORT_ATTN_TILED
ATTENTION_KERNELS = ("attention", "attention.grad_input")


def multi_grad_backward(rec, bc, f, fo, gy, xs_needing, trained, extra=None):
    """One ``<kind>.grad_input`` op writing the gradients of the operands among the first three that need one
    (``extra``: further attributes of it)."""
    need = tuple(i for i, t in enumerate(f.x[:3]) if t in xs_needing)
    if not need:
        return
    outs = [(f.x[i], bc.new_grad(f.x[i], "")) for i in need]
    fl = (f.flops // 2) * len(need) if f.kind == "matmul" else f.flops * 10 // 4
    bc.op(f"{f.name}.grad_input", f.layer, f"{f.kind}.grad_input", public_attrs(f) | {"grads": need} | (extra or {}),
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
# einsum: a capture rule only (permute, reshape and matmul ops)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EinsumPlan:
    """A two-operand einsum as one batched matmul: operand ``left`` permuted by ``perm_left`` and viewed as
    ``mm_left`` [Bt, M, K] times operand 1 - ``left`` permuted by ``perm_right`` and viewed as ``mm_right``
    [Bt, K, N]; the product [Bt, M, N] viewed as ``prod`` (its letters' extents) and permuted by ``perm_out`` into
    the result. An identity permutation is no op."""
    left: int
    perm_left: tuple[int, ...]
    mm_left: tuple[int, int, int]
    perm_right: tuple[int, ...]
    mm_right: tuple[int, int, int]
    prod: tuple[int, ...]
    perm_out: tuple[int, ...]


def _parse_einsum(eq: str) -> tuple[str, str, str] | None:
    """(a, b, out) subscripts of a two-operand equation of letters (implicit output: the letters used once, in
    order), or None (ellipsis, another operand count, a letter repeated within a term)."""
    eq = eq.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != 2 or not all(c.isascii() and c.isalpha() for c in "".join(terms) + out):
        return None
    a, b = terms
    if not arrow:
        out = "".join(sorted(c for c in set(a + b) if (a + b).count(c) == 1))
    if any(len(set(t)) != len(t) for t in (a, b, out)):
        return None
    return a, b, out


def einsum_plan(eq: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> EinsumPlan | None:
    """The matmul form of ``eq`` over operands of shapes ``sa`` and ``sb``, or None where the equation is not a
    (batched) matrix product: a letter summed within one operand, a diagonal, extents that differ (broadcast),
    an ellipsis. Of the two forms (A B, or the transposed product B^T A^T) the one that permutes fewer elements."""
    terms = _parse_einsum(eq)
    if terms is None:
        return None
    a, b, out = terms
    if len(a) != len(sa) or len(b) != len(sb) or not set(out) <= set(a) | set(b) or \
            not (set(a) ^ set(b)) <= set(out):
        return None
    size = dict(zip(a, sa))
    if any(size.setdefault(c, e) != e for c, e in zip(b, sb)):
        return None
    batch = [c for c in out if c in a and c in b]
    k = [c for c in a if c in b and c not in out]
    best = None
    for left, (x, y) in enumerate(((a, b), (b, a))):
        m = [c for c in out if c in x and c not in y]
        n = [c for c in out if c in y and c not in x]
        ol, orr, prod = batch + m + k, batch + k + n, batch + m + n
        plan = EinsumPlan(left, tuple(x.index(c) for c in ol), _mm3(size, batch, m, k),
                          tuple(y.index(c) for c in orr), _mm3(size, batch, k, n),
                          tuple(size[c] for c in prod), tuple(prod.index(c) for c in out))
        moved = sum(numel(s) for s, p in ((sa if left == 0 else sb, plan.perm_left),
                                          (sb if left == 0 else sa, plan.perm_right),
                                          (plan.prod, plan.perm_out)) if list(p) != sorted(p))
        if best is None or moved < best[0]:
            best = (moved, plan)
    return best[1]


def _mm3(size: dict, batch: list, rows: list, cols: list) -> tuple[int, int, int]:
    return tuple(numel(tuple(size[c] for c in g)) for g in (batch, rows, cols))


def _einsum_capture(ctx):
    """torch.einsum of two float32 operands that is a batched matrix product: permute ops (where the letters are
    not in matmul order), reshape views, one matmul (runs on C and in port-rt); any other einsum declines (a
    torch_op)."""
    from port.ops.shape import view_fwd
    n = ctx.node
    eq, operands = arg(n, 0, "equation"), arg(n, 1, "tensors")
    if not isinstance(eq, str) or not isinstance(operands, (list, tuple)) or len(operands) != 2:
        return False
    xs = tuple(ctx.t(o) for o in operands)
    plan = einsum_plan(eq, ctx.shape(xs[0]), ctx.shape(xs[1]))
    if plan is None or not float32(ctx, *xs) or max(len(ctx.shape(x)) for x in xs) > 6 or len(plan.prod) > 6:
        return False
    made = []

    def tensor(tag: str, shape) -> int:
        return ctx.b.tensor(f"{ctx.opname}:{tag}", shape, F32, ROLE_ACTIVATION)

    def permuted(x: int, perm: tuple[int, ...], tag: str, last: bool = False) -> int:
        if list(perm) == sorted(perm):
            return x
        y = ctx.out() if last else tensor(tag, tuple(ctx.shape(x)[i] for i in perm))
        made.append(replace(fwd(ctx, "permute", dict(perm=perm), (x,), (y,)), name=f"{ctx.opname}.{tag}"))
        return y

    def viewed(x: int, shape: tuple[int, ...], tag: str, last: bool = False) -> int:
        if tuple(shape) == ctx.shape(x):
            return x
        y = ctx.out() if last else tensor(tag, shape)
        made.append(view_fwd(ctx.b, f"{ctx.opname}.{tag}", ctx.scope, x, y))
        return y

    l = viewed(permuted(xs[plan.left], plan.perm_left, "left"), plan.mm_left, "left_mm")
    r = viewed(permuted(xs[1 - plan.left], plan.perm_right, "right"), plan.mm_right, "right_mm")
    (bt, m, k), nn = plan.mm_left, plan.mm_right[2]
    tail = list(plan.perm_out) != sorted(plan.perm_out) or plan.prod != (bt, m, nn)
    y = ctx.out() if not tail else tensor("mm", (bt, m, nn))
    made.append(replace(fwd(ctx, "matmul", {}, (l, r), (y,), 2 * bt * m * nn * k), name=f"{ctx.opname}.mm"))
    identity_out = list(plan.perm_out) == sorted(plan.perm_out)
    permuted(viewed(y, plan.prod, "prod", last=identity_out), plan.perm_out, "out", last=True)
    return made


def _einsum_shapes(k, attrs, I, O, at):
    raise CallShapeError("einsum is a capture rule only: it makes permute, reshape and matmul ops")


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------
def _sdpa_capture(ctx):
    n = ctx.node
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    a = dict(zip(names, n.args)) | dict(n.kwargs)
    p = float(a.get("dropout_p", 0.0) or 0.0)
    q, k, v = (ctx.t(a[x]) for x in ("query", "key", "value"))
    sq, sk, sv = ctx.shape(q), ctx.shape(k), ctx.shape(v)
    if len(sq) != 4 or sk != sv or len(sk) != 4 or sq[0] != sk[0] or sq[3] != sk[3] or not float32(ctx, q, k, v) \
            or not 0.0 <= p < 1.0:
        return False
    n_, h, tq, d = sq
    hkv, tk = sk[1], sk[2]
    if hkv != h and not (a.get("enable_gqa") and hkv >= 1 and h % hkv == 0):
        return False
    if a.get("is_causal") and tq != tk:     # torch aligns the causal mask top left, the kernel bottom right
        return False
    scale = a.get("scale")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    ins = (q, k, v)
    attrs = dict(causal=bool(a.get("is_causal", False)), scale=scale)
    if hkv != h:
        attrs["kv_heads"] = hkv
    if p > 0.0:
        attrs["p"] = p
    mask = a.get("attn_mask")
    if mask is not None:
        m = ctx.t(mask)
        ms, full = tuple(ctx.shape(m)), (n_, h, tq, tk)
        if ctx.dtype(m) not in ("bool", F32) or len(ms) > 4:
            return False
        dims = (1,) * (4 - len(ms)) + ms
        if any(e not in (1, f) for e, f in zip(dims, full)):
            return False
        attrs |= dict(mask="bool" if ctx.dtype(m) == "bool" else "add", mask_dims=dims)
        ins = ins + (m,)
    y = ctx.out()
    lse = ctx.b.tensor(f"{ctx.opname}:lse", (n_, h, tq), F32, ROLE_ACTIVATION)
    return fwd(ctx, "attention", attrs, ins, (y, lse), 4 * n_ * h * tq * tk * d, 6 * n_ * h * tq * tk)


def _attn_reads(f):
    return f.x[:3] + f.outputs + f.x[3:]        # (q, k, v, o, lse[, mask])


def _mask_dims(attrs, q, kk) -> tuple[int, ...] | None:
    """The mask operand's 4 extents (None without a mask), checked against q [N, H, Tq, d] and k."""
    kind = attrs.get("mask")
    if kind is None:
        return None
    dims = attrs.get("mask_dims")
    full = (q[0], q[1], q[2], kk[2])
    if kind not in ("bool", "add") or not isinstance(dims, tuple) or len(dims) != 4 or \
            any(type(e) is not int or e not in (1, f) for e, f in zip(dims, full)):
        raise CallShapeError(f"attention mask={kind!r}, mask_dims={dims!r}: expected 'bool' or 'add' and 4 extents "
                             f"each 1 or the one of {list(full)}")
    return tuple(dims)


def _attn_shapes(k, attrs, I, O, at):
    q = rank(at(I, 0 if k == "attention" else 1, "q"), 4, "q")
    kk = rank(at(I, 1 if k == "attention" else 2, "k"), 4, "k")
    kvh = attrs.get("kv_heads", q[1])
    if kk[0] != q[0] or kk[3] != q[3] or not isinstance(attrs.get("scale"), float) or type(kvh) is not int or \
            kvh < 1 or q[1] % kvh or kk[1] != kvh:
        raise CallShapeError(f"attention of q {list(q)}, k {list(kk)} (scale={attrs.get('scale')!r}, "
                             f"kv_heads={attrs.get('kv_heads')!r})")
    if "p" in attrs:
        unit_float(attrs, "p")
    Q, K_, lse = (q, F32), (kk, F32), ((q[0], q[1], q[2]), F32)
    dims = _mask_dims(attrs, q, kk)
    mask = []
    if dims is not None:       # the mask tensor's own shape (rank <= 4), its extents padded with 1s: mask_dims
        ms = at(I, 3 if k == "attention" else 6, "mask")
        if ms is not None and (len(ms) > 4 or (1,) * (4 - len(ms)) + tuple(ms) != dims):
            raise CallShapeError(f"attention mask of shape {list(ms)}: expected mask_dims {list(dims)}")
        mask = [(tuple(ms) if ms is not None else dims, "bool" if attrs["mask"] == "bool" else F32)]
    if k == "attention":
        return [Q, K_, K_] + mask, [Q, lse]
    g = attrs.get("grads")
    if not isinstance(g, tuple) or not g or any(i not in (0, 1, 2) for i in g) or list(g) != sorted(set(g)):
        raise CallShapeError(f"attribute grads={g!r}: expected increasing operand indices among 0 (q), 1, 2")
    return [Q, Q, K_, K_, Q, lse] + mask, [(Q, K_, K_)[i] for i in g]


_MASK_KIND = {None: 0, "bool": 1, "add": 2}        # PORT_ATTN_MASK_KEYS (none here), _BOOL, _ADD


def attention_params(capi, kernel: str, attrs: dict, in_shapes):
    """port_attention_params of an attention call from its slot shapes (q is input 0 of the forward, 1 of the
    backward, whose input 0 is the output gradient). The dropout seed and stream are the run's (left 0)."""
    q = in_shapes[0] if kernel == "attention" else in_shapes[1]
    k = in_shapes[1] if kernel == "attention" else in_shapes[2]
    n, h, tq, d = q
    dims = _mask_dims(attrs, q, k) or (0, 0, 0, 0)
    p = capi.AttentionParams(n * h, h, tq, k[2], d, int(bool(attrs.get("causal"))), float(attrs["scale"]),
                             int(attrs.get("kv_heads", 0)), _MASK_KIND[attrs.get("mask")])
    p.mask_dims[:] = dims
    p.dropout_p = float(attrs.get("p", 0.0))
    return p


def _attn_workspace(kernel, variant, attrs, in_shapes, out_shapes) -> int:
    from port.exec import capi
    p = attention_params(capi, kernel, attrs, in_shapes)
    return int(capi.raw.port_attention_workspace_bytes(ctypes.byref(p), ATTN_ALGO.get(variant, 0),
                                                       int(kernel != "attention")))


def _rng_op(kind, a, call) -> int:
    """The forward op whose stream the dropout mask comes from (0 without dropout)."""
    if not a.get("p"):
        return 0
    return int(call.op) if kind == "attention" else int(a["rng_op"])


def _attn_encode(kind, a, IS, OS, I, O, variant, call):
    backward = kind != "attention"
    q, k = (IS[0], IS[1]) if not backward else (IS[1], IS[2])
    n, h, tq, d = q
    dims = _mask_dims(a, q, k) or (0, 0, 0, 0)
    iv = (n * h, h, tq, k[2], d, int(bool(a.get("causal"))), ATTN_ALGO.get(variant, 0), int(a.get("kv_heads", 0)),
          _MASK_KIND[a.get("mask")], *dims, _rng_op(kind, a, call))
    fv = (float(a["scale"]), float(a.get("p", 0.0)))
    masked = a.get("mask") is not None
    state = bool(a.get("p"))
    if not backward:
        return Encoded("port_attention_forward", (O[0], O[1], I[0], I[1], I[2], I[3] if masked else None), iv, fv,
                       state)
    g = dict(zip(a["grads"], O))       # 0: dq, 1: dk, 2: dv (NULL where no gradient is needed)
    return Encoded("port_attention_backward", (g.get(0), g.get(1), g.get(2), I[0], I[1], I[2], I[3], I[4], I[5],
                                               I[6] if masked else None), iv, fv, state)


def _attn_torch(kind, a, I, O, env):
    """The math path in torch, the same function as the C kernels: grouped heads by repeating k, v (their
    gradients summed over each group), the mask broadcast (boolean: -inf where False; additive: added), the
    dropout keep mask from PORT's generator."""
    from port.ops.random import call_stream, keep_mask
    torch = env.torch
    scale, causal, mk = float(a["scale"]), bool(a.get("causal")), a.get("mask")
    pr = float(a.get("p", 0.0))

    def scores(q, k, mask):
        """scale q k^T with the mask (boolean: -inf where False; additive: added) and the causal limit."""
        s = torch.matmul(q, k.transpose(-1, -2)) * scale
        if mk == "bool":
            s = s.masked_fill(~mask.bool(), float("-inf"))
        elif mk == "add":
            s = s + mask
        if causal:
            tq, tk = q.shape[2], k.shape[2]
            s = s.masked_fill(torch.ones(tq, tk, dtype=torch.bool, device=q.device).triu(tk - tq + 1), float("-inf"))
        return s

    def rep(t, h):
        return t if t.shape[1] == h else t.repeat_interleave(h // t.shape[1], 1)

    def unrep(t, hkv):
        n, h = t.shape[:2]
        return t if h == hkv else t.reshape(n, hkv, h // hkv, *t.shape[2:]).sum(2)

    def keep(shape, op):
        if not pr:
            return None
        seed, stream = call_stream(env, op)
        return keep_mask(torch, seed, stream, shape, pr, I[0].device).to(I[0].dtype) / (1.0 - _f32(pr))

    if kind == "attention":
        q, k, v = I[:3]
        mask = I[3] if mk else None
        o, lse = O

        def run():
            h = q.shape[1]
            s = scores(q, rep(k, h), mask)
            l = torch.logsumexp(s, -1)
            p = torch.exp(s - l.unsqueeze(-1)).nan_to_num_(0.0)
            kd = keep(p.shape, None)
            torch.matmul(p if kd is None else p * kd, rep(v, h), out=o)
            lse.copy_(l)
        return run
    dout, q, k, v, o, lse = I[:6]
    mask = I[6] if mk else None
    g = dict(zip(a["grads"], O))

    def run():
        h, hkv = q.shape[1], k.shape[1]
        kr, vr = rep(k, h), rep(v, h)
        s = scores(q, kr, mask)
        p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num_(0.0)
        kd = keep(p.shape, int(a.get("rng_op", 0)))
        dp = torch.matmul(dout, vr.transpose(-1, -2))
        if kd is not None:
            dp = dp * kd
        ds = p * (dp - (dout * o).sum(-1, keepdim=True))
        if 0 in g:
            torch.matmul(ds, kr, out=g[0]).mul_(scale)
        if 1 in g:
            g[1].copy_(unrep(torch.matmul(ds.transpose(-1, -2), q), hkv)).mul_(scale)
        if 2 in g:
            g[2].copy_(unrep(torch.matmul((p if kd is None else p * kd).transpose(-1, -2), dout), hkv))
    return run


def _f32(x: float) -> float:
    return float(ctypes.c_float(x).value)


def _attn_backward(bc, f, fo, gy, xs_needing, trained):
    """multi_grad_backward, the gradient op also naming the forward op (``rng_op``) whose dropout stream it
    redraws."""
    multi_grad_backward(_ATTENTION, bc, f, fo, gy, xs_needing, trained, {"rng_op": fo.id} if "p" in f.attrs else None)


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
                      bwd_vector_flops=_attn_bwd_vf, backward=_attn_backward,
                      workspace=_attn_workspace, tags=frozenset({"tiled_variant"}), doc=__doc__)
_EINSUM = OpRecord(kind="einsum", family="attention", kernels={}, shapes=_einsum_shapes, aten=("einsum",),
                   capture=_einsum_capture, doc=_einsum_capture.__doc__)
register(_MATMUL, _ATTENTION, _EINSUM)
