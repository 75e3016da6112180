"""Norms: batch_norm2d (training: batch statistics, running statistics updated; eval: running statistics) and
layer_norm (over the last dim or the last ``dims`` trailing dims, optional affine weight and bias).

Saved (autograd's choice): batch norm in training x, its statistics [2, C] (mean, 1/std) and gamma; in eval
gamma and the running variance (and x, running mean for the weight gradient). Layer norm: x, its statistics
[2, rows] and the weight. Batch norm has an ``inplace`` variant: y over x, the backward rebuilds x-hat from y
(kernels ``batch_norm2d.grad_*_from_output``).
"""
from __future__ import annotations

from port.ir.types import ROLE_ACTIVATION, numel
from port.ops import register
from port.ops.base import F32, CallShapeError, Encoded, OpRecord, grads, rank


def bn_scalars(attrs: dict) -> None:
    eps, mom = attrs.get("eps"), attrs.get("momentum")
    if not isinstance(eps, float) or not 0.0 < eps < float("inf"):
        raise CallShapeError(f"attribute eps={eps!r}: expected a finite float > 0")
    if not isinstance(mom, float) or not 0.0 <= mom <= 1.0:
        raise CallShapeError(f"attribute momentum={mom!r}: expected a float in [0, 1]")


# =============================================================================================
# batch_norm2d
# =============================================================================================
def _bn_capture(ctx):
    """_native_batch_norm_legit_functional (training: outputs y, mean, rstd, new running mean/var) and
    _native_batch_norm_legit_no_training (eval: y, and two empty tensors)."""
    from port.ir import capture as C
    from port.ops.base import Fwd, float32
    n = ctx.node
    packet = n.target._overloadpacket.__name__
    training = packet == "_native_batch_norm_legit_functional"
    if training:
        xa, wa, ba, rma, rva, tr, mom, eps = n.args[:8]
        if not tr:
            return False
    else:
        xa, wa, ba, rma, rva, mom, eps = n.args[:7]
    x = ctx.t(xa)
    if (len(ctx.shape(x)) != 4 or not ctx.is_param(wa) or not ctx.is_param(ba) or not ctx.is_buffer(rma)
            or not ctx.is_buffer(rva) or not float32(ctx, x)):
        return False
    vals = C.val_of(n)
    y = ctx.out(val=vals[0])
    outs: tuple[int, ...] = (y,)
    ys = ctx.shape(y)
    if training:
        outs = (y, ctx.b.tensor(f"{ctx.opname}:stats", (2, ys[1]), F32, ROLE_ACTIVATION))
    ctx.multi[n.name] = {0: y}
    attrs = dict(training=training, eps=float(eps), momentum=float(mom))
    if ctx.t(wa) in ctx.zero_params:     # a scale with an entry 0 at capture: never in place (variants.inplace_legal)
        attrs["gamma_has_zero"] = True
    return Fwd(ctx.opname, ctx.scope, "batch_norm2d", attrs, (x,), {"weight": ctx.t(wa), "bias": ctx.t(ba)},
               {"running_mean": ctx.t(rma), "running_var": ctx.t(rva)}, outs, 0, (8 if training else 2) * numel(ys))


def _bn_saved(f, gi, gw, wanted):
    x = f.x[0]
    if f.attrs["training"]:
        return (x, f.outputs[1], f.params["weight"])
    s = [f.params["weight"], f.buffers["running_var"]] if gi else []
    if gw:
        s = [x, f.buffers["running_mean"], f.buffers["running_var"]] + s
    return tuple(s)


def _bn_gi_reads(f):
    if f.attrs["training"]:
        return (f.x[0], f.outputs[1], f.params["weight"])
    return (f.params["weight"], f.buffers["running_var"])


def _bn_gw_reads(f):
    if f.attrs["training"]:
        return (f.x[0], f.outputs[1])
    return (f.x[0], f.buffers["running_mean"], f.buffers["running_var"])


