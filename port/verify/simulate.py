"""Replay a Plan: predicted step time and the memory timeline.

The simulator is the referee every plan (the ILP's included) is checked against. It shares with the solver
and with lowering only the plan's meaning, ``port.plan.semantics.schedule`` (the events a plan runs), and
none of the ILP's variables: it prices each event from the profile and accounts memory on its own.

Memory recorded per executed op or re-run (``op``/``recompute`` events): the plan's static bytes + the live
roots + what the running op needs beyond them (OpCost.extra_bytes: its arena workspace + what it allocates
outside the arena, measured by the profiler) + the engine memory of the accelerators the plan uses
(port.plan.semantics.engine_bytes: each engine's resident footprint, outside the arena). ``peak_bytes`` is that process-level peak, the figure a budget
bounds; ``arena_peak_bytes`` leaves the outside allocations out and is the arena lowering builds. Time: the sum of op latencies (re-runs included),
hand-offs (per tensor and reading op when producer and reader sit on different accelerators; a re-run re-reads
its inputs), and paging (latency + bytes / bandwidth for each page_out and each page_in), plus the executor's
fixed per-step overhead when the profile records one (host ``executor.step_overhead_ms``: the wall time of a
step outside its kernel calls, measured by ``port profile`` and corrected by ``port train --replan``; the same
for every plan, so it moves no decision), less the per-call dispatch the whole-step C engine does not pay on
plans it runs (:func:`rt_dispatch_saving_ms`), less what the per-op executor's call timers added to the prices on
plans it runs untimed (:func:`timed_call_saving_ms`); both in ``overhead_ms``, so they move no decision either.

Overlap: ``step_ms`` is the serial sum (the ILP's "serial" objective). ``breakdown["makespan_ms"]`` is the
step with the engines overlapped as the executor issues them (``_Timelines``: a queued engine's calls run while
the host thread goes on, waits at hand-offs; the ILP's "makespan" objective; a queued call's issue, OpCost.issue_ms,
takes the host thread first): at most ``step_ms`` plus the queued calls' issue times, and equal to ``step_ms``
where the queued engine shares compute (the profile's ``shared_compute``, a device YAML's
``shares_compute_with``: PoCL's CPU device and the C kernels here).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from port.errors import PlanError
from port.ir.types import Graph
from port.plan import semantics as SEM
from port.plan import variants as V
from port.plan.types import Plan
from port.cost.types import Profile



@dataclass(frozen=True)
class SimResult:
    step_ms: float
    peak_bytes: int
    timeline: tuple[int, ...]                 # bytes in use during each executed step (static included)
    steps: tuple[tuple[str, int], ...]        # ("op", id) or ("recompute", id), executed order
    peak_step: int                            # index into steps/timeline
    peak_tensors: tuple[str, ...]             # roots live at the peak, largest first
    static_bytes: int
    breakdown: dict = field(default_factory=dict)   # compute/recompute/handoff/paging/overhead ms, engine_bytes
    gantt: tuple[tuple[str, str, float, float], ...] = ()  # (label, accelerator, start_ms, end_ms)
    # the makespan's schedule (``_Timelines``): (label, lane, start_ms, end_ms), lane "host" (the host thread: its
    # engines' calls, hand-offs, paging) or a queued engine's accelerator
    lanes: tuple[tuple[str, str, float, float], ...] = ()
    arena_peak_bytes: int = 0                 # the peak without allocations outside the arena (= the arena)


def _costs(graph: Graph, profile: Profile, plan: Plan):
    costs = []
    for o, d in zip(graph.ops, plan.ops):
        c = profile.lookup(graph.signature(o), d.accelerator, d.variant)
        if c is None:
            raise PlanError(f"op {o.name!r}: ({d.accelerator}, {d.variant}) is not in the profile")
        costs.append(c)
    return costs


# profile host records (written by port.cost.measure's program-order re-timing)
STEP_OVERHEAD_KEY = "executor.step_overhead_ms"   # the Python executor's wall per step outside its calls
CALL_DISPATCH_KEY = "executor.call_dispatch_us"   # what its timed call adds to every C call (closure, ctypes)
STATE_SYNC_KEY = "executor.state_sync_us"   # what it adds on top to a call reading the run state (updates, dropout)
RT_ACCELERATORS_KEY = "executor.rt_accelerators"  # accelerators whose ops the whole-step C engine runs
TIMED_CALL_KEY = "executor.timed_call_us"   # what timing a call adds to it (the profile's prices are timed calls)
# what the whole-step C engine's untimed step saves per call over the per-op executor's untimed step, measured in
# program (v1: paired steps of the default all-C plan); profiles before it price the rt engine by CALL_DISPATCH_KEY
RT_STEP_SAVING_KEY = "executor.rt_step_saving_v1_us"


def _host_ms(profile: Profile, key: str) -> float:
    """A non-negative finite float host record of ``profile`` (0 when absent or not one)."""
    try:
        x = float(dict(profile.host).get(key, 0.0))
    except ValueError:
        return 0.0
    return x if x > 0 and x == x and x != float("inf") else 0.0


def _signed_host(profile: Profile, key: str) -> float | None:
    """A finite float host record of ``profile``, of either sign (None when absent or not one)."""
    try:
        x = float(dict(profile.host)[key])
    except (KeyError, ValueError):
        return None
    return x if x == x and abs(x) != float("inf") else None


def step_overhead_ms(profile: Profile) -> float:
    """The executor's fixed per-step overhead recorded in ``profile`` (0 when none is)."""
    return _host_ms(profile, STEP_OVERHEAD_KEY)


