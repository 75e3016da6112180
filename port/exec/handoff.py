"""Hand-offs at run time: what a lowered ``handoff`` call (port.plan.semantics rule 7, emitted by lowering where
port.lower.lower.needs_handoff_call holds) does in the executor, and the synchronisation an asynchronous engine
needs around the synchronous ones.

Engines and their memory:
* ``c``, ``torch-cpu``: synchronous, on the host arena: a call is complete when it returns.
* ``opencl``: its calls are enqueued on the engine's in-order queue (port.exec.backends.opencl) and run later.
  On unified memory (the only kind the executor runs: PoCL, integrated GPUs) its buffers are the arena's own
  bytes (CL_MEM_USE_HOST_PTR), so one arena serves both engines and a hand-off moves no bytes:
  - opencl -> host engine: wait for the queue (``Engine.finish``: the producing kernel and everything before it);
  - host engine -> opencl: nothing to wait for (the host call returned before the reader is enqueued; the
    in-order queue reads the arena's bytes as they are then).
  An engine with its own memory (a program lowered with ``own_memory``, port.lower.memories) has its own arena
  instead: a hand-off with attribute ``copy`` copies the tensor's bytes between the arenas (``bind_copy``).

Besides the data edges, a host-side call that follows queued calls waits for the queue where its bytes and those
of a queued call not yet waited for form a hazard (``call_bytes``: a call reads its inputs' root slots and writes
its outputs' and its workspace): it writes bytes a queued call reads or writes (write-after-read,
write-after-write) or reads bytes a queued call writes (read-after-write). Two readers of one tensor do not wait
for each other (a backward's weight gradient on the queue and the host's activation gradient both read the
layer's input: ResNet-8's split plan waited there, serialising the queue's work with the host's). Lowering does
not give a queued call's bytes to a later tensor before the host joins that queue (port.plan.semantics rule 8:
a hand-off from it, a page call, the end of the pass), so arena reuse makes no hazard; a page call always waits
for the queue (the simulator's join). Otherwise the host call runs while the queue works (``drain_before``): a
host op and an OpenCL op without a dependency overlap. Before such a host call the queue is flushed, so the device
has started the queued kernels. A pass ends with a drain (``finish_all``).
On PoCL's CPU device the queued kernels compute on the same cores as the C kernels, so the overlap gains
little here; on a phone or integrated GPU the engines are separate silicon.
"""
from __future__ import annotations

from typing import Callable

from port.errors import ProgramError

QUEUED = ("opencl",)


def queue_finish(backend: str) -> Callable[[], None]:
    """The wait for ``backend``'s queue (a no-op for synchronous engines)."""
    if backend == "opencl":
        from port.exec.backends.opencl import engine
        return engine().finish
    return lambda: None


def bind_handoff(call) -> Callable[[], None]:
    """The run-time hand-off of ``call`` (kernel ``handoff``, attributes ``src``/``dst`` backends), or its join
    (kernel ``join``, Plan.joins: the wait for queue ``src``, as a hand-off from it)."""
    src, dst = call.attr("src"), call.attr("dst")
    if call.kernel == "join":
        if src not in QUEUED:
            raise ProgramError(f"call {call.index} ({call.name}): joins {src!r}, which queues no calls")
        return queue_finish(src)
    if src in QUEUED:
        fn = queue_finish(src)
    elif dst in QUEUED:
        if dst == "opencl":
            from port.exec.backends.opencl import engine
            engine().check_unified()

        def fn():
            return None
    else:
        raise ProgramError(f"call {call.index} ({call.name}): a hand-off from {src} to {dst}, engines that share "
                           f"the host arena synchronously, needs no call")
    return fn


def bind_copy(call, ctx) -> Callable[[], None]:
    """A copy hand-off (attribute ``copy``; ``src``/``dst``: memories, ``host`` or an own-memory engine): the
    root's bytes from one arena to the other."""
    src, dst = call.attr("src"), call.attr("dst")
    eng = dst if src == "host" else src
    if eng != "opencl" or "host" not in (src, dst):
        raise ProgramError(f"call {call.index} ({call.name}): a copy from {src} to {dst}; the executor copies "
                           f"between the host arena and the opencl engine's own arena only")
    from port.exec.backends.opencl import engine
    e = engine()
    tid = call.inputs[0]
    root = ctx.root(tid)
    host, dev, off = ctx.view_bytes(root), ctx.own_arena(eng), ctx.own_offset(eng, root)
    to_host = dst == "host"

    def fn():
        e.copy(host, dev, off, to_host)
    return fn


