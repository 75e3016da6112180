"""linear: y = x W^T + b over the last dim of x ([..., in] -> [..., out]); the forward's FLOPs again for each
gradient. Saved: x for the weight gradient, the weight for the input gradient. ``addmm(b, x, W)`` and
``mm(x, W)`` with a parameter W stored [in, out] (Hugging Face GPT-2's Conv1D) are linear with attribute
``weight_t``: the C kernels ``port_linear_t_*`` take W in that layout (y = x W + b; the weight gradient
accumulates in the parameter's own [in, out] layout), the torch engines the transposed views.
"""
from __future__ import annotations

from port.ir.types import numel
from port.ops import register
from port.ops.base import F32, CallShapeError, Encoded, OpRecord, arg, float32, fwd, grads, rank


def _capture(ctx):
    n = ctx.node
    packet = n.target._overloadpacket.__name__
    if packet == "linear":
        xa, wa, ba = n.args[0], n.args[1], arg(n, 2, "bias")
    elif packet == "addmm":       # addmm(bias, x, W): W [in, out]
        ba, xa, wa = n.args[0], n.args[1], n.args[2]
        if arg(n, 3, "beta", 1) != 1 or arg(n, 4, "alpha", 1) != 1:
            return False
    else:                         # mm(x, W)
        xa, wa, ba = n.args[0], n.args[1], None
    if not hasattr(xa, "name") or not hasattr(wa, "name"):
        return False
    x = ctx.t(xa)
    if (not ctx.is_param(wa) or (ba is not None and not ctx.is_param(ba)) or len(ctx.shape(x)) < 2
            or not float32(ctx, x)):
        return False
    w = ctx.t(wa)
    wt = packet != "linear"
    fo = ctx.shape(w)[1 if wt else 0]
    bias = ctx.t(ba) if ba is not None else None
    if bias is not None and tuple(ctx.shape(bias)) != (fo,):
        return False              # (a bias broadcast over rows only)
    params = {"weight": w} | ({"bias": bias} if bias is not None else {})
    rows = numel(ctx.shape(x)[:-1])
    return fwd(ctx, "linear", dict(bias=bias is not None) | ({"weight_t": True} if wt else {}), (x,), (ctx.out(),),
               2 * rows * ctx.shape(w)[0] * ctx.shape(w)[1], rows * fo if bias is not None else 0, params=params)


def _saved(f, gi, gw, wanted):
    return tuple(([f.x[0]] if gw else []) + ([f.params["weight"]] if gi else []))


# RMSNorm + linear fused (issue 54), the fused variant of rms_norm -> linears (port.plan.variants.FUSIONS
# "rmsnorm_linear"): kernels of the linear record, emitted for the chain's calls only (never captured as an op).
# rmsnorm_linears: the norm's call for all k linears reading its output y (rstd and the linears' outputs from x[,
# gamma], W_1..W_k and the biases of the linears marked in attribute biases; y never stored); rmsnorm_linears.
# grad_weight: their weight gradients in one call (dW_1..dW_k and the bias gradients marked in biases, from dy_1..dy_k,
# x, rstd[, gamma]). Each block of block_rows rows of x is normalised once for the k GEMMs. attrs: gamma, weight_t,
# block_rows, biases (a bool per linear), eps (forward).
RMSLIN_KERNELS = {"rmsnorm_linears": ("port_rmsnorm_linears_forward",),
                  "rmsnorm_linears.grad_weight": ("port_rmsnorm_linears_backward_weight",)}
# the linears one call takes: a port-rt call holds 10 pointers, 3 + 2 per linear + 1 per bias (rt_check.c)
RMSLIN_MAX_LINEARS, RMSLIN_MAX_POINTERS = 3, 10


def rmslin_fits(biases: tuple[bool, ...]) -> bool:
    """Whether k linears with these biases (or bias gradients) fit one rmsnorm_linears call."""
    return 1 <= len(biases) <= RMSLIN_MAX_LINEARS and 3 + 2 * len(biases) + sum(biases) <= RMSLIN_MAX_POINTERS


