"""`port train CONFIG`: trace -> profile (cached) -> solve -> train -> export -> report.

Each run writes ``runs/<name>/``: ``config.yaml`` (resolved), ``profile.json``, ``plan.json``,
``checkpoint.port``, ``metrics.jsonl`` (one line per step), ``measured.json`` (per-op times and the memory
timeline of instrumented steps), ``model.onnx`` / ``model.pt`` (inference exports) and ``report.html``.
``port report RUN_DIR`` rebuilds the report; ``port train --replan`` re-profiles the ops the last run flagged
(measured time off the prediction by more than 25%) and solves again before training.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Optional

import typer

ROOT = Path(__file__).resolve().parent.parent
PROFILE_MAX_TIME_S = 600.0


def _rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _model_and_graph(cfg):
    import torch

    from . import data as D
    from . import models
    from .graph import trace

    torch.manual_seed(cfg.train.seed)
    kwargs = dict(cfg.model.kwargs)
    if ":" not in cfg.model.name:
        kwargs.setdefault("num_classes", cfg.num_classes)
        kwargs["seed"] = cfg.train.seed
    model = models.load(cfg.model.name, **kwargs)
    ds = D.load(cfg)
    example = ds.x_train[:cfg.batch_size].contiguous()
    trainable = list(cfg.train.trainable) if cfg.train.trainable else None
    graph = trace(model, example, trainable=trainable, optimizer=cfg.optimizer.name, name=cfg.model.name)
    return model, ds, example, graph, trainable


def _covers(profile, graph) -> bool:
    return all(profile.options(graph.signature(o)) for o in graph.ops)


def get_profile(graph, device, run_dir: Path, console, replan_ops: tuple[str, ...] = (), max_time_s: float | None = None):
    """A profile covering ``graph``: the run's own or the repository's cached one when it covers every op,
    else measured now (reusing cached entries: incremental). ``replan_ops`` are signatures to re-measure."""
    from .errors import ProfileError
    from .profile import load_profile, profile, save_profile
    from .types import Profile

    candidates = [run_dir / "profile.json", ROOT / "profiles" / device.name / f"{graph.name}.json"]
    cache = None
    for p in candidates:
        if not p.exists():
            continue
        try:
            prof = load_profile(p, device=device.name)
        except ProfileError as e:
            console.print(f"[yellow]ignoring cached profile {p}: {e}[/]")
            continue
        if _covers(prof, graph) and not replan_ops:
            console.print(f"profile: cached {p} ({sum(e.measured for e in prof.entries)} measured entries)")
            own = run_dir / "profile.json"
            if p != own:
                save_profile(prof, own)        # every run directory holds the profile its plan used
            return prof, own
        cache = prof
        break
    if cache is not None and replan_ops:
        keep = tuple(e for e in cache.entries if e.signature not in replan_ops)
        cache = Profile(cache.device, cache.accelerators, keep, cache.handoff, cache.threads, cache.host,
                        cache.memory_bytes, cache.accelerator_caps, cache.storage)
        console.print(f"re-profiling {len(replan_ops)} flagged op signature(s)")
    t = time.perf_counter()
    prof = profile(graph, device, cache=cache, progress=True,
                   max_time_s=max_time_s if max_time_s is not None else PROFILE_MAX_TIME_S)
    out = run_dir / "profile.json"
    save_profile(prof, out)
    console.print(f"profile: measured in {time.perf_counter() - t:.1f} s -> {out}")
    return prof, out


def naive_peak_bytes(graph, profile) -> int:
    """The keep-everything, plain-variant plan's peak on the first accelerator: what PyTorch eager holds."""
    from .solve import SOLVERS
    plan = SOLVERS["single"](graph, profile, 10**15, accelerator=profile.accelerators[0])
    return int(plan.predicted_peak_bytes)


