"""port.solver.ilp: the ILP solve (solve_ilp, behind SOLVERS' "highs", "cbc", "scip" and "cpsat"): the phases
(single-level model, then the multi-level one; first solve, rolling horizon, final solve), the warm starts
(baselines, the LP-guided restricted solve), the minimum-peak search (min_feasible_budget) and the
InfeasibleBudgetError that names the smallest feasible budget. solver/FORMULATION.md is the model; port.solver
dispatches to it."""
from __future__ import annotations

import dataclasses
import time

from port.errors import InfeasibleBudgetError, PortError, SolverError
from port.verify.simulate import simulate
from port.plan.types import Plan
from port.solver.backends import BACKENDS, Result, complete_solution
from port.solver.baselines import _plan, chen_plan, finish, greedy_plan
from port.solver.formulation import KiB, Model, Vars, build
from port.solver.instance import DEFAULT_WINDOW, Instance, build_instance
from port.plan.semantics import drop_idle_reruns, queued_engines, with_inplace_reruns

DEFAULT_MAX_RERUNS = 3   # how often one forward op may be re-run (multi-level recompute); solve(max_reruns=)

MIN_PEAK_TIME_LIMIT_S = 60.0


def _warm_values(inst: Instance, m: Model, v: Vars, choice, rc, pg, at, early, joins=()) -> list[float] | None:
    """Fix every binary to the given plan (at: re-run step, or steps, per recomputed op; joins: Plan.joins, at
    candidate steps) and complete the rest (None when the plan is outside the model). A re-run copy of an output
    root is held past its group when op t or a later step reads it before the op's next re-run, to its last such
    use."""
    steps = {p: sorted((at[p],) if isinstance(at[p], int) else at[p]) for p in rc}
    if any(p not in inst.rc_times or not steps[p] or any(t not in inst.rc_times[p] for t in steps[p]) for p in rc):
        return None
    if any(u not in v.e for u in early) or any(len(steps[p]) > 1 + len({lv for lv, _ in v.rc_more.get(p, ())})
                                               for p in rc):
        return None
    fixed: dict[int, float] = {}
    for (i, k), j in v.x.items():
        o = inst.options[i][k]
        fixed[j] = 1.0 if (o.acc, o.var) == tuple(choice[i]) else 0.0
    for (p, k), j in v.rcx.items():
        o = inst.options[p][k]
        fixed[j] = 1.0 if (p in rc and (o.acc, o.var) == tuple(choice[p])) else 0.0
    for (lv, p, k), j in v.rcx_more.items():
        o = inst.options[p][k]
        fixed[j] = 1.0 if (p in rc and len(steps[p]) >= lv and (o.acc, o.var) == tuple(choice[p])) else 0.0
    readers: dict[int, list[tuple[int, int]]] = {}     # root -> (step, re-running op) of re-runs reading it
    for q in rc:
        for _k, u, _pu in inst.rc_in.get(q, ()):
            readers.setdefault(u, []).extend((t, q) for t in steps[q])
    for j in list(v.st.values()) + list(v.en.values()):
        fixed[j] = 0.0
    for (p, t), j in v.rt.items():
        fixed[j] = 1.0 if (p in rc and t in steps[p]) else 0.0
    for p in rc:
        ts = steps[p]
        for r in inst.rc_outputs[p]:
            for k, t in enumerate(ts):
                t1 = ts[k + 1] if k + 1 < len(ts) else len(inst.graph.ops) + 1
                uses = [s for s in inst.rc_cover[r] if t <= s < t1] + [s for s, _q in readers.get(r, ()) if t < s < t1]
                if uses:
                    if (r, t) not in v.st:
                        return None              # single-level model: a pure copy lives in its group only
                    fixed[v.st[r, t]] = 1.0
                    if inst.nested:
                        if max(uses) not in inst.rc_ends[r]:
                            return None
                        fixed[v.en[r, max(uses)]] = 1.0
    for r, j in list(v.pg.items()) + list(v.ps.items()):
        fixed[j] = 1.0 if r in pg else 0.0
    for u, j in v.e.items():
        fixed[j] = 1.0 if u in early else 0.0
    if any(e not in v.jn for e in joins):
        return None
    for e, j in v.jn.items():
        fixed[j] = 1.0 if e in joins else 0.0
    return complete_solution(m, fixed)


def _tidy(inst: Instance, plan: Plan) -> Plan:
    """A solution's plan: re-runs nobody reads dropped, and the re-runs the model lets run in place
    (Instance.rc_inplace) doing so."""
    plan = drop_idle_reruns(inst.graph, plan)
    if not inst.rc_inplace or not plan.recompute:
        return plan
    return with_inplace_reruns(inst.graph, plan, {q for q, (_x, _p, accs) in inst.rc_inplace.items()
                                                  if plan.ops[q].accelerator in accs})


