"""Element-wise kernels, dropout and pooling vs PyTorch float64."""
import ctypes
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


BROADCASTS = [((3, 5, 7, 2), (3, 5, 1, 1)),      # squeeze-excitation gate
              ((1, 1, 7, 9), (3, 5, 7, 9)),      # the broadcast operand first
              ((4, 6, 10), (10,)),               # layer scale over the last dim
              ((2, 1, 5, 1, 3), (1, 4, 1, 6, 1)),  # both broadcast, alternating (5 merged dims)
              ((3, 5), (3, 5)),                  # same shape
              ((1,), (17, 33, 65)),              # a scalar operand; crosses the parallel threshold
              ((3, 11, 2, 2), (3, 11, 1, 1)),    # 2x2 gate rows (the fast paths' unrolled rows)
              ((6, 8, 1), (6, 8, 70))]           # a trailing broadcast of the first operand


@pytest.mark.parametrize("sa,sb", BROADCASTS)
@pytest.mark.parametrize("kind", ["add_nd", "sub", "mul", "div"])
def test_binary_broadcast(K, kind, sa, sb):
    """port_binary_forward/backward vs float64 autograd: every operand's gradient summed to its shape, gradients
    overwritten or accumulated, each one alone (the other operand NULL where it is not read)."""
    g = torch.Generator().manual_seed(len(sa) * 7 + len(sb))
    a, b = torch.randn(sa, generator=g), torch.randn(sb, generator=g)
    if kind == "div":
        b = b.sign() * (b.abs() + 0.5)
    fn = {"add_nd": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[kind]
    a64, b64 = a.double().requires_grad_(), b.double().requires_grad_()
    y64 = fn(a64, b64)
    dy = torch.randn(y64.shape, generator=g)
    y64.backward(dy.double())
    close(K.binary_forward(kind, a, b), y64.detach(), 1e-6, 1e-6)
    da, db = K.binary_backward(kind, dy, a, b)
    close(da, a64.grad, 1e-5, 1e-5)
    close(db, b64.grad, 1e-5, 1e-5)
    for k in (0, 1):
        got = K.binary_backward(kind, dy, a, b, want=(k,))
        assert got[1 - k] is None
        close(got[k], (a64, b64)[k].grad, 1e-5, 1e-5)
    base = (torch.ones(sa), torch.ones(sb))
    acc = K.binary_backward(kind, dy, a, b, accumulate_into=tuple(t.clone() for t in base))
    close(acc[0], a64.grad + 1, 1e-5, 1e-5)
    close(acc[1], b64.grad + 1, 1e-5, 1e-5)


def test_silu_float_vs_double_reference(K):
    """port_silu_forward/backward (float32 logistic) against their double references (port_silu_*_reference):
    within a few float ulps (the forward 4 ulps; the backward 4e-7 relative plus 3e-7: its 1 + x (1 - s) cancels
    near x = -1.28, as in torch's float kernel); the special values as the reference's (NaN, infinities, -0 for x below -87, whose exact value
    underflows to 0 in torch's float silu too); the same bits at 1, 2 and 3 threads (crossing the parallel threshold)."""
    from port.exec import capi
    raw = capi.raw
    g = torch.Generator().manual_seed(5)
    x = torch.cat([torch.randn(70001, generator=g) * 8, torch.linspace(-120, 120, 4001),
                   torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), -1.2784645, 88.5, -88.5])])
    dy = torch.randn(x.shape, generator=g)
    n = x.numel()

    def run(fn, *ins):
        out = torch.empty(n)
        assert fn(out.data_ptr(), *[t.data_ptr() for t in ins], n) == capi.PORT_OK
        return out
    y_ref, dx_ref = run(raw.port_silu_forward_reference, x), run(raw.port_silu_backward_reference, dy, x)
    outs = []
    for th in (1, 2, 3):
        capi.set_num_threads(th)
        outs.append((run(raw.port_silu_forward, x), run(raw.port_silu_backward, dy, x)))
    capi.set_num_threads(2)
    for y, dx in outs[1:]:
        assert torch.equal(y.view(torch.int32), outs[0][0].view(torch.int32))
        assert torch.equal(dx.view(torch.int32), outs[0][1].view(torch.int32))
    y, dx = outs[0]
    assert torch.equal(y.isnan(), y_ref.isnan()) and torch.equal(dx.isnan(), dx_ref.isnan())
    fin = ~y_ref.isnan()
    torch.testing.assert_close(y[fin], y_ref[fin], rtol=4e-7, atol=1e-30)
    fin = ~dx_ref.isnan()
    torch.testing.assert_close(dx[fin], dx_ref[fin], rtol=4e-7, atol=3e-7)
    big = fin & (y_ref.abs() > 1e-30)          # below x = -87 the float exp flushes to 0: silu -0 (|exact| < 1e-36)
    ulps = (y[big].view(torch.int32).long() - y_ref[big].view(torch.int32).long()).abs()
    assert int(ulps.max()) <= 4, int(ulps.max())


