"""The ILP's own plans across engines and memories (issue 56): on host-opencl.yaml (unified memory) and
host-opencl-discrete.yaml (the opencl engine on its own memory) the ILP's plans for ResNet-8 at 100% and 50% use
both engines, price what the simulator prices (the own memory's copies included: port.solver.ownmem), keep the
own memory within its cap, and train equal to PyTorch eager with the Trainer told nothing about memories (the
profile says which engine has its own memory; the plan carries it to lowering).

PoCL on 2 shared cores is rarely faster than the C kernels, so the ILP rightly leaves ops off it under a real
profile; these tests use a modeled profile whose OpenCL convolutions cost a tenth (an engine on its own
silicon), as test_opencl_async does. ResNet-18 and MobileNetV2 run in the slow tier."""
from __future__ import annotations

import dataclasses
import functools
import random

import pytest

import port
import port.models as M
from port.config import load_device
from port.cost.roofline import modeled_profile
from port.exec import registry
from port.verify.simulate import simulate
from _equiv import compare, data, port_opt

OK, WHY = registry.available("opencl")
pytestmark = pytest.mark.skipif(not OK, reason=f"opencl backend unavailable: {WHY}")
KW = {"mobilenetv2": {"dropout": 0.0}}     # eager's dropout draws other masks
YAMLS = {"unified": "configs/devices/host-opencl.yaml", "discrete": "configs/devices/host-opencl-discrete.yaml"}


@functools.lru_cache(maxsize=None)
def _trainer_graph(name, batch):
    """The Trainer's graph of ``name`` at ``batch`` (traced once per worker: a Graph is frozen, tests only read it)."""
    from port.train.trainer import Trainer
    tr = Trainer(M.get(name, seed=0, **KW.get(name, {})), data(name, batch, 1)[0][0], optimizer=port_opt("sgd", 0.01))
    tr.close()
    return tr.graph


def _fast_conv_profile(g, yaml, scale=0.1, **kw):
    prof = modeled_profile(g, load_device(yaml))
    fast = tuple(dataclasses.replace(e, latency_ms=e.latency_ms * scale)
                 if e.accelerator == "opencl" and "conv" in e.signature else e for e in prof.entries)
    return dataclasses.replace(prof, entries=fast, _index={}, **kw)


def _check_plan(g, prof, plan):
    """The plan uses both engines; the ILP's objective is the simulator's step (overhead aside: none here); an own
    memory stays within its cap."""
    accs = {d.accelerator for d in plan.ops}
    assert "opencl" in accs and len(accs) > 1, accs
    sim = simulate(plan, g, prof)
    assert plan.status == "optimal" and abs(plan.objective_ms - sim.step_ms) <= 1e-5 * sim.step_ms, \
        (plan.objective_ms, sim.step_ms)
    assert sim.breakdown["handoff_ms"] > 0
    assert plan.own_memory == prof.own_memory
    caps = dict(prof.accelerator_caps)
    for m, nb in sim.breakdown.get("own_memory_peaks", {}).items():
        assert 0 < nb <= caps[m]
    return sim


def _solve_and_train(name, batch, kind, budgets, steps=2, rtol=1e-4):
    g = _trainer_graph(name, batch)
    prof = _fast_conv_profile(g, YAMLS[kind])       # the YAML's shared compute kept: the serial objective
    assert prof.own_memory == (("opencl",) if kind == "discrete" else ())
    out = []
    for budget in budgets:
        plan = port.solve(g, prof, budget=budget, time_limit_s=120)
        sim = _check_plan(g, prof, plan)
        _pl, _tl, tr = compare(M.get(name, seed=0, **KW.get(name, {})), data(name, batch, steps), plan=plan,
                               rtol=rtol)
        prog = tr.executor.program
        assert "opencl" in {c.backend for c in prog.calls}
        # the Trainer was told nothing: the plan (from the profile) gave the engine its own arena, or none
        assert bool(prog.memories) == (kind == "discrete")
        if kind == "discrete":
            assert dict(prog.memories)["opencl"] == sim.breakdown["own_memory_peaks"]["opencl"]
        tr.close()
        out.append((plan, sim))
    return out