def _extract(inst: Instance, v: Vars, vals: list[float]):
    choice = []
    for i, opts in enumerate(inst.options):
        k = max(range(len(opts)), key=lambda k: vals[v.x[i, k]])
        choice.append((opts[k].acc, opts[k].var))
    rc = {p for p in inst.rc_times if sum(vals[j] for j in v.rc_of.get(p, ())) > 0.5}
    at = {p: [t for t in inst.rc_times[p] if vals[v.rt[p, t]] > 0.5] for p in rc}
    pg = {r for r, j in list(v.pg.items()) + list(v.ps.items()) if vals[j] > 0.5}    # activations, optimizer state
    early = {u for u, j in v.e.items() if vals[j] > 0.5}
    return choice, rc, pg, at, early


def _with_joins(plan: Plan, v: Vars, vals: list[float]) -> Plan:
    """``plan`` with the solution's explicit joins (jn[a,t] = 1; Plan.joins)."""
    joins = tuple(sorted((e for e, j in v.jn.items() if vals[j] > 0.5), key=lambda e: (e[1], e[0])))
    return dataclasses.replace(plan, joins=joins) if joins else plan


FIRST_SHARE = 0.35      # of the time left: the first solve; then rolling-horizon improvement, then a final solve
IMPROVE_SHARE = 0.6     # of the time left after the first solve: rolling horizon (port.solver.improve)
PHASED_MIN_WINDOWS = 2  # the rolling horizon runs only on graphs longer than this many of its windows


def _reserve_s(time_limit_s: float) -> float:
    """Time kept back from the solver for what follows it (extracting, simulating and checking the plan), so
    that a solve returns within its time limit."""
    return 0.05 + 0.01 * time_limit_s


def _phased(inst: Instance) -> bool:
    """Whether a budgeted solve runs in phases (first solve, rolling horizon, final solve). On a graph of at
    most PHASED_MIN_WINDOWS rolling-horizon windows of forward ops, a window's sub-MIP is most of the model,
    and every restart repeats the solver's root work (ResNet-18 at 50% on jetson-orin-nano: ~7 s of cuts per
    root); one solve with all the time finds better plans there (10 s: 341 -> 323 ms; 30 s: 309 -> 282 ms)."""
    from port.ir.types import PHASE_FORWARD
    from port.solver.improve import DEFAULT_WINDOW_OPS
    return sum(1 for o in inst.graph.ops if o.phase == PHASE_FORWARD) > PHASED_MIN_WINDOWS * DEFAULT_WINDOW_OPS


def _aggregate(m: Model, v: Vars) -> int:
    """Add the memory rows that bind at the LP optimum in aggregated form (formulation.add_aggregated_memory_rows):
    the knapsack structure for HiGHS's cuts."""
    from port.solver.backends import solve_lp
    from port.solver.formulation import add_aggregated_memory_rows
    val = solve_lp(m)
    return 0 if val is None else add_aggregated_memory_rows(m, v, val)


def _run(inst: Instance, budget: int | None, backend: str, time_limit_s: float, gap: float, warm,
         threads: int | None, allow_early: bool = True, max_reruns: int = 1,
         improve: bool = False, target_bytes: int | None = None) -> tuple[Result, Vars, Model]:
    """Build and solve within ``time_limit_s`` (building included). ``improve`` (a budgeted model with a warm
    start, on a graph long enough for ``_phased``): the solver gets FIRST_SHARE of the time; if it stops above
    the gap, the rolling horizon improves its incumbent and a final solve starts from that
    (solver/FORMULATION.md, "Phases"). The bound reported is the best of both solves."""
    t0 = time.perf_counter()
    unit = 1 if backend == "cpsat" else KiB
    m, v = build(inst, budget, mem_unit=unit, allow_early=allow_early, max_reruns=max_reruns)
    if budget is not None and backend == "highs":
        _aggregate(m, v)
    start = None
    for w in warm or ():
        start = _warm_values(inst, m, v, *w)
        if start is not None:
            break
    solve = BACKENDS[backend]
    deadline = t0 + time_limit_s
    if not improve or start is None or budget is None or not _phased(inst):
        kw = {"target": target_bytes / unit} if target_bytes is not None and backend == "highs" else {}
        return solve(m, max(0.1, deadline - time.perf_counter()), gap, start=start, threads=threads, **kw), v, m
    left = deadline - time.perf_counter()
    res = solve(m, max(min(left, 2.0), FIRST_SHARE * left), gap, start=start, threads=threads)
    left = deadline - time.perf_counter()
    if res.values is None or res.status in ("optimal", "infeasible") or res.gap <= gap or left < 1.0:
        return res, v, m
    from port.solver.improve import rolling_horizon
    imp = rolling_horizon(inst, m, v, res.values, time.perf_counter() + IMPROVE_SHARE * left, backend,
                          threads=threads)
    left = deadline - time.perf_counter()
    fin = solve(m, max(left, 0.5), gap, start=imp.values, threads=threads) if left > 0.5 else None
    best = res if imp.objective >= res.objective else Result("timeout", imp.values, imp.objective, res.bound,
                                                             res.solve_time_s, backend)
    if fin is not None and fin.values is not None and fin.objective <= best.objective:
        best = fin
    bounds = [b for b in (res.bound, fin.bound if fin is not None else None) if b is not None]
    bound = min(max(bounds), best.objective) if bounds else None
    status = "optimal" if fin is not None and fin.status == "optimal" and best is fin else "timeout"
    out = Result(status, best.values, best.objective, bound, time.perf_counter() - t0, backend)
    if out.status == "timeout" and out.gap <= gap:
        out.status = "optimal"
    return out, v, m


