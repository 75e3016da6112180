"""Issue 54's generic unary kernel (port_unary_forward/backward: neg, exp, rsqrt, cos, sin, pow by a scalar, abs,
x + c) and shape copies (port_slice_copy: narrow / select / split / cat and their gradients; port_expand) vs
PyTorch float64 autograd on odd shapes, and their refusals of bad parameters."""
import ctypes
import math

import pytest
import torch

from conftest import close
from port.exec import capi

UNARY = [("neg", 0.0, torch.neg), ("exp", 0.0, torch.exp), ("rsqrt", 0.0, torch.rsqrt), ("cos", 0.0, torch.cos),
         ("sin", 0.0, torch.sin), ("abs", 0.0, torch.abs), ("shift", 1e-6, lambda t: t + 1e-6),
         ("shift", -2.5, lambda t: t - 2.5)] + \
        [("pow_scalar", e, (lambda e: lambda t: t.pow(e))(e)) for e in (2.0, 3.0, -1.0, -2.0, 0.5, -0.5, 1.7, 0.0)]


def _x(kind, shape, g):
    x = torch.randn(shape, generator=g)
    if kind == "rsqrt" or (kind == "pow_scalar"):      # positive operands (non-integer powers, rsqrt)
        x = x.abs() + 0.1
    if kind in ("cos", "sin"):                         # rotary tables: angles up to a few hundred radians
        x = x * 100
    return x


@pytest.mark.parametrize("shape", [(3, 5, 7), (1,), (17, 33, 65)])    # the last crosses the parallel threshold
@pytest.mark.parametrize("kind,scalar,fn", UNARY, ids=[f"{k}{s}" for k, s, _ in UNARY])
def test_unary_forward_backward(K, kind, scalar, fn, shape):
    g = torch.Generator().manual_seed(7)
    x = _x(kind, shape, g)
    dy = torch.randn(shape, generator=g)
    x64 = x.double().requires_grad_()
    y64 = fn(x64)
    y64.backward(dy.double())
    y = K.unary_forward(kind, x, scalar)
    close(y, y64.detach(), 1e-6, 2e-6, kind)
    saves = capi.raw.port_unary_saves(capi.UNARY_OPS[kind])
    s = {0: None, 1: x, 2: y}[saves]
    close(K.unary_backward(kind, dy, s, scalar), x64.grad, 1e-5, 1e-5, kind)
    # in place: y over x, dx over dy
    xi, dyi = x.clone(), dy.clone()
    assert torch.equal(K.unary_forward(kind, xi, scalar, out=xi), y)
    assert torch.equal(K.unary_backward(kind, dyi, s, scalar, out=dyi), K.unary_backward(kind, dy, s, scalar))


