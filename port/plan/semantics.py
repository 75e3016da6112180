"""What a plan means: the one definition of a plan's rules, consumed by the simulator (port.verify.simulate),
the ILP instance builder (port.solver.instance) and lowering (port.lower.lower). None of them re-implements a
rule; the simulator stays an independent check of the ILP because it replays ``schedule(graph, plan)`` with
its own accounting and shares none of the ILP's variables.

Static memory (resident for the whole step): parameters, buffers, optimizer state, parameter gradients (except
those of early-updated parameters) that an op reads or writes (``held_static_roots``: a buffer no op touches, as
batch norm's ``num_batches_tracked``, has no arena slot), the input batch and the labels, and the loss-gradient
scale (a one-float constant the loss's input gradient reads: 1 / micro-batches) where the graph's calls read it.

Bytes (the arena's rule, port.lower.arena): every storage root, static or not, takes its data's bytes rounded up
to the arena's 64-byte alignment (``stored_bytes``: port.lower.program.ALIGN; a 4-byte loss or the scale takes
64 B), and so does an op's arena workspace (port.cost.types.OpCost.extra_bytes). The loss stays live from its
producer to the end of the step (readable after it, as the lowered program keeps it). With these, a plan's
memory at each op is exactly the bytes its lowered program holds live at that op's calls (the arena's live
bound, ``Program.peak_live_bytes``, for a plan on the C backend), so a budget the plan's peak fits bounds the
arena up to the packing's fragmentation.

Engine memory (resident for the whole step, outside the arena): every accelerator the plan runs at least one op
on brings its execution engine's footprint (``Profile.engine_bytes``: code pages, caches, retained heap that
engine keeps once it ran the graph's kernels), paid once per accelerator however many ops run there
(``engine_bytes``).

Every other tensor lives in a *storage root*: ``alias_of`` views share their root (a range view, ``narrow_view``,
at an offset inside it: it owns no bytes, its readers keep the root alive, and it is never re-run: a re-run of the
root's producer re-makes it at the same offset of the new copy); an op running ``inplace``
makes its first output share its first input's root; a ``fused`` chain (port.plan.variants.FUSIONS) never
materialises its intermediates (conv -> batch norm -> relu: the batch-norm output; SwiGLU: silu(a) and its
gradient), and a member's outputs are allocated when the call computing them runs (conv -> bn -> relu: the conv
op; SwiGLU's da: the mul's gradient op). A chain's call op reads the inputs of the members it covers in every
plan (port.plan.variants.fused_reads), so fusing never ends a tensor's life early.
A root is allocated when its producer runs and freed after the last op
that reads it (or one of its aliases); a root nobody reads is freed right after its producer.

At step t (op t in graph order) a plan runs, in this order (``schedule`` emits exactly these events):
  1. ``page_in`` every paged root whose first backward reader is op t, and every paged optimizer-state root
     whose update runs at step t (op t, or an early update of step 4);
  2. ``recompute`` the re-run group of step t, in increasing op id, each on its forward op's accelerator and
     variant (batch norm re-runs in training mode but does not update its running statistics). The group is
     {P : (P, t) in plan.recompute_at} when ``recompute_at`` is given, else {P : tau(P) == t}; right after each
     re-run, ``free`` the roots whose last use was that re-run. A re-run (Q, t) in ``plan.inplace_reruns`` runs
     Q's ``inplace`` call: its output takes over the storage of its first input x's copy instead of a new
     buffer (legal when port.plan.variants.rerun_inplace_inputs names x for Q, x's producer re-runs earlier in
     the same group, and that copy's last use is this re-run; ``inplace_ok`` lists every such re-run);
  3. ``op`` t (unless t is an early update: it already ran, see 4);
  4. ``op`` u for the early updates u whose gradient's last producer is op t (increasing op id);
  4b. ``join`` queue a for every (a, t) in ``plan.joins``: the host waits for queue a (rule 8);
  5. ``page_out`` every paged root whose last forward/loss reader was op t (or an early update of step 4), and
     every paged optimizer-state root whose update ran at step t;
  6. ``free`` every root whose last use was op t or an early update of step 4.
  7. (within 2-4) right before each op or re-run Q: a ``handoff`` of every tensor Q reads that an earlier op
     produced on another accelerator (one event per tensor, ``handoff_edges``; a re-run re-reads its inputs).
     The simulator and the ILP price it from the profile's measured latency + bytes / bandwidth of that engine
     pair; lowering turns it into a ``handoff`` call where the bytes cross engines that do not share a queue (a
     synchronisation on unified memory; none between the CPU engines, which share one arena and run
     synchronously). A view runs no kernel: the hand-off of the bytes it passes on happens where a kernel reads
     them.
  8. (after 1-7) bytes an op on a queued engine (an accelerator whose backend runs asynchronously on a queue,
     port.lower.program.QUEUED_BACKENDS, on host memory: not one of ``plan.own_memory``) read or wrote stay that
     queue's until the host joins it (``join_frees``): a ``free`` of such a root waits for the next join, a
     hand-off from that queue (right after it), an explicit ``join`` of it (step 4b: so a root freed at that step
     is freed at once), a page call (right before it: it waits for every queue), the end
     of the main pass (before the first late update: the executor drains every queue there) or the end of the
     step. The queued op may still be running when the host passes its free, and a later host call must not
     write its bytes before it has run (port.exec.handoff.host_waits would wait there: a wait no lane prices).
     A held root that an event allocates again (a re-run's copy) is freed right before it.
A *use* of a root is an op or a re-run reading it (or one of its views). Every root lives from its allocation
to its last use, re-runs included: a kept input of a re-run stays until the re-run. A recomputed root has one
*copy* per allocation: the forward one, then one per re-run of its producer (an op may be re-run at several
steps: multi-level recompute, where a re-run segment is dropped again and re-run later from copies made by
other re-runs). Each use is served by the newest copy allocated at or before it; each copy is freed after its
last use before the next re-run. A paged root is written to storage after its last forward/loss reader and read
back before its first backward reader (re-runs may read it only from then on).

Paged optimizer state: an optimizer-state root in ``plan.paged`` (SGD's momentum, AdamW's m and v: each read
and written by its parameter's update alone, ``paged_state_updates``) leaves static memory. It lives in storage
between steps (its storage holds the true state: the executor's spill file, which the Trainer reads and writes
for ``optimizer_state``/checkpoints) and in the arena only during the step its update runs at: paged in before
that step's op (rule 1), paged out after the update (rule 5) and freed (rule 6). Each step pages it in and out
once, priced like an activation's pages. Only where the update phase runs (``phases``); elsewhere it is static.

tau(P), a function of the graph only (``recompute_times``): own(P) = the first backward reader of any owned
output of P; for each output r of P that no backward op reads (a "pure intermediate") and each recomputable
forward consumer Q of r: tau(P) = min(own(P), tau(Q)).

Legality (``validate``; PlanError otherwise): one decision per op in op-id order; ``inplace`` only where
port.plan.variants.inplace_legal holds and never on both ops of an inplace_conflicts pair; a fused chain runs
fused as a whole on one accelerator; a batch norm's backward ops run ``inplace`` (from the output) exactly when
the batch norm does; recompute lists all owned outputs of recomputable forward ops that run neither in place
nor fused, and never reads an input a later in-place op overwrites; ``recompute_at`` lists (producer, step)
pairs once each, sorted by (step, op id), at backward steps, every re-run read before the next re-run of the
same op; paged tensors are unshared activation roots produced in the forward pass and read
in backward, or optimizer-state roots (``paged_state_updates``);
early updates are update ops whose parameter and gradient nobody reads after the gradient's last
producer p_u, and no recompute reading the parameter runs after p_u.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from port.errors import PlanError
from port.ir.types import (PHASE_BACKWARD, PHASE_FORWARD, PHASE_LOSS, PHASE_UPDATE, PHASES, ROLE_ACTIVATION,
                           ROLE_BUFFER, ROLE_GRADIENT, ROLE_INPUT, ROLE_LABEL, ROLE_OPTIMIZER_STATE, ROLE_PARAMETER,
                           Graph)
from port import ops
from port.lower.program import ALIGN, GRAD_SCALE_ID, align
from port.plan import variants as V
from port.plan.types import Plan

NOT_RECOMPUTABLE_KINDS = ops.with_tag("not_recomputable")   # views cost nothing; a random mask must not be redrawn
# the variants of ops never re-run (Legality, above: recompute lists ops that run neither in place nor fused)
NOT_RERUN_VARIANTS = ("inplace", "fused")


# =============================================================================================
# graph facts
# =============================================================================================
def is_static(graph: Graph, tid: int) -> bool:
    """Whether tensor ``tid`` is stored in static memory (the whole step): a parameter, buffer, optimizer state,
    input or label, or a parameter's gradient, or a view of one. Once per graph (schedule asks per read)."""
    def flags() -> list[bool]:
        def static(t) -> bool:
            if t.role in (ROLE_PARAMETER, ROLE_BUFFER, ROLE_OPTIMIZER_STATE, ROLE_INPUT, ROLE_LABEL):
                return True
            return t.role == ROLE_GRADIENT and t.grad_of is not None and graph.tensors[t.grad_of].role == ROLE_PARAMETER
        return [static(graph.tensors[graph.storage_root(t.id)]) for t in graph.tensors]
    return graph.memo("static_tensors", flags)[tid]


