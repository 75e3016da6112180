"""Checked torch-tensor wrappers of PORT's C kernels: test support (the kernel tests and bench/ use them; port
itself runs the kernels through port.exec.capi's raw functions only).

Each function takes torch tensors, validates shape, dtype (float32 activations, int64 labels/indices, uint8
masks), device, contiguity and aliasing, allocates outputs/workspace when not given, raises ValueError naming the
offending argument, and calls the raw C function (``port.exec.capi.raw``), raising on a non-OK status.

Gradient semantics follow the header: weight gradients ACCUMULATE (+=) into the given buffers (zero-initialised
when not given), input gradients OVERWRITE.

Import it as ``checked`` with tests/kernels on sys.path (tests/conftest.py puts it there; bench/_results.py's
``checked_kernels()`` for the benchmarks).
"""
from __future__ import annotations

import ctypes
import math
from typing import Sequence

# port first: importing it applies PORT's OpenMP wait policy before torch loads the runtime
from port.exec import capi  # noqa: E402
from port.exec.capi import (ATTN_PLAIN, ATTN_TILED, PORT_OK, _ALGOS, AttentionParams, BatchNormParams,
                            Conv2dParams, LinearParams, Pool2dParams, check, raw, status_string)

import torch  # noqa: E402


# --------------------------------------------------------------------------- validation helpers
def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _tensor(t, name: str, shape: Sequence[int] | None = None, dtype=torch.float32,
            ndim: int | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: must be on the CPU, got device {t.device}")
    if t.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(int(s) for s in shape):
        raise ValueError(f"{name}: expected shape {tuple(int(s) for s in shape)}, "
                         f"got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (call .contiguous())")
    return t


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def _no_alias(outs: dict, ins: dict, allow_equal: Sequence[tuple[str, str]] = ()) -> None:
    """Outputs must not overlap inputs (or each other); pairs in allow_equal may be identical."""
    items_out = [(k, v) for k, v in outs.items() if v is not None and v.numel() > 0]
    items_in = [(k, v) for k, v in ins.items() if v is not None and v.numel() > 0]
    pairs = [(a, b) for a in items_out for b in items_in]
    pairs += [(items_out[i], items_out[j]) for i in range(len(items_out))
              for j in range(i + 1, len(items_out))]
    for (na, a), (nb, b) in pairs:
        sa, sb = _span(a), _span(b)
        if sa[0] < sb[1] and sb[0] < sa[1]:
            if ((na, nb) in allow_equal or (nb, na) in allow_equal) and sa == sb \
                    and a.shape == b.shape:
                continue
            raise ValueError(f"{na}: output aliases {nb}; pass a separate buffer "
                             f"(or use the explicit in-place variant)")


def _out(out, name, shape, dtype=torch.float32):
    if out is None:
        return torch.empty(tuple(shape), dtype=dtype)
    return _tensor(out, name, shape, dtype)


def _acc(buf, name, shape):
    if buf is None:
        return torch.zeros(tuple(shape), dtype=torch.float32)
    return _tensor(buf, name, shape)


def _pair(v, name) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    try:
        a, b = v
        return int(a), int(b)
    except Exception:
        raise ValueError(f"{name}: expected an int or a pair of ints, got {v!r}") from None


def _algo(algo) -> int:
    if isinstance(algo, int) and algo in _ALGOS.values():
        return algo
    if algo not in _ALGOS:
        raise ValueError(f"algo: expected one of {sorted(_ALGOS)}, got {algo!r}")
    return _ALGOS[algo]


def _workspace(nbytes: int) -> torch.Tensor:
    return torch.empty(max(int(nbytes), 1), dtype=torch.uint8)


# --------------------------------------------------------------------------- GEMM
def sgemm(a: torch.Tensor, b: torch.Tensor, trans_a: bool = False, trans_b: bool = False,
          alpha: float = 1.0, beta: float = 0.0, c: torch.Tensor | None = None) -> torch.Tensor:
    """C = alpha * op(A) op(B) + beta * C (row-major, 2-D tensors)."""
    _tensor(a, "a", ndim=2)
    _tensor(b, "b", ndim=2)
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    kb, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != kb:
        raise ValueError(f"b: inner dimensions differ ({k} vs {kb})")
    if c is None:
        c = torch.zeros((m, n), dtype=torch.float32)
    _tensor(c, "c", (m, n))
    _no_alias({"c": c}, {"a": a, "b": b})
    check(raw.port_sgemm(c.data_ptr(), a.data_ptr(), b.data_ptr(), int(trans_a), int(trans_b), m,
                         n, k, alpha, beta, a.shape[1], b.shape[1], n), "sgemm")
    return c


# --------------------------------------------------------------------------- conv2d
def conv2d_params(x_shape, w_shape, stride=1, padding=0, groups=1) -> Conv2dParams:
    n, c_in, h, w = (int(s) for s in x_shape)
    c_out, cig, kh, kw = (int(s) for s in w_shape)
    sh, sw = _pair(stride, "stride")
    ph, pw = _pair(padding, "padding")
    if groups < 1 or c_in % groups or c_out % groups:
        raise ValueError(f"groups: {groups} must divide c_in={c_in} and c_out={c_out}")
    if cig != c_in // groups:
        raise ValueError(f"w: expected shape[1] == c_in/groups = {c_in // groups}, got {cig}")
    p = Conv2dParams(n, c_in, h, w, c_out, kh, kw, sh, sw, ph, pw, groups)
    st = raw.port_conv2d_check(p)
    if st != PORT_OK:
        raise ValueError(f"conv2d params {conv_params_dict(p)}: {status_string(st)}")
    return p


def conv_params_dict(p: Conv2dParams) -> dict:
    return {f: getattr(p, f) for f, _ in Conv2dParams._fields_}


def conv2d_out_shape(p: Conv2dParams) -> tuple[int, int, int, int]:
    return p.n, p.c_out, raw.port_conv2d_out_h(p), raw.port_conv2d_out_w(p)


def conv2d_workspace_bytes(p: Conv2dParams, algo="auto") -> int:
    return raw.port_conv2d_workspace_bytes(p, _algo(algo))


def _conv_setup(x_shape, w, stride, padding, groups):
    _tensor(w, "w", ndim=4)
    return conv2d_params(x_shape, w.shape, stride, padding, groups)


def conv2d_forward(x, w, b=None, stride=1, padding=0, groups=1, algo="auto", out=None,
                   workspace=None):
    _tensor(x, "x", ndim=4)
    p = _conv_setup(x.shape, w, stride, padding, groups)
    if b is not None:
        _tensor(b, "b", (p.c_out,))
    y = _out(out, "out", conv2d_out_shape(p))
    _no_alias({"out": y}, {"x": x, "w": w, "b": b})
    a = _algo(algo)
    ws = workspace if workspace is not None else _workspace(conv2d_workspace_bytes(p, a))
    check(raw.port_conv2d_forward(y.data_ptr(), x.data_ptr(), w.data_ptr(), _ptr(b), p, a,
                                  ws.data_ptr(), ws.numel() * ws.element_size()), "conv2d_forward")
    return y


def conv2d_backward_input(dy, w, x_shape, stride=1, padding=0, groups=1, algo="auto", out=None,
                          workspace=None):
    p = _conv_setup(x_shape, w, stride, padding, groups)
    _tensor(dy, "dy", conv2d_out_shape(p))
    dx = _out(out, "out", x_shape)
    _no_alias({"out": dx}, {"dy": dy, "w": w})
    a = _algo(algo)
    ws = workspace if workspace is not None else _workspace(conv2d_workspace_bytes(p, a))
    check(raw.port_conv2d_backward_input(dx.data_ptr(), dy.data_ptr(), w.data_ptr(), p, a,
                                         ws.data_ptr(), ws.numel() * ws.element_size()),
          "conv2d_backward_input")
    return dx


def conv2d_backward_weight(dy, x, w_shape, stride=1, padding=0, groups=1, bias=True,
                           algo="auto", dw=None, db=None, workspace=None, overwrite=False):
    """Returns (dw, db) -- accumulated into dw/db when given (db None if bias=False); overwrite=True: written
    over them (port_conv2d_backward_weight_overwrite: their old contents are never read)."""
    _tensor(x, "x", ndim=4)
    p = conv2d_params(x.shape, w_shape, stride, padding, groups)
    _tensor(dy, "dy", conv2d_out_shape(p))
    dw = _acc(dw, "dw", w_shape)
    db = _acc(db, "db", (p.c_out,)) if bias else None
    _no_alias({"dw": dw, "db": db}, {"dy": dy, "x": x})
    a = _algo(algo)
    ws = workspace if workspace is not None else _workspace(conv2d_workspace_bytes(p, a))
    fn = raw.port_conv2d_backward_weight_overwrite if overwrite else raw.port_conv2d_backward_weight
    check(fn(dw.data_ptr(), _ptr(db), dy.data_ptr(), x.data_ptr(), p, a, ws.data_ptr(),
             ws.numel() * ws.element_size()), "conv2d_backward_weight")
    return dw, db


def conv2d_patch_workspace_bytes(p: Conv2dParams, tile) -> int:
    th, tw = _pair(tile, "tile")
    return raw.port_conv2d_patch_workspace_bytes(p, th, tw)


def conv2d_patch_forward(x, w, b=None, stride=1, padding=0, groups=1, tile=(4, 4), out=None):
    _tensor(x, "x", ndim=4)
    p = _conv_setup(x.shape, w, stride, padding, groups)
    if b is not None:
        _tensor(b, "b", (p.c_out,))
    th, tw = _pair(tile, "tile")
    y = _out(out, "out", conv2d_out_shape(p))
    _no_alias({"out": y}, {"x": x, "w": w, "b": b})
    ws = _workspace(raw.port_conv2d_patch_workspace_bytes(p, th, tw))
    check(raw.port_conv2d_patch_forward(y.data_ptr(), x.data_ptr(), w.data_ptr(), _ptr(b), p, th,
                                        tw, ws.data_ptr(), ws.numel()), "conv2d_patch_forward")
    return y


def conv2d_patch_backward_input(dy, w, x_shape, stride=1, padding=0, groups=1, tile=(4, 4),
                                out=None):
    p = _conv_setup(x_shape, w, stride, padding, groups)
    _tensor(dy, "dy", conv2d_out_shape(p))
    th, tw = _pair(tile, "tile")
    dx = _out(out, "out", x_shape)
    _no_alias({"out": dx}, {"dy": dy, "w": w})
    ws = _workspace(raw.port_conv2d_patch_workspace_bytes(p, th, tw))
    check(raw.port_conv2d_patch_backward_input(dx.data_ptr(), dy.data_ptr(), w.data_ptr(), p, th,
                                               tw, ws.data_ptr(), ws.numel()),
          "conv2d_patch_backward_input")
    return dx


def conv2d_patch_backward_weight(dy, x, w_shape, stride=1, padding=0, groups=1, bias=True,
                                 tile=(4, 4), dw=None, db=None):
    _tensor(x, "x", ndim=4)
    p = conv2d_params(x.shape, w_shape, stride, padding, groups)
    _tensor(dy, "dy", conv2d_out_shape(p))
    th, tw = _pair(tile, "tile")
    dw = _acc(dw, "dw", w_shape)
    db = _acc(db, "db", (p.c_out,)) if bias else None
    _no_alias({"dw": dw, "db": db}, {"dy": dy, "x": x})
    ws = _workspace(raw.port_conv2d_patch_workspace_bytes(p, th, tw))
    check(raw.port_conv2d_patch_backward_weight(dw.data_ptr(), _ptr(db), dy.data_ptr(),
                                                x.data_ptr(), p, th, tw, ws.data_ptr(),
                                                ws.numel()), "conv2d_patch_backward_weight")
    return dw, db


# --------------------------------------------------------------------------- batch norm
def _bn_params(x_shape, eps, momentum) -> BatchNormParams:
    n, c, h, w = (int(s) for s in x_shape)
    return BatchNormParams(n, c, h, w, float(eps), float(momentum))


def _vec(t, name, c, required=True):
    if t is None:
        if required:
            raise ValueError(f"{name}: required")
        return None
    return _tensor(t, name, (c,))


def batchnorm2d_forward_train(x, gamma, beta, running_mean=None, running_var=None, eps=1e-5,
                              momentum=0.1, out=None):
    """Returns (y, save_mean, save_invstd); running stats updated in place. out=x: in place."""
    _tensor(x, "x", ndim=4)
    c = x.shape[1]
    _vec(gamma, "gamma", c, False), _vec(beta, "beta", c, False)
    _vec(running_mean, "running_mean", c, False), _vec(running_var, "running_var", c, False)
    y = _out(out, "out", x.shape)
    _no_alias({"out": y}, {"x": x, "gamma": gamma, "beta": beta, "running_mean": running_mean,
                           "running_var": running_var}, allow_equal=[("out", "x")])
    sm, si = torch.empty(c), torch.empty(c)
    check(raw.port_batchnorm2d_forward_train(y.data_ptr(), sm.data_ptr(), si.data_ptr(),
                                             _ptr(running_mean), _ptr(running_var), x.data_ptr(),
                                             _ptr(gamma), _ptr(beta),
                                             _bn_params(x.shape, eps, momentum)),
          "batchnorm2d_forward_train")
    return y, sm, si


def batchnorm2d_forward_eval(x, gamma, beta, running_mean, running_var, eps=1e-5, out=None):
    _tensor(x, "x", ndim=4)
    c = x.shape[1]
    _vec(gamma, "gamma", c, False), _vec(beta, "beta", c, False)
    _vec(running_mean, "running_mean", c), _vec(running_var, "running_var", c)
    y = _out(out, "out", x.shape)
    _no_alias({"out": y}, {"x": x, "gamma": gamma, "beta": beta}, allow_equal=[("out", "x")])
    check(raw.port_batchnorm2d_forward_eval(y.data_ptr(), x.data_ptr(), _ptr(gamma), _ptr(beta),
                                            running_mean.data_ptr(), running_var.data_ptr(),
                                            _bn_params(x.shape, eps, 0.0)),
          "batchnorm2d_forward_eval")
    return y


def batchnorm2d_backward_input(dy, x, gamma, save_mean, save_invstd, out=None):
    _tensor(x, "x", ndim=4)
    c = x.shape[1]
    _tensor(dy, "dy", x.shape)
    _vec(gamma, "gamma", c, False), _vec(save_mean, "save_mean", c)
    _vec(save_invstd, "save_invstd", c)
    dx = _out(out, "out", x.shape)
    _no_alias({"out": dx}, {"dy": dy, "x": x}, allow_equal=[("out", "dy")])
    check(raw.port_batchnorm2d_backward_input(dx.data_ptr(), dy.data_ptr(), x.data_ptr(),
                                              _ptr(gamma), save_mean.data_ptr(),
                                              save_invstd.data_ptr(), _bn_params(x.shape, 1e-5, 0)),
          "batchnorm2d_backward_input")
    return dx


def batchnorm2d_backward_weight(dy, x, save_mean, save_invstd, dgamma=None, dbeta=None):
    _tensor(x, "x", ndim=4)
    c = x.shape[1]
    _tensor(dy, "dy", x.shape)
    _vec(save_mean, "save_mean", c), _vec(save_invstd, "save_invstd", c)
    dgamma, dbeta = _acc(dgamma, "dgamma", (c,)), _acc(dbeta, "dbeta", (c,))
    check(raw.port_batchnorm2d_backward_weight(dgamma.data_ptr(), dbeta.data_ptr(), dy.data_ptr(),
                                               x.data_ptr(), save_mean.data_ptr(),
                                               save_invstd.data_ptr(),
                                               _bn_params(x.shape, 1e-5, 0)),
          "batchnorm2d_backward_weight")
    return dgamma, dbeta


def batchnorm2d_backward_input_from_output(dy, y, gamma, beta, save_invstd, out=None):
    """In-place BN backward: xhat = (y - beta)/gamma (requires gamma != 0). out=dy allowed."""
    _tensor(y, "y", ndim=4)
    c = y.shape[1]
    _tensor(dy, "dy", y.shape)
    _vec(gamma, "gamma", c), _vec(beta, "beta", c), _vec(save_invstd, "save_invstd", c)
    dx = _out(out, "out", y.shape)
    _no_alias({"out": dx}, {"dy": dy, "y": y}, allow_equal=[("out", "dy")])
    check(raw.port_batchnorm2d_backward_input_from_output(
        dx.data_ptr(), dy.data_ptr(), y.data_ptr(), gamma.data_ptr(), beta.data_ptr(),
        save_invstd.data_ptr(), _bn_params(y.shape, 1e-5, 0)),
        "batchnorm2d_backward_input_from_output")
    return dx


def batchnorm2d_backward_weight_from_output(dy, y, gamma, beta, dgamma=None, dbeta=None):
    _tensor(y, "y", ndim=4)
    c = y.shape[1]
    _tensor(dy, "dy", y.shape)
    _vec(gamma, "gamma", c), _vec(beta, "beta", c)
    dgamma, dbeta = _acc(dgamma, "dgamma", (c,)), _acc(dbeta, "dbeta", (c,))
    check(raw.port_batchnorm2d_backward_weight_from_output(
        dgamma.data_ptr(), dbeta.data_ptr(), dy.data_ptr(), y.data_ptr(), gamma.data_ptr(),
        beta.data_ptr(), _bn_params(y.shape, 1e-5, 0)), "batchnorm2d_backward_weight_from_output")
    return dgamma, dbeta


def batchnorm2d_backward_input_eval(dy, gamma, running_var, eps=1e-5, out=None):
    _tensor(dy, "dy", ndim=4)
    c = dy.shape[1]
    _vec(gamma, "gamma", c, False), _vec(running_var, "running_var", c)
    dx = _out(out, "out", dy.shape)
    _no_alias({"out": dx}, {"dy": dy}, allow_equal=[("out", "dy")])
    check(raw.port_batchnorm2d_backward_input_eval(dx.data_ptr(), dy.data_ptr(), _ptr(gamma),
                                                   running_var.data_ptr(),
                                                   _bn_params(dy.shape, eps, 0)),
          "batchnorm2d_backward_input_eval")
    return dx


def batchnorm2d_backward_weight_eval(dy, x, running_mean, running_var, eps=1e-5, dgamma=None,
                                     dbeta=None):
    _tensor(x, "x", ndim=4)
    c = x.shape[1]
    _tensor(dy, "dy", x.shape)
    _vec(running_mean, "running_mean", c), _vec(running_var, "running_var", c)
    dgamma, dbeta = _acc(dgamma, "dgamma", (c,)), _acc(dbeta, "dbeta", (c,))
    check(raw.port_batchnorm2d_backward_weight_eval(dgamma.data_ptr(), dbeta.data_ptr(),
                                                    dy.data_ptr(), x.data_ptr(),
                                                    running_mean.data_ptr(),
                                                    running_var.data_ptr(),
                                                    _bn_params(x.shape, eps, 0)),
          "batchnorm2d_backward_weight_eval")
    return dgamma, dbeta


# --------------------------------------------------------------------------- element-wise
def _unary(fname, x, out, xname="x", inplace_ok=True):
    _tensor(x, xname)
    y = _out(out, "out", x.shape)
    _no_alias({"out": y}, {xname: x}, allow_equal=[("out", xname)] if inplace_ok else [])
    check(getattr(raw, fname)(y.data_ptr(), x.data_ptr(), x.numel()), fname[5:])
    return y


def _unary_bwd(fname, dy, saved, savedname, out):
    _tensor(dy, "dy")
    _tensor(saved, savedname, dy.shape)
    dx = _out(out, "out", dy.shape)
    _no_alias({"out": dx}, {"dy": dy, savedname: saved}, allow_equal=[("out", "dy")])
    check(getattr(raw, fname)(dx.data_ptr(), dy.data_ptr(), saved.data_ptr(), dy.numel()),
          fname[5:])
    return dx


def relu_forward(x, out=None, inplace=False):
    """Saved for backward: the output y. inplace=True writes into x."""
    return _unary("port_relu_forward", x, x if inplace else out)


def relu_backward(dy, y, out=None, inplace=False):
    return _unary_bwd("port_relu_backward", dy, y, "y", dy if inplace else out)


def relu6_forward(x, out=None, inplace=False):
    return _unary("port_relu6_forward", x, x if inplace else out)


def relu6_backward(dy, y, out=None, inplace=False):
    return _unary_bwd("port_relu6_backward", dy, y, "y", dy if inplace else out)


def hardswish_forward(x, out=None):
    return _unary("port_hardswish_forward", x, out, inplace_ok=False)


def hardswish_backward(dy, x, out=None, inplace=False):
    return _unary_bwd("port_hardswish_backward", dy, x, "x", dy if inplace else out)


def sigmoid_forward(x, out=None, inplace=False):
    return _unary("port_sigmoid_forward", x, x if inplace else out)


def sigmoid_backward(dy, y, out=None, inplace=False):
    return _unary_bwd("port_sigmoid_backward", dy, y, "y", dy if inplace else out)


def hardsigmoid_forward(x, out=None, inplace=False):
    return _unary("port_hardsigmoid_forward", x, x if inplace else out)


def hardsigmoid_backward(dy, x, out=None, inplace=False):
    return _unary_bwd("port_hardsigmoid_backward", dy, x, "x", dy if inplace else out)


def silu_forward(x, out=None, inplace=False):
    return _unary("port_silu_forward", x, x if inplace else out)


def silu_backward(dy, x, out=None, inplace=False):
    return _unary_bwd("port_silu_backward", dy, x, "x", dy if inplace else out)


def _binary_params(kind, sa, sb, sy):
    from port.exec.capi import BINARY_OPS, BinaryParams
    from port.ops.elementwise import collapse
    dims, am, bm = collapse(tuple(sa), tuple(sb), tuple(sy))
    p = BinaryParams(BINARY_OPS[kind], len(dims), am, bm)
    for i, d in enumerate(dims):
        p.dims[i] = d
    return p


def binary_backward_path(kind, sa, sb, operand):
    """port_binary_backward_path: 0 reference, 1 elementwise, 2 rows (the fast path operand's gradient takes)."""
    return raw.port_binary_backward_path(ctypes.byref(_binary_params(kind, sa, sb, torch.broadcast_shapes(sa, sb))),
                                         operand)


def binary_forward(kind, a, b):
    """y = a op b with full broadcasting (kind: add_nd, sub, mul, div)."""
    _tensor(a, "a")
    _tensor(b, "b")
    y = torch.empty(torch.broadcast_shapes(a.shape, b.shape))
    p = _binary_params(kind, a.shape, b.shape, y.shape)
    check(raw.port_binary_forward(y.data_ptr(), a.data_ptr(), b.data_ptr(), ctypes.byref(p)), "binary_forward")
    return y


def binary_backward(kind, dy, a, b, want=(0, 1), accumulate_into=None, reference=False):
    """(da, db) of y = a op b (None where not wanted); accumulate_into: (da, db) to add into; reference: the plain
    reference (port_binary_backward_reference) instead of the fast paths."""
    _tensor(dy, "dy")
    p = _binary_params(kind, a.shape, b.shape, dy.shape)
    outs = list(accumulate_into) if accumulate_into is not None else \
        [torch.empty(t.shape) if i in want else None for i, t in enumerate((a, b))]
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    fn = raw.port_binary_backward_reference if reference else raw.port_binary_backward
    check(fn(ptr(outs[0]), ptr(outs[1]), dy.data_ptr(), a.data_ptr(), b.data_ptr(), ctypes.byref(p),
             int(accumulate_into is not None)), "binary_backward")
    return tuple(outs)


def add(a, b, out=None):
    """y = a + b; out may be a or b (in-place add)."""
    _tensor(a, "a")
    _tensor(b, "b", a.shape)
    y = _out(out, "out", a.shape)
    _no_alias({"out": y}, {"a": a, "b": b}, allow_equal=[("out", "a"), ("out", "b")])
    check(raw.port_add(y.data_ptr(), a.data_ptr(), b.data_ptr(), a.numel()), "add")
    return y


def accumulate(a, b):
    """a += b (in place); returns a."""
    _tensor(a, "a")
    _tensor(b, "b", a.shape)
    _no_alias({"a": a}, {"b": b})
    check(raw.port_accumulate(a.data_ptr(), b.data_ptr(), a.numel()), "accumulate")
    return a


def dropout_forward(x, p, seed, out=None, mask=None, stream=0):
    """Returns (y, mask uint8). out=x allowed (in place)."""
    _tensor(x, "x")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p: must be in [0, 1), got {p}")
    y = _out(out, "out", x.shape)
    m = _out(mask, "mask", x.shape, torch.uint8)
    _no_alias({"out": y, "mask": m}, {"x": x}, allow_equal=[("out", "x")])
    check(raw.port_dropout_forward(y.data_ptr(), m.data_ptr(), x.data_ptr(), x.numel(), p,
                                   int(seed) & 0xFFFFFFFFFFFFFFFF, int(stream) & 0xFFFFFFFFFFFFFFFF),
          "dropout_forward")
    return y, m


def dropout_backward(dy, mask, p, out=None):
    _tensor(dy, "dy")
    _tensor(mask, "mask", dy.shape, torch.uint8)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p: must be in [0, 1), got {p}")
    dx = _out(out, "out", dy.shape)
    _no_alias({"out": dx}, {"dy": dy, "mask": mask}, allow_equal=[("out", "dy")])
    check(raw.port_dropout_backward(dx.data_ptr(), dy.data_ptr(), mask.data_ptr(), dy.numel(), p),
          "dropout_backward")
    return dx


# --------------------------------------------------------------------------- pooling
def pool2d_params(x_shape, kernel, stride=None, padding=0, dilation=1, ceil_mode=False,
                  count_include_pad=True) -> Pool2dParams:
    n, c, h, w = (int(s) for s in x_shape)
    kh, kw = _pair(kernel, "kernel")
    sh, sw = _pair(kernel if stride is None else stride, "stride")
    ph, pw = _pair(padding, "padding")
    dh, dw = _pair(dilation, "dilation")
    return Pool2dParams(n, c, h, w, kh, kw, sh, sw, ph, pw, 0, 0, dh, dw, int(bool(ceil_mode)),
                        int(not count_include_pad))


def _pool_out(p):
    return p.n, p.c, raw.port_pool2d_out_h(p), raw.port_pool2d_out_w(p)


def maxpool2d_forward(x, kernel, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Returns (y, indices int64 into the H*W plane)."""
    _tensor(x, "x", ndim=4)
    p = pool2d_params(x.shape, kernel, stride, padding, dilation, ceil_mode)
    shape = _pool_out(p)
    if min(shape) < 1:
        raise ValueError(f"kernel: window larger than the padded input {tuple(x.shape)}")
    y, idx = torch.empty(shape), torch.empty(shape, dtype=torch.int64)
    check(raw.port_maxpool2d_forward(y.data_ptr(), idx.data_ptr(), x.data_ptr(), p),
          "maxpool2d_forward")
    return y, idx


def maxpool2d_backward_input(dy, indices, x_shape, kernel, stride=None, padding=0, out=None, dilation=1,
                             ceil_mode=False):
    p = pool2d_params(x_shape, kernel, stride, padding, dilation, ceil_mode)
    _tensor(dy, "dy", _pool_out(p))
    _tensor(indices, "indices", dy.shape, torch.int64)
    dx = _out(out, "out", x_shape)
    _no_alias({"out": dx}, {"dy": dy, "indices": indices})
    check(raw.port_maxpool2d_backward_input(dx.data_ptr(), dy.data_ptr(), indices.data_ptr(), p),
          "maxpool2d_backward_input")
    return dx


def avgpool2d_forward(x, kernel, stride=None, padding=0, out=None, ceil_mode=False, count_include_pad=True):
    _tensor(x, "x", ndim=4)
    p = pool2d_params(x.shape, kernel, stride, padding, ceil_mode=ceil_mode, count_include_pad=count_include_pad)
    shape = _pool_out(p)
    if min(shape) < 1:
        raise ValueError(f"kernel: window larger than the padded input {tuple(x.shape)}")
    y = _out(out, "out", shape)
    _no_alias({"out": y}, {"x": x})
    check(raw.port_avgpool2d_forward(y.data_ptr(), x.data_ptr(), p), "avgpool2d_forward")
    return y


def avgpool2d_backward_input(dy, x_shape, kernel, stride=None, padding=0, out=None, ceil_mode=False,
                             count_include_pad=True):
    p = pool2d_params(x_shape, kernel, stride, padding, ceil_mode=ceil_mode, count_include_pad=count_include_pad)
    _tensor(dy, "dy", _pool_out(p))
    dx = _out(out, "out", x_shape)
    _no_alias({"out": dx}, {"dy": dy})
    check(raw.port_avgpool2d_backward_input(dx.data_ptr(), dy.data_ptr(), p),
          "avgpool2d_backward_input")
    return dx


def global_avgpool_forward(x, out=None):
    _tensor(x, "x", ndim=4)
    n, c, h, w = x.shape
    y = _out(out, "out", (n, c))
    _no_alias({"out": y}, {"x": x})
    check(raw.port_global_avgpool_forward(y.data_ptr(), x.data_ptr(), n, c, h * w),
          "global_avgpool_forward")
    return y


def global_avgpool_backward_input(dy, x_shape, out=None):
    n, c, h, w = (int(s) for s in x_shape)
    _tensor(dy, "dy", (n, c))
    dx = _out(out, "out", x_shape)
    _no_alias({"out": dx}, {"dy": dy})
    check(raw.port_global_avgpool_backward_input(dx.data_ptr(), dy.data_ptr(), n, c, h * w),
          "global_avgpool_backward_input")
    return dx


# --------------------------------------------------------------------------- linear
def linear_forward(x, w, b=None, out=None, wt=False):
    """wt: w stored [in, out] (port_linear_t_forward, GPT-2's Conv1D)."""
    _tensor(x, "x", ndim=2)
    _tensor(w, "w", ndim=2)
    fin, fo = (w.shape[0], w.shape[1]) if wt else (w.shape[1], w.shape[0])
    if fin != x.shape[1]:
        raise ValueError(f"w: expected in_features {x.shape[1]}, got shape {tuple(w.shape)}")
    if b is not None:
        _tensor(b, "b", (fo,))
    y = _out(out, "out", (x.shape[0], fo))
    _no_alias({"out": y}, {"x": x, "w": w, "b": b})
    p = LinearParams(x.shape[0], x.shape[1], fo)
    fn = raw.port_linear_t_forward if wt else raw.port_linear_forward
    check(fn(y.data_ptr(), x.data_ptr(), w.data_ptr(), _ptr(b), p), "linear_forward")
    return y


def linear_backward_input(dy, w, out=None, wt=False):
    _tensor(w, "w", ndim=2)
    _tensor(dy, "dy", ndim=2)
    fin, fo = (w.shape[0], w.shape[1]) if wt else (w.shape[1], w.shape[0])
    if dy.shape[1] != fo:
        raise ValueError(f"dy: expected shape (n, {fo}), got {tuple(dy.shape)}")
    dx = _out(out, "out", (dy.shape[0], fin))
    _no_alias({"out": dx}, {"dy": dy, "w": w})
    p = LinearParams(dy.shape[0], fin, fo)
    fn = raw.port_linear_t_backward_input if wt else raw.port_linear_backward_input
    check(fn(dx.data_ptr(), dy.data_ptr(), w.data_ptr(), p), "linear_backward_input")
    return dx


def linear_backward_weight(dy, x, bias=True, dw=None, db=None, wt=False):
    _tensor(x, "x", ndim=2)
    _tensor(dy, "dy", ndim=2)
    if dy.shape[0] != x.shape[0]:
        raise ValueError(f"dy: batch {dy.shape[0]} differs from x batch {x.shape[0]}")
    dw = _acc(dw, "dw", (x.shape[1], dy.shape[1]) if wt else (dy.shape[1], x.shape[1]))
    db = _acc(db, "db", (dy.shape[1],)) if bias else None
    _no_alias({"dw": dw, "db": db}, {"dy": dy, "x": x})
    p = LinearParams(x.shape[0], x.shape[1], dy.shape[1])
    fn = raw.port_linear_t_backward_weight if wt else raw.port_linear_backward_weight
    check(fn(dw.data_ptr(), _ptr(db), dy.data_ptr(), x.data_ptr(), p), "linear_backward_weight")
    return dw, db


# --------------------------------------------------------------------------- loss
def softmax_xent_forward(logits, labels, label_smoothing=0.0):
    """Returns (loss [1], probs [n,k])."""
    _tensor(logits, "logits", ndim=2)
    n, k = logits.shape
    _tensor(labels, "labels", (n,), torch.int64)
    if n and (int(labels.min()) < 0 or int(labels.max()) >= k):
        raise ValueError(f"labels: values must be in [0, {k})")
    loss, probs = torch.empty(1), torch.empty((n, k))
    check(raw.port_softmax_xent_forward(loss.data_ptr(), probs.data_ptr(), logits.data_ptr(),
                                        labels.data_ptr(), n, k, float(label_smoothing)),
          "softmax_xent_forward")
    return loss, probs


def softmax_xent_backward(probs, labels, grad_loss=None, label_smoothing=0.0, out=None):
    _tensor(probs, "probs", ndim=2)
    n, k = probs.shape
    _tensor(labels, "labels", (n,), torch.int64)
    gl = torch.ones(1) if grad_loss is None else _tensor(grad_loss, "grad_loss", (1,))
    d = _out(out, "out", (n, k))
    _no_alias({"out": d}, {"probs": probs, "labels": labels, "grad_loss": gl},
              allow_equal=[("out", "probs")])
    check(raw.port_softmax_xent_backward(d.data_ptr(), probs.data_ptr(), labels.data_ptr(),
                                         gl.data_ptr(), n, k, float(label_smoothing)),
          "softmax_xent_backward")
    return d


# --------------------------------------------------------------------------- optimizers
def sgd_step(param, grad, momentum_buf=None, lr=0.01, momentum=0.0, dampening=0.0,
             weight_decay=0.0, nesterov=False, first_step=False):
    _tensor(param, "param")
    _tensor(grad, "grad", param.shape)
    if momentum != 0.0:
        _tensor(momentum_buf, "momentum_buf", param.shape)
    _no_alias({"param": param, "momentum_buf": momentum_buf}, {"grad": grad})
    check(raw.port_sgd_step(param.data_ptr(), _ptr(momentum_buf), grad.data_ptr(), param.numel(),
                            lr, momentum, dampening, weight_decay, int(nesterov),
                            int(first_step)), "sgd_step")
    return param


def adamw_step(param, grad, exp_avg, exp_avg_sq, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
               weight_decay=1e-2):
    _tensor(param, "param")
    _tensor(grad, "grad", param.shape)
    _tensor(exp_avg, "exp_avg", param.shape)
    _tensor(exp_avg_sq, "exp_avg_sq", param.shape)
    _no_alias({"param": param, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}, {"grad": grad})
    check(raw.port_adamw_step(param.data_ptr(), exp_avg.data_ptr(), exp_avg_sq.data_ptr(),
                              grad.data_ptr(), param.numel(), lr, betas[0], betas[1], eps,
                              weight_decay, int(step)), "adamw_step")
    return param


# --------------------------------------------------------------------------- fused conv+bn+relu
def conv2d_bn_relu_forward_train(x, w, gamma, beta, running_mean=None, running_var=None,
                                 stride=1, padding=0, groups=1, eps=1e-5, momentum=0.1,
                                 algo="auto"):
    """Returns (y, z, save_mean, save_invstd); z is the conv output (saved for backward)."""
    _tensor(x, "x", ndim=4)
    p = _conv_setup(x.shape, w, stride, padding, groups)
    c = p.c_out
    for t, nm in ((gamma, "gamma"), (beta, "beta"), (running_mean, "running_mean"),
                  (running_var, "running_var")):
        _vec(t, nm, c, False)
    shape = conv2d_out_shape(p)
    y, z, sm, si = torch.empty(shape), torch.empty(shape), torch.empty(c), torch.empty(c)
    a = _algo(algo)
    ws = _workspace(conv2d_workspace_bytes(p, a))
    check(raw.port_conv2d_bn_relu_forward_train(
        y.data_ptr(), z.data_ptr(), sm.data_ptr(), si.data_ptr(), _ptr(running_mean),
        _ptr(running_var), x.data_ptr(), w.data_ptr(), _ptr(gamma), _ptr(beta), p, eps, momentum,
        a, ws.data_ptr(), ws.numel()), "conv2d_bn_relu_forward_train")
    return y, z, sm, si


# --------------------------------------------------------------------------- transformer
def _prod(dims) -> int:
    r = 1
    for d in dims:
        r *= int(d)
    return r


def embedding_forward(idx, w, out=None):
    """y[..., :] = w[idx[...], :]; idx int64 (any shape), w [v, d]. Returns y of shape idx.shape + (d,)."""
    _tensor(w, "w", ndim=2)
    _tensor(idx, "idx", dtype=torch.int64)
    v, d = w.shape
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= v):
        raise ValueError(f"idx: values must be in [0, {v})")
    y = _out(out, "out", tuple(idx.shape) + (d,))
    _no_alias({"out": y}, {"w": w, "idx": idx})
    check(raw.port_embedding_forward(y.data_ptr(), idx.data_ptr(), w.data_ptr(), idx.numel(), v, d),
          "embedding_forward")
    return y


def embedding_backward_weight(dy, idx, w_shape, dw=None, padding_idx=None):
    """dw[idx[i]] += dy[i] (accumulates into dw when given, in index order); with padding_idx, row padding_idx
    gets nothing (port_embedding_backward_weight_pad)."""
    v, d = (int(s) for s in w_shape)
    _tensor(idx, "idx", dtype=torch.int64)
    _tensor(dy, "dy", tuple(idx.shape) + (d,))
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= v):
        raise ValueError(f"idx: values must be in [0, {v})")
    if padding_idx is not None and not 0 <= padding_idx < v:
        raise ValueError(f"padding_idx={padding_idx}: must be in [0, {v})")
    dw = _acc(dw, "dw", (v, d))
    _no_alias({"dw": dw}, {"dy": dy, "idx": idx})
    if padding_idx is None:
        check(raw.port_embedding_backward_weight(dw.data_ptr(), dy.data_ptr(), idx.data_ptr(), idx.numel(), v, d),
              "embedding_backward_weight")
    else:
        check(raw.port_embedding_backward_weight_pad(dw.data_ptr(), dy.data_ptr(), idx.data_ptr(), idx.numel(), v,
                                                     d, padding_idx), "embedding_backward_weight_pad")
    return dw


def _rows_d(x, name):
    _tensor(x, name)
    if x.dim() < 1 or x.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(x.shape)}")
    d = x.shape[-1]
    return x.numel() // d, d


