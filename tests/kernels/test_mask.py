"""Issue 54's mask kernels (kernels/src/mask.c; port-rt ids 122-125): what HF's attention_mask becomes before
attention. port_mask_cast (to bool / float32 from float32, bool, int64), port_mask_logic (and / or / xor of two
bool masks broadcast on every axis), port_expand_mask and port_mask_index2 (mask[i0, i1] by two broadcast int64
index tensors). Exact against torch on odd shapes with every broadcast, the same bits at 1/2/3 threads, their
refusals and port-rt's call rules."""
import ctypes
import itertools

import pytest
import torch

from port.exec import capi
from port.ops.elementwise import collapse

SHAPE = (3, 5, 7, 9)
BCASTS = [tuple(1 if (b >> i) & 1 else SHAPE[i] for i in range(4)) for b in range(16)]
DT = {torch.float32: 0, torch.bool: 1, torch.int64: 2}
OPS = {0: torch.logical_and, 1: torch.logical_or, 2: torch.logical_xor}


def _dims(dims):
    return (ctypes.c_int64 * 6)(*(list(dims) + [1] * (6 - len(dims))))


def cast(x, dtype):
    y = torch.empty(x.shape, dtype=dtype)
    assert capi.raw.port_mask_cast(y.data_ptr(), DT[dtype], x.data_ptr(), DT[x.dtype], x.numel()) == capi.PORT_OK
    return y


def _broadcast2(kernel, a, b, op):
    """A two-operand mask kernel (port_mask_logic, port_mask_compare) on a and b broadcast to one shape."""
    shape = torch.broadcast_shapes(a.shape, b.shape)
    y = torch.empty(shape, dtype=torch.bool)
    dims, ma, mb = collapse(tuple(a.shape), tuple(b.shape), tuple(shape))
    st = kernel(y.data_ptr(), a.data_ptr(), b.data_ptr(), op, len(dims), ma, mb, _dims(dims))
    assert st == capi.PORT_OK
    return y


def logic(a, b, op):
    return _broadcast2(capi.raw.port_mask_logic, a, b, op)


def expand(x, shape):
    y = torch.empty(shape, dtype=torch.bool)
    dims, mx, _ = collapse(tuple(x.shape), tuple(shape), tuple(shape))
    assert capi.raw.port_expand_mask(y.data_ptr(), x.data_ptr(), len(dims), mx, _dims(dims)) == capi.PORT_OK
    return y


def index2(x, i0, i1):
    shape = torch.broadcast_shapes(i0.shape, i1.shape)
    y = torch.empty(shape, dtype=torch.bool)
    dims, m0, m1 = collapse(tuple(i0.shape), tuple(i1.shape), tuple(shape))
    st = capi.raw.port_mask_index2(y.data_ptr(), x.data_ptr(), i0.data_ptr(), i1.data_ptr(), x.shape[0],
                                   x.shape[1], len(dims), m0, m1, _dims(dims))
    assert st == capi.PORT_OK
    return y


@pytest.mark.parametrize("src,dst", [(torch.int64, torch.bool), (torch.float32, torch.bool),
                                     (torch.bool, torch.float32), (torch.int64, torch.float32),
                                     (torch.bool, torch.bool)])
def test_mask_cast_equals_torch(src, dst):
    g = torch.Generator().manual_seed(1)
    x = {torch.int64: torch.randint(-3, 4, (7, 13), generator=g), torch.bool: torch.rand(7, 13, generator=g) < .5,
         torch.float32: torch.randn(7, 13, generator=g).masked_fill(torch.rand(7, 13, generator=g) < .4, 0.)}[src]
    if src == torch.float32:
        x[0, :3] = torch.tensor([-0.0, float("nan"), float("inf")])    # -0 is false, NaN and inf are true
    if src == torch.bool:
        x.view(torch.uint8)[0, 0] = 2          # a byte other than 0/1 still reads as true
    y = cast(x, dst)
    assert torch.equal(y, x.to(dst)) if src != torch.bool else torch.equal(y, (x.view(torch.uint8) != 0).to(dst))
    if dst == torch.bool:
        assert set(y.view(torch.uint8).unique().tolist()) <= {0, 1}


@pytest.mark.parametrize("op", [0, 1, 2])
@pytest.mark.parametrize("sa,sb", list(zip(BCASTS, reversed(BCASTS))) + [((9,), SHAPE), ((), (7, 1)),
                                                                          ((5, 1, 9), (3, 1, 7, 1))])