def test_unary_matches_float32_torch_where_exact(K):
    """neg, abs, shift, x^2 and exp are the same bits as PyTorch's float32 kernels (exp within one ulp)."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 5
    for kind, s, fn in (("neg", 0.0, torch.neg), ("abs", 0.0, torch.abs), ("shift", 0.25, lambda t: t + 0.25),
                        ("pow_scalar", 2.0, lambda t: t.pow(2))):
        assert torch.equal(K.unary_forward(kind, x, s), fn(x)), kind
    torch.testing.assert_close(K.unary_forward("exp", x), torch.exp(x), rtol=2.5e-7, atol=0)


def test_unary_special_values(K):
    """pow at 0 and below 0, exponent 0 (x^0 = 1, gradient 0 everywhere), rsqrt(0) = inf: as PyTorch."""
    x = torch.tensor([0.0, -2.0, 2.0, float("inf"), -0.0])
    for e in (0.0, 2.0, 3.0, -1.0, 0.5, 1.7, -0.5):
        ours, ref = K.unary_forward("pow_scalar", x, e), x.pow(e)
        torch.testing.assert_close(ours, ref, equal_nan=True, rtol=1e-6, atol=0, msg=f"pow {e}")
    assert torch.equal(K.unary_backward("pow_scalar", torch.ones(5), x, 0.0), torch.zeros(5))
    assert torch.equal(K.unary_forward("rsqrt", torch.tensor([0.0, 4.0])), torch.tensor([float("inf"), 0.5]))


def test_unary_refusals(K):
    x, y = torch.randn(4), torch.empty(4)
    f, b = capi.raw.port_unary_forward, capi.raw.port_unary_backward
    assert f(y.data_ptr(), x.data_ptr(), 4, 8, 0.0) == capi.PORT_ERR_ARG          # unknown op
    assert f(y.data_ptr(), x.data_ptr(), 4, -1, 0.0) == capi.PORT_ERR_ARG
    assert f(y.data_ptr(), x.data_ptr(), 4, 5, float("nan")) == capi.PORT_ERR_ARG  # a scalar that is not finite
    assert f(y.data_ptr(), x.data_ptr(), 4, 7, float("inf")) == capi.PORT_ERR_ARG
    assert f(y.data_ptr(), x.data_ptr(), -1, 0, 0.0) == capi.PORT_ERR_SHAPE
    assert f(None, x.data_ptr(), 4, 0, 0.0) == capi.PORT_ERR_NULL
    assert b(y.data_ptr(), x.data_ptr(), None, 4, 1, 0.0) == capi.PORT_ERR_NULL    # exp's backward reads y
    assert b(y.data_ptr(), x.data_ptr(), None, 4, 0, 0.0) == capi.PORT_OK          # neg's reads nothing
    assert capi.raw.port_unary_saves(9) == -1


NARROWS = [((3, 7, 5), 1, 2, 4), ((6, 5), 0, 5, 1), ((2, 3, 17, 5), 2, 0, 17), ((4, 9), 1, 8, 1),
           ((1, 70000), 1, 3, 69000)]


@pytest.mark.parametrize("shape,dim,start,length", NARROWS)
def test_slice_copy_narrow_and_its_gradient(K, shape, dim, start, length):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=g)
    want = x.narrow(dim, start, length)
    y = K.slice_copy(torch.full(want.shape, 7.0), x, dim, 0, start, length, 0)
    assert torch.equal(y, want)
    x64 = x.double().requires_grad_()
    dy = torch.randn(want.shape, generator=g)
    x64.narrow(dim, start, length).backward(dy.double())
    dx = K.slice_copy(torch.full(shape, 7.0), dy, dim, start, 0, length, 1)   # fill: the rest of dx zeroed
    assert torch.equal(dx, x64.grad.float())


def test_slice_copy_cat_parts(K):
    """cat along every dim as one copy per input (fill 0 keeps the other parts), and its gradient's slices."""
    g = torch.Generator().manual_seed(4)
    for dim in range(3):
        sizes = (3, 1, 5)
        xs = [torch.randn([s if i == dim else (2, 4, 3)[i] for i in range(3)], generator=g) for s in sizes]
        want = torch.cat(xs, dim)
        y = torch.full(want.shape, float("nan"))
        off = 0
        for x, s in zip(xs, sizes):
            K.slice_copy(y, x, dim, off, 0, s, 0)
            off += s
        assert torch.equal(y, want), dim
        off = 0
        for x, s in zip(xs, sizes):
            assert torch.equal(K.slice_copy(torch.empty_like(x), want, dim, 0, off, s, 0), x)
            off += s


def test_slice_copy_refusals(K):
    x, y = torch.randn(2, 5, 3), torch.empty(2, 2, 3)
    P = lambda *v: ctypes.byref(K.slice_params(*v))     # noqa: E731
    sc = capi.raw.port_slice_copy
    assert sc(y.data_ptr(), x.data_ptr(), P(2, 3, 2, 5, 2, 0, 3, 0)) == capi.PORT_OK
    for bad in ((2, 3, 2, 5, 2, 0, 4, 0),        # x_start + len past nx
                (2, 3, 2, 5, 2, 1, 0, 0),        # y_start + len past ny
                (2, 3, 2, 5, 0, 0, 0, 0),        # len 0
                (0, 3, 2, 5, 2, 0, 0, 0),        # outer 0
                (2, 3, 2, 5, 2, -1, 0, 0),       # a negative start
                (2, 3, 2, 5, 2, 0, 0, 2),        # fill not 0/1
                (1 << 40, 1 << 40, 2, 5, 2, 0, 0, 0)):   # extents past 2^40 elements
        assert sc(y.data_ptr(), x.data_ptr(), P(*bad)) == capi.PORT_ERR_SHAPE, bad
    assert sc(x.data_ptr(), x.data_ptr(), P(2, 3, 5, 5, 2, 0, 3, 0)) == capi.PORT_ERR_ALIAS
    assert sc(None, x.data_ptr(), P(2, 3, 2, 5, 2, 0, 3, 0)) == capi.PORT_ERR_NULL
    assert sc(y.data_ptr(), x.data_ptr(), None) == capi.PORT_ERR_NULL


EXPANDS = [((1, 1, 8), (4, 1, 8)), ((5, 1), (5, 6)), ((3,), (2, 4, 3)), ((1, 3, 1, 2), (4, 3, 5, 2)),
           ((2, 1, 3, 1, 2, 1), (2, 4, 3, 5, 2, 3)), ((7,), (7,)), ((1,), (300, 301))]


@pytest.mark.parametrize("sx,sy", EXPANDS)
def test_expand_and_its_gradient(K, sx, sy):
    """port_expand vs Tensor.expand; the gradient (port_binary_backward's add sum) vs autograd."""
    g = torch.Generator().manual_seed(len(sy))
    x = torch.randn(sx, generator=g)
    assert torch.equal(K.expand(x, sy), x.expand(sy))
    x64 = x.double().requires_grad_()
    dy = torch.randn(sy, generator=g)
    x64.expand(sy).backward(dy.double())
    dx, _ = K.binary_backward("add_nd", dy, x, torch.zeros(()).expand(sy).contiguous(), want=(0,))
    close(dx, x64.grad, 1e-5, 1e-5)