@pytest.mark.parametrize("kind", sorted(YAMLS))
def test_ilp_resnet8_plans_on_both_engines_train_equal(kind):
    (full, _s1), (half, s2) = _solve_and_train("resnet8", 4, kind, ("100%", "50%"))
    assert half.recompute or half.paged or half.early_updates       # 50% binds: something is dropped


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2"])
@pytest.mark.parametrize("kind", sorted(YAMLS))
def test_ilp_large_plans_on_both_engines_train_equal(name, kind):
    """ResNet-18's 50% is below its static memory (parameters, momentum, gradients: 85 MiB with early updates
    against 69 MiB at batch 2; the least feasible is ~70% of its keep-everything peak): 75% there."""
    # MobileNetV2 at batch 2, one step: the weights' global relative error is 1.47e-4 on both memories, 1.48e-4
    # with the all-C default plan (its float32 noise floor at batch 2, not the engines'): tolerance 2e-4 there
    _solve_and_train(name, 2, kind, ("100%", "75%" if name == "resnet18" else "50%"), steps=1,
                     rtol=2e-4 if name == "mobilenetv2" else 1e-4)


def test_own_memory_copies_priced_exactly_under_many_placements():
    """The ILP's copy model (port.solver.ownmem) equals the simulator's residency replay: a seeded profile per trial
    makes the convolutions and a random subset of the other ops cheap on opencl, so each trial's optimum crosses
    memories differently, and the solver's own check (objective == simulated step, both directions) holds on
    every one."""
    g = _trainer_graph("resnet8", 4)
    base = modeled_profile(g, load_device(YAMLS["discrete"]))
    seen = set()
    for seed in range(4):
        rnd = random.Random(seed)
        cheap = {s for s in sorted({e.signature for e in base.entries}) if "conv" in s or rnd.random() < 0.4}
        ents = tuple(dataclasses.replace(e, latency_ms=e.latency_ms * rnd.choice((0.02, 0.05, 0.1)))
                     if e.accelerator == "opencl" and e.signature in cheap else e for e in base.entries)
        prof = dataclasses.replace(base, entries=ents, _index={})
        plan = port.solve(g, prof, budget=("100%", "50%")[seed % 2], time_limit_s=60)
        sim = simulate(plan, g, prof)
        assert abs(plan.objective_ms - sim.step_ms) <= 1e-5 * sim.step_ms
        seen.add(tuple(d.accelerator == "opencl" for d in plan.ops))
    assert len(seen) >= 3


def test_own_memory_cap_binds_in_the_ilp():
    """An own memory smaller than the uncapped plan's peak there: the ILP's plan fits it (own_cap, a bound on the
    replay's peak), is slower, and still uses the engine; the pipeline's lowering gives an arena within it."""
    from port.lower.lower import lower
    g = _trainer_graph("resnet8", 4)
    prof = _fast_conv_profile(g, YAMLS["discrete"])
    free = port.solve(g, prof, budget="100%", time_limit_s=60)
    peak = simulate(free, g, prof).breakdown["own_memory_peaks"]["opencl"]
    cap = peak // 3
    tight = dataclasses.replace(prof, accelerator_caps=(("opencl", cap),), _index={})
    plan = port.solve(g, tight, budget="100%", time_limit_s=60)
    sim = _check_plan(g, tight, plan)
    assert sim.breakdown["own_memory_peaks"]["opencl"] <= cap < peak
    assert plan.predicted_step_ms > free.predicted_step_ms
    assert dict(lower(g, plan).memories)["opencl"] <= cap


def _own_silicon(g, budget_pairs=None):
    """host-opencl's fast-conv profile with the OpenCL engine on its own silicon (no shares_compute_with)."""
    prof = _fast_conv_profile(g, YAMLS["unified"])
    assert prof.shared_compute == (("opencl", "cpu-c"),)     # the YAML: PoCL computes on the C kernels' cores
    return dataclasses.replace(prof, shared_compute=())


