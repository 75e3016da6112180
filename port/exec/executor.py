"""Run a Program on one arena: bind every call once (pointers, views, param structs), then a step is a tight
loop over closures.

The arena is one contiguous torch uint8 tensor; the C backend gets raw addresses into it, the torch backends
get typed views (``arena[off:off+n].view(dtype).view(shape)``): zero-copy both ways. Several programs (the
training program and its inference program) can share one arena: the inference program places its
parameters at the training program's offsets and its scratch inside the training scratch.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from port.errors import LabelError, ProgramError
from port.lower.arena import check_program
from port.lower.program import GRAD_SCALE_ID, Program, align
from port.ir.types import PHASE_UPDATE, ROLE_GRADIENT
from port.ops.attention import ATTENTION_KERNELS

_TORCH_DTYPES = {}


def torch_dtype(name: str):
    import torch
    if not _TORCH_DTYPES:
        _TORCH_DTYPES.update({"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                              "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8, "bool": torch.bool})
    return _TORCH_DTYPES[name]


def grad_runs(program: Program, arena: Any, update_calls: list) -> list:
    """Views of ``arena`` covering the gradients ``update_calls`` read, in as few runs as the layout allows: slots
    of one dtype that follow each other up to their alignment padding (persistent gradients are laid out one after
    another; the padding is never written, so it holds zeros) share one run. The non-finite check sums each run:
    one reduction per run instead of one per gradient (a small transformer's 42 sums were a third of its 0.3 ms
    step)."""
    gids: list[int] = []
    for c in update_calls:     # gradients live between the backward pass and the updates
        for t in c.inputs:
            if t >= 0 and t not in gids and program.has_slot(t) and program.slot(t).role == ROLE_GRADIENT:
                gids.append(t)
    runs: list[list] = []          # [offset, nbytes, dtype]
    for off, nb, dt in sorted((program.slot(t).offset, program.slot(t).nbytes, program.slot(t).dtype) for t in gids):
        r = runs[-1] if runs else None
        if r is not None and r[2] == dt and r[0] + r[1] <= off <= r[0] + align(r[1]):
            r[1] = off + nb - r[0]
        else:
            runs.append([off, nb, dt])
    return [arena[o:o + n].view(torch_dtype(dt)) for o, n, dt in runs]


@dataclass
class RunState:
    """Mutable run-time state the bound calls read: optimizer steps done, forward passes done (dropout RNG
    counter), the run's dropout seed and the optimizer settings."""
    opt: Any = None
    step: int = 0
    dropout_counter: int = 0
    seed: int = 0


class BindContext:
    def __init__(self, ex: "Executor"):
        self.ex = ex
        self.state = ex.state

    def ptr(self, tid: int | None) -> int | None:
        if tid is None:
            return None
        return self.ex.base + self.ex.program.slot(tid).offset

    def view(self, tid: int):
        return self.ex.view(tid)

    def shape(self, tid: int) -> tuple[int, ...]:
        return self.ex.program.slot(tid).shape

    def root(self, tid: int) -> int:
        return self.ex.program.slot(tid).root

    def view_bytes(self, tid: int):
        """The host arena bytes of ``tid``'s slot (uint8)."""
        s = self.ex.program.slot(tid)
        return self.ex.arena[s.offset:s.offset + s.nbytes]

    def own_arena(self, memory: str):
        """The engine ``memory``'s own arena (None: the engine works on the host arena)."""
        return self.ex.own.get(memory)

    def own_offset(self, memory: str, tid: int) -> int:
        """The byte offset of ``tid`` in own memory ``memory``'s arena (a view at its place in its root)."""
        p = self.ex.program
        s = p.slot(tid)
        try:
            return p.memory_offset(memory, s.root) + s.offset - p.slot(s.root).offset
        except KeyError:
            raise ProgramError(f"tensor {s.name!r} has no slot in memory {memory!r} (memory_slots)") from None

    def ws_ptr(self, call) -> int | None:
        return self.ex.base + call.workspace_offset if call.workspace_bytes else None

    def ws_view(self, call):
        return self.ex.arena[call.workspace_offset:call.workspace_offset + call.workspace_bytes]


def program_backends(program: Program) -> set[str]:
    """The backends of a program's kernel calls (``host`` calls, paging, run wherever the arena is)."""
    return {c.backend for c in program.calls} - {"host"}


