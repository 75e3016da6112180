"""End-to-end benchmark (issue 7): profile -> solve under a memory budget -> train with the plan, against
PyTorch eager, on ``host``.

    python bench/e2e.py --quick     # ResNet-18 + MobileNetV2 at batch 8, budgets 100/50/25 % (< 8 min)
    python bench/e2e.py             # ResNet-18, VGG-11, MobileNetV2 at batch 8 and 32
    options: --models resnet18,vgg11 --batches 8 --budgets 1,0.5,0.25 --steps N --warmup N
             --profile-max-s S --solve-s S --no-write
    python bench/e2e.py --speed-list --out /tmp/speed.md    # issue 54: published models, default plan vs eager
    python bench/e2e.py --models tv.mobilenet_v3_small,hf.llama_lm --batches 8,32 --budgets 1,0.5
    python bench/e2e.py --all       # every model of bench/published.py, default plan, batch 8

Published models (bench/published.py names, issue 54): the same workers built from the model's Spec at the
batch asked (transformers: sequences at the list's token count); budget 1 is Trainer's default plan (no profile,
no solve), other budgets are solved as below (profile --profile-max-s 60 by default, no calibration rounds
unless --calib-rounds); the eager worker and the PORT workers alternate single steps. Table: step ms PORT/eager
against the issue's targets (SPEED_TARGETS, else 1.2x), process growth of the 50% worker / eager's (target 0.6x
on MEMORY_LIST), the worst three rows' time by PORT kernel and by eager aten op; the headline last.
``--budgets 0.5`` alone measures the growth only (no default-plan worker, no speed figures).

Process growth (both workers, one method: process_growth): VmRSS after imports, model and batch, then VmHWM
reset; growth = the larger of the set-up's peak and the steps' peak (VmHWM reset again after set-up) minus that
baseline. It counts every resident page the training adds: PORT's arena, heap, stacks, and the code pages the
steps touch (eager's first backward maps ~22 MiB of libtorch's code on MobileNetV3-small b8; a PORT plan with
ops on cpu-torch maps them too, which the profile's engine footprint prices). Tables
go to bench/RESULTS.md, one section per batch set (--all: a section of its own, "every published model";
--no-write: not written; --out also writes the table).

Per (model, batch):
  1. PyTorch eager worker (fresh subprocess, torch.optim.SGD lr 0.01 momentum 0.9, 2 threads) runs
     ``--warmup`` steps; its peak training memory is measured (RSS: VmHWM after reset - VmRSS before the
     optimizer exists, see bench/train.py) and defines
         EAGER TOTAL = parameter + buffer bytes (the weights, resident before the baseline)
                       + eager RSS growth (peak - pre: grads + momentum + activations + autograd/allocator).
     PORT's budget at fraction f = f x EAGER TOTAL (the budget the solver gets covers PORT's whole arena:
     its weights, grads, momentum, buffers, activations and workspace).
  2. profile the traced graph on ``host`` (all variants, cache in runs/bench_profiles/host/, time budget
     ``--profile-max-s``: entries it does not reach are roofline-modeled and counted in the notes), solve
     with HiGHS (allow_early_updates=True), verify with port.verify.simulate -> predicted step ms + peak bytes.
  3. one fresh PORT worker per feasible budget (Trainer(model, x, plan=plan)); the eager worker and the PORT
     workers are then driven in alternating single steps (order rotates each round), ``--steps`` timed rounds.
     Afterwards each PORT worker runs 3 instrumented steps (Trainer.profile_step: per-call kernel ms) so the
     step wall time splits into kernels + executor overhead.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
# bench/ holds a profile.py that would shadow the stdlib module torch._dynamo imports: bench/ goes last
sys.path[:] = [str(ROOT)] + [q for q in sys.path if Path(q or ".").resolve() != BENCH] + [str(BENCH)]

MODELS = ("resnet18", "vgg11", "mobilenetv2")
LABEL = {"resnet18": "ResNet-18", "vgg11": "VGG-11", "mobilenetv2": "MobileNetV2"}
LABEL = type("Labels", (dict,), {"__missing__": lambda self, k: k})(LABEL)
MB = 1e6
PROFILE_DIR = ROOT / "runs" / "bench_profiles" / "host"
# PORT workers' Trainer(threads=...): PORT_E2E_THREADS=auto (the default, as Trainer's; not with --fixed-threads)
# lets the step-time governor pick the kernels' thread count (port.exec.threads); unset: the fixed count of --threads
THREADS_SETTING = "auto" if os.environ.get("PORT_E2E_THREADS") == "auto" else None
PLAN_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / "port_e2e_plans"
LR, MOM = 0.01, 0.9
TRIM = os.environ.get("PORT_E2E_TRIM", "1") == "1"
QUICK = [False]     # --quick: the profiler's quick timing (3 blocks of 5 ms), re-timed in program order


def _train_module():
    """bench/train.py as a module (its RSS helpers); None if it cannot be imported."""
    try:
        spec = importlib.util.spec_from_file_location("_bench_train", BENCH / "train.py")
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        m._status, m._Sampler  # noqa: B018
        return m
    except Exception:  # noqa: BLE001 - a colleague may be editing it: fall back to the local copy
        return None


def _status() -> dict[str, int]:
    from _results import proc_status
    return proc_status()


DEFAULT_PLAN = "-"      # a worker's plan argument: Trainer's default plan (port.lower.lower.default_plan)


def is_published(name: str) -> bool:
    """A model of bench/published.py (``tv.``, ``timm.``, ``hf.``, ``peft.``, ``hand.`` names), not of port.models."""
    return "." in name


def _published():
    """bench/published.py as a module, with the zoo (torchvision, timm, transformers, peft) imported first."""
    import published
    published.import_zoo()
    return published


def build_case(name: str, batch: int):
    """(model in train mode, input, labels, loss_of(model, x, y)) of a zoo model (port.models: random input,
    10 classes) or a published one (bench/published.py's Spec at ``batch``: its input shape, token count and
    labels; dropout and stochastic depth off, as bench/coverage.py trains it)."""
    import dataclasses
    import torch
    if is_published(name):
        P = _published()
        spec = dataclasses.replace(P.MODELS[name], batch=batch)
        model = P.deterministic(spec.build())
        model.train()
        x, y = P.batch_of(spec)
        return model, x, y, P.eager_loss
    import torch.nn.functional as F
    from port import models
    model = models.get(name, seed=0)
    model.train()
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(batch, *models.INPUT_SHAPES[name], generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    return model, x, y, lambda m, xx, yy: F.cross_entropy(m(xx), yy)


# ----------------------------------------------------------------------------- worker (fresh process)
def worker(impl: str, name: str, batch: int, threads: int, plan_path: str) -> None:
    from port.exec import capi
    capi.configure_openmp_env()     # PORT's wait policy before torch loads the runtime (eager: left at defaults)
    import torch
    torch.set_num_threads(threads)
    import torch.nn.functional as F  # noqa: F401  (same heavy imports in both workers before the baseline)
    from port import models  # noqa: F401
    capi.set_num_threads(threads)
    from port.train.optim import SGD as PortSGD
    from port.train.trainer import Trainer
    from port.train.memwatch import release_freed_heap, reset_peak
    import torch._dynamo  # noqa: F401  (same heavy imports in both workers before the baseline)
    import torch.fx  # noqa: F401
    import port.exec.backends.c  # noqa: F401
    import port.ir.trace  # noqa: F401
    import port.lower.lower  # noqa: F401
    T = _train_module()
    status = T._status if T else _status

    model, x, y, loss_of = build_case(name, batch)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    gc.collect()
    pre = status()["VmRSS"]
    # the growth's window opens here, in both workers: VmHWM reset to VmRSS, so the set-up's peak (setup_hwm)
    # is the peak since this baseline, not the process's since start (imports, building the model)
    pre_reset = reset_peak()
    t0 = time.perf_counter()
    tr = None
    if impl == "torch":
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=MOM)

        def step() -> float:
            opt.zero_grad()
            loss = loss_of(model, x, y)
            loss.backward()
            opt.step()
            return loss.item()
        report = None
    else:
        import warnings
        with warnings.catch_warnings(record=True) as wl:
            warnings.simplefilter("always")
            tr = Trainer(model, x, plan=None if plan_path == DEFAULT_PLAN else plan_path,
                         optimizer=PortSGD(LR, momentum=MOM), backend="c", threads=THREADS_SETTING)
        if any("digest" in str(w.message) for w in wl):
            print("plan digest mismatch", file=sys.stderr)

        def step() -> float:
            return tr.step(x, y)
        report = tr.memory_report()
    setup_s = time.perf_counter() - t0
    gc.collect()
    if TRIM:      # hand the set-up's freed heap (tracing, lowering) back to the OS, in both workers
        release_freed_heap()
    setup = status()["VmRSS"]
    # the set-up's own peak since the baseline (tracing, lowering); without the reset (no clear_refs) the
    # process's peak since start, an overestimate
    setup_hwm = status().get("VmHWM", setup) if pre_reset else max(setup, status().get("VmHWM", setup))
    sampler = None
    try:
        if not reset_peak():
            raise OSError("clear_refs not writable")
        method = "clear_refs"
        if status()["VmHWM"] > setup + (4 << 20):
            raise OSError("VmHWM not reset")
    except OSError:
        method, sampler = "sampler", (T._Sampler() if T else None)

    held_peak = [0]      # the steps' peak before a calibration's instrumented steps (see "calib")

    def peak() -> int:
        st = status()
        if sampler is None:
            return max(held_peak[0], st["VmHWM"])
        return max(held_peak[0], sampler.peak, st["VmRSS"])

    out = sys.stdout
    out.write(json.dumps({"ready": True, "setup_s": setup_s}) + "\n")
    out.flush()
    losses = []
    extra: dict = {}
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "step":
            t, c = time.perf_counter(), time.process_time()
            loss = step()
            t, c = time.perf_counter() - t, time.process_time() - c
            losses.append(loss)
            out.write(json.dumps({"t": t, "c": c, "loss": loss}) + "\n")
        elif cmd == "mem":
            out.write(json.dumps({"peak": peak(), "pre": pre, "setup_hwm": setup_hwm, "param_bytes": param_bytes,
                                  "buffer_bytes": buffer_bytes}) + "\n")
        elif cmd == "prof" and tr is None:
            # eager's own op times (torch.profiler, 3 steps: self CPU ms per step by aten op), to set against
            # PORT's per-kernel ms; after the timed steps (it trains on), the steps' peak taken before it
            pk = peak()
            extra = {"ms_by_kernel": eager_op_ms(step), "peak_before_prof": pk}
            out.write(json.dumps({"ok": True}) + "\n")
        elif cmd == "prof":
            # instrumented steps (weights restored afterwards): per-call kernel ms vs the un-instrumented wall
            pk = peak()
            runs = [tr.profile_step(x, y) for _ in range(3)]
            by_backend: dict[str, float] = {}
            n_backend: dict[str, int] = {}
            r = runs[len(runs) // 2]
            for row in r["calls"]:
                by_backend[row["backend"]] = by_backend.get(row["backend"], 0.0) + row["ms"]
                n_backend[row["backend"]] = n_backend.get(row["backend"], 0) + 1
            op_ms = {k: statistics.median(q["op_ms"].get(k, 0.0) for q in runs) for k in runs[0]["op_ms"]}
            by_kernel: dict[str, float] = {}
            for row in r["calls"]:
                by_kernel[row["kernel"]] = by_kernel.get(row["kernel"], 0.0) + row["ms"]
            extra = {"kernel_ms": statistics.median(q["total_ms"] for q in runs), "calls_by_backend": n_backend,
                     "ms_by_kernel": by_kernel,
                     "op_ms": op_ms,
                     "ms_by_backend": by_backend, "arena_peak_live": max(r["timeline_bytes"]),
                     "peak_before_prof": pk}
            out.write(json.dumps({"ok": True}) + "\n")
        elif cmd == "calib":     # "calib [untimed steps]"
            # the calibration run of a candidate plan: 2 untimed steps, the wall median of 9, then the per-op
            # in-plan times of 3 instrumented steps (weights restored afterwards). The instrumentation's own
            # copies are not training memory: the peak so far is kept, the heap handed back, the peak reset
            for _ in range(int(args[0]) if args else 2):
                step()
            ws = []
            for _ in range(9):
                t1 = time.perf_counter()
                step()
                ws.append((time.perf_counter() - t1) * 1e3)
            held_peak[0] = max(held_peak[0], peak())
            runs = [tr.profile_step(x, y) for _ in range(3)]
            op_ms = {k: statistics.median(q["op_ms"].get(k, 0.0) for q in runs) for k in runs[0]["op_ms"]}
            del runs
            gc.collect()
            release_freed_heap()
            if method == "clear_refs":
                reset_peak()
            out.write(json.dumps({"wall_ms": statistics.median(ws), "op_ms": op_ms}) + "\n")
        elif cmd == "done":
            break
        out.flush()
    st = status()
    pk = extra.get("peak_before_prof", peak())
    if tr is not None and report is not None:
        report = dict(report, step_fixed_ms=_step_fixed_ms(tr, x, y))   # after the peak is read: not a user's step
    rec = {"impl": impl, "model": name, "batch": batch, "steps_run": len(losses), "setup_s": setup_s,
           "pre": pre, "setup": setup, "setup_hwm": setup_hwm, "peak": pk, "end": st["VmRSS"],
           "method": method, "param_bytes": param_bytes, "buffer_bytes": buffer_bytes, "report": report,
           "kernel_threads": capi.get_num_threads(), "loss_first": losses[0] if losses else None,
           "thread_events": [[e.step, e.from_threads, e.to_threads, e.why] for e in tr.thread_events] if tr else [],
           **extra}
    out.write(json.dumps(rec) + "\n")
    out.flush()


def _step_fixed_ms(tr, x, y) -> float | None:
    """Fixed per-step cost of Trainer.step outside the program's calls: gradient zeroing, input + label copy,
    loss readback (what step() does around run_main/run_updates), median of 30; None for keyword inputs. Run
    after the steps' memory is read, as bench instrumentation, not part of the measured training."""
    import torch
    if not isinstance(x, torch.Tensor):
        return None
    ex = tr.executor
    fx = []
    for _ in range(30):
        t1 = time.perf_counter()
        ex.zero_grads()
        ex.input.copy_(x)
        ex.labels.copy_(y)
        float(ex.loss)
        fx.append((time.perf_counter() - t1) * 1e3)
    return statistics.median(fx)