def test_mask_logic_equals_torch_with_every_broadcast(op, sa, sb):
    g = torch.Generator().manual_seed(len(sa) * 11 + sum(sa) + op)
    a, b = torch.rand(sa, generator=g) < .5, torch.rand(sb, generator=g) < .5
    assert torch.equal(logic(a, b, op), OPS[op](a, b))


def test_mask_logic_in_place():
    g = torch.Generator().manual_seed(2)
    a, b = torch.rand(SHAPE, generator=g) < .5, torch.rand(1, 5, 1, 9, generator=g) < .5
    want = a & b
    dims, ma, mb = collapse(SHAPE, tuple(b.shape), SHAPE)
    assert capi.raw.port_mask_logic(a.data_ptr(), a.data_ptr(), b.data_ptr(), 0, len(dims), ma, mb,
                                    _dims(dims)) == capi.PORT_OK
    assert torch.equal(a, want)


@pytest.mark.parametrize("xs", BCASTS + [(9,), (), (7, 1)], ids=lambda s: "x".join(map(str, s)) or "scalar")
def test_expand_mask_equals_torch(xs):
    x = torch.rand(xs, generator=torch.Generator().manual_seed(sum(xs))) < .5
    assert torch.equal(expand(x, SHAPE), x.expand(SHAPE))


@pytest.mark.parametrize("s0,s1", [((4, 1, 1, 1), (1, 1, 1, 16)), ((4, 1, 1, 16), (1, 1, 1, 16)),
                                   ((3, 1), (1, 5, 1, 7)), ((1,), (6,)), ((2, 3, 5), (2, 3, 5))])
def test_mask_index2_equals_torch(s0, s1):
    g = torch.Generator().manual_seed(sum(s0) + sum(s1))
    x = torch.rand(4, 16, generator=g) < .6
    i0 = torch.randint(-4, 4, s0, generator=g)      # negative indices count from the end, as in torch
    i1 = torch.randint(-16, 16, s1, generator=g)
    assert torch.equal(index2(x, i0, i1), x[i0, i1])


def test_hf_padding_mask_chain_equals_torch():
    """The chain HF builds (transformers' sdpa_mask): attention_mask.bool(), mask[batch_arange, kv_arange],
    and with a causal mask, expand to [B, 1, Q, K]."""
    B, Q = 5, 11
    am = torch.ones(B, Q, dtype=torch.int64)
    am[::2, -3:] = 0
    b_idx, kv = torch.arange(B)[:, None, None, None], torch.arange(Q)[None, None, None, :]
    causal = torch.ones(Q, Q, dtype=torch.bool).tril()[None, None]
    pad = index2(cast(am, torch.bool), b_idx, kv)
    got = expand(logic(pad, causal, 0), (B, 1, Q, Q))
    assert torch.equal(got, (am.bool()[b_idx, kv] & causal).expand(B, 1, Q, Q))


def test_mask_kernels_same_bits_at_any_thread_count():
    """Above the parallel threshold (PORT_PAR_MIN elements): [8, 4, 64, 64] masks."""
    g = torch.Generator().manual_seed(3)
    S = (8, 4, 64, 64)
    a, b = torch.rand(8, 1, 1, 64, generator=g) < .7, torch.ones(64, 64, dtype=torch.bool).tril()[None, None]
    x, f = torch.randint(0, 2, S, generator=g), torch.rand(S, generator=g) < .5
    m2 = torch.rand(64, 64, generator=g) < .5
    fx, fb = torch.randn(S, generator=g), torch.randn(1, 4, 64, 1, generator=g)
    i0, i1 = torch.randint(0, 64, (64, 1, 1, 64), generator=g), torch.randint(0, 64, (1, 8, 64, 1), generator=g)
    prev, outs = capi.get_num_threads(), []
    try:
        for t in (1, 2, 3):
            capi.set_num_threads(t)
            outs.append((logic(a, b, 1), expand(a, S), cast(x, torch.bool), cast(f, torch.float32),
                         index2(m2, i0, i1), compare(fx, fb, 3)))
    finally:
        capi.set_num_threads(prev)
    for o in outs[1:]:
        assert all(torch.equal(p, q) for p, q in zip(outs[0], o))
    assert torch.equal(outs[0][0], a | b) and torch.equal(outs[0][4], m2[i0, i1]) and torch.equal(outs[0][5], fx <= fb)