def plan_summary(plan, graph) -> str:
    from collections import Counter

    from .config import format_size
    accs = Counter(d.accelerator for d in plan.ops)
    vars_ = Counter(d.variant for d in plan.ops if d.variant != "plain")
    gap = "-" if plan.gap != plan.gap else f"{plan.gap:.2%}"
    return (f"plan: {plan.status} by {plan.solver} in {plan.solve_time_s:.2f} s (gap {gap}); predicted step "
            f"{plan.predicted_step_ms:.2f} ms, peak {format_size(plan.predicted_peak_bytes)} of budget "
            f"{format_size(plan.budget_bytes)}\n  placement: " + ", ".join(f"{a} {n}" for a, n in sorted(accs.items()))
            + "; variants: " + (", ".join(f"{v} {n}" for v, n in sorted(vars_.items())) or "all plain")
            + f"; recomputed tensors {len(plan.recompute)}, early updates {len(plan.early_updates)}, "
              f"paged {len(plan.paged)}")


def measure(trainer, x, y, repeats: int = 5) -> dict[str, Any]:
    """Per-op measured times (median over ``repeats`` instrumented steps) and the measured memory timeline."""
    fn = getattr(trainer, "profile_step", None)
    if fn is None:
        t = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            trainer.step(x, y)
            t.append((time.perf_counter() - t0) * 1e3)
        return {"step_ms": statistics.median(t), "op_ms": {}, "timeline_bytes": []}
    runs = [fn(x, y) for _ in range(repeats)]
    per: dict[str, list[float]] = {}
    for r in runs:
        for name, ms in r["op_ms"].items():
            per.setdefault(name, []).append(ms)
    return {"step_ms": statistics.median(r["step_ms"] for r in runs),
            "op_ms": {k: statistics.median(v) for k, v in per.items()},
            "timeline_bytes": list(runs[-1].get("timeline_bytes", [])),
            # which graph op (and whether a recompute) each timeline point belongs to, to align with the plan
            "timeline_ops": [[int(c["op"]), bool(c.get("recompute"))] for c in runs[-1].get("calls", [])],
            "peak_bytes": max(runs[-1].get("timeline_bytes", [0]) or [0])}


def align_timeline(sim_steps, measured: dict) -> list[int]:
    """The measured (arena) timeline on the simulator's step axis: each executor call is matched to the plan
    step of the same op (recompute or not); steps without a call of their own (views, ops inside a fused
    kernel) carry the previous value."""
    tl, ops = measured.get("timeline_bytes") or [], measured.get("timeline_ops") or []
    if not tl or len(ops) != len(tl):
        return list(tl)
    at: dict[tuple[int, bool], int] = {}
    for (op, rc), b in zip(ops, tl):
        at[(op, rc)] = max(at.get((op, rc), 0), b)
    out, last = [], tl[0]
    for kind, op in sim_steps:
        last = at.get((op, kind == "recompute"), last)
        out.append(last)
    return out


def build_report(run_dir: Path, graph, profile, plan, measured: dict, summary: dict):
    from .report import OpRow, render_report
    from .simulate import simulate

    sim = simulate(plan, graph, profile)
    pred: dict[str, float] = {}
    for label, acc, start, end in sim.gantt:
        pred[label] = pred.get(label, 0.0) + (end - start)
    rows = []
    op_ms = measured.get("op_ms", {})
    for d in plan.ops:
        o = graph.ops[d.op]
        rows.append(OpRow(o.name, o.layer, o.kind, o.phase, d.accelerator, d.variant,
                          pred.get(o.name, 0.0), op_ms.get(o.name)))
    acc_of = {label: acc for label, acc, _, _ in sim.gantt}
    for label in pred:
        if label.endswith(" (recompute)"):
            rows.append(OpRow(label, label[:-len(" (recompute)")], "recompute", "recompute", acc_of.get(label, "-"),
                              "-", pred[label], op_ms.get(label)))
    flags = render_report(run_dir / "report.html", f"PORT run {run_dir.name}", rows, list(sim.timeline),
                          align_timeline(sim.steps, measured) or None, plan.budget_bytes, summary)
    return flags


