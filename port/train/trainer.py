"""port.Trainer: train a torch.nn.Module on PORT's executor (C kernels by default) with a static arena.

    trainer = port.Trainer(model, example_input, optimizer=port.optim.SGD(0.05, momentum=0.9))
    for x, y in loader:
        loss = trainer.step(x, y)
    trainer.evaluate(test_loader); trainer.save_checkpoint("ckpt.port"); model = trainer.to_torch()

Micro-batching (``micro_batch=k`` samples): a batch of B runs as B/k micro-batches through the same program
(traced at batch k); weight-gradient kernels accumulate, and the loss gradient is scaled by k/B, so the update
equals full-batch training exactly (up to float rounding) when no batch norm runs in training mode.
With training-mode batch norm the statistics (and the running-stat updates) are per micro-batch, as in
PyTorch gradient accumulation: the result then differs from full-batch training.
"""
from __future__ import annotations

import mmap
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from port.errors import ArgumentError, NonFiniteError, PlanError, PortError
from port.exec import capi
from port.exec.executor import Executor, RunState
from port.lower.lower import default_plan, inference_job, inference_program, lower
from port.train.optim import SGD, AdamW
from port.lower.program import Program
from port.ir.types import ROLE_BUFFER, ROLE_OPTIMIZER_STATE, ROLE_PARAMETER
from port.plan.types import Plan
from port.ir.tokens import check_tokens, token_bounds
from port.ir.fold import is_folded, model_constants
from port.train.memwatch import release_freed_heap