def rt_dispatch_saving_ms(plan: Plan, graph: Graph, profile: Profile, call_ms: list[tuple[int, float]],
                          paged: bool) -> float:
    """The per-call dispatch of the Python executor that the whole-step C engine (port.exec.rtengine) does not
    pay, over the calls priced ``call_ms``: the profile's op times were taken through the Python executor, each
    with that dispatch in it (host ``executor.call_dispatch_us``), and a Trainer runs a plan on the rt engine when
    every op sits on the C kernels' accelerator (host ``executor.rt_accelerators``), every further input (an
    attention mask) is of a dtype port-rt takes and nothing is paged (port.exec.rtengine.eligible's rules that a
    plan decides; micro-batching is the Trainer's: hf.bert_seqcls_mask's all-C plan ran on the rt engine while
    this rule still refused every graph with a further input, its step predicted 0.53 ms, run 0.29).
    Else 0. A call saves at most its own price: views and fused-away ops (priced 0) run no call, and a dispatch
    figure taken on a loaded machine must not price a step below nothing (hf.bert_seqcls, load 6: 25 us a call,
    the plan's step predicted -1.1 ms). ``call_ms``: (op id, price) per executed call. A call that reads the run
    state (its op kind's record tagged ``run_state``: optimizer updates, dropout draws) saves the state sync too
    (host ``executor.state_sync_us``): the per-op executor syncs the C run state before each such call, the
    whole-step engine once a half step (hf.bert_seqcls, 1 thread, CPU time: the per-op engine's timed calls
    1.76 us a call over the rt engine's step, the dispatch figure 1.35; its 41 updates 1 us each).
    A profile that records ``executor.rt_step_saving_v1_us`` (port profile pairs the default all-C plan's untimed
    per-op step with its untimed whole-step engine step, in program) prices the engine by that instead, per call
    and of either sign, on top of :func:`timed_call_saving_ms` (what timing added), so that the timers' cost is
    booked alike on both engines' plans (before, a profile whose step overhead came out negative, recorded 0,
    left about n x timed_call_us of timer cost in every rt plan: hf.bert_seqcls predicted ~15% long); a call
    saves at most its price less its timer cost. The dispatch figure is a tight-loop microbenchmark and
    understated the in-program Python cost."""
    from port import ops as OPS
    if not rt_runs(plan, graph, profile, paged):
        return 0.0
    measured = _signed_host(profile, RT_STEP_SAVING_KEY)
    if measured is not None:     # per call, against the untimed per-op step (the timers' cost is booked apart)
        timer = _host_ms(profile, TIMED_CALL_KEY)
        return sum(measured / 1e3 if measured < 0 else min(measured, max(0.0, ms * 1e3 - timer)) / 1e3
                   for _oid, ms in call_ms if ms > 0)
    us = _host_ms(profile, CALL_DISPATCH_KEY)
    sync = _host_ms(profile, STATE_SYNC_KEY)
    stateful = set(OPS.with_tag("run_state"))
    if not us:
        return 0.0
    return sum(min((us + (sync if graph.ops[oid].kind in stateful else 0.0)) / 1e3, ms) for oid, ms in call_ms
               if ms > 0)