def run_training(config: Path, resume: bool = False, steps: Optional[int] = None, out_dir: Path = Path("runs"),
                 quiet: bool = False, replan: bool = False, budget: Optional[str] = None,
                 solver: Optional[str] = None, export: bool = True) -> dict:
    import torch
    import yaml
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from . import config as C
    from .config import format_size
    from .errors import ConfigError
    from .io import atomic_write_text
    from .optim import from_config
    from .plan_io import save_plan
    from .solve import solve
    from .trainer import Trainer

    console = Console(quiet=quiet, highlight=False)
    cfg = C.load_experiment(config)
    if budget is not None:
        cfg = cfg.model_copy(update={"budget": C.ExperimentConfig._budget(budget)})
    if solver is not None:
        cfg = cfg.model_copy(update={"solver": cfg.solver.model_copy(update={"name": solver})})
    device = C.resolve_device(cfg, config)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    run_dir = Path(out_dir) / cfg.name
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(C.dump_experiment(cfg), sort_keys=False))
    ckpt = run_dir / "checkpoint.port"

    rss0 = _rss_bytes()
    t_setup = time.perf_counter()
    model, ds, example, graph, trainable = _model_and_graph(cfg)
    B = cfg.batch_size
    console.print(f"[bold]{cfg.name}[/]: {cfg.model.name} ({len(graph.ops)} ops) on {cfg.data.kind} "
                  f"({ds.x_train.shape[0]} train / {ds.x_test.shape[0]} test), batch {B}, device {device.name}")

    # profile -> solve
    replan_ops: tuple[str, ...] = ()
    if replan:
        mpath = run_dir / "measured.json"
        if not mpath.exists():
            raise ConfigError(f"--replan needs a previous run's measurements at {mpath}; run `port train {config}` first")
        replan_ops = tuple(json.loads(mpath.read_text()).get("flagged_signatures", ()))
        if not replan_ops:
            console.print("nothing was flagged in the last run; solving again with the cached profile")
    profile, _ = get_profile(graph, device, run_dir, console, replan_ops)
    naive = naive_peak_bytes(graph, profile)
    budget_b = cfg.budget_bytes(naive, device.memory)
    console.print(f"budget {format_size(budget_b)} ({budget_b / naive:.0%} of the keep-everything peak "
                  f"{format_size(naive)}, what PyTorch eager holds)")
    if cfg.train.micro_batch and cfg.train.micro_batch < B:
        allow_early = False
    else:
        allow_early = True
    plan = solve(graph, profile, budget_b, solver=cfg.solver.name, time_limit_s=cfg.solver.time_limit_s,
                 gap=cfg.solver.gap, allow_early_updates=allow_early)
    save_plan(plan, run_dir / "plan.json", graph=graph)
    console.print(plan_summary(plan, graph))

    # train
    kw = dict(optimizer=from_config(cfg.optimizer), micro_batch=cfg.train.micro_batch, trainable=trainable,
              seed=cfg.train.seed, plan=plan)
    if resume and ckpt.exists():
        tr = Trainer.resume(ckpt, model, example, **kw)
        console.print(f"resumed from {ckpt} at step {tr.step_count}")
    else:
        if resume:
            console.print(f"no checkpoint at {ckpt}; starting from scratch")
        tr = Trainer(model, example, **kw)
    setup_s = time.perf_counter() - t_setup
    mem = tr.memory_report()
    console.print(f"arena: {format_size(mem['arena_bytes'])} (persistent {format_size(mem['persistent_bytes'])} + "
                  f"scratch {format_size(mem['scratch_bytes'])}); plan predicted peak "
                  f"{format_size(plan.predicted_peak_bytes)}; set-up {setup_s:.2f} s")
    rss_train0 = _rss_bytes()     # training-time growth is measured from here (set-up excluded)
    total = steps if steps is not None else cfg.train.steps
    per_epoch = max(1, ds.x_train.shape[0] // B)
    if cfg.train.epochs:
        total = cfg.train.epochs * per_epoch
    epoch = tr.step_count // per_epoch
    it = ds.batches(B, cfg.train.seed, epoch)
    skip = tr.step_count % per_epoch          # resume mid-epoch on the same batches
    for _ in range(skip):
        next(it, None)
    losses: list[float] = []
    t0 = time.perf_counter()
    done0 = tr.step_count
    rss_peak = _rss_bytes()
    metrics = (run_dir / "metrics.jsonl").open("a" if resume else "w")
    last = (None, None)
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TextColumn("loss {task.fields[loss]}"),
                  TextColumn("{task.fields[sps]} steps/s"), TextColumn("mem {task.fields[mem]}"),
                  TimeElapsedColumn(), console=console, transient=False, disable=quiet) as prog:
        task = prog.add_task("train", total=total, completed=tr.step_count, loss="-", sps="-",
                             mem=format_size(mem["arena_bytes"]))
        while tr.step_count < total:
            try:
                x, y = next(it)
            except StopIteration:
                epoch += 1
                it = ds.batches(B, cfg.train.seed, epoch)
                continue
            ts = time.perf_counter()
            loss = tr.step(x, y)
            step_ms = (time.perf_counter() - ts) * 1e3
            last = (x, y)
            losses.append(loss)
            s = tr.step_count
            metrics.write(json.dumps({"step": s, "loss": loss, "step_ms": round(step_ms, 4), "epoch": epoch}) + "\n")
            if s % cfg.train.checkpoint_every == 0 or s == total:
                metrics.flush()
                tr.save_checkpoint(ckpt, meta={"config": str(config), "epoch": epoch})
            if cfg.train.eval_every and s % cfg.train.eval_every == 0:
                ev = tr.evaluate(ds.test_batches(B))
                console.print(f"step {s}: test accuracy {ev['accuracy']:.4f}")
            if s % 10 == 0 or s == total:
                rss_peak = max(rss_peak, _rss_bytes())
                el = time.perf_counter() - t0
                prog.update(task, completed=s, loss=f"{sum(losses[-10:]) / len(losses[-10:]):.4f}",
                            sps=f"{(s - done0) / max(el, 1e-9):.0f}")
    metrics.close()
    train_s = time.perf_counter() - t0
    ev = tr.evaluate(ds.test_batches(B))
    rss_growth = max(rss_peak, _rss_bytes()) - rss_train0
    setup_rss = rss_train0 - rss0

    # closed loop: measure per-op times on a copy of the state (the trained weights are not touched)
    x, y = last if last[0] is not None else next(ds.batches(B, cfg.train.seed, 0))
    snapshot = tr.state_dict()
    opt_state = tr.optimizer_state() if hasattr(tr, "optimizer_state") else None
    measured = measure(tr, x, y)
    tr.load_state_dict(snapshot)
    if opt_state is not None and hasattr(tr, "load_optimizer_state"):
        tr.load_optimizer_state(opt_state)
    summary = {
        "model": f"{cfg.model.name} ({len(graph.ops)} ops), batch {B}",
        "device": device.name, "plan": f"{plan.status} by {plan.solver}, gap {plan.gap:.2%}",
        "budget": format_size(plan.budget_bytes),
        "predicted step": f"{plan.predicted_step_ms:.2f} ms", "measured step": f"{measured['step_ms']:.2f} ms",
        "predicted peak": format_size(plan.predicted_peak_bytes),
        "arena (planned, allocated)": format_size(mem["arena_bytes"]),
        "process RSS growth while training": format_size(rss_growth),
        "test accuracy": f"{ev['accuracy'] * 100:.2f}%", "steps": tr.step_count,
    }
    flags = build_report(run_dir, graph, profile, plan, measured, summary)
    sig_of = {o.name: graph.signature(o) for o in graph.ops}
    measured["flagged"] = [r.op for r in flags]
    measured["flagged_signatures"] = sorted({sig_of[r.op] for r in flags if r.op in sig_of})
    measured["predicted_step_ms"] = plan.predicted_step_ms
    atomic_write_text(run_dir / "measured.json", json.dumps(measured, indent=1))
    if export:
        for fmt, name in (("onnx", "model.onnx"), ("torch", "model.pt")):
            try:
                tr.export(run_dir / name, fmt)
            except Exception as e:  # noqa: BLE001 - export is a convenience at the end of a run
                console.print(f"[yellow]export {fmt} failed: {e}[/]")
    console.print(f"trained {tr.step_count - done0} steps in {train_s:.2f} s; step time predicted "
                  f"{plan.predicted_step_ms:.2f} ms, measured {measured['step_ms']:.2f} ms")
    console.print(f"memory: plan peak {format_size(plan.predicted_peak_bytes)}, arena {format_size(mem['arena_bytes'])}"
                  f", budget {format_size(plan.budget_bytes)}; process RSS growth while training "
                  f"{format_size(rss_growth)} (set-up: torch, tracing, solver, arena: {format_size(setup_rss)})")
    console.print(f"{len(flags)} op(s) off their predicted time by more than 25% (see report; `--replan` "
                  f"re-profiles them)")
    console.print(f"[bold]test accuracy {ev['accuracy'] * 100:.2f}%[/] (loss {ev['loss']:.4f}); run directory {run_dir}")
    return {"accuracy": ev["accuracy"], "test_loss": ev["loss"], "steps": tr.step_count, "train_s": train_s,
            "arena_bytes": mem["arena_bytes"], "rss_growth_bytes": rss_growth, "run_dir": str(run_dir),
            "plan": plan, "measured": measured, "flagged": [r.op for r in flags]}