def test_expand_refusals(K):
    x, y = torch.randn(3), torch.empty(4, 3)
    d = (ctypes.c_int64 * 6)(4, 3, 1, 1, 1, 1)
    e = capi.raw.port_expand
    assert e(y.data_ptr(), x.data_ptr(), 2, 1, d) == capi.PORT_OK and torch.equal(y, x.expand(4, 3))
    assert e(y.data_ptr(), x.data_ptr(), 0, 0, d) == capi.PORT_ERR_SHAPE
    assert e(y.data_ptr(), x.data_ptr(), 7, 0, d) == capi.PORT_ERR_SHAPE
    assert e(y.data_ptr(), x.data_ptr(), 2, 4, d) == capi.PORT_ERR_SHAPE       # a mask bit past the rank
    assert e(y.data_ptr(), y.data_ptr(), 2, 1, d) == capi.PORT_ERR_ALIAS
    d[1] = 0
    assert e(y.data_ptr(), x.data_ptr(), 2, 1, d) == capi.PORT_ERR_SHAPE
    assert math.prod([4, 3]) == y.numel()


def _rule(kernel, ptrs, iv, fv=()):
    """port_rt_call_check of one call record (arena 1 MiB, no persistent region): 0 or the refusal's field."""
    from port.exec.rtcall import kernel_ids
    r = capi.RtCall()
    r.kernel, r.op = kernel_ids()[kernel], 0
    for i in range(capi.RT_MAX_PTRS):
        r.ptr[i] = ptrs[i] if i < len(ptrs) else -1
    for i, v in enumerate(iv):
        r.iv[i] = v
    for i, v in enumerate(fv):
        r.fv[i] = v
    why = capi.RtCallProblem()
    return 0 if not capi.raw.port_rt_call_check(ctypes.byref(r), 1 << 20, 0, ctypes.byref(why)) else \
        why.field.decode()


def test_call_rule_of_the_unary_and_shape_kernels():
    """port-rt's call rule (rt_check.c) for ids 74-77: extents from the shape parameters, enums, finite scalars,
    in-place only where the kernel allows it."""
    u, ub, sc, ex = "port_unary_forward", "port_unary_backward", "port_slice_copy", "port_expand"
    assert _rule(u, (0, 4096), (100, 5), (1.5,)) == 0
    assert _rule(u, (0, 0), (100, 0)) == 0                       # in place
    assert _rule(u, (0, 200), (100, 0)) == "ptr[0]"              # a partial overlap
    assert _rule(u, (0, 4096), (100, 8)) == "iv[1]"              # unknown op
    assert _rule(u, (0, 4096), (0, 0)) == "iv[0]"                # count 0
    assert _rule(u, (0, 4096), (100, 5), (math.inf,)) == "fv[0]"
    assert _rule(u, (0, (1 << 20) - 200), (100, 0)) == "ptr[1]"  # past the arena
    assert _rule(ub, (0, 0, 4096), (100, 1)) == 0 and _rule(ub, (0, 4096, -1), (100, 0)) == 0
    assert _rule(ub, (0, 4096, 0), (100, 1)) == "ptr[0]"         # dx over the saved tensor
    ok = (2, 3, 2, 5, 2, 0, 3, 1)
    assert _rule(sc, (0, 4096), ok) == 0
    assert _rule(sc, (0, 40), ok) == "ptr[0]"                    # y [2, 2, 3] overlaps x
    assert _rule(sc, (0, 4096), (2, 3, 2, 5, 2, 1, 3, 1)) == "iv[5]"
    assert _rule(sc, (0, 4096), (2, 3, 2, 5, 2, 0, 4, 1)) == "iv[6]"
    assert _rule(sc, (0, 4096), (2, 3, 2, 5, 2, 0, 3, 2)) == "iv[7]"
    assert _rule(sc, (0, 4096), (2, 3, 2, 5, 0, 0, 3, 0)) == "iv[4]"
    assert _rule(sc, (0, 4096), (1 << 20, 3, 2, 5, 2, 0, 3, 1)) == "ptr[0]"   # extents past the arena
    assert _rule(ex, (0, 4096), (2, 1, 4, 3, 1, 1, 1, 1)) == 0
    assert _rule(ex, (0, 4096), (2, 4, 4, 3, 1, 1, 1, 1)) == "iv[1]"          # a mask bit past the rank
    assert _rule(ex, (0, 4096), (2, 1, 4, 3, 2, 1, 1, 1)) == "iv[4]"          # a dim past the rank not 1
    assert _rule(ex, (0, 4096), (7, 1, 4, 3, 1, 1, 1, 1)) == "iv[0]"
    assert _rule(ex, (0, 8), (2, 1, 4, 3, 1, 1, 1, 1)) == "ptr[0]"            # y [4, 3] over x [3]