def stored_bytes(tensor) -> int:
    """The bytes a tensor's storage takes: its data rounded up to the arena's 64-byte alignment (each root's
    offset is aligned). Every memory figure of a plan counts these."""
    return align(tensor.bytes)


def reads_grad_scale(graph: Graph) -> bool:
    """Whether a call of ``graph`` reads the loss-gradient scale (a 64-byte constant slot of the program)."""
    def find() -> bool:
        for o in graph.ops:
            r = ops.RECORDS.get(o.kind) or ops.owner(o.kind)
            calls = r.calls(graph, o, "plain") if r is not None and r.calls is not None else None
            if calls and any(GRAD_SCALE_ID in c[2] for c in calls):
                return True
        return False
    return graph.memo("reads_grad_scale", find)


def held_static_roots(graph: Graph) -> tuple[int, ...]:
    """The static roots a step holds: the input batch and labels, and every static root an op reads or writes
    (a buffer no op touches, batch norm's ``num_batches_tracked``, has no slot in the arena)."""
    def find() -> tuple[int, ...]:
        used = {graph.storage_root(t) for o in graph.ops for t in o.inputs + o.outputs}
        used.update(graph.storage_root(t) for t in graph.input_ids + (graph.label_id,) if 0 <= t < len(graph.tensors))
        return tuple(t.id for t in graph.tensors if t.alias_of is None and t.id in used and is_static(graph, t.id))
    return graph.memo("held_static_roots", find)


def static_bytes(graph: Graph) -> int:
    """The stored bytes of the static roots a step holds, plus the loss-gradient scale's slot where the graph
    reads it."""
    return (sum(stored_bytes(graph.tensors[r]) for r in held_static_roots(graph))
            + (ALIGN if reads_grad_scale(graph) else 0))


def loss_root(graph: Graph) -> int | None:
    """The storage root of the loss (kept to the end of the step), None when the graph has no loss."""
    return graph.storage_root(graph.loss_id) if 0 <= graph.loss_id < len(graph.tensors) else None


def engine_bytes(plan: Plan, profile) -> int:
    """The engine memory of ``plan``: the footprint of every accelerator it places an op on, once each."""
    if not profile.engine_bytes:
        return 0
    return sum(profile.engine_bytes_of(a) for a in dict.fromkeys(d.accelerator for d in plan.ops))


def is_backward(graph: Graph, oid: int) -> bool:
    return graph.ops[oid].phase in (PHASE_BACKWARD, PHASE_UPDATE)


def owned_activation_outputs(graph: Graph, oid: int) -> tuple[int, ...]:
    return tuple(t for t in graph.ops[oid].outputs
                 if graph.tensors[t].alias_of is None and graph.tensors[t].role == ROLE_ACTIVATION)


def readers_by_root(graph: Graph, root_of=None, ops=None, skip=None) -> dict[int, list[int]]:
    """storage root -> ids of the ops reading it or any tensor stored on it, in order (each op once). A fused
    chain's call op reads the inputs of the members it covers too (port.plan.variants.fused_reads), fused or
    not: one liveness for both."""
    root_of = root_of or graph.storage_root
    out: dict[int, list[int]] = {}
    extra = V.fused_reads(graph)
    for o in (graph.ops if ops is None else ops):
        for t in dict.fromkeys(o.inputs + extra.get(o.id, ())):
            if skip is not None and skip(t):
                continue
            r = root_of(t)
            lst = out.setdefault(r, [])
            if not lst or lst[-1] != o.id:
                lst.append(o.id)
    return out


def recompute_times(graph: Graph) -> dict[int, int]:
    """Forward op id -> tau, the step before which it is re-run by default, for every recomputable op (once per
    graph: every schedule asks; the caller's own copy)."""
    return dict(graph.memo("recompute_times", lambda: _recompute_times(graph)))


