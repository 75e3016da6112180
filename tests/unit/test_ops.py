"""The op records (port.ops): one definition per op kind, read by the tracer, the registry, the C-call encoder
and the torch backend. Checks the records are complete and consistent, and every record with a torch binding
only (sigmoid, hardsigmoid, silu, broadcasting mul, cat) against PyTorch autograd in float64 on odd shapes."""
from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[2]


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
    assert set(semantics.NOT_RECOMPUTABLE_KINDS) == {"reshape", "dropout"}
    assert {"relu", "linear", "max_pool2d", "sigmoid", "mul"} <= set(CHECKPOINT_KINDS)
    assert "dropout" not in CHECKPOINT_KINDS


def test_torch_only_records_have_no_c_variants():
    for kind in ("sigmoid", "hardsigmoid", "silu", "mul", "cat", "torch_op"):
        assert not ops.has_c(kind) and not registry.known_kernel(kind, "c")
        assert registry.known_kernel(kind, "torch-cpu")
    assert ops.has_c("conv2d") and ops.has_c("reshape")


# ---------------------------------------------------------------------------------------------
# forward and backward of the torch-only records against autograd, float64, odd shapes
# ---------------------------------------------------------------------------------------------
def _rand(shape, gen):
    return torch.randn(shape, dtype=torch.float64, generator=gen)


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


@pytest.mark.parametrize("sa,sb", [((3, 5, 7), (3, 5, 7)), ((2, 5, 3, 3), (2, 5, 1, 1)), ((3, 1, 5, 1), (1, 4, 1, 7)),
                                   ((6, 5), (5,)), ((1, 7), (3, 1))])
def test_mul_broadcasts_on_every_axis(sa, sb):
    gen = torch.Generator().manual_seed(2)
    r = ops.record("mul")
    a, b = _rand(sa, gen), _rand(sb, gen)
    y = torch.empty(torch.broadcast_shapes(sa, sb), dtype=torch.float64)
    ins, outs = registry.call_shapes("mul", {}, [sa, sb], [y.shape])
    assert outs[0][0] == tuple(y.shape)
    r.torch("mul", {}, [a, b], [y], _env())()
    torch.testing.assert_close(y, a * b, rtol=0, atol=0)
    dy = _rand(y.shape, gen)
    da, db = torch.empty_like(a), torch.empty_like(b)
    attrs = {"grads": (0, 1)}
    registry.call_shapes("mul.grad_input", attrs, [y.shape, sb, sa], [sa, sb])
    r.torch("mul.grad_input", attrs, [dy, b, a], [da, db], _env())()
    ar, br = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    wa, wb = torch.autograd.grad(ar * br, (ar, br), dy)
    torch.testing.assert_close(da, wa, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(db, wb, rtol=1e-13, atol=1e-13)
    with pytest.raises(CallShapeError):
        registry.call_shapes("mul", {}, [(3, 4), (5,)], [(3, 4)])


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
    """Squeeze-excitation with sigmoid and hardsigmoid gates, SiLU, a broadcast multiply and cat."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.se = nn.Conv2d(6, 6, 1)
        self.fc = nn.Linear(12, 4)

    def forward(self, x):
        h = nn.functional.silu(self.conv(x))
        s = h.mean((2, 3), keepdim=True)
        h = h * torch.sigmoid(self.se(s)) + h * nn.functional.hardsigmoid(s)
        h = torch.cat([h, torch.relu(h)], 1)
        return self.fc(h.mean((2, 3)))


def test_records_capture_instead_of_torch_ops_and_train_like_eager():
    x, y = torch.randn(4, 3, 7, 5), torch.tensor([0, 1, 2, 3])
    tr = port.Trainer(_Gates(), x, optimizer=SGD(0.1))
    kinds = {o.kind for o in tr.graph.ops}
    assert {"silu", "sigmoid", "hardsigmoid", "mul", "cat"} <= kinds and "torch_op" not in kinds, kinds
    # ops with no C kernel run on the torch engine of the same memory; the rest on C
    acc = {tr.graph.ops[d.op].kind: d.accelerator for d in tr.plan.ops}
    assert acc["mul"] == "cpu-torch" and acc["conv2d"] == "cpu-c"
    ref = _Gates()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        loss = tr.step(x, y)
        opt.zero_grad()
        want = nn.functional.cross_entropy(ref(x), y)
        want.backward()
        opt.step()
        assert abs(float(loss) - want.item()) < 1e-5
