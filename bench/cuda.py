"""PORT's torch-cuda backend on a GPU against PyTorch eager on the same GPU: step time and GPU memory.

Per (model, batch): trace; measure the profile on the GPU (`host`'s `cuda` engine alone: every op and variant timed
through the op registry, as `port profile` does); solve two plans on it with the ILP: ``port`` (no budget: the
fastest plan keeping every activation) and ``port50`` (50% of the keep-everything peak: recomputation). Then
``eager`` (the same model and SGD with momentum in PyTorch, the loss read every step), ``port`` and ``port50`` are
built one after another, each measured alone for GPU memory (the CUDA caching allocator's peak allocated bytes
over set-up and 3 warm-up steps, less what was allocated before: weights, gradients, optimizer state,
activations, the arena and aten's temporaries; measured, not accounted), then timed in alternating order over
rounds (paired; the table gives the median over rounds of each round's mean step, synchronized; both read the
batch from GPU memory). ``predicted``: the plan's step time from the profile (port.verify.simulate). PORT's
main pass and late updates replay as CUDA graphs where the plan allows (port.exec.executor: no paging, no
dropout, SGD's scalars); the log says which.

    python bench/cuda.py            # resnet18 b32/b256, mobilenetv2 b128; 7 rounds of 10 steps
    python bench/cuda.py --quick    # resnet18 b32 only, 3 rounds
    options: --rounds N --steps N --no-write --breakdown (log where the GPU time goes)
Without a GPU it says so and exits 0 without writing. Headline targets: port step <= 1.1x eager; port50 GPU
memory <= 0.6x eager's.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

if __name__ != "__main__":
    # a script, not the ``cuda`` package: torch probes ``from cuda.bindings import ...``, which found this file
    # whenever bench/ was on sys.path and turned engine footprints off in the importing process (see below)
    raise ImportError("bench/cuda.py is a script (python bench/cuda.py), not an importable module")

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]   # bench/profile.py != stdlib
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PORT_PROFILE_ENGINE", "0")     # engine footprints are CPU process memory: not used here

CONFIGS = (("resnet18", 32), ("resnet18", 256), ("mobilenetv2", 128))
LR = 0.05


def _impls(name: str, batch: int, log) -> tuple[dict, dict, dict]:
    import torch
    import port.models as M
    from port.cost.measure import profile_with_report
    from port.train.optim import SGD
    from port.solver import solve
    from port.train.trainer import Trainer
    from port.ir.trace import trace
    model = M.get(name, seed=0)
    x = torch.randn(batch, *M.INPUT_SHAPES[name])
    y = torch.randint(0, 10, (batch,))
    g = trace(model, x, optimizer="sgd_momentum")
    t0 = time.perf_counter()
    prof, rep = profile_with_report(g, "host", accelerators=("cuda",), handoff=False, blocks=3, block_ms=2.0,
                                    warmup_ms=1.0)
    prof = prof.only(("cuda",))
    log(f"{name} b{batch}: profile {time.perf_counter() - t0:.0f} s, {len(prof.entries)} entries, "
        f"failed {len(rep.failed)}")
    plans = {"port": solve(g, prof, None, time_limit_s=20), "port50": solve(g, prof, "50%", time_limit_s=20)}
    xc, yc = x.cuda(), y.cuda()
    built, mem, pred = {}, {}, {}
    for impl in ("eager", *plans):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        if impl == "eager":
            m = copy.deepcopy(model).cuda().train()
            opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9)
            lossf = torch.nn.CrossEntropyLoss()

            def step(m=m, opt=opt, lossf=lossf):
                opt.zero_grad(set_to_none=True)
                loss = lossf(m(xc), yc)
                loss.backward()
                opt.step()
                return float(loss.detach())
        else:
            tr = Trainer(copy.deepcopy(model), x, plan=plans[impl], optimizer=SGD(LR, momentum=0.9))
            assert tr.arena.device.type == "cuda"
            pred[impl] = plans[impl].predicted_step_ms
            built[impl + ":trainer"] = tr

            def step(tr=tr):
                return tr.step(xc, yc)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        mem[impl] = torch.cuda.max_memory_allocated() - base
        built[impl] = step
    from port.pipeline import plan_summary
    for impl, p in plans.items():
        ex = built[impl + ":trainer"].executor
        log(f"  {impl}: {plan_summary(p)}; main pass {ex.cuda_graph}; late updates {ex.update_graph}")
    trainers = {k: built.pop(k) for k in list(built) if k.endswith(":trainer")}
    return built, mem, pred, trainers


def _breakdown(fns: dict, trainers: dict, log=print) -> None:
    """Where the GPU time goes (log only): PORT's plan per kernel kind (one step with per-call timers,
    synchronized around each call) and eager's CUDA kernels (torch.profiler), the 8 largest of each."""
    import collections
    import torch
    tr = trainers["port:trainer"]
    ex = tr.executor
    ex.zero_grads()
    r = ex.run(timing=True, updates=False)
    by = collections.Counter()
    for c in r["calls"]:
        by[c["kernel"]] += c["ms"]
    log("  port per kernel (ms, synchronized per call): " + ", ".join(f"{k} {v:.2f}" for k, v in by.most_common(8))
        + f"; total {r['total_ms']:.2f}")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fns["eager"]()
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -getattr(e, "device_time_total", 0.0))[:8]
    log("  eager CUDA kernels (ms): " + ", ".join(f"{e.key[:40]} {getattr(e, 'device_time_total', 0.0) / 1e3:.2f}"
                                                  for e in rows))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--breakdown", action="store_true", help="log where the GPU time goes (per kernel kind)")
    a = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench/cuda.py: no CUDA device here (torch.cuda.is_available() is False); nothing measured")
        return 0
    sys.path.append(str(ROOT / "bench"))
    from _results import machine_line, write_section
    t_start, load0 = time.time(), os.getloadavg()[0]
    rounds = a.rounds or (3 if a.quick else 7)
    configs = CONFIGS[:1] if a.quick else CONFIGS
    torch.backends.cudnn.benchmark = False
    rows, ratios, mems = [], [], []
    for name, batch in configs:
        fns, mem, pred, _trainers = _impls(name, batch, print)
        times: dict[str, list[float]] = {k: [] for k in fns}
        order = list(fns)
        for r in range(rounds):
            for impl in order[r % len(order):] + order[:r % len(order)]:
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(a.steps):
                    fns[impl]()
                torch.cuda.synchronize()
                times[impl].append((time.perf_counter() - t) * 1e3 / a.steps)
        med = {k: statistics.median(v) for k, v in times.items()}
        for impl in fns:
            rows.append(f"| {name} | {batch} | {impl} | {med[impl]:.2f} | {med[impl] / med['eager']:.2f} | "
                        f"{pred[impl]:.2f} |" if impl in pred else
                        f"| {name} | {batch} | {impl} | {med[impl]:.2f} | 1.00 | |")
            rows[-1] += f" {mem[impl] / 2**20:.1f} | {mem[impl] / mem['eager']:.2f} |"
            print(rows[-1], flush=True)
        if a.breakdown:
            try:
                _breakdown(fns, _trainers, log=print)
            except Exception as e:  # noqa: BLE001 - a diagnostic: the figures above stand
                print(f"  breakdown failed: {type(e).__name__}: {e}")
        ratios.append(med["port"] / med["eager"])
        mems.append(mem["port50"] / mem["eager"])
    gpu = torch.cuda.get_device_name(0)
    head = (f"CUDA ({gpu}): port step / eager max {max(ratios):.2f}x (target <= 1.1x: "
            f"{'met' if max(ratios) <= 1.1 else 'not met'}); port50 GPU memory / eager max {max(mems):.2f}x "
            f"(target <= 0.6x: {'met' if max(mems) <= 0.6 else 'not met'})")
    body = "\n".join([
        machine_line("python bench/cuda.py" + (" --quick" if a.quick else ""), t_start, load0)
        + f"; GPU {gpu}, torch {torch.__version__}, {rounds} rounds x {a.steps} steps",
        "",
        "| model | batch | impl | step ms | / eager | predicted ms | GPU peak MiB | / eager |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows, "", head])
    print(head)
    if not a.no_write:
        write_section("CUDA: torch-cuda plans against PyTorch eager on the GPU (bench/cuda.py)", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
