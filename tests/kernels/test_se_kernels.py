"""Squeeze-excitation fused (issue 54, h54-se): port_se_forward / _backward_weight / _backward_input against float64
autograd on odd shapes (odd C and H, W, batch 1 and 3) for the four activation pairs, equal bits to the plain
members' C kernels (the pool, the 1x1 convolutions as the plain plan runs them, the activations, the mul and its
gradient, the pool's gradient, the accumulate) at 1/2/3 threads on odd shapes (the convolutions' folded, slot and
per-image paths), refusals and the port-rt call rule of ids 111-113."""

import ctypes


import pytest
import torch
import torch.nn.functional as F

from port.exec import capi
from port.exec.capi import PORT_OK

from checked import rt_rule

raw = capi.raw
PAIRS = [("relu", "hardsigmoid"), ("silu", "sigmoid"), ("relu", "sigmoid"),   # MobileNetV3, EfficientNet, RegNet-Y
         ("silu", "hardsigmoid")]
ACT, GATE = {"relu": 0, "silu": 1}, {"sigmoid": 0, "hardsigmoid": 1}


def _ws(n, c, s, k):
    return torch.empty(max(1, raw.port_se_workspace_bytes(n, c, s, k) // 4))


def _fwd(x, w1, b1, w2, b2, act, gate):
    n, c, H, W = x.shape
    s = w1.shape[0]
    y, h, z, ws = torch.empty_like(x), torch.empty(n, s), torch.empty(n, c), _ws(n, c, s, 0)
    assert raw.port_se_forward(y.data_ptr(), h.data_ptr(), z.data_ptr(), x.data_ptr(), w1.data_ptr(), b1.data_ptr(),
                               w2.data_ptr(), b2.data_ptr(), n, c, s, H * W, ACT[act], GATE[gate], ws.data_ptr(),
                               ws.numel() * 4) == PORT_OK
    return y, h, z


def _bwd(dy, x, w1, w2, h, z, act, gate):
    n, c, H, W = x.shape
    s = w1.shape[0]
    dw1, db1, dw2, db2 = torch.zeros(s, c), torch.zeros(s), torch.zeros(c, s), torch.zeros(c)
    dh, dx, ws, wi = torch.empty(n, s), torch.empty_like(x), _ws(n, c, s, 1), _ws(n, c, s, 2)
    assert raw.port_se_backward_weight(dw1.data_ptr(), db1.data_ptr(), dw2.data_ptr(), db2.data_ptr(), dh.data_ptr(),
                                       dy.data_ptr(), x.data_ptr(), w2.data_ptr(), h.data_ptr(), z.data_ptr(), n, c,
                                       s, H * W, ACT[act], GATE[gate], ws.data_ptr(), ws.numel() * 4) == PORT_OK
    assert raw.port_se_backward_input(dx.data_ptr(), dy.data_ptr(), z.data_ptr(), w1.data_ptr(), dh.data_ptr(), n, c,
                                      s, H * W, GATE[gate], wi.data_ptr(), wi.numel() * 4) == PORT_OK
    return dx, dw1, db1, dw2, db2, dh


def _data(n, c, s, H, W, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, H, W, generator=g) * 2
    w1, b1 = torch.randn(s, c, generator=g) / c ** 0.5 * 3, torch.randn(s, generator=g)
    w2, b2 = torch.randn(c, s, generator=g) / s ** 0.5 * 3, torch.randn(c, generator=g)
    return x, w1, b1, w2, b2, torch.randn(n, c, H, W, generator=g)


def _reference(x, w1, b1, w2, b2, dy, act, gate):
    """float64 autograd of the plain chain: (y, h, z, dx, dw1, db1, dw2, db2)."""
    ts = [t.double().requires_grad_() for t in (x, w1, b1, w2, b2)]
    X, W1, B1, W2, B2 = ts
    h = F.conv2d(X.mean((2, 3), keepdim=True), W1[:, :, None, None], B1)
    z = F.conv2d(getattr(F, act)(h), W2[:, :, None, None], B2)
    y = X * (torch.sigmoid(z) if gate == "sigmoid" else F.hardsigmoid(z))
    y.backward(dy.double())
    return (y.detach(), h.detach().flatten(1), z.detach().flatten(1)) + tuple(t.grad for t in ts)


@pytest.mark.parametrize("act,gate", PAIRS)
@pytest.mark.parametrize("n,c,s,H,W", [(1, 5, 3, 7, 5), (3, 17, 5, 9, 11), (3, 33, 8, 1, 1), (2, 9, 2, 3, 13)])
def test_se_matches_float64_autograd(act, gate, n, c, s, H, W):
    x, w1, b1, w2, b2, dy = _data(n, c, s, H, W, seed=n * 100 + c)
    y, h, z = _fwd(x, w1, b1, w2, b2, act, gate)
    dx, dw1, db1, dw2, db2, _ = _bwd(dy, x, w1, w2, h, z, act, gate)
    ref = _reference(x, w1, b1, w2, b2, dy, act, gate)
    for got, want in zip((y, h, z, dx, dw1, db1, dw2, db2), ref):
        torch.testing.assert_close(got.double(), want.reshape(got.shape), rtol=1e-5, atol=1e-5)


def _fc(n, cin, cout):
    return capi.Conv2dParams(n, cin, 1, 1, cout, 1, 1, 1, 1, 0, 0, 1)


def _conv(entry, p, *ptrs):
    """a plain 1x1 conv call as the plain plan makes it: PORT_CONV_DIRECT (the C library's choice), its workspace"""
    ws = torch.empty(max(1, raw.port_conv2d_workspace_bytes(ctypes.byref(p), 2) // 4))
    assert getattr(raw, entry)(*ptrs, ctypes.byref(p), 2, ws.data_ptr(), ws.numel() * 4) == PORT_OK


def _plain(x, w1, b1, w2, b2, dy, act, gate, dw):
    """The plain chain, member by member, on the C kernels the plain plan calls: (y, h, z, dx, dw1, db1, dw2, db2,
    dh); the weight gradients accumulate into dw's four tensors (copied)."""
    n, c, H, W = x.shape
    s, hw, P = w1.shape[0], H * W, lambda t: t.data_ptr()
    pooled, h, a, z, g, y = (torch.empty(n, c), torch.empty(n, s), torch.empty(n, s), torch.empty(n, c),
                             torch.empty(n, c), torch.empty_like(x))
    f1, f2 = _fc(n, c, s), _fc(n, s, c)
    bp = capi.BinaryParams(2, 2, 2, 0)                    # mul, rank 2: g [n c, 1] (broadcast) * x [n c, hw]
    bp.dims[0], bp.dims[1] = n * c, hw
    assert raw.port_global_avgpool_forward(P(pooled), P(x), n, c, hw) == PORT_OK
    _conv("port_conv2d_forward", f1, P(h), P(pooled), P(w1), P(b1))
    assert getattr(raw, f"port_{act}_forward")(P(a), P(h), n * s) == PORT_OK
    _conv("port_conv2d_forward", f2, P(z), P(a), P(w2), P(b2))
    assert getattr(raw, f"port_{gate}_forward")(P(g), P(z), n * c) == PORT_OK
    assert raw.port_binary_forward(P(y), P(g), P(x), ctypes.byref(bp)) == PORT_OK
    dg, dxm, dz, da, dh, dm, dxp, dx = (torch.empty(n, c), torch.empty_like(x), torch.empty(n, c), torch.empty(n, s),
                                        torch.empty(n, s), torch.empty(n, c), torch.empty_like(x), torch.empty_like(x))
    dw1, db1, dw2, db2 = (t.clone() for t in dw)
    assert raw.port_binary_backward(P(dg), P(dxm), P(dy), P(g), P(x), ctypes.byref(bp), 0) == PORT_OK
    assert getattr(raw, f"port_{gate}_backward")(P(dz), P(dg), P(g if gate == "sigmoid" else z), n * c) == PORT_OK
    _conv("port_conv2d_backward_input", f2, P(da), P(dz), P(w2))
    _conv("port_conv2d_backward_weight", f2, P(dw2), P(db2), P(dz), P(a))
    assert getattr(raw, f"port_{act}_backward")(P(dh), P(da), P(a if act == "relu" else h), n * s) == PORT_OK
    _conv("port_conv2d_backward_input", f1, P(dm), P(dh), P(w1))
    _conv("port_conv2d_backward_weight", f1, P(dw1), P(db1), P(dh), P(pooled))
    assert raw.port_global_avgpool_backward_input(P(dxp), P(dm), n, c, hw) == PORT_OK
    assert raw.port_add(P(dx), P(dxm), P(dxp), dx.numel()) == PORT_OK
    return y, h, z, dx, dw1, db1, dw2, db2, dh


# (n, c, s, H, W): odd everything; batch 1 (the convolutions' per-image path), 3 (folded), 8 x 577 x 145 (slot path:
# over PORT_PAR_MIN_MACS), a 1x1 map, a map over PORT_PAR_MIN (the pool, the mul's gradient and dx in parallel)
PLAIN_SHAPES = [(1, 5, 3, 7, 5), (3, 37, 9, 7, 7), (3, 37, 9, 5, 3), (8, 577, 145, 7, 7), (2, 9, 2, 1, 1),
                (3, 67, 9, 29, 31)]


@pytest.mark.parametrize("act,gate", PAIRS)
@pytest.mark.parametrize("n,c,s,H,W", PLAIN_SHAPES)
def test_se_is_the_plain_members_chain_bit_for_bit(act, gate, n, c, s, H, W):
    """Every output of the fused calls (y, h, z, dx, the four weight gradients accumulated onto nonzero values, dh)
    equals the plain members' C kernels' bit for bit at 1, 2 and 3 threads."""
    x, w1, b1, w2, b2, dy = _data(n, c, s, H, W, seed=n + c)
    dw = (torch.full((s, c), 0.25), torch.full((s,), -0.5), torch.full((c, s), 0.75), torch.full((c,), 1.5))
    prev = capi.get_num_threads()
    try:
        for t in (1, 2, 3):
            capi.set_num_threads(t)
            want = _plain(x, w1, b1, w2, b2, dy, act, gate, dw)
            y, h, z = _fwd(x, w1, b1, w2, b2, act, gate)
            g1, g2, g3, g4 = (d.clone() for d in dw)
            dh, dx, ws, wi = torch.empty(n, s), torch.empty_like(x), _ws(n, c, s, 1), _ws(n, c, s, 2)
            assert raw.port_se_backward_weight(
                g1.data_ptr(), g2.data_ptr(), g3.data_ptr(), g4.data_ptr(), dh.data_ptr(), dy.data_ptr(), x.data_ptr(),
                w2.data_ptr(), h.data_ptr(), z.data_ptr(), n, c, s, H * W, ACT[act], GATE[gate], ws.data_ptr(),
                ws.numel() * 4) == PORT_OK
            assert raw.port_se_backward_input(dx.data_ptr(), dy.data_ptr(), z.data_ptr(), w1.data_ptr(), dh.data_ptr(),
                                              n, c, s, H * W, GATE[gate], wi.data_ptr(), wi.numel() * 4) == PORT_OK
            for name, got, exp in zip(("y", "h", "z", "dx", "dw1", "db1", "dw2", "db2", "dh"),
                                      (y, h, z, dx, g1, g2, g3, g4, dh), want):
                assert torch.equal(got, exp.reshape(got.shape)), (name, t)
    finally:
        capi.set_num_threads(prev)


def test_se_same_bits_at_1_2_3_threads_and_dx_in_place():
    n, c, s, H, W = 3, 67, 9, 29, 31                   # over PORT_PAR_MIN: every loop runs parallel
    x, w1, b1, w2, b2, dy = _data(n, c, s, H, W, seed=3)
    prev, outs = capi.get_num_threads(), []
    try:
        for t in (1, 2, 3):
            capi.set_num_threads(t)
            for act, gate in PAIRS:
                y, h, z = _fwd(x, w1, b1, w2, b2, act, gate)
                outs.append((t, (y, h, z) + _bwd(dy, x, w1, w2, h, z, act, gate)))
    finally:
        capi.set_num_threads(prev)
    k = len(PAIRS)
    for i, (t, o) in enumerate(outs[k:]):
        assert all(torch.equal(a, b) for a, b in zip(outs[i % k][1], o)), t
    y, h, z, dx, _, _, _, _, dh = outs[0][1]
    g, wi = dy.clone(), _ws(n, c, s, 2)                # dx over dy
    assert raw.port_se_backward_input(g.data_ptr(), g.data_ptr(), z.data_ptr(), w1.data_ptr(), dh.data_ptr(), n, c,
                                      s, H * W, GATE["hardsigmoid"], wi.data_ptr(), wi.numel() * 4) == PORT_OK
    assert torch.equal(g, dx)
    assert raw.port_se_backward_input(g.data_ptr(), g.data_ptr(), z.data_ptr(), w1.data_ptr(), dh.data_ptr(), n, c,
                                      s, H * W, 1, wi.data_ptr(), wi.numel() * 4 - 4) == capi.PORT_ERR_WORKSPACE


def test_se_weight_gradients_accumulate_and_refusals():
    n, c, s, H, W = 2, 5, 3, 3, 3
    x, w1, b1, w2, b2, dy = _data(n, c, s, H, W)
    y, h, z = _fwd(x, w1, b1, w2, b2, "relu", "sigmoid")
    ws = _ws(n, c, s, 1)
    dw1, db1, dw2, db2, dh = torch.ones(s, c), torch.ones(s), torch.ones(c, s), torch.ones(c), torch.empty(n, s)
    args = lambda wsb: (dw1.data_ptr(), db1.data_ptr(), dw2.data_ptr(), db2.data_ptr(), dh.data_ptr(),  # noqa: E731
                        dy.data_ptr(), x.data_ptr(), w2.data_ptr(), h.data_ptr(), z.data_ptr(), n, c, s, H * W, 0, 0,
                        ws.data_ptr(), wsb)
    assert raw.port_se_backward_weight(*args(ws.numel() * 4)) == PORT_OK
    _, e1, f1, e2, f2, _ = _bwd(dy, x, w1, w2, h, z, "relu", "sigmoid")
    assert torch.equal(dw1, e1 + 1) and torch.equal(db1, f1 + 1) and torch.equal(dw2, e2 + 1) and torch.equal(db2, f2 + 1)
    assert raw.port_se_backward_weight(*args(ws.numel() * 4 - 4)) == capi.PORT_ERR_WORKSPACE
    # the overwriting form writes the four gradients (the 1s are gone): the accumulating form's result on zeros
    for t in (dw1, db1, dw2, db2):
        t.fill_(7.0)
    assert raw.port_se_backward_weight_overwrite(*args(ws.numel() * 4)) == PORT_OK
    assert torch.equal(dw1, e1) and torch.equal(db1, f1) and torch.equal(dw2, e2) and torch.equal(db2, f2)
    assert raw.port_se_backward_weight_overwrite(*args(ws.numel() * 4 - 4)) == capi.PORT_ERR_WORKSPACE
    wf = _ws(n, c, s, 0)
    fa = lambda yp, nn_, act, wsb: raw.port_se_forward(  # noqa: E731
        yp, h.data_ptr(), z.data_ptr(), x.data_ptr(), w1.data_ptr(), b1.data_ptr(), w2.data_ptr(), b2.data_ptr(), nn_,
        c, s, H * W, act, 0, wf.data_ptr(), wsb)
    ok = wf.numel() * 4
    assert fa(y.data_ptr(), n, 0, ok) == PORT_OK
    assert fa(x.data_ptr(), n, 0, ok) == capi.PORT_ERR_ALIAS
    assert fa(y.data_ptr(), 0, 0, ok) == capi.PORT_ERR_SHAPE
    assert fa(y.data_ptr(), n, 2, ok) == capi.PORT_ERR_ARG
    assert fa(None, n, 0, ok) == capi.PORT_ERR_NULL
    assert fa(y.data_ptr(), n, 0, ok - 4) == capi.PORT_ERR_WORKSPACE
    # [pooled | act(h) | the gate][conv] (forward), [dz | pooled][act(h)][the sigmoid | conv] (weights),
    # [dm][conv | the gate] (input); the fc convolutions' workspace folds the batch here: (c + s) n floats
    conv = (c + s) * n
    assert raw.port_se_workspace_bytes(n, c, s, 0) == (max(n * c, n * s) + conv) * 4
    assert raw.port_se_workspace_bytes(n, c, s, 1) == (n * c + n * s + max(conv, n * c)) * 4
    assert raw.port_se_workspace_bytes(n, c, s, 2) == (n * c + max(conv, n * c)) * 4
    assert raw.port_se_workspace_bytes(n, c, s, 3) == 0 and raw.port_se_workspace_bytes(0, c, s, 0) == 0


def _rule(kernel, ptrs, iv, arena=1 << 16, ws=0):
    return rt_rule(kernel, ptrs, iv, arena, ws)


def test_port_rt_call_rule_of_se_ids_111_113():
    """111 (y, h, z, x, w1, b1, w2, b2), 112 and 132 (dw1, db1, dw2, db2, dh, dy, x, w2, h, z), 113 (dx, dy, z, w1, dh; dx may
    be dy); iv n, c, s, hw, act, gate; every operand inside the arena, the forward's and 112's workspace the
    kernel's query, no output over an input but dx over dy."""
    n, c, s, hw, B = 2, 5, 3, 9, 400
    iv = (n, c, s, hw, 1, 1)
    assert [raw.port_rt_kernel_name(k).decode() for k in (111, 112, 113, 132)] == [
        "port_se_forward", "port_se_backward_weight", "port_se_backward_input", "port_se_backward_weight_overwrite"]
    fwd_ws, bwd_ws, in_ws = (raw.port_se_workspace_bytes(n, c, s, k) for k in range(3))
    at = [i * B for i in range(10)]
    assert _rule(111, at[:8], iv, ws=fwd_ws)[0] == 0
    assert _rule(111, at[:8], iv, ws=fwd_ws - 4)[0] != 0           # workspace short of the query
    assert _rule(111, at[:8], iv)[0] != 0                            # no workspace
    assert _rule(112, at, iv, ws=bwd_ws)[0] == 0
    assert _rule(132, at, iv, ws=bwd_ws)[0] == 0
    assert _rule(132, at, iv, ws=bwd_ws - 4)[0] != 0
    assert _rule(132, at[:4] + at[5:6] + at[5:], iv, ws=bwd_ws)[0] != 0   # dh over dy
    assert _rule(113, at[:5], iv, ws=in_ws)[0] == 0
    assert _rule(113, at[:5], iv, ws=in_ws - 4)[0] != 0
    assert _rule(113, [0, 0] + at[2:5], iv, ws=in_ws)[0] == 0        # dx in place over dy
    assert _rule(113, [0, B, 0, 3 * B, 4 * B], iv, ws=in_ws)[0] != 0   # dx over z
    assert _rule(111, [0, 0] + at[2:8], iv, ws=fwd_ws)[0] != 0       # h over y
    assert _rule(111, at[:8], (n, c, s, hw, 2, 0), ws=fwd_ws)[0] != 0   # act 2
    assert _rule(111, at[:8], (n, c, s, hw, 0, 2), ws=fwd_ws)[0] != 0   # gate 2
    assert _rule(111, at[:8], (n, 0, s, hw, 0, 0), ws=fwd_ws)[0] != 0   # c 0
    assert _rule(111, at[:7] + [(1 << 16) - 8], iv, ws=fwd_ws)[0] != 0   # b2 past the arena
