"""SwiGLU and rotary embedding fused (issue 54) on Hugging Face's tiny LlamaForCausalLM (bench/published.py
hf.llama_lm): each layer's MLP silu -> mul (and its two gradient ops) is one fusable chain, each layer's q and k
rotation (seven ops and nine gradient ops) another; the fused plan trains to the plain plan's losses,
gradients (the first step's momentum buffers) and weights bit for bit, on the per-call executor and the C step
engine, and port-rt trains the fused bundle to the Trainer's bits."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import port
from port.lower.lower import default_plan
from port.plan import variants as V
from port.train.optim import SGD
from published_zoo import published  # tests/published_zoo.py: bench/published.py as a module

P = published()
ZOO = P.import_zoo()


@pytest.fixture(scope="module")
def llama():
    if "transformers" not in ZOO:
        pytest.skip("transformers does not import here")
    spec = P.MODELS["hf.llama_lm"]
    model = P.deterministic(spec.build())
    model.train()
    x, y = P.batch_of(spec)
    tr = port.Trainer(copy.deepcopy(model), x, optimizer=SGD(P.LR, momentum=0.9))
    return spec, model, x, y, tr.graph


def _run(model, x, y, plan, engine, steps=3):
    tr = port.Trainer(copy.deepcopy(model), x, plan=plan, optimizer=SGD(P.LR, momentum=0.9), engine=engine)
    losses, mom = [], None
    for k in range(steps):
        losses.append(float(tr.step(x, y)))
        if k == 0:       # after the first step each momentum buffer is that step's gradient
            mom = {n: t.clone() for n, t in _tensors(tr.optimizer_state()).items()}
    return losses, mom, {n: t.clone() for n, t in tr.state_dict().items()}, tr


def _tensors(d, prefix=""):
    out = {}
    for k, v in (d.items() if isinstance(d, dict) else enumerate(d)):
        if isinstance(v, torch.Tensor):
            out[f"{prefix}{k}"] = v
        elif isinstance(v, (dict, list, tuple)):
            out.update(_tensors(v, f"{prefix}{k}."))
    return out


def test_llama_mlp_chains(llama):
    _, _, _, _, g = llama
    every = V.chains(g)
    chains = {k: c for k, c in every.items() if c.fusion.name == "swiglu"}
    assert len(chains) == 2
    rotary = [c for c in every.values() if c.fusion.name == "rotary"]      # q and k of each layer
    assert len(rotary) == 4 and all(len(c.ops) == 16 for c in rotary)
    assert len(every) == 6 + sum(c.fusion.name == "rmsnorm_linear" for c in every.values())
    for ch in chains.values():
        assert [g.ops[i].kind for i in ch.ops] == ["silu", "mul", "mul.grad_input", "silu.grad_input"]
        assert g.ops[ch.ops[0]].layer.endswith("mlp.act_fn") or "mlp" in g.ops[ch.ops[0]].name
    fused = [d.op for d in default_plan(g).ops if d.variant == "fused"]
    assert sorted(fused) == sorted(i for ch in every.values() if ch.fusion.default for i in ch.ops)


@pytest.mark.parametrize("engine", ["python", "rt"])
def test_fused_swiglu_equals_plain_bit_for_bit(llama, engine):
    spec, model, x, y, g = llama
    fused, plain = default_plan(g), default_plan(g, fuse=False)
    assert any(d.variant == "fused" for d in fused.ops) and not any(d.variant == "fused" for d in plain.ops)
    lf, gf, sf, tf = _run(model, x, y, fused, engine)
    lp, gp, sp, tp = _run(model, x, y, plain, engine)
    kernels = lambda tr: [c.kernel for c in tr.program.calls]  # noqa: E731
    assert kernels(tf).count("swiglu") == kernels(tf).count("swiglu.grad_input") == 2
    assert "swiglu" not in kernels(tp) and kernels(tp).count("silu") == 2
    assert kernels(tf).count("rotary") == kernels(tf).count("rotary.grad_input") == 4 and "rotary" not in kernels(tp)
    assert lf == lp, (lf, lp)
    assert gf.keys() == gp.keys() and gf
    for n in gf:
        assert torch.equal(gf[n], gp[n]), n
    for n in sf:
        assert torch.equal(sf[n], sp[n]), n
    assert torch.equal(tf.predict(x), tp.predict(x))       # the inference program: the forward pair fused


def test_port_rt_trains_the_fused_bundle_bit_for_bit(llama, port_rt):
    spec, model, x, y, g = llama
    tr = port.Trainer(copy.deepcopy(model), x, plan=default_plan(g), optimizer=SGD(P.LR, momentum=0.9))
    assert any(d.variant == "fused" for d in tr.plan.ops)
    chk = P.RtCheck(str(port_rt), tr, x, y, spec.classes)
    losses = [float(tr.step(x, y)) for _ in range(3)]
    assert chk.run(tr, losses) == "yes"


class _TinyMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gate, self.up = torch.nn.Linear(4, 6, bias=False), torch.nn.Linear(4, 6, bias=False)
        self.down = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


@pytest.mark.parametrize("drop", ["recompute", "paged"])
def test_fused_swiglu_with_its_input_dropped(drop):
    """a = gate(x), read by both fused calls (the mul's and its gradient's), recomputed or paged out between
    them: the fused plan trains to the plain plan's bits (a is live at each call that reads it)."""
    m, x, y = _TinyMLP(), torch.randn(5, 4), torch.tensor([0, 1, 2, 1, 0])
    g = port.trace(copy.deepcopy(m), x, optimizer="sgd")
    ch, = V.chains(g).values()
    a = g.ops[ch.ops[0]].inputs[0]
    got = {}
    for fuse in (True, False):
        p = default_plan(g, fuse=fuse)
        p = dataclasses.replace(p, **{drop: (a,)})
        tr = port.Trainer(copy.deepcopy(m), x, plan=p, optimizer=SGD(0.1), engine="python")
        got[fuse] = [float(tr.step(x, y)) for _ in range(3)], tr.state_dict(), tr
    assert got[True][0] == got[False][0]
    assert all(torch.equal(got[True][1][n], got[False][1][n]) for n in got[True][1])
    assert "swiglu" in [c.kernel for c in got[True][2].program.calls]
