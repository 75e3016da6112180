"""How a C-backend call runs: its port-rt kernel id, pointer arguments, integer and float parameters.

``encode(call, shape)`` is pure (slot shapes in, flat arguments out) and is the one description of a C call:

* the Python executor and the profiler bind it (``bind``) and run it through the C library's
  ``port_rt_exec`` (kernels/runtime/rt_exec.c), one ctypes call per kernel call;
* ``port compile`` writes it into a bundle (port.exec.bundle) that port-rt runs without Python.

Pointer arguments are ``(tensor id, byte offset inside its slot)`` pairs (``None``: NULL, ``WS``: the
call's workspace), in the kernel's argument order. Layouts: kernels/include/port_rt.h.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from port.errors import ProgramError
from port.ir.types import numel
from port.exec.capi import RT_MAX_FLOATS as MAX_FLOATS, RT_MAX_INTS as MAX_INTS, RT_MAX_PTRS as MAX_PTRS

LATE_UPDATE = 1


from port.exec.capi import RtCall, RtState  # noqa: E402  (layouts: kernels/include/port_rt.h)

WS = "ws"
_IDS: dict[str, int] = {}


def kernel_ids() -> dict[str, int]:
    """{entry point name: port-rt kernel id}, read from the C library (PORT_RT_KERNELS in port_rt.h)."""
    if not _IDS:
        from port.exec.kernels import raw
        for i in range(1, 256):
            name = raw.port_rt_kernel_name(i)
            if name:
                _IDS[name.decode()] = i
    return _IDS


@dataclass(frozen=True)
class Encoded:
    entry: str                                   # the C entry point ("port_conv2d_forward")
    ptrs: tuple                                  # ((tid, byte offset) | WS | None, ...) in argument order
    iv: tuple[int, ...] = ()
    fv: tuple[float, ...] = ()
    state: bool = False                          # reads the run state (optimizer settings, dropout counter)


def _conv_iv(kernel: str, attrs: dict, IS, OS, variant: str) -> tuple[int, ...]:
    from port.exec.registry import CONV_ALGO, conv_geometry
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


def encode(call: Any, shape: Callable[[int], tuple[int, ...]]) -> Encoded:
    """The flat C call of ``call`` (a port.lower.program.Call, backend ``c``); ``shape(tid)`` gives slot shapes."""
    kind, a, variant = call.kernel, dict(call.attrs), call.variant
    ins, outs = list(call.inputs), list(call.outputs)
    IS, OS = [shape(t) for t in ins], [shape(t) for t in outs]
    I = [(t, 0) for t in ins]
    O = [(t, 0) for t in outs]
    where = f"call {call.index} ({call.name}, {kind})"

    if kind in ("conv2d", "conv2d.grad_input", "conv2d.grad_weight", "conv2d_bn_relu"):
        iv = _conv_iv(kind, a, IS, OS, variant)
        patch = iv[15] > 0
        if kind == "conv2d":
            b = I[2] if a.get("bias") else None
            return Encoded("port_conv2d_patch_forward" if patch else "port_conv2d_forward",
                           (O[0], I[0], I[1], b), iv)
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
                    raise ProgramError(f"{where}: 'overwrite' applies to the whole-tensor weight gradient only")
                return Encoded("port_conv2d_backward_weight_overwrite", (dw, db, I[0], I[1]), iv)
            return Encoded("port_conv2d_patch_backward_weight" if patch else "port_conv2d_backward_weight",
                           (dw, db, I[0], I[1]), iv)
        C = OS[2][1]   # fused: outs (y, z, stats, rm, rv), ins (x, w, gamma, beta, rm, rv)
        return Encoded("port_conv2d_bn_relu_forward_train",
                       (O[0], O[1], O[2], (outs[2], 4 * C), O[3], O[4], I[0], I[1], I[2], I[3]), iv,
                       (float(a["eps"]), float(a["momentum"])))

    if kind.startswith("batch_norm2d"):
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
                return Encoded("port_batchnorm2d_forward_train", (O[0], O[1], inv, rm, rv, I[0], I[1], I[2]),
                               iv, fv)
            return Encoded("port_batchnorm2d_forward_eval", (O[0], I[0], I[1], I[2], I[3], I[4]), iv, fv)
        if kind == "batch_norm2d.grad_input_from_output":   # ins (gy, y, stats, gamma, beta)
            return Encoded("port_batchnorm2d_backward_input_from_output",
                           (O[0], I[0], I[1], I[3], I[4], (ins[2], 4 * c)), iv, fv)
        if kind == "batch_norm2d.grad_weight_from_output":  # ins (gy, y, gamma, beta)
            return Encoded("port_batchnorm2d_backward_weight_from_output",
                           (g.get("weight"), g.get("bias"), I[0], I[1], I[2], I[3]), iv, fv)
        if kind == "batch_norm2d.grad_input":
            if tr:   # ins (gy, x, stats, weight)
                return Encoded("port_batchnorm2d_backward_input", (O[0], I[0], I[1], I[3], I[2], (ins[2], 4 * c)),
                               iv, fv)
            return Encoded("port_batchnorm2d_backward_input_eval", (O[0], I[0], I[1], I[2]), iv, fv)
        if kind == "batch_norm2d.grad_weight":
            if tr:   # ins (gy, x, stats)
                return Encoded("port_batchnorm2d_backward_weight",
                               (g.get("weight"), g.get("bias"), I[0], I[1], I[2], (ins[2], 4 * c)), iv, fv)
            return Encoded("port_batchnorm2d_backward_weight_eval",   # ins (gy, x, rm, rv)
                           (g.get("weight"), g.get("bias"), I[0], I[1], I[2], I[3]), iv, fv)

    if kind in ("relu", "relu6", "hardswish"):
        return Encoded(f"port_{kind}_forward", (O[0], I[0]), (numel(OS[0]),))
    if kind in ("relu.grad_input", "relu6.grad_input", "hardswish.grad_input"):
        return Encoded(f"port_{kind.split('.')[0]}_backward", (O[0], I[0], I[1]), (numel(OS[0]),))
    if kind in ("add", "grad_accumulate"):
        return Encoded("port_add", (O[0], I[0], I[1]), (numel(OS[0]),))
    if kind == "dropout":
        return Encoded("port_dropout_forward", (O[0], O[1], I[0]), (numel(OS[0]),), (float(a["p"]),), True)
    if kind == "dropout.grad_input":
        return Encoded("port_dropout_backward", (O[0], I[0], I[1]), (numel(OS[0]),), (float(a["p"]),))
    if kind in ("max_pool2d", "avg_pool2d", "max_pool2d.grad_input", "avg_pool2d.grad_input"):
        n, c, h, w = IS[0] if "." not in kind else OS[0]
        y_shape = OS[0] if "." not in kind else IS[0]
        iv = (n, c, h, w, *a["kernel"], *a["stride"], *a["padding"], y_shape[2], y_shape[3])
        if kind == "max_pool2d":
            return Encoded("port_maxpool2d_forward", (O[0], O[1], I[0]), iv)
        if kind == "max_pool2d.grad_input":
            return Encoded("port_maxpool2d_backward_input", (O[0], I[0], I[1]), iv)
        if kind == "avg_pool2d":
            return Encoded("port_avgpool2d_forward", (O[0], I[0]), iv)
        return Encoded("port_avgpool2d_backward_input", (O[0], I[0]), iv)
    if kind == "global_avg_pool2d":
        n, c, h, w = IS[0]
        return Encoded("port_global_avgpool_forward", (O[0], I[0]), (n, c, h * w))
    if kind == "global_avg_pool2d.grad_input":
        n, c, h, w = OS[0]
        return Encoded("port_global_avgpool_backward_input", (O[0], I[0]), (n, c, h * w))
    if kind == "linear":
        fin = IS[0][-1]
        n = numel(IS[0]) // fin
        return Encoded("port_linear_forward", (O[0], I[0], I[1], I[2] if a.get("bias") else None),
                       (n, fin, IS[1][0]))
    if kind == "linear.grad_input":
        fin = OS[0][-1]
        n = numel(OS[0]) // fin
        return Encoded("port_linear_backward_input", (O[0], I[0], I[1]), (n, fin, IS[1][0]))
    if kind == "linear.grad_weight":
        fin = IS[1][-1]
        n = numel(IS[1]) // fin
        fout = IS[0][-1]
        g = dict(zip(a["grads"], O))
        if g.get("weight") is None:
            return Encoded("port_bias_backward", (g.get("bias"), I[0]), (n, fout, 1))
        return Encoded("port_linear_backward_weight", (g.get("weight"), g.get("bias"), I[0], I[1]), (n, fin, fout))
    if kind in SEQ_ENCODERS:
        return SEQ_ENCODERS[kind](a, IS, OS, I, O, variant)
    if kind in ("cross_entropy", "cross_entropy.grad_input") and "ignore_index" in a:
        k = IS[0][-1]
        n = numel(IS[0]) // k
        iv, fv = (n, k, int(a["ignore_index"])), (float(a.get("label_smoothing", 0.0)),)
        if kind == "cross_entropy":
            return Encoded("port_softmax_xent_ignore_forward", (O[0], O[1], I[0], I[1]), iv, fv)
        return Encoded("port_softmax_xent_ignore_backward", (O[0], I[0], I[1], I[2]), iv, fv)
    if kind in ("cross_entropy", "cross_entropy.grad_input"):
        n, k = IS[0]   # ins (logits, labels) / (probs, labels, grad_scale)
        fv = (float(a.get("label_smoothing", 0.0)),)
        if kind == "cross_entropy":
            return Encoded("port_softmax_xent_forward", (O[0], O[1], I[0], I[1]), (n, k), fv)
        return Encoded("port_softmax_xent_backward", (O[0], I[0], I[1], I[2]), (n, k), fv)
    if kind == "update":
        opt = call.attr("optimizer")
        cnt = numel(IS[0])
        if opt in ("sgd", "sgd_momentum"):
            return Encoded("port_sgd_step", (I[0], I[2] if opt == "sgd_momentum" else None, I[1]), (cnt,), (), True)
        if opt == "adamw":
            p, g, m1, m2 = I
            return Encoded("port_adamw_step", (p, m1, m2, g), (cnt,), (), True)
        raise ProgramError(f"{where}: unknown optimizer {opt!r}")
    raise ProgramError(f"{where}: the c backend has no kernel for {kind!r} (variant {variant})")


def state_from(st: Any, out: Optional[RtState] = None) -> RtState:
    """The C run state of a port.exec.executor.RunState (its optimizer's settings and counters)."""
    s = out if out is not None else RtState()
    o = st.opt
    if o is not None:
        name = type(o).__name__
        s.optimizer = 3 if name == "AdamW" else (2 if getattr(o, "momentum", 0.0) else 1)
        s.nesterov = 1 if getattr(o, "nesterov", False) else 0
        s.lr = float(o.lr)
        s.momentum = float(getattr(o, "momentum", 0.0) or 0.0)
        s.dampening = float(getattr(o, "dampening", 0.0) or 0.0)
        s.weight_decay = float(getattr(o, "weight_decay", 0.0) or 0.0)
        b = getattr(o, "betas", (0.0, 0.0))
        s.beta1, s.beta2 = float(b[0]), float(b[1])
        s.eps = float(getattr(o, "eps", 0.0) or 0.0)
    s.step = int(st.step)
    s.seed = int(st.seed) & 0xFFFFFFFFFFFFFFFF
    s.dropout_counter = int(st.dropout_counter)
    return s


def to_struct(enc: Encoded, call: Any, offset: Callable[[int], int], flags: int = 0) -> RtCall:
    """The bundle record of an encoded call: pointer pairs become arena byte offsets (``offset(tid)``)."""
    ids = kernel_ids()
    if enc.entry not in ids:
        raise ProgramError(f"call {call.index} ({call.name}): {enc.entry} is not a port-rt kernel")
    if len(enc.ptrs) > MAX_PTRS or len(enc.iv) > MAX_INTS or len(enc.fv) > MAX_FLOATS:
        raise ProgramError(f"call {call.index} ({call.name}): too many arguments for a port-rt call")
    r = RtCall()
    r.kernel, r.op, r.flags = ids[enc.entry], int(call.op), flags
    for i in range(MAX_PTRS):
        p = enc.ptrs[i] if i < len(enc.ptrs) else None
        r.ptr[i] = -1 if p is None else (int(call.workspace_offset) if p == WS else offset(p[0]) + p[1])
    for i, v in enumerate(enc.iv):
        r.iv[i] = int(v)
    for i, v in enumerate(enc.fv):
        r.fv[i] = float(v)
    r.ws_offset, r.ws_bytes = int(call.workspace_offset), int(call.workspace_bytes)
    return r


# ---------------------------------------------------------------------------------------------
# sequence-model kernels (port.ir.seqops): (attrs, input shapes, output shapes, input ptrs, output ptrs, variant)
# ---------------------------------------------------------------------------------------------
def _enc_attention(a, IS, OS, I, O, variant, backward: bool) -> Encoded:
    from port.exec.registry import ATTN_ALGO
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


def _enc_matmul(a, IS, OS, I, O, variant) -> Encoded:
    A, B = IS
    m, k = A[-2], A[-1]
    nn = B[-1]
    return Encoded("port_bmm", (O[0], I[0], I[1]), (numel(A[:-2]), m, nn, k, 0, 0), (1.0, 0.0))


def _enc_matmul_grad(a, IS, OS, I, O, variant) -> Encoded:
    gy, other = IS
    bt = numel(gy[:-2])
    if a["operand"] == 0:      # da [M, K] = dy [M, N] b^T (b is [K, N])
        m, nn, k = gy[-2], other[-2], gy[-1]
        return Encoded("port_bmm", (O[0], I[0], I[1]), (bt, m, nn, k, 0, 1), (1.0, 0.0))
    # db [K, N] = a^T [K, M] dy [M, N] (a is [M, K])
    m, nn, k = other[-1], gy[-1], gy[-2]
    return Encoded("port_bmm", (O[0], I[1], I[0]), (bt, m, nn, k, 1, 0), (1.0, 0.0))


def _enc_permute(a, IS, OS, I, O, variant, inverse: bool) -> Encoded:
    x = IS[0]
    from port.ir.seqops import inverse_perm
    p = list(inverse_perm(a["perm"]) if inverse else a["perm"])
    r = len(x)
    shape = list(x) + [1] * (6 - r)
    perm = p + list(range(r, 6))
    return Encoded("port_permute", (O[0], I[0]), (r, *shape, *perm))


def _mid(x, d):
    return numel(x[:d]), x[d], numel(x[d + 1:])


SEQ_ENCODERS = {
    "embedding": lambda a, IS, OS, I, O, v: Encoded("port_embedding_forward", (O[0], I[0], I[1]),
                                                    (numel(IS[0]), IS[1][0], IS[1][1])),
    "embedding.grad_weight": lambda a, IS, OS, I, O, v: Encoded(
        "port_embedding_backward_weight", (O[0], I[0], I[1]), (numel(IS[1]), OS[0][0], OS[0][1])),
    "layer_norm": lambda a, IS, OS, I, O, v: Encoded(
        "port_layernorm_forward", (O[0], O[1], I[0], I[1] if "weight" in a["affine"] else None,
                                   I[1 + ("weight" in a["affine"])] if "bias" in a["affine"] else None),
        (numel(IS[0]) // IS[0][-1], IS[0][-1]), (float(a["eps"]),)),
    "layer_norm.grad_input": lambda a, IS, OS, I, O, v: Encoded(
        "port_layernorm_backward_input", (O[0], I[0], I[1], I[2], I[3] if len(I) > 3 else None),
        (numel(IS[1]) // IS[1][-1], IS[1][-1])),
    "layer_norm.grad_weight": lambda a, IS, OS, I, O, v: Encoded(
        "port_layernorm_backward_weight", (dict(zip(a["grads"], O)).get("weight"), dict(zip(a["grads"], O)).get("bias"),
                                           I[0], I[1], I[2]), (numel(IS[1]) // IS[1][-1], IS[1][-1])),
    "gelu": lambda a, IS, OS, I, O, v: Encoded("port_gelu_forward", (O[0], I[0]),
                                               (numel(IS[0]), int(a["approximate"] == "tanh"))),
    "gelu.grad_input": lambda a, IS, OS, I, O, v: Encoded("port_gelu_backward", (O[0], I[0], I[1]),
                                                          (numel(IS[0]), int(a["approximate"] == "tanh"))),
    "tanh": lambda a, IS, OS, I, O, v: Encoded("port_tanh_forward", (O[0], I[0]), (numel(IS[0]),)),
    "tanh.grad_input": lambda a, IS, OS, I, O, v: Encoded("port_tanh_backward", (O[0], I[0], I[1]), (numel(IS[0]),)),
    "softmax": lambda a, IS, OS, I, O, v: Encoded("port_softmax_forward", (O[0], I[0]),
                                                  (numel(IS[0]) // IS[0][-1], IS[0][-1])),
    "softmax.grad_input": lambda a, IS, OS, I, O, v: Encoded("port_softmax_backward", (O[0], I[0], I[1]),
                                                             (numel(IS[0]) // IS[0][-1], IS[0][-1])),
    "scale": lambda a, IS, OS, I, O, v: Encoded("port_scale", (O[0], I[0]), (numel(IS[0]),), (float(a["alpha"]),)),
    "scale.grad_input": lambda a, IS, OS, I, O, v: Encoded("port_scale", (O[0], I[0]), (numel(IS[0]),),
                                                           (float(a["alpha"]),)),
    "permute": lambda a, IS, OS, I, O, v: _enc_permute(a, IS, OS, I, O, v, False),
    "permute.grad_input": lambda a, IS, OS, I, O, v: _enc_permute(a, IS, OS, I, O, v, True),
    "matmul": _enc_matmul,
    "matmul.grad_input": _enc_matmul_grad,
    "attention": lambda a, IS, OS, I, O, v: _enc_attention(a, IS, OS, I, O, v, False),
    "attention.grad_input": lambda a, IS, OS, I, O, v: _enc_attention(a, IS, OS, I, O, v, True),
    "add_bcast": lambda a, IS, OS, I, O, v: Encoded("port_add_broadcast", (O[0], I[0], I[1]),
                                                    (numel(IS[0]) // numel(IS[1]), numel(IS[1]))),
    "add_bcast.grad_input": lambda a, IS, OS, I, O, v: Encoded("port_sum_rows", (O[0], I[0]),
                                                               (numel(IS[0]) // numel(OS[0]), numel(OS[0]))),
    "mean_mid": lambda a, IS, OS, I, O, v: Encoded("port_mean_mid_forward", (O[0], I[0]), _mid(IS[0], a["dim"])),
    "mean_mid.grad_input": lambda a, IS, OS, I, O, v: Encoded("port_mean_mid_backward", (O[0], I[0]),
                                                              _mid(OS[0], a["dim"])),
    "arange": lambda a, IS, OS, I, O, v: Encoded("port_arange_i64", (O[0],), (numel(OS[0]), int(a.get("start", 0)))),
    "ne_scalar": lambda a, IS, OS, I, O, v: Encoded("port_ne_scalar_i64", (O[0], I[0]), (numel(IS[0]), int(a["value"]))),
}
