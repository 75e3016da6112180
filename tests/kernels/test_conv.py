"""conv2d (im2col/direct/patch, vendored GEMM) vs PyTorch float64 references."""
import ctypes
import itertools
import os

import pytest
import torch
import torch.nn.functional as F

from conftest import close, quick_subset
from port.exec import capi

# (n, c_in, c_out, h, w, k, stride, pad, groups)
_CASES = []
for n, (h, w), k, stride, pad, g in itertools.product((1, 3), ((7, 5), (9, 11)), (1, 3),
                                                       (1, 2), (0, 1, 2), ("1", "2", "dw")):
    c_in = 4
    groups = {"1": 1, "2": 2, "dw": c_in}[g]
    c_out = c_in if g == "dw" else 6
    _CASES.append((n, c_in, c_out, h, w, k, stride, pad, groups))
CASES = quick_subset(_CASES, 7)


def _ids(c):
    return "n{}_ci{}_co{}_{}x{}_k{}_s{}_p{}_g{}".format(*c)


def _ref(x, w, b, stride, pad, groups, dy):
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    b64 = b.double().requires_grad_() if b is not None else None
    y = F.conv2d(x64, w64, b64, stride, pad, 1, groups)
    y.backward(dy.double())
    return y.detach(), x64.grad, w64.grad, (b64.grad if b is not None else None)


