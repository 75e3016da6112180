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
  the start of each step (weight-gradient kernels accumulate).
* ``peak_live_bytes`` = persistent + max over t of (aligned live scratch bytes + workspace at t): the
  lower bound any placement can reach; ``arena_bytes`` = persistent + the placement's high-water mark
  (>= peak_live_bytes by fragmentation).
"""
from __future__ import annotations

from typing import Hashable, Iterable, Sequence

import numpy as np

from port.errors import ProgramError
from port.lower.program import ALIGN, REGION_PERSISTENT, REGION_SCRATCH, Program, align

STRATEGIES = ("best_fit", "lowest", "first_fit", "area", "auto")


def assign_offsets(items: Sequence[tuple[Hashable, int, int, int]], strategy: str = "best_fit",
                   alignment: int = ALIGN) -> tuple[dict[Hashable, int], int]:
    """Place blocks ``(key, nbytes, first, last)`` (inclusive live interval in call indices) so that no two
    blocks with overlapping intervals overlap in bytes. Returns (offsets, high-water mark).

    best_fit: blocks in decreasing size (ties: earlier first), each into the smallest gap among the
    already-placed blocks whose intervals overlap it (greedy-by-size, as TFLite's planner).
    lowest: the same order, each at the lowest offset that fits.
    first_fit: blocks in order of first use, each at the lowest offset that fits.
    area: blocks in decreasing size x lifetime, smallest gap.
    auto: all of the above, then (while the result is > 1% above the lower bound max_t live bytes) a few
    deterministic seeded perturbations of the size order; the smallest high-water mark wins (``lower``'s
    default).
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

    if strategy != "auto":
        offs, high = _place(order_of(strategy), sizes, firsts, lasts, tightest=strategy in ("best_fit", "area"))
        return {items[i][0]: o for i, o in offs.items()}, high
    tl = np.zeros(int(lasts.max()) + 2, dtype=np.int64)
    np.add.at(tl, firsts, sizes)
    np.add.at(tl, lasts + 1, -sizes)
    bound = int(np.cumsum(tl).max())
    best = None
    for st in ("lowest", "best_fit", "area", "first_fit"):
        r = _place(order_of(st), sizes, firsts, lasts, tightest=st in ("best_fit", "area"))
        if best is None or r[1] < best[1]:
            best = r
    rng = np.random.default_rng(0)
    for _ in range(24):
        if best[1] <= bound * 1.01:
            break
        jit = rng.uniform(0.7, 1.3, n)
        order = sorted(range(n), key=lambda i: (-S[i] * jit[i], F[i], i))
        for tight in (False, True):
            r = _place(order, sizes, firsts, lasts, tightest=tight)
            if r[1] < best[1]:
                best = r
    return {items[i][0]: o for i, o in best[0].items()}, best[1]


def _place(order, sizes, firsts, lasts, tightest: bool) -> tuple[dict[int, int], int]:
    n = len(order)
    p_first = np.empty(n, dtype=np.int64)
    p_last = np.empty(n, dtype=np.int64)
    p_off = np.empty(n, dtype=np.int64)
    p_end = np.empty(n, dtype=np.int64)
    k = 0
    offsets: dict[int, int] = {}
    high = 0
    for i in order:
        size, f, l = int(sizes[i]), int(firsts[i]), int(lasts[i])
        best = None
        if k:
            m = (p_first[:k] <= l) & (p_last[:k] >= f)
            offs = p_off[:k][m]
            ends = p_end[:k][m]
        else:
            offs = ends = np.empty(0, dtype=np.int64)
        if len(offs):
            srt = np.argsort(offs, kind="stable")
            cur = 0
            best_gap = None
            for o, e in zip(offs[srt].tolist(), ends[srt].tolist()):
                gap = o - cur
                if gap >= size:
                    if not tightest:
                        best = cur
                        break
                    if best_gap is None or gap < best_gap:
                        best, best_gap = cur, gap
                cur = max(cur, e)
            if best is None:
                best = cur
        else:
            best = 0
        offsets[i] = best
        p_first[k], p_last[k], p_off[k], p_end[k] = f, l, best, best + size
        k += 1
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
    pre = {program.input_id, program.label_id}
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
    live roots (or a call's workspace and a live root) overlapping in bytes.
    """
    from port.ir.types import DTYPE_BYTES, numel

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
        if s.root != s.tensor:
            if s.offset != root.offset or s.nbytes > root.nbytes or s.region != root.region:
                raise ProgramError(f"tensor {s.name!r} aliases {root.name!r} but its offset {s.offset} / size "
                                   f"{s.nbytes} / region do not match the root's ({root.offset}, {root.nbytes})")
        elif s.offset % ALIGN:
            raise ProgramError(f"tensor {s.name!r}: offset {s.offset} is not {ALIGN}-byte aligned")
    for t in (program.input_id, program.label_id):
        if t >= 0 and t not in slot_of:
            raise ProgramError(f"the program's input tensor id {t} has no slot")

    n = len(program.calls)
    written = {s.root for s in program.slots if s.region == REGION_PERSISTENT}
    written |= {slot_of[t].root for t in (program.input_id, program.label_id) if t in slot_of}
    for i, c in enumerate(program.calls):
        if c.index != i:
            raise ProgramError(f"call {c.name!r} has index {c.index} at position {i}")
        for t in c.inputs + c.outputs:
            if t not in slot_of:
                raise ProgramError(f"call {i} ({c.name}): tensor id {t} has no slot")
        for t in c.inputs:
            r = slot_of[t].root
            if r not in written:
                raise ProgramError(f"call {i} ({c.name}): reads tensor {slot_of[t].name!r} (offset "
                                   f"{slot_of[t].offset}) before any call writes it")
        for t in c.outputs:
            written.add(slot_of[t].root)
        if c.workspace_bytes < 0 or (c.workspace_bytes and (c.workspace_offset < P or
                                                           c.workspace_offset + c.workspace_bytes > A)):
            raise ProgramError(f"call {i} ({c.name}): workspace [{c.workspace_offset}, "
                               f"{c.workspace_offset + c.workspace_bytes}) outside the scratch region [{P}, {A})")

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