def _bn_shapes(k, attrs, I, O, at):
    tr = bool(attrs.get("training"))
    if k == "batch_norm2d":
        x = rank(at(I, 0, "input 0 (x)"), 4, "x")
    elif k in ("batch_norm2d.grad_input",) and not tr:
        x = rank(at(O, 0, "output 0 (dx)"), 4, "dx")
    else:
        x = rank(at(I, 1, "input 1 (x)"), 4, "x")
    bn_scalars(attrs)
    X, c, st = (x, F32), ((x[1],), F32), ((2, x[1]), F32)
    if k == "batch_norm2d":
        return [X, c, c, c, c], ([X, st, c, c] if tr else [X])
    if k == "batch_norm2d.grad_input":
        return ([X, X, st, c] if tr else [X, c, c]), [X]
    if k == "batch_norm2d.grad_weight":
        return ([X, X, st] if tr else [X, X, c, c]), grads(attrs, {"weight": c[0], "bias": c[0]})
    if k == "batch_norm2d.grad_input_from_output":
        return [X, X, st, c, c], [X]
    return [X, X, c, c], grads(attrs, {"weight": c[0], "bias": c[0]})      # grad_weight_from_output


def _bn_encode(kind, a, IS, OS, I, O, variant, call):
    ins, outs = call.inputs, call.outputs
    x_shape = IS[0] if kind == "batch_norm2d" else (OS[0] if kind.endswith("grad_input") else IS[1])
    if kind.endswith("_from_output"):
        x_shape = IS[1]
    if kind == "batch_norm2d.grad_input" and len(IS) == 3 and not a.get("training"):
        x_shape = OS[0]
    n, c, h, w = x_shape
    iv, fv = (n, c, h, w), (float(a["eps"]), float(a["momentum"]))
    tr = bool(a.get("training"))
    g = dict(zip(a.get("grads", ()), O))
    if kind == "batch_norm2d":
        inv = (outs[1], 4 * c) if tr else None
        if tr:   # outs (y, stats, rm, rv); ins (x, w, b, rm, rv); a re-run leaves running stats alone
            rm, rv = (None, None) if a.get("recompute") else (I[3], I[4])
            return Encoded("port_batchnorm2d_forward_train", (O[0], O[1], inv, rm, rv, I[0], I[1], I[2]), iv, fv)
        return Encoded("port_batchnorm2d_forward_eval", (O[0], I[0], I[1], I[2], I[3], I[4]), iv, fv)
    if kind == "batch_norm2d.grad_input_from_output":   # ins (gy, y, stats, gamma, beta)
        return Encoded("port_batchnorm2d_backward_input_from_output",
                       (O[0], I[0], I[1], I[3], I[4], (ins[2], 4 * c)), iv, fv)
    if kind == "batch_norm2d.grad_weight_from_output":  # ins (gy, y, gamma, beta)
        return Encoded("port_batchnorm2d_backward_weight_from_output",
                       (g.get("weight"), g.get("bias"), I[0], I[1], I[2], I[3]), iv, fv)
    if kind == "batch_norm2d.grad_input":
        if tr:   # ins (gy, x, stats, weight)
            return Encoded("port_batchnorm2d_backward_input", (O[0], I[0], I[1], I[3], I[2], (ins[2], 4 * c)), iv, fv)
        return Encoded("port_batchnorm2d_backward_input_eval", (O[0], I[0], I[1], I[2]), iv, fv)
    if tr:   # grad_weight, ins (gy, x, stats)
        return Encoded("port_batchnorm2d_backward_weight",
                       (g.get("weight"), g.get("bias"), I[0], I[1], I[2], (ins[2], 4 * c)), iv, fv)
    return Encoded("port_batchnorm2d_backward_weight_eval",   # ins (gy, x, rm, rv)
                   (g.get("weight"), g.get("bias"), I[0], I[1], I[2], I[3]), iv, fv)


