"""What the host waits for beside an asynchronous engine's queue (issue 56; the hazard rule itself is tested in
tests/e2e/test_opencl_async.py): a root an OpenCL op read or wrote keeps its bytes until the host joins that queue
(port.plan.semantics rule 8, ``join_frees``), so lowering never gives them to a later host tensor before then.
Without it (and with two readers of one tensor waiting for each other) ResNet-8's split plan waited for the queue
right after enqueueing each weight gradient (measured 13.4 ms against a predicted makespan of 8.8 ms, the serial
sum 13.6 ms): waits no lane of the simulator prices. Modeled profiles and lowering only: no OpenCL needed."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import port
import port.models as M
from port.config import load_device
from port.cost.roofline import modeled_profile
from port.exec import handoff as H
from port.lower.lower import default_plan, lower
from port.plan.semantics import early_update_candidates, schedule
from port.train.optim import SGD
from port.verify.simulate import simulate

SPLIT = "configs/devices/host-opencl-split.yaml"
ON_QUEUE = ("layer3.0.conv2.grad_weight", "layer3.0.conv1.grad_weight", "layer2.0.conv2.grad_weight")


@pytest.fixture(scope="module")
def split():
    g = port.trace(M.get("resnet8", seed=0), torch.randn(4, 3, 32, 32), optimizer=SGD(0.01, momentum=0.9).graph_name)
    base = default_plan(g, "c", fuse=False)
    plan = dataclasses.replace(base, ops=tuple(dataclasses.replace(d, accelerator="opencl", variant="plain")
                                               if o.name in ON_QUEUE else d for o, d in zip(g.ops, base.ops)))
    return g, plan, modeled_profile(g, load_device(SPLIT, present_only=False))


def test_queued_reads_stay_until_the_host_joins_the_queue(split):
    g, plan, prof = split
    sch = schedule(g, plan)
    ev = list(sch.events)
    # the host joins the queue at a hand-off from it or at the end of the main pass (before the late updates)
    first_join = min(i for i, e in enumerate(ev) if (e.kind == "handoff" and e.src == "opencl") or (
        e.kind == "op" and g.ops[e.op].phase == "update" and e.op not in sch.early_at))
    names = {g.tensors[r].name: i for i, e in enumerate(ev) if e.kind == "free" for r in e.roots}
    for o in g.ops:
        if o.name in ON_QUEUE:          # what the queued weight gradients read is freed at the join, not before
            for t in o.inputs:
                n = g.tensors[sch.root_of(t)].name
                if n in names:
                    assert names[n] >= first_join - 1, (o.name, n)     # (a free right before it)
    prog = lower(g, plan)
    main = [c for c in prog.calls if c.phase != "update"]
    waits = H.host_waits(main, prog)
    # every host call of the backward runs beside the queue: lowering gave no queued call's bytes to a later
    # host tensor, and no host call reads what the queue writes before the hand-off that waits for it
    assert "finish" not in waits and waits.count("flush") >= 2
    sim = simulate(plan, g, prof)
    assert prog.peak_live_bytes == sim.arena_peak_bytes      # one memory semantics: the held bytes counted
    assert sim.breakdown["makespan_ms"] < sim.step_ms
    lanes = {lane for _l, lane, _a, _b in sim.lanes}
    assert lanes == {"host", "opencl"}
    q = [(a, b) for lab, lane, a, b in sim.lanes if lane == "opencl"]
    assert len(q) == len(ON_QUEUE) and all(b > a for a, b in q)


def _modeled_peak(g, prof, plan) -> int:
    """The min-peak model's peak at the plan's integer point (every binary fixed to the plan, the LP completes it)."""
    from port.solver.formulation import build
    from port.solver.ilp import _warm_of, _warm_values
    from port.solver.instance import build_instance
    inst = build_instance(g, prof, nested=False, prune=False)
    m, v = build(inst, None)
    w = _warm_values(inst, m, v, *_warm_of(inst, plan))
    assert w is not None
    return round(w[v.peak] * m.mem_unit)


def test_the_memory_rows_hold_an_early_gradient_a_queued_update_used(split):
    """Rule 8 holds an early update's gradient root past its free when the update (or another op touching it) runs
    on the queue; the model held only activation roots there, so a plan with its early updates queued simulated
    above the peak its memory rows gave (ResNet-8 b4 50% on own-silicon OpenCL: 2,393,024 B against a budget of
    2,133,536 B the ILP thought it met; here 4,929,280 B against 4,637,504 B)."""
    g, base, prof = split
    host = dataclasses.replace(default_plan(g, "c", fuse=False), early_updates=tuple(
        sorted(u for u in early_update_candidates(g))))
    queued = dataclasses.replace(host, ops=tuple(dataclasses.replace(d, accelerator="opencl", variant="plain")
                                                 if o.id in host.early_updates else d for o, d in zip(g.ops, host.ops)))
    sim_host, sim_q = simulate(host, g, prof).peak_bytes, simulate(queued, g, prof).peak_bytes
    assert sim_q > sim_host                      # the held gradients raise the peak
    assert _modeled_peak(g, prof, host) == sim_host
    assert _modeled_peak(g, prof, queued) == sim_q