def test_mask_kernel_refusals():
    r = capi.raw
    a, b, y = torch.zeros(4, 3, dtype=torch.bool), torch.zeros(4, 3, dtype=torch.bool), torch.empty(4, 3,
                                                                                                    dtype=torch.bool)
    x64 = torch.zeros(4, 3, dtype=torch.int64)
    f32 = torch.empty(4, 3)
    d = _dims((4, 3))
    p = (y.data_ptr(), a.data_ptr(), b.data_ptr())
    # cast
    assert r.port_mask_cast(y.data_ptr(), 1, x64.data_ptr(), 2, 12) == capi.PORT_OK
    assert r.port_mask_cast(x64.data_ptr(), 2, y.data_ptr(), 1, 12) == capi.PORT_ERR_ARG     # int64 output
    assert r.port_mask_cast(y.data_ptr(), 1, x64.data_ptr(), 4, 12) == capi.PORT_ERR_ARG     # unknown dtype
    assert r.port_mask_cast(y.data_ptr(), 1, x64.data_ptr(), 2, -1) == capi.PORT_ERR_SHAPE
    assert r.port_mask_cast(f32.data_ptr(), 0, f32.data_ptr() + 4, 1, 12) == capi.PORT_ERR_ALIAS
    # logic
    assert r.port_mask_logic(*p, 0, 2, 0, 0, d) == capi.PORT_OK
    assert r.port_mask_logic(*p, 4, 2, 0, 0, d) == capi.PORT_ERR_ARG
    assert r.port_mask_logic(*p, 0, 0, 0, 0, d) == capi.PORT_ERR_SHAPE
    assert r.port_mask_logic(*p, 0, 7, 0, 0, d) == capi.PORT_ERR_SHAPE
    assert r.port_mask_logic(*p, 0, 2, 4, 0, d) == capi.PORT_ERR_SHAPE                       # a bit past the rank
    assert r.port_mask_logic(a.data_ptr() + 1, a.data_ptr(), b.data_ptr(), 0, 2, 0, 0, d) == capi.PORT_ERR_ALIAS
    assert r.port_mask_logic(a.data_ptr(), a.data_ptr(), b.data_ptr(), 0, 2, 1, 0, d) == capi.PORT_ERR_ALIAS
    # expand
    assert r.port_expand_mask(y.data_ptr(), a.data_ptr(), 2, 1, d) == capi.PORT_OK
    assert r.port_expand_mask(y.data_ptr(), y.data_ptr(), 2, 1, d) == capi.PORT_ERR_ALIAS
    assert r.port_expand_mask(y.data_ptr(), a.data_ptr(), 2, 8, d) == capi.PORT_ERR_SHAPE
    # index2: indices out of range, bad shapes
    i0, i1 = torch.zeros(4, 1, dtype=torch.int64), torch.zeros(1, 3, dtype=torch.int64)
    q = (y.data_ptr(), a.data_ptr(), i0.data_ptr(), i1.data_ptr())
    assert r.port_mask_index2(*q, 4, 3, 2, 2, 1, d) == capi.PORT_OK
    i0[2] = 4
    assert r.port_mask_index2(*q, 4, 3, 2, 2, 1, d) == capi.PORT_ERR_ARG
    i0[2], i1[0, 1] = -4, -4
    assert r.port_mask_index2(*q, 4, 3, 2, 2, 1, d) == capi.PORT_ERR_ARG
    i1[0, 1] = 0
    assert r.port_mask_index2(*q, 0, 3, 2, 2, 1, d) == capi.PORT_ERR_SHAPE
    assert r.port_mask_index2(*q, 4, 3, 2, 4, 1, d) == capi.PORT_ERR_SHAPE
    d[0] = 0
    assert r.port_mask_index2(*q, 4, 3, 2, 2, 1, d) == capi.PORT_ERR_SHAPE
    assert r.port_expand_mask(y.data_ptr(), a.data_ptr(), 2, 0, d) == capi.PORT_ERR_SHAPE