def _bn_torch(kind, a, I, O, env):
    torch, F, aten = env.torch, env.F, env.aten
    eps, mom = float(a["eps"]), float(a["momentum"])
    if kind == "batch_norm2d":
        x, w, b, rm, rv = I
        if a.get("training"):
            y, stats = O[0], O[1]
            if a.get("recompute"):    # re-run during backward: running stats must not move again
                rm = rv = None

            def run():     # out=: written straight into the arena slots
                aten.native_batch_norm.out(x, w, b, rm, rv, True, mom, eps, out=y, save_mean=stats[0],
                                           save_invstd=stats[1])
            return run
        y = O[0]
        return lambda: y.copy_(F.batch_norm(x, rm, rv, w, b, False, 0.0, eps))
    if kind == "batch_norm2d.grad_input_from_output":
        # in-place BN: x was overwritten by y; x-hat = (y - beta) / gamma. ins (gy, y, stats, gamma, beta)
        dy, yv, stats, g_, b_ = I
        dx = O[0]
        c = yv.shape[1]

        def run():
            gm, bt = g_.view(1, c, 1, 1), b_.view(1, c, 1, 1)
            inv = stats[1].view(1, c, 1, 1)
            xhat = (yv - bt) / gm
            mdy = dy.mean((0, 2, 3), keepdim=True)
            mdyx = (dy * xhat).mean((0, 2, 3), keepdim=True)
            dx.copy_(gm * inv * (dy - mdy - xhat * mdyx))
        return run
    if kind == "batch_norm2d.grad_weight_from_output":   # ins (gy, y, gamma, beta)
        dy, yv, g_, b_ = I
        gr = dict(zip(a["grads"], O))
        dg, dbt = gr.get("weight"), gr.get("bias")
        c = yv.shape[1]

        def run():
            if dg is not None:
                xhat = (yv - b_.view(1, c, 1, 1)) / g_.view(1, c, 1, 1)
                dg.add_((dy * xhat).sum((0, 2, 3)))
            if dbt is not None:
                dbt.add_(dy.sum((0, 2, 3)))
        return run
    if kind == "batch_norm2d.grad_input":
        dx = O[0]
        if a.get("training"):
            dy, x, stats, w = I

            def run():     # (the .out overload refuses masked-out outputs: a copy)
                r = aten.native_batch_norm_backward(dy, x, w, None, None, stats[0], stats[1], True, eps,
                                                    [True, False, False])
                dx.copy_(r[0])
            return run
        dy, w, rv = I
        return lambda: torch.mul(dy, (w * torch.rsqrt(rv + eps)).view(1, -1, 1, 1), out=dx)
    gr = dict(zip(a["grads"], O))       # batch_norm2d.grad_weight
    dg, dbt = gr.get("weight"), gr.get("bias")
    if a.get("training"):
        dy, x, stats = I
        # aten's batch-norm backward reduces sum(dy * x-hat) and sum(dy) in one pass over x and dy (no
        # x-hat temporary); neither depends on gamma, so a ones vector stands in for it
        ones = torch.ones(x.shape[1], dtype=x.dtype, device=x.device)
        mask = [False, dg is not None, dbt is not None]

        def run():
            r = aten.native_batch_norm_backward(dy, x, ones, None, None, stats[0], stats[1], True, eps, mask)
            if dg is not None:
                dg.add_(r[1])
            if dbt is not None:
                dbt.add_(r[2])
        return run
    dy, x, rm, rv = I

    def run():
        if dg is not None:
            xhat = (x - rm.view(1, -1, 1, 1)) * torch.rsqrt(rv + eps).view(1, -1, 1, 1)
            dg.add_((dy * xhat).sum((0, 2, 3)))
        if dbt is not None:
            dbt.add_(dy.sum((0, 2, 3)))
    return run


def _bn_calls(graph, op, variant):
    """Training batch norm also writes its running statistics (read-modify-write); the backward of an in-place
    forward (x overwritten by y) rebuilds x-hat from y, gamma and beta."""
    a = dict(op.attrs)
    if op.kind == "batch_norm2d" and a.get("training"):
        return [(op.kind, op.outputs + (op.inputs[3], op.inputs[4]), op.inputs, a, ())]
    if variant == "inplace" and op.kind in ("batch_norm2d.grad_input", "batch_norm2d.grad_weight"):
        bn = graph.ops[op.forward_op]
        y, gamma, beta = bn.outputs[0], bn.inputs[1], bn.inputs[2]
        if op.kind == "batch_norm2d.grad_input":
            return [("batch_norm2d.grad_input_from_output", op.outputs, (op.inputs[0], y, bn.outputs[1], gamma, beta),
                     a, ())]
        return [("batch_norm2d.grad_weight_from_output", op.outputs, (op.inputs[0], y, gamma, beta), a, ())]
    return None


def _bn_pairs(k, a):
    return ((2, 3), (3, 4)) if k == "batch_norm2d" and a.get("training") else ()