def rt_runs(plan: Plan, graph: Graph, profile: Profile, paged: bool) -> bool:
    """Whether a Trainer runs ``plan`` on the whole-step C engine (port.exec.rtengine.eligible's rules that a
    plan decides): every op on an accelerator of the profile's ``executor.rt_accelerators``, every further input
    of a dtype port-rt takes, nothing paged."""
    from port.exec.rtengine import RT_INPUT_DTYPES
    rt = {a for a in dict(profile.host).get(RT_ACCELERATORS_KEY, "").split(",") if a}
    if not rt or paged or any(d.accelerator not in rt for d in plan.ops):
        return False
    return all(graph.tensors[t].dtype in RT_INPUT_DTYPES for _k, t in graph.extra_inputs)


def timed_call_saving_ms(plan: Plan, graph: Graph, profile: Profile, call_ms: list[tuple[int, float]],
                         paged: bool) -> float:
    """What the per-op executor's call timers added to the profile's prices, on a plan it runs untimed (a
    Trainer's step): the profile's op times are timed calls, and where a step's timed calls add up to more than
    the same step run untimed (host ``executor.timed_call_us``, that difference per call of the default plan,
    measured with the step overhead: tv.squeezenet1_1, 1 thread, CPU time: 231 timed calls 6.10 ms, the step
    untimed 5.78 ms), a plan's step is that much shorter per call, on either engine. 0 on plans the whole-step C
    engine runs when the profile predates ``executor.rt_step_saving_v1_us``: its saving
    (:func:`rt_dispatch_saving_ms`) was taken against the timed calls then. A call saves at most its own price;
    ``call_ms``: (op id, price) per executed call."""
    us = _host_ms(profile, TIMED_CALL_KEY)
    if not us or rt_runs(plan, graph, profile, paged) and _signed_host(profile, RT_STEP_SAVING_KEY) is None:
        return 0.0
    return sum(min(us / 1e3, ms) for _oid, ms in call_ms if ms > 0)


def queued_accelerators(plan: Plan) -> frozenset[str]:
    """The plan's accelerators whose backend runs asynchronously on a queue (port.lower.program.QUEUED_BACKENDS:
    the executor enqueues their calls and waits only at hand-offs and byte conflicts)."""
    return _queued(dict.fromkeys(d.accelerator for d in plan.ops))


def overlapping_accelerators(accelerators, profile: Profile) -> frozenset[str]:
    """Those of ``accelerators`` whose calls overlap the host thread's in the makespan: queued engines
    (:func:`queued_accelerators`) that do not share compute with another engine (the profile's
    ``shared_compute``, a device YAML's ``shares_compute_with``: PoCL's CPU device computes on the host's cores)."""
    shared = {a for a, _b in getattr(profile, "shared_compute", ())}
    return frozenset(a for a in _queued(accelerators) if a not in shared)


def _queued(accelerators) -> frozenset[str]:
    from port.errors import PortError
    from port.lower.lower import backend_of
    from port.lower.program import QUEUED_BACKENDS
    out = set()
    for a in accelerators:
        try:
            if backend_of(a) in QUEUED_BACKENDS:
                out.add(a)
        except PortError:
            pass
    return frozenset(out)


