"""Step 5: profile + budget -> plan: the solver (port.solver) on the job's graph, one plan per memory the
executor can run a program in, simulated; the plan file `port show` draws; the one-line plan summary."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from port.errors import PortError
from port.pipeline.budget import Budget
from port.pipeline.build import Built
from port.pipeline.job import Job
from port.pipeline.profiles import ProfileStep


@dataclass(frozen=True)
class Solved:
    plan: Any                         # port.plan.types.Plan
    budget: Budget
    sim: Any                          # port.verify.simulate.SimResult of the plan
    notes: tuple[str, ...] = ()       # one line per memory solved apart (a host with a GPU), else none


def memory_groups(device: Any, profile: Any) -> dict[str, tuple[str, ...]]:
    """The profile's accelerators grouped by the memory their kernels run in on this machine
    (port.cost.handoff.backend_memory): {"cpu": ("cpu-c", "cpu-torch"), "cuda": ("cuda",)} on a host with a
    GPU. Accelerators the device description does not name count as host memory."""
    from port.cost.handoff import backend_memory
    backends = {a.id: a.backend for a in device.accelerators}
    out: dict[str, list[str]] = {}
    for acc in profile.accelerators:
        out.setdefault(backend_memory(backends.get(acc, "c")), []).append(acc)
    return {m: tuple(a) for m, a in out.items()}



def solve_plan(job: Job, built: Built, prof: ProfileStep, budget: Budget) -> Solved:
    """Solve the job's graph under ``budget`` (early updates off with micro-batching) and simulate it."""
    from port.solver import solve
    from port.verify.simulate import simulate
    s = job.config.solver
    groups = memory_groups(job.device, prof.profile)

    def one(profile: Any) -> Any:
        return solve(built.graph, profile, budget.bytes, solver=s.name, time_limit_s=s.time_limit_s, gap=s.gap,
                     allow_early_updates=job.graph_batch == job.config.batch_size, max_reruns=s.max_reruns)
    notes: list[str] = []
    if len(groups) <= 1:
        plan = one(prof.profile)
    else:
        plan, notes = _one_memory(groups, prof.profile, one)
    if plan.status == "infeasible":   # a baseline's best plan is over the budget: never hand it on as a plan
        raise _over_budget(job, built, prof, budget, plan)
    return Solved(plan, budget, simulate(plan, built.graph, prof.profile), tuple(notes))


def _one_memory(groups: dict[str, tuple[str, ...]], profile: Any, one: Callable[[Any], Any]
                ) -> tuple[Any, list[str]]:
    """The executor runs a program in one memory (no GPU<->CPU hand-off copies): one plan per memory, the
    fastest that fits is kept (else the smallest peak, refused by solve_plan with the floor). Returns the plan
    and one note per memory."""
    import dataclasses
    found, errors, notes = [], [], []
    for mem, accs in groups.items():
        try:
            p = one(profile.only(accs))
        except PortError as e:
            errors.append(e)
            notes.append(f"{mem} memory ({', '.join(accs)}): no plan ({str(e).splitlines()[0][:160]})")
            continue
        found.append((mem, p))
        notes.append(f"{mem} memory ({', '.join(accs)}): predicted step {p.predicted_step_ms:.3f} ms, "
                     f"peak {p.predicted_peak_bytes} B ({p.status})")
    if not found:
        raise errors[0]
    fits = [mp for mp in found if mp[1].status != "infeasible"]
    mem, plan = (min(fits, key=lambda mp: mp[1].predicted_step_ms) if fits
                 else min(found, key=lambda mp: mp[1].predicted_peak_bytes))
    plan = dataclasses.replace(plan, profile_digest=profile.digest())
    notes.append(f"plan: the {mem} memory's (the executor runs a program in one memory: no GPU<->CPU "
                 f"hand-offs)")
    return plan, notes


def _over_budget(job: Job, built: Built, prof: ProfileStep, budget: Budget, plan: Any) -> PortError:
    """The InfeasibleBudgetError of a baseline's plan over the budget, with the smallest budget any plan fits."""
    from port.config import format_size
    from port.errors import InfeasibleBudgetError
    from port.solver import min_feasible_budget
    from port.solver.instance import build_instance
    s = job.config.solver
    mn, _p, proven = min_feasible_budget(build_instance(built.graph, prof.profile, prune=True),
                                         allow_early_updates=job.graph_batch == job.config.batch_size)
    floor = (f"; the smallest budget any plan fits is {format_size(mn)} ({mn} B)"
             f"{'' if proven else ' (best found, not proven minimal)'}, found by the ILP (--solver highs)"
             if mn is not None else "")
    return InfeasibleBudgetError(
        f"solver {s.name!r} finds no plan within the budget of {format_size(budget.bytes)} ({budget.bytes} B): "
        f"its best plan peaks at {format_size(plan.predicted_peak_bytes)} ({plan.predicted_peak_bytes} B)"
        f"{floor}. Raise --budget, or use --solver highs", budget.bytes, mn, ())


def save_plan_file(solved: Solved, job: Job, built: Built, prof: ProfileStep, path: Path) -> Path:
    """The plan file (with what `port show` draws), written with the user's umask."""
    from port.plan.io import save_plan
    graph, profile, plan, sim = built.graph, prof.profile, solved.plan, solved.sim
    layers = []
    for o in graph.ops:
        d = plan.ops[o.id]
        c = profile.lookup(graph.signature(o), d.accelerator, d.variant)
        layers.append({"op": o.name, "layer": o.layer, "kind": o.kind, "phase": o.phase,
                       "ms": c.latency_ms if c is not None else None})
    extra = {"gantt": [list(g) for g in sim.gantt], "layers": layers, "steps": [list(s) for s in sim.steps],
             "device": job.device.name, "config": job.name, "batch_size": graph.batch_size,
             "profile_source": str(prof.path) if prof.path is not None else "roofline model",
             "keep_everything_peak_bytes": solved.budget.keep_everything_peak,
             "budget_spec": solved.budget.spec if solved.budget.spec is not None else "device memory"}
    save_plan(plan, path, graph, extra=extra)
    return Path(path)


def plan_summary(plan: Any) -> str:
    from collections import Counter

    from port.config import format_size
    accs = Counter(d.accelerator for d in plan.ops)
    vars_ = Counter(d.variant for d in plan.ops if d.variant != "plain")
    gap = "-" if plan.gap != plan.gap else f"{plan.gap:.2%}"
    return (f"plan: {plan.status} by {plan.solver} in {plan.solve_time_s:.2f} s (gap {gap}); predicted step "
            f"{plan.predicted_step_ms:.3f} ms, peak {format_size(plan.predicted_peak_bytes)} of budget "
            f"{format_size(plan.budget_bytes)}\n  placement: " + ", ".join(f"{a} {n}" for a, n in sorted(accs.items()))
            + "; variants: " + (", ".join(f"{v} {n}" for v, n in sorted(vars_.items())) or "all plain")
            + f"; recomputed tensors {len(plan.recompute)} ({len(plan.recompute_at)} re-runs), early updates "
              f"{len(plan.early_updates)}, paged {len(plan.paged)}")

