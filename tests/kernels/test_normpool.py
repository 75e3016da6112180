"""Norms, pooling and resize of issue 54 (normpool.c, pool.c) against PyTorch autograd in float64: RMS norm, group
norm, max pool with dilation and ceil_mode, nearest / bilinear resize (align_corners both ways, sizes and scale
factors), adaptive average pooling to any size; refusals of bad parameters."""
import pytest
import torch
import torch.nn.functional as F

from conftest import close
from port.exec.capi import PORT_OK, raw


def _grads(fn, *ts, dy):
    """float64 forward and the gradients of (fn(*ts) * dy).sum() w.r.t. each t."""
    ts64 = [t.double().requires_grad_(True) for t in ts]
    y = fn(*ts64)
    return (y, *torch.autograd.grad(y, ts64, dy.double()))


@pytest.mark.parametrize("shape", [(3, 37), (2, 5, 64), (1, 1, 1, 130)])
@pytest.mark.parametrize("affine", [True, False])
def test_rmsnorm_equals_float64_autograd(K, shape, affine):
    x = torch.randn(shape) * 3 + 0.5
    w = torch.rand(shape[-1]) + 0.5 if affine else None
    eps = 1e-6
    y, rstd = K.rmsnorm_forward(x, w, eps)
    dy = torch.randn(shape)

    def ref(xx, *ww):
        return F.rms_norm(xx, (shape[-1],), ww[0] if ww else None, eps)
    y64, *g = _grads(ref, x, *([w] if affine else []), dy=dy)
    close(y, y64, what="rms y")
    close(rstd, torch.rsqrt(x.double().pow(2).mean(-1) + eps).reshape(-1), what="rstd")
    close(K.rmsnorm_backward_input(dy, x, rstd, w), g[0], what="rms dx")
    if affine:
        close(K.rmsnorm_backward_weight(dy, x, rstd), g[1], atol=1e-3, what="rms dw")
        acc = torch.ones(shape[-1])     # accumulates
        close(K.rmsnorm_backward_weight(dy, x, rstd, acc), g[1] + 1, atol=1e-3, what="rms dw +=")
    # dx may overwrite dy
    d2 = dy.clone()
    K.rmsnorm_backward_input(d2, x, rstd, w, out=d2)
    assert torch.equal(d2, K.rmsnorm_backward_input(dy, x, rstd, w))


@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 7), 3), ((3, 20, 9), 4), ((1, 17, 3, 3), 17), ((2, 8, 1, 1), 1)])
@pytest.mark.parametrize("affine", [True, False])
def test_groupnorm_equals_float64_autograd(K, shape, groups, affine):
    c = shape[1]
    x = torch.randn(shape) * 2 - 1
    w, b = (torch.rand(c) + 0.5, torch.randn(c)) if affine else (None, None)
    y, st = K.groupnorm_forward(x, groups, w, b, 1e-5)
    dy = torch.randn(shape)

    def ref(xx, *wb):
        return F.group_norm(xx, groups, *(wb if wb else (None, None)), eps=1e-5)
    y64, *g = _grads(ref, x, *([w, b] if affine else []), dy=dy)
    close(y, y64, what="gn y")
    close(K.groupnorm_backward_input(dy, x, st, groups, w), g[0], what="gn dx")
    if affine:
        dg, db = K.groupnorm_backward_weight(dy, x, st, groups)
        close(dg, g[1], atol=1e-3, what="gn dgamma")
        close(db, g[2], atol=1e-3, what="gn dbeta")
        dg2, db2 = K.groupnorm_backward_weight(dy, x, st, groups, bias=False)
        assert db2 is None and torch.equal(dg2, dg)


