"""Cross-engine plans on ``host-opencl`` (issue 56): the ILP's own plans for ResNet-8, ResNet-18 and MobileNetV2 at
100% and 50% budgets over the C kernels, PyTorch's CPU kernels and the OpenCL engine, executed; predicted step
(port.verify.simulate) against the measured median step.

    python bench/opencl.py --quick                 # ResNet-8 only, batch 8, quick profile
    python bench/opencl.py                         # ResNet-8, ResNet-18, MobileNetV2 at batch 8, budgets 1, 0.5
    options: --models resnet8,resnet18 --batch 8 --budgets 1,0.5 --steps 10 --profile-max-s S --solve-s S
             --profile-dir DIR (profiles are reused from there; one without the opencl calls' issue times is
             measured again for them) --json PATH
             --memory unified,discrete,split (host-opencl.yaml, host-opencl-discrete.yaml: the profile records
             which engine has its own memory, and the plan runs with its own arena and copies without being told;
             host-opencl-split.yaml: the C kernels on one core, PoCL on the other, so the OpenCL queue overlaps
             the host for real and the predicted step is the simulator's makespan; each configuration runs in a
             process of its own, as PoCL reads its thread count once a process)
             --opencl-scale F (also solve on the measured profile with OpenCL's convolutions x F: forced plans
             where the real profile leaves OpenCL out; predicted from the scaled profile, so its error says
             nothing about the pricing, only that the plan runs) --no-write

The table goes to bench/RESULTS.md (section "OpenCL engine: cross-engine plans"; --quick and --no-write: printed
only), its headline last: how many of the ILP's plans use both engines and execute, and how many of those are
within 15% of their prediction (the target, on a quiet machine; rows solved on a --opencl-scale profile are listed
but not counted).

PoCL's OpenCL device computes on the same CPU cores as the other two engines: its timings are CPU timings. The
executor enqueues OpenCL calls and runs independent host calls meanwhile (it waits at hand-offs and byte
conflicts: port.exec.handoff.host_waits), but on shared cores that overlap saves little: the predicted step is
the simulator's serial sum (what the ILP minimises); the overlapped makespan (breakdown["makespan_ms"], the
figure for an engine on its own silicon) is printed beside it. The split configuration gives each engine a core
of its own (C kernels and PyTorch 1 thread, PoCL 1 thread): there the ILP minimises the makespan and the
prediction is the makespan. Whether
a plan "uses both engines" is reported per row (the ILP places an op on opencl only where the profile says it
pays). Figures are for a quiet machine: the lead records them, not this script. Under load (2 cores shared
by 8 processes, load 6) every plan's median is 2-10x its prediction, the all-C plans' too (ResNet-8 b8: predicted
27.9 ms, medians 47-1054 ms, minima 14-22 ms over alternating runs), so the minimum is printed beside the median.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path[:] = [str(ROOT)] + [q for q in sys.path if Path(q or ".").resolve() != BENCH]

MODELS = ("resnet8", "resnet18", "mobilenetv2")
DEVICES = {"unified": ROOT / "configs" / "devices" / "host-opencl.yaml",
           "split": ROOT / "configs" / "devices" / "host-opencl-split.yaml",
           "discrete": ROOT / "configs" / "devices" / "host-opencl-discrete.yaml"}
KW = {"mobilenetv2": {"dropout": 0.0}}


def scaled(prof, f: float):
    """``prof`` with the opencl convolutions' times x ``f`` (a forced plan; bench only)."""
    import dataclasses
    ents = tuple(dataclasses.replace(e, latency_ms=e.latency_ms * f) if e.accelerator == "opencl" and "conv" in
                 e.signature else e for e in prof.entries)
    return dataclasses.replace(prof, entries=ents, _index={})


def infeasible_row(name: str, batch: int, budget: float, memory: str, label: str, err, profile_s: float) -> dict:
    """The row of a budget no plan fits (port.errors.InfeasibleBudgetError ``err``): no plan, no times; its
    "infeasible" text names the smallest feasible budget the solver found."""
    from port.config import format_size
    mn = err.min_feasible_bytes
    return {"model": name, "batch": batch, "budget": budget, "memory": memory, "profile": label,
            "infeasible": ("infeasible: smallest feasible " + (format_size(mn) if mn is not None else "unknown")
                           + f" (budget {format_size(err.budget_bytes)})"),
            "budget_bytes": err.budget_bytes, "min_feasible_bytes": mn, "profile_s": profile_s}