def eager_op_ms(step, steps: int = 3) -> dict[str, float]:
    """{aten op: self CPU ms per step} of ``steps`` eager training steps under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as pr:
        for _ in range(steps):
            step()
    return {e.key: e.self_cpu_time_total / 1e3 / steps for e in pr.key_averages() if e.self_cpu_time_total > 0}


_TRAIN = _train_module()
if _TRAIN is None:
    raise SystemExit("bench/e2e.py needs bench/train.py (its worker driver and RSS helpers)")


class Worker(_TRAIN.Worker):
    """bench/train.py's step-by-step worker driver, launching this script's workers (which run a plan)."""

    def __init__(self, impl: str, name: str, batch: int, threads: int, plan_path: str = DEFAULT_PLAN):
        self.impl, self.name, self.batch, self.timeout = impl, name, batch, 600
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", impl, name, str(batch), str(threads),
               plan_path]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for k, v in _TRAIN._USER_OMP.items():     # nothing PORT set in this driver leaks into a worker
            env.pop(k, None)
            if v is not None:
                env[k] = v
        if impl == "torch" and _TRAIN._USER_OMP["PORT_OMP_WAIT_POLICY"] is None:
            env["PORT_OMP_WAIT_POLICY"] = "default"   # PyTorch eager with libgomp's defaults
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env, cwd=str(ROOT))
        self.error: str | None = None
        self.times: list[float] = []
        self._read()

    def send(self, cmd: str) -> dict | None:
        return self._send(cmd)


# ----------------------------------------------------------------------------- driver
def get_profile(name: str, batch: int, graph, max_s: float, threads: int):
    from port.cost.measure import entry_keys
    from port.config import load_device
    from port.pipeline import remeasure
    path = PROFILE_DIR / f"{name}_b{batch}.json"
    t = time.perf_counter()
    prof, rep = remeasure(graph, load_device("host"), path, quick=QUICK[0], max_time_s=max_s, threads=threads)
    secs = time.perf_counter() - t
    n_keys = len(entry_keys(graph, load_device("host")))
    n_meas = sum(e.measured for e in prof.entries)
    return prof, {"path": str(path.relative_to(ROOT)), "seconds": secs, "measured_now": rep.measured,
                  "reused": rep.reused, "modeled": n_keys - n_meas, "entries": n_keys, "failed": len(rep.failed)}


LOADED_SETTLE_STEPS = 8     # untimed steps under load before the loaded calibration (a governor settles)


def _correct(graph, bprof, plan, c: dict, label: str):
    """``bprof`` corrected by one worker's "calib" answer ``c`` (port.cost.measure.correct_from_run)."""
    from port.cost.measure import correct_from_run
    ids = {o.name: o.id for o in graph.ops}
    op_ms = {ids[k]: v for k, v in c["op_ms"].items() if k in ids}
    return correct_from_run(graph, bprof, plan, op_ms, c["wall_ms"], label)


