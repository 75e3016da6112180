"""The op records (port.ops): one definition per op kind, read by the tracer, the registry, the C-call encoder
and the torch backend. Checks the records are complete and consistent, and every record with a torch binding
only (sigmoid, hardsigmoid, silu, broadcasting mul, cat) against PyTorch autograd in float64 on odd shapes."""
from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

import port
from port import ops
from port.exec import registry
from port.exec.backends.torch_backend import TorchEnv
from port.ops.base import TAGS, CallShapeError
from port.train.optim import SGD

from nets54 import AvgPools

ROOT = Path(__file__).resolve().parents[2]


def _steps_like_eager(tr, ref: nn.Module, x, y, lr: float, steps: int = 3) -> None:
    """``steps`` SGD steps of a port.Trainer and of ``ref`` (the same module, same init) give the same losses."""
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    for _ in range(steps):
        loss = tr.step(x, y)
        opt.zero_grad()
        want = nn.functional.cross_entropy(ref(x), y)
        want.backward()
        opt.step()
        assert abs(float(loss) - want.item()) < 1e-5


def _env(op: int = 0) -> TorchEnv:
    return TorchEnv(torch, torch.nn.functional, torch.ops.aten, SimpleNamespace(seed=0, dropout_counter=0), op)


def test_every_kernel_is_owned_once_and_complete():
    for kind, r in ops.RECORDS.items():
        assert r.kind == kind and r.family and r.doc, kind
        assert set(r.tags) <= set(TAGS), (kind, r.tags)
        for k in r.kernels:
            assert ops.owner(k) is r, k
            if k in r.views:
                continue
            assert r.torch is not None, f"{k}: no torch binding"
            if r.c_entries(k):
                assert r.encode is not None, f"{k}: C entries without an encoding"
    # every aten packet a rule reads maps to rules of records that produce forward kinds
    rules = ops.capture_rules()
    assert {"conv2d", "linear", "mul", "cat", "sigmoid", "silu", "hardsigmoid", "view"} <= set(rules)
    assert rules["mul"][0] is ops.record("scale").capture       # a Python-number factor first, then tensors


def test_c_entries_are_kernels_of_the_c_library():
    """Every C entry point a record names is declared in the public header and is a port-rt kernel."""
    header = (ROOT / "kernels" / "include" / "port_kernels.h").read_text()
    from port.exec.rtcall import kernel_ids
    ids = kernel_ids()
    for k in ops.kernels():
        for e in ops.c_entries(k):
            assert re.search(rf"\b{e}\s*\(", header), f"{k}: {e} not in port_kernels.h"
            assert e in ids, f"{k}: {e} is not a port-rt kernel"


def test_kind_tuples_come_from_tags():
    from port.lower.lower import CHECKPOINT_KINDS
    from port.plan import semantics, variants as V
    assert set(V.INPLACE_KINDS) == {"relu", "relu6", "batch_norm2d", "add"}
    assert set(V.CONV_KINDS) == {"conv2d", "conv2d.grad_input", "conv2d.grad_weight"}
    assert set(V.ATTENTION_KINDS) == {"attention", "attention.grad_input"}
    assert set(semantics.NOT_RECOMPUTABLE_KINDS) == {"reshape", "narrow_view", "dropout"}
    assert {"relu", "linear", "max_pool2d", "sigmoid", "mul"} <= set(CHECKPOINT_KINDS)
    assert "dropout" not in CHECKPOINT_KINDS


def test_torch_only_records_have_no_c_variants():
    assert not ops.has_c("torch_op") and not registry.known_kernel("torch_op", "c")
    assert registry.known_kernel("torch_op", "torch-cpu")
    assert ops.has_c("conv2d") and ops.has_c("reshape")
    for kind in ("sigmoid", "hardsigmoid", "silu", "mul", "add_nd", "sub", "div", "cat", "narrow", "expand", "neg",
                 "exp", "rsqrt", "cos", "sin", "pow_scalar", "abs", "shift"):   # C kernels (issue 54) too
        assert ops.has_c(kind) and registry.known_kernel(kind, "c") and registry.known_kernel(kind, "torch-cpu")


# ---------------------------------------------------------------------------------------------
# forward and backward of the torch-only records against autograd, float64, odd shapes
# ---------------------------------------------------------------------------------------------
def _rand(shape, gen):
    return torch.randn(shape, dtype=torch.float64, generator=gen)


def test_softmax_torch_binding_equals_autograd_and_trains_on_the_torch_engine():
    """softmax.grad_input's torch binding passed its output as out= (the overload's out argument is grad_input):
    every plan with a softmax on the torch engine failed at its first backward (tv.swin_t's solved plan)."""
    gen = torch.Generator().manual_seed(2)
    r = ops.record("softmax")
    x = _rand((3, 5, 7), gen)
    y = torch.empty_like(x)
    r.torch("softmax", {}, [x], [y], _env())()
    torch.testing.assert_close(y, torch.softmax(x, -1), rtol=1e-13, atol=1e-13)
    dy, dx = _rand(x.shape, gen), torch.empty_like(x)
    r.torch("softmax.grad_input", {}, [dy, y], [dx], _env())()
    xr = x.clone().requires_grad_(True)
    want, = torch.autograd.grad(torch.softmax(xr, -1), xr, dy)
    torch.testing.assert_close(dx, want, rtol=1e-13, atol=1e-13)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 7), nn.Softmax(-1), nn.Linear(7, 3))
    xb, yb = torch.randn(4, 5), torch.tensor([0, 2, 1, 1])
    ref = __import__("copy").deepcopy(m)
    tr = port.Trainer(m, xb, backend="torch-cpu", optimizer=SGD(0.1))
    _steps_like_eager(tr, ref, xb, yb, lr=0.1)


@pytest.mark.parametrize("kind,ref,saves_output", [
    ("sigmoid", torch.sigmoid, True), ("hardsigmoid", torch.nn.functional.hardsigmoid, False),
    ("silu", torch.nn.functional.silu, False)])
def test_unary_records_equal_autograd(kind, ref, saves_output):
    gen = torch.Generator().manual_seed(1)
    r = ops.record(kind)
    x = _rand((3, 5, 7), gen) * 4            # past hardsigmoid's kinks at +-3
    y = torch.empty_like(x)
    r.torch(kind, {}, [x], [y], _env())()
    torch.testing.assert_close(y, ref(x), rtol=1e-13, atol=1e-13)
    dy, dx = _rand(x.shape, gen), torch.empty_like(x)
    r.torch(f"{kind}.grad_input", {}, [dy, y if saves_output else x], [dx], _env())()
    xr = x.clone().requires_grad_(True)
    want, = torch.autograd.grad(ref(xr), xr, dy)
    torch.testing.assert_close(dx, want, rtol=1e-13, atol=1e-13)
    assert registry.call_shapes(kind, {}, [x.shape], [x.shape]) == ([(x.shape, "float32")], [(x.shape, "float32")])


