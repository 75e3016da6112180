"""Everything the formulation and the baselines need, derived once from (graph, profile).

Names follow solver/FORMULATION.md: options O(i), static bytes S, roots r with birth p_r, death d_r,
last forward reader f_r, first backward reader b_r, recompute candidates P with their legacy time tau_P
and their candidate re-run steps C(P) (chain recompute, window K), early-update candidates u with p_u.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from port.plan import semantics as SEM
from port.plan import variants as V
from port.plan.semantics import RootInfo as Root  # noqa: F401  (re-exported for the formulation)
from port.ir.types import PHASE_FORWARD, PHASE_LOSS, Graph
from port.cost.types import STATE_PAGES_KEY, Profile
DEFAULT_WINDOW = 12     # K: a dropped producer may be re-run at the own-time of up to K forward ops after it


@dataclass(frozen=True)
class Option:
    acc: str
    var: str
    ms: float
    ws: int     # OpCost.extra_bytes: arena workspace + what the op allocates outside the arena
    issue: float = 0.0   # OpCost.issue_ms: a queued engine's call, the host thread's time to issue it (makespan only)


@dataclass
class Instance:
    graph: Graph
    profile: Profile
    options: list[list[Option]]
    static_bytes: int
    roots: dict[int, Root]
    chains: dict[int, tuple[int, ...]]          # key op id -> fusable chain's members (port.plan.variants.chains)
    nonmat: dict[int, int]                      # never-materialised root of a fused chain -> its key op id
    inplace_ops: dict[int, tuple[int, int]]     # op -> (root of input, root of output)
    tau: dict[int, int]                         # recompute candidate -> time
    rc_outputs: dict[int, tuple[int, ...]]      # candidate -> owned activation outputs
    rc_needs: dict[int, list[tuple[str, int]]]  # candidate -> [("kept", root) | ("rc", producer)]
    own: dict[int, int | None]                  # candidate -> first backward reader of its outputs (None: pure)
    rc_times: dict[int, list[int]]              # candidate -> C(P), candidate re-run steps, ascending
    rc_cover: dict[int, list[int]]              # output root of a candidate -> its backward readers (covered when dropped)
    rc_ends: dict[int, list[int]]               # output root of a candidate -> E(r), steps a re-run copy may be held to
    rc_in: dict[int, list[tuple[str, int, int]]]  # candidate -> [("saved"|"pure", input root u, producer of u)]
    early: dict[int, tuple[int, int, tuple[int, ...]]]  # update op -> (parameter, p_u, gradient roots)
    grad_bytes: int                             # bytes of the gradient roots of early-update candidates
    window: int
    page_roots: list[int]
    page_ms: dict[int, float]
    edges: list[tuple[int, int, int, int]]      # (tensor, producer u, consumer v, bytes)
    accs: tuple[str, ...]
    excluded: list[tuple[int, str, str, str]] = field(default_factory=list)  # (op, acc, var, why)
    nested: bool = True                         # multi-level re-run steps and held copies (False: single-level)
    rc_inplace: dict[int, tuple[int, int, frozenset]] = field(default_factory=dict)  # candidate Q -> (input
    #   root x, its producer P, the accelerators the profile runs Q inplace on): Q's re-run there may take over
    #   x's copy (Plan.inplace_reruns)
    pruned: bool = False                        # built with prune=True (dominated accelerators' options dropped)
    ownmem: object = None                       # port.solver.ownmem.OwnMemory: the engine with its own memory
    objective: str = "serial"                   # "serial" (sum of event times) or "makespan" (engines overlapped)
    # optimizer-state root that may be paged -> (its update op, page_ms: out and in, once a step)
    # (port.plan.semantics.paged_state_updates; none where an engine has its own memory, none where the profile's
    # storage says so: STATE_PAGES_KEY)
    state_pages: dict[int, tuple[int, float]] = field(default_factory=dict)
    fused_inplace: dict[int, tuple[int, int]] = field(default_factory=dict)  # fused call op -> (root of the
    #   input, root of the output) it writes in place when its chain runs fused (port.plan.variants.fused_inplace)
    joins: bool = True                          # explicit joins of queued engines in the model (Plan.joins)

    @property
    def state_bytes(self) -> int:
        """The stored bytes of the optimizer state a plan may page (state_pages)."""
        return sum(SEM.stored_bytes(self.graph.tensors[r]) for r in self.state_pages)

    def inplace_items(self):
        """(op, input root, output root, the variant that shares them) of every in-place candidate: ordinary
        ``inplace`` ops and fused calls that write over an input."""
        return [(q, x, y, "inplace") for q, (x, y) in sorted(self.inplace_ops.items())] + \
            [(q, x, y, "fused") for q, (x, y) in sorted(self.fused_inplace.items())]

    def handoff_ms(self, a: str, b: str, nbytes: int) -> float:
        return 0.0 if a == b else self.profile.handoff_cost(a, b).cost_ms(nbytes)


def _link_no_dearer(profile: Profile, src_b: str, dst_b: str, src_a: str, dst_a: str) -> bool:
    """Whether handing any tensor src_b -> dst_b costs no more than src_a -> dst_a, whatever its size."""
    try:
        hb, ha = profile.handoff_cost(src_b, dst_b), profile.handoff_cost(src_a, dst_a)
    except KeyError:
        return False
    return hb.latency_ms <= ha.latency_ms and hb.bytes_per_ms >= ha.bytes_per_ms


def dominating_accelerator(profile: Profile, options: list[list[Option]], accs: tuple[str, ...],
                           a: str) -> str | None:
    """An accelerator b that dominates ``a``: for every op, every option (a, v) has an option (b, v) no slower and
    with no more workspace; b's engine footprint is no larger than a's; and a hand-off to or from b costs no more
    than the same hand-off to or from a, for every third accelerator. Then moving every op of a plan from a to b
    keeps it legal (same variants, so the same in-place, fusion, re-run and coupling rules), within the same
    memory at every step and no slower, so some optimal plan uses no a. None when no accelerator does."""
    for b in accs:
        if b == a or profile.engine_bytes_of(b) > profile.engine_bytes_of(a):
            continue
        if not all(_link_no_dearer(profile, b, c, a, c) and _link_no_dearer(profile, c, b, c, a)
                   for c in accs if c not in (a, b)):
            continue
        ok = True
        for opts in options:
            on_b = {o.var: o for o in opts if o.acc == b}
            for o in opts:
                if o.acc == a:
                    p = on_b.get(o.var)
                    if p is None or p.ms > o.ms or p.ws > o.ws:
                        ok = False
                        break
            if not ok:
                break
        if ok:
            return b
    return None


def prune_dominated(profile: Profile, options: list[list[Option]], excluded: list) -> tuple[list[list[Option]],
                                                                                            tuple[str, ...]]:
    """Drop the options of dominated accelerators (``dominating_accelerator``), one accelerator at a time (two
    identical accelerators: the later one goes), until none is dominated. Returns (options, accelerators left);
    every dropped option is recorded in ``excluded`` with the accelerator that dominates it. An engine whose calls
    overlap the host's (port.verify.simulate.overlapping_accelerators: a queue on cores of its own) is never
    dropped nor the one that dominates: in the makespan its slower option may pay, running beside the host's."""
    from port.verify.simulate import overlapping_accelerators
    over = overlapping_accelerators(profile.accelerators, profile)
    accs = tuple(profile.accelerators)
    while len(accs) > 1:
        for a in reversed(accs):
            if a in over:
                continue
            b = dominating_accelerator(profile, options, tuple(c for c in accs if c not in over), a)
            if b is not None:
                break
        else:
            break
        excluded.extend((i, o.acc, o.var, f"dominated by {b}") for i, opts in enumerate(options)
                        for o in opts if o.acc == a)
        options = [[o for o in opts if o.acc != a] for opts in options]
        accs = tuple(c for c in accs if c != a)
    return options, accs


