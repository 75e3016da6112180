"""Paged optimizer state (issue 56): a plan may keep an optimizer-state tensor (SGD's momentum, AdamW's m and v) in
storage between its updates, paged in for the step its update runs at and out after it (port.plan.semantics,
rules 1 and 5). A budget below parameters + optimizer state is then feasible; the plan trains as PyTorch does,
the simulator's arena peak is the lowered program's, the trainer's optimizer state and checkpoints hold the true
state (read from storage), and the solver pages state only where the budget binds.
"""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import port
import port.plan.semantics as SEM
from port.config import load_device
from port.cost.roofline import modeled_profile
from port.exec.bundle import BundleError
from port.ir.trace import trace
from port.ir.types import ROLE_OPTIMIZER_STATE
from port.lower.lower import default_plan
from port.solver.budget import keep_everything
from port.train.trainer import Trainer
from port.verify.simulate import simulate
from _equiv import compare, port_opt

LR = 0.01


def mlp():
    """Four equal hidden layers: parameters and optimizer state dominate, activations are small."""
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(96, 96), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(96, 10))


def batches(steps: int = 4):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 96, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(steps)]


def with_storage(prof, gbps=1.0, lat=0.05):
    return dataclasses.replace(prof, storage=(("bandwidth_gbps", gbps), ("latency_ms", lat)), _index={})


def setup(optimizer: str):
    model = mlp()
    bs = batches()
    g = trace(model, bs[0][0], optimizer=optimizer)
    return model, bs, g, with_storage(modeled_profile(g, load_device("host")))


def state_roots(g, plan) -> list[int]:
    return [t for t in plan.paged if g.tensors[t].role == ROLE_OPTIMIZER_STATE]


@pytest.mark.parametrize("optimizer,opt", [("sgd_momentum", "sgd"), ("adamw", "adamw")])
def test_budget_below_parameters_and_state_pages_state_and_trains_equal(optimizer, opt, tmp_path, monkeypatch):
    monkeypatch.setenv("PORT_SPILL_DIR", str(tmp_path))
    model, bs, g, prof = setup(optimizer)
    params = sum(SEM.stored_bytes(t) for t in g.tensors if t.role == "parameter" and t.alias_of is None)
    state = sum(SEM.stored_bytes(g.tensors[r]) for r in SEM.paged_state_updates(g))
    grads = sum(SEM.stored_bytes(g.tensors[gr]) for (_p, _pu, gs) in SEM.early_update_candidates(g).values()
                for gr in gs)
    budget = params + state
    # below every plan that keeps the state resident: the static floor with every update early (the old rule)
    assert budget < SEM.static_bytes(g) - grads
    plan = port.solve(g, prof, budget=budget, time_limit_s=20)
    assert plan.predicted_peak_bytes <= budget
    assert state_roots(g, plan), "the budget binds: some optimizer state must be paged"
    sim = simulate(plan, g, prof)
    pl, tl, tr = compare(copy.deepcopy(model), bs, opt, lr=LR, plan=plan)
    assert tr.program.peak_live_bytes == sim.arena_peak_bytes      # the simulator's arena peak is the program's
    c = tr.executor.spill_counters()
    n_state = len(state_roots(g, plan))
    n_act = len(plan.paged) - n_state
    assert c["writes"] == len(bs) * (n_state + n_act)


def test_solver_pages_no_state_where_the_budget_does_not_bind():
    _model, _bs, g, prof = setup("sgd_momentum")
    peak, _eng = keep_everything(g, prof)
    plan = port.solve(g, prof, budget=peak, time_limit_s=20)
    assert not state_roots(g, plan)


