"""The ILP's own-memory families (solver/FORMULATION.md, "Own memory"): an engine with its own (discrete) memory
(``Profile.own_memory``) pays the copies of port.lower.memories' residency rule instead of the plan semantics'
per-edge hand-offs, and its memory has its own capacity (the engine's ``accelerator_caps`` entry).

The residency rule, replayed by ``port.plan.semantics.own_memory_replay`` (the simulator prices its copies), is
linear in the placement where the order of a root's uses is fixed: the ops of the graph in order, the late
updates in their own segment. Re-runs, paging and early updates move or add uses, so the model keeps them off the
own memory (``own_restrict``): what it prices is then exactly what the simulator prices.
"""
from __future__ import annotations

from dataclasses import dataclass

from port.errors import SolverError
from port.plan import semantics as SEM
from port.plan.semantics import stored_bytes


@dataclass(frozen=True)
class OwnMemory:
    acc: str                                   # the accelerator with its own memory (D)
    host: str                                  # the accelerator that prices the host side of a copy
    uses: dict                                 # (root, segment) -> [(op, writes)] in run order
    touch: dict                                # root -> ops that read or write it (kernels only)
    static: frozenset                          # roots current in host memory when a segment starts
    keep_main: frozenset                       # roots copied back to the host after the main segment
    cap: int | None                            # the memory's size (bytes), None: unbounded


def own_memory_of(graph, profile, accs) -> OwnMemory | None:
    """The instance's own-memory data (None when no accelerator of ``accs`` has its own memory)."""
    own = [a for a in profile.own_memory if a in accs]
    if not own:
        return None
    if len(own) > 1:
        raise SolverError(f"profile {profile.device!r}: the ILP models one engine with its own memory, this profile "
                          f"has {own}: solve with one of them (Profile.only) or give the others host memory")
    T = graph.tensors
    uses: dict = {}
    touch: dict = {}
    for o in graph.ops:
        if o.outputs and all(T[t].alias_of is not None for t in o.outputs):
            continue                        # views run no kernel (the replay's rule)
        seg = "late" if o.phase == "update" else "main"
        outs = {graph.storage_root(t) for t in o.outputs}
        outs |= {graph.storage_root(t) for t in o.inputs if T[t].role == SEM.ROLE_BUFFER}
        for r in dict.fromkeys(graph.storage_root(t) for t in o.inputs + o.outputs):
            uses.setdefault((r, seg), []).append((o.id, r in outs))
            touch.setdefault(r, []).append(o.id)
    keep = {graph.storage_root(t) for t in (graph.loss_id, graph.logits_id) if t is not None and t >= 0}
    static = frozenset(r for r, _s in uses if SEM.is_static(graph, r))
    return OwnMemory(own[0], profile.host_accelerator(), uses, touch, static, frozenset(keep),
                     dict(profile.accelerator_caps).get(own[0]))


def _d(inst, v, i: int, var: str | None = None) -> dict[int, float]:
    """X[i,D] (``var``: x[i,.,var] instead) as {variable: 1} (formulation.acc_expr / var_expr; this module is
    imported by the instance, below the formulation)."""
    return {v.x[i, k]: 1.0 for k, o in enumerate(inst.options[i])
            if (o.var == var if var is not None else o.acc == inst.ownmem.acc)}


def _add(d: dict[int, float], k: int, val: float) -> None:
    d[k] = d.get(k, 0.0) + val


def own_restrict(m, inst, v) -> None:
    """own_rc[P,i]: rc_P + X[i,D] <= 1 for P and every reader of P's outputs (a re-run makes a new copy whose
    readers' copies the model does not price); own_pg[r,i]: pg_r + X[i,D] <= 1 for every op touching r;
    own_eu[u,i]: e_u + X[i,D] <= 1 for every op touching a root the update touches (an early update moves its
    uses into the main segment)."""
    om = inst.ownmem
    g = inst.graph
    readers = SEM.readers_by_root(g)
    def rows(tag, key, lhs, ops):
        for i in sorted(set(ops)):
            d = _d(inst, v, i)
            if d and lhs:
                m.row(f"own_{tag}[{key},{i}]", {**lhs, **d}, hi=1.0)

    for p in sorted(v.rc_of):
        outs = {g.storage_root(t) for t in inst.rc_outputs.get(p, ())}
        rows("rc", p, {j: 1.0 for j in v.rc_of[p]}, [p] + [i for r in outs for i in readers.get(r, ())])
    for r, j in sorted(v.pg.items()):
        rows("pg", r, {j: 1.0}, om.touch.get(r, ()))
    for u, j in sorted(v.e.items()):
        o = g.ops[u]
        roots = {g.storage_root(t) for t in o.inputs + o.outputs}
        rows("eu", u, {j: 1.0}, [i for r in roots for i in om.touch.get(r, ())])


