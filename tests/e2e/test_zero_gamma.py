"""A batch norm whose scale has an entry exactly 0 at capture (timm zero-initialises the last batch norm of a
residual block: RegNetX, MobileViT) never runs in place: its in-place backward rebuilds x-hat as (y - beta) / gamma
(port_batchnorm2d_backward_*_from_output refuse gamma == 0), so a solved plan that chose it failed at its first
step (bench/coverage.py --predict: timm.regnetx_002, timm.mobilevit_xxs)."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn as nn

import port
from port.errors import PlanError
from port.lower.lower import default_plan
from port.plan import variants as V
from port.train.optim import SGD


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1, self.b1 = nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6)
        self.c2, self.b2 = nn.Conv2d(6, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6)
        self.fc = nn.Linear(6, 3)
        with torch.no_grad():
            self.b2.weight[2] = 0.0          # one channel's scale 0, as a zero-initialised one has all of them

    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        h = torch.relu(self.b2(self.c2(h)) + h)
        return self.fc(h.mean((2, 3)))


def test_a_batch_norm_with_a_zero_scale_never_runs_in_place():
    m = _Net()
    x, y = torch.randn(4, 3, 7, 6), torch.tensor([0, 1, 2, 1])
    g = port.trace(copy.deepcopy(m), x, optimizer="sgd_momentum")
    bns = [o for o in g.ops if o.kind == "batch_norm2d"]
    assert [bool(o.attr("gamma_has_zero")) for o in bns] == [False, True]
    assert [V.inplace_legal(g, o) for o in bns] == [True, False]
    base = default_plan(g, "c", fuse=False)
    base = dataclasses.replace(base, ops=tuple(dataclasses.replace(d, variant="plain") if d.variant == "inplace"
                                               else d for d in base.ops))
    def in_place(bn_ids):          # the batch norms and their backward ops (coupled: port.plan.semantics)
        return dataclasses.replace(base, ops=tuple(dataclasses.replace(d, variant="inplace")
                                                   if o.id in bn_ids or o.forward_op in bn_ids else d
                                                   for o, d in zip(g.ops, base.ops)))

    ins = in_place({o.id for o in bns if V.inplace_legal(g, o)})
    tr = port.Trainer(copy.deepcopy(m), x, plan=ins, optimizer=SGD(0.05, momentum=0.9))
    losses = [float(tr.step(x, y)) for _ in range(3)]
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    want = []
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ref(x), y)
        loss.backward()
        opt.step()
        want.append(float(loss))
    assert losses == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert sum(d.variant == "inplace" for d in tr.plan.ops) == 3       # b1 and its two backward ops
    with pytest.raises(PlanError, match="'b2': variant 'inplace' is not legal"):
        port.Trainer(copy.deepcopy(m), x, plan=in_place({bns[1].id}), optimizer=SGD(0.05, momentum=0.9))
