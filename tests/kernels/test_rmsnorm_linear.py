"""RMSNorm + linear fused (issue 54): port_rmsnorm_stats, port_rmsnorm_linear_forward and _backward_weight against
float64 autograd of rms_norm -> linear on odd shapes (gamma or none, bias or none, W [out, in] or stored [in, out]),
against the plain members port_rmsnorm_forward -> port_linear_* (the same bits with one block of rows; within float
rounding with smaller blocks), equal bits at 1/2/3 threads, refusals and port-rt's call rule (ids 114, 117, 118);
the same for port_rmsnorm_linears_forward / _backward_weight (all k linears reading one norm in one call, ids 119,
131) and their plain references."""
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


# ---- all the linears reading one norm in one call: port_rmsnorm_linears_forward / _backward_weight (ids 119, 131)

def _arr(ts, ctype=ctypes.c_void_p):
    a = (ctype * len(ts))(*[_p(t) for t in ts])
    return a, ctypes.addressof(a)


def _multi_fwd(x, g, ws_, bs, block, wt=False, ref=False):
    n, fin = x.shape
    outs = [w.shape[1] if wt else w.shape[0] for w in ws_]
    r, ys = torch.empty(n), [torch.empty(n, o) for o in outs]
    nb = raw.port_rmsnorm_linear_workspace_bytes(n, fin, n if ref else block)
    ws = torch.empty(max(1, nb // 4))
    (ya, yp), (wa, wp), (ba, bp) = _arr(ys), _arr(ws_), _arr(bs)
    oa = (ctypes.c_int64 * len(outs))(*outs)
    f = raw.port_rmsnorm_linears_forward_ref if ref else raw.port_rmsnorm_linears_forward
    assert f(r.data_ptr(), yp, x.data_ptr(), _p(g), wp, bp, ctypes.addressof(oa), len(ws_), n, fin,
             ctypes.c_float(EPS), block, int(wt), ws.data_ptr(), nb) == PORT_OK
    return r, ys


def _multi_bwd_w(dys, x, r, g, bias, block, wt=False, ref=False):
    n, fin = x.shape
    outs = [d.shape[1] for d in dys]
    dw = [torch.zeros((fin, o) if wt else (o, fin)) for o in outs]
    db = [torch.zeros(o) if bb else None for o, bb in zip(outs, bias)]
    nb = raw.port_rmsnorm_linear_workspace_bytes(n, fin, n if ref else block)
    ws = torch.empty(max(1, nb // 4))
    (_a, dwp), (_b, dbp), (_c, dyp) = _arr(dw), _arr(db), _arr(dys)
    oa = (ctypes.c_int64 * len(outs))(*outs)
    f = raw.port_rmsnorm_linears_backward_weight_ref if ref else raw.port_rmsnorm_linears_backward_weight
    assert f(dwp, dbp, dyp, x.data_ptr(), r.data_ptr(), _p(g), ctypes.addressof(oa), len(dys), n, fin, block,
             int(wt), ws.data_ptr(), nb) == PORT_OK
    return dw, db


MULTI = [(7, 37, (5, 9), (True, False), True, False), (300, 37, (17, 4, 11), (False, False, False), False, False),
         (130, 37, (9, 33), (True, True), False, True), (1, 3, (1, 2, 3), (True, False, True), True, False),
         (513, 40, (8, 16, 24), (False, True, False), True, True)]


@pytest.mark.parametrize("n,fin,outs,bias,gamma,wt", MULTI)
def test_rmsnorm_linears_match_float64_autograd_and_the_plain_members(n, fin, outs, bias, gamma, wt):
    """k = 2 and 3 linears (each with or without a bias), gamma or none, W [out, in] or [in, out], rows not a multiple
    of the block: float64 autograd of rms_norm -> the linears; the plain members (the _ref kernels: rms_norm then
    each linear on all rows) bit for bit with one block, the per-block rows of the plain GEMM with smaller ones."""
    gen = torch.Generator().manual_seed(n * 11 + fin + len(outs))
    x = torch.randn(n, fin, generator=gen) * 2
    g = torch.rand(fin, generator=gen) + 0.5 if gamma else None
    ws_ = [torch.randn((fin, o) if wt else (o, fin), generator=gen) * 0.3 for o in outs]
    bs = [torch.randn(o, generator=gen) if bb else None for o, bb in zip(outs, bias)]
    dys = [torch.randn(n, o, generator=gen) for o in outs]
    x64 = x.double().requires_grad_()
    w64 = [w.double().requires_grad_() for w in ws_]
    b64 = [b.double().requires_grad_() if b is not None else None for b in bs]
    y64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * (g.double() if gamma else 1.0)
    o64 = [y64 @ (w if wt else w.T) + (b if b is not None else 0.0) for w, b in zip(w64, b64)]
    torch.autograd.backward(o64, [d.double() for d in dys])
    r_ref, y_ref = _multi_fwd(x, g, ws_, bs, 1, wt, ref=True)
    dw_ref, db_ref = _multi_bwd_w(dys, x, r_ref, g, bias, 1, wt, ref=True)
    yn, r_plain = _plain_norm(x, g)
    assert torch.equal(r_ref, r_plain)
    for i in range(len(outs)):          # the reference is the plain members
        assert torch.equal(y_ref[i], linear_forward(yn, ws_[i], bs[i], wt=wt))
        pdw, pdb = linear_backward_weight(dys[i], yn, bias=bias[i], wt=wt)
        assert torch.equal(dw_ref[i], pdw) and (not bias[i] or torch.equal(db_ref[i], pdb))
    for block in (1, 64, 256, n, n + 3):
        r, ys = _multi_fwd(x, g, ws_, bs, block, wt)
        dw, db = _multi_bwd_w(dys, x, r, g, bias, block, wt)
        assert torch.equal(r, r_plain)
        for i in range(len(outs)):
            torch.testing.assert_close(ys[i].double(), o64[i].detach(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(dw[i].double(), w64[i].grad, rtol=1e-5, atol=1e-4)
            if bias[i]:
                torch.testing.assert_close(db[i].double(), b64[i].grad, rtol=1e-5, atol=1e-4)
            else:
                assert db[i] is None
            for r0 in range(0, n, block):   # each block's rows: the plain GEMM on those rows
                rows = slice(r0, r0 + block)
                assert torch.equal(ys[i][rows], linear_forward(yn[rows].contiguous(), ws_[i], bs[i], wt=wt))
            if block >= n:                  # one block: the plain members' bits
                assert torch.equal(ys[i], y_ref[i]) and torch.equal(dw[i], dw_ref[i])
                assert not bias[i] or torch.equal(db[i], db_ref[i])


def test_rmsnorm_linears_equal_the_per_linear_calls_and_same_bits_at_1_2_3_threads():
    """The one call equals port_rmsnorm_stats + one port_rmsnorm_linear_* per linear bit for bit at any block; the
    same bits at 1/2/3 threads."""
    gen = torch.Generator().manual_seed(5)
    n, fin, outs = 333, 96, (80, 48, 64)
    x, g = torch.randn(n, fin, generator=gen), torch.rand(fin, generator=gen) + 0.5
    ws_ = [torch.randn(o, fin, generator=gen) for o in outs]
    bs = [torch.randn(80, generator=gen), None, torch.randn(64, generator=gen)]
    dys = [torch.randn(n, o, generator=gen) for o in outs]
    prev, got = capi.get_num_threads(), []
    try:
        for t in (1, 2, 3):
            capi.set_num_threads(t)
            r, ys = _multi_fwd(x, g, ws_, bs, 128)
            dw, db = _multi_bwd_w(dys, x, r, g, (True, False, True), 128)
            got.append([r, *ys, *dw, db[0], db[2]])
            r1 = _stats(x)
            assert torch.equal(r, r1)
            for i in range(3):
                assert torch.equal(ys[i], _fwd(x, r, g, ws_[i], bs[i], 128))
                pdw, pdb = _bwd_w(dys[i], x, r, g, 128, bs[i] is not None)
                assert torch.equal(dw[i], pdw) and (pdb is None or torch.equal(db[i], pdb))
    finally:
        capi.set_num_threads(prev)
    for o in got[1:]:
        assert all(torch.equal(a, c) for a, c in zip(got[0], o))


def test_rmsnorm_linears_refusals():
    x, g = torch.randn(4, 6), None
    ws_ = [torch.randn(3, 6), torch.randn(2, 6)]
    nb = raw.port_rmsnorm_linear_workspace_bytes(4, 6, 2)
    ws, r = torch.empty(64), torch.empty(4)
    ys = [torch.empty(4, 3), torch.empty(4, 2)]
    (_y, yp), (_w, wp) = _arr(ys), _arr(ws_)
    oa = (ctypes.c_int64 * 4)(3, 2, 0, 5)
    f = raw.port_rmsnorm_linears_forward

    def call(k=2, out=None, eps=EPS, block=2, wsb=nb, w=wp, y=yp):
        return f(r.data_ptr(), y, x.data_ptr(), None, w, None, ctypes.addressof(out or oa), k, 4, 6,
                 ctypes.c_float(eps), block, 0, ws.data_ptr(), wsb)
    assert call() == PORT_OK
    assert call(wsb=nb - 4) == capi.PORT_ERR_WORKSPACE
    assert call(k=0) == call(k=4) == capi.PORT_ERR_ARG               # 1..PORT_RMSLIN_MAX_LINEARS linears
    assert call(k=3) == capi.PORT_ERR_SHAPE                          # out[2] = 0
    assert call(eps=-1.0) == capi.PORT_ERR_ARG and call(block=0) == capi.PORT_ERR_SHAPE
    nul, nulp = _arr([ys[0], None])
    assert call(y=nulp) == capi.PORT_ERR_NULL and call(w=None) == capi.PORT_ERR_NULL
    dw = [torch.zeros(3, 6), torch.zeros(2, 6)]
    (_d, dwp), (_e, dyp) = _arr(dw), _arr(ys)
    b = raw.port_rmsnorm_linears_backward_weight
    assert b(dwp, None, dyp, x.data_ptr(), r.data_ptr(), None, ctypes.addressof(oa), 2, 4, 6, 2, 0, ws.data_ptr(),
             nb) == PORT_OK
    assert b(dwp, None, dyp, x.data_ptr(), r.data_ptr(), None, ctypes.addressof(oa), 2, 4, 6, 2, 0, ws.data_ptr(),
             nb - 1) == capi.PORT_ERR_WORKSPACE
    assert b(dwp, None, nulp, x.data_ptr(), r.data_ptr(), None, ctypes.addressof(oa), 2, 4, 6, 2, 0, ws.data_ptr(),
             nb) == capi.PORT_ERR_NULL
    assert raw.port_rmsnorm_linears_forward_ref(r.data_ptr(), yp, x.data_ptr(), None, wp, None, ctypes.addressof(oa),
                                                2, 4, 6, ctypes.c_float(EPS), 2, 0, ws.data_ptr(), nb) \
        == capi.PORT_ERR_WORKSPACE                                   # the reference takes the whole norm output


def test_port_rt_call_rule_of_rmsnorm_linears_ids_119_131():
    """119 (rstd, y[k], x, gamma, w[k], the masked biases; fv eps) and 131 (dw[k], the masked db, dy[k], x, rstd,
    gamma); iv n, in, k, block rows, wt, bias mask, out[k]: every extent from them, outputs over no input and no
    other output, at most 10 pointers, the workspace min(n, block rows) rows of x."""
    assert raw.port_rt_kernel_name(119).decode() == "port_rmsnorm_linears_forward"
    assert raw.port_rt_kernel_name(131).decode() == "port_rmsnorm_linears_backward_weight"
    n, fin, outs = 10, 6, (4, 3)
    X, R, G = n * fin * 4, n * 4, fin * 4
    iv = [n, fin, 2, 3, 0, 0b10, *outs]
    ws = 3 * fin * 4
    sizes = [R, n * 4 * 4, n * 3 * 4, X, G, 4 * fin * 4, 3 * fin * 4, 3 * 4]      # rstd y0 y1 x gamma w0 w1 b1
    fwd = [sum(sizes[:i]) for i in range(len(sizes))]
    assert fwd[-1] + sizes[-1] < 8192
    assert rt_rule(119, fwd, iv, ws=ws)[0] == 0
    assert rt_rule(119, fwd, iv, ws=ws - 4)[0] != 0                  # a workspace short of the kernel's
    assert rt_rule(119, fwd[:-1], iv[:5] + [0] + iv[6:], ws=ws)[0] == 0          # no bias
    assert rt_rule(119, fwd, iv[:5] + [0b100] + iv[6:], ws=ws)[0] != 0           # a bit past k
    assert rt_rule(119, fwd[:4] + [-1] + fwd[5:], iv, ws=ws)[0] == 0             # no gamma
    assert rt_rule(119, fwd[:2] + [fwd[1]] + fwd[3:], iv, ws=ws)[0] != 0         # two outputs overlap
    assert rt_rule(119, fwd[:1] + [fwd[3]] + fwd[2:], iv, ws=ws)[0] != 0         # y over x
    assert rt_rule(119, fwd[:7] + [(1 << 16) - 8], iv, ws=ws)[0] != 0           # the bias past the arena
    assert rt_rule(119, fwd, iv[:6] + [4, 0], ws=ws)[0] != 0                      # an out of 0
    assert rt_rule(119, fwd, [n, fin, 4, 3, 0, 0, 1, 1, 1, 1], ws=ws)[0] != 0    # k above 3
    assert rt_rule(119, fwd, iv[:4] + [2] + iv[5:], ws=ws)[0] != 0               # wt
    three = [n, fin, 3, 3, 0, 0b111, 1, 1, 1]                        # 3 + 6 + 3 = 12 pointers: refused
    assert rt_rule(119, list(range(0, 400, 40)), three, ws=ws)[0] != 0
    bsz = [4 * fin * 4, 3 * fin * 4, 3 * 4, n * 4 * 4, n * 3 * 4, X, R, G]      # dw0 dw1 db1 dy0 dy1 x rstd gamma
    bwd = [sum(bsz[:i]) for i in range(len(bsz))]
    assert rt_rule(131, bwd, iv, ws=ws)[0] == 0
    assert rt_rule(131, bwd[:2] + [bwd[3]] + bwd[3:], iv, ws=ws)[0] != 0        # db over dy
    assert rt_rule(131, bwd[:5] + [(1 << 16) - X + 4] + bwd[6:], iv, ws=ws)[0] != 0   # x past the arena
