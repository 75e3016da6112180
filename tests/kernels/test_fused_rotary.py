"""Rotary position embedding fused (issue 54): port_rotary_forward/backward against float64 autograd of
x cos + rotate_half(x) sin, against the plain members in their order (the same bits), in place, tables shared by the
batch or one per sample, refusals, equal bits at 1/2/3 threads and port-rt's call rule (ids 115-116)."""
import pytest
import torch

from port.exec import capi
from port.exec.capi import PORT_OK

from checked import rt_rule

raw = capi.raw


def _call(fn, out, x, c, s):
    n, heads, seq, d = x.shape
    return fn(out.data_ptr(), x.data_ptr(), c.data_ptr(), s.data_ptr(), n, heads, seq, d, c.shape[0])


def _fwd(x, c, s):
    y = torch.empty_like(x)
    assert _call(raw.port_rotary_forward, y, x, c, s) == PORT_OK
    return y


def _bwd(dy, c, s):
    dx = torch.empty_like(dy)
    assert _call(raw.port_rotary_backward, dx, dy, c, s) == PORT_OK
    return dx


def _rotate_half(v):
    h = v.shape[-1] // 2
    return torch.cat((-v[..., h:], v[..., :h]), -1)


def _tables(table_n, seq, d, g):
    """cos and sin of position x frequency, as Llama builds them (each frequency twice), [table_n, 1, seq, d]."""
    pos = torch.arange(seq, dtype=torch.float64)[None, :, None] + torch.arange(table_n)[:, None, None] * 3.0
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.cat((pos * inv, pos * inv), -1) + 0.1 * torch.rand(table_n, seq, d, generator=g, dtype=torch.float64)
    return ang.cos().float()[:, None], ang.sin().float()[:, None]


@pytest.mark.parametrize("shape,table_n", [((3, 5, 7, 6), 1), ((2, 3, 9, 10), 2), ((1, 1, 1, 2), 1),
                                           ((4, 2, 33, 16), 4)])
def test_rotary_matches_float64_autograd_and_the_plain_members(shape, table_n):
    g = torch.Generator().manual_seed(sum(shape))
    x, dy = torch.randn(shape, generator=g) * 3, torch.randn(shape, generator=g)
    c, s = _tables(table_n, shape[2], shape[3], g)
    y, dx = _fwd(x, c, s), _bwd(dy, c, s)
    x64 = x.double().requires_grad_()
    y64 = x64 * c.double() + _rotate_half(x64) * s.double()
    y64.backward(dy.double())
    torch.testing.assert_close(y.double(), y64.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dx.double(), x64.grad, rtol=1e-6, atol=1e-6)
    # the plain chain in float32, operation by operation: mul, narrow, neg, cat, mul, add (and its gradient ops)
    assert torch.equal(y, x * c + _rotate_half(x) * s)
    h = shape[3] // 2
    v = dy * s
    assert torch.equal(dx, dy * c + torch.cat((v[..., h:], -v[..., :h]), -1))


def test_rotary_in_place_and_refusals():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, 8, generator=g)
    c, s = _tables(1, 5, 8, g)
    y, dx = _fwd(x, c, s), _bwd(x, c, s)
    z = x.clone()
    assert _call(raw.port_rotary_forward, z, z, c, s) == PORT_OK and torch.equal(z, y)
    z = x.clone()
    assert _call(raw.port_rotary_backward, z, z, c, s) == PORT_OK and torch.equal(z, dx)
    out = torch.empty_like(x)
    f = raw.port_rotary_forward
    p = (out.data_ptr(), x.data_ptr(), c.data_ptr(), s.data_ptr())
    assert f(*p, 2, 3, 5, 7, 1) == capi.PORT_ERR_SHAPE            # odd rotary dim
    assert f(*p, 2, 3, 5, 8, 3) == capi.PORT_ERR_SHAPE            # tables for 3 samples, batch of 2
    assert f(*p, 0, 3, 5, 8, 1) == capi.PORT_ERR_SHAPE
    assert f(out.data_ptr(), x.data_ptr(), None, s.data_ptr(), 2, 3, 5, 8, 1) == capi.PORT_ERR_NULL


def test_rotary_same_bits_at_1_2_3_threads():
    g = torch.Generator().manual_seed(5)
    x, dy = torch.randn(8, 4, 128, 64, generator=g), torch.randn(8, 4, 128, 64, generator=g)
    c, s = _tables(8, 128, 64, g)
    prev, outs = capi.get_num_threads(), []
    try:
        for t in (1, 2, 3):
            capi.set_num_threads(t)
            outs.append((_fwd(x, c, s), _bwd(dy, c, s)))
    finally:
        capi.set_num_threads(prev)
    for o in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], o))


def test_port_rt_call_rule_of_rotary_ids_115_116():
    """ids 115 (y, x, cos, sin) and 116 (dx, dy, cos, sin): x n*heads*seq*d floats, the tables table_n*seq*d, the
    output over its input allowed (in place), over a table not; d even, table_n 1 or n."""
    assert raw.port_rt_kernel_name(115).decode() == "port_rotary_forward"
    assert raw.port_rt_kernel_name(116).decode() == "port_rotary_backward"
    iv = [2, 3, 5, 8, 1]                          # 240 floats, tables 40 floats
    X, T = 240 * 4, 40 * 4
    ok = [0, X, 2 * X, 2 * X + T]
    for k in (115, 116):
        assert rt_rule(k, ok, iv)[0] == 0
        assert rt_rule(k, [0, 0, 2 * X, 2 * X + T], iv)[0] == 0         # in place
        assert rt_rule(k, [0, X, 8, 2 * X + T], iv)[0] != 0              # cos under the output
        assert rt_rule(k, [0, X, 2 * X, (1 << 16) - T + 4], iv)[0] != 0  # sin past the arena
        assert rt_rule(k, ok, [2, 3, 5, 7, 1])[0] != 0                   # odd d
        rc, why = rt_rule(k, ok, [2, 3, 5, 8, 3])
        assert rc != 0 and "iv[4]" in why
        assert rt_rule(k, [0, X, 2 * X, 2 * X + 2 * T], [2, 3, 5, 8, 2])[0] == 0   # a table per sample
