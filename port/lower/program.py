"""The lowered Program: plain frozen data that an executor (Python today, a Python-free C runtime later) runs.

A Program is an ordered list of kernel ``Call``s and one ``Slot`` per tensor that has storage, each slot an
offset into ONE arena (a single contiguous byte buffer). The arena has two regions:

* ``[0, persistent_bytes)``: parameters, buffers (BN running stats), parameter gradients, optimizer state and
  program constants (the loss-gradient scale). Alive for the whole program and between steps.
* ``[persistent_bytes, arena_bytes)``: scratch: activations, saved tensors, activation gradients and
  per-call workspaces, placed by ``port.lower.arena`` from their lifetimes.

Everything is ints/strings/tuples, so ``Program.to_json()`` / ``Program.from_json()`` round-trip exactly.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from port.errors import PlanError

PROGRAM_FORMAT_VERSION = 2     # 2: a call may carry attribute "overwrite" (its gradients are not zeroed first)
PROGRAM_FORMAT_OWN_MEMORY = 3  # 3: engines with their own memory (fields memories, memory_slots; copy hand-offs):
                               # only such programs carry it, so the others stay readable by readers of 1-2
PROGRAM_FORMATS_READ = (1, 2, 3)  # a version-1 program zeroes every gradient: it means the same here
ALIGN = 64

REGION_PERSISTENT = "persistent"
REGION_SCRATCH = "scratch"

# pseudo tensor ids for program-internal buffers (not graph tensors)
GRAD_SCALE_ID = -1


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives. ``root`` is the tensor id owning the bytes (== tensor for owners); views and
    in-place outputs point at their root's offset."""

    tensor: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    nbytes: int
    region: str
    root: int
    role: str = ""


