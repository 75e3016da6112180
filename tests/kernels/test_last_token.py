"""Issue 54's last-token pooling kernels (kernels/src/mask.c; port-rt ids 137-139, and port_mask_cast's int32
output on id 122): what HF's GPT-2 / Llama sequence classifiers run to pool the logits of each row's last non-pad
token -- (ids != pad).to(int32) (port_mask_cast), * arange(T, dtype=int32) (port_int_binary), .argmax(-1)
(port_argmax_rows), logits[arange(B), idx] (port_index2_rows) and its gradient (the same call, scatter = 1).
Exact against torch (integer ops, selects; the gradient against float64 autograd), the same bits at 1/2/3
threads, the refusals and port-rt's call rules."""
import ctypes

import pytest
import torch

from port.exec import capi
from port.ops.elementwise import collapse

DT = {torch.float32: 0, torch.bool: 1, torch.int64: 2, torch.int32: 3}
SHAPE = (3, 5, 7, 9)
BCASTS = [tuple(1 if (b >> i) & 1 else SHAPE[i] for i in range(4)) for b in range(16)]


def _dims(dims):
    return (ctypes.c_int64 * 6)(*(list(dims) + [1] * (6 - len(dims))))


def int_binary(a, b, op):
    shape = torch.broadcast_shapes(a.shape, b.shape)
    y = torch.empty(shape, dtype=a.dtype)
    dims, ma, mb = collapse(tuple(a.shape), tuple(b.shape), tuple(shape))
    st = capi.raw.port_int_binary(y.data_ptr(), a.data_ptr(), b.data_ptr(), DT[a.dtype], op, len(dims), ma, mb,
                                  _dims(dims))
    assert st == capi.PORT_OK
    return y


def argmax(x):
    """argmax over the last axis."""
    y = torch.empty(x.shape[:-1], dtype=torch.int64)
    assert capi.raw.port_argmax_rows(y.data_ptr(), x.data_ptr(), DT[x.dtype], x.numel() // x.shape[-1],
                                     x.shape[-1]) == capi.PORT_OK
    return y


def rows(x, i0, i1, grad_of=None):
    """x[i0, i1] for x [R, C, ...]; grad_of (a shape [R, C, ...]): the gradient of that gather with dy = x."""
    sb = torch.broadcast_shapes(i0.shape, i1.shape)
    dims, m0, m1 = collapse(tuple(i0.shape), tuple(i1.shape), tuple(sb))
    full = tuple(grad_of) if grad_of is not None else tuple(x.shape)
    y = torch.full(full if grad_of is not None else tuple(sb) + full[2:], float("nan"))
    inner = 1
    for d in full[2:]:
        inner *= d
    st = capi.raw.port_index2_rows(y.data_ptr(), x.data_ptr(), i0.data_ptr(), i1.data_ptr(), full[0], full[1], inner,
                                   len(dims), m0, m1, _dims(dims), int(grad_of is not None))
    assert st == capi.PORT_OK
    return y


