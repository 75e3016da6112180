"""The ILP of solver/FORMULATION.md, one function per constraint family, every constraint named.

The model is built into a small solver-neutral ``Model`` (variables, named rows, objective) that the
backends in ``port.solver.backends`` hand to HiGHS, CBC, SCIP or CP-SAT. Size is linear in the graph: no
T x T matrices; memory at step t is a running sum L_t = L_{t-1} + (births at t) - (deaths after t-1).
Chain recompute adds r[P,t] for t in C(P) (|C(P)| <= K+2) with cumulative sums, early updates one binary
e[u] per update op: O(n K) variables and non-zeros.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from port.plan.semantics import stored_bytes
from port.solver.instance import Instance

KiB = 1024
EPS_EARLY_MS = 1e-6   # objective cost of one early update: ties go to late updates (tidy plans)


@dataclass
class Model:
    names: list[str] = field(default_factory=list)
    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    rows: list[tuple[str, dict[int, float], float, float]] = field(default_factory=list)
    obj: dict[int, float] = field(default_factory=dict)
    sense_min: bool = True
    mem_unit: int = KiB
    index: dict[str, int] = field(default_factory=dict)

    def var(self, name: str, lb: float = 0.0, ub: float = 1.0, integer: bool = True) -> int:
        i = len(self.names)
        self.names.append(name)
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(integer)
        self.index[name] = i
        return i

    def row(self, name: str, terms: dict[int, float], lo: float = -float("inf"), hi: float = float("inf")) -> None:
        t = {k: v for k, v in terms.items() if v != 0}
        self.rows.append((name, t, lo, hi))

    @property
    def num_vars(self) -> int:
        return len(self.names)


def _add(d: dict[int, float], k: int, v: float) -> None:
    d[k] = d.get(k, 0.0) + v


@dataclass
class Vars:
    x: dict[tuple[int, int], int] = field(default_factory=dict)      # (op, option index)
    rcx: dict[tuple[int, int], int] = field(default_factory=dict)    # (candidate, option index)
    pg: dict[int, int] = field(default_factory=dict)                 # root -> var
    L: list[int] = field(default_factory=list)                       # live bytes at step t
    peak: int | None = None
    rc_of: dict[int, list[int]] = field(default_factory=dict)        # candidate -> its rcx vars
    rt: dict[tuple[int, int], int] = field(default_factory=dict)     # (candidate, step t) -> r[P,t]
    st: dict[tuple[int, int], int] = field(default_factory=dict)     # (output root r, step t) -> h[r,t]: held past t
    en: dict[tuple[int, int], int] = field(default_factory=dict)     # (output root r, step e) -> z[r,e]: held copy ends
    cov: dict[tuple[int, int], int] = field(default_factory=dict)    # (output root r, point s) -> cover(r,s), continuous
    cov_pts: dict[int, list[int]] = field(default_factory=dict)      # output root -> its cover points
    rcx_more: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (level j >= 2, candidate, option)
    rc_more: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # candidate -> [(level, var)]
    e: dict[int, int] = field(default_factory=dict)                  # update op -> e[u]
    # (update op, gradient root) -> ef[u,g] = e[u] AND its producer's chain fused (continuous, >= their sum - 1):
    # the gradient of an early update is born at the chain's call op when a fused call computes it (SE's se.grad_weight)
    ef: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)   # -> (var, call op)
    # (update op, gradient root) -> eq[u,g] = e[u] AND an op touching g on a queued engine (continuous, >= their
    # sum - 1): the early gradient's bytes stay the queue's past their free (rule 8, _queue_holds)
    eq: dict[tuple[int, int], int] = field(default_factory=dict)
    jn: dict[tuple[str, int], int] = field(default_factory=dict)     # (queued acc, step) -> jn[a,t]: a join there
    # (op, queued acc, candidate step) -> rel[i,a,c] <= jn[a,c], sum_c rel <= x_a[i]: the join at c ends the holds
    # of the roots op i touched (continuous; _queue_holds)
    rel: dict[tuple[int, str, int], int] = field(default_factory=dict)
    # (update op, gradient root, candidate step c >= p_u) -> releq <= jn[a,c], sum_c releq <= eq[u,g]: a join after
    # every op that may touch the early gradient ends its hold (one queued engine a only)
    releq: dict[tuple[int, int, int], int] = field(default_factory=dict)
    ps: dict[int, int] = field(default_factory=dict)                 # optimizer-state root -> ps[r]: paged
    # optimizer-state root whose update may run early -> pse[r] = ps[r] AND e[u] (continuous, exact at integer
    # points): paged in and out around p_u instead of u
    pse: dict[int, int] = field(default_factory=dict)
    static_fixed: int = 0                          # S minus early-able gradient and pageable optimizer-state bytes
    eng: dict[str, int] = field(default_factory=dict)                # accelerator -> u[a]: its engine is used
    eng_bytes: dict[str, int] = field(default_factory=dict)          # accelerator -> its engine's footprint
    defs: dict[int, int] = field(default_factory=dict)               # L[t] / A[t,P] -> index of its defining row
    caps: list[int] = field(default_factory=list)                    # indices of the memory-cap rows
    expanded: dict[int, tuple[dict[int, float], float]] = field(default_factory=dict)   # expand_memory's memo


def _sanitize(s: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in s)


def acc_expr(inst: Instance, v: Vars, i: int, acc: str) -> dict[int, float]:
    return {v.x[i, k]: 1.0 for k, o in enumerate(inst.options[i]) if o.acc == acc}


def var_expr(inst: Instance, v: Vars, i: int, var: str, acc: str | None = None) -> dict[int, float]:
    return {v.x[i, k]: 1.0 for k, o in enumerate(inst.options[i]) if o.var == var and (acc is None or o.acc == acc)}


def rc_expr(v: Vars, p: int) -> dict[int, float]:
    return {j: 1.0 for j in v.rc_of.get(p, ())}


def rc_level_expr(v: Vars, p: int, level: int) -> dict[int, float]:
    """The level-th re-run of P happens (level 1: rc_P)."""
    if level == 1:
        return rc_expr(v, p)
    return {j: 1.0 for (lv, q, _k), j in v.rcx_more.items() if q == p and lv == level}


def cover_points(inst: Instance, r: int) -> list[int]:
    """The steps at which cover(r, .) has its own variable: C(P) U E(r) U backward readers of r."""
    return sorted(set(inst.rc_times[inst.roots[r].birth]) | set(inst.rc_ends[r]) | set(inst.rc_cover[r]))


def cover_expr(inst: Instance, v: Vars, r: int, s: int) -> dict[int, float]:
    """cover(r,s) = sum_{t in C(P), t <= s} h[r,t] - sum_{e in E(r), e < s} z[r,e]: a held re-run copy of
    output root r (of candidate P) is live at step s (0 or 1). A running sum: one continuous cov[r,s] per cover
    point (rc_cov rows), so every use is one term (linear size)."""
    if not inst.nested:   # single-level: a saved root's one re-run copy lives to its death, a pure one in its group
        return {v.st[r, t]: 1.0 for t in inst.rc_times[inst.roots[r].birth] if t <= s and (r, t) in v.st}
    if (r, s) in v.cov:
        return {v.cov[r, s]: 1.0}
    pts = v.cov_pts[r]
    i = bisect.bisect_right(pts, s) - 1
    if i < 0:
        return {}
    q = pts[i]
    out = {v.cov[r, q]: 1.0}
    if (r, q) in v.en:
        out[v.en[r, q]] = -1.0
    return out


def avail_expr(inst: Instance, v: Vars, r: int, s: int) -> dict[int, float]:
    """A copy of root r exists during the re-run group of step s: a held copy, or a re-run of its producer P
    at s itself (r[P,s] - h[r,s]: re-run for the group only)."""
    out = cover_expr(inst, v, r, s)
    p = inst.roots[r].birth
    if (p, s) in v.rt:
        _add(out, v.rt[p, s], 1.0)
        if (r, s) in v.st:
            _add(out, v.st[r, s], -1.0)
    return {k: c for k, c in out.items() if c != 0}


# ---------------------------------------------------------------------------------------------
# variables
# ---------------------------------------------------------------------------------------------
def add_variables(m: Model, inst: Instance, budget_bytes: int | None, allow_early: bool = True,
                  max_reruns: int = 1) -> Vars:
    v = Vars()
    g = inst.graph
    for i, opts in enumerate(inst.options):
        for k, o in enumerate(opts):
            v.x[i, k] = m.var(f"x[{_sanitize(g.ops[i].name)},{o.acc},{o.var}]")
    for p in sorted(inst.rc_times):
        for k, o in enumerate(inst.options[p]):
            if o.var not in ("inplace", "fused"):
                v.rcx[p, k] = m.var(f"rc[{_sanitize(g.ops[p].name)},{o.acc},{o.var}]")
                v.rc_of.setdefault(p, []).append(v.rcx[p, k])
        for lv in range(2, max_reruns + 1):
            for k, o in enumerate(inst.options[p]):
                if o.var not in ("inplace", "fused"):
                    j = m.var(f"rc{lv}[{_sanitize(g.ops[p].name)},{o.acc},{o.var}]")
                    v.rcx_more[lv, p, k] = j
                    v.rc_more.setdefault(p, []).append((lv, j))
        for t in inst.rc_times[p]:
            v.rt[p, t] = m.var(f"r[{_sanitize(g.ops[p].name)},{t}]")
            for r in inst.rc_outputs[p]:
                if inst.nested:
                    v.st[r, t] = m.var(f"h[{_sanitize(g.tensors[r].name)},{t}]")
                elif inst.roots[r].bwd_first is not None:
                    v.st[r, t] = v.rt[p, t]      # single-level: a saved root's re-run copy is held (to its death)
        for r in inst.rc_outputs[p] if inst.nested else ():
            for e in inst.rc_ends[r]:
                v.en[r, e] = m.var(f"z[{_sanitize(g.tensors[r].name)},{e}]")
            v.cov_pts[r] = cover_points(inst, r)
            for q in v.cov_pts[r]:
                v.cov[r, q] = m.var(f"cov[{_sanitize(g.tensors[r].name)},{q}]", 0.0, 1.0, integer=False)
    for r in inst.page_roots:
        v.pg[r] = m.var(f"pg[{_sanitize(g.tensors[r].name)}]")
    if allow_early:
        for u in sorted(inst.early):
            v.e[u] = m.var(f"e[{_sanitize(g.ops[u].name)}]")
        from port.plan import variants as V
        prods = g.producers()
        for u in sorted(inst.early):
            for gr in inst.early[u][2]:
                ch = V.chain_of(g, g.ops[prods[gr]])
                if ch is None or ch.ops[0] not in inst.chains or ch.call_of(prods[gr]) >= prods[gr]:
                    continue
                w = m.var(f"ef[{_sanitize(g.ops[u].name)},{gr}]", 0.0, 1.0, integer=False)
                v.ef[u, gr] = (w, ch.call_of(prods[gr]))
                terms = {w: 1.0, v.e[u]: -1.0}
                for kk, val in var_expr(inst, v, ch.ops[0], "fused").items():
                    _add(terms, kk, -val)
                m.row(f"ef[{u},{gr}]", terms, -1.0)
        _early_queue_vars(m, inst, v)
    for r, (u, _ms) in sorted(inst.state_pages.items()):
        j = v.ps[r] = m.var(f"ps[{_sanitize(g.tensors[r].name)}]")
        if u in v.e:
            w = v.pse[r] = m.var(f"pse[{_sanitize(g.tensors[r].name)}]", 0.0, 1.0, integer=False)
            m.row(f"pse_lo[{r}]", {w: 1.0, j: -1.0, v.e[u]: -1.0}, lo=-1.0)
            m.row(f"pse_ps[{r}]", {w: 1.0, j: -1.0}, hi=0.0)
            m.row(f"pse_e[{r}]", {w: 1.0, v.e[u]: -1.0}, hi=0.0)
    _join_vars(m, inst, v)
    v.static_fixed = inst.static_bytes - (inst.grad_bytes if allow_early else 0) - inst.state_bytes
    for a in inst.accs:     # u[a] in [0, 1], pushed to 1 by any op placed on a (engine rows), in every memory row
        nb = inst.profile.engine_bytes_of(a)
        if nb > 0 and any(o.acc == a for opts in inst.options for o in opts):
            v.eng[a] = m.var(f"u[{_sanitize(a)}]", 0.0, 1.0, integer=False)
            v.eng_bytes[a] = nb
    cap = float("inf") if budget_bytes is None else max(0.0, (budget_bytes - v.static_fixed) / m.mem_unit)
    for t in range(len(g.ops)):
        v.L.append(m.var(f"L[{t}]", 0.0, cap, integer=False))
    if budget_bytes is None:
        v.peak = m.var("peak", 0.0, float("inf"), integer=False)
    return v


# ---------------------------------------------------------------------------------------------
# constraint families
# ---------------------------------------------------------------------------------------------
def c_assign(m: Model, inst: Instance, v: Vars) -> None:
    """assign[i]: every op runs on exactly one (accelerator, variant) of its profiled options."""
    for i, opts in enumerate(inst.options):
        m.row(f"assign[{i}]", {v.x[i, k]: 1.0 for k in range(len(opts))}, 1.0, 1.0)


def c_engine(m: Model, inst: Instance, v: Vars) -> None:
    """engine[i,a]: X[i,a] <= u[a]: an op on accelerator a brings a's engine footprint (paid once, in every
    memory row; port.plan.semantics.engine_bytes)."""
    for a, j in v.eng.items():
        for i in range(len(inst.options)):
            t = acc_expr(inst, v, i, a)
            if t:
                t[j] = -1.0
                m.row(f"engine[{i},{_sanitize(a)}]", t, hi=0.0)


def c_fusion(m: Model, inst: Instance, v: Vars) -> None:
    """fuse[c,j,a]: a fusable chain (port.plan.variants.FUSIONS: conv, bn, act; ...) runs fused on accelerator a
    all together or not at all."""
    for conv, chain in inst.chains.items():
        for j in chain[1:]:
            for a in inst.accs:
                t = var_expr(inst, v, conv, "fused", a)
                for kk, val in var_expr(inst, v, j, "fused", a).items():
                    _add(t, kk, -val)
                if t:
                    m.row(f"fuse[{conv},{j},{a}]", t, 0.0, 0.0)
    # members whose chain cannot fuse: never fused
    for i, opts in enumerate(inst.options):
        if any(o.var == "fused" for o in opts):
            if not any(i in ch for ch in inst.chains.values()):
                m.row(f"fuse_none[{i}]", var_expr(inst, v, i, "fused"), 0.0, 0.0)


def c_inplace_conflict(m: Model, inst: Instance, v: Vars) -> None:
    """inplace_conflict[a,b]: port.plan.variants.inplace_conflicts pairs never both run inplace."""
    from port.plan import variants as V
    for a, b in V.inplace_conflicts(inst.graph):
        t = var_expr(inst, v, a, "inplace")
        t.update(var_expr(inst, v, b, "inplace"))
        if t:
            m.row(f"inplace_conflict[{a},{b}]", t, hi=1.0)


def c_coupled(m: Model, inst: Instance, v: Vars) -> None:
    """coupled[f,b]: a batch norm's backward op runs from the output (variant inplace) exactly when the batch
    norm runs in place (port.plan.semantics.coupled_variants)."""
    from port.plan.semantics import coupled_variants
    for f, b in coupled_variants(inst.graph):
        t = var_expr(inst, v, f, "inplace")
        for kk, val in var_expr(inst, v, b, "inplace").items():
            _add(t, kk, -val)
        if t:
            m.row(f"coupled[{f},{b}]", t, 0.0, 0.0)


def c_recompute_choice(m: Model, inst: Instance, v: Vars) -> None:
    """rc_sel[P,k]: rc[P,k] <= x[P,k] (P is recomputed with the option it runs with; rc_P = sum_k rc[P,k]);
    rc_more[j,P,k]: rc_j[P,k] <= rc_{j-1}[P,k] (a j-th re-run, same option); rc_time[P]: sum_t r[P,t] =
    rc_P + sum_j rc_j (one step per re-run). Per output root r of P: held[r,t]: h[r,t] <= r[P,t] (the re-run
    copy of r is held past its group); rc_ends[r]: sum_t h[r,t] = sum_e z[r,e] (every held copy ends);
    rc_one[r,s]: cover(r,s) + r[P,s] - h[r,s] <= 1 (copies never overlap); rc_end[r,e]: cover(r,e) >= z[r,e]
    (a copy ends only while live); rc_cover[r,s]: cover(r,s) >= rc_P at every backward reader s of r."""
    for (p, k), j in v.rcx.items():
        m.row(f"rc_sel[{p},{k}]", {j: 1.0, v.x[p, k]: -1.0}, hi=0.0)
    for (lv, p, k), j in v.rcx_more.items():
        prev = v.rcx[p, k] if lv == 2 else v.rcx_more[lv - 1, p, k]
        m.row(f"rc_more[{lv},{p},{k}]", {j: 1.0, prev: -1.0}, hi=0.0)
    readers_of: dict[int, list[int]] = {}     # output root -> recomputable ops reading it
    for q, ins in inst.rc_in.items():
        for _k, u, _pu in ins:
            readers_of.setdefault(u, []).append(q)
    for p, ts in sorted(inst.rc_times.items()):
        row = rc_expr(v, p)
        for _lv, j in v.rc_more.get(p, ()):
            row[j] = 1.0
        for t in ts:
            row[v.rt[p, t]] = -1.0
        m.row(f"rc_time[{p}]", row, 0.0, 0.0)
        for r in inst.rc_outputs[p] if inst.nested else ():   # single-level: rc_time implies these
            prev = None
            for q in v.cov_pts[r]:      # rc_cov[r,q]: cov[r,q] = cov[r,q-] + h[r,q] - z[r,q-]
                row = {v.cov[r, q]: 1.0}
                if (r, q) in v.st:
                    row[v.st[r, q]] = -1.0
                if prev is not None:
                    row[v.cov[r, prev]] = -1.0
                    if (r, prev) in v.en:
                        row[v.en[r, prev]] = 1.0
                m.row(f"rc_cov[{r},{q}]", row, 0.0, 0.0)
                prev = q
            row = {}
            for t in ts:
                m.row(f"held[{r},{t}]", {v.st[r, t]: 1.0, v.rt[p, t]: -1.0}, hi=0.0)
                row[v.st[r, t]] = 1.0
            for e in inst.rc_ends[r]:
                _add(row, v.en[r, e], -1.0)
            m.row(f"rc_ends[{r}]", row, 0.0, 0.0)
            for s in sorted(set(ts) | set(inst.rc_ends[r]) | set(inst.rc_cover[r])):
                a = avail_expr(inst, v, r, s)
                if a:
                    m.row(f"rc_one[{r},{s}]", a, hi=1.0)
            cov_set = set(inst.rc_cover[r])
            for e in inst.rc_ends[r]:
                row = cover_expr(inst, v, r, e)
                _add(row, v.en[r, e], -1.0)
                m.row(f"rc_end[{r},{e}]", {k: c for k, c in row.items() if c}, lo=0.0)
                if e not in cov_set:     # rc_end_use[r,e]: a copy ends only at a use (no idle tail: no symmetry)
                    row = {v.en[r, e]: 1.0}
                    for q in readers_of.get(r, ()):
                        if (q, e) in v.rt:
                            row[v.rt[q, e]] = -1.0
                    m.row(f"rc_end_use[{r},{e}]", row, hi=0.0)
            for s in inst.rc_cover[r]:
                row = cover_expr(inst, v, r, s)
                for kk, val in rc_expr(v, p).items():
                    _add(row, kk, -val)
                m.row(f"rc_cover[{r},{s}]", {k: c for k, c in row.items() if c}, lo=0.0)


def _drop_terms(inst: Instance, v: Vars, r: int) -> dict[int, float]:
    t: dict[int, float] = {}
    if r in v.pg:
        _add(t, v.pg[r], 1.0)
    p = inst.roots[r].birth
    if p in inst.rc_times and r in inst.rc_outputs[p]:
        for kk, val in rc_expr(v, p).items():
            _add(t, kk, val)
    return t


def c_recompute_inputs(m: Model, inst: Instance, v: Vars) -> None:
    """Soundness of recompute, for every candidate Q, activation input root u (producer P) and t in C(Q):
    rc_avail[Q,u,t]: r[Q,t] + rc_P - avail(P,t) <= 1 for a saved u whose producer is a candidate (when P is
      dropped, a copy of u exists in the group of step t: held, or re-run at t before Q, as P < Q); a kept u
      is live at t because t <= d_u (filter of C(Q));
    rc_avail_iv[Q,u,t] (single-level: each op re-run at most once, its copy held to its death): the interval
      form sum_{t' <= t} r[Q,t'] + sum_{t' > t} r[P,t'] <= 1, a re-run of Q at or before t excludes P's
      re-run after t. Implied for integers, it keeps the LP from spreading Q's re-run over several steps
      against P's (ResNet-18 b32 at 50% on jetson-orin-nano: LP bound 230.0 -> 240.9 ms). Added beside
      rc_avail, not instead: without those rows HiGHS found no plan for MobileNetV2 at 25% in 15 s;
    rc_pure[Q,u,t]: r[Q,t] <= avail(P,t) for a pure intermediate u (only re-run copies exist after forward);
    rc_paged[Q,u]: sum_{t in C(Q), t < beta_u} r[Q,t] + pg[u] <= 1 (a paged u is back only from beta_u);
    rc_overwrite[Q,I]: rc_Q + x[I,inplace] <= 1 when an in-place op I after u's producer overwrites u."""
    g = inst.graph
    for q, ins in sorted(inst.rc_in.items()):
        ts = inst.rc_times[q]
        for kind, u, p in ins:
            if kind == "pure":
                for t in ts:
                    row = {v.rt[q, t]: 1.0}
                    for kk, val in avail_expr(inst, v, u, t).items():
                        _add(row, kk, -val)
                    m.row(f"rc_pure[{q},{u},{t}]", row, hi=0.0)
                continue
            if p in inst.rc_times and u in inst.rc_outputs[p]:
                for t in ts:
                    row = rc_expr(v, p)
                    _add(row, v.rt[q, t], 1.0)
                    for kk, val in avail_expr(inst, v, u, t).items():
                        _add(row, kk, -val)
                    m.row(f"rc_avail[{q},{u},{t}]", {k: c for k, c in row.items() if c}, hi=1.0)
                    if not inst.nested and ts[0] < t:
                        # interval form: Q re-run by t excludes P re-run after t (rc_P - avail = the latter)
                        row = {v.rt[q, t2]: 1.0 for t2 in ts if t2 <= t}
                        for t1 in inst.rc_times[p]:
                            if t1 > t:
                                _add(row, v.rt[p, t1], 1.0)
                        m.row(f"rc_avail_iv[{q},{u},{t}]", row, hi=1.0)
            if u in v.pg:
                bf = inst.roots[u].bwd_first
                row = {v.rt[q, t]: 1.0 for t in ts if t < bf}
                if row:
                    row[v.pg[u]] = 1.0
                    m.row(f"rc_paged[{q},{u}]", row, hi=1.0)
        rc = rc_expr(v, q)
        for u in dict.fromkeys(g.ops[q].inputs):
            if u not in g.producers() or g.storage_root(u) not in inst.roots:
                continue
            ru = g.storage_root(u)
            for i, x, _y, var in inst.inplace_items():
                if x == ru and i != q and i > inst.roots[ru].birth:
                    t = dict(rc)
                    t.update(var_expr(inst, v, i, var))
                    m.row(f"rc_overwrite[{q},{i}]", t, hi=1.0)