def _recompute_times(graph: Graph) -> dict[int, int]:
    readers = readers_by_root(graph)
    tau: dict[int, int] = {}
    for o in reversed(graph.ops):
        if o.phase != PHASE_FORWARD or o.kind in NOT_RECOMPUTABLE_KINDS:
            continue
        outs = owned_activation_outputs(graph, o.id)
        if not outs:
            continue
        cand = []
        for r in outs:
            bw = [c for c in readers.get(r, ()) if is_backward(graph, c)]
            if bw:
                cand.append(min(bw))
            else:   # pure intermediate: needed when a recomputed consumer is re-run
                cand += [tau[c] for c in readers.get(r, ()) if c in tau]
        if cand:
            tau[o.id] = min(cand)
    return tau


@dataclass(frozen=True)
class RootInfo:
    """A non-static storage root produced in the step (static aliasing: views only)."""
    id: int
    bytes: int
    birth: int             # producer op
    death: int             # last reader (birth if none)
    fwd_last: int          # last forward/loss reader (birth if none)
    bwd_first: int | None  # first backward/update reader


def activation_roots(graph: Graph) -> dict[int, RootInfo]:
    prods = graph.producers()
    readers = readers_by_root(graph, skip=lambda t: is_static(graph, t))
    loss = loss_root(graph)
    out: dict[int, RootInfo] = {}
    for t in graph.tensors:
        if t.alias_of is None and not is_static(graph, t.id) and t.id in prods:
            p = prods[t.id]
            rd = readers.get(t.id, [])
            fw = [c for c in rd if not is_backward(graph, c)]
            bw = [c for c in rd if is_backward(graph, c)]
            end = len(graph.ops) - 1 if t.id == loss else p      # the loss: to the end of the step
            out[t.id] = RootInfo(t.id, stored_bytes(t), p, max(rd + [p, end]), max(fw + [p]),
                                 min(bw) if bw else None)
    return out


def param_grad_roots(graph: Graph, param: int) -> tuple[int, ...]:
    """Storage roots of every gradient tensor of parameter ``param`` (partial sums included)."""
    return tuple(t.id for t in graph.tensors if t.role == ROLE_GRADIENT and t.grad_of == param and t.alias_of is None)


def early_update_info(graph: Graph, uid: int) -> tuple[int, int, tuple[int, ...]]:
    """(parameter id, p_u = last producer of its gradient, gradient roots) for update op ``uid``; PlanError when
    an early update of it is not legal."""
    out = graph.memo(("early_update_info", uid), lambda: _early_update_info(graph, uid))
    if isinstance(out, str):
        raise PlanError(out)
    return out


def _early_update_info(graph: Graph, uid: int) -> tuple[int, int, tuple[int, ...]] | str:
    try:
        return _early_update_checked(graph, uid)
    except PlanError as e:
        return str(e)


def _early_update_checked(graph: Graph, uid: int) -> tuple[int, int, tuple[int, ...]]:
    if not (0 <= uid < len(graph.ops)) or graph.ops[uid].phase != PHASE_UPDATE:
        raise PlanError(f"early_updates names op {uid}, which is not an update op")
    o = graph.ops[uid]
    param = graph.storage_root(o.inputs[0])
    groots = param_grad_roots(graph, param)
    prods = graph.producers()
    if not groots or any(g not in prods for g in groots):
        raise PlanError(f"update {o.name!r}: gradient of {graph.tensors[param].name!r} not produced in the step")
    # a fused chain's call makes its covered members' gradients (rmsnorm_linear: the last weight gradient's call
    # every linear's): the update waits for that call, whether or not the chain runs fused
    pu = max(_made_at(graph, prods[g]) for g in groots)
    watch = set(groots) | {param}
    for q in graph.ops[pu + 1:]:
        if q.id != uid and any(graph.storage_root(t) in watch for t in q.inputs):
            raise PlanError(f"update {o.name!r} cannot run early: {q.name!r} reads {graph.tensors[param].name!r} "
                            f"or its gradient after the gradient is complete")
    return param, pu, groots


def _made_at(graph: Graph, oid: int) -> int:
    ch = V.chain_of(graph, graph.ops[oid])
    return max(oid, ch.call_of(oid)) if ch is not None else oid


def early_update_candidates(graph: Graph) -> dict[int, tuple[int, int, tuple[int, ...]]]:
    out = {}
    for o in graph.ops:
        if o.phase == PHASE_UPDATE:
            try:
                out[o.id] = early_update_info(graph, o.id)
            except PlanError:
                pass
    return out


def paged_state_updates(graph: Graph) -> dict[int, int]:
    """Optimizer-state root -> its update op, for every optimizer-state tensor a plan may page (rule 1, 5): a
    root (no view of it) that its parameter's update op alone reads and writes. Once per graph."""
    def find() -> dict[int, int]:
        readers = readers_by_root(graph)
        out = {}
        for t in graph.tensors:
            if t.role != ROLE_OPTIMIZER_STATE or t.alias_of is not None:
                continue
            rd = readers.get(t.id, [])
            if len(rd) == 1 and graph.ops[rd[0]].phase == PHASE_UPDATE and \
                    not any(s.alias_of is not None and graph.storage_root(s.id) == t.id for s in graph.tensors):
                out[t.id] = rd[0]
        return out
    return graph.memo("paged_state_updates", find)


def handoff_edges(graph: Graph) -> dict[int, tuple[tuple[int, int], ...]]:
    """Reading op -> its (tensor, producer) edges a hand-off may cross (rule 7): every tensor an op reads, with
    the earlier op that produced it. The ILP prices the same edges (port.solver.instance). A view runs no kernel:
    its edges stand for the bytes it passes on (lowering hands the bytes over where a kernel reads them)."""
    def build():
        prods = graph.producers()
        out: dict[int, tuple[tuple[int, int], ...]] = {}
        for o in graph.ops:
            es = []
            for x in dict.fromkeys(o.inputs):
                u = prods.get(x)
                if u is not None and u < o.id:
                    es.append((x, u))
            if es:
                out[o.id] = tuple(es)
        return out
    return graph.memo("handoff_edges", build)


def coupled_variants(graph: Graph) -> tuple[tuple[int, int], ...]:
    """(forward batch norm, backward op) pairs whose ``inplace`` choice must agree: an in-place batch norm
    overwrites its input, so its backward ops rebuild x-hat from the output (the *_from_output kernels)."""
    return graph.memo("coupled_variants", lambda: tuple((o.forward_op, o.id) for o in graph.ops
                                                        if o.forward_op is not None
                                                        and V.follows_forward_inplace(graph, o)))


