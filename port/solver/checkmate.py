"""Checkmate (Jain et al., MLSys 2020) as a baseline with the solvers' signature: the T x T rematerialization
MILP over the training graph, solved by HiGHS with a time limit. It is the optimality reference for the
recompute part of PORT's ILP, in the *matched memory model* (``matched_profile``): one accelerator, plain
variants, no workspace, no early updates, no paging.

Stages follow the graph order: stage t computes op t, preceded by re-runs of recomputable forward ops
(``R[t,p]``) in op order. The model is Checkmate's, written on PORT's storage roots instead of one value per
node (an op may own several roots with different lives; views belong to their root), and restricted to what a
PORT plan can express: re-runs of recomputable forward ops (``port.plan.semantics.recompute_times``) at
backward steps. Within that space any op may be re-run any number of times, and re-run copies may be dropped
and re-run again (multi-level recompute). Variables (all binary except U):

* ``R[t,p]``   re-run forward op p before op t (t a backward step, p recomputable, its outputs used at >= t);
* ``S[t,r]``   root r is held entering stage t (birth_r < t <= the last step anything may read r);
* ``F[t,r,k]`` root r may be freed after node k of stage t (k reads or writes r): only if k runs, r is not
  held into stage t+1 and no later node of stage t reads it (the upper bounds of Checkmate's FREE
  linearisation; freeing never costs, so the optimum frees whenever it may);
* ``U[t,k]``   bytes of dynamic memory after node k of stage t (before its frees).

Rows: ``dep[t,k,r]``: R[t,k] <= S[t,r] + R[t,prod r] (op t: 1 <= ...); ``hold[t,r]``: S[t+1,r] <= S[t,r] +
R[t,prod r] (1 when prod r = t); ``mem[t,k]``: the running sum U; ``free_*``: the bounds on F above;
``cap[t,k]``: U[t,k] + workspace_k <= B - S.
Objective: sum of re-run latencies (the ops themselves are a constant). The solution becomes a PORT plan with
``recompute_at`` = {(p, t): R[t,p] = 1} (re-runs nothing reads are dropped: ``drop_idle_reruns``); the simulator then prices it
under PORT's semantics, where every copy lives only to its last use (never longer than in the MILP).

Lower bounds: ``working_set_bound`` (static + the largest op's working set) and ``window_bound``, the least
peak of the same MILP over a window of backward stages with three relaxations (any root born before the
window may be held entering it, any op owning a root may be re-run, roots below a size are free), solved to
optimality by HiGHS: every schedule in Checkmate's space (graph order, any re-runs at backward steps) peaks
at least that high, so a plan that reaches it is optimal.
"""
from __future__ import annotations

import dataclasses
import math
import time

from port.cost.types import Profile
from port.errors import PlanError
from port.ir.types import PHASE_BACKWARD
from port.plan import semantics as SEM
from port.plan.types import OpDecision, Plan
from port.solver.formulation import KiB, Model


def matched_profile(profile: Profile, accelerator: str | None = None) -> Profile:
    """``profile`` restricted to the matched memory model: plain entries on one accelerator (default: the
    first), no workspace or allocations outside the arena, no engine footprint, no hand-offs, no storage (no
    paging)."""
    acc = accelerator or profile.accelerators[0]
    if acc not in profile.accelerators:
        raise PlanError(f"accelerator {acc!r} is not in profile {profile.device!r} ({', '.join(profile.accelerators)})")
    one = profile.only((acc,))
    ents = tuple(dataclasses.replace(e, workspace_bytes=0, peak_delta_bytes=0) for e in one.entries
                 if e.variant == "plain")
    return dataclasses.replace(one, entries=ents, handoff=(), storage=(), accelerator_caps=(), engine_bytes=(),
                               _index={})


def working_set_bound(graph, profile: Profile, accelerator: str | None = None) -> tuple[int, str]:
    """A lower bound on any plan's peak with plain variants on one accelerator: static bytes + the largest
    single op's working set (its non-static input and output roots + workspace). Returns (bytes, op name)."""
    acc = accelerator or profile.accelerators[0]
    roots = SEM.activation_roots(graph)
    best, name = 0, ""
    for o in graph.ops:
        rs = {graph.storage_root(t) for t in o.inputs + o.outputs} & set(roots)
        c = profile.lookup(graph.signature(o), acc, "plain")
        b = sum(roots[r].bytes for r in rs) + (c.extra_bytes if c is not None else 0)
        if b > best:
            best, name = b, o.name
    return SEM.static_bytes(graph) + best, name