def layernorm_forward(x, gamma=None, beta=None, eps=1e-5, out=None):
    """Layer norm over the last dim. Returns (y, stats [2*rows]: means then rstds)."""
    rows, d = _rows_d(x, "x")
    _vec(gamma, "gamma", d, False), _vec(beta, "beta", d, False)
    if not eps >= 0.0:
        raise ValueError(f"eps: must be >= 0, got {eps}")
    y = _out(out, "out", x.shape)
    stats = torch.empty(2 * rows)
    _no_alias({"out": y}, {"x": x, "gamma": gamma, "beta": beta})
    check(raw.port_layernorm_forward(y.data_ptr(), stats.data_ptr(), x.data_ptr(), _ptr(gamma), _ptr(beta), rows,
                                     d, float(eps)), "layernorm_forward")
    return y, stats


def layernorm_backward_input(dy, x, stats, gamma=None, out=None):
    rows, d = _rows_d(x, "x")
    _tensor(dy, "dy", x.shape)
    _tensor(stats, "stats", (2 * rows,))
    _vec(gamma, "gamma", d, False)
    dx = _out(out, "out", x.shape)
    _no_alias({"out": dx}, {"dy": dy, "x": x, "stats": stats, "gamma": gamma})
    check(raw.port_layernorm_backward_input(dx.data_ptr(), dy.data_ptr(), x.data_ptr(), stats.data_ptr(),
                                            _ptr(gamma), rows, d), "layernorm_backward_input")
    return dx