def own_copies(m, inst, v) -> dict[int, float]:
    """Copies of the residency rule, per root and segment over its uses u_1..u_n (op, writes) in run order, with
    d_k = X[u_k, D] and w the last use before k that writes (a static root: a write on the host before u_1):
    own_in[r,k]:   cD_k >= d_k - d_w - sum_{w<j<k} d_j          (bytes wanted in D, current only in the host)
    own_out[r,k]:  cH_k >= d_w - d_k - sum_{w<j<k} (1 - d_j)    (wanted in the host, current only in D)
    own_back[r]:   cE >= d_w - sum_{j>w} (1 - d_j)              (a kept root current only in D at the end)
    each minus x[c,fused] for a fused chain's bn output (never materialised). Returns the objective terms (ms)."""
    om = inst.ownmem
    g = inst.graph
    prof = inst.profile
    into, out = prof.handoff_cost(om.host, om.acc), prof.handoff_cost(om.acc, om.host)
    obj: dict[int, float] = {}
    for (r, seg), us in sorted(inst.ownmem.uses.items(), key=lambda kv: (kv[0][0], kv[0][1] != "main")):
        ds = [_d(inst, v, i) for i, _w in us]
        if not any(ds):
            continue
        nb = stored_bytes(g.tensors[r])
        fused = _d(inst, v, inst.nonmat[r], "fused") if r in inst.nonmat else {}
        cin, cout = into.cost_ms(nb), out.cost_ms(nb)

        def copy(name, cost, terms, const):
            if cost <= 0:
                return
            c = m.var(name, 0.0, 1.0, integer=False)
            obj[c] = cost
            row = {c: 1.0}
            for k, val in terms.items():
                _add(row, k, -val)
            for k, val in fused.items():
                _add(row, k, val)
            m.row(name.replace("c_", "own_", 1), row, lo=const)

        w = -1 if r in om.static else None        # -1: the host wrote it before the segment
        for k, (i, writes) in enumerate(us):
            if w is not None:
                between = range(w + 1, k)
                dw = ds[w] if w >= 0 else {}
                t_in = dict(ds[k])
                for kk, val in dw.items():
                    _add(t_in, kk, -val)
                for j in between:
                    for kk, val in ds[j].items():
                        _add(t_in, kk, -val)
                if ds[k]:
                    copy(f"c_in[{r},{seg},{k}]", cin, t_in, 0.0)
                if dw:
                    t_out = dict(dw)
                    for kk, val in ds[k].items():
                        _add(t_out, kk, -val)
                    for j in between:
                        for kk, val in ds[j].items():
                            _add(t_out, kk, val)
                    copy(f"c_out[{r},{seg},{k}]", cout, t_out, -float(len(between)))
            if writes:
                w = k
        keep = r in om.static or (seg == "main" and r in om.keep_main)
        if keep and w is not None and w >= 0 and ds[w]:
            after = range(w + 1, len(us))
            t_end = dict(ds[w])
            for j in after:
                for kk, val in ds[j].items():
                    _add(t_end, kk, val)
            copy(f"c_back[{r},{seg}]", cout, t_end, -float(len(after)))
    return obj


def own_capacity(m, inst, v) -> None:
    """own_cap[D]: sum_r b_r y_r <= cap_D with own_use[r,i]: y_r >= X[i,D] for every op i touching root r: every
    root an op on D touches is charged for the whole step, an upper bound on the memory's peak (a root's copy in
    D lives from its first use there to its last, each copy one interval: port.plan.semantics.own_memory_replay)."""
    om = inst.ownmem
    if om.cap is None:
        return
    g = inst.graph
    total: dict[int, float] = {}
    unit = m.mem_unit
    for r, ops in sorted(om.touch.items()):
        ds = [(i, _d(inst, v, i)) for i in dict.fromkeys(ops)]
        ds = [(i, d) for i, d in ds if d]
        if not ds:
            continue
        y = m.var(f"y_own[{r}]", 0.0, 1.0, integer=False)
        total[y] = stored_bytes(g.tensors[r]) / unit
        for i, d in ds:
            row = {y: 1.0}
            for kk, val in d.items():
                row[kk] = row.get(kk, 0.0) - val
            m.row(f"own_use[{r},{i}]", row, lo=0.0)
    if total:
        m.row(f"own_cap[{om.acc}]", total, hi=om.cap / unit)