# =============================================================================================
# legality
# =============================================================================================
def validate(graph: Graph, plan: Plan, phases: Sequence[str] = PHASES, check_digest: bool = True) -> None:
    """Refuse (PlanError) a plan that does not belong to ``graph`` or breaks a rule of the module docstring
    that can be checked op by op. The schedule rules (recompute, paging, early updates) are checked by
    ``schedule``."""
    if not isinstance(plan, Plan):
        raise PlanError(f"expected a port.plan.types.Plan, got {type(plan).__name__}")
    if check_digest and plan.graph_digest and plan.graph_digest != graph.digest():
        raise PlanError(f"plan was made for another graph (digest {plan.graph_digest[:12]}...), not for "
                        f"{graph.name!r} ({graph.digest()[:12]}...): re-solve for this model/batch/optimizer")
    if len(plan.ops) != len(graph.ops) or any(getattr(d, "op", None) != i for i, d in enumerate(plan.ops)):
        raise PlanError(f"plan has {len(plan.ops)} decisions; graph {graph.name!r} has {len(graph.ops)} ops "
                        f"(one decision per op, in op-id order)")
    dec = plan.ops
    for o in graph.ops:
        if o.phase not in phases:
            continue
        d = dec[o.id]
        if d.variant == "inplace" and not (V.inplace_legal(graph, o) or V.follows_forward_inplace(graph, o)):
            raise PlanError(f"op {o.name!r}: variant 'inplace' is not legal here")
        if d.variant == "fused":
            ch = V.chain_of(graph, o)
            if ch is None:
                raise PlanError(f"op {o.name!r}: variant 'fused' is not legal here (no fusable chain holds it: "
                                f"port.plan.variants.FUSIONS)")
            chain = ch.ops
            for c in chain:
                if dec[c].variant != "fused" or dec[c].accelerator != d.accelerator:
                    raise PlanError(f"fused chain {[graph.ops[i].name for i in chain]} must run fused together "
                                    f"on one accelerator")
        elif d.variant.startswith("patch") and o.kind not in V.CONV_KINDS:
            raise PlanError(f"op {o.name!r}: variant {d.variant!r} applies to convolutions only")
    for a, b in V.inplace_conflicts(graph):
        if dec[a].variant == "inplace" and dec[b].variant == "inplace":
            raise PlanError(f"ops {graph.ops[a].name!r} and {graph.ops[b].name!r} may not both run inplace "
                            f"(the batch norm's backward reads the output the second op would overwrite)")
    if PHASE_BACKWARD in phases:
        for f, b in coupled_variants(graph):
            if (dec[f].variant == "inplace") != (dec[b].variant == "inplace"):
                raise PlanError(f"op {graph.ops[b].name!r} must run 'inplace' (from the output) exactly when "
                                f"{graph.ops[f].name!r} runs in place (it is {dec[f].variant!r}, the backward "
                                f"op {dec[b].variant!r})")
    nt = len(graph.tensors)
    for what, ids in (("recompute", plan.recompute), ("paged", plan.paged)):
        for t in ids:
            if not isinstance(t, int) or not (0 <= t < nt):
                raise PlanError(f"plan.{what} names tensor id {t!r}; graph {graph.name!r} has {nt} tensors")
    for u in plan.early_updates:
        if not isinstance(u, int) or not (0 <= u < len(graph.ops)) or graph.ops[u].phase != PHASE_UPDATE:
            raise PlanError(f"plan.early_updates names op {u!r}, which is not an update op of {graph.name!r}")
    if len(set(plan.early_updates)) != len(plan.early_updates):
        raise PlanError("plan.early_updates lists an update twice")
    if set(plan.recompute) & set(plan.paged):
        raise PlanError("a tensor is both recomputed and paged")
    if plan.joins:
        queued = queued_engines(plan)
        for e in plan.joins:
            ok = isinstance(e, tuple) and len(e) == 2 and e[0] in queued and isinstance(e[1], int)
            if not ok or not (0 <= e[1] < len(graph.ops)) or graph.ops[e[1]].phase == PHASE_UPDATE:
                raise PlanError(f"plan.joins: {e!r} is not (a queued engine of the plan {sorted(queued)}, the id of a "
                                f"forward, loss or backward op)")
        if list(plan.joins) != sorted(set(plan.joins), key=lambda e: (e[1], e[0])):
            raise PlanError("plan.joins must be sorted by (step, accelerator), each once")


# =============================================================================================
# the schedule
# =============================================================================================
@dataclass(frozen=True)
class Event:
    """One step of a plan's execution. kind: page_in | recompute | op | page_out | free | handoff | join.
    op: the graph op (recompute, op; handoff: the reading op; join: the step it follows) or -1; roots: the root
    paged (page_in, page_out) or freed (free), the tensor handed over (handoff); alloc: roots allocated right
    before this event runs (op, recompute, page_in); into: for a re-run in place, the input root whose copy
    ``alloc`` takes over (that copy is not freed: its bytes are the output's); src: a hand-off's source
    accelerator (its destination is the reading op's); a join's queued accelerator."""
    kind: str
    op: int = -1
    roots: tuple[int, ...] = ()
    alloc: tuple[int, ...] = ()
    into: tuple[int, ...] = ()
    src: str = ""


@dataclass(frozen=True)
class Schedule:
    events: tuple[Event, ...]
    root: dict                       # tensor id -> storage root (views, in-place outputs); static tensors too
    nonmat: frozenset                # roots never materialised (fused chains' batch-norm outputs)
    static_bytes: int                # static memory of this plan (early-updated gradients excluded)
    dynamic_grads: frozenset         # gradient roots of early-updated parameters (not static)
    recompute: dict                  # re-run producer -> its owned outputs
    recompute_at: dict               # re-run producer -> its re-run steps (ascending)
    early_at: dict                   # early update op -> p_u (the step it runs after)
    paged: tuple[int, ...]
    phases: tuple[str, ...]
    inplace_ok: frozenset = frozenset()   # (op, step) re-runs that may run in place (rule 2); the plan's are a subset
    paged_state: frozenset = frozenset()  # the paged optimizer-state roots (also in ``paged``): not static

    def root_of(self, t: int) -> int:
        return self.root.get(t, t)

    def is_static(self, graph: Graph, t: int) -> bool:
        r = graph.storage_root(t)
        return is_static(graph, t) and r not in self.dynamic_grads and r not in self.paged_state

    def root_bytes(self, graph: Graph, r: int) -> int:
        return 0 if r in self.nonmat else stored_bytes(graph.tensors[r])