def layernorm_backward_weight(dy, x, stats, weight=True, bias=True, dgamma=None, dbeta=None):
    """Returns (dgamma, dbeta) -- accumulated into the given buffers; None for weight/bias=False."""
    rows, d = _rows_d(x, "x")
    _tensor(dy, "dy", x.shape)
    _tensor(stats, "stats", (2 * rows,))
    if not (weight or bias):
        raise ValueError("weight: at least one of weight and bias must be True")
    dgamma = _acc(dgamma, "dgamma", (d,)) if weight else None
    dbeta = _acc(dbeta, "dbeta", (d,)) if bias else None
    _no_alias({"dgamma": dgamma, "dbeta": dbeta}, {"dy": dy, "x": x, "stats": stats})
    check(raw.port_layernorm_backward_weight(_ptr(dgamma), _ptr(dbeta), dy.data_ptr(), x.data_ptr(),
                                             stats.data_ptr(), rows, d), "layernorm_backward_weight")
    return dgamma, dbeta


def _approx(approximate) -> int:
    code = {"none": 0, "tanh": 1, 0: 0, 1: 1, False: 0, True: 1}.get(approximate)
    if code is None:
        raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    return code


def gelu_forward(x, approximate="none", out=None):
    """GELU (approximate 'none': x*Phi(x); 'tanh': torch's tanh approximation). Saved: x (no in-place)."""
    a = _approx(approximate)
    _tensor(x, "x")
    y = _out(out, "out", x.shape)
    _no_alias({"out": y}, {"x": x})
    check(raw.port_gelu_forward(y.data_ptr(), x.data_ptr(), x.numel(), a), "gelu_forward")
    return y