def _rmslins_shapes(k, attrs, I, O, at):
    bias, wt, gi = tuple(attrs.get("biases") or ()), bool(attrs.get("weight_t")), int(bool(attrs.get("gamma")))
    if not rmslin_fits(bias):
        raise CallShapeError(f"{k}: attribute biases={bias!r}: expected 1 to {RMSLIN_MAX_LINEARS} linears that fit "
                             f"{RMSLIN_MAX_POINTERS} pointers")
    nk = len(bias)
    fwd = k == "rmsnorm_linears"
    x = tuple(at(I, 0 if fwd else nk, "x"))
    if len(x) < 2:
        raise CallShapeError(f"{k}: x has shape {list(x)}: expected >= 2 dims")
    lead, fin = x[:-1], x[-1]
    r, g = ((numel(lead),), F32), [((fin,), F32)] * gi
    if fwd:
        ws_ = [tuple(rank(at(I, 1 + gi + i, f"weight {i}"), 2, "weight")) for i in range(nk)]
        fo = [w[1 if wt else 0] for w in ws_]
        return ([(x, F32), *g, *[(w, F32) for w in ws_], *[((f,), F32) for f, b in zip(fo, bias) if b]],
                [r, *[(lead + (f,), F32) for f in fo]])
    fo = [at(I, i, f"dy {i}")[-1] for i in range(nk)]
    dws = [((fin, f) if wt else (f, fin), F32) for f in fo]
    return ([(lead + (f,), F32) for f in fo] + [(x, F32), r, *g], dws + [((f,), F32) for f, b in zip(fo, bias) if b])