register(OpRecord(
    kind="batch_norm2d", family="norm",
    kernels={"batch_norm2d": ("port_batchnorm2d_forward_train", "port_batchnorm2d_forward_eval"),
             "batch_norm2d.grad_input": ("port_batchnorm2d_backward_input", "port_batchnorm2d_backward_input_eval"),
             "batch_norm2d.grad_weight": ("port_batchnorm2d_backward_weight",
                                          "port_batchnorm2d_backward_weight_eval"),
             "batch_norm2d.grad_input_from_output": ("port_batchnorm2d_backward_input_from_output",),
             "batch_norm2d.grad_weight_from_output": ("port_batchnorm2d_backward_weight_from_output",)},
    shapes=_bn_shapes, torch=_bn_torch, encode=_bn_encode,
    aten=("_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training"), capture=_bn_capture,
    saved=_bn_saved, grad_input_reads=_bn_gi_reads, grad_weight_reads=_bn_gw_reads,
    bwd_vector_flops=lambda f, T: 8 * numel(T[f.outputs[0]].shape), weight_vector_factor=2,
    inplace_pairs=_bn_pairs, calls=_bn_calls, tags=frozenset({"inplace"}), doc=__doc__))


# =============================================================================================
# layer_norm
# =============================================================================================
def _ln_capture(ctx):
    from port.ops.base import arg, float32, fwd
    n = ctx.node
    x = ctx.t(n.args[0])
    shape_ = list(n.args[1])
    wa, ba, eps = arg(n, 2, "weight"), arg(n, 3, "bias"), float(arg(n, 4, "eps", 1e-5))
    xs = ctx.shape(x)
    k = len(shape_)           # normalized over the last k dims (nn.LayerNorm([C, H, W])): one row of numel of them
    if (not 1 <= k <= len(xs) - 1 or tuple(shape_) != tuple(xs[-k:]) or (wa is not None and not ctx.is_param(wa))
            or (ba is not None and not ctx.is_param(ba)) or (wa is None and ba is not None) or not float32(ctx, x)):
        return False
    params = {}
    if wa is not None:
        params["weight"] = ctx.t(wa)
    if ba is not None:
        params["bias"] = ctx.t(ba)
    y = ctx.out()
    stats = ctx.b.tensor(f"{ctx.opname}:stats", (2, numel(xs[:-k])), F32, ROLE_ACTIVATION)
    return fwd(ctx, "layer_norm", dict(eps=eps, affine=tuple(params)) | ({"dims": k} if k > 1 else {}), (x,),
               (y, stats), 0, 8 * numel(xs), params=params)


def _ln_dims(attrs: dict, x) -> int:
    """How many trailing dims of ``x`` a layer norm normalizes over (attribute ``dims``, default 1)."""
    k = attrs.get("dims", 1)
    if type(k) is not int or not 1 <= k < len(x):
        raise CallShapeError(f"attribute dims={k!r}: expected 1 to {len(x) - 1} trailing dims of {list(x)}")
    return k


def _ln_reads(f):
    return (f.x[0], f.outputs[1]) + ((f.params["weight"],) if "weight" in f.params else ())


def _ln_shapes(k, attrs, I, O, at):
    x = at(I, 0, "input 0 (x)") if k == "layer_norm" else at(I, 1, "input 1 (x)")
    eps = attrs.get("eps")
    if k == "layer_norm" and (not isinstance(eps, float) or not 0.0 < eps < float("inf")):
        raise CallShapeError(f"attribute eps={eps!r}: expected a finite float > 0")
    affine = attrs.get("affine", ())
    nd = _ln_dims(attrs, x)
    X, c, st = (tuple(x), F32), (tuple(x[-nd:]), F32), ((2, numel(x[:-nd])), F32)
    if k == "layer_norm":
        return [X] + [c] * len(affine), [X, st]
    if k == "layer_norm.grad_input":
        return [X, X, st] + ([c] if "weight" in affine else []), [X]
    return [X, X, st], grads(attrs, {n: c[0] for n in affine})


