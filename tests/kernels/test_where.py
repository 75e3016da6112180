"""Issue 54's where (port_where_forward, its plain reference and port_where_backward in kernels/src/mask.c; port-rt
ids 128-129): y = cond ? a : b with cond, a and b broadcast on every axis, a or b a number; da = dy where cond,
db = dy where not, each summed to its operand's shape. Exact against torch.where (a select) and float64 autograd
(each gradient element a sum of float32 values in a double: exact here), the same bits at 1/2/3 threads, the
refusals and port-rt's call rules, the record's capture, and training equal to eager PyTorch."""
import ctypes
import math

import pytest
import torch

from port.exec import capi
from port.ops.elementwise import collapse_n

SHAPE = (3, 5, 7, 9)
BCASTS = [tuple(1 if (b >> i) & 1 else SHAPE[i] for i in range(4)) for b in range(16)]
# (cond, a, b) shapes: every broadcast of each operand, three ways rotated, and lower-rank operands
CASES = [(BCASTS[i], BCASTS[(i * 5 + 3) % 16], BCASTS[(i * 11 + 7) % 16]) for i in range(16)] + \
    [((9,), SHAPE, (7, 1)), ((), (5, 1, 9), SHAPE), ((7, 9), (), (3, 1, 1, 1))]


def _dims(dims):
    return (ctypes.c_int64 * 6)(*(list(dims) + [1] * (6 - len(dims))))


def where(c, a, b, reference=False):
    """port_where_forward (or the reference) of cond c and a, b tensors or Python numbers."""
    ts = [t for t in (a, b) if isinstance(t, torch.Tensor)]
    shape = torch.broadcast_shapes(c.shape, *(t.shape for t in ts))
    y = torch.empty(shape)
    sa = tuple(a.shape) if isinstance(a, torch.Tensor) else ()
    sb = tuple(b.shape) if isinstance(b, torch.Tensor) else ()
    dims, (mc, ma, mb) = collapse_n(tuple(shape), tuple(c.shape), sa, sb)
    ptr = lambda t: t.data_ptr() if isinstance(t, torch.Tensor) else None  # noqa: E731
    val = lambda t: 0.0 if isinstance(t, torch.Tensor) else float(t)  # noqa: E731
    scalars = int(not isinstance(a, torch.Tensor)) | 2 * int(not isinstance(b, torch.Tensor))
    fn = capi.raw.port_where_forward_reference if reference else capi.raw.port_where_forward
    st = fn(y.data_ptr(), c.data_ptr(), ptr(a), ptr(b), len(dims), mc, ma, mb, _dims(dims), scalars, val(a), val(b))
    assert st == capi.PORT_OK
    return y


def where_grads(dy, c, sa, sb, want=(0, 1)):
    """port_where_backward: the gradients of a [sa] and b [sb] (None where not in want)."""
    da, db = (torch.full(s, float("nan")) if i in want else None for i, s in enumerate((sa, sb)))
    dims, (mc, ma, mb) = collapse_n(tuple(dy.shape), tuple(c.shape), tuple(sa), tuple(sb))
    st = capi.raw.port_where_backward(da.data_ptr() if da is not None else None,
                                      db.data_ptr() if db is not None else None, dy.data_ptr(), c.data_ptr(),
                                      len(dims), mc, ma, mb, _dims(dims))
    assert st == capi.PORT_OK
    return da, db


@pytest.mark.parametrize("sc,sa,sb", CASES, ids=lambda s: "x".join(map(str, s)) or "scalar")
def test_where_forward_and_gradients_equal_torch_with_every_broadcast(sc, sa, sb):
    g = torch.Generator().manual_seed(sum(sc) * 7 + sum(sa) * 3 + sum(sb))
    c = torch.rand(sc, generator=g) < 0.4
    a, b = torch.randn(sa, generator=g), torch.randn(sb, generator=g)
    want = torch.where(c, a, b)
    assert torch.equal(where(c, a, b), want) and torch.equal(where(c, a, b, reference=True), want)
    a64, b64 = a.double().requires_grad_(), b.double().requires_grad_()
    dy = torch.randn(want.shape, generator=g)
    torch.where(c, a64, b64).backward(dy.double())
    da, db = where_grads(dy, c, sa, sb)
    assert torch.equal(da.double(), a64.grad.float().double()) and torch.equal(db.double(), b64.grad.float().double())
    da_only, none = where_grads(dy, c, sa, sb, want=(0,))
    assert none is None and torch.equal(da_only, da)