def min_feasible_budget(inst: Instance, solver: str = "highs", time_limit_s: float = MIN_PEAK_TIME_LIMIT_S,
                        threads: int | None = None, allow_early_updates: bool = True,
                        max_reruns: int = DEFAULT_MAX_RERUNS,
                        target_bytes: int | None = None) -> tuple[int | None, Plan | None, bool]:
    """Smallest peak any plan reaches (solved to optimality with the same model): (bytes, plan, proven).
    With ``max_reruns`` > 1 and a nested instance, the single-level minimum is found first and warm-starts the
    multi-level (nested recompute) model. ``target_bytes`` (HiGHS): stop at the first plan whose modeled peak
    is within it (not proven minimal then): the search for any plan within a budget."""
    t0 = time.perf_counter()
    backend = solver if solver in BACKENDS else "highs"
    warm = None
    if inst.nested and max_reruns > 1:
        flat = build_instance(inst.graph, inst.profile, window=inst.window, nested=False, prune=inst.pruned)
        _mn1, plan1, _p = min_feasible_budget(flat, solver, time_limit_s / 3, threads, allow_early_updates, 1)
        if plan1 is not None:
            warm = [_warm_of(inst, plan1)]
    elif not inst.nested:
        max_reruns = 1
    left = max(1.0, time_limit_s - (time.perf_counter() - t0))
    res, v, m = _run(inst, None, backend, left, 0.0, warm, threads, allow_early_updates, max_reruns,
                     target_bytes=target_bytes)
    if res.values is None:
        return None, None, False
    choice, rc, pg, at, early = _extract(inst, v, res.values)
    plan = _tidy(inst, _with_joins(_plan(inst, choice, 0, rc, pg, at=at, early=early), v, res.values))
    sim = simulate(plan, inst.graph, inst.profile)
    plan = finish(inst, dataclasses.replace(plan, budget_bytes=sim.peak_bytes), sim.peak_bytes,
                  f"min-peak:{backend}", t0)
    return sim.peak_bytes, plan, res.status == "optimal"


def _warm_of(inst: Instance, plan: Plan):
    """A plan as a warm start tuple (choice, recomputed ops, paged, steps per op, early updates, joins)."""
    at: dict[int, list[int]] = {}
    for p, t in plan.recompute_at:
        at.setdefault(p, []).append(t)
    if plan.recompute and not plan.recompute_at:
        at = {p: [inst.tau[p]] for p in {inst.roots[r].birth for r in plan.recompute if r in inst.roots}
              if p in inst.tau}
    return ([(d.accelerator, d.variant) for d in plan.ops], set(at), set(plan.paged), at, set(plan.early_updates),
            tuple(plan.joins))


def _infeasible(inst: Instance, budget: int, solver: str, threads, allow_early: bool = True,
                max_reruns: int = DEFAULT_MAX_RERUNS, found=None) -> InfeasibleBudgetError:
    """found: an earlier min_feasible_budget result on ``inst`` (else it is solved here)."""
    if max_reruns > 1 and not inst.nested:
        inst = build_instance(inst.graph, inst.profile, window=inst.window, nested=True, prune=inst.pruned)
    mn, plan, proven = found or min_feasible_budget(inst, solver, threads=threads, allow_early_updates=allow_early,
                                                    max_reruns=max_reruns)
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
           + (f" ({format_size(inst.static_bytes - (inst.grad_bytes if allow_early else 0) - inst.state_bytes)} "
              f"with the optimizer state paged)" if inst.state_bytes else "")
           + f". At that plan's peak "
           f"({kind} {inst.graph.ops[oid].name!r}) memory is held by: " + ", ".join(tens[:12])
           + (f" and {len(tens) - 12} more" if len(tens) > 12 else ""))
    return InfeasibleBudgetError(msg, budget, mn, tuple(tens))