def test_norm_refusals():
    x, y, st = torch.randn(2, 6, 4), torch.empty(2, 6, 4), torch.empty(8)
    gn = raw.port_groupnorm_forward
    assert gn(y.data_ptr(), st.data_ptr(), x.data_ptr(), None, None, 2, 6, 4, 4, 1e-5) != PORT_OK   # 4 !| 6
    assert gn(y.data_ptr(), st.data_ptr(), x.data_ptr(), None, None, 2, 6, 4, 0, 1e-5) != PORT_OK
    assert gn(y.data_ptr(), st.data_ptr(), x.data_ptr(), None, None, 2, 6, 4, 2, 0.0) != PORT_OK    # eps > 0
    assert gn(y.data_ptr(), st.data_ptr(), x.data_ptr(), None, None, 2, 6, 4, 2, float("nan")) != PORT_OK
    assert gn(y.data_ptr(), st.data_ptr(), x.data_ptr(), None, None, 2, 6, 4, 2, 1e-5) == PORT_OK
    assert raw.port_groupnorm_backward_weight(None, None, x.data_ptr(), x.data_ptr(), st.data_ptr(), 2, 6, 4,
                                              2) != PORT_OK
    r = torch.empty(12)
    rms = raw.port_rmsnorm_forward
    assert rms(y.data_ptr(), r.data_ptr(), x.data_ptr(), None, 12, 4, -1.0) != PORT_OK
    assert rms(y.data_ptr(), r.data_ptr(), x.data_ptr(), None, 12, 0, 1e-6) != PORT_OK
    assert rms(x.data_ptr(), r.data_ptr(), x.data_ptr(), None, 12, 4, 1e-6) != PORT_OK     # y over x
    assert rms(y.data_ptr(), r.data_ptr(), x.data_ptr(), None, 12, 4, 0.0) == PORT_OK


MAXPOOLS = [((2, 3, 9, 8), 3, 2, 1, 1, True), ((2, 3, 9, 8), (2, 3), (2, 1), (0, 1), (2, 1), False),
            ((1, 5, 10, 11), 3, 2, 0, (1, 2), True), ((2, 2, 7, 7), 2, 2, 0, 1, True),
            ((1, 3, 13, 12), 3, 2, 1, 2, False), ((1, 1, 6, 6), 3, 3, 1, 1, True)]


@pytest.mark.parametrize("shape,k,s,p,d,ceil", MAXPOOLS)
def test_maxpool_dilation_and_ceil_mode_equal_torch(K, shape, k, s, p, d, ceil):
    x = torch.randn(shape)
    kw = dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil)
    y_r, i_r = F.max_pool2d(x.double(), return_indices=True, **kw)
    y, idx = K.maxpool2d_forward(x, k, s, p, dilation=d, ceil_mode=ceil)
    assert y.shape == y_r.shape
    assert torch.equal(y.double(), y_r) and torch.equal(idx, i_r)
    dy = torch.randn(y.shape)
    y64, dx64 = _grads(lambda t: F.max_pool2d(t, **kw), x, dy=dy)
    close(K.maxpool2d_backward_input(dy, idx, x.shape, k, s, p, dilation=d, ceil_mode=ceil), dx64, what="dx")


# average pools with ceil_mode and count_include_pad=False (issue 52): odd shapes, stride 2, padding, a ceil-mode
# last window that hangs past the padded input (its divisor: the part inside it), rectangular windows
AVGPOOLS = [((2, 3, 9, 8), 3, 2, 1, True, False), ((2, 3, 9, 8), 3, 2, 1, True, True),
            ((2, 3, 9, 8), 3, 2, 1, False, False), ((1, 5, 10, 11), (3, 2), (2, 2), (1, 0), True, False),
            ((1, 5, 10, 11), (3, 2), (2, 2), (1, 0), True, True), ((2, 2, 7, 7), 2, 2, 0, True, True),
            ((1, 3, 13, 12), 3, 2, 1, False, False), ((1, 1, 6, 6), 3, 3, 1, True, False),
            ((3, 2, 5, 9), (2, 4), (2, 3), (1, 2), True, False)]


@pytest.mark.parametrize("shape,k,s,p,ceil,include", AVGPOOLS)
def test_avgpool_ceil_mode_and_count_include_pad_equal_torch(K, shape, k, s, p, ceil, include):
    x = torch.randn(shape)
    kw = dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil, count_include_pad=include)
    y_r = F.avg_pool2d(x.double(), **kw)
    y = K.avgpool2d_forward(x, k, s, p, ceil_mode=ceil, count_include_pad=include)
    assert y.shape == y_r.shape
    close(y, y_r, 1e-6, 1e-5, what="y")
    dy = torch.randn(y.shape)
    _, dx64 = _grads(lambda t: F.avg_pool2d(t, **kw), x, dy=dy)
    dx = K.avgpool2d_backward_input(dy, x.shape, k, s, p, ceil_mode=ceil, count_include_pad=include)
    close(dx, dx64, 1e-6, 1e-5, what="dx")


