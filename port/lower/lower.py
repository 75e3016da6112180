"""Lowering: Graph + Plan -> Program (ordered kernel calls with arena offsets). Pure: no torch, no hardware.

``default_plan(graph, backend)`` is the plan the executor runs without a solver: every op on one backend, the
fused conv -> training batch norm -> relu kernel and in-place relu/relu6/add wherever legal, ``direct``
convolutions where legal (depthwise, 1x1). A plan's per-op accelerator decides the backend, so plans may mix
backends op by op (both CPU backends share the arena zero-copy).

``lower(graph, plan)``
1. takes the plan's events from ``port.plan.semantics.schedule`` (the one statement of what a plan means),
2. turns each event into the calls ``port.exec.registry.op_calls`` gives for it (the ones the profiler times),
   with a fresh tensor version for every re-run or paged-in root,
3. gives every root version the life the schedule gives it (allocating event to free event),
4. asks the registry for each call's workspace (the C kernels' own queries),
5. places the persistent region (params, buffers, param grads, optimizer state, constants) and the scratch
   roots + workspaces with ``port.lower.arena.assign_offsets``, and
6. checks the result with ``port.lower.arena.check_program``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from port.errors import PlanError
from port.lower.arena import assign_offsets, check_program, live_timeline
from port.lower.program import QUEUED_BACKENDS, needs_handoff_call  # noqa: F401 - re-exported
from port.lower.program import ACCELERATOR_BACKENDS, BACKEND_ACCELERATORS, BACKENDS, backend_of  # noqa: F401 - as above
from port.lower.program import (GRAD_SCALE_ID, REGION_PERSISTENT, REGION_SCRATCH, Call, Program, Slot, align)
from port.exec import registry
from port.ir.types import (DTYPE_BYTES, PHASE_BACKWARD, PHASE_FORWARD, PHASE_LOSS, PHASES, ROLE_BUFFER, ROLE_GRADIENT,
                           ROLE_INPUT, ROLE_LABEL, ROLE_OPTIMIZER_STATE, ROLE_PARAMETER, Graph, numel)
from port.plan import semantics as SEM
from port import ops
from port.plan import variants as V
from port.plan.types import OpDecision, Plan


def default_plan(graph: Graph, backend: str = "c", fuse: bool = True, inplace: bool = True,
                 fusions: tuple[str, ...] = ()) -> Plan:
    """Every op on ``backend`` with fusion and in-place wherever legal (and supported by the kernels); on the
    C backend each conv runs the algorithm the C library picks for its shape (PORT_CONV_AUTO: direct,
    winograd where it pays, else im2col), as the fused conv+bn+relu kernel does, and attention runs tiled
    (faster than the plain kernel and a workspace per thread instead of every head's scores: gpt_tiny batch 32,
    4 layers, forward + backward 31 -> 27 ms a step; the backward call's scratch 16 MiB -> 0.27 MiB). ``fuse``:
    the chains whose Fusion is a default (port.plan.variants.FUSIONS: conv -> bn -> relu, SwiGLU, rotary; not SE or
    rmsnorm_linear, which a solved plan picks where the profile says it pays), and those named in ``fusions``."""
    if backend not in BACKENDS:
        raise PlanError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    acc = BACKEND_ACCELERATORS[backend]
    variant: dict[int, str] = {o.id: "plain" for o in graph.ops}
    if backend == "c":
        for o in graph.ops:      # the C library's own choice (direct, winograd where it pays, else im2col)
            if o.kind in V.CONV_KINDS:
                v = registry.c_auto_conv_variant(graph, o)
                variant[o.id] = v if v in V.variants(graph, o, backend) else "plain"
            elif o.kind in V.ATTENTION_KINDS and "tiled" in V.variants(graph, o, backend):
                variant[o.id] = "tiled"
        if fuse:
            for ch in V.chains(graph).values():
                if ch.fusion.default or ch.fusion.name in fusions:
                    for i in ch.ops:
                        variant[i] = "fused"
    if inplace:
        for o in graph.ops:
            if o.kind in V.RERUN_INPLACE_KINDS and variant[o.id] == "plain" and V.inplace_legal(graph, o):
                variant[o.id] = "inplace"
    # ops the backend cannot run (torch_op on the C backend: PyTorch's own kernels) go to the torch engine of the
    # same device, which shares the arena zero-copy
    torch_acc = BACKEND_ACCELERATORS["torch-cuda" if backend == "torch-cuda" else "torch-cpu"]
    ops = tuple(OpDecision(o.id, acc if V.variants(graph, o, backend) else torch_acc, variant[o.id])
                for o in graph.ops)
    return Plan(graph_digest=graph.digest(), profile_digest="", budget_bytes=0, ops=ops, solver="default",
                status="feasible", batch_size=graph.batch_size)


# ---------------------------------------------------------------------------------------------
def _check_backends(graph: Graph, plan: Plan, phases, accelerators) -> dict[int, str]:
    """op id -> backend; PlanError when a variant is not available on the op's backend (the plan's rules
    themselves are port.plan.semantics')."""
    out = {}
    for o in graph.ops:
        if o.phase not in phases:
            continue
        d = plan.ops[o.id]
        be = backend_of(d.accelerator, accelerators)
        legal = V.variants(graph, o, be)
        if d.variant not in legal:
            raise PlanError(f"op {o.name!r}: variant {d.variant!r} is not legal on accelerator {d.accelerator!r} "
                            f"(backend {be}; legal: {', '.join(legal)})")
        out[o.id] = be
    return out


def plan_own_backends(plan: Plan, accelerators: dict[str, str] | None = None) -> tuple[str, ...]:
    """The backends of ``plan``'s own-memory accelerators (Plan.own_memory, from its profile) that run on a
    backend which can have its own memory (port.lower.program.QUEUED_BACKENDS); a stand-in backend
    (``accelerators``) runs on host memory."""
    from port.errors import PortError
    from port.lower.program import QUEUED_BACKENDS
    out = set()
    for a in plan.own_memory:
        try:
            b = backend_of(a, accelerators)
        except PortError:
            continue
        if b in QUEUED_BACKENDS:
            out.add(b)
    return tuple(sorted(out))


def lower(graph: Graph, plan: Plan | None = None, phases: Sequence[str] = PHASES, *,
          persistent_from: Program | None = None, strategy: str = "auto",
          accelerators: dict[str, str] | None = None, backend: str = "c", check: bool = True,
          check_digest: bool = True, overwrite_gradients: bool = True,
          own_memory: Sequence[str] | None = None) -> Program:
    """Lower ``graph`` under ``plan`` (default: ``default_plan(graph, backend)``) into a Program.

    phases: the graph phases to lower; ("forward",) gives an inference program (logits kept to the end).
    persistent_from: place parameters/buffers at the offsets (by name) of another program's persistent
      region, so an inference program can run on the training program's arena (its scratch reuses the
      training scratch, which is dead between steps).

    The program runs the plan's events (``port.plan.semantics.schedule``) in order, each as the calls the op
    registry gives for it (``port.exec.registry.op_calls``): ``page_in``/``page_out`` host calls for paged
    roots, re-emitted calls for re-runs (phase ``recompute``, new tensor *versions* with their own slots: the
    saved root's life splits in two), the op, early updates. Every root version lives exactly from its
    allocating event to its free event. Gradients of early-updated parameters live in scratch (their first,
    accumulating writer zeroes them).

    A gradient whose only writer is a C weight-gradient call (port.exec.registry.overwrites_gradients) is
    written by it, not zeroed before the step and accumulated; ``overwrite_gradients=False`` (micro-batching:
    the program runs once per micro-batch and the gradients add up over them) keeps every gradient zeroed and
    accumulated.

    own_memory: backends with their own memory (a discrete device, port.lower.memories): their tensors get
    slots in that memory's own arena too, and copy hand-offs move the bytes between memories. None (default):
    the backends of the plan's ``own_memory`` accelerators (what the profile it was solved on says).
    """
    from port.lower import memories as MEM
    if plan is None:
        plan = default_plan(graph, backend)
    if own_memory is None:
        own_memory = plan_own_backends(plan, accelerators)
    own = MEM.check_own(own_memory)
    phases = tuple(p for p in PHASES if p in phases)
    sch = SEM.schedule(graph, plan, phases, check_digest)
    be_of = _check_backends(graph, plan, phases, accelerators)
    own = tuple(b for b in own if b in be_of.values())     # an own memory no op of the plan runs on: no arena
    T = graph.tensors
    NT = len(T)
    dec = plan.ops
    R = sch.root_of

    members: dict[int, list[int]] = {}
    for t in range(NT):
        members.setdefault(R(t), []).append(t)

    def is_persistent_graph(t: int) -> bool:
        return t < 0 or (sch.is_static(graph, t) and T[R(t)].role not in (ROLE_INPUT, ROLE_LABEL))

    # -- events -> call drafts; root versions and their lives ----------------------------------
    cur: dict[int, int] = {}      # graph tensor -> its current version id
    vroot: dict[int, int] = {}    # version id -> its root version id
    vbase: dict[int, int] = {}    # version id -> the graph tensor it materialises
    vtag: dict[int, str] = {}
    next_id = [NT]

    def new_version(r: int, tag: str, share: int | None = None) -> None:
        """A new version of root r's tensors; ``share``: the root version whose bytes it takes over (a re-run
        in place), else its own."""
        rv = next_id[0] if share is None else share
        for m in sorted(members[r], key=lambda m: (m != r, m)):
            v = next_id[0]
            next_id[0] += 1
            vbase[v], vroot[v], vtag[v], cur[m] = m, rv, tag, v
        return None

    def Vr(t: int) -> int:
        return cur.get(t, t)

    def VR(t: int) -> int:      # the root version of a (version) id
        return vroot.get(t, R(t) if 0 <= t < NT else t)

    drafts: list[dict[str, Any]] = []
    wrote: dict[int, str] = {}          # root version -> backend of its last writer call in this pass
    handed: dict[int, set] = {}         # root version -> backends it was handed to since

    def hand_over(o, dst: str, ins: list[int], attrs: dict) -> None:
        """The plan's hand-off events where the bytes cross engines (port.plan.semantics rule 7): a ``handoff``
        call before a call reading a tensor whose last writer ran on an engine ``dst`` does not share a queue
        with (needs_handoff_call). A view passes its base's bytes on: its hand-off happens where a kernel reads
        them. port.lower.arena.check_program requires exactly this."""
        if own and (dst in own or any(wrote.get(VR(t)) in own for t in ins)):
            return                  # own memory: copies (place_copies below), not synchronisations
        for t in dict.fromkeys(ins):
            r = VR(t)
            src = wrote.get(r)
            if src is not None and needs_handoff_call(src, dst) and dst not in handed.get(r, ()):
                drafts.append(dict(op=o.id, name=f"{T[vbase.get(t, t)].name}.handoff", kernel="handoff",
                                   backend="host", variant="plain", outputs=(), inputs=(t,),
                                   phase="recompute" if attrs.get("recompute") else o.phase,
                                   attrs={"src": src, "dst": dst} | ({"early": True} if attrs.get("early") else {}),
                                   covers=()))
                handed.setdefault(r, set()).add(dst)

    born: dict[int, int] = {}     # root version -> index of the first call at/after its allocating event
    died: dict[int, int] = {}     # root version -> index of the last call at/before its free event
    pending: list[int] = []
    seen_root: set[int] = set()
    for ev in sch.events:
        if ev.kind == "free":
            for r in ev.roots:
                died[VR(Vr(r))] = len(drafts) - 1
            continue
        if ev.kind == "handoff":      # priced by the simulator; the calls follow the bytes (hand_over)
            continue
        if ev.kind == "join":         # the host waits for the queue (Plan.joins): its held bytes are freed after
            from port.lower.program import backend_of
            drafts.append(dict(op=ev.op, name=f"{graph.ops[ev.op].name}.join_{ev.src}", kernel="join",
                               backend="host", variant="plain", phase=graph.ops[ev.op].phase, outputs=(), inputs=(),
                               attrs={"src": backend_of(ev.src)}, covers=()))
            continue
        share = VR(Vr(ev.into[0])) if ev.into else None
        for r in ev.alloc:
            if ev.kind in ("recompute", "page_in") or r in seen_root:
                new_version(r, "recompute" if ev.kind == "recompute" else "paged", share)
            seen_root.add(r)
            if share is None:
                pending.append(Vr(r))
        n0 = len(drafts)
        if ev.kind in ("page_in", "page_out"):
            r = ev.roots[0]
            # a paged optimizer state's pages around a late update run with the late updates (once a step)
            late = r in sch.paged_state and SEM.paged_state_updates(graph)[r] not in sch.early_at
            io = ((Vr(r),), ()) if ev.kind == "page_in" else ((), (Vr(r),))
            drafts.append(dict(op=-1, name=f"{T[r].name}.{ev.kind}", kernel=ev.kind, backend="host",
                               variant="plain", phase="page", outputs=io[0], inputs=io[1],
                               attrs={"key": r} | ({"state": True} if r in sch.paged_state else {})
                               | ({"late": True} if late else {}), covers=()))
        else:
            o = graph.ops[ev.op]
            rec = ev.kind == "recompute"
            for spec in registry.op_calls(graph, o, "inplace" if ev.into else dec[o.id].variant, be_of[o.id]):
                attrs = dict(spec.attrs)
                if rec:
                    attrs["recompute"] = True        # batch norm: do not update the running statistics again
                if o.id in sch.early_at:
                    attrs["early"] = True
                hand_over(o, spec.backend, [Vr(t) for t in spec.inputs], attrs)
                drafts.append(dict(op=o.id, name=o.name + (".recompute" if rec else ""), kernel=spec.kernel,
                                   backend=spec.backend, variant=spec.variant,
                                   phase="recompute" if rec else o.phase,
                                   outputs=tuple(Vr(t) for t in spec.outputs),
                                   inputs=tuple(Vr(t) for t in spec.inputs), attrs=attrs, covers=spec.covers))
                for t in spec.outputs:
                    wrote[VR(Vr(t))] = spec.backend
                    handed.pop(VR(Vr(t)), None)
        if len(drafts) > n0:
            for v in pending:
                born[v] = n0
            pending = []
    n = len(drafts)
    for v in pending:            # allocated by an event without calls: lives from the next call
        born[v] = n - 1

    # gradients their only writer overwrites: never zeroed (with overwrite_gradients=False: accumulated)
    overwritten: set[int] = set()
    for dr in drafts:
        if dr["attrs"].get("overwrite"):
            if not overwrite_gradients:
                del dr["attrs"]["overwrite"]
            else:
                overwritten.update(R(vbase.get(t, t)) for t in dr["outputs"])
    # early-updated gradients live in scratch: their first (accumulating) writer zeroes them
    zeroed: set[int] = set(overwritten)
    for dr in drafts:
        z = []
        for t in dr["outputs"]:
            r = R(vbase.get(t, t)) if t >= 0 else t
            if r in sch.dynamic_grads and r not in zeroed:
                zeroed.add(r)
                if dr["kernel"].endswith("grad_weight") or dr["kernel"].endswith("grad_weight_from_output"):
                    z.append(t)
        if z:
            dr["attrs"]["zero_outputs"] = tuple(z)

    if own:     # copies between memories (port.lower.memories); the lives follow the calls' new indices
        keep_roots = {VR(Vr(t)) for t in (graph.loss_id, graph.logits_id) if 0 <= t < NT}

        def persistent(r: int) -> bool:
            return r < 0 or (r < NT and is_persistent_graph(r))

        def preexisting(r: int) -> bool:       # the step's inputs and labels, and the persistent region
            return persistent(r) or (r < NT and T[r].role in (ROLE_INPUT, ROLE_LABEL))
        drafts, where_now = _place_copies(drafts, own, VR, preexisting, persistent, keep_roots,
                                          lambda t: T[vbase.get(t, t)].name if t >= 0 else "loss.grad_scale")
        born = {v: where_now[i] if i >= 0 else i for v, i in born.items()}
        died = {v: where_now[i] if i >= 0 else i for v, i in died.items()}
        n = len(drafts)

    # tensors referenced
    used: list[int] = []
    seen = set()
    for dr in drafts:
        for t in dr["inputs"] + dr["outputs"]:
            if t not in seen:
                seen.add(t)
                used.append(t)
    for t in graph.input_ids + (graph.logits_id,):
        if t not in seen:
            seen.add(t)
            used.append(t)
    if PHASE_LOSS in phases and graph.label_id not in seen:
        seen.add(graph.label_id)
        used.append(graph.label_id)

    def base(t: int) -> int:
        return vbase.get(t, t)

    def spec(t: int) -> tuple[str, tuple[int, ...], str, str]:
        if t == GRAD_SCALE_ID:
            return "loss.grad_scale", (1,), "float32", "constant"
        s = T[base(t)]
        name = s.name if t < NT else f"{s.name}@{vtag[t]}"
        return name, s.shape, s.dtype, s.role

    # persistent region
    slots: dict[int, Slot] = {}
    pers = sorted({(t if t < 0 else R(t)) for t in used if is_persistent_graph(base(t) if t >= 0 else t)},
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
            if role == ROLE_GRADIENT and t not in overwritten:
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

    # scratch roots: lives from the schedule; every reference must fall inside (semantics == calls)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, dr in enumerate(drafts):
        for t in dr["inputs"] + dr["outputs"]:
            if t < 0 or is_persistent_graph(base(t)):
                continue
            r = VR(t)
            first.setdefault(r, i)
            last[r] = i
    ref_last = dict(last)
    for r in list(first):
        b, d = born.get(r), died.get(r)
        if b is not None and d is not None and not (b <= first[r] and last[r] <= max(d, b)):
            raise PlanError(f"internal: tensor {spec(r)[0]!r} is used at calls {first[r]}..{last[r]} outside its "
                            f"life {b}..{d} in the plan's schedule (please report)")
        if b is not None:
            first[r] = min(first[r], b)
        if d is not None:
            last[r] = max(last[r], d)
    # the step's input batch and labels are written before call 0 and stay for the whole step (static memory
    # in the plan's semantics); the loss (and, for inference, the logits) stay readable after the step
    for t in graph.input_ids + (graph.label_id,):
        if t in seen:
            r = VR(t)
            first[r] = 0
            last[r] = max(n - 1, 0)
    keep = [graph.loss_id] if PHASE_LOSS in phases else []
    if phases == (PHASE_FORWARD,):
        keep.append(graph.logits_id)
    for t in keep:
        r = VR(Vr(t))
        first.setdefault(r, n - 1)
        last[r] = max(n - 1, 0)
    # lives the calls alone do not show (a re-run's pure intermediate is freed after its whole group)
    hold = tuple(sorted((r, last[r]) for r in ref_last if last[r] > ref_last[r]))

    def shape_of(t: int) -> tuple[int, ...]:
        return spec(t)[1]

    ws_bytes = [0 if dr["backend"] == "host" else
                registry.workspace_bytes(dr["kernel"], dr["variant"], dr["backend"], dr["attrs"],
                                         [shape_of(t) for t in dr["inputs"]], [shape_of(t) for t in dr["outputs"]])
                for dr in drafts]
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
        if t in slots or (t >= 0 and R(base(t)) in sch.nonmat):
            continue
        r = VR(t) if t >= 0 else t
        if r not in slots:
            continue
        name, shape, dtype, role = spec(t)
        rs = slots[r]
        off = rs.offset + (graph.view_offset(base(t)) if t >= 0 else 0)     # a range view: into its root's bytes
        slots[t] = Slot(t, name, shape, dtype, off, numel(shape) * DTYPE_BYTES[dtype], rs.region, r, role)

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
                   live_until=hold, extra_input_ids=tuple(t for _, t in graph.extra_inputs if t in slots))
    tl = live_timeline(prog)
    from dataclasses import replace
    prog = replace(prog, live_timeline=tl, peak_live_bytes=int(P + (max(tl) if tl else 0)))
    if own:
        prog = _place_own_arenas(prog, own, strategy)
    if check:
        check_program(prog)
    return prog


def _place_copies(drafts: list, own: tuple, root, preexisting, persistent, keep_roots: set, name):
    """``drafts`` with the copy hand-offs of port.lower.memories' rule inserted, and where each old draft went
    (old index -> new index). Late updates must follow every main call (the executor's run order)."""
    from port.lower import memories as MEM
    late = [MEM.is_late_update(d["phase"], d["attrs"]) for d in drafts]
    if any(late[i] and not late[i + 1] for i in range(len(late) - 1)):
        raise PlanError("internal: a late update call precedes a main call; own-memory programs need the late "
                        "updates last (please report)")
    out: list[dict] = []
    where: list[int] = []
    res = MEM.Residency(preexisting)

    def copy(r: int, src: str, dst: str, like: dict) -> None:
        out.append(dict(op=like["op"], name=f"{name(r)}.copy", kernel="handoff", backend="host", variant="plain",
                        outputs=(), inputs=(r,), phase=like["phase"],
                        attrs={"src": src, "dst": dst, "copy": True}
                        | ({"early": True} if like["attrs"].get("early") else {}), covers=()))
        res.copied(r, dst)

    def flush(keep, like: dict) -> None:
        for r, src in res.stranded(keep):
            copy(r, src, MEM.HOST, like)

    for i, d in enumerate(drafts):
        if late[i] and (i == 0 or not late[i - 1]):
            if i:
                flush(lambda r: persistent(r) or r in keep_roots, drafts[i - 1])
            res = MEM.Residency(preexisting)
        m = MEM.memory_of(d["backend"], own)
        for r, src in res.missing(m, [root(t) for t in d["inputs"] + d["outputs"]]):
            copy(r, src, m, d)
        where.append(len(out))
        out.append(d)
        res.wrote(m, [root(t) for t in d["outputs"]])
    if drafts:
        flush(lambda r: persistent(r) or (not late[-1] and r in keep_roots), drafts[-1])
    return out, where


def _place_own_arenas(prog: Program, own: tuple, strategy: str) -> Program:
    """Each own memory's arena: the roots its calls and copies use, placed from their lives there."""
    from port.lower import memories as MEM
    lives = MEM.own_lives(prog.calls, lambda t: prog.slot(t).root, own)
    mems, mslots = [], []
    for m in own:
        items = [(r, prog.slot(r).nbytes, a, b) for r, (a, b) in sorted(lives[m].items())]
        offs, high = assign_offsets(items, strategy)
        mems.append((m, int(high)))
        mslots += [(m, r, int(offs[r])) for r, *_ in items]
    from port.lower.program import PROGRAM_FORMAT_OWN_MEMORY
    return replace(prog, memories=tuple(mems), memory_slots=tuple(mslots), version=PROGRAM_FORMAT_OWN_MEMORY)


def inference_program(graph: Graph, train_program: Program, backend: str = "c", strategy: str = "auto") -> Program:
    """The inference program of ``graph`` (forward only) on ``train_program``'s arena: its parameters at the
    training program's offsets, and its arena no larger than the training program's wherever the variants allow.

    The executor allocates one arena for both programs, sized by the larger; the solver's budget covers the
    training program only. ``default_plan``'s variants are the fastest, not the leanest: at digits_cnn's batch 32 a
    Winograd workspace (1.6 MB) made the inference arena 2.03 MiB against the training program's 1.12 MiB, and
    the demo's arena over its budget. While the inference arena is over the training one, the op of the call at
    its peak switches to its legal variant of least workspace (fusion off for it), and the program is lowered
    again; it stops when the arena fits or that op has no leaner variant (the arena is then the inference
    program's: a forward pass that alone exceeds the training arena)."""
    plan = default_plan(graph, backend)
    prog = lower(graph, plan, phases=(PHASE_FORWARD,), persistent_from=train_program, strategy=strategy)
    limit = train_program.arena_bytes
    variants = {d.op: d.variant for d in plan.ops}
    while prog.arena_bytes > limit and prog.live_timeline:
        peak = max(range(len(prog.calls)), key=lambda i: prog.live_timeline[i])
        c = prog.calls[peak]
        if c.op < 0 or not c.workspace_bytes:
            break
        o = graph.ops[c.op]
        be = backend_of(plan.ops[o.id].accelerator)
        lean = min((v for v in V.variants(graph, o, be) if v not in ("fused", "inplace")),
                   key=lambda v: (registry.op_workspace_bytes(graph, o, v, be), v != variants[o.id]))
        if registry.op_workspace_bytes(graph, o, lean, be) >= c.workspace_bytes:
            break
        for i in (V.chain_of(graph, o).ops if variants[o.id] == "fused" else ()):
            variants[i] = "plain"
        variants[o.id] = lean
        plan = replace(plan, ops=tuple(replace(d, variant=variants[d.op]) for d in plan.ops))
        prog = lower(graph, plan, phases=(PHASE_FORWARD,), persistent_from=train_program, strategy=strategy)
    return prog


def inference_graph(model: Any, example_input: Any, name: str | None = None) -> Graph:
    """Trace ``model`` in eval mode (BN with running stats, dropout off) for an inference program."""
    from port.ir.trace import trace_many
    return trace_many([inference_job(model, example_input, name)])[0]


def inference_job(model: Any, example_input: Any, name: str | None = None) -> dict:
    """port.ir.trace.trace_many's job for ``model``'s inference graph (an eval-mode copy without the weights)."""
    import copy
    from port.ir.trace import meta_copy
    m = meta_copy(model)        # no copy of the weights (trace copies again, meta to meta: free)
    m = (m if m is not None else copy.deepcopy(model)).eval()
    return dict(model=m, example_input=example_input, optimizer="sgd", name=name)


CHECKPOINT_KINDS = ops.with_tag("checkpoint")     # cheap to re-run (their records' tag)


def recompute_plan(graph: Graph, plan: Plan, only: Sequence[int] | None = None,
                   checkpoint_kinds: Sequence[str] = CHECKPOINT_KINDS) -> Plan:
    """``plan`` with as many saved activations as possible dropped and recomputed (chains included), with an
    explicit ``recompute_at`` schedule: each producer re-runs at the earliest step that needs one of its
    outputs (its first backward reader, or the step of a recomputed consumer that reads it). Producers whose
    inputs would not be in memory then are kept. ``only``: restrict to these forward op ids. A heuristic
    (not the solver): verify the result with ``port.verify.simulate``."""
    from dataclasses import replace
    from port.plan.semantics import NOT_RECOMPUTABLE_KINDS, is_static, owned_activation_outputs
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
    fused_over = {q: xy for q, xy in V.fused_inplace(graph).items() if dec[q].variant == "fused"}
    for q, (x, y) in fused_over.items():      # a fused call's output over an input (the rotary embedding's y)
        root[y] = R(x)
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
    inplace_hit.update(R(x) for x, _y in fused_over.values())
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
        return [c for c in readers.get(R(t), ()) if SEM.is_backward(graph, c)]

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
    return replace(plan, recompute=rc, recompute_at=at, inplace_reruns=())