@pytest.mark.parametrize("va,vb", [(-1.5, None), (None, float("-inf")), (2.0, -0.0), (float("inf"), 3.0)])
def test_where_with_numbers_equals_torch(va, vb):
    g = torch.Generator().manual_seed(4)
    c = torch.rand(3, 1, 7, generator=g) < 0.5
    a = torch.randn(5, 7, generator=g) if va is None else va
    b = torch.randn(1, 5, 1, generator=g) if vb is None else vb
    want = torch.where(c, a, b)
    got = where(c, a, b)
    assert got.dtype == torch.float32 and torch.equal(got, want.float())
    assert torch.equal(where(c, a, b, reference=True), got)
    if va is not None and vb is not None:       # two numbers: -0.0 and 0.0 kept apart
        assert torch.equal(torch.signbit(got), torch.signbit(want.float()))


def test_where_in_place_onto_a_full_shape_operand():
    g = torch.Generator().manual_seed(6)
    c, a, b = torch.rand(1, 5, 9, generator=g) < .5, torch.randn(4, 5, 9, generator=g), torch.randn(9, generator=g)
    want = torch.where(c, a, b)
    dims, (mc, ma, mb) = collapse_n((4, 5, 9), (1, 5, 9), (4, 5, 9), (9,))
    assert capi.raw.port_where_forward(a.data_ptr(), c.data_ptr(), a.data_ptr(), b.data_ptr(), len(dims), mc, ma,
                                       mb, _dims(dims), 0, 0.0, 0.0) == capi.PORT_OK
    assert torch.equal(a, want)


def test_where_same_bits_at_any_thread_count():
    """Above the parallel thresholds: [8, 4, 64, 64] scores, a causal [64, 64] mask, a [4, 1, 64] operand whose
    gradient sums over the batch and a row."""
    g = torch.Generator().manual_seed(3)
    S = (8, 4, 64, 64)
    c = torch.ones(64, 64, dtype=torch.bool).tril()
    a, b = torch.randn(S, generator=g), torch.randn(4, 1, 64, generator=g)
    dy = torch.randn(S, generator=g)
    prev, outs = capi.get_num_threads(), []
    try:
        for t in (1, 2, 3):
            capi.set_num_threads(t)
            outs.append((where(c, a, b), *where_grads(dy, c, S, (4, 1, 64)), where(c, a, -1e9)))
    finally:
        capi.set_num_threads(prev)
    for o in outs[1:]:
        assert all(torch.equal(p, q) for p, q in zip(outs[0], o))
    assert torch.equal(outs[0][0], torch.where(c, a, b)) and torch.equal(outs[0][3], torch.where(c, a, -1e9))


def test_where_refusals():
    r = capi.raw
    c, a, b, y = torch.zeros(4, 3, dtype=torch.bool), torch.randn(4, 3), torch.randn(4, 3), torch.empty(4, 3)
    d = _dims((4, 3))
    f = lambda *p, rank=2, bits=(0, 0, 0), s=0, va=0.0, vb=0.0: r.port_where_forward(  # noqa: E731
        *p, rank, *bits, d, s, va, vb)
    p = (y.data_ptr(), c.data_ptr(), a.data_ptr(), b.data_ptr())
    assert f(*p) == capi.PORT_OK
    assert f(*p, rank=0) == capi.PORT_ERR_SHAPE and f(*p, rank=7) == capi.PORT_ERR_SHAPE
    assert f(*p, bits=(4, 0, 0)) == capi.PORT_ERR_SHAPE                       # a broadcast bit past the rank
    assert f(*p, s=4) == capi.PORT_ERR_ARG
    assert f(*p, s=1) == capi.PORT_ERR_ARG                                    # a number a with a pointer
    assert f(p[0], p[1], None, p[3], s=1, va=math.nan) == capi.PORT_ERR_ARG   # NaN
    assert f(p[0], p[1], None, p[3], s=1, va=-math.inf) == capi.PORT_OK
    assert f(p[0], p[1], None, p[3]) == capi.PORT_ERR_NULL                    # a tensor a without a pointer
    assert f(p[0], p[1], p[2], None, s=2, vb=math.nan) == capi.PORT_ERR_ARG
    assert f(a.data_ptr() + 4, p[1], p[2], p[3]) == capi.PORT_ERR_ALIAS       # a partial overlap
    assert f(a.data_ptr(), p[1], p[2], p[3], bits=(0, 1, 0)) == capi.PORT_ERR_ALIAS   # y = a broadcast
    assert f(c.data_ptr(), p[1], p[2], p[3]) == capi.PORT_ERR_ALIAS           # y over cond
    bw = r.port_where_backward
    dy, da, db = torch.randn(4, 3), torch.empty(4, 3), torch.empty(4, 3)
    assert bw(da.data_ptr(), db.data_ptr(), dy.data_ptr(), c.data_ptr(), 2, 0, 0, 0, d) == capi.PORT_OK
    assert bw(None, None, dy.data_ptr(), c.data_ptr(), 2, 0, 0, 0, d) == capi.PORT_ERR_NULL
    assert bw(da.data_ptr(), da.data_ptr(), dy.data_ptr(), c.data_ptr(), 2, 0, 0, 0, d) == capi.PORT_ERR_ALIAS
    assert bw(dy.data_ptr(), None, dy.data_ptr(), c.data_ptr(), 2, 0, 0, 0, d) == capi.PORT_ERR_ALIAS
    assert bw(da.data_ptr(), None, dy.data_ptr(), c.data_ptr(), 2, 0, 8, 0, d) == capi.PORT_ERR_SHAPE
    d[1] = 0
    assert f(*p) == capi.PORT_ERR_SHAPE


