"""Replay a Plan in execution order: predicted step time and the memory timeline.

Independent of the solver (it imports nothing from ``port.solve``): it is the referee every plan is
checked against, so it re-derives lifetimes, aliasing, recompute times and costs from the graph itself.

Plan semantics (what the executor must do; solver/FORMULATION.md gives the same rules in math)
-------------------------------------------------------------------------------------------
Static memory (resident for the whole step, counted at every step): parameters, buffers, optimizer
state, parameter gradients, the input batch and the labels.

Every other tensor lives in a *storage root* (``alias_of`` views share their root; an op running
``inplace`` makes its first output share its first input's root; a ``fused`` conv+bn+act chain never
materialises the batch-norm output). A root is allocated when its producer runs and freed after the
last op that reads it (or any of its aliases); a root nobody reads is freed right after its producer.

At step t (op t in graph order) the executor does, in this order:
  1. page in every paged root whose first backward reader is op t;
  2. run the recompute group of step t, in increasing op id, each on its forward op's planned accelerator
     and variant (batch norm re-runs in training mode but must NOT update the running statistics).
     The group is {P : (P, t) in plan.recompute_at} when ``recompute_at`` is non-empty (the explicit,
     possibly chained schedule), else {P : P's outputs are in plan.recompute and tau(P) == t} (legacy rule);
  3. free the recomputed outputs that no backward op reads (pure intermediates that only fed the group);
  4. run op t (skipped here if t is an early update: it already ran, see 5);
  5. run the early updates whose gradient's last producer is op t (``plan.early_updates``, increasing
     op id): the optimizer step of that parameter, right after op t and before anything is freed;
  6. free every root whose last reader (counting an early update at its new position) was op t or one of
     the early updates of step 5.
A recomputed op's outputs are freed after their last forward/loss reader and live again from their
re-run step until their last backward reader; a paged root is written to storage and freed after its
last forward/loss reader.

Soundness of ``recompute_at`` (checked, PlanError otherwise): it names every producer of
``plan.recompute`` exactly once, sorted by (step, op id), each step a backward/update op no later than the
first backward reader of the op's outputs; every activation input of a re-run op is live at that moment
(kept, paged in earlier, re-run at an earlier step and still alive, or re-run earlier in the same group);
an input overwritten by a later in-place op cannot feed a recompute.

Early updates (checked): only update ops; no op other than the update reads the parameter or any of its
gradient roots after the gradient's last producer p_u, and no recompute that reads the parameter runs
after p_u. The gradient roots of an early-updated parameter are not static: each lives from its producer
to its last reader (the final one until the early update right after p_u).

tau(P), a function of the graph only (see ``recompute_times``): own(P) = the first backward reader of
any owned output of P; for each output r of P that no backward op reads (a "pure intermediate") and each
recomputable forward consumer Q of r: tau(P) = min(own(P), tau(Q)).

Static memory: as above, minus the parameter gradients of early-updated parameters.
Memory recorded per executed step (recompute ops and graph ops): static bytes + live roots + the
running op's workspace (OpCost.workspace_bytes). Time: the sum of op latencies (recomputes included),
hand-offs (per tensor and reading op, when producer and reader sit on different accelerators; a
recompute re-reads its inputs), and paging (write + read: 2 x (latency + bytes / bandwidth)).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import variants as V
from .errors import PlanError
from .types import (PHASE_BACKWARD, PHASE_FORWARD, PHASE_LOSS, PHASE_UPDATE, ROLE_ACTIVATION, ROLE_BUFFER,
                    ROLE_GRADIENT, ROLE_INPUT, ROLE_LABEL, ROLE_OPTIMIZER_STATE, ROLE_PARAMETER, Graph, Plan,
                    Profile)

NOT_RECOMPUTABLE_KINDS = ("reshape", "dropout")   # dropout: the mask must not be redrawn


@dataclass(frozen=True)
class SimResult:
    step_ms: float
    peak_bytes: int
    timeline: tuple[int, ...]                 # bytes in use during each executed step (static included)
    steps: tuple[tuple[str, int], ...]        # ("op", id) or ("recompute", id), executed order
    peak_step: int                            # index into steps/timeline
    peak_tensors: tuple[str, ...]             # roots live at the peak, largest first
    static_bytes: int
    breakdown: dict = field(default_factory=dict)   # compute/recompute/handoff/paging ms
    gantt: tuple[tuple[str, str, float, float], ...] = ()  # (label, accelerator, start_ms, end_ms)


# ---------------------------------------------------------------------------------------------
# graph-only facts
# ---------------------------------------------------------------------------------------------
def is_static(graph: Graph, tid: int) -> bool:
    t = graph.tensors[graph.storage_root(tid)]
    if t.role in (ROLE_PARAMETER, ROLE_BUFFER, ROLE_OPTIMIZER_STATE, ROLE_INPUT, ROLE_LABEL):
        return True
    if t.role == ROLE_GRADIENT and t.grad_of is not None and graph.tensors[t.grad_of].role == ROLE_PARAMETER:
        return True
    return False


def static_bytes(graph: Graph) -> int:
    return sum(t.bytes for t in graph.tensors if t.alias_of is None and is_static(graph, t.id))


def _static_readers(graph: Graph) -> dict[int, list[int]]:
    """storage root (static aliasing only) -> ops reading it or any of its views, in order."""
    out: dict[int, list[int]] = {}
    for o in graph.ops:
        for t in dict.fromkeys(o.inputs):
            out.setdefault(graph.storage_root(t), []).append(o.id)
    return out


def _is_bwd(graph: Graph, oid: int) -> bool:
    return graph.ops[oid].phase in (PHASE_BACKWARD, PHASE_UPDATE)


def owned_activation_outputs(graph: Graph, oid: int) -> tuple[int, ...]:
    return tuple(t for t in graph.ops[oid].outputs
                 if graph.tensors[t].alias_of is None and graph.tensors[t].role == ROLE_ACTIVATION)


def recompute_times(graph: Graph) -> dict[int, int]:
    """Forward op id -> its recompute time tau (a backward op id), for every recomputable op."""
    readers = _static_readers(graph)
    tau: dict[int, int] = {}
    for o in reversed(graph.ops):
        if o.phase != PHASE_FORWARD or o.kind in NOT_RECOMPUTABLE_KINDS:
            continue
        outs = owned_activation_outputs(graph, o.id)
        if not outs:
            continue
        cand = []
        for r in outs:
            bw = [c for c in readers.get(r, ()) if _is_bwd(graph, c)]
            if bw:
                cand.append(min(bw))
            else:  # pure intermediate: needed when a recomputed consumer is re-run
                for c in readers.get(r, ()):
                    if c in tau:
                        cand.append(tau[c])
        if cand:
            tau[o.id] = min(cand)
    return tau


# ---------------------------------------------------------------------------------------------
# the replay
# ---------------------------------------------------------------------------------------------
def _validate_variants(graph: Graph, profile: Profile, plan: Plan) -> list[tuple[str, str, object]]:
    if len(plan.ops) != len(graph.ops):
        raise PlanError(f"plan has {len(plan.ops)} op decisions, graph {graph.name!r} has {len(graph.ops)} ops")
    costs = []
    for o, d in zip(graph.ops, plan.ops):
        if d.op != o.id:
            raise PlanError(f"plan decision #{o.id} is for op {d.op}; decisions must be in op-id order")
        c = profile.lookup(graph.signature(o), d.accelerator, d.variant)
        if c is None:
            raise PlanError(f"op {o.name!r}: ({d.accelerator}, {d.variant}) is not in the profile")
        if d.variant == "inplace" and not V.inplace_legal(graph, o):
            raise PlanError(f"op {o.name!r}: inplace is not legal here")
        if d.variant == "fused":
            conv = o.id if o.kind == "conv2d" else V.fused_into(graph, o)
            chain = V.fusion_chain(graph, graph.ops[conv]) if conv is not None else None
            if chain is None:
                raise PlanError(f"op {o.name!r}: fused is not legal here")
            for c_id in chain:
                dc = plan.ops[c_id]
                if dc.variant != "fused" or dc.accelerator != d.accelerator:
                    raise PlanError(f"fused chain {[graph.ops[i].name for i in chain]} must run fused together "
                                    f"on one accelerator")
        costs.append((d.accelerator, d.variant, c))
    for a, b in V.inplace_conflicts(graph):
        if plan.ops[a].variant == "inplace" and plan.ops[b].variant == "inplace":
            raise PlanError(f"ops {graph.ops[a].name!r} and {graph.ops[b].name!r} may not both run inplace")
    return costs


def param_grad_roots(graph: Graph, param: int) -> tuple[int, ...]:
    """Storage roots of every gradient tensor of parameter ``param`` (partial sums included)."""
    return tuple(t.id for t in graph.tensors
                 if t.role == ROLE_GRADIENT and t.grad_of == param and t.alias_of is None)


def early_update_info(graph: Graph, uid: int) -> tuple[int, int, tuple[int, ...]]:
    """(parameter id, p_u = last producer of its gradient, gradient roots) for update op ``uid``;
    PlanError when an early update of it is not legal."""
    if not (0 <= uid < len(graph.ops)) or graph.ops[uid].phase != PHASE_UPDATE:
        raise PlanError(f"early_updates names op {uid}, which is not an update op")
    o = graph.ops[uid]
    param = graph.storage_root(o.inputs[0])
    groots = param_grad_roots(graph, param)
    prods = graph.producers()
    if not groots or any(g not in prods for g in groots):
        raise PlanError(f"update {o.name!r}: gradient of {graph.tensors[param].name!r} not produced in the step")
    pu = max(prods[g] for g in groots)
    watch = set(groots) | {param}
    for q in graph.ops[pu + 1:]:
        if q.id != uid and any(graph.storage_root(t) in watch for t in q.inputs):
            raise PlanError(f"update {o.name!r} cannot run early: {q.name!r} reads {graph.tensors[param].name!r} "
                            f"or its gradient after the gradient is complete")
    return param, pu, groots


def simulate(plan: Plan, graph: Graph, profile: Profile) -> SimResult:
    costs = _validate_variants(graph, profile, plan)
    dec = plan.ops
    prods = graph.producers()

    # early updates: their gradient roots leave static memory
    early_at: dict[int, list[int]] = {}
    early_pos: dict[int, int] = {}
    early_params: dict[int, int] = {}
    dyn_grads: set[int] = set()
    if len(set(plan.early_updates)) != len(plan.early_updates):
        raise PlanError("early_updates lists an update twice")
    for u in sorted(plan.early_updates):
        param, pu, groots = early_update_info(graph, u)
        early_at.setdefault(pu, []).append(u)
        early_pos[u] = pu
        early_params[u] = param
        dyn_grads.update(groots)
    S = static_bytes(graph) - sum(graph.tensors[g].bytes for g in dyn_grads)

    def st(t: int) -> bool:
        return is_static(graph, t) and graph.storage_root(t) not in dyn_grads

    # dynamic storage roots (views + inplace), materialisation (fused chains)
    dalias: dict[int, int] = {}
    nonmat: set[int] = set()
    for o in graph.ops:
        if dec[o.id].variant == "inplace":
            dalias[o.outputs[0]] = o.inputs[0]
        if o.kind == "conv2d" and dec[o.id].variant == "fused":
            chain = V.fusion_chain(graph, o)
            if len(chain) == 3:
                nonmat.add(graph.ops[chain[1]].outputs[0])

    def droot(t: int) -> int:
        while True:
            s = graph.tensors[t]
            if s.alias_of is not None:
                t = s.alias_of
            elif t in dalias:
                t = dalias[t]
            else:
                return t

    members: dict[int, list[int]] = {}
    for t in graph.tensors:
        if not st(t.id):
            members.setdefault(droot(t.id), []).append(t.id)
    readers: dict[int, list[int]] = {}
    for o in graph.ops:
        for t in dict.fromkeys(o.inputs):
            if not st(t):
                r = droot(t)
                if not readers.get(r) or readers[r][-1] != o.id:
                    readers.setdefault(r, []).append(o.id)

    def rbytes(r: int) -> int:
        return 0 if r in nonmat else graph.tensors[r].bytes

    def pos(oid: int) -> int:           # where an op runs (early updates: right after p_u)
        return early_pos.get(oid, oid)

    birth = {r: prods[r] for r in members if r in prods}
    death = {r: max([pos(c) for c in readers.get(r, [])] + [birth[r]]) for r in birth}

    def fwd_last(r: int) -> int:
        f = [c for c in readers.get(r, ()) if not _is_bwd(graph, c)]
        return max(f + [birth[r]])

    def bwd_first(r: int) -> int | None:
        b = [c for c in readers.get(r, ()) if _is_bwd(graph, c)]
        return min(b) if b else None

    # -- recompute / paging validation ------------------------------------------------------
    tau_all = recompute_times(graph)
    rc_ops: dict[int, list[int]] = {}
    for t in plan.recompute:
        if not (0 <= t < len(graph.tensors)):
            raise PlanError(f"recompute names tensor id {t}, which the graph does not have")
        p = prods.get(t)
        if p is None or p not in tau_all or t not in owned_activation_outputs(graph, p):
            raise PlanError(f"tensor {graph.tensors[t].name!r} cannot be recomputed (its producer is not a "
                            f"recomputable forward op)")
        rc_ops.setdefault(p, []).append(t)
    for p, ts in rc_ops.items():
        outs = owned_activation_outputs(graph, p)
        if set(ts) != set(outs):
            raise PlanError(f"recomputing op {graph.ops[p].name!r} regenerates all of "
                            f"{[graph.tensors[t].name for t in outs]}: list them all in plan.recompute")
        if dec[p].variant in ("inplace", "fused"):
            raise PlanError(f"op {graph.ops[p].name!r} runs {dec[p].variant}: it cannot be recomputed")
        for t in outs:
            if members.get(t) is None or droot(t) != t or any(droot(m) != t or (m != t and graph.tensors[m].alias_of is None)
                                                               for m in members[t]):
                raise PlanError(f"tensor {graph.tensors[t].name!r} shares storage with an in-place op: "
                                f"it cannot be recomputed")
        for u in dict.fromkeys(graph.ops[p].inputs):
            if st(u):
                continue
            ru = graph.storage_root(u)
            for q in graph.ops:
                if (q.id != p and q.id > prods.get(u, -1) and dec[q.id].variant == "inplace"
                        and graph.storage_root(q.inputs[0]) == ru):
                    raise PlanError(f"recompute of {graph.ops[p].name!r} reads {graph.tensors[u].name!r}, which "
                                    f"the in-place op {q.name!r} overwrites")
    # the recompute schedule: explicit (recompute_at) or the legacy tau rule
    when: dict[int, int] = {}
    if plan.recompute_at:
        try:
            at = [(int(a), int(b)) for a, b in plan.recompute_at]
        except (TypeError, ValueError):
            raise PlanError("recompute_at must be a sequence of (op id, step) pairs") from None
        if at != sorted(at, key=lambda x: (x[1], x[0])):
            raise PlanError("recompute_at must be sorted by (step, op id)")
        for p, t in at:
            if p in when:
                raise PlanError(f"recompute_at re-runs {graph.ops[p].name if 0 <= p < len(graph.ops) else p!r} twice")
            if p not in rc_ops:
                raise PlanError(f"recompute_at re-runs op {p}, but plan.recompute lists none of its outputs")
            if not (0 <= t < len(graph.ops)) or not _is_bwd(graph, t):
                raise PlanError(f"recompute_at: {graph.ops[p].name!r} at step {t}, which is not a backward op")
            for r in rc_ops[p]:
                bf = bwd_first(r)
                if bf is not None and t > bf:
                    raise PlanError(f"recompute_at: {graph.ops[p].name!r} re-runs at step {t}, after its output "
                                    f"{graph.tensors[r].name!r} is first read in backward (step {bf})")
            when[p] = t
        missing = set(rc_ops) - set(when)
        if missing:
            raise PlanError(f"recompute_at has no step for {sorted(graph.ops[p].name for p in missing)}")
    else:
        when = {p: tau_all[p] for p in rc_ops}
    for u, param in early_params.items():
        for p, t in when.items():
            if t > early_pos[u] and any(graph.storage_root(x) == param for x in graph.ops[p].inputs):
                raise PlanError(f"recompute of {graph.ops[p].name!r} at step {t} reads "
                                f"{graph.tensors[param].name!r} after its early update")
    paged = set(plan.paged)
    if paged and not profile.storage:
        raise PlanError(f"plan pages tensors but profile {profile.device!r} declares no storage")
    for t in paged:
        if not (0 <= t < len(graph.tensors)) or t not in birth or graph.ops[birth[t]].phase not in (PHASE_FORWARD, PHASE_LOSS):
            raise PlanError(f"tensor id {t} cannot be paged (not an activation root produced in the forward pass)")
        if any(m != t and graph.tensors[m].alias_of is None for m in members[t]) or droot(t) != t:
            raise PlanError(f"tensor {graph.tensors[t].name!r} shares storage with an in-place op: it cannot be paged")
        if bwd_first(t) is None:
            raise PlanError(f"tensor {graph.tensors[t].name!r} is not read in the backward pass: nothing to page")
        if prods[t] in rc_ops:
            raise PlanError(f"tensor {graph.tensors[t].name!r} is both paged and recomputed")
        if t in nonmat:
            raise PlanError(f"tensor {graph.tensors[t].name!r} is never materialised (fused chain): it cannot be paged")

    # -- intervals --------------------------------------------------------------------------
    alloc: dict[int, list[int]] = {}
    free_after: dict[int, list[int]] = {}
    page_in: dict[int, list[int]] = {}
    groups: dict[int, list[int]] = {}
    transient: dict[int, list[int]] = {}
    for r, b in birth.items():
        alloc.setdefault(b, []).append(r)
        dropped = r in paged or prods[r] in rc_ops
        end = fwd_last(r) if dropped else death[r]
        free_after.setdefault(end, []).append(r)
        if r in paged:
            bf = bwd_first(r)
            page_in.setdefault(bf, []).append(r)
            free_after.setdefault(death[r], []).append(r)
    for p, tau in when.items():
        groups.setdefault(tau, []).append(p)
        for r in rc_ops[p]:
            if bwd_first(r) is None:
                transient.setdefault(tau, []).append(r)
            else:
                free_after.setdefault(death[r], []).append(r)

    live: dict[int, int] = {}
    timeline: list[int] = []
    steps: list[tuple[str, int]] = []
    snapshots: list[tuple[int, ...]] = []
    gantt: list[tuple[str, str, float, float]] = []
    clock = 0.0
    comp = rcomp = hand = pagems = 0.0
    total = 0

    def add(r: int) -> None:
        nonlocal total
        if r in live:
            raise PlanError(f"{graph.tensors[r].name!r} is materialised twice (recomputed while still live)")
        live[r] = rbytes(r)
        total += live[r]

    def drop(r: int) -> None:
        nonlocal total
        total -= live.pop(r)

    def handoff_ms(tid: int, consumer: int) -> float:
        u = prods.get(tid)
        if u is None or u >= consumer:
            return 0.0
        a, b = dec[u].accelerator, dec[consumer].accelerator
        if a == b:
            return 0.0
        return profile.handoff_cost(a, b).cost_ms(graph.tensors[tid].bytes)

    def check_inputs(oid: int, what: str) -> None:
        for t in graph.ops[oid].inputs:
            if st(t) or droot(t) in nonmat:
                continue
            if droot(t) not in live:
                raise PlanError(f"{what} {graph.ops[oid].name!r} reads {graph.tensors[t].name!r}, which is not in "
                                f"memory then (dropped and not restored)")

    def record(kind: str, oid: int, ws: int) -> None:
        timeline.append(S + total + ws)
        steps.append((kind, oid))
        snapshots.append(tuple(live))

    def run_op(t: int) -> None:
        nonlocal clock, comp, hand
        check_inputs(t, "op")
        for r in alloc.get(t, ()):
            add(r)
        acc, var, c = costs[t]
        h = sum(handoff_ms(x, t) for x in dict.fromkeys(graph.ops[t].inputs))
        record("op", t, c.workspace_bytes)
        comp += c.latency_ms
        hand += h
        gantt.append((graph.ops[t].name, acc, clock + h, clock + h + c.latency_ms))
        clock += h + c.latency_ms

    if profile.storage:
        stg = dict(profile.storage)
        bw = stg.get("bandwidth_gbps", 0.0) * 1e6   # bytes per ms
        lat = stg.get("latency_ms", 0.0)
    for t in range(len(graph.ops)):
        for r in page_in.get(t, ()):
            add(r)
            c = 2 * (lat + graph.tensors[r].bytes / bw)
            pagems += c
            gantt.append((f"page {graph.tensors[r].name}", "storage", clock, clock + c))
            clock += c
        for p in sorted(groups.get(t, ())):
            check_inputs(p, "recompute of")
            for r in owned_activation_outputs(graph, p):
                add(r)
            acc, var, c = costs[p]
            h = sum(handoff_ms(x, p) for x in dict.fromkeys(graph.ops[p].inputs))
            record("recompute", p, c.workspace_bytes)
            rcomp += c.latency_ms
            hand += h
            gantt.append((f"{graph.ops[p].name} (recompute)", acc, clock + h, clock + h + c.latency_ms))
            clock += h + c.latency_ms
        for r in transient.get(t, ()):
            drop(r)
        if t not in early_pos:
            run_op(t)
        for u in early_at.get(t, ()):
            run_op(u)
        for r in free_after.get(t, ()):
            if r in live:
                drop(r)
    if total != 0 and live:
        # everything non-static must be freed by the end of the step
        raise PlanError(f"internal: tensors still live at the end: {[graph.tensors[r].name for r in live][:5]}")
    pk = max(range(len(timeline)), key=lambda i: (timeline[i], -i))
    peak_roots = sorted(snapshots[pk], key=lambda r: -rbytes(r))
    kind, oid = steps[pk]
    ws = costs[oid][2].workspace_bytes
    names = tuple(f"{graph.tensors[r].name} ({rbytes(r)} B)" for r in peak_roots if rbytes(r) > 0)
    if ws:
        names = names + (f"workspace of {graph.ops[oid].name} ({ws} B)",)
    names = names + (f"static: parameters/buffers/gradients/optimizer state/input ({S} B)",)
    return SimResult(
        step_ms=comp + rcomp + hand + pagems, peak_bytes=timeline[pk], timeline=tuple(timeline),
        steps=tuple(steps), peak_step=pk, peak_tensors=names, static_bytes=S,
        breakdown={"compute_ms": comp, "recompute_ms": rcomp, "handoff_ms": hand, "paging_ms": pagems},
        gantt=tuple(gantt))
