"""Discrete memory (issue 56): engines with their own memory, one arena per memory, copies at hand-offs.

A device YAML marks an engine ``memory: own`` (port.config.AcceleratorConfig) when its buffers are not the
host's bytes (a discrete GPU; the OpenCL engine without CL_MEM_USE_HOST_PTR). Lowering then gives each such
memory its own arena (``Program.memories``: (memory, bytes); ``Program.memory_slots``: (memory, root, offset)),
placed by port.lower.arena.assign_offsets from the lives the calls give it (``own_lives``), and the host arena
keeps every tensor as before (it is the master copy between passes).

The one rule, replayed by lowering (which inserts the copies) and by the program checker (which requires them),
in the executor's run order (the main calls, then the late updates; each a *segment*):
* at the start of a segment every tensor that exists before it (the persistent region, the step's inputs and
  labels, the program's constants) has its current bytes in host memory only; a scratch root has none until a
  call writes it;
* a call on memory M (a host engine or a host call: ``host``; an own-memory engine: its backend name) needs
  the current bytes of every tensor it reads or writes in M (a written tensor that already has bytes may be
  accumulated into or updated in place); where they are not, a ``handoff`` call with attribute ``copy``
  (``src``/``dst``: memories) copies the root's bytes first (from the host copy when there is one);
* a call's outputs then have their current bytes in M only;
* at the end of a segment every persistent root (and after the main calls the loss and the logits) has its
  current bytes in the host arena again (copies at the end of the segment).
"""
from __future__ import annotations

from typing import Callable, Iterable

from port.lower.program import QUEUED_BACKENDS

HOST = "host"


def memory_of(backend: str, own: Iterable[str]) -> str:
    """The memory a call on ``backend`` reads and writes: its own memory or the host's."""
    return backend if backend in own else HOST


def check_own(own: Iterable[str]) -> tuple[str, ...]:
    """``own`` as a sorted tuple of backends that may have their own memory (the queued engines)."""
    from port.errors import PlanError
    own = tuple(sorted(set(own)))
    bad = [b for b in own if b not in QUEUED_BACKENDS]
    if bad:
        raise PlanError(f"backends {bad} cannot have their own memory: only the queued engines "
                        f"{QUEUED_BACKENDS} run on a device arena with copying hand-offs")
    return own


class Residency:
    """Which memories hold the current bytes of each root (the rule above), for one segment."""

    def __init__(self, preexisting: Callable[[int], bool]):
        self.pre = preexisting
        self.valid: dict[int, frozenset] = {}

    def where(self, r: int) -> frozenset:
        v = self.valid.get(r)
        if v is None:
            return frozenset((HOST,)) if self.pre(r) else frozenset()
        return v

    def missing(self, mem: str, roots: Iterable[int]) -> list[tuple[int, str]]:
        """(root, memory to copy from) for each of ``roots`` a call on ``mem`` needs copied there first."""
        out = []
        for r in dict.fromkeys(roots):
            s = self.where(r)
            if s and mem not in s:
                out.append((r, HOST if HOST in s else min(s)))
        return out

    def copied(self, r: int, dst: str) -> None:
        self.valid[r] = self.where(r) | {dst}

    def wrote(self, mem: str, roots: Iterable[int]) -> None:
        for r in roots:
            self.valid[r] = frozenset((mem,))

    def stranded(self, keep: Callable[[int], bool]) -> list[tuple[int, str]]:
        """(root, memory) for each root ``keep`` names whose current bytes are not in host memory."""
        return [(r, min(s)) for r, s in sorted(self.valid.items()) if HOST not in s and keep(r)]


def is_late_update(phase: str, attrs: dict) -> bool:
    """A call the executor runs in the update segment (port.exec.executor: late updates)."""
    return phase == "update" and not attrs.get("early")


def own_lives(calls, root_of: Callable[[int], int], memories: Iterable[str]) -> dict[str, dict[int, list[int]]]:
    """memory -> root -> [first, last] call index at which the root's bytes are in use in that memory: a call on
    the memory's engine reading or writing it, or a copy hand-off to or from it."""
    mems = set(memories)
    lives: dict[str, dict[int, list[int]]] = {m: {} for m in mems}

    def touch(m, r, i):
        lv = lives[m].setdefault(r, [i, i])
        lv[1] = i

    for i, c in enumerate(calls):
        if c.backend == HOST and c.kernel == "handoff" and c.attr("copy"):
            r = root_of(c.inputs[0])
            for m in (c.attr("src"), c.attr("dst")):
                if m in mems:
                    touch(m, r, i)
        elif c.backend in mems:
            for t in dict.fromkeys(c.inputs + c.outputs):
                touch(c.backend, root_of(t), i)
    return lives


def own_peaks(program) -> dict[str, int]:
    """Each own memory's live bound: the most bytes (64-byte aligned) its roots hold there at one call, which its
    arena (``Program.memories``) reaches up to the packing's fragmentation."""
    from port.lower.program import align
    from port.plan.semantics import interval_peak
    lives = own_lives(program.calls, lambda t: program.slot(t).root, [m for m, _ in program.memories])
    return {m: interval_peak(((align(program.slot(r).nbytes), a, b) for r, (a, b) in lv.items()),
                             len(program.calls) - 1)
            for m, lv in lives.items()}


def check_caps(program, caps: dict) -> None:
    """Each own memory's arena within its engine's ``memory_cap`` (``caps``: backend -> bytes or None), else
    InfeasibleBudgetError naming the memory, both sizes and the fix."""
    from port.errors import InfeasibleBudgetError
    for m, nbytes in program.memories:
        cap = caps.get(m)
        if cap is not None and nbytes > cap:
            raise InfeasibleBudgetError(
                f"the {m} engine's own memory needs an arena of {nbytes} B for this plan, above its memory_cap of "
                f"{cap} B (device YAML): raise memory_cap if the engine has that memory, or solve a plan that puts "
                f"fewer ops on {m}", cap, nbytes)
