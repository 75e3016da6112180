"""port.solver: placement, implementation variant and keep/recompute/page plan under a memory budget.

    solve(graph, profile, budget, solver="highs", time_limit_s=30.0, gap=0.01,
          allow_early_updates=True, window=K) -> Plan
      budget: bytes, "64MB", "1.5GiB" or "75%" of the keep-everything peak (port.pipeline)
    SOLVERS: name -> fn(graph, profile, budget_bytes, time_limit_s=..., gap=..., **kw) -> Plan
      ILP backends: "highs" (default), "cbc", "scip", "cpsat";
      baselines: "single" (accelerator=...; also "single:<acc>"), "greedy", "chen".

The ILP (solver/FORMULATION.md) is built by port.solver.formulation; every returned plan is replayed by
port.verify.simulate, whose time and memory timeline fill the Plan's predicted_* fields.
"""
from __future__ import annotations

import dataclasses
import math
import time
from functools import partial

from port.errors import InfeasibleBudgetError, PortError, SolverError  # noqa: F401  (SolverError re-exported)
from port.verify.simulate import simulate
from port.plan.types import OpDecision, Plan
from port.solver.backends import BACKENDS, Result, complete_solution
from port.solver.baselines import _plan, chen_plan, finish, greedy_plan, solve_chen, solve_greedy, solve_single
from port.solver.formulation import KiB, Model, Vars, build
from port.solver.instance import DEFAULT_WINDOW, Instance, build_instance

MIN_PEAK_TIME_LIMIT_S = 60.0


def _warm_values(inst: Instance, m: Model, v: Vars, choice, rc, pg, at, early) -> list[float] | None:
    """Fix every binary to the given plan (at: recompute step per recomputed op) and complete the rest."""
    if any(p not in inst.rc_times or at.get(p) not in inst.rc_times[p] for p in rc):
        return None
    if any(u not in v.e for u in early):
        return None
    fixed: dict[int, float] = {}
    for (i, k), j in v.x.items():
        o = inst.options[i][k]
        fixed[j] = 1.0 if (o.acc, o.var) == tuple(choice[i]) else 0.0
    for (p, k), j in v.rcx.items():
        o = inst.options[p][k]
        fixed[j] = 1.0 if (p in rc and (o.acc, o.var) == tuple(choice[p])) else 0.0
    for (p, t), j in v.rt.items():
        fixed[j] = 1.0 if (p in rc and at[p] == t) else 0.0
    for r, j in v.pg.items():
        fixed[j] = 1.0 if r in pg else 0.0
    for u, j in v.e.items():
        fixed[j] = 1.0 if u in early else 0.0
    return complete_solution(m, fixed)


def _extract(inst: Instance, v: Vars, vals: list[float]):
    choice = []
    for i, opts in enumerate(inst.options):
        k = max(range(len(opts)), key=lambda k: vals[v.x[i, k]])
        choice.append((opts[k].acc, opts[k].var))
    rc = {p for p in inst.rc_times if sum(vals[j] for j in v.rc_of.get(p, ())) > 0.5}
    at = {p: max(inst.rc_times[p], key=lambda t: vals[v.rt[p, t]]) for p in rc}
    pg = {r for r, j in v.pg.items() if vals[j] > 0.5}
    early = {u for u, j in v.e.items() if vals[j] > 0.5}
    return choice, rc, pg, at, early


def _run(inst: Instance, budget: int | None, backend: str, time_limit_s: float, gap: float, warm,
         threads: int | None, allow_early: bool = True) -> tuple[Result, Vars, Model]:
    unit = 1 if backend == "cpsat" else KiB
    m, v = build(inst, budget, mem_unit=unit, allow_early=allow_early)
    start = None
    for w in warm or ():
        start = _warm_values(inst, m, v, *w)
        if start is not None:
            break
    res = BACKENDS[backend](m, time_limit_s, gap, start=start, threads=threads)
    return res, v, m