def _ln_encode(kind, a, IS, OS, I, O, variant, call):
    x = IS[0] if kind == "layer_norm" else IS[1]
    d = numel(x[-a.get("dims", 1):])          # the normalized trailing dims are one contiguous row
    rows = numel(x) // d
    if kind == "layer_norm":
        aff = a["affine"]
        return Encoded("port_layernorm_forward", (O[0], O[1], I[0], I[1] if "weight" in aff else None,
                                                  I[1 + ("weight" in aff)] if "bias" in aff else None),
                       (rows, d), (float(a["eps"]),))
    if kind == "layer_norm.grad_input":
        return Encoded("port_layernorm_backward_input", (O[0], I[0], I[1], I[2], I[3] if len(I) > 3 else None),
                       (rows, d))
    g = dict(zip(a["grads"], O))
    return Encoded("port_layernorm_backward_weight", (g.get("weight"), g.get("bias"), I[0], I[1], I[2]), (rows, d))


def _native_norm_backward(grads_, a, I, O, weight: bool):
    """The torch binding of a norm's backward from aten's native_*_norm_backward (``grads_(w)`` -> (dx, dw, db)):
    grad_input writes dx (the weight read from I[3] where the op is affine); grad_weight accumulates dw, db into
    the gradients the op's ``grads`` attribute names."""
    if not weight:
        w = I[3] if len(I) > 3 else None
        dx = O[0]
        return lambda: dx.copy_(grads_(w)[0])
    g = dict(zip(a["grads"], O))

    def run():
        r = grads_()
        if "weight" in g:
            g["weight"].add_(r[1])
        if "bias" in g:
            g["bias"].add_(r[2])
    return run


def _ln_torch(kind, a, I, O, env):
    torch = env.torch
    if kind == "layer_norm":
        x = I[0]
        aff = a["affine"]
        w = I[1] if "weight" in aff else None
        b = I[1 + (w is not None)] if "bias" in aff else None
        y, st = O
        d = list(x.shape[-a.get("dims", 1):])

        def run():
            r = torch.ops.aten.native_layer_norm(x, d, w, b, float(a["eps"]))
            y.copy_(r[0])
            st[0].copy_(r[1].reshape(-1))
            st[1].copy_(r[2].reshape(-1))
        return run
    weight = kind == "layer_norm.grad_weight"
    dy, x, st = I[0], I[1], I[2]
    k = a.get("dims", 1)
    d, lead = list(x.shape[-k:]), x.shape[:-k]

    def grads_(w=None):
        mean, rstd = st[0].reshape(*lead, *[1] * k), st[1].reshape(*lead, *[1] * k)
        return torch.ops.aten.native_layer_norm_backward(
            dy, x, d, mean, rstd, w if w is not None else torch.ones(d, dtype=x.dtype, device=x.device),
            torch.zeros(d, dtype=x.dtype, device=x.device), [not weight, weight, weight])
    return _native_norm_backward(grads_, a, I, O, weight)


# what a norm that saves x and its statistics (mean, rstd) saves, reads and costs: layer norm and group norm
_STATS_NORM = dict(
    saved=lambda f, gi, gw, wanted: (f.x[0], f.outputs[1]) + (
        (f.params["weight"],) if gi and "weight" in f.params else ()),
    grad_input_reads=_ln_reads, grad_weight_reads=lambda f: (f.x[0], f.outputs[1]),
    bwd_vector_flops=lambda f, T: 8 * numel(T[f.outputs[0]].shape), weight_vector_factor=2)


register(OpRecord(
    kind="layer_norm", family="norm",
    kernels={"layer_norm": ("port_layernorm_forward",), "layer_norm.grad_input": ("port_layernorm_backward_input",),
             "layer_norm.grad_weight": ("port_layernorm_backward_weight",)},
    shapes=_ln_shapes, torch=_ln_torch, encode=_ln_encode, aten=("layer_norm",), capture=_ln_capture,
    **_STATS_NORM, doc=__doc__))


# =============================================================================================
# rms_norm (Llama's RMSNorm): F.rms_norm, or the decomposition LlamaRMSNorm is captured as
# =============================================================================================
_F32_EPS = 1.1920928955078125e-07     # torch.finfo(torch.float32).eps: F.rms_norm's eps=None


def _packet(node) -> str:
    t = getattr(node, "target", None)
    return t._overloadpacket.__name__ if hasattr(t, "_overloadpacket") else ""


def _users(node) -> list:
    """The node's users, less export's metadata asserts (they read a value but compute nothing)."""
    return [u for u in node.users if "_assert" not in str(u.target)]


def _only_user(node, packet: str):
    us = _users(node)
    return us[0] if len(us) == 1 and _packet(us[0]) == packet else None