# (a shape, b shape, path of da, path of db): 1 elementwise (the same bits as the reference), 2 rows (a fixed
# 8-lane order: the reference's sum to double rounding), 0 the reference itself
FAST_PATHS = [((5, 7, 3, 3), (5, 7, 1, 1), 1, 2),        # squeeze-excitation, 3x3 rows (unrolled row code)
              ((3, 11, 2, 2), (3, 11, 1, 1), 1, 2),      # 2x2 rows
              ((2, 9, 13, 5), (2, 9, 1, 1), 1, 2),       # 65-element rows: lanes plus a tail
              ((64, 40, 5, 5), (64, 40, 1, 1), 1, 2),    # parallel: several blocks of rows
              ((3, 20000), (3, 1), 1, 2),                # parallel: chunks that end inside a row
              ((7, 300), (7, 1), 1, 2),                  # long rows, several lane rounds
              ((3, 5, 7), (3, 5, 7), 1, 1),              # same shape (one merged dim)
              ((1, 1, 7, 9), (3, 5, 7, 9), 0, 1),        # a reduced over the leading dim: reference
              ((4, 6, 10), (10,), 1, 0),                 # layer scale: b reduced over leading dims
              ((2, 1, 5, 1, 3), (1, 4, 1, 6, 1), 0, 0),  # alternating: reference
              ((300, 129), (1, 129), 1, 0),              # a bias-like row vector (parallel): reference
              ((6, 8, 1), (6, 8, 70), 2, 1),             # a trailing broadcast of a
              ((1,), (17, 33, 65), 2, 1)]                # a scalar: one row of everything


@pytest.mark.parametrize("sa,sb,pa,pb", FAST_PATHS)
@pytest.mark.parametrize("kind", ["add_nd", "sub", "mul", "div"])
def test_binary_backward_fast_vs_reference(K, kind, sa, sb, pa, pb):
    """port_binary_backward's fast paths against its plain reference (port_binary_backward_reference): the
    elementwise path bit for bit (a -0 kept), the rows path to 1e-6 relative (its 8 double lanes against the
    reference's sequential double sum, each rounded once to float), overwriting and accumulating; the path each
    gradient takes is the one the table names (so each path is exercised); the same bits at 1, 2 and 3 threads."""
    g = torch.Generator().manual_seed(sum(sa) * 31 + sum(sb))
    a, b = torch.randn(sa, generator=g), torch.randn(sb, generator=g)
    if kind == "div":
        b = torch.where(b < 0, -1.0, 1.0) * (b.abs() + 0.5)   # (randn's exact zeros have sign 0)
    a.view(-1)[::5] = 0.0                       # zero products: the sign of a zero gradient is compared too
    dy = torch.randn(torch.broadcast_shapes(sa, sb), generator=g)
    dy.view(-1)[::7] = -0.0
    paths = (K.binary_backward_path(kind, sa, sb, 0), K.binary_backward_path(kind, sa, sb, 1))
    assert paths == (pa, pb)
    base = (torch.randn(sa, generator=g), torch.randn(sb, generator=g))
    for acc in (None, base):
        into = None if acc is None else tuple(t.clone() for t in acc)
        ref = K.binary_backward(kind, dy, a, b, accumulate_into=into, reference=True)
        runs = []
        for th in (1, 2, 3):
            capi.set_num_threads(th)
            into = None if acc is None else tuple(t.clone() for t in acc)
            runs.append(K.binary_backward(kind, dy, a, b, accumulate_into=into))
        capi.set_num_threads(2)
        for r in runs[1:]:
            for x, y in zip(runs[0], r):
                assert torch.equal(x, y) and torch.equal(x.signbit(), y.signbit())
        for x, y, path in zip(runs[0], ref, paths):
            if path == 2:
                torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
            else:
                assert torch.equal(x, y) and torch.equal(x.signbit(), y.signbit()), (path, (x - y).abs().max())


