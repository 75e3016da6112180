"""Run one graph op for timing exactly as the executor runs it: the calls ``port.exec.registry.op_calls`` gives
for (op, variant, backend), bound by ``port.exec.registry.bind`` on scratch buffers instead of an arena.

    runner = get_runner("c", graph, threads=2)       # any backend of port.exec.registry.BACKENDS
    run = runner.prepare(op, variant="plain")        # buffers with random inputs of the op's shapes
    run()                                            # the op's calls, once (may be asynchronous on CUDA)
    runner.sync()
    run.workspace_bytes, run.entries                 # the calls' workspace (the kernel's query), entry points

In-place variants write their output over their input, as in the arena. A backward op first runs its forward
op once (plain) so that what it reads (pooling indices, batch statistics, probabilities, dropout masks) is
what the forward writes. Nothing here knows how an op maps to a kernel: that is the registry's alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from port.errors import ProfileError
from port.exec import capi, registry
from port.plan import variants as V
from port.ir.types import Graph, Op
from port.lower.program import GRAD_SCALE_ID, Call

SGD_DEFAULTS = dict(lr=0.05, momentum=0.9, weight_decay=0.0)
ADAMW_DEFAULTS = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)


@dataclass
class PreparedOp:
    """A ready-to-run op: ``run()`` executes its calls once on the runner's device."""

    fn: Callable[[], Any]
    op: Op
    variant: str
    backend: str
    workspace_bytes: int = 0
    tensors: tuple = field(default=(), repr=False)   # keeps buffers alive
    calls: tuple = ()                                 # the port.lower.program.Call objects timed
    entries: tuple[str, ...] = ()                     # kernel entry point of each call
    buffers: dict = field(default_factory=dict, repr=False)     # tensor id -> its scratch buffer
    workspaces: dict = field(default_factory=dict, repr=False)  # call index -> its workspace

    def __call__(self) -> Any:
        return self.fn()


class _Scratch:
    """The bind context of port.exec.registry on per-tensor scratch buffers (the executor's is the arena)."""

    def __init__(self, bufs: dict, ws: dict, shapes: dict, state: Any) -> None:
        self.bufs, self.ws, self.shapes, self.state = bufs, ws, shapes, state

    def ptr(self, tid: int | None) -> int | None:
        return None if tid is None else self.bufs[tid].data_ptr()

    def view(self, tid: int):
        return self.bufs[tid]

    def shape(self, tid: int) -> tuple[int, ...]:
        return self.shapes[tid]

    def ws_ptr(self, call) -> int | None:
        return self.ws[call.index].data_ptr() if call.workspace_bytes else None

    def ws_view(self, call):
        return self.ws[call.index]