def run_config(name: str, batch: int, fracs: list[float], a) -> dict:
    import torch
    from port.errors import InfeasibleBudgetError
    from port.ir.trace import trace
    from port.train.optim import SGD as PortSGD
    from port.plan.io import save_plan
    from port.verify.simulate import simulate
    from port.solver import solve

    row: dict = {"model": name, "batch": batch, "budgets": {}}
    torch.set_num_threads(a.threads)
    model, x, _y, _ = build_case(name, batch)
    graph = trace(model, x, optimizer=PortSGD(LR, momentum=MOM).graph_name)
    del model
    prof = None       # profiled when a budget is solved (the default plan needs none)

    # 1. eager: warm-up steps, then its peak defines the budgets
    eager = Worker("torch", name, batch, a.threads)
    for _ in range(a.warmup):
        eager.send("step")
    m = eager.send("mem")
    if m is None:
        row["error"] = f"eager worker: {eager.error}"
        return row
    eager_total = m["param_bytes"] + m["buffer_bytes"] + process_growth(m)
    row["eager_total_budgetbase"] = eager_total

    # 2. solve per budget
    PLAN_DIR.mkdir(parents=True, exist_ok=True)
    workers: dict[str, Worker] = {"torch": eager}
    priced: dict[str, tuple] = {}       # budget key -> (plan, its calibrated profile)
    for f in fracs:
        key = f"{f:g}"
        b: dict = {"frac": f, "budget": int(f * eager_total)}
        row["budgets"][key] = b
        if getattr(a, "default_plan", False) and f == 1.0:    # published models: Trainer's default plan
            b["default_plan"] = True
            w = Worker("port", name, batch, a.threads, DEFAULT_PLAN)
            if w.error:
                b["error"] = f"port worker: {w.error}"
                continue
            workers[key] = w
            continue
        if prof is None:
            prof, row["profile"] = get_profile(name, batch, graph, a.profile_max_s, a.threads)
        t = time.perf_counter()
        try:
            plan = solve(graph, prof, b["budget"], solver="highs", time_limit_s=a.solve_s, gap=0.01,
                         allow_early_updates=True)
        except InfeasibleBudgetError as e:
            b["infeasible"] = e.min_feasible_bytes
            b["solve_s"] = time.perf_counter() - t
            continue
        except Exception as e:  # noqa: BLE001
            b["error"] = f"solve: {type(e).__name__}: {e}"[:200]
            continue
        b["solve_s"] = time.perf_counter() - t
        bprof = prof
        # calibration (issue 12): run a few instrumented steps of the candidate plan, correct the profile with
        # its in-plan times and per-step overhead (port.cost.measure.correct_from_run, as `port train --replan`
        # does), solve again; until the re-solved plan is the one just calibrated, at most a.calib_rounds
        # re-solves. A re-solved plan that differs is calibrated once more (no re-solve), so the plan that is
        # timed is always priced by a profile corrected with its own run. Each calibration runs in the worker
        # that trains that plan: the last one is the worker then timed, so prediction and measurement come from
        # one process (two processes of one plan differ by up to 40% on this VM).
        b["calib"] = []

        def calibrate(plan, bprof, rnd):
            pp = PLAN_DIR / f"{name}_b{batch}_{key}_calib{rnd}.json"
            save_plan(plan, pp, graph=graph)
            cw = Worker("port", name, batch, a.threads, str(pp))
            c = None if cw.error else cw.send("calib")
            if c is None:
                err = cw.error
                cw.finish()
                raise RuntimeError(f"calibration worker: {err}")
            before = simulate(plan, graph, bprof).step_ms
            bprof, changed, _n, over = _correct(graph, bprof, plan, c, f"bench calibration {rnd + 1}")
            b["calib"].append({"predicted_ms": before, "wall_ms": c["wall_ms"], "changed": changed,
                               "overhead_ms": over})
            return bprof, cw

        def decisions(p):
            return (tuple((d.accelerator, d.variant) for d in p.ops), tuple(sorted(p.recompute)),
                    tuple(sorted(p.paged)), tuple(sorted(p.early_updates)))
        w = None
        try:
            for rnd in range(a.calib_rounds + 1):
                if a.calib_rounds == 0:
                    break
                bprof, w = calibrate(plan, bprof, rnd)
                if rnd == a.calib_rounds:
                    break
                new = solve(graph, bprof, b["budget"], solver="highs", time_limit_s=a.solve_s, gap=0.01,
                            allow_early_updates=True)
                if decisions(new) == decisions(plan):
                    break
                w.finish()
                w, plan = None, new
        except Exception as e:  # noqa: BLE001
            b["error"] = f"calibration: {type(e).__name__}: {e}"[:200]
        if b.get("error"):
            if w is not None:
                w.finish()
            continue
        sim = simulate(plan, graph, bprof)
        pred_ops: dict[str, list] = {}
        for label, acc, s0, s1 in sim.gantt:
            q = pred_ops.setdefault(label, [acc, 0.0])
            q[1] += s1 - s0
        b["pred_ops"] = pred_ops
        b.update(status=plan.status, gap=plan.gap, sim_ms=sim.step_ms, sim_peak=sim.peak_bytes,
                 engine_bytes=sim.breakdown.get("engine_bytes", 0),
                 sim_arena_peak=sim.arena_peak_bytes,
                 plan_ms=plan.predicted_step_ms, recompute=len(plan.recompute), early=len(plan.early_updates),
                 paged=len(plan.paged), torch_ops=sum(d.accelerator == "cpu-torch" for d in plan.ops),
                 n_ops=len(plan.ops), variants=sum(d.variant != "plain" for d in plan.ops),
                 calls=len(plan.ops) + len(plan.recompute))
        if w is None:
            pp = PLAN_DIR / f"{name}_b{batch}_{key}.json"
            save_plan(plan, pp, graph=graph)
            w = Worker("port", name, batch, a.threads, str(pp))
        if w.error:
            b["error"] = f"port worker: {w.error}"
            continue
        workers[key] = w
        priced[key] = (plan, bprof)

    # 3. alternate single steps: a.warmup untimed rounds (the PORT workers' first steps: arena first touch,
    # thread pools), then a.steps timed rounds; the order rotates every round
    order = list(workers)
    for r in range(a.warmup + a.steps):
        k = r % len(order)
        for key in order[k:] + order[:k]:
            o = workers[key].send("step")
            if o is not None and r >= a.warmup:
                workers[key].times.append(o["t"])
            if a.settle_ms > 0:
                time.sleep(a.settle_ms / 1e3)
    # 3a. solo blocks (issue 12's prediction target): a training loop runs its steps back to back, so each
    # worker runs a block of consecutive steps (the first of each block untimed: caches and thread pools after
    # the other workers), in rotating order, twice; the prediction is held against these medians, the paired
    # PORT/PT ratios above against the alternating ones
    for rep in range(2 if a.solo_steps > 0 else 0):
        for key in (order if rep == 0 else order[::-1]):
            for j in range(a.solo_steps + 1):
                o = workers[key].send("step")
                if o is not None and j > 0:
                    workers[key].__dict__.setdefault("times_solo", []).append(o["t"])
            if a.settle_ms > 0:
                time.sleep(a.settle_ms / 1e3)
    # 3b. time parts (issue 12): the same rounds again with one busy CPU-bound process beside them (loaded)
    if a.loaded:
        from _results import busy_process
        busy = busy_process()
        try:
            time.sleep(0.5)
            # the prediction under load is the calibrated one, as `port train --replan` makes it on a loaded
            # device: each PORT worker's calibration run under this load corrects its plan's profile
            for key, w in workers.items():
                if key == "torch" or key not in priced:
                    continue
                c = w.send(f"calib {LOADED_SETTLE_STEPS}")
                if c is not None:
                    plan, bprof = priced[key]
                    lp, *_ = _correct(graph, bprof, plan, c, "bench calibration under load")
                    row["budgets"][key]["sim_ms_loaded"] = simulate(plan, graph, lp).step_ms
                    row["budgets"][key]["calib_loaded_wall_ms"] = c["wall_ms"]
            for r in range(a.steps):
                k = r % len(order)
                for key in order[k:] + order[:k]:
                    o = workers[key].send("step")
                    if o is not None:
                        workers[key].__dict__.setdefault("times_loaded", []).append(o["t"])
                    if a.settle_ms > 0:
                        time.sleep(a.settle_ms / 1e3)
        finally:
            busy.kill()
            busy.wait()
    for key, w in workers.items():
        if key != "torch" or getattr(a, "default_plan", False):
            w.send("prof")
    for key, w in workers.items():
        rec = w.finish()
        rec["times"] = w.times
        rec["median_ms"] = statistics.median(w.times) * 1e3 if w.times else None
        ts = w.__dict__.get("times_solo") or []
        rec["median_solo_ms"] = statistics.median(ts) * 1e3 if ts else None
        tl = w.__dict__.get("times_loaded") or []
        rec["median_loaded_ms"] = statistics.median(tl) * 1e3 if tl else None
        if key == "torch":
            row["eager"] = rec
        else:
            row["budgets"][key]["port"] = rec
    return row


