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

Besides the data edges, an asynchronous engine can still be reading or writing a slot that lowering has given
to a later tensor (arena slots are reused by lifetime). So a host-side call that follows queued calls waits for
the queue only when its bytes (its tensors' root slots and its workspace) intersect the bytes of a queued call
not yet waited for (read-after-write, write-after-read, write-after-write); otherwise it runs while the queue
works (``drain_before``): a host op and an OpenCL op without a dependency overlap. Before such a host call the
queue is flushed, so the device has started the queued kernels. A pass ends with a drain (``finish_all``).
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
    """The run-time hand-off of ``call`` (kernel ``handoff``, attributes ``src``/``dst`` backends)."""
    src, dst = call.attr("src"), call.attr("dst")
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


def call_ranges(program, call) -> list[tuple[int, int]]:
    """The arena byte ranges ``call`` may read or write: its tensors' root slots (a view or in-place output
    stands for its whole root) and its workspace."""
    out = []
    for t in (*call.inputs, *call.outputs):
        if program.has_slot(t):
            s = program.slot(t)
            r = program.slot(s.root) if s.root != t and program.has_slot(s.root) else s
            if r.nbytes:
                out.append((r.offset, r.offset + r.nbytes))
    if call.workspace_bytes:
        out.append((call.workspace_offset, call.workspace_offset + call.workspace_bytes))
    return out


def _intersects(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    return any(x0 < y1 and y0 < x1 for x0, x1 in a for y0, y1 in b)


def host_waits(calls: list, program=None) -> list[str]:
    """Per call, what runs right before it: "finish" (wait for the queued engines: a host-side call, i.e. a host
    engine's kernel, a page call or a zeroing wrapper, whose bytes intersect those of a queued call not yet waited
    for), "flush" (submit the queue and go on: a host-side call after queued ones, independent of them, runs
    while they work) or "". ``program`` None: no byte ranges known, every such host call waits."""
    out, pending, queued_bytes, flushed = [], set(), [], True
    for c in calls:
        queued = c.backend in QUEUED and not c.attr("zero_outputs")
        handoff = c.backend == "host" and c.kernel == "handoff"
        w = ""
        if handoff and c.attr("src") in pending:
            pending.discard(c.attr("src"))            # the hand-off call itself waits for the queue
            queued_bytes = [] if not pending else queued_bytes
            flushed = True
        elif not queued and pending and not handoff:
            if program is None or _intersects(call_ranges(program, c), queued_bytes):
                w, pending, queued_bytes, flushed = "finish", set(), [], True
            elif not flushed:
                w, flushed = "flush", True
        if c.backend in QUEUED:
            pending.add(c.backend)
            if program is not None:
                queued_bytes.extend(call_ranges(program, c))
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
