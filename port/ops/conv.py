"""conv2d: a 2-D convolution (stride, padding, groups; dilation 1) and its fused chain with a training batch
norm and a relu (``conv2d_bn_relu``, the C library's one-pass kernel, emitted for variant ``fused``).

Saved: x for the weight gradient, the weight for the input gradient (autograd's choice). Variants on the C
backend: im2col (``plain``), ``direct`` (depthwise, pointwise), ``winograd`` (3x3 stride 1), ``patch<T>`` (row
tiles), ``fused``.
"""
from __future__ import annotations

import ctypes

from port.ir.types import numel
from port.ops import register
from port.ops.base import (F32, CallShapeError, Encoded, OpRecord, arg, attr_pair, float32, fwd, grads, pair,
                           rank)

CONV_ALGO = {"plain": 1, "direct": 2, "fused": 0, "winograd": 3}   # PORT_CONV_IM2COL, _DIRECT, _AUTO, _WINOGRAD
CONV_KERNELS = ("conv2d", "conv2d.grad_input", "conv2d.grad_weight", "conv2d_bn_relu")


def _capture(ctx):
    n = ctx.node
    xa, wa, ba = n.args[0], n.args[1], arg(n, 2, "bias")
    stride, pad, dil, groups = (arg(n, 3, "stride", [1, 1]), arg(n, 4, "padding", [0, 0]),
                                arg(n, 5, "dilation", [1, 1]), arg(n, 6, "groups", 1))
    x = ctx.t(xa)
    if (len(ctx.shape(x)) != 4 or isinstance(pad, str) or pair(dil) != (1, 1) or not ctx.is_param(wa)
            or (ba is not None and not ctx.is_param(ba)) or not float32(ctx, x)):
        return False
    w = ctx.t(wa)
    kh, kw = ctx.shape(w)[2:]
    y = ctx.out()
    ys = ctx.shape(y)
    bias = ctx.t(ba) if ba is not None else None
    attrs = dict(stride=pair(stride), padding=pair(pad), groups=int(groups), kernel=(kh, kw), bias=bias is not None)
    flops = 2 * ctx.batch * ys[1] * ys[2] * ys[3] * ctx.shape(w)[1] * kh * kw
    params = {"weight": w} | ({"bias": bias} if bias is not None else {})
    return fwd(ctx, "conv2d", attrs, (x,), (y,), flops, numel(ys) if bias is not None else 0, params=params)


def _saved(f, gi, gw, wanted):
    s = []
    if gw:
        s.append(f.x[0])
    if gi:
        s.append(f.params["weight"])
    return tuple(s)