def _f(v, spec=".1f", none="-"):
    return none if v is None else format(v, spec)


def derive(row: dict) -> list[dict]:
    """One flat record per (model, batch, budget)."""
    out = []
    e = row.get("eager", {})
    if "error" in e or "median_ms" not in e:
        return [{"model": row["model"], "batch": row["batch"], "error": row.get("error") or e.get("error")}]
    e_ms = e["median_ms"]
    e_growth = process_growth(e)
    e_total = e["param_bytes"] + e["buffer_bytes"] + e_growth
    base = row["eager_total_budgetbase"]
    for key, b in row["budgets"].items():
        d = {"model": row["model"], "batch": row["batch"], "frac": b["frac"], "budget": b["budget"],
             "e_ms": e_ms, "e_total": e_total, "e_growth": e_growth, "base": base}
        if "infeasible" in b:
            d["min_feasible"] = b["infeasible"]
            out.append(d)
            continue
        p = b.get("port")
        if b.get("error") or p is None or "error" in p or not p.get("times"):
            d["error"] = b.get("error") or (p or {}).get("error", "no steps")
            out.append(d)
            continue
        rep = p["report"]
        d.update(p_ms=p["median_ms"], ratio=p["median_ms"] / e_ms,
                 paired=statistics.median(pt / et for pt, et in zip(p["times"], row["eager"]["times"])),
                 arena=rep["train_arena_bytes"], arena_all=rep["arena_bytes"], p_growth=process_growth(p),
                 p_setup=p["setup"] - p["pre"], p_steps=p["peak"] - p["setup"],
                 sim_ms=b["sim_ms"], sim_peak=b["sim_peak"], sim_arena_peak=b["sim_arena_peak"], kernel_ms=p.get("kernel_ms"),
                 engine=b.get("engine_bytes", 0),
                 calls=sum(p.get("calls_by_backend", {}).values()), status=b["status"], recompute=b["recompute"],
                 early=b["early"], torch_ops=b["torch_ops"], n_ops=b["n_ops"], variants=b["variants"],
                 solve_s=b["solve_s"], steps=len(p["times"]))
        d["p_ms_solo"] = p.get("median_solo_ms")      # consecutive steps, as a training loop runs them
        d["t_err_alt"] = b["sim_ms"] / d["p_ms"] - 1
        d["t_err"] = d["t_err_alt"]
        d["t_err_solo"] = b["sim_ms"] / d["p_ms_solo"] - 1 if d["p_ms_solo"] else None
        d["calib"] = [(c.get("predicted_ms"), c.get("wall_ms")) for c in b.get("calib", [])]   # per round
        d["p_ms_loaded"] = p.get("median_loaded_ms")     # one busy CPU-bound process beside it
        d["sim_ms_loaded"] = b.get("sim_ms_loaded")    # calibrated under that load (older runs: the quiet one)
        d["t_err_loaded"] = ((d["sim_ms_loaded"] or b["sim_ms"]) / d["p_ms_loaded"] - 1 if d["p_ms_loaded"]
                             else None)
        d["fixed_ms"] = rep.get("step_fixed_ms")
        d["t_err_fixed"] = (b["sim_ms"] + d["fixed_ms"]) / d["p_ms"] - 1 if d["fixed_ms"] is not None else None
        d["m_err_arena"] = b["sim_arena_peak"] / d["arena"] - 1
        d["m_err_rss"] = b["sim_peak"] / d["p_growth"] - 1
        d.update(_memory_figures(d, p, e_growth))
        d["overhead_ms"] = d["p_ms"] - d["kernel_ms"] if d["kernel_ms"] is not None else None
        # per accelerator: measured in-program op time (profile_step) - the profile's entry, per op
        per_acc: dict[str, list[float]] = {}
        for label, (acc, pms) in b.get("pred_ops", {}).items():
            if label in p.get("op_ms", {}):
                per_acc.setdefault(acc, []).append(p["op_ms"][label] - pms)
        d["op_delta"] = {acc: (len(v), statistics.median(v) * 1e3, sum(v)) for acc, v in per_acc.items()}
        d["k_err"] = b["sim_ms"] / d["kernel_ms"] - 1 if d["kernel_ms"] else None
        out.append(d)
    return out


def table(recs: list[dict]) -> str:
    h = ("| model | batch | budget % eager (MB) | PyTorch ms | PORT ms | PORT/PT (paired) | eager total MB (RSS growth) "
         "| PORT arena MB | PORT RSS growth MB (set-up + steps) | sim ms | sim err vs wall (solo ms: err; 1 busy process: sim calibrated under load / wall ms, err) | + fixed step ms: err | kernels ms (sim err) | exec overhead ms "
         "| sim peak MB | peak err vs arena / RSS | plan: recompute, early upd, torch ops, variants |")
    out = [h, "|" + "---|" * h.count(" | ") + "---|"]
    for d in recs:
        lead = f"| {LABEL[d['model']]} | {d['batch']} "
        if d.get("error") and "frac" not in d:
            out.append(lead + f"| error: {d['error']} |")
            continue
        lead += f"| {d['frac'] * 100:.0f}% ({d['budget'] / MB:.0f}) | {d['e_ms']:.1f} "
        if "min_feasible" in d:
            mf = d["min_feasible"]
            out.append(lead + "| infeasible: smallest feasible budget "
                       + (f"{mf / MB:.0f} MB = {mf / d['base'] * 100:.0f}% of eager |" if mf else "unknown |"))
            continue
        if d.get("error"):
            out.append(lead + f"| error: {d['error'][:120]} |")
            continue
        out.append(lead + f"| {d['p_ms']:.1f} | {d['ratio']:.2f} ({d['paired']:.2f}) "
                   f"| {d['e_total'] / MB:.0f} ({d['e_growth'] / MB:.0f}) | {d['arena'] / MB:.1f} "
                   f"| {d['p_growth'] / MB:.0f} ({d['p_setup'] / MB:.0f} + {d['p_steps'] / MB:.1f}) | {d['sim_ms']:.1f} | {d['t_err'] * 100:+.0f}% (solo {_f(d.get('p_ms_solo'))}: {_f(d.get('t_err_solo') and d['t_err_solo'] * 100, '+.0f')}%; 1 busy: {_f(d.get('sim_ms_loaded'))} / {_f(d.get('p_ms_loaded'))} ms, {_f(d.get('t_err_loaded') and d['t_err_loaded'] * 100, '+.0f')}%) "
                   f"| {_f(d['fixed_ms'], '.2f')}: {_f(d['t_err_fixed'] and d['t_err_fixed'] * 100, '+.0f')}% "
                   f"| {_f(d['kernel_ms'])} ({_f(d['k_err'] and d['k_err'] * 100, '+.0f')}%) | {_f(d['overhead_ms'])} "
                   f"| {d['sim_peak'] / MB:.1f} | {d['m_err_arena'] * 100:+.1f}% / {d['m_err_rss'] * 100:+.0f}% "
                   f"| {d['recompute']}, {d['early']}, {d['torch_ops']}/{d['n_ops']}, {d['variants']} |")
    return "\n".join(out)