def test_narrow_and_expand_records_equal_autograd():
    gen = torch.Generator().manual_seed(4)
    x = _rand((3, 7, 5), gen)
    for attrs, ref in (({"dim": 1, "start": 2, "length": 4, "size": 7, "squeeze": False}, lambda t: t[:, 2:6]),
                       ({"dim": 2, "start": 4, "length": 1, "size": 5, "squeeze": True}, lambda t: t[:, :, 4])):
        (ins, outs) = registry.call_shapes("narrow", attrs, [x.shape], [None])
        y = torch.empty(outs[0][0], dtype=torch.float64)
        ops.record("narrow").torch("narrow", attrs, [x], [y], _env())()
        torch.testing.assert_close(y, ref(x), rtol=0, atol=0)
        dy, dx = _rand(y.shape, gen), torch.full_like(x, 3.0)
        ops.record("narrow").torch("narrow.grad_input", attrs, [dy], [dx], _env())()
        xr = x.clone().requires_grad_(True)
        torch.testing.assert_close(dx, torch.autograd.grad(ref(xr), xr, dy)[0], rtol=0, atol=0)
    with pytest.raises(CallShapeError):
        registry.call_shapes("narrow", {"dim": 1, "start": 5, "length": 4, "size": 7, "squeeze": False}, [x.shape], [None])
    p = _rand((1, 1, 5), gen)
    y = torch.empty(3, 4, 5, dtype=torch.float64)
    ops.record("expand").torch("expand", {}, [p], [y], _env())()
    torch.testing.assert_close(y, p.expand(3, 4, 5), rtol=0, atol=0)
    dy, dp = _rand(y.shape, gen), torch.ones_like(p)
    ops.record("expand").torch("expand.grad_weight", {"grads": ("weight",)}, [dy], [dp], _env())()
    torch.testing.assert_close(dp, dy.sum((0, 1), keepdim=True) + 1, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("kind,ref", [("mul", torch.mul), ("add_nd", torch.add), ("sub", torch.sub),
                                      ("div", torch.div)])
@pytest.mark.parametrize("sa,sb", [((3, 5, 7), (3, 5, 7)), ((2, 5, 3, 3), (2, 5, 1, 1)), ((3, 1, 5, 1), (1, 4, 1, 7)),
                                   ((6, 5), (5,)), ((1, 7), (3, 1))])
def test_binary_records_broadcast_on_every_axis(kind, ref, sa, sb):
    gen = torch.Generator().manual_seed(2)
    r = ops.record(kind)
    a, b = _rand(sa, gen), _rand(sb, gen).abs() + 0.5
    y = torch.empty(torch.broadcast_shapes(sa, sb), dtype=torch.float64)
    ins, outs = registry.call_shapes(kind, {}, [sa, sb], [y.shape])
    assert outs[0][0] == tuple(y.shape)
    r.torch(kind, {}, [a, b], [y], _env())()
    torch.testing.assert_close(y, ref(a, b), rtol=0, atol=0)
    dy = _rand(y.shape, gen)
    ar, br = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    wa, wb = torch.autograd.grad(ref(ar, br), (ar, br), dy)
    for grads, want in (((0, 1), (wa, wb)), ((0,), (wa,)), ((1,), (wb,))):
        rd = tuple(sorted({j for i in grads for j in ((1,), (0,)) [i]})) if kind == "mul" else \
            {"add_nd": (), "sub": (), "div": tuple(sorted({j for i in grads for j in ((1,), (0, 1))[i]}))}[kind]
        attrs = {"grads": grads, "reads": rd}
        shp = {0: sa, 1: sb}
        registry.call_shapes(f"{kind}.grad_input", attrs, [y.shape] + [shp[j] for j in rd], [shp[i] for i in grads])
        outs = [torch.full(shp[i], 7.0, dtype=torch.float64) for i in grads]
        r.torch(f"{kind}.grad_input", attrs, [dy] + [(a, b)[j] for j in rd], outs, _env())()
        for o, w in zip(outs, want):       # input gradients overwrite
            torch.testing.assert_close(o, w, rtol=1e-13, atol=1e-13)
    # a parameter operand: its gradient accumulates
    rd = {"mul": (0,), "add_nd": (), "sub": (), "div": (0, 1)}[kind]
    dw = torch.ones(sb, dtype=torch.float64)
    r.torch(f"{kind}.grad_weight", {"grads": ("weight",), "reads": rd}, [dy] + [(a, b)[j] for j in rd], [dw], _env())()
    torch.testing.assert_close(dw, wb + 1, rtol=1e-13, atol=1e-13)
    with pytest.raises(CallShapeError):
        registry.call_shapes(kind, {}, [(3, 4), (5,)], [(3, 4)])


def test_cat_forward_and_slices_of_the_gradient():
    gen = torch.Generator().manual_seed(3)
    r = ops.record("cat")
    xs = [_rand((2, c, 3, 5), gen) for c in (3, 1, 4)]
    attrs = {"dim": 1, "sizes": (3, 1, 4)}
    y = torch.empty(2, 8, 3, 5, dtype=torch.float64)
    assert registry.call_shapes("cat", attrs, [x.shape for x in xs], [y.shape])[0][1][0] == (2, 1, 3, 5)
    r.torch("cat", attrs, xs, [y], _env())()
    torch.testing.assert_close(y, torch.cat(xs, 1), rtol=0, atol=0)
    dy = _rand(y.shape, gen)
    g = attrs | {"grads": (0, 2)}
    outs = [torch.empty_like(xs[0]), torch.empty_like(xs[2])]
    r.torch("cat.grad_input", g, [dy], outs, _env())()
    leaves = [x.clone().requires_grad_(True) for x in xs]
    want = torch.autograd.grad(torch.cat(leaves, 1), [leaves[0], leaves[2]], dy)
    for o, w in zip(outs, want):
        torch.testing.assert_close(o, w, rtol=0, atol=0)
    with pytest.raises(CallShapeError):
        registry.call_shapes("cat", {"dim": 1, "sizes": (3, 2)}, [(2, 3), (2, 2)], [(2, 6)])


class _Gates(nn.Module):
    """Squeeze-excitation with sigmoid and hardsigmoid gates, SiLU, broadcast multiplies (one by a layer-scale
    parameter) and cat."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.se = nn.Conv2d(6, 6, 1)
        self.fc = nn.Linear(12, 4)
        self.gamma = nn.Parameter(torch.linspace(0.5, 1.5, 6).view(6, 1, 1))

    def forward(self, x):
        h = nn.functional.silu(self.conv(x))
        s = h.mean((2, 3), keepdim=True)
        h = h * torch.sigmoid(self.se(s)) + h * nn.functional.hardsigmoid(s)
        h = torch.cat([h, self.gamma * torch.relu(h)], 1)
        return self.fc(h.mean((2, 3)))


def test_records_capture_instead_of_torch_ops_and_train_like_eager():
    x, y = torch.randn(4, 3, 7, 5), torch.tensor([0, 1, 2, 3])
    tr = port.Trainer(_Gates(), x, optimizer=SGD(0.1))
    kinds = {o.kind for o in tr.graph.ops}
    assert {"silu", "sigmoid", "hardsigmoid", "mul", "cat"} <= kinds and "torch_op" not in kinds, kinds
    # ops with no C kernel run on the torch engine of the same memory; the rest on C
    assert any(o.kind == "mul.grad_weight" for o in tr.graph.ops)
    acc = {tr.graph.ops[d.op].kind: d.accelerator for d in tr.plan.ops}
    assert acc["mul"] == acc["sigmoid"] == acc["conv2d"] == acc["cat"] == "cpu-c"
    ref = _Gates()
    _steps_like_eager(tr, ref, x, y, 0.1, 3)


class _Tokens(nn.Module):
    """A ViT-like head: a class token expanded over the batch and cat-ed, a position embedding added, chunk /
    split / unbind / select / slice of activations, sub and div of activations."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(6, 8)
        self.cls = nn.Parameter(torch.randn(1, 1, 8) * 0.1)
        self.pos = nn.Parameter(torch.randn(1, 6, 8) * 0.1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):                                    # x [N, 5, 6]
        h = self.proj(x)
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), h], 1) + self.pos
        a, b = h.chunk(2, dim=2)                             # split items
        q, k = torch.unbind(h.view(h.shape[0], 6, 2, 4), 2)  # unbind items
        h = torch.cat([a * b, q - k], 2) / (h[:, :, :1].abs() + 1.0)
        return self.fc(h[:, 0] + h[:, 1:4].mean(1))          # select, slice