# ---------------------------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------------------------
def conv_out_hw(x_shape, attrs: dict) -> tuple[int, int]:
    kh, kw = attr_pair(attrs, "kernel", 1)
    sh, sw = attr_pair(attrs, "stride", 1)
    ph, pw = attr_pair(attrs, "padding", 0)
    h, w = x_shape[2], x_shape[3]
    if h + 2 * ph < kh or w + 2 * pw < kw:
        raise CallShapeError(f"kernel {(kh, kw)} with padding {(ph, pw)} does not fit the input {h}x{w}")
    return (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1


def geometry(k: str, I, O, at, r: int) -> tuple[tuple, int]:
    """(x shape, output channels/features) of a conv or linear call: the forward reads them from x and the
    weight, the input gradient from dx and the weight, the weight gradient from x and dy."""
    if "." not in k:
        return rank(at(I, 0, "input 0 (x)"), r, "x"), rank(at(I, 1, "input 1 (weight)"), r, "weight")[0]
    if k.endswith(".grad_input"):
        return rank(at(O, 0, "output 0 (dx)"), r, "dx"), rank(at(I, 1, "input 1 (weight)"), r, "weight")[0]
    return rank(at(I, 1, "input 1 (x)"), r, "x"), rank(at(I, 0, "input 0 (dy)"), r, "dy")[1]


def _shapes(k, attrs, I, O, at):
    from port.ops.norm import bn_scalars
    x, co = geometry(k, I, O, at, 4)
    g = attrs.get("groups")
    if type(g) is not int or g < 1 or x[1] % g or co % g:
        raise CallShapeError(f"attribute groups={g!r}: expected an int >= 1 dividing C_in={x[1]} and C_out={co}")
    kh, kw = attr_pair(attrs, "kernel", 1)
    ho, wo = conv_out_hw(x, attrs)
    w = ((co, x[1] // g, kh, kw), F32)
    y = ((x[0], co, ho, wo), F32)
    c = ((co,), F32)
    if k == "conv2d":
        return [(x, F32), w] + ([c] if attrs.get("bias") else []), [y]
    if k == "conv2d_bn_relu":
        bn_scalars(attrs)
        return [(x, F32), w, c, c, c, c], [y, y, ((2, co), F32), c, c]
    if k == "conv2d.grad_input":
        return [y, w], [(x, F32)]
    return [y, (x, F32)], grads(attrs, {"weight": w[0], "bias": (co,)})


# ---------------------------------------------------------------------------------------------
# C: workspace and call encoding
# ---------------------------------------------------------------------------------------------
def conv_geometry(kernel: str, in_shapes, out_shapes) -> tuple[tuple[int, ...], int]:
    """(x shape, C_out) of a conv call from its slot shapes."""
    if kernel in ("conv2d", "conv2d_bn_relu"):
        return tuple(in_shapes[0]), in_shapes[1][0]
    if kernel == "conv2d.grad_input":
        return tuple(out_shapes[0]), in_shapes[0][1]
    if kernel == "conv2d.grad_weight":
        return tuple(in_shapes[1]), in_shapes[0][1]
    raise KeyError(kernel)


def conv_params(capi, x_shape, c_out: int, attrs: dict):
    n, c, h, w = x_shape
    kh, kw = attrs["kernel"]
    sh, sw = attrs["stride"]
    ph, pw = attrs["padding"]
    return capi.Conv2dParams(n, c, h, w, c_out, kh, kw, sh, sw, ph, pw, attrs["groups"])


def _workspace(kernel, variant, attrs, in_shapes, out_shapes) -> int:
    from port.exec import capi
    from port.plan import variants as V
    x, co = conv_geometry(kernel, in_shapes, out_shapes)
    p = conv_params(capi, x, co, attrs)
    pr = ctypes.byref(p)
    tile = V.patch_tile_hw(variant, capi.raw.port_conv2d_out_h(pr), capi.raw.port_conv2d_out_w(pr))
    if tile is not None:
        return int(capi.raw.port_conv2d_patch_workspace_bytes(pr, *tile))
    return int(capi.raw.port_conv2d_workspace_bytes(pr, CONV_ALGO.get(variant, 0)))


def _conv_iv(kernel: str, attrs: dict, IS, OS, variant: str) -> tuple[int, ...]:
    from port.plan import variants as V
    (n, c, h, w), co = conv_geometry(kernel, IS, OS)
    kh, kw = attrs["kernel"]
    sh, sw = attrs["stride"]
    ph, pw = attrs["padding"]
    ho, wo = (OS[0] if kernel in ("conv2d", "conv2d_bn_relu") else IS[0])[2:4]
    tile = V.patch_tile_hw(variant, ho, wo)
    if tile is not None:    # patch kernels: iv[14] = tile width, iv[15] = tile height (kernels/runtime/rt_exec.c)
        return (n, c, h, w, co, kh, kw, sh, sw, ph, pw, attrs["groups"], ho, wo, tile[1], tile[0])
    algo = 0 if kernel == "conv2d_bn_relu" else CONV_ALGO.get(variant, 0)
    return (n, c, h, w, co, kh, kw, sh, sw, ph, pw, attrs["groups"], ho, wo, algo, 0)


def _encode(kind, a, IS, OS, I, O, variant, call):
    from port.errors import ProgramError
    iv = _conv_iv(kind, a, IS, OS, variant)
    patch = iv[15] > 0
    if kind == "conv2d":
        b = I[2] if a.get("bias") else None
        return Encoded("port_conv2d_patch_forward" if patch else "port_conv2d_forward", (O[0], I[0], I[1], b), iv)
    if kind == "conv2d.grad_input":
        return Encoded("port_conv2d_patch_backward_input" if patch else "port_conv2d_backward_input",
                       (O[0], I[0], I[1]), iv)
    if kind == "conv2d.grad_weight":
        g = dict(zip(a["grads"], O))
        dw, db = g.get("weight"), g.get("bias")
        if dw is None:                          # only the bias trains
            n, co = IS[0][0], IS[0][1]
            return Encoded("port_bias_backward", (db, I[0]), (n, co, numel(IS[0]) // (n * co)))
        if a.get("overwrite"):
            if patch:
                raise ProgramError(f"call {call.index} ({call.name}, {kind}): 'overwrite' applies to the "
                                   f"whole-tensor weight gradient only")
            return Encoded("port_conv2d_backward_weight_overwrite", (dw, db, I[0], I[1]), iv)
        return Encoded("port_conv2d_patch_backward_weight" if patch else "port_conv2d_backward_weight",
                       (dw, db, I[0], I[1]), iv)
    C = OS[2][1]   # fused: outs (y, z, stats, rm, rv), ins (x, w, gamma, beta, rm, rv)
    return Encoded("port_conv2d_bn_relu_forward_train",
                   (O[0], O[1], O[2], (call.outputs[2], 4 * C), O[3], O[4], I[0], I[1], I[2], I[3]), iv,
                   (float(a["eps"]), float(a["momentum"])))


# ---------------------------------------------------------------------------------------------
# torch
# ---------------------------------------------------------------------------------------------
def _torch(kind, a, I, O, env):
    torch, aten = env.torch, env.aten
    s, p, g = list(a["stride"]), list(a["padding"]), a["groups"]
    if kind == "conv2d":
        x, w = I[0], I[1]
        b = I[2] if a.get("bias") else None
        y = O[0]
        # out=: aten's convolution.out (no Python-side temporary; aten may still use an internal one)
        return lambda: aten.convolution.out(x, w, b, s, p, [1, 1], False, [0, 0], g, out=y)
    if kind == "conv2d.grad_input":
        dy, w = I
        dx = O[0]

        def run():     # aten's convolution_backward.out refuses masked-out outputs: a copy
            r = aten.convolution_backward(dy, dx, w, None, s, p, [1, 1], False, [0, 0], g, [True, False, False])
            dx.copy_(r[0])
        return run
    if kind != "conv2d.grad_weight":
        return None
    dy, x = I
    gr = dict(zip(a["grads"], O))
    dw, db = gr.get("weight"), gr.get("bias")
    wshape = [dy.shape[1], x.shape[1] // g, *a["kernel"]]
    wdummy = torch.empty(wshape, dtype=x.dtype, device=x.device)

    def run():
        r = aten.convolution_backward(dy, x, wdummy, [dy.shape[1]] if db is not None else None, s, p,
                                      [1, 1], False, [0, 0], g, [False, dw is not None, db is not None])
        if dw is not None:
            dw.add_(r[1])
        if db is not None:
            db.add_(r[2])
    return run


def _calls(graph, op, variant):
    """A ``fused`` conv2d runs its chain's one call (conv2d_bn_relu: outputs y, z, stats and the running
    statistics, read-modify-write)."""
    if op.kind != "conv2d" or variant != "fused":
        return None
    from port.errors import PlanError
    from port.plan import variants as V
    chain = V.fusion_chain(graph, op)
    if chain is None:
        raise PlanError(f"op {op.name!r}: variant 'fused' is not legal here")
    bn, act = graph.ops[chain[1]], graph.ops[chain[2]]
    outs = (act.outputs[0], op.outputs[0], bn.outputs[1], bn.inputs[3], bn.inputs[4])
    ins = (op.inputs[0], op.inputs[1], bn.inputs[1], bn.inputs[2], bn.inputs[3], bn.inputs[4])
    attrs = dict(op.attrs) | dict(eps=bn.attr("eps"), momentum=bn.attr("momentum"))
    return [("conv2d_bn_relu", outs, ins, attrs, chain[1:])]


register(OpRecord(
    kind="conv2d", family="conv", calls=_calls,
    kernels={"conv2d": ("port_conv2d_forward", "port_conv2d_patch_forward"),
             "conv2d.grad_input": ("port_conv2d_backward_input", "port_conv2d_patch_backward_input"),
             "conv2d.grad_weight": ("port_conv2d_backward_weight", "port_conv2d_patch_backward_weight",
                                    "port_conv2d_backward_weight_overwrite", "port_bias_backward"),
             "conv2d_bn_relu": ("port_conv2d_bn_relu_forward_train",)},
    shapes=_shapes, torch=_torch, encode=_encode, aten=("conv2d",), capture=_capture, saved=_saved,
    grad_input_reads=lambda f: (f.params["weight"],), grad_weight_reads=lambda f: (f.x[0],),
    weight_flops=True, workspace=_workspace,
    inplace_pairs=lambda k, a: ((3, 4), (4, 5)) if k == "conv2d_bn_relu" else (),
    tags=frozenset({"conv_variants"}), doc=__doc__))