def schedule(graph: Graph, plan: Plan, phases: Sequence[str] = PHASES, check_digest: bool = True) -> Schedule:
    """The events a plan runs for the ops of ``phases`` (the module docstring's rules); PlanError when the plan
    breaks one."""
    sch, idle = _schedule(graph, plan, phases, check_digest)
    if idle:
        p, t = min(idle, key=lambda x: (x[1], x[0]))
        raise PlanError(f"recompute_at re-runs {graph.ops[p].name!r} at step {t}, but nothing reads its outputs "
                        f"before its next re-run or the end of the step (drop_idle_reruns removes such re-runs)")
    return sch


def with_inplace_reruns(graph: Graph, plan: Plan, ops=None) -> Plan:
    """``plan`` with every re-run that may run in place doing so (only those of ``ops`` when given): it costs no
    time and never more memory."""
    from dataclasses import replace
    sch = schedule(graph, replace(plan, inplace_reruns=()))
    ok = sorted((q, t) for q, t in sch.inplace_ok if ops is None or q in ops)
    return replace(plan, inplace_reruns=tuple(ok))


def drop_idle_reruns(graph: Graph, plan: Plan) -> Plan:
    """``plan`` without the re-runs nothing reads (a solver stopped early may leave some); an op left with no
    re-run is kept instead of recomputed."""
    from dataclasses import replace
    while True:
        _sch, idle = _schedule(graph, plan, PHASES, False)
        if not idle:
            return plan
        at = tuple(x for x in plan.recompute_at if tuple(x) not in idle)
        left = {p for p, _t in at}
        prods = graph.producers()
        plan = replace(plan, recompute_at=at, recompute=tuple(t for t in plan.recompute if prods.get(t) in left),
                       inplace_reruns=tuple(x for x in plan.inplace_reruns if tuple(x) in set(at)))