def test_shape_and_broadcast_records_capture_and_train_like_eager():
    x, y = torch.randn(4, 5, 6), torch.tensor([0, 1, 2, 1])
    tr = port.Trainer(_Tokens(), x, optimizer=SGD(0.1))
    kinds = {o.kind for o in tr.graph.ops}
    assert {"narrow", "expand", "add_nd", "sub", "div", "mul", "cat", "expand.grad_weight",
            "add_nd.grad_weight", "abs"} <= kinds and "torch_op" not in kinds, kinds
    ref = _Tokens()
    _steps_like_eager(tr, ref, x, y, 0.1, 3)


@pytest.mark.parametrize("kind,attrs,ref", [
    ("neg", {}, torch.neg), ("rsqrt", {}, torch.rsqrt), ("exp", {}, torch.exp), ("cos", {}, torch.cos),
    ("sin", {}, torch.sin), ("abs", {}, torch.abs), ("pow_scalar", {"exponent": 3.0}, lambda t: t.pow(3.0)),
    ("pow_scalar", {"exponent": -0.5}, lambda t: t.pow(-0.5)), ("shift", {"value": 1e-6}, lambda t: t + 1e-6)])
def test_unary_math_records_equal_autograd(kind, attrs, ref):
    gen = torch.Generator().manual_seed(5)
    r = ops.record(kind)
    x = _rand((3, 5, 7), gen).abs() + 0.1
    if kind == "abs":
        x = x * torch.sign(_rand(x.shape, gen))       # both signs
    y = torch.empty_like(x)
    registry.call_shapes(kind, attrs, [x.shape], [x.shape])
    r.torch(kind, attrs, [x], [y], _env())()
    torch.testing.assert_close(y, ref(x), rtol=1e-14, atol=0)
    dy = _rand(x.shape, gen)
    xr = x.clone().requires_grad_(True)
    want, = torch.autograd.grad(ref(xr), xr, dy)
    saved = [y] if kind in ("rsqrt", "exp") else [x] if kind in ("cos", "sin", "abs", "pow_scalar") else []
    ins, _ = registry.call_shapes(f"{kind}.grad_input", attrs, [dy.shape] + [s.shape for s in saved], [x.shape])
    assert len(ins) == 1 + len(saved)
    dx = torch.empty_like(x)
    r.torch(f"{kind}.grad_input", attrs, [dy] + saved, [dx], _env())()
    torch.testing.assert_close(dx, want, rtol=1e-12, atol=1e-14)