def _baseline_warm(inst: Instance, budget: int, time_limit_s: float, early_ok: bool, backend: str = "highs",
                   threads: int | None = None) -> list:
    """Warm starts that fit the budget, fastest first: Chen's checkpointing with segments of K+1 forward ops
    re-run inside C(P) (always a solution of the model) and greedy (at most a tenth of the time limit, 10 s);
    when neither fits, the restricted solve (``_restricted_warm``, RESTRICTED_SHARE of the time) and Chen's
    own sqrt(n) segments (on long graphs outside the model, yet a plan if the solver finds none)."""
    t0 = time.perf_counter()
    graph, profile = inst.graph, inst.profile
    found = []

    def consider(choice, rc, pg, at, early) -> None:
        try:
            plan = _tidy(inst, _plan(inst, choice, budget, rc, pg, at=at, early=early))
            sim = simulate(plan, graph, profile)
        except PortError:
            return
        if sim.peak_bytes <= budget:     # one the model cannot express is skipped by _run, yet it still
            found.append((sim.step_ms, len(found), _warm_of(inst, plan)))   # stands if the solver finds nothing

    choice, rc, at, early = chen_plan(inst, budget, segments=inst.window + 1, allow_early=early_ok, in_model=True)
    consider(choice, rc, set(), at, early)
    choice, rc, pg, early = greedy_plan(inst, budget, min(10.0, 0.1 * time_limit_s), early_ok, give_up=True)
    consider(choice, rc, pg, {p: inst.tau[p] for p in rc}, early)
    if found:
        return [w for _ms, _k, w in sorted(found, key=lambda f: f[:2])]
    left = max(0.5, time_limit_s - (time.perf_counter() - t0))
    restricted = _restricted_warm(inst, budget, backend, RESTRICTED_SHARE * left, threads, early_ok)
    choice, rc, at, early = chen_plan(inst, budget, allow_early=early_ok)
    consider(choice, rc, set(), at, early)
    return restricted + [w for _ms, _k, w in found]


RESTRICTED_SHARE = 0.3   # of the time left: the restricted solve that seeds the ILP when no baseline fits


def plain_choice(inst: Instance) -> list[tuple[str, str]]:
    """Per op its fastest plain option (batch-norm backward ops coupled): each op placed where it runs fastest,
    no in-place, fused or workspace-heavy variant."""
    from port.solver.baselines import _coupled
    out = []
    for opts in inst.options:
        o = min([o for o in opts if o.var == "plain"] or opts, key=lambda o: (o.ms, o.acc, o.var))
        out.append((o.acc, o.var))
    return _coupled(inst, out)


def lp_choice(inst: Instance, m: Model, v: Vars) -> tuple[list[tuple[str, str]], tuple[int, ...]] | None:
    """A restriction of the model guided by its LP relaxation (None when the LP has no solution): per op the
    option the LP weights most, made consistent (in-place and fused variants only where the LP picks them
    whole: they keep tensors from being dropped, so a rounded-up one can leave no plan; a fused chain fused on
    its conv's accelerator or not at all; of two conflicting in-place ops, the one the LP favours less runs
    its best other option; batch-norm backward ops coupled), and the re-run steps r[P,t] that neither the LP
    nor the LP with that choice uses (to be kept off). The restricted solve on it is near the optimum in about
    a second where the fastest plain options are far from it (ResNet-18 b32 at 50% on jetson-orin-nano:
    275.8 ms in 0.8 s, against 385.5 ms in 13 s; the optimum is 269.8 ms)."""
    from port.plan.variants import inplace_conflicts
    from port.solver.backends import solve_lp
    from port.solver.baselines import _coupled
    val = solve_lp(m)
    if val is None:
        return None

    def best(i: int, ok=lambda o: True) -> int:
        ks = [k for k, o in enumerate(inst.options[i]) if ok(o)] or list(range(len(inst.options[i])))
        return max(ks, key=lambda k: (val[v.x[i, k]], -inst.options[i][k].ms))

    # in-place and fused variants keep their tensors from being dropped: chosen only where the LP is sure
    sure = lambda i, kind: sum(val[v.x[i, k]] for k, o in enumerate(inst.options[i]) if o.var == kind) > 1 - 1e-6  # noqa: E731
    pick = [best(i, lambda o, i=i: o.var not in ("inplace", "fused") or sure(i, o.var)) for i in range(len(inst.options))]
    in_chain = set()
    for conv, chain in inst.chains.items():
        in_chain.update(chain)
        oc = inst.options[conv][pick[conv]]
        for j in chain[1:]:
            if oc.var == "fused":
                pick[j] = best(j, lambda o: o.acc == oc.acc and o.var == "fused")
            elif inst.options[j][pick[j]].var == "fused":
                pick[j] = best(j, lambda o: o.var != "fused")
    for i in range(len(pick)):
        if i not in in_chain and inst.options[i][pick[i]].var == "fused":
            pick[i] = best(i, lambda o: o.var != "fused")
    ipl = lambda i: sum(val[v.x[i, k]] for k, o in enumerate(inst.options[i]) if o.var == "inplace")  # noqa: E731
    for a, b in inplace_conflicts(inst.graph):
        if inst.options[a][pick[a]].var == "inplace" and inst.options[b][pick[b]].var == "inplace":
            w = a if ipl(a) < ipl(b) else b
            pick[w] = best(w, lambda o: o.var != "inplace")
    choice = _coupled(inst, [(inst.options[i][k].acc, inst.options[i][k].var) for i, k in enumerate(pick)])
    fixed = solve_lp(m, dict.fromkeys(_other_options(inst, v, choice), 0.0))
    off = () if fixed is None else tuple(j for j in v.rt.values() if val[j] <= 1e-6 and fixed[j] <= 1e-6)
    return choice, off


