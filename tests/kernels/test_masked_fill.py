"""Issue 54's masked_fill (port_masked_fill and its plain reference; port-rt id 121): x where a boolean mask
broadcast to x's shape is false, a scalar where it is true; its gradient the same call on dy with 0. Against
torch.masked_fill (a select: exact) and float64 autograd, on odd shapes with the mask broadcast on every axis,
in place, at 1/2/3 threads, and its refusals."""
import ctypes

import pytest
import torch

from port.exec import capi

SHAPE = (3, 5, 7, 9)
# the mask broadcast along every subset of the axes (size 1 there), the full mask, and a scalar mask
MASKS = [tuple(1 if (b >> i) & 1 else SHAPE[i] for i in range(4)) for b in range(16)] + [(), (9,), (7, 1)]


@pytest.mark.parametrize("ms", MASKS, ids=lambda s: "x".join(map(str, s)) or "scalar")
@pytest.mark.parametrize("value", [float("-inf"), -3.5, 0.0, float("inf")])
def test_masked_fill_forward_and_gradient_equal_torch(K, ms, value):
    g = torch.Generator().manual_seed(len(ms) * 7 + sum(ms))
    x = torch.randn(SHAPE, generator=g)
    m = torch.rand(ms, generator=g) < 0.4
    want = x.masked_fill(m, value)
    assert torch.equal(K.masked_fill(x, m, value), want)
    assert torch.equal(K.masked_fill(x, m, value, reference=True), want)
    x64 = x.double().requires_grad_()
    dy = torch.randn(SHAPE, generator=g)
    x64.masked_fill(m, value).backward(dy.double())
    assert torch.equal(K.masked_fill(dy, m, 0.0).double(), x64.grad)          # dx = dy where the mask is false
    inplace = x.clone()
    K.masked_fill(inplace, m, value, out=inplace)
    assert torch.equal(inplace, want)


def test_masked_fill_same_bits_at_any_thread_count(K):
    """Rows split across threads above the parallel threshold (a [8, 4, 64, 64] score tensor and a causal
    [1, 1, 64, 64] mask)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 4, 64, 64, generator=g)
    m = torch.ones(64, 64, dtype=torch.bool).triu(1)[None, None]
    prev, outs = capi.get_num_threads(), []
    try:
        for t in (1, 2, 3):
            capi.set_num_threads(t)
            outs.append(K.masked_fill(x, m, float("-inf")))
    finally:
        capi.set_num_threads(prev)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    assert torch.equal(outs[0], x.masked_fill(m, float("-inf")))


def test_masked_fill_refusals():
    x, y, m = torch.randn(4, 3), torch.empty(4, 3), torch.zeros(4, 3, dtype=torch.bool)
    d = (ctypes.c_int64 * 6)(4, 3, 1, 1, 1, 1)
    f = capi.raw.port_masked_fill
    p = (y.data_ptr(), x.data_ptr(), m.data_ptr())
    assert f(*p, 2, 0, d, -1.0) == capi.PORT_OK and torch.equal(y, x)
    assert f(*p, 0, 0, d, 0.0) == capi.PORT_ERR_SHAPE
    assert f(*p, 7, 0, d, 0.0) == capi.PORT_ERR_SHAPE
    assert f(*p, 2, 4, d, 0.0) == capi.PORT_ERR_SHAPE                  # a broadcast bit past the rank
    assert f(*p, 2, 0, d, float("nan")) == capi.PORT_ERR_ARG
    assert f(x.data_ptr() + 4, x.data_ptr(), m.data_ptr(), 2, 0, d, 0.0) == capi.PORT_ERR_ALIAS   # partial overlap
    assert f(y.data_ptr(), x.data_ptr(), y.data_ptr(), 2, 0, d, 0.0) == capi.PORT_ERR_ALIAS       # y over the mask
    d[1] = 0
    assert f(*p, 2, 0, d, 0.0) == capi.PORT_ERR_SHAPE


def test_call_rule_of_masked_fill():
    """port-rt's rule (rt_check.c, id 121): the extents from the shape, the mask's bytes, the value not NaN,
    y = x allowed, other overlaps refused."""
    from test_shape_unary import _rule
    k = "port_masked_fill"
    iv = (2, 1, 64, 3, 1, 1, 1, 1)           # y, x [64, 3]; the mask [1, 3] (3 bytes)
    assert _rule(k, (0, 4096, 8192), iv, (float("-inf"),)) == 0
    assert _rule(k, (0, 0, 8192), iv, (0.0,)) == 0                   # in place
    assert _rule(k, (0, 100, 8192), iv, (0.0,)) == "ptr[0]"          # a partial overlap
    assert _rule(k, (0, 4096, 760), iv, (0.0,)) == "ptr[0]"          # the mask inside y
    assert _rule(k, (0, 4096, 8192), iv, (float("nan"),)) == "fv[0]"
    assert _rule(k, (0, 4096, 8192), (7, 0) + iv[2:]) == "iv[0]"
    assert _rule(k, (0, 4096, 8192), (2, 4) + iv[2:]) == "iv[1]"
    assert _rule(k, (0, 4096, 8192), iv[:4] + (2,) + iv[5:]) == "iv[4]"   # a dim past the rank must be 1