class _RMSRotary(nn.Module):
    """Llama's RMSNorm (pow, mean over the last dim, shift by eps, rsqrt, weight * x: one rms_norm op), a
    normalisation over the tokens (the same ops over dim 1: no RMS norm, each op its own record), a layer scale
    and rotary embedding (cos, sin, neg, cat of halves)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(6, 8)
        self.weight = nn.Parameter(torch.linspace(0.8, 1.2, 8))
        self.scale = nn.Parameter(torch.linspace(1.2, 0.8, 8))
        self.fc = nn.Linear(8, 3)
        self.register_buffer("freq", torch.linspace(0.1, 1.0, 8))

    def forward(self, x):                                    # [N, T, 6]
        h = self.proj(x)
        h = self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))
        h = h * torch.rsqrt(h.pow(2).mean(1, keepdim=True) + 1e-5) * self.scale
        t = torch.arange(h.shape[1], dtype=torch.float32, device=x.device)[:, None] * self.freq
        cos, sin = t.cos(), t.sin()
        x1, x2 = h[..., :4], h[..., 4:]
        h = h * cos + torch.cat([-x2, x1], -1) * sin
        return self.fc(h.exp().mean(1))


def test_rmsnorm_and_rotary_capture_as_records_and_train_like_eager():
    x, y = torch.randn(4, 5, 6), torch.tensor([0, 1, 2, 1])
    tr = port.Trainer(_RMSRotary(), x, optimizer=SGD(0.05))
    kinds = [o.kind for o in tr.graph.ops]
    assert {"rms_norm", "rms_norm.grad_input", "rms_norm.grad_weight", "pow_scalar", "rsqrt", "shift", "neg",
            "mul.grad_weight", "exp", "narrow"} <= set(kinds), kinds
    assert kinds.count("rms_norm") == 1 and kinds.count("pow_scalar") == 1      # the token norm: not fused
    ref = _RMSRotary()
    _steps_like_eager(tr, ref, x, y, 0.05, 3)


@pytest.mark.parametrize("attrs", [dict(kernel=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=True),
                                   dict(kernel=(2, 3), stride=(2, 1), padding=(0, 1), dilation=(2, 1)),
                                   dict(kernel=(3, 3), stride=(2, 2), padding=(0, 0), ceil_mode=True, dilation=(1, 2))])
def test_max_pool_ceil_mode_and_dilation_torch_bindings_and_c_kernels(attrs):
    gen = torch.Generator().manual_seed(6)
    x = _rand((2, 3, 9, 8), gen)
    assert ops.has_c("max_pool2d", attrs) and ops.has_c("max_pool2d", {"kernel": (2, 2)})     # (issue 54)
    assert registry.known_kernel("max_pool2d", "c", attrs) and registry.known_kernel("max_pool2d", "torch-cpu", attrs)
    kw = dict(kernel_size=attrs["kernel"], stride=attrs["stride"], padding=attrs["padding"],
              dilation=attrs.get("dilation", 1), ceil_mode=attrs.get("ceil_mode", False))
    want = torch.nn.functional.max_pool2d(x, **kw)
    _, outs = registry.call_shapes("max_pool2d", attrs, [x.shape], [None, None])
    assert outs[0][0] == tuple(want.shape)
    y, idx = torch.empty(want.shape, dtype=torch.float64), torch.empty(want.shape, dtype=torch.int64)
    ops.record("max_pool2d").torch("max_pool2d", attrs, [x], [y, idx], _env())()
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    dy, dx = _rand(y.shape, gen), torch.empty_like(x)
    ops.record("max_pool2d").torch("max_pool2d.grad_input", attrs, [dy, idx], [dx], _env())()
    xr = x.clone().requires_grad_(True)
    torch.testing.assert_close(dx, torch.autograd.grad(torch.nn.functional.max_pool2d(xr, **kw), xr, dy)[0])


@pytest.mark.parametrize("attrs", [dict(kernel=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=True),
                                   dict(kernel=(3, 2), stride=(2, 2), padding=(1, 1), count_include_pad=False),
                                   dict(kernel=(3, 3), stride=(2, 2), padding=(1, 0), ceil_mode=True,
                                        count_include_pad=False)])
def test_avg_pool_ceil_mode_and_count_include_pad_torch_bindings_and_c_kernels(attrs):
    gen = torch.Generator().manual_seed(6)
    x = _rand((2, 3, 9, 8), gen)
    assert ops.has_c("avg_pool2d", attrs) and registry.known_kernel("avg_pool2d", "c", attrs)   # (issue 52)
    kw = dict(kernel_size=attrs["kernel"], stride=attrs["stride"], padding=attrs["padding"],
              ceil_mode=attrs.get("ceil_mode", False), count_include_pad=attrs.get("count_include_pad", True))
    want = torch.nn.functional.avg_pool2d(x, **kw)
    _, outs = registry.call_shapes("avg_pool2d", attrs, [x.shape], [None])
    assert outs[0][0] == tuple(want.shape)
    y = torch.empty(want.shape, dtype=torch.float64)
    ops.record("avg_pool2d").torch("avg_pool2d", attrs, [x], [y], _env())()
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    dy, dx = _rand(y.shape, gen), torch.empty_like(x)
    ops.record("avg_pool2d").torch("avg_pool2d.grad_input", attrs, [dy], [dx], _env())()
    xr = x.clone().requires_grad_(True)
    torch.testing.assert_close(dx, torch.autograd.grad(torch.nn.functional.avg_pool2d(xr, **kw), xr, dy)[0])
    with pytest.raises(CallShapeError):
        registry.call_shapes("avg_pool2d", attrs | {"count_include_pad": True}, [x.shape], [None])
    with pytest.raises(CallShapeError):
        registry.call_shapes("avg_pool2d", attrs | {"dilation": (2, 2)}, [x.shape], [None])


def test_avg_pool_ceil_mode_and_count_include_pad_capture_on_c_and_train_like_eager():
    """Captured as avg_pool2d records (not torch_op), every op on C, three SGD steps like eager."""
    x, y = torch.randn(4, 3, 9, 7), torch.tensor([0, 1, 2, 1])
    tr = port.Trainer(AvgPools(), x, optimizer=SGD(0.05))
    pools = [o for o in tr.graph.ops if o.kind == "avg_pool2d"]
    assert len(pools) == 4 and not [o for o in tr.graph.ops if o.kind == "torch_op"]
    assert sorted((o.attr("ceil_mode", False), o.attr("count_include_pad", True)) for o in pools) == \
        [(False, False), (True, False), (True, True), (True, True)]
    assert all(d.accelerator == "cpu-c" for d in tr.plan.ops)
    _steps_like_eager(tr, AvgPools(), x, y, 0.05, 3)


@pytest.mark.parametrize("dims,keep", [((1,), False), ((2,), True), ((0, 2), False), ((1, 2), True)])
@pytest.mark.parametrize("kind,ref", [("reduce_mean", torch.mean), ("reduce_sum", torch.sum)])
def test_reductions_equal_autograd(kind, ref, dims, keep):
    gen = torch.Generator().manual_seed(7)
    x = _rand((3, 5, 7), gen)
    attrs = {"dims": dims, "keepdim": keep}
    want = ref(x, dims, keep)
    assert registry.call_shapes(kind, attrs, [x.shape], [None])[1][0][0] == tuple(want.shape)
    y = torch.empty(want.shape, dtype=torch.float64)
    ops.record(kind).torch(kind, attrs, [x], [y], _env())()
    torch.testing.assert_close(y, want, rtol=1e-14, atol=1e-14)
    dy, dx = _rand(y.shape, gen), torch.empty_like(x)
    ops.record(kind).torch(f"{kind}.grad_input", attrs, [dy], [dx], _env())()
    xr = x.clone().requires_grad_(True)
    torch.testing.assert_close(dx, torch.autograd.grad(ref(xr, dims, keep), xr, dy)[0], rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("mode,kw", [("nearest", dict(scale_factor=2)), ("nearest", dict(size=(7, 5))),
                                     ("bilinear", dict(scale_factor=2, align_corners=False)),
                                     ("bilinear", dict(size=(7, 9), align_corners=True))])
def test_upsample_and_adaptive_pool_capture_and_equal_autograd(mode, kw):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.c = nn.Conv2d(2, 3, 3, padding=1)
            self.fc = nn.Linear(3 * 6, 4)

        def forward(self, x):
            h = nn.functional.interpolate(self.c(x), mode=mode, **kw)
            return self.fc(nn.functional.adaptive_avg_pool2d(h, (3, 2)).flatten(1))
    x = torch.randn(2, 2, 4, 3)
    g = port.trace(M(), x)
    up = next(o for o in g.ops if o.kind == "upsample")
    ad = next(o for o in g.ops if o.kind == "adaptive_avg_pool2d")
    gen = torch.Generator().manual_seed(8)
    for o, ref in ((up, lambda t: nn.functional.interpolate(t, mode=mode, **kw)),
                   (ad, lambda t: nn.functional.adaptive_avg_pool2d(t, (3, 2)))):
        a = dict(o.attrs)
        xi = _rand(g.tensors[o.inputs[0]].shape, gen)
        y = torch.empty(g.tensors[o.outputs[0]].shape, dtype=torch.float64)
        ops.record(o.kind).torch(o.kind, a, [xi], [y], _env())()
        torch.testing.assert_close(y, ref(xi), rtol=1e-14, atol=1e-14)
        dy, dx = _rand(y.shape, gen), torch.empty_like(xi)
        ops.record(o.kind).torch(f"{o.kind}.grad_input", a, [dy], [dx], _env())()
        xr = xi.clone().requires_grad_(True)
        torch.testing.assert_close(dx, torch.autograd.grad(ref(xr), xr, dy)[0], rtol=1e-13, atol=1e-13)
    tr = port.Trainer(M(), x, optimizer=SGD(0.1))
    y = torch.tensor([1, 3])
    ref_m = M()
    _steps_like_eager(tr, ref_m, x, y, 0.1, 2)


def test_embedding_padding_idx_runs_on_c_without_a_padding_gradient():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.e = nn.Embedding(11, 6, padding_idx=0)
            self.fc = nn.Linear(6, 3)

        def forward(self, ids):
            return self.fc(self.e(ids).mean(1))
    ids = torch.tensor([[0, 3, 4, 0], [5, 0, 9, 10]])
    tr = port.Trainer(M(), ids, optimizer=SGD(0.5))
    emb = next(o for o in tr.graph.ops if o.kind == "embedding")
    assert emb.attr("padding_idx") == 0 and ops.has_c("embedding", dict(emb.attrs))
    assert tr.plan.ops[emb.id].accelerator == "cpu-c"
    y = torch.tensor([1, 2])
    ref = M()
    _steps_like_eager(tr, ref, ids, y, 0.5, 2)
    torch.testing.assert_close(tr.state_dict()["e.weight"], ref.e.weight.detach(), rtol=1e-5, atol=1e-6)
    assert torch.equal(tr.state_dict()["e.weight"][0], ref.e.weight.detach()[0])   # the padding row never moves


def test_addmm_with_a_weight_stored_in_out_is_a_linear_on_c():
    """Hugging Face GPT-2's Conv1D: addmm(bias, x, W) with W [in, out] (and mm without a bias): a linear with
    weight_t, on the C kernels port_linear_t_* (forward, input and weight gradients)."""
    class Conv1D(nn.Module):
        def __init__(self, nx, nf, bias=True):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(nx, nf) * 0.2)
            self.bias = nn.Parameter(torch.randn(nf) * 0.1) if bias else None

        def forward(self, x):
            h = x.reshape(-1, x.shape[-1])
            h = torch.addmm(self.bias, h, self.weight) if self.bias is not None else torch.mm(h, self.weight)
            return h.reshape(*x.shape[:-1], -1)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b, self.fc = Conv1D(6, 10), Conv1D(10, 8, bias=False), nn.Linear(8, 3)

        def forward(self, x):
            return self.fc(torch.tanh(self.b(torch.tanh(self.a(x)))).mean(1))
    x, y = torch.randn(4, 5, 6), torch.tensor([0, 1, 2, 1])
    tr = port.Trainer(M(), x, optimizer=SGD(0.1))
    lin = [o for o in tr.graph.ops if o.kind == "linear"]
    assert len(lin) == 3 and sum(bool(o.attr("weight_t")) for o in lin) == 2
    assert "torch_op" not in {o.kind for o in tr.graph.ops}
    assert all(d.accelerator == "cpu-c" for d in tr.plan.ops)
    from port.exec import rtcall
    kernels = {rtcall.encode(c, lambda t: tuple(tr.graph.tensors[t].shape)).entry for c in tr.program.calls
               if c.kernel.startswith("linear")}
    assert {"port_linear_t_forward", "port_linear_t_backward_input", "port_linear_t_backward_weight"} <= kernels
    assert registry.call_shapes("linear", {"bias": True, "weight_t": True}, [(20, 6), (6, 10), (10,)], [None])[1] == \
        [((20, 10), "float32")]
    _steps_like_eager(tr, M(), x, y, 0.1, 3)


class _RMSVariants(nn.Module):
    """An RMS norm whose mean of squares is read twice (no fusion: each op its own record) beside F.rms_norm
    (eps None: float32's machine epsilon) and a group norm without affine parameters."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(6, 8)
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.fc = nn.Linear(8, 3)

    def forward(self, x):                                    # [N, T, 6]
        h = self.proj(x)
        v = h.pow(2).mean(-1, keepdim=True)
        a = h * torch.rsqrt(v + 1e-6) + v
        b = nn.functional.rms_norm(h, (8,), self.w)
        c = nn.functional.group_norm(h.transpose(1, 2), 4).transpose(1, 2)
        return self.fc((a + b + c).mean(1))


def test_rms_norm_fuses_only_its_pattern_and_records_equal_autograd():
    x, y = torch.randn(4, 5, 6), torch.tensor([0, 1, 2, 1])
    tr = port.Trainer(_RMSVariants(), x, optimizer=SGD(0.05))
    kinds = [o.kind for o in tr.graph.ops]
    assert kinds.count("rms_norm") == 1 and kinds.count("group_norm") == 1 and "pow_scalar" in kinds, kinds
    rms = next(o for o in tr.graph.ops if o.kind == "rms_norm")
    assert dict(rms.attrs)["eps"] == torch.finfo(torch.float32).eps
    _steps_like_eager(tr, _RMSVariants(), x, y, 0.05, 3)
    # the torch bindings (a plan may put either op on the torch engine) against float64 autograd
    gen = torch.Generator().manual_seed(9)
    w = _rand((8,), gen)
    for kind, shape, attrs, ref in (("rms_norm", (3, 4, 8), dict(eps=1e-5, affine=("weight",)),
                                     lambda t, ww: nn.functional.rms_norm(t, (8,), ww, 1e-5)),
                                    ("group_norm", (3, 8, 5), dict(groups=2, eps=1e-5, affine=("weight",)),
                                     lambda t, ww: nn.functional.group_norm(t, 2, ww, None, 1e-5))):
        r = ops.record(kind)
        xi, dy = _rand(shape, gen), _rand(shape, gen)
        (ys, st), = [registry.call_shapes(kind, attrs, [xi.shape, w.shape], [None, None])[1]]
        yv, sv = torch.empty(ys[0], dtype=torch.float64), torch.empty(st[0], dtype=torch.float64)
        r.torch(kind, attrs, [xi, w], [yv, sv], _env())()
        xr, wr = xi.clone().requires_grad_(True), w.clone().requires_grad_(True)
        want = ref(xr, wr)
        torch.testing.assert_close(yv, want, rtol=1e-12, atol=1e-12)
        gx, gw = torch.autograd.grad(want, (xr, wr), dy)
        dx, dw = torch.empty_like(xi), torch.zeros_like(w)
        r.torch(f"{kind}.grad_input", attrs, [dy, xi, sv, w], [dx], _env())()
        r.torch(f"{kind}.grad_weight", attrs | {"grads": ("weight",)}, [dy, xi, sv], [dw], _env())()
        torch.testing.assert_close(dx, gx, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(dw, gw, rtol=1e-10, atol=1e-10)
class _Sdpa(nn.Module):
    """scaled_dot_product_attention as published models call it: grouped-query (enable_gqa) under HF's boolean
    [N, 1, T, T] mask, an additive per-head key mask, is_causal; with drop > 0 also attention dropout, dropout and
    timm's drop path (new_empty(...).bernoulli_(keep).div_(keep))."""

    def __init__(self, drop=0.0):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.kv, self.fc, self.drop = nn.Linear(6, 8), nn.Linear(6, 4), nn.Linear(8, 3), drop
        g = torch.Generator().manual_seed(1)
        self.register_buffer("add", torch.randn(1, 4, 1, 5, generator=g))

    def forward(self, x, mask):
        F = nn.functional
        n, t, _ = x.shape
        q, kv = self.q(x).view(n, t, 4, 2).transpose(1, 2), self.kv(x).view(n, t, 2, 2).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask, dropout_p=self.drop, enable_gqa=True)
        a = F.scaled_dot_product_attention(a, q, q, attn_mask=self.add)
        a = F.scaled_dot_product_attention(a, a, a, is_causal=True).transpose(1, 2).reshape(n, t, 8)
        if self.drop:
            a = F.dropout(a, self.drop) * x.new_empty((n, 1, 1)).bernoulli_(1 - self.drop).div_(1 - self.drop)
        return self.fc(a.mean(1))


def _sdpa_batch():
    x, y = torch.randn(3, 5, 6), torch.tensor([0, 1, 2])
    mask = torch.ones(3, 1, 5, 5, dtype=torch.bool).tril()
    mask[1, :, :, 3:] = False
    mask[..., 0] = True
    return x, mask, y


def test_attention_masks_and_gqa_capture_on_c_and_train_like_eager():
    """Boolean and additive masks and grouped-query attention are attention records on the C kernels (no
    torch_op), and train like eager."""
    x, mask, y = _sdpa_batch()
    tr = port.Trainer(_Sdpa(), {"x": x, "mask": mask}, optimizer=SGD(0.1))
    att = [o for o in tr.graph.ops if o.kind == "attention"]
    assert [(o.attr("mask"), o.attr("mask_dims"), o.attr("kv_heads"), o.attr("causal")) for o in att] == \
        [("bool", (3, 1, 5, 5), 2, False), ("add", (1, 4, 1, 5), None, False), (None, None, None, True)]
    assert "torch_op" not in {o.kind for o in tr.graph.ops}
    assert all(d.accelerator == "cpu-c" for d in tr.plan.ops)
    ref = _Sdpa()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        loss = tr.step({"x": x, "mask": mask}, y)
        opt.zero_grad()
        want = nn.functional.cross_entropy(ref(x, mask), y)
        want.backward()
        opt.step()
        assert abs(float(loss) - want.item()) < 1e-5


def test_random_ops_capture_on_c_and_draw_per_pass():
    """Attention dropout, dropout and drop path capture as PORT's random records (no torch_op, all C); a pass
    draws new masks (another forward-pass counter), the same seed the same run."""
    x, mask, y = _sdpa_batch()
    runs = []
    for _ in range(2):
        tr = port.Trainer(_Sdpa(0.3), {"x": x, "mask": mask}, optimizer=SGD(0.0), seed=5)
        kinds = [o.kind for o in tr.graph.ops]
        assert {"bernoulli", "dropout"} <= set(kinds) and "torch_op" not in kinds
        assert [o.attr("p") for o in tr.graph.ops if o.kind == "attention"] == [0.3, None, None]
        assert [o.attr("rng_op") for o in tr.graph.ops if o.kind == "attention.grad_input"][-1] == \
            next(o.id for o in tr.graph.ops if o.kind == "attention")
        assert all(d.accelerator == "cpu-c" for d in tr.plan.ops)
        runs.append([float(tr.step({"x": x, "mask": mask}, y)) for _ in range(3)])
    assert runs[0] == runs[1] and len(set(runs[0])) == 3     # lr 0: only the masks change between passes


class _DropPath(nn.Module):
    """Stochastic depth as timm's drop_path (x.new_empty(shape).bernoulli_(keep).div_(keep)) and torchvision's
    stochastic_depth (torch.empty(size, dtype, device).bernoulli_(keep).div_(keep)) write it."""

    def __init__(self, form):
        super().__init__()
        self.form, self.a, self.b = form, nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = self.a(x)
        keep = 0.75
        if self.form == "timm":
            noise = h.new_empty((h.shape[0],) + (1,) * (h.ndim - 1)).bernoulli_(keep)
        else:
            noise = torch.empty([h.shape[0]] + [1] * (h.ndim - 1), dtype=h.dtype, device=h.device).bernoulli_(keep)
        return self.b(h * noise.div_(keep))


@pytest.mark.parametrize("form", ["timm", "torchvision"])
def test_stochastic_depth_is_a_bernoulli_record(form):
    """timm's DropPath and torchvision's StochasticDepth (empty + bernoulli_ + div_ + mul) capture without a
    torch_op: the empty tensor only the bernoulli fills is no op."""
    g = port.trace(_DropPath(form), torch.randn(4, 6))
    kinds = [o.kind for o in g.ops]
    assert "bernoulli" in kinds and "torch_op" not in kinds, kinds
    b = next(o for o in g.ops if o.kind == "bernoulli")
    assert tuple(g.tensors[b.outputs[0]].shape) == (4, 1) and b.attr("p") == 0.75 and not b.inputs


def test_random_calls_refuse_cuda_graph_replay():
    """A CUDA graph would replay a random call's mask: dropout, bernoulli and attention with dropout refuse it."""
    from port.exec.executor import graph_refusal
    from port.lower.program import Call

    def call(kernel, attrs=()):
        return Call(index=3, op=0, name="n", kernel=kernel, backend="torch-cuda", variant="plain", phase="forward",
                    outputs=(), inputs=(), attrs=attrs)
    for k, a in (("dropout", ()), ("bernoulli", ()), ("attention", (("p", 0.1),)),
                 ("attention.grad_input", (("p", 0.1),))):
        assert "mask" in graph_refusal(None, [call(k, a)]), k
    assert graph_refusal(None, [call("attention"), call("relu")]) is None


class _PositionIds(nn.Module):
    """BERT's position ids: a slice of an int64 buffer into an embedding (of a [1, 12] buffer, BERT's, or of row 1
    of a [2, 12] one, ``rows=2``): input-independent, folded at capture into an int64 buffer (port.ir.fold)."""

    def __init__(self, rows=1):
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("pos_ids", torch.arange(12 * rows).flip(0).view(rows, 12) % 12)
        self.pos = nn.Embedding(12, 6)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):                                    # x [N, 5, 6]
        p = self.pos(self.pos_ids[:, 2:2 + x.shape[1]][-1])
        return self.fc((x + p).mean(1))