def join_ms(profile: Profile, acc: str) -> float:
    """An explicit join of queue ``acc`` (Plan.joins) on the host thread once the queue has drained: the profile's
    join figure (``Profile.join_ms_of``: the engine's finish() on a drained queue, measured by ``port profile``),
    not a hand-off's latency (that holds the wait for a busy queue, which is the lanes' here:
    ``_Timelines.handoff``)."""
    return profile.join_ms_of(acc)


class _Timelines:
    """The overlap model of one step, as the executor issues it: the host thread runs synchronous engines' calls,
    hand-offs and paging in program order and enqueues a queued engine's calls without waiting; each queued
    engine runs its calls in order, a call starting when it is issued and its queue is free. A hand-off from a
    queued engine waits for its queue (in order: everything enqueued before), a page call for every queue. The
    makespan is when the host thread and every queue are done. The executor waits nowhere else: lowering keeps a
    queued call's bytes until the host joins its queue (port.plan.semantics rule 8), so no host call reuses them
    before (port.exec.handoff.host_waits; an in-place host write to bytes a queued call used would still wait: not
    modelled). A queued call first takes the host thread for its issue (OpCost.issue_ms: binding and enqueueing
    its kernels; measured by ``port profile``), then runs on its queue from the end of its issue: ResNet-8 b8's
    split plan (four calls queued; measured 13.8 ms, predicted 8.4 without it) spent 0.78 ms of the host's time
    issuing them against 0.39 ms of C work they took off it: with it 9.0 ms, above the same plan all on C (8.7).
    Not modelled: engines that share cores (PoCL's CPU device computes on the C kernels' cores: no real overlap
    there); other processes on an engine's cores (a queue whose thread waits for its core delays the host's join)."""

    def __init__(self, queued: frozenset[str]) -> None:
        self.queued = queued
        self.host = 0.0
        self.q: dict[str, float] = {}
        self.spans: list[tuple[str, str, float, float]] = []   # (label, lane: "host" or the queue, start, end)

    def op(self, acc: str, ms: float, label: str = "", issue_ms: float = 0.0) -> None:
        if acc in self.queued:
            if issue_ms > 0:
                self.spans.append((f"issue {label}", "host", self.host, self.host + issue_ms))
                self.host += issue_ms
            t0 = max(self.host, self.q.get(acc, 0.0))
            self.q[acc] = t0 + ms
            self.spans.append((label, acc, t0, t0 + ms))
        else:
            self.spans.append((label, "host", self.host, self.host + ms))
            self.host += ms

    def handoff(self, src: str, ms: float, label: str = "") -> None:
        t0 = max(self.host, self.q.get(src, 0.0))
        self.spans.append((label, "host", t0, t0 + ms))
        self.host = t0 + ms

    def page(self, ms: float, label: str = "") -> None:
        t0 = max(self.host, *self.q.values()) if self.q else self.host
        self.spans.append((label, "host", t0, t0 + ms))
        self.host = t0 + ms

    def makespan(self) -> float:
        return max(self.host, *self.q.values()) if self.q else self.host