class Runner:
    """Times ops of ``graph`` on one backend through the op registry."""

    def __init__(self, graph: Graph, backend: str, threads: int | None = None, seed: int = 0,
                 optimizer_kwargs: dict | None = None) -> None:
        import torch
        ok, why = registry.available(backend)
        if not ok:
            raise ProfileError(f"{backend}: {why}")
        self.torch = torch
        self.graph = graph
        self.backend = backend
        self.device = torch.device("cuda" if backend == "torch-cuda" else "cpu")
        if backend == "torch-cpu":     # as the executor runs them (port.exec.executor): timed without re-faults
            from port.train.memwatch import keep_freed_heap
            keep_freed_heap()
        if threads:
            if backend == "c":
                capi.set_num_threads(int(threads))   # kernel OpenMP + BLAS + torch intra-op threads
            else:
                torch.set_num_threads(int(threads))
        self.threads = torch.get_num_threads()
        self.gen = torch.Generator().manual_seed(seed)
        self._shape_constants: dict | None = None     # the graph's folded constants made from shapes alone
        from port.exec.executor import RunState
        from port.train.optim import SGD, AdamW
        kw = dict(optimizer_kwargs or {})
        if graph.optimizer == "adamw":
            opt = AdamW(**{**ADAMW_DEFAULTS, **{k: v for k, v in kw.items() if k in ADAMW_DEFAULTS}})
        else:
            d = {**SGD_DEFAULTS, **{k: v for k, v in kw.items() if k in SGD_DEFAULTS}}
            if graph.optimizer == "sgd":
                d["momentum"] = 0.0
            opt = SGD(**d)
        self.state = RunState(opt=opt, step=10)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        elif self.backend == "opencl":      # its calls are queued (port.exec.backends.opencl)
            from port.exec.backends.opencl import engine
            engine().finish()

    # -- buffers ------------------------------------------------------------------------------
    def _init(self, tid: int):
        torch, g = self.torch, self.graph
        if tid == GRAD_SCALE_ID:
            return torch.ones(1, device=self.device)
        s = g.tensors[tid]
        shape = tuple(int(v) for v in s.shape)
        if self._shape_constants is None:     # causal masks, position ids: their values, as a step reads them
            from port.ir.fold import shape_constants
            self._shape_constants = shape_constants(g.constants)
        if s.name in self._shape_constants:
            v = self._shape_constants[s.name].reshape(shape)
            return (v.to(torch.uint8) if s.dtype in ("uint8", "bool") else v.clone()).to(self.device)
        if s.dtype == "float32":
            t = torch.randn(shape, generator=self.gen)
            if s.role in ("buffer", "optimizer_state"):   # running and second-moment variances are positive
                t = t.abs_().add_(0.5)
        elif s.dtype == "int64":
            high = g.tensors[g.logits_id].shape[-1] if tid == g.label_id else 1
            t = torch.randint(0, high, shape, generator=self.gen, dtype=torch.int64)
        elif s.dtype in ("uint8", "bool"):
            t = torch.randint(0, 2, shape, generator=self.gen, dtype=torch.uint8)
        else:
            raise ProfileError(f"profiler: tensor {s.name!r} has unsupported dtype {s.dtype}")
        return t.to(self.device)

    def _calls(self, op: Op, variant: str, first_index: int, bufs: dict, ws: dict, shapes: dict) -> list[Call]:
        g = self.graph
        out = []
        for k, spec in enumerate(registry.op_calls(g, op, variant, self.backend)):
            for t in spec.inputs + spec.outputs:
                if t not in shapes:
                    shapes[t] = (1,) if t == GRAD_SCALE_ID else tuple(g.tensors[t].shape)
            if variant == "inplace" and (op.forward_op is None or op.kind in V.BACKWARD_INPLACE_KINDS) \
                    and spec.outputs[0] not in bufs:
                # in place (forward ops; dx over dy): the output is the input's storage, as lowering places it
                bufs.setdefault(spec.inputs[0], self._init(spec.inputs[0]))
                bufs[spec.outputs[0]] = bufs[spec.inputs[0]]
            for t in spec.inputs + spec.outputs:
                if t not in bufs:
                    bufs[t] = self._init(t)
            attrs = dict(spec.attrs)
            nb = registry.workspace_bytes(spec.kernel, spec.variant, spec.backend, attrs,
                                          [shapes[t] for t in spec.inputs], [shapes[t] for t in spec.outputs])
            idx = first_index + k
            if nb:
                ws[idx] = self.torch.empty(nb, dtype=self.torch.uint8, device=self.device)
            out.append(Call(index=idx, op=op.id, name=op.name, kernel=spec.kernel, backend=spec.backend,
                            variant=spec.variant, phase=op.phase, outputs=spec.outputs, inputs=spec.inputs,
                            attrs=spec.attrs, workspace_bytes=int(nb), covers=spec.covers))
        return out

    # -- ops ----------------------------------------------------------------------------------
    def prepare(self, op: Op, variant: str = "plain") -> PreparedOp:
        g = self.graph
        bufs: dict = {}
        ws: dict = {}
        shapes: dict = {}
        setup: list = []
        if op.forward_op is not None:
            fwd = g.ops[op.forward_op]
            setup = self._calls(fwd, "plain", 10_000, bufs, ws, shapes)
        # a fused member times the calls of its chain's call op (the profiler books its share, V.fused_share)
        host = g.ops[V.chain_of(g, op).call_of(op.id)] if variant == "fused" and V.chain_of(g, op) else op
        if host is not op and host.forward_op is not None and host.forward_op != op.forward_op:
            setup += self._calls(g.ops[host.forward_op], "plain", 20_000, bufs, ws, shapes)
        calls = self._calls(host, variant, 0, bufs, ws, shapes)
        ctx = _Scratch(bufs, ws, shapes, self.state)
        try:
            for c in setup:
                registry.bind(c, ctx)()
            fns = [registry.bind(c, ctx) for c in calls]
        except Exception as e:  # noqa: BLE001 - report which op failed
            raise ProfileError(f"{self.backend}: cannot run {op.name} ({op.kind}, {variant}): "
                               f"{type(e).__name__}: {e}") from e
        if not fns:
            fn: Callable[[], Any] = lambda: None    # noqa: E731 - views and fused-away ops run nothing
        elif len(fns) == 1:
            fn = fns[0]
        else:
            def fn():
                for f in fns:
                    f()
        fn()           # once, checked (status errors raise here, not in the timed loop)
        self.sync()
        keep = tuple({id(v): v for v in list(bufs.values()) + list(ws.values())}.values())
        return PreparedOp(fn, op, variant, self.backend, int(sum(c.workspace_bytes for c in calls)), keep,
                          tuple(calls), tuple(getattr(f, "entry", "?") for f in fns), bufs, ws)

    def peak_delta_bytes(self, run: PreparedOp) -> int:
        """Process peak-memory growth of one ``run()`` (0 if the backend cannot tell)."""
        if self.device.type == "cuda":
            torch = self.torch
            self.sync()
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            run()
            self.sync()
            return max(0, int(torch.cuda.max_memory_allocated(self.device) - base))
        return _cpu_peak_delta(run)


def _read_hwm_rss() -> tuple[int, int]:
    hwm = rss = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return hwm, rss


_LIBC: Any = None


def _cpu_peak_delta(run: PreparedOp, repeats: int = 3) -> int:
    """Process peak-RSS growth of one run: trim malloc's free lists, reset the kernel's high-water mark
    (``/proc/self/clear_refs`` = 5), run, read ``VmHWM - VmRSS(before)``; median of ``repeats``. Counts
    outputs and temporaries, whoever allocates them (torch, OpenBLAS, the C kernels). 0 where Linux's
    /proc interface is unavailable."""
    global _LIBC
    try:
        import ctypes
        if _LIBC is None:
            _LIBC = ctypes.CDLL("libc.so.6")
        vals = []
        for _ in range(repeats):
            _LIBC.malloc_trim(0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            _, rss0 = _read_hwm_rss()
            out = run()
            hwm1, _ = _read_hwm_rss()
            del out
            vals.append(max(0, hwm1 - rss0))
        vals.sort()
        return int(vals[len(vals) // 2])
    except Exception:  # noqa: BLE001 - best effort; 0 means unknown
        return 0


def get_runner(backend: str, graph: Graph, threads: int | None = None, **kw: Any) -> Runner:
    """The runner for ``backend`` (``c``, ``torch-cpu``, ``torch-cuda``)."""
    if backend not in registry.BACKENDS:
        raise ProfileError(f"no runner for backend {backend!r} (modeled accelerators are not run)")
    return Runner(graph, backend, threads, **kw)


def backend_available(backend: str) -> tuple[bool, str]:
    return registry.available(backend)