def test_mask_cast_to_int32_and_from_int32():
    g = torch.Generator().manual_seed(0)
    m = torch.rand(4, 17, generator=g) < .5
    y = torch.empty(4, 17, dtype=torch.int32)
    assert capi.raw.port_mask_cast(y.data_ptr(), 3, m.data_ptr(), 1, m.numel()) == capi.PORT_OK
    assert torch.equal(y, m.to(torch.int32))
    i = torch.randint(-3, 4, (4, 17), generator=g, dtype=torch.int32)
    b, f = torch.empty(4, 17, dtype=torch.bool), torch.empty(4, 17)
    assert capi.raw.port_mask_cast(b.data_ptr(), 1, i.data_ptr(), 3, i.numel()) == capi.PORT_OK
    assert capi.raw.port_mask_cast(f.data_ptr(), 0, i.data_ptr(), 3, i.numel()) == capi.PORT_OK
    assert torch.equal(b, i.bool()) and torch.equal(f, i.float())
    x64 = torch.zeros(4, 17, dtype=torch.int64)
    assert capi.raw.port_mask_cast(y.data_ptr(), 3, x64.data_ptr(), 2, 68) == capi.PORT_ERR_ARG     # int32 of int64
    assert capi.raw.port_mask_cast(y.data_ptr(), 3, f.data_ptr(), 0, 68) == capi.PORT_ERR_ARG       # of float32
    assert capi.raw.port_mask_cast(y.data_ptr(), 4, m.data_ptr(), 1, 68) == capi.PORT_ERR_ARG


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("op", [0, 1, 2], ids=["add", "sub", "mul"])
@pytest.mark.parametrize("sa,sb", list(zip(BCASTS[::3], reversed(BCASTS[::3]))) + [((9,), SHAPE), ((), (7, 1))])
def test_int_binary_equals_torch_with_every_broadcast(dtype, op, sa, sb):
    g = torch.Generator().manual_seed(len(sa) * 17 + sum(sa) + op)
    big = torch.iinfo(dtype).max
    a, b = torch.randint(-50, 50, sa, generator=g, dtype=dtype), torch.randint(-50, 50, sb, generator=g, dtype=dtype)
    a.view(-1)[0], b.view(-1)[-1] = big, big                 # overflow wraps around, as torch
    assert torch.equal(int_binary(a, b, op), (torch.add, torch.sub, torch.mul)[op](a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.int32, torch.int64])
def test_argmax_rows_equals_torch(dtype):
    """Ties (the first index wins), NaN (the largest; the first NaN wins), int64 ids above 2^53."""
    g = torch.Generator().manual_seed(DT[dtype])
    if dtype == torch.float32:
        x = (torch.randn(6, 3, 11, generator=g) * 2).round()
        x[0, 0, 4], x[0, 0, 7], x[1, 2, 0], x[2, 1, 10] = float("nan"), float("nan"), float("nan"), float("inf")
        x[3, 0] = -float("inf")
    elif dtype == torch.bool:
        x = torch.rand(6, 3, 11, generator=g) < .3
        x[0, 0] = False
    else:
        x = torch.randint(-4, 4, (6, 3, 11), generator=g, dtype=dtype)
        if dtype == torch.int64:
            x[1, 1, 3], x[1, 1, 5] = (1 << 60) + 1, 1 << 60
    t = x.to(torch.uint8) if dtype == torch.bool else x        # (torch's argmax takes no bool: its bytes)
    assert torch.equal(argmax(x), t.argmax(-1))
    assert torch.equal(argmax(x.reshape(-1)).reshape(()), t.argmax())


@pytest.mark.parametrize("s0,s1,inner", [((4,), (4,), (10,)), ((4, 1), (1, 5), (3, 2)), ((1,), (6,), ()),
                                         ((2, 3, 1), (3, 4), (7,)), ((5,), (1,), (10,))])
def test_index2_rows_and_its_gradient_equal_torch(s0, s1, inner):
    """The gather exact; the gradient (repeated index pairs add up, in index order) against float64 autograd: each
    element of dx a sum of at most a few float32 values in float32, compared to within one rounding per term."""
    g = torch.Generator().manual_seed(sum(s0) + 3 * sum(s1) + len(inner))
    R, C = 5, 6
    x = torch.randn(R, C, *inner, generator=g)
    i0, i1 = torch.randint(-R, R, s0, generator=g), torch.randint(-C, C, s1, generator=g)
    want = x[i0, i1]
    assert torch.equal(rows(x, i0, i1), want)
    dy = torch.randn(want.shape, generator=g)
    x64 = x.double().requires_grad_()
    x64[i0, i1].backward(dy.double())
    dx = rows(dy, i0, i1, grad_of=x.shape)
    torch.testing.assert_close(dx.double(), x64.grad, rtol=0, atol=1e-6)
    loop = torch.zeros(x.shape)            # the same sums in float32, index order
    b0, b1 = torch.broadcast_tensors(i0, i1)
    flat = dy.reshape(b0.numel(), -1)
    for e, (r, c) in enumerate(zip(b0.reshape(-1).tolist(), b1.reshape(-1).tolist())):
        loop[r, c] += flat[e].reshape(x.shape[2:])
    assert torch.equal(dx, loop)