class Trainer:
    def __init__(self, model: Any, example_input: Any, plan: Plan | str | Path | None = None,
                 optimizer: SGD | AdamW | None = None, micro_batch: int | None = None,
                 trainable: Sequence[str] | str | None = None, backend: str = "c", seed: int = 0,
                 strategy: str = "auto", allow_plan_mismatch: bool = False, on_nonfinite: str = "stop",
                 accelerators: dict[str, str] | None = None, spill_dir: str | Path | None = None,
                 drop_cache: bool = False, engine: str = "auto", threads: int | str | None = "auto",
                 own_memory: Sequence[str] | None = None):
        """``plan``: a Plan or plan file solved for this trainer's graph: the model traced at the batch one
        program run processes (``micro_batch`` when set, else the example's batch) with this optimizer and
        trainable set. A plan of another graph is refused (PortError naming both batch sizes when the batch is
        what differs) unless ``allow_plan_mismatch=True``, which runs its decisions anyway (its predicted
        memory then does not apply).

        ``on_nonfinite``: a step whose loss or gradients are not finite (diverged, e.g. a too-large lr):
        "stop" raises port.errors.NonFiniteError (step, loss, fix) before the update, so the weights stay those
        of the last good step; "skip" leaves the update out (counted in ``skipped_steps``) and goes on.
        ``accelerators``: {plan accelerator id: backend} for ids the executor does not know (e.g. the modeled
        engines of a device description, run here on a stand-in backend such as "c").
        ``spill_dir``/``drop_cache``: where a plan's paged tensors go (a device's ``storage.path``; default
        $PORT_SPILL_DIR, else the temp directory) and whether each write is flushed and dropped from the page
        cache (port.exec.spill).
        ``own_memory``: backends with their own memory (a device YAML's ``memory: own`` engines,
        port.config.own_memory_backends): they get their own arena and copy hand-offs (port.lower.memories).
        None (default): what the plan says (Plan.own_memory, from the profile it was solved on).
        ``engine``: how a training step runs. "rt": the whole step in C (port.exec.rtengine: port-rt's runtime on
        this arena, one C call for the pass and one for the updates); "python": one ctypes call per kernel call
        (port.exec.executor). "auto" (default): "rt" when every op of the plan runs on the C kernels, on the
        CPU, without micro-batching. Both run the same calls and give the same bits; ``profile_step``,
        ``evaluate`` and ``predict`` always use the per-call executor.
        ``threads``: the kernels' thread count (port.exec.capi.set_num_threads: 1 to max(64, 4 x the machine's
        CPUs), capi.max_threads()). "auto" (default): ``step``
        picks it from its own step times (port.exec.threads.ThreadGovernor, up to the count set now): fewer
        threads while another process keeps cores busy (a 2-thread step then waits at every barrier for a
        descheduled worker), all of them again when it stops; ``thread_events`` lists its decisions. The C
        kernels give the same bits at any thread count, so a governed run is bitwise the run of a fixed count.
        An int: that many, fixed; None: as set now, fixed."""
        import torch
        from port.ir.trace import trace_many
        from port.train.memwatch import rss_bytes
        self.rss = {"before_bytes": rss_bytes()}   # the process's resident memory before / after set-up
        self._governor = None
        self.set_threads(threads)
        if on_nonfinite not in ("stop", "skip"):
            raise ArgumentError(f"on_nonfinite={on_nonfinite!r}: expected 'stop' or 'skip'")
        self.on_nonfinite = on_nonfinite
        self.skipped_steps = 0
        # the arguments checked before any work (tracing, lowering, the arena)
        _check_args(model, optimizer, plan, micro_batch, engine, backend)
        import torch
        # several inputs (a tuple of positional tensors or a dict of keyword tensors, e.g. input_ids and
        # attention_mask): the first is the main input, the rest ride along in every batch the same way
        self.extra_names: tuple[str, ...] = ()
        extra: dict = {}
        if isinstance(example_input, (tuple, dict)):
            from port.ir.trace import example_inputs
            named = example_inputs(example_input)
            self._input_kind = "dict" if isinstance(example_input, dict) else "tuple"
            self.extra_names = tuple(k for k, _ in named[1:])
            extra = {k: _as_tensor(v, k) for k, v in named[1:]}
            self._main_name = named[0][0]
            example_input = named[0][1]
        example_input = _as_tensor(example_input, "example_input")
        if example_input.dim() < 2 or example_input.shape[0] < 1:
            raise PortError(f"example_input must be a batch [B, *sample shape] with B >= 1, got shape "
                            f"{list(example_input.shape)}")
        if not (example_input.is_floating_point() or example_input.dtype == torch.int64):
            raise PortError(f"example_input must be a floating-point tensor (or int64 token ids), got dtype "
                            f"{example_input.dtype}")
        self.tokens = example_input.dtype == torch.int64     # a sequence model fed token ids
        self.model = model
        self.opt = optimizer if optimizer is not None else SGD(0.01)
        self.backend = backend
        B = int(example_input.shape[0])
        mb = int(micro_batch) if micro_batch is not None else B
        if mb < 1 or B % mb:
            raise ArgumentError(f"micro_batch={micro_batch}: expected a positive divisor of the batch size {B} "
                                f"(the example's first dimension), or None")
        self.batch_size, self.micro_batch = B, mb
        self.example_shape = tuple(example_input.shape[1:])
        ex_in = example_input[:mb].detach().contiguous()
        ex_in = ex_in if self.tokens else ex_in.float()
        # token ids valid for this model (a random float batch stands in for any other input, e.g. in export)
        self.example_tokens = ex_in.clone() if self.tokens else None
        self.extra_shapes = {k: (tuple(v.shape[1:]), v.dtype) for k, v in extra.items()}
        ex_all = self._pack(ex_in, {k: v[:mb].detach().contiguous() for k, v in extra.items()})
        # the training graph and the inference graph (eval mode: BN running stats, no dropout), one capture
        self.graph, self.eval_graph = trace_many([
            dict(model=model, example_input=ex_all, trainable=trainable, optimizer=self.opt.graph_name),
            inference_job(model, ex_all)])
        self.label_shape = tuple(self.graph.tensors[self.graph.label_id].shape[1:])   # () or (T,) for tokens
        # the embeddings that look up an input's ids: every batch's ids are checked against them (trace checked
        # the example's)
        self._token_bounds = token_bounds(self.graph)
        plan_batch = None          # the batch a plan file says it was solved for (port.pipeline writes it)
        plan_path = None
        if isinstance(plan, (str, Path)):
            from port.plan.io import load_plan
            plan_path = Path(plan)
            plan = load_plan(plan_path)
            plan_batch = _plan_file_batch(plan_path)
        if plan is not None and plan.batch_size:
            plan_batch = plan.batch_size
        if plan is not None and plan.early_updates and mb != B:
            raise PortError(f"micro_batch={mb} (batch {B}) cannot run a plan with early updates "
                            f"({len(plan.early_updates)} of them): micro-batches accumulate gradients over the "
                            f"batch, an early update applies each gradient as soon as one micro-batch completes "
                            f"it. Re-solve with allow_early_updates=False or drop micro_batch.")
        self.plan = plan if plan is not None else default_plan(self.graph, backend)
        check_digest = True
        if plan is not None and plan.graph_digest and plan.graph_digest != self.graph.digest():
            why = self._mismatch(model, example_input, trainable, plan, plan_batch)
            if not allow_plan_mismatch:
                raise PortError(why + "; pass allow_plan_mismatch=True to run its decisions anyway (its predicted "
                                "memory does not apply then)")
            import warnings
            warnings.warn(why + "; running its decisions anyway (allow_plan_mismatch=True): its predicted memory "
                          "does not apply", stacklevel=2)
            check_digest = False
        # micro-batches add their gradients up: every gradient zeroed before the step and accumulated
        try:
            self.program: Program = lower(self.graph, self.plan, strategy=strategy, check_digest=check_digest,
                                          accelerators=accelerators, overwrite_gradients=mb == B,
                                          own_memory=own_memory)
        except PlanError as e:    # a plan file's decision lowering refuses: name the file (an edited plan)
            if plan_path is None:
                raise
            raise PlanError(f"{plan_path}: {e}; re-solve it (port solve) or fix that decision") from None
        # inference program on the same arena: forward only, eval-mode BN, no dropout
        # the arena's memory follows the program (a plan solved for a GPU runs there whatever ``backend`` says)
        from port.exec.executor import program_device
        dev = program_device(self.program, default="cuda" if backend == "torch-cuda" else "cpu")
        # (within the training arena where its variants allow: port.lower.lower.inference_program)
        self.eval_program: Program = inference_program(self.eval_graph, self.program,
                                                       "torch-cuda" if dev == "cuda" else backend, strategy)
        size = max(self.program.arena_bytes, self.eval_program.arena_bytes)
        # tracing's and lowering's freed temporaries back to the OS before the arena's pages are touched: glibc
        # keeps them resident otherwise, under the arena, and the set-up's peak is the process's peak (a full
        # garbage collection first, ~0.1 s with torch loaded: the traced fx graphs hold reference cycles)
        release_freed_heap()
        # CPU: the arena is an anonymous mapping of its own (zero pages, made resident only when first written):
        # _load_module moves the weights in one tensor at a time (freeing the module's copy as it goes), so
        # set-up never holds the weights twice, and the rest (optimizer state, gradients, activations) becomes
        # resident in the first step, after set-up's temporaries are freed -- not beside them.  (Zeroing it here
        # made set-up the process's peak: bert_tiny LoRA batch 8, smallest-peak plan, 10.7 MiB of VmHWM growth
        # against 9.4 steady.)  An anonymous mapping is zero-filled by the kernel; an allocator's block may not be.
        if dev == "cpu":
            self._arena_map = mmap.mmap(-1, max(size, 1))
            self.arena = torch.frombuffer(self._arena_map, dtype=torch.uint8)[:size]
        else:
            self.arena = torch.zeros(size, dtype=torch.uint8, device=dev)
        self.state = RunState(opt=self.opt, seed=int(seed))
        self.executor = Executor(self.program, self.state, arena=self.arena,
                                 spill_dir=str(spill_dir) if spill_dir is not None else None,
                                 drop_cache=bool(drop_cache))
        self.eval_executor = Executor(self.eval_program, self.state, arena=self.arena)
        self.executor.set_grad_scale(mb / B)
        self._bn_batches = 0        # training forward passes (BN num_batches_tracked)
        self._load_module(model, bind=True)
        release_freed_heap()     # the module's own weight copies, freed as they moved into the arena
        from port.exec import rtengine
        why = rtengine.eligible(self)
        if engine == "rt" and why:
            raise PortError(f"engine='rt' cannot run this trainer: {why}. Fix: engine='python' (or 'auto')")
        self._rt = rtengine.RtEngine(self) if engine != "python" and not why else None
        self.engine = "rt" if self._rt is not None else "python"
        release_freed_heap()     # set-up's freed temporaries: glibc keeps small allocations' pages otherwise
        self.rss["after_setup_bytes"] = rss_bytes()
        self.closed = False
        for m in model.modules():          # this trainer's arena holds the module's weights now (see _check_args)
            _OWNERS[m] = weakref.ref(self)


    def set_threads(self, threads: int | str | None) -> None:
        """The kernels' thread count from the next step on: an int, "auto" (governed by the step times, up to
        the count set now, or the governor's own maximum when one runs) or None (keep the current setting; a
        governor stops). See __init__."""
        if threads is not None and threads != "auto" and (isinstance(threads, bool) or not isinstance(threads, int)
                                                            or threads < 1):
            raise ArgumentError(f"threads={threads!r}: expected a thread count >= 1, 'auto' or None (keep the "
                            f"current setting, {capi.get_num_threads()})")
        if threads is not None and threads != "auto":
            capi.check_thread_count(threads, "threads")     # at most capi.max_threads(): max(64, 4 x the CPUs)
        top = self._governor.candidates[0] if self._governor is not None else capi.get_num_threads()
        if threads == "auto":
            from port.exec.threads import ThreadGovernor
            self._governor = ThreadGovernor(top)
            capi.set_num_threads(top)
            return
        self._governor = None
        if threads is not None:
            capi.set_num_threads(threads)

    @property
    def threads(self) -> int:
        """The thread count steps run with: the governor's settled count under threads="auto" (a probe's
        count only for the step that probes), else the kernels' current setting."""
        return self._governor.home if self._governor is not None else capi.get_num_threads()

    @property
    def thread_events(self) -> list:
        """The thread governor's decisions (port.exec.threads.GovernorEvent; empty unless threads="auto")."""
        return list(self._governor.events) if self._governor is not None else []

    def _mismatch(self, model: Any, example_input: Any, trainable: Any, plan: Plan, plan_batch: int | None) -> str:
        """Why ``plan`` does not belong to this trainer's graph, naming both batch sizes when they differ."""
        from port.ir.trace import trace
        B, mb = self.batch_size, self.micro_batch
        mine = (f"this trainer's program runs batch {mb}" + (f" (micro-batches of the batch {B})" if mb != B else "")
                + f", graph digest {self.graph.digest()[:12]}...")
        if plan_batch is None and mb != B:
            full = trace(model, example_input[:B].detach().float().contiguous(), trainable=trainable,
                         optimizer=self.opt.graph_name)
            if full.digest() == plan.graph_digest:
                plan_batch = B
        if plan_batch is not None and plan_batch != mb:
            fix = (f"solve the plan for batch {mb} (port train does so when train.micro_batch is set)" if mb != B
                   else f"solve the plan for batch {mb}")
            return (f"the plan was solved for batch {plan_batch}, but {mine}: {fix}")
        return (f"the plan was solved for another graph (digest {plan.graph_digest[:12]}...: another model, batch "
                f"size, optimizer or trainable set); {mine}: solve the plan for this graph")

    # -- properties ---------------------------------------------------------------------------
    @property
    def arena_bytes(self) -> int:
        return int(self.arena.numel())

    @property
    def step_count(self) -> int:
        return self.state.step

    def _named_slots(self, roles: Iterable[str]):
        """The arena slots of the graph's own tensors of ``roles`` (not a re-run's or a page-in's version), and,
        for optimizer state, the plan's paged optimizer state (StoredState: it lives in the spill file)."""
        roles = set(roles)
        out: list = self.executor.own_slots(len(self.graph.tensors), roles)
        if ROLE_OPTIMIZER_STATE in roles:
            T = self.graph.tensors
            out += [StoredState(T[k].name, tuple(T[k].shape), T[k].dtype, T[k].role, k)
                    for k in self.executor.stored_state_keys()]
        return out

    def _view(self, slot):
        """The tensor of a slot: a view of the arena; a paged optimizer state's value read from storage (a
        copy: write it back with _write)."""
        if isinstance(slot, StoredState):
            return self.executor.read_page(slot.key).view(slot.shape)
        return self.executor.view(slot.tensor)

    def _write(self, slot, value: Any) -> None:
        """Set a slot's tensor to ``value`` (a paged optimizer state: in storage)."""
        if isinstance(slot, StoredState):
            self.executor.write_page(slot.key, value)
        else:
            self.executor.view(slot.tensor).copy_(value)

    def _load_module(self, model: Any, bind: bool = False) -> None:
        """Copy the module's parameters and buffers into their arena slots; ``bind``: also make each a view of
        its slot (see _bind_module) right after its copy, so its own storage is freed before the next one is
        copied."""
        import torch
        done = set()
        freed = 0
        with torch.no_grad():
            for t, v in self._module_tensors(model):
                v.copy_(t.detach().reshape(v.shape))
                done.add(v.data_ptr())
                if bind and t.device == v.device and t.dtype == v.dtype and t.numel() == v.numel():
                    freed += t.numel() * t.element_size() if t.device.type == "cpu" else 0
                    t.data = v.view(t.shape)
                    if freed >= TRIM_EVERY_BYTES:     # small tensors' storage stays in glibc's heap: hand it back
                        release_freed_heap(collect=False)   # as it goes, or set-up holds the weights twice
                        freed = 0
            rest = [s for s in self._named_slots((ROLE_PARAMETER, ROLE_BUFFER))
                    if self._view(s).data_ptr() not in done]
            folded = dict(self.graph.constants) | dict(self.eval_graph.constants)
            if any(s.name in folded for s in rest):     # constants the capture folded (port.ir.fold): their
                values = model_constants(folded.items(), model)  # recipes run on the model's buffers, once
                for s in [s for s in rest if s.name in values]:
                    self._view(s).copy_(values[s.name].reshape(s.shape))
                rest = [s for s in rest if s.name not in values]
            if rest:
                sd = model.state_dict()     # names the module's attributes do not give (custom state_dict)
                for s in rest:
                    if s.name not in sd:
                        raise PortError(f"the model has no parameter/buffer {s.name!r}")
                    self._view(s).copy_(sd[s.name].detach().reshape(s.shape))
                del sd
        self._base_nbt = {k: int(v) for k, v in model.named_buffers() if k.endswith("num_batches_tracked")}

    def _module_tensors(self, model: Any) -> list:
        """[(parameter or buffer object, its arena view)] for every tensor of ``model`` the program holds (a
        tied parameter, one object under several names, once)."""
        by_name = {s.name: s for s in self._named_slots((ROLE_PARAMETER, ROLE_BUFFER))}
        out, seen = [], set()
        for qn, t in list(model.named_parameters(remove_duplicate=False)) + \
                list(model.named_buffers(remove_duplicate=False)):
            s = by_name.get(qn)
            if s is None or id(t) in seen:
                continue
            seen.add(id(t))
            out.append((t, self._view(s)))
        return out

    def _bind_module(self, model: Any) -> None:
        """(Done by _load_module(bind=True) at construction.) Weights live once: each parameter and buffer of ``model`` the program holds becomes a view of its
        arena slot (``t.data = view``), so the module's own storage is freed and the module always shows the
        trained values (a tied parameter stays one object). Tensors of another device or dtype than the arena
        (e.g. a CPU module trained on a CUDA arena) keep their storage; ``to_torch`` copies into them."""
        for t, v in self._module_tensors(model):
            if t.device == v.device and t.dtype == v.dtype and t.numel() == v.numel():
                t.data = v.view(t.shape)

    # -- training -----------------------------------------------------------------------------
    def _pack(self, x: Any, extra: dict) -> Any:
        """The model's call input from the main tensor and the others (as the example was given)."""
        if not self.extra_names:
            return x
        if self._input_kind == "dict":
            return {self._main_name: x} | {k: extra[k] for k in self.extra_names}
        return (x,) + tuple(extra[k] for k in self.extra_names)

    def _unpack(self, x: Any, what: str, batch: int | None) -> tuple[Any, list]:
        """(main tensor, [the other inputs in graph order]) of a batch given like the example (tuple or dict)."""
        if not self.extra_names:
            return x, []
        from port.ir.trace import example_inputs
        try:
            named = dict(example_inputs(tuple(x) if isinstance(x, list) else x))
        except PortError as e:
            raise PortError(f"{what}(): {e}") from None
        names = (self._main_name,) + self.extra_names
        if set(named) != set(names) if self._input_kind == "dict" else len(named) != len(names):
            raise PortError(f"{what}() expects the inputs {list(names)} (as the example input), got {list(named)}")
        vals = list(named.values()) if self._input_kind == "tuple" else [named[k] for k in names]
        out = []
        for k, v in zip(self.extra_names, vals[1:]):
            v = _as_tensor(v, k)
            shp, dt = self.extra_shapes[k]
            if tuple(v.shape[1:]) != shp or (batch is not None and v.shape[0] != batch):
                raise PortError(f"{what}() expects input {k!r} of shape {[batch or 'M', *shp]}, got {list(v.shape)}")
            out.append(v.to(dt))
        return vals[0], out

    def input_tensors(self, x: Any) -> list:
        """A batch given like the example input (a tensor, tuple or dict) as its tensors in the model's input
        order, the main input first: what a port-rt data file holds (``write_data(path, tr.input_tensors(x),
        y, ...)``)."""
        main, extra = self._unpack(x, "input_tensors", None)
        return [_as_tensor(main, "x"), *extra]

    def _check_batch(self, x: Any, y: Any, what: str) -> tuple[Any, Any]:
        """x, y as tensors of the compiled shapes and dtypes (numpy arrays and lists are converted); a named
        PortError with the expected and the given shape/dtype otherwise."""
        import torch
        self._check_open(what)
        B = self.batch_size
        x, self._extra_batch = self._unpack(x, what, B)
        x = _as_tensor(x, "x")
        y = _as_tensor(y, "y")
        if x.dim() < 1 or x.shape[0] != B or tuple(x.shape[1:]) != self.example_shape:
            raise ArgumentError(f"{what}() expects x of shape {[B, *self.example_shape]}, got {list(x.shape)} (the "
                                f"example input's shape: the program is compiled for batch {B}" + (
                                    f" and sequence length {self.example_shape[0]}" if self.tokens else "") + ")")
        self._check_x(x, what)
        want = (B,) + self.label_shape
        if tuple(y.shape) != want:
            raise PortError(f"{what}() expects labels y of shape {list(want)} (" + (
                "one class index per sample" if not self.label_shape else
                f"one token id per position, {self.executor.ignore_index} = ignored") + f"), got {list(y.shape)}")
        if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
            raise PortError(f"{what}() expects labels y of an integer dtype (int64 class indices), got {y.dtype}; "
                            f"convert with y.long() if they are whole numbers")
        return x, y

    def _check_x(self, x: Any, what: str, extra: Any = None) -> None:
        """x's dtype (token ids: an integer dtype; else a real number dtype) and every input's token ids
        against the embeddings that look them up (port.ir.tokens)."""
        import torch
        if self.tokens and (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool):
            raise ArgumentError(f"{what}() expects x of token ids of an integer dtype (int64, as the example input), "
                                f"got {x.dtype}. Fix: x.long() if the values are whole numbers")
        if not (x.is_floating_point() or x.dtype in (torch.int8, torch.int16, torch.int32, torch.int64,
                                                     torch.uint8)) or x.is_complex():
            raise ArgumentError(f"{what}() expects x of a real number dtype (float32), got {x.dtype}")
        if self._token_bounds:
            names = ["x"] + [f"x[{k!r}]" for k in self.extra_names]
            check_tokens(self._token_bounds, [x, *(self._extra_batch if extra is None else extra)], names)

    def _nonfinite(self, loss: float) -> bool:
        return self.executor.nonfinite(loss)

    def step(self, x: Any, y: Any) -> float:
        """One optimizer step on the batch (x [B, ...], y [B] int64). Returns the mean loss. A non-finite loss
        or gradient: see ``on_nonfinite``."""
        if self._governor is None:
            return self._step(x, y)
        import time
        t0 = time.perf_counter()
        loss = self._step(x, y)       # a step that raised (bad batch, non-finite stop) is no timing evidence
        n = self._governor.record((time.perf_counter() - t0) * 1e3)
        if n != capi.get_num_threads():
            capi.set_num_threads(n)
        return loss

    def _step(self, x: Any, y: Any) -> float:
        B, mb = self.batch_size, self.micro_batch
        x, y = self._check_batch(x, y, "step")
        ex = self.executor
        ex.check_labels(y)   # the whole batch before any micro-batch runs: a bad label changes no state
        st = self.state
        if self._rt is not None:
            return self._step_rt(x, y)
        ex.zero_grads()
        total = 0.0
        w = self._micro_weights(y)
        for j, i in enumerate(range(0, B, mb)):
            ex.input.copy_(x[i:i + mb])
            for v, e in zip(ex.extra_inputs, self._extra_batch):
                v.copy_(e[i:i + mb])
            ex.labels.copy_(y[i:i + mb])
            if w is not None:
                ex.set_grad_scale(w[j])
            ex.run_main()
            total += float(ex.loss) * (w[j] if w is not None else 1.0)
            st.dropout_counter += 1
            self._bn_batches += 1
        return self._finish_step(total if w is not None else total / (B // mb), ex.run_updates)

    def _micro_weights(self, y: Any) -> list[float] | None:
        """Per-micro-batch weights of a token-level loss with ignored labels (None otherwise): each micro-batch's
        loss is a mean over its own counted tokens, the batch's is the mean over all of them, so micro-batch j
        weighs (its counted tokens) / (the batch's) in both the loss and the gradient (its loss-gradient scale),
        as one pass over the whole batch would."""
        ign, B, mb = self.executor.ignore_index, self.batch_size, self.micro_batch
        if ign is None or mb == B:
            return None
        counts = [int((y[i:i + mb] != ign).sum()) for i in range(0, B, mb)]
        n = sum(counts)
        return [c / n if n else 0.0 for c in counts]

    def _finish_step(self, loss: float, updates) -> float:
        """After the pass: stop or skip on a non-finite loss or gradient, else run the updates."""
        st = self.state
        if self._nonfinite(loss):
            what = f"loss {loss}" if not __import__("math").isfinite(loss) else f"loss {loss:.6g} but a gradient"
            if self.on_nonfinite == "stop":
                raise NonFiniteError(
                    f"step {st.step + 1}: {what} is not finite (NaN or infinity): training diverged; the update "
                    f"was not applied. Fix: lower the learning rate (optimizer.lr, now {self.opt.lr:g}), or skip "
                    f"such steps (train.on_nonfinite: skip, --on-nonfinite skip)", st.step + 1, loss)
            self.skipped_steps += 1
            st.step += 1
            return loss
        updates()
        st.step += 1
        return loss

    def _step_rt(self, x: Any, y: Any) -> float:
        import torch
        xt = torch.int64 if self.tokens else torch.float32
        xs = x if (x.dtype == xt and x.is_contiguous() and x.device.type == "cpu") else x.to("cpu", xt).contiguous()
        ys = y if (y.dtype == torch.int64 and y.is_contiguous() and y.device.type == "cpu") else \
            y.to("cpu", torch.int64).contiguous()
        ex = self.executor
        extra = [e if (e.dtype == v.dtype and e.is_contiguous() and e.device.type == "cpu") else
                 e.to("cpu", v.dtype).contiguous() for v, e in zip(ex.extra_inputs, self._extra_batch)]
        loss = self._rt.forward_backward(xs, ys, extra)
        self.state.dropout_counter += 1
        self._bn_batches += 1
        return self._finish_step(loss, self._rt.update)

    def profile_step(self, x: Any, y: Any, commit: bool = False) -> dict:
        """One optimizer step run with per-call timers. commit=True: a real step (exactly like ``step``: same
        updates, same RNG counters). commit=False (default): the weights, buffers, optimizer state and counters
        are restored afterwards, so measuring does not change training. Returns ``Executor.run(timing=True)``'s dict (per-call wall ms with op names, phases, backends,
        variants and recompute flags; the arena live-bytes timeline; peak) plus ``"loss"`` (float),
        ``"micro_batches"``, ``"step_ms"`` (= total_ms), ``"op_ms"`` ({graph op name or "<name> (recompute)" or
        page-call name: summed ms}; a fused conv call is booked on the conv) and ``"timeline_bytes"`` (= timeline);
        with micro-batching the call rows of every micro-batch are listed in order. ``"rss_timeline_bytes"``: the
        process's resident memory (bytes) after each call (port.train.memwatch.rss_bytes; commit=False: less the
        bytes of the state copy kept for restoring), to set against the arena accounting of ``timeline``.
        With ``threads="auto"`` it runs at the governor's settled count, never at a probe's."""
        g = self._governor
        if g is None or g.home == g.current:
            return self._profile_step(x, y, commit)
        capi.set_num_threads(g.home)
        try:
            return self._profile_step(x, y, commit)
        finally:
            capi.set_num_threads(g.current)

    def _profile_step(self, x: Any, y: Any, commit: bool) -> dict:
        B, mb = self.batch_size, self.micro_batch
        x, y = self._check_batch(x, y, "profile_step")
        ex = self.executor
        ex.check_labels(y)   # the whole batch before any micro-batch runs: a bad label changes no state
        st = self.state
        saved = None
        if not commit:
            saved = (self.arena[:self.program.persistent_bytes].clone(), st.step, st.dropout_counter,
                     self._bn_batches)
        saved_bytes = int(saved[0].numel()) if saved is not None else 0
        ex.zero_grads()
        rows, timeline, rss_tl, total, tot_ms = [], [], [], 0.0, 0.0
        by_phase: dict = {}
        k = B // mb
        w = self._micro_weights(y)
        for j, i in enumerate(range(0, B, mb)):
            ex.input.copy_(x[i:i + mb])
            for v, e in zip(ex.extra_inputs, self._extra_batch):
                v.copy_(e[i:i + mb])
            ex.labels.copy_(y[i:i + mb])
            if w is not None:
                ex.set_grad_scale(w[j])
            r = ex.run(timing=True, updates=(j == k - 1))
            rows += r["calls"]
            timeline += r["timeline"]
            # the process's RSS after each call, less the copy of the state kept to restore it (commit=False)
            rss_tl += [v - saved_bytes for v in r.get("rss_timeline", [])]
            tot_ms += r["total_ms"]
            for ph, v in r["by_phase_ms"].items():
                by_phase[ph] = by_phase.get(ph, 0.0) + v
            total += float(ex.loss) * (w[j] if w is not None else 1.0)
            st.dropout_counter += 1
            self._bn_batches += 1
        st.step += 1
        if saved is not None:
            self.arena[:self.program.persistent_bytes].copy_(saved[0])
            st.step, st.dropout_counter, self._bn_batches = saved[1], saved[2], saved[3]
        op_ms: dict[str, float] = {}
        for r in rows:   # keyed like port.verify.simulate's gantt labels: op name, "<op name> (recompute)"
            if r["op"] < 0:
                key = r["name"]
            else:
                key = self.graph.ops[r["op"]].name + (" (recompute)" if r["recompute"] else "")
            op_ms[key] = op_ms.get(key, 0.0) + r["ms"]
        return {"loss": total if w is not None else total / k, "micro_batches": k, "calls": rows, "total_ms": tot_ms, "step_ms": tot_ms,
                "op_ms": op_ms, "by_phase_ms": by_phase, "timeline": timeline, "timeline_bytes": timeline,
                "rss_timeline_bytes": rss_tl,
                "peak_bytes": max(timeline), "arena_bytes": self.program.arena_bytes,
                "persistent_bytes": self.program.persistent_bytes}

    # -- inference ----------------------------------------------------------------------------
    def predict(self, x: Any):
        """Logits for x [M, ...] (any M) with eval-mode semantics (running BN stats, no dropout)."""
        import torch
        self._check_open("predict")
        x, extra = self._unpack(x, "predict", None)
        x = _as_tensor(x, "x")
        if x.dim() < 1 or tuple(x.shape[1:]) != self.example_shape:
            raise ArgumentError(f"predict() expects x of shape [M, {', '.join(map(str, self.example_shape))}] "
                                f"(any M), got {list(x.shape)}")
        self._check_x(x, "predict", extra)
        ex = self.eval_executor
        n = ex.input.shape[0]
        outs = []
        for i in range(0, x.shape[0], n):
            chunk = x[i:i + n]
            m = chunk.shape[0]
            if m < n:
                ex.input.zero_()
                for v in ex.extra_inputs:
                    v.zero_()
            ex.input[:m].copy_(chunk)
            for v, e in zip(ex.extra_inputs, extra):
                v[:m].copy_(e[i:i + n])
            ex.run_main()
            outs.append(ex.logits[:m].clone())
        return torch.cat(outs) if outs else torch.empty(0)

    def evaluate(self, loader: Iterable) -> dict[str, float]:
        """Mean cross-entropy loss and accuracy over (x, y) batches, eval mode."""
        import torch
        import torch.nn.functional as F
        tot_loss, correct, count = 0.0, 0, 0
        for x, y in loader:
            y = _as_tensor(y, "y")
            if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
                raise ArgumentError(f"evaluate() expects labels y of an integer dtype (int64 class indices), got "
                                    f"{y.dtype}")
            self.executor.check_labels(y)      # before predict runs: a LabelError naming y, not torch's IndexError
            logits = self.predict(x)
            if logits.shape[:y.dim()] != y.shape:
                raise ArgumentError(f"evaluate() expects labels y of shape {list(logits.shape[:-1])} (one per "
                                    f"{'position' if logits.dim() == 3 else 'sample'} of x), got {list(y.shape)}")
            if logits.dim() == 3:        # token-level: every non-ignored position counts
                from port.ir.trace import IGNORE_INDEX
                z, t = logits.reshape(-1, logits.shape[-1]), torch.as_tensor(y).reshape(-1)
                keep = t != IGNORE_INDEX
                tot_loss += float(F.cross_entropy(z, t, ignore_index=IGNORE_INDEX, reduction="sum"))
                correct += int(((z.argmax(1) == t) & keep).sum())
                count += int(keep.sum())
                continue
            tot_loss += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(1) == y).sum())
            count += int(y.shape[0])
        if count == 0:
            return {"loss": float("nan"), "accuracy": float("nan")}
        return {"loss": tot_loss / count, "accuracy": correct / count}

    # -- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Parameters and buffers (BN running stats) as torch tensors (copies), by module state_dict name."""
        return {s.name: self._view(s).clone() for s in self._named_slots((ROLE_PARAMETER, ROLE_BUFFER))
                if not is_folded(s.name)}

    def load_state_dict(self, sd: dict) -> None:
        for s in self._named_slots((ROLE_PARAMETER, ROLE_BUFFER)):
            if s.name in sd:
                self._view(s).copy_(sd[s.name].reshape(s.shape))

    def optimizer_state(self) -> dict:
        return {s.name: self._view(s).clone() for s in self._named_slots((ROLE_OPTIMIZER_STATE,))}

    def to_torch(self, model: Any = None, detach: bool = False):
        """The trained weights and BN running stats in ``model`` (default: the module given to the
        constructor), returned.

        The constructor's module already holds them: its parameters and buffers are views of the trainer's
        arena (weights live once), so they always show the current values and writing them (e.g.
        ``load_state_dict``) changes the trainer's weights. ``detach=True`` gives the module its own copies
        instead (it then outlives the trainer without keeping the arena alive; ``torch.save`` of a view
        writes the whole arena, of a copy only the tensor). Another ``model`` gets the values copied in."""
        import torch
        m = self.model if model is None else model
        if m is self.model and self.closed:
            raise PortError("to_torch(): this Trainer was closed and its module handed back (it holds the trained "
                            "weights as its own tensors); pass model= to copy the weights into another module")
        with torch.no_grad():
            mine = {id(t): v for t, v in self._module_tensors(m)}
            for k, t in list(m.named_parameters(remove_duplicate=False)) + \
                    list(m.named_buffers(remove_duplicate=False)):
                v = mine.get(id(t))
                if v is not None:
                    if detach:
                        t.data = v.detach().reshape(t.shape).to(t.device, t.dtype, copy=True)
                    elif m is self.model and t.device == v.device and t.dtype == v.dtype:
                        if t.data_ptr() != v.data_ptr():
                            t.data = v.view(t.shape)      # (re)bind: e.g. after detach=True
                    else:
                        t.copy_(v.reshape(t.shape))
                elif k.endswith("num_batches_tracked"):
                    t.fill_(self._base_nbt.get(k, 0) + self._bn_batches)
        return m

    def parameter_delta(self, base_state_dict: dict) -> dict:
        """Only the parameters (not buffers) that differ from ``base_state_dict``: {name: current - base}."""
        out = {}
        for s in self._named_slots((ROLE_PARAMETER,)):
            cur = self._view(s)
            base = base_state_dict.get(s.name)
            if base is None:
                out[s.name] = cur.clone()
                continue
            d = cur - base.reshape(cur.shape).to(cur.dtype)
            if bool(d.any()):
                out[s.name] = d
        return out

    def close(self) -> None:
        """Hand the module back: its parameters and buffers become tensors of their own holding the trained
        values (``to_torch(detach=True)``), so another Trainer may train it; this trainer then refuses to
        step, predict or bind a module again (its arena is freed with it)."""
        if self.closed:
            return
        self.to_torch(detach=True)
        for m in self.model.modules():
            ref = _OWNERS.get(m)
            if ref is not None and ref() is self:
                del _OWNERS[m]
        self.closed = True

    def _check_open(self, what: str) -> None:
        if self.closed:
            raise PortError(f"{what}(): this Trainer was closed (close() handed its module back); make a new "
                            f"Trainer to train it again")

    # -- checkpoints and export ---------------------------------------------------------------
    def save_checkpoint(self, path: str | Path, meta: dict | None = None) -> None:
        from port.train.checkpoint import save_trainer
        save_trainer(self, path, meta)

    @classmethod
    def resume(cls, path: str | Path, model: Any, example_input: Any, **kwargs: Any) -> "Trainer":
        """A Trainer for ``model`` restored from a checkpoint: weights, buffers, optimizer state and settings,
        step and dropout RNG state. Continuing reproduces the uninterrupted run bit for bit."""
        from port.train.checkpoint import load_into_trainer, read_header
        from port.train.optim import from_dict
        hdr = read_header(path)
        if "optimizer" not in kwargs and hdr.get("optimizer"):
            kwargs["optimizer"] = from_dict(hdr["optimizer"])
        if "seed" not in kwargs:
            kwargs["seed"] = hdr.get("rng", {}).get("seed", 0)
        t = cls(model, example_input, **kwargs)
        load_into_trainer(t, path)
        return t

    def compile(self, path: str | Path, sign_key: bytes | None = None):
        """Write this trainer (its programs, weights, optimizer state and counters) as a port-rt bundle that the
        `port-rt` binary trains without Python (port.exec.bundle; layout in kernels/include/port_rt.h);
        ``sign_key``: signed with HMAC-SHA-256 (port.exec.bundle.load_key)."""
        from port.exec.bundle import write_bundle
        return write_bundle(self, path, sign_key=sign_key)

    def export(self, path: str | Path, format: str = "onnx") -> Path:
        from port.train.export import export
        return export(self, path, format)

    def memory_report(self) -> dict[str, int]:
        """The arena accounting (arena, persistent, scratch, peak live bytes) and the process's resident memory
        before and after this trainer's set-up (``rss_before_bytes``, ``rss_after_setup_bytes``; the module's
        weights move into the arena, so set-up grows the process by about arena - weights + runtime)."""
        p = self.program
        return {"arena_bytes": self.arena_bytes, "train_arena_bytes": p.arena_bytes,
                "eval_arena_bytes": self.eval_program.arena_bytes, "persistent_bytes": p.persistent_bytes,
                "scratch_bytes": p.scratch_bytes, "peak_live_bytes": p.peak_live_bytes,
                "rss_before_bytes": self.rss["before_bytes"], "rss_after_setup_bytes": self.rss["after_setup_bytes"]}