class _IdSlices(nn.Module):
    """Slices of int64 token ids into an embedding: columns 2..6 of every row (copied on C as pairs of 4-byte
    words) and the last row (a batch slice: a view of the ids' bytes)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(12, 6)
        self.fc = nn.Linear(6, 3)

    def forward(self, ids):                                  # ids [N, 12]
        return self.fc((self.emb(ids[:, 2:7]) + self.emb(ids[-1:, :5])).mean(1))


@pytest.mark.parametrize("rows", [2, 1])
def test_a_slice_of_an_int64_buffer_is_folded_and_trains_like_eager(rows):
    from port.ir.fold import is_folded
    x, y = torch.randn(4, 5, 6), torch.tensor([0, 1, 2, 1])
    tr = port.Trainer(_PositionIds(rows), x, optimizer=SGD(0.1))
    held = [t for t in tr.graph.tensors if is_folded(t.name)]
    assert [(t.shape, t.dtype) for t in held] == [((5,), "int64")], held
    assert not any(o.kind in ("narrow", "narrow_view") for o in tr.graph.ops)
    _steps_like_eager(tr, _PositionIds(rows), x, y, 0.1, 3)


def test_narrow_of_int64_ids_runs_on_c_and_trains_like_eager():
    x, y = torch.randint(0, 12, (4, 12), generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 1])
    tr = port.Trainer(_IdSlices(), x, optimizer=SGD(0.1))
    for kind in ("narrow", "narrow_view"):
        narrow = [o for o in tr.graph.ops if o.kind == kind]
        assert narrow and narrow[0].attr("dtype") == "int64", kind
        assert all(tr.plan.ops[o.id].accelerator == "cpu-c" for o in narrow)
    assert "narrow" in {c.kernel for c in tr.program.calls} and "narrow_view" not in {c.kernel for c in
                                                                                      tr.program.calls}
    _steps_like_eager(tr, _IdSlices(), x, y, 0.1, 3)
    a = dict(narrow[0].attrs)
    assert ops.has_c("narrow", a) and not ops.has_c("narrow", a | {"dtype": "bool"})   # (bool: PyTorch's kernels)


class _Scatters(nn.Module):
    """Swin's shifted-window mask (a constant filled region by region: slice_scatter of expanded scalars) and a
    slice assignment of activations (slice_scatter with gradients to both operands)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(6, 6)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):                                    # [N, 6, 6]
        m = x.new_zeros((6, 6))
        for i, (h0, h1) in enumerate(((0, 3), (3, 5), (5, 6))):
            for j, (w0, w1) in enumerate(((0, 4), (4, 6))):
                m[h0:h1, w0:w1] = 2 * i + j
        h = torch.tanh(self.proj(x)) + m
        h = h.clone()
        h[:, 1:4] = torch.sigmoid(self.proj(x[:, 2:5]))
        return self.fc(h.mean(1))


