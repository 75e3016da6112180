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

from functools import partial

from port.errors import InfeasibleBudgetError, PortError, SolverError  # noqa: F401  (SolverError re-exported)
from port.verify.simulate import simulate  # noqa: F401  (re-exported)
from port.plan.types import Plan
from port.solver.baselines import solve_chen, solve_greedy, solve_single
from port.solver.checkmate import solve_checkmate
from port.solver.ilp import min_feasible_budget, solve_ilp  # noqa: F401  (min_feasible_budget re-exported)

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
          gap: float = 0.01, *, budget_bytes: int | None = None, **kw) -> Plan:
    """Plan one training step of ``graph`` on ``profile``'s device within the memory ``budget``.

    ``budget``: bytes (int), a size text (``"64MB"``, ``"1.5GiB"``) or ``"NN%"`` of the keep-everything peak
    (port.solver.budget.keep_everything_peak); None: the device memory recorded in the profile (the one
    budget rule: port.solver.budget). ``budget_bytes=``
    is the older keyword for the same argument.
    Raises InfeasibleBudgetError (with the smallest feasible budget and the tensors at its peak) when no
    plan fits. On a time limit the best plan found is returned with status "timeout" and its proven gap."""
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
    return SOLVERS[solver](graph, profile, budget, time_limit_s=time_limit_s, gap=gap, **kw)


__all__ = ["solve", "SOLVERS", "ILP_SOLVERS", "min_feasible_budget", "SolverError", "simulate"]