def _other_options(inst: Instance, v: Vars, choice) -> list[int]:
    """The option columns (x, and rcx of re-runs) of every option other than ``choice``'s, op by op."""
    return [j for d in (v.x, v.rcx) for (i, k), j in d.items()
            if (inst.options[i][k].acc, inst.options[i][k].var) != tuple(choice[i])]


def _restricted_warm(inst: Instance, budget: int, backend: str, time_limit_s: float, threads,
                     early_ok: bool) -> list:
    """A warm start when neither greedy nor Chen fits: the model with every op's placement and variant fixed
    leaves only keep/re-run/page/early decisions, which the solver finds a plan for in seconds where the full
    model may find none in a minute (MobileNetV2 at 25% on jetson-orin-nano). Tried in turn: the LP-guided
    choice with the re-run steps its LP leaves unused kept off (``lp_choice``; half the time), the same
    choice with every step, each op's fastest plain option, plain on the first accelerator. Its plan is a
    solution of the full model."""
    from port.solver.baselines import single_choice
    t0 = time.perf_counter()
    unit = 1 if backend == "cpsat" else KiB
    m, v = build(inst, budget, mem_unit=unit, allow_early=early_ok, max_reruns=1)
    lp = lp_choice(inst, m, v)
    cands = ([lp, (lp[0], ())] if lp is not None else []) + [(plain_choice(inst), ())]
    try:
        cands.append((single_choice(inst, inst.accs[0]), ()))
    except PortError:
        pass
    for k, (choice, off) in enumerate(cands):
        if (choice, off) in cands[:k]:
            continue
        left = time_limit_s - (time.perf_counter() - t0)
        if left < 0.2:
            break
        sub = dataclasses.replace(m, lb=list(m.lb), ub=list(m.ub))
        for j in _other_options(inst, v, choice) + list(off):
            sub.ub[j] = 0.0
        res = BACKENDS[backend](sub, left if k == len(cands) - 1 else 0.5 * left, 0.01, threads=threads)
        if res.values is not None:
            choice, rc, pg, at, early = _extract(inst, v, res.values)
            plan = _tidy(inst, _plan(inst, choice, budget, rc, pg, at=at, early=early))
            if simulate(plan, inst.graph, inst.profile).peak_bytes <= budget:
                return [_warm_of(inst, plan)]
    return []


OBJECTIVES = ("auto", "serial", "makespan")
SERIAL_SHARE = 0.3      # of the time limit: the serial solve whose plan starts a makespan solve
DESCENT_SHARE = 0.2     # of the time limit: the greedy descent from that plan (_offload_descent)


