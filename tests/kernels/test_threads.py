"""The same bits at any thread count (port_kernels.h, "Threads"): a kernel's result may not depend on how many
threads ran it, on either GEMM backend, so a training run can change its thread count between steps (the thread
governor does) without changing a bit. Whole training steps are checked in tests/e2e/test_trainer_threads.py."""
import os

import pytest
import torch

from port.exec import capi

QUICK = os.environ.get("PORT_KERNELS_QUICK") == "1"     # as conftest.QUICK (`make test-asan`)

THREADS = (1, 2, 3)
BACKENDS = ("blas", "vendored", "auto")


def _at_each_count(K, backend, fn):
    """fn()'s tensors at 1, 2 and 3 threads with the given GEMM backend."""
    prev = capi.get_num_threads()
    outs = []
    try:
        with capi.gemm_backend(backend):
            for t in THREADS:
                capi.set_num_threads(t)
                r = fn()
                r = r if isinstance(r, (tuple, list)) else (r,)
                outs.append([v.clone() for v in r if isinstance(v, torch.Tensor)])
    finally:
        capi.set_num_threads(prev)
    return outs


def _same_bits(outs, what):
    for t, o in zip(THREADS[1:], outs[1:]):
        for i, (a, b) in enumerate(zip(outs[0], o)):
            assert torch.equal(a, b), (f"{what}: output {i} at {t} threads differs from 1 thread in "
                                       f"{int((a != b).sum())} of {a.numel()} elements")


# (m, n, k): split by rows (n < m) and by columns, a first layer's weight gradient (64 x 27 x 1024, whose
# per-thread row blocks OpenBLAS summed differently), odd sizes
GEMMS = [(64, 27, 1024), (64, 1024, 576), (576, 1024, 64), (301, 530, 270), (1100, 40, 700), (33, 2049, 31),
         (512, 16, 1152), (1152, 30, 256), (130, 2304, 16)]   # narrow (gemm_skinny.c): NN/TN n <= 32, NT k <= 16


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0)])
@pytest.mark.parametrize("m,n,k", GEMMS[::2] if QUICK else GEMMS)
def test_gemm_same_bits_at_any_thread_count(K, backend, ta, tb, m, n, k):
    a = torch.randn((k, m) if ta else (m, k))
    b = torch.randn((n, k) if tb else (k, n))
    outs = _at_each_count(K, backend, lambda: K.sgemm(a, b, trans_a=bool(ta), trans_b=bool(tb)))
    ref = (a.T if ta else a).double() @ (b.T if tb else b).double()
    assert torch.allclose(outs[0][0].double(), ref, atol=1e-3, rtol=1e-4)
    _same_bits(outs, f"sgemm {m}x{n}x{k} ta={ta} tb={tb} on {backend}")