def test_hf_last_token_pooling_chain_equals_torch():
    """transformers' GPT2/LlamaForSequenceClassification: non_pad = (ids != pad).to(int32), token_indices =
    arange(T, int32), last = (token_indices * non_pad).argmax(-1), pooled = logits[arange(B), last]."""
    B, T, K = 5, 13, 10
    ids = torch.randint(1, 50, (B, T), generator=torch.Generator().manual_seed(8))
    for i, n in enumerate((0, 4, 12, 13, 1)):                # trailing pads; row 3 all pad (argmax 0, as torch)
        ids[i, T - n:] = 0
    logits = torch.randn(B, T, K, generator=torch.Generator().manual_seed(9))
    non_pad = torch.empty(B, T, dtype=torch.int32)
    ne = ids != 0
    assert capi.raw.port_mask_cast(non_pad.data_ptr(), 3, ne.data_ptr(), 1, ne.numel()) == capi.PORT_OK
    last = argmax(int_binary(torch.arange(T, dtype=torch.int32), non_pad, 2))
    want_last = (torch.arange(T, dtype=torch.int32) * ne.to(torch.int32)).argmax(-1)
    assert torch.equal(last, want_last)
    assert torch.equal(rows(logits, torch.arange(B), last), logits[torch.arange(B), want_last])


def test_last_token_kernels_same_bits_at_any_thread_count():
    g = torch.Generator().manual_seed(11)
    a, b = torch.randint(-9, 9, (64, 1, 256), generator=g, dtype=torch.int32), torch.randint(
        -9, 9, (16, 256), generator=g, dtype=torch.int32)
    xf = torch.randn(512, 300, generator=g)
    x = torch.randn(32, 64, 96, generator=g)
    i0, i1 = torch.randint(0, 32, (400,), generator=g), torch.randint(0, 64, (400,), generator=g)   # repeats
    dy = torch.randn(400, 96, generator=g)
    prev, outs = capi.get_num_threads(), []
    try:
        for t in (1, 2, 3):
            capi.set_num_threads(t)
            outs.append((int_binary(a, b, 2), argmax(xf), rows(x, i0, i1), rows(dy, i0, i1, grad_of=x.shape)))
    finally:
        capi.set_num_threads(prev)
    for o in outs[1:]:
        assert all(torch.equal(p, q) for p, q in zip(outs[0], o))
    assert torch.equal(outs[0][0], a * b) and torch.equal(outs[0][1], xf.argmax(-1))
    assert torch.equal(outs[0][2], x[i0, i1])