def test_scatter_torch_ops_copy_their_operands_not_the_arena():
    """aten's slice_scatter clones its input's whole storage (clone_preserve_strides): on an arena view, the whole
    arena at each call (Swin-T's mask: 23 s of a 28 s step). The torch_op hands it compact copies: no aten call of
    the forward and backward torch_ops reads a tensor larger than the op's own operands."""
    x, y = torch.randn(4, 6, 6), torch.tensor([0, 1, 2, 1])
    tr = port.Trainer(_Scatters(), x, optimizer=SGD(0.1))
    ex = tr.executor
    calls = [(c, f) for c, f in zip(ex.main_calls, ex.main) if c.kernel.startswith("torch_op")
             and "slice_scatter" in c.attr("call")]
    assert {c.kernel for c, _ in calls} >= {"torch_op", "torch_op.grad_input"}, [c.kernel for c, _ in calls]
    assert tr.program.arena_bytes // 4 > 4 * 4 * 6 * 6     # the arena is much larger than any operand
    _steps_like_eager(tr, _Scatters(), x, y, 0.1, 2)
    for c, f in calls:
        with torch.profiler.profile(record_shapes=True) as prof:
            f()
        widest = max(math.prod(s) for e in prof.events() if e.name.startswith("aten::")
                     for s in e.input_shapes if isinstance(s, list) and s)
        assert 0 < widest <= 4 * 6 * 6, (c.name, widest)