def delta_table(recs: list[dict]) -> str:
    """Per accelerator: how much longer each op took inside the program (Trainer.profile_step, per-call timer)
    than its profile entry: the per-call executor cost (dispatch, torch backend's copy into the arena) plus
    the profile's bias under this run's load."""
    out = ["| model | batch | budget | accelerator: ops, median (in-program - profile) us/op, sum ms |",
           "|---|---|---|---|"]
    for d in recs:
        if d.get("op_delta"):
            cells = "; ".join(f"{acc}: {n}, {med:+.0f} us, {tot:+.1f} ms" for acc, (n, med, tot)
                              in sorted(d["op_delta"].items()))
            out.append(f"| {LABEL[d['model']]} | {d['batch']} | {d['frac'] * 100:.0f}% | {cells} |")
    return "\n".join(out)


SETTLE_MS = 50.0             # pause between two workers' steps in the alternating rounds
RUNTIME_OVERHEAD_MIB = 16    # fixed runtime overhead allowed over the budget (graph/program objects, C runtime)


def _memory_figures(d: dict, p: dict, e_growth: int) -> dict:
    """The process-memory figures of one PORT run (issue 12): growth from before Trainer(...) (its weights are
    in that baseline and move into the arena) to the steps' peak and to the end, against the arena, the budget
    and PyTorch eager's growth."""
    weights = p["param_bytes"] + p["buffer_bytes"]
    total = process_growth(p)
    plan_peak = max(d["arena"], d["sim_peak"])        # arena + the priced outside-arena allocations
    # the steps' memory: the part of the arena resident after set-up (the CPU arena is an anonymous mapping whose
    # pages become resident when first written, and set-up writes only the weights: port.train.trainer) + what
    # the steps add beyond the set-up's resident set (the rest of the arena's pages as they are first written,
    # engine footprints); the set-up's own fixed overhead is the total figure's business
    steps = min(weights, d.get("arena_all", d["arena"])) + max(0, d["p_steps"])
    return {"mem_total": total, "mem_weights": weights, "mem_plan": plan_peak, "mem_steps": steps,
            "mem_vs_arena_ok": steps <= plan_peak * 1.02 + 4 * MB,
            "mem_overhead": total + weights - d["arena"],          # not in the arena accounting (runtime)
            "mem_vs_budget_ok": total <= d["budget"] + RUNTIME_OVERHEAD_MIB * MB,
            "mem_vs_eager": total / e_growth if e_growth > 0 else float("nan")}


def process_growth(p: dict) -> int:
    """A worker's process growth, the same figure for eager and PORT: from VmRSS before the training set-up
    (``Trainer(...)`` / ``torch.optim.SGD(...)``: imports, model and batch already resident) to the peak of the
    set-up (VmHWM reset at that baseline) and of the steps (VmHWM reset after set-up), not the profiling after
    them. Everything the process maps counts: the arena, heap, thread stacks, and the code pages the steps
    touch (libtorch's kernels: eager's first backward maps ~22 MiB of them on MobileNetV3-small, b8)."""
    return max(p["peak"], p.get("setup_hwm", 0)) - p["pre"]


def memory_table(recs: list[dict]) -> str:
    out = ["| model | batch | budget % (MB) | PORT arena MB (plan's peak with priced outside-arena allocations; of "
           "it, engine footprints) "
           "| steps' memory MB: arena + RSS growth during steps (target <= plan's peak + 2% + 4 MiB) "
           "| RSS growth from before Trainer: steps' peak MB "
           f"| total to end MB (target <= budget + {RUNTIME_OVERHEAD_MIB} MiB) | runtime overhead MB (growth + weights "
           "- arena) | PORT growth / eager growth (eager MB) |", "|---|---|---|---|---|---|---|---|---|"]
    for d in recs:
        if "mem_total" in d:
            out.append(f"| {LABEL[d['model']]} | {d['batch']} | {d['frac'] * 100:.0f}% ({d['budget'] / MB:.0f}) "
                       f"| {d['arena'] / MB:.1f} ({d['mem_plan'] / MB:.1f}; {d.get('engine', 0) / MB:.1f}) | {d['mem_steps'] / MB:.1f} ({'met' if d['mem_vs_arena_ok'] else 'NOT met'}) | {d['p_growth'] / MB:.1f} "
                       f"| {d['mem_total'] / MB:.1f} ({'met' if d['mem_vs_budget_ok'] else 'NOT met'}) "
                       f"| {d['mem_overhead'] / MB:.1f} | {d['mem_vs_eager']:.2f} ({d['e_growth'] / MB:.0f}) |")
    return "\n".join(out)


def memory_headline_parts(recs: list[dict]) -> list[str]:
    ok = [d for d in recs if "mem_total" in d]
    if not ok:
        return []
    parts = []
    bad = [d for d in ok if not d["mem_vs_arena_ok"]]
    worst = max(ok, key=lambda d: d["mem_steps"] / d["mem_plan"])
    parts.append(f"steps' memory (arena + RSS growth during steps) vs plan: max {worst['mem_steps'] / worst['mem_plan']:.3f}x (target <= plan + 2% + 4 MiB: "
                 f"{'met' if not bad else f'NOT met ({len(bad)})'})")
    over = max((d["mem_total"] - d["budget"]) / MB for d in ok)
    ovh = max(d["mem_overhead"] / MB for d in ok)
    parts.append(f"total growth vs budget: max {over:+.1f} MiB, runtime overhead max {ovh:.1f} MiB (target <= budget + "
                 f"{RUNTIME_OVERHEAD_MIB} MiB: {'met' if all(d['mem_vs_budget_ok'] for d in ok) else 'NOT met'})")
    r50 = [d["mem_vs_eager"] for d in ok if d["frac"] == 0.5]
    if r50:
        parts.append(f"50% budget: PORT/eager memory growth max {max(r50):.2f} (target <= 0.6: "
                     f"{'met' if max(r50) <= 0.6 else 'NOT met'})")
    return parts


def headline(recs: list[dict]) -> str:
    ok = [d for d in recs if "p_ms" in d]
    parts = []
    r100 = [d["ratio"] for d in ok if d["frac"] == 1.0]
    if r100:
        parts.append(f"100% budget: PORT/PT step max {max(r100):.2f}x (target <= 0.9: "
                     f"{'met' if max(r100) <= 0.9 else 'NOT met'})")
    r25 = [d["ratio"] for d in ok if d["frac"] == 0.25]
    inf25 = [d for d in recs if d.get("frac") == 0.25 and "min_feasible" in d]
    if r25 or inf25:
        s = f"25% budget: max {max(r25):.2f}x of PT unconstrained" if r25 else "25% budget:"
        if inf25:
            s += f" ({len(inf25)} infeasible)"
        s += f" (target <= 1.3: {'met' if r25 and max(r25) <= 1.3 and not inf25 else 'NOT met'})"
        parts.append(s)
    if ok:
        parts += time_headline_parts(ok)
        me = max(abs(d["m_err_arena"]) for d in ok)
        parts.append(f"plan peak vs arena (accounting) {me * 100:.1f}% (target 2%: {'met' if me <= 0.02 else 'NOT met'})")
    parts += memory_headline_parts(recs)
    return "E2E: " + "; ".join(parts)


def time_headline_parts(ok: list[dict]) -> list[str]:
    """Issue 12 (time): predicted step / measured median step, quiet (target within 10%) and with one busy
    CPU-bound process running (target within 20%)."""
    parts = []
    q = [abs(d["t_err"]) for d in ok]
    ld = [abs(d["t_err_loaded"]) for d in ok if d.get("t_err_loaded") is not None]
    if q:
        parts.append(f"step time pred/measured quiet: max err {max(q) * 100:.0f}% (target 10%: "
                     f"{'met' if max(q) <= 0.1 else 'NOT met'})")
    if ld:
        parts.append(f"loaded (1 busy process): max err {max(ld) * 100:.0f}% (target 20%: "
                     f"{'met' if max(ld) <= 0.2 else 'NOT met'})")
    return parts


