"""Attention with the issue-54 extensions vs float64 autograd: boolean and additive masks of every broadcastable
shape, grouped-query attention (kv_heads < heads), causal with a mask, and attention dropout (the keep mask from
PORT's generator, drawn again by the backward), plain and tiled, forward and every gradient; the same bits at
1/2/3 threads; refusals of bad parameters."""
import ctypes

import pytest
import torch
import torch.nn.functional as F

from port.exec import capi
from port.ops import random as R


def _mask(kind, dims, g):
    if kind == "bool":
        m = torch.rand(dims, generator=g) > 0.3
        m[..., 0] = True           # every query sees a key (a fully masked row is tested on its own)
        return m
    m = torch.randn(dims, generator=g) * 2
    if dims[-1] == 1:              # one value for a whole row of scores: -1e4 would only cost their float32 digits
        return m
    return m.masked_fill(torch.rand(dims, generator=g) < 0.2, -1e4)


def _ref(q, k, v, dy, mask, causal, scale, keep=None, p=0.0):
    """float64 o and (dq, dk, dv): torch's math path (enable_gqa), or with dropout, or causal with Tq != Tk (the
    kernel's limit j <= i + Tk - Tq, aligned bottom right; torch's is_causal aligns top left), the same math with
    PORT's keep mask."""
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    m = mask if mask is None or mask.dtype == torch.bool else mask.double()
    h, hkv = q.shape[1], k.shape[1]
    if keep is None and not (causal and q.shape[2] != k.shape[2]):
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, scale=scale,
                                           enable_gqa=hkv != h)
    else:
        kr, vr = k.repeat_interleave(h // hkv, 1), v.repeat_interleave(h // hkv, 1)
        s = q @ kr.transpose(-1, -2) * scale
        if m is not None:
            s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m
        if causal:
            tq, tk = s.shape[-2:]
            s = s.masked_fill(torch.ones(tq, tk, dtype=torch.bool).triu(tk - tq + 1), float("-inf"))
        a = torch.softmax(s, -1)
        o = (a if keep is None else a * keep.double() / (1 - R._f32(p))) @ vr
    o.backward(dy.double())
    return o.detach(), q.grad, k.grad, v.grad


CASES = [  # (n, h, hkv, tq, tk, dh, mask kind, mask dims, causal)
    (2, 3, 3, 13, 150, 12, "bool", (2, 1, 13, 150), False),     # HF's [N, 1, T, T] boolean mask, tk over a tile
    (2, 4, 2, 9, 9, 8, "bool", (1, 4, 1, 9), True),             # per head, causal too, GQA 2 groups
    (1, 4, 1, 70, 33, 16, "add", (1, 1, 70, 33), False),        # additive [Tq, Tk], multi-query
    (3, 2, 2, 5, 7, 4, "add", (3, 2, 5, 7), False),             # full additive
    (2, 2, 2, 6, 6, 8, "add", (2, 1, 1, 6), True),              # additive key padding + causal
    (2, 6, 3, 17, 17, 5, None, None, True),                     # GQA, causal, no mask
    (2, 2, 2, 8, 11, 4, "bool", (1, 1, 1, 1), False),           # a scalar mask
    (2, 4, 2, 11, 19, 8, "add", (1, 4, 11, 1), False),          # per head and query, broadcast over the keys
    (3, 2, 1, 7, 40, 6, "add", (3, 1, 1, 40), True),            # key padding, causal with Tq < Tk, multi-query
    (1, 3, 3, 5, 9, 7, "bool", (1, 3, 5, 9), False),            # batch broadcast, per head, odd head size
]


@pytest.mark.parametrize("algo", ["plain", "tiled"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_attention_masks_gqa_dropout_vs_float64(K, algo, case, p):
    n, h, hkv, tq, tk, dh, kind, dims, causal = case
    g = torch.Generator().manual_seed(tq * 31 + tk)
    q, dy = torch.randn(n, h, tq, dh, generator=g), torch.randn(n, h, tq, dh, generator=g)
    k, v = torch.randn(n, hkv, tk, dh, generator=g), torch.randn(n, hkv, tk, dh, generator=g)
    mask = _mask(kind, dims, g) if kind else None
    scale = 0.7 / dh ** 0.5
    seed, stream = 1234, R.rng_stream(2, 9)
    kw = dict(causal=causal, scale=scale, algo=algo, dropout_p=p, seed=seed, stream=stream)
    km = None if mask is None else (mask.to(torch.uint8) if kind == "bool" else mask.contiguous())
    o, lse = K.attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), km, **kw)
    keep = R.keep_mask(torch, seed, stream, (n, h, tq, tk), p) if p else None
    ro, rdq, rdk, rdv = _ref(q, k, v, dy, mask, causal, scale, keep, p)
    assert torch.allclose(o.double(), ro, atol=2e-5, rtol=1e-4), float((o.double() - ro).abs().max())
    dq, dk, dv = K.attention_backward(dy, q, k, v, o, lse, km, **kw)
    for got, want, name in ((dq, rdq, "dq"), (dk, rdk, "dk"), (dv, rdv, "dv")):
        err = float((got.double() - want).abs().max())
        assert torch.allclose(got.double(), want, atol=5e-5, rtol=1e-4), (name, err)
    # each gradient alone is the same as with the others
    for i in range(3):
        alone = K.attention_backward(dy, q, k, v, o, lse, km, needs_grad=tuple(j == i for j in range(3)), **kw)
        assert torch.equal(alone[i], (dq, dk, dv)[i])


def test_attention_dropout_draws_its_stream(K):
    """Another stream or seed drops other probabilities; the same one the same (forward and backward agree)."""
    q, k, v = (torch.randn(2, 2, 8, 4) for _ in range(3))
    a = K.attention_forward(q, k, v, dropout_p=0.5, seed=1, stream=2)[0]
    assert torch.equal(a, K.attention_forward(q, k, v, dropout_p=0.5, seed=1, stream=2)[0])
    assert not torch.equal(a, K.attention_forward(q, k, v, dropout_p=0.5, seed=1, stream=3)[0])
    assert not torch.equal(a, K.attention_forward(q, k, v, dropout_p=0.5, seed=2, stream=2)[0])


def test_attention_fully_masked_rows_are_zero(K):
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    m = torch.ones(1, 1, 4, 4, dtype=torch.uint8)
    m[0, 0, 2] = 0
    for algo in ("plain", "tiled"):
        o, lse = K.attention_forward(q, k, v, m, algo=algo)
        assert torch.equal(o[:, :, 2], torch.zeros(1, 2, 8)) and torch.isinf(lse.view(1, 2, 4)[:, :, 2]).all()
        dq, dk, dv = K.attention_backward(torch.randn(1, 2, 4, 8), q, k, v, o, lse, m, algo=algo)
        assert torch.isfinite(dq).all() and torch.equal(dq[:, :, 2], torch.zeros(1, 2, 8))


@pytest.mark.parametrize("algo", ["plain", "tiled"])
def test_attention_ext_same_bits_at_any_thread_count(K, algo):
    g = torch.Generator().manual_seed(0)
    q, dy = torch.randn(4, 8, 140, 16, generator=g), torch.randn(4, 8, 140, 16, generator=g)
    k, v = torch.randn(4, 2, 140, 16, generator=g), torch.randn(4, 2, 140, 16, generator=g)
    m = torch.randn(4, 1, 140, 140, generator=g)
    kw = dict(algo=algo, dropout_p=0.2, seed=3, stream=4, causal=True)
    prev = capi.get_num_threads()
    outs = []
    try:
        for t in (1, 2, 3):
            capi.set_num_threads(t)
            o, lse = K.attention_forward(q, k, v, m, **kw)
            outs.append((o, lse, *K.attention_backward(dy, q, k, v, o, lse, m, **kw)))
    finally:
        capi.set_num_threads(prev)
    for o in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], o))