def build_instance(graph: Graph, profile: Profile, window: int = DEFAULT_WINDOW, nested: bool = True,
                   prune: bool = False) -> Instance:
    """nested=False: the re-run steps of single-level chain recompute only (each op re-run at most once, at or
    before its first backward reader): a smaller model, the first phase of ``port.solver.solve_ilp``.
    prune=True: without the options of dominated accelerators (``prune_dominated``): the same optimum, a
    smaller model; for the solvers that search every placement (the ILP), not for baselines that pin one."""
    from port.errors import PlanError
    prods = graph.producers()
    caps = dict(profile.accelerator_caps)
    chains = {k: ch.ops for k, ch in V.chains(graph).items()}
    options: list[list[Option]] = []
    excluded = []
    for o in graph.ops:
        opts = []
        io = sum(graph.tensors[t].bytes for t in dict.fromkeys(o.inputs + o.outputs) if graph.tensors[t].alias_of is None)
        for e in profile.options(graph.signature(o)):
            if e.variant == "inplace" and not (V.inplace_legal(graph, o) or V.follows_forward_inplace(graph, o)):
                continue
            if e.variant == "fused":
                ch = V.chain_of(graph, o)
                if ch is None:
                    continue
                conv = ch.ops[0]
                # every op of the chain must have a fused entry on this accelerator
                if any(graph.ops[c].id != o.id and profile.lookup(graph.signature(graph.ops[c]), e.accelerator, "fused") is None
                       for c in chains[conv]):
                    continue
            if e.accelerator in caps and io + e.extra_bytes > caps[e.accelerator]:
                excluded.append((o.id, e.accelerator, e.variant, "cap"))
                continue
            opts.append(Option(e.accelerator, e.variant, float(e.latency_ms), e.extra_bytes, float(e.issue_ms)))
        if not opts:
            raise PlanError(f"op {o.name!r} ({o.kind}) has no usable (accelerator, variant) in profile "
                            f"{profile.device!r}: profile it or lift the memory cap")
        opts.sort(key=lambda x: (x.acc, x.var))
        options.append(opts)
    accs = tuple(profile.accelerators)
    if prune:
        options, accs = prune_dominated(profile, options, excluded)
    S = SEM.static_bytes(graph)
    readers = SEM.readers_by_root(graph, skip=lambda t: SEM.is_static(graph, t))
    roots = SEM.activation_roots(graph)

    nonmat = {}
    for conv, ch in V.chains(graph).items():
        for t in ch.nonmat:
            nonmat[graph.storage_root(t)] = conv
    inplace_ops = {}
    for i, o in enumerate(graph.ops):
        if any(op.var == "inplace" for op in options[i]) and V.inplace_legal(graph, o):
            x, y = graph.storage_root(o.inputs[0]), graph.storage_root(o.outputs[0])
            if graph.tensors[x].bytes != graph.tensors[y].bytes:
                raise PlanError(f"inplace op {o.name!r} changes the tensor size")
            inplace_ops[i] = (x, y)
    fused_inplace = {q: (graph.storage_root(x), graph.storage_root(y)) for q, (x, y) in V.fused_inplace(graph).items()
                     if any(o.var == "fused" for o in options[q])}

    # recompute candidates and their default times (port.plan.semantics.recompute_times)
    tau = SEM.recompute_times(graph)
    outs_of = {p: SEM.owned_activation_outputs(graph, p) for p in tau}
    # legacy soundness (fixed tau): kept for the legacy-rule baselines (greedy) and warm starts
    rc_needs: dict[int, list[tuple[str, int]]] = {}
    for pid in sorted(tau):
        o = graph.ops[pid]
        t_p = tau[pid]
        ok = any(op.var not in ("inplace", "fused") for op in options[pid])
        needs: list[tuple[str, int]] = []
        for u in dict.fromkeys(o.inputs):
            if SEM.is_static(graph, u):
                continue
            ru = graph.storage_root(u)
            R = roots[ru]
            if R.bwd_first is not None:
                if R.death < t_p:
                    ok = False
                elif R.bwd_first > t_p:
                    needs.append(("kept", ru))
            else:
                pu = R.birth
                if pu in tau and tau[pu] == t_p:
                    needs.append(("rc", pu))
                else:
                    ok = False
        if ok:
            rc_needs[pid] = needs
    changed = True
    while changed:
        changed = False
        for pid in list(rc_needs):
            if any(k == "rc" and q not in rc_needs for k, q in rc_needs[pid]):
                del rc_needs[pid]
                changed = True

    # chain recompute: candidates P (any recomputable forward op with an option that is neither in-place nor
    # fused), own(P), inputs, and candidate steps C(P) = {own(Q) : Q = P or one of the next K forward ops}
    # U {tau_P} U (C(Q) of recomputable readers Q of P's pure outputs), restricted to t <= own(P), then
    # filtered to the steps at which every input can be available (fixpoint).
    fwd_ids = [o.id for o in graph.ops if o.phase == PHASE_FORWARD]
    fpos = {oid: k for k, oid in enumerate(fwd_ids)}
    own: dict[int, int | None] = {}
    rc_in: dict[int, list[tuple[str, int, int]]] = {}
    for pid in outs_of:
        if not any(op.var not in ("inplace", "fused") for op in options[pid]):
            continue
        bws = [roots[r].bwd_first for r in outs_of[pid] if roots[r].bwd_first is not None]
        own[pid] = min(bws) if bws else None
        ins = []
        ok = True
        for u in dict.fromkeys(graph.ops[pid].inputs):
            if SEM.is_static(graph, u):
                continue
            ru = graph.storage_root(u)
            R = roots[ru]
            ins.append(("saved" if R.bwd_first is not None else "pure", ru, R.birth))
        rc_in[pid] = ins
    # backward readers of each candidate's output roots: the steps a re-run copy must cover when P is dropped
    rc_cover = {r: sorted(c for c in readers.get(r, ()) if SEM.is_backward(graph, c)) for pid in own
                for r in outs_of[pid]}
    rc_times: dict[int, list[int]] = {}
    for pid in sorted(own, reverse=True):
        k0 = fpos[pid]
        ts = {own[q] for q in fwd_ids[k0:k0 + window + 1] if own.get(q) is not None}
        # one step earlier too: before the previous backward op allocates its gradient output
        if nested:
            ts |= {t - 1 for t in ts if SEM.is_backward(graph, t - 1)}
        if pid in tau:
            ts.add(tau[pid])
        for r in outs_of[pid]:
            if roots[r].bwd_first is None:
                for c in readers.get(r, ()):
                    ts.update(rc_times.get(c, ()))
        if own[pid] is not None:
            ts = {t for t in ts if t <= own[pid]}
        if own[pid] is not None and nested:
            # later re-runs (multi-level recompute): before a backward reader of P's outputs, or with a
            # recomputable reader re-run between P's first and last backward reader
            late = sorted({c for r in outs_of[pid] for c in rc_cover[r]})
            late += [c - 1 for c in late if c - 1 > own[pid]]
            last = max(late)
            ts.update(late)
            for r in outs_of[pid]:
                for c in readers.get(r, ()):
                    ts.update(t for t in rc_times.get(c, ()) if own[pid] < t <= last)
        rc_times[pid] = sorted(ts)
    changed = True
    while changed:
        changed = False
        for pid in sorted(rc_times):
            keep = []
            for t in rc_times[pid]:
                good = True
                for kind, ru, pu in rc_in[pid]:
                    if kind == "saved":
                        good = roots[ru].death >= t
                    else:   # a pure input: a copy of its producer re-run at or before t, held to t
                        good = bool(rc_times.get(pu)) and rc_times[pu][0] <= t
                    if not good:
                        break
                if good:
                    keep.append(t)
            if keep != rc_times[pid]:
                rc_times[pid] = keep
                changed = True
    rc_times = {p: ts for p, ts in rc_times.items() if ts}
    own = {p: own[p] for p in rc_times}
    rc_in = {p: rc_in[p] for p in rc_times}
    rc_cover = {r: rc_cover[r] for p in rc_times for r in outs_of[p]}
    # E(r): the steps a re-run copy of output root r may be held to (its last use): backward readers of r and
    # the candidate steps of recomputable readers of r, from its producer's first candidate step on
    rc_ends: dict[int, list[int]] = {}
    for pid in rc_times:
        for r in outs_of[pid]:
            es = set(rc_cover[r])
            for q, ins in rc_in.items():
                if any(ru == r for _k, ru, _pu in ins):
                    es.update(rc_times[q])
            rc_ends[r] = sorted(e for e in es if e >= rc_times[pid][0])
    tau = {p: tau[p] for p in rc_needs}
    rc_outputs = {p: outs_of[p] for p in set(rc_times) | set(tau)}

    early = SEM.early_update_candidates(graph)
    grad_bytes = sum(SEM.stored_bytes(graph.tensors[g]) for (_p, _pu, gs) in early.values() for g in gs)

    page_roots, page_ms = [], {}
    state_pages: dict[int, tuple[int, float]] = {}
    from port.solver.ownmem import own_memory_of
    ownmem = own_memory_of(graph, profile, accs)
    if profile.storage:
        st = dict(profile.storage)
        bw, lat = st.get("bandwidth_gbps", 0.0) * 1e6, st.get("latency_ms", 0.0)
        for r, R in sorted(roots.items()):
            if R.bwd_first is not None and graph.ops[R.birth].phase in (PHASE_FORWARD, PHASE_LOSS) \
                    and R.bwd_first > R.fwd_last + 1 and bw > 0:
                page_roots.append(r)
                page_ms[r] = 2 * (lat + graph.tensors[r].bytes / bw)     # the data, as the simulator pages it
        if bw > 0 and ownmem is None and st.get(STATE_PAGES_KEY, 1.0):     # (port-rt's spill file keeps none)
            state_pages = {r: (u, 2 * (lat + graph.tensors[r].bytes / bw))
                           for r, u in sorted(SEM.paged_state_updates(graph).items())}

    edges = [(t, u, w, graph.tensors[t].bytes)          # the plan semantics' hand-off edges (rule 7)
             for w, es in sorted(SEM.handoff_edges(graph).items()) for t, u in es]
    rc_inplace = {}
    for q, x in V.rerun_inplace_inputs(graph).items():
        p = prods.get(x)
        accs_q = frozenset(o.acc for o in options[q] if o.var == "inplace")
        if q in rc_times and p in rc_times and x in roots and x in rc_outputs.get(p, ()) and accs_q:
            rc_inplace[q] = (x, p, accs_q)
    return Instance(graph, profile, options, S, roots, chains, nonmat, inplace_ops, tau, rc_outputs, rc_needs,
                    own, rc_times, rc_cover, rc_ends, rc_in, early, grad_bytes, window,
                    page_roots, page_ms, edges, accs, excluded, nested, rc_inplace, prune,
                    ownmem, fused_inplace=fused_inplace, state_pages=state_pages)