def c_early(m: Model, inst: Instance, v: Vars) -> None:
    """eu_rc[u,F,t]: e[u] + r[F,t] <= 1 when a recompute of F reading u's parameter would run after p_u."""
    g = inst.graph
    for u, j in sorted(v.e.items()):
        param, pu, _gs = inst.early[u]
        for f, ts in sorted(inst.rc_times.items()):
            if any(g.storage_root(x) == param for x in g.ops[f].inputs):
                for t in ts:
                    if t > pu:
                        m.row(f"eu_rc[{u},{f},{t}]", {j: 1.0, v.rt[f, t]: 1.0}, hi=1.0)


def c_drop_exclusive(m: Model, inst: Instance, v: Vars) -> None:
    """drop_once[r]: a root is paged or recomputed, not both; drop_fused[r,c]: the bn output of a fused
    chain is not materialised, so it cannot be dropped; drop_inplace[r,Q]: roots shared by an in-place op
    are kept (neither paged nor recomputed)."""
    for r in inst.roots:
        t = _drop_terms(inst, v, r)
        if len(t) > 1:
            m.row(f"drop_once[{r}]", t, hi=1.0)
    for r, conv in sorted(inst.nonmat.items()):   # a never-materialised bn output cannot be paged
        t = _drop_terms(inst, v, r)
        if t:
            t.update(var_expr(inst, v, conv, "fused"))
            m.row(f"drop_fused[{r},{conv}]", t, hi=1.0)
    for q, x, y, var in inst.inplace_items():
        inp = var_expr(inst, v, q, var)
        for r in (x, y):
            t = _drop_terms(inst, v, r)
            if t:
                t.update(inp)
                m.row(f"drop_inplace[{r},{q}]", t, hi=1.0)


