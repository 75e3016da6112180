"""Hostile inputs to trace (issue 11): in-place tensor ops and tied (shared) parameters.

In-place ops are functionalized (the result replaces the modified tensor for every later use, under any name)
or refused by name where PORT's functional graph cannot reproduce them; tied parameters are one graph tensor
with one gradient (the sum of every use's contribution), one optimizer state and one update. Every supported
case trains equal to PyTorch eager step for step (small models, a few steps: fast)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from port.errors import PortTraceError
from port.ir.trace import trace
from port.ir.types import ROLE_OPTIMIZER_STATE, ROLE_PARAMETER
from port.train.optim import SGD, AdamW
from port.train.trainer import Trainer

STEPS = 4
RTOL = 1e-4


def _batches(in_shape=(16,), batch=8, steps=STEPS, seed=1):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(batch, *in_shape, generator=g) for _ in range(2)]
    ys = [torch.randint(0, 10, (batch,), generator=g) for _ in range(2)]
    return [(xs[i % 2], ys[i % 2]) for i in range(steps)]


def _opts(kind: str):
    if kind == "sgd":
        return (SGD(0.05, momentum=0.9, weight_decay=1e-4),
                lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-4, foreach=False))
    return (AdamW(1e-2, weight_decay=1e-2),
            lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=1e-2, foreach=False))


def _compare(model, batches, opt="sgd", backend="c", **kw):
    """Train ``model`` under PORT and a deep copy in PyTorch eager; every step's loss and the final weights
    agree within float32 tolerance. Returns (trainer, reference module)."""
    ref = copy.deepcopy(model)
    popt, topt_fn = _opts(opt)
    tr = Trainer(model, batches[0][0], optimizer=popt, backend=backend, **kw)
    topt = topt_fn([p for p in ref.parameters() if p.requires_grad])
    for i, (x, y) in enumerate(batches):
        lp = tr.step(x, y)
        topt.zero_grad(set_to_none=True)
        lt = F.cross_entropy(ref(x), y)
        lt.backward()
        topt.step()
        lt = float(lt.detach())
        assert abs(lp - lt) <= RTOL * abs(lt) + 1e-6, f"step {i}: loss {lp} (PORT) vs {lt} (PyTorch)"
    sd, rsd = tr.state_dict(), ref.state_dict()
    for k, v in sd.items():
        err = float((v - rsd[k]).norm()) / max(float(rsd[k].norm()), 1e-3)
        assert err <= 1e-3, f"{k}: relative error {err:.2e} after {len(batches)} steps"
    return tr, ref


# =============================================================================================
# in-place ops: functionalized
# =============================================================================================
class _Base(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(16, 32)
        self.c = nn.Linear(16, 32)
        self.b = nn.Linear(32, 10)
        self.d = nn.Linear(32, 10)
        self.ident = nn.Identity()
        self.relu_ip = nn.ReLU(inplace=True)
        self.relu6_ip = nn.ReLU6(inplace=True)
        self.hsw_ip = nn.Hardswish(inplace=True)


class MethodRelu(_Base):
    def forward(self, x):
        h = self.a(x)
        h.relu_()                        # result unused: h itself changed
        return self.b(h)


class FunctionalInplace(_Base):
    def forward(self, x):
        h = self.a(x)
        F.relu(h, inplace=True)
        return self.b(h)


class FunctionalRelu_(_Base):
    def forward(self, x):
        h = self.a(x)
        F.relu_(h)
        h2 = self.c(x)
        torch.relu_(h2)
        return self.b(h) + self.d(h2)


class ModuleInplaceUnused(_Base):
    def forward(self, x):
        h = self.a(x)
        self.relu_ip(h)
        return self.b(h)


class ModuleInplaceBothNames(_Base):
    def forward(self, x):
        h = self.a(x)
        y = self.relu_ip(h)              # y and h are the same tensor in eager mode
        return self.b(y) + self.d(h)


class Relu6HardswishInplace(_Base):
    def forward(self, x):
        h = self.a(x)
        self.relu6_ip(h)
        g = self.c(x)
        self.hsw_ip(g)
        return self.b(h) + self.d(g)


class MethodAdd(_Base):
    def forward(self, x):
        h = self.a(x)
        h.add_(self.c(x))
        return self.b(h)


class AugmentedAssignAlias(_Base):
    def forward(self, x):
        h = self.a(x)
        g = h                            # another name for the same tensor
        h += self.c(x)
        return self.b(F.relu(g))


class InplaceOnIdentityAlias(_Base):
    def forward(self, x):
        h = self.a(x)
        h2 = self.ident(h)               # nn.Identity returns the same tensor
        h2.relu_()
        return self.b(h)


class ChainedInplace(_Base):
    def forward(self, x):
        h = self.a(x)
        h.add_(self.c(x)).relu_()
        return self.b(h)


class ResidualIadd(_Base):
    """torchvision's BasicBlock idiom: out += identity; out = relu(out) (in place)."""
    def forward(self, x):
        h = F.relu(self.a(x))
        out = self.c(x)
        out += h
        out = self.relu_ip(out)
        return self.b(out) + self.d(h)


