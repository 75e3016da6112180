"""Per-backend op runners: one small interface shared by the profiler and (optionally) the executor.

    runner = get_runner("torch-cpu", graph, threads=2)   # or TorchRunner(graph, device="cpu", threads=2)
    run = runner.prepare(op, variant="plain")            # allocates random inputs of the op's shapes
    run()                                                 # executes the op once (may be asynchronous)
    runner.sync()                                         # waits for the device (CUDA); no-op on CPU
    run.workspace_bytes                                   # scratch the kernel needs beyond inputs/outputs

``prepare`` returns a :class:`PreparedOp`: a callable that owns its tensors. Runners never allocate in
``run()`` beyond what the backend itself does (torch allocates its outputs; C kernels write into buffers
allocated by ``prepare``). Every runner fixes its thread count when constructed (``threads``) and reports
it as ``runner.threads``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ProfileError
from ..types import Graph, Op, numel

TORCH_DTYPES = ("float32", "float64", "float16", "int64", "int32", "uint8", "bool")


@dataclass
class PreparedOp:
    """A ready-to-run op: ``run()`` executes it once on the runner's device."""

    fn: Callable[[], Any]
    op: Op
    variant: str
    backend: str
    workspace_bytes: int = 0
    tensors: tuple = field(default=(), repr=False)   # keeps inputs/outputs/workspace alive

    def __call__(self) -> Any:
        return self.fn()


class Runner:
    """Interface: ``prepare(op, variant) -> PreparedOp``, ``sync()``, ``threads``, ``available()``."""

    backend = "?"

    def __init__(self, graph: Graph, threads: int | None = None) -> None:
        self.graph = graph
        self.threads = threads or 1

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return True, ""

    def prepare(self, op: Op, variant: str = "plain") -> PreparedOp:  # pragma: no cover - interface
        raise NotImplementedError

    def sync(self) -> None:
        pass

    def peak_delta_bytes(self, run: PreparedOp) -> int:
        """Process peak-memory growth of one ``run()`` (0 if the backend cannot tell)."""
        return _cpu_peak_delta(run)


# =============================================================================================
# torch (cpu, cuda, mps): functional calls / aten backward kernels on random tensors
# =============================================================================================
SGD_DEFAULTS = dict(lr=0.05, momentum=0.9, weight_decay=0.0)
ADAMW_DEFAULTS = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)