class _Windows(nn.Module):
    """Swin's copies: F.pad of an NHWC map over two dims, torch.roll over two dims and one, a table picked by an
    index buffer (relative-position bias)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(6, 6)
        self.table = nn.Parameter(torch.randn(9, 6) * 0.3)
        self.register_buffer("idx", torch.tensor([[8, 0, 3, 3, 5, 1, 7], [2, 2, 6, 4, 0, 8, 1]]))
        self.fc = nn.Linear(6, 3)

    def forward(self, x):                                    # [N, 5, 7, 6]
        h = torch.tanh(self.proj(x))
        h = nn.functional.pad(h, (0, 0, 1, 2, 0, 3))       # [N, 8, 10, 6]
        h = torch.roll(h, (-3, 2), (1, 2))
        h = torch.roll(h, 4, 3)[:, 2:4, 1:8] + self.table[self.idx]
        h = torch.roll(nn.functional.pad(h, (0, 0, 0, 0)), 7, 2)          # identities: no op
        h = torch.cat([h[:, 0::2, 0::7], h[:, 1::2, 3::7]], 2)              # strided slices: view + narrow
        return self.fc(h.flatten(1, 2).mean(1))


def test_roll_pad_and_table_index_capture_on_c_and_train_like_eager():
    x, y = torch.randn(4, 5, 7, 6), torch.tensor([0, 1, 2, 1])
    tr = port.Trainer(_Windows(), x, optimizer=SGD(0.1))
    kinds = [o.kind for o in tr.graph.ops]
    assert kinds.count("roll") == 3 and kinds.count("pad") == 2 and "embedding" in kinds, kinds
    assert kinds.count("narrow") == 6, kinds     # [:, 2:4, 1:8]; h[:, 0::2], h[:, 1::2] and their [:, :, s::7]
    assert "torch_op" not in kinds
    acc = {tr.graph.ops[d.op].kind: d.accelerator for d in tr.plan.ops}
    assert all(acc[k] == "cpu-c" for k in ("roll", "roll.grad_input", "pad", "pad.grad_input", "embedding",
                                           "embedding.grad_weight")), acc
    _steps_like_eager(tr, _Windows(), x, y, 0.1, 3)


@pytest.mark.parametrize("kind,attrs,shape", [("roll", {"dim": 1, "shift": 3, "size": 5}, (2, 5, 3)),
                                              ("roll", {"dim": 0, "shift": 1, "size": 2}, (2, 5, 3)),
                                              ("pad", {"dim": 2, "before": 2, "after": 1, "size": 3}, (2, 5, 3)),
                                              ("pad", {"dim": 0, "before": 0, "after": 3, "size": 2}, (2, 5, 3))])
def test_roll_and_pad_torch_bindings_equal_autograd(kind, attrs, shape):
    """The torch engine's binding of each call (the two ranges of a roll, attribute ``part``; a pad) and of the
    gradient against torch.roll / F.pad and their autograd."""
    x = torch.randn(shape, requires_grad=True)
    d = attrs["dim"]
    if kind == "roll":
        want = torch.roll(x, attrs["shift"], d)
    else:
        p = [0] * (2 * len(shape))
        p[2 * (len(shape) - 1 - d)], p[2 * (len(shape) - 1 - d) + 1] = attrs["before"], attrs["after"]
        want = nn.functional.pad(x, p)
    dy = torch.randn(want.shape)
    want.backward(dy)
    rec = ops.RECORDS[kind]
    y, dx = torch.full(want.shape, float("nan")), torch.full(shape, float("nan"))
    parts = ({"part": 0}, {"part": 1}) if kind == "roll" else ({},)
    for extra in parts:
        rec.torch(kind, attrs | extra, [x.detach()], [y], _env())()
        rec.torch(f"{kind}.grad_input", attrs | extra, [dy], [dx], _env())()
    assert torch.equal(y, want.detach()) and torch.equal(dx, x.grad)


class _CausalCross(nn.Module):
    """is_causal with fewer queries than keys (the last 3 positions attending all 5): torch's causal mask is
    aligned top left then (query i sees keys 0..i), not bottom right as PORT's kernel's causal flag."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.kv, self.fc = nn.Linear(6, 8), nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        n, t, _ = x.shape
        q = self.q(x[:, 2:]).view(n, t - 2, 2, 4).transpose(1, 2)
        kv = self.kv(x).view(n, t, 2, 4).transpose(1, 2)
        a = nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True)
        return self.fc(a.transpose(1, 2).reshape(n, t - 2, 8).mean(1))


def test_is_causal_with_fewer_queries_than_keys_trains_like_eager():
    """sdpa(is_causal=True) with tq != tk is not the C kernel's causal attention (its limit j <= i + tk - tq
    aligns bottom right; torch's aligns top left): the capture leaves it to torch, and the model trains like
    eager (it was an attention record on C, and its first loss differed from eager's by 1e-2)."""
    x, y = torch.randn(3, 5, 6), torch.tensor([0, 1, 2])
    tr = port.Trainer(_CausalCross(), x, optimizer=SGD(0.1))
    assert "attention" not in {o.kind for o in tr.graph.ops}
    _steps_like_eager(tr, _CausalCross(), x, y, 0.1)


class _LNTrailing(nn.Module):
    """nn.LayerNorm over the trailing [C, H, W] of a conv's output (affine) and over [T, D] of a sequence (no
    affine): one layer_norm record each (attribute dims), not a torch_op."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)
        self.ln = nn.LayerNorm([4, 5, 3])
        self.ln2 = nn.LayerNorm([4, 15], elementwise_affine=False)
        self.fc = nn.Linear(60, 3)

    def forward(self, x):
        h = self.ln(self.conv(x))
        h = self.ln2(h.flatten(2))
        return self.fc(h.flatten(1))


def test_layer_norm_over_trailing_dims_is_a_record_equal_to_autograd():
    """The blocker list's 'layer_norm over any trailing dims': the record normalizes the last ``dims`` dims as one
    row; its torch binding forward and backward equal autograd in float64 (odd shapes, affine and not), the C
    kernels run it, and training equals eager (it was a torch_op)."""
    gen = torch.Generator().manual_seed(3)
    r = ops.record("layer_norm")
    for shape, k, affine in (((2, 3, 5, 7), 3, True), ((3, 5, 7), 2, False), ((2, 3, 5, 7), 2, True)):
        x = _rand(shape, gen)
        ns = list(shape[-k:])
        wb = [_rand(ns, gen), _rand(ns, gen)] if affine else []
        attrs = {"eps": 1e-5, "affine": ("weight", "bias") if affine else (), "dims": k}
        ins, outs = registry.call_shapes("layer_norm", attrs, [x.shape] + [t.shape for t in wb], [None, None])
        y, st = torch.empty(shape, dtype=torch.float64), torch.empty(outs[1][0], dtype=torch.float64)
        r.torch("layer_norm", attrs, [x] + wb, [y, st], _env())()
        torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, ns, *(wb or [None, None]), eps=1e-5),
                                   rtol=1e-12, atol=1e-12)
        dy = _rand(shape, gen)
        leaves = [t.clone().requires_grad_(True) for t in [x] + wb]
        want = torch.autograd.grad(torch.nn.functional.layer_norm(leaves[0], ns, *(leaves[1:] or [None, None]),
                                                                   eps=1e-5), leaves, dy)
        dx = torch.empty_like(x)
        r.torch("layer_norm.grad_input", attrs, [dy, x, st] + wb[:1], [dx], _env())()
        torch.testing.assert_close(dx, want[0], rtol=1e-10, atol=1e-12)
        if affine:
            g = attrs | {"grads": ("weight", "bias")}
            dw, db = torch.zeros(ns, dtype=torch.float64), torch.zeros(ns, dtype=torch.float64)
            r.torch("layer_norm.grad_weight", g, [dy, x, st], [dw, db], _env())()
            torch.testing.assert_close(dw, want[1], rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(db, want[2], rtol=1e-10, atol=1e-12)
    with pytest.raises(CallShapeError, match="dims"):
        registry.call_shapes("layer_norm", {"eps": 1e-5, "affine": (), "dims": 4}, [(2, 3, 5, 7)], [None, None])
    x, y = torch.randn(4, 3, 7, 5), torch.tensor([0, 1, 2, 1])
    tr = port.Trainer(_LNTrailing(), x, optimizer=SGD(0.1))
    lns = [o for o in tr.graph.ops if o.kind == "layer_norm"]
    assert [o.attr("dims") for o in lns] == [3, 2] and "torch_op" not in {o.kind for o in tr.graph.ops}
    assert all(d.accelerator == "cpu-c" for d in tr.plan.ops)
    _steps_like_eager(tr, _LNTrailing(), x, y, 0.1, 3)


# ---------------------------------------------------------------------------------------------
# einsum: a capture rule making permute, reshape and matmul ops
# ---------------------------------------------------------------------------------------------
def _einsum_by_plan(plan, a, b, dy):
    """The forward and both operand gradients of ``plan`` (port.ops.attention.EinsumPlan), run by the permute
    and matmul records' torch bindings (forward and .grad_input calls), the reshapes as views."""
    pm, mm = ops.record("permute"), ops.record("matmul")

    def perm(kernel, x, p):
        if list(p) == sorted(p):
            return x
        y = torch.empty([x.shape[i] for i in (p if kernel == "permute" else ops.shape.inverse_perm(p))],
                        dtype=x.dtype)
        pm.torch(kernel, {"perm": tuple(p)}, [x], [y], _env())()
        return y
    x = (a, b) if plan.left == 0 else (b, a)
    lhs = perm("permute", x[0], plan.perm_left).reshape(plan.mm_left)
    rhs = perm("permute", x[1], plan.perm_right).reshape(plan.mm_right)
    p = torch.empty(plan.mm_left[:2] + plan.mm_right[2:], dtype=a.dtype)
    mm.torch("matmul", {}, [lhs, rhs], [p], _env())()
    y = perm("permute", p.reshape(plan.prod), plan.perm_out)
    gp = perm("permute.grad_input", dy, plan.perm_out).reshape(p.shape)
    g = []
    for i, (other, mine) in enumerate(((rhs, lhs), (lhs, rhs))):
        gi = torch.empty(mine.shape, dtype=a.dtype)
        mm.torch("matmul.grad_input", {"operand": i}, [gp, other], [gi], _env())()
        keep = (plan.perm_left, plan.perm_right)[i]
        g.append(perm("permute.grad_input", gi.reshape([x[i].shape[j] for j in keep]), keep))
    return y, (g if plan.left == 0 else g[::-1])


