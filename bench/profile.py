"""Profiler benchmark: does the profile predict the step that training runs?

For ResNet-18 and MobileNetV2 (CIFAR 3x32x32, batch 8, SGD momentum) on each present backend:
  * the profile, measured as every command measures it (port.cost.measure.profile_with_report: ops timed alone,
    then re-timed in program order, and the executor's per-step overhead recorded), plain variants;
  * the plan "every op on this accelerator, plain, everything kept" (solver "single:<accelerator>"): its
    predicted step (the simulator: the profile's op times plus the step overhead) and the raw sum of the op
    times;
  * the step that plan takes in training: port.Trainer(model, x, plan=plan), ``trainer.step(x, y)`` wall time,
    driven in alternating rounds with PyTorch eager's training step (zero_grad, forward, loss, backward,
    optimizer.step, loss.item()), order rotating, median;
  * a second profile taken afterwards: median per-op relative difference between the two (stability).
Target: |predicted - measured| / measured <= 10% for every (model, accelerator).

    python bench/profile.py [--quick] [--batch 8] [--models resnet18,mobilenetv2] [--no-write]

Results go to the `## Profiler` section of bench/RESULTS.md; the headline is the last line printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# this file is named like the stdlib's `profile` (cProfile imports it): keep bench/ off the path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import port  # noqa: E402
from port.config import load_device  # noqa: E402
from port.models import get  # noqa: E402
from port.cost.measure import profile_with_report  # noqa: E402
from port.cost.runners import backend_available  # noqa: E402
from port.verify.simulate import simulate  # noqa: E402


SETTLE_S = 0.05   # pause after each step, untimed (as bench/e2e.py's SETTLE_MS)


def training_steps(name: str, plans: dict, batch: int, threads: int, warmup: int, steps: int
                   ) -> tuple[dict[str, float], float, dict[str, int]]:
    """Median step wall time (ms) of each plan's Trainer and of PyTorch eager, in alternating rounds (the order
    rotates each round): ({accelerator: ms}, eager ms, {accelerator: kernel threads after its Trainer's last step})."""
    import torch.nn.functional as F
    from port.exec import capi
    from port.train.optim import SGD as PortSGD
    from port.train.trainer import Trainer
    torch.set_num_threads(threads)
    capi.set_num_threads(threads)
    gen = torch.Generator().manual_seed(1234)
    batches = [(torch.randn(batch, 3, 32, 32, generator=gen), torch.randint(0, 10, (batch,), generator=gen))
               for _ in range(4)]
    model = get(name, seed=0).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def eager(x, y) -> float:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()
    runs = {"eager": eager}
    trainers = {}
    for acc, plan in plans.items():
        tr = Trainer(get(name, seed=0).train(), batches[0][0], plan=plan, optimizer=PortSGD(0.01, momentum=0.9),
                     threads=threads)
        trainers[acc] = tr
        runs[acc] = tr.step
    keys = list(runs)
    times: dict[str, list[float]] = {k: [] for k in keys}
    threads_after: dict[str, int] = {}     # the kernel thread count each Trainer left after its own last step
    for rnd in range(warmup + steps):
        order = keys[rnd % len(keys):] + keys[:rnd % len(keys)]
        x, y = batches[rnd % len(batches)]
        for k in order:
            t0 = time.perf_counter()
            runs[k](x, y)
            if rnd >= warmup:
                times[k].append((time.perf_counter() - t0) * 1e3)
            if k in trainers:
                threads_after[k] = capi.get_num_threads()
            time.sleep(SETTLE_S)    # the previous step's OpenMP threads go idle before the next step starts
    med = {k: statistics.median(v) for k, v in times.items()}
    return ({a: med[a] for a in plans}, med["eager"], threads_after)


def profile_sum(graph, prof, acc: str) -> float:
    tot = 0.0
    for op in graph.ops:
        e = prof.lookup(graph.signature(op), acc, "plain")
        tot += e.latency_ms
    return tot


def stability(p1, p2, acc: str) -> float:
    d = []
    for e in p1.entries:
        if e.accelerator != acc or not e.measured:
            continue
        f = p2.lookup(e.signature, e.accelerator, e.variant)
        if f is not None and f.measured and e.latency_ms > 1e-4:
            d.append(abs(f.latency_ms - e.latency_ms) / e.latency_ms)
    return statistics.median(d) if d else float("nan")


def main() -> None:
    from port.solver.baselines import solve_single
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--models", default="resnet18,mobilenetv2")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    dev = load_device("host")
    timing = dict(blocks=3, block_ms=5.0, warmup_ms=3.0) if args.quick else dict(blocks=5, block_ms=20.0, warmup_ms=10.0)
    warmup, steps = (3, 9) if args.quick else (5, 21)
    rows = []
    t_start, load0 = time.time(), os.getloadavg()[0]
    present = [a for a in dev.accelerators if backend_available(a.backend)[0]]
    threads = present[0].threads
    for name in args.models.split(","):
        t_model = time.time()
        g = port.trace(get(name, seed=0), torch.randn(args.batch, 3, 32, 32), optimizer="sgd_momentum", name=name)
        ids = tuple(a.id for a in present)
        p1, _ = profile_with_report(g, dev, accelerators=ids, variants=("plain",), handoff=False, peak_memory=False,
                                    **timing)
        plans = {a.id: solve_single(g, p1, 10 ** 15, accelerator=a.id) for a in present}
        wall, eager, thr = training_steps(name, plans, args.batch, threads, warmup, steps)
        t_mid = time.time()
        p2, _ = profile_with_report(g, dev, accelerators=ids, variants=("plain",), handoff=False, peak_memory=False,
                                    **timing)
        gap_s = time.time() - t_mid
        print(f"# {name}: 2 profiles + training steps in {time.time() - t_model:.0f} s", flush=True)
        for a in present:
            pred = plans[a.id].predicted_step_ms
            pred2 = simulate(plans[a.id], g, p2).step_ms
            r = dict(model=name, acc=a.id, sum1=profile_sum(g, p1, a.id), pred=pred, pred2=pred2, wall=wall[a.id],
                     eager=eager, err=(pred - wall[a.id]) / wall[a.id], err2=(pred2 - wall[a.id]) / wall[a.id],
                     stab=stability(p1, p2, a.id), gap=gap_s, threads=thr[a.id],
                     n=sum(1 for e in p1.entries if e.accelerator == a.id and e.measured))
            rows.append(r)
            print(f"{name:12s} {a.id:9s} predicted {pred:8.2f} ms (2nd profile {pred2:8.2f}; op sum {r['sum1']:8.2f})  "
                  f"trainer step {r['wall']:8.2f} ms  error {r['err']:+.1%} / {r['err2']:+.1%}   eager step "
                  f"{eager:8.2f} ms   per-op profile-vs-profile median diff {r['stab']:.1%} ({r['n']} entries)",
                  flush=True)
        if not args.no_write:  # partial results survive an interrupted run
            write_results(rows, f"(partial: {', '.join(sorted({r['model'] for r in rows}))} done)", args,
                          t_start, load0)
    worst = max(abs(r["err"]) for r in rows)
    stab = statistics.median(r["stab"] for r in rows)
    ok = "met" if worst <= 0.10 else "NOT met"
    headline = (f"profiler: predicted vs measured training step within {worst:.1%} worst case (target 10%: {ok}) "
                f"over {len(rows)} model x backend pairs (batch {args.batch}, plain keep-everything plans); "
                f"profile-to-profile median per-op difference {stab:.1%}; {time.time() - t_start:.0f} s")
    if not args.no_write:
        write_results(rows, headline, args, t_start, load0)
    print(headline)


def write_results(rows, headline, args, t_start: float, load0: float) -> None:
    import importlib.util    # bench/ stays off sys.path (see the top of this file)
    spec = importlib.util.spec_from_file_location("_results", ROOT / "bench" / "_results.py")
    res = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(res)
    machine_line, write_section = res.machine_line, res.write_section
    lines = [machine_line(f"python bench/profile.py{' --quick' if args.quick else ''}", t_start, load0)
             + f": torch {torch.__version__}, {rows[0]['threads']} kernel threads. CIFAR 3x32x32, batch {args.batch}, "
             "SGD momentum, plain variants. *Predicted*: the simulated step of the plan \"every op on this "
             "accelerator, plain, everything kept\" with the profile as every command measures it "
             "(`port.cost.measure.profile_with_report`: ops timed alone, re-timed in program order, plus the "
             "executor's recorded per-step overhead); *op sum*: the raw sum of the profile's op times; *trainer "
             "step*: `port.Trainer(model, x, plan=plan).step(x, y)` wall time, median, driven in alternating rounds "
             "(a 50 ms pause after each step) with PyTorch eager's training step (zero_grad, forward, loss, backward, optimizer.step, loss.item()); "
             "error = predicted / trainer step - 1, with the first profile / with a second one taken after the "
             f"steps. *Stability*: median per-op |difference| between the two profiles ({rows[0]['gap']:.0f} s "
             "apart).", "",
             "| model | accelerator | predicted ms (2nd profile) | op sum ms | trainer step ms | error | eager step ms | "
             "stability |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['acc']} | {r['pred']:.2f} ({r['pred2']:.2f}) | {r['sum1']:.2f} | "
                     f"{r['wall']:.2f} | {r['err']:+.1%} / {r['err2']:+.1%} | {r['eager']:.2f} | {r['stab']:.1%} |")
    lines += ["", f"Headline: {headline}"]
    write_section("Profiler", "\n".join(lines))


if __name__ == "__main__":
    main()
