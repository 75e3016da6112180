"""Lowering: Graph + Plan -> Program (ordered kernel calls with arena offsets).

``default_plan(graph, backend)`` builds the plan the executor runs until the ILP's plans arrive: every op on
one backend, fusion (conv2d -> batch_norm2d -> relu, training BN) and in-place (relu, relu6, add) wherever
legal, ``direct`` convolutions where legal (depthwise, 1x1). A Plan's per-op accelerator decides the
backend, so plans may mix backends op by op (both CPU backends share the arena zero-copy).

``lower(graph, plan)`` then
1. maps every tensor to a storage root (views and in-place outputs onto their input),
2. emits one Call per executed op (views and fused-away ops emit none),
3. asks each call's backend for its workspace,
4. places the persistent region (params, buffers, param grads, optimizer state, constants) and the scratch
   roots + workspaces with ``port.memory.assign_offsets``, and
5. checks the result with ``port.memory.check_program``.
"""
from __future__ import annotations

from typing import Any, Sequence

from .errors import PlanError
from .memory import assign_offsets, check_program, live_timeline
from .program import (GRAD_SCALE_ID, REGION_PERSISTENT, REGION_SCRATCH, Call, Program, Slot, align)
from .types import (PHASE_BACKWARD, PHASE_FORWARD, PHASE_LOSS, PHASE_UPDATE, PHASES, ROLE_BUFFER,
                    ROLE_GRADIENT, ROLE_OPTIMIZER_STATE, ROLE_PARAMETER, Graph, OpDecision, Plan, numel,
                    DTYPE_BYTES)
from . import variants as V

# accelerator id -> backend (plans name accelerators; the device YAML says which backend each has)
ACCELERATOR_BACKENDS = {"cpu-c": "c", "cpu-torch": "torch-cpu", "gpu-torch": "torch-cuda", "cuda": "torch-cuda",
                        "cpu": "c"}
BACKEND_ACCELERATORS = {"c": "cpu-c", "torch-cpu": "cpu-torch", "torch-cuda": "gpu-torch"}
BACKENDS = ("c", "torch-cpu", "torch-cuda")

NO_CALL_KINDS = ("reshape", "reshape.grad_input", "add.grad_input")


def backend_of(accelerator: str, accelerators: dict[str, str] | None = None) -> str:
    m = dict(ACCELERATOR_BACKENDS)
    if accelerators:
        m.update(accelerators)
    if accelerator in BACKENDS:
        return accelerator
    try:
        return m[accelerator]
    except KeyError:
        raise PlanError(f"accelerator {accelerator!r} has no known backend; known: {sorted(m)} "
                        f"(pass accelerators={{id: backend}} to lower())") from None


def fused_chain_supported(graph: Graph, chain: tuple[int, ...] | None) -> bool:
    """The C library fuses conv2d (no bias) -> training batch_norm2d -> relu (not relu6, not conv+bn alone)."""
    if chain is None or len(chain) != 3:
        return False
    conv, bn, act = (graph.ops[i] for i in chain)
    return act.kind == "relu" and bool(bn.attr("training")) and not conv.attr("bias")


def default_plan(graph: Graph, backend: str = "c", fuse: bool = True, inplace: bool = True) -> Plan:
    """Every op on ``backend`` with fusion and in-place wherever legal (and supported by the kernels)."""
    if backend not in BACKENDS:
        raise PlanError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    acc = BACKEND_ACCELERATORS[backend]
    variant: dict[int, str] = {o.id: "plain" for o in graph.ops}
    if backend == "c":
        for o in graph.ops:
            if o.kind in V.CONV_KINDS and (V.is_depthwise(graph, o) or V.is_pointwise(graph, o)):
                variant[o.id] = "direct"
        if fuse:
            for o in graph.ops:
                ch = V.fusion_chain(graph, o)
                if fused_chain_supported(graph, ch):
                    for i in ch:
                        variant[i] = "fused"
    if inplace:
        for o in graph.ops:
            if o.kind in ("relu", "relu6", "add") and variant[o.id] == "plain" and V.inplace_legal(graph, o):
                variant[o.id] = "inplace"
    ops = tuple(OpDecision(o.id, acc, variant[o.id]) for o in graph.ops)
    return Plan(graph_digest=graph.digest(), profile_digest="", budget_bytes=0, ops=ops, solver="default",
                status="feasible")


