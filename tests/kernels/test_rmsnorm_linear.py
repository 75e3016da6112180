"""RMSNorm + linear fused (issue 54): port_rmsnorm_stats, port_rmsnorm_linear_forward and _backward_weight against
float64 autograd of rms_norm -> linear on odd shapes (gamma or none, bias or none, W [out, in] or stored [in, out]),
against the plain members port_rmsnorm_forward -> port_linear_* (the same bits with one block of rows; within float
rounding with smaller blocks), equal bits at 1/2/3 threads, refusals and port-rt's call rule (ids 114, 117, 118)."""
import ctypes

import pytest
import torch

from port.exec import capi
from port.exec.capi import PORT_OK

from checked import linear_backward_weight, linear_forward, rt_rule

raw = capi.raw
EPS = 1e-6


def _p(t):
    return t.data_ptr() if t is not None else None


def _ws(n, fin, block):
    nb = raw.port_rmsnorm_linear_workspace_bytes(n, fin, block)
    return torch.empty(max(1, nb // 4)), nb


def _stats(x):
    r = torch.empty(x.shape[0])
    assert raw.port_rmsnorm_stats(r.data_ptr(), x.data_ptr(), x.shape[0], x.shape[1], ctypes.c_float(EPS)) == PORT_OK
    return r


def _fwd(x, r, g, w, b, block, wt=False):
    n, fin = x.shape
    fo = w.shape[1] if wt else w.shape[0]
    y, (ws, nb) = torch.empty(n, fo), _ws(n, fin, block)
    assert raw.port_rmsnorm_linear_forward(y.data_ptr(), x.data_ptr(), r.data_ptr(), _p(g), w.data_ptr(), _p(b), n,
                                           fin, fo, block, int(wt), ws.data_ptr(), nb) == PORT_OK
    return y


def _bwd_w(dy, x, r, g, block, bias, wt=False):
    n, fin = x.shape
    fo = dy.shape[1]
    dw = torch.zeros((fin, fo) if wt else (fo, fin))
    db = torch.zeros(fo) if bias else None
    ws, nb = _ws(n, fin, block)
    assert raw.port_rmsnorm_linear_backward_weight(dw.data_ptr(), _p(db), dy.data_ptr(), x.data_ptr(), r.data_ptr(),
                                                   _p(g), n, fin, fo, block, int(wt), ws.data_ptr(), nb) == PORT_OK
    return dw, db


def _plain_norm(x, g):
    y, r = torch.empty_like(x), torch.empty(x.shape[0])
    assert raw.port_rmsnorm_forward(y.data_ptr(), r.data_ptr(), x.data_ptr(), _p(g), x.shape[0], x.shape[1],
                                    ctypes.c_float(EPS)) == PORT_OK
    return y, r


CASES = [(7, 13, 5, True, True, False), (1, 3, 1, False, False, False), (33, 24, 17, True, False, True),
         (130, 40, 9, False, True, True), (65, 7, 31, True, True, False)]


@pytest.mark.parametrize("n,fin,fo,gamma,bias,wt", CASES)
def test_rmsnorm_linear_matches_float64_autograd_and_the_plain_chain(n, fin, fo, gamma, bias, wt):
    gen = torch.Generator().manual_seed(n * 7 + fin)
    x, dy = torch.randn(n, fin, generator=gen) * 2, torch.randn(n, fo, generator=gen)
    g = torch.rand(fin, generator=gen) + 0.5 if gamma else None
    w = torch.randn((fin, fo) if wt else (fo, fin), generator=gen) * 0.3
    b = torch.randn(fo, generator=gen) if bias else None
    r = _stats(x)
    yn, r_plain = _plain_norm(x, g)
    assert torch.equal(r, r_plain)                                   # the norm's own rstd
    # float64 autograd of rms_norm -> linear
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    b64 = b.double().requires_grad_() if bias else None
    y64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * (g.double() if gamma else 1.0)
    o64 = y64 @ (w64 if wt else w64.T) + (b64 if bias else 0.0)
    o64.backward(dy.double())
    for block in (1, 4, n, n + 5):
        y = _fwd(x, r, g, w, b, block, wt)
        dw, db = _bwd_w(dy, x, r, g, block, bias, wt)
        torch.testing.assert_close(y.double(), o64.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(dw.double(), w64.grad, rtol=1e-5, atol=1e-4)
        if bias:
            torch.testing.assert_close(db.double(), b64.grad, rtol=1e-5, atol=1e-4)
        if block >= n:      # one block: the plain chain's bits
            assert torch.equal(y, linear_forward(yn, w, b, wt=wt))
            pdw, pdb = linear_backward_weight(dy, yn, bias=bias, wt=wt)
            assert torch.equal(dw, pdw) and (not bias or torch.equal(db, pdb))


def test_rmsnorm_linear_rows_are_the_plain_rows_per_block_and_same_bits_at_1_2_3_threads():
    gen = torch.Generator().manual_seed(3)
    n, fin, fo = 300, 96, 80
    x, dy = torch.randn(n, fin, generator=gen), torch.randn(n, fo, generator=gen)
    g, w, b = torch.rand(fin, generator=gen) + 0.5, torch.randn(fo, fin, generator=gen), torch.randn(fo, generator=gen)
    r = _stats(x)
    yn, _ = _plain_norm(x, g)
    # each block's rows are the plain GEMM on those rows of the norm's output
    y = _fwd(x, r, g, w, b, 64)
    for r0 in range(0, n, 64):
        assert torch.equal(y[r0:r0 + 64], linear_forward(yn[r0:r0 + 64].contiguous(), w, b))
    prev, outs = capi.get_num_threads(), []
    try:
        for t in (1, 2, 3):
            capi.set_num_threads(t)
            outs.append((_stats(x), _fwd(x, r, g, w, b, 64), *_bwd_w(dy, x, r, g, 64, True), _fwd(x, r, g, w, b, n)))
    finally:
        capi.set_num_threads(prev)
    for o in outs[1:]:
        assert all(torch.equal(a, c) for a, c in zip(outs[0], o))


def test_rmsnorm_linear_refusals():
    x, r, w = torch.randn(4, 6), torch.rand(4), torch.randn(3, 6)
    y, ws = torch.empty(4, 3), torch.empty(64)
    nb = raw.port_rmsnorm_linear_workspace_bytes(4, 6, 2)
    assert nb == 2 * 6 * 4 and raw.port_rmsnorm_linear_workspace_bytes(4, 6, 99) == 4 * 6 * 4
    assert raw.port_rmsnorm_linear_workspace_bytes(0, 6, 2) == 0
    f = raw.port_rmsnorm_linear_forward
    assert f(y.data_ptr(), x.data_ptr(), r.data_ptr(), None, w.data_ptr(), None, 4, 6, 3, 2, 0, ws.data_ptr(),
             nb) == PORT_OK
    assert f(y.data_ptr(), x.data_ptr(), r.data_ptr(), None, w.data_ptr(), None, 4, 6, 3, 2, 0, ws.data_ptr(),
             nb - 4) == capi.PORT_ERR_WORKSPACE
    assert f(y.data_ptr(), x.data_ptr(), r.data_ptr(), None, w.data_ptr(), None, 4, 6, 3, 0, 0, ws.data_ptr(),
             nb) == capi.PORT_ERR_SHAPE
    assert f(y.data_ptr(), x.data_ptr(), None, None, w.data_ptr(), None, 4, 6, 3, 2, 0, ws.data_ptr(),
             nb) == capi.PORT_ERR_NULL
    assert f(y.data_ptr(), x.data_ptr(), r.data_ptr(), None, w.data_ptr(), None, 4, 6, 3, 2, 0, None,
             nb) == capi.PORT_ERR_NULL
    dw = torch.zeros(3, 6)
    assert raw.port_rmsnorm_linear_backward_weight(dw.data_ptr(), None, y.data_ptr(), x.data_ptr(), r.data_ptr(),
                                                   None, 4, 6, 3, 2, 0, ws.data_ptr(), nb - 1) \
        == capi.PORT_ERR_WORKSPACE
    assert raw.port_rmsnorm_stats(r.data_ptr(), x.data_ptr(), 4, 6, ctypes.c_float(-1.0)) == capi.PORT_ERR_ARG
    assert raw.port_rmsnorm_stats(r.data_ptr(), x.data_ptr(), 0, 6, ctypes.c_float(EPS)) == capi.PORT_ERR_SHAPE


def test_port_rt_call_rule_of_rmsnorm_linear_ids_114_117_118():
    """114 (rstd, x; iv rows, d; fv eps), 117 (y, x, rstd, gamma, w, b) and 118 (dw, db, dy, x, rstd, gamma); iv n,
    in, out, block rows, wt: extents from them, the workspace min(n, block rows) rows of x, no output over an
    input, wt 0 or 1."""
    assert raw.port_rt_kernel_name(114).decode() == "port_rmsnorm_stats"
    assert raw.port_rt_kernel_name(117).decode() == "port_rmsnorm_linear_forward"
    assert raw.port_rt_kernel_name(118).decode() == "port_rmsnorm_linear_backward_weight"
    n, fin, fo = 10, 6, 4
    X, Y, R, W = n * fin * 4, n * fo * 4, n * 4, fin * fo * 4
    assert rt_rule(114, [0, R], [n, fin])[0] == 0
    assert rt_rule(114, [0, 8], [n, fin])[0] != 0                    # rstd under x
    assert rt_rule(114, [0, (1 << 16) - X + 4], [n, fin])[0] != 0    # x past the arena
    iv = [n, fin, fo, 3, 0]
    fwd = [0, Y, Y + X, Y + X + R, Y + X + R + fin * 4, Y + X + R + fin * 4 + W]
    ws = 3 * fin * 4                                                  # three rows of x
    assert ws == raw.port_rmsnorm_linear_workspace_bytes(n, fin, 3)
    assert rt_rule(117, fwd, iv, ws=ws)[0] == 0
    assert rt_rule(117, fwd, iv, ws=ws - 4)[0] != 0                  # a workspace short of the kernel's
    assert rt_rule(117, fwd, [n, fin, fo, 99, 0], ws=n * fin * 4)[0] == 0    # one block: all n rows
    assert rt_rule(117, fwd[:3] + [-1, fwd[4], -1], iv, ws=ws)[0] == 0       # no gamma, no bias
    assert rt_rule(117, [Y] + fwd[1:], iv, ws=ws)[0] != 0            # y over x
    assert rt_rule(117, fwd, [n, fin, fo, 3, 2], ws=ws)[0] != 0      # wt
    assert rt_rule(117, fwd, [n, fin, fo, 0, 0], ws=ws)[0] != 0      # no block rows
    bwd = [0, W, W + fo * 4, W + fo * 4 + Y, W + fo * 4 + Y + X, W + fo * 4 + Y + X + R]
    assert rt_rule(118, bwd, iv, ws=ws)[0] == 0
    assert rt_rule(118, [bwd[3]] + bwd[1:], iv, ws=ws)[0] != 0       # dw over x
    assert rt_rule(118, bwd[:5] + [(1 << 16) - fin * 4], iv, ws=ws)[0] == 0
    assert rt_rule(118, bwd[:5] + [(1 << 16) - fin * 4 + 4], iv, ws=ws)[0] != 0   # gamma past the arena