@dataclasses.dataclass
class CheckmateModel:
    model: Model
    R: dict            # (t, p) -> var
    static_bytes: int
    num_binaries: int


def build(graph, profile: Profile, accelerator: str, budget_bytes: int | None, unit: int = KiB,
          stages: tuple[int, int] | None = None, rerun_any: bool = False, min_root_bytes: int = 0) -> CheckmateModel:
    """The MILP of the module docstring at ``budget_bytes``. ``budget_bytes=None``: no budget; instead a
    variable ``P`` (bytes / unit above static memory) bounds every ``U`` and is minimised (the least peak).
    ``stages=(a, b)``: only stages a..b, with any root born before a free to be held entering stage a (what a
    full schedule holds there is one choice), and ``rerun_any``: any op that owns a root may be re-run at a
    backward step, not only recomputable forward ops (Checkmate's own space); ``min_root_bytes``: smaller roots
    are free (no bytes, always readable). All three only relax the model, so a least peak proven for such a
    window is a lower bound on every full schedule's peak (``window_bound``)."""
    g = graph
    n = len(g.ops)
    a, b = stages if stages is not None else (0, n - 1)
    cost, ws = [], []
    for o in g.ops:
        c = profile.lookup(g.signature(o), accelerator, "plain")
        if c is None:
            raise PlanError(f"checkmate: op {o.name!r} has no plain entry on {accelerator!r} in the profile")
        cost.append(c.latency_ms)
        ws.append(c.extra_bytes)
    roots = {r: R_ for r, R_ in SEM.activation_roots(g).items() if R_.bytes >= min_root_bytes}
    S0 = SEM.static_bytes(g)
    root_of = g.storage_root
    ins = [sorted({root_of(t) for t in o.inputs} & set(roots)) for o in g.ops]
    outs = [sorted({t for t in o.outputs if t in roots and roots[t].birth == o.id}) for o in g.ops]
    prod = {r: R_.birth for r, R_ in roots.items()}
    rc = {p for p in SEM.recompute_times(g) if outs[p]}
    if rerun_any:
        rc |= {o.id for o in g.ops if outs[o.id] and o.phase != "update"}
    bwd = [t for t in range(a, b + 1) if SEM.is_backward(g, t)]
    readers = SEM.readers_by_root(g, skip=lambda t: SEM.is_static(g, t))
    # need[r]: the last step anything may read r (a re-run of a recomputable reader extends it)
    need_op: dict[int, int] = {}
    need: dict[int, int] = {}
    for o in reversed(g.ops):
        for r in outs[o.id]:
            last = roots[r].death
            for q in readers.get(r, ()):
                if q in need_op:
                    last = max(last, need_op[q])
            need[r] = last
        if o.id in rc:
            need_op[o.id] = max((need[r] for r in outs[o.id]), default=o.id)
    for r in roots:
        need.setdefault(r, roots[r].death)
    m = Model(mem_unit=unit)
    Rv: dict[tuple[int, int], int] = {}
    for t in bwd:
        for p in sorted(rc):
            if p < t <= need_op[p]:
                Rv[t, p] = m.var(f"R[{t},{p}]")
    Sv: dict[tuple[int, int], int] = {}
    for r, R_ in roots.items():
        for t in range(max(R_.birth + 1, a), min(need[r], b) + 1):
            Sv[t, r] = m.var(f"S[{t},{r}]")
    loss = SEM.loss_root(g)           # held to the end of the step (port.plan.semantics), never dropped
    for (t, r), v in Sv.items():
        if r == loss:
            m.row(f"keep[{t},{r}]", {v: 1.0}, lo=1.0)

    def run(t: int, k: int):      # (var or None, constant)
        return (None, 1.0) if k == t else ((Rv[t, k], 0.0) if (t, k) in Rv else (None, 0.0))

    peak = None
    if budget_bytes is None:
        cap = float(sum(R_.bytes for R_ in roots.values()) + max(ws, default=0)) / unit
        peak = m.var("P", 0.0, cap, integer=False)
    else:
        cap = (budget_bytes - S0) / unit
    for t in range(a, b + 1):
        ks = [p for p in sorted(rc) if (t, p) in Rv] + [t]
        # dependencies: a node runs only when each root it reads is held or re-run earlier in the stage
        for k in ks:
            rv, rconst = run(t, k)
            for r in ins[k]:
                row: dict[int, float] = {}
                if (t, r) in Sv:
                    row[Sv[t, r]] = 1.0
                if (t, prod[r]) in Rv and prod[r] < k:
                    row[Rv[t, prod[r]]] = 1.0
                if rv is not None:
                    row[rv] = -1.0
                    lo = 0.0
                else:
                    lo = rconst
                    if not row:
                        raise PlanError(f"checkmate: op {g.ops[k].name!r} can never read {g.tensors[r].name!r}")
                m.row(f"dep[{t},{k},{r}]", row, lo=lo)
        # holding into stage t+1
        for r in roots:
            if (t + 1, r) not in Sv:
                continue
            row = {Sv[t + 1, r]: 1.0}
            hi = 0.0
            if (t, r) in Sv:
                row[Sv[t, r]] = -1.0
            pv, pconst = run(t, prod[r])
            if pv is not None:
                row[pv] = -1.0
            hi += pconst
            m.row(f"hold[{t},{r}]", row, hi=hi)
        # memory: U[t,k] after node k, frees F[t,r,k]
        held = {Sv[t, r]: roots[r].bytes / unit for r in roots if (t, r) in Sv}
        prev_u, prev_free = None, {}
        for j, k in enumerate(ks):
            u = m.var(f"U[{t},{k}]", 0.0, max(cap, 0.0), integer=False)
            row = {u: 1.0}
            mk = sum(roots[r].bytes for r in outs[k]) / unit
            rv, rconst = run(t, k)
            const = rconst * mk
            if rv is not None:
                row[rv] = -mk
            if prev_u is None:
                for var, b in held.items():
                    row[var] = row.get(var, 0.0) - b
            else:
                row[prev_u] = -1.0
                for var, b in prev_free.items():
                    row[var] = row.get(var, 0.0) + b
            m.row(f"mem[{t},{k}]", row, const, const)
            if peak is not None:
                crow = {u: 1.0, peak: -1.0}
                if rv is not None:
                    crow[rv] = ws[k] / unit
                m.row(f"peak[{t},{k}]", crow, hi=0.0 if rv is not None else -ws[k] / unit)
            elif ws[k]:
                crow = {u: 1.0}
                if rv is not None:
                    crow[rv] = ws[k] / unit
                    m.row(f"cap[{t},{k}]", crow, hi=cap)
                else:
                    m.row(f"cap[{t},{k}]", crow, hi=cap - ws[k] / unit)
            # frees after node k
            prev_free = {}
            for r in sorted(set(ins[k]) | set(outs[k])):
                later = [q for q in ks[j + 1:] if r in ins[q]]
                if t in later:
                    continue                       # op t reads r after k: never freed here
                f = m.var(f"F[{t},{r},{k}]")
                if rv is not None:
                    m.row(f"free_run[{t},{r},{k}]", {f: 1.0, rv: -1.0}, hi=0.0)
                if (t + 1, r) in Sv:
                    m.row(f"free_held[{t},{r},{k}]", {f: 1.0, Sv[t + 1, r]: 1.0}, hi=1.0)
                for q in later:
                    m.row(f"free_later[{t},{r},{k},{q}]", {f: 1.0, Rv[t, q]: 1.0}, hi=1.0)
                # r is freed at most once per stage: by the last node that reads it (the rows above)
                prev_free[f] = roots[r].bytes / unit
            prev_u = u
    m.obj = {peak: 1.0} if peak is not None else {v: cost[p] for (t, p), v in Rv.items()}
    nb = sum(1 for x in m.integer if x)
    return CheckmateModel(m, Rv, S0, nb)