# ---------------------------------------------------------------------------------------------
# plan validation
# ---------------------------------------------------------------------------------------------
def _members(graph: Graph, root_of) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for t in graph.tensors:
        out.setdefault(root_of(t.id), []).append(t.id)
    return out


def validate_plan(graph: Graph, plan: Plan, phases: Sequence[str] = PHASES,
                  accelerators: dict[str, str] | None = None, check_digest: bool = True) -> None:
    """Refuse (PlanError) a plan that does not belong to ``graph`` or that the executor cannot run: wrong
    graph digest, wrong length/op ids, unknown accelerators, variants illegal on the op's backend, in-place
    conflicts, unsound recompute/paging/early-update requests. Schedules that are legal but wasteful (a
    recompute_at step later than needed) are not refused here: ``port.simulate`` is the referee for them."""
    if not isinstance(plan, Plan):
        raise PlanError(f"expected a port.types.Plan, got {type(plan).__name__}")
    if check_digest and plan.graph_digest and plan.graph_digest != graph.digest():
        raise PlanError(f"plan was made for another graph (digest {plan.graph_digest[:12]}...), not for "
                        f"{graph.name!r} ({graph.digest()[:12]}...): re-solve for this model/batch/optimizer")
    if len(plan.ops) != len(graph.ops) or any(getattr(d, "op", None) != i for i, d in enumerate(plan.ops)):
        raise PlanError(f"plan has {len(plan.ops)} decisions; graph {graph.name!r} has {len(graph.ops)} ops "
                        f"(one decision per op, in op-id order)")
    for o in graph.ops:
        if o.phase not in phases:
            continue
        d = plan.ops[o.id]
        be = backend_of(d.accelerator, accelerators)
        legal = V.variants(graph, o, be)
        if d.variant not in legal and not (d.variant == "fused" and o.kind in ("batch_norm2d", "relu", "relu6")):
            raise PlanError(f"op {o.name!r}: variant {d.variant!r} is not legal on accelerator {d.accelerator!r} "
                            f"(backend {be}; legal: {', '.join(legal)})")
        if d.variant == "inplace" and o.kind == "batch_norm2d":
            if len(o.inputs) < 3 or any(graph.tensors[t].role != ROLE_PARAMETER for t in o.inputs[1:3]):
                raise PlanError(f"op {o.name!r}: in-place batch norm needs affine weight and bias (it rebuilds "
                                f"x-hat from the output)")
    for a, b in V.inplace_conflicts(graph):
        if plan.ops[a].variant == "inplace" and plan.ops[b].variant == "inplace":
            raise PlanError(f"ops {graph.ops[a].name!r} and {graph.ops[b].name!r} may not both run inplace "
                            f"(the batch norm's backward reads the output the second op would overwrite)")
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


def _recompute_ops(graph: Graph, plan: Plan) -> dict[int, tuple[int, ...]]:
    """producer op -> its owned activation outputs, for every producer of ``plan.recompute``."""
    from .simulate import NOT_RECOMPUTABLE_KINDS, owned_activation_outputs
    prods = graph.producers()
    rc: dict[int, set[int]] = {}
    for t in plan.recompute:
        p = prods.get(t)
        if p is None or graph.ops[p].phase != PHASE_FORWARD or graph.ops[p].kind in NOT_RECOMPUTABLE_KINDS \
                or t not in owned_activation_outputs(graph, p):
            raise PlanError(f"tensor {graph.tensors[t].name!r} cannot be recomputed (its producer is not a "
                            f"recomputable forward op; dropout and views never are)")
        rc.setdefault(p, set()).add(t)
    out = {}
    for p, ts in rc.items():
        outs = owned_activation_outputs(graph, p)
        if set(outs) != ts:
            raise PlanError(f"recomputing op {graph.ops[p].name!r} regenerates all of "
                            f"{[graph.tensors[t].name for t in outs]}: list them all in plan.recompute")
        if plan.ops[p].variant in ("inplace", "fused"):
            raise PlanError(f"op {graph.ops[p].name!r} runs {plan.ops[p].variant}: it cannot be recomputed")
        out[p] = outs
    return out


def _is_bwd(graph: Graph, oid: int) -> bool:
    return graph.ops[oid].phase in (PHASE_BACKWARD, PHASE_UPDATE)