# ----------------------------------------------------------------------------- published models (issue 54)
# Speed of Trainer's default plan against eager at the coverage list's inputs, and process growth at 50% of
# eager's memory. Targets (issue 54, section 2): <= 0.85x on the CNNs and ViTs below, <= 0.9x on the tiny BERT,
# GPT-2 and Llama configs, <= 1.2x on every other model of bench/published.py; growth at 50% <= 0.6x eager's on
# the four CNNs and the two transformers of MEMORY_LIST.
SPEED_TARGETS = {**dict.fromkeys(("tv.mobilenet_v3_small", "tv.mobilenet_v3_large", "tv.efficientnet_b0",
                                  "timm.convnext_atto", "tv.regnet_y_400mf", "timm.vit_tiny_patch16_224",
                                  "timm.deit_tiny_patch16_224"), 0.85),
                 **dict.fromkeys(("hf.bert_seqcls", "hf.gpt2_lm", "hf.llama_lm"), 0.9)}
SPEED_LIST = tuple(SPEED_TARGETS)
SPEED_ANY = 1.2            # no model of the list slower than this
MEMORY_LIST = ("tv.mobilenet_v3_small", "tv.mobilenet_v3_large", "tv.efficientnet_b0", "timm.convnext_atto",
               "timm.vit_tiny_patch16_224", "timm.deit_tiny_patch16_224")
MEMORY_TARGET = 0.6
MIB = 1 << 20


def speed_target(name: str) -> float:
    """The issue's speed target (PORT / eager step) for a published model."""
    return SPEED_TARGETS.get(name, SPEED_ANY)


def model_names(models: str | None, speed_list: bool, every: bool, published_names=()) -> list[str]:
    """The models a run measures: ``--models a,b`` (zoo names or published ones, not mixed), ``--speed-list``
    (SPEED_LIST) or ``--all`` (every name of ``published_names``, bench/published.py's list)."""
    if sum(map(bool, (models, speed_list, every))) > 1:
        raise SystemExit("--models, --speed-list and --all are exclusive")
    names = (list(SPEED_LIST) if speed_list else list(published_names) if every
             else [n for n in (models or "").split(",") if n])
    if names and len({is_published(n) for n in names}) > 1:
        raise SystemExit(f"zoo and published models in one run: {','.join(names)} (run them separately)")
    return names


def speed_record(row: dict) -> dict:
    """One (model, batch) of a published-model run: eager's and the default plan's median step (alternating
    rounds), their ratio (and the median of per-round ratios), the growth of the 50% plan's worker and
    eager's, and the per-kernel / per-aten-op ms of both (instrumented steps after the timed ones)."""
    d = {"model": row["model"], "batch": row["batch"], "target": speed_target(row["model"])}
    e = row.get("eager") or {}
    if row.get("error") or "error" in e or not e.get("median_ms"):
        d["error"] = row.get("error") or e.get("error") or "eager: no steps"
        return d
    d.update(e_ms=e["median_ms"], e_growth=process_growth(e), e_ops=e.get("ms_by_kernel") or {})
    b1 = row["budgets"].get("1")
    p = (b1 or {}).get("port") or {}
    if b1 is None:
        d["error"] = "default plan not run (--budgets without 1: memory only)"
    elif b1.get("error") or "error" in p or not p.get("times"):
        d["error"] = b1.get("error") or p.get("error") or "PORT: no steps"
    else:
        d.update(p_ms=p["median_ms"], ratio=p["median_ms"] / e["median_ms"],
                 paired=statistics.median(pt / et for pt, et in zip(p["times"], e["times"])),
                 calls=p.get("calls_by_backend") or {}, p_ops=p.get("ms_by_kernel") or {})
        d["met"] = d["ratio"] <= d["target"]
    b5 = row["budgets"].get("0.5")
    if b5 is not None:
        p5 = b5.get("port") or {}
        if "infeasible" in b5:
            d["mem_note"] = f"infeasible (smallest {b5['infeasible'] / MIB:.0f} MiB)" if b5["infeasible"] \
                else "infeasible"
        elif b5.get("error") or "error" in p5 or "peak" not in p5:
            d["mem_note"] = f"error: {b5.get('error') or p5.get('error') or 'no record'}"[:120]
        else:
            d.update(p_growth=process_growth(p5), mem_ratio=process_growth(p5) / d["e_growth"])
    return d


def _top(ops: dict[str, float], k: int) -> str:
    return ", ".join(f"{n} {v:.1f}" for n, v in sorted(ops.items(), key=lambda kv: -kv[1])[:k])


def speed_table(recs: list[dict], label: str, condition: str = "") -> str:
    """The published-model table (markdown), the worst three rows' time split, and the headline (last line)."""
    h = ("| model | batch | eager ms | PORT ms (default plan) | PORT/eager (median of paired) | target | met "
         "| calls C / torch | growth at 50% MiB PORT / eager (ratio) | memory target <= 0.6 |")
    out = [label, "", h, "|" + "---|" * h.count(" | ") + "---|"]
    for d in recs:
        lead = f"| {d['model']} | {d['batch']} "
        mem = d.get("mem_note", "-")
        mem_ok = "-"
        if "mem_ratio" in d:
            mem = f"{d['p_growth'] / MIB:.1f} / {d['e_growth'] / MIB:.1f} ({d['mem_ratio']:.2f})"
        if d["model"] in MEMORY_LIST and ("mem_ratio" in d or "mem_note" in d):
            mem_ok = "met" if d.get("mem_ratio", 9) <= MEMORY_TARGET else "NOT met"
        if "ratio" not in d:
            out.append(lead + f"| {_f(d.get('e_ms'))} | error: {d.get('error', '?')[:120]} | | {d['target']:.2f} "
                       f"| NOT met | | {mem} | {mem_ok} |")
            continue
        calls = d.get("calls", {})
        out.append(lead + f"| {d['e_ms']:.1f} | {d['p_ms']:.1f} | {d['ratio']:.2f} ({d['paired']:.2f}) "
                   f"| {d['target']:.2f} | {'met' if d['met'] else 'NOT met'} "
                   f"| {calls.get('c', 0)} / {sum(v for k, v in calls.items() if k != 'c')} | {mem} | {mem_ok} |")
    worst = sorted((d for d in recs if "ratio" in d), key=lambda d: -d["ratio"] / d["target"])[:3]
    if worst:
        out += ["", "Where the time goes (worst 3 against their target; ms per step: PORT per kernel from "
                "Trainer.profile_step's per-call timers, eager self CPU per aten op from torch.profiler):", ""]
        out += [f"- {d['model']} b{d['batch']} ({d['ratio']:.2f}x): PORT {_top(d['p_ops'], 6)}; eager "
                f"{_top(d['e_ops'], 6)}" for d in worst]
    out += ["", speed_headline(recs, condition or label)]
    return "\n".join(out)


def speed_headline(recs: list[dict], label: str) -> str:
    parts = []
    for b in sorted({d["batch"] for d in recs}):
        rs = [d for d in recs if d["batch"] == b]
        ok = [d for d in rs if "ratio" in d]
        tight = [d for d in ok if d["model"] in SPEED_TARGETS]
        w = max(ok, key=lambda d: d["ratio"], default=None)
        parts.append(f"at batch {b}, {sum(d['met'] for d in tight)}/{len([d for d in rs if d['model'] in SPEED_TARGETS])}"
                     f" of the issue's models within target (<= 0.85x CNN/ViT, <= 0.9x BERT/GPT-2/Llama), "
                     f"{sum(d['ratio'] <= SPEED_ANY for d in ok)}/{len(rs)} within {SPEED_ANY}x"
                     + (f", worst {w['model']} {w['ratio']:.2f}x" if w else "")
                     + (f", {len(rs) - len(ok)} errors" if len(rs) > len(ok) else ""))
    mem = [d for d in recs if d["model"] in MEMORY_LIST and ("mem_ratio" in d or "mem_note" in d)]
    if mem:
        met = sum(d.get("mem_ratio", 9) <= MEMORY_TARGET for d in mem)
        parts.append(f"growth at 50%: {met}/{len(mem)} rows of the four CNNs and two ViTs <= {MEMORY_TARGET}x eager's"
                     + (f" (max {max(d['mem_ratio'] for d in mem if 'mem_ratio' in d):.2f})"
                        if any("mem_ratio" in d for d in mem) else ""))
    return "Speed headline: " + "; ".join(parts) + f" ({label})"