def test_binary_broadcast_refusals(K):
    from port.exec import capi
    from checked import _binary_params
    a, b, dy = torch.randn(3, 4), torch.randn(3, 1), torch.randn(3, 4)
    p = _binary_params("mul", a.shape, b.shape, dy.shape)
    P = ctypes.byref(p)
    assert capi.raw.port_binary_forward(a.data_ptr(), a.data_ptr(), b.data_ptr(), P) == capi.PORT_OK   # in place
    assert capi.raw.port_binary_backward(dy.data_ptr(), None, dy.data_ptr(), a.data_ptr(), b.data_ptr(), P, 0) \
        == capi.PORT_ERR_ALIAS                                   # a gradient over dy
    assert capi.raw.port_binary_backward(a.data_ptr(), None, dy.data_ptr(), a.data_ptr(), None, P, 0) \
        == capi.PORT_ERR_NULL                                    # mul's da reads b
    assert capi.raw.port_binary_backward(None, None, dy.data_ptr(), a.data_ptr(), b.data_ptr(), P, 0) \
        == capi.PORT_ERR_NULL
    assert capi.raw.port_binary_backward(a.data_ptr(), None, dy.data_ptr(), None, b.data_ptr(), P, 2) \
        == capi.PORT_ERR_ARG
    for field, v in (("rank", 0), ("rank", 7), ("op", 4), ("a_bcast", 4)):
        q = _binary_params("mul", a.shape, b.shape, dy.shape)
        setattr(q, field, v)
        assert capi.raw.port_binary_forward(dy.data_ptr(), a.data_ptr(), b.data_ptr(), ctypes.byref(q)) \
            == capi.PORT_ERR_SHAPE, field
    assert capi.raw.port_binary_numel(P, 0) == 12 and capi.raw.port_binary_numel(P, 1) == 3 \
        and capi.raw.port_binary_numel(P, 2) == 12


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


@pytest.mark.parametrize("n,c,hw", [(1, 1, 1), (3, 5, 37), (2, 9, 3), (1, 8, 5), (19, 1, 11)])
def test_global_avgpool_rows_side_by_side_keep_each_rows_order(n, c, hw):
    """The rows summed eight side by side (full groups and the tail) give each row's float sum in index order divided
    once: the bits of one row at a time (the fused squeeze-excitation's pooled mean is this one, se.c)."""
    x = torch.randn(n, c, hw) * 3
    y = torch.empty(n, c)
    assert capi.raw.port_global_avgpool_forward(y.data_ptr(), x.data_ptr(), n, c, hw) == capi.PORT_OK
    want = torch.empty(n * c)
    for r, row in enumerate(x.reshape(n * c, hw)):
        s = torch.zeros((), dtype=torch.float32)
        for v in row:
            s = s + v
        want[r] = s / torch.tensor(float(hw))
    assert torch.equal(y.flatten(), want)
