"""Element-wise kernels, dropout and pooling vs PyTorch float64."""
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT, close, quick_subset
from port.exec import capi

SHAPES = [(3, 4, 7, 5), (1, 1, 1, 1), (2, 3, 5, 9)]


def _grad(fn, x, dy):
    x64 = x.double().requires_grad_()
    y = fn(x64)
    y.backward(dy.double())
    return y.detach(), x64.grad


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["relu", "relu6"])
def test_relu_family(K, name, shape):
    x = torch.randn(shape) * 5
    x.view(-1)[0] = 0.0  # boundary
    if x.numel() > 1:
        x.view(-1)[1] = 6.0
    dy = torch.randn(shape)
    fn = F.relu if name == "relu" else F.relu6
    y_r, dx_r = _grad(fn, x, dy)
    fwd, bwd = getattr(K, f"{name}_forward"), getattr(K, f"{name}_backward")
    y = fwd(x)
    close(y, y_r, 0, 0)
    close(bwd(dy, y), dx_r, 0, 0)
    # in place: output into the input buffer; backward from the output mask still valid
    xb = x.clone()
    yi = fwd(xb, inplace=True)
    assert yi.data_ptr() == xb.data_ptr()
    close(yi, y, 0, 0)
    dyb = dy.clone()
    dxi = bwd(dyb, yi, inplace=True)
    assert dxi.data_ptr() == dyb.data_ptr()
    close(dxi, dx_r, 0, 0)


@pytest.mark.parametrize("shape", SHAPES)
def test_hardswish(K, shape):
    x = torch.randn(shape) * 4
    flat = x.view(-1)
    for i, v in enumerate([-3.0, 3.0, 0.0][: flat.numel()]):
        flat[i] = v
    dy = torch.randn(shape)
    y_r, dx_r = _grad(F.hardswish, x, dy)
    y = K.hardswish_forward(x)
    close(y, y_r, 1e-6, 1e-6)
    close(K.hardswish_backward(dy, x), dx_r, 1e-6, 1e-6)
    dyb = dy.clone()
    close(K.hardswish_backward(dyb, x, inplace=True), dx_r, 1e-6, 1e-6)
    with pytest.raises(ValueError, match="out: output aliases x"):
        K.hardswish_forward(x, out=x)


@pytest.mark.parametrize("shape", SHAPES + [(2, 5, 33, 17)])      # the last one crosses the parallel threshold
@pytest.mark.parametrize("name", ["sigmoid", "hardsigmoid", "silu"])
def test_sigmoid_family(K, name, shape):
    """Forward and backward (sigmoid's from its output, hardsigmoid's and silu's from the input) against float64
    autograd, at the kinks (+-3), large magnitudes (the exp's range) and NaN; dx over dy and y over x in place."""
    torch.manual_seed(0)
    x = torch.randn(shape) * 6
    flat = x.view(-1)
    for i, v in enumerate([-3.0, 3.0, 0.0, 95.0, -120.0, 1e30, -1e30][: flat.numel()]):
        flat[i] = v
    dy = torch.randn(shape)
    fn = {"sigmoid": torch.sigmoid, "hardsigmoid": F.hardsigmoid, "silu": F.silu}[name]
    y_r, dx_r = _grad(fn, x, dy)
    fwd, bwd = getattr(K, f"{name}_forward"), getattr(K, f"{name}_backward")
    y = fwd(x)
    close(y, y_r, 2e-7, 1e-7)
    saved = y if name == "sigmoid" else x
    close(bwd(dy, saved), dx_r, 2e-6, 1e-7)
    dyb = dy.clone()
    dxi = bwd(dyb, saved, inplace=True)
    assert dxi.data_ptr() == dyb.data_ptr()
    close(dxi, dx_r, 2e-6, 1e-7)
    xb = x.clone()
    close(fwd(xb, inplace=True), y, 0, 0)
    n = torch.tensor([float("nan")])
    assert fwd(n).isnan().all()