class TorchRunner(Runner):
    """Runs graph ops with PyTorch's own kernels (what eager training calls) on ``device``."""

    def __init__(self, graph: Graph, device: str = "cpu", threads: int | None = None, seed: int = 0,
                 optimizer_kwargs: dict | None = None) -> None:
        import torch
        self.torch = torch
        self.device = torch.device(device)
        self.backend = {"cpu": "torch-cpu", "cuda": "torch-cuda", "mps": "torch-mps"}[self.device.type]
        ok, why = self.available_for(self.device.type)
        if not ok:
            raise ProfileError(f"{self.backend}: {why}")
        if threads:
            torch.set_num_threads(int(threads))
        super().__init__(graph, torch.get_num_threads())
        self.gen = torch.Generator().manual_seed(seed)
        self.optimizer_kwargs = optimizer_kwargs or {}

    @staticmethod
    def available_for(devtype: str) -> tuple[bool, str]:
        import torch
        if devtype == "cuda" and not torch.cuda.is_available():
            return False, "no CUDA device (torch.cuda.is_available() is False)"
        if devtype == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            return False, "no MPS device"
        return True, ""

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            self.torch.mps.synchronize()

    # -- tensors ------------------------------------------------------------------------------
    def _rand(self, shape, dtype: str = "float32", *, positive: bool = False, high: int | None = None):
        torch = self.torch
        shape = tuple(int(s) for s in shape)
        if dtype == "float32":
            t = torch.randn(shape, generator=self.gen)
            if positive:
                t = t.abs_().add_(0.5)
        elif dtype in ("int64", "int32"):
            t = torch.randint(0, high or 2, shape, generator=self.gen, dtype=getattr(torch, dtype))
        elif dtype in ("uint8", "bool"):
            t = torch.randint(0, 2, shape, generator=self.gen, dtype=torch.uint8)
            if dtype == "bool":
                t = t.bool()
        else:
            t = torch.randn(shape, generator=self.gen).to(getattr(torch, dtype))
        return t.to(self.device)

    def _t(self, tid: int, **kw):
        spec = self.graph.tensors[tid]
        return self._rand(spec.shape, spec.dtype, **kw)

    def shape(self, tid: int) -> tuple[int, ...]:
        return self.graph.tensors[tid].shape

    # -- ops ----------------------------------------------------------------------------------
    def prepare(self, op: Op, variant: str = "plain") -> PreparedOp:
        if variant not in ("plain", "inplace"):
            raise ProfileError(f"{self.backend} runs variants 'plain' and 'inplace' only, not {variant!r} "
                               f"(op {op.name})")
        torch = self.torch
        with torch.no_grad():
            fn, keep = self._build(op, variant)
        no_grad = torch.no_grad

        def run() -> Any:
            with no_grad():
                return fn()
        return PreparedOp(run, op, variant, self.backend, 0, tuple(keep))

    def peak_delta_bytes(self, run: PreparedOp) -> int:
        torch = self.torch
        if self.device.type == "cuda":
            self.sync()
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            out = run()
            self.sync()
            del out
            return max(0, int(torch.cuda.max_memory_allocated(self.device) - base))
        if self.device.type != "cpu":
            return 0
        return _cpu_peak_delta(run)

    def _build(self, op: Op, variant: str) -> tuple[Callable[[], Any], list]:
        torch = self.torch
        aten = torch.ops.aten
        g = self.graph
        k = op.kind
        a = op.attr_dict
        T = self._t
        ins = op.inputs
        fwd = g.ops[op.forward_op] if op.forward_op is not None else op
        fa = fwd.attr_dict

        if k in ("reshape", "reshape.grad_input"):
            x = T(ins[0])
            shp = self.shape(op.outputs[0])
            return (lambda: x.view(shp)), [x]
        if k == "add.grad_input":
            gy = T(ins[0])
            return (lambda: gy), [gy]

        if k == "conv2d":
            x, w = T(ins[0]), T(ins[1])
            b = T(ins[2]) if a.get("bias") else None
            s, p, gr = list(a["stride"]), list(a["padding"]), a["groups"]
            return (lambda: torch.nn.functional.conv2d(x, w, b, s, p, 1, gr)), [x, w, b]
        if k in ("conv2d.grad_input", "conv2d.grad_weight"):
            gy = T(ins[0])
            x = self._rand(self.shape(fwd.inputs[0]))
            w = self._rand(self.shape(fwd.inputs[1]))
            has_b = bool(fa.get("bias"))
            s, p, gr = list(fa["stride"]), list(fa["padding"]), fa["groups"]
            mask = [True, False, False] if k.endswith("grad_input") else [False, True, has_b]
            bs = [w.shape[0]] if has_b else None
            return (lambda: aten.convolution_backward(gy, x, w, bs, s, p, [1, 1], False, [0, 0], gr, mask)), [gy, x, w]

        if k == "batch_norm2d":
            x, w, b = T(ins[0]), T(ins[1]), T(ins[2])
            rm = T(ins[3]) if len(ins) > 3 else None
            rv = T(ins[4], positive=True) if len(ins) > 4 else None
            tr, mom, eps = bool(a["training"]), float(a["momentum"]), float(a["eps"])
            if variant == "inplace":
                raise ProfileError("torch backends have no in-place batch norm")
            return (lambda: aten.native_batch_norm(x, w, b, rm, rv, tr, mom, eps)), [x, w, b, rm, rv]
        if k in ("batch_norm2d.grad_input", "batch_norm2d.grad_weight"):
            gy = self._rand(self.shape(fwd.outputs[0]))
            fi = fwd.inputs
            x, w = self._rand(self.shape(fi[0])), self._rand(self.shape(fi[1]))
            b = self._rand(self.shape(fi[2]))
            rm = self._rand(self.shape(fi[3])) if len(fi) > 3 else None
            rv = self._rand(self.shape(fi[4]), positive=True) if len(fi) > 4 else None
            tr, eps = bool(fa["training"]), float(fa["eps"])
            if tr:
                _, sm, si = aten.native_batch_norm(x, w, b, None, None, True, 0.1, eps)
            else:
                sm = si = None
            mask = [True, False, False] if k.endswith("grad_input") else [False, True, True]
            return (lambda: aten.native_batch_norm_backward(gy, x, w, rm, rv, sm, si, tr, eps, mask)), [gy, x, w, rm, rv, sm, si]

        if k in ("relu", "relu6", "hardswish"):
            x = T(ins[0])
            if variant == "inplace":
                f = {"relu": torch.relu_, "relu6": lambda t: torch.nn.functional.hardtanh_(t, 0.0, 6.0),
                     "hardswish": lambda t: torch.nn.functional.hardswish(t, inplace=True)}[k]
            else:
                f = {"relu": torch.relu, "relu6": lambda t: torch.nn.functional.hardtanh(t, 0.0, 6.0),
                     "hardswish": torch.nn.functional.hardswish}[k]
            return (lambda: f(x)), [x]
        if k == "relu.grad_input":
            gy, y = T(ins[0]), torch.relu(T(ins[1]))
            return (lambda: aten.threshold_backward(gy, y, 0)), [gy, y]
        if k == "relu6.grad_input":
            gy, y = T(ins[0]), T(ins[1]).clamp_(0, 6)
            return (lambda: aten.hardtanh_backward(gy, y, 0.0, 6.0)), [gy, y]
        if k == "hardswish.grad_input":
            gy, x = T(ins[0]), T(ins[1])
            return (lambda: aten.hardswish_backward(gy, x)), [gy, x]

        if k == "max_pool2d":
            x = T(ins[0])
            kk, s, p = list(a["kernel"]), list(a["stride"]), list(a["padding"])
            return (lambda: aten.max_pool2d_with_indices(x, kk, s, p, [1, 1], False)), [x]
        if k == "max_pool2d.grad_input":
            kk, s, p = list(fa["kernel"]), list(fa["stride"]), list(fa["padding"])
            x = self._rand(self.shape(fwd.inputs[0]))
            _, idx = aten.max_pool2d_with_indices(x, kk, s, p, [1, 1], False)
            gy = T(ins[0])
            return (lambda: aten.max_pool2d_with_indices_backward(gy, x, kk, s, p, [1, 1], False, idx)), [gy, x, idx]
        if k == "avg_pool2d":
            x = T(ins[0])
            kk, s, p = list(a["kernel"]), list(a["stride"]), list(a["padding"])
            return (lambda: torch.nn.functional.avg_pool2d(x, kk, s, p)), [x]
        if k == "avg_pool2d.grad_input":
            kk, s, p = list(fa["kernel"]), list(fa["stride"]), list(fa["padding"])
            x = self._rand(self.shape(fwd.inputs[0]))
            gy = T(ins[0])
            return (lambda: aten.avg_pool2d_backward(gy, x, kk, s, p, False, True, None)), [gy, x]
        if k == "global_avg_pool2d":
            x = T(ins[0])
            keep = len(self.shape(op.outputs[0])) == 4
            return (lambda: x.mean((-1, -2), keepdim=keep)), [x]
        if k == "global_avg_pool2d.grad_input":
            xs = self.shape(fwd.inputs[0])
            gy = T(ins[0])
            n_hw = xs[2] * xs[3]
            return (lambda: gy.reshape(xs[0], xs[1], 1, 1).expand(xs) / n_hw), [gy]

        if k == "linear":
            x, w = T(ins[0]), T(ins[1])
            b = T(ins[2]) if a.get("bias") else None
            return (lambda: torch.nn.functional.linear(x, w, b)), [x, w, b]
        if k == "linear.grad_input":
            gy, w = T(ins[0]), T(ins[1])
            return (lambda: gy.mm(w)), [gy, w]
        if k == "linear.grad_weight":
            gy, x = T(ins[0]), T(ins[1])
            has_b = bool(fa.get("bias"))
            if has_b:
                return (lambda: (gy.t().mm(x), gy.sum(0))), [gy, x]
            return (lambda: gy.t().mm(x)), [gy, x]

        if k == "add":
            x, y = T(ins[0]), T(ins[1])
            if variant == "inplace":
                return (lambda: x.add_(y)), [x, y]
            return (lambda: torch.add(x, y)), [x, y]
        if k == "grad_accumulate":
            x, y = T(ins[0]), T(ins[1])
            return (lambda: torch.add(x, y)), [x, y]

        if k == "dropout":
            x = T(ins[0])
            pr = float(a["p"])
            def drop():  # ATen's CPU dropout: bernoulli noise, scale, multiply
                noise = torch.empty_like(x).bernoulli_(1 - pr).div_(1 - pr)
                return x * noise, noise
            return drop, [x]
        if k == "dropout.grad_input":
            gy = T(ins[0])
            noise = self._rand(self.shape(ins[0]))
            return (lambda: gy * noise), [gy, noise]

        if k == "cross_entropy":
            logits = T(ins[0])
            K = self.shape(ins[0])[1]
            labels = self._t(ins[1], high=K)
            def ce():
                lp = aten._log_softmax(logits, 1, False)
                return aten.nll_loss_forward(lp, labels, None, 1, -100)
            return ce, [logits, labels]
        if k == "cross_entropy.grad_input":
            K = self.shape(ins[0])[1]
            logits = self._rand(self.shape(ins[0]))
            labels = self._t(ins[1], high=K)
            lp = aten._log_softmax(logits, 1, False)
            _, tw = aten.nll_loss_forward(lp, labels, None, 1, -100)
            go = torch.ones((), device=self.device)
            def ce_b():
                gl = aten.nll_loss_backward(go, lp, labels, None, 1, -100, tw)
                return aten._log_softmax_backward_data(gl, lp, 1, torch.float32)
            return ce_b, [logits, labels, lp, tw, go]

        if k == "update":
            return self._update(op)
        raise ProfileError(f"{self.backend}: no runner for op kind {k!r} (op {op.name})")

    def _update(self, op: Op):
        torch = self.torch
        opt = op.attr("optimizer")
        p = self._t(op.inputs[0])
        gr = self._t(op.inputs[1])
        states = [self._t(t).abs_() for t in op.inputs[2:]]
        kw = self.optimizer_kwargs
        if opt in ("sgd", "sgd_momentum"):  # torch.optim.SGD, single-tensor (foreach=False) path
            lr = kw.get("lr", SGD_DEFAULTS["lr"])
            mom = kw.get("momentum", SGD_DEFAULTS["momentum"]) if opt == "sgd_momentum" else 0.0
            wd = kw.get("weight_decay", SGD_DEFAULTS["weight_decay"])
            buf = states[0] if states else None
            def sgd():
                d = gr.add(p, alpha=wd) if wd else gr
                if buf is not None:
                    buf.mul_(mom).add_(d)
                    p.add_(buf, alpha=-lr)
                else:
                    p.add_(d, alpha=-lr)
            return sgd, [p, gr] + states
        if opt == "adamw":  # torch.optim.AdamW single-tensor path
            lr = kw.get("lr", ADAMW_DEFAULTS["lr"])
            b1, b2 = kw.get("betas", ADAMW_DEFAULTS["betas"])
            eps = kw.get("eps", ADAMW_DEFAULTS["eps"])
            wd = kw.get("weight_decay", ADAMW_DEFAULTS["weight_decay"])
            m, v = states
            step = 10
            bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
            def adamw():
                p.mul_(1 - lr * wd)
                m.lerp_(gr, 1 - b1)
                v.mul_(b2).addcmul_(gr, gr, value=1 - b2)
                denom = (v.sqrt() / (bc2 ** 0.5)).add_(eps)
                p.addcdiv_(m, denom, value=-lr / bc1)
            return adamw, [p, gr, m, v]
        raise ProfileError(f"{self.backend}: unknown optimizer {opt!r} in op {op.name}")


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