def gelu_backward(dy, x, approximate="none", out=None, inplace=False):
    a = _approx(approximate)
    _tensor(dy, "dy")
    _tensor(x, "x", dy.shape)
    dx = _out(dy if inplace else out, "out", dy.shape)
    _no_alias({"out": dx}, {"dy": dy, "x": x}, allow_equal=[("out", "dy")])
    check(raw.port_gelu_backward(dx.data_ptr(), dy.data_ptr(), x.data_ptr(), dy.numel(), a), "gelu_backward")
    return dx


def tanh_forward(x, out=None, inplace=False):
    """Saved for backward: the output y. inplace=True writes into x."""
    return _unary("port_tanh_forward", x, x if inplace else out)


def tanh_backward(dy, y, out=None, inplace=False):
    return _unary_bwd("port_tanh_backward", dy, y, "y", dy if inplace else out)


def scale(x, alpha, out=None, inplace=False):
    """y = alpha * x (also the backward of a scaling)."""
    _tensor(x, "x")
    y = _out(x if inplace else out, "out", x.shape)
    _no_alias({"out": y}, {"x": x}, allow_equal=[("out", "x")])
    check(raw.port_scale(y.data_ptr(), x.data_ptr(), x.numel(), float(alpha)), "scale")
    return y


def softmax_forward(x, out=None, inplace=False):
    """Softmax over the last dim. Saved: y."""
    rows, d = _rows_d(x, "x")
    y = _out(x if inplace else out, "out", x.shape)
    _no_alias({"out": y}, {"x": x}, allow_equal=[("out", "x")])
    check(raw.port_softmax_forward(y.data_ptr(), x.data_ptr(), rows, d), "softmax_forward")
    return y