def queue_flush(backend: str) -> Callable[[], None]:
    """Submit ``backend``'s enqueued calls to its device without waiting (a no-op for synchronous engines)."""
    if backend == "opencl":
        from port.exec.backends.opencl import engine
        return engine().flush
    return lambda: None


def _root_ranges(program, tids) -> list[tuple[int, int]]:
    """The arena byte ranges of ``tids``' root slots (a view or in-place output stands for its whole root)."""
    out = []
    for t in tids:
        if program.has_slot(t):
            s = program.slot(t)
            r = program.slot(s.root) if s.root != t and program.has_slot(s.root) else s
            if r.nbytes:
                out.append((r.offset, r.offset + r.nbytes))
    return out


def call_bytes(program, call) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(the arena byte ranges ``call`` may read, those it may write): its inputs' root slots; its outputs' root
    slots (the kernels write only their outputs: a mutated operand, a running statistic or an updated parameter,
    is one) and its workspace."""
    ws = [(call.workspace_offset, call.workspace_offset + call.workspace_bytes)] if call.workspace_bytes else []
    return _root_ranges(program, call.inputs), _root_ranges(program, call.outputs) + ws


def call_ranges(program, call) -> list[tuple[int, int]]:
    """Every arena byte range ``call`` may read or write (``call_bytes``, both)."""
    r, w = call_bytes(program, call)
    return r + w


def _intersects(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    return any(x0 < y1 and y0 < x1 for x0, x1 in a for y0, y1 in b)


def hazard(reads, writes, queued_reads, queued_writes) -> bool:
    """Whether a host-side call reading ``reads`` and writing ``writes`` must wait for queued calls that read
    ``queued_reads`` and write ``queued_writes``: read-after-write, write-after-read or write-after-write (two
    reads share bytes freely)."""
    return (_intersects(writes, queued_reads) or _intersects(writes, queued_writes)
            or _intersects(reads, queued_writes))


def host_waits(calls: list, program=None) -> list[str]:
    """Per call, what runs right before it: "finish" (wait for the queued engines: a page call, or a host-side
    call, i.e. a host engine's kernel or a zeroing wrapper, whose bytes form a ``hazard`` with those of a queued
    call not yet waited for; lowering holds a queued call's bytes until the host joins its queue,
    port.plan.semantics rule 8, so a hazard is an in-place write of bytes a queued call used, or a stand-in
    program's), "flush" (submit the queue and go on: a host-side call after queued ones, independent of
    them, runs while they work) or "". ``program`` None: no byte ranges known, every such host call waits."""
    out, pending, q_reads, q_writes, flushed = [], set(), [], [], True
    for c in calls:
        queued = c.backend in QUEUED and not c.attr("zero_outputs")
        handoff = c.backend == "host" and c.kernel in ("handoff", "join")
        w = ""
        if handoff and c.attr("src") in pending:
            pending.discard(c.attr("src"))            # the hand-off call itself waits for the queue
            if not pending:
                q_reads, q_writes = [], []
            flushed = True
        elif not queued and pending and not handoff:
            page = c.backend == "host" and c.kernel in ("page_out", "page_in")
            if program is None or page or hazard(*call_bytes(program, c), q_reads, q_writes):
                w, pending, q_reads, q_writes, flushed = "finish", set(), [], [], True
            elif not flushed:
                w, flushed = "flush", True
        if c.backend in QUEUED:
            pending.add(c.backend)
            if program is not None:
                r, wr = call_bytes(program, c)
                q_reads, q_writes = q_reads + r, q_writes + wr
            flushed = False
        out.append(w)
    return out


def drain_before(calls: list, fns: list, program=None) -> list:
    """``fns`` (the bound calls, in order) with the waits and flushes of ``host_waits`` before them; the
    engines a wait drains are the queued ones used so far."""
    used = sorted({c.backend for c in calls} & set(QUEUED))
    finish = [queue_finish(b) for b in used]
    flush = [queue_flush(b) for b in used]
    return [_after(finish, f) if w == "finish" else _after(flush, f) if w == "flush" else f
            for w, f in zip(host_waits(calls, program), fns)]


def _after(waits, f):
    def run():
        for w in waits:
            w()
        f()
    return run


def finish_all(calls: list) -> Callable[[], None]:
    """Drain every queued engine ``calls`` use (the end of a pass: the caller reads the loss, the trainer the
    weights)."""
    waits = [queue_finish(b) for b in sorted({c.backend for c in calls} & set(QUEUED))]

    def run():
        for w in waits:
            w()
    return run