def _rms_fwd(ctx, x: int, weight, eps: float, y: int):
    params = {"weight": ctx.t(weight)} if weight is not None else {}
    rows = numel(ctx.shape(x)[:-1])
    stats = ctx.b.tensor(f"{ctx.opname}:rstd", (rows,), F32, ROLE_ACTIVATION)
    from port.ops.base import fwd
    return fwd(ctx, "rms_norm", dict(eps=float(eps), affine=tuple(params)), (x,), (y, stats), 0,
               4 * numel(ctx.shape(x)), params=params)


def _rms_capture(ctx):
    """aten.rms_norm (F.rms_norm, nn.RMSNorm) over the last dim, and the decomposition Llama's RMSNorm is
    exported as, recognised at its pow node: pow(x, 2) -> mean(-1, keepdim) -> add(eps) -> rsqrt -> mul(x, .)
    [-> float32 casts -> mul(weight, .)], each intermediate read only by the next. Anything else declines (the
    element-wise records take the nodes one by one)."""
    from port.ir import capture as C
    from port.ops.base import arg, float32
    n = ctx.node
    if _packet(n) == "rms_norm":
        x = ctx.t(n.args[0])
        shape_, wa, eps = list(n.args[1]), arg(n, 2, "weight"), arg(n, 3, "eps")
        xs = ctx.shape(x)
        if (len(shape_) != 1 or not xs or shape_[0] != xs[-1] or (wa is not None and not ctx.is_param(wa))
                or not float32(ctx, x)):
            return False
        return _rms_fwd(ctx, x, wa, _F32_EPS if eps is None else float(eps), ctx.out())
    if str(n.target) != "aten.pow.Tensor_Scalar" or n.args[1] != 2 or not hasattr(n.args[0], "name"):
        return False
    xa = n.args[0]
    x = ctx.t(xa)
    xs = ctx.shape(x)
    if not xs or not float32(ctx, x):
        return False
    mean = _only_user(n, "mean")
    if mean is None or str(mean.target) != "aten.mean.dim" or mean.kwargs.get("dtype") is not None:
        return False
    dims = arg(mean, 1, "dim")
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    if [d % len(xs) for d in dims] != [len(xs) - 1] or not arg(mean, 2, "keepdim", False):
        return False
    add = _only_user(mean, "add")
    if add is None or add.args[0] is not mean or not isinstance(add.args[1], float) or add.kwargs.get("alpha", 1) != 1:
        return False
    eps = add.args[1]
    rs = _only_user(add, "rsqrt")
    mul = _only_user(rs, "mul") if rs is not None else None
    if mul is None or set(mul.args) != {xa, rs} or len(mul.args) != 2 or eps < 0:
        return False
    fused, end, weight = [mean, add, rs, mul], mul, None
    casts, nxt = [], mul
    while True:                    # .to(float32) casts of a float32 value (Llama's .to(input_dtype))
        us = _users(nxt)
        if len(us) == 1 and _packet(us[0]) in ("to", "_to_copy") and C.dtype_name(C.val_of(us[0]).dtype) == F32:
            casts.append(us[0])
            nxt = us[0]
            continue
        break
    us = _users(nxt)
    if len(us) == 1 and _packet(us[0]) == "mul" and len(us[0].args) == 2 and nxt in us[0].args:
        w = us[0].args[1] if us[0].args[0] is nxt else us[0].args[0]
        if ctx.is_param(w) and ctx.shape(ctx.t(w)) == (xs[-1],) and tuple(C.val_of(us[0]).shape) == xs:
            fused += casts + [us[0]]
            end, weight = us[0], w
    y = ctx.out(val=C.val_of(end))
    ctx.env[end.name] = y
    ctx.skip.update(f.name for f in fused)
    return _rms_fwd(ctx, x, weight, eps, y)


def _rms_reads(f):
    return (f.x[0], f.outputs[1]) + ((f.params["weight"],) if "weight" in f.params else ())