# ---------------------------------------------------------------------------------------------
def lower(graph: Graph, plan: Plan | None = None, phases: Sequence[str] = PHASES, *,
          persistent_from: Program | None = None, strategy: str = "auto",
          accelerators: dict[str, str] | None = None, backend: str = "c", check: bool = True,
          check_digest: bool = True) -> Program:
    """Lower ``graph`` under ``plan`` (default: ``default_plan(graph, backend)``) into a Program.

    phases: the graph phases to lower; ("forward",) gives an inference program (logits kept to the end).
    persistent_from: place parameters/buffers at the offsets (by name) of another program's persistent
      region, so an inference program can run on the training program's arena (its scratch reuses the
      training scratch, which is dead between steps).

    Plan semantics follow port.simulate (its module docstring): at graph step t the program runs, in order,
    ``page_in`` calls for paged roots first read by t, the recompute group of t (re-emitted Calls of the
    producers, phase ``recompute``, new tensor *versions* with their own slots: the saved root's live range
    splits in two), op t itself, then the early updates whose gradient became complete at t. A paged root
    gets a ``page_out`` call right after its last forward reader. Gradients of early-updated parameters
    live in scratch (from their producer, which zeroes them first when it accumulates, to the update).
    """
    from .backends import get_backend
    from .simulate import early_update_info, recompute_times

    if plan is None:
        plan = default_plan(graph, backend)
    phases = tuple(p for p in PHASES if p in phases)
    validate_plan(graph, plan, phases, accelerators, check_digest)
    T = graph.tensors
    NT = len(T)
    ops = [o for o in graph.ops if o.phase in phases]
    dec = {d.op: d for d in plan.ops}
    training = PHASE_BACKWARD in phases

    # fused chains: conv id -> (bn, act); covered ops
    covered: dict[int, int] = {}
    chains: dict[int, tuple[int, ...]] = {}
    emulated: dict[int, tuple[int, ...]] = {}   # fused chains without a fused kernel: separate calls
    for o in ops:
        if o.kind == "conv2d" and dec[o.id].variant == "fused":
            ch = V.fusion_chain(graph, o)
            if ch is None:
                raise PlanError(f"op {o.name!r}: fused is not legal here (no conv2d -> batch_norm2d chain)")
            if any(dec[i].variant != "fused" or dec[i].accelerator != dec[o.id].accelerator for i in ch[1:]):
                raise PlanError(f"op {o.name!r} is fused but the rest of its chain "
                                f"{[graph.ops[i].name for i in ch[1:]]} is not fused on the same accelerator")
            if fused_chain_supported(graph, ch) and backend_of(dec[o.id].accelerator, accelerators) == "c":
                chains[o.id] = ch
                for i in ch[1:]:
                    covered[i] = o.id
            else:
                # no fused kernel (conv+bn, conv+bn+relu6, eval BN, conv with bias): conv, then batch norm
                # writing straight into the activation's buffer, then the activation in place -- the
                # batch-norm output takes no bytes of its own, as the plan's fused semantics promise
                emulated[o.id] = ch
    in_chain = set(covered) | {i for ch in emulated.values() for i in ch[1:]}
    for o in ops:
        if o.phase == PHASE_FORWARD and dec[o.id].variant == "fused" and o.kind != "conv2d" and o.id not in in_chain:
            raise PlanError(f"op {o.name!r} is marked fused but its conv2d is not")

    # storage roots (views and in-place outputs map onto their input's root)
    root: dict[int, int] = {}

    def R(t: int) -> int:
        if t >= NT or t < 0:
            return vroot.get(t, t)
        r = root.get(t)
        if r is None:
            a = T[t].alias_of
            r = R(a) if a is not None else t
            root[t] = r
        return r

    vroot: dict[int, int] = {}     # version id -> its root version id
    vbase: dict[int, int] = {}     # version id -> the graph tensor it re-materialises
    vtag: dict[int, str] = {}
    for o in ops:
        if dec[o.id].variant == "inplace" and o.id not in covered:
            root[o.outputs[0]] = R(o.inputs[0])
    for ch in emulated.values():
        if len(ch) == 3:
            act = graph.ops[ch[2]]
            root[act.outputs[0]] = R(act.inputs[0])
    unmaterialised = set()   # fused intermediates (bn output inside conv-bn-relu)
    for cid, ch in chains.items():
        unmaterialised.add(graph.ops[ch[1]].outputs[0])
    members: dict[int, list[int]] = {}
    for t in range(NT):
        members.setdefault(R(t), []).append(t)

    readers: dict[int, list[int]] = {}
    for o in ops:
        for t in dict.fromkeys(o.inputs):
            r = R(t)
            if not readers.get(r) or readers[r][-1] != o.id:
                readers.setdefault(r, []).append(o.id)

    def fwd_last(r: int) -> int:
        p = graph.producers().get(r, -1)
        return max([c for c in readers.get(r, ()) if not _is_bwd(graph, c)] + [p])

    def bwd_first(r: int) -> int | None:
        b = [c for c in readers.get(r, ()) if _is_bwd(graph, c)]
        return min(b) if b else None

    # -- recompute / paging / early updates (training programs only) -----------------------------
    rc_ops: dict[int, tuple[int, ...]] = {}
    when: dict[int, int] = {}
    paged: list[int] = []
    early_at: dict[int, list[int]] = {}
    early_pos: dict[int, int] = {}
    dyn_grads: set[int] = set()
    if training:
        rc_ops = _recompute_ops(graph, plan)
        prods = graph.producers()
        for p, outs in rc_ops.items():
            for t in outs:
                if any(m != t and T[m].alias_of is None for m in members[R(t)]) or R(t) != t:
                    raise PlanError(f"tensor {T[t].name!r} shares storage with an in-place op: it cannot be "
                                    f"recomputed")
            for u in dict.fromkeys(graph.ops[p].inputs):
                ru = R(u)
                for q in ops:
                    if (q.id != p and q.id > prods.get(u, -1) and dec[q.id].variant == "inplace"
                            and q.phase == PHASE_FORWARD and R(q.inputs[0]) == ru and q.id not in covered):
                        raise PlanError(f"recompute of {graph.ops[p].name!r} reads {T[u].name!r}, which the "
                                        f"in-place op {q.name!r} overwrites")
        if plan.recompute_at:
            try:
                at = [(int(a), int(b)) for a, b in plan.recompute_at]
            except (TypeError, ValueError):
                raise PlanError("recompute_at must be a sequence of (op id, step) pairs") from None
            for p, t in at:
                if p in when:
                    raise PlanError(f"recompute_at re-runs op {p} twice")
                if p not in rc_ops:
                    raise PlanError(f"recompute_at re-runs op {p}, but plan.recompute lists none of its outputs")
                if not (0 <= t < len(graph.ops)) or not _is_bwd(graph, t):
                    raise PlanError(f"recompute_at: {graph.ops[p].name!r} at step {t}, which is not a backward op")
                when[p] = t
            missing = set(rc_ops) - set(when)
            if missing:
                raise PlanError(f"recompute_at has no step for {sorted(graph.ops[p].name for p in missing)}")
        else:
            tau = recompute_times(graph)
            when = {p: tau[p] for p in rc_ops}
        for u in sorted(plan.early_updates):
            param, pu, groots = early_update_info(graph, u)
            early_at.setdefault(pu, []).append(u)
            early_pos[u] = pu
            dyn_grads.update(groots)
            for p, t in when.items():
                if t > pu and any(R(x) == param for x in graph.ops[p].inputs):
                    raise PlanError(f"recompute of {graph.ops[p].name!r} at step {t} reads {T[param].name!r} "
                                    f"after its early update")
        for t in plan.paged:
            p = prods.get(t)
            if p is None or graph.ops[p].phase not in (PHASE_FORWARD, PHASE_LOSS) or R(t) != t \
                    or T[t].role != "activation":
                raise PlanError(f"tensor {T[t].name!r} cannot be paged (not an activation root produced in the "
                                f"forward pass)")
            if any(m != t and T[m].alias_of is None for m in members[t]):
                raise PlanError(f"tensor {T[t].name!r} shares storage with an in-place op: it cannot be paged")
            if bwd_first(t) is None:
                raise PlanError(f"tensor {T[t].name!r} is not read in the backward pass: nothing to page")
            if p in rc_ops:
                raise PlanError(f"tensor {T[t].name!r} is both paged and recomputed")
            if t in unmaterialised:
                raise PlanError(f"tensor {T[t].name!r} is never materialised (fused chain): it cannot be paged")
            paged.append(t)
    elif plan.recompute or plan.paged or plan.early_updates:
        pass   # forward-only programs ignore the backward-pass decisions

    # -- the event sequence (simulator order) ----------------------------------------------------
    groups: dict[int, list[int]] = {}
    for p, t in when.items():
        groups.setdefault(t, []).append(p)
    page_in_at: dict[int, list[int]] = {}
    page_out_after: dict[int, list[int]] = {}
    for r in paged:
        page_in_at.setdefault(bwd_first(r), []).append(r)
        page_out_after.setdefault(fwd_last(r), []).append(r)
    events: list[tuple[str, int]] = []
    for o in ops:
        t = o.id
        for r in sorted(page_in_at.get(t, ())):
            events.append(("page_in", r))
        for p in sorted(groups.get(t, ())):
            events.append(("recompute", p))
        if t not in early_pos:
            events.append(("op", t))
        for u in early_at.get(t, ()):
            events.append(("op", u))
        for r in sorted(page_out_after.get(t, ())):
            events.append(("page_out", r))

    cur: dict[int, int] = {}      # graph tensor -> its current version id
    next_id = [NT]

    def new_version(r: int, tag: str) -> None:
        """Fresh version ids for root ``r`` and every tensor stored on it (views)."""
        rv = next_id[0]
        for m in sorted(members[r], key=lambda m: (m != r, m)):
            v = next_id[0]
            next_id[0] += 1
            vbase[v] = m
            vroot[v] = rv
            vtag[v] = tag
            cur[m] = v

    def Vr(t: int) -> int:
        return cur.get(t, t)

    drafts: list[dict[str, Any]] = []
    hold: dict[int, int] = {}     # transient recompute version root -> draft index of its group's last call
    group_transients: list[int] = []
    inplace_bn = {o.id for o in ops if o.kind == "batch_norm2d" and dec[o.id].variant == "inplace"
                  and o.phase == PHASE_FORWARD}
    for kind_ev, oid in events:
        if kind_ev != "recompute":
            group_transients = []
        if kind_ev == "page_in":
            new_version(oid, "paged")
            drafts.append(dict(op=-1, name=f"{T[oid].name}.page_in", kernel="page_in", backend="host",
                               variant="plain", phase="page", outputs=(Vr(oid),), inputs=(),
                               attrs={"key": oid}, covers=()))
            continue
        if kind_ev == "page_out":
            drafts.append(dict(op=-1, name=f"{T[oid].name}.page_out", kernel="page_out", backend="host",
                               variant="plain", phase="page", outputs=(), inputs=(Vr(oid),),
                               attrs={"key": oid}, covers=()))
            continue
        o = graph.ops[oid]
        if o.id in covered or o.kind in NO_CALL_KINDS:
            continue
        d = dec[o.id]
        be = backend_of(d.accelerator, accelerators)
        attrs = dict(o.attrs)
        if kind_ev == "recompute":
            ins = tuple(Vr(t) for t in o.inputs)
            for t in rc_ops[o.id]:
                new_version(t, "recompute")
            outs = tuple(Vr(t) for t in o.outputs)
            attrs["recompute"] = True          # batch norm: do not update the running statistics again
            drafts.append(dict(op=o.id, name=f"{o.name}.recompute", kernel=o.kind, backend=be, variant=d.variant,
                               phase="recompute", outputs=outs, inputs=ins, attrs=attrs, covers=()))
            # outputs no backward op reads are freed after the whole group (simulator rule 3), not earlier
            group_transients.extend(Vr(t) for t in rc_ops[o.id] if bwd_first(R(t)) is None)
            for v in group_transients:
                hold[v] = len(drafts) - 1
            continue
        if o.id in chains:
            bn, act = graph.ops[chains[o.id][1]], graph.ops[chains[o.id][2]]
            # outputs: y (act), z (conv out), stats; read-modify-write: running mean/var
            outs = (act.outputs[0], o.outputs[0], bn.outputs[1], bn.inputs[3], bn.inputs[4])
            ins = (o.inputs[0], o.inputs[1], bn.inputs[1], bn.inputs[2], bn.inputs[3], bn.inputs[4])
            attrs.update(eps=bn.attr("eps"), momentum=bn.attr("momentum"))
            drafts.append(dict(op=o.id, name=o.name, kernel="conv2d_bn_relu", backend=be, variant="fused",
                               phase=o.phase, outputs=tuple(Vr(t) for t in outs), inputs=tuple(Vr(t) for t in ins),
                               attrs=attrs, covers=chains[o.id][1:]))
            continue
        outs, ins, kernel = o.outputs, o.inputs, o.kind
        if o.kind == "batch_norm2d" and attrs.get("training"):
            outs = outs + (o.inputs[3], o.inputs[4])     # running stats updated
        if o.forward_op in inplace_bn and o.kind in ("batch_norm2d.grad_input", "batch_norm2d.grad_weight"):
            # the forward overwrote x with y: rebuild x-hat from y, gamma, beta (the *_from_output kernels)
            bn = graph.ops[o.forward_op]
            y, gamma, beta = bn.outputs[0], bn.inputs[1], bn.inputs[2]
            if o.kind == "batch_norm2d.grad_input" and attrs.get("training"):
                kernel, ins = "batch_norm2d.grad_input_from_output", (o.inputs[0], y, bn.outputs[1], gamma, beta)
            elif o.kind == "batch_norm2d.grad_weight":
                kernel, ins = "batch_norm2d.grad_weight_from_output", (o.inputs[0], y, gamma, beta)
        if o.phase == PHASE_UPDATE and o.id in early_pos:
            attrs["early"] = True
        drafts.append(dict(op=o.id, name=o.name, kernel=kernel, backend=be, variant=d.variant, phase=o.phase,
                           outputs=tuple(Vr(t) for t in outs), inputs=tuple(Vr(t) for t in ins), attrs=attrs,
                           covers=()))
    if training:
        for dr in drafts:
            if dr["kernel"] == "cross_entropy.grad_input":
                dr["inputs"] = dr["inputs"] + (GRAD_SCALE_ID,)
    # early-updated gradients live in scratch: the first (accumulating) writer zeroes them
    zeroed: set[int] = set()
    for dr in drafts:
        z = []
        for t in dr["outputs"]:
            r = R(t)
            if r in dyn_grads and r not in zeroed:
                zeroed.add(r)
                if dr["kernel"].endswith("grad_weight") or dr["kernel"].endswith("grad_weight_from_output"):
                    z.append(t)
        if z:
            dr["attrs"]["zero_outputs"] = tuple(z)

    # tensors referenced
    used: list[int] = []
    seen = set()
    for dr in drafts:
        for t in dr["inputs"] + dr["outputs"]:
            if t not in seen:
                seen.add(t)
                used.append(t)
    for t in (graph.input_id, graph.logits_id):
        if t not in seen:
            seen.add(t)
            used.append(t)
    for t in list(used):   # make sure roots of used tensors have slots
        if t >= 0 and R(t) not in seen:
            seen.add(R(t))
            used.append(R(t))
    if graph.label_id in seen or PHASE_LOSS in phases:
        if graph.label_id not in seen:
            seen.add(graph.label_id)
            used.append(graph.label_id)

    def base(t: int) -> int:
        return vbase.get(t, t)

    def is_persistent(t: int) -> bool:
        if t < 0:
            return True
        s = T[base(t)]
        if s.role in (ROLE_PARAMETER, ROLE_BUFFER, ROLE_OPTIMIZER_STATE):
            return True
        return s.role == ROLE_GRADIENT and s.grad_of is not None and T[s.grad_of].role == ROLE_PARAMETER \
            and s.alias_of is None and R(t) not in dyn_grads

    def spec(t: int) -> tuple[str, tuple[int, ...], str, str]:
        if t == GRAD_SCALE_ID:
            return "loss.grad_scale", (1,), "float32", "constant"
        s = T[base(t)]
        name = s.name if t < NT else f"{s.name}@{vtag[t]}"
        return name, s.shape, s.dtype, s.role

    # persistent region
    slots: dict[int, Slot] = {}
    pers = sorted((t for t in used if is_persistent(t) and (t < 0 or R(t) == t)),
                  key=lambda t: ({ROLE_PARAMETER: 0, ROLE_BUFFER: 1, ROLE_GRADIENT: 2, ROLE_OPTIMIZER_STATE: 3}
                                 .get(T[t].role, 4) if t >= 0 else 5, t))
    zero_ranges: list[tuple[int, int]] = []
    if persistent_from is not None:
        P = persistent_from.persistent_bytes
        for t in pers:
            name, shape, dtype, role = spec(t)
            try:
                ref = persistent_from.slot_by_name(name)
            except KeyError:
                raise PlanError(f"tensor {name!r} has no slot in the program given as persistent_from") from None
            if ref.shape != shape or ref.dtype != dtype:
                raise PlanError(f"tensor {name!r}: shape/dtype {shape} {dtype} differ from persistent_from's "
                                f"{ref.shape} {ref.dtype}")
            slots[t] = Slot(t, name, shape, dtype, ref.offset, ref.nbytes, REGION_PERSISTENT, t, role)
    else:
        off = 0
        for t in pers:
            name, shape, dtype, role = spec(t)
            nb = numel(shape) * DTYPE_BYTES[dtype]
            slots[t] = Slot(t, name, shape, dtype, off, nb, REGION_PERSISTENT, t, role)
            if role == ROLE_GRADIENT:
                zero_ranges.append((off, align(nb)))
            off += align(nb)
        P = off
        merged: list[tuple[int, int]] = []
        for o_, n_ in zero_ranges:
            if merged and merged[-1][0] + merged[-1][1] == o_:
                merged[-1] = (merged[-1][0], merged[-1][1] + n_)
            else:
                merged.append((o_, n_))
        zero_ranges = merged

    # scratch: lifetimes of roots (call indices, inclusive)
    n = len(drafts)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, dr in enumerate(drafts):
        for t in dr["inputs"] + dr["outputs"]:
            if is_persistent(t):
                continue
            r = R(t)
            first.setdefault(r, i)
            last[r] = i
    for r, i in hold.items():
        if r in last:
            last[r] = max(last[r], i)
    # the step's input batch and labels are written before call 0 and stay for the whole step (the
    # simulator counts them as static memory)
    for t in (graph.input_id, graph.label_id):
        if t in seen:
            r = R(t)
            first[r] = 0
            last[r] = max(n - 1, 0)
    keep = [graph.loss_id] if PHASE_LOSS in phases else []
    if phases == (PHASE_FORWARD,):
        keep.append(graph.logits_id)
    for t in keep:
        r = R(t)
        first.setdefault(r, n - 1)
        last[r] = max(n - 1, 0)

    def shape_of(t: int) -> tuple[int, ...]:
        return spec(t)[1]

    ws_bytes = []
    for dr in drafts:
        if dr["backend"] == "host":
            ws_bytes.append(0)
            continue
        be = get_backend(dr["backend"])
        ws_bytes.append(int(be.workspace_bytes(dr["kernel"], dr["variant"], dr["attrs"],
                                               [shape_of(t) for t in dr["inputs"]],
                                               [shape_of(t) for t in dr["outputs"]])))
    items: list[tuple[Any, int, int, int]] = []
    for r in sorted(first):
        name, shape, dtype, role = spec(r)
        items.append((("t", r), numel(shape) * DTYPE_BYTES[dtype], first[r], last[r]))
    for i, w in enumerate(ws_bytes):
        if w:
            items.append((("w", i), w, i, i))
    offs, high = assign_offsets(items, strategy)
    arena = P + high
    for r in first:
        name, shape, dtype, role = spec(r)
        slots[r] = Slot(r, name, shape, dtype, P + offs[("t", r)], numel(shape) * DTYPE_BYTES[dtype],
                        REGION_SCRATCH, r, role)
    for t in used:
        if t in slots or base(t) in unmaterialised:
            continue
        r = R(t)
        if r not in slots:
            continue
        name, shape, dtype, role = spec(t)
        rs = slots[r]
        slots[t] = Slot(t, name, shape, dtype, rs.offset, numel(shape) * DTYPE_BYTES[dtype], rs.region, r, role)

    calls = tuple(Call(index=i, op=dr["op"], name=dr["name"], kernel=dr["kernel"], backend=dr["backend"],
                       variant=dr["variant"], phase=dr["phase"], outputs=tuple(dr["outputs"]),
                       inputs=tuple(dr["inputs"]),
                       attrs=tuple(sorted(dr["attrs"].items())),
                       workspace_offset=(P + offs[("w", i)]) if ws_bytes[i] else 0,
                       workspace_bytes=ws_bytes[i], covers=tuple(dr["covers"]))
                  for i, dr in enumerate(drafts))
    prog = Program(graph_name=graph.name, graph_digest=graph.digest(), batch_size=graph.batch_size,
                   arena_bytes=int(arena), persistent_bytes=int(P),
                   slots=tuple(sorted(slots.values(), key=lambda s: s.tensor)), calls=calls,
                   input_id=graph.input_id, label_id=graph.label_id if graph.label_id in slots else -1,
                   loss_id=graph.loss_id if graph.loss_id in slots else -1, logits_id=graph.logits_id,
                   zero_ranges=tuple(zero_ranges), optimizer=graph.optimizer, phases=phases,
                   live_until=tuple(sorted((r, i) for r, i in hold.items() if r in first)))
    tl = live_timeline(prog)
    from dataclasses import replace
    prog = replace(prog, live_timeline=tl, peak_live_bytes=int(P + (max(tl) if tl else 0)))
    if check:
        check_program(prog)
    return prog