def min_feasible_budget(inst: Instance, solver: str = "highs", time_limit_s: float = MIN_PEAK_TIME_LIMIT_S,
                        threads: int | None = None, allow_early_updates: bool = True
                        ) -> tuple[int | None, Plan | None, bool]:
    """Smallest peak any plan reaches (solved to optimality with the same model): (bytes, plan, proven)."""
    t0 = time.perf_counter()
    backend = solver if solver in BACKENDS else "highs"
    res, v, m = _run(inst, None, backend, time_limit_s, 0.0, None, threads, allow_early_updates)
    if res.values is None:
        return None, None, False
    choice, rc, pg, at, early = _extract(inst, v, res.values)
    plan = _plan(inst, choice, 0, rc, pg, at=at, early=early)
    sim = simulate(plan, inst.graph, inst.profile)
    plan = finish(inst, _plan(inst, choice, sim.peak_bytes, rc, pg, at=at, early=early), sim.peak_bytes,
                  f"min-peak:{backend}", t0)
    return sim.peak_bytes, plan, res.status == "optimal"


def _infeasible(inst: Instance, budget: int, solver: str, threads, allow_early: bool = True) -> InfeasibleBudgetError:
    mn, plan, proven = min_feasible_budget(inst, solver, threads=threads, allow_early_updates=allow_early)
    from port.config import format_size
    if mn is None:
        return InfeasibleBudgetError(f"no plan fits the budget of {format_size(budget)} ({budget} B), and the "
                                     f"minimum-peak solve found no plan either", budget, None, ())
    sim = simulate(plan, inst.graph, inst.profile)
    tens = sim.peak_tensors
    kind, oid = sim.steps[sim.peak_step]
    msg = (f"no plan fits the memory budget of {format_size(budget)} ({budget} B) for {inst.graph.name!r} on "
           f"{inst.profile.device!r}: the smallest feasible budget is {format_size(mn)} ({mn} B)"
           f"{'' if proven else ' (best found, not proven minimal)'}; static memory (parameters, gradients, "
           f"optimizer state, input) alone is {format_size(inst.static_bytes)}"
           + (f" ({format_size(inst.static_bytes - inst.grad_bytes)} with early updates)" if allow_early else "")
           + f". At that plan's peak "
           f"({kind} {inst.graph.ops[oid].name!r}) memory is held by: " + ", ".join(tens[:12])
           + (f" and {len(tens) - 12} more" if len(tens) > 12 else ""))
    return InfeasibleBudgetError(msg, budget, mn, tuple(tens))