def _make(c, bias):
    n, ci, co, h, w, k, s, p, g = c
    x = torch.randn(n, ci, h, w)
    wt = torch.randn(co, ci // g, k, k) * 0.5
    b = torch.randn(co) if bias else None
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    dy = torch.randn(n, co, ho, wo)
    return x, wt, b, dy


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("algo", ["im2col", "auto"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_conv2d_vs_torch(K, case, algo, bias):
    n, ci, co, h, w, k, s, p, g = case
    x, wt, b, dy = _make(case, bias)
    y_ref, dx_ref, dw_ref, db_ref = _ref(x, wt, b, s, p, g, dy)
    y = K.conv2d_forward(x, wt, b, s, p, g, algo=algo)
    close(y, y_ref, what="y")
    dx = K.conv2d_backward_input(dy, wt, x.shape, s, p, g, algo=algo)
    close(dx, dx_ref, what="dx")
    dw, db = K.conv2d_backward_weight(dy, x, wt.shape, s, p, g, bias=bias, algo=algo)
    close(dw, dw_ref, what="dw")
    if bias:
        close(db, db_ref, what="db")


DIRECT_CASES = quick_subset([c for c in _CASES if c[8] == c[1] == c[2] or
                             (c[5] == 1 and c[6] == 1 and c[7] == 0)], 5)


@pytest.mark.parametrize("case", DIRECT_CASES, ids=_ids)
def test_im2col_equals_direct(K, case):
    n, ci, co, h, w, k, s, p, g = case
    x, wt, b, dy = _make(case, True)
    args = (s, p, g)
    close(K.conv2d_forward(x, wt, b, *args, algo="direct"),
          K.conv2d_forward(x, wt, b, *args, algo="im2col"), 1e-5, 1e-5)
    close(K.conv2d_backward_input(dy, wt, x.shape, *args, algo="direct"),
          K.conv2d_backward_input(dy, wt, x.shape, *args, algo="im2col"), 1e-5, 1e-5)
    dwd, dbd = K.conv2d_backward_weight(dy, x, wt.shape, *args, algo="direct")
    dwi, dbi = K.conv2d_backward_weight(dy, x, wt.shape, *args, algo="im2col")
    close(dwd, dwi, 1e-4, 1e-5)
    close(dbd, dbi, 1e-4, 1e-5)


def test_direct_unsupported(K):
    x, wt = torch.randn(1, 4, 5, 5), torch.randn(6, 4, 3, 3)
    with pytest.raises(NotImplementedError, match="not supported"):
        K.conv2d_forward(x, wt, algo="direct")


def test_weight_grad_accumulates(K):
    x, wt, b, dy = _make((2, 4, 6, 7, 7, 3, 1, 1, 2), True)
    dw1, db1 = K.conv2d_backward_weight(dy, x, wt.shape, 1, 1, 2)
    dw2, db2 = K.conv2d_backward_weight(dy, x, wt.shape, 1, 1, 2, dw=dw1.clone(), db=db1.clone())
    close(dw2, 2 * dw1, 1e-5, 1e-5)
    close(db2, 2 * db1, 1e-5, 1e-5)
    # micro-batching: two halves accumulate to the full-batch gradient
    dwa, dba = K.conv2d_backward_weight(dy[:1].contiguous(), x[:1].contiguous(), wt.shape, 1, 1, 2)
    K.conv2d_backward_weight(dy[1:].contiguous(), x[1:].contiguous(), wt.shape, 1, 1, 2, dw=dwa,
                             db=dba)
    close(dwa, dw1, 1e-4, 1e-5)
    close(dba, db1, 1e-4, 1e-5)


# overwrite: every path (im2col per image, batch-folded (the first two FOLD_CASES below), winograd, depthwise and pointwise direct, the narrow
# GEMMs of a batch-1 small map) -- the accumulating kernel's bits into zeros, whatever dw/db held before
OVERWRITE_CASES = [c for c in _CASES if c[0] == 3][::5] + [(7, 5, 6, 5, 5, 3, 1, 1, 1), (7, 6, 4, 9, 9, 3, 2, 1, 2),
    (1, 128, 64, 4, 4, 3, 1, 1, 1), (2, 8, 8, 12, 12, 3, 1, 1, 1), (1, 48, 24, 5, 7, 1, 1, 0, 1)]


@pytest.mark.parametrize("algo", ["im2col", "auto", "direct", "winograd"])
@pytest.mark.parametrize("case", OVERWRITE_CASES, ids=_ids)
def test_weight_grad_overwrite_equals_accumulate_into_zeros(K, case, algo):
    n, ci, co, h, w, k, s, p, g = case
    prm = K.conv2d_params((n, ci, h, w), (co, ci // g, k, k), s, p, g)
    if capi.raw.port_conv2d_resolve_algo(ctypes.byref(prm), K._algo(algo)) < 0:
        pytest.skip(f"{algo} does not apply")
    x, wt, b, dy = _make(case, True)
    dw0, db0 = K.conv2d_backward_weight(dy, x, wt.shape, s, p, g, bias=True, algo=algo)
    junk_w, junk_b = torch.full_like(dw0, float("nan")), torch.full_like(db0, 7.0)
    dw1, db1 = K.conv2d_backward_weight(dy, x, wt.shape, s, p, g, bias=True, algo=algo, dw=junk_w, db=junk_b,
                                        overwrite=True)
    assert dw1.data_ptr() == junk_w.data_ptr()
    assert torch.equal(dw1, dw0) and torch.equal(db1, db0)
    _, _, dw_ref, db_ref = _ref(x, wt, b, s, p, g, dy)
    close(dw1, dw_ref, what="dw")
    close(db1, db_ref, what="db")


# Batch folding: maps below the fold threshold (64 output pixels) put several images into one GEMM; n is
# chosen so the last chunk is partial (P=25 -> 3 images per GEMM; n=7 -> 3+3+1).
FOLD_CASES = [(7, 5, 6, 5, 5, 3, 1, 1, 1), (7, 6, 4, 9, 9, 3, 2, 1, 2), (5, 5, 7, 5, 5, 1, 1, 0, 1),
              (7, 4, 6, 5, 6, 3, 1, 1, 1)]


@pytest.mark.parametrize("algo", ["im2col", "auto"])
@pytest.mark.parametrize("case", FOLD_CASES, ids=_ids)
def test_conv2d_batch_folding_vs_torch(K, case, algo):
    n, ci, co, h, w, k, s, p, g = case
    x, wt, b, dy = _make(case, True)
    prm = K._conv_setup(x.shape, wt, s, p, g)
    per_image = (ci // g) * k * k * dy.shape[2] * dy.shape[3] * 4
    ws = K.conv2d_workspace_bytes(prm, K._algo(algo))
    # folded: the workspace holds several images' im2col blocks and an output block (else the test is moot)
    assert ws > per_image, (ws, per_image)
    y_ref, dx_ref, dw_ref, db_ref = _ref(x, wt, b, s, p, g, dy)
    close(K.conv2d_forward(x, wt, b, s, p, g, algo=algo), y_ref, what="y")
    close(K.conv2d_backward_input(dy, wt, x.shape, s, p, g, algo=algo), dx_ref, what="dx")
    dw, db = K.conv2d_backward_weight(dy, x, wt.shape, s, p, g, bias=True, algo=algo)
    close(dw, dw_ref, what="dw")
    close(db, db_ref, what="db")
    # every image alone (no folding: n = 1) gives the same result
    y1 = torch.cat([K.conv2d_forward(x[i:i + 1].contiguous(), wt, b, s, p, g, algo=algo) for i in range(n)])
    close(K.conv2d_forward(x, wt, b, s, p, g, algo=algo), y1, 1e-5, 1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 4, 40, 1, 33, 1, 0), (3, 2, 5, 37, 3, 35, 2, 1)])
def test_depthwise_wide_kernel_vs_torch(K, shape):
    # kernel wider than the precomputed column-range table (32): the per-use path
    n, c, h, w, kh, kw, s, p = shape
    x = torch.randn(n, c, h, w)
    wt = torch.randn(c, 1, kh, kw) * 0.3
    dy = torch.randn(n, c, (h + 2 * p - kh) // s + 1, (w + 2 * p - kw) // s + 1)
    y_ref, dx_ref, dw_ref, _ = _ref(x, wt, None, s, p, c, dy)
    close(K.conv2d_forward(x, wt, None, s, p, c, algo="direct"), y_ref, what="y")
    close(K.conv2d_backward_input(dy, wt, x.shape, s, p, c, algo="direct"), dx_ref, what="dx")
    dw, _ = K.conv2d_backward_weight(dy, x, wt.shape, s, p, c, algo="direct")
    close(dw, dw_ref, what="dw")


# Stride-1 depthwise runs a stack of images per channel as one tall padded plane (as many as fit the worker's
# buffer: 2 at 40x40 with k3, so 5 images make stacks of 2, 2 and 1; all 9 at 6x5); the rows between two images
# are computed and dropped, and the weight gradient's dot products run over the whole stack.
@pytest.mark.parametrize("shape", [(5, 3, 40, 40, 3, 1), (9, 4, 6, 5, 3, 1), (7, 2, 13, 11, 5, 2),
                                   (3, 2, 9, 7, 5, 1), (4, 3, 8, 8, 3, 0), (6, 2, 12, 10, 7, 3)])
def test_depthwise_stacked_images_vs_torch(K, shape):
    n, c, h, w, k, p = shape
    x = torch.randn(n, c, h, w)
    wt = torch.randn(c, 1, k, k) * 0.3
    b = torch.randn(c)
    dy = torch.randn(n, c, h + 2 * p - k + 1, w + 2 * p - k + 1)
    y_ref, dx_ref, dw_ref, db_ref = _ref(x, wt, b, 1, p, c, dy)
    close(K.conv2d_forward(x, wt, b, 1, p, c, algo="direct"), y_ref, what="y")
    close(K.conv2d_backward_input(dy, wt, x.shape, 1, p, c, algo="direct"), dx_ref, what="dx")
    dw, db = K.conv2d_backward_weight(dy, x, wt.shape, 1, p, c, bias=True, algo="direct")
    close(dw, dw_ref, what="dw")
    close(db, db_ref, what="db")
    # each image alone (a stack of one) gives the same forward bits
    y1 = torch.cat([K.conv2d_forward(x[i:i + 1].contiguous(), wt, b, 1, p, c, algo="direct") for i in range(n)])
    assert torch.equal(K.conv2d_forward(x, wt, b, 1, p, c, algo="direct"), y1)


# Depthwise with a block of 16 images in the vector lanes (small maps, stride 2; at least 8 images): every case is
# one the C rule (dw_lane_pays in kernels/src/conv.c) sends there -- stride 2 (where the buffers fit), or stride 1
# where the flat loops over padded planes would run more than twice the real taps (a 7x7 kernel on 8x8 .. 1x1
# maps).  Batches of 8 .. 33: one partial block, and full blocks with a partial one after; odd channels, non-square
# kernels and maps, unequal strides and paddings; the last case opens the parallel region.
LANE_CASES = [(33, 5, 8, 8, 7, 7, 1, 1, 3, 3), (17, 3, 2, 2, 7, 7, 1, 1, 3, 3), (20, 7, 1, 1, 7, 7, 1, 1, 3, 3),
              (18, 5, 4, 4, 5, 5, 1, 1, 2, 2), (17, 3, 9, 7, 5, 3, 2, 2, 2, 1), (9, 3, 16, 16, 5, 5, 2, 2, 2, 2),
              (8, 4, 11, 6, 3, 5, 2, 1, 0, 2), (10, 3, 5, 3, 3, 3, 1, 2, 1, 1), (33, 3, 6, 5, 7, 3, 1, 1, 3, 0),
              (32, 40, 8, 8, 7, 7, 1, 1, 3, 3)]


def _lanes_pay(n, c, h, w, kh, kw, sh, sw, ph, pw):
    """dw_lane_pays in Python (kernels/src/conv.c; PORT_DW_PAD_MAX = 8192): the cases above must take that path"""
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    if n < 8 or (max(h * (w + 2 * pw), h * w) + ho * wo) * 16 > 8192 or kh * kw > 64:
        return False
    ws = wo + kw - 1
    if not (sh == sw == 1 and ph < kh and pw < kw and (ho + kh - 1) * ws + kw - 1 + ho * ws <= 8192):
        return True
    rows = sum(min(kh, h + ph - o) - max(0, ph - o) for o in range(ho))
    cols = sum(min(kw, w + pw - o) - max(0, pw - o) for o in range(wo))
    return (ho + kh - 1) * ws * kh * kw > 2 * rows * cols


@pytest.mark.parametrize("shape", LANE_CASES, ids=lambda s: "n{}_c{}_{}x{}_k{}x{}_s{}x{}_p{}x{}".format(*s))
def test_depthwise_lanes_vs_torch_reference_and_threads(K, shape):
    n, c, h, w, kh, kw, sh, sw, ph, pw = shape
    assert _lanes_pay(*shape)
    s, p = (sh, sw), (ph, pw)
    x = torch.randn(n, c, h, w)
    wt = torch.randn(c, 1, kh, kw) * 0.3
    b = torch.randn(c)
    dy = torch.randn(n, c, (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1)
    refs = _ref(x, wt, b, s, p, c, dy)
    crefs = _ref_c(K, x, wt, b, dy, s, p, c)
    threads = capi.get_num_threads()
    runs = []
    try:
        for nt in (1, 2, 3):
            capi.set_num_threads(nt)
            dwo, dbo = K.conv2d_backward_weight(dy, x, wt.shape, s, p, c, bias=True, algo="direct",
                                                dw=torch.full_like(wt, float("nan")),
                                                db=torch.full_like(b, float("nan")), overwrite=True)
            runs.append((K.conv2d_forward(x, wt, b, s, p, c, algo="direct"),
                         K.conv2d_backward_input(dy, wt, x.shape, s, p, c, algo="direct"), dwo, dbo))
    finally:
        capi.set_num_threads(threads)
    names = ("y", "dx", "dw", "db")
    for got, want, cref, what in zip(runs[0], refs, crefs, names):
        close(got, want, 1e-4 if what[0] == "d" else 1e-5, 1e-5, what=what)
        close(got, cref, 1e-4 if what[0] == "d" else 1e-5, 1e-5, what=f"{what} vs the C reference")
    for nt, run in zip((2, 3), runs[1:]):
        for a, b_, what in zip(runs[0], run, names):
            assert torch.equal(a, b_), f"{what}: bits differ between 1 and {nt} threads"
    # accumulating into zeros gives the overwrite's bits; without a bias the forward is the bias-free one
    dw, db = K.conv2d_backward_weight(dy, x, wt.shape, s, p, c, bias=True, algo="direct")
    assert torch.equal(dw, runs[0][2]) and torch.equal(db, runs[0][3])
    close(K.conv2d_forward(x, wt, None, s, p, c, algo="direct"), F.conv2d(x.double(), wt.double(), None, s, p, 1, c),
          1e-5, 1e-5, what="y without bias")


PATCH_CASES = quick_subset([(2, 4, 6, 9, 11, 3, 1, 1, 1), (1, 4, 6, 9, 11, 3, 2, 1, 2),
                            (3, 4, 4, 7, 5, 3, 1, 2, 4), (1, 3, 5, 10, 10, 5, 2, 2, 1),
                            (2, 4, 6, 7, 9, 1, 1, 0, 1), (1, 4, 6, 8, 8, 3, 2, 0, 1)], 2)


@pytest.mark.parametrize("tile", [(1, 1), (2, 3), (4, 4), (3, 100)])
@pytest.mark.parametrize("case", PATCH_CASES, ids=_ids)
def test_patch_equals_whole(K, case, tile):
    n, ci, co, h, w, k, s, p, g = case
    x, wt, b, dy = _make(case, True)
    args = (s, p, g)
    close(K.conv2d_patch_forward(x, wt, b, *args, tile=tile),
          K.conv2d_forward(x, wt, b, *args, algo="im2col"), 1e-5, 1e-5, "patch y")
    close(K.conv2d_patch_backward_input(dy, wt, x.shape, *args, tile=tile),
          K.conv2d_backward_input(dy, wt, x.shape, *args, algo="im2col"), 1e-5, 1e-5, "patch dx")
    dwp, dbp = K.conv2d_patch_backward_weight(dy, x, wt.shape, *args, tile=tile)
    dww, dbw = K.conv2d_backward_weight(dy, x, wt.shape, *args, algo="im2col")
    close(dwp, dww, 1e-4, 1e-5, "patch dw")
    close(dbp, dbw, 1e-4, 1e-5, "patch db")


def test_patch_workspace_scales_with_tile(K):
    p = K.conv2d_params((1, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1)
    whole = K.conv2d_workspace_bytes(p, "im2col")
    assert whole == 16 * 9 * 32 * 32 * 4
    tile = K.conv2d_patch_workspace_bytes(p, (8, 8))
    assert tile == (16 * 9 + 16) * 64 * 4
    assert tile * 8 <= whole


# maps of >= 512 output pixels at stride 1: with the vendored GEMM, the forward builds im2col inside the GEMM's
# B packing (kernels/src/conv.c, im2col_pack); column blocks of 512 and panels of 32 cut output rows anywhere
@pytest.mark.parametrize("backend", ["vendored", "blas", "auto"])
@pytest.mark.parametrize("case", [(2, 5, 7, 23, 29, 3, 1, 1, 1), (1, 6, 4, 24, 33, 5, 1, 2, 2),
                                  (2, 3, 33, 40, 17, 3, 1, 0, 1), (1, 4, 9, 19, 61, 7, 1, 3, 1)], ids=_ids)
def test_forward_with_im2col_in_gemm_packing(K, case, backend):
    n, ci, co, h, w, k, s, p, g = case
    x, wt, b, dy = _make(case, True)
    y_ref = _ref(x, wt, b, s, p, g, dy)[0]
    assert y_ref.shape[2] * y_ref.shape[3] >= 512
    prev = capi.get_gemm_backend()
    try:
        capi.set_gemm_backend(backend)
        y = K.conv2d_forward(x, wt, b, s, p, g, algo="im2col")
    finally:
        capi.set_gemm_backend(prev)
    close(y, y_ref, what="y")


@pytest.mark.parametrize("case", quick_subset(_CASES[::9], 3), ids=_ids)
def test_vendored_gemm_conv_equals_blas(K, case):
    x, wt, b, dy = _make(case, True)
    n, ci, co, h, w, k, s, p, g = case
    res = []
    for backend in ("blas", "vendored"):
        capi.set_gemm_backend(backend)
        y = K.conv2d_forward(x, wt, b, s, p, g, algo="im2col")
        dx = K.conv2d_backward_input(dy, wt, x.shape, s, p, g, algo="im2col")
        dw, db = K.conv2d_backward_weight(dy, x, wt.shape, s, p, g, algo="im2col")
        res.append((y, dx, dw, db))
    for a, b_ in zip(*res):
        close(a, b_, 1e-4, 1e-5)


GEMM_SHAPES = [(1, 1, 1), (7, 5, 3), (64, 33, 17), (130, 70, 300), (9, 257, 65), (300, 20, 520)]


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("mnk", quick_subset(GEMM_SHAPES, 2))
@pytest.mark.parametrize("backend", ["blas", "vendored", "auto"])
def test_sgemm(K, backend, mnk, ta, tb):
    m, n, k = mnk
    a = torch.randn(k, m) if ta else torch.randn(m, k)
    bm = torch.randn(n, k) if tb else torch.randn(k, n)
    c0 = torch.randn(m, n)
    ref = 0.5 * ((a.double().T if ta else a.double()) @ (bm.double().T if tb else bm.double())) \
        + 2.0 * c0.double()
    capi.set_gemm_backend(backend)
    c = K.sgemm(a, bm, bool(ta), bool(tb), alpha=0.5, beta=2.0, c=c0.clone())
    close(c, ref, 1e-4, 1e-4)
    # beta = 0 must ignore NaN in C
    c = K.sgemm(a, bm, bool(ta), bool(tb), c=torch.full((m, n), float("nan")))
    close(c, 2 * (ref - 2.0 * c0.double()), 1e-4, 1e-4)


# narrow products (kernels/src/gemm_skinny.c on AVX-512; the other GEMMs elsewhere): NN / TN with n <= 64 at odd
# widths (one masked vector, several, a tail of 1), TN with k past one 16-term chunk, NT with k <= 16; inside
# larger matrices (leading dimensions past the width), against float64 torch; beta = 0 ignores NaN in C
NARROW = [(512, 16, 576, 0, 0), (37, 5, 1900, 0, 0), (100, 49, 300, 0, 0), (33, 64, 70, 0, 0), (19, 32, 3500, 0, 0),
          (16, 1, 4100, 0, 0), (576, 16, 512, 1, 0), (700, 17, 330, 1, 0), (450, 31, 300, 1, 0), (16, 2, 4096, 1, 0),
          (64, 1024, 16, 0, 1), (35, 2000, 4, 0, 1), (17, 4000, 1, 0, 1), (130, 640, 9, 0, 1)]


@pytest.mark.parametrize("m,n,k,ta,tb", quick_subset(NARROW, 5))
@pytest.mark.parametrize("backend", ["vendored", "auto"])
def test_sgemm_narrow_with_leading_dims(K, backend, m, n, k, ta, tb):
    pad = 3
    ar, ac = (k, m) if ta else (m, k)
    br, bc = (n, k) if tb else (k, n)
    abuf, bbuf = torch.randn(ar, ac + pad), torch.randn(br, bc + pad)
    a, b = abuf[:, :ac], bbuf[:, :bc]
    c0 = torch.randn(m, n + pad)
    ref = 0.5 * ((a.double().T if ta else a.double()) @ (b.double().T if tb else b.double()))
    with capi.gemm_backend(backend):
        for beta, cbuf in ((2.0, c0.clone()), (0.0, torch.full((m, n + pad), float("nan")))):
            assert capi.raw.port_sgemm(cbuf.data_ptr(), abuf.data_ptr(), bbuf.data_ptr(), ta, tb, m, n, k, 0.5, beta,
                                    ac + pad, bc + pad, n + pad) == 0
            want = ref + beta * c0[:, :n].double() if beta else ref
            close(cbuf[:, :n], want, 1e-4, 1e-4)
            past = cbuf[:, n:]   # C's columns past n: untouched
            assert torch.equal(past, c0[:, n:]) if beta else past.isnan().all(), "C changed past its n columns"


@pytest.mark.skipif(bool(os.environ.get("PORT_KERNELS_LIB")),
                    reason="the sanitizer build (-O1) leaves some of the vendored GEMM's a * b + c uncontracted")
@pytest.mark.parametrize("m,n,k,ta,tb", quick_subset([c for c in NARROW if c[:3] not in ((100, 49, 300), (33, 64, 70))], 4))
def test_narrow_gemm_gives_the_vendored_gemms_bits(K, m, n, k, ta, tb):
    """The narrow kernels add in the vendored GEMM's order (K blocks of 256 summed from zero, then
    C = fma(alpha, sum, beta C)), so a product equals, bit for bit, its rows computed one at a time (m = 1: the
    blocked kernel) -- and the portable build stays bit-identical across ISAs (tests/e2e/test_rt_cross.py)."""
    a = torch.randn((k, m) if ta else (m, k))
    b = torch.randn((n, k) if tb else (k, n))
    c0 = torch.randn(m, n)
    with capi.gemm_backend("vendored"):
        for alpha, beta in ((1.0, 0.0), (0.5, 1.0), (0.7, 0.3)):
            c = K.sgemm(a, b, bool(ta), bool(tb), alpha=alpha, beta=beta, c=c0.clone())
            rows = torch.cat([K.sgemm(a[:, i:i + 1].contiguous() if ta else a[i:i + 1], b, bool(ta), bool(tb),
                                      alpha=alpha, beta=beta, c=c0[i:i + 1].clone()) for i in range(m)])
            assert torch.equal(c, rows), (alpha, beta, float((c - rows).abs().max()))


# ----------------------------------------------------------------------------- the in-C reference convolution
def _ref_c(K, x, wt, b, dy, s, p, g):
    """port_conv2d_reference_* (plain loops, double accumulators) on float32 tensors."""
    prm = K._conv_setup(x.shape, wt, s, p, g)
    y = torch.empty_like(dy)
    dx = torch.empty_like(x)
    dw = torch.zeros_like(wt)
    db = torch.zeros(wt.shape[0])
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    capi.check(capi.raw.port_conv2d_reference_forward(y.data_ptr(), x.data_ptr(), wt.data_ptr(), ptr(b), prm))
    capi.check(capi.raw.port_conv2d_reference_backward_input(dx.data_ptr(), dy.data_ptr(), wt.data_ptr(), prm))
    capi.check(capi.raw.port_conv2d_reference_backward_weight(dw.data_ptr(), db.data_ptr(), dy.data_ptr(),
                                                            x.data_ptr(), prm))
    return y, dx, dw, db


REF_CASES = quick_subset(_CASES + FOLD_CASES + [(2, 3, 5, 11, 9, 5, 3, 2, 1), (1, 6, 6, 8, 13, 3, 2, 0, 3)], 9)


@pytest.mark.parametrize("case", REF_CASES, ids=_ids)
def test_reference_conv_vs_torch_float64(K, case):
    n, ci, co, h, w, k, s, p, g = case
    x, wt, b, dy = _make(case, True)
    y_ref, dx_ref, dw_ref, db_ref = _ref(x, wt, b, s, p, g, dy)
    y, dx, dw, db = _ref_c(K, x, wt, b, dy, s, p, g)
    # double accumulation: only the final float32 rounding differs from float64 torch
    for got, want, what in ((y, y_ref, "y"), (dx, dx_ref, "dx"), (dw, dw_ref, "dw"), (db, db_ref, "db")):
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6, msg=what)


@pytest.mark.parametrize("case", REF_CASES, ids=_ids)
def test_fast_conv_paths_equal_reference(K, case):
    """Every fast path (im2col with batch folding, direct, patch tiles) against the in-C reference."""
    n, ci, co, h, w, k, s, p, g = case
    x, wt, b, dy = _make(case, True)
    y_r, dx_r, dw_r, db_r = _ref_c(K, x, wt, b, dy, s, p, g)
    algos = ["im2col", "auto"] + (["direct"] if g == ci == co or (k == 1 and s == 1 and p == 0) else []) \
        + (["winograd"] if k == 3 and s == 1 and g == 1 and p <= 2 else [])
    for algo in algos:
        close(K.conv2d_forward(x, wt, b, s, p, g, algo=algo), y_r, 1e-5, 1e-5, what=f"{algo} y")
        close(K.conv2d_backward_input(dy, wt, x.shape, s, p, g, algo=algo), dx_r, 1e-5, 1e-5, what=f"{algo} dx")
        dw, db = K.conv2d_backward_weight(dy, x, wt.shape, s, p, g, bias=True, algo=algo)
        close(dw, dw_r, 1e-4, 1e-5, what=f"{algo} dw")
        close(db, db_r, 1e-4, 1e-5, what=f"{algo} db")
    for tile in ((2, 3), (4, 100)):
        close(K.conv2d_patch_forward(x, wt, b, s, p, g, tile=tile), y_r, 1e-5, 1e-5, what=f"patch{tile} y")
        close(K.conv2d_patch_backward_input(dy, wt, x.shape, s, p, g, tile=tile), dx_r, 1e-5, 1e-5,
              what=f"patch{tile} dx")
        dw, db = K.conv2d_patch_backward_weight(dy, x, wt.shape, s, p, g, bias=True, tile=tile)
        close(dw, dw_r, 1e-4, 1e-5, what=f"patch{tile} dw")
        close(db, db_r, 1e-4, 1e-5, what=f"patch{tile} db")



# Tiles large enough for the patch kernels' thread team (a tile's rows split over the threads) and for the
# path where each step threads itself (a tile's GEMM above the split threshold): both dw GEMM splits (c_out/g
# >= K and < K), bands of whole rows and narrower tiles, a last band of one row, stride 2, groups.
PATCH_TEAM_CASES = [  # n, c_in, c_out, h, w, k, s, p, g, tile
    (2, 16, 48, 31, 29, 3, 1, 1, 1, (3, 1000)),
    (2, 16, 48, 31, 29, 3, 1, 1, 1, (16, 1000)),
    (2, 16, 48, 31, 29, 3, 1, 1, 1, (4, 7)),
    (3, 3, 64, 33, 35, 3, 1, 1, 1, (4, 1000)),
    (3, 3, 64, 33, 35, 3, 1, 1, 1, (8, 9)),
    (2, 8, 96, 40, 37, 3, 2, 1, 2, (5, 1000)),
]


@pytest.mark.parametrize("case", PATCH_TEAM_CASES, ids=lambda c: "x".join(map(str, c[:9])) + f"_t{c[9]}")
def test_patch_threaded_tiles_equal_torch(K, case):
    n, ci, co, h, w, k, s, p, g, tile = case
    x, wt, b, dy = _make(case[:9], True)
    xd, wd, bd, dyd = (t.double().requires_grad_(True) for t in (x, wt, b, dy))
    y_ref = F.conv2d(xd, wd, bd, s, p, 1, g)
    dx_ref, dw_ref, db_ref = torch.autograd.grad(y_ref, (xd, wd, bd), dyd)
    close(K.conv2d_patch_forward(x, wt, b, s, p, g, tile=tile), y_ref, 1e-5, 1e-5, what="y")
    close(K.conv2d_patch_backward_input(dy, wt, x.shape, s, p, g, tile=tile), dx_ref, 1e-5, 1e-5, what="dx")
    dw, db = K.conv2d_patch_backward_weight(dy, x, wt.shape, s, p, g, bias=True, tile=tile)
    close(dw, dw_ref, 1e-4, 1e-5, what="dw")
    close(db, db_ref, 1e-4, 1e-5, what="db")


# Winograd F(2x2, 3x3): 3x3, stride 1, groups 1, padding <= 2. Odd maps (partial edge tiles), 1x1 and 1xN
# maps, every padding, and one case large enough to run several tile chunks (c_in + c_out = 1024 -> chunks
# of 128 tiles; 4 images of 7x6 tiles = 168 tiles: the second chunk starts mid-row in the fourth image).
# Tiles that fit one chunk with more than PORT_WG_BLOCK (64) output rows run in blocks of 64 channels: 72 and
# 66 output channels (a partial last block), 70 and 130 input channels (the backward input's rows), and
# ResNet-18's last stage at batch 8 (512 x 512 on 4x4 maps: 8 blocks). The last three run the blocked passes
# (c_in + c_out <= 256 and at least two blocks of tiles, each thread's blocks in its own slot): 64 + 64 channels
# in blocks of 128 tiles, 550 tiles -> 5 blocks in 4 weight-gradient groups (one of two blocks), a partial last
# block; 5 + 11 channels in blocks of 1024 tiles (2108 tiles, no padding); 40 + 24 channels with padding 2 (the
# backward input's 540 input tiles, 3 blocks, and a 25 x 32 output).
WINOGRAD_CASES = [(2, 5, 7, 9, 11, 3, 1, 1, 1), (1, 3, 4, 5, 5, 3, 1, 0, 1), (3, 6, 5, 7, 4, 3, 1, 2, 1),
                  (2, 16, 8, 1, 1, 3, 1, 1, 1), (1, 4, 4, 2, 3, 3, 1, 1, 1), (2, 33, 17, 13, 6, 3, 1, 1, 1),
                  (1, 2, 3, 3, 8, 3, 1, 0, 1), (4, 512, 512, 13, 11, 3, 1, 1, 1), (2, 70, 72, 5, 5, 3, 1, 1, 1),
                  (1, 130, 66, 3, 4, 3, 1, 2, 1), (8, 512, 512, 4, 4, 3, 1, 1, 1),
                  (5, 64, 64, 19, 21, 3, 1, 1, 1), (2, 5, 11, 61, 67, 3, 1, 0, 1), (3, 40, 24, 23, 30, 3, 1, 2, 1)]


@pytest.mark.parametrize("case", WINOGRAD_CASES, ids=_ids)
def test_winograd_vs_torch_float64(K, case):
    n, ci, co, h, w, k, s, p, g = case
    x, wt, b, dy = _make(case, True)
    y_ref, dx_ref, dw_ref, db_ref = _ref(x, wt, b, s, p, g, dy)
    # the transforms reorder the sums (entries 0, +-1, +-1/2): a few float32 ulps of the partial sums
    tol = 2e-5 * max(1.0, (ci * 9) ** 0.5 / 8)
    close(K.conv2d_forward(x, wt, b, s, p, g, algo="winograd"), y_ref, tol, tol, what="y")
    close(K.conv2d_backward_input(dy, wt, x.shape, s, p, g, algo="winograd"), dx_ref, tol, tol, what="dx")
    dw0, db0 = torch.randn_like(wt), torch.randn(co)   # accumulates into dw/db like the other algorithms
    dw, db = K.conv2d_backward_weight(dy, x, wt.shape, s, p, g, bias=True, algo="winograd", dw=dw0.clone(),
                                      db=db0.clone())
    close(dw - dw0, dw_ref, 4 * tol, 4 * tol, what="dw")
    close(db - db0, db_ref, tol, tol, what="db")
    # the variant equals the plain one (im2col)
    close(K.conv2d_forward(x, wt, b, s, p, g, algo="winograd"), K.conv2d_forward(x, wt, b, s, p, g, algo="im2col"),
          tol, tol, what="winograd vs im2col y")


def test_winograd_blocks_hold_a_fraction_of_the_transformed_kernels(K):
    """Tiles that fit one chunk: the output channels run in blocks of 64, so the workspace holds 64 rows of the
    16 transformed kernel planes, not all 512 (ResNet-18's last stage: 25.2 MB at batch 32 before, 6.8 now);
    several chunks keep the whole transform."""
    planes = lambda ci, co: 16 * ci * co * 4   # noqa: E731 - U (or dU) in bytes, all rows
    for n in (8, 32):
        ws = K.conv2d_workspace_bytes(K.conv2d_params((n, 512, 4, 4), (512, 512, 3, 3), 1, 1, 1), "winograd")
        assert 0 < ws < planes(512, 512) / 2, (n, ws)
    many = K.conv2d_workspace_bytes(K.conv2d_params((4, 512, 13, 11), (512, 512, 3, 3), 1, 1, 1), "winograd")
    assert many >= planes(512, 512)


def _resolve(algo, *params):
    """The C library's resolution of ``algo`` for Conv2dParams(*params) (-1: does not apply)."""
    return capi.raw.port_conv2d_resolve_algo(ctypes.byref(capi.Conv2dParams(*params)), algo)


def test_winograd_legality_and_auto_choice(K):
    resolve = lambda *a: _resolve(capi.CONV_WINOGRAD, *a)  # noqa: E731
    # n, c_in, h, w, c_out, kh, kw, sh, sw, ph, pw, groups
    assert resolve(1, 4, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1) == capi.CONV_WINOGRAD
    for bad in [(1, 4, 8, 8, 4, 3, 3, 2, 2, 1, 1, 1), (1, 4, 8, 8, 4, 3, 3, 1, 1, 1, 1, 2),
                (1, 4, 8, 8, 4, 5, 5, 1, 1, 1, 1, 1), (1, 4, 8, 8, 4, 3, 3, 1, 1, 3, 3, 1)]:
        assert resolve(*bad) == -1, bad
    # rows wider than the kernel's stack buffers (PORT_WG_ROW_MAX = 520 floats: w + 2 pad + 4)
    assert resolve(1, 1, 3, 514, 1, 3, 3, 1, 1, 1, 1, 1) == capi.CONV_WINOGRAD
    assert resolve(1, 1, 3, 515, 1, 3, 3, 1, 1, 1, 1, 1) == -1
    with pytest.raises(NotImplementedError, match="not supported"):
        K.conv2d_forward(torch.randn(1, 4, 8, 8), torch.randn(4, 4, 3, 3), stride=2, algo="winograd")
    # AUTO: winograd where each GEMM gets >= 64 tiles and >= 16 channels each side, else im2col
    auto = lambda *a: _resolve(capi.CONV_AUTO, *a)  # noqa: E731
    assert auto(1, 16, 16, 16, 16, 3, 3, 1, 1, 1, 1, 1) == capi.CONV_WINOGRAD    # 64 tiles
    assert auto(1, 16, 16, 14, 16, 3, 3, 1, 1, 1, 1, 1) == capi.CONV_IM2COL      # 8 x 7 = 56 tiles
    assert auto(4, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1) == capi.CONV_WINOGRAD      # 4 x 16 tiles
    assert auto(2, 8, 16, 16, 16, 3, 3, 1, 1, 1, 1, 1) == capi.CONV_IM2COL       # c_in 8
    assert auto(2, 16, 16, 16, 16, 1, 1, 1, 1, 0, 0, 1) == capi.CONV_DIRECT


def test_rt_patch_call_reads_band_and_square_tiles(K):
    """port_rt_exec's patch calls: iv[15] = tile height, iv[14] = tile width (bundles written before row bands
    carry 0 there and mean square tiles of iv[15]); both tilings give the convolution."""
    n, ci, co, h, w, k, s, p, g = 2, 5, 12, 19, 17, 3, 2, 1, 1
    x, wt, b, _ = _make((n, ci, co, h, w, k, s, p, g), True)
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    y_ref = F.conv2d(x.double(), wt.double(), b.double(), s, p)
    iv = [n, ci, h, w, co, k, k, s, s, p, p, g, ho, wo]
    for tw, th in ((wo, 2), (3, 9), (0, 3)):     # (3, 9): a runtime reading th x th would want more workspace
        prm = K.conv2d_params(x.shape, wt.shape, s, p, g)
        ws_bytes = K.conv2d_patch_workspace_bytes(prm, (th, tw or th))
        ws = torch.empty(ws_bytes, dtype=torch.uint8)
        y = torch.full((n, co, ho, wo), float("nan"))
        rc = capi.RtCall()
        rc.kernel = 4                                  # PORT_RT_CONV2D_PATCH_FORWARD (port_rt.h)
        rc.ws_bytes = ws_bytes
        for i, v in enumerate(iv + [tw, th]):
            rc.iv[i] = v
        ptrs = (ctypes.c_void_p * capi.RT_MAX_PTRS)(y.data_ptr(), x.data_ptr(), wt.data_ptr(), b.data_ptr())
        st = capi.raw.port_rt_exec(ctypes.byref(rc), ptrs, ws.data_ptr(), ctypes.byref(capi.RtState()))
        assert st == 0, capi.status_string(st)
        close(y, y_ref, 1e-5, 1e-5, what=f"tile {th}x{tw}")


# ----------------------------------------------------------------------------- grouped convolutions
# Groups with small per-group GEMMs run in one parallel region over the groups (conv.c, conv_grouped): group
# widths 1..60 (non-multiples of 8 among them), 2..32 groups (more than the 16 workspace slots: a slot runs
# several groups), stride 1/2, padding 0..2, 1x1 and 5x5 kernels, batch folding (small maps) and none, and
# ResNeXt-50's first-stage grouped 3x3 at batch 8 (large enough to open the region).
GROUPED_CASES = [(3, 64, 64, 11, 9, 3, 1, 1, 32), (2, 80, 120, 9, 13, 3, 2, 1, 2), (5, 96, 96, 6, 5, 3, 1, 1, 12),
                 (4, 36, 24, 7, 7, 3, 2, 2, 4), (2, 39, 26, 8, 8, 1, 1, 0, 13), (3, 20, 20, 5, 6, 5, 1, 2, 20),
                 (2, 24, 48, 10, 10, 3, 2, 1, 3), (8, 128, 128, 16, 16, 3, 1, 1, 32),
                 (8, 256, 256, 4, 4, 3, 2, 1, 32),
                 # 16 images in the lanes (group_lane_ok): several blocks and a partial one, odd group widths (the
                 # forward's four output channels at once and the rest), stride 2, a non-square map
                 (33, 24, 16, 5, 7, 3, 2, 1, 8), (17, 16, 16, 4, 4, 3, 1, 1, 2), (17, 15, 25, 3, 5, 3, 1, 1, 5),
                 (20, 12, 18, 2, 2, 3, 1, 1, 3), (18, 8, 12, 7, 6, 5, 2, 2, 2),
                 # the weight gradient tap by tap (maps of 16 outputs or more): eight, four and one output channels'
                 # sums at once; RegNet's 8x8 layer (a full block and a partial one)
                 (17, 15, 25, 5, 5, 3, 1, 1, 5), (9, 16, 16, 8, 8, 3, 1, 1, 2),
                 # flat phase planes (group_flat_ok): RegNet-Y-400MF's stride-2 layers on 32x32 and 16x16 maps (a
                 # stack of one image and of three), odd maps, stride 3, 5x5 at padding 2, the im2col path beside
                 # (padding = kernel: no flat form)
                 (3, 48, 48, 32, 32, 3, 2, 1, 6), (7, 104, 104, 16, 16, 3, 2, 1, 13), (3, 18, 12, 13, 11, 3, 2, 1, 3),
                 (2, 12, 18, 17, 14, 3, 3, 1, 6), (3, 16, 8, 15, 15, 5, 2, 2, 2), (2, 12, 12, 9, 9, 1, 1, 1, 3)]


def _flat_floats(n, ci, co, h, w, k, s, p, g):
    """group_flat_ok and group_flat_floats in Python (kernels/src/conv.c): a slot's floats, None off that path"""
    cig, cog, ho, wo = ci // g, co // g, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    if g < 2 or p >= k or min(s, k) > 8 or max(cig, cog) * k * k > 288:
        return None
    ru = lambda v: -(-v // 32) * 32   # noqa: E731 - FLAT_NR
    t, nph = (k - 1) // s, min(s, k)
    rows, ws, u, v = ho + t, wo + t, (p + h - 1) // s + 1, (p + w - 1) // s + 1
    m = max(1, min(n, 256 // (rows * ws)))
    lf, lb = ru((m * rows - t) * ws), ru(((m - 1) * (u + t) + u) * (v + t))
    if 3 * m * ho * wo < 2 * lf:
        return None
    fwd = cig * nph * nph * (m * rows * ws + t + 32) + cog * lf + cog * cig * k * k * 16
    return max(fwd, cog * (m * (u + t) * (v + t) + t + 32) + s * s * cig * lb + 16 + cig * cog * k * k)


def _grouped_run(K, case, x, wt, b, dy, algo):
    n, ci, co, h, w, k, s, p, g = case
    y = K.conv2d_forward(x, wt, b, s, p, g, algo=algo)
    dx = K.conv2d_backward_input(dy, wt, x.shape, s, p, g, algo=algo)
    dw, db = K.conv2d_backward_weight(dy, x, wt.shape, s, p, g, bias=True, algo=algo)
    dwo, dbo = K.conv2d_backward_weight(dy, x, wt.shape, s, p, g, bias=True, algo=algo,
                                        dw=torch.full_like(wt, float("nan")), db=torch.full_like(b, float("nan")),
                                        overwrite=True)
    assert torch.equal(dwo, dw) and torch.equal(dbo, db), "overwrite differs from accumulating into zeros"
    return y, dx, dw, db


@pytest.mark.parametrize("case", GROUPED_CASES, ids=_ids)
def test_grouped_conv_vs_torch_and_equal_bits_at_any_thread_count(K, case):
    n, ci, co, h, w, k, s, p, g = case
    x, wt, b, dy = _make(case, True)
    refs = _ref(x, wt, b, s, p, g, dy)
    prm = K.conv2d_params(x.shape, wt.shape, s, p, g)
    threads = capi.get_num_threads()
    try:
        for algo in ("im2col", "auto"):
            runs = []
            for nt in (1, 2, 3):
                capi.set_num_threads(nt)
                runs.append(_grouped_run(K, case, x, wt, b, dy, algo))
            for got, want, what in zip(runs[0], refs, ("y", "dx", "dw", "db")):
                close(got, want, 1e-4 if what[0] == "d" else 1e-5, 1e-5, what=f"{algo} {what}")
            for nt, run in zip((2, 3), runs[1:]):
                for a, b_, what in zip(runs[0], run, ("y", "dx", "dw", "db")):
                    assert torch.equal(a, b_), f"{algo} {what}: bits differ between 1 and {nt} threads"
    finally:
        capi.set_num_threads(threads)
    # the grouped path ran: its workspace is min(groups, 16) slots of one group's im2col (and fold) buffers, or on
    # small maps with at most 16 channels a group each way, of the lane buffers (x, y or dy, and the weight
    # gradient's 16 partial sums per weight), or of the flat phase planes' buffers
    kk, cog = ci // g * k * k, co // g
    P = ((h + 2 * p - k) // s + 1) * ((w + 2 * p - k) // s + 1)
    nb = 1 if P >= 256 or n < 2 else min(n, -(-256 // P))
    assert cog * kk * P < 1 << 20, "a case for the grouped path: one image's per-group GEMM below the split"
    if n >= 8 and ci // g <= 16 and cog <= 16 and h * w <= 64 and k * k <= 25:   # group_lane_ok: image lanes
        cig = ci // g
        assert K.conv2d_workspace_bytes(prm, "im2col") == 4 * min(g, 16) * (cig * h * w + cog * P + cog * kk) * 16
    elif _flat_floats(*case) is not None:
        assert K.conv2d_workspace_bytes(prm, "im2col") == 4 * min(g, 16) * _flat_floats(*case)
    else:
        assert K.conv2d_workspace_bytes(prm, "im2col") == 4 * min(g, 16) * (kk + (cog if nb > 1 else 0)) * nb * P


# Slot drivers (slot_ok in kernels/src/conv.c: one region over items of a chunk of images x a group, each item on
# one thread; the weight gradient's slots summed in slot order): RegNet's 1x1 layers on 4x4 and 2x2 maps (chunks
# of 5+4 and 9+8 images), a pointwise map of 272 pixels (image by image), a stem-like 3x3 stride 2 image by image
# on im2col, a 3x3 stride 2 padded fold of 4+3 images, two groups whose per-image GEMMs are too large for the
# grouped drivers (image by image, and folded 2+1 on an odd map), a 10x10 map whose three chunks of 3+3+2 images
# become four of 2 (an even number of items); every case opens the region (work above PORT_PAR_MIN_MACS).
SLOT_CASES = [(9, 40, 56, 4, 4, 1, 1, 0, 1), (17, 96, 72, 2, 2, 1, 1, 0, 1), (5, 12, 20, 16, 17, 1, 1, 0, 1),
              (3, 3, 16, 33, 35, 3, 2, 1, 1), (7, 20, 24, 9, 9, 3, 2, 1, 1), (2, 64, 64, 16, 16, 3, 1, 1, 2),
              (3, 66, 40, 15, 17, 3, 1, 1, 2), (8, 32, 40, 10, 10, 1, 1, 0, 1)]


def _slot_ws_floats(case, direct):
    """slot_ws_floats in Python (kernels/src/conv.c): the forward's 2 slots of a chunk's im2col and output blocks,
    the weight gradient's 2 slots and one partial weight gradient."""
    n, ci, co, h, w, k, s, p, g = case
    kk, cog = ci // g * k * k, co // g
    P = ((h + 2 * p - k) // s + 1) * ((w + 2 * p - k) // s + 1)
    sizes = []
    for cols, slots in ((256, 2), (64, 2)):
        fold = 1 if P >= cols or n < 2 else min(n, -(-cols // P))
        nb = max(1, min(fold, (n + 1) // 2))
        chunks = -(-n // nb)
        if chunks * g % 2 and chunks * g < 8:   # an odd number of items under 8: one chunk more
            nb = (n + chunks) // (chunks + 1)
            chunks = -(-n // nb)
        S = min(chunks * g, slots)
        sizes.append((S, (kk + cog) * nb * P if nb > 1 else (0 if direct else kk * P)))
    (sf, lf), (sw, lw) = sizes
    return max(sf * lf, sw * lw + (sw - 1) * co * kk)


@pytest.mark.parametrize("algo", ["im2col", "auto"])
@pytest.mark.parametrize("case", SLOT_CASES, ids=_ids)
def test_slot_conv_vs_torch_and_equal_bits_at_any_thread_count(K, case, algo):
    n, ci, co, h, w, k, s, p, g = case
    x, wt, b, dy = _make(case, True)
    prm = K.conv2d_params(x.shape, wt.shape, s, p, g)
    direct = k == 1 and s == 1 and p == 0 and algo == "auto"
    assert K.conv2d_workspace_bytes(prm, algo) == 4 * _slot_ws_floats(case, direct), "not the slot drivers"
    refs = _ref(x, wt, b, s, p, g, dy)
    threads = capi.get_num_threads()
    try:
        runs = []
        for nt in (1, 2, 3):
            capi.set_num_threads(nt)
            runs.append(_grouped_run(K, case, x, wt, b, dy, algo))
    finally:
        capi.set_num_threads(threads)
    for got, want, what in zip(runs[0], refs, ("y", "dx", "dw", "db")):
        close(got, want, 1e-4 if what[0] == "d" else 1e-5, 1e-5, what=f"{algo} {what}")
    for nt, run in zip((2, 3), runs[1:]):
        for a, b_, what in zip(runs[0], run, ("y", "dx", "dw", "db")):
            assert torch.equal(a, b_), f"{algo} {what}: bits differ between 1 and {nt} threads"
    # accumulating adds to what dw held: slot 0 sums into dw itself, the other slots' partials after it
    dw0 = torch.randn_like(wt)
    dwa, _ = K.conv2d_backward_weight(dy, x, wt.shape, s, p, g, bias=True, algo=algo, dw=dw0.clone())
    close(dwa, dw0.double() + refs[2], 1e-4, 1e-5, what=f"{algo} dw accumulated")