def _rmslins_encode(kind, a, IS, OS, I, O):
    """port-rt's layout (rt_check.c rmsnorm_linears): 119: rstd, y[k], x, gamma, w[k], the biases; 131: dw[k], the bias
    gradients, dy[k], x, rstd, gamma; iv n, in, k, block rows, wt, bias mask, out[k]."""
    bias, gi, wt = tuple(a["biases"]), int(bool(a.get("gamma"))), int(bool(a.get("weight_t")))
    nk, mask = len(bias), sum(1 << i for i, b in enumerate(bias) if b)
    if kind == "rmsnorm_linears":
        x, fin = IS[0], IS[0][-1]
        fo = [OS[1 + i][-1] for i in range(nk)]
        gamma = (I[1],) if gi else (None,)
        ptrs = (O[0], *O[1:1 + nk], I[0], *gamma, *I[1 + gi:1 + gi + nk], *I[1 + gi + nk:])
        return Encoded("port_rmsnorm_linears_forward", ptrs, (numel(x) // fin, fin, nk, int(a["block_rows"]), wt, mask,
                                                              *fo), (float(a["eps"]),))
    x, fin = IS[nk], IS[nk][-1]
    fo = [IS[i][-1] for i in range(nk)]
    gamma = (I[nk + 2],) if gi else (None,)
    return Encoded("port_rmsnorm_linears_backward_weight", (*O, *I[:nk + 2], *gamma),
                   (numel(x) // fin, fin, nk, int(a["block_rows"]), wt, mask, *fo))


def _rmslin_workspace(kernel, variant, attrs, IS, OS) -> int:
    if kernel not in RMSLIN_KERNELS:
        return 0         # the plain linear calls take none
    from port.exec import capi
    x = IS[0] if kernel == "rmsnorm_linears" else IS[len(attrs["biases"])]
    return int(capi.raw.port_rmsnorm_linear_workspace_bytes(numel(x) // x[-1], x[-1], int(attrs["block_rows"])))


def _rmslins_torch(kind, a, I, O, env):
    """rmsnorm_linears[.grad_weight] on PyTorch's float32 kernels: the norm's output whole, then each linear."""
    torch, bias, gi = env.torch, tuple(a["biases"]), int(bool(a.get("gamma")))
    nk, wt = len(bias), bool(a.get("weight_t"))
    fwd = kind == "rmsnorm_linears"
    x = (I[0] if fwd else I[nk]).reshape(-1, (I[0] if fwd else I[nk]).shape[-1])
    g = (I[1] if fwd else I[nk + 2]) if gi else None

    def normed(r):
        y = x * r.reshape(-1, 1)
        return y * g if g is not None else y
    if fwd:
        ws_, bs = I[1 + gi:1 + gi + nk], iter(I[1 + gi + nk:])
        bs = [next(bs) if b else None for b in bias]
        outs = [o.reshape(-1, o.shape[-1]) for o in O[1:]]

        def run():
            O[0].copy_(torch.rsqrt(x.pow(2).mean(-1) + float(a["eps"])))
            y = normed(O[0])
            for w, b, out in zip(ws_, bs, outs):
                z = y @ (w if wt else w.t())
                out.copy_(z + b if b is not None else z)
        return run
    dys = [d.reshape(-1, d.shape[-1]) for d in I[:nk]]
    dbs = iter(O[nk:])
    dbs = [next(dbs) if b else None for b in bias]

    def run_w():
        y = normed(I[nk + 1])
        for dw, db, dy in zip(O[:nk], dbs, dys):
            dw.add_(y.t() @ dy if wt else dy.t() @ y)
            if db is not None:
                db.add_(dy.sum(0))
    return run_w


def _shapes(k, attrs, I, O, at):
    if k in RMSLIN_KERNELS:
        return _rmslins_shapes(k, attrs, I, O, at)
    xt = at(I, 0, "input 0 (x)") if k == "linear" else (at(O, 0, "output 0 (dx)") if k.endswith("input")
                                                          else at(I, 1, "input 1 (x)"))
    if xt is None or len(xt) < 2:
        raise CallShapeError(f"x has shape {list(xt) if xt is not None else None}: expected >= 2 dims")
    lead = tuple(xt[:-1])
    wt = bool(attrs.get("weight_t"))
    fo = (rank(at(I, 1, "input 1 (weight)"), 2, "weight")[1 if wt else 0] if k != "linear.grad_weight"
          else at(I, 0, "input 0 (dy)")[-1])
    x = (lead + (xt[-1],))
    w, y, b = (((x[-1], fo) if wt else (fo, x[-1])), F32), (lead + (fo,), F32), ((fo,), F32)
    if k == "linear":
        return [(x, F32), w] + ([b] if attrs.get("bias") else []), [y]
    if k == "linear.grad_input":
        return [y, w], [(x, F32)]
    return [y, (x, F32)], grads(attrs, {"weight": w[0], "bias": b[0]})


def _encode(kind, a, IS, OS, I, O, variant, call):
    if kind in RMSLIN_KERNELS:
        return _rmslins_encode(kind, a, IS, OS, I, O)
    t = "_t" if a.get("weight_t") else ""          # W [in, out]: port_linear_t_*, the same params
    if kind == "linear":
        fin = IS[0][-1]
        return Encoded(f"port_linear{t}_forward", (O[0], I[0], I[1], I[2] if a.get("bias") else None),
                       (numel(IS[0]) // fin, fin, IS[1][1 if t else 0]))
    if kind == "linear.grad_input":
        fin = OS[0][-1]
        return Encoded(f"port_linear{t}_backward_input", (O[0], I[0], I[1]),
                       (numel(OS[0]) // fin, fin, IS[1][1 if t else 0]))
    fin, fout = IS[1][-1], IS[0][-1]
    n = numel(IS[1]) // fin
    g = dict(zip(a["grads"], O))
    if g.get("weight") is None:
        return Encoded("port_bias_backward", (g.get("bias"), I[0]), (n, fout, 1))
    return Encoded(f"port_linear{t}_backward_weight", (g.get("weight"), g.get("bias"), I[0], I[1]), (n, fin, fout))


def _torch(kind, a, I, O, env):
    if kind in RMSLIN_KERNELS:
        return _rmslins_torch(kind, a, I, O, env)
    torch = env.torch
    if I[0].dim() > 2:     # [..., features]: the same call on [rows, features]
        I = [t.reshape(-1, t.shape[-1]) if t.dim() > 2 else t for t in I]
        O = [t.reshape(-1, t.shape[-1]) if t.dim() > 2 else t for t in O]
    wt = bool(a.get("weight_t"))       # W stored [in, out]
    if kind == "linear":
        x, w = I[0], I[1]
        y = O[0]
        wm = w if wt else w.t()
        if a.get("bias"):
            b = I[2]
            return lambda: torch.addmm(b, x, wm, out=y)
        return lambda: torch.mm(x, wm, out=y)
    if kind == "linear.grad_input":
        dy, w = I
        dx = O[0]
        wm = w.t() if wt else w
        return lambda: torch.mm(dy, wm, out=dx)
    dy, x = I
    gr = dict(zip(a["grads"], O))
    dw, db = gr.get("weight"), gr.get("bias")

    def run():
        if dw is not None and wt:
            dw.addmm_(x.t(), dy)
        elif dw is not None:
            dw.addmm_(dy.t(), x)
        if db is not None:
            db.add_(dy.sum(0))
    return run


register(OpRecord(
    kind="linear", family="linear",
    kernels={"linear": ("port_linear_forward", "port_linear_t_forward"),
             "linear.grad_input": ("port_linear_backward_input", "port_linear_t_backward_input"),
             "linear.grad_weight": ("port_linear_backward_weight", "port_linear_t_backward_weight",
                                    "port_bias_backward")} | RMSLIN_KERNELS,
    shapes=_shapes, torch=_torch, encode=_encode, aten=("linear", "addmm", "mm"), capture=_capture, saved=_saved,
    grad_input_reads=lambda f: (f.params["weight"],), grad_weight_reads=lambda f: (f.x[0],), weight_flops=True,
    workspace=_rmslin_workspace,
    tags=frozenset({"checkpoint"}), doc=__doc__))