class InplaceOnViewOfDeadTensor(_Base):
    def forward(self, x):
        v = self.a(x).view(x.size(0), -1)    # nothing reads the viewed tensor again
        v.relu_()
        g = self.relu_ip(torch.flatten(self.c(x), 1))
        return self.b(v) + self.d(g)


INPLACE_OK = [MethodRelu, FunctionalInplace, FunctionalRelu_, ModuleInplaceUnused, ModuleInplaceBothNames,
              Relu6HardswishInplace, MethodAdd, AugmentedAssignAlias, InplaceOnIdentityAlias, ChainedInplace,
              ResidualIadd, InplaceOnViewOfDeadTensor]


@pytest.mark.parametrize("cls", INPLACE_OK, ids=[c.__name__ for c in INPLACE_OK])
def test_inplace_ops_train_like_pytorch(cls):
    _compare(cls(), _batches())


@pytest.mark.parametrize("backend", ["torch-cpu"])
def test_inplace_ops_torch_backend(backend):
    _compare(AugmentedAssignAlias(), _batches(), opt="adamw", backend=backend)
    _compare(MethodRelu(), _batches(), opt="adamw", backend=backend)


def test_inplace_trace_does_not_modify_the_example_input():
    x = torch.randn(4, 16)
    keep = x.clone()

    class M(_Base):
        def forward(self, x):
            h = self.a(x)
            h.relu_()
            return self.b(h)
    trace(M(), x)
    assert torch.equal(x, keep)


# =============================================================================================
# in-place ops: refused by name
# =============================================================================================
class OnInput(_Base):
    def forward(self, x):
        x.relu_()
        return self.b(self.a(x))


class OnView(_Base):
    def forward(self, x):
        h = self.a(x)
        v = h.view(h.size(0), -1)
        v.relu_()
        return self.b(h)


class AfterView(_Base):
    def forward(self, x):
        h = self.a(x)
        v = h.flatten(1)
        h.relu_()
        return self.b(v)


class SavedForBackward(_Base):
    def forward(self, x):
        h = self.a(x)
        z = self.b(h)                    # linear saves h for its weight gradient
        h.relu_()
        return z + self.d(h)


class OnReluOutput(_Base):
    def forward(self, x):
        r = F.relu(self.a(x))            # relu's backward reads its output
        r.add_(self.c(x))
        return self.b(r)


class UnsupportedMul(_Base):
    def forward(self, x):
        h = self.a(x)
        h.mul_(2)
        return self.b(h)


class OutKwarg(_Base):
    def forward(self, x):
        h = self.a(x)
        g = self.c(x)
        torch.add(h, g, out=h)
        return self.b(h)


