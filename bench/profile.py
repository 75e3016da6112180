"""Profiler benchmark: does the sum of profiled op times predict a step?

For ResNet-18 and MobileNetV2 (CIFAR 3x32x32, batch 8, SGD momentum) on each present backend:
  * profile (plain variants) -> sum over graph ops of the profiled latency;
  * the same ops run back to back by the same runner (one prepared callable per graph op), median step;
  * PyTorch eager's real training step (forward, backward, optimizer.step), reported beside;
  * a second profile taken later: median per-op relative difference between the two (stability).
Target: |sum - back-to-back| / back-to-back <= 10%.

    python bench/profile.py [--quick] [--batch 8] [--models resnet18,mobilenetv2]

Results go to the `## Profiler` section of bench/RESULTS.md; the headline is the last line printed.
"""
from __future__ import annotations

import argparse
import datetime
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
from port.cost.runners import get_runner
from port.cost.measure import profile_with_report  # noqa: E402
from port.cost.runners import backend_available  # noqa: E402


def back_to_back_ms(graph, backend: str, threads: int, steps: int) -> float:
    r = get_runner(backend, graph, threads)
    runs = [r.prepare(op, "plain") for op in graph.ops]
    for run in runs:  # warm-up step
        run()
    r.sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for run in runs:
            run()
        r.sync()
        times.append((time.perf_counter() - t0) * 1e3)
    del runs
    return statistics.median(times)


def eager_step_ms(name: str, batch: int, threads: int, steps: int) -> float:
    torch.set_num_threads(threads)
    m = get(name, seed=0).train()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
        if i >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


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
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--models", default="resnet18,mobilenetv2")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    dev = load_device("host")
    timing = dict(blocks=3, block_ms=5.0, warmup_ms=3.0) if args.quick else dict(blocks=5, block_ms=20.0, warmup_ms=10.0)
    steps = 5 if args.quick else 15
    rows = []
    t_start = time.time()
    present = [a for a in dev.accelerators if backend_available(a.backend)[0]]
    for name in args.models.split(","):
        t_model = time.time()
        g = port.trace(get(name, seed=0), torch.randn(args.batch, 3, 32, 32), optimizer="sgd_momentum", name=name)
        ids = tuple(a.id for a in present)
        p1, _ = profile_with_report(g, dev, accelerators=ids, variants=("plain",), handoff=False, peak_memory=False,
                                    **timing)
        eager = eager_step_ms(name, args.batch, present[0].threads, steps)
        b2b = {a.id: back_to_back_ms(g, a.backend, a.threads, steps) for a in present}
        t_mid = time.time()
        p2, _ = profile_with_report(g, dev, accelerators=ids, variants=("plain",), handoff=False, peak_memory=False,
                                    **timing)
        gap_s = time.time() - t_mid
        print(f"# {name}: 2 profiles + back-to-back + eager in {time.time() - t_model:.0f} s", flush=True)
        for a in present:
            s = profile_sum(g, p1, a.id)
            s2 = profile_sum(g, p2, a.id)
            rows.append(dict(model=name, acc=a.id, sum1=s, sum2=s2, b2b=b2b[a.id], eager=eager,
                             err=(s - b2b[a.id]) / b2b[a.id], err2=(s2 - b2b[a.id]) / b2b[a.id],
                             stab=stability(p1, p2, a.id), gap=gap_s,
                             n=sum(1 for e in p1.entries if e.accelerator == a.id and e.measured)))
            r = rows[-1]
            print(f"{name:12s} {a.id:9s} profile sum {s:8.2f} ms (2nd {s2:8.2f})  back-to-back {r['b2b']:8.2f} ms  "
                  f"error {r['err']:+.1%} / {r['err2']:+.1%}   eager step {eager:8.2f} ms   "
                  f"per-op profile-vs-profile median diff {r['stab']:.1%} ({r['n']} entries)", flush=True)
        if not args.no_write:  # partial results survive an interrupted run
            write_results(rows, f"(partial: {', '.join(sorted({r['model'] for r in rows}))} done)", args,
                          time.time() - t_start)
    elapsed = time.time() - t_start
    worst = max(abs(r["err"]) for r in rows)
    stab = statistics.median(r["stab"] for r in rows)
    ok = "meets" if worst <= 0.10 else "MISSES"
    headline = (f"profiler: sum of op times vs back-to-back step within {worst:.1%} worst case "
                f"({ok} the 10% target) over {len(rows)} model x backend pairs (batch {args.batch}); "
                f"profile-to-profile median per-op difference {stab:.1%}; {elapsed:.0f} s")
    if not args.no_write:
        write_results(rows, headline, args, elapsed)
    print(headline)


def write_results(rows, headline, args, elapsed) -> None:
    path = ROOT / "bench" / "RESULTS.md"
    cpu = "unknown"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = ["## Profiler", "",
             f"`python bench/profile.py{' --quick' if args.quick else ''}` on {cpu}, {torch.get_num_threads()} threads, "
             f"torch {torch.__version__}, {datetime.date.today().isoformat()} ({elapsed:.0f} s). CIFAR 3x32x32, batch "
             f"{args.batch}, SGD momentum, plain variants. *Profile sum*: sum over the graph's ops of the profiled "
             f"median latency; *back-to-back*: the same runner's prepared ops run in graph order, median step; "
             f"*eager*: PyTorch's real training step (forward, backward, optimizer.step) for reference. "
             f"*Stability*: median per-op |difference| between two profiles taken {rows[0]['gap']:.0f}+ s apart.", "",
             "| model | accelerator | profile sum (ms) | 2nd profile sum (ms) | back-to-back (ms) | error | eager step (ms) | stability |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['acc']} | {r['sum1']:.2f} | {r['sum2']:.2f} | {r['b2b']:.2f} | "
                     f"{r['err']:+.1%} / {r['err2']:+.1%} | {r['eager']:.2f} | {r['stab']:.1%} |")
    lines += ["", f"Headline: {headline}", ""]
    section = "\n".join(lines)
    text = path.read_text() if path.exists() else "# PORT benchmark results\n\n"
    start = text.find("## Profiler")
    if start >= 0:
        end = text.find("\n## ", start + 5)
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    from port.io import atomic_write_text
    atomic_write_text(path, text)


if __name__ == "__main__":
    main()