def _memory_deltas(inst: Instance, v: Vars, unit: int):
    """Per step t: delta terms (var -> coef), delta constant, and the births/rc terms at t."""
    n = len(inst.graph.ops)
    dvar = [dict() for _ in range(n + 1)]
    dcon = [0.0] * (n + 1)
    bvar = [dict() for _ in range(n + 1)]   # op-births at t (for the recompute-group rows)
    bcon = [0.0] * (n + 1)
    rcv = [dict() for _ in range(n + 1)]    # rc persistent restores at t
    for r, R in inst.roots.items():
        b = R.bytes / unit
        dcon[R.birth] += b
        bcon[R.birth] += b
        dcon[R.death + 1] -= b
        if r in inst.nonmat:  # fused chain: the bn output is never materialised
            conv = inst.nonmat[r]
            for kk in var_expr(inst, v, conv, "fused"):
                _add(dvar[R.birth], kk, -b)
                _add(bvar[R.birth], kk, -b)
                _add(dvar[R.death + 1], kk, b)
        if r in v.pg:
            _add(dvar[R.fwd_last + 1], v.pg[r], -b)
            _add(dvar[R.bwd_first], v.pg[r], b)
        p = R.birth
        if p in inst.rc_times and r in inst.rc_outputs[p]:
            if R.bwd_first is not None:      # dropped: the forward copy ends after its last forward reader
                for kk in rc_expr(v, p):
                    _add(dvar[R.fwd_last + 1], kk, -b)
                    if inst.nested:
                        _add(dvar[R.death + 1], kk, b)
            for t in inst.rc_times[p]:       # held re-run copies: from their group to their end step (death)
                if (r, t) in v.st:
                    _add(dvar[t], v.st[r, t], b)
                    _add(rcv[t], v.st[r, t], b)
            for e in inst.rc_ends[r] if inst.nested else ():
                _add(dvar[e + 1], v.en[r, e], -b)
    g = inst.graph
    from port.plan import variants as V
    for conv, ch in V.chains(g).items():   # a fused chain's outputs exist from the call that computes them on
        if conv not in inst.chains:
            continue
        fz = var_expr(inst, v, conv, "fused")
        for j, at in zip(ch.ops, ch.at):
            if j == at:
                continue
            for r in g.ops[j].outputs:
                R = inst.roots.get(r)
                if R is None or R.birth != j or r in inst.nonmat:
                    continue
                b = R.bytes / unit
                for kk in fz:
                    _add(dvar[at], kk, b)
                    _add(bvar[at], kk, b)
                    _add(dvar[j], kk, -b)
                    _add(bvar[j], kk, -b)
    cons = g.consumers()
    prods = g.producers()
    for u, j in v.e.items():   # gradient roots of an early-able update: static when late, transient when early
        _param, pu, gs = inst.early[u]
        for gr in gs:
            b = stored_bytes(g.tensors[gr]) / unit
            rd = [c for c in cons.get(gr, ()) if c != u] + ([pu] if u in cons.get(gr, ()) else [])
            end = min(max(rd + [prods[gr]]), pu)
            dcon[0] += b
            _add(dvar[0], j, -b)
            _add(dvar[prods[gr]], j, b)
            _add(bvar[prods[gr]], j, b)
            _add(dvar[end + 1], j, -b)
            if (u, gr) in v.ef:         # computed earlier, at its fused chain's call op
                w, at = v.ef[u, gr]
                for row, sign in ((dvar, 1.0), (bvar, 1.0)):
                    _add(row[at], w, sign * b)
                    _add(row[prods[gr]], w, -sign * b)
    for q, x, y, var in inst.inplace_items():  # y shares x's storage on their overlap
        b = inst.roots[y].bytes / unit
        end = min(inst.roots[y].death, inst.roots[x].death)
        for kk in var_expr(inst, v, q, var):
            _add(dvar[q], kk, -b)
            _add(bvar[q], kk, -b)
            _add(dvar[end + 1], kk, b)
    for r, j in v.ps.items():  # optimizer state: held from step 0 unless paged, then at its update's step only
        u = inst.state_pages[r][0]
        b = stored_bytes(g.tensors[r]) / unit
        dcon[0] += b
        _add(dvar[0], j, -b)
        _add(dvar[u], j, b)
        _add(dvar[u + 1], j, -b)
        if r in v.pse:          # the update runs early: at p_u instead
            pu = inst.early[u][1]
            for at, sign in ((pu, 1.0), (pu + 1, -1.0), (u, -1.0), (u + 1, 1.0)):
                _add(dvar[at], v.pse[r], sign * b)
    _queue_holds(inst, v, unit, dvar)
    return dvar, dcon, bvar, bcon, rcv


