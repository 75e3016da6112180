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


# RMSNorm + linear fused (issue 54), the fused variant of rms_norm -> linear (port.plan.variants.FUSIONS
# "rmsnorm_linear"): kernels of the linear record, emitted for the chain's calls only (never captured as an op).
# rmsnorm_linear.stats: rstd from x (the norm's call: its output y is never stored); rmsnorm_linear: y_lin from
# (x, rstd[, gamma], W[, b]); rmsnorm_linear.grad_weight: the linear's gradients (weight[, bias]) from
# (dy, x, rstd[, gamma]). attrs: gamma, bias, weight_t, block_rows (the rows normalised per block), eps (stats).
RMSLIN_KERNELS = {"rmsnorm_linear.stats": ("port_rmsnorm_stats",), "rmsnorm_linear": ("port_rmsnorm_linear_forward",),
                  "rmsnorm_linear.grad_weight": ("port_rmsnorm_linear_backward_weight",)}


def _rmslin_shapes(k, attrs, I, O, at):
    x = tuple(at(I, 0, "input 0 (x)") if k != "rmsnorm_linear.grad_weight" else at(I, 1, "input 1 (x)"))
    if len(x) < 2:
        raise CallShapeError(f"{k}: x has shape {list(x)}: expected >= 2 dims")
    lead, fin = x[:-1], x[-1]
    r, g = ((numel(lead),), F32), (((fin,), F32),) if attrs.get("gamma") else ()
    if k == "rmsnorm_linear.stats":
        return [(x, F32)], [r]
    wt = bool(attrs.get("weight_t"))
    if k == "rmsnorm_linear":
        w = rank(at(I, 2 + len(g), "the weight"), 2, "weight")
        fo = w[1 if wt else 0]
        return [(x, F32), r, *g, (tuple(w), F32)] + ([((fo,), F32)] if attrs.get("bias") else []), [(lead + (fo,),
                                                                                                     F32)]
    fo = at(I, 0, "input 0 (dy)")[-1]
    return [(lead + (fo,), F32), (x, F32), r, *g], grads(attrs, {"weight": (fin, fo) if wt else (fo, fin),
                                                                 "bias": (fo,)})


def _rmslin_encode(kind, a, IS, OS, I, O, variant, call):
    if kind == "rmsnorm_linear.stats":
        return Encoded("port_rmsnorm_stats", (O[0], I[0]), (numel(IS[0]) // IS[0][-1], IS[0][-1]), (float(a["eps"]),))
    gi = 3 if a.get("gamma") else None
    if kind == "rmsnorm_linear":
        fin, w = IS[0][-1], 3 if gi else 2             # W's input index
        fo = IS[w][1 if a.get("weight_t") else 0]
        return Encoded("port_rmsnorm_linear_forward", (O[0], I[0], I[1], I[2] if gi else None, I[w],
                                                       I[w + 1] if a.get("bias") else None),
                       (numel(IS[0]) // fin, fin, fo, int(a["block_rows"]), int(bool(a.get("weight_t")))))
    fin, fo = IS[1][-1], IS[0][-1]
    g = dict(zip(a["grads"], O))
    return Encoded("port_rmsnorm_linear_backward_weight", (g["weight"], g.get("bias"), I[0], I[1], I[2],
                                                           I[3] if gi else None),
                   (numel(IS[1]) // fin, fin, fo, int(a["block_rows"]), int(bool(a.get("weight_t")))))


def _rmslin_workspace(kernel, variant, attrs, IS, OS) -> int:
    if kernel not in ("rmsnorm_linear", "rmsnorm_linear.grad_weight"):
        return 0         # the plain linear calls and the stats take none
    from port.exec import capi
    x = IS[0] if kernel == "rmsnorm_linear" else IS[1]
    return int(capi.raw.port_rmsnorm_linear_workspace_bytes(numel(x) // x[-1], x[-1], int(attrs["block_rows"])))


def _rmslin_torch(kind, a, I, O, env):
    """PyTorch's float32 kernels for the calls (the same maths: the norm's output rebuilt whole, then the linear)."""
    torch = env.torch
    x, r = I[0] if kind != "rmsnorm_linear.grad_weight" else I[1], None
    if kind == "rmsnorm_linear.stats":
        x2 = x.reshape(-1, x.shape[-1])
        return lambda: O[0].copy_(torch.rsqrt(x2.pow(2).mean(-1) + float(a["eps"])))
    r = I[1] if kind == "rmsnorm_linear" else I[2]
    g = (I[2] if kind == "rmsnorm_linear" else I[3]) if a.get("gamma") else None
    x2 = x.reshape(-1, x.shape[-1])

    def normed():
        y = x2 * r.reshape(-1, 1)
        return y * g if g is not None else y
    wt = bool(a.get("weight_t"))
    if kind == "rmsnorm_linear":
        w = I[3 if g is not None else 2]
        b = I[4 if g is not None else 3] if a.get("bias") else None
        out = O[0].reshape(-1, O[0].shape[-1])

        def run():
            y = normed() @ (w if wt else w.t())
            out.copy_(y + b if b is not None else y)
        return run
    dy = I[0].reshape(-1, I[0].shape[-1])
    gr = dict(zip(a["grads"], O))

    def run_w():
        y = normed()
        gr["weight"].add_(y.t() @ dy if wt else dy.t() @ y)
        if "bias" in gr:
            gr["bias"].add_(dy.sum(0))
    return run_w


def _shapes(k, attrs, I, O, at):
    if k in RMSLIN_KERNELS:
        return _rmslin_shapes(k, attrs, I, O, at)
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
        return _rmslin_encode(kind, a, IS, OS, I, O, variant, call)
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
        return _rmslin_torch(kind, a, I, O, env)
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