def _rms_shapes(k, attrs, I, O, at):
    x = at(I, 0, "input 0 (x)") if k == "rms_norm" else at(I, 1, "input 1 (x)")
    eps = attrs.get("eps")
    if k == "rms_norm" and (not isinstance(eps, float) or not 0.0 <= eps < float("inf")):
        raise CallShapeError(f"attribute eps={eps!r}: expected a finite float >= 0")
    affine = attrs.get("affine", ())
    if not x:
        raise CallShapeError("x has no dims: rms_norm normalises the last one")
    X, c, st = (tuple(x), F32), ((x[-1],), F32), ((numel(x[:-1]),), F32)
    if k == "rms_norm":
        return [X] + [c] * len(affine), [X, st]
    if k == "rms_norm.grad_input":
        return [X, X, st] + ([c] if "weight" in affine else []), [X]
    return [X, X, st], grads(attrs, {"weight": c[0]})


def _rms_encode(kind, a, IS, OS, I, O, variant, call):
    x = IS[0] if kind == "rms_norm" else IS[1]
    rows, d = numel(x) // x[-1], x[-1]
    if kind == "rms_norm":
        return Encoded("port_rmsnorm_forward", (O[0], O[1], I[0], I[1] if a["affine"] else None), (rows, d),
                       (float(a["eps"]),))
    if kind == "rms_norm.grad_input":
        return Encoded("port_rmsnorm_backward_input", (O[0], I[0], I[1], I[2], I[3] if len(I) > 3 else None),
                       (rows, d))
    return Encoded("port_rmsnorm_backward_weight", (O[0], I[0], I[1], I[2]), (rows, d))


def _rms_torch(kind, a, I, O, env):
    torch = env.torch
    if kind == "rms_norm":
        x, w = I[0], (I[1] if len(I) > 1 else None)
        y, st = O

        def run():
            r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + float(a["eps"]))
            st.copy_(r.reshape(-1))
            torch.mul(x, r, out=y)
            if w is not None:
                y.mul_(w)
        return run
    dy, x, st = I[0], I[1], I[2]
    r = st.reshape(*x.shape[:-1], 1)
    if kind == "rms_norm.grad_weight":
        dw = O[0]
        return lambda: dw.add_((dy * x * r).reshape(-1, x.shape[-1]).sum(0))
    w = I[3] if len(I) > 3 else None
    dx = O[0]

    def run_dx():
        g = dy * w if w is not None else dy
        dx.copy_(r * (g - x * (r * r) * (g * x).mean(-1, keepdim=True)))
    return run_dx


register(OpRecord(
    kind="rms_norm", family="norm",
    kernels={"rms_norm": ("port_rmsnorm_forward",), "rms_norm.grad_input": ("port_rmsnorm_backward_input",),
             "rms_norm.grad_weight": ("port_rmsnorm_backward_weight",)},
    shapes=_rms_shapes, torch=_rms_torch, encode=_rms_encode, aten=("rms_norm", "pow"), capture=_rms_capture,
    saved=lambda f, gi, gw, wanted: (f.x[0], f.outputs[1]) + (
        (f.params["weight"],) if gi and "weight" in f.params else ()),
    grad_input_reads=_rms_reads, grad_weight_reads=lambda f: (f.x[0], f.outputs[1]),
    bwd_vector_flops=lambda f, T: 6 * numel(T[f.outputs[0]].shape), weight_vector_factor=3,
    tags=frozenset({"pattern"}),
    doc="rms_norm: y = x / sqrt(mean(x^2, last dim) + eps) * weight (F.rms_norm, or Llama's RMSNorm as exported: "
        "pow -> mean -> add eps -> rsqrt -> mul [-> mul weight], fused at the pow node); saves x, rstd [rows] "
        "and the weight. C kernels port_rmsnorm_*."))


# =============================================================================================
# group_norm
# =============================================================================================
def _gn_capture(ctx):
    """aten.group_norm(x [N, C, *], groups, weight, bias, eps): any group count dividing C, affine or not."""
    from port.ops.base import arg, float32, fwd
    n = ctx.node
    x = ctx.t(n.args[0])
    xs = ctx.shape(x)
    g, wa, ba, eps = int(n.args[1]), arg(n, 2, "weight"), arg(n, 3, "bias"), float(arg(n, 4, "eps", 1e-5))
    if (len(xs) < 2 or g < 1 or xs[1] % g or (wa is not None and not ctx.is_param(wa))
            or (ba is not None and not ctx.is_param(ba)) or not float32(ctx, x) or not eps > 0):
        return False
    params = {}
    if wa is not None:
        params["weight"] = ctx.t(wa)
    if ba is not None:
        params["bias"] = ctx.t(ba)
    y = ctx.out()
    stats = ctx.b.tensor(f"{ctx.opname}:stats", (2, xs[0] * g), F32, ROLE_ACTIVATION)
    return fwd(ctx, "group_norm", dict(groups=g, eps=eps, affine=tuple(params)), (x,), (y, stats), 0,
               8 * numel(xs), params=params)