def _offload_descent(inst: Instance, plan: Plan, budget: int, time_limit_s: float) -> Plan:
    """Greedy descent on the simulated makespan from ``plan``: one op at a time (or a weight's gradient ops with
    its update) moves to another of its options on an engine that overlaps the host's (an OpenCL queue beside the
    C kernels), and a move that shortens the makespan within the budget (and the engines' caps) is kept; a move
    over the budget by the bytes the queue holds (rule 8) is tried with one explicit join more (Plan.joins, at the
    model's candidate steps). Rounds until one moves nothing or the time is spent. The makespan model's big-M
    clocks leave its bound weak and, started from the serial optimum (every op on the fastest engine), it rarely
    finds in its time the plans where several weight gradients run beside the host's backward; this plan starts
    it there, so the solve ends no slower than it."""
    from port.solver.baselines import own_within_caps
    from port.solver.formulation import join_candidates, queued_accs
    from port.verify.simulate import overlapping_accelerators
    over = overlapping_accelerators(inst.accs, inst.profile)
    if not over:
        return plan
    g = inst.graph
    prods = g.producers()
    queued = queued_accs(inst)
    cands = join_candidates(inst)
    moves: list[dict[int, tuple[str, str]]] = []     # the few group moves first: a short descent tries them
    for u, (_p, _pu, gs) in sorted(inst.early.items()):     # a gradient's producers and the update that reads it
        group = sorted({prods[gr] for gr in gs} | {u})
        for a in over:
            mv = {}
            for i in group:
                o = next((o for o in inst.options[i] if o.acc == a and o.var == "plain"), None)
                if o is not None:
                    mv[i] = (o.acc, o.var)
            if len(mv) == len(group) > 1:
                moves.append(mv)
    for i, opts in enumerate(inst.options):
        moves += [{i: (o.acc, o.var)} for o in opts if o.acc in over]
    t_end = time.perf_counter() + time_limit_s

    def trial(cand: Plan):
        try:
            sim = simulate(cand, g, inst.profile)
        except PortError:
            return None
        return sim.breakdown["makespan_ms"], sim.peak_bytes <= budget and own_within_caps(sim, inst.profile)

    best = simulate(plan, g, inst.profile).breakdown["makespan_ms"]
    moved = True
    while moved and time.perf_counter() < t_end:
        moved = False
        for mv in moves:
            if any("fused" in (plan.ops[i].variant, var) for i, (_a, var) in mv.items()) or all(
                    (plan.ops[i].accelerator, plan.ops[i].variant) == c for i, c in mv.items()):
                continue
            if time.perf_counter() >= t_end:
                return plan
            ops = list(plan.ops)
            for i, (a, var) in mv.items():
                ops[i] = dataclasses.replace(ops[i], accelerator=a, variant=var)
            cand = dataclasses.replace(plan, ops=tuple(ops))
            r = trial(cand)
            if r is None or r[0] >= best - 1e-6:
                continue
            if r[1]:
                plan, best, moved = cand, r[0], True
                continue
            for a in sorted(queued & {c[0] for c in mv.values()}):     # over the budget: one join more
                for c in cands:
                    if (a, c) in cand.joins or time.perf_counter() >= t_end:
                        continue
                    cj = dataclasses.replace(cand, joins=tuple(sorted(cand.joins + ((a, c),),
                                                                      key=lambda e: (e[1], e[0]))))
                    rj = trial(cj)
                    if rj is not None and rj[1] and rj[0] < best - 1e-6:
                        plan, best, moved = cj, rj[0], True
    return plan


def _with_objective(inst: Instance, name: str) -> Instance:
    """``inst`` with its objective named (solve_ilp's ``objective``; "auto" resolved)."""
    if name not in OBJECTIVES:
        raise PortError(f"objective={name!r}: give one of {', '.join(OBJECTIVES)}")
    if name == "auto":
        from port.verify.simulate import overlapping_accelerators
        name = "makespan" if inst.ownmem is None and overlapping_accelerators(inst.accs, inst.profile) else "serial"
    elif name == "makespan" and inst.ownmem is not None:
        raise PortError("objective='makespan': not modelled with an engine on its own memory (its copies); "
                        "use 'serial' or 'auto'")
    return dataclasses.replace(inst, objective=name)


def _verified_warm(inst, warm: list, budget: int, backend: str, t0: float):
    """The fastest of the warm starts ``warm`` (the serial optimum, the descent's plan, the baselines) that
    ``finish`` finds within the budget and the own-memory caps, with the instance's objective (the makespan or the
    serial step, plus the early-update tie-breaker), or None."""
    from port.solver.budget import arena_bytes
    from port.solver.formulation import EPS_EARLY_MS
    found = []
    for choice, rc, pg, at, early, joins in warm:
        p = finish(inst, dataclasses.replace(_plan(inst, choice, budget, rc, pg, at=at, early=early), joins=joins),
                   budget, backend, t0)
        if p.status != "feasible":
            continue
        obj = (simulate(p, inst.graph, inst.profile).breakdown["makespan_ms"] if inst.objective == "makespan"
               else p.predicted_step_ms)
        found.append((obj, len(found), dataclasses.replace(p, objective_ms=obj + EPS_EARLY_MS * len(p.early_updates))))
    for _obj, _k, p in sorted(found):
        # its arena too (port.solver.fit_arena): ResNet-18 b8 split's descent plan at 100% (a join holding the
        # queue's bytes) simulated within the budget and packed 233,472 B above it, and the solve failed there
        held = arena_bytes(inst.graph, inst.profile, p)
        if held is None or held <= budget:
            return p
    return None


