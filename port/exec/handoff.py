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

Besides the data edges, an asynchronous engine can still be reading a slot that lowering has given to a later
tensor (arena slots are reused by lifetime): so before any host-side call that follows queued calls, and at the
end of a pass, the executor drains the queue (``drain_before``). That keeps the one-arena lifetime plan valid
without per-slot events; the cost is that an OpenCL call and a host call never overlap (issue 56 section 3's
overlap is not done).
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


def drain_before(calls: list, fns: list) -> list:
    """``fns`` (the bound calls, in order) with the queued engines drained before every call that runs on the
    host side after queued calls (a host engine's kernel, a page call, a zeroing wrapper), so no slot is reused
    while a queued kernel may still read it."""
    out, pending = [], set()
    for c, f in zip(calls, fns):
        queued = c.backend in QUEUED and not c.attr("zero_outputs")
        if not queued and pending and not (c.backend == "host" and c.kernel == "handoff"):
            waits = [queue_finish(b) for b in sorted(pending)]
            f = _after(waits, f)
            pending = set()
        elif c.backend == "host" and c.kernel == "handoff" and c.attr("src") in pending:
            pending.discard(c.attr("src"))
        if c.backend in QUEUED:
            pending.add(c.backend)
        out.append(f)
    return out


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
