"""Models nobody here wrote train under PORT like PyTorch eager (issue 52): a quick subset of bench/published.py's
list (torchvision, timm, Hugging Face, hand-written idioms), and the torch_op fallback on its own.

Equality, per step of 3 SGD-momentum steps: PORT's loss within 1e-4 of eager float32's, or no farther from eager
float64's than 2x float32 eager's distance + 1e-4 (bench/published.equal)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import port
from port.train.optim import SGD, AdamW
from port.train.trainer import Trainer
from published_zoo import published  # tests/published_zoo.py: bench/published.py as a module

P = published()
ZOO = P.import_zoo()
QUICK = [n for n, s in P.MODELS.items() if s.quick]


def _needs(spec):
    fam = {"torchvision": "torchvision", "timm": "timm", "transformers": "transformers", "peft": "peft"}.get(spec.family)
    if fam is not None and fam not in ZOO:
        pytest.skip(f"{fam} is not installed (pip install -e '.[zoo]')")


@pytest.mark.parametrize("name", QUICK)
def test_published_model_trains_like_eager(name):
    spec = P.MODELS[name]
    _needs(spec)
    row = P.compare(spec, steps=3)
    assert row.captured, row.error
    assert not row.error, row.error
    assert row.trained_equal, (f"{name}: PORT {row.losses_port}, eager float32 {row.losses_eager}, "
                               f"float64 {row.losses_f64}")
    assert row.ops_c > 0        # PORT's own kernels run what they can
    assert row.plan_peak_bytes > 0 and row.eager_growth_bytes > 0      # the table's memory column: both measured


def test_equality_criterion():
    """The criterion can fail: a run farther from float64 than twice float32's spread is not equal."""
    f64 = [2.0, 1.5, 1.0]
    f32 = [2.0, 1.5, 1.01]            # float32 eager, default threads: 1e-2 from float64 at step 3
    f32_1t = [2.0, 1.5, 0.97]         # one thread: 3e-2
    assert P.equal([2.0, 1.5, 1.01001], f32, f64)            # within 1e-4 of eager
    assert P.equal([2.0, 1.5, 0.985], f32, f64)              # 1.5e-2 <= 2 * 1e-2
    assert not P.equal([2.0, 1.5, 0.95], f32, f64)           # 5e-2 > 2 * 1e-2 + 1e-4
    assert P.equal([2.0, 1.5, 0.95], f32, f64, (f32_1t,))    # 5e-2 <= 2 * 3e-2: the spread of both runs
    assert not P.equal([2.0, 1.5, 0.9], f32, f64, (f32_1t,))
    assert not P.equal([2.0, 1.6, 1.0], f32, f64, (f32_1t,))  # step 2 where float32 agrees with float64 exactly
    assert not P.equal([2.0, float("nan"), 1.0], f32, f64)


def _losses_like_eager(tr, ref, opt, x, y, steps):
    """``steps`` steps of the Trainer and of eager ``ref`` with ``opt``: every loss equal to 1e-5."""
    for i in range(steps):
        lp = tr.step(x, y)
        opt.zero_grad()
        lt = F.cross_entropy(ref(x), y)
        lt.backward()
        opt.step()
        assert abs(lp - float(lt)) <= 1e-5 * abs(float(lt)) + 1e-6, f"step {i}: {lp} vs {float(lt)}"


