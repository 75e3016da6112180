"""RMSNorm + linear fused (issue 54) on Hugging Face's tiny LlamaForCausalLM (bench/published.py hf.llama_lm): each
layer's input_layernorm with q/k/v, its post_attention_layernorm with gate/up and the final norm with lm_head are
rmsnorm_linear chains (the norm, its linears and their weight gradients: one call for the norm and its linears, one
for their weight gradients); with every chain fused on top of the
default plan the model trains to the default plan's losses, gradients and weights bit for bit (64 rows: one block
of rows, the plain chain's bits), on the per-call executor and the C step engine, without storing any norm output;
port-rt trains the fused bundle to the Trainer's bits."""
from __future__ import annotations

import copy

import pytest
import torch

import port
from port.lower.lower import default_plan
from port.plan import variants as V
from port.train.optim import SGD
from test_fused_swiglu_llama import P, llama  # noqa: F401  (bench/published.py; the tiny Llama fixture)


def fused_plan(g):
    """The default plan (SwiGLU and rotary fused) with every rmsnorm_linear chain fused too."""
    return default_plan(g, fusions=("rmsnorm_linear",))


def test_llama_norm_chains(llama):
    _, model, _, _, g = llama
    chains = [c for c in V.chains(g).values() if c.fusion.name == "rmsnorm_linear"]
    layers = len(model.model.layers)
    assert len(chains) == 2 * layers + 1
    names = sorted(tuple(g.ops[i].name.rsplit(".", 1)[-1] for i in c.ops if g.ops[i].kind == "linear")
                   for c in chains)
    assert names == sorted([("q_proj", "k_proj", "v_proj")] * layers + [("gate_proj", "up_proj")] * layers
                           + [("lm_head",)])
    for c in chains:
        lins = [i for i in c.ops if g.ops[i].kind == "linear"]
        assert [g.ops[i].kind for i in c.ops] == ["rms_norm"] + ["linear"] * len(lins) \
            + ["linear.grad_weight"] * len(lins)
        assert not c.fusion.default and not any(default_plan(g).ops[i].variant == "fused" for i in c.ops)


@pytest.mark.parametrize("engine", ["python", "rt"])
def test_fused_rmsnorm_linear_equals_plain_bit_for_bit(llama, engine):
    spec, model, x, y, g = llama
    got = {}
    for name, plan in (("fused", fused_plan(g)), ("plain", default_plan(g))):
        tr = port.Trainer(copy.deepcopy(model), x, plan=plan, optimizer=SGD(P.LR, momentum=0.9), engine=engine)
        losses = [float(tr.step(x, y)) for _ in range(2)]
        got[name] = losses, {n: t.clone() for n, t in tr.state_dict().items()}, tr
    kernels = [c.kernel for c in got["fused"][2].program.calls]
    layers = len(model.model.layers)
    # one call per norm for all its linears (q/k/v, gate/up, lm_head), one for all their weight gradients
    assert kernels.count("rmsnorm_linears") == kernels.count("rmsnorm_linears.grad_weight") == 2 * layers + 1
    assert "rms_norm" not in kernels and kernels.count("linear.grad_weight") == 2 * layers     # o_proj, down_proj
    assert got["fused"][0] == got["plain"][0], (got["fused"][0], got["plain"][0])
    for n in got["plain"][1]:
        assert torch.equal(got["fused"][1][n], got["plain"][1][n]), n
    assert torch.equal(got["fused"][2].predict(x), got["plain"][2].predict(x))
    # no norm output has a slot in the fused program
    norms = {g.ops[c.ops[0]].outputs[0] for c in V.chains(g).values() if c.fusion.name == "rmsnorm_linear"}
    assert not norms & {s.tensor for s in got["fused"][2].program.slots}
    assert norms <= {s.tensor for s in got["plain"][2].program.slots}


def test_port_rt_trains_the_fused_rmsnorm_linear_bundle_bit_for_bit(llama, port_rt):
    spec, model, x, y, g = llama
    tr = port.Trainer(copy.deepcopy(model), x, plan=fused_plan(g), optimizer=SGD(P.LR, momentum=0.9))
    assert "rmsnorm_linears.grad_weight" in [c.kernel for c in tr.program.calls]
    chk = P.RtCheck(str(port_rt), tr, x, y, spec.classes)
    losses = [float(tr.step(x, y)) for _ in range(3)]
    assert chk.run(tr, losses) == "yes"