def test_avgpool_ceil_mode_changes_the_divisor(K):
    """The cases the plain average pool got wrong: a last window past the padded input (ceil mode) and padding
    left out of the divisor; the defaults give the old bits (sum * (1 / (kh kw)))."""
    x = torch.ones(1, 1, 5, 5)
    y = K.avgpool2d_forward(x, 2, 2, 0, ceil_mode=True)              # last window: 1 column, 1 row of input
    assert y.shape == (1, 1, 3, 3) and torch.equal(y, torch.ones(1, 1, 3, 3))
    y = K.avgpool2d_forward(x, 3, 2, 1, count_include_pad=False)
    assert torch.equal(y, torch.ones(1, 1, 3, 3))
    y = K.avgpool2d_forward(x, 3, 2, 1)
    assert y[0, 0, 0, 0] == torch.tensor(4.0) * (1.0 / torch.tensor(9.0)) and y[0, 0, 1, 1] == 1.0
    x = torch.randn(2, 3, 9, 8)
    ref = torch.empty(2, 3, 4, 3)
    for i in range(4):
        for j in range(3):
            s = torch.zeros(2, 3)
            for a in range(3):
                for b in range(3):
                    s = s + x[:, :, 2 * i + a, 2 * j + b]   # the kernel's order, in float32
            ref[:, :, i, j] = s * (1.0 / torch.tensor(9.0))
    assert torch.equal(K.avgpool2d_forward(x, 3, 2, 0), ref)


@pytest.mark.parametrize("ceil,include", [(True, False), (True, True), (False, False)])
def test_avgpool_ceil_mode_same_bits_at_any_thread_count(K, ceil, include):
    from port.exec import capi
    x = torch.randn(4, 16, 37, 35)
    dy = None
    outs = []
    before = capi.get_num_threads()
    try:
        for t in (1, 2, 3):
            capi.set_num_threads(t)
            y = K.avgpool2d_forward(x, 3, 2, 1, ceil_mode=ceil, count_include_pad=include)
            dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(5)) if dy is None else dy
            outs.append((y, K.avgpool2d_backward_input(dy, x.shape, 3, 2, 1, ceil_mode=ceil,
                                                       count_include_pad=include)))
    finally:
        capi.set_num_threads(before)
    assert outs[0][0].numel() * 9 > 32768   # above the kernel's parallel threshold
    for y, dx in outs[1:]:
        assert torch.equal(y, outs[0][0]) and torch.equal(dx, outs[0][1])


def test_pool_refusals():
    from port.exec.capi import Pool2dParams
    x = torch.randn(1, 1, 6, 6)
    y, idx = torch.empty(36), torch.empty(36, dtype=torch.int64)

    def mp(*extra):
        return raw.port_maxpool2d_forward(y.data_ptr(), idx.data_ptr(), x.data_ptr(),
                                          Pool2dParams(1, 1, 6, 6, 3, 3, 1, 1, 0, 0, 0, 0, *extra))
    assert mp(1, 1, 0) == PORT_OK and mp(0, 0, 1) == PORT_OK
    assert mp(-1, 1, 0) != PORT_OK and mp(1, 1, 2) != PORT_OK
    assert mp(3, 3, 0) != PORT_OK          # a dilated 3x3 window spans 7 > 6
    assert mp(1, 1, 0, 1) != PORT_OK       # exclude_pad: average pools only
    # average pools take no dilation; ceil mode and exclude_pad 0 or 1
    ap = raw.port_avgpool2d_forward
    assert ap(y.data_ptr(), x.data_ptr(), Pool2dParams(1, 1, 6, 6, 3, 3, 1, 1, 0, 0, 0, 0, 0, 0, 0)) == PORT_OK
    assert ap(y.data_ptr(), x.data_ptr(), Pool2dParams(1, 1, 6, 6, 3, 3, 1, 1, 0, 0, 0, 0, 2, 1, 0)) != PORT_OK
    assert ap(y.data_ptr(), x.data_ptr(), Pool2dParams(1, 1, 6, 6, 3, 3, 2, 2, 0, 0, 0, 0, 0, 0, 1, 1)) == PORT_OK
    assert ap(y.data_ptr(), x.data_ptr(), Pool2dParams(1, 1, 6, 6, 3, 3, 2, 2, 0, 0, 0, 0, 0, 0, 2)) != PORT_OK
    assert ap(y.data_ptr(), x.data_ptr(), Pool2dParams(1, 1, 6, 6, 3, 3, 2, 2, 0, 0, 0, 0, 0, 0, 0, 2)) != PORT_OK