def softmax_backward(dy, y, out=None, inplace=False):
    rows, d = _rows_d(y, "y")
    _tensor(dy, "dy", y.shape)
    dx = _out(dy if inplace else out, "out", y.shape)
    _no_alias({"out": dx}, {"dy": dy, "y": y}, allow_equal=[("out", "dy")])
    check(raw.port_softmax_backward(dx.data_ptr(), dy.data_ptr(), y.data_ptr(), rows, d), "softmax_backward")
    return dx


def bmm(a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, c=None):
    """c[i] = alpha * op(a[i]) op(b[i]) + beta * c[i] for 3-D a, b (c zero-initialised when not given)."""
    _tensor(a, "a", ndim=3)
    _tensor(b, "b", ndim=3)
    if b.shape[0] != a.shape[0]:
        raise ValueError(f"b: batch {b.shape[0]} differs from a's batch {a.shape[0]}")
    batch = a.shape[0]
    m, k = (a.shape[2], a.shape[1]) if trans_a else (a.shape[1], a.shape[2])
    kb, n = (b.shape[2], b.shape[1]) if trans_b else (b.shape[1], b.shape[2])
    if k != kb:
        raise ValueError(f"b: inner dimensions differ ({k} vs {kb})")
    if c is None:
        c = torch.zeros((batch, m, n), dtype=torch.float32)
    _tensor(c, "c", (batch, m, n))
    _no_alias({"c": c}, {"a": a, "b": b})
    check(raw.port_bmm(c.data_ptr(), a.data_ptr(), b.data_ptr(), batch, m, n, k, int(bool(trans_a)),
                       int(bool(trans_b)), float(alpha), float(beta)), "bmm")
    return c