def unsolved_row(name: str, batch: int, budget: float, memory: str, label: str, solve_s: float, err,
                 profile_s: float) -> dict:
    """The row of a budget the solve found no plan for in ``solve_s`` (port.errors.SolverError ``err``: MobileNetV2
    b8 at 50% split, 20 s, on a loaded machine): no plan, no times; listed like an infeasible budget, counted apart."""
    return {"model": name, "batch": batch, "budget": budget, "memory": memory, "profile": label, "unsolved": True,
            "infeasible": f"no plan in {solve_s:g} s: {str(err)[:120]}", "profile_s": profile_s}


def runq_ms() -> float | None:
    """What this process's threads have waited so far for a core held by another process, ms (Linux schedstat's
    run-queue wait, summed over the threads: the host thread and PoCL's workers); None where it is not readable.
    A step's share says how far other processes moved its time: the split configuration pins each engine to one
    core, so a busy neighbour there delays that engine (and the host where it joins the queue) by whole
    scheduler slices (ResNet-8 b8 at load 5-8: 20-30 ms per step on the host thread, 6-12 ms on PoCL's)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    total = 0
    for t in tids:
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):   # a thread gone meanwhile, or no schedstat
            continue
    return total / 1e6


def run_model(name: str, batch: int, budgets: list[float], a, memory: str = "unified") -> list[dict]:
    import torch
    import port
    from port import models
    from port.config import load_device
    from port.cost.io import load_profile, save_profile
    from port.errors import InfeasibleBudgetError, SolverError
    from port.verify.simulate import overlapping_accelerators
    from port.train.optim import SGD
    from port.train.trainer import Trainer

    dev = load_device(str(DEVICES[memory]))
    if "opencl" not in {acc.id for acc in dev.accelerators}:
        raise SystemExit(f"host-opencl: the opencl engine is absent here ({'; '.join(dev.skipped)})")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *models.INPUT_SHAPES[name], generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    opt = SGD(0.01, momentum=0.9)
    graph = port.trace(models.get(name, seed=0, **KW.get(name, {})), x, optimizer=opt.graph_name)
    ppath = Path(a.profile_dir) / f"{name}_b{batch}{'' if memory == 'unified' else '_' + memory}.json"
    t0 = time.perf_counter()
    if ppath.exists():
        prof = load_profile(ppath)
        if any(e.accelerator == "opencl" and e.measured and not e.issue_ms for e in prof.entries):
            # written before the host's issue of a queued call was measured (OpCost.issue_ms): its opencl
            # entries measured again, the rest reused (port.cost.measure's cache)
            prof = port.profile(graph, dev, quick=a.quick, max_time_s=a.profile_max_s, cache=prof)
            save_profile(prof, ppath)
    else:
        prof = port.profile(graph, dev, quick=a.quick, max_time_s=a.profile_max_s)
        ppath.parent.mkdir(parents=True, exist_ok=True)
        save_profile(prof, ppath)
    prof_s = time.perf_counter() - t0
    rows = []
    profs = [("measured", prof)] + ([(f"opencl conv x{a.opencl_scale:g}", scaled(prof, a.opencl_scale))]
                                    if a.opencl_scale else [])
    for (label, pr), f in [(lp, f) for lp in profs for f in budgets]:
        try:
            plan = port.solve(graph, pr, budget=f"{f * 100:g}%", time_limit_s=a.solve_s)
        except InfeasibleBudgetError as e:   # a recorded row: the budget is below what any plan needs
            rows.append(infeasible_row(name, batch, f, memory, label, e, prof_s))
            print(f"{name} b{batch} {f:.0%} {memory} ({label}): {rows[-1]['infeasible']}", flush=True)
            continue
        except SolverError as e:             # a recorded row too: no plan within --solve-s
            rows.append(unsolved_row(name, batch, f, memory, label, a.solve_s, e, prof_s))
            print(f"{name} b{batch} {f:.0%} {memory} ({label}): {rows[-1]['infeasible']}", flush=True)
            continue
        sim = port.simulate(plan, graph, pr)
        accs = sorted({d.accelerator for d in plan.ops})
        # the step the ILP minimised: the makespan where a queued engine has cores of its own (split), else the
        # serial sum (shared cores: no real overlap)
        objective = "makespan" if overlapping_accelerators(accs, pr) else "serial"
        pred = sim.breakdown["makespan_ms"] if objective == "makespan" else sim.step_ms
        tr = Trainer(models.get(name, seed=0, **KW.get(name, {})), x, optimizer=SGD(0.01, momentum=0.9), plan=plan,
                     threads=pr.threads or "auto")     # the profile's count: its times hold for it
        for _ in range(2):
            tr.step(x, y)
        ms, waits = [], []
        for _ in range(a.steps):
            r0 = runq_ms()
            t = time.perf_counter()
            tr.step(x, y)
            ms.append((time.perf_counter() - t) * 1e3)
            r1 = runq_ms()
            if r0 is not None and r1 is not None:
                waits.append(r1 - r0)
        calls = tr.executor.program.calls
        n_ocl = sum(c.backend == "opencl" for c in calls)
        own_arena = dict(tr.executor.program.memories)
        tr.close()
        meas = statistics.median(ms)
        rows.append({"model": name, "batch": batch, "budget": f, "memory": memory, "profile": label,
                     "accelerators": accs, "own_arena_bytes": own_arena.get("opencl", 0),
                     "own_peak_bytes": sim.breakdown.get("own_memory_peaks", {}).get("opencl", 0),
                     "opencl_calls": n_ocl, "handoff_calls": sum(c.kernel == "handoff" for c in calls),
                     "both_engines": n_ocl > 0 and len(accs) > 1, "predicted_ms": pred, "objective": objective,
                     "handoff_ms": sim.breakdown.get("handoff_ms", 0.0),
                     "makespan_ms": sim.breakdown.get("makespan_ms", sim.step_ms), "measured_ms": meas,
                     "measured_min_ms": min(ms), "runq_ms": statistics.median(waits) if waits else None,
                     "error": (meas - pred) / pred, "profile_s": prof_s})
        print(f"{name} b{batch} {f:.0%} {memory} ({label}): predicted {pred:.1f} ms ({objective}) "
              f"(hand-offs {rows[-1]['handoff_ms']:.2f}, overlapped {rows[-1]['makespan_ms']:.1f}) "
              f"measured {meas:.1f} ms ({rows[-1]['error']:+.0%}; min {min(ms):.1f}; waited for a core "
              f"{_ms(rows[-1]['runq_ms'])} ms); engines {accs}, "
              f"{n_ocl} opencl calls, {rows[-1]['handoff_calls']} hand-offs"
              + (f", own arena {own_arena['opencl']} B" if own_arena else ""), flush=True)
    return rows


def run_child(a, memory: str, names: list[str]) -> list[dict]:
    """The rows of one configuration, run by this script in a process of its own."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "rows.json"
        cmd = [sys.executable, __file__, "--memory", memory, "--json", str(out), "--no-write", "--models",
               ",".join(names), "--batch", str(a.batch), "--budgets", a.budgets, "--steps", str(a.steps),
               "--solve-s", str(a.solve_s), "--profile-dir", a.profile_dir]
        cmd += (["--quick"] if a.quick else []) + (["--profile-max-s", str(a.profile_max_s)] if a.profile_max_s
                                                   else []) + (["--opencl-scale", str(a.opencl_scale)]
                                                               if a.opencl_scale else [])
        subprocess.run(cmd, check=True, env={**os.environ, CHILD_ENV: "1"})
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--budgets", default="1,0.5")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--profile-max-s", type=float, default=None)
    ap.add_argument("--solve-s", type=float, default=60.0)
    ap.add_argument("--profile-dir", default=str(ROOT / "runs" / "bench_profiles" / "host-opencl"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--memory", default="unified,discrete,split")
    ap.add_argument("--opencl-scale", type=float, default=None)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    t0, load0 = time.time(), os.getloadavg()[0]
    names = a.models.split(",") if a.models else (["resnet8"] if a.quick else list(MODELS))
    budgets = [float(b) for b in a.budgets.split(",")]
    mems = a.memory.split(",")
    for mem in mems:
        if mem not in DEVICES:
            raise SystemExit(f"--memory {mem!r}: choose from {sorted(DEVICES)}")
    rows = []
    for mem in mems:
        if len(mems) == 1:
            for n in names:
                rows += run_model(n, a.batch, budgets, a, mem)
        else:       # a process per configuration: PoCL reads its thread count once a process (split: 1)
            rows += run_child(a, mem, names)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    if os.environ.get(CHILD_ENV):
        return                  # run_child's process: the parent prints and writes the section
    sys.path.append(str(BENCH))
    from _results import machine_line, publish
    publish(SECTION, results_text(rows, machine_line("python bench/opencl.py " + " ".join(sys.argv[1:]), t0, load0),
                                  load0), not (a.no_write or a.quick))


SECTION = "OpenCL engine: cross-engine plans"
CHILD_ENV = "PORT_BENCH_OPENCL_CHILD"
TARGET = 0.15


def results_text(rows: list[dict], machine: str, load0: float) -> str:
    """The section's text: the machine line, one table row per plan, the headline (last paragraph)."""
    quiet = load0 < 1.0
    lines = [machine + (", quiet." if quiet else ", UNDER LOAD: indicative only, to be rerun on a quiet machine.")
             + " PoCL's OpenCL device computes on this machine's CPU cores: its times are CPU timings. "
             "Configurations: unified (host-opencl.yaml) and discrete (host-opencl-discrete.yaml) share both cores "
             "between the engines, predicted = port.verify.simulate's step (the serial sum), overlapped = its "
             "makespan were the engine on its own silicon; split (host-opencl-split.yaml) gives the C kernels one "
             "core and PoCL the other, predicted = overlapped = the makespan (the ILP's objective there). Waited for a "
             "core: the median step's run-queue wait of this process's threads (Linux schedstat), the time other "
             "processes held the cores its engines are pinned to (split), not in any prediction.", "",
             "| model | batch | budget | configuration | profile | engines | opencl calls | hand-offs | predicted ms "
             "| "
             "overlapped ms | measured ms (median) | min ms | waited for a core ms (median) | measured vs predicted |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("infeasible"):
            lines.append(f"| {r['model']} | {r['batch']} | {r['budget']:.0%} | {r['memory']} | {r['profile']} | "
                         f"{r['infeasible']} |" + " |" * 8)
            continue
        lines.append(f"| {r['model']} | {r['batch']} | {r['budget']:.0%} | {r['memory']} | {r['profile']} | "
                     f"{', '.join(r['accelerators'])} | {r['opencl_calls']} | {r['handoff_calls']} | "
                     f"{r['predicted_ms']:.1f} | {r['makespan_ms']:.1f} | {r['measured_ms']:.1f} | "
                     f"{r['measured_min_ms']:.1f} | {_ms(r.get('runq_ms'))} | {100 * r['error']:+.1f}% |")
    own = [r for r in rows if r["profile"] == "measured" and not r.get("infeasible")]
    n_inf = sum(bool(r.get("infeasible")) and not r.get("unsolved") for r in rows if r["profile"] == "measured")
    n_uns = sum(bool(r.get("unsolved")) for r in rows if r["profile"] == "measured")
    both = [r for r in own if r["both_engines"]]
    ok = sum(abs(r["error"]) <= TARGET for r in both)
    lines += ["", f"OpenCL headline: {len(both)}/{len(own)} of the ILP's plans use both engines and executed"
                  + (f" ({n_inf} budget{'s' if n_inf > 1 else ''} infeasible: no plan fits)" if n_inf else "")
                  + (f" ({n_uns} not solved in the solve's time)" if n_uns else "")
                  + f"; {ok}/{len(both)} of them within 15% of their predicted step (target: all"
                  f"{'' if quiet else '; UNDER LOAD, indicative only'}; PoCL timings are CPU timings)."]
    return "\n".join(lines)


def _ms(v) -> str:
    return "n/a" if v is None else f"{v:.1f}"


if __name__ == "__main__":
    main()