def _schedule(graph: Graph, plan: Plan, phases: Sequence[str], check_digest: bool) -> tuple[Schedule, set]:
    phases = tuple(p for p in PHASES if p in phases)
    validate(graph, plan, phases, check_digest)
    dec = plan.ops
    ops = [o for o in graph.ops if o.phase in phases]
    in_phase = {o.id for o in ops}
    training = PHASE_BACKWARD in phases
    prods = graph.producers()
    T = graph.tensors

    # early updates: their gradient roots leave static memory
    early_at: dict[int, int] = {}
    early_after: dict[int, list[int]] = {}
    early_param: dict[int, int] = {}
    dyn: set[int] = set()
    if training:
        for u in sorted(plan.early_updates):
            param, pu, groots = early_update_info(graph, u)
            early_at[u] = pu
            early_after.setdefault(pu, []).append(u)
            early_param[u] = param
            dyn.update(groots)

    # paged optimizer state: out of static memory, in the arena around its update only
    pstate: dict[int, int] = {}            # state root -> the step its update runs at
    if PHASE_UPDATE in phases:
        cand_state = paged_state_updates(graph)
        for t in sorted(set(plan.paged)):
            if T[t].role != ROLE_OPTIMIZER_STATE:
                continue
            if t not in cand_state:
                raise PlanError(f"optimizer state {T[t].name!r} cannot be paged (its update alone must read it, "
                                f"and no view of it may exist)")
            u = cand_state[t]
            pstate[t] = early_at.get(u, u)
    dyn_or_paged = dyn | set(pstate)

    def st(t: int) -> bool:
        return is_static(graph, t) and graph.storage_root(t) not in dyn_or_paged

    # storage roots: views, in-place outputs; fused chains
    dalias: dict[int, int] = {}
    nonmat: set[int] = set()
    chain_head: dict[int, int] = {}        # op covered by a fused chain -> the chain op whose call computes it
    for o in ops:
        if dec[o.id].variant == "inplace" and (o.phase == PHASE_FORWARD or o.kind in V.BACKWARD_INPLACE_KINDS):
            dalias[o.outputs[0]] = o.inputs[0]
        ch = V.chains(graph).get(o.id)
        if ch is not None and dec[o.id].variant == "fused":
            nonmat.update(graph.storage_root(t) for t in ch.nonmat)
            for _c, y, x in ch.inplace:          # a fused call's output over an input dying at it
                dalias[y] = x
            for c, at in zip(ch.ops, ch.at):
                if c != at:
                    chain_head[c] = at
    root: dict[int, int] = {}

    def droot(t: int) -> int:
        r = root.get(t)
        if r is None:
            s = T[t]
            r = droot(s.alias_of) if s.alias_of is not None else (droot(dalias[t]) if t in dalias else t)
            root[t] = r
        return r

    for t in range(len(T)):
        droot(t)
    members: dict[int, list[int]] = {}
    for t in T:
        members.setdefault(root[t.id], []).append(t.id)
    readers = readers_by_root(graph, droot, ops, skip=st)

    def pos(oid: int) -> int:
        return early_at.get(oid, oid)

    def where(oid: int) -> int:        # the event that allocates an op's outputs
        return chain_head.get(oid, oid)

    birth: dict[int, int] = {}
    for o in ops:
        for t in o.outputs:
            r = root[t]
            if r == t and not st(t) and r not in nonmat and t not in birth and t not in pstate:
                birth[t] = where(o.id)
    death = {r: max([pos(c) for c in readers.get(r, [])] + [birth[r]]) for r in birth}

    def fwd_last(r: int) -> int:
        return max([c for c in readers.get(r, ()) if not is_backward(graph, c)] + [birth[r]])

    def bwd_first(r: int) -> int | None:
        b = [c for c in readers.get(r, ()) if is_backward(graph, c)]
        return min(b) if b else None

    # -- recompute ----------------------------------------------------------------------------
    rc: dict[int, tuple[int, ...]] = {}
    when: dict[int, int] = {}
    paged: list[int] = []
    if training:
        tau_all = recompute_times(graph)
        byp: dict[int, set[int]] = {}
        for t in plan.recompute:
            p = prods.get(t)
            if p is None or p not in tau_all or t not in owned_activation_outputs(graph, p):
                raise PlanError(f"tensor {T[t].name!r} cannot be recomputed (its producer is not a recomputable "
                                f"forward op; dropout and views never are)")
            byp.setdefault(p, set()).add(t)
        for p, ts in sorted(byp.items()):
            outs = owned_activation_outputs(graph, p)
            if set(outs) != ts:
                raise PlanError(f"recomputing op {graph.ops[p].name!r} regenerates all of "
                                f"{[T[t].name for t in outs]}: list them all in plan.recompute")
            if dec[p].variant in NOT_RERUN_VARIANTS:
                raise PlanError(f"op {graph.ops[p].name!r} runs {dec[p].variant}: it cannot be recomputed")
            for t in outs:
                if root[t] != t or any(m != t and T[m].alias_of is None for m in members[t]):
                    raise PlanError(f"tensor {T[t].name!r} shares storage with an in-place op: it cannot be "
                                    f"recomputed")
            for u in dict.fromkeys(graph.ops[p].inputs):
                if st(u):
                    continue
                ru = root[u]
                for q in ops:
                    if (q.id != p and q.id > prods.get(u, -1) and q.phase == PHASE_FORWARD
                            and dec[q.id].variant == "inplace" and root[q.inputs[0]] == ru):
                        raise PlanError(f"recompute of {graph.ops[p].name!r} reads {T[u].name!r}, which the "
                                        f"in-place op {q.name!r} overwrites")
            rc[p] = outs
        if plan.recompute_at:
            try:
                at = [(int(a), int(b)) for a, b in plan.recompute_at]
            except (TypeError, ValueError):
                raise PlanError("recompute_at must be a sequence of (op id, step) pairs") from None
            if at != sorted(at, key=lambda x: (x[1], x[0])):
                raise PlanError("recompute_at must be sorted by (step, op id)")
            if len(set(at)) != len(at):
                raise PlanError("recompute_at lists a (op, step) re-run twice")
            steps: dict[int, list[int]] = {}
            for p, t in at:
                if p not in rc:
                    raise PlanError(f"recompute_at re-runs op {p}, but plan.recompute lists none of its outputs")
                if not (0 <= t < len(graph.ops)) or not is_backward(graph, t):
                    raise PlanError(f"recompute_at: {graph.ops[p].name!r} at step {t}, which is not a backward op")
                steps.setdefault(p, []).append(t)
            missing = set(rc) - set(steps)
            if missing:
                raise PlanError(f"recompute_at has no step for {sorted(graph.ops[p].name for p in missing)}")
            when = {p: tuple(ts) for p, ts in steps.items()}
        else:
            when = {p: (tau_all[p],) for p in rc}
        for u, param in early_param.items():
            for p, ts in when.items():
                for t in ts:
                    if t > early_at[u] and any(graph.storage_root(x) == param for x in graph.ops[p].inputs):
                        raise PlanError(f"recompute of {graph.ops[p].name!r} at step {t} reads {T[param].name!r} "
                                        f"after its early update")
        for t in sorted(t for t in set(plan.paged) if T[t].role != ROLE_OPTIMIZER_STATE):
            if t not in birth or graph.ops[birth[t]].phase not in (PHASE_FORWARD, PHASE_LOSS) \
                    or T[t].role != ROLE_ACTIVATION:
                raise PlanError(f"tensor {T[t].name!r} cannot be paged (not an activation root produced in the "
                                f"forward pass)")
            if any(m != t and T[m].alias_of is None for m in members[t]):
                raise PlanError(f"tensor {T[t].name!r} shares storage with an in-place op: it cannot be paged")
            if bwd_first(t) is None:
                raise PlanError(f"tensor {T[t].name!r} is not read in the backward pass: nothing to page")
            if prods[t] in rc:
                raise PlanError(f"tensor {T[t].name!r} is both paged and recomputed")
            paged.append(t)
    paged.extend(pstate)
    for t in plan.paged:
        if graph.storage_root(t) in nonmat:
            raise PlanError(f"tensor {T[t].name!r} is never materialised (fused chain): it cannot be paged")

    # -- lives ----------------------------------------------------------------------------------
    # A root lives from its allocation to its last use; a use is an op reading it (at the op's position) or a
    # re-run reading it (in the group of its step, before the op). A recomputed root has one *copy* per
    # allocation (the forward one, then one per re-run); each use is served by the newest copy allocated at or
    # before it, and each copy is freed after its last use: after the op (free_after) or, when only re-runs of
    # that step read it, right after the last re-run reading it (transient, keyed by (step, re-run op)).
    alloc_at: dict[int, list[int]] = {}
    free_after: dict[int, list[int]] = {}
    transient: dict[int, list[int]] = {}
    page_in_at: dict[int, list[int]] = {}
    page_out_after: dict[int, list[int]] = {}
    groups: dict[int, list[int]] = {}
    rc_uses: dict[int, list[tuple[int, int]]] = {}      # root -> (step, op) of the re-runs reading it
    for p, ts in when.items():
        for t in ts:
            groups.setdefault(t, []).append(p)
            for u in dict.fromkeys(graph.ops[p].inputs):
                if not st(u) and root[u] in birth:
                    rc_uses.setdefault(root[u], []).append((t, p))
    op_uses = {r: sorted(pos(c) for c in readers.get(r, ())) for r in birth}
    loss = loss_root(graph)
    if PHASE_LOSS in phases and loss in op_uses:       # the loss stays to the end of the step
        op_uses[loss].append(ops[-1].id)

    def free_copy(r: int, ops_at: list[int], rcs_at: list[tuple[int, int]], unread) -> None:
        """Free one copy of r after its last use; ``unread``: where a copy nobody reads goes (a step: after its
        op, the producer; (step, op): after that re-run, its own)."""
        last_op, last_rc = max(ops_at, default=-1), max(rcs_at, default=(-1, -1))
        if last_op < 0 and last_rc[0] < 0:
            at = unread
        else:
            at = last_op if last_op >= last_rc[0] else last_rc
        (transient if isinstance(at, tuple) else free_after).setdefault(at, []).append(r)

    rc_root = {r: p for p in rc for r in rc[p]}
    for r, b in birth.items():
        alloc_at.setdefault(b, []).append(r)
        uo, ur = op_uses[r], rc_uses.get(r, [])
        if r in rc_root:
            starts = [b] + list(when[rc_root[r]])
            for k, s0 in enumerate(starts):
                s1 = starts[k + 1] if k + 1 < len(starts) else len(graph.ops) + 1
                free_copy(r, [c for c in uo if s0 <= c < s1], [c for c in ur if s0 <= c[0] < s1],
                          s0 if k == 0 else (s0, rc_root[r]))
        elif r in paged:
            bf, fl = bwd_first(r), fwd_last(r)
            early = [c for c, _q in ur if c < bf]
            if early:
                raise PlanError(f"a re-run at step {early[0]} reads {T[r].name!r}, which is paged out until step {bf}")
            page_in_at.setdefault(bf, []).append(r)
            page_out_after.setdefault(fl, []).append(r)
            free_after.setdefault(fl, []).append(r)
            free_copy(r, [c for c in uo if c >= bf], ur, bf)
        else:
            free_copy(r, uo, ur, b)
    for r, at in pstate.items():          # rules 1, 5, 6: in the arena for the step its update runs at
        page_in_at.setdefault(at, []).append(r)
        page_out_after.setdefault(at, []).append(r)
        free_after.setdefault(at, []).append(r)
    idle: set[tuple[int, int]] = set()   # re-runs nothing reads: a planning error, not a cost to pay silently
    for p, ts in when.items():
        for k, t in enumerate(ts):
            t1 = ts[k + 1] if k + 1 < len(ts) else len(graph.ops) + 1
            if not any(t <= c < t1 for r in rc[p] for c in op_uses[r] + [c for c, _q in rc_uses.get(r, [])]):
                idle.add((p, t))

    # re-runs in place (rule 2): x, re-made earlier in the group, is read last by this re-run
    inplace_ok: set[tuple[int, int]] = set()
    cand = V.rerun_inplace_inputs(graph) if training and groups else {}
    if cand:
        for q, x in cand.items():
            p = prods.get(x)
            for t in when.get(q, ()):
                if p in rc and p < q and p in groups.get(t, ()) and root[x] == x and x in transient.get((t, q), ()):
                    inplace_ok.add((q, t))
    into: dict[tuple[int, int], tuple[int, ...]] = {}
    for e in plan.inplace_reruns:
        try:
            q, t = (int(e[0]), int(e[1]))
        except (TypeError, ValueError, IndexError):
            raise PlanError(f"plan.inplace_reruns: {e!r} is not an (op id, step) pair") from None
        if (q, t) not in inplace_ok or (q, t) in into:
            what = graph.ops[q].name if 0 <= q < len(graph.ops) else q
            raise PlanError(f"plan.inplace_reruns: the re-run of {what!r} at step {t} cannot run in place (it must "
                            f"be a re-run of a relu/relu6/add whose first input is read by it alone, re-made in the "
                            f"same group and not used after it), or is listed twice")
        x = cand[q]
        transient[(t, q)] = [r for r in transient[(t, q)] if r != x]
        into[(q, t)] = (x,)

    events: list[Event] = []

    edges = handoff_edges(graph)

    def handoffs(oid: int) -> None:
        """Rule 7: a hand-off for every tensor ``oid`` reads whose bytes an earlier op produced, when that op
        runs on another accelerator (a re-run re-reads its inputs), right before it runs."""
        acc = dec[oid].accelerator
        for x, u in edges.get(oid, ()):
            if dec[u].accelerator != acc:
                events.append(Event("handoff", oid, (x,), src=dec[u].accelerator))

    joins_at: dict[int, list[str]] = {}
    for a, t in plan.joins:
        joins_at.setdefault(t, []).append(a)
    for o in ops:
        t = o.id
        for r in sorted(page_in_at.get(t, ())):
            events.append(Event("page_in", -1, (r,), (r,)))
        for p in sorted(groups.get(t, ())):
            handoffs(p)
            events.append(Event("recompute", p, (), rc[p], into.get((p, t), ())))
            if transient.get((t, p)):
                events.append(Event("free", -1, tuple(sorted(transient[t, p]))))
        if t not in early_at:
            handoffs(t)
            events.append(Event("op", t, (), tuple(sorted(alloc_at.get(t, ())))))
        for u in early_after.get(t, ()):
            if u in in_phase:
                handoffs(u)
                events.append(Event("op", u, (), tuple(sorted(alloc_at.get(u, ())))))
        for a in joins_at.get(t, ()):
            events.append(Event("join", t, src=a))
        for r in sorted(page_out_after.get(t, ())):
            events.append(Event("page_out", -1, (r,)))
        fr = sorted(set(free_after.get(t, ())))
        if fr:
            events.append(Event("free", -1, tuple(fr)))
    events = join_frees(graph, plan, events, root, early_at)
    S = static_bytes(graph) - sum(stored_bytes(T[g]) for g in dyn_or_paged)
    return Schedule(events=tuple(events), root=root, nonmat=frozenset(nonmat), static_bytes=S,
                    dynamic_grads=frozenset(dyn), recompute=rc, recompute_at=when, early_at=early_at,
                    paged=tuple(paged), phases=phases, inplace_ok=frozenset(inplace_ok),
                    paged_state=frozenset(pstate)), idle


