"""port.solver: placement, implementation variant and keep/recompute/page plan under a memory budget.

    solve(graph, profile, budget, solver="highs", time_limit_s=30.0, gap=0.01,
          allow_early_updates=True, window=K) -> Plan
      budget: bytes, "64MB", "1.5GiB" or "75%" of the keep-everything peak (port.solver.budget)
    SOLVERS: name -> fn(graph, profile, budget_bytes, time_limit_s=..., gap=..., **kw) -> Plan
      ILP backends: "highs" (default), "cbc", "scip", "cpsat";
      baselines: "single" (accelerator=...; also "single:<acc>"), "greedy", "chen", "checkmate" (Checkmate's
      T x T MILP: one accelerator, plain variants, recompute only; port.solver.checkmate).

The ILP (solver/FORMULATION.md) is built by port.solver.formulation and solved by port.solver.ilp (phases, warm
starts, the minimum-peak search); the budget rule is port.solver.budget; every returned plan is replayed by
port.verify.simulate, whose time and memory timeline fill the Plan's predicted_* fields.
"""
from __future__ import annotations

import dataclasses
from functools import partial

from port.errors import InfeasibleBudgetError, PortError, SolverError  # noqa: F401  (SolverError re-exported)
from port.verify.simulate import simulate  # noqa: F401  (re-exported)
from port.plan.types import Plan
from port.solver.baselines import solve_chen, solve_greedy, solve_single
from port.solver.checkmate import solve_checkmate
from port.solver.ilp import min_feasible_budget, solve_ilp  # noqa: F401  (min_feasible_budget re-exported)
from port.solver.budget import arena_bytes

SOLVERS = {
    "highs": partial(solve_ilp, backend="highs"),
    "cbc": partial(solve_ilp, backend="cbc"),
    "scip": partial(solve_ilp, backend="scip"),
    "cpsat": partial(solve_ilp, backend="cpsat"),
    "greedy": solve_greedy,
    "chen": solve_chen,
    "single": solve_single,
    "checkmate": solve_checkmate,
}
ILP_SOLVERS = ("highs", "cbc", "scip", "cpsat")


def solve(graph, profile, budget: int | str | None = None, solver: str = "highs", time_limit_s: float = 30.0,
          gap: float = 0.01, *, budget_bytes: int | None = None, fit: bool = True, **kw) -> Plan:
    """Plan one training step of ``graph`` on ``profile``'s device within the memory ``budget``.

    ``budget``: bytes (int), a size text (``"64MB"``, ``"1.5GiB"``) or ``"NN%"`` of the keep-everything peak
    (port.solver.budget.keep_everything_peak); None: the device memory recorded in the profile (the one
    budget rule: port.solver.budget). ``budget_bytes=``
    is the older keyword for the same argument.
    Raises InfeasibleBudgetError (with the smallest feasible budget and the tensors at its peak) when no
    plan fits. On a time limit the best plan found is returned with status "timeout" and its proven gap.
    ``fit``: the arena the plan lowers to fits the budget too (``fit_arena``, a last resort: the plan's accounting
    is the arena's, only the packing's fragmentation can exceed it); False for a profile that prices the
    kernels' workspaces otherwise than lowering (Checkmate's matched profile: no workspace at all)."""
    if budget_bytes is not None:
        if budget is not None:
            raise TypeError("solve(): give the budget once (budget or budget_bytes)")
        budget = budget_bytes
    from port.solver.budget import budget_bytes as _resolve_budget
    budget = _resolve_budget(budget, graph, profile)
    if solver.startswith("single:"):
        kw["accelerator"] = solver.split(":", 1)[1]
        solver = "single"
    if solver not in SOLVERS:
        raise PortError(f"unknown solver {solver!r}; choose one of {sorted(SOLVERS)} or single:<accelerator>")
    run = partial(SOLVERS[solver], graph, profile, time_limit_s=time_limit_s, gap=gap, **kw)
    plan = run(budget)
    if plan.own_memory != profile.own_memory:       # the profile says which engines have their own memory
        plan = dataclasses.replace(plan, own_memory=profile.own_memory)
    return fit_arena(graph, profile, plan, budget, run) if fit else plan


ARENA_FIT_SLOWER = 0.02     # a re-solved plan this much slower than the ILP's first plan is announced (a warning)
FIT_TRIES = 3               # re-solves at most, each budget tightened by every gap the packings left so far


class ArenaFitWarning(UserWarning):
    """fit_arena re-solved with a tighter budget and the plan it returns is noticeably slower."""


def fit_arena(graph, profile, plan: Plan, budget: int, run) -> Plan:
    """``plan`` (solved within ``budget``) if its arena (+ engines) fits the budget too, else ``run(tighter)``'s
    plan, the budget tightened by the overshoot; where that plan's packing leaves gaps over the budget too, tightened
    again by them (FIT_TRIES re-solves at most).

    The plan's accounting is the arena's (port.plan.semantics: stored bytes), so its peak is the lowered
    program's live bound; the packer (port.lower.arena) reaches that bound on every zoo plan the tests solve, but
    it is a heuristic: where it leaves gaps above a budget with no slack, this is the last resort. The plan
    returned records the caller's budget; one ARENA_FIT_SLOWER or more slower than ``plan`` comes with an
    ArenaFitWarning naming both step times. InfeasibleBudgetError when the tighter budget finds no plan or its
    arena is still over, naming the arena as the budget to ask for."""
    if plan.status == "infeasible":
        return plan
    held = arena_bytes(graph, profile, plan)
    if held is None or held <= budget:
        return plan
    from port.config import format_size
    over = held - budget
    why = (f"the plan solved within the budget of {format_size(budget)} ({budget} B) lowers to an arena (+ engines) "
           f"of {format_size(held)} ({held} B): the packing leaves {over} B of gaps above the plan's peak")
    cut = over
    for _ in range(FIT_TRIES):     # each re-solve tightened by the gaps its predecessor's packing left as well
        tried = budget - cut
        try:
            fit = run(tried)
        except InfeasibleBudgetError as e:
            raise InfeasibleBudgetError(f"{why}, and no plan fits the budget tightened by them ({tried} B). "
                                        f"Raise the budget to {format_size(held)} ({held} B) or more", budget, held,
                                        e.peak_tensors) from None
        again = arena_bytes(graph, profile, fit)
        if fit.status == "infeasible" or again is None or again <= budget:
            break
        cut += again - budget
    if fit.status == "infeasible" or (again is not None and again > budget):
        raise InfeasibleBudgetError(f"{why}; the plan re-solved within {tried} B still lowers to "
                                    f"{again if fit.status != 'infeasible' else held} B. Raise the budget to "
                                    f"{format_size(held)} ({held} B) or more", budget, held, ())
    if fit.predicted_step_ms > plan.predicted_step_ms * (1 + ARENA_FIT_SLOWER):
        import warnings
        warnings.warn(f"{why}; re-solved within {tried} B, the plan that fits predicts "
                      f"{fit.predicted_step_ms:.3f} ms a step against {plan.predicted_step_ms:.3f} ms (raise the "
                      f"budget by {held - budget} B for the faster one)", ArenaFitWarning, stacklevel=2)
    return dataclasses.replace(fit, budget_bytes=budget)


__all__ = ["solve", "SOLVERS", "ILP_SOLVERS", "min_feasible_budget", "SolverError", "simulate", "arena_bytes",
           "fit_arena", "ArenaFitWarning"]