def speed_main(a, names: list[str], batches: list[int], fracs: list[float]) -> None:
    """Published models: one eager worker, one default-plan worker and, for budget 0.5, one solved plan's worker
    per (model, batch), run_config's alternating rounds; prints the table and writes it to ``--out``."""
    t0, load0 = time.time(), os.getloadavg()[0]
    rows, recs = [], []
    for b in batches:
        for name in names:
            try:
                row = run_config(name, b, fracs, a)
            except Exception as e:  # noqa: BLE001 - one model's failure is a row, the sweep goes on
                row = {"model": name, "batch": b, "budgets": {}, "error": f"{type(e).__name__}: {e}"[:200]}
            rows.append(row)
            recs.append(speed_record(row))
            d = recs[-1]
            print(f"{name} b{b}: " + (f"{d['e_ms']:.1f} / {d['p_ms']:.1f} ms, {d['ratio']:.2f}x" if "ratio" in d
                                      else f"error {d.get('error')}")
                  + (f"; growth at 50% {d['mem_ratio']:.2f}x eager" if "mem_ratio" in d else ""), flush=True)
            text = _speed_write(a, rows, recs, t0, load0, done=len(rows) == len(batches) * len(names))
    print()
    if a.no_write:
        print(text)
        return
    from _results import publish      # one section per set of batches: a batch-32 run keeps the batch-8 one
    which = "every published model" if a.every else "published models"    # --all: its own section
    publish(f"End to end: {which} (batch {','.join(map(str, batches))})", text)


def _speed_write(a, rows: list[dict], recs: list[dict], t0: float, load0: float, done: bool) -> str:
    """The table so far (written to --out and the JSON dump after every row: a run cut short keeps its rows)."""
    load1 = os.getloadavg()[0]
    from _results import machine_line
    quiet = load0 < 1.0      # the load before the run: at its end the run's own 2-thread workers count in it
    cond = (a.label or ("quiet" if quiet else "UNDER LOAD: indicative only, to be rerun on a quiet machine")) \
        + f", load average {load0:.1f} / {load1:.1f}" + ("" if done else f", {len(rows)} rows so far")
    label = (machine_line("python bench/e2e.py " + " ".join(sys.argv[1:]), t0, load0) + f", {cond}; "
             f"{a.threads} threads, {a.steps} alternating rounds")
    with open(Path(os.environ.get("TMPDIR", "/tmp")) / "port_bench_speed.json", "w") as f:
        json.dump(rows, f, default=str)
    text = speed_table(recs, label, cond)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=None)
    ap.add_argument("--batches", default=None)
    ap.add_argument("--budgets", default=None, help="fractions of eager's memory (zoo: 1,0.5,0.25; published "
                    "models: 1,0.5, where 1 is Trainer's default plan)")
    ap.add_argument("--speed-list", action="store_true",
                    help="issue 54's speed list (SPEED_LIST: published models) at --batches (default 8,32)")
    ap.add_argument("--all", dest="every", action="store_true",
                    help="every model of bench/published.py, default plan only (--budgets 1), batch 8 by default")
    ap.add_argument("--out", default=None, help="published models: write the table (markdown) to this path")
    ap.add_argument("--label", default=None, help="published models: the run's condition in the table (default: "
                    "quiet or UNDER LOAD from the load average)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--solo-steps", type=int, default=None,
                    help="timed steps per worker in each block of consecutive steps (the prediction's reference; "
                         "zoo: 4, published models: 0, no blocks)")
    ap.add_argument("--settle-ms", type=float, default=SETTLE_MS,
                    help="pause after each worker's step before the next worker's (its thread pool goes idle)")
    ap.add_argument("--calib-rounds", type=int, default=None,
                    help="calibration rounds per budget: instrumented steps of the plan correct the profile, "
                         "then solve again (0: the profile as measured; zoo: 2, published models: 0)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile-max-s", type=float, default=None)
    ap.add_argument("--solve-s", type=float, default=None)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--no-loaded", dest="loaded", action="store_false",
                    help="skip the second timed pass with one busy CPU-bound process running")
    ap.add_argument("--fixed-threads", dest="threads_auto", action="store_false",
                    help="PORT workers keep --threads fixed (Trainer(threads=None)) instead of the Trainer's default "
                         "threads='auto', where the step-time governor picks the kernels' thread count (fewer while "
                         "the busy process runs)")
    ap.add_argument("--threads-auto", dest="threads_auto", action="store_true", default=True,
                    help="the default (kept for earlier command lines)")
    ap.add_argument("--from-json", default=None,
                    help="re-render (and write) the section from a previous run's JSON dump, without measuring")
    ap.add_argument("--worker", nargs=5, metavar=("IMPL", "MODEL", "BATCH", "THREADS", "PLAN"))
    a = ap.parse_args()
    if getattr(a, "threads_auto", False):
        os.environ["PORT_E2E_THREADS"] = "auto"     # read by the workers (THREADS_SETTING)
    if a.worker:
        impl, name, b, th, pp = a.worker
        worker(impl, name, int(b), int(th), pp)
        return
    QUICK[0] = a.quick
    names = model_names(a.models, a.speed_list, a.every, list(_published().MODELS) if a.every else ())
    if names and is_published(names[0]):       # issue 54: default plan vs eager, growth at 50%
        a.default_plan, a.loaded = True, False
        a.solo_steps = a.solo_steps if a.solo_steps is not None else 0
        a.calib_rounds = a.calib_rounds if a.calib_rounds is not None else 0
        a.steps = a.steps or 12
        a.profile_max_s = a.profile_max_s if a.profile_max_s is not None else 60.0
        a.solve_s = a.solve_s or 20.0
        batches = [int(b) for b in (a.batches or ("8" if a.every else "8,32")).split(",")]
        fracs = [float(f) for f in (a.budgets or ("1" if a.every else "1,0.5")).split(",")]
        return speed_main(a, names, batches, fracs)
    names = names or (["resnet18", "mobilenetv2"] if a.quick else list(MODELS))
    a.solo_steps = a.solo_steps if a.solo_steps is not None else 4
    a.calib_rounds = a.calib_rounds if a.calib_rounds is not None else 2
    batches = [int(b) for b in (a.batches or ("8" if a.quick else "8,32")).split(",")]
    fracs = [float(f) for f in (a.budgets or "1,0.5,0.25").split(",")]
    a.steps = a.steps or (8 if a.quick else 12)
    a.profile_max_s = a.profile_max_s if a.profile_max_s is not None else (120.0 if a.quick else 400.0)
    a.solve_s = a.solve_s or (20.0 if a.quick else 60.0)
    t0 = time.time()
    load0 = os.getloadavg()
    rows, recs = [], []
    meta = None
    if a.from_json:
        dump = json.loads(Path(a.from_json).read_text())
        rows, meta = (dump["rows"], dump["meta"]) if isinstance(dump, dict) else (dump, {})
        for row in rows:
            recs += derive(row)
        batches, names = [], []
    for b in batches:
        for name in names:
            row = run_config(name, b, fracs, a)
            rows.append(row)
            rs = derive(row)
            recs += rs
            print(f"{LABEL[name]} b{b}: profile {row.get('profile')}", flush=True)
            for d in rs:
                print("  ", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}, flush=True)
    wall = time.time() - t0
    load1 = os.getloadavg()
    if meta is None:
        from port.cost.measure import host_info
        meta = {"quick": a.quick, "date": time.strftime("%Y-%m-%d %H:%M"), "l0": load0[0], "l1": load1[0],
                "cpu": host_info().get("cpu", "?"),
                "wall": wall, "steps": a.steps, "warmup": a.warmup, "pmax": a.profile_max_s, "solve_s": a.solve_s, "settle": a.settle_ms, "solo": a.solo_steps, "calib": a.calib_rounds,
                "threads_auto": bool(a.threads_auto)}
        with open(Path(os.environ.get("TMPDIR", "/tmp")) / "port_bench_e2e.json", "w") as f:
            json.dump({"rows": rows, "meta": meta}, f, default=str)
    meta = {**{"quick": a.quick, "date": "?", "l0": float("nan"), "l1": float("nan"), "wall": float("nan"),
               "steps": a.steps, "warmup": a.warmup, "pmax": a.profile_max_s, "solve_s": a.solve_s, "settle": a.settle_ms, "solo": a.solo_steps, "calib": a.calib_rounds}, **meta}
    tab = table(recs)
    head = headline(recs)
    prof_notes = "; ".join(f"{LABEL[r['model']]} b{r['batch']}: {r['profile']['entries']} entries, "
                           f"{r['profile']['measured_now']} measured now in {r['profile']['seconds']:.0f} s, "
                           f"{r['profile']['reused']} from cache, {r['profile']['modeled']} modeled"
                           for r in rows if "profile" in r)
    from port.cost.measure import host_info
    notes = NOTES.format(cmd="python bench/e2e.py" + (" --quick" if meta["quick"] else ""), cpus=os.cpu_count(),
                         cpu=meta.get("cpu") or host_info().get("cpu", "?"),
                         prof=prof_notes, **{k: v for k, v in meta.items() if k not in ("quick", "cpu")})
    if not meta.get("threads_auto", True):
        notes = notes.replace("python bench/e2e.py" + (" --quick" if meta["quick"] else ""),
                              "python bench/e2e.py" + (" --quick" if meta["quick"] else "") + " --fixed-threads", 1)
    if meta.get("threads_auto"):
        notes = notes + (
            "\nThreads: PORT workers ran `Trainer(..., threads=\"auto\")` (port.exec.threads.ThreadGovernor: the "
            "kernels' thread count chosen from the step times, 2 or 1 here; the loaded calibration ran after "
            f"{LOADED_SETTLE_STEPS} untimed steps under the load, so the governor settled first).\n")
    print()
    print(tab)
    print(delta_table(recs))
    print(memory_table(recs))
    if not a.no_write:
        from _results import write_section
        write_section("End to end", notes + "\n" + tab + "\n\n" + delta_table(recs) + "\n\n" + memory_table(recs) + "\n\n" + FINDINGS + "\n\n" + head + "\n")
    print(head)