def inference_graph(model: Any, example_input: Any, name: str | None = None) -> Graph:
    """Trace ``model`` in eval mode (BN with running stats, dropout off) for an inference program."""
    import copy
    from .graph import trace
    m = copy.deepcopy(model).eval()
    return trace(m, example_input, optimizer="sgd", name=name)


CHECKPOINT_KINDS = ("relu", "relu6", "hardswish", "add", "max_pool2d", "avg_pool2d", "global_avg_pool2d",
                    "linear")


def recompute_plan(graph: Graph, plan: Plan, only: Sequence[int] | None = None,
                   checkpoint_kinds: Sequence[str] = CHECKPOINT_KINDS) -> Plan:
    """``plan`` with as many saved activations as possible dropped and recomputed (chains included), with an
    explicit ``recompute_at`` schedule: each producer re-runs at the earliest step that needs one of its
    outputs (its first backward reader, or the step of a recomputed consumer that reads it). Producers whose
    inputs would not be in memory then are kept. ``only``: restrict to these forward op ids. A heuristic
    (not the solver): verify the result with ``port.simulate``."""
    from dataclasses import replace
    from .simulate import NOT_RECOMPUTABLE_KINDS, owned_activation_outputs, is_static
    dec = plan.ops
    root: dict[int, int] = {}

    def R(t: int) -> int:
        s = graph.tensors[t]
        if s.alias_of is not None:
            return R(s.alias_of)
        return root.get(t, t)
    for o in graph.ops:
        if dec[o.id].variant == "inplace":
            root[o.outputs[0]] = R(o.inputs[0])
    shared = set()
    for t in graph.tensors:
        if t.alias_of is None and R(t.id) != t.id:
            shared.add(R(t.id))
    readers: dict[int, list[int]] = {}
    for o in graph.ops:
        for t in dict.fromkeys(o.inputs):
            readers.setdefault(R(t), []).append(o.id)
    prods = graph.producers()
    inplace_hit = set()
    for o in graph.ops:
        if dec[o.id].variant == "inplace" and o.phase == PHASE_FORWARD:
            inplace_hit.add(R(o.inputs[0]))
    cand = []
    for o in graph.ops:
        if o.phase != PHASE_FORWARD or o.kind in NOT_RECOMPUTABLE_KINDS or dec[o.id].variant in ("inplace", "fused"):
            continue
        if only is not None and o.id not in only:
            continue
        if only is None and o.kind in checkpoint_kinds:
            continue
        outs = owned_activation_outputs(graph, o.id)
        if not outs or any(R(t) != t or t in shared for t in outs):
            continue
        if any(not is_static(graph, u) and R(u) in inplace_hit for u in o.inputs):
            continue
        if o.outputs[0] == graph.logits_id or graph.logits_id in outs:
            continue
        cand.append(o.id)
    chosen = set(cand)

    def bwd_readers(t):
        return [c for c in readers.get(R(t), ()) if _is_bwd(graph, c)]

    while True:
        step: dict[int, int] = {}
        for p in sorted(chosen, reverse=True):
            c = []
            for t in owned_activation_outputs(graph, p):
                b = bwd_readers(t)
                if b:
                    c.append(min(b))
                for q in readers.get(t, ()):
                    if q in step:
                        c.append(step[q])
            if c:
                step[p] = min(c)
        bad = set(chosen) - set(step)
        for p, s in step.items():
            for u in dict.fromkeys(graph.ops[p].inputs):
                if is_static(graph, u):
                    continue
                q = prods.get(u)
                b = bwd_readers(u)
                if q in step:
                    # a pure intermediate is freed after its group: every re-run reader must share the group
                    if not b and step[q] != s:
                        bad.add(q)
                elif not b or max(b) < s:
                    bad.add(p)           # input not in memory at the re-run
        if not bad:
            break
        chosen -= bad
    rc = tuple(sorted(t for p in step for t in owned_activation_outputs(graph, p)))
    at = tuple(sorted(((p, s) for p, s in step.items()), key=lambda x: (x[1], x[0])))
    return replace(plan, recompute=rc, recompute_at=at)