def test_add_and_accumulate(K):
    a, b = torch.randn(3, 5, 7), torch.randn(3, 5, 7)
    close(K.add(a, b), a + b, 0, 0)
    a2 = a.clone()
    K.add(a2, b, out=a2)
    close(a2, a + b, 0, 0)
    b2 = b.clone()
    K.add(a, b2, out=b2)
    close(b2, a + b, 0, 0)
    a3 = a.clone()
    K.accumulate(a3, b)
    close(a3, a + b, 0, 0)
    big_a, big_b = torch.randn(100_003), torch.randn(100_003)  # parallel path
    close(K.add(big_a, big_b), big_a + big_b, 0, 0)


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
def test_dropout(K, p):
    x = torch.randn(4, 8, 33, 31)
    y, m = K.dropout_forward(x, p, seed=1234)
    assert m.dtype == torch.uint8 and set(m.unique().tolist()) <= {0, 1}
    ref = x.double() * m.double() / (1 - p)
    close(y, ref, 1e-6, 1e-6)
    keep = m.double().mean().item()
    assert abs(keep - (1 - p)) < 0.01
    y2, m2 = K.dropout_forward(x, p, seed=1234)
    assert torch.equal(m, m2) and torch.equal(y, y2)
    if p > 0:
        _, m3 = K.dropout_forward(x, p, seed=1235)
        assert not torch.equal(m, m3)
    dy = torch.randn_like(x)
    close(K.dropout_backward(dy, m, p), dy.double() * m.double() / (1 - p), 1e-6, 1e-6)
    xb = x.clone()
    yi, mi = K.dropout_forward(xb, p, seed=1234, out=xb)
    assert torch.equal(yi, y) and torch.equal(mi, m)


def test_dropout_mask_independent_of_threads(K):
    x = torch.randn(300_000)
    masks = []
    for t in (1, 2, 3):
        capi.set_num_threads(t)
        masks.append(K.dropout_forward(x, 0.3, seed=99)[1])
    capi.set_num_threads(2)
    assert torch.equal(masks[0], masks[1]) and torch.equal(masks[0], masks[2])
    # a chunk of a tensor gets the same mask as the same elements of the whole tensor
    # only if offsets match: mask depends on (seed, flat index) alone
    code = ("import sys; sys.path.append('tests/kernels'); import torch, checked as K; from port.exec import capi; "
            "capi.set_num_threads({t}); "
            "x=torch.ones(300000); print(int(K.dropout_forward(x,0.3,seed=99)[1].sum()))")
    outs = {subprocess.run([sys.executable, "-c", code.format(t=t)], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.strip() for t in (1, 2)}
    assert len(outs) == 1 and int(outs.pop()) == int(masks[0].sum())


POOL = quick_subset([((2, 3, 7, 5), 3, 2, 1), ((1, 2, 9, 11), 3, 1, 0), ((3, 2, 8, 8), 2, 2, 0),
                     ((2, 4, 7, 7), (3, 2), (2, 1), (1, 1)), ((1, 1, 5, 5), 5, 1, 2)], 2)


@pytest.mark.parametrize("shape,k,s,p", POOL)
def test_maxpool(K, shape, k, s, p):
    x = torch.randn(shape)
    x.view(-1)[:4] = 1.0  # ties: first max wins, like PyTorch
    y_r, i_r = F.max_pool2d(x.double(), k, s, p, return_indices=True)
    y, idx = K.maxpool2d_forward(x, k, s, p)
    close(y, y_r, 0, 0)
    assert torch.equal(idx, i_r)
    dy = torch.randn(y.shape)
    x64 = x.double().requires_grad_()
    F.max_pool2d(x64, k, s, p).backward(dy.double())
    close(K.maxpool2d_backward_input(dy, idx, x.shape, k, s, p), x64.grad, 1e-6, 1e-6)


@pytest.mark.parametrize("shape,k,s,p", POOL)
def test_avgpool(K, shape, k, s, p):
    x = torch.randn(shape)
    y_r, dx_r = _grad(lambda t: F.avg_pool2d(t, k, s, p, count_include_pad=True), x,
                      torch.randn(F.avg_pool2d(x, k, s, p).shape))
    dy = torch.randn(y_r.shape)
    x64 = x.double().requires_grad_()
    F.avg_pool2d(x64, k, s, p, count_include_pad=True).backward(dy.double())
    close(K.avgpool2d_forward(x, k, s, p), y_r, 1e-6, 1e-5)
    close(K.avgpool2d_backward_input(dy, x.shape, k, s, p), x64.grad, 1e-6, 1e-5)


@pytest.mark.parametrize("shape", SHAPES)
def test_global_avgpool(K, shape):
    x = torch.randn(shape)
    dy = torch.randn(shape[:2])
    y_r, dx_r = _grad(lambda t: t.mean((2, 3)), x, dy)
    close(K.global_avgpool_forward(x), y_r, 1e-6, 1e-5)
    close(K.global_avgpool_backward_input(dy, x.shape), dx_r, 1e-6, 1e-5)