def solve_checkmate(graph, profile, budget_bytes, time_limit_s: float = 30.0, gap: float = 0.01,
                    accelerator: str | None = None, threads: int | None = None, **_kw) -> Plan:
    """Checkmate's MILP (module docstring) on ``accelerator`` (default: the profile's first) with plain
    variants; status/gap are HiGHS's. No solution within the time limit: the keep-everything plan with status
    "timeout" (or "infeasible" when HiGHS proves none exists), objective NaN."""
    from port.solver.backends import BACKENDS
    from port.solver.baselines import finish
    from port.solver.instance import build_instance
    t0 = time.perf_counter()
    acc = accelerator or profile.accelerators[0]
    cm = build(graph, profile, acc, int(budget_bytes))
    res = BACKENDS["highs"](cm.model, max(0.5, time_limit_s - (time.perf_counter() - t0)), gap, start=None,
                            threads=threads)
    ops = tuple(OpDecision(o.id, acc, "plain") for o in graph.ops)
    at: list[tuple[int, int]] = []
    if res.values is not None:
        at = sorted(((p, t) for (t, p), v in cm.R.items() if res.values[v] > 0.5), key=lambda x: (x[1], x[0]))
    rcops = sorted({p for p, _t in at})
    rec = tuple(sorted(r for p in rcops for r in SEM.owned_activation_outputs(graph, p)))
    plan = Plan(graph_digest=graph.digest(), profile_digest=profile.digest(), budget_bytes=int(budget_bytes),
                ops=ops, recompute=rec, recompute_at=tuple(at), solver="checkmate", batch_size=graph.batch_size)
    plan = SEM.drop_idle_reruns(graph, plan)
    inst = build_instance(graph, profile)
    out = finish(inst, plan, int(budget_bytes), "checkmate", t0)
    if res.values is None:     # keep-everything stands in: "timeout" when it fits, else "infeasible"
        bad = res.status == "infeasible" or out.status == "infeasible"
        return dataclasses.replace(out, status="infeasible" if bad else "timeout", objective_ms=float("nan"),
                                   gap=float("nan"))
    status = res.status if out.status == "feasible" else "infeasible"
    gap_step = 0.0 if res.status == "optimal" else float("nan")
    if res.status != "optimal" and res.bound is not None and res.objective is not None:   # relative to the step
        total = res.objective + sum(profile.lookup(graph.signature(o), acc, "plain").latency_ms for o in graph.ops)
        gap_step = max(0.0, (res.objective - res.bound) / max(total, 1e-12))
    return dataclasses.replace(out, status=status, gap=gap_step)