# (n, c_in, h, w, c_out, k, stride, pad, groups): the CIFAR stem (3 input channels), stride 2, 1x1 stride 2,
# a depthwise layer, a Winograd-sized layer, an odd map
CONVS = [(8, 3, 32, 32, 64, 3, 1, 1, 1), (8, 64, 32, 32, 128, 3, 2, 1, 1), (8, 64, 16, 16, 128, 1, 2, 0, 1),
         (8, 96, 16, 16, 96, 3, 1, 1, 96), (8, 128, 16, 16, 128, 3, 1, 1, 1), (4, 24, 37, 37, 40, 3, 1, 1, 1)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n,ci,h,w,co,k,s,p,g", CONVS[::2] if QUICK else CONVS)
def test_conv_same_bits_at_any_thread_count(K, backend, n, ci, h, w, co, k, s, p, g):
    x = torch.randn(n, ci, h, w)
    wt = torch.randn(co, ci // g, k, k) * 0.1
    b = torch.randn(co)
    dy = torch.randn_like(K.conv2d_forward(x, wt, b, s, p, g))
    outs = _at_each_count(K, backend, lambda: (
        K.conv2d_forward(x, wt, b, s, p, g),
        K.conv2d_backward_input(dy, wt, x.shape, s, p, g),
        *K.conv2d_backward_weight(dy, x, wt.shape, s, p, g, bias=True)))
    _same_bits(outs, f"conv {(n, ci, h, w, co, k, s, p, g)} on {backend}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tile", [(4, 32), (3, 5), (8, 8)])
def test_patch_conv_same_bits_at_any_thread_count(K, backend, tile):
    """Patch tiles split their rows over a team: the bands may not change the sums."""
    x = torch.randn(2, 64, 32, 32)
    wt = torch.randn(64, 64, 3, 3) * 0.1
    b = torch.randn(64)
    dy = torch.randn(2, 64, 32, 32)
    outs = _at_each_count(K, backend, lambda: (
        K.conv2d_patch_forward(x, wt, b, 1, 1, 1, tile=tile),
        K.conv2d_patch_backward_input(dy, wt, x.shape, 1, 1, 1, tile=tile),
        *K.conv2d_patch_backward_weight(dy, x, wt.shape, 1, 1, 1, bias=True, tile=tile)))
    _same_bits(outs, f"patch conv tile {tile} on {backend}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_bmm_and_linear_same_bits_at_any_thread_count(K, backend):
    """Batched GEMMs run across the batch or split each product, by the thread count: the same bits either way."""
    a = torch.randn(3, 128, 96)
    bb = torch.randn(3, 96, 160)
    x = torch.randn(64, 640)
    wl = torch.randn(300, 640)
    dy = torch.randn(64, 300)
    xt, wt, bt, dyt = torch.randn(700, 64), torch.randn(130, 64), torch.randn(130), torch.randn(700, 130)
    xk, dyk = torch.randn(2500, 40), torch.randn(2500, 24)
    outs = _at_each_count(K, backend, lambda: (
        K.bmm(a, bb, alpha=0.125), K.linear_forward(x, wl), *K.linear_backward_weight(dy, x),
        K.linear_backward_input(dy, wl),
        # a bias: row blocks of y set to b and accumulated by one-thread GEMMs; db's column blocks
        K.linear_forward(xt, wt, bt), *K.linear_backward_weight(dyt, xt),
        # a small weight from many rows: split over the rows, partials added in order
        *K.linear_backward_weight(dyk, xk),
        # W stored [in, out] (GPT-2's Conv1D): the same three at each shape above
        K.linear_forward(x, wl.T.contiguous(), wt=True), K.linear_backward_input(dy, wl.T.contiguous(), wt=True),
        K.linear_forward(xt, wt.T.contiguous(), bt, wt=True), *K.linear_backward_weight(dyt, xt, wt=True),
        *K.linear_backward_weight(dyk, xk, wt=True)))
    _same_bits(outs, f"bmm / linear on {backend}")


@pytest.mark.parametrize("sa,sb", [((8, 64, 33, 35), (8, 64, 1, 1)), ((64, 33, 35), (35,)), ((1,), (50, 2000))])
def test_binary_broadcast_same_bits_at_any_thread_count(K, sa, sb):
    """Broadcast mul's gradients (each element summed over the broadcast dims by one thread)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(sa, generator=g), torch.randn(sb, generator=g)
    dy = torch.randn(torch.broadcast_shapes(a.shape, b.shape), generator=g)
    _same_bits(_at_each_count(K, "auto", lambda: (K.binary_forward("mul", a, b),
                                                  *K.binary_backward("mul", dy, a, b))), "binary mul")


def test_norms_pools_and_resize_same_bits_at_any_thread_count(K):
    """RMS norm, group norm, dilated ceil-mode max pool, resize and adaptive pooling (normpool.c, pool.c): rows,
    groups, channels and planes split over threads, every sum in one order."""
    g = torch.Generator().manual_seed(1)
    t = torch.randn(64, 1030, generator=g)
    dt = torch.randn(t.shape, generator=g)
    w = torch.rand(1030, generator=g) + 0.5
    x = torch.randn(4, 24, 33, 31, generator=g)
    gx = torch.rand(24, generator=g) + 0.5
    bx = torch.randn(24, generator=g)

    def run():
        y, r = K.rmsnorm_forward(t, w)
        gy, st = K.groupnorm_forward(x, 6, gx, bx)
        dgx = K.groupnorm_backward_input(x, x, st, 6, gx)
        mp, idx = K.maxpool2d_forward(x, 3, 2, 1, dilation=2, ceil_mode=True)
        up = K.upsample2d_forward(x, (50, 70), "bilinear", False, None)
        ad = K.adaptive_avgpool2d_forward(x, (5, 7))
        return (y, r, K.rmsnorm_backward_input(dt, t, r, w), K.rmsnorm_backward_weight(dt, t, r), gy, st, dgx,
                *K.groupnorm_backward_weight(x, x, st, 6), mp, idx,
                K.maxpool2d_backward_input(mp, idx, x.shape, 3, 2, 1, dilation=2, ceil_mode=True), up,
                K.upsample2d_backward_input(up, x.shape, "bilinear", False, None),
                K.upsample2d_backward_input(K.upsample2d_forward(x, (66, 62)), x.shape), ad,
                K.adaptive_avgpool2d_backward_input(ad, x.shape))
    _same_bits(_at_each_count(K, "auto", run), "norms / pools / resize")


def test_unary_and_shape_copies_same_bits_at_any_thread_count(K):
    """The unary math (pow's exp-log path, cos, rsqrt), slice copies and expand across the parallel threshold."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40000, generator=g) + 0.1
    dy = torch.randn(40000, generator=g)
    big = torch.randn(70, 3, 500, generator=g)
    _same_bits(_at_each_count(K, "auto", lambda: (
        K.unary_forward("pow_scalar", x, 1.7), K.unary_backward("pow_scalar", dy, x, 1.7),
        K.unary_forward("cos", x * 50), K.unary_backward("rsqrt", dy, K.unary_forward("rsqrt", x)),
        K.slice_copy(torch.empty(70, 2, 500), big, 1, 0, 1, 2, 0),
        K.slice_copy(torch.ones(70, 3, 500), big[:, 1:2].contiguous(), 1, 2, 0, 1, 1),
        K.expand(x[:500].view(1, 500), (80, 500)))), "unary / slice copy / expand")


def test_embedding_padding_idx_same_bits_at_any_thread_count(K):
    """Column blocks in parallel (d = 1000: several blocks, above the parallel threshold), the padding row
    skipped."""
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(0, 37, (400,), generator=g)
    dy = torch.randn(400, 1000, generator=g)
    outs = _at_each_count(K, "auto", lambda: K.embedding_backward_weight(dy, idx, (37, 1000), padding_idx=3))
    _same_bits(outs, "embedding_backward_weight_pad")
    assert not outs[0][0][3].any()


def test_activations_unary_binary_and_permute_same_bits_at_any_thread_count(K):
    """Issue 54's elementwise families above the parallel threshold: sigmoid, hardsigmoid, SiLU, hardswish, GELU
    (both forms), tanh and every generic unary op, forward and backward; add/sub/mul/div broadcast on every axis
    (forward and both gradients); softmax, permute (ConvNeXt's LayerNorm2d: NCHW -> NHWC) and layer norm over
    the channels of the permuted map (odd channel counts)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 37, 19, 23, generator=g) * 4        # 97k elements, 37 channels
    dy = torch.randn(x.shape, generator=g)
    pos = x.abs() + 0.1
    a, b = torch.randn(6, 1, 19, 23, generator=g), torch.randn(1, 37, 19, 1, generator=g).abs() + 0.5
    dyb = torch.randn(6, 37, 19, 23, generator=g)
    gam, bet = torch.rand(37, generator=g) + 0.5, torch.randn(37, generator=g)

    def run():
        outs = []
        for name, saved in (("sigmoid", "y"), ("hardsigmoid", "x"), ("silu", "x"), ("hardswish", "x"),
                            ("tanh", "y")):
            y = getattr(K, f"{name}_forward")(x)
            outs += [y, getattr(K, f"{name}_backward")(dy, y if saved == "y" else x)]
        for approx in ("none", "tanh"):
            outs += [K.gelu_forward(x, approx), K.gelu_backward(dy, x, approx)]
        for kind, s in (("neg", 0.0), ("exp", 0.0), ("rsqrt", 0.0), ("sin", 0.0), ("abs", 0.0), ("shift", 0.5),
                        ("pow_scalar", -0.5)):
            src = pos if kind in ("rsqrt", "pow_scalar") else x
            y = K.unary_forward(kind, src, s)
            saved = {0: None, 1: src, 2: y}[capi.raw.port_unary_saves(capi.UNARY_OPS[kind])]
            outs += [y, K.unary_backward(kind, dy, saved, s)]
        for kind in ("add_nd", "sub", "mul", "div"):
            outs += [K.binary_forward(kind, a, b), *K.binary_backward(kind, dyb, a, b)]
        sm = K.softmax_forward(x)
        nhwc = K.permute(x, (0, 2, 3, 1))
        ln, st = K.layernorm_forward(nhwc, gam, bet)
        dln = K.permute(dy, (0, 2, 3, 1))
        outs += [sm, K.softmax_backward(dy, sm), nhwc, ln, st, K.layernorm_backward_input(dln, nhwc, st, gam),
                 *K.layernorm_backward_weight(dln, nhwc, st), K.permute(ln, (0, 3, 1, 2))]
        return outs
    _same_bits(_at_each_count(K, "auto", run), "activations / unary / binary / softmax / permute / layer norm")
