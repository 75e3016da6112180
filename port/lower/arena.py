"""Arena memory planning and program checking.

Accounting rules (the simulator/ILP should match these to predict ``Program.arena_bytes``):

* Time is the index ``t`` of a kernel call in the Program (ops that produce no call -- views, the
  pass-through gradient of add, the batch-norm/activation ops covered by a fused conv -- take no time
  step and own no bytes).
* A *storage root* owns bytes; views (``alias_of``) and in-place outputs map to their input's root.
  A root is live from the first call that writes it to the last call that reads or writes it or any tensor
  mapped onto it, both inclusive. The step inputs (input and labels, written before call 0) are live for
  the whole program, as the simulator's static memory; the loss (and, in inference programs, the logits)
  stay live to the last call.
* Recomputed and paged tensors get fresh *version* ids (>= the graph's tensor count) with their own slots:
  the original version lives from its producer to its last forward reader, the new one from the recompute
  (or page-in) call to its last backward reader.
* Two roots may share bytes only if their live intervals are disjoint. An output therefore never shares
  bytes with an input that dies at the same call (the kernels forbid aliasing unless declared in-place).
* Each call's workspace is a short-lived block live only at that call.
* Sizes are rounded up to 64 bytes; offsets are 64-byte aligned.
* Persistent region (parameters, buffers, parameter gradients, optimizer state, constants) is placed first,
  sequentially, and is live for the whole program. Parameter gradients are one contiguous range, zeroed at
  the start of each step (weight-gradient kernels accumulate), but for those a call with attribute
  ``overwrite`` writes (a conv weight gradient's only writer: port.exec.registry.overwrites_gradients).
* ``peak_live_bytes`` = persistent + max over t of (aligned live scratch bytes + workspace at t): the
  lower bound any placement can reach; ``arena_bytes`` = persistent + the placement's high-water mark
  (>= peak_live_bytes by fragmentation).
"""
from __future__ import annotations

import bisect
import heapq
from typing import Hashable, Iterable, Sequence

import numpy as np

from port.errors import ProgramError
from port.lower.program import ALIGN, REGION_PERSISTENT, REGION_SCRATCH, Program, align

STRATEGIES = ("best_fit", "lowest", "first_fit", "area", "lowest_block", "auto")
# "auto": perturbed size orders tried after the fixed strategies: about AUTO_TRIES_WORK / n^2 of them (each
# placement costs ~n^2), clamped to [AUTO_TRIES_MIN, AUTO_TRIES_MAX]; they stop within AUTO_TOLERANCE of the lower
# bound (which no placement may reach)
AUTO_TRIES_MIN, AUTO_TRIES_MAX, AUTO_TRIES_WORK = 24, 400, 4_000_000
AUTO_TOLERANCE = 1e-4