def program_device(program: Program, default: str = "cpu") -> str:
    """The memory a program's arena lives in: ``cuda`` when its calls run on torch-cuda, ``cpu`` when they run on
    CPU backends, ``default`` for a program of host calls alone. One
    program runs in one memory: a program that mixes torch-cuda with CPU backends is refused (the executor has
    no hand-off copies between memories; port.pipeline solves plans that run here within one memory)."""
    backends = program_backends(program)
    if "torch-cuda" not in backends:
        return "cpu" if backends else default
    if backends != {"torch-cuda"}:
        raise ProgramError(f"the program mixes torch-cuda with CPU backends ({', '.join(sorted(backends))}): that "
                           f"needs hand-off copies between GPU and CPU memory, which the executor does not do. "
                           f"Fix: a plan within one memory (port.pipeline.solve_plan solves one per memory and "
                           f"keeps the faster; or solve with --solver single:<accelerator>)")
    return "cuda"


def graph_refusal(program: Program, main_calls: list) -> str | None:
    """Why a CUDA program's main pass cannot replay as a CUDA graph (None: it can). A graph fixes every launch:
    page calls (host file I/O) and random ops (dropout, bernoulli, attention dropout: fresh masks every step) would
    replay stale. PORT_CUDA_GRAPH=0 turns graphs off."""
    if os.environ.get("PORT_CUDA_GRAPH", "1") == "0":
        return "PORT_CUDA_GRAPH=0"
    for c in main_calls:
        if c.backend == "host":
            return f"call {c.index} ({c.name}) pages to storage"
        if c.kernel in ("dropout", "bernoulli") or (c.kernel in ATTENTION_KERNELS and c.attr("p")):
            return f"call {c.index} ({c.name}) draws a {'dropout' if c.kernel != 'bernoulli' else 'bernoulli'} mask"
    return None


def update_key(calls: list, state: Any) -> tuple | None:
    """The Python scalars the update calls among ``calls`` read when they run (port.exec.backends.torch_backend:
    a graph replays them as captured, so a pass is re-captured when they change), or None when some change every
    step (AdamW's bias corrections: such a pass runs eagerly)."""
    from port.exec.backends.torch_backend import TorchBackend
    keys = []
    for c in calls:
        if c.phase == PHASE_UPDATE:
            k = TorchBackend.update_graph_key(c, state)
            if k is None:
                return None
            keys.append(k)
    return tuple(sorted(set(keys)))


class _CudaGraphPass:
    """Runs a list of calls on its own stream: eagerly for the first ``WARM`` passes (cuDNN and cuBLAS set up
    their handles and workspaces on that stream), then captures them once and replays the graph from then on.
    ``key()``: the Python scalars the calls read (update_key); a pass whose key differs from the captured one
    runs eagerly and is captured again; None: eagerly, uncaptured. The stream waits for the caller's stream
    before a pass and the caller's stream for it after, so copies before (the batch, zeroed gradients) and reads
    after (the loss, the updates) are ordered."""
    WARM = 2
    MAX_CAPTURES = 8

    def __init__(self, key: Callable[[], tuple | None]):
        import torch
        self.torch = torch
        self.key = key
        self.stream = torch.cuda.Stream()
        self.graph = None
        self.captured_key = None
        self.passes = 0
        self.captures = 0
        self.failed = ""

    def run(self, fns: list) -> None:
        torch = self.torch
        key = self.key()
        if self.graph is not None and key != self.captured_key:
            self.graph, self.passes = None, self.WARM - 1     # scalars changed: one eager pass, then capture
            if self.captures >= self.MAX_CAPTURES:
                self.failed = (f"the updates' scalars changed after {self.captures} captures (a learning-rate "
                               f"schedule?); eager passes")
        cur = torch.cuda.current_stream()
        self.stream.wait_stream(cur)
        with torch.cuda.stream(self.stream):
            if self.graph is not None:
                self.graph.replay()
            else:
                for f in fns:
                    f()
                self.passes += 1
        cur.wait_stream(self.stream)
        if self.graph is None and self.passes == self.WARM and key is not None and not self.failed:
            g = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(g, stream=self.stream):     # recorded, not run: this pass already ran
                    for f in fns:
                        f()
            except Exception as e:  # noqa: BLE001 - a call torch cannot capture: the passes stay eager
                self.failed = f"capture failed ({type(e).__name__}: {e}); eager passes"
                return
            self.graph, self.captured_key = g, key
            self.captures += 1

    def status(self) -> str:
        if self.graph is not None:
            return "replayed"
        if self.failed:
            return f"eager: {self.failed}"
        if self.key() is None:
            return "eager: its updates' scalars change every step (AdamW)"
        return "eager (warming up)"