def test_call_rules_of_where():
    """port-rt's rules (rt_check.c, ids 128-129): extents of the three broadcast operands from the shape
    parameters, a number operand's pointer -1 and its value not NaN, an unused value 0, in place only onto a
    full-shape operand; the gradient needs da or db."""
    from test_shape_unary import _rule
    w, wb = "port_where_forward", "port_where_backward"
    iv = (2, 1, 0, 2, 64, 3, 1, 1, 1, 1, 0)          # y [64, 3] = cond [1, 3] ? a [64, 3] : b [64, 1]
    assert _rule(w, (0, 1024, 2048, 4096), iv) == 0
    assert _rule(w, (0, 1024, 0, 4096), iv) == 0                          # y = a (full shape)
    assert _rule(w, (0, 1024, 2048, 0), iv) == "ptr[0]"                   # y = b (broadcast): refused
    assert _rule(w, (0, 100, 2048, 4096), iv) == "ptr[0]"                 # y over cond
    assert _rule(w, (0, 1024, -1, 4096), iv[:10] + (1,), (-math.inf,)) == 0      # a = -inf
    assert _rule(w, (0, 1024, -1, 4096), iv[:10] + (1,), (math.nan,)) == "fv[0]"
    assert _rule(w, (0, 1024, 2048, 4096), iv[:10] + (1,), (1.0,)) == "ptr[2]"   # a number with a pointer
    assert _rule(w, (0, 1024, -1, 4096), iv) == "ptr[2]"                  # a tensor without one
    assert _rule(w, (0, 1024, 2048, 4096), iv, (0.0, 2.0)) == "fv[1]"     # an unused value not 0
    assert _rule(w, (0, 1024, 2048, 4096), iv[:10] + (4,)) == "iv[10]"
    assert _rule(w, (0, 1024, 2048, 4096), (7,) + iv[1:]) == "iv[0]"
    assert _rule(w, (0, 1024, 2048, 4096), iv[:3] + (4,) + iv[4:]) == "iv[3]"
    assert _rule(w, (0, 1024, 2048, 4096), iv[:6] + (2,) + iv[7:]) == "iv[6]"
    assert _rule(wb, (0, 1024, 2048, 4096), iv[:10]) == 0                 # da [64, 3], db [64, 1]
    assert _rule(wb, (-1, 1024, 2048, 4096), iv[:10]) == 0
    assert _rule(wb, (-1, -1, 2048, 4096), iv[:10]) == "ptr[0]"
    assert _rule(wb, (0, 1024, 200, 4096), iv[:10]) == "ptr[0]"           # da over dy


def test_where_record_captures_and_trains_like_eager():
    """Capture: where of two activations, with a number on either side or a 0-d buffer, to the where record on C
    (forward and gradient); a parameter operand stays a torch_op. Three SGD steps equal eager PyTorch's (float32,
    1e-6)."""
    import copy

    import port
    from nets54 import WhereNet

    net, x, y = WhereNet(), torch.randn(6, 5, generator=torch.Generator().manual_seed(1)), torch.arange(6) % 10
    tr = port.Trainer(copy.deepcopy(net), x, optimizer=port.optim.SGD(0.05, momentum=0.9))
    kinds = [(o.kind, tr.plan.ops[o.id].accelerator) for o in tr.graph.ops]
    assert kinds.count(("where", "cpu-c")) == 4 and kinds.count(("where.grad_input", "cpu-c")) == 4
    assert all(acc == "cpu-c" for _, acc in kinds)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        assert abs(float(tr.step(x, y)) - loss.item()) <= 1e-6 * max(1.0, abs(loss.item()))

    class Held(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.fc = torch.nn.Parameter(torch.randn(5)), torch.nn.Linear(5, 3)

        def forward(self, x):
            return self.fc(torch.where(x > 0, x, self.w))

    tr = port.Trainer(Held(), torch.randn(4, 5), optimizer=port.optim.SGD(0.1))
    assert not any(o.kind == "where" for o in tr.graph.ops)
    assert any(o.kind == "torch_op" and "where" in dict(o.attrs).get("call", "") for o in tr.graph.ops)