def queued_engines(plan: Plan) -> frozenset[str]:
    """The plan's accelerators whose backend runs asynchronously on a queue (port.lower.program.QUEUED_BACKENDS)
    on host memory (not one of ``plan.own_memory``): rule 8's queues."""
    from port.errors import PortError
    from port.lower.program import QUEUED_BACKENDS, backend_of
    out = set()
    for a in dict.fromkeys(d.accelerator for d in plan.ops):
        try:
            if a not in plan.own_memory and backend_of(a) in QUEUED_BACKENDS:
                out.add(a)
        except PortError:
            pass
    return frozenset(out)


def join_frees(graph: Graph, plan: Plan, events: list, root: dict, early_at: dict) -> list:
    """Rule 8: ``events`` with each ``free`` of a root a queued engine's op read or wrote since the host last
    joined that queue moved to the next join (a hand-off from the queue or an explicit join of it: right after it; a
    page call: right before it; the end of the main pass: before the first late update; the end of the events)."""
    queued = queued_engines(plan)
    if not queued:
        return events
    late = {o.id for o in graph.ops if o.phase == PHASE_UPDATE and o.id not in early_at}
    touched: dict[str, set[int]] = {}      # queue -> roots its ops used since the host last joined it
    held: dict[int, set[str]] = {}         # root the host freed -> the queues it waits for
    out: list[Event] = []

    def release(roots) -> None:
        if roots:
            out.append(Event("free", -1, tuple(sorted(roots))))

    def join(accs) -> list[int]:
        for a in accs:
            touched.pop(a, None)
        done = [r for r, qs in held.items() if not (qs - set(accs))]
        for r in done:
            del held[r]
        for qs in held.values():
            qs.difference_update(accs)
        return done

    in_late = False
    for ev in events:
        if ev.kind == "op" and ev.op in late and not in_late:
            in_late = True
            release(join(queued))
        if ev.kind in ("page_in", "page_out"):
            release(join(queued))
        for r in ev.into:          # a re-run in place takes the held copy's bytes over (never freed then)
            held.pop(r, None)
        again = [r for r in ev.alloc if r in held]
        if again:                  # a re-run's copy of a held root: the earlier copy is freed here
            for r in again:
                del held[r]
            release(again)
        if ev.kind == "free":
            keep = []
            for r in ev.roots:
                qs = {a for a, rs in touched.items() if r in rs}
                if qs:
                    held[r] = qs
                else:
                    keep.append(r)
            release(keep)
            continue
        out.append(ev)
        acc = plan.ops[ev.op].accelerator if ev.kind in ("op", "recompute") else None
        if acc in queued:
            o = graph.ops[ev.op]
            touched.setdefault(acc, set()).update(root.get(t, t) for t in (*o.inputs, *o.outputs))
        if ev.kind in ("handoff", "join") and ev.src in queued:
            release(join([ev.src]))
    release(join(queued))
    return out


