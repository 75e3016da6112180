"""Squeeze-excitation fused (issue 54, h54-se): an SE block (torchvision's SqueezeExcitation shape: pool, 1x1 convs
with bias, relu|silu, sigmoid|hardsigmoid, gate * x) trains with the fused chain to its plain members' bits (the
fused kernels run the members' own C kernels: torch.equal on every loss and parameter after three steps), on odd
channels (37, squeeze 9), 7x7 and 5x3 maps, batch 3, the four activation pairs, at 1, 2 and 3 threads, on the
per-call executor and the C step engine (engine "rt"), and port-rt trains the fused bundle to the plain Trainer's
bits; eager PyTorch (the oracle) within float rounding; MobileNetV3-small's SE blocks are chains and train fused to
the plain plan's bits."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn as nn

import port
from port.exec import capi
from port.lower.lower import default_plan
from port.plan import variants as V
from port.train.optim import SGD
from published_zoo import published  # tests/published_zoo.py: bench/published.py as a module

P = published()
PAIRS = [(nn.ReLU, nn.Hardsigmoid), (nn.SiLU, nn.Sigmoid), (nn.ReLU, nn.Sigmoid), (nn.SiLU, nn.Hardsigmoid)]
MAPS = [(7, 7), (5, 3)]
THREADS = (1, 2, 3)


class _Net(nn.Module):
    """conv -> SE (odd channels c, squeeze s) -> conv -> mean -> linear."""
    def __init__(self, act, gate, c=37, s=9):
        super().__init__()
        torch.manual_seed(0)
        self.c = nn.Conv2d(3, c, 3, padding=1)
        self.fc1, self.fc2, self.act, self.gate = nn.Conv2d(c, s, 1), nn.Conv2d(s, c, 1), act(), gate()
        self.c2, self.fc = nn.Conv2d(c, 6, 1), nn.Linear(6, 4)

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


@pytest.fixture
def threads():
    """capi.set_num_threads for the test's loop, the caller's count restored after"""
    prev = capi.get_num_threads()
    yield capi.set_num_threads
    capi.set_num_threads(prev)


def _same_bits(lf, sf, lp, sp, what):
    assert [torch.tensor(v).numpy().tobytes() for v in lf] == [torch.tensor(v).numpy().tobytes() for v in lp], \
        (what, lf, lp)
    assert sf.keys() == sp.keys()
    for n in sf:
        assert torch.equal(sf[n], sp[n]), (what, n, (sf[n] - sp[n]).abs().max())


@pytest.mark.parametrize("engine", ["python", "rt"])
@pytest.mark.parametrize("act,gate", PAIRS)
@pytest.mark.parametrize("hw", MAPS)
def test_fused_se_trains_to_the_plain_chains_bits(act, gate, engine, hw, threads):
    m = _Net(act, gate)
    x, y = torch.randn(3, 3, *hw), torch.tensor([0, 3, 1])
    g = port.trace(copy.deepcopy(m), x, optimizer="sgd_momentum")
    for t in THREADS:
        threads(t)
        lf, sf, tf = _run(m, x, y, fused_plan(g), engine)
        lp, sp, tp = _run(m, x, y, default_plan(g), engine)
        kernels = [c.kernel for c in tf.program.calls]
        assert kernels.count("se") == kernels.count("se.grad_weight") == kernels.count("se.grad_input") == 1
        assert "se" not in [c.kernel for c in tp.program.calls]
        _same_bits(lf, sf, lp, sp, f"{t} threads")
        assert torch.equal(tf.predict(x), tp.predict(x))
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
@pytest.mark.parametrize("hw", MAPS)
def test_port_rt_trains_the_fused_se_bundle_to_the_plain_trainers_bits(act, gate, hw, port_rt, threads):
    """port-rt runs the fused plan's bundle; its losses and checkpoint equal the PLAIN plan's Trainer's bits (at the
    Trainer's thread count: 1, 2 and 3)."""
    m = _Net(act, gate)
    x, y = torch.randn(3, 3, *hw), torch.tensor([0, 3, 1])
    g = port.trace(copy.deepcopy(m), x, optimizer="sgd_momentum")
    for t in THREADS:
        threads(t)
        tr = port.Trainer(copy.deepcopy(m), x, plan=fused_plan(g), optimizer=SGD(0.05, momentum=0.9))
        assert "se.grad_weight" in [c.kernel for c in tr.program.calls]
        chk = P.RtCheck(str(port_rt), tr, x, y, 4)
        plain = port.Trainer(copy.deepcopy(m), x, plan=default_plan(g), optimizer=SGD(0.05, momentum=0.9))
        losses = [float(plain.step(x, y)) for _ in range(3)]
        assert chk.run(plain, losses) == "yes", t


@pytest.mark.parametrize("engine", ["python", "rt"])
def test_fused_se_with_early_updates_writes_its_four_gradients(engine):
    """Every parameter updated early (its gradient lives in scratch): the fused SE weight-gradient call is the only
    writer of the two fcs' four gradients and overwrites them (port_se_backward_weight_overwrite) instead of
    zeroing them first (port-rt zeroes at most two ranges per call: RegNet-Y's 50% plan failed to lower with
    'zero_outputs' of 3), and trains to the plain chain's bits under the same early updates."""
    m = _Net(nn.ReLU, nn.Sigmoid)
    x, y = torch.randn(3, 3, 7, 5), torch.tensor([0, 3, 1])
    g = port.trace(copy.deepcopy(m), x, optimizer="sgd_momentum")
    ups = tuple(o.id for o in g.ops if o.kind == "update")
    assert len(ups) >= 6
    lf, sf, tf = _run(m, x, y, dataclasses.replace(fused_plan(g), early_updates=ups), engine)
    lp, sp, _ = _run(m, x, y, dataclasses.replace(default_plan(g), early_updates=ups), engine)
    (se,) = [c for c in tf.program.calls if c.kernel == "se.grad_weight"]
    assert se.attr("overwrite") and not se.attr("zero_outputs")
    _same_bits(lf, sf, lp, sp, "early updates")


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
    _same_bits(lf, sf, lp, sp, "mobilenet_v3_small")