NOTES = """`{cmd}` ({date}, {cpu}, {cpus}-vCPU VM: load average {l0:.1f} at start, {l1:.1f} at end; {wall:.0f} s). Device `host` (accelerators cpu-c = PORT's C kernels and cpu-torch = PyTorch CPU kernels, 2 threads each; torch.set_num_threads(2) in the eager worker).

How it is measured. Per (model, batch): the traced graph is profiled with all variants (`port.profile(graph, "host", cache=..., max_time_s={pmax:.0f})`, cache `runs/bench_profiles/host/<model>_b<batch>.json`; entries the time budget does not reach are roofline-modeled and counted below). A fresh PyTorch eager worker (torch.optim.SGD lr 0.01 momentum 0.9) runs {warmup} warm-up steps; its peak training memory defines the budgets: **eager total = parameter + buffer bytes (the weights, resident before the baseline) + eager RSS growth** (VmHWM after the steps, reset via /proc/self/clear_refs after set-up, minus VmRSS after imports + model + data, before the optimizer: grads + momentum + activations + autograd/allocator overhead) = 3 x param bytes + buffers + eager's activation/overhead memory. PORT's budget at f = f x eager total, handed to `port.solver.solve(graph, profile, budget, solver="highs", time_limit_s={solve_s:.0f}, gap=0.01, allow_early_updates=True)`; the plan is verified with `port.verify.simulate.simulate` (sim ms, sim peak). Calibration (as `port train --replan`): a fresh worker trains the plan (`Trainer(model, x, plan=plan, optimizer=port.optim.SGD(0.01, momentum=0.9))`) 2 untimed + 9 timed steps, then 3 instrumented ones; their in-plan op times and the wall median correct the profile (`port.cost.measure.correct_from_run`) and the budget is solved again, up to {calib} rounds, until the re-solved plan is the one just calibrated. The worker that calibrated the final plan is the one then timed (prediction and measurement from one process; the instrumentation's copies are handed back and the peak reset after it). The eager worker and the PORT workers of one (model, batch) are driven in alternating single steps (order rotating each round), {warmup} untimed + {steps} timed rounds, median step wall time (`trainer.step` / zero_grad+fwd+loss+bwd+step+item), with a {settle:.0f} ms pause after each worker's step (the previous worker's thread pool goes idle before the next step starts). PORT/PT in brackets = median of per-round ratios. Then each worker runs blocks of {solo} consecutive timed steps (after one untimed), in rotating order, twice: "solo ms", the median step of a training loop running alone (shown beside the alternating median the prediction is held against: how far two phases of the same run drift apart on this VM). Loaded: a Python busy loop runs beside the workers; each PORT worker first calibrates again under it (the prediction a user's `--replan` would make on that loaded device), then {steps} alternating rounds are timed. PORT memory: arena = the training program's arena bytes (memory_report()["train_arena_bytes"]: weights, grads, momentum, buffers, activations, workspace), RSS growth = VmHWM - VmRSS-before-Trainer (arena + graph/program objects + anything the kernels allocate; the torch module's own weights stay in the baseline). After the timed steps each PORT worker runs 3 instrumented steps (`Trainer.profile_step`): "kernels ms" = median sum of per-call times, "exec overhead" = wall step - kernels (per-call Python dispatch, input/label copy, gradient zeroing, loss readback). Steps' memory = the arena's pages written during set-up (the weights: the CPU arena is an anonymous mapping, resident as first written) + the RSS growth during the steps beyond the set-up's resident set, held against the plan's peak (arena + priced engine footprints); total growth = steps' peak (or set-up's, if larger) - VmRSS-before-Trainer, held against the budget plus a fixed runtime allowance (trace, programs, executors: the set-up's own objects). Errors: sim ms / measured wall ms - 1; sim peak / arena - 1 and sim peak / RSS growth - 1. Eager total in the table is the final peak (after all steps); budgets were set from the peak after warm-up. Both workers call glibc malloc_trim(0) after set-up, before the RSS baseline for the steps is taken (set-up garbage such as tracing/lowering temporaries is handed back; PORT_E2E_TRIM=0 disables).

Profiles: {prof}.
"""

FINDINGS = """Findings (2026-11-24 17:59 run, PORT workers with threads="auto" (now the default), load 0.3 at start, 1.3 at end; the final calibration
runs in the worker that is then timed, the loaded prediction is calibrated under the load, and the steps' memory
is held against the plan without the set-up's fixed overhead, which the total figure carries):

- Time, quiet: predictions within 8% of the alternating median on every row (ResNet-18 +1% and +8%, MobileNetV2
  -2%, +1%, +3%; target 10%: met). A 16:34 run that calibrated in a separate process missed by up to 38%: two
  processes of one plan differ by that much on this VM (ResNet-18's first calibration worker took 156-161 ms per
  step in two runs, the next one of the same plan 80-85).
- Time, loaded (one Python busy loop beside the steps): with a fixed 2 threads (17:31 run, as --fixed-threads now)
  steps took 2.7-4.4x the quiet ones and were bimodal, and the prediction calibrated under the load missed by up
  to 35%. With `Trainer(threads="auto")` the governor drops to 1 thread a few steps into the load: steps are
  1.7-1.9x the quiet ones (PyTorch eager: 3.6x in the 17:31 run) and the calibrated prediction is within 1-5%
  (target 20%: met). "kernels ms" is taken after the loaded phase, at the governor's 1 thread: it is not the
  quiet step's.
- Memory: the steps' memory (arena + growth during steps) is within 1.3% of the plan's peak on every row (target
  plan + 2% + 4 MiB: met); total growth from before `Trainer(...)` is at most budget + 12.0 MiB (target +16 MiB:
  met); PORT / eager growth at 50% 0.44 (ResNet-18) and 0.55 (MobileNetV2; target 0.6: met).
- What the set-up keeps beyond the arena (measured stage by stage on MobileNetV2 at 25%, VmRSS after
  gc + malloc_trim): the first trace of a process costs 7-8 MiB that stays after the graph is deleted (PyTorch's
  meta-tensor dispatch and torch.fx code generation warming up; a second trace adds 0.8 MiB), the Python objects
  of graph, programs and executors 5 MiB (tracemalloc), the whole-step engine 0.4 MiB; the module's weights
  (8.5 MB) are handed back as they move into the arena. That is the fixed runtime overhead of the total figure.
- Speed: at 100% PORT/PT 0.93 (ResNet-18, 75 torch ops; target 0.9: NOT met) and 0.75 (MobileNetV2); at 50% the
  all-C ResNet-18 plan is 1.30x eager (its 3x3 convolutions on the C kernels are slower than oneDNN's, and
  oneDNN's footprint no longer fits the budget); at 25% MobileNetV2 is 0.79x eager.
- ResNet-18 at 25%: infeasible, the smallest feasible budget is 104 MB (47% of eager)."""



if __name__ == "__main__":
    main()
