"""Profile types: the measured or modeled cost of every (op signature, accelerator, variant)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Sequence

# =============================================================================================
# profile: measured or modeled cost of every (op signature, accelerator, variant)
# =============================================================================================
PROFILE_FORMAT_VERSION = 2   # 2: entries timed through the op registry (what the executor runs)
# the host's join of a queued engine (Plan.joins) once its queue has drained, where no figure is measured (a
# modeled engine, a profile written before joins were): PoCL's finish() on a drained queue measured ~1 us
# (2026-11-29); a hand-off's latency also holds the wait for a busy queue, which the simulator's lanes model
MODELED_JOIN_MS = 0.002


@dataclass(frozen=True)
class OpCost:
    """Cost of one op signature on one accelerator with one implementation variant."""

    signature: str            # Graph.signature(op)
    accelerator: str          # accelerator id from the device description
    variant: str              # see port.plan.variants
    latency_ms: float         # median
    spread_ms: float = 0.0    # (p75 - p25) of the timing blocks; 0 for modeled entries
    workspace_bytes: int = 0  # scratch the kernel needs beyond its inputs and outputs
    peak_delta_bytes: int = 0 # measured process/allocator peak growth while running it (0 if unknown)
    measured: bool = False    # False: modeled (roofline)
    samples: int = 0
    # a queued engine's call (port.lower.program.QUEUED_BACKENDS): the host thread's own time to issue it (bind
    # its arguments, enqueue its kernels), median of single calls on an idle queue (port.cost.timing.time_issue);
    # the simulator's and the ILP's makespan put it on the host lane, ``latency_ms`` on the queue's. 0: a
    # synchronous engine, a modeled entry, a profile written before it was measured
    issue_ms: float = 0.0

    @property
    def arena_workspace_bytes(self) -> int:
        """The bytes its workspace takes in the arena: rounded up to the arena's 64-byte alignment, as lowering
        places it (port.plan.semantics: every memory figure of a plan counts stored bytes)."""
        from port.lower.program import align
        return align(int(self.workspace_bytes)) if self.workspace_bytes > 0 else 0

    @property
    def extra_bytes(self) -> int:
        """Memory the op needs beyond its live inputs and outputs while it runs: its arena workspace (stored
        bytes) plus what it allocates outside the arena (``peak_delta_bytes``: a torch kernel's temporaries, for
        example). The solver and the simulator budget both; lowering sizes the arena with the workspace alone."""
        return self.arena_workspace_bytes + max(0, int(self.peak_delta_bytes))


@dataclass(frozen=True)
class HandoffCost:
    """Cost of handing a tensor from one accelerator to another: latency_ms + bytes / bytes_per_ms."""

    src: str
    dst: str
    latency_ms: float
    bytes_per_ms: float       # float('inf') for zero-copy
    measured: bool = False

    def cost_ms(self, nbytes: int) -> float:
        if self.bytes_per_ms == float("inf"):
            return self.latency_ms
        return self.latency_ms + nbytes / self.bytes_per_ms


# the storage record's key that says whether a plan may page optimizer state there (absent: it may)
STATE_PAGES_KEY = "state_pages"


@dataclass(frozen=True)
class Profile:
    """Costs for one device. ``entries`` sorted by (signature, accelerator, variant)."""

    device: str
    accelerators: tuple[str, ...]
    entries: tuple[OpCost, ...]
    handoff: tuple[HandoffCost, ...] = ()
    threads: int = 0
    host: tuple[tuple[str, str], ...] = ()       # cpu model, cores, library versions, date
    memory_bytes: int = 0                         # device memory available to training
    accelerator_caps: tuple[tuple[str, int], ...] = ()  # (accelerator id, memory cap bytes)
    storage: tuple[tuple[str, float], ...] = ()   # (("bandwidth_gbps", x), ("latency_ms", y)) or ()
    # (a (STATE_PAGES_KEY, 0.0) pair: the engine that runs the plan keeps no optimizer state in storage between
    # steps, so no plan may page it: port-rt, see port.pipeline.compile.c_only_profile)
    # (accelerator id, bytes): what an execution engine keeps resident once a plan runs any op on it (code
    # pages it maps, caches it fills, heap it retains), beyond the arena and the ops' own temporaries;
    # measured by port.cost.footprint, paid once per accelerator a plan uses (port.plan.semantics.engine_bytes)
    engine_bytes: tuple[tuple[str, int], ...] = ()
    # accelerator ids whose engine has its own (discrete) memory (a device YAML's ``memory: own``): the one place
    # that says so for the solver (own-memory copies and capacity), the simulator and lowering (its own arena);
    # its size is the accelerator's ``accelerator_caps`` entry
    own_memory: tuple[str, ...] = ()
    # (accelerator, accelerator) pairs: the first engine computes on the second's cores (a device YAML's
    # ``shares_compute_with``): the simulator's and the ILP's makespan do not overlap it (port.verify.simulate)
    shared_compute: tuple[tuple[str, str], ...] = ()
    # (queued accelerator id, ms): the host's join of that engine's queue once it has drained (Plan.joins: its
    # finish(), median of many; port.cost.handoff.measure_joins) or MODELED_JOIN_MS; read by :meth:`join_ms_of`
    join_ms: tuple[tuple[str, float], ...] = ()
    _index: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def lookup(self, signature: str, accelerator: str, variant: str) -> OpCost | None:
        idx = self._index.get("by_key")
        if idx is None:
            idx = {(e.signature, e.accelerator, e.variant): e for e in self.entries}
            self._index["by_key"] = idx
        return idx.get((signature, accelerator, variant))

    def options(self, signature: str) -> tuple[OpCost, ...]:
        """Every (accelerator, variant) entry profiled for this signature."""
        idx = self._index.get("by_sig")
        if idx is None:
            acc: dict[str, list[OpCost]] = {}
            for e in self.entries:
                acc.setdefault(e.signature, []).append(e)
            idx = {k: tuple(v) for k, v in acc.items()}
            self._index["by_sig"] = idx
        return idx.get(signature, ())

    def only(self, accelerators: Sequence[str]) -> "Profile":
        """This profile restricted to ``accelerators`` (their entries, hand-offs between them, caps, footprints)."""
        keep = tuple(a for a in self.accelerators if a in set(accelerators))
        ks = set(keep)
        return replace(self, accelerators=keep, entries=tuple(e for e in self.entries if e.accelerator in ks),
                       handoff=tuple(h for h in self.handoff if h.src in ks and h.dst in ks),
                       accelerator_caps=tuple(c for c in self.accelerator_caps if c[0] in ks),
                       engine_bytes=tuple(c for c in self.engine_bytes if c[0] in ks),
                       own_memory=tuple(a for a in self.own_memory if a in ks),
                       shared_compute=tuple(p for p in self.shared_compute if p[0] in ks and p[1] in ks),
                       join_ms=tuple(j for j in self.join_ms if j[0] in ks), _index={})

    def own_map(self) -> dict[str, str]:
        """accelerator -> its memory's name for the engines with their own memory (simulate's ``own``)."""
        return {a: a for a in self.own_memory}

    def host_accelerator(self) -> str:
        """The accelerator that prices the host side of an own-memory copy: the profile's first accelerator on host
        memory (a copy moves bytes between two memories, whichever host engine reads or wrote them)."""
        return next((a for a in self.accelerators if a not in self.own_memory), self.accelerators[0])

    def engine_bytes_of(self, accelerator: str) -> int:
        """The resident footprint of ``accelerator``'s engine (0 when none is recorded)."""
        return dict(self.engine_bytes).get(accelerator, 0)

    def join_ms_of(self, accelerator: str) -> float:
        """The host's join of ``accelerator``'s drained queue (Plan.joins), ms: the profile's figure, else
        MODELED_JOIN_MS (a profile written before joins were recorded)."""
        return dict(self.join_ms).get(accelerator, MODELED_JOIN_MS)

    def handoff_cost(self, src: str, dst: str) -> HandoffCost:
        if src == dst:
            return HandoffCost(src, dst, 0.0, float("inf"))
        for h in self.handoff:
            if h.src == src and h.dst == dst:
                return h
        raise KeyError(f"profile for {self.device!r} has no hand-off cost {src} -> {dst}")

    def digest(self) -> str:
        blob = json.dumps([self.device, list(self.accelerators),
                           [[e.signature, e.accelerator, e.variant, e.latency_ms, e.workspace_bytes]
                            + ([e.issue_ms] if e.issue_ms else []) for e in self.entries],
                           [[h.src, h.dst, h.latency_ms, str(h.bytes_per_ms)] for h in self.handoff]]
                          + ([[list(x) for x in self.engine_bytes]] if self.engine_bytes else [])
                          + ([["own_memory", *self.own_memory]] if self.own_memory else [])
                          + ([["shared_compute", *map(list, self.shared_compute)]] if self.shared_compute else [])
                          + ([["join_ms", *map(list, self.join_ms)]] if self.join_ms else []),
                          separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()