def solve_ilp(graph, profile, budget_bytes: int, time_limit_s: float = 30.0, gap: float = 0.01,
              backend: str = "highs", warm_start: bool = True, threads: int | None = None,
              allow_early_updates: bool = True, window: int = DEFAULT_WINDOW, **_kw) -> Plan:
    t0 = time.perf_counter()
    budget = int(budget_bytes)
    early_ok = bool(allow_early_updates)
    inst = build_instance(graph, profile, window=window)
    if budget < inst.static_bytes - (inst.grad_bytes if early_ok else 0):
        raise _infeasible(inst, budget, backend, threads, early_ok)
    warm = []
    if warm_start:
        choice, rc, pg, early = greedy_plan(inst, budget, min(10.0, time_limit_s), early_ok)
        try:
            gs = simulate(_plan(inst, choice, budget, rc, pg, early=early), graph, profile)
            if gs.peak_bytes <= budget:
                warm.append((choice, rc, pg, {p: inst.tau[p] for p in rc}, early))
        except PortError:
            pass
        if not warm:   # tight budgets: Chen's segments (+ early updates) as a start
            choice, rc, at, early = chen_plan(inst, budget, allow_early=early_ok)
            try:
                cs = simulate(_plan(inst, choice, budget, rc, (), at=at, early=early), graph, profile)
                if cs.peak_bytes <= budget:
                    warm.append((choice, rc, set(), at, early))
            except PortError:
                pass
    remaining = max(0.5, time_limit_s - (time.perf_counter() - t0))
    res, v, m = _run(inst, budget, backend, remaining, gap, warm, threads, early_ok)
    if res.status == "infeasible":
        raise _infeasible(inst, budget, backend, threads, early_ok)
    if res.values is None:
        if warm:  # time limit before the solver reported anything: the warm start stands
            choice, rc, pg, at, early = warm[0]
            p = finish(inst, _plan(inst, choice, budget, rc, pg, at=at, early=early), budget, backend, t0)
            return dataclasses.replace(p, status="timeout", gap=float("nan"), objective_ms=p.predicted_step_ms)
        if res.status == "timeout":
            raise SolverError(f"{backend} found no plan within {time_limit_s:.1f} s and neither greedy nor Chen "
                              f"fits the budget; raise --time-limit or the budget")
        raise SolverError(f"{backend} failed (status {res.status})")
    choice, rc, pg, at, early = _extract(inst, v, res.values)
    plan = _plan(inst, choice, budget, rc, pg, at=at, early=early)
    sim = simulate(plan, graph, profile)
    if sim.peak_bytes > budget:
        raise SolverError(f"{backend} returned a plan with simulated peak {sim.peak_bytes} B over the budget "
                          f"{budget} B (formulation/simulator mismatch)")
    obj = res.objective
    from port.solver.formulation import EPS_EARLY_MS
    expect = obj - EPS_EARLY_MS * len(plan.early_updates)     # the objective's tie-breaker is not time
    expect += sim.breakdown.get("overhead_ms", 0.0)           # the executor's fixed per-step cost: not a decision
    tol = 1e-6 * max(1.0, abs(obj)) + 1e-9
    if abs(sim.step_ms - expect) > tol:   # both directions: the ILP may neither under- nor over-price a plan
        raise SolverError(f"{backend}: simulated step {sim.step_ms:.6f} ms differs from the ILP objective "
                          f"{expect:.6f} ms (formulation/simulator mismatch; please report)")
    return dataclasses.replace(plan, solver=backend, status=res.status, objective_ms=float(obj), gap=float(res.gap),
                               solve_time_s=time.perf_counter() - t0, predicted_step_ms=sim.step_ms,
                               predicted_peak_bytes=sim.peak_bytes, memory_timeline=sim.timeline)


SOLVERS = {
    "highs": partial(solve_ilp, backend="highs"),
    "cbc": partial(solve_ilp, backend="cbc"),
    "scip": partial(solve_ilp, backend="scip"),
    "cpsat": partial(solve_ilp, backend="cpsat"),
    "greedy": solve_greedy,
    "chen": solve_chen,
    "single": solve_single,
}
ILP_SOLVERS = ("highs", "cbc", "scip", "cpsat")


def solve(graph, profile, budget: int | str | None = None, solver: str = "highs", time_limit_s: float = 30.0,
          gap: float = 0.01, *, budget_bytes: int | None = None, **kw) -> Plan:
    """Plan one training step of ``graph`` on ``profile``'s device within the memory ``budget``.

    ``budget``: bytes (int), a size text (``"64MB"``, ``"1.5GiB"``) or ``"NN%"`` of the keep-everything peak
    (port.pipeline.keep_everything_peak); None: the device memory recorded in the profile. ``budget_bytes=``
    is the older keyword for the same argument.
    Raises InfeasibleBudgetError (with the smallest feasible budget and the tensors at its peak) when no
    plan fits. On a time limit the best plan found is returned with status "timeout" and its proven gap."""
    if budget_bytes is not None:
        if budget is not None:
            raise TypeError("solve(): give the budget once (budget or budget_bytes)")
        budget = budget_bytes
    from port.pipeline import budget_bytes as _resolve_budget
    budget = _resolve_budget(budget, graph, profile)
    if solver.startswith("single:"):
        kw["accelerator"] = solver.split(":", 1)[1]
        solver = "single"
    if solver not in SOLVERS:
        raise PortError(f"unknown solver {solver!r}; choose one of {sorted(SOLVERS)} or single:<accelerator>")
    return SOLVERS[solver](graph, profile, budget, time_limit_s=time_limit_s, gap=gap, **kw)


__all__ = ["solve", "SOLVERS", "ILP_SOLVERS", "min_feasible_budget", "SolverError", "simulate"]
