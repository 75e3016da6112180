"""Training benchmark (issue 4): PORT's Trainer (C kernels, static arena) against PyTorch eager.

    python bench/train.py --quick      # ResNet-18, VGG-11, MobileNetV2 at batch 1 and 8 (< 6 min)
    python bench/train.py              # ... at batch 1, 8 and 32 (< 25 min)
    options: --models resnet18,vgg11 --batches 1,8 --steps N --warmup N --no-write

Every (model, batch, implementation) runs in a FRESH subprocess (``--worker``), measured the same way:

  * same model (``port.models.get(name, seed=0)``, train mode), same data (a new seeded random batch x
    [B,3,32,32] and labels every step, the same sequence in every worker), SGD lr 0.01 momentum 0.9 (torch.optim.SGD defaults otherwise: foreach off on CPU,
    zero_grad(set_to_none=True)); PORT: ``Trainer(model, x, optimizer=SGD(0.01, momentum=0.9), backend="c")``.
  * threads: ``torch.set_num_threads(2)`` and ``port.exec.capi.set_num_threads(2)`` in both (``--threads N`` to
    change); PORT's Trainer runs its default thread governor (``threads="auto"``, up to that count) and its
    settled count per phase is recorded, as is torch's.
  * step time: median of ``--steps`` timed steps after ``--warmup`` untimed steps (time.perf_counter around
    one full step: torch = zero_grad + forward + loss + backward + opt.step + loss.item(); PORT = trainer.step).
    The workers alternate blocks of consecutive steps (>= BLOCK_S long), each block's first step untimed
    (``_rounds``).
  * memory (Linux /proc/self/status):
      pre   = VmRSS after imports, model construction and data creation, before the optimizer/Trainer
              is built (gc.collect() first);
      setup = VmRSS after the optimizer/Trainer is built (PORT: trace + plan + lower + arena allocation);
      then the high-water mark is reset to the current RSS by writing "5" to /proc/self/clear_refs (if the
      kernel refuses, a 1 ms VmRSS sampling thread runs instead; the method used is recorded);
      peak  = VmHWM after warm-up + timed steps.
    "RSS growth" = peak - pre: everything the training set-up and the steps added to the process. For PyTorch
    this is gradients + momentum buffers + activations + autograd/allocator overhead (the weights are in
    ``pre``); for PORT it is the arena (a second copy of the weights, gradients, momentum, buffers and
    scratch) + the traced graph/program objects + anything allocated per step.
    "Beyond weights/grads/optimizer state" = RSS growth - (persistent bytes allocated after ``pre``):
    PyTorch: growth - 2 x parameter bytes (grads + momentum); PORT: growth - the arena's persistent bytes.
    For PORT the planned figure (arena scratch bytes) is reported beside it.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# bench/ holds a profile.py that would shadow the stdlib module torch._dynamo imports: bench/ goes last
sys.path[:] = [str(ROOT)] + [q for q in sys.path if Path(q or ".").resolve() != ROOT / "bench"] + [str(ROOT / "bench")]
import _results  # noqa: E402,F401  (now: importing torch rebuilds sys.path without bench/; later imports find it loaded)

MODELS = ("resnet18", "vgg11", "mobilenetv2", "dsnet")
LABEL = {"resnet18": "ResNet-18", "vgg11": "VGG-11", "mobilenetv2": "MobileNetV2", "dsnet": "dsnet-37"}
MB = 1e6
IMPLS = ("torch", "torchp", "port")    # PyTorch eager with its own OpenMP defaults; with PORT's policy; PORT
# the driver's own OpenMP settings (a user's choice is passed on; nothing PORT sets leaks into a worker)
_USER_OMP = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "PORT_OMP_WAIT_POLICY")}


def build_model(name: str):
    """(model, per-sample input shape): the zoo's models, and examples/dsnet (a depthwise-separable net, width 32,
    on an odd 37x37 input)."""
    from port import models
    if name == "dsnet":
        import importlib.util
        spec = importlib.util.spec_from_file_location("dsnet", ROOT / "examples" / "dsnet" / "dsnet.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        import torch
        torch.manual_seed(0)
        return mod.make(width=32), (3, 37, 37)
    return models.get(name, seed=0), models.INPUT_SHAPES[name]


def train_flops(model, x, y) -> float:
    """FLOPs of one training step: 2 per multiply-add of every convolution and linear layer, forward plus both
    gradients (3x the forward; the first layer's input gradient, which no step computes, is counted too).
    Counted with forward hooks: torch's FlopCounterMode ignores groups in a convolution's backward (it counts a
    depthwise conv's gradients as dense ones, 64x too many for 64 channels)."""
    import torch
    import torch.nn as nn
    total = [0]

    def hook(mod, inp, out):
        if isinstance(mod, nn.Conv2d):
            kh, kw = mod.kernel_size
            total[0] += 2 * out.numel() * (mod.in_channels // mod.groups) * kh * kw
        elif isinstance(mod, nn.Linear):
            total[0] += 2 * out.numel() * mod.in_features
    hs = [mod.register_forward_hook(hook) for mod in model.modules() if isinstance(mod, (nn.Conv2d, nn.Linear))]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hs:
            h.remove()
    return 3.0 * total[0]


# ----------------------------------------------------------------------------- worker (fresh process)
def _status() -> dict[str, int]:
    from _results import proc_status
    return proc_status()


class _Sampler:
    """Fallback peak-RSS meter when /proc/self/clear_refs cannot reset VmHWM."""

    def __init__(self) -> None:
        self.peak = _status()["VmRSS"]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _status()["VmRSS"])

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return max(self.peak, _status()["VmRSS"])


def worker(impl: str, name: str, batch: int, steps: int, warmup: int, threads: int, trim: bool) -> dict:
    # the OpenMP runtime reads its wait policy once, when it loads (with torch): PORT's policy is set first, as
    # `import port` before `import torch` (or `port train`) does; the "torch" worker runs with
    # PORT_OMP_WAIT_POLICY=default, where this leaves libgomp's defaults alone
    from port.exec import capi
    capi.configure_openmp_env()
    import torch
    torch.set_num_threads(threads)
    import torch.nn.functional as F
    from port import models
    capi.set_num_threads(threads)   # kernel OpenMP pool (+ torch intra-op): same call in both workers
    from port.train.optim import SGD as PortSGD
    from port.train.trainer import Trainer
    # the same heavy imports in both workers before the baseline: torch.optim's first construction imports
    # torch._dynamo (~70 MB RSS), port's tracer/lowering/backends import on first Trainer
    import torch._dynamo  # noqa: F401
    import torch.fx  # noqa: F401
    import port.exec.backends.c  # noqa: F401
    import port.ir.trace  # noqa: F401
    import port.lower.lower  # noqa: F401

    model, in_shape = build_model(name)
    model.train()
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(batch, *in_shape, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    gc.collect()
    pre = _status()["VmRSS"]

    t0 = time.perf_counter()
    if impl in ("torch", "torchp"):
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step(x, y) -> float:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.item()
        report = None
    else:
        # the Trainer's defaults: threads="auto" (the thread governor, up to the 2 set above)
        tr = Trainer(model, x, optimizer=PortSGD(0.01, momentum=0.9), backend="c")

        def step(x, y) -> float:
            return tr.step(x, y)
        report = tr.memory_report()
    setup_s = time.perf_counter() - t0
    gc.collect()
    if trim:                         # --trim: hand freed heap back to the OS after set-up (glibc)
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    setup = _status()["VmRSS"]
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        method, sampler = "clear_refs", None
        if _status()["VmHWM"] > setup + (4 << 20):       # reset did not take
            raise OSError("VmHWM not reset")
    except OSError:
        method, sampler = "sampler", _Sampler()

    # driver protocol (stdin/stdout, one JSON line each): "steps K" -> K steps back to back,
    # {"t": [wall s], "c": [CPU s], "n": threads}; "done" -> the final record. The driver alternates blocks of
    # steps between the workers.
    out = sys.stdout
    out.write(json.dumps({"ready": True, "setup_s": setup_s}) + "\n")
    out.flush()
    losses = []
    for line in sys.stdin:
        cmd = line.split()
        if cmd and cmd[0] == "steps":
            ts, cs = [], []
            for _ in range(int(cmd[1])):
                # a new random batch every step (the same sequence in every worker): one batch trained on
                # again and again is memorised within ~20 steps (VGG-11 at batch 1: loss 0), its gradients
                # become denormal floats, and from then on both implementations slow down 10-30x
                xb = torch.randn(x.shape, generator=g)
                yb = torch.randint(0, 10, (batch,), generator=g)
                t, c = time.perf_counter(), time.process_time()
                losses.append(step(xb, yb))
                ts.append(time.perf_counter() - t)
                cs.append(time.process_time() - c)
            n = tr.threads if impl == "port" else torch.get_num_threads()    # PORT: the governor's settled count
            out.write(json.dumps({"t": ts, "c": cs, "n": n}) + "\n")
            out.flush()
        elif cmd == ["done"]:
            break
    st = _status()
    peak = st["VmHWM"] if sampler is None else sampler.stop()
    flops = train_flops(model, x, y) if impl == "torch" else None
    return {"impl": impl, "flops": flops,
            "omp_env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}, "model": name, "batch": batch, "steps_run": len(losses),
            "setup_s": setup_s, "pre": pre, "setup": setup, "peak": peak,
            "end": st["VmRSS"], "method": method, "param_bytes": param_bytes, "buffer_bytes": buffer_bytes,
            "torch_threads": torch.get_num_threads(), "trim": trim, "kernel_threads": capi.get_num_threads(),
            "report": report, "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None}


def gemm_worker(threads: int) -> dict:
    """The machine's measured sgemm rate (GFLOP/s, 2048^3, best of 5): PORT's GEMM (OpenBLAS, split over the
    kernel threads) and torch.mm, each with ``threads`` threads."""
    import torch
    from port.exec import capi
    from _results import sgemm_gflops
    torch.set_num_threads(threads)
    capi.set_num_threads(threads)
    return sgemm_gflops(with_torch=True)


class Worker:
    """A fresh worker process for one implementation, driven step by step."""

    def __init__(self, impl: str, name: str, batch: int, threads: int, trim: bool, timeout: float):
        self.impl, self.name, self.batch, self.timeout = impl, name, batch, timeout
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", impl, name, str(batch), "0", "0",
               str(threads), str(int(trim))]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for k, v in _USER_OMP.items():
            env.pop(k, None)
            if v is not None:
                env[k] = v
        if impl == "torch" and _USER_OMP["PORT_OMP_WAIT_POLICY"] is None:
            env["PORT_OMP_WAIT_POLICY"] = "default"   # `import port` leaves the OpenMP runtime's defaults alone
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env, cwd=str(ROOT))
        self.error: str | None = None
        self._read()                                       # "ready"

    def _read(self) -> dict | None:
        if self.error:
            return None
        while True:
            line = self.p.stdout.readline()
            if not line:
                self.p.wait()
                tail = self.p.stderr.read().strip().splitlines()[-1:] or ["?"]
                self.error = f"rc={self.p.returncode}: {tail[0][:200]}"
                return None
            if line.startswith("{"):
                return json.loads(line)

    def _send(self, cmd: str) -> dict | None:
        if self.error:
            return None
        try:
            self.p.stdin.write(cmd + "\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            pass
        return self._read()

    def steps(self, k: int) -> dict | None:
        return self._send(f"steps {k}")

    def finish(self) -> dict:
        r = self._send("done")
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
        if r is None:
            return {"impl": self.impl, "model": self.name, "batch": self.batch, "error": self.error}
        return r


BLOCK_S = 0.06         # a block of consecutive steps lasts at least this long (up to MAX_BLOCK steps)
MAX_BLOCK = 40


def _rounds(W: dict, order: tuple, warmup: int, steps: int, max_s: float, block: int = 1) -> dict:
    """Rounds of ``block`` consecutive steps per worker, rotating who goes first: ``warmup`` untimed rounds, then
    rounds until every worker has ``steps`` timed steps (at least 3 rounds; fewer steps if the timed rounds pass
    ``max_s``). A block's first step is not timed when block > 1: it shares the cores with the previous worker's
    OpenMP threads, which spin for a while after their last region (libgomp's default, PyTorch's and PORT's
    alike), a cost a training loop that runs alone never pays. Returns {impl: [{"t": s, "c": s, "n": threads}]}."""
    rec: dict[str, list] = {impl: [] for impl in order}
    t0 = time.time()
    skip = 1 if block > 1 else 0
    r = 0
    while True:
        timed = r >= warmup
        if timed and r >= warmup + 3 and (min(len(v) for v in rec.values()) >= steps or time.time() - t0 > max_s):
            break
        k = r % len(order)                               # rotate who goes first
        for impl in order[k:] + order[:k]:
            o = W[impl].steps(block)
            if o is not None and timed:
                rec[impl] += [{"t": t, "c": c, "n": o["n"]} for t, c in zip(o["t"][skip:], o["c"][skip:])]
        if r == warmup - 1:
            t0 = time.time()
        r += 1
        if all(W[i].error for i in order):
            break
    return rec


def _block_size(W: dict, order: tuple) -> int:
    """Steps per block: enough that the slowest worker's block lasts BLOCK_S (from each worker's second step of
    two: the first after set-up is a cold one)."""
    slowest = max((o["t"][-1] for o in (W[i].steps(2) for i in order) if o is not None), default=1.0)
    return max(1, min(MAX_BLOCK, 1 + math.ceil(BLOCK_S / max(slowest, 1e-6))))


def _stats(ts: list[float]) -> dict:
    if not ts:
        return {"median_s": float("nan"), "p90_p50": None}
    q = sorted(ts)
    p90 = q[min(len(q) - 1, int(round(0.9 * (len(q) - 1))))]
    return {"median_s": statistics.median(ts), "p90_p50": p90 / statistics.median(ts)}


LOADED_WARMUP_STEPS = 10   # warm-up steps once the background process runs (the governor decides within ~8)


def measure(name: str, batch: int, steps: int, warmup: int, threads: int, trim: bool,
            first: str, max_s: float, loaded: bool = True) -> dict[str, dict]:
    """Set the workers up (one after the other), then alternate single steps between them (who goes first rotates
    every round): ``warmup`` untimed steps (whole blocks) then ``steps`` timed ones (fewer if the timed rounds pass ``max_s``
    seconds, at least 3). loaded=True: then the same again with one CPU-bound background process running."""
    order = tuple(IMPLS[IMPLS.index(first):] + IMPLS[:IMPLS.index(first)])
    W = {impl: Worker(impl, name, batch, threads, trim, timeout=600) for impl in order}
    block = _block_size(W, order)
    rec = _rounds(W, order, math.ceil(warmup / block), steps, max_s, block)
    rec_l = None
    if loaded:
        from _results import busy_process
        busy = busy_process()
        try:
            time.sleep(0.5)
            rec_l = _rounds(W, order, math.ceil(LOADED_WARMUP_STEPS / block), steps, max_s, block)
        finally:
            busy.kill()
            busy.wait()
    res = {}
    for impl in order:
        d = W[impl].finish()
        if "error" not in d:
            ts = [o["t"] for o in rec[impl]]
            d.update(times=ts, cpu_median_s=statistics.median([o["c"] for o in rec[impl]]) if ts else float("nan"),
                     threads_quiet=rec[impl][-1].get("n") if ts else None, **_stats(ts))
            if rec_l is not None:
                tl = [o["t"] for o in rec_l[impl]]
                st = _stats(tl)
                d.update(times_loaded=tl, loaded_median_s=st["median_s"], loaded_p90_p50=st["p90_p50"],
                         threads_loaded=rec_l[impl][-1].get("n") if tl else None)
        res[impl] = d
    res["port"]["block"] = block
    if "error" not in res["torch"] and "error" not in res["port"]:
        pr = [p / t for p, t in zip(res["port"]["times"], res["torch"]["times"])]
        res["port"]["paired_ratio"] = statistics.median(pr)
    return res


# ----------------------------------------------------------------------------- driver
def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def _gmean(xs: list[float]) -> float | None:
    import math
    xs = [v for v in xs if v is not None and v > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def derive(t: dict, p: dict, tp: dict | None = None, gemm_gflops: float | None = None) -> dict:
    """Ratios for one (model, batch) from the torch run t (PyTorch's OpenMP defaults), the PORT run p and the
    PyTorch run with PORT's OpenMP policy tp."""
    d = {"model": t["model"], "batch": t["batch"]}
    ok = "error" not in t and "error" not in p
    d["flops"] = t.get("flops")
    d["tp_ms"] = tp["median_s"] * 1e3 if tp and "error" not in tp else None
    for tag, r in (("t", t), ("p", p)):
        d[f"{tag}_p90"] = r.get("p90_p50")
        d[f"{tag}_lq"] = (r["loaded_median_s"] / r["median_s"]) if "loaded_median_s" in r else None
        d[f"{tag}_lp90"] = r.get("loaded_p90_p50")
        if ok and d["flops"]:
            d[f"{tag}_gflops"] = d["flops"] / r["median_s"] / 1e9
            d[f"{tag}_peak"] = d[f"{tag}_gflops"] / gemm_gflops if gemm_gflops else None
    d["t_ms"] = t["median_s"] * 1e3 if "error" not in t else None
    d["p_ms"] = p["median_s"] * 1e3 if "error" not in p else None
    d["time_ratio"] = d["p_ms"] / d["t_ms"] if d["p_ms"] and d["t_ms"] else None
    d["paired"] = p.get("paired_ratio")
    d["n"] = len(p.get("times", []))
    d["t_err"], d["p_err"] = t.get("error"), p.get("error")
    if "error" not in t:
        d["t_growth"] = t["peak"] - t["pre"]
        d["t_beyond"] = d["t_growth"] - 2 * t["param_bytes"]           # minus grads + momentum
        d["threads"] = t["torch_threads"]
    if "error" not in p:
        r = p["report"]
        d["p_growth"] = p["peak"] - p["pre"]
        d["p_setup_growth"] = p["setup"] - p["pre"]
        d["p_step_growth"] = p["peak"] - p["setup"]
        d["persist"], d["scratch"], d["arena"] = r["persistent_bytes"], r["scratch_bytes"], r["arena_bytes"]
        d["p_beyond"] = d["p_growth"] - r["persistent_bytes"]
        d["growth_vs_plan"] = d["p_growth"] / r["arena_bytes"]
        d["kthreads"] = p["kernel_threads"]
        d["p_threads_q"], d["p_threads_l"] = p.get("threads_quiet"), p.get("threads_loaded")
        d["pthreads"] = p["torch_threads"]
        d["method"] = p["method"]
    if "error" not in t and "error" not in p:
        d["beyond_ratio_rss"] = d["p_beyond"] / d["t_beyond"] if d["t_beyond"] > 0 else None
        d["beyond_ratio_plan"] = d["scratch"] / d["t_beyond"] if d["t_beyond"] > 0 else None
        d["loss0"] = (t["loss_first"], p["loss_first"])
    return d


def table(rows: list[dict]) -> str:
    h = ("| model | batch | PyTorch ms | PORT ms | time PORT/PT (paired) | threads torch/kernel | PT RSS growth MB "
         "| PORT RSS growth MB (setup + steps) | PORT arena MB persistent + scratch | PT beyond W/G/O MB "
         "| PORT beyond W/G/O MB RSS / plan | beyond ratio RSS / plan | PORT growth / arena | loss0 PT / PORT |")
    out = [h, "|" + "---|" * h.count(" | ") + "---|"]
    for d in rows:
        if d.get("t_err") or d.get("p_err"):
            out.append(f"| {LABEL[d['model']]} | {d['batch']} | {_fmt(d['t_ms'], '.1f')} | {_fmt(d['p_ms'], '.1f')} "
                       f"| error: {d.get('t_err') or ''} {d.get('p_err') or ''} |")
            continue
        out.append(
            f"| {LABEL[d['model']]} | {d['batch']} | {d['t_ms']:.1f} | {d['p_ms']:.1f} | {d['time_ratio']:.2f} ({_fmt(d['paired'])}) "
            f"| {d['threads']}/{d['kthreads']} | {d['t_growth'] / MB:.0f} "
            f"| {d['p_growth'] / MB:.0f} ({d['p_setup_growth'] / MB:.0f} + {d['p_step_growth'] / MB:.1f}) "
            f"| {d['persist'] / MB:.0f} + {d['scratch'] / MB:.1f} | {d['t_beyond'] / MB:.0f} "
            f"| {d['p_beyond'] / MB:.0f} / {d['scratch'] / MB:.1f} "
            f"| {_fmt(d['beyond_ratio_rss'])} / {_fmt(d['beyond_ratio_plan'])} | {d['growth_vs_plan']:.2f} "
            f"| {d['loss0'][0]:.4f} / {d['loss0'][1]:.4f} |")
    return "\n".join(out)


def headline(rows: list[dict]) -> str:
    ok = [d for d in rows if not d.get("t_err") and not d.get("p_err")]
    parts = []
    for b, tgt in ((1, 0.7), (8, 1.0), (32, None)):
        rs = [d["time_ratio"] for d in ok if d["batch"] == b]
        if rs:
            parts.append(f"step PORT/PT b{b} gmean {_gmean(rs):.2f}x max {max(rs):.2f}x"
                         + (f" (target <= {tgt}: {'met' if max(rs) <= tgt else 'NOT met'})" if tgt else ""))
    br = [d["beyond_ratio_rss"] for d in ok if d.get("beyond_ratio_rss") is not None]
    bp = [d["beyond_ratio_plan"] for d in ok if d.get("beyond_ratio_plan") is not None]
    if br:
        parts.append(f"memory beyond W/G/O PORT/PT max {max(br):.2f}x by RSS, {max(bp):.3f}x by plan "
                     f"(target <= 0.5: RSS {'met' if max(br) <= 0.5 else 'NOT met'}, "
                     f"plan {'met' if max(bp) <= 0.5 else 'NOT met'})")
    gv = [d["growth_vs_plan"] for d in ok]
    if gv:
        parts.append(f"PORT RSS growth/arena {min(gv):.2f}-{max(gv):.2f} "
                     f"(target 0.9-1.1: {'met' if min(gv) >= 0.9 and max(gv) <= 1.1 else 'NOT met'})")
    kt = sorted({d["kthreads"] for d in ok})
    parts.append(f"threads torch/kernel {'/'.join(map(str, sorted({d['threads'] for d in ok})))}/"
                 f"{'/'.join(map(str, kt))}")
    errs = len(rows) - len(ok)
    if errs:
        parts.append(f"{errs} config(s) failed")
    return "train: " + "; ".join(parts)


FINDINGS = """Where PORT's RSS growth above the arena comes from (investigated 2026-11-21, not fixed here): the steps
add only ~1 MB (column "setup + steps"); the excess is set-up. Trainer.__init__ traces twice (training graph,
then inference_graph), and each trace deep-copies the model and runs ShapeProp: resnet18 b8 measured stage by
stage (VmRSS, gc.collect() after each): trace +28 MiB, lower +2, inference trace (copy.deepcopy in
lower.inference_graph + another deepcopy in graph.trace + forward) +89 MiB, eval lower +0.1, then
malloc_trim(0) gives back 101 MiB, i.e. ~101 of the ~120 MiB are freed tensors (weight copies, ShapeProp
activations) that glibc keeps in its heap; only ~18 MiB (Python graph/program objects, tracemalloc: ~3.4 MiB of
Python heap for mobilenetv2) stays live. The arena itself is then touched in full by torch.zeros (RSS +arena
exactly). Fix candidates for the Trainer owner: malloc_trim(0) at the end of Trainer.__init__ on glibc, or
trace without copying weights (meta/fake tensors for ShapeProp, share parameters in the deepcopy memo).
`python bench/train.py --quick --trim` shows the effect (diagnostic, not written here). The "plan" ratio uses
PORT's planned scratch against PyTorch's RSS-measured figure. Timing: PyTorch's idle figures on this host are
36/86/306 ms (ResNet-18) and 18/32/98 ms (VGG-11) at batch 1/8/32 (DESIGN.md); PyTorch times far above those
mean the host was oversubscribed and 2-thread OpenMP pools stalled: read the ratios, not the times."""


def speed_table(rows: list[dict]) -> str:
    h = ("| model | batch | GFLOP/step | PyTorch ms (PORT's OpenMP policy) | PORT ms | PORT/PT (paired) "
         "| GFLOP/s PT / PORT | % of sgemm PT / PORT | p90/p50 PT / PORT | loaded/quiet PT / PORT (ratio) "
         "| loaded p90/p50 PT / PORT | PORT threads quiet / loaded |")
    out = [h, "|" + "---|" * h.count(" | ") + "---|"]
    for d in rows:
        if d.get("t_err") or d.get("p_err"):
            continue
        rr = d["p_lq"] / d["t_lq"] if d.get("p_lq") and d.get("t_lq") else None
        out.append(
            f"| {LABEL[d['model']]} | {d['batch']} | {_fmt((d['flops'] or 0) / 1e9, '.2f')} "
            f"| {d['t_ms']:.1f} ({_fmt(d['tp_ms'], '.1f')}) | {d['p_ms']:.1f} | {d['time_ratio']:.2f} ({_fmt(d['paired'])}) "
            f"| {_fmt(d.get('t_gflops'), '.0f')} / {_fmt(d.get('p_gflops'), '.0f')} "
            f"| {_fmt(100 * d['t_peak'] if d.get('t_peak') else None, '.0f')} / "
            f"{_fmt(100 * d['p_peak'] if d.get('p_peak') else None, '.0f')} "
            f"| {_fmt(d['t_p90'])} / {_fmt(d['p_p90'])} | {_fmt(d['t_lq'])} / {_fmt(d['p_lq'])} ({_fmt(rr)}) "
            f"| {_fmt(d['t_lp90'])} / {_fmt(d['p_lp90'])} "
            f"| {_fmt(d.get('p_threads_q'), 'd')} / {_fmt(d.get('p_threads_l'), 'd')} |")
    return "\n".join(out)


def speed_headline(rows: list[dict], gemm: dict) -> str:
    ok = [d for d in rows if not d.get("t_err") and not d.get("p_err")]
    parts = []
    for bs, tgt in (((1,), 0.5), ((8, 32), 0.85)):
        rs = [d["time_ratio"] for d in ok if d["batch"] in bs]
        if rs:
            worst = max(ok, key=lambda d: d["time_ratio"] if d["batch"] in bs else -1)
            parts.append(f"step PORT/PT b{'+'.join(map(str, bs))} max {max(rs):.2f}x ({LABEL[worst['model']]} "
                         f"b{worst['batch']}) (target <= {tgt}: {'met' if max(rs) <= tgt else 'NOT met'})")
    lq = [d["p_lq"] / d["t_lq"] for d in ok if d.get("p_lq") and d.get("t_lq")]
    if lq:
        parts.append(f"loaded/quiet PORT vs PT max {max(lq):.2f}x (target <= 1.2: {'met' if max(lq) <= 1.2 else 'NOT met'})")
    p9 = [d["p_p90"] for d in ok if d.get("p_p90")]
    if p9:
        parts.append(f"PORT p90/p50 max {max(p9):.2f} (target <= 1.3: {'met' if max(p9) <= 1.3 else 'NOT met'})")
    pk = [d["p_peak"] for d in ok if d.get("p_peak")]
    if pk:
        parts.append(f"PORT whole-step GFLOP/s {min(pk) * 100:.0f}-{max(pk) * 100:.0f}% of sgemm "
                     f"({max(gemm.values()):.0f} GFLOP/s)")
    return "speed: " + "; ".join(parts)


def speed_notes(a, gemm: dict, load0, load1) -> str:
    return (f"Step times of PORT's default all-C plan (`Trainer(model, x, backend=\"c\")`) against PyTorch eager in a "
            f"process where `import port` left libgomp's defaults (PORT_OMP_WAIT_POLICY=default; the first PyTorch "
            f"column) and against PyTorch eager in a process that imported port first, under PORT's own policy "
            f"(in brackets: {_policy()}). "
            f"The three workers of one (model, batch) alternate blocks of consecutive steps (rotating who goes "
            f"first; a block lasts >= {BLOCK_S * 1e3:.0f} ms, at most {MAX_BLOCK} steps, its first step untimed: "
            f"it shares the cores with the previous worker's OpenMP threads, PyTorch's and PORT's alike, which "
            f"spin for a while after their last region, a cost no training loop running alone pays); "
            f"{f'a second phase repeats the rounds (after {LOADED_WARMUP_STEPS} warm-up steps) with one CPU-bound background process (a Python busy loop) running: loaded/quiet = median loaded step / median quiet step per implementation, and (ratio) = PORT/PyTorch of those' if not a.no_loaded else 'no loaded phase (--no-loaded)'}. "
            f"PyTorch runs its 2 threads; PORT runs the Trainer's default thread governor (`threads=\"auto\"`, up to 2: "
            f"fewer while steps stall, the same bits at any count), whose settled count at the end of each phase is "
            f"the last column. "
            f"GFLOP/step: forward + backward FLOPs of one step (torch FlopCounterMode); % of sgemm: step GFLOP/s over the "
            f"machine's measured sgemm rate (2048^3, {a.threads} threads: PORT's GEMM {gemm['port']:.0f}, torch.mm "
            f"{gemm['torch']:.0f} GFLOP/s; the larger). Load average {load0[0]:.1f} at start, {load1[0]:.1f} at end.")


def _policy() -> str:
    v = _USER_OMP.get("PORT_OMP_WAIT_POLICY")
    if v in (None, "", "default"):
        return "libgomp's defaults, as PyTorch's: a second sample of the first column's configuration"
    return f"PORT_OMP_WAIT_POLICY={v}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2, help="torch + kernel threads in both (default 2)")
    ap.add_argument("--trim", action="store_true",
                    help="malloc_trim(0) after set-up in both workers (diagnostic; implies --no-write)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--no-loaded", action="store_true", help="skip the phase with a background CPU-bound process")
    ap.add_argument("--gemm-worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker", nargs=7, metavar=("IMPL", "MODEL", "BATCH", "STEPS", "WARMUP", "THREADS", "TRIM"))
    a = ap.parse_args()
    if a.gemm_worker:
        print(json.dumps(gemm_worker(a.gemm_worker)), flush=True)
        return
    if a.worker:
        impl, name, b, s, w, th, tm = a.worker
        print(json.dumps(worker(impl, name, int(b), int(s), int(w), int(th), bool(int(tm)))), flush=True)
        return
    if a.trim or a.threads != 2:
        a.no_write = True

    names = [m for m in a.models.split(",") if m]
    batches = [int(b) for b in (a.batches or ("1,8" if a.quick else "1,8,32")).split(",")]
    steps = a.steps or (5 if a.quick else 20)
    # warm-up steps: the thread governor's first probe (after its 3 warm-up steps and a 5-step window, 2 steps
    # at the other count) falls inside them
    warmup = a.warmup or (6 if a.quick else 14)
    max_s = 20.0 if a.quick else 120.0       # cap on the timed rounds of one (model, batch)
    t_start = time.time()
    load0 = os.getloadavg()
    genv = dict(os.environ, PYTHONPATH=str(ROOT))
    gemm = json.loads(subprocess.run([sys.executable, str(Path(__file__).resolve()), "--gemm-worker", str(a.threads)],
                                     capture_output=True, text=True, env=genv, cwd=str(ROOT), check=True
                                     ).stdout.strip().splitlines()[-1])
    gemm_rate = max(gemm.values())
    print(f"sgemm 2048^3, {a.threads} threads: PORT's GEMM {gemm['port']:.0f} GFLOP/s, torch.mm {gemm['torch']:.0f}",
          flush=True)
    rows, raw = [], []
    for b in batches:
        for i, name in enumerate(names):
            # alternate which implementation runs first, so slow drift in machine load hits both
            first = IMPLS[(i + b) % len(IMPLS)]
            res = measure(name, b, steps, warmup, a.threads, a.trim, first, max_s=max_s, loaded=not a.no_loaded)
            t, p, tp = res["torch"], res["port"], res["torchp"]
            raw += [t, p, tp]
            d = derive(t, p, tp, gemm_gflops=gemm_rate)
            rows.append(d)
            print(f"{LABEL[name]:12s} b{b:<3d} PT {_fmt(d['t_ms'], '.1f')} ms  PORT {_fmt(d['p_ms'], '.1f')} ms  "
                  f"ratio {_fmt(d['time_ratio'])}  PT growth {_fmt(d.get('t_growth', 0) / MB, '.0f')} MB  "
                  f"PORT growth {_fmt(d.get('p_growth', 0) / MB, '.0f')} MB (arena "
                  f"{_fmt(d.get('arena', 0) / MB, '.0f')} MB)  {d.get('t_err') or ''}{d.get('p_err') or ''}",
                  flush=True)
    wall = time.time() - t_start
    load1 = os.getloadavg()
    tab = table(rows)
    head = headline(rows)
    kt = sorted({d["kthreads"] for d in rows if "kthreads" in d})
    method = sorted({d["method"] for d in rows if "method" in d})
    cmd = ("python bench/train.py" + (" --quick" if a.quick else "") + (f" --batches {a.batches}" if a.batches else "")
           + (f" --models {a.models}" if a.models != ",".join(MODELS) else ""))
    notes = f"""`{cmd}` ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()}-vCPU host shared with other jobs: load average {load0[0]:.1f} at start, {load1[0]:.1f} at end; {wall:.0f} s total). Every (model, batch, implementation) in a fresh subprocess; the PyTorch and the PORT worker of one (model, batch) are set up one after the other, then driven in alternating blocks of consecutive steps (who goes first alternates each round; a block's first step untimed, see Speed below) so machine-load drift hits both: {warmup} warm-up steps (whole blocks; PORT's thread governor makes its first probe in them), then rounds until each worker has {steps} timed steps (at least 3 rounds; capped at {max_s:.0f} s per configuration); median step time, their ratio, and in brackets the median of the per-round PORT/PyTorch ratios. Same model (seed 0, train mode), same random data (a new batch every step, the same sequence in every worker: a fixed batch is memorised within ~20 steps and its denormal gradients slow both implementations 10-30x), SGD lr 0.01 momentum 0.9 (PyTorch: torch.optim.SGD, zero_grad(set_to_none=True)). torch.set_num_threads(2) and port.exec.capi.set_num_threads(2) in both; PORT's Trainer governed its kernels' thread count (its default, `threads="auto"`, up to 2); the threads column shows port.exec.capi.get_num_threads() after the last step.

{tab}

How memory is measured (/proc/self/status): `pre` = VmRSS after imports + model + data, before the optimizer/Trainer is built; VmHWM is then reset ({', '.join(method)}: writing "5" to /proc/self/clear_refs after set-up) and `peak` = VmHWM after all steps. RSS growth = peak - pre (for PORT split into set-up = trace + lower + arena, and the steps). "Beyond W/G/O" = RSS growth minus the persistent bytes allocated after `pre`: PyTorch 2 x parameter bytes (grads + momentum; its weights are in `pre`), PORT the arena's persistent part (its own copy of weights, grads, momentum, BN buffers; the torch module's weights stay in `pre`). "plan" = PORT's planned scratch (activations + workspace) from memory_report(). PORT growth / arena: RSS growth over the planned arena bytes (target 0.9-1.1). loss0 = first-step loss (same model, same data: should agree; MobileNetV2 has dropout, whose masks differ).
"""
    with open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "port_bench_train.json"), "w") as f:
        json.dump(raw, f)
    stab, shead = speed_table(rows), speed_headline(rows, gemm)
    snotes = speed_notes(a, gemm, load0, load1)
    print()
    print(tab)
    print()
    print(stab)
    if not a.no_write:
        from _results import machine_line, write_section
        write_section("Training", notes + "\n" + FINDINGS + "\n\n" + "### Speed (issue 14)\n\n"
                      + machine_line(cmd, t_start, load0[0])
                      + "\n\n" + snotes + "\n\n" + stab + "\n\n" + head + "\n" + shead + "\n")
    print(head)
    print(shead)


if __name__ == "__main__":
    main()