def test_attention_ext_refusals(K):
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 6, 8)
    o, lse = torch.empty(q.shape), torch.empty(8, 5)
    ws = torch.empty(1 << 20, dtype=torch.uint8)

    def run(**kw):
        p = K.attention_params(q.shape, k.shape)
        mask = kw.pop("mask", None)
        for f, val in kw.items():
            if f == "mask_dims":
                p.mask_dims[:] = val
            else:
                setattr(p, f, val)
        return capi.raw.port_attention_forward(o.data_ptr(), lse.data_ptr(), q.data_ptr(), k.data_ptr(),
                                               k.data_ptr(), mask, ctypes.byref(p), 1, ws.data_ptr(), ws.numel())
    m = torch.ones(2, 1, 5, 6, dtype=torch.uint8)
    assert run() == capi.PORT_OK
    assert run(kv_heads=3) == capi.PORT_ERR_SHAPE                     # does not divide the heads
    assert run(kv_heads=-1) == capi.PORT_ERR_SHAPE
    assert run(dropout_p=1.0) == capi.PORT_ERR_ARG
    assert run(dropout_p=float("nan")) == capi.PORT_ERR_ARG
    assert run(mask_kind=3) == capi.PORT_ERR_ARG
    assert run(mask_kind=1, mask_dims=(2, 1, 5, 6)) == capi.PORT_ERR_NULL        # a mask kind without the mask
    assert run(mask_kind=1, mask_dims=(2, 1, 5, 6), mask=m.data_ptr()) == capi.PORT_OK
    assert run(mask_kind=1, mask_dims=(2, 2, 5, 6), mask=m.data_ptr()) == capi.PORT_ERR_SHAPE   # 2 of 4 heads
    assert run(mask_kind=2, mask_dims=(2, 1, 4, 6), mask=m.data_ptr()) == capi.PORT_ERR_SHAPE
    p = K.attention_params(q.shape, k.shape, mask=torch.ones(2, 1, 5, 6))
    assert capi.raw.port_attention_mask_numel(ctypes.byref(p)) == 60
    p.mask_kind = 0
    assert capi.raw.port_attention_mask_numel(ctypes.byref(p)) == 12
