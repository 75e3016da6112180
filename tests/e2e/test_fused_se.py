"""Squeeze-excitation fused (issue 54, h54-se): an SE block (torchvision's SqueezeExcitation shape: pool, 1x1 convs
with bias, relu|silu, sigmoid|hardsigmoid, gate * x) trains with the fused chain as with its plain members within
float rounding (the fused kernels sum in double, the plain 1x1 convs in GEMMs: not the same bits; losses to 1e-5
relative, weights to 1e-5 after three steps), on the per-call executor and the C step engine (engine "rt"); port-rt trains the
fused bundle to the Trainer's bits; MobileNetV3-small's SE blocks are chains and train fused."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn as nn

import port
from port.lower.lower import default_plan
from port.plan import variants as V
from port.train.optim import SGD
from published_zoo import published  # tests/published_zoo.py: bench/published.py as a module

P = published()
PAIRS = [(nn.ReLU, nn.Hardsigmoid), (nn.SiLU, nn.Sigmoid), (nn.ReLU, nn.Sigmoid)]


class _Net(nn.Module):
    """conv -> SE (odd channels 13, squeeze 5, odd 7x5 map) -> conv -> mean -> linear."""
    def __init__(self, act, gate):
        super().__init__()
        torch.manual_seed(0)
        self.c = nn.Conv2d(3, 13, 3, padding=1)
        self.fc1, self.fc2, self.act, self.gate = nn.Conv2d(13, 5, 1), nn.Conv2d(5, 13, 1), act(), gate()
        self.c2, self.fc = nn.Conv2d(13, 6, 1), nn.Linear(6, 4)

    def forward(self, x):
        x = torch.relu(self.c(x))
        s = self.gate(self.fc2(self.act(self.fc1(nn.functional.adaptive_avg_pool2d(x, 1)))))
        return self.fc(self.c2(s * x).mean((2, 3)))


def fused_plan(g):
    """The default plan with every SE chain fused (the default plan leaves them plain: a solved plan picks them)."""
    p = default_plan(g)
    fz = {i for ch in V.chains(g).values() if ch.fusion.name == "se" for i in ch.ops}
    assert fz
    return dataclasses.replace(p, ops=tuple(dataclasses.replace(d, variant="fused") if d.op in fz else d
                                            for d in p.ops))


def _run(model, x, y, plan, engine, steps=3):
    tr = port.Trainer(copy.deepcopy(model), x, plan=plan, optimizer=SGD(0.05, momentum=0.9), engine=engine)
    losses = [float(tr.step(x, y)) for _ in range(steps)]
    return losses, {n: t.clone() for n, t in tr.state_dict().items()}, tr


@pytest.mark.parametrize("engine", ["python", "rt"])
@pytest.mark.parametrize("act,gate", PAIRS)
@pytest.mark.parametrize("batch", [1, 3])
def test_fused_se_trains_as_the_plain_chain(act, gate, engine, batch):
    m = _Net(act, gate)
    x, y = torch.randn(batch, 3, 7, 5), torch.arange(batch) % 4
    g = port.trace(copy.deepcopy(m), x, optimizer="sgd_momentum")
    lf, sf, tf = _run(m, x, y, fused_plan(g), engine)
    lp, sp, tp = _run(m, x, y, default_plan(g), engine)
    kernels = [c.kernel for c in tf.program.calls]
    assert kernels.count("se") == kernels.count("se.grad_weight") == kernels.count("se.grad_input") == 1
    assert "se" not in [c.kernel for c in tp.program.calls]
    assert lf == pytest.approx(lp, rel=1e-5, abs=1e-6)
    for n in sf:
        torch.testing.assert_close(sf[n], sp[n], rtol=1e-5, atol=1e-5, msg=n)
    torch.testing.assert_close(tf.predict(x), tp.predict(x), rtol=1e-5, atol=1e-5)
    # eager PyTorch, the oracle, to float rounding
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        opt.step()
    for n, t in ref.state_dict().items():
        torch.testing.assert_close(sf[n], t, rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.parametrize("act,gate", PAIRS)
def test_port_rt_trains_the_fused_se_bundle_bit_for_bit(act, gate, port_rt):
    m = _Net(act, gate)
    x, y = torch.randn(3, 3, 7, 5), torch.tensor([0, 3, 1])
    g = port.trace(copy.deepcopy(m), x, optimizer="sgd_momentum")
    tr = port.Trainer(copy.deepcopy(m), x, plan=fused_plan(g), optimizer=SGD(0.05, momentum=0.9))
    assert "se.grad_weight" in [c.kernel for c in tr.program.calls]
    chk = P.RtCheck(str(port_rt), tr, x, y, 4)
    losses = [float(tr.step(x, y)) for _ in range(3)]
    assert chk.run(tr, losses) == "yes"


@pytest.mark.parametrize("engine", ["python", "rt"])
def test_fused_se_with_early_updates_writes_its_four_gradients(engine):
    """Every parameter updated early (its gradient lives in scratch): the fused SE weight-gradient call is the only
    writer of the two fcs' four gradients and overwrites them (port_se_backward_weight_overwrite) instead of
    zeroing them first (port-rt zeroes at most two ranges per call: RegNet-Y's 50% plan failed to lower with
    'zero_outputs' of 3), and trains as the plain chain under the same early updates."""
    m = _Net(nn.ReLU, nn.Sigmoid)
    x, y = torch.randn(3, 3, 7, 5), torch.tensor([0, 3, 1])
    g = port.trace(copy.deepcopy(m), x, optimizer="sgd_momentum")
    ups = tuple(o.id for o in g.ops if o.kind == "update")
    assert len(ups) >= 6
    lf, sf, tf = _run(m, x, y, dataclasses.replace(fused_plan(g), early_updates=ups), engine)
    lp, sp, _ = _run(m, x, y, dataclasses.replace(default_plan(g), early_updates=ups), engine)
    (se,) = [c for c in tf.program.calls if c.kernel == "se.grad_weight"]
    assert se.attr("overwrite") and not se.attr("zero_outputs")
    assert lf == pytest.approx(lp, rel=1e-5, abs=1e-6)
    for n in sf:
        torch.testing.assert_close(sf[n], sp[n], rtol=1e-5, atol=1e-5, msg=n)


def test_mobilenet_v3_small_se_blocks_train_fused():
    zoo = P.import_zoo()
    if "torchvision" not in zoo:
        pytest.skip("torchvision does not import here")
    spec = P.MODELS["tv.mobilenet_v3_small"]
    model = P.deterministic(spec.build())
    model.train()
    x, y = P.batch_of(spec)
    x, y = x[:2], y[:2]
    g = port.trace(copy.deepcopy(model), x, optimizer="sgd_momentum")
    chains = [ch for ch in V.chains(g).values() if ch.fusion.name == "se"]
    n_se = sum(1 for mod in model.modules() if type(mod).__name__ == "SqueezeExcitation")
    assert n_se > 0 and len(chains) == n_se
    assert {(g.ops[ch.ops[2]].kind, g.ops[ch.ops[4]].kind) for ch in chains} == {("relu", "hardsigmoid")}
    lf, sf, _ = _run(model, x, y, fused_plan(g), "rt", steps=2)
    lp, sp, _ = _run(model, x, y, default_plan(g), "rt", steps=2)
    assert lf == pytest.approx(lp, rel=1e-4), (lf, lp)
