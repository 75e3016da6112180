"""SwiGLU fused (issue 54, h54-fused): port_swiglu_forward/backward against float64 autograd, against the plain
members (silu then mul: the same bits), refusals and equal bits at 1/2/3 threads."""
import pytest
import torch
import torch.nn.functional as F

from port.exec import capi
from port.exec.capi import PORT_OK

from checked import rt_rule

raw = capi.raw


def _fwd(a, b):
    y = torch.empty_like(a)
    assert raw.port_swiglu_forward(y.data_ptr(), a.data_ptr(), b.data_ptr(), a.numel()) == PORT_OK
    return y


def _bwd(dy, a, b):
    da, db = torch.empty_like(a), torch.empty_like(b)
    assert raw.port_swiglu_backward(da.data_ptr(), db.data_ptr(), dy.data_ptr(), a.data_ptr(), b.data_ptr(),
                                    a.numel()) == PORT_OK
    return da, db


@pytest.mark.parametrize("shape", [(3, 7, 11), (1, 5), (4097,)])
def test_swiglu_matches_float64_autograd_and_plain_members(shape):
    g = torch.Generator().manual_seed(sum(shape))
    a, b, dy = (torch.randn(shape, generator=g) * 4 for _ in range(3))
    y = _fwd(a, b)
    da, db = _bwd(dy, a, b)
    a64, b64 = a.double().requires_grad_(), b.double().requires_grad_()
    y64 = F.silu(a64) * b64
    y64.backward(dy.double())
    torch.testing.assert_close(y.double(), y64.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(da.double(), a64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(db.double(), b64.grad, rtol=1e-5, atol=1e-5)
    # the plain members, as PORT runs them unfused: port_silu_forward, a product, their backward
    s = torch.empty_like(a)
    assert raw.port_silu_forward(s.data_ptr(), a.data_ptr(), a.numel()) == PORT_OK
    assert torch.equal(y, s * b)
    ga, da_plain = dy * b, torch.empty_like(a)
    assert raw.port_silu_backward(da_plain.data_ptr(), ga.data_ptr(), a.data_ptr(), a.numel()) == PORT_OK
    assert torch.equal(da, da_plain) and torch.equal(db, dy * s)


def test_swiglu_in_place_gradient_and_refusals():
    a, b, dy = torch.randn(3, 50), torch.randn(3, 50), torch.randn(3, 50)
    da, db = _bwd(dy, a, b)
    g = dy.clone()
    db2 = torch.empty_like(b)
    assert raw.port_swiglu_backward(g.data_ptr(), db2.data_ptr(), g.data_ptr(), a.data_ptr(), b.data_ptr(),
                                    a.numel()) == PORT_OK
    assert torch.equal(g, da) and torch.equal(db2, db)
    y = torch.empty_like(a)
    assert raw.port_swiglu_forward(a.data_ptr(), a.data_ptr(), b.data_ptr(), a.numel()) == capi.PORT_ERR_ALIAS
    assert raw.port_swiglu_forward(y.data_ptr(), a.data_ptr(), b.data_ptr(), -1) == capi.PORT_ERR_SHAPE
    assert raw.port_swiglu_forward(y.data_ptr(), a.data_ptr(), None, a.numel()) == capi.PORT_ERR_NULL
    assert raw.port_swiglu_backward(da.data_ptr(), da.data_ptr(), dy.data_ptr(), a.data_ptr(), b.data_ptr(),
                                    a.numel()) == capi.PORT_ERR_ALIAS


def test_swiglu_same_bits_at_1_2_3_threads():
    g = torch.Generator().manual_seed(5)
    a, b, dy = (torch.randn(64, 1031, generator=g) for _ in range(3))
    prev, outs = capi.get_num_threads(), []
    try:
        for t in (1, 2, 3):
            capi.set_num_threads(t)
            outs.append((_fwd(a, b), *_bwd(dy, a, b)))
    finally:
        capi.set_num_threads(prev)
    for o in outs[1:]:
        assert all(torch.equal(x, y) for x, y in zip(outs[0], o))


def _rule(kernel, ptrs, count):
    return rt_rule(kernel, ptrs, [count])


def test_port_rt_call_rule_of_swiglu_ids_135_136():
    """port-rt ids 135 (forward: y, a, b) and 136 (backward: da, db, dy, a, b; da or db may be dy): each operand
    count floats inside the arena, no output over another operand but the allowed in-place gradient."""
    n, B = 100, 400
    assert capi.raw.port_rt_kernel_name(135).decode() == "port_swiglu_forward"
    assert capi.raw.port_rt_kernel_name(136).decode() == "port_swiglu_backward"
    assert _rule(135, [0, B, 2 * B], n)[0] == 0
    assert _rule(136, [0, B, 2 * B, 3 * B, 4 * B], n)[0] == 0
    assert _rule(136, [0, B, 0, 3 * B, 4 * B], n)[0] == 0          # da in place over dy
    assert _rule(135, [0, 0, 2 * B], n)[0] != 0                     # y over a
    assert _rule(136, [0, B, 2 * B, 0, 4 * B], n)[0] != 0           # da over a
    assert _rule(136, [0, 0, 2 * B, 3 * B, 4 * B], n)[0] != 0       # da over db
    assert _rule(135, [0, B, (1 << 16) - 8], n)[0] != 0             # b past the arena
    assert _rule(135, [0, B, 2 * B], 0)[0] != 0                     # count 0