@dataclasses.dataclass(frozen=True)
class WindowBound:
    """A proven lower bound on the peak of every schedule of the graph in Checkmate's space (plain variants,
    one accelerator, the graph's order, any op re-run any number of times at backward steps, at most once per
    stage): static bytes + HiGHS's dual bound on the least peak over stages ``first_stage..last_stage`` of the
    relaxed model (``build(stages=..., rerun_any=True, min_root_bytes=...)``). ``best_bytes``: the least
    peak of a relaxed window schedule HiGHS found (equal to the bound when ``status`` is "optimal")."""
    bound_bytes: int
    best_bytes: int | None
    status: str
    first_stage: int
    last_stage: int
    min_root_bytes: int
    solve_s: float


def block_window(graph, profile: Profile, accelerator: str | None = None) -> tuple[int, int]:
    """The backward steps of the module block around the op with the largest working set
    (``working_set_bound``): from the first to the last backward op named ``<block>.*``, where ``<block>``
    is that op's name less its last two parts (``layer1.1`` for ``layer1.1.bn2.grad_input``); ops 6 either
    side when the name has no such prefix."""
    name = working_set_bound(graph, profile, accelerator)[1]
    at = next(o.id for o in graph.ops if o.name == name)
    parts = name.split(".")
    if len(parts) > 2:
        pre = ".".join(parts[:-2]) + "."
        ids = [o.id for o in graph.ops if o.phase == PHASE_BACKWARD and o.name.startswith(pre)]
        if ids:
            return min(ids), max(ids)
    return max(0, at - 6), min(len(graph.ops) - 1, at + 6)


def window_bound(graph, profile: Profile, stages: tuple[int, int] | None = None, time_limit_s: float = 60.0,
                 min_root_bytes: int | None = None, accelerator: str | None = None,
                 threads: int | None = None) -> WindowBound:
    """The least peak over a window of stages (default ``block_window``), relaxed as in ``build`` so that it
    bounds every full schedule from below; roots smaller than ``min_root_bytes`` (default: the largest
    activation root's size) are free, which keeps the MILP small. It tightens ``working_set_bound`` by
    what the ops around the largest working set must hold beside it."""
    from port.solver.backends import BACKENDS
    acc = accelerator or profile.accelerators[0]
    a, b = stages if stages is not None else block_window(graph, profile, acc)
    if min_root_bytes is None:
        min_root_bytes = max((r.bytes for r in SEM.activation_roots(graph).values()), default=0)
    cm = build(graph, profile, acc, None, stages=(a, b), rerun_any=True, min_root_bytes=min_root_bytes)
    res = BACKENDS["highs"](cm.model, time_limit_s, 0.0, start=None, threads=threads)
    unit = cm.model.mem_unit
    lo = res.bound if res.bound is not None else 0.0
    bound = cm.static_bytes + max(0, int(math.floor(lo * unit + 1e-6)))
    best = cm.static_bytes + int(math.ceil(res.objective * unit - 1e-6)) if res.objective is not None else None
    return WindowBound(bound, best, res.status, a, b, min_root_bytes, res.solve_time_s)