def simulate(plan: Plan, graph: Graph, profile: Profile, own: dict[str, str] | None = None) -> SimResult:
    """``own``: accelerator -> memory for engines with their own memory (a device YAML's ``memory: own``; None,
    the default: the profile's ``own_memory``, ``{}``: none): the hand-offs to and from them are the copies of
    port.lower.memories' rule (``SEM.own_memory_replay``: parameters copied in every step included), each priced
    from the latency + bytes / bandwidth between the own memory's engine and the profile's host accelerator
    (``Profile.host_accelerator``: a copy moves bytes between two memories, whichever host engine reads them), and
    ``breakdown["own_memory_peaks"]`` gives each such memory's peak (= the lowered program's own arena)."""
    if own is None:
        own = profile.own_map()
    sch = SEM.schedule(graph, plan)
    costs = _costs(graph, profile, plan)
    dec = plan.ops
    T = graph.tensors
    S = sch.static_bytes
    E = SEM.engine_bytes(plan, profile)   # engines' resident footprint: outside the arena, the whole step
    if sch.paged and not profile.storage:
        raise PlanError(f"plan pages tensors but profile {profile.device!r} declares no storage")
    stg = dict(profile.storage or ())
    bw = stg.get("bandwidth_gbps", 0.0) * 1e6   # bytes per ms
    lat = stg.get("latency_ms", 0.0)

    live: dict[int, int] = {}
    total = 0
    timeline: list[int] = []
    arena_tl: list[int] = []
    steps: list[tuple[str, int]] = []
    snapshots: list[tuple[int, ...]] = []
    gantt: list[tuple[str, str, float, float]] = []
    clock = comp = rcomp = hand = pagems = 0.0
    lanes = _Timelines(overlapping_accelerators(dict.fromkeys(d.accelerator for d in plan.ops), profile))

    def add(r: int) -> None:
        nonlocal total
        if r in live:
            raise PlanError(f"{T[r].name!r} is materialised twice (recomputed while still live)")
        live[r] = sch.root_bytes(graph, r)
        total += live[r]

    def handoff(ev) -> None:
        """A hand-off event (port.plan.semantics rule 7): the engine pair's latency + bytes / bandwidth."""
        nonlocal clock, hand
        if own and (ev.src in own or dec[ev.op].accelerator in own):
            return                  # own memory: its copies are priced below
        tid = ev.roots[0]
        h = profile.handoff_cost(ev.src, dec[ev.op].accelerator).cost_ms(T[tid].bytes)
        hand += h
        lanes.handoff(ev.src, h, f"hand-off {T[tid].name}")
        if h:
            gantt.append((f"hand-off {T[tid].name} {ev.src}->{dec[ev.op].accelerator}", "handoff", clock, clock + h))
        clock += h

    def run(kind: str, oid: int, taken: tuple[int, ...] = ()) -> None:
        nonlocal clock, comp, rcomp
        reads, made = graph.ops[oid].inputs, ()
        ch = V.chain_of(graph, graph.ops[oid]) if dec[oid].variant == "fused" and kind == "op" else None
        if ch is not None:       # a fused member runs no call of its own (its call op reads its inputs), a call op
            covered = [m for m in ch.ops if ch.call_of(m) == oid]     # reads its calls' inputs too (fused_reads)
            made = {t for m in ch.ops for t in graph.ops[m].outputs} if ch.call_of(oid) != oid else \
                {t for m in covered for t in graph.ops[m].outputs}
            reads = reads + V.fused_reads(graph).get(oid, ())
        for t in reads:
            r = sch.root_of(t)
            if t in made:
                continue
            if not sch.is_static(graph, t) and r not in sch.nonmat and r not in live and r not in taken:
                raise PlanError(f"{'recompute of' if kind == 'recompute' else 'op'} {graph.ops[oid].name!r} reads "
                                f"{T[t].name!r}, which is not in memory then (dropped and not restored)")
        c = costs[oid]
        timeline.append(S + E + total + c.extra_bytes)
        arena_tl.append(S + total + c.arena_workspace_bytes)
        steps.append((kind, oid))
        snapshots.append(tuple(live))
        if kind == "recompute":
            rcomp += c.latency_ms
        else:
            comp += c.latency_ms
        label = graph.ops[oid].name + (" (recompute)" if kind == "recompute" else "")
        lanes.op(dec[oid].accelerator, c.latency_ms, label, c.issue_ms)
        gantt.append((label, dec[oid].accelerator, clock, clock + c.latency_ms))
        clock += c.latency_ms

    def page(r: int, what: str) -> None:
        nonlocal clock, pagems
        c = lat + T[r].bytes / bw
        pagems += c
        lanes.page(c, f"{what} {T[r].name}")
        gantt.append((f"{what} {T[r].name}", "storage", clock, clock + c))
        clock += c

    for ev in sch.events:
        for r in ev.into:           # a re-run in place: its output takes over this copy's bytes
            if r not in live:
                raise PlanError(f"recompute of {graph.ops[ev.op].name!r} runs in place on {T[r].name!r}, which "
                                f"is not in memory then")
            total -= live.pop(r)
        for r in ev.alloc:
            add(r)
        if ev.kind in ("op", "recompute"):
            run(ev.kind, ev.op, ev.into)
        elif ev.kind == "handoff":
            handoff(ev)
        elif ev.kind == "join":
            h = join_ms(profile, ev.src)
            hand += h
            lanes.handoff(ev.src, h, f"join {ev.src}")
            if h:
                gantt.append((f"join {ev.src}", "handoff", clock, clock + h))
            clock += h
        elif ev.kind == "page_in":
            page(ev.roots[0], "page in")
        elif ev.kind == "page_out":
            page(ev.roots[0], "page out")
        elif ev.kind == "free":
            for r in ev.roots:
                if r in live:
                    total -= live.pop(r)
    own_peaks: dict[str, int] = {}
    if own:
        own_peaks, copies = SEM.own_memory_replay(graph, plan, own)
        h0 = profile.host_accelerator()
        acc_of = {m: min(a for a, x in own.items() if x == m) for m in set(own.values())}
        for r, src, dst, nb, sa, da in copies:
            h = profile.handoff_cost(acc_of.get(src, h0), acc_of.get(dst, h0)).cost_ms(nb)
            hand += h
            if h:
                gantt.append((f"copy {T[r].name} {sa}->{da}", "handoff", clock, clock + h))
            clock += h
            lanes.handoff(acc_of.get(src, h0), h, f"copy {T[r].name}")
    if live:
        raise PlanError(f"internal: tensors still live at the end of the step: {[T[r].name for r in live][:5]}")
    pk = max(range(len(timeline)), key=lambda i: (timeline[i], -i))
    peak_roots = sorted(snapshots[pk], key=lambda r: -sch.root_bytes(graph, r))
    kind, oid = steps[pk]
    ws = costs[oid].workspace_bytes
    outside = costs[oid].extra_bytes - ws
    names = tuple(f"{T[r].name} ({sch.root_bytes(graph, r)} B)" for r in peak_roots if sch.root_bytes(graph, r) > 0)
    if ws:
        names = names + (f"workspace of {graph.ops[oid].name} ({ws} B)",)
    if outside:
        names = names + (f"allocations of {graph.ops[oid].name} outside the arena ({outside} B)",)
    if E:
        names = names + (f"engines of {', '.join(a for a in dict.fromkeys(d.accelerator for d in plan.ops) if profile.engine_bytes_of(a))} "
                         f"outside the arena ({E} B)",)
    names = names + (f"static: parameters/buffers/gradients/optimizer state/input ({S} B)",)
    call_ms = [(oid, costs[oid].latency_ms) for _k, oid in steps]
    over = step_overhead_ms(profile) - rt_dispatch_saving_ms(plan, graph, profile, call_ms, sch.paged) \
        - timed_call_saving_ms(plan, graph, profile, call_ms, sch.paged)
    return SimResult(
        step_ms=comp + rcomp + hand + pagems + over, peak_bytes=timeline[pk], timeline=tuple(timeline),
        steps=tuple(steps), peak_step=pk, peak_tensors=names, static_bytes=S,
        breakdown={"compute_ms": comp, "recompute_ms": rcomp, "handoff_ms": hand, "paging_ms": pagems,
                   "overhead_ms": over, "engine_bytes": E, "makespan_ms": lanes.makespan() + over}
                  | ({"own_memory_peaks": own_peaks} if own else {}),
        gantt=tuple(gantt), arena_peak_bytes=max(arena_tl), lanes=tuple(lanes.spans))