RESIZES = [("nearest", dict(scale_factor=2)), ("nearest", dict(size=(7, 5))), ("nearest", dict(size=(3, 2))),
           ("nearest", dict(scale_factor=(1.5, 0.75))), ("nearest", dict(scale_factor=3)),
           ("bilinear", dict(scale_factor=2, align_corners=False)), ("bilinear", dict(size=(7, 9), align_corners=True)),
           ("bilinear", dict(size=(9, 4), align_corners=False)), ("bilinear", dict(size=(3, 3), align_corners=True)),
           ("bilinear", dict(scale_factor=(1.7, 0.6), align_corners=False)),
           ("bilinear", dict(size=(1, 1), align_corners=True)), ("bilinear", dict(size=(5, 6), align_corners=False))]


@pytest.mark.parametrize("mode,kw", RESIZES)
def test_upsample_equals_float64_autograd(K, mode, kw):
    x = torch.randn(2, 3, 5, 6)
    y_r = F.interpolate(x.double(), mode=mode, **kw)
    size = tuple(y_r.shape[2:])
    sf, ac = kw.get("scale_factor"), kw.get("align_corners", False)
    y = K.upsample2d_forward(x, size, mode, ac, sf)
    if mode == "nearest":
        assert torch.equal(y.double(), y_r)     # the same source pixels
    close(y, y_r, what="resize y")
    dy = torch.randn(y.shape)
    _, dx64 = _grads(lambda t: F.interpolate(t, mode=mode, **kw), x, dy=dy)
    close(K.upsample2d_backward_input(dy, x.shape, mode, ac, sf), dx64, what="resize dx")


def test_upsample_refusals():
    from port.exec.capi import Upsample2dParams
    x, y = torch.randn(60), torch.empty(240)

    def up(*a):
        return raw.port_upsample2d_forward(y.data_ptr(), x.data_ptr(), Upsample2dParams(1, 1, 6, 10, 12, 20, *a))
    assert up(0, 0, 0.5, 0.5) == PORT_OK and up(1, 1, 0.0, 0.0) == PORT_OK
    assert up(2, 0, 0.0, 0.0) != PORT_OK          # mode
    assert up(0, 1, 0.0, 0.0) != PORT_OK          # align_corners with nearest
    assert up(1, 2, 0.0, 0.0) != PORT_OK
    assert up(0, 0, -1.0, 0.5) != PORT_OK and up(0, 0, float("inf"), 0.5) != PORT_OK
    assert raw.port_upsample2d_forward(x.data_ptr(), x.data_ptr(), Upsample2dParams(1, 1, 6, 10, 6, 10, 0, 0)) \
        != PORT_OK      # y over x


@pytest.mark.parametrize("shape,size", [((2, 3, 7, 9), (3, 2)), ((1, 5, 6, 6), (6, 6)), ((2, 2, 5, 4), (7, 3)),
                                        ((1, 3, 13, 11), (4, 5)), ((2, 4, 1, 1), (2, 3))])
def test_adaptive_avgpool_equals_float64_autograd(K, shape, size):
    x = torch.randn(shape)
    y = K.adaptive_avgpool2d_forward(x, size)
    dy = torch.randn(y.shape)
    y64, dx64 = _grads(lambda t: F.adaptive_avg_pool2d(t, size), x, dy=dy)
    close(y, y64, what="adaptive y")
    close(K.adaptive_avgpool2d_backward_input(dy, x.shape), dx64, what="adaptive dx")
    assert raw.port_adaptive_avgpool2d_forward(y.data_ptr(), x.data_ptr(), *shape, 0, size[1]) != PORT_OK