def own_memory_peaks(graph: Graph, plan: Plan, own: dict[str, str]) -> dict[str, int]:
    """Each own memory's peak in bytes (``own_memory_replay``)."""
    return own_memory_replay(graph, plan, own)[0]


def own_memory_copies(graph: Graph, plan: Plan, own: dict[str, str]) -> tuple[tuple, ...]:
    """The copies the residency rule makes, in order: (root, from memory, to memory, bytes, from accelerator, to
    accelerator) (``host``: the host memory; the accelerators price it: the own memory's engine, and on the
    host side the op that reads it there, or that last wrote it there, else the plan's first host engine), one
    per copy hand-off lowering emits (``own_memory_replay``)."""
    return own_memory_replay(graph, plan, own)[1]


def own_memory_replay(graph: Graph, plan: Plan, own: dict[str, str]):
    """Each own memory's peak (bytes) under the residency rule of port.lower.memories, replayed over the plan's
    events: ``own`` maps the accelerators that have their own memory to its name. An op or re-run on such an
    accelerator holds what it reads and writes in that memory (copied there when its current bytes are
    elsewhere); a host op (or a page-out) reading bytes that are current only in an own memory copies them out,
    a use there too; each segment (the main events; the late updates) starts with the static tensors current in
    host memory and ends copying the static tensors (after the main events also the loss and the logits) that are
    current only in an own memory back. A copy of a root is live in a memory from its first use there to its last;
    the peak is the most bytes (``stored_bytes``) live there at one op. Lowering's own arenas follow the same rule
    call by call (``port.lower.memories.own_peaks``: the live bound of ``Program.memories``).
    Returns (memory -> peak bytes, the copies: (root, from, to, bytes) in order)."""
    sch = schedule(graph, plan)
    dec = plan.ops
    T = graph.tensors
    mems = sorted(set(own.values()))
    host = "host"
    gen: dict[int, int] = {}
    seen: set[int] = set()
    lives: dict[str, dict[tuple[int, int], list[int]]] = {m: {} for m in mems}
    keep_main = {sch.root_of(t) for t in (graph.loss_id, graph.logits_id) if t is not None and t >= 0}
    late = {o.id for o in graph.ops if o.phase == "update" and o.id not in sch.early_at}
    valid: dict[tuple[int, int], frozenset] = {}
    copies: list[tuple] = []
    wacc: dict[tuple[int, int], str] = {}       # the accelerator of a root's last host-side writer
    acc_of = {m: min(a for a, x in own.items() if x == m) for m in mems}
    host_acc = next((d.accelerator for d in dec if d.accelerator not in own), host)
    step = 0

    def key(r):
        return r, gen.get(r, 0)

    def where(k):
        v = valid.get(k)
        return v if v is not None else (frozenset((host,)) if sch.is_static(graph, k[0]) else frozenset())

    def touch(m, k):
        if m != host:
            lv = lives[m].setdefault(k, [step, step])
            lv[1] = step

    def use(m, acc, roots, outs):
        for r in dict.fromkeys(roots):
            k = key(r)
            s = where(k)
            if s and m not in s:
                src = host if host in s else min(s)
                touch(src, k)
                sa = wacc.get(k, host_acc) if src == host else acc_of[src]
                copies.append((r, src, m, sch.root_bytes(graph, r), sa, acc))
                valid[k] = s | {m}
            touch(m, k)
        for r in outs:
            valid[key(r)] = frozenset((m,))
            if m == host:
                wacc[key(r)] = acc

    def flush(keep):
        for k, s in list(valid.items()):
            if host not in s and keep(k[0]):
                touch(min(s), k)
                copies.append((k[0], min(s), host, sch.root_bytes(graph, k[0]), acc_of[min(s)], host_acc))
        valid.clear()

    in_late = False
    for ev in sch.events:
        for r in ev.alloc:
            if ev.kind in ("recompute", "page_in") or r in seen:
                gen[r] = gen.get(r, 0) + 1
            seen.add(r)
        if ev.kind in ("op", "recompute"):
            o = graph.ops[ev.op]
            if ev.kind == "op" and o.id in late and not in_late:
                flush(lambda r: sch.is_static(graph, r) or r in keep_main)
                in_late = True
            if o.outputs and all(T[t].alias_of is not None for t in o.outputs):
                continue            # views run no kernel: the bytes are used where a kernel reads them
            # a buffer an op reads is a running statistic it updates in place (batch norm in training; not its
            # re-run), so it is written where the op runs
            outs = list(o.outputs) + [t for t in o.inputs if T[t].role == ROLE_BUFFER and ev.kind == "op"]
            roots = [sch.root_of(t) for t in o.inputs + o.outputs if sch.root_of(t) not in sch.nonmat]
            use(own.get(dec[o.id].accelerator, host), dec[o.id].accelerator, roots,
                [sch.root_of(t) for t in outs if sch.root_of(t) not in sch.nonmat])
            step += 1
        elif ev.kind == "page_out":
            use(host, host_acc, [ev.roots[0]], [])
            step += 1
        elif ev.kind == "page_in":
            valid[key(ev.roots[0])] = frozenset((host,))
    flush(lambda r: sch.is_static(graph, r) or (not in_late and r in keep_main))
    out = {m: interval_peak(((sch.root_bytes(graph, r), a, b) for (r, _g), (a, b) in lives[m].items()), step)
           for m in mems}
    return out, tuple(copies)


def interval_peak(lives, steps: int) -> int:
    """The most bytes live at one step: ``lives`` (bytes, first step, last step), both ends inclusive, steps
    0..``steps``."""
    tl = [0] * (steps + 2)
    for nb, a, b in lives:
        tl[a] += nb
        tl[b + 1] -= nb
    peak = cur = 0
    for d in tl:
        cur += d
        peak = max(peak, cur)
    return peak
