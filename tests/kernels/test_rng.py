"""PORT's one generator (kernels/src/rng.c, port/ops/random.py): Philox4x32-10 against Random123's known answers,
the C draws against the plain-Python reference bit for bit (and the torch-vectorised form the torch engines
use), dropout's and bernoulli's masks from it, their statistics (rates within binomial bounds, independence
across streams and seeds, uniform draws) and the same bits at any thread count."""
import ctypes
import math

import pytest
import torch

from port.exec import capi
from port.ops import random as R

# Random123 kat_vectors: counter[4], key[2] -> output[4]
KAT = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]

SEEDS = [(0, 0), (7, R.rng_stream(3, 5)), (0xDEADBEEF12345678, R.rng_stream(2**32 + 9, 2**31 - 1))]


def _c_draws(seed, stream, count, offset=0):
    out = (ctypes.c_uint32 * max(count, 1))()
    assert capi.raw.port_rng_u32(out, count, offset, seed, stream) == capi.PORT_OK
    return list(out)[:count]


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_philox_known_answers(K, ctr, key, want):
    assert R.philox4x32_10(ctr, key) == want
    out = (ctypes.c_uint32 * 4)()
    capi.raw.port_philox4x32_10(out, (ctypes.c_uint32 * 4)(*ctr), (ctypes.c_uint32 * 2)(*key))
    assert tuple(out) == want


@pytest.mark.parametrize("seed,stream", SEEDS)
def test_draws_match_the_python_reference(K, seed, stream):
    """C (any offset, not a multiple of 4), the plain-Python reference and the torch form: the same words."""
    for count, offset in ((37, 0), (23, 5), (9, 2**33 - 3)):
        ref = R.draws_reference(seed, stream, count, offset)
        assert _c_draws(seed, stream, count, offset) == ref
    ref = R.draws_reference(seed, stream, 103)
    assert R.draws(torch, seed, stream, 103).tolist() == ref


def test_rng_stream_matches_port_rt():
    for c, o in ((0, 0), (7, 3), (2**40 + 5, 99), (2**32 - 1, 2**31 - 1)):
        assert capi.raw.port_rt_rng_stream(c, o) == R.rng_stream(c, o)
    assert R.rng_stream(1, 2) == 1 | 2 << 32


def test_threshold_is_the_float32_probability():
    assert R.threshold(0.0) == 0 and R.threshold(1.0) == 2**32 and R.threshold(-1.0) == 0
    assert R.threshold(0.5) == 2**31
    p32 = 0.10000000149011612     # 0.1 as a float32
    assert R.threshold(0.1) == math.ceil(p32 * 2**32)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_mask_is_the_generator_bit_for_bit(K, p):
    """The C kernel's mask is draws >= threshold(p), as the torch engine's (keep_mask) and port-rt's."""
    seed, stream = 0xABCDEF0123, R.rng_stream(4, 17)
    x = torch.randn(3, 5, 67)
    y, m = K.dropout_forward(x, p, seed=seed, stream=stream)
    keep = R.keep_mask(torch, seed, stream, x.shape, p)
    assert torch.equal(m.bool(), keep)
    ref = [u >= R.threshold(p) for u in R.draws_reference(seed, stream, x.numel())]
    assert m.flatten().bool().tolist() == ref
    scale = R._f32(1.0 / (1.0 - R._f32(p)))
    assert torch.equal(y, (x * keep) * scale)


def _binomial_ok(k, n, p, sigmas=6.0):
    return abs(k - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.8])
def test_dropout_statistics(K, p):
    """Keep rate within binomial bounds; masks of other streams and seeds independent (agreement rate
    p^2 + (1-p)^2, joint keeps (1-p)^2); neighbours uncorrelated; draws uniform over 16 bins (chi-square)."""
    n = 200_000
    x = torch.ones(n)
    masks = [K.dropout_forward(x, p, seed=s, stream=st)[1].bool() for s, st in ((1, 0), (1, 1), (2, 0))]
    for m in masks:
        assert _binomial_ok(int(m.sum()), n, 1 - p)
    for a, b in ((0, 1), (0, 2), (1, 2)):
        both = int((masks[a] & masks[b]).sum())
        assert _binomial_ok(both, n, (1 - p) ** 2), (a, b, both)
    m = masks[0]
    assert _binomial_ok(int((m[1:] & m[:-1]).sum()), n - 1, (1 - p) ** 2)
    u = R.draws(torch, 1, 0, n)
    counts = torch.bincount(u >> 28, minlength=16).double()
    chi2 = float(((counts - n / 16) ** 2 / (n / 16)).sum())
    assert chi2 < 50.0, chi2        # 15 degrees of freedom: P(chi2 > 50) ~ 1e-5


@pytest.mark.parametrize("prob", [0.0, 0.25, 0.8, 1.0])
def test_bernoulli(K, prob):
    n, seed, stream = 50_001, 5, R.rng_stream(1, 2)
    y = torch.empty(n)
    assert capi.raw.port_bernoulli_forward(y.data_ptr(), n, prob, seed, stream) == capi.PORT_OK
    want = R.draws(torch, seed, stream, n) < R.threshold(prob)
    assert torch.equal(y, want.float())
    assert _binomial_ok(int(y.sum()), n, prob)
    if prob in (0.0, 1.0):
        assert int(y.sum()) == n * prob


def test_rng_refusals(K):
    y, m = torch.empty(8), torch.empty(8, dtype=torch.uint8)
    raw = capi.raw
    assert raw.port_bernoulli_forward(y.data_ptr(), 8, 1.5, 0, 0) == capi.PORT_ERR_ARG
    assert raw.port_bernoulli_forward(y.data_ptr(), 8, -0.1, 0, 0) == capi.PORT_ERR_ARG
    assert raw.port_bernoulli_forward(y.data_ptr(), 8, float("nan"), 0, 0) == capi.PORT_ERR_ARG
    assert raw.port_bernoulli_forward(None, 8, 0.5, 0, 0) == capi.PORT_ERR_NULL
    assert raw.port_bernoulli_forward(y.data_ptr(), -1, 0.5, 0, 0) == capi.PORT_ERR_SHAPE
    assert raw.port_dropout_forward(y.data_ptr(), m.data_ptr(), y.data_ptr(), 8, 1.0, 0, 0) == capi.PORT_ERR_ARG
    assert raw.port_dropout_forward(y.data_ptr(), None, y.data_ptr(), 8, 0.5, 0, 0) == capi.PORT_ERR_NULL
    assert raw.port_rng_u32(None, 4, 0, 0, 0) == capi.PORT_ERR_NULL
    assert raw.port_rng_u32((ctypes.c_uint32 * 4)(), 4, -1, 0, 0) == capi.PORT_ERR_SHAPE


def test_rng_kernels_same_bits_at_any_thread_count(K):
    x = torch.randn(300_007)
    prev = capi.get_num_threads()
    outs = []
    try:
        for t in (1, 2, 3):
            capi.set_num_threads(t)
            y, m = K.dropout_forward(x, 0.3, seed=99, stream=12345)
            b = torch.empty(200_003)
            assert capi.raw.port_bernoulli_forward(b.data_ptr(), b.numel(), 0.6, 99, 7) == capi.PORT_OK
            outs.append((y, m, b))
    finally:
        capi.set_num_threads(prev)
    for o in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], o))