def permute(x, perm, out=None):
    """x.permute(perm).contiguous() (rank 1..6)."""
    _tensor(x, "x")
    rank = x.dim()
    perm = [int(p) for p in perm]
    if not 1 <= rank <= 6:
        raise ValueError(f"x: rank must be in 1..6, got {rank}")
    if sorted(perm) != list(range(rank)):
        raise ValueError(f"perm: expected a permutation of 0..{rank - 1}, got {perm}")
    if x.numel() == 0:
        raise ValueError(f"x: expected a non-empty tensor, got shape {tuple(x.shape)}")
    y = _out(out, "out", [x.shape[p] for p in perm])
    _no_alias({"out": y}, {"x": x})
    sh = (ctypes.c_int64 * 6)(*x.shape)
    pm = (ctypes.c_int64 * 6)(*perm)
    check(raw.port_permute(y.data_ptr(), x.data_ptr(), rank, ctypes.addressof(sh), ctypes.addressof(pm)),
          "permute")
    return y


def add_broadcast(a, b, out=None):
    """y = a + b with b broadcast over a's leading dims (b's shape = a's trailing dims); out may be a."""
    _tensor(a, "a")
    _tensor(b, "b")
    if b.dim() > a.dim() or tuple(a.shape[a.dim() - b.dim():]) != tuple(b.shape) or b.numel() == 0:
        raise ValueError(f"b: shape {tuple(b.shape)} is not a non-empty trailing part of a's {tuple(a.shape)}")
    y = _out(out, "out", a.shape)
    _no_alias({"out": y}, {"a": a, "b": b}, allow_equal=[("out", "a")])
    inner = b.numel()
    check(raw.port_add_broadcast(y.data_ptr(), a.data_ptr(), b.data_ptr(), a.numel() // inner, inner),
          "add_broadcast")
    return y


def sum_rows(dy, shape, out=None):
    """db = dy summed over its leading dims down to the trailing `shape` (the backward of add_broadcast's b);
    overwrites out."""
    _tensor(dy, "dy")
    shape = tuple(int(s) for s in shape)
    if len(shape) > dy.dim() or tuple(dy.shape[dy.dim() - len(shape):]) != shape or _prod(shape) == 0:
        raise ValueError(f"shape: {shape} is not a non-empty trailing part of dy's {tuple(dy.shape)}")
    db = _out(out, "out", shape)
    _no_alias({"out": db}, {"dy": dy})
    inner = _prod(shape)
    check(raw.port_sum_rows(db.data_ptr(), dy.data_ptr(), dy.numel() // inner, inner), "sum_rows")
    return db


def _mid(shape, dim, name):
    shape = tuple(int(s) for s in shape)
    if not -len(shape) <= dim < len(shape):
        raise ValueError(f"dim: {dim} out of range for shape {shape}")
    dim %= len(shape)
    if _prod(shape) == 0:
        raise ValueError(f"{name}: expected a non-empty shape, got {shape}")
    return shape, dim, _prod(shape[:dim]), shape[dim], _prod(shape[dim + 1:])


def mean_mid_forward(x, dim, out=None):
    """x.mean(dim) (keepdim=False)."""
    _tensor(x, "x")
    shape, dim, outer, mid, inner = _mid(x.shape, int(dim), "x")
    y = _out(out, "out", shape[:dim] + shape[dim + 1:])
    _no_alias({"out": y}, {"x": x})
    check(raw.port_mean_mid_forward(y.data_ptr(), x.data_ptr(), outer, mid, inner), "mean_mid_forward")
    return y


def mean_mid_backward(dy, x_shape, dim, out=None):
    shape, dim, outer, mid, inner = _mid(x_shape, int(dim), "x_shape")
    _tensor(dy, "dy", shape[:dim] + shape[dim + 1:])
    dx = _out(out, "out", shape)
    _no_alias({"out": dx}, {"dy": dy})
    check(raw.port_mean_mid_backward(dx.data_ptr(), dy.data_ptr(), outer, mid, inner), "mean_mid_backward")
    return dx


def arange_i64(count, start=0, out=None):
    count = int(count)
    if count < 0:
        raise ValueError(f"count: must be >= 0, got {count}")
    y = _out(out, "out", (count,), torch.int64)
    if count:
        check(raw.port_arange_i64(y.data_ptr(), count, int(start)), "arange_i64")
    return y


def ne_scalar_i64(x, value, out=None):
    """(x != value) as uint8."""
    _tensor(x, "x", dtype=torch.int64)
    y = _out(out, "out", x.shape, torch.uint8)
    _no_alias({"out": y}, {"x": x})
    if x.numel():
        check(raw.port_ne_scalar_i64(y.data_ptr(), x.data_ptr(), x.numel(), int(value)), "ne_scalar_i64")
    return y


_ATTN_ALGOS = {"plain": ATTN_PLAIN, "tiled": ATTN_TILED}


def _attn_algo(algo) -> int:
    if isinstance(algo, int) and algo in _ATTN_ALGOS.values():
        return algo
    if algo not in _ATTN_ALGOS:
        raise ValueError(f"algo: expected one of {sorted(_ATTN_ALGOS)}, got {algo!r}")
    return _ATTN_ALGOS[algo]


def attention_params(q_shape, k_shape, heads=1, causal=False, scale=None, kv_heads=0, mask=None, dropout_p=0.0,
                     seed=0, stream=0) -> AttentionParams:
    """Params of q [bh, tq, dh] (or [b, heads, tq, dh]) and k [bkv, tk, dh] (or [b, kv_heads, tk, dh]); scale
    defaults to 1/sqrt(dh). mask: None, a key mask [bh/heads, tk] (uint8/bool) or a 4-d boolean / float mask
    broadcast to [b, heads, tq, tk]."""
    q_shape, k_shape = tuple(int(s) for s in q_shape), tuple(int(s) for s in k_shape)
    if len(q_shape) == 4:
        heads = q_shape[1]
        if len(k_shape) == 4:
            kv_heads = k_shape[1] if k_shape[1] != heads else kv_heads
            k_shape = (k_shape[0] * k_shape[1],) + k_shape[2:]
        q_shape = (q_shape[0] * q_shape[1],) + q_shape[2:]
    if len(q_shape) != 3 or len(k_shape) != 3:
        raise ValueError(f"q: expected [bh, t, dh] or [b, heads, t, dh] tensors, got {q_shape} and {k_shape}")
    bh, tq, dh = q_shape
    heads, kv_heads = int(heads), int(kv_heads)
    if heads < 1 or bh % heads or kv_heads < 0 or (kv_heads and heads % kv_heads):
        raise ValueError(f"heads: {heads} must divide bh={bh} and kv_heads={kv_heads} divide heads")
    bkv = bh // heads * (kv_heads or heads)
    if k_shape[0] != bkv or k_shape[2] != dh:
        raise ValueError(f"k: expected shape ({bkv}, tk, {dh}), got {k_shape}")
    if min(bh, tq, k_shape[1], dh) < 1:
        raise ValueError(f"q: empty attention shapes {q_shape}, {k_shape}")
    sc = 1.0 / math.sqrt(dh) if scale is None else float(scale)
    p = AttentionParams(bh, heads, tq, k_shape[1], dh, int(bool(causal)), sc, kv_heads)
    if mask is not None and mask.dim() == 4:
        p.mask_kind = capi.ATTN_MASK_BOOL if mask.dtype in (torch.bool, torch.uint8) else capi.ATTN_MASK_ADD
        p.mask_dims[:] = tuple(mask.shape)
    p.dropout_p, p.seed, p.stream = float(dropout_p), int(seed), int(stream)
    return p


def attention_workspace_bytes(p: AttentionParams, algo="tiled", backward=False) -> int:
    return raw.port_attention_workspace_bytes(p, _attn_algo(algo), int(bool(backward)))


def _attn_mask(mask, p):
    if mask is None:
        return None
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)
    if p.mask_kind == capi.ATTN_MASK_KEYS:
        return _tensor(mask, "key_mask", (p.bh // p.heads, p.tk), torch.uint8)
    return _tensor(mask, "mask", tuple(p.mask_dims),
                   torch.uint8 if p.mask_kind == capi.ATTN_MASK_BOOL else torch.float32)


def attention_forward(q, k, v, key_mask=None, heads=1, causal=False, scale=None, algo="tiled", out=None,
                      workspace=None, kv_heads=0, dropout_p=0.0, seed=0, stream=0):
    """Scaled dot-product attention. q [bh, tq, dh] (or [b, heads, tq, dh]), k and v likewise with tk keys (and
    kv_heads heads: grouped-query); key_mask uint8/bool [bh/heads, tk] (0 = masked) or a 4-d boolean / float
    mask. Returns (o, lse [bh, tq])."""
    _tensor(q, "q")
    _tensor(k, "k")
    p = attention_params(q.shape, k.shape, heads, causal, scale, kv_heads, key_mask, dropout_p, seed, stream)
    _tensor(v, "v", k.shape)
    km = _attn_mask(key_mask, p)
    a = _attn_algo(algo)
    o = _out(out, "out", q.shape)
    lse = torch.empty((p.bh, p.tq))
    _no_alias({"out": o}, {"q": q, "k": k, "v": v, "key_mask": km})
    ws = workspace if workspace is not None else _workspace(attention_workspace_bytes(p, a))
    check(raw.port_attention_forward(o.data_ptr(), lse.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                     _ptr(km), p, a, ws.data_ptr(), ws.numel() * ws.element_size()),
          "attention_forward")
    return o, lse


def attention_backward(dout, q, k, v, o, lse, key_mask=None, heads=1, causal=False, scale=None, algo="tiled",
                       workspace=None, needs_grad=(True, True, True), kv_heads=0, dropout_p=0.0, seed=0, stream=0):
    """Returns (dq, dk, dv) (overwritten); None for the ones needs_grad (q, k, v) marks False."""
    _tensor(q, "q")
    _tensor(k, "k")
    p = attention_params(q.shape, k.shape, heads, causal, scale, kv_heads, key_mask, dropout_p, seed, stream)
    _tensor(v, "v", k.shape)
    _tensor(o, "o", q.shape)
    _tensor(dout, "dout", q.shape)
    _tensor(lse, "lse", (p.bh, p.tq))
    km = _attn_mask(key_mask, p)
    a = _attn_algo(algo)
    nq, nk, nv = (bool(x) for x in needs_grad)
    if not (nq or nk or nv):
        raise ValueError("needs_grad: at least one of the gradients of q, k, v must be computed")
    dq = torch.empty(q.shape) if nq else None
    dk = torch.empty(k.shape) if nk else None
    dv = torch.empty(k.shape) if nv else None
    ws = workspace if workspace is not None else _workspace(attention_workspace_bytes(p, a, True))
    check(raw.port_attention_backward(_ptr(dq), _ptr(dk), _ptr(dv), dout.data_ptr(), q.data_ptr(),
                                      k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), _ptr(km), p, a,
                                      ws.data_ptr(), ws.numel() * ws.element_size()), "attention_backward")
    return dq, dk, dv


def _xent_labels(labels, n, k, ignore_index):
    _tensor(labels, "labels", (n,), torch.int64)
    counted = labels[labels != ignore_index]
    if counted.numel() and (int(counted.min()) < 0 or int(counted.max()) >= k):
        raise ValueError(f"labels: values other than ignore_index={ignore_index} must be in [0, {k})")


def softmax_xent_ignore_forward(logits, labels, ignore_index=-100, label_smoothing=0.0):
    """Token-level cross-entropy (mean over rows whose label != ignore_index; 0 when none). Returns (loss [1],
    probs [n, k])."""
    _tensor(logits, "logits", ndim=2)
    n, k = logits.shape
    _xent_labels(labels, n, k, int(ignore_index))
    loss, probs = torch.empty(1), torch.empty((n, k))
    check(raw.port_softmax_xent_ignore_forward(loss.data_ptr(), probs.data_ptr(), logits.data_ptr(),
                                               labels.data_ptr(), n, k, float(label_smoothing), int(ignore_index)),
          "softmax_xent_ignore_forward")
    return loss, probs


def softmax_xent_ignore_backward(probs, labels, grad_loss=None, ignore_index=-100, label_smoothing=0.0, out=None):
    _tensor(probs, "probs", ndim=2)
    n, k = probs.shape
    _xent_labels(labels, n, k, int(ignore_index))
    gl = torch.ones(1) if grad_loss is None else _tensor(grad_loss, "grad_loss", (1,))
    d = _out(out, "out", (n, k))
    _no_alias({"out": d}, {"probs": probs, "labels": labels, "grad_loss": gl}, allow_equal=[("out", "probs")])
    check(raw.port_softmax_xent_ignore_backward(d.data_ptr(), probs.data_ptr(), labels.data_ptr(), gl.data_ptr(),
                                                n, k, float(label_smoothing), int(ignore_index)),
          "softmax_xent_ignore_backward")
    return d


# --------------------------------------------------------------------------- norms, pooling, resize (issue 54)
def rmsnorm_forward(x, gamma=None, eps=1e-6):
    """RMS norm over the last dim. Returns (y, rstd [rows])."""
    rows, d = _rows_d(x, "x")
    _vec(gamma, "gamma", d, False)
    y, rstd = torch.empty(x.shape), torch.empty(rows)
    check(raw.port_rmsnorm_forward(y.data_ptr(), rstd.data_ptr(), x.data_ptr(), _ptr(gamma), rows, d, float(eps)),
          "rmsnorm_forward")
    return y, rstd


def rmsnorm_backward_input(dy, x, rstd, gamma=None, out=None):
    rows, d = _rows_d(x, "x")
    _tensor(dy, "dy", x.shape)
    _tensor(rstd, "rstd", (rows,))
    dx = _out(out, "out", x.shape)
    _no_alias({"out": dx}, {"x": x, "rstd": rstd, "gamma": gamma, **({} if dx is dy else {"dy": dy})})
    check(raw.port_rmsnorm_backward_input(dx.data_ptr(), dy.data_ptr(), x.data_ptr(), rstd.data_ptr(), _ptr(gamma),
                                          rows, d), "rmsnorm_backward_input")
    return dx


def rmsnorm_backward_weight(dy, x, rstd, dgamma=None):
    rows, d = _rows_d(x, "x")
    dgamma = _acc(dgamma, "dgamma", (d,))
    check(raw.port_rmsnorm_backward_weight(dgamma.data_ptr(), dy.data_ptr(), x.data_ptr(), rstd.data_ptr(), rows, d),
          "rmsnorm_backward_weight")
    return dgamma


def _gn(x, groups):
    _tensor(x, "x")
    if x.dim() < 2 or groups < 1 or x.shape[1] % groups:
        raise ValueError(f"groups: {groups} must divide the channels of {tuple(x.shape)}")
    return x.shape[0], x.shape[1], x.numel() // (x.shape[0] * x.shape[1]), groups


def groupnorm_forward(x, groups, gamma=None, beta=None, eps=1e-5):
    """Returns (y, stats [2 * n * groups]: means then rstds)."""
    n, c, hw, g = _gn(x, groups)
    y, st = torch.empty(x.shape), torch.empty(2 * n * g)
    check(raw.port_groupnorm_forward(y.data_ptr(), st.data_ptr(), x.data_ptr(), _ptr(gamma), _ptr(beta), n, c, hw, g,
                                     float(eps)), "groupnorm_forward")
    return y, st


def groupnorm_backward_input(dy, x, stats, groups, gamma=None):
    n, c, hw, g = _gn(x, groups)
    dx = torch.empty(x.shape)
    check(raw.port_groupnorm_backward_input(dx.data_ptr(), dy.data_ptr(), x.data_ptr(), stats.data_ptr(),
                                            _ptr(gamma), n, c, hw, g), "groupnorm_backward_input")
    return dx


def groupnorm_backward_weight(dy, x, stats, groups, weight=True, bias=True):
    n, c, hw, g = _gn(x, groups)
    dg = torch.zeros(c) if weight else None
    db = torch.zeros(c) if bias else None
    check(raw.port_groupnorm_backward_weight(_ptr(dg), _ptr(db), dy.data_ptr(), x.data_ptr(), stats.data_ptr(), n, c,
                                             hw, g), "groupnorm_backward_weight")
    return dg, db


def upsample2d_params(x_shape, size, mode="nearest", align_corners=False, scale_factor=None):
    """PyTorch's F.interpolate arguments as port_upsample2d_params (the step from the scale factors as PyTorch
    computes it: (float)(1.0 / s))."""
    from port.exec.capi import UPSAMPLE_MODES, Upsample2dParams
    n, c, h, w = (int(s) for s in x_shape)
    sf = (None, None) if scale_factor is None or align_corners else _fpair(scale_factor)
    r = [0.0 if s is None else ctypes.c_float(1.0 / s).value for s in sf]
    return Upsample2dParams(n, c, h, w, int(size[0]), int(size[1]), UPSAMPLE_MODES[mode], int(align_corners), *r)


def _fpair(v):
    return (float(v), float(v)) if isinstance(v, (int, float)) else (float(v[0]), float(v[1]))


def upsample2d_forward(x, size, mode="nearest", align_corners=False, scale_factor=None):
    _tensor(x, "x", ndim=4)
    p = upsample2d_params(x.shape, size, mode, align_corners, scale_factor)
    y = torch.empty(x.shape[0], x.shape[1], p.ho, p.wo)
    check(raw.port_upsample2d_forward(y.data_ptr(), x.data_ptr(), ctypes.byref(p)), "upsample2d_forward")
    return y


def upsample2d_backward_input(dy, x_shape, mode="nearest", align_corners=False, scale_factor=None):
    _tensor(dy, "dy", ndim=4)
    p = upsample2d_params(x_shape, dy.shape[2:], mode, align_corners, scale_factor)
    dx = torch.empty(tuple(x_shape))
    check(raw.port_upsample2d_backward_input(dx.data_ptr(), dy.data_ptr(), ctypes.byref(p)),
          "upsample2d_backward_input")
    return dx


def adaptive_avgpool2d_forward(x, size):
    _tensor(x, "x", ndim=4)
    n, c, h, w = x.shape
    y = torch.empty(n, c, size[0], size[1])
    check(raw.port_adaptive_avgpool2d_forward(y.data_ptr(), x.data_ptr(), n, c, h, w, size[0], size[1]),
          "adaptive_avgpool2d_forward")
    return y


def adaptive_avgpool2d_backward_input(dy, x_shape):
    _tensor(dy, "dy", ndim=4)
    n, c, h, w = x_shape
    dx = torch.empty(tuple(x_shape))
    check(raw.port_adaptive_avgpool2d_backward_input(dx.data_ptr(), dy.data_ptr(), n, c, h, w, dy.shape[2],
                                                     dy.shape[3]), "adaptive_avgpool2d_backward_input")
    return dx


# --------------------------------------------------------------------------- issue 54: unary math, shape copies
def unary_forward(kind, x, scalar=0.0, out=None):
    """y = f(x) (kind: a key of port.exec.capi.UNARY_OPS; scalar: pow's exponent, shift's constant); out may be
    x (in place)."""
    from port.exec.capi import UNARY_OPS
    _tensor(x, "x")
    y = torch.empty_like(x) if out is None else _tensor(out, "out", x.shape)
    check(raw.port_unary_forward(y.data_ptr(), x.data_ptr(), x.numel(), UNARY_OPS[kind], float(scalar)),
          "unary_forward")
    return y


def unary_backward(kind, dy, saved, scalar=0.0, out=None):
    """dx of y = f(x) from dy and the saved tensor (x or y as port_unary_saves says; None where it reads
    neither); out may be dy (in place)."""
    from port.exec.capi import UNARY_OPS
    _tensor(dy, "dy")
    dx = torch.empty_like(dy) if out is None else _tensor(out, "out", dy.shape)
    check(raw.port_unary_backward(dx.data_ptr(), dy.data_ptr(), _ptr(saved), dy.numel(), UNARY_OPS[kind],
                                  float(scalar)), "unary_backward")
    return dx


def slice_params(outer, inner, ny, nx, length, y_start, x_start, fill):
    from port.exec.capi import SliceParams
    return SliceParams(outer, inner, ny, nx, length, y_start, x_start, fill)


def slice_copy(y, x, dim, y_start, x_start, length, fill):
    """y.narrow(dim, y_start, length) = x.narrow(dim, x_start, length) (fill: zero the rest of y), in place in
    y; y and x agree on every dim but ``dim``."""
    _tensor(y, "y")
    _tensor(x, "x")
    outer, inner = math.prod(y.shape[:dim]), math.prod(y.shape[dim + 1:])
    p = slice_params(outer, inner, y.shape[dim], x.shape[dim], length, y_start, x_start, fill)
    check(raw.port_slice_copy(y.data_ptr(), x.data_ptr(), ctypes.byref(p)), "slice_copy")
    return y


def expand(x, shape):
    """x broadcast to ``shape`` (a copy)."""
    from port.ops.elementwise import collapse
    _tensor(x, "x")
    y = torch.empty(shape)
    dims, xm, _ = collapse(tuple(x.shape), tuple(shape), tuple(shape))
    d = (ctypes.c_int64 * 6)(*(dims + [1] * (6 - len(dims))))
    check(raw.port_expand(y.data_ptr(), x.data_ptr(), len(dims), xm, d), "expand")
    return y


def masked_fill(x, mask, value, reference=False, out=None):
    """x.masked_fill(mask, value) (mask bool, broadcast to x's shape); ``out``: the output tensor (x itself: in
    place); ``reference``: the plain reference kernel."""
    from port.ops.elementwise import collapse
    _tensor(x, "x")
    assert mask.dtype == torch.bool and mask.is_contiguous()
    y = torch.empty_like(x) if out is None else out
    dims, mm, _ = collapse(tuple(mask.shape), tuple(x.shape), tuple(x.shape))
    d = (ctypes.c_int64 * 6)(*(dims + [1] * (6 - len(dims))))
    fn = raw.port_masked_fill_reference if reference else raw.port_masked_fill
    check(fn(y.data_ptr(), x.data_ptr(), mask.data_ptr(), len(dims), mm, d, float(value)), "masked_fill")
    return y


# --------------------------------------------------------------------------- port-rt's call rule
def rt_rule(kernel: int, ptrs: Sequence[int], iv: Sequence[int], arena: int = 1 << 16,
            ws: int = 0) -> tuple[int, str]:
    """port_rt_call_check of one call record (pointers as arena byte offsets, -1 past ``ptrs``; the integer
    arguments ``iv``; ``ws`` workspace bytes at offset 8192; no persistent region): (status, the refusal's text)."""
    c = capi.RtCall()
    c.kernel = kernel
    for i in range(capi.RT_MAX_PTRS):
        c.ptr[i] = ptrs[i] if i < len(ptrs) else -1
    for i, v in enumerate(iv):
        c.iv[i] = v
    if ws:
        c.ws_offset, c.ws_bytes = 8192, ws
    prob = capi.RtCallProblem()
    rc = raw.port_rt_call_check(ctypes.byref(c), arena, 0, ctypes.byref(prob))
    return rc, prob.text()