def solve_ilp(graph, profile, budget_bytes: int, time_limit_s: float = 30.0, gap: float = 0.01,
              backend: str = "highs", warm_start: bool = True, threads: int | None = None,
              allow_early_updates: bool = True, window: int = DEFAULT_WINDOW,
              max_reruns: int = DEFAULT_MAX_RERUNS, objective: str = "auto", joins: bool | None = None,
              **_kw) -> Plan:
    """Two phases (solver/FORMULATION.md, "Phases"): the single-level model (each dropped op re-run once, at
    or before its first backward reader) first; when the budget is below its reach and ``max_reruns`` > 1,
    the multi-level model (an op re-run up to ``max_reruns`` times, re-run copies held and dropped again).
    ``objective``: "serial" (the sum of the step's event times, ``simulate``'s step_ms), "makespan" (the engines
    overlapped, ``simulate``'s breakdown["makespan_ms"]; solver/FORMULATION.md, "Overlap") or "auto" (makespan
    where the profile has an engine that overlaps the host's and none with its own memory, else serial).
    ``joins``: the model may place explicit joins of queued engines (Plan.joins; solver/FORMULATION.md); None: with
    the makespan objective only (the serial model with their variables finds its plans slower)."""
    t0 = time.perf_counter()
    budget = int(budget_bytes)
    early_ok = bool(allow_early_updates)
    if not isinstance(max_reruns, int) or max_reruns < 1:
        raise PortError(f"max_reruns={max_reruns!r}: give 1 or more (how often one op may be re-run)")
    inst = _with_objective(build_instance(graph, profile, window=window, nested=False, prune=True), objective)
    joins = inst.objective == "makespan" if joins is None else bool(joins)
    inst = dataclasses.replace(inst, joins=joins)
    if budget < inst.static_bytes - (inst.grad_bytes if early_ok else 0) - inst.state_bytes:
        raise _infeasible(inst, budget, backend, threads, early_ok, max_reruns)
    warm = _baseline_warm(inst, budget, time_limit_s, early_ok, backend, threads) if warm_start else []
    if inst.objective == "makespan" and warm_start:
        # the big-M clocks leave the LP bound weak: the serial model's optimum (solved in a share of the time) is
        # a plan of the same feasible set and starts the makespan search, so it ends no slower than that plan
        try:
            # (without joins: a smaller model finds its plan sooner; the descent below adds joins where they pay)
            ser = solve_ilp(graph, profile, budget, time_limit_s * SERIAL_SHARE, gap, backend, True, threads,
                            early_ok, window, max_reruns, objective="serial", joins=False)
            desc = _offload_descent(inst, ser, budget, time_limit_s * DESCENT_SHARE)
            warm = ([_warm_of(inst, desc)] if desc is not ser else []) + [_warm_of(inst, ser)] + warm
        except PortError:
            pass
    remaining = max(0.5, time_limit_s - _reserve_s(time_limit_s) - (time.perf_counter() - t0))
    res, v, m = _run(inst, budget, backend, remaining, gap, warm, threads, early_ok, 1, improve=True)
    flat_infeasible = res.status == "infeasible"
    if res.values is None and max_reruns > 1 and res.status in ("infeasible", "timeout"):
        # below the single-level model's reach (or no plan in time): the multi-level model
        inst = dataclasses.replace(_with_objective(build_instance(graph, profile, window=window, nested=True,
                                                                  prune=True), objective), joins=joins)
        remaining = max(0.5, time_limit_s - _reserve_s(time_limit_s) - (time.perf_counter() - t0))
        res, v, m = _run(inst, budget, backend, remaining, gap, warm, threads, early_ok, max_reruns, improve=True)
    if res.status == "infeasible":
        raise _infeasible(inst, budget, backend, threads, early_ok, max_reruns)
    if res.values is None:
        if warm:  # time limit before the solver reported anything: the warm start stands
            choice, rc, pg, at, early, joins = warm[0]
            p = finish(inst, dataclasses.replace(_plan(inst, choice, budget, rc, pg, at=at, early=early), joins=joins),
                       budget, backend, t0)
            return dataclasses.replace(p, status="timeout", gap=float("nan"), objective_ms=p.predicted_step_ms)
        if not (res.status == "timeout" and flat_infeasible):
            if res.status == "timeout":
                raise SolverError(f"{backend} found no plan within {time_limit_s:.1f} s and neither greedy nor "
                                  f"Chen fits the budget; raise --time-limit or the budget")
            raise SolverError(f"{backend} failed (status {res.status})")
        # below the single-level model's reach and no multi-level plan in time: the minimum-peak search either
        # finds a plan within the budget or names the smallest budget it reaches
        found = min_feasible_budget(inst, backend, threads=threads, allow_early_updates=early_ok,
                                    max_reruns=max_reruns, target_bytes=budget)
        if found[0] is None or found[0] > budget:
            raise _infeasible(inst, budget, backend, threads, early_ok, max_reruns, found=found)
        # a plan of least memory: it starts the budgeted multi-level solve (the time limit once more, the search
        # having run past it), which trades the memory left over for time
        res, v, m = _run(inst, budget, backend, max(0.5, time_limit_s - _reserve_s(time_limit_s)), gap,
                         [_warm_of(inst, found[1])], threads, early_ok, max_reruns, improve=True)
        if res.values is None:
            p = finish(inst, found[1], budget, backend, t0)
            return dataclasses.replace(p, status="timeout", gap=float("nan"), objective_ms=p.predicted_step_ms)
    choice, rc, pg, at, early = _extract(inst, v, res.values)
    full = _with_joins(_plan(inst, choice, budget, rc, pg, at=at, early=early), v, res.values)
    plan = _tidy(inst, full)       # a solution within the gap may carry a re-run nobody reads
    sim = simulate(plan, graph, profile)
    if sim.peak_bytes > budget and warm and queued_engines(plan):
        # rule 8's held bytes: the memory rows bound them (formulation._queue_holds; early updates' gradients
        # held since eq[u,g]: ResNet-8 b4 50% with OpenCL simulated 2.39 MB against 2.13 MB before). A safety net:
        # never return a plan over the budget; the best warm start within it stands, with a warning
        fb = _verified_warm(inst, warm, budget, backend, t0)
        if fb is not None:
            import warnings
            warnings.warn(f"{backend}: the ILP's plan simulates to {sim.peak_bytes} B over the budget {budget} B "
                          f"(queued engines' held bytes, formulation/simulator mismatch); returning the best warm "
                          f"start within it ({fb.predicted_peak_bytes} B)", RuntimeWarning, stacklevel=2)
            return fb
    if sim.peak_bytes > budget:
        raise SolverError(f"{backend} returned a plan with simulated peak {sim.peak_bytes} B over the budget "
                          f"{budget} B (formulation/simulator mismatch)")
    from port.solver.baselines import own_within_caps
    if not own_within_caps(sim, profile):
        raise SolverError(f"{backend} returned a plan whose own-memory peaks {sim.breakdown['own_memory_peaks']} "
                          f"exceed the engine's cap {dict(profile.accelerator_caps)} (formulation/simulator mismatch)")
    obj = res.objective
    from port.solver.formulation import EPS_EARLY_MS
    expect = obj - EPS_EARLY_MS * len(plan.early_updates)     # the objective's tie-breaker is not time
    expect += sim.breakdown.get("overhead_ms", 0.0)           # the executor's fixed per-step cost: not a decision
    # HiGHS reports the objective of a solution whose integers are feasible within its tolerance (1e-6): a few
    # hundred binaries at 0.999999 move a ~100 ms objective by ~1e-4 ms; 1e-5 relative still flags any real
    # mismatch (one op's time, ~1e-2 ms and up)
    tol = 1e-5 * max(1.0, abs(obj)) + 1e-9
    step = sim.breakdown["makespan_ms"] if inst.objective == "makespan" else sim.step_ms
    if inst.objective == "makespan" and plan.paged:
        # a page call joins every lane in the model as in the simulator (solver/FORMULATION.md, "Overlap"); the
        # check stays one-sided there: the simulated makespan never above the objective
        if step > expect + tol:
            raise SolverError(f"{backend}: simulated makespan {step:.6f} ms above the ILP objective "
                              f"{expect:.6f} ms (formulation/simulator mismatch; please report)")
    elif plan != full:                      # the dropped re-runs' time is priced by the ILP, not run
        if step > expect + tol:
            raise SolverError(f"{backend}: simulated step {step:.6f} ms above the ILP objective "
                              f"{expect:.6f} ms (formulation/simulator mismatch; please report)")
    elif abs(step - expect) > tol:   # both directions: the ILP may neither under- nor over-price a plan
        raise SolverError(f"{backend}: simulated step {step:.6f} ms differs from the ILP objective "
                          f"{expect:.6f} ms (formulation/simulator mismatch; please report)")
    if inst.objective == "makespan" and warm:
        # the memory rows bound rule 8's held bytes from above, so a warm start the simulator keeps within the
        # budget (the descent's plan with its joins) may lie outside the model and be lost to the solver: the
        # solve ends no slower than the best of them. Also where the solver's plan queues nothing: ResNet-18 b8 split's
        # descent found a two-engine plan at 212.2 ms in 4 s of a 20-s solve, the model kept only the serial
        # optimum (225.9, every op on the C kernels) and that came back
        fb = _verified_warm(inst, warm, budget, backend, t0)
        if fb is not None and fb.objective_ms < step + EPS_EARLY_MS * len(plan.early_updates) - tol:
            return fb
    return dataclasses.replace(plan, solver=backend, status=res.status, objective_ms=float(obj), gap=float(res.gap),
                               solve_time_s=time.perf_counter() - t0, predicted_step_ms=sim.step_ms,
                               predicted_peak_bytes=sim.peak_bytes, memory_timeline=sim.timeline)