def queued_accs(inst: Instance) -> frozenset[str]:
    """The instance's accelerators whose backend runs on a queue on host memory: rule 8's queues
    (port.plan.semantics.queued_engines for a plan)."""
    from port.lower.program import QUEUED_BACKENDS, backend_of
    from port.errors import PortError
    own = {inst.ownmem.acc} if inst.ownmem is not None else set()
    queued = set()
    for a in inst.accs:
        try:
            if a not in own and backend_of(a) in QUEUED_BACKENDS:
                queued.add(a)
        except PortError:
            pass
    return frozenset(queued)


def _touching(inst: Instance, r: int) -> list[int]:
    """The ops that read or write storage root ``r`` (as rule 8's queue bookkeeping sees them)."""
    g = inst.graph
    return [o.id for o in g.ops if any(g.storage_root(t) == r for t in (*o.inputs, *o.outputs))]


def _early_queue_vars(m: Model, inst: Instance, v: Vars) -> None:
    """eq[u,g] >= e[u] + x_q[i] - 1 for each op i touching gradient root g with queued options (x_q[i]: their
    sum): the bytes of an early update's gradient root that a queued op read or wrote are held past its free."""
    queued = queued_accs(inst)
    if not queued:
        return
    g = inst.graph
    for u in sorted(v.e):
        for gr in inst.early[u][2]:
            for i in _touching(inst, gr):
                q = {v.x[i, k]: 1.0 for k, o in enumerate(inst.options[i]) if o.acc in queued}
                if not q:
                    continue
                if (u, gr) not in v.eq:
                    v.eq[u, gr] = m.var(f"eq[{_sanitize(g.ops[u].name)},{gr}]", 0.0, 1.0, integer=False)
                terms = {v.eq[u, gr]: 1.0, v.e[u]: -1.0}
                for kk, val in q.items():
                    _add(terms, kk, -val)
                m.row(f"eq[{u},{gr},{i}]", terms, -1.0)


JOIN_CANDIDATES = 24     # explicit-join candidate steps per queued engine (Plan.joins), spread over the main pass