def test_port_compile_solves_without_paged_state(tmp_path, monkeypatch):
    """`port compile` solves on the C-only profile port-rt runs (port.pipeline.compile.c_only_profile): port-rt's
    spill file keeps no optimizer state between steps, so that profile offers the solver no state pages (the
    default config's compile at 75% once got a plan paging two momenta, which the bundle writer then refused).
    The budget that needs paged state is infeasible there, naming a floor above it; at that floor the plan pages
    no state and compiles."""
    from types import SimpleNamespace

    from port.errors import InfeasibleBudgetError
    from port.pipeline.compile import c_only_profile
    monkeypatch.setenv("PORT_SPILL_DIR", str(tmp_path))
    model, bs, g, prof = setup("sgd_momentum")
    params = sum(SEM.stored_bytes(t) for t in g.tensors if t.role == "parameter" and t.alias_of is None)
    budget = params + sum(SEM.stored_bytes(g.tensors[r]) for r in SEM.paged_state_updates(g))
    assert state_roots(g, port.solve(g, prof, budget=budget, time_limit_s=20))     # the full profile pages state
    rt = c_only_profile(SimpleNamespace(device=load_device("host"), where=""), prof)
    assert dict(rt.storage)["bandwidth_gbps"] == dict(prof.storage)["bandwidth_gbps"]   # activations still page
    with pytest.raises(InfeasibleBudgetError) as e:
        port.solve(g, rt, budget=budget, time_limit_s=20)
    assert e.value.min_feasible_bytes > budget
    plan = port.solve(g, rt, budget=e.value.min_feasible_bytes, time_limit_s=20)
    assert not state_roots(g, plan) and plan.predicted_peak_bytes <= e.value.min_feasible_bytes
    tr = Trainer(copy.deepcopy(model), bs[0][0], optimizer=port_opt("sgd", LR), plan=plan)
    tr.compile(tmp_path / "b.portrt")
    assert (tmp_path / "b.portrt").stat().st_size > 0


def test_paged_state_is_the_true_state_and_checkpoints_round_trip(tmp_path, monkeypatch):
    """Every momentum paged (updates early and late): the trainer's optimizer_state() equals the resident plan's,
    a checkpoint of the paged trainer resumes into the same training, and port-rt refuses the plan."""
    monkeypatch.setenv("PORT_SPILL_DIR", str(tmp_path))
    model, bs, g, _prof = setup("sgd_momentum")
    keep = default_plan(g, "c", fuse=False, inplace=False)
    early = tuple(sorted(SEM.early_update_candidates(g)))[:3]          # some early, the rest late
    keep = dataclasses.replace(keep, early_updates=early)
    paged = dataclasses.replace(keep, paged=tuple(sorted(SEM.paged_state_updates(g))))
    sch = SEM.schedule(g, paged)
    assert sch.paged_state == frozenset(paged.paged)
    assert sch.static_bytes == SEM.schedule(g, keep).static_bytes - sum(SEM.stored_bytes(g.tensors[r])
                                                                          for r in paged.paged)

    def make(plan):
        return Trainer(copy.deepcopy(model), bs[0][0], optimizer=port_opt("sgd", LR), plan=plan)
    a, b = make(keep), make(paged)
    for x, y in bs[:2]:
        assert a.step(x, y) == b.step(x, y)
    sa, sb = a.optimizer_state(), b.optimizer_state()
    assert set(sa) == set(sb) and len(sb) == len(paged.paged)
    for k in sa:
        assert torch.equal(sa[k].reshape(-1), sb[k].reshape(-1)), k
    assert any(float(v.abs().max()) > 0 for v in sb.values())
    ck = tmp_path / "paged.ckpt"
    b.save_checkpoint(ck)
    c = Trainer.resume(ck, copy.deepcopy(model), bs[0][0], plan=paged)
    for x, y in bs[2:]:
        assert b.step(x, y) == c.step(x, y)
    for k, v in b.optimizer_state().items():
        assert torch.equal(v, c.optimizer_state()[k]), k
    with pytest.raises(BundleError, match="pages optimizer state"):
        b.compile(tmp_path / "b.portrt")


def test_paged_state_across_engines_trains_equal(tmp_path, monkeypatch):
    """Every other layer (its backward and update with it) on the opencl engine, every momentum paged, updates
    early: the page calls wait for the queue that updates the state (rule 8), and training equals PyTorch."""
    from port.exec import registry
    ok, why = registry.available("opencl")
    if not ok:
        pytest.skip(f"opencl backend unavailable: {why}")
    from port.ir.trace import trace_many
    from test_opencl_cross import alternating
    monkeypatch.setenv("PORT_SPILL_DIR", str(tmp_path))
    model, bs = mlp(), batches()
    g = trace_many([dict(model=mlp(), example_input=bs[0][0], optimizer="sgd_momentum", name="mlp4")])[0]
    base = alternating(g)
    plan = dataclasses.replace(base, paged=tuple(sorted(SEM.paged_state_updates(g))),
                               early_updates=tuple(sorted(SEM.early_update_candidates(g))))
    paged_ups = {SEM.paged_state_updates(g)[r] for r in plan.paged}
    assert {plan.ops[u].accelerator for u in paged_ups} == {"opencl"}      # (the linears; relus on cpu-c)
    assert {d.accelerator for d in plan.ops} == {"cpu-c", "opencl"}
    compare(copy.deepcopy(model), bs, "sgd", lr=LR, plan=plan)