@pytest.mark.parametrize("eq,sa,sb", [
    ("B G H I D, B G H J D -> B G H I J", (2, 3, 2, 5, 7), (2, 3, 2, 6, 7)),     # MaxViT's scores
    ("B G H I J, B G H J D -> B G H I D", (2, 3, 2, 5, 6), (2, 3, 2, 6, 7)),     # MaxViT's attn @ v
    ("ij,jk->ik", (5, 7), (7, 3)), ("ij,kj->ik", (5, 7), (3, 7)), ("ji,jk->ik", (7, 5), (7, 3)),
    ("ji,kj->ki", (7, 5), (3, 7)), ("bij,bjk", (3, 5, 7), (3, 7, 2)), ("ibj,bjk->bki", (5, 3, 7), (3, 7, 2)),
    ("bij,jk->bik", (3, 5, 7), (7, 2)), ("xbiqr,bqjr->jxbi", (2, 3, 5, 7, 2), (3, 7, 4, 2)),
    ("i,j->ij", (5,), (3,)), ("bi,bi->b", (3, 7), (3, 7)), ("bi,bj->bji", (3, 5), (3, 2))])
def test_einsum_plan_equals_einsum_and_autograd_float64(eq, sa, sb):
    """Batched matrix products with batch letters, several contracted and free letters, transposed operands,
    an implicit output and an output in another order: the plan's permutes, views and matmul (the records' torch
    bindings) equal torch.einsum and its gradients in float64 on odd sizes."""
    from port.ops.attention import einsum_plan
    gen = torch.Generator().manual_seed(5)
    a, b = _rand(sa, gen), _rand(sb, gen)
    plan = einsum_plan(eq, sa, sb)
    assert plan is not None
    ar, br = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    want = torch.einsum(eq, ar, br)
    dy = _rand(want.shape, gen)
    y, (ga, gb) = _einsum_by_plan(plan, a, b, dy)
    torch.testing.assert_close(y, want.detach(), rtol=1e-13, atol=1e-13)
    wa, wb = torch.autograd.grad(want, (ar, br), dy)
    torch.testing.assert_close(ga, wa, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(gb, wb, rtol=1e-13, atol=1e-13)


def test_einsum_plan_permutes_the_fewer_elements():
    """MaxViT's scores permute k only (not q and the scores); its attn @ v is a plain batched matmul."""
    from port.ops.attention import einsum_plan
    p = einsum_plan("B G H I D, B G H J D -> B G H I J", (2, 3, 2, 5, 7), (2, 3, 2, 6, 7))
    assert p.left == 0 and p.perm_left == (0, 1, 2, 3, 4) and p.perm_right == (0, 1, 2, 4, 3), p
    assert p.perm_out == (0, 1, 2, 3, 4) and p.mm_left == (12, 5, 7) and p.mm_right == (12, 7, 6), p
    p = einsum_plan("B G H I J, B G H J D -> B G H I D", (2, 3, 2, 5, 6), (2, 3, 2, 6, 7))
    assert all(list(q) == sorted(q) for q in (p.perm_left, p.perm_right, p.perm_out)), p
    p = einsum_plan("ij,kj->ki", (5, 7), (3, 7))          # (b a^T): b untouched, a transposed
    assert p.left == 1 and p.perm_left == (0, 1) and p.perm_right == (1, 0), p


@pytest.mark.parametrize("eq,sa,sb", [
    ("ii,ij->j", (3, 3), (3, 4)),            # a diagonal
    ("ij,j->", (2, 3), (3,)),                 # i summed within one operand
    ("bij,bjk->bk", (2, 3, 4), (2, 4, 5)),   # i summed within one operand
    ("...ij,...jk->...ik", (2, 3, 4), (2, 4, 5)),    # an ellipsis
    ("bij,bjk->bik", (1, 3, 4), (2, 4, 5)),  # b broadcast
    ("ij,jk,kl->il", (2, 3), (3, 4)),        # three operands
    ("ij,jk->ikk", (2, 3), (3, 4))])         # a letter repeated in the output
def test_einsum_plan_declines_what_is_not_a_matrix_product(eq, sa, sb):
    from port.ops.attention import einsum_plan
    assert einsum_plan(eq, sa, sb) is None


class _Einsums(nn.Module):
    """einsum(eq, tanh(a(x)), b): b a parameter of shape ``sb``, or (None) sigmoid(a(x))."""

    def __init__(self, eq: str, sb: tuple[int, ...] | None):
        super().__init__()
        torch.manual_seed(0)
        self.eq = eq
        self.a = nn.Linear(5, 6)
        self.b = nn.Parameter(torch.randn(sb) * 0.3) if sb else None
        self.fc = nn.LazyLinear(3)

    def forward(self, x):                                    # [N, 4, 5]
        h = self.a(x)
        other = self.b if self.b is not None else torch.sigmoid(h)
        return self.fc(torch.einsum(self.eq, torch.tanh(h), other).flatten(1))


@pytest.mark.parametrize("eq,sb,kinds", [
    ("nij,kj->nik", (3, 6), {"matmul": 1, "permute": 1}),    # b^T, b a parameter: b permuted
    ("nij,kj->nki", (3, 6), {"matmul": 1, "permute": 2}),    # and the product permuted into the output
    ("nij,nij->ni", None, {"matmul": 1, "permute": 0}),
    ("nij,jk->nik", (6, 2), {"matmul": 1, "permute": 0}),
    ("nij,kj->nk", (3, 6), None),                                # i summed within a: not a matmul; a torch_op
    ("nij,abcd->nijabcd", (1, 2, 1, 2), None)])                  # a product of rank 7: past permute's 6 dims
def test_einsum_captures_as_matmul_on_c_and_trains_like_eager(eq, sb, kinds):
    """A two-operand einsum that is a matrix product is captured as permute, reshape and matmul ops (every op on
    C, training like eager); another stays a torch_op."""
    x, y = torch.randn(4, 4, 5), torch.tensor([0, 2, 1, 1])

    def net():
        m = _Einsums(eq, sb)
        m(x)                                                 # LazyLinear's size
        return m
    tr = port.Trainer(net(), x, optimizer=SGD(0.1))
    got = [o.kind for o in tr.graph.ops if o.phase == "forward"]
    if kinds is None:
        assert "torch_op" in got and "matmul" not in got, got
        return
    assert "torch_op" not in got and {k: got.count(k) for k in kinds} == kinds, got
    assert all(d.accelerator == "cpu-c" for d in tr.plan.ops)
    _steps_like_eager(tr, net(), x, y, 0.1, 3)