# ---- the fallback: an aten op PORT has no kind for ------------------------------------------------------
class _Fallback(nn.Module):
    """Ops without C kernels: sigmoid gating with a broadcast tensor multiply, a parameter used directly (a
    cumsum: a torch_op with a weight gradient), cat, chunk, amax, a small lifted constant; a ceil-mode pool (on C
    since issue 54) between them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.gamma = nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.extra = nn.Parameter(torch.randn(1, 4))
        self.fc = nn.Linear(20, 5)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        h = h * torch.sigmoid(h.mean((2, 3), keepdim=True)) * self.gamma.view(1, -1, 1, 1)
        a, b = h.chunk(2, dim=1)
        h = F.max_pool2d(torch.cat([b, a], 1), 2, ceil_mode=True)
        z = h.amax((2, 3)) * torch.tensor(0.5)
        return self.fc(torch.cat([z, F.silu(z), torch.cumsum(self.extra, 1).expand(z.shape[0], -1)], 1))


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_torch_op_fallback_trains_like_eager(opt):
    m = _Fallback()
    ref = copy.deepcopy(m)
    x = torch.randn(4, 3, 7, 9)        # odd spatial shape: the ceil-mode pool pads
    y = torch.randint(0, 5, (4,))
    popt, topt = ((SGD(0.05, momentum=0.9), torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9))
                  if opt == "sgd" else (AdamW(1e-2), torch.optim.AdamW(ref.parameters(), lr=1e-2)))
    tr = Trainer(m, x, optimizer=popt)
    kinds = {o.kind for o in tr.graph.ops}
    assert {"torch_op", "torch_op.grad_input", "torch_op.grad_weight", "conv2d", "linear"} <= kinds
    assert {d.accelerator for d in tr.plan.ops} == {"cpu-c", "cpu-torch"}
    _losses_like_eager(tr, ref, topt, x, y, 4)
    sd, rsd = tr.state_dict(), ref.state_dict()
    for k in rsd:
        torch.testing.assert_close(sd[k], rsd[k], rtol=1e-4, atol=1e-5)


def test_torch_ops_are_recomputed_like_any_op():
    """A plan that drops saved activations and re-runs their producers re-runs torch_ops too (the ILP's recompute
    candidates are the same ops: no record tag stops them), on the torch engine, verified by the simulator, and
    trains bit for bit like keeping everything."""
    from port.lower.lower import default_plan, recompute_plan
    from port.verify.simulate import simulate
    from port.cost.roofline import modeled_profile
    from port.config import load_device
    x, y = torch.randn(4, 3, 7, 9), torch.randint(0, 5, (4,))
    g = port.trace(_Fallback(), x)
    keep = default_plan(g)
    rc = recompute_plan(g, keep, only=[o.id for o in g.ops if o.phase == "forward"])   # checkpoint kinds too
    rerun = {g.ops[p].kind for p, _ in rc.recompute_at}
    assert "torch_op" in rerun, rerun
    acc = {d.op: d.accelerator for d in rc.ops}
    assert all(acc[p] == "cpu-torch" for p, _ in rc.recompute_at if g.ops[p].kind == "torch_op")
    sim_k, sim_r = (simulate(p, g, modeled_profile(g, load_device("host"))) for p in (keep, rc))   # legal plans
    assert sim_r.step_ms > sim_k.step_ms          # the re-runs are priced (this tiny net peaks at its weights)
    losses = []
    for plan in (keep, rc):
        tr = Trainer(_Fallback(), x, plan=plan, optimizer=SGD(0.05, momentum=0.9))
        losses.append([tr.step(x, y) for _ in range(3)])
    reruns = [c for c in tr.program.calls if c.phase == "recompute"]
    assert sum(1 for c in reruns if c.kernel == "torch_op") == 2, [c.kernel for c in reruns]
    assert losses[0] == losses[1], losses


def test_torch_op_gradients_equal_autograd_in_float64():
    """A torch_op's backward is PyTorch's derivative of the aten call: checked through the torch backend's binding
    on float64 views, odd shapes, against torch.autograd on the same function."""
    from types import SimpleNamespace
    from port import ops as records
    from port.exec.backends.torch_backend import TorchEnv
    g = port.trace(_Fallback(), torch.randn(3, 3, 5, 7))
    ops = [o for o in g.ops if o.kind in ("torch_op.grad_input", "torch_op.grad_weight")]
    assert ops
    gen = torch.Generator().manual_seed(0)
    state = SimpleNamespace(seed=0, dropout_counter=0)
    checked = 0
    for o in ops:
        ins = [torch.randn(g.tensors[t].shape, dtype=torch.float64, generator=gen)
               if g.tensors[t].dtype.startswith("float") else torch.zeros(g.tensors[t].shape, dtype=torch.int64)
               for t in o.inputs]
        outs = [torch.zeros(g.tensors[t].shape, dtype=torch.float64) for t in o.outputs]   # (weights accumulate)
        env = TorchEnv(torch, torch.nn.functional, torch.ops.aten, state, o.id)
        records.record(o.kind).torch(o.kind, dict(o.attrs), ins, outs, env)()
        from port.ir.capture import make_call
        fn = make_call(o.attr("call"), None)
        full = list(ins[1:])          # the saved operands, and zeros for those the derivative does not read
        for i, shape, dtype in (dict(o.attrs).get("absent") or ()):
            full.insert(i, torch.zeros(shape, dtype=torch.float64 if dtype.startswith("float") else torch.int64))
        xs = [t.clone().requires_grad_(i in o.attr("grads")) for i, t in enumerate(full)]
        want = torch.autograd.grad(fn(xs), [xs[i] for i in o.attr("grads")], ins[0])
        for a, w in zip(outs, want):
            torch.testing.assert_close(a, w.reshape(a.shape), rtol=1e-12, atol=1e-12)
        checked += 1
    assert checked >= 2 and {o.kind for o in ops} == {"torch_op.grad_input", "torch_op.grad_weight"}


class _Saves(nn.Module):
    """torch_ops whose derivative reads none of their operands (pad by a non-zero value, flip, roll of the
    flattened tensor: forms the pad and roll records leave to torch), one operand (a product with a
    parameter through an op PORT has no record for: addcmul: self is not read) or their output (expm1's backward:
    every input)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 4).view(1, 4, 1, 1))
        self.fc = nn.Linear(4 * 7 * 9, 3)

    def forward(self, x):
        h = F.pad(self.conv(x), (1, 1, 1, 1), value=0.5)
        h = torch.flip(h, [3]).roll(1)
        h = torch.addcmul(h, h.detach() * 0 + 1.0, self.w)
        return self.fc(torch.expm1(-h.abs()).flatten(1))


