"""Baselines with the solvers' signature: single-accelerator plain keep-everything, greedy
fastest-feasible, Chen's sqrt(n) checkpointing. All are scored by port.verify.simulate; a baseline that does not
fit the budget returns a Plan with status "infeasible" (it proves nothing, so gap is NaN)."""
from __future__ import annotations

import dataclasses
import math
import time

from port.errors import PlanError
from port.verify.simulate import simulate
from port.plan.types import OpDecision, Plan
from port.solver.instance import Instance, build_instance


def _coupled(inst: Instance, choice: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A batch norm's backward ops follow its in-place choice (port.plan.semantics.coupled_variants): pick
    their fastest option of the matching kind, on the same accelerator when it has one; when a backward op has
    no in-place option, the batch norm gives up its in-place variant."""
    from port.plan.semantics import coupled_variants
    choice = list(choice)
    for f, b in coupled_variants(inst.graph):
        want = choice[f][1] == "inplace"
        if (choice[b][1] == "inplace") == want:
            continue
        opts = [o for o in inst.options[b] if (o.var == "inplace") == want]
        if not opts and want:
            o = min((o for o in inst.options[f] if o.var != "inplace"), key=lambda o: (o.ms, o.acc, o.var))
            choice[f] = (o.acc, o.var)
            opts = [o for o in inst.options[b] if o.var != "inplace"]
        o = min(opts, key=lambda o: (o.acc != choice[b][0], o.ms, o.acc, o.var))
        choice[b] = (o.acc, o.var)
    return choice


def _plan(inst: Instance, choice: list[tuple[str, str]], budget: int, rc_ops=(), pg=(), solver="baseline",
          t0: float | None = None, at: dict[int, int] | None = None, early=()) -> Plan:
    """at: re-run step (or steps) per recomputed op (explicit ``recompute_at``); None: the legacy tau rule."""
    choice = _coupled(inst, choice)
    rec = tuple(sorted(t for p in rc_ops for t in inst.rc_outputs[p]))
    steps = lambda x: (x,) if isinstance(x, int) else tuple(x)   # noqa: E731
    rat = tuple(sorted(((p, t) for p in rc_ops for t in steps(at[p])), key=lambda x: (x[1], x[0]))) \
        if at is not None else ()
    return Plan(graph_digest=inst.graph.digest(), profile_digest=inst.profile.digest(), budget_bytes=int(budget),
                ops=tuple(OpDecision(i, a, v) for i, (a, v) in enumerate(choice)), recompute=rec,
                recompute_at=rat, paged=tuple(sorted(pg)), early_updates=tuple(sorted(early)), solver=solver,
                batch_size=inst.graph.batch_size, own_memory=inst.profile.own_memory)


def own_within_caps(sim, profile) -> bool:
    """Each own memory's simulated peak within its engine's cap (Profile.accelerator_caps)."""
    caps = dict(profile.accelerator_caps)
    return all(nb <= caps.get(m, nb) for m, nb in sim.breakdown.get("own_memory_peaks", {}).items())


def finish(inst: Instance, plan: Plan, budget: int, solver: str, t0: float) -> Plan:
    sim = simulate(plan, inst.graph, inst.profile)
    ok = sim.peak_bytes <= budget and own_within_caps(sim, inst.profile)
    return dataclasses.replace(plan, budget_bytes=int(budget), solver=solver,
                               status="feasible" if ok else "infeasible", objective_ms=sim.step_ms, gap=float("nan"),
                               solve_time_s=time.perf_counter() - t0, predicted_step_ms=sim.step_ms,
                               predicted_peak_bytes=sim.peak_bytes, memory_timeline=sim.timeline)


def single_choice(inst: Instance, acc: str) -> list[tuple[str, str]]:
    out = []
    for i, opts in enumerate(inst.options):
        o = [x for x in opts if x.acc == acc and x.var == "plain"]
        if not o:
            raise PlanError(f"single:{acc}: op {inst.graph.ops[i].name!r} has no plain variant on {acc!r}")
        out.append((acc, "plain"))
    return out


def fastest_choice(inst: Instance) -> list[tuple[str, str]]:
    g = inst.graph
    choice: list[tuple[str, str] | None] = [None] * len(g.ops)
    best = lambda i, ok: min((o for o in inst.options[i] if ok(o)), key=lambda o: (o.ms, o.acc, o.var))
    for conv, chain in sorted(inst.chains.items()):
        unf = [best(i, lambda o: o.var != "fused") for i in chain]
        cost_unf = sum(o.ms for o in unf)
        fused = None
        for a in inst.accs:
            opts = [[o for o in inst.options[i] if o.var == "fused" and o.acc == a] for i in chain]
            if all(opts):
                c = sum(x[0].ms for x in opts)
                if fused is None or c < fused[0]:
                    fused = (c, a)
        if fused is not None and fused[0] < cost_unf:
            for i in chain:
                choice[i] = (fused[1], "fused")
    for i in range(len(g.ops)):
        if choice[i] is None:
            o = best(i, lambda o: o.var != "fused")
            choice[i] = (o.acc, o.var)
    from port.plan import variants as V
    for a, b in V.inplace_conflicts(g):
        if choice[a][1] == "inplace" and choice[b][1] == "inplace":
            o = best(b, lambda o: o.var not in ("fused", "inplace"))
            choice[b] = (o.acc, o.var)
    return choice  # type: ignore[return-value]


def _try(inst: Instance, choice, budget, rc, pg, at=None, early=()):
    try:
        return simulate(_plan(inst, choice, budget, rc, pg, at=at, early=early), inst.graph, inst.profile)
    except PlanError:
        return None


def greedy_plan(inst: Instance, budget: int, time_limit_s: float = 60.0,
                allow_early: bool = True, give_up: bool = False) -> tuple[list, set, set, set]:
    """Fastest option per op; over budget: every legal early update first (free in time), then drop saved
    tensors (page or recompute at the legacy time tau) or page optimizer state, in order of bytes saved per ms
    added, keeping each
    drop that the simulator accepts and that lowers the peak. In-place choices on tensors that get dropped
    are reverted to their best non-in-place option. ``give_up``: stop as soon as the candidates left cannot
    bring the peak within the budget (a warm start needs a plan that fits; the baseline itself returns its
    lowest peak). Returns (choice, recomputed ops, paged roots, early)."""
    t_end = time.perf_counter() + time_limit_s
    choice = fastest_choice(inst)
    rc: set[int] = set()
    pg: set[int] = set()
    early: set[int] = set()
    sim = _try(inst, choice, budget, rc, pg)
    if sim is None or sim.peak_bytes <= budget:
        return choice, rc, pg, early
    if allow_early and inst.early:
        s2 = _try(inst, choice, budget, rc, pg, early=set(inst.early))
        if s2 is not None and s2.peak_bytes < sim.peak_bytes:
            early, sim = set(inst.early), s2
            if sim.peak_bytes <= budget:
                return choice, rc, pg, early
    cands = []
    for p in inst.tau:
        b = sum(inst.roots[r].bytes for r in inst.rc_outputs[p] if inst.roots[r].bwd_first is not None)
        ms = min(o.ms for o in inst.options[p] if o.var not in ("inplace", "fused"))
        if b > 0:
            cands.append((b / max(ms, 1e-6), "rc", p))
    for r in inst.page_roots:
        cands.append((inst.roots[r].bytes / max(inst.page_ms[r], 1e-6), "pg", r))
    state_bytes = {r: inst.graph.tensors[r].bytes for r in inst.state_pages}
    for r, (_u, ms) in inst.state_pages.items():      # optimizer state: paged around its update
        cands.append((state_bytes[r] / max(ms, 1e-6), "ps", r))
    cands.sort(key=lambda c: (-c[0], c[1], c[2]))
    # a drop lowers the memory of any step by at most its bytes, so once the bytes of the candidates left are
    # below peak - budget no more drops can fit the budget (ResNet-18 b32 at 50%: greedy ends ~20% over)
    left = [0] * (len(cands) + 1)
    for j in range(len(cands) - 1, -1, -1):
        kind, k = cands[j][1:]
        left[j] = left[j + 1] + (inst.roots[k].bytes if kind == "pg" else state_bytes[k] if kind == "ps" else sum(
            inst.roots[r].bytes for r in inst.rc_outputs[k] if inst.roots[r].bwd_first is not None))
    peak = sim.peak_bytes
    for j, (_score, kind, k) in enumerate(cands):
        if peak <= budget or (give_up and peak - budget > left[j]) or time.perf_counter() > t_end:
            break
        trial = list(choice)
        if kind == "rc":
            nrc, npg = rc | {k}, pg
            if trial[k][1] in ("inplace", "fused"):
                continue
        else:
            nrc, npg = rc, pg | {k}
        s = _try(inst, trial, budget, nrc, npg, early=early)
        if s is None:
            # undo in-place ops that share the dropped storage, then retry once
            for q, (x, y) in inst.inplace_ops.items():
                hit = (kind == "pg" and k in (x, y)) or (kind == "rc" and (x in inst.rc_outputs[k] or y in inst.rc_outputs[k]))
                if trial[q][1] == "inplace" and hit:
                    o = min((o for o in inst.options[q] if o.var not in ("inplace", "fused")), key=lambda o: o.ms)
                    trial[q] = (o.acc, o.var)
            s = _try(inst, trial, budget, nrc, npg, early=early)
        if s is not None and s.peak_bytes < peak:
            choice, rc, pg, peak = trial, nrc, npg, s.peak_bytes
    return choice, rc, pg, early


def solve_single(graph, profile, budget_bytes, time_limit_s: float = 30.0, gap: float = 0.01,
                 accelerator: str | None = None, **_kw) -> Plan:
    t0 = time.perf_counter()
    inst = build_instance(graph, profile)
    acc = accelerator or profile.accelerators[0]
    return finish(inst, _plan(inst, single_choice(inst, acc), budget_bytes), budget_bytes, f"single:{acc}", t0)


def solve_greedy(graph, profile, budget_bytes, time_limit_s: float = 30.0, gap: float = 0.01, **_kw) -> Plan:
    t0 = time.perf_counter()
    inst = build_instance(graph, profile)
    choice, rc, pg, early = greedy_plan(inst, budget_bytes, time_limit_s, _kw.get("allow_early_updates", True))
    return finish(inst, _plan(inst, choice, budget_bytes, rc, pg, early=early), budget_bytes, "greedy", t0)


def chen_plan(inst: Instance, budget: int, segments: int | None = None, allow_early: bool = False,
              in_model: bool = False):
    """Chen et al. 2016 sqrt(n) checkpointing with real segment recompute: the forward ops are cut into
    ~sqrt(n) segments; the last op of each segment keeps its outputs (checkpoint), every other recomputable
    op of the segment drops them, and the whole segment is re-run at once, in op order, right before the
    first backward op that reads any of its outputs (explicit ``recompute_at``). Ops whose inputs would not
    be available then (e.g. a residual input dropped in another segment) stay kept. Variants: fastest
    non-fused, non-in-place option per op. ``in_model``: re-run each segment at the latest step before that
    one which every member's candidate steps C(P) hold, members the model cannot re-run there kept (a plan
    the ILP can express: its warm start; not simulated segment by segment, so the caller simulates it).
    Returns (choice, rc ops, at, early)."""
    g = inst.graph
    choice = fastest_choice(inst)
    for i, (a, var) in enumerate(choice):
        if var in ("inplace", "fused"):
            o = min((o for o in inst.options[i] if o.var not in ("inplace", "fused")), key=lambda o: o.ms)
            choice[i] = (o.acc, o.var)
    fwd = [o.id for o in g.ops if o.phase == "forward"]
    k = segments or max(1, int(math.ceil(math.sqrt(len(fwd)))))
    early = set(inst.early) if allow_early else set()
    rc: set[int] = set()
    at: dict[int, int] = {}
    for s0 in range(0, len(fwd), k):
        seg = [oid for oid in fwd[s0:s0 + k - 1] if oid in inst.rc_times]   # last op: checkpoint
        while seg:
            owns = [inst.own[p] for p in seg if inst.own[p] is not None]
            if not owns:
                break
            t = min(owns)
            if in_model:
                common = set.intersection(*(set(inst.rc_times[p]) for p in seg))
                if not any(s <= t for s in common):
                    seg = seg[:-1]
                    continue
                t = max(s for s in common if s <= t)
                bad = _outside_model(inst, seg, t, rc, at)
                if bad:
                    seg = [p for p in seg if p not in bad]
                    continue
            trial_at = dict(at)
            trial_at.update({p: t for p in seg})
            if in_model:      # sound by construction in the model; the caller simulates the whole plan once
                rc |= set(seg)
                at = trial_at
                break
            try:
                simulate(_plan(inst, choice, budget, rc | set(seg), (), at=trial_at, early=early), g, inst.profile)
            except PlanError:
                seg = seg[:-1]      # shorten the segment from its end until it is sound
                continue
            rc |= set(seg)
            at = trial_at
            break
    return choice, rc, at, early


def _outside_model(inst: Instance, seg: list[int], t: int, rc: set[int], at: dict[int, int]) -> set[int]:
    """Members of a segment re-run at t whose re-run the single-level ILP cannot express: an input that is a
    pure intermediate not re-run in the same group, or a dropped output whose producer re-runs after t (the
    plan semantics would hold its forward copy into backward; the model does not)."""
    bad = set()
    for q in seg:
        for kind, u, p in inst.rc_in.get(q, ()):
            same = p in seg
            if kind == "pure" and not same:
                bad.add(q)
            elif kind == "saved" and p in rc and not same and at[p] > t:
                bad.add(q)
    return bad


def solve_chen(graph, profile, budget_bytes, time_limit_s: float = 30.0, gap: float = 0.01, **_kw) -> Plan:
    """Chen's sqrt(n) checkpointing (see chen_plan), regardless of the budget."""
    t0 = time.perf_counter()
    inst = build_instance(graph, profile)
    choice, rc, at, early = chen_plan(inst, budget_bytes, allow_early=False)
    return finish(inst, _plan(inst, choice, budget_bytes, rc, (), at=at, early=early), budget_bytes, "chen", t0)