class OnParameter(_Base):
    def forward(self, x):
        self.a.weight.mul_(0.5)
        return self.b(self.a(x))


REFUSED = [
    (OutKwarg, "add", "out="),
    (OnParameter, "parameter", "test_hostile_trace.py:"),
]


@pytest.mark.parametrize("cls,op,why", REFUSED, ids=[r[0].__name__ for r in REFUSED])
def test_unsupported_inplace_refused_by_name(cls, op, why):
    x = torch.randn(4, 16)
    keep = x.clone()
    with pytest.raises(PortTraceError) as e:
        trace(cls(), x)
    msg = str(e.value)
    assert op in msg and why in msg, msg
    assert torch.equal(x, keep), "trace modified the caller's example input"
    assert "test_hostile_trace.py:" in msg, f"no source line in: {msg}"   # the user's line


# torch.export's functionalization reproduces mutation through views exactly (a write into a view of h shows
# in h), so these train like eager now instead of being refused
@pytest.mark.parametrize("cls", [OnView, AfterView, UnsupportedMul], ids=lambda c: c.__name__)
def test_inplace_through_views_is_functionalized(cls):
    _compare(cls(), _batches())


# eager autograd cannot differentiate these (it fails with 'modified by an inplace operation'), or they write
# into the caller's batch: PORT captures the forward's values as a functional graph and never touches the input
@pytest.mark.parametrize("cls", [OnInput, SavedForBackward, OnReluOutput], ids=lambda c: c.__name__)
def test_inplace_eager_cannot_differentiate_captures_functionally(cls):
    x = torch.randn(4, 16)
    keep = x.clone()
    g = trace(cls(), x)
    assert torch.equal(x, keep) and g.ops


# =============================================================================================
# tied (shared) parameters
# =============================================================================================
class TiedLinear(nn.Module):
    """Embedding-like input Linear and a later Linear sharing one weight (separate biases)."""
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.out = nn.Linear(16, 10)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.out(F.relu(self.b(F.relu(self.a(x)))))