def assign_offsets(items: Sequence[tuple[Hashable, int, int, int]], strategy: str = "best_fit",
                   alignment: int = ALIGN) -> tuple[dict[Hashable, int], int]:
    """Place blocks ``(key, nbytes, first, last)`` (inclusive live interval in call indices) so that no two
    blocks with overlapping intervals overlap in bytes. Returns (offsets, high-water mark).

    best_fit: blocks in decreasing size (ties: earlier first), each into the smallest gap among the
    already-placed blocks whose intervals overlap it (greedy-by-size, as TFLite's planner).
    lowest: the same order, each at the lowest offset that fits.
    first_fit: blocks in order of first use, each at the lowest offset that fits.
    area: blocks in decreasing size x lifetime, smallest gap.
    lowest_block: no fixed order: of the blocks left, the one whose lowest fitting offset is lowest goes next
    (ties: the larger, then the longer-lived), at that offset; the arena fills bottom-up, so the blocks live at
    the peak stack without gaps where the orders above leave some (resnet8 batch 8 solved at 100%: 2.1% above
    the bound with every order, at the bound with this).
    auto: the four orders, then (while above the lower bound max_t live bytes) lowest_block and its variants
    with ties by size x lifetime, by lifetime, by first use (bert_tiny batch 2 at its smallest budget: only the
    last two reach the bound, gpt_tiny at 50%: only the first two come within 0.1% of it), then (while above it
    by more than AUTO_TOLERANCE) deterministic seeded perturbations of the size order (``AUTO_TRIES_*``); the
    smallest high-water mark wins (``lower``'s default).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown memory strategy {strategy!r}; choose one of {STRATEGIES}")
    n = len(items)
    if n == 0:
        return {}, 0
    sizes = np.array([align(max(int(it[1]), 1), alignment) for it in items], dtype=np.int64)
    firsts = np.array([it[2] for it in items], dtype=np.int64)
    lasts = np.array([it[3] for it in items], dtype=np.int64)
    S, F, L = sizes.tolist(), firsts.tolist(), lasts.tolist()

    def order_of(st: str) -> list[int]:
        if st in ("best_fit", "lowest"):
            return sorted(range(n), key=lambda i: (-S[i], F[i], i))
        if st == "area":
            return sorted(range(n), key=lambda i: (-(S[i] * (L[i] - F[i] + 1)), F[i], i))
        return sorted(range(n), key=lambda i: (F[i], -S[i], i))

    by_size = [(-S[i], -(L[i] - F[i]), i) for i in range(n)]
    if strategy == "lowest_block":
        offs, high = _place_lowest_block(by_size, S, F, L)
        return {items[i][0]: o for i, o in offs.items()}, high
    if strategy != "auto":
        offs, high = _place(order_of(strategy), S, F, L, tightest=strategy in ("best_fit", "area"))
        return {items[i][0]: o for i, o in offs.items()}, high
    tl = np.zeros(int(lasts.max()) + 2, dtype=np.int64)
    np.add.at(tl, firsts, sizes)
    np.add.at(tl, lasts + 1, -sizes)
    bound = int(np.cumsum(tl).max())
    best = None
    for st in ("lowest", "best_fit", "area", "first_fit"):
        r = _place(order_of(st), S, F, L, tightest=st in ("best_fit", "area"))
        if best is None or r[1] < best[1]:
            best = r
    for ties in (lambda i: (-S[i], -(L[i] - F[i]), i), lambda i: (-(S[i] * (L[i] - F[i] + 1)), i),
                 lambda i: (F[i] - L[i], -S[i], i), lambda i: (F[i], -S[i], i)):
        if best[1] <= bound:
            break
        r = _place_lowest_block([ties(i) for i in range(n)], S, F, L)
        if r[1] < best[1]:
            best = r
    rng = np.random.default_rng(0)
    # seeded perturbations of the size order until the bound is reached (a fixed count, not a clock: the same
    # items always give the same placement); more of them for small programs, where each is cheap and a few
    # percent of fragmentation can put the arena over a budget the plan's peak fits (digits_cnn at 75%: the
    # four orders above leave 5.9%, ~240 perturbations reach the bound)
    tries = max(AUTO_TRIES_MIN, min(AUTO_TRIES_MAX, AUTO_TRIES_WORK // max(n * n, 1)))
    for _ in range(tries):
        if best[1] <= bound * (1 + AUTO_TOLERANCE):
            break
        jit = rng.uniform(0.5, 1.5, n)
        order = sorted(range(n), key=lambda i: (-S[i] * jit[i], F[i], i))
        for tight in (False, True):
            r = _place(order, S, F, L, tightest=tight)
            if r[1] < best[1]:
                best = r
    return {items[i][0]: o for i, o in best[0].items()}, best[1]


def _place_lowest_block(ties, sizes, firsts, lasts) -> tuple[dict[int, int], int]:
    """Place the block whose lowest fitting offset is lowest (``ties[i]``: smaller first), at that offset, until
    none is left. Each block's candidate offset only rises, and only when a newly placed block overlaps it in
    time and bytes: those are recomputed, and a heap with stale entries skipped picks the next."""
    n = len(sizes)
    S, F, L = np.asarray(sizes, dtype=np.int64), np.asarray(firsts, dtype=np.int64), np.asarray(lasts, dtype=np.int64)
    placed: list[tuple[int, int, int, int]] = []    # (offset, end, first, last), sorted
    cand = np.zeros(n, dtype=np.int64)
    left = np.ones(n, dtype=bool)
    heap = [(0, ties[i], i) for i in range(n)]
    heapq.heapify(heap)
    offsets: dict[int, int] = {}
    high = 0
    while heap:
        c, _t, i = heapq.heappop(heap)
        if not left[i] or c != cand[i]:
            continue
        left[i] = False
        e, f, l = c + int(S[i]), int(F[i]), int(L[i])
        offsets[i] = int(c)
        high = max(high, e)
        bisect.insort(placed, (c, e, f, l))
        for j in np.flatnonzero(left & (F <= l) & (L >= f) & (cand < e) & (cand + S > c)).tolist():
            cur, s, fj, lj = 0, int(S[j]), int(F[j]), int(L[j])
            for o, oe, pf, pl in placed:
                if pf > lj or pl < fj:
                    continue
                if o - cur >= s:
                    break
                if oe > cur:
                    cur = oe
            cand[j] = cur
            heapq.heappush(heap, (cur, ties[j], j))
    return offsets, high


def _place(order, sizes, firsts, lasts, tightest: bool) -> tuple[dict[int, int], int]:
    """Place blocks in ``order``: each into the first (``tightest``: the smallest) gap between the placed blocks
    whose intervals overlap its own, else above them. The placed blocks are kept sorted by offset, so a gap
    search is one pass (plain Python: ~10x faster than numpy masks at a few hundred blocks)."""
    placed: list[tuple[int, int, int, int]] = []    # (offset, end, first, last), sorted
    offsets: dict[int, int] = {}
    high = 0
    for i in order:
        size, f, l = sizes[i], firsts[i], lasts[i]
        cur, best, best_gap = 0, None, None
        for o, e, pf, pl in placed:
            if pf > l or pl < f:
                continue
            gap = o - cur
            if gap >= size:
                if not tightest:
                    best = cur
                    break
                if best_gap is None or gap < best_gap:
                    best, best_gap = cur, gap
            if e > cur:
                cur = e
        if best is None:
            best = cur
        offsets[i] = best
        bisect.insort(placed, (best, best + size, f, l))
        high = max(high, best + size)
    return offsets, high


# ---------------------------------------------------------------------------------------------
# liveness of a (possibly hand-edited) program
# ---------------------------------------------------------------------------------------------
def liveness(program: Program) -> dict[int, tuple[int, int]]:
    """Scratch root -> (first, last) call index, derived from the calls themselves."""
    n = len(program.calls)
    live: dict[int, list[int]] = {}
    slot_of = {s.tensor: s for s in program.slots}
    pre = {*program.input_ids, program.label_id}
    for c in program.calls:
        for t in c.inputs + c.outputs:
            s = slot_of.get(t)
            if s is None or s.region != REGION_SCRATCH:
                continue
            r = s.root
            if r in live:
                live[r][1] = max(live[r][1], c.index)
            else:
                live[r] = [c.index, c.index]
    for t in pre:   # written before call 0, kept for the whole step (static in the simulator's accounting)
        s = slot_of.get(t)
        if s is not None and s.region == REGION_SCRATCH:
            live[s.root] = [0, max(n - 1, 0)]
    for r, i in program.live_until:
        if r in live:
            live[r][1] = max(live[r][1], min(int(i), n - 1))
    keep = [program.loss_id]
    if program.phases == ("forward",):
        keep.append(program.logits_id)
    for t in keep:
        s = slot_of.get(t)
        if s is not None and s.root in live:
            live[s.root][1] = n - 1
    return {r: (a, b) for r, (a, b) in live.items()}


def check_program(program: Program) -> None:
    """Refuse a corrupt or hand-edited program with ProgramError before anything runs it.

    Checks: every slot and workspace inside the arena (persistent slots inside the persistent region,
    scratch ones after it), 64-byte aligned roots, sizes matching shapes, aliases consistent with their
    root, every tensor a call touches has a slot, every read after its write, and no two simultaneously
    live roots (or a call's workspace and a live root) overlapping in bytes. Every C-backend call, encoded as
    port-rt and the executor run it, must pass the C call rule (port_rt_call_check, kernels/runtime/rt_check.c:
    the one the bundle loader applies to every call of a bundle).
    """
    from port.ir.types import DTYPE_BYTES, numel

    _check_fields(program)
    A, P = program.arena_bytes, program.persistent_bytes
    if P < 0 or A < P:
        raise ProgramError(f"program {program.graph_name!r}: persistent region {P} B does not fit the arena {A} B")
    slot_of = {}
    for s in program.slots:
        if s.tensor in slot_of:
            raise ProgramError(f"tensor {s.name!r} (id {s.tensor}) has two slots")
        slot_of[s.tensor] = s
    for s in program.slots:
        if s.dtype not in DTYPE_BYTES:
            raise ProgramError(f"tensor {s.name!r}: unknown dtype {s.dtype!r}")
        want = numel(s.shape) * DTYPE_BYTES[s.dtype]
        if s.nbytes != want:
            raise ProgramError(f"tensor {s.name!r}: nbytes {s.nbytes} does not match shape {list(s.shape)} "
                               f"{s.dtype} ({want} B)")
        if s.offset < 0 or s.offset + s.nbytes > A:
            raise ProgramError(f"tensor {s.name!r}: bytes [{s.offset}, {s.offset + s.nbytes}) lie outside the "
                               f"arena of {A} B")
        lo, hi = (0, P) if s.region == REGION_PERSISTENT else (P, A)
        if s.region not in (REGION_PERSISTENT, REGION_SCRATCH):
            raise ProgramError(f"tensor {s.name!r}: unknown region {s.region!r}")
        if s.offset < lo or s.offset + s.nbytes > hi:
            raise ProgramError(f"tensor {s.name!r}: {s.region} bytes [{s.offset}, {s.offset + s.nbytes}) outside "
                               f"the {s.region} region [{lo}, {hi})")
        root = slot_of.get(s.root)
        if root is None:
            raise ProgramError(f"tensor {s.name!r}: its storage root id {s.root} has no slot")
        if root.root != root.tensor:
            raise ProgramError(f"tensor {s.name!r}: root {root.name!r} is itself a view")
        if s.root != s.tensor:      # a view or in-place output: inside its root's bytes (a range view: at an offset)
            if not root.offset <= s.offset <= s.offset + s.nbytes <= root.offset + root.nbytes \
                    or s.region != root.region:
                raise ProgramError(f"tensor {s.name!r} aliases {root.name!r} but its offset {s.offset} / size "
                                   f"{s.nbytes} / region fall outside the root's ({root.offset}, {root.nbytes})")
        elif s.offset % ALIGN:
            raise ProgramError(f"tensor {s.name!r}: offset {s.offset} is not {ALIGN}-byte aligned")
    _check_ids_and_zero_ranges(program, slot_of)

    n = len(program.calls)
    written = {s.root for s in program.slots if s.region == REGION_PERSISTENT}
    written |= {slot_of[t].root for t in program.input_ids + (program.label_id,) if t in slot_of}
    pages: dict = {}
    # in-place outputs are new tensor ids on their input's bytes: a tensor some call writes may be read only
    # after that call (views, written by no call, follow their root). Reading an input whose bytes a later
    # in-place call overwrote is allowed: relu6's in-place backward reads the output through x's id.
    produced = {t for c in program.calls if isinstance(c.outputs, tuple) for t in c.outputs}
    written_ids = {s.tensor for s in program.slots if s.region == REGION_PERSISTENT}
    written_ids |= {*program.input_ids, program.label_id}
    for i, c in enumerate(program.calls):
        if c.index != i:
            raise ProgramError(f"call {c.name!r} has index {c.index} at position {i}")
        for t in c.inputs + c.outputs:
            if t not in slot_of:
                raise ProgramError(f"call {i} ({c.name}): tensor id {t} has no slot")
        for t in c.inputs:
            r = slot_of[t].root
            if r not in written or (t in produced and t not in written_ids):
                raise ProgramError(f"call {i} ({c.name}): reads tensor {slot_of[t].name!r} (offset "
                                   f"{slot_of[t].offset}) before any call writes it")
        _check_call(program, c, slot_of, pages)
        for t in c.outputs:
            written.add(slot_of[t].root)
            written_ids.add(t)
        if c.workspace_bytes < 0 or (c.workspace_bytes and (c.workspace_offset < P or
                                                           c.workspace_offset + c.workspace_bytes > A)):
            raise ProgramError(f"call {i} ({c.name}): workspace [{c.workspace_offset}, "
                               f"{c.workspace_offset + c.workspace_bytes}) outside the scratch region [{P}, {A})")
        if c.workspace_bytes and c.workspace_offset % ALIGN:
            raise ProgramError(f"call {i} ({c.name}): workspace offset {c.workspace_offset} is not {ALIGN}-byte "
                               "aligned (the kernels read floats from it)")
    for k, v in pages.items():      # a paged optimizer state is paged out again each step, as it was paged in
        if isinstance(k, tuple) and pages.get(k[1]) != v:
            raise ProgramError(f"the optimizer state paged in under key {k[1]} ({list(v[0])} {v[1]}) is not paged "
                               f"out again in the step (saved: {pages.get(k[1])})")

    _check_handoffs(program, slot_of)
    _check_memories(program, slot_of)
    for r, i in program.live_until:
        s = slot_of.get(r)
        if s is None or s.root != r or s.region != REGION_SCRATCH or not 0 <= i < max(n, 1):
            raise ProgramError(f"live_until entry ({r}, {i}): expected a scratch root tensor id and a call index "
                               f"in [0, {n})")

    # persistent roots are all live for the whole program (and between steps): none may share bytes
    pers = sorted((s.offset, s.offset + s.nbytes, s.name) for s in program.slots
                  if s.region == REGION_PERSISTENT and s.root == s.tensor and s.nbytes)
    for (o1, e1, n1), (o2, e2, n2) in zip(pers, pers[1:]):
        if o2 < e1:
            raise ProgramError(f"persistent tensors {n1!r} [{o1}, {e1}) and {n2!r} [{o2}, {e2}) overlap at offset "
                               f"{o2}")

    # overlap of simultaneously live roots, and of workspaces with live roots
    live = liveness(program)
    starts: dict[int, list[int]] = {}
    for r, (a, b) in live.items():
        starts.setdefault(a, []).append(r)
    active: list[int] = []
    for t in range(n):
        active = [r for r in active if live[r][1] >= t] + starts.get(t, [])
        blocks = [(slot_of[r].offset, slot_of[r].offset + slot_of[r].nbytes, slot_of[r].name) for r in active]
        c = program.calls[t]
        if c.workspace_bytes:
            blocks.append((c.workspace_offset, c.workspace_offset + c.workspace_bytes, f"workspace of call {t}"))
        blocks.sort()
        for (o1, e1, n1), (o2, e2, n2) in zip(blocks, blocks[1:]):
            if o2 < e1:
                raise ProgramError(f"call {t} ({c.name}): {n1!r} [{o1}, {e1}) and {n2!r} [{o2}, {e2}) are live "
                                   f"at the same time and overlap at offset {o2}")


def live_timeline(program: Program) -> tuple[int, ...]:
    """Aligned scratch bytes live at each call (plus its workspace)."""
    n = len(program.calls)
    tl = np.zeros(n + 1, dtype=np.int64)
    slot_of = {s.tensor: s for s in program.slots}
    for r, (a, b) in liveness(program).items():
        tl[a] += align(slot_of[r].nbytes)
        tl[b + 1] -= align(slot_of[r].nbytes)
    tl = np.cumsum(tl)[:n]
    ws = np.array([align(c.workspace_bytes) if c.workspace_bytes else 0 for c in program.calls], dtype=np.int64)
    return tuple(int(v) for v in (tl + ws))


# ---------------------------------------------------------------------------------------------
# field-by-field validation (a program may come from a file: every field is checked before anything runs)
# ---------------------------------------------------------------------------------------------
def _is_int(v) -> bool:
    return type(v) is int


def _bad(field: str, value, expected: str) -> ProgramError:
    return ProgramError(f"program field {field} = {value!r}: expected {expected}")


def _check_fields(program: Program) -> None:
    from port.lower.program import PROGRAM_FORMATS_READ, Call, Slot
    p = program
    if p.version not in PROGRAM_FORMATS_READ:
        raise _bad("version", p.version, " or ".join(map(str, PROGRAM_FORMATS_READ)))
    for f in ("graph_name", "graph_digest", "optimizer"):
        if not isinstance(getattr(p, f), str):
            raise _bad(f, getattr(p, f), "a string")
    for f in ("arena_bytes", "persistent_bytes", "batch_size", "peak_live_bytes"):
        v = getattr(p, f)
        if not _is_int(v) or v < 0:
            raise _bad(f, v, "a non-negative int")
    if p.persistent_bytes > p.arena_bytes:
        raise _bad("persistent_bytes", p.persistent_bytes, f"at most arena_bytes ({p.arena_bytes})")
    for f in ("input_id", "label_id", "loss_id", "logits_id"):
        if not _is_int(getattr(p, f)):
            raise _bad(f, getattr(p, f), "an int tensor id")
    if not isinstance(p.slots, tuple) or not all(isinstance(s, Slot) for s in p.slots):
        raise _bad("slots", type(p.slots).__name__, "a tuple of Slot")
    if not isinstance(p.calls, tuple) or not all(isinstance(c, Call) for c in p.calls):
        raise _bad("calls", type(p.calls).__name__, "a tuple of Call")
    if not isinstance(p.phases, tuple) or not all(isinstance(x, str) for x in p.phases):
        raise _bad("phases", p.phases, "a tuple of phase names")
    if not isinstance(p.live_timeline, tuple) or not all(_is_int(x) and x >= 0 for x in p.live_timeline) \
            or len(p.live_timeline) not in (0, len(p.calls)):
        raise _bad("live_timeline", p.live_timeline, f"{len(p.calls)} non-negative ints")
    for name, pairs in (("zero_ranges", p.zero_ranges), ("live_until", p.live_until)):
        if not isinstance(pairs, tuple) or not all(isinstance(r, tuple) and len(r) == 2 and all(map(_is_int, r))
                                                   for r in pairs):
            raise _bad(name, pairs, "a tuple of (int, int) pairs")
    for s in p.slots:
        where = f"slot of tensor {s.tensor!r}"
        if not _is_int(s.tensor) or not _is_int(s.root) or not isinstance(s.name, str):
            raise ProgramError(f"{where}: tensor/root ids must be ints and the name a string")
        if not _is_int(s.offset) or not _is_int(s.nbytes) or s.nbytes < 0:
            raise ProgramError(f"{where} ({s.name!r}): offset {s.offset!r} / nbytes {s.nbytes!r}: expected ints, "
                               f"nbytes >= 0")
        if not isinstance(s.shape, tuple) or not all(_is_int(d) and d >= 0 for d in s.shape):
            raise ProgramError(f"{where} ({s.name!r}): shape {s.shape!r}: expected a tuple of non-negative ints")
        if not isinstance(s.dtype, str) or not isinstance(s.role, str):
            raise ProgramError(f"{where} ({s.name!r}): dtype {s.dtype!r} / role {s.role!r}: expected strings")
    for i, c in enumerate(p.calls):
        where = f"call {i} ({c.name!r})"
        if not _is_int(c.index) or not _is_int(c.op) or not isinstance(c.name, str):
            raise ProgramError(f"{where}: index {c.index!r} / op {c.op!r}: expected ints")
        for f in ("outputs", "inputs", "covers"):
            v = getattr(c, f)
            if not isinstance(v, tuple) or not all(map(_is_int, v)):
                raise ProgramError(f"{where}: {f} {v!r}: expected a tuple of int tensor ids")
        if not isinstance(c.attrs, tuple) or not all(isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str)
                                                     for a in c.attrs) \
                or len({a[0] for a in c.attrs}) != len(c.attrs):
            raise ProgramError(f"{where}: attrs {c.attrs!r}: expected distinct (name, value) pairs")
        if not _is_int(c.workspace_offset) or not _is_int(c.workspace_bytes) or c.workspace_bytes < 0 \
                or c.workspace_offset < 0:
            raise ProgramError(f"{where}: workspace offset {c.workspace_offset!r} / bytes {c.workspace_bytes!r}: "
                               f"expected non-negative ints")
        for f in ("kernel", "backend", "variant", "phase"):
            if not isinstance(getattr(c, f), str):
                raise ProgramError(f"{where}: {f} {getattr(c, f)!r}: expected a string")


def _check_ids_and_zero_ranges(program: Program, slot_of: dict) -> None:
    from port.ir.types import ROLE_GRADIENT, numel
    p = program
    s = slot_of.get(p.input_id)
    if s is None or s.dtype not in ("float32", "int64"):
        raise _bad("input_id", p.input_id, "the id of a float32 (or int64 token-id) tensor with a slot")
    for t in p.extra_input_ids:
        if not _is_int(t) or slot_of.get(t) is None or (slot_of[t].role and slot_of[t].role != "input"):
            raise _bad("extra_input_ids", p.extra_input_ids, "ids of input tensors with a slot")
    if p.label_id != -1:
        s = slot_of.get(p.label_id)
        if s is None or s.dtype != "int64" or len(s.shape) not in (1, 2):
            raise _bad("label_id", p.label_id, "-1 or the id of a 1-d (or [N, T] token) int64 tensor with a slot")
    if p.loss_id != -1:
        s = slot_of.get(p.loss_id)
        if s is None or s.dtype != "float32" or numel(s.shape) != 1:
            raise _bad("loss_id", p.loss_id, "-1 or the id of a one-element float32 tensor with a slot")
    if p.logits_id not in slot_of:
        raise _bad("logits_id", p.logits_id, "the id of a tensor with a slot")
    for f, role in (("input_id", "input"), ("label_id", "label")):
        s = slot_of.get(getattr(p, f))
        if s is not None and s.role and s.role != role:
            raise _bad(f, getattr(p, f), f"the id of the {role} tensor (tensor {s.name!r} is a {s.role})")
    for c in p.calls:     # the loss call fixes the loss, label and logits ids
        if c.kernel == "cross_entropy" and len(c.inputs) == 2 and len(c.outputs) == 2:
            for f, want in (("loss_id", c.outputs[0]), ("label_id", c.inputs[1]), ("logits_id", c.inputs[0])):
                if getattr(p, f) != want:
                    raise _bad(f, getattr(p, f), f"{want}, the id call {c.index} ({c.name}) uses")
    roots = [s for s in p.slots if s.root == s.tensor and s.nbytes]
    for k, (o, nb) in enumerate(p.zero_ranges):
        if o < 0 or nb <= 0 or o + nb > p.persistent_bytes:
            raise ProgramError(f"program field zero_ranges[{k}] = ({o}, {nb}): expected a non-empty range inside "
                               f"the persistent region [0, {p.persistent_bytes})")
        for s in roots:
            if s.offset < o + nb and o < s.offset + s.nbytes and s.role != ROLE_GRADIENT:
                raise ProgramError(f"program field zero_ranges[{k}] = ({o}, {nb}) covers {s.role or 'tensor'} "
                                   f"{s.name!r} [{s.offset}, {s.offset + s.nbytes}): only parameter gradients "
                                   f"may be zeroed")
    # every persistent gradient starts the step at zero, or its writer overwrites it (only the C whole-tensor
    # weight gradient and the fused SE weight gradient can: port.exec.registry.may_overwrite)
    from port.exec.registry import may_overwrite
    for c in p.calls:
        if c.attr("overwrite") and not may_overwrite(c.kernel, c.backend, c.variant):
            raise ProgramError(f"call {c.index} ({c.name}): attribute 'overwrite' on a {c.backend} {c.kernel} "
                               f"call ({c.variant}); only the C backend's whole-tensor conv2d.grad_weight and "
                               f"se.grad_weight overwrite their gradients: drop the attribute and zero them "
                               f"(zero_ranges)")
    written = {t for c in p.calls if c.attr("overwrite") for t in c.outputs}
    for s in roots:
        if s.role == ROLE_GRADIENT and s.offset < p.persistent_bytes and s.tensor not in written and not any(
                o <= s.offset and s.offset + s.nbytes <= o + nb for o, nb in p.zero_ranges):
            raise ProgramError(f"program field zero_ranges: gradient {s.name!r} [{s.offset}, "
                               f"{s.offset + s.nbytes}) is neither zeroed before the step nor overwritten by a call "
                               f"(attribute 'overwrite'): it would add to the last step's gradient")


def _check_handoffs(program: Program, slot_of: dict) -> None:
    """Every tensor a call reads that a call on another engine wrote in this pass, where one of the two engines
    queues its calls (port.lower.program.needs_handoff_call), is handed over to the reader's engine first: a
    ``handoff`` call with ``dst`` = the reader's backend between the write and the read (port.plan.semantics
    rule 7). A pass starts with every tensor on the host (the executor drains the queues after each pass)."""
    from port.lower.program import needs_handoff_call
    own = {m for m, _ in program.memories}     # engines with their own memory: copies (_check_memories)
    wrote: dict[int, str] = {}       # root -> backend of its last writer in this pass
    handed: dict[int, set] = {}      # root -> backends it was handed to since that write
    for c in program.calls:
        if c.backend == "host" and c.kernel == "handoff" and c.attr("copy"):
            continue
        if c.backend == "host" and c.kernel == "join":
            continue
        if c.backend == "host" and c.kernel == "handoff":
            r = slot_of[c.inputs[0]].root
            if wrote.get(r, "host") != c.attr("src"):
                raise ProgramError(f"call {c.index} ({c.name}): hands {slot_of[c.inputs[0]].name!r} over from "
                                   f"{c.attr('src')}, but its last writer ran on {wrote.get(r, 'the host')}")
            handed.setdefault(r, set()).add(c.attr("dst"))
            continue
        if c.backend != "host":
            for t in dict.fromkeys(c.inputs):
                r = slot_of[t].root
                w = wrote.get(r)
                if w not in (None, "host") and needs_handoff_call(w, c.backend) \
                        and c.backend not in handed.get(r, ()) and not ({w, c.backend} & own):
                    raise ProgramError(f"call {c.index} ({c.name}, {c.backend}) reads {slot_of[t].name!r}, written "
                                       f"on {w} without a hand-off to {c.backend} in between (a handoff call)")
        for t in c.outputs:
            r = slot_of[t].root
            wrote[r] = c.backend
            handed.pop(r, None)


def _check_memories(program: Program, slot_of: dict) -> None:
    """Engines with their own memory (port.lower.memories): the fields, every root a call or copy uses in such a
    memory has a slot inside its arena, roots live there at the same time do not overlap, and the residency
    rule holds in the executor's run order (main calls, then late updates): every call finds the current bytes
    of what it reads and writes in its memory, and each segment ends with the persistent roots (after the main
    calls also the loss and the logits) current in the host arena."""
    from port.ir.types import ROLE_INPUT, ROLE_LABEL
    from port.lower import memories as MEM
    from port.lower.program import PROGRAM_FORMAT_OWN_MEMORY, QUEUED_BACKENDS
    p = program
    if not isinstance(p.memories, tuple) or not all(
            isinstance(m, tuple) and len(m) == 2 and m[0] in QUEUED_BACKENDS and _is_int(m[1]) and m[1] >= 0
            for m in p.memories) or len({m for m, _ in p.memories}) != len(p.memories):
        raise _bad("memories", p.memories, f"distinct (engine, bytes) pairs, engines of {QUEUED_BACKENDS}")
    size = dict(p.memories)
    if not isinstance(p.memory_slots, tuple) or not all(
            isinstance(x, tuple) and len(x) == 3 and x[0] in size and _is_int(x[1]) and _is_int(x[2])
            for x in p.memory_slots):
        raise _bad("memory_slots", p.memory_slots, "(memory of field memories, root tensor id, offset) triples")
    copies = [c for c in p.calls if c.backend == "host" and c.kernel == "handoff" and c.attr("copy")]
    copy_at = {c.index for c in copies}
    if not size:
        if p.memory_slots or copies:
            raise ProgramError("the program has copy hand-offs or memory_slots but no own memories (field "
                               "memories): a one-arena program hands over without copies")
        return
    if p.version != PROGRAM_FORMAT_OWN_MEMORY:
        raise _bad("version", p.version, f"{PROGRAM_FORMAT_OWN_MEMORY} (a program with own memories)")
    off: dict[tuple[str, int], int] = {}
    for m, r, o in p.memory_slots:
        s = slot_of.get(r)
        if s is None or s.root != r:
            raise ProgramError(f"program field memory_slots: ({m!r}, {r}, {o}): {r} is not a root tensor id")
        if (m, r) in off:
            raise ProgramError(f"program field memory_slots: root {s.name!r} placed twice in memory {m!r}")
        if o < 0 or o % ALIGN or o + s.nbytes > size[m]:
            raise ProgramError(f"program field memory_slots: {s.name!r} at [{o}, {o + s.nbytes}) in memory {m!r}: "
                               f"expected a {ALIGN}-byte aligned extent inside its arena [0, {size[m]})")
        off[(m, r)] = o
    for c in copies:
        src, dst = c.attr("src"), c.attr("dst")
        if src == dst or not {src, dst} <= set(size) | {MEM.HOST} or len(c.inputs) != 1 or c.outputs:
            raise ProgramError(f"call {c.index} ({c.name}): a copy hand-off takes one tensor from one memory to "
                               f"another of {['host'] + sorted(size)}; got src={src!r} dst={dst!r}, "
                               f"{len(c.inputs)} inputs, {len(c.outputs)} outputs")
    lives = MEM.own_lives(p.calls, lambda t: slot_of[t].root, size)
    for m, lv in lives.items():
        for r in lv:
            if (m, r) not in off:
                raise ProgramError(f"tensor {slot_of[r].name!r} is used in memory {m!r} (calls {lv[r][0]}.."
                                   f"{lv[r][1]}) but has no slot there (memory_slots)")
        order = sorted(lv, key=lambda r: off[(m, r)])
        for i, a in enumerate(order):
            ea = off[(m, a)] + slot_of[a].nbytes
            for b in order[i + 1:]:
                if off[(m, b)] >= ea:
                    break
                if lv[a][0] <= lv[b][1] and lv[b][0] <= lv[a][1]:
                    raise ProgramError(f"memory {m!r}: {slot_of[a].name!r} and {slot_of[b].name!r} are live there "
                                       f"at the same time and overlap at offset {off[(m, b)]}")
    roles_pre = (ROLE_INPUT, ROLE_LABEL)

    def persistent(r):
        return slot_of[r].region == REGION_PERSISTENT

    def preexisting(r):
        return persistent(r) or slot_of[r].role in roles_pre or r in p.input_ids or r == p.label_id
    keep_main = {slot_of[t].root for t in (p.loss_id, p.logits_id) if t in slot_of}
    main = [c for c in p.calls if not MEM.is_late_update(c.phase, dict(c.attrs))]
    late = [c for c in p.calls if MEM.is_late_update(c.phase, dict(c.attrs))]
    for seg, keep in ((main, lambda r: persistent(r) or r in keep_main), (late, persistent)):
        res = MEM.Residency(preexisting)
        for c in seg:
            if c.index in copy_at:
                r = slot_of[c.inputs[0]].root
                if c.attr("src") not in res.where(r):
                    raise ProgramError(f"call {c.index} ({c.name}): copies {slot_of[r].name!r} from memory "
                                       f"{c.attr('src')!r}, which does not hold its current bytes "
                                       f"({sorted(res.where(r)) or 'none yet'})")
                res.copied(r, c.attr("dst"))
                continue
            m = MEM.memory_of(c.backend, size)
            miss = res.missing(m, [slot_of[t].root for t in c.inputs + c.outputs])
            if miss:
                r, src = miss[0]
                raise ProgramError(f"call {c.index} ({c.name}, {c.backend}) uses {slot_of[r].name!r} in memory {m!r}"
                                   f", but its current bytes are in {src!r}: a copy hand-off (handoff call with "
                                   f"attribute copy) from {src!r} to {m!r} is missing before it")
            res.wrote(m, [slot_of[t].root for t in c.outputs])
        left = res.stranded(keep)
        if seg and left:
            r, m = left[0]
            raise ProgramError(f"{slot_of[r].name!r} ends the {'update' if seg is late else 'main'} calls with its "
                               f"current bytes in memory {m!r} only: a copy hand-off to the host is missing")


def _check_call(program: Program, c, slot_of: dict, pages: dict) -> None:
    """One call against the kernel registry: known backend/kernel/variant, the per-kernel shape rule
    (port.exec.registry.call_shapes), read-modify-write pairs, persistent writes and the workspace size."""
    from port.exec import registry as R
    from port.ir.types import PHASES, ROLE_GRADIENT
    where = f"call {c.index} ({c.name}, {c.kernel})"
    if c.backend not in R.BACKENDS + ("host",):
        raise ProgramError(f"{where}: backend {c.backend!r}: expected one of {R.BACKENDS + ('host',)}")
    if not R.known_kernel(c.kernel, c.backend, dict(c.attrs)):
        raise ProgramError(f"{where}: kernel {c.kernel!r} is unknown to the {c.backend} backend (registry)")
    if c.backend != "host" and not R.known_variant(c.kernel, c.variant, c.backend):
        raise ProgramError(f"{where}: variant {c.variant!r} does not apply to kernel {c.kernel!r} on {c.backend}")
    if c.phase not in PHASES + ("recompute", "page"):
        raise ProgramError(f"{where}: phase {c.phase!r}: expected one of {PHASES + ('recompute', 'page')}")
    a = dict(c.attrs)
    ins = [slot_of[t] for t in c.inputs]
    outs = [slot_of[t] for t in c.outputs]
    try:
        ein, eout = R.call_shapes(c.kernel, a, [s.shape for s in ins], [s.shape for s in outs])
    except R.CallShapeError as e:
        raise ProgramError(f"{where}: {e}") from None
    for kind, got, want in (("input", ins, ein), ("output", outs, eout)):
        if len(got) != len(want):
            raise ProgramError(f"{where}: {len(got)} {kind}s, expected {len(want)} for this kernel and attributes")
        for j, (s, (shape, dt)) in enumerate(zip(got, want)):
            if (shape is not None and tuple(s.shape) != tuple(shape)) or (dt is not None and s.dtype != dt):
                raise ProgramError(f"{where}: {kind} {j} {s.name!r} is {list(s.shape)} {s.dtype}; its attributes "
                                   f"{a} and the other tensors need {list(shape)} {dt or s.dtype}")
    pairs = R.inplace_pairs(c.kernel, a)
    for oi, ii in pairs:
        if c.outputs[oi] != c.inputs[ii]:
            raise ProgramError(f"{where}: output {oi} (id {c.outputs[oi]}) must be input {ii} (id {c.inputs[ii]}): "
                               f"the kernel updates it in place")
    rmw = {c.outputs[oi] for oi, _ in pairs}
    for s in outs:
        if s.region == "persistent" and s.role != ROLE_GRADIENT and s.tensor not in rmw:
            raise ProgramError(f"{where}: writes persistent {s.role or 'tensor'} {s.name!r}, which only its own "
                               f"update/statistics kernel may write")
    z = a.get("zero_outputs")
    if z is not None and (not isinstance(z, tuple) or not set(z) <= set(c.outputs)):
        raise ProgramError(f"{where}: attribute zero_outputs={z!r}: expected a tuple of the call's outputs")
    if c.backend == "host" and c.kernel == "handoff" and a.get("copy"):
        return                                  # between memories: _check_memories
    if c.backend == "host" and c.kernel == "join":
        from port.lower.program import QUEUED_BACKENDS
        if a.get("src") not in QUEUED_BACKENDS or set(a) != {"src"}:
            raise ProgramError(f"{where}: attributes {a}: a join takes src, a backend of {QUEUED_BACKENDS}")
        return
    if c.backend == "host" and c.kernel == "handoff":
        from port.lower.program import needs_handoff_call
        src, dst = a.get("src"), a.get("dst")
        if src not in R.BACKENDS or dst not in R.BACKENDS or not needs_handoff_call(src, dst):
            raise ProgramError(f"{where}: attributes src={src!r} dst={dst!r}: expected two backends of "
                               f"{R.BACKENDS} of which one queues its calls (a hand-off between them)")
        return
    if c.backend == "host":
        key = a.get("key")
        if not _is_int(key):
            raise ProgramError(f"{where}: attribute key={key!r}: expected an int")
        if c.kernel == "page_out":
            pages[key] = (ins[0].shape, ins[0].dtype)
        elif a.get("state"):        # a paged optimizer state: storage holds it from the last step's page_out
            pages.setdefault(("state", key), (outs[0].shape, outs[0].dtype))
        elif pages.get(key) != (outs[0].shape, outs[0].dtype):
            raise ProgramError(f"{where}: pages in key {key} as {list(outs[0].shape)} {outs[0].dtype}, but no "
                               f"earlier page_out saved that (saved: {pages.get(key)})")
        return
    try:
        need = R.workspace_bytes(c.kernel, c.variant, c.backend, a, [s.shape for s in ins], [s.shape for s in outs])
    except Exception as e:  # noqa: BLE001 - a query on parameters the kernel refuses
        raise ProgramError(f"{where}: workspace query failed ({type(e).__name__}: {e})") from None
    if c.workspace_bytes != need:
        raise ProgramError(f"{where}: workspace_bytes {c.workspace_bytes}, expected {need} (the kernel's query for "
                           f"these shapes, attributes and variant {c.variant!r})")
    if c.backend == "c":     # the call as port-rt and the executor run it: the C call rule (rt_check.c)
        from port.exec import rtcall
        try:
            r = rtcall.record(c, slot_of.__getitem__)
        except ProgramError:
            raise
        except Exception as e:  # noqa: BLE001 - an encoder on attributes it cannot read
            raise ProgramError(f"{where}: cannot encode the C call ({type(e).__name__}: {e})") from None
        rtcall.check_record(r, c, program.arena_bytes, program.persistent_bytes)