def test_call_rules_of_the_mask_kernels():
    """port-rt's rules (rt_check.c, ids 122-125): extents from the shape parameters and dtypes, enums, in place
    only for mask_logic onto a full-shape operand."""
    from test_shape_unary import _rule
    c, lo, ex, ix = "port_mask_cast", "port_mask_logic", "port_expand_mask", "port_mask_index2"
    assert _rule(c, (0, 4096), (1, 2, 100)) == 0                          # int64 -> bool: 100 B out, 800 B in
    assert _rule(c, (0, 96), (1, 2, 100)) == "ptr[0]"                    # y (100 B) over the int64 input
    assert _rule(c, (0, 100), (1, 2, 100)) == "ptr[1]"                   # an int64 operand not 8-byte aligned
    assert _rule(c, (0, 400), (0, 1, 100)) == 0                          # bool -> float32: 400 B out
    assert _rule(c, (0, 399), (0, 1, 100)) == "ptr[0]"
    assert _rule(c, (0, 4096), (2, 2, 100)) == "iv[0]"                   # int64 output
    assert _rule(c, (0, 4096), (1, 4, 100)) == "iv[1]"
    assert _rule(c, (0, 4096), (1, 2, 0)) == "iv[2]"
    iv = (0, 2, 1, 0, 64, 3, 1, 1, 1, 1)                                  # y, b [64, 3]; a [1, 3]
    assert _rule(lo, (0, 4096, 8192), iv) == 0
    assert _rule(lo, (0, 4096, 0), iv) == 0                               # y = b (full shape)
    assert _rule(lo, (0, 0, 8192), iv) == "ptr[0]"                        # y = a (broadcast): refused
    assert _rule(lo, (0, 4096, 8192), (4,) + iv[1:]) == "iv[0]"
    assert _rule(lo, (0, 4096, 8192), iv[:1] + (7,) + iv[2:]) == "iv[1]"
    assert _rule(lo, (0, 4096, 8192), iv[:2] + (4,) + iv[3:]) == "iv[2]"
    assert _rule(lo, (0, 4096, 8192), iv[:6] + (2,) + iv[7:]) == "iv[6]"  # a dim past the rank must be 1
    assert _rule(ex, (0, 4096), (2, 1, 64, 3, 1, 1, 1, 1)) == 0
    assert _rule(ex, (0, 1), (2, 1, 64, 3, 1, 1, 1, 1)) == "ptr[0]"
    assert _rule(ex, (0, 4096), (2, 1, 0, 3, 1, 1, 1, 1)) == "iv[2]"
    ivx = (4, 16, 2, 2, 1, 4, 16, 1, 1, 1, 1)                            # y [4, 16] = x[4, 16][i0 [4, 1], i1 [1, 16]]
    assert _rule(ix, (0, 1024, 2048, 4096), ivx) == 0
    assert _rule(ix, (0, 1024, 2048, 2064), ivx) == 0                     # read-only index operands may overlap
    assert _rule(ix, (0, 1024, 2048, 2060), ivx) == "ptr[3]"              # an int64 operand not 8-byte aligned
    assert _rule(ix, (0, 10, 2048, 4096), ivx) == "ptr[0]"                # y (64 B) over x
    assert _rule(ix, (0, 1024, 2048, (1 << 20) - 64), ivx) == "ptr[3]"    # i1 (128 B) past the arena
    assert _rule(ix, (0, 1024, 2048, 4096), (0,) + ivx[1:]) == "iv[0]"
    assert _rule(ix, (0, 1024, 2048, 4096), ivx[:3] + (4,) + ivx[4:]) == "iv[3]"
    assert _rule(ix, (0, 1024, 2048, 4096), ivx[:2] + (0,) + ivx[3:]) == "iv[2]"


def test_every_index_pattern_of_index2_matches_a_loop():
    """The broadcast gather on small shapes, every combination of broadcast bits, against a Python loop."""
    x = torch.rand(3, 4, generator=torch.Generator().manual_seed(5)) < .5
    for b0, b1 in itertools.product(range(8), range(8)):
        s0 = tuple(1 if (b0 >> i) & 1 else (2, 3, 2)[i] for i in range(3))
        s1 = tuple(1 if (b1 >> i) & 1 else (2, 3, 2)[i] for i in range(3))
        i0, i1 = torch.randint(0, 3, s0), torch.randint(0, 4, s1)
        assert torch.equal(index2(x, i0, i1), x[i0, i1])


CMP = ("eq", "ne", "lt", "le", "gt", "ge")


def compare(a, b, op):
    return _broadcast2(capi.raw.port_mask_compare, a, b, op)


def _special(t, g):
    """Rounded values (ties), NaN, infinities and signed zeros among the elements."""
    t = (t * 2).round() / 2
    flat = t.view(-1)
    k = torch.randint(0, flat.numel(), (min(5, flat.numel()),), generator=g)
    flat[k] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0])[:len(k)]
    return t


@pytest.mark.parametrize("op", range(6), ids=CMP)
@pytest.mark.parametrize("sa,sb", list(zip(BCASTS[::3], reversed(BCASTS[::3]))) + [((9,), SHAPE), ((), (7, 1))])
def test_mask_compare_equals_torch_with_every_broadcast(op, sa, sb):
    g = torch.Generator().manual_seed(len(sa) * 13 + sum(sa) + op)
    a, b = _special(torch.randn(sa, generator=g), g), _special(torch.randn(sb, generator=g), g)
    assert torch.equal(compare(a, b, op), getattr(torch, CMP[op])(a, b))