class SameModuleTwice(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(16, 16)
        self.out = nn.Linear(16, 10)

    def forward(self, x):
        return self.out(F.relu(self.a(F.relu(self.a(x)))))


class ModuleRegisteredTwice(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(16, 16)
        self.b = self.a                  # one module under two names: weight and bias tied
        self.out = nn.Linear(16, 10)

    def forward(self, x):
        return self.out(F.relu(self.b(F.relu(self.a(x)))))


class TiedConv(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.c2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, 10)
        self.c2.weight = self.c1.weight

    def forward(self, x):
        h = F.relu(self.bn1(self.c1(x)))
        h = F.relu(self.bn2(self.c2(h)))
        return self.fc(h.flatten(1))


TIED = [TiedLinear, SameModuleTwice, ModuleRegisteredTwice, TiedConv]
_IN = {TiedConv: (4, 6, 6)}


def _check_tied_graph(model, g):
    want = list(dict(model.named_parameters()))        # torch's deduplicated parameter names
    assert sorted(t.name for t in g.parameters()) == sorted(want)
    assert sum(1 for o in g.ops if o.kind == "update") == len(want)
    n_state = sum(1 for t in g.tensors if t.role == ROLE_OPTIMIZER_STATE)
    assert n_state == len(want) * {"sgd": 0, "sgd_momentum": 1, "adamw": 2}[g.optimizer]


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
@pytest.mark.parametrize("cls", TIED, ids=[c.__name__ for c in TIED])
def test_tied_parameters_train_like_pytorch(cls, opt):
    m = cls()
    batches = _batches(_IN.get(cls, (16,)))
    tr, ref = _compare(m, batches, opt=opt)
    _check_tied_graph(m, tr.graph)
    # a tied weight's gradient is the sum of both uses: one grad_accumulate feeds its update
    m2 = tr.to_torch()
    if cls is TiedLinear:
        assert m2.a.weight is m2.b.weight
        assert torch.allclose(m2.b.weight, ref.b.weight, rtol=1e-4, atol=1e-6)
        assert not torch.equal(m2.a.weight, cls().a.weight)   # it trained
    if cls is TiedConv:
        assert m2.c1.weight is m2.c2.weight
        assert torch.allclose(m2.c2.weight, ref.c2.weight, rtol=1e-4, atol=1e-6)


def test_tied_parameters_torch_backend():
    _compare(TiedLinear(), _batches(), opt="sgd", backend="torch-cpu")
    _compare(TiedConv(), _batches((4, 6, 6)), opt="adamw", backend="torch-cpu")


def test_tied_parameters_micro_batch():
    _compare(TiedLinear(), _batches(), opt="sgd", micro_batch=4)


def test_tied_parameter_trainable_through_either_module():
    """trainable=['b']: the weight b shares with a is trained (with both uses' gradients); a.bias is frozen."""
    m = TiedLinear()
    batches = _batches()
    ref = copy.deepcopy(m)
    ref.a.bias.requires_grad_(False)
    ref.out.requires_grad_(False)
    popt, topt_fn = _opts("sgd")
    tr = Trainer(m, batches[0][0], optimizer=popt, trainable=["b"])
    topt = topt_fn([p for p in ref.parameters() if p.requires_grad])
    for x, y in batches:
        lp = tr.step(x, y)
        topt.zero_grad(set_to_none=True)
        lt = F.cross_entropy(ref(x), y)
        lt.backward()
        topt.step()
        lt = float(lt.detach())
        assert abs(lp - lt) <= RTOL * abs(lt) + 1e-6
    sd = tr.state_dict()
    assert torch.allclose(sd["a.weight"], ref.a.weight.detach(), rtol=1e-4, atol=1e-6)
    assert torch.equal(sd["a.bias"], m.a.bias.detach())


def test_tied_parameters_checkpoint_resume(tmp_path):
    batches = _batches(steps=6)
    a = Trainer(TiedLinear(), batches[0][0], optimizer=AdamW(1e-2))
    la = [a.step(x, y) for x, y in batches]
    b = Trainer(TiedLinear(), batches[0][0], optimizer=AdamW(1e-2))
    lb = [b.step(x, y) for x, y in batches[:3]]
    b.save_checkpoint(tmp_path / "t.port")
    c = Trainer.resume(tmp_path / "t.port", TiedLinear(), batches[0][0])
    lc = [c.step(x, y) for x, y in batches[3:]]
    assert la == lb + lc
    m = c.to_torch()
    assert m.a.weight is m.b.weight and torch.equal(m.b.weight.detach(), a.state_dict()["a.weight"])
    from port.train.export import export
    ts = torch.export.load(str(export(c, tmp_path / "t.pt2", format="torch"))).module()
    x = batches[0][0]
    assert torch.allclose(ts(x), c.predict(x), atol=1e-5)


def test_tied_parameters_solved_plan():
    """The solver, simulator and lowering handle one parameter read by two forward ops and written by one
    update: a plan solved under a tight budget runs and trains like PyTorch."""
    from port.config import load_device
    from port.cost.roofline import modeled_profile
    from port.solver import solve
    from port.verify.simulate import simulate
    m = TiedLinear()
    batches = _batches()
    popt, _ = _opts("sgd")
    g = trace(m, batches[0][0], optimizer=popt.graph_name)
    prof = modeled_profile(g, load_device("host"))
    full = simulate(solve(g, prof, budget=10**9, time_limit_s=10), g, prof).peak_bytes
    plan = solve(g, prof, budget=int(full * 0.9), time_limit_s=10)
    assert simulate(plan, g, prof).peak_bytes <= int(full * 0.9)
    _compare(m, batches, opt="sgd", plan=plan)