def _gn_dims(x, attrs) -> tuple[int, int, int, int]:
    g = attrs.get("groups")
    if len(x) < 2 or type(g) is not int or g < 1 or x[1] % g:
        raise CallShapeError(f"attribute groups={g!r}: expected an int >= 1 dividing the channels of {list(x)}")
    return x[0], x[1], numel(x[2:]), g


def _gn_shapes(k, attrs, I, O, at):
    x = tuple(at(I, 0, "input 0 (x)") if k == "group_norm" else at(I, 1, "input 1 (x)"))
    n, c, _, g = _gn_dims(x, attrs)
    eps = attrs.get("eps")
    if k == "group_norm" and (not isinstance(eps, float) or not 0.0 < eps < float("inf")):
        raise CallShapeError(f"attribute eps={eps!r}: expected a finite float > 0")
    affine = attrs.get("affine", ())
    X, cs, st = (x, F32), ((c,), F32), ((2, n * g), F32)
    if k == "group_norm":
        return [X] + [cs] * len(affine), [X, st]
    if k == "group_norm.grad_input":
        return [X, X, st] + ([cs] if "weight" in affine else []), [X]
    return [X, X, st], grads(attrs, {nm: cs[0] for nm in affine})


def _gn_encode(kind, a, IS, OS, I, O, variant, call):
    iv = _gn_dims(tuple(IS[0] if kind == "group_norm" else IS[1]), a)
    if kind == "group_norm":
        aff = a["affine"]
        return Encoded("port_groupnorm_forward", (O[0], O[1], I[0], I[1] if "weight" in aff else None,
                                                  I[1 + ("weight" in aff)] if "bias" in aff else None),
                       iv, (float(a["eps"]),))
    if kind == "group_norm.grad_input":
        return Encoded("port_groupnorm_backward_input", (O[0], I[0], I[1], I[2], I[3] if len(I) > 3 else None), iv)
    g = dict(zip(a["grads"], O))
    return Encoded("port_groupnorm_backward_weight", (g.get("weight"), g.get("bias"), I[0], I[1], I[2]), iv)


def _gn_torch(kind, a, I, O, env):
    aten = env.aten
    if kind == "group_norm":
        x = I[0]
        aff = a["affine"]
        w = I[1] if "weight" in aff else None
        b = I[1 + (w is not None)] if "bias" in aff else None
        y, st = O
        n, c, hw, g = _gn_dims(tuple(x.shape), a)

        def run():
            r = aten.native_group_norm(x, w, b, n, c, hw, g, float(a["eps"]))
            y.copy_(r[0])
            st[0].copy_(r[1].reshape(-1))
            st[1].copy_(r[2].reshape(-1))
        return run
    weight = kind == "group_norm.grad_weight"
    dy, x, st = I[0], I[1], I[2]
    n, c, hw, g = _gn_dims(tuple(x.shape), a)

    def grads_(w=None):
        return aten.native_group_norm_backward(dy, x, st[0].reshape(n, g), st[1].reshape(n, g),
                                               w if w is not None else env.torch.ones(c, dtype=x.dtype), n, c, hw, g,
                                               [not weight, weight, weight])
    return _native_norm_backward(grads_, a, I, O, weight)


register(OpRecord(
    kind="group_norm", family="norm",
    kernels={"group_norm": ("port_groupnorm_forward",), "group_norm.grad_input": ("port_groupnorm_backward_input",),
             "group_norm.grad_weight": ("port_groupnorm_backward_weight",)},
    shapes=_gn_shapes, torch=_gn_torch, encode=_gn_encode, aten=("group_norm",), capture=_gn_capture,
    **_STATS_NORM,
    doc="group_norm: F.group_norm / nn.GroupNorm over [N, C, *] in ``groups`` groups of consecutive channels, "
        "affine (weight, bias) or not; saves x, its statistics [2, N*groups] (mean, rstd) and the weight. C "
        "kernels port_groupnorm_*."))