@pytest.mark.parametrize("op", range(6), ids=CMP)
@pytest.mark.parametrize("s", [0.5, 0.0, -0.0, float("inf"), float("nan"), -2.0])
def test_mask_compare_scalar_equals_torch(op, s):
    g = torch.Generator().manual_seed(op)
    x = _special(torch.randn(7, 13, generator=g), g)
    y = torch.empty(x.shape, dtype=torch.bool)
    assert capi.raw.port_mask_compare_scalar(y.data_ptr(), x.data_ptr(), op, x.numel(), s) == capi.PORT_OK
    assert torch.equal(y, getattr(torch, CMP[op])(x, s))


def test_mask_not_equals_torch():
    a = torch.rand(SHAPE, generator=torch.Generator().manual_seed(9)) < .5
    assert torch.equal(logic(a, a, 3), ~a)


def test_compare_refusals_and_call_rules():
    from test_shape_unary import _rule
    r = capi.raw
    a, y = torch.zeros(4, 3), torch.empty(4, 3, dtype=torch.bool)
    d = _dims((4, 3))
    assert r.port_mask_compare(y.data_ptr(), a.data_ptr(), a.data_ptr(), 6, 2, 0, 0, d) == capi.PORT_ERR_ARG
    assert r.port_mask_compare(y.data_ptr(), a.data_ptr(), a.data_ptr(), 0, 2, 0, 8, d) == capi.PORT_ERR_SHAPE
    assert r.port_mask_compare(a.data_ptr(), a.data_ptr(), a.data_ptr(), 0, 2, 0, 0, d) == capi.PORT_ERR_ALIAS
    assert r.port_mask_compare_scalar(y.data_ptr(), a.data_ptr(), -1, 12, 0.0) == capi.PORT_ERR_ARG
    assert r.port_mask_compare_scalar(y.data_ptr(), a.data_ptr(), 0, 0, 0.0) == capi.PORT_ERR_SHAPE
    assert r.port_mask_compare_scalar(a.data_ptr(), a.data_ptr(), 0, 12, 0.0) == capi.PORT_ERR_ALIAS
    assert r.port_mask_logic(y.data_ptr(), y.data_ptr(), y.data_ptr(), 4, 2, 0, 0, d) == capi.PORT_ERR_ARG
    c, cs = "port_mask_compare", "port_mask_compare_scalar"
    iv = (4, 2, 1, 0, 64, 3, 1, 1, 1, 1)                                  # y [64, 3] = a [1, 3] > b [64, 3]
    assert _rule(c, (0, 1024, 4096), iv) == 0
    assert _rule(c, (0, 1024, 1000), iv) == 0                             # the inputs may overlap (read only)
    assert _rule(c, (0, 1024, 128), iv) == "ptr[0]"                       # y (192 B) over b
    assert _rule(c, (0, 1024, 4096), (6,) + iv[1:]) == "iv[0]"
    assert _rule(c, (0, 1024, 4096), iv[:3] + (4,) + iv[4:]) == "iv[3]"
    assert _rule(cs, (0, 1024), (5, 100), (float("nan"),)) == 0
    assert _rule(cs, (0, 64), (5, 100), (0.0,)) == "ptr[0]"               # y (100 B) over x
    assert _rule(cs, (0, 1024), (5, 0), (0.0,)) == "iv[1]"
    assert _rule("port_mask_logic", (0, 0, 0), (3, 1, 0, 0, 64, 1, 1, 1, 1, 1)) == 0    # not, in place


def test_records_take_masks_and_leave_parameter_compares_to_torch():
    """Capture: compares of activations, casts of masks and not/and go to the mask records on C; a compare with a
    parameter operand stays a torch_op (no trained tensor enters a mask record)."""
    import port

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.fc = torch.nn.Parameter(torch.randn(5)), torch.nn.Linear(5, 3)

        def forward(self, x):
            keep = torch.logical_not(x < 0.25) & (x >= x.flip(0))
            return self.fc(x * keep.to(torch.float32) * (self.w > 0).to(torch.float32))

    tr = port.Trainer(Net(), torch.randn(4, 5), optimizer=port.optim.SGD(0.1))
    acc = {o.kind: tr.plan.ops[o.id].accelerator for o in tr.graph.ops}
    kinds = [o.kind for o in tr.graph.ops]
    assert kinds.count("mask_compare") == 2 and kinds.count("mask_logic") == 2 and kinds.count("mask_cast") == 2
    assert all(acc[k] == "cpu-c" for k in ("mask_compare", "mask_logic", "mask_cast"))
    gt = [o for o in tr.graph.ops if o.kind == "torch_op" and "gt" in dict(o.attrs)["call"]]
    assert len(gt) == 1