def run_report(run_dir: Path) -> Path:
    """Rebuild runs/<name>/report.html from the run's files."""
    from . import config as C
    from .errors import ConfigError
    from .plan_io import load_plan
    from .profile import load_profile

    run_dir = Path(run_dir)
    for f in ("config.yaml", "profile.json", "plan.json", "measured.json"):
        if not (run_dir / f).exists():
            raise ConfigError(f"{run_dir}: not a run directory (missing {f}); create one with `port train CONFIG`")
    cfg = C.load_experiment(run_dir / "config.yaml")
    device = C.resolve_device(cfg)
    _, _, _, graph, _ = _model_and_graph(cfg)
    profile = load_profile(run_dir / "profile.json", device=device.name)
    plan = load_plan(run_dir / "plan.json", graph=graph, profile=profile)
    measured = json.loads((run_dir / "measured.json").read_text())
    build_report(run_dir, graph, profile, plan, measured,
                 {"model": cfg.model.name, "device": device.name, "predicted step": f"{plan.predicted_step_ms:.2f} ms",
                  "measured step": f"{measured.get('step_ms', float('nan')):.2f} ms"})
    return run_dir / "report.html"


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(config: Path = typer.Argument(..., help="experiment YAML, e.g. configs/default.yaml"),
              resume: bool = typer.Option(False, "--resume", help="continue from runs/<name>/checkpoint.port"),
              steps: Optional[int] = typer.Option(None, "--steps", help="override train.steps"),
              budget: Optional[str] = typer.Option(None, "--budget", help="memory budget: 64MB, 1.5GiB or 60% of the naive peak"),
              solver: Optional[str] = typer.Option(None, "--solver", help="highs | cbc | scip | cpsat | greedy | chen | single"),
              replan: bool = typer.Option(False, "--replan", help="re-profile the ops the last run flagged, then solve again"),
              out: Path = typer.Option(Path("runs"), "--out", help="directory for runs/<name>/"),
              ) -> None:
        """Trace, profile (cached), solve under the budget, train with the plan, export and report."""
        run_training(config, resume=resume, steps=steps, out_dir=out, replan=replan, budget=budget, solver=solver)

    @app.command("report")
    def report(run_dir: Path = typer.Argument(..., help="a run directory, e.g. runs/digits")) -> None:
        """Write RUN_DIR/report.html: memory predicted vs measured, Gantt chart, placement, flagged ops."""
        out = run_report(run_dir)
        typer.echo(f"wrote {out}")