def join_candidates(inst: Instance) -> list[int]:
    """The steps where the model may join a queued engine (Plan.joins): every k-th forward/loss/backward step,
    about JOIN_CANDIDATES of them (a sparse set keeps the model small; with none it is the model without joins)."""
    from port.ir.types import PHASE_UPDATE
    main = [o.id for o in inst.graph.ops if o.phase != PHASE_UPDATE]
    k = max(1, -(-len(main) // JOIN_CANDIDATES))
    return main[k - 1::k]


def _releases(m: Model, v: Vars, a: str, cands: list[int], first: int, name: str,
              gate: dict[int, float]) -> dict[int, int]:
    """Per candidate step c >= first, a continuous release var: rel_c <= jn[a,c], sum_c rel_c <= gate."""
    out = {}
    for c in cands:
        if c >= first:
            out[c] = m.var(f"{name},{c}]", 0.0, 1.0, integer=False)
            m.row(f"{name}_jn,{c}]", {out[c]: 1.0, v.jn[a, c]: -1.0}, hi=0.0)
    if out:
        row = {j: 1.0 for j in out.values()}
        for kk, val in gate.items():
            _add(row, kk, -val)
        m.row(f"{name}_sum]", row, hi=0.0)
    return out


def _join_vars(m: Model, inst: Instance, v: Vars) -> None:
    """jn[a,c] (binary) per queued engine a and candidate step c; rel[i,a,c] (continuous) for each op i with
    options on a that runs at its own step (neither an early-update nor a re-run candidate: their touches move),
    c >= i: rel <= jn[a,c], sum_c rel[i,a,c] <= x_a[i]; with one queued engine, releq[u,g,c] for c >= p_u:
    releq <= jn[a,c], sum_c releq[u,g,c] <= eq[u,g]."""
    queued = queued_accs(inst)
    if not queued or not inst.joins:
        return
    g = inst.graph
    cands = join_candidates(inst)
    for a in sorted(queued):
        if not any(o.acc == a for opts in inst.options for o in opts):
            continue
        for c in cands:
            v.jn[a, c] = m.var(f"jn[{_sanitize(a)},{c}]")
        for i in range(len(inst.options)):
            xa = acc_expr(inst, v, i, a)
            if xa and i not in inst.early and i not in inst.rc_times:
                for c, j in _releases(m, v, a, cands, i, f"rel[{i},{_sanitize(a)}", xa).items():
                    v.rel[i, a, c] = j
    if len({a for a, _c in v.jn}) != 1:
        return
    (a,) = {a for a, _c in v.jn}
    for (u, gr), q in v.eq.items():
        for c, j in _releases(m, v, a, cands, inst.early[u][1], f"releq[{u},{gr}", {q: 1.0}).items():
            v.releq[u, gr, c] = j


def _queue_holds(inst: Instance, v: Vars, unit: int, dvar: list) -> None:
    """The plan semantics' rule 8 as an upper bound: a root an op on a queued engine (on host memory) reads or
    writes keeps its bytes past its free until the host joins the queue (a hand-off from it, a page call, the end
    of the main pass). The model holds it from its free to the end of the step, once per such op placed on a queue
    (x[i,k] of its queued options): from death + 1, or, where a forward op touches a root that may be dropped (re-run
    or paged), from fwd_last + 1 (its forward copy is freed there). An early update's gradient root (static when
    the update runs late) is held from its early free on when the update runs early and a queued op touched it
    (eq[u,g]). Never below what the simulator holds; an op on a host engine adds nothing, so plans without a queued
    op are priced as before."""
    queued = queued_accs(inst)
    if not queued:
        return
    g = inst.graph
    droppable = set(inst.page_roots) | {r for p in inst.rc_times for r in inst.rc_outputs.get(p, ())}
    rel_ops = {i for i, _a, _c in v.rel}
    for i, opts in enumerate(inst.options):
        ks = [k for k, o in enumerate(opts) if o.acc in queued]
        if not ks:
            continue
        o = g.ops[i]
        for r in dict.fromkeys(g.storage_root(t) for t in (*o.inputs, *o.outputs)):
            R = inst.roots.get(r)
            if R is None or r in inst.nonmat:
                continue
            start = R.fwd_last + 1 if (r in droppable and i <= R.fwd_last) else R.death + 1
            if start >= len(dvar):
                continue
            for k in ks:
                _add(dvar[start], v.x[i, k], R.bytes / unit)
            for (i2, _a, c), j in v.rel.items() if i in rel_ops else ():
                if i2 == i:     # a join at c ends the hold: before its free (none then), or from c + 1 on
                    at = max(start, c + 1)
                    if at < len(dvar):
                        _add(dvar[at], j, -R.bytes / unit)
    cons, prods = g.consumers(), g.producers()
    for (u, gr), j in v.eq.items():     # freed (when early) after end, as in _memory_deltas
        pu = inst.early[u][1]
        rd = [c for c in cons.get(gr, ()) if c != u] + ([pu] if u in cons.get(gr, ()) else [])
        start = min(max(rd + [prods[gr]]), pu) + 1
        if start < len(dvar):
            _add(dvar[start], j, stored_bytes(g.tensors[gr]) / unit)
        for c in range(pu, len(dvar) - 1):
            if (u, gr, c) in v.releq:       # a join at c >= p_u (after every touch) ends the hold from c + 1 on
                _add(dvar[max(start, c + 1)], v.releq[u, gr, c], -stored_bytes(g.tensors[gr]) / unit)


def c_memory(m: Model, inst: Instance, v: Vars, budget_bytes: int | None) -> None:
    """mem_flow[t]: L_t = L_{t-1} + births_t - deaths_{t-1};  mem_peak[t]: L_t + W_t <= B - S (or <= peak - S);
    mem_rc[t,P]: during the recompute of P at t: E_t + outputs of the group so far + W_P <= B - S."""
    unit = m.mem_unit
    n = len(inst.graph.ops)
    dvar, dcon, bvar, bcon, rcv = _memory_deltas(inst, v, unit)
    S = v.static_fixed
    cap_rhs = None if budget_bytes is None else (budget_bytes - S) / unit
    for t in range(n):
        terms = {v.L[t]: 1.0}
        if t > 0:
            terms[v.L[t - 1]] = -1.0
        for kk, val in dvar[t].items():
            _add(terms, kk, -val)
        m.row(f"mem_flow[{t}]", terms, dcon[t], dcon[t])
        v.defs[v.L[t]] = len(m.rows) - 1
        peak = {v.L[t]: 1.0}
        for k, o in enumerate(inst.options[t]):
            if o.ws:
                _add(peak, v.x[t, k], o.ws / unit)
        wmax = max(o.ws for o in inst.options[t]) / unit
        if t in v.e and wmax:      # an early update does not run at its graph position
            _add(peak, v.e[t], -wmax)
        _cap_row(m, v, f"mem_peak[{t}]", peak, cap_rhs, S, unit)
    for u, j in sorted(v.e.items()):   # mem_eu[u]: the early update runs right after p_u, before frees
        pu = inst.early[u][1]
        wmax = max(o.ws for o in inst.options[u]) / unit
        if not wmax:
            continue                  # implied by mem_peak[p_u]
        row = {v.L[pu]: 1.0, j: wmax}
        for k, o in enumerate(inst.options[u]):
            if o.ws:
                _add(row, v.x[u, k], o.ws / unit)
        _cap_row(m, v, f"mem_eu[{u}]", row, cap_rhs, S, unit, extra=wmax)
    rc_ws: dict[int, list[tuple[int, int]]] = {}
    for (q, k), jj in v.rcx.items():
        if inst.options[q][k].ws:
            rc_ws.setdefault(q, []).append((k, jj))
    rc_wmax = {q: max((inst.options[q][k].ws for k, _ in rc_ws.get(q, ())), default=0) / unit for q in inst.rc_times}
    groups: dict[int, list[int]] = {}
    for p, ts in inst.rc_times.items():
        for t in ts:
            groups.setdefault(t, []).append(p)
    for t, ps in sorted(groups.items()):
        # E_t = L_t - births at t - held restores at t;  A[t,j] = E_t + outputs of members <= j - group frees
        base = {v.L[t]: 1.0}
        for kk, val in bvar[t].items():
            _add(base, kk, -val)
        for kk, val in rcv[t].items():
            _add(base, kk, -val)
        const = bcon[t]
        prev = None
        members = sorted(ps)
        # a copy made for the group only (r[P,t] - h[r,t]) is freed after the last member reading it (after P
        # itself when no member does): frees[Q] = the roots freed right after Q's re-run
        frees: dict[int, list[tuple[int, int]]] = {}
        for p in members:
            for r in inst.rc_outputs[p]:
                rd = [q for q in members if q > p and any(u == r for _k, u, _pu in inst.rc_in.get(q, ()))]
                frees.setdefault(max(rd) if rd else p, []).append((r, p))
        last = None
        taken: dict[int, int] = {}     # input root x -> ipr[t,Q]: Q's re-run took x's copy over (in place)
        for p in members:
            ob = sum(inst.roots[r].bytes for r in inst.rc_outputs[p]) / unit
            a = m.var(f"A[{t},{p}]", -float("inf"), float("inf"), integer=False)
            row = {a: 1.0, v.rt[p, t]: -ob}
            x, px, accs = inst.rc_inplace.get(p, (None, None, ()))
            if x is not None and px in ps and px < p:
                # ipr[t,Q] <= r[Q,t], ipr[t,Q] <= r[P,t] - h[x,t]: Q re-runs in place on x's group-only copy;
                # ipr_acc[t,Q]: on an accelerator whose profile runs Q inplace
                w = m.var(f"ipr[{t},{p}]", 0.0, 1.0, integer=False)
                m.row(f"ipr_q[{t},{p}]", {w: 1.0, v.rt[p, t]: -1.0}, hi=0.0)
                if {o.acc for o in inst.options[p]} - set(accs):
                    ra = {w: 1.0}
                    for a in accs:
                        for kk, val in acc_expr(inst, v, p, a).items():
                            _add(ra, kk, -val)
                    m.row(f"ipr_acc[{t},{p}]", ra, hi=0.0)
                rw = {w: 1.0, v.rt[px, t]: -1.0}
                if (x, t) in v.st:
                    _add(rw, v.st[x, t], 1.0)
                m.row(f"ipr_p[{t},{p}]", rw, hi=0.0)
                _add(row, w, inst.roots[x].bytes / unit)     # the output needs no bytes of its own ...
                taken[x] = w
            if prev is None:
                for kk, val in base.items():
                    _add(row, kk, -val)
                m.row(f"mem_rc_sum[{t},{p}]", row, -const, -const)
                v.defs[a] = len(m.rows) - 1
            else:
                row[prev] = -1.0
                for r, q in frees.get(last, ()):
                    b = inst.roots[r].bytes / unit
                    _add(row, v.rt[q, t], b)
                    if (r, t) in v.st:
                        _add(row, v.st[r, t], -b)
                    if r in taken:                           # ... and x's copy is not freed: they are its bytes
                        _add(row, taken[r], -b)
                m.row(f"mem_rc_sum[{t},{p}]", row, 0.0, 0.0)
                v.defs[a] = len(m.rows) - 1
            prev, last = a, p
            wmax = rc_wmax[p]
            if wmax:   # mem_rc[t,P]: A + W_P - W_max (1 - r[P,t]) <= B - S
                row = {a: 1.0, v.rt[p, t]: wmax}
                for k, jj in rc_ws[p]:
                    _add(row, jj, inst.options[p][k].ws / unit)
                _cap_row(m, v, f"mem_rc[{t},{p}]", row, cap_rhs, S, unit, extra=wmax)
            elif frees.get(p) and p != members[-1]:   # A drops after p: bound it here (else the next A bounds it)
                _cap_row(m, v, f"mem_rc[{t},{p}]", {a: 1.0}, cap_rhs, S, unit)
        _cap_row(m, v, f"mem_rc[{t},end]", {prev: 1.0}, cap_rhs, S, unit)


def _cap_row(m: Model, v: Vars, name: str, row: dict[int, float], cap_rhs, S: int, unit: int, extra: float = 0.0) -> None:
    if v.eng:               # the engines' footprint: resident for the whole step, outside the arena
        row = dict(row)
        for a, j in v.eng.items():
            row[j] = row.get(j, 0.0) + v.eng_bytes[a] / unit
    if cap_rhs is None:
        row = dict(row)
        row[v.peak] = row.get(v.peak, 0.0) - 1.0
        m.row(name, row, hi=extra - S / unit)
    else:
        m.row(name, row, hi=cap_rhs + extra)
    v.caps.append(len(m.rows) - 1)


def expand_memory(m: Model, v: Vars, terms: dict[int, float]) -> tuple[dict[int, float], float]:
    """``terms`` with every running sum L[t] and group sum A[t,P] replaced by its definition (mem_flow,
    mem_rc_sum rows), recursively: (coefficients on decision variables only, constant)."""
    memo = v.expanded

    def definition(j: int) -> tuple[dict[int, float], float]:
        if j in memo:
            return memo[j]
        order, stack = set(), [j]       # iterative: L[t] refers to L[t-1] (graphs of thousands of steps)
        while stack:
            k = stack.pop()
            if k in memo or k in order:
                continue
            order.add(k)
            _n, row, lo, _hi = m.rows[v.defs[k]]
            stack.extend(x for x in row if x != k and x in v.defs and x not in memo)
        for k in sorted(order, key=lambda k: v.defs[k]):   # rows are built in dependency order
            _n, row, lo, _hi = m.rows[v.defs[k]]
            own = row[k]
            out: dict[int, float] = {}
            const = lo / own
            for x, c in row.items():
                if x == k:
                    continue
                if x in v.defs:
                    e, ec = memo[x]
                    for y, cy in e.items():
                        _add(out, y, -c * cy / own)
                    const -= c * ec / own
                else:
                    _add(out, x, -c / own)
            memo[k] = ({x: c for x, c in out.items() if abs(c) > 1e-12}, const)
        return memo[j]

    out: dict[int, float] = {}
    const = 0.0
    for x, c in terms.items():
        if x in v.defs:
            e, ec = definition(x)
            for y, cy in e.items():
                _add(out, y, c * cy)
            const += c * ec
        else:
            _add(out, x, c)
    return {x: c for x, c in out.items() if abs(c) > 1e-12}, const


def add_aggregated_memory_rows(m: Model, v: Vars, lp_values: list[float], rel_slack: float = 1e-6) -> int:
    """mem_agg[...]: every memory-cap row that binds at the LP optimum ``lp_values``, written out over the
    decision variables (running sums expanded). Redundant for the LP, but the knapsack structure it exposes
    (which tensors are live at that step, with their bytes) lets the MIP solver's cover and MIR cuts see it;
    the running sums hide it (ResNet-18 b32 at 50% on jetson-orin-nano: bound after 8 s 245-248 -> 255-259
    ms). Returns how many rows were added."""
    added = 0
    for i in list(v.caps):
        name, terms, lo, hi = m.rows[i]
        act = sum(c * lp_values[j] for j, c in terms.items())
        if math.isinf(hi) or act < hi - rel_slack * max(1.0, abs(hi)):
            continue
        e, const = expand_memory(m, v, terms)
        m.row(f"mem_agg[{name}]", e, hi=hi - const)
        added += 1
    return added


def c_handoff(m: Model, inst: Instance, v: Vars, into: dict[int, tuple] | None = None) -> dict[int, float]:
    """``into`` (filled when given): hand-off variable -> the op whose forward/backward run it precedes (the
    re-runs' hand-offs left out). handoff[e,a]: s_e >= X[u,a] - X[v,a] (one cost per edge when all directions cost the same), or
    handoff[e,a,b]: s_e^ab >= X[u,a] + X[v,b] - 1 (per-direction costs); rc_handoff[...]: the same for the
    inputs a recompute re-reads, switched on by rc_Q. Returns the objective terms."""
    obj: dict[int, float] = {}
    accs = inst.accs
    if len(accs) < 2:
        return obj
    g = inst.graph
    own = {inst.ownmem.acc} if inst.ownmem is not None else set()    # its copies: port.solver.ownmem
    pairs = [(a, b) for a in accs for b in accs if a != b and a not in own and b not in own]

    def on(i: int, a: str) -> bool:
        return any(o.acc == a for o in inst.options[i])

    def edge(tag: str, t: int, u: int, w: int, nbytes: int, rc: dict[int, float] | None) -> None:
        costs = {(a, b): inst.handoff_ms(a, b, nbytes) for a, b in pairs if on(u, a) and on(w, b)}
        if not costs or max(costs.values()) <= 0:
            return
        extra = dict(rc) if rc else {}
        lo = -1.0 if rc else 0.0
        if len(set(costs.values())) == 1:
            c = next(iter(costs.values()))
            s = m.var(f"s{tag}[{t},{u},{w}]", 0.0, 1.0, integer=False)
            obj[s] = obj.get(s, 0.0) + c
            if into is not None and tag in ("", "_rc"):
                into[s] = (t, u, w, tag)
            for a in accs:
                row = {s: 1.0}
                for kk, val in acc_expr(inst, v, u, a).items():
                    _add(row, kk, -val)
                for kk, val in acc_expr(inst, v, w, a).items():
                    _add(row, kk, val)
                for kk, val in extra.items():
                    _add(row, kk, -val)
                m.row(f"handoff{tag}[{t},{u},{w},{a}]", row, lo=lo)
        else:
            for (a, b), c in costs.items():
                if c <= 0:
                    continue
                s = m.var(f"s{tag}[{t},{u},{w},{a},{b}]", 0.0, 1.0, integer=False)
                obj[s] = c
                if into is not None and tag in ("", "_rc"):
                    into[s] = (t, u, w, tag)
                row = {s: 1.0}
                for kk, val in acc_expr(inst, v, u, a).items():
                    _add(row, kk, -val)
                for kk, val in acc_expr(inst, v, w, b).items():
                    _add(row, kk, -val)
                for kk, val in extra.items():
                    _add(row, kk, -val)
                m.row(f"handoff{tag}[{t},{u},{w},{a},{b}]", row, lo=lo - 1.0)

    for t, u, w, nbytes in inst.edges:
        edge("", t, u, w, nbytes, None)
        if w in inst.rc_times:
            edge("_rc", t, u, w, nbytes, rc_expr(v, w))
            for lv in sorted({lv for lv, _j in v.rc_more.get(w, ())}):
                edge(f"_rc{lv}", t, u, w, nbytes, rc_level_expr(v, w, lv))
    return obj


def objective(m: Model, inst: Instance, v: Vars, handoff_terms: dict[int, float], budget_bytes: int | None) -> None:
    """min  sum x*latency + sum rc*latency + sum pg*paging + sum s*handoff   (or min peak)."""
    if budget_bytes is None:
        m.obj = {v.peak: 1.0}
        return
    obj: dict[int, float] = {}
    for (i, k), j in v.x.items():
        _add(obj, j, inst.options[i][k].ms)
    for (p, k), j in v.rcx.items():
        _add(obj, j, inst.options[p][k].ms)
    for (_lv, p, k), j in v.rcx_more.items():
        _add(obj, j, inst.options[p][k].ms)
    for r, j in v.pg.items():
        _add(obj, j, inst.page_ms[r])
    for r, j in v.ps.items():
        _add(obj, j, inst.state_pages[r][1])
    for j, c in handoff_terms.items():
        _add(obj, j, c)
    for j in v.e.values():
        _add(obj, j, EPS_EARLY_MS)
    m.obj = obj


def c_makespan(m: Model, inst: Instance, v: Vars, handoff_terms: dict[int, float], into: dict[int, tuple]) -> None:
    """The makespan objective (solver/FORMULATION.md, "Overlap"): the simulator's overlap model
    (port.verify.simulate._Timelines) as clocks along the plan semantics' event order: at each step t the re-runs
    of the group at t (candidates in op order, each after its hand-offs), op t (unless updated early), the early
    updates that run after t. Each event E of op i has a gate g (1; r[P,t] for a re-run; 1 - e[i] / e[i] for an
    early-update candidate at its own step / after p_i) and, with H the host clock and Q[a] queue a's before it:
    A >= H, A >= H + h - M(1-g) (h: its hand-offs' time), A >= Q[a] + sum_{l>=k} h_l - M(1-w) - M(1-g) where
    w >= X[u_k,a] - X[i,a] (its k-th hand-off comes from queue a: it waits for it);
    H' >= A, H' >= A + ms_k - M(2-g-x[i,k]) for host options k; Q'[a] >= Q[a], Q'[a] >= max(A, Q[a]) + ms_k
    - M(2-g-x[i,k]) for options k on a; a page call of root r (rule 1: before step bwd_first's re-runs; rule 5:
    after step fwd_last's early updates) joins every lane: H' >= H + c pg[r], H' >= Q[a] + c - M(1 - pg[r]);
    makespan >= H_end, Q[a]_end. Exact (= simulate's ``makespan_ms``) at integer points: every clock is a max of
    sums and the objective only pushes them down. M: the serial objective's bound. The load and path cuts add
    paging: nothing runs during a page call (every queue has drained before it, the host pages).
    Replaces the serial objective (its early-update tie-breaker kept)."""
    from port.verify.simulate import overlapping_accelerators
    ov = overlapping_accelerators(inst.accs, inst.profile)
    queued = [a for a in inst.accs if a in ov]
    big = sum(c for c in m.obj.values() if c > 0) + 1.0 + sum(max((o.issue for o in opts), default=0.0)
                                                              for opts in inst.options)
    inf = float("inf")
    per_edge: dict[tuple, dict[int, float]] = {}        # (tensor, u, w, tag) -> hand-off cost terms
    for j, e in into.items():
        _add(per_edge.setdefault(e, {}), j, handoff_terms[j])
    edges_in: dict[int, list[tuple]] = {}
    for t, u, w, _nb in inst.edges:
        edges_in.setdefault(w, []).append((t, u, w))
    clock: dict[str | None, int | None] = {None: None} | {a: None for a in queued}   # None: the host thread
    n = [0]

    def gated(row: dict[int, float], gate: dict[int, float], lo: float, name: str) -> None:
        """row >= lo - M(1 - gate) (gate: a linear 0/1 expression; {} is the constant 1)."""
        row = dict(row)
        for j, c in gate.items():
            if j >= 0:
                _add(row, j, -big * c)
        const = gate.get(-1, 0.0) if gate else 1.0
        m.row(name, row, lo=lo - big * (1.0 - const) if gate else lo)

    def event(i: int, gate: dict[int, float], tag: str) -> None:
        n[0] += 1
        es = edges_in.get(i, [])
        costs = [per_edge.get((e[0], e[1], e[2], tag), {}) for e in es]
        A = m.var(f"mkA[{n[0]}]", 0.0, inf, integer=False)
        if clock[None] is not None:
            m.row(f"mk_in0[{n[0]}]", {A: 1.0, clock[None]: -1.0}, lo=0.0)
        row = {A: 1.0} | ({clock[None]: -1.0} if clock[None] is not None else {})
        for cs in costs:
            for j, c in cs.items():
                _add(row, j, -c)
        gated(row, gate, 0.0, f"mk_in[{n[0]}]")
        for a in queued:
            for k, e in enumerate(es):
                if clock[a] is None or not acc_expr(inst, v, e[1], a):
                    continue
                wv = m.var(f"mkw[{n[0]},{k},{_sanitize(a)}]", 0.0, 1.0, integer=False)
                ru = {wv: 1.0}
                for kk, val in acc_expr(inst, v, e[1], a).items():
                    _add(ru, kk, -val)
                for kk, val in acc_expr(inst, v, i, a).items():
                    _add(ru, kk, val)
                m.row(f"mk_wait[{n[0]},{k},{_sanitize(a)}]", ru, lo=0.0)
                row = {A: 1.0, clock[a]: -1.0, wv: -big}
                for cs in costs[k:]:
                    for j, c in cs.items():
                        _add(row, j, -c)
                gated(row, gate, -big, f"mk_wait_in[{n[0]},{k},{_sanitize(a)}]")
        issue = {k: o.issue for k, o in enumerate(inst.options[i]) if o.acc in ov and o.issue > 0}
        for lane in clock:
            ks = [k for k, o in enumerate(inst.options[i]) if (o.acc if o.acc in ov else None) == lane]
            if lane is None:        # a queued option's issue takes the host thread (simulate._Timelines.op)
                ks += sorted(issue)
            if not ks and lane is not None:
                continue
            new = m.var(f"mk{_sanitize(str(lane))}[{n[0]}]", 0.0, inf, integer=False)
            prev = A if lane is None else clock[lane]
            if prev is not None:
                m.row(f"mk_keep[{n[0]},{_sanitize(str(lane))}]", {new: 1.0, prev: -1.0}, lo=0.0)
            for k in ks:
                g = dict(gate) if gate else {-1: 1.0}
                _add(g, v.x[i, k], 1.0)
                _add(g, -1, -1.0)              # g + x - 1: both on
                if lane is None and k in issue:      # the host: the issue of a queued call
                    gated({new: 1.0, A: -1.0}, g, issue[k], f"mk_issue[{n[0]},{k}]")
                    continue
                for base in {A, prev} - {None}:      # a queued call starts when issued and its queue is free
                    lo = inst.options[i][k].ms + (issue.get(k, 0.0) if base == A else 0.0)
                    gated({new: 1.0, base: -1.0}, g, lo, f"mk_run[{n[0]},{k},{base}]")
            clock[lane] = new

    rc_at: dict[int, list[int]] = {}
    for (p, t) in v.rt:
        rc_at.setdefault(t, []).append(p)
    early_after: dict[int, list[int]] = {}
    for u in sorted(v.e):
        early_after.setdefault(inst.early[u][1], []).append(u)
    def page(j: int, c: float, what: str) -> None:
        """A page call taking c ms (gate j: pg[r], or a paged optimizer state's) on the host thread: it waits for
        every queue (a join of all lanes, as ``_Timelines.page``), then takes its time: H' >= H + c j,
        H' >= Q[a] + c - M(1 - j) per queue."""
        n[0] += 1
        new = m.var(f"mkpg{what}[{n[0]}]", 0.0, inf, integer=False)
        m.row(f"mk_pg[{n[0]}]", {new: 1.0, j: -c} | ({clock[None]: -1.0} if clock[None] is not None else {}), lo=0.0)
        for a in queued:
            if clock[a] is not None:
                m.row(f"mk_pgq[{n[0]},{_sanitize(a)}]", {new: 1.0, clock[a]: -1.0, j: -big}, lo=c - big)
        clock[None] = new

    def join(a: str, t: int) -> None:
        """An explicit join of queue a after step t (gate jn[a,t]; Plan.joins) on the host thread, as
        ``_Timelines.handoff``: H' >= H + c jn, H' >= Q[a] + c - M(1 - jn) (a lane only where a overlaps)."""
        from port.verify.simulate import join_ms
        j, c = v.jn[a, t], join_ms(inst.profile, a)
        n[0] += 1
        new = m.var(f"mkjn[{n[0]}]", 0.0, inf, integer=False)
        m.row(f"mk_jn[{n[0]}]", {new: 1.0, j: -c} | ({clock[None]: -1.0} if clock[None] is not None else {}), lo=0.0)
        if clock.get(a) is not None:
            m.row(f"mk_jnq[{n[0]}]", {new: 1.0, clock[a]: -1.0, j: -big}, lo=c - big)
        clock[None] = new

    joins_at: dict[int, list[str]] = {}
    for a, t in sorted(v.jn, key=lambda e: (e[1], e[0])):
        joins_at.setdefault(t, []).append(a)
    page_in_at: dict[int, list[tuple[int, int, float]]] = {}      # step -> (root, gate, ms) of its page calls
    page_out_after: dict[int, list[tuple[int, int, float]]] = {}
    for r, j in v.pg.items():
        page_in_at.setdefault(inst.roots[r].bwd_first, []).append((r, j, inst.page_ms[r] / 2))
        page_out_after.setdefault(inst.roots[r].fwd_last, []).append((r, j, inst.page_ms[r] / 2))
    for r, j in v.ps.items():    # a paged optimizer state: around its update's step (p_u when early: gate pse)
        u, ms = inst.state_pages[r]
        gates = [(u, j)]
        if r in v.pse:
            late = m.var(f"psl[{_sanitize(inst.graph.tensors[r].name)}]", 0.0, 1.0, integer=False)
            m.row(f"psl[{r}]", {late: 1.0, j: -1.0, v.pse[r]: 1.0}, 0.0, 0.0)
            gates = [(u, late), (inst.early[u][1], v.pse[r])]
        for at, gate in gates:
            page_in_at.setdefault(at, []).append((r, gate, ms / 2))
            page_out_after.setdefault(at, []).append((r, gate, ms / 2))
    for t in range(len(inst.options)):
        for _r, j, c in sorted(page_in_at.get(t, ())):
            page(j, c, "in")
        for p in sorted(rc_at.get(t, ())):
            event(p, {v.rt[p, t]: 1.0, -1: 0.0}, "_rc")
        event(t, {v.e[t]: -1.0, -1: 1.0} if t in v.e else {}, "")
        for u in early_after.get(t, ()):
            event(u, {v.e[u]: 1.0, -1: 0.0}, "")
        for a in joins_at.get(t, ()):
            join(a, t)
        for _r, j, c in sorted(page_out_after.get(t, ())):
            page(j, c, "out")
    paging = {j: inst.page_ms[r] for r, j in v.pg.items()} | {j: inst.state_pages[r][1] for r, j in v.ps.items()}
    mk = m.var("makespan", 0.0, inf, integer=False)
    for lane, end in clock.items():          # (paging is on the host lane's clock: page())
        m.row(f"mk_end[{_sanitize(str(lane))}]", {mk: 1.0} | ({end: -1.0} if end is not None else {}), lo=0.0)
    # load cuts: a lane's clock passes every call placed on it, so the makespan is at least each lane's summed
    # option times (re-runs and hand-offs left out: still a lower bound). Implied at integer points; without them
    # the big-M rows let the LP relaxation put the makespan near 0 (a 94% gap on ResNet-8 after 20 s)
    for lane in clock:
        row = {mk: 1.0}
        for i, opts in enumerate(inst.options):
            for k, o in enumerate(opts):
                if (o.acc if o.acc in ov else None) == lane and o.ms > 0:
                    _add(row, v.x[i, k], -o.ms)
                elif lane is None and o.acc in ov and o.issue > 0:     # a queued call's issue, on the host
                    _add(row, v.x[i, k], -o.issue)
        for j, c in paging.items():
            _add(row, j, -c)
        m.row(f"mk_load[{_sanitize(str(lane))}]", row, lo=0.0)
    # path cut: along a chain of data edges each call starts after its producer ends (on its own lane, or after
    # the hand-off's wait), so the makespan is at least the chain's summed option times; the chain is the
    # longest by each op's fastest option. A training step is mostly one chain (forward, then backward), so this
    # bound is near the serial sum where the engines cannot overlap
    fastest = [min((o.ms for o in opts), default=0.0) for opts in inst.options]
    best, prev_op = list(fastest), [-1] * len(fastest)
    for w, es in sorted(edges_in.items()):
        for _t, u, _w in es:
            if 0 <= u < w and best[u] + fastest[w] > best[w]:
                best[w], prev_op[w] = best[u] + fastest[w], u
    edge_of = {(u, w): (t, u, w) for w, es in edges_in.items() for t, u, _w in es}
    if best:
        row, i = {mk: 1.0}, max(range(len(best)), key=best.__getitem__)
        while i >= 0:
            for k, o in enumerate(inst.options[i]):
                if o.ms > 0:
                    _add(row, v.x[i, k], -o.ms)
            if prev_op[i] >= 0:     # the hand-off on the chain's edge, where the plan puts one (its wait counts)
                for j, c in per_edge.get(edge_of[prev_op[i], i] + ("",), {}).items():
                    _add(row, j, -c)
            i = prev_op[i]
        for j, c in paging.items():
            _add(row, j, -c)
        m.row("mk_path", row, lo=0.0)
    m.obj = {mk: 1.0} | {j: EPS_EARLY_MS for j in v.e.values()}


def build(inst: Instance, budget_bytes: int | None, mem_unit: int = KiB,
          allow_early: bool = True, max_reruns: int = 1) -> tuple[Model, Vars]:
    """budget_bytes=None builds the min-peak model (objective: peak bytes / mem_unit). max_reruns: how many
    times one forward op may be re-run (1: each dropped op once)."""
    m = Model(mem_unit=mem_unit)
    v = add_variables(m, inst, budget_bytes, allow_early, max_reruns)
    c_assign(m, inst, v)
    c_engine(m, inst, v)
    c_fusion(m, inst, v)
    c_inplace_conflict(m, inst, v)
    c_coupled(m, inst, v)
    c_recompute_choice(m, inst, v)
    c_recompute_inputs(m, inst, v)
    c_drop_exclusive(m, inst, v)
    c_early(m, inst, v)
    c_memory(m, inst, v, budget_bytes)
    into: dict[int, tuple] = {}
    h = c_handoff(m, inst, v, into)
    if inst.ownmem is not None:
        from port.solver import ownmem as OM
        OM.own_restrict(m, inst, v)
        OM.own_capacity(m, inst, v)
        for j, c in OM.own_copies(m, inst, v).items():
            _add(h, j, c)
    if v.jn:                    # an explicit join costs the host its latency (simulate.join_ms)
        from port.verify.simulate import join_ms
        for (a, _c), j in v.jn.items():
            _add(h, j, join_ms(inst.profile, a))
    objective(m, inst, v, h, budget_bytes)
    if budget_bytes is not None and inst.objective == "makespan":
        c_makespan(m, inst, v, h, into)
    return m, v