# module -> weakref to the live Trainer whose arena holds its weights (every submodule too): a second Trainer
# on the same module (or a part or a parent of it) would rebind the same parameters to its own arena
_OWNERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class StoredState:
    """A paged optimizer-state tensor (port.plan.semantics: it lives in storage between its updates), named like
    a slot for Trainer._named_slots: ``key`` is its page key (the graph tensor id)."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str
    key: int
    tensor: int = -1


def _owner(model: Any) -> "Trainer | None":
    """The live, open Trainer that trains ``model`` or one of its submodules or parents, if any."""
    for m in model.modules():
        ref = _OWNERS.get(m)
        t = ref() if ref is not None else None
        if t is not None and not t.closed:
            return t
    return None


def _check_args(model: Any, optimizer: Any, plan: Any, micro_batch: Any, engine: Any, backend: Any) -> None:
    """Trainer's arguments that need no tracing, checked before any: a named ArgumentError otherwise."""
    import torch
    from port.lower.lower import BACKENDS
    if not isinstance(model, torch.nn.Module):
        raise ArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, (SGD, AdamW)):
        raise ArgumentError(f"optimizer must be port.optim.SGD(...) or port.optim.AdamW(...) (or None: SGD(0.01)), "
                            f"got {type(optimizer).__module__}.{type(optimizer).__qualname__}")
    if optimizer is not None:
        optimizer.check()
    if plan is not None and not isinstance(plan, (Plan, str, Path)):
        raise ArgumentError(f"plan must be a port.Plan, a plan file path or None, got {type(plan).__name__}")
    if micro_batch is not None and (isinstance(micro_batch, bool) or not isinstance(micro_batch, int)
                                    or micro_batch < 1):
        raise ArgumentError(f"micro_batch={micro_batch!r}: expected None or a positive int that divides the batch "
                            f"size")
    if engine not in ("auto", "rt", "python"):
        raise ArgumentError(f"engine={engine!r}: expected 'auto', 'rt' or 'python'")
    if backend not in BACKENDS:
        raise ArgumentError(f"backend={backend!r}: expected one of {', '.join(map(repr, BACKENDS))}")
    if _owner(model) is not None:
        import gc
        gc.collect()            # a trainer nobody holds may live on in a reference cycle until collected
    if _owner(model) is not None:
        raise ArgumentError(
            "model: another live Trainer trains this module (or a part of it): its parameters are views of that "
            "trainer's arena, and a second Trainer would rebind the same parameters to its own (each would "
            "silently change the other's module). Fix: pass a copy (Trainer(copy.deepcopy(model), ...)), or "
            "call close() on the first trainer (the module then keeps its trained weights as its own tensors)")


def _as_tensor(v: Any, what: str):
    """torch tensors as they are; numpy arrays and (nested) lists converted; anything else a named error."""
    import torch
    if isinstance(v, torch.Tensor):
        return v
    try:
        import numpy as np
        if isinstance(v, np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(v))
    except ImportError:
        pass
    if isinstance(v, (list, tuple)):
        try:
            return torch.tensor(v)
        except (TypeError, ValueError, RuntimeError) as e:
            raise PortError(f"{what}: cannot make a tensor of the given list ({e})") from None
    raise PortError(f"{what} must be a torch tensor, a numpy array or a list, got {type(v).__name__}")


def _plan_file_batch(path: Path) -> int | None:
    """The batch size a plan file records (written by port.pipeline), or None."""
    import json
    try:
        b = json.loads(path.read_text()).get("batch_size")
    except (OSError, ValueError, AttributeError):
        return None
    return int(b) if isinstance(b, int) else None


TRIM_EVERY_BYTES = 4 << 20     # _load_module: weights freed between two hand-backs of glibc's heap