def test_torch_op_saves_what_autograd_saves():
    """The saved bytes of a torch_op are measured at capture (saved_tensors_hooks): pad/flip/roll keep nothing of
    their input for the backward, addcmul its two factors, expm1 every input, and training stays equal to eager."""
    m = _Saves()
    x, y = torch.randn(2, 3, 7, 9), torch.tensor([0, 2])
    g = port.trace(m, x)
    from port.ir.capture import aten_of
    by_aten = {}
    for o in g.ops:
        if o.kind == "torch_op":
            by_aten.setdefault(aten_of(o).split(".")[1], o)
    for name in ("pad", "flip", "roll"):
        o = by_aten[name]
        assert o.attr("saves") == () and o.saved == (), (name, o.attrs, o.saved)
    assert by_aten["addcmul"].attr("saves") == (1, 2) and len(by_aten["addcmul"].saved) == 2
    e = by_aten["expm1"]
    assert "saves" not in dict(e.attrs) and e.saved == e.inputs
    ref = copy.deepcopy(m)
    tr = Trainer(m, x, optimizer=SGD(0.1))
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    _losses_like_eager(tr, ref, opt, x, y, 3)


def test_model_output_dicts_and_output_choice():
    class Multi(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(6, 3), nn.Linear(6, 4)

        def forward(self, x):
            return {"aux": self.a(x), "logits": self.b(x)}
    x = torch.randn(2, 6)
    assert port.trace(Multi(), x).tensors[port.trace(Multi(), x).logits_id].shape == (2, 4)
    assert port.trace(Multi(), x, output="aux").tensors[port.trace(Multi(), x, output="aux").logits_id].shape == (2, 3)
    with pytest.raises(port.errors.PortTraceError, match="output='nope'"):
        port.trace(Multi(), x, output="nope")


def test_tuple_inputs_tuple_outputs_and_optional_arguments():
    """A tuple of positional tensors are the inputs; optional forward arguments left at their defaults (a tensor
    argument None, a float) are not; a tuple output's first tensor is the logits unless output= picks another."""
    class TwoIn(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.aux = nn.Linear(6, 3), nn.Linear(4, 3), nn.Linear(6, 5)

        def forward(self, x, z, mask=None, scale: float = 1.0):
            if mask is not None:
                x = x * mask
            return (self.a(x) + self.b(z)) * scale, self.aux(x)
    x, z = torch.randn(2, 6), torch.randn(2, 4)
    g = port.trace(TwoIn(), (x, z))
    assert len(g.input_ids) == 2 and [g.tensors[t].shape for t in g.input_ids] == [(2, 6), (2, 4)]
    assert g.tensors[g.logits_id].shape == (2, 3)
    assert port.trace(TwoIn(), (x, z), output=1).tensors[port.trace(TwoIn(), (x, z), output=1).logits_id].shape \
        == (2, 5)
    ref = TwoIn()
    tr = Trainer(copy.deepcopy(ref), (x, z), optimizer=SGD(0.1))
    opt, y = torch.optim.SGD(ref.parameters(), lr=0.1), torch.tensor([0, 2])
    for _ in range(2):
        lp = tr.step((x, z), y)
        opt.zero_grad()
        lt = F.cross_entropy(ref(x, z)[0], y)
        lt.backward()
        opt.step()
        assert abs(lp - float(lt)) <= 1e-5 * abs(float(lt)) + 1e-6


def test_spatial_mean_without_keepdim_lowers():
    """x.mean([2, 3]) without keepdim (torchvision MNASNet) is the spatial mean and a free view, not an error."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 3)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(self.c(x).mean([2, 3]))
    tr = Trainer(Net(), torch.randn(2, 3, 6, 6))
    assert any(o.kind == "global_avg_pool2d" for o in tr.graph.ops)
    assert all(d.accelerator == "cpu-c" for d in tr.plan.ops)
    tr.step(torch.randn(2, 3, 6, 6), torch.tensor([0, 1]))


def test_ops_without_c_kernels_are_listed():
    """torch_ops by their aten op, records with a torch binding only by their kind: what `port inspect` shows and
    `port compile` refuses."""
    from port.ir.capture import torch_ops
    g = port.trace(_Fallback(), torch.randn(2, 3, 5, 5))
    names = set(dict(torch_ops(g)).values())
    assert any("aten.amax" in a for a in names), names
    assert not any(k in names for k in ("conv2d", "relu", "linear", "sigmoid", "silu", "mul", "max_pool2d", "cat",
                                        "narrow", "expand")), names   # (C kernels; the ceil-mode pool too, issue 54)


def test_capture_in_a_child_process_gives_the_same_graph(monkeypatch):
    """The default capture path (a forked child: the caller never imports torch.export's compiler stack) and the
    in-process one give the same graph, torch_ops and several inputs included; an error keeps its message."""
    from port.ir import trace as T
    x = torch.randn(2, 3, 5, 5)
    monkeypatch.setenv("PORT_CAPTURE", "inprocess")
    T._CACHE.clear()
    here = port.trace(_Fallback(), x)
    monkeypatch.delenv("PORT_CAPTURE")
    T._CACHE.clear()
    child = port.trace(_Fallback(), x)
    assert child.digest() == here.digest() and child.to_dict() == here.to_dict()

    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, a, scale=None):
            return self.fc(a * scale)
    g = port.trace(TwoInputs(), {"a": torch.randn(2, 6), "scale": torch.rand(2, 6)})
    assert [g.tensors[t].name for t in g.input_ids] == ["input", "scale"]

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x) if x.sum() > 0 else -self.fc(x)
    with pytest.raises(port.errors.PortTraceError, match="data-dependent"):
        port.trace(Branchy(), torch.randn(2, 4))


def test_several_inputs_train_like_eager():
    """A model called with keyword tensors (token ids and an attention mask) takes them in every batch as given."""
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb, self.fc = nn.Embedding(20, 8), nn.Linear(8, 3)

        def forward(self, input_ids, attention_mask=None):
            h = self.emb(input_ids) * attention_mask.unsqueeze(-1).float()
            return self.fc(h.sum(1) / attention_mask.sum(1, keepdim=True).float())
    m = Masked()
    ref = copy.deepcopy(m)
    ids = torch.randint(0, 20, (4, 7))
    mask = torch.ones(4, 7, dtype=torch.long)
    mask[1:, 5:] = 0
    y = torch.tensor([0, 2, 1, 0])
    tr = Trainer(m, {"input_ids": ids, "attention_mask": mask}, optimizer=SGD(0.1))
    topt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for i in range(3):
        lp = tr.step({"input_ids": ids, "attention_mask": mask}, y)
        topt.zero_grad()
        lt = F.cross_entropy(ref(input_ids=ids, attention_mask=mask), y)
        lt.backward()
        topt.step()
        assert abs(lp - float(lt)) <= 1e-5, (i, lp, float(lt))
    torch.testing.assert_close(tr.predict({"input_ids": ids[:3], "attention_mask": mask[:3]}),
                               ref(input_ids=ids[:3], attention_mask=mask[:3]), rtol=1e-4, atol=1e-5)
    with pytest.raises(port.errors.PortError, match="attention_mask"):
        tr.step({"input_ids": ids}, y)


def test_port_rt_column_trains_bit_for_bit_and_says_no_on_a_difference(port_rt):
    """bench/coverage.py's port-rt column (issue 54): an all-C published model compiles and port-rt trains it to
    the Trainer's losses and tensors bit for bit ("yes"); a loss off by one float32 ulp is "no (losses ...)"; a
    plan with torch ops is "n/a"."""
    import numpy as np
    spec = P.MODELS["hand.se_cat_net"]
    row = P.compare(spec, steps=3, rt_binary=str(port_rt))
    assert row.ops_torch == 0 and row.rt == "yes", row.rt
    model = P.deterministic(spec.build())
    x, y = P.batch_of(spec)
    tr = Trainer(model, x, optimizer=SGD(P.LR, momentum=0.9))
    chk = P.RtCheck(str(port_rt), tr, x, y, spec.classes)
    losses = [float(tr.step(x, y)) for _ in range(2)]
    losses[1] = float(np.nextafter(np.float32(losses[1]), np.float32(np.inf)))
    assert chk.run(tr, losses).startswith("no (losses"), losses
    erf = P.Spec("hand.erf_net", "hand-written", _ErfNet, (6,))     # erf has no PORT record: a torch_op
    tagged = P.compare(erf, steps=1, rt_binary=str(port_rt))
    assert tagged.ops_torch and tagged.rt.startswith("n/a"), tagged.rt


class _ErfNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(6, 10)

    def forward(self, x):
        return self.fc(torch.erf(x))


@pytest.mark.parametrize("name", ["hf.gpt2_seqcls", "hf.llama_seqcls"])
def test_seqcls_last_token_pooling_runs_on_c_and_in_port_rt(name, port_rt):
    """HF's last-non-pad-token pooling (int32 cast of ids != pad, times an arange, argmax, logits[arange(B), idx]
    and its gradient; issue 54) on C: the whole model on C kernels, trained like eager and by port-rt bit for bit
    (compare's rt column); then batches padded at other lengths per row (other pooled positions, read at run time)
    train like eager."""
    spec = P.MODELS[name]
    _needs(spec)
    row = P.compare(spec, steps=3, rt_binary=str(port_rt))
    assert not row.error, row.error
    assert row.ops_torch == 0 and row.trained_equal and row.rt == "yes", (row.ops_torch, row.losses_port,
                                                                          row.losses_eager, row.rt)
    model = P.deterministic(spec.build())
    x, y = P.batch_of(spec)
    tr = Trainer(copy.deepcopy(model), x, optimizer=SGD(1e-3, momentum=0.9))
    assert {o.kind for o in tr.graph.ops} >= {"mask_cast", "int_binary", "argmax_rows", "index2_rows",
                                              "index2_rows.grad_input"}
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    padded = x.clone()
    for i, n in enumerate((0, 3, 15, 7)):               # trailing pad tokens (id 0); row 2 keeps one token
        padded[i, padded.shape[1] - n:] = 0
    _losses_like_eager(tr, lambda t: model(t).logits, opt, padded, y, 3)