def test_last_token_kernel_refusals():
    r = capi.raw
    a, y = torch.zeros(4, 3, dtype=torch.int32), torch.empty(4, 3, dtype=torch.int32)
    d = _dims((4, 3))
    assert r.port_int_binary(y.data_ptr(), a.data_ptr(), a.data_ptr(), 3, 2, 2, 0, 0, d) == capi.PORT_OK
    assert r.port_int_binary(y.data_ptr(), a.data_ptr(), a.data_ptr(), 0, 2, 2, 0, 0, d) == capi.PORT_ERR_ARG  # f32
    assert r.port_int_binary(y.data_ptr(), a.data_ptr(), a.data_ptr(), 3, 3, 2, 0, 0, d) == capi.PORT_ERR_ARG  # div
    assert r.port_int_binary(y.data_ptr(), a.data_ptr(), a.data_ptr(), 3, 2, 2, 4, 0, d) == capi.PORT_ERR_SHAPE
    row = torch.ones(1, 3, dtype=torch.int32)
    assert r.port_int_binary(a.data_ptr(), a.data_ptr(), row.data_ptr(), 3, 2, 2, 0, 1, d) == capi.PORT_OK  # in place
    assert r.port_int_binary(a.data_ptr(), a.data_ptr(), y.data_ptr(), 3, 2, 2, 1, 0, d) == capi.PORT_ERR_ALIAS
    i64 = torch.empty(4, dtype=torch.int64)
    assert r.port_argmax_rows(i64.data_ptr(), a.data_ptr(), 3, 4, 3) == capi.PORT_OK
    assert r.port_argmax_rows(i64.data_ptr(), a.data_ptr(), 4, 4, 3) == capi.PORT_ERR_ARG
    assert r.port_argmax_rows(i64.data_ptr(), a.data_ptr(), 3, 4, 0) == capi.PORT_ERR_SHAPE
    assert r.port_argmax_rows(a.data_ptr(), a.data_ptr(), 3, 4, 3) == capi.PORT_ERR_ALIAS
    x, out = torch.randn(4, 3, 2), torch.empty(2, 2)
    i0, i1 = torch.tensor([0, 3]), torch.tensor([2, -3])
    q = (out.data_ptr(), x.data_ptr(), i0.data_ptr(), i1.data_ptr())
    d = _dims((2,))
    assert r.port_index2_rows(*q, 4, 3, 2, 1, 0, 0, d, 0) == capi.PORT_OK and torch.equal(out, x[i0, i1])
    assert r.port_index2_rows(*q, 4, 3, 2, 1, 0, 0, d, 2) == capi.PORT_ERR_ARG
    assert r.port_index2_rows(*q, 4, 2, 2, 1, 0, 0, d, 0) == capi.PORT_ERR_ARG       # i1 2 out of [-2, 2)
    i1[1] = -4
    assert r.port_index2_rows(*q, 4, 3, 2, 1, 0, 0, d, 0) == capi.PORT_ERR_ARG
    i1[1] = 0
    assert r.port_index2_rows(*q, 4, 3, 0, 1, 0, 0, d, 0) == capi.PORT_ERR_SHAPE
    assert r.port_index2_rows(*q, 4, 3, 2, 1, 2, 0, d, 0) == capi.PORT_ERR_SHAPE
    assert r.port_index2_rows(x.data_ptr() + 8, *q[1:], 4, 3, 2, 1, 0, 0, d, 0) == capi.PORT_ERR_ALIAS
    assert r.port_index2_rows(x.data_ptr(), out.data_ptr(), *q[2:], 4, 3, 2, 1, 0, 0, d, 1) == capi.PORT_OK
    assert r.port_index2_rows(x.data_ptr(), x.data_ptr() + 8, *q[2:], 4, 3, 2, 1, 0, 0, d, 1) == capi.PORT_ERR_ALIAS