class Executor:
    def __init__(self, program: Program, state: RunState | None = None, arena=None, device: str = "cpu",
                 check: bool = True, spill_dir: str | None = None, drop_cache: bool = False):
        import torch
        if check:
            check_program(program)
        self.program = program
        self.state = state or RunState()
        if any(c.backend == "torch-cpu" for c in program.calls):
            # PyTorch's kernels allocate and free temporaries every call: keep their pages mapped (no page
            # faults each step; the profiler's torch runner does the same, so its times hold here)
            from port.train.memwatch import keep_freed_heap
            keep_freed_heap()
        device = program_device(program, default=device)
        if arena is None:
            arena = torch.zeros(max(program.arena_bytes, 64), dtype=torch.uint8, device=device)
        if arena.device.type != device:
            raise ProgramError(f"the program's calls run on {device} ({', '.join(sorted(program_backends(program)))})"
                               f" but the arena given is in {arena.device.type} memory: allocate the arena on "
                               f"{device}")
        if arena.numel() < program.arena_bytes:
            raise ProgramError(f"arena of {arena.numel()} B is smaller than the program's {program.arena_bytes} B")
        self.arena = arena
        self.base = arena.data_ptr()
        if self.base % 64:
            raise ProgramError(f"arena base address {self.base:#x} is not 64-byte aligned")
        self._views: dict[int, Any] = {}
        self._grad_runs: list | None = None     # nonfinite's views, made on first use
        # engines with their own memory (port.lower.memories): one arena each, the engine's own buffer
        self.own: dict[str, Any] = {}
        for m, nbytes in program.memories:
            if m != "opencl":
                raise ProgramError(f"the program gives engine {m!r} its own memory; the executor has own arenas for "
                                   f"the opencl engine only")
            from port.exec.backends.opencl import engine
            self.own[m] = engine().device_arena(nbytes)
        # paged tensors' backing store: a spill file on the device's storage (port.exec.spill), created only
        # when the program pages; spill_dir: the device config's storage.path (default $PORT_SPILL_DIR/tmp)
        self.spill = None
        self._staging = None
        pages = {int(c.attr("key")): program.slot(c.inputs[0]).nbytes for c in program.calls
                 if c.backend == "host" and c.kernel == "page_out"}
        if pages:
            from port.exec.spill import SpillFile
            self.spill = SpillFile(pages, spill_dir, drop_cache=drop_cache)
        from port.exec import registry
        ctx = BindContext(self)
        self.main: list[Callable[[], None]] = []
        self.updates: list[Callable[[], None]] = []
        self.main_calls: list = []
        self.update_calls: list = []
        self.bound: list = []          # per call index: the registry's callable (port.exec.registry.bind)
        self.entries: list[str] = []   # per call index: its kernel entry point
        for c in program.calls:
            if c.backend == "host":
                fn = self._bind_host(c)
            else:
                fn = registry.bind(c, ctx)
            self.entries.append(getattr(fn, "entry", c.kernel))
            self.bound.append(fn)
            z = c.attr("zero_outputs")
            if z and c.backend in self.own:
                fn = _zero_own(ctx, c.backend, z, fn)
            elif z:
                fn = _zero_first([self.view(t) for t in z], fn)
            # a late update, or a page call of a paged optimizer state around one (lowering marks it "late")
            late_update = (c.phase == PHASE_UPDATE and not c.attr("early")) or bool(c.attr("late"))
            (self.updates if late_update else self.main).append(fn)
            (self.update_calls if late_update else self.main_calls).append(c)
        # asynchronous engines (opencl): waited for at hand-offs, before host-side calls whose bytes a queued
        # call still uses, and at the end of each pass; other host calls overlap the queue (port.exec.handoff)
        from port.exec import handoff as H
        self.queued = sorted(program_backends(program) & set(H.QUEUED))
        if self.queued:
            self.main = _then(H.drain_before(self.main_calls, self.main, program), H.finish_all(self.main_calls))
            self.updates = _then(H.drain_before(self.update_calls, self.updates, program), H.finish_all(self.update_calls))
        self._zero = [arena[o:o + n] for o, n in program.zero_ranges]
        # a CUDA arena's main pass (forward, loss, backward, recomputes) replays as one CUDA graph: every
        # tensor is a fixed view of the arena, so the launches of a pass are the same every step
        why = graph_refusal(program, self.main_calls) if arena.device.type == "cuda" else "not a CUDA arena"
        self.graph_note = why or ""
        self._graph = self._graph_updates = None
        if why is None:
            self._graph = _CudaGraphPass(lambda: update_key(self.main_calls, self.state))
            if self.update_calls:
                self._graph_updates = _CudaGraphPass(lambda: update_key(self.update_calls, self.state))
        # CPU arenas: zero gradient ranges with memset, not torch's zero_() (which wakes the intra-op thread
        # pool every step: ~7 ms per step on a loaded 2-core machine for a 57 KB range)
        self._memset = None
        if arena.device.type == "cpu":
            import ctypes
            self._memset = [(self.base + o, n) for o, n in program.zero_ranges]
            self._c_memset = ctypes.memset
        self.input = self.view(program.input_id)
        self.extra_inputs = [self.view(t) for t in program.extra_input_ids]   # (an attention mask ...)
        self.labels = self.view(program.label_id) if program.label_id >= 0 else None
        self.loss = self.view(program.loss_id) if program.loss_id >= 0 else None
        self.logits = self.view(program.logits_id)
        if program.has_slot(GRAD_SCALE_ID):
            self.view(GRAD_SCALE_ID).fill_(1.0)
        # classes the loss kernels accept: labels are checked before the first call of every pass (a bad
        # label found by the C loss kernel mid-step would leave running statistics already updated)
        loss_calls = [c for c in program.calls
                      if c.kernel in ("cross_entropy", "cross_entropy.grad_input") and len(c.inputs) > 1
                      and c.inputs[1] == program.label_id]
        ks = {program.slot(c.inputs[0]).shape[-1] for c in loss_calls}
        self.num_classes = min(ks) if ks else None
        ign = {c.attr("ignore_index") for c in loss_calls}
        self.ignore_index = ign.pop() if len(ign) == 1 else None   # token-level loss: this label is skipped

    def check_labels(self, labels=None) -> None:
        """Raise LabelError (naming the value, its index and num_classes) unless every label is a class index
        in [0, num_classes). ``labels``: a batch to check before copying it in (default: the label slot)."""
        y = self.labels if labels is None else labels
        K = self.num_classes
        if y is None or K is None:
            return
        if self.ignore_index is not None:
            y = y.masked_fill(y == self.ignore_index, 0)
        lo, hi = (int(v) for v in y.aminmax())
        if lo < 0 or hi >= K:
            bad = ((y < 0) | (y >= K)).reshape(-1).nonzero()
            i = int(bad[0])
            ign = f" (or {self.ignore_index}: ignored)" if self.ignore_index is not None else ""
            raise LabelError(f"labels y: label {int(y.reshape(-1)[i])} at index {i} of the batch is not a class "
                             f"index: expected 0 <= label < num_classes = {K}{ign}")

    def nonfinite(self, loss: float) -> bool:
        """Whether a pass's ``loss`` or any gradient the late updates read is not finite: the check Trainer.step
        runs after every pass, before the updates (port.cost.measure's untimed step runs it too, so the profile's
        step overhead holds it: hf.llama_lm_mask's 0.4 ms step spends ~0.01 ms in it)."""
        import math
        if not math.isfinite(loss):
            return True
        if self._grad_runs is None:
            self._grad_runs = grad_runs(self.program, self.arena, self.update_calls)
        if not self._grad_runs:
            return False
        import torch
        return not math.isfinite(float(torch.stack([g.sum() for g in self._grad_runs]).sum()))

    def view(self, tid: int):
        v = self._views.get(tid)
        if v is None:
            s = self.program.slot(tid)
            v = self.arena[s.offset:s.offset + s.nbytes].view(torch_dtype(s.dtype)).view(s.shape)
            self._views[tid] = v
        return v

    def set_grad_scale(self, value: float) -> None:
        self.view(GRAD_SCALE_ID).fill_(value)

    def zero_grads(self) -> None:
        if self._memset is not None:
            ms = self._c_memset
            for addr, n in self._memset:
                ms(addr, 0, n)
            return
        for z in self._zero:
            z.zero_()

    @property
    def cuda_graph(self) -> str:
        """How the main pass runs on a CUDA arena: "replayed" (one CUDA graph), "eager (warming up)", or why it
        runs eagerly (the refusal, the capture error, per-step scalars). The late updates replay as a second
        graph under the same rules (``update_graph``)."""
        if self._graph is None:
            return f"eager: {self.graph_note}"
        return self._graph.status()

    def run_main(self) -> None:
        if self.num_classes is not None:
            self.check_labels()
        if self._graph is not None:
            self._graph.run(self.main)
            return
        for f in self.main:
            f()

    @property
    def update_graph(self) -> str:
        """How the late updates run on a CUDA arena (see ``cuda_graph``)."""
        if self._graph_updates is None:
            return f"eager: {self.graph_note or 'no late updates'}"
        return self._graph_updates.status()

    def run_updates(self) -> None:
        if self._graph_updates is not None:
            self._graph_updates.run(self.updates)
            return
        for f in self.updates:
            f()

    def _bind_host(self, call) -> Callable[[], None]:
        """page_out: write the tensor's arena bytes to the spill file (synchronously: the slot may be reused
        by the next call); page_in: read them back into the new version's slot. CPU arenas are written and
        read in place (a numpy view of the slot: no copy of the tensor is allocated); a CUDA arena goes
        through one host staging buffer."""
        if call.kernel == "handoff" and call.attr("copy"):
            from port.exec.handoff import bind_copy
            return bind_copy(call, BindContext(self))
        if call.kernel in ("handoff", "join"):
            from port.exec.handoff import bind_handoff
            return bind_handoff(call)
        key = int(call.attr("key"))
        if call.kernel not in ("page_out", "page_in"):
            raise ProgramError(f"call {call.index} ({call.name}): unknown host kernel {call.kernel!r}")
        tid = call.inputs[0] if call.kernel == "page_out" else call.outputs[0]
        s = self.program.slot(tid)
        raw = self.arena[s.offset:s.offset + s.nbytes]
        spill = self.spill
        if spill is None or key not in spill.layout:
            raise ProgramError(f"call {call.index} ({call.name}): pages key {key}, which no page_out saves")
        if self.arena.device.type == "cpu":
            mv = memoryview(raw.numpy())
            if call.kernel == "page_out":
                return lambda: spill.write(key, mv)
            return lambda: spill.read(key, mv)
        import torch
        need = max(n for _o, n in spill.layout.values())
        if self._staging is None or self._staging.numel() < need:
            self._staging = torch.empty(need, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        stage = self._staging[:s.nbytes]
        smv = memoryview(stage.numpy())

        def out():
            stage.copy_(raw)
            spill.write(key, smv)

        def inn():
            spill.read(key, smv)
            raw.copy_(stage)
        return out if call.kernel == "page_out" else inn

    def close(self) -> None:
        """Close (and so delete) the spill file; safe to call twice. Also run when the executor is collected."""
        if self.spill is not None:
            self.spill.close()

    def own_slots(self, n_tensors: int, roles) -> list:
        """The arena slots of a graph's own tensors (ids below ``n_tensors``: not a re-run's or a page-in's version,
        not a view) of ``roles``: what the Trainer and the whole-step engine name as the model's state."""
        roles = set(roles)
        return [s for s in self.program.slots if 0 <= s.tensor < n_tensors and s.role in roles and s.root == s.tensor]

    def stored_state_keys(self) -> tuple[int, ...]:
        """The page keys of the program's paged optimizer state (page calls marked ``state``): it lives in the
        spill file between steps (zero, as a fresh state, until written)."""
        return tuple(sorted({int(c.attr("key")) for c in self.program.calls
                             if c.backend == "host" and c.kernel == "page_out" and c.attr("state")}))

    def read_page(self, key: int):
        """A copy of the bytes stored under page ``key`` (a tensor of the paged slot's dtype, flat, on the
        arena's device)."""
        import torch
        c = next(c for c in self.program.calls if c.kernel == "page_out" and int(c.attr("key")) == key)
        s = self.program.slot(c.inputs[0])
        buf = torch.empty(s.nbytes, dtype=torch.uint8)
        self.spill.read(key, memoryview(buf.numpy()))
        return buf.view(torch_dtype(s.dtype)).to(self.arena.device)

    def write_page(self, key: int, value) -> None:
        """Store ``value`` (a tensor with the paged slot's element count and dtype) under page ``key``."""
        c = next(c for c in self.program.calls if c.kernel == "page_out" and int(c.attr("key")) == key)
        s = self.program.slot(c.inputs[0])
        buf = value.detach().to("cpu", torch_dtype(s.dtype)).contiguous().reshape(-1).view(-1)
        import torch
        raw = buf.view(torch.uint8)
        if raw.numel() != s.nbytes:
            raise ProgramError(f"page key {key}: {raw.numel()} B given, the slot holds {s.nbytes} B")
        self.spill.write(key, memoryview(raw.numpy()))

    def spill_counters(self) -> dict:
        """Bytes/calls written to and read from the spill file ({} when the program does not page)."""
        return self.spill.counters() if self.spill is not None else {}

    def run(self, timing: bool = False, updates: bool = True) -> dict | None:
        """One pass over the program: the main calls (forward, loss, backward with recomputes, page calls
        and early updates) then, when ``updates``, the late optimizer updates. The caller writes the input
        and labels first and zeroes the gradients (``zero_grads``).

        timing=False: returns None (no overhead). timing=True: runs every call with a wall-clock timer
        (``torch.cuda.synchronize`` around calls on CUDA) and returns

          {"calls": [{"index", "name", "kernel", "op", "phase", "backend", "variant", "recompute": bool,
                      "ms": float, "live_bytes": int}, ...],     # executed order
           "total_ms": float,                                    # sum of the call times
           "by_phase_ms": {phase: ms},                           # forward/loss/backward/recompute/page/update
           "timeline": [int, ...],     # bytes in use at each call: persistent + live scratch + workspace
           "peak_bytes": int, "arena_bytes": int, "persistent_bytes": int}

        The memory timeline is the arena accounting (Program.live_timeline): exact for everything the
        program places; torch-backend kernels' internal temporaries (outside the arena) are not in it."""
        if not timing:
            self.run_main()
            if updates:
                self.run_updates()
            return None
        import time
        import torch
        self.check_labels()
        sync = torch.cuda.synchronize if self.arena.device.type == "cuda" else (lambda: None)
        if self.queued:        # each call's time includes its queued kernels
            from port.exec.handoff import finish_all
            sync = finish_all(self.program.calls)
        pairs = list(zip(self.main_calls, self.main))
        if updates:
            pairs += list(zip(self.update_calls, self.updates))
        P = self.program.persistent_bytes
        tl = self.program.live_timeline
        rows = []
        clock = time.perf_counter
        from port.train.memwatch import rss_bytes   # the process's resident memory after each call (~5 us read)
        sync()
        for c, f in pairs:
            t0 = clock()
            f()
            sync()
            ms = (clock() - t0) * 1e3
            live = P + (tl[c.index] if c.index < len(tl) else 0)
            rows.append({"index": c.index, "name": c.name, "kernel": c.kernel, "op": c.op, "phase": c.phase,
                         "backend": c.backend, "variant": c.variant, "recompute": c.phase == "recompute",
                         "ms": ms, "live_bytes": int(live), "rss_bytes": rss_bytes()})
        by_phase: dict[str, float] = {}
        for r in rows:
            by_phase[r["phase"]] = by_phase.get(r["phase"], 0.0) + r["ms"]
        timeline = [r["live_bytes"] for r in rows]
        return {"calls": rows, "total_ms": sum(r["ms"] for r in rows), "by_phase_ms": by_phase,
                "timeline": timeline, "rss_timeline": [r["rss_bytes"] for r in rows], "peak_bytes": max(timeline) if timeline else P,
                "arena_bytes": self.program.arena_bytes, "persistent_bytes": P}


def _then(fns: list, last) -> list:
    """``fns`` with ``last`` run after the final one."""
    if not fns:
        return fns
    f = fns[-1]

    def run():
        f()
        last()
    return fns[:-1] + [run]


def _zero_own(ctx, memory: str, tids, fn):
    """``_zero_first`` in an engine's own arena (opencl: a fill on its queue, before the call's kernels)."""
    from port.exec.backends.opencl import engine
    e, dev = engine(), ctx.own_arena(memory)
    regions = [(ctx.own_offset(memory, t), ctx.ex.program.slot(t).nbytes) for t in tids]

    def run():
        for off, nb in regions:
            e.zero(dev, off, nb)
        fn()
    return run


def _zero_first(bufs, fn):
    """Gradients of early-updated parameters live in scratch: zero them right before the first (accumulating)
    weight-gradient kernel writes them."""
    def run():
        for b in bufs:
            b.zero_()
        fn()
    return run