# =============================================================================================
# C kernels (PORT's library through port.kernels)
# =============================================================================================
def c_kernels_status() -> tuple[bool, str]:
    """(available, why not) for the C runner."""
    try:
        from .c_runner import CRunner  # noqa: F401
        return CRunner.available()
    except ImportError as e:
        return False, f"C kernels not built or binding missing ({e})"


def get_runner(backend: str, graph: Graph, threads: int | None = None, **kw: Any) -> Runner:
    """The runner for ``backend`` (``c``, ``torch-cpu``, ``torch-cuda``, ``torch-mps``)."""
    if backend == "torch-cpu":
        return TorchRunner(graph, "cpu", threads, **kw)
    if backend == "torch-cuda":
        return TorchRunner(graph, "cuda", threads, **kw)
    if backend == "torch-mps":
        return TorchRunner(graph, "mps", threads, **kw)
    if backend == "c":
        ok, why = c_kernels_status()
        if not ok:
            raise ProfileError(f"C kernels not built: {why}")
        from .c_runner import CRunner
        return CRunner(graph, threads, **kw)
    raise ProfileError(f"no runner for backend {backend!r} (modeled accelerators are not run)")


def backend_available(backend: str) -> tuple[bool, str]:
    if backend == "torch-cpu":
        return True, ""
    if backend == "torch-cuda":
        return TorchRunner.available_for("cuda")
    if backend == "torch-mps":
        return TorchRunner.available_for("mps")
    if backend == "c":
        return c_kernels_status()
    return False, "modeled accelerator (not present on this machine)"
