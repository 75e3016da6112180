"""Cross-engine execution (issue 56): plans that alternate the opencl engine (PoCL's CPU device) with the C
kernels layer by layer train equal to PyTorch eager; every edge the plan crosses is a hand-off event of the plan
semantics, a lowered ``handoff`` call and a priced step of the simulator; the program checker refuses a program
without them."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import port.models as M
from port.errors import ProgramError
from port.exec import registry
from port.lower.lower import default_plan, lower
from port.lower.arena import check_program
from port.plan import semantics as SEM
from port.plan import variants as V
from port.plan.types import OpDecision
from _equiv import compare, data

OK, WHY = registry.available("opencl")
pytestmark = pytest.mark.skipif(not OK, reason=f"opencl backend unavailable: {WHY}")


def _graph(name="resnet8", batch=4, opt="sgd"):
    from port.ir.trace import trace_many
    m = M.get(name, seed=0)
    x = torch.randn(batch, *M.INPUT_SHAPES[name])
    return m, trace_many([dict(model=M.get(name, seed=0), example_input=x, optimizer=opt, name=name)])[0]


def alternating(g):
    """The all-C default plan without fusion, then every other layer (module path, in forward order: conv, batch
    norm, relu, ... alternate) on opencl, its backward and update ops with it, wherever opencl has a kernel for
    the op and its variant: the most engine crossings a plan can have."""
    base = default_plan(g, "c", fuse=False)
    layers = list(dict.fromkeys(o.layer for o in g.ops if o.phase in ("forward", "loss")))
    ocl = set(layers[::2])
    ops = list(base.ops)
    for o in g.ops:
        layer = g.ops[o.forward_op].layer if o.forward_op is not None else o.layer
        d = ops[o.id]
        if layer in ocl and d.variant in V.variants(g, o, "opencl"):
            ops[o.id] = OpDecision(o.id, "opencl", d.variant)
    plan = dataclasses.replace(base, ops=tuple(ops))
    SEM.schedule(g, plan)
    return plan


def test_alternating_plan_lowers_with_checked_handoffs():
    _m, g = _graph()
    plan = alternating(g)
    accs = {d.accelerator for d in plan.ops}
    assert {"opencl", "cpu-c"} <= accs
    sch = SEM.schedule(g, plan)
    hand = [e for e in sch.events if e.kind == "handoff"]
    assert hand and all(e.src != plan.ops[e.op].accelerator for e in hand)
    prog = lower(g, plan)
    calls = [c for c in prog.calls if c.kernel == "handoff"]
    assert calls and {c.attr("src") for c in calls} == {"opencl", "c"}
    # the checker refuses the program without its hand-offs
    bad = [c for c in prog.calls if c.kernel != "handoff"]
    bad = tuple(dataclasses.replace(c, index=i) for i, c in enumerate(bad))
    with pytest.raises(ProgramError, match="without a hand-off"):
        check_program(dataclasses.replace(prog, calls=bad, live_timeline=(), live_until=()))


def test_simulator_prices_handoff_events():
    from port.cost.types import HandoffCost
    from port.verify.simulate import simulate
    from port.cost.roofline import modeled_profile
    from port.config import load_device
    _m, g = _graph()
    plan = alternating(g)
    dev = load_device("configs/devices/host-opencl.yaml")
    prof = modeled_profile(g, dev)
    sim = simulate(plan, g, prof)
    sch = SEM.schedule(g, plan)
    want = sum(prof.handoff_cost(e.src, plan.ops[e.op].accelerator).cost_ms(g.tensors[e.roots[0]].bytes)
               for e in sch.events if e.kind == "handoff")
    assert want > 0 and abs(sim.breakdown["handoff_ms"] - want) < 1e-9


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_alternating_resnet8_trains_equal_to_eager(opt):
    from port.train.trainer import Trainer
    from _equiv import port_opt
    batches = data("resnet8", 4, 3)
    m = M.get("resnet8", seed=0)
    tr = Trainer(M.get("resnet8", seed=0), batches[0][0], optimizer=port_opt(opt, 0.01 if opt == "sgd" else 1e-3))
    g = tr.graph
    tr.close()
    plan = alternating(g)
    _pl, _tl, tr = compare(m, batches, opt=opt, plan=plan)
    calls = tr.executor.program.calls
    assert {"opencl", "c"} <= {c.backend for c in calls}
    assert sum(c.kernel == "handoff" for c in calls) >= 10
    assert sum(c.backend == "opencl" for c in calls) >= 40      # 56 when written
