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


def _joined(g, plan, steps):
    return dataclasses.replace(plan, joins=tuple(("opencl", t) for t in sorted(steps)))


def test_an_explicit_join_frees_what_the_queue_used_there(split, tmp_path):
    """Plan.joins (rule 8, step 4b): the host joins the queue right after a step's ops, and the roots the queued ops
    used that were freed at or before it are freed there, not at the pass end. With a join two steps after each
    queued weight gradient the held bytes are gone (the all-host plan's peak); the simulator prices the join as a
    hand-off from the queue without bytes; lowering emits a host ``join`` call bound to the queue's finish, the
    checker accepts it and the arena follows the semantics (its peak = the simulator's)."""
    from port.lower.arena import check_program
    from port.plan.io import load_plan, save_plan
    from port.verify.simulate import join_ms
    g, plan, prof = split
    host = default_plan(g, "c", fuse=False)
    ids = [o.id for o in g.ops if o.name in ON_QUEUE]
    joined = _joined(g, plan, [i + 2 for i in ids])
    s0, s1 = simulate(plan, g, prof), simulate(joined, g, prof)
    assert s1.peak_bytes == simulate(host, g, prof).peak_bytes < s0.peak_bytes
    assert s1.breakdown["handoff_ms"] == pytest.approx(s0.breakdown["handoff_ms"] + len(ids) * join_ms(prof, "opencl"))
    ev = list(schedule(g, joined).events)
    at = [k for k, e in enumerate(ev) if e.kind == "join"]
    assert [ev[k].op for k in at] == [i + 2 for i in sorted(ids)] and all(ev[k].src == "opencl" for k in at)
    prog = lower(g, joined)
    check_program(prog)
    calls = [c for c in prog.calls if c.kernel == "join"]
    assert [c.attr("src") for c in calls] == ["opencl"] * len(ids) and all(c.backend == "host" for c in calls)
    assert prog.peak_live_bytes == s1.arena_peak_bytes < lower(g, plan).peak_live_bytes
    main = [c for c in prog.calls if c.phase != "update"]
    assert "finish" not in H.host_waits(main, prog)            # the join is the wait; no host call waits else
    back = load_plan(save_plan(joined, tmp_path / "p.json", g), g)
    assert back.joins == joined.joins


@pytest.mark.parametrize("bad", [(("opencl", 200),), (("cpu-c", 40),), (("opencl", 50), ("opencl", 40)),
                                 (("opencl", 40), ("opencl", 40))])
def test_a_join_must_name_a_queued_engine_at_a_main_pass_step(split, bad):
    from port.errors import PlanError
    g, plan, _prof = split
    upd = next(o.id for o in g.ops if o.phase == "update")
    for joins in (bad, (("opencl", upd),)):
        with pytest.raises(PlanError, match="joins"):
            schedule(g, dataclasses.replace(plan, joins=joins))


def test_the_memory_rows_follow_explicit_joins(split):
    """jn[a,c] and rel[i,a,c] (formulation._join_vars): at the plan's integer point the model's peak equals the
    simulated one, with and without joins at its candidate steps."""
    from port.solver.formulation import build, join_candidates
    from port.solver.ilp import _warm_of, _warm_values
    from port.solver.instance import build_instance
    g, plan, prof = split
    inst = build_instance(g, prof, nested=False, prune=False)
    m, v = build(inst, None)
    cands = join_candidates(inst)
    assert ("opencl", cands[0]) in v.jn and v.rel
    seen = set()
    for steps in ((), cands[len(cands) // 2:][:1], cands[1::5], cands[-6:-3]):
        p = _joined(g, plan, steps)
        w = _warm_values(inst, m, v, *_warm_of(inst, p))
        sim = simulate(p, g, prof).peak_bytes
        assert round(w[v.peak] * m.mem_unit) == sim, steps
        seen.add(sim)
    assert len(seen) > 1                          # the joins change the peak


def test_the_makespan_model_takes_a_joined_plan_the_holds_to_the_end_refuse(split):
    """At a budget of the all-host plan's peak, the queued weight gradients' held bytes break the budget unless the
    host joins the queue: the makespan model (its memory rows and its clocks) holds the plan with joins at its
    candidate steps within the budget, with its objective the simulated makespan, and refuses it without them (the
    model before Plan.joins held every such byte to the end of the step)."""
    from port.solver.formulation import build, join_candidates
    from port.solver.ilp import _warm_of, _warm_values, _with_objective
    from port.solver.instance import build_instance
    g, plan, prof = split
    inst = _with_objective(build_instance(g, prof, nested=False, prune=False), "makespan")
    cands = join_candidates(inst)
    ids = [o.id for o in g.ops if o.name in ON_QUEUE]
    joined = _joined(g, plan, {min(c for c in cands if c >= i + 2) for i in ids})
    sim = simulate(joined, g, prof)
    budget = sim.peak_bytes
    assert simulate(plan, g, prof).peak_bytes > budget
    m, v = build(inst, budget)
    w = _warm_values(inst, m, v, *_warm_of(inst, joined))
    assert w is not None
    obj = sum(c * w[j] for j, c in m.obj.items()) + sim.breakdown["overhead_ms"]
    assert obj == pytest.approx(sim.breakdown["makespan_ms"], rel=1e-6)
    assert _warm_values(inst, m, v, *_warm_of(inst, plan)) is None


def test_a_join_costs_the_profiles_join_figure_not_a_handoffs_latency(split):
    """A join of a drained queue is priced at the profile's join figure (Profile.join_ms: the engine's finish(),
    measured by ``port profile``), not at the least hand-off latency from the queue (0.15 ms in the split YAML, a
    wait that holds the busy queue's work, which the lanes model): the simulator's step and the makespan model's
    objective (formulation's join cost) both follow the figure, here set to 0.4 ms against the modeled 2 us."""
    from port.cost.types import MODELED_JOIN_MS
    from port.solver.formulation import build, join_candidates
    from port.solver.ilp import _warm_of, _warm_values, _with_objective
    from port.solver.instance import build_instance
    g, plan, prof = split
    assert dict(prof.join_ms) == {"opencl": MODELED_JOIN_MS}
    assert MODELED_JOIN_MS < min(h.latency_ms for h in prof.handoff if h.src == "opencl")
    slow = dataclasses.replace(prof, join_ms=(("opencl", 0.4),), _index={})
    inst = _with_objective(build_instance(g, slow, nested=False, prune=False), "makespan")
    cands = join_candidates(inst)
    ids = [o.id for o in g.ops if o.name in ON_QUEUE]
    joined = _joined(g, plan, {min(c for c in cands if c >= i + 2) for i in ids})
    n = len(joined.joins)
    for p, j in ((prof, MODELED_JOIN_MS), (slow, 0.4)):
        s0, s1 = simulate(plan, g, p), simulate(joined, g, p)
        assert s1.breakdown["handoff_ms"] == pytest.approx(s0.breakdown["handoff_ms"] + n * j)
        assert s1.step_ms == pytest.approx(s0.step_ms + n * j)
    sim = simulate(joined, g, slow)
    m, v = build(inst, sim.peak_bytes)
    w = _warm_values(inst, m, v, *_warm_of(inst, joined))
    obj = sum(c * w[j] for j, c in m.obj.items()) + sim.breakdown["overhead_ms"]
    assert obj == pytest.approx(sim.breakdown["makespan_ms"], rel=1e-6)
    assert sim.breakdown["makespan_ms"] > simulate(joined, g, prof).breakdown["makespan_ms"]