@pytest.mark.parametrize("budget", ["100%", "50%"])
def test_makespan_objective_equals_simulated_makespan(budget):
    """Issue 56: with an engine that overlaps the host's, the ILP's default objective is the simulator's makespan
    (engines overlapped, hand-offs waiting for the queue): its value equals simulate's ``makespan_ms`` on the plan it
    returns (the early-update tie-breaker aside), below the serial sum, and no slower than the serial objective's
    plan (which starts it)."""
    from port.solver.formulation import EPS_EARLY_MS
    g = _trainer_graph("resnet8", 4)
    prof = _own_silicon(g)
    plan = port.solve(g, prof, budget=budget, time_limit_s=10)
    sim = simulate(plan, g, prof)
    mk = sim.breakdown["makespan_ms"]
    assert abs(plan.objective_ms - EPS_EARLY_MS * len(plan.early_updates) - mk) <= 1e-6 * mk, (plan.objective_ms, mk)
    if budget == "100%":    # (at 50% a time-limited solve on a loaded machine may keep every op on one engine)
        assert {"opencl", "cpu-c"} <= {d.accelerator for d in plan.ops}
        assert mk < sim.step_ms - 1e-6
    ser = port.solve(g, prof, budget=budget, time_limit_s=10, objective="serial")
    assert abs(ser.objective_ms - simulate(ser, g, prof).step_ms) <= 1e-5 * ser.objective_ms
    assert mk <= simulate(ser, g, prof).breakdown["makespan_ms"] + 1e-9
    if budget == "50%":
        assert plan.recompute and plan.early_updates    # re-runs and early updates are on the clocks too


def test_a_plan_over_the_budget_in_the_simulator_is_never_returned(monkeypatch):
    """The ILP's incumbent simulated over the budget with queued engines (seen once per full run at this 50% case,
    2.39 MB against 2.13 MB, until the memory rows held early gradients a queued update used): the solve returns
    the best warm start within the budget, with a warning, not the plan and not an error; its objective is its
    simulated makespan."""
    import inspect
    import port.solver.ilp as ilp
    from port.solver.formulation import EPS_EARLY_MS
    g = _trainer_graph("resnet8", 4)
    prof = _own_silicon(g)
    real = ilp.simulate

    def inflated(plan, graph, profile, *a, **k):      # the ILP's own plan, as solve_ilp checks it: made too big
        sim = real(plan, graph, profile, *a, **k)
        caller = inspect.stack()[1]
        if (caller.function == "solve_ilp" and caller.frame.f_locals["inst"].objective == "makespan"
                and ilp.queued_engines(plan)):
            return dataclasses.replace(sim, peak_bytes=plan.budget_bytes + 1)
        return sim
    monkeypatch.setattr(ilp, "simulate", inflated)
    with pytest.warns(RuntimeWarning, match="over the budget"):
        plan = port.solve(g, prof, budget="50%", time_limit_s=10)
    sim = real(plan, g, prof)
    assert sim.peak_bytes <= plan.budget_bytes
    mk = sim.breakdown["makespan_ms"]
    assert abs(plan.objective_ms - EPS_EARLY_MS * len(plan.early_updates) - mk) <= 1e-6 * mk


def test_shared_compute_makes_the_makespan_serial():
    """shares_compute_with (host-opencl.yaml: PoCL on the C kernels' cores): the simulator's makespan is the serial
    sum and the ILP's default objective the serial one; a bad name is refused naming the accelerators."""
    from port.errors import ConfigError
    from port.solver.ilp import _with_objective
    from port.solver.instance import build_instance
    g = _trainer_graph("resnet8", 4)
    prof = _fast_conv_profile(g, YAMLS["unified"])
    plan = port.solve(g, prof, budget="100%", time_limit_s=10)
    sim = simulate(plan, g, prof)
    assert "opencl" in {d.accelerator for d in plan.ops}
    assert sim.breakdown["makespan_ms"] == pytest.approx(sim.step_ms, rel=1e-12)
    assert abs(plan.objective_ms - sim.step_ms) <= 1e-5 * sim.step_ms
    assert simulate(plan, g, dataclasses.replace(prof, shared_compute=())).breakdown["makespan_ms"] < sim.step_ms
    inst = build_instance(g, prof, nested=False, prune=True)
    assert _with_objective(inst, "auto").objective == "serial"
    assert _with_objective(dataclasses.replace(inst, profile=_own_silicon(g)), "auto").objective == "makespan"
    with pytest.raises(port.PortError, match="objective='fastest'"):
        _with_objective(inst, "fastest")
    import yaml, tempfile, os
    d = yaml.safe_load(open(YAMLS["unified"]))
    d["accelerators"][2]["shares_compute_with"] = "gpu0"
    with tempfile.TemporaryDirectory() as td:
        p = os.path.join(td, "bad.yaml")
        yaml.safe_dump(d, open(p, "w"))
        with pytest.raises(ConfigError, match="shares_compute_with 'gpu0'.*cpu-c"):
            load_device(p)