def test_call_rules_of_the_last_token_kernels():
    """port-rt's rules (rt_check.c, ids 137-139, and id 122's int32 output): extents from the shape parameters and
    dtypes, enums, in place only onto a full-shape operand, the scatter direction swapping the extents."""
    from test_shape_unary import _rule
    ib, am, ix, c = "port_int_binary", "port_argmax_rows", "port_index2_rows", "port_mask_cast"
    assert _rule(c, (0, 4096), (3, 1, 100)) == 0                          # bool -> int32: 400 B out
    assert _rule(c, (0, 399), (3, 1, 100)) == "ptr[0]"
    assert _rule(c, (0, 4096), (3, 2, 100)) == "iv[1]"                    # int32 of int64: refused
    assert _rule(c, (0, 4096), (2, 1, 100)) == "iv[0]"                    # int64 output
    assert _rule(c, (0, 4096), (0, 3, 100)) == 0                          # int32 -> float32
    iv = (3, 2, 2, 1, 0, 64, 16, 1, 1, 1, 1)                             # y, b [64, 16] int32; a [1, 16]
    assert _rule(ib, (0, 8192, 4096), iv) == 0
    assert _rule(ib, (0, 8192, 0), iv) == 0                               # y = b (full shape)
    assert _rule(ib, (0, 0, 8192), iv) == "ptr[0]"                        # y = a (broadcast)
    assert _rule(ib, (0, 8192, 2048), iv) == "ptr[0]"                     # b inside y (4096 B)
    assert _rule(ib, (0, 8192, 16384), (2,) + iv[1:]) == 0                # int64: 8192 B each full operand
    assert _rule(ib, (0, 8192, 4096), (2,) + iv[1:]) == "ptr[0]"
    assert _rule(ib, (0, 8192, 16388), (2,) + iv[1:]) == "ptr[2]"         # an int64 operand not 8-byte aligned
    assert _rule(ib, (0, 8192, 4096), (0,) + iv[1:]) == "iv[0]"
    assert _rule(ib, (0, 8192, 4096), iv[:1] + (3,) + iv[2:]) == "iv[1]"
    assert _rule(ib, (0, 8192, 4096), iv[:3] + (4,) + iv[4:]) == "iv[3]"
    assert _rule(am, (0, 4096), (3, 4, 16)) == 0                          # y [4] int64 (32 B), x [4, 16] int32
    assert _rule(am, (0, 16), (3, 4, 16)) == "ptr[0]"
    assert _rule(am, (4, 4096), (3, 4, 16)) == "ptr[0]"                   # y not 8-byte aligned
    assert _rule(am, (0, 4096), (4, 4, 16)) == "iv[0]"
    assert _rule(am, (0, 4096), (3, 4, 0)) == "iv[2]"
    ivx = (4, 16, 10, 1, 0, 0, 4, 1, 1, 1, 1, 1, 0)                      # y [4, 10] = x [4, 16, 10][i0 [4], i1 [4]]
    assert _rule(ix, (0, 1024, 8192, 8256), ivx) == 0
    assert _rule(ix, (0, 100, 8192, 8256), ivx) == "ptr[0]"               # y (160 B) over x
    assert _rule(ix, (0, 1024, 8192, 8260), ivx) == "ptr[3]"
    assert _rule(ix, (0, 1024, 8192, 8256), ivx[:12] + (1,)) == "ptr[0]"  # the gradient: y = dx (2560 B) over dy
    assert _rule(ix, (0, 4096, 8192, 8256), ivx[:12] + (1,)) == 0
    assert _rule(ix, (0, 1024, 8192, 8256), ivx[:12] + (2,)) == "iv[12]"
    assert _rule(ix, (0, 1024, 8192, 8256), (0,) + ivx[1:]) == "iv[0]"
    assert _rule(ix, (0, 1024, 8192, 8256), ivx[:4] + (2,) + ivx[5:]) == "iv[4]"


def test_records_capture_the_pooling_and_train_like_eager():
    """Capture: the pooling's five nodes go to mask_cast, int_binary, argmax_rows, index2_rows (+ its gradient) on
    C; three SGD steps on batches padded otherwise than the captured one equal eager PyTorch's (float32, 1e-6)."""
    import copy

    import port
    from nets54 import LastTokenPool

    net = LastTokenPool()
    g = torch.Generator().manual_seed(2)
    x0 = torch.randint(1, 11, (4, 7), generator=g)
    tr = port.Trainer(copy.deepcopy(net), x0, optimizer=port.optim.SGD(0.05, momentum=0.9))
    kinds = {o.kind: tr.plan.ops[o.id].accelerator for o in tr.graph.ops}
    for k in ("mask_cast", "int_binary", "argmax_rows", "index2_rows", "index2_rows.grad_input"):
        assert kinds.get(k) == "cpu-c", (k, kinds.get(k))
    assert all(a == "cpu-c" for a in kinds.values())
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for s in range(3):
        x, y = torch.randint(1, 11, (4, 7), generator=g), torch.randint(0, 10, (4,), generator=g)
        for i in range(4):
            x[i, 7 - (i + s) % 7:] = 0
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        assert abs(float(tr.step(x, y)) - loss.item()) <= 1e-6 * max(1.0, abs(loss.item()))