@dataclass(frozen=True)
class Call:
    """One kernel invocation. ``op`` is the graph op it implements (-1 for none); ``covers`` lists further
    graph ops it also implements (fusion). ``kernel`` names what the backend runs."""

    index: int
    op: int
    name: str
    kernel: str
    backend: str
    variant: str
    phase: str
    outputs: tuple[int, ...]
    inputs: tuple[int, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    workspace_offset: int = 0
    workspace_bytes: int = 0
    covers: tuple[int, ...] = ()

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default


@dataclass(frozen=True)
class Program:
    graph_name: str
    graph_digest: str
    batch_size: int
    arena_bytes: int
    persistent_bytes: int
    slots: tuple[Slot, ...]            # sorted by tensor id (pseudo ids < 0 first)
    calls: tuple[Call, ...]
    input_id: int
    label_id: int
    loss_id: int
    logits_id: int
    zero_ranges: tuple[tuple[int, int], ...] = ()   # (offset, nbytes) zeroed at the start of each step: the
                                       # persistent gradients but those a call with attribute "overwrite" writes
    peak_live_bytes: int = 0           # persistent + max over calls of live scratch bytes (lower bound)
    live_timeline: tuple[int, ...] = ()  # scratch bytes live at each call (aligned sizes, incl. workspace)
    optimizer: str = ""
    phases: tuple[str, ...] = ()       # which graph phases were lowered
    live_until: tuple[tuple[int, int], ...] = ()  # (scratch root, call index): kept live (unread) up to that
                                       # call: recomputed outputs no backward op reads live to the end of
                                       # their recompute group (port.verify.simulate's rule 3)
    version: int = PROGRAM_FORMAT_VERSION
    extra_input_ids: tuple[int, ...] = ()   # further model inputs (an attention mask), written like input_id
    memories: tuple[tuple[str, int], ...] = ()  # (engine backend, bytes): engines with their own memory, each
                                       # with its own arena (port.lower.memories); () = one host arena
    memory_slots: tuple[tuple[str, int, int], ...] = ()  # (memory, root tensor id, offset in that arena)
    _index: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def input_ids(self) -> tuple[int, ...]:
        return (self.input_id,) + tuple(self.extra_input_ids)

    def slot(self, tid: int) -> Slot:
        idx = self._index.get("slots")
        if idx is None:
            idx = {s.tensor: s for s in self.slots}
            self._index["slots"] = idx
        return idx[tid]

    def has_slot(self, tid: int) -> bool:
        try:
            self.slot(tid)
            return True
        except KeyError:
            return False

    def slot_by_name(self, name: str) -> Slot:
        idx = self._index.get("names")
        if idx is None:
            idx = {s.name: s for s in self.slots}
            self._index["names"] = idx
        return idx[name]

    @property
    def scratch_bytes(self) -> int:
        return self.arena_bytes - self.persistent_bytes

    def memory_offset(self, memory: str, root: int) -> int:
        """The offset of root ``root`` in the arena of own memory ``memory`` (KeyError: it has none there)."""
        idx = self._index.get("memory_slots")
        if idx is None:
            idx = {(m, r): o for m, r, o in self.memory_slots}
            self._index["memory_slots"] = idx
        return idx[(memory, root)]

    def summary(self) -> dict[str, int]:
        return {"arena_bytes": self.arena_bytes, "persistent_bytes": self.persistent_bytes,
                "scratch_bytes": self.scratch_bytes, "peak_live_bytes": self.peak_live_bytes,
                "calls": len(self.calls)}

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        d["calls"] = [dict(asdict(c), attrs=[[k, _jsonable(v)] for k, v in c.attrs]) for c in self.calls]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @staticmethod
    def from_dict(d: dict) -> "Program":
        if d.get("version") not in PROGRAM_FORMATS_READ:
            from port.errors import ProgramError
            raise ProgramError(f"program format version {d.get('version')} is not supported "
                               f"(this PORT reads versions {', '.join(map(str, PROGRAM_FORMATS_READ))})")
        slots = tuple(Slot(**dict(s, shape=tuple(s["shape"]))) for s in d["slots"])
        calls = tuple(Call(**dict(c, outputs=tuple(c["outputs"]), inputs=tuple(c["inputs"]),
                                  covers=tuple(c["covers"]),
                                  attrs=tuple((k, _untuple(v)) for k, v in c["attrs"]))) for c in d["calls"])
        rest = {k: v for k, v in d.items() if k not in ("slots", "calls")}
        rest["zero_ranges"] = tuple(tuple(r) for r in rest.get("zero_ranges", ()))
        rest["live_timeline"] = tuple(rest.get("live_timeline", ()))
        rest["phases"] = tuple(rest.get("phases", ()))
        rest["live_until"] = tuple(tuple(r) for r in rest.get("live_until", ()))
        rest["extra_input_ids"] = tuple(rest.get("extra_input_ids", ()))
        rest["memories"] = tuple(tuple(m) for m in rest.get("memories", ()))
        rest["memory_slots"] = tuple(tuple(m) for m in rest.get("memory_slots", ()))
        return Program(slots=slots, calls=calls, **rest)

    @staticmethod
    def from_json(s: str) -> "Program":
        return Program.from_dict(json.loads(s))


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    return v


def _untuple(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_untuple(x) for x in v)
    return v


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


# accelerator id -> backend (plans name accelerators; the device YAML says which backend each has)
ACCELERATOR_BACKENDS = {"cpu-c": "c", "cpu-torch": "torch-cpu", "gpu-torch": "torch-cuda", "cuda": "torch-cuda",
                        "cpu": "c", "opencl": "opencl", "gpu-opencl": "opencl"}
BACKEND_ACCELERATORS = {"c": "cpu-c", "torch-cpu": "cpu-torch", "torch-cuda": "gpu-torch", "opencl": "opencl"}
BACKENDS = ("c", "torch-cpu", "torch-cuda", "opencl")

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


# engines that queue their calls (asynchronous, own queue): a tensor crossing to or from them is handed over by a
# ``handoff`` call (port.exec.handoff); the CPU engines run synchronously on one arena and need none
QUEUED_BACKENDS = ("opencl",)


def needs_handoff_call(src: str, dst: str) -> bool:
    """A tensor produced on backend ``src`` and read on ``dst`` needs a lowered ``handoff`` call."""
    return src != dst and (src in QUEUED_BACKENDS or dst in QUEUED_BACKENDS)
