"""Step 6: the training run (`port train CONFIG`): trace -> profile -> budget -> plan -> train -> measure ->
export -> report, with checkpoints, resume and a clean stop on SIGINT / SIGTERM. One state record (_Run)
carries what the steps share; each step is a function over it."""
from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from port.errors import ConfigError, NonFiniteError
from port.pipeline.budget import Budget, resolve_budget
from port.pipeline.build import Built, build_graph, load_data
from port.pipeline.common import KEEP_EVERYTHING, Echo, Interrupted
from port.pipeline.job import Job, fixed_threads, load_job, stand_in_backends
from port.pipeline.profiles import ProfileStep, get_profile, replan_profile
from port.pipeline.runs import (_governed_threads, _metrics_upto, _reuse_plan, _rss_bytes, build_report,
                                measure_steps, read_header_step, read_measured, wall_step_ms)
from port.pipeline.solve import Solved, plan_summary, save_plan_file, solve_plan


@dataclass(frozen=True)
class TrainResult:
    accuracy: float
    test_loss: float
    steps: int
    train_s: float
    arena_bytes: int
    rss_growth_bytes: int
    run_dir: Path
    plan: Any
    profile_path: Optional[Path]
    profile_source: str
    measured: dict = field(default_factory=dict)
    flagged: tuple[str, ...] = ()


class _StopOnSignal:
    """While training: SIGINT / SIGTERM only set a flag, which the loop checks between steps (so the checkpoint
    it then writes is of a whole step). A second signal stops at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._old: dict = {}

    def _on(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:
            raise Interrupted(signum, f"{signal.Signals(signum).name} again: stopped before the checkpoint "
                                      f"was written (the previous checkpoint is intact)")
        self.signum = signum

    def __enter__(self) -> "_StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.getsignal(s)
                signal.signal(s, self._on)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)



@dataclass
class _Run:
    """What the steps of one `port train` share."""

    config: str | Path                # as given (messages, checkpoint meta)
    job: Job
    run_dir: Path
    say: Echo
    console: Any                      # rich.console.Console (quiet or not)
    rss0: int                         # process RSS before anything was built
    t_setup: float                    # time.perf_counter() when set-up began
    built: Built
    ds: Any                           # port.train.data.Dataset
    stand_ins: dict[str, str]         # modeled accelerators the C kernels stand in for
    prof: Optional[ProfileStep] = None
    bud: Optional[Budget] = None
    plan: Any = None                  # port.plan.types.Plan

    @property
    def ckpt(self) -> Path:
        return self.run_dir / "checkpoint.port"


@dataclass
class _Loop:
    """The training loop's state and what it measured."""

    total: int                        # the step count to reach
    per_epoch: int
    epoch: int
    it: Iterator[Any]                 # the epoch's batches
    done0: int                        # trainer steps before this run
    rss_train0: int                   # RSS when training began (set-up excluded)
    hwm_reset: bool                   # VmHWM reset after set-up: its peak is the steps' peak
    rss_peak: int
    losses: list[float] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)   # wall ms of every training step: the measured step time
    last: tuple[Any, Any] = (None, None)
    first_loss: Optional[float] = None
    warned: bool = False
    train_s: float = 0.0


def run_training(config: str | Path | None = None, *, model: str | None = None, input_shape: str | None = None,
                 batch: int | None = None, resume: bool = False, steps: int | None = None,
                 out_dir: str | Path = "runs", quiet: bool = False, replan: bool = False, budget: Any = None,
                 solver: str | None = None, profile: str | Path | None = None, export: bool = True,
                 progress: bool = True, on_nonfinite: str | None = None,
                 threads: int | str | None = None) -> TrainResult:
    """`port train CONFIG` (or `--model NAME`, as load_job takes it): trace -> profile (the location rule) ->
    solve -> train -> export -> report.

    SIGINT / SIGTERM while training writes a checkpoint at the current step and raises Interrupted (the CLI
    exits 130 / 143); ``resume=True`` continues from it, keeping runs/<name>/metrics.jsonl free of duplicates.
    The run directory is locked for the whole run (port.io.dir_lock): a second `port train` on it stops with a
    LockedError naming the first one's PID (exit 2) before it writes anything there."""
    with contextlib.ExitStack() as held:      # holds the run directory's lock until the run returns or raises
        job = load_job(config, model=model, input_shape=input_shape, batch=batch, budget=budget, solver=solver,
                       profile=profile, train={"steps": steps, "on_nonfinite": on_nonfinite, "threads": threads})
        run = _open_run(job.command_hint, job, held, out_dir, quiet)   # messages name the config file, or CONFIG
        _plan_run(run, replan=replan, reuse=resume and not replan and budget is None and solver is None,
                  progress=progress and not quiet)
        tr, mem = _make_trainer(run, resume)
        loop = _start_loop(run, tr, steps)
        _train(run, tr, loop, mem, resume, show=progress and not quiet)
        return _finish(run, tr, loop, mem, export)


def _open_run(config: str | Path, job: Job, held: contextlib.ExitStack, out_dir: str | Path, quiet: bool) -> _Run:
    """The run directory (locked, with the resolved config.yaml), the model, graph and data."""
    import yaml
    from rich.console import Console

    from port import config as C
    from port.exec import capi
    from port.io import atomic_write_text, dir_lock
    console = Console(quiet=quiet, highlight=False, soft_wrap=True)

    def say(msg: str) -> None:
        console.print(msg, markup=False)
    cfg = job.config
    if fixed_threads(cfg):
        capi.set_num_threads(fixed_threads(cfg))
    run_dir = Path(out_dir) / cfg.name
    run_dir.mkdir(parents=True, exist_ok=True)
    held.enter_context(dir_lock(run_dir))
    atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(C.dump_experiment(cfg), sort_keys=False))
    rss0, t_setup = _rss_bytes(), time.perf_counter()
    built = build_graph(job)
    ds = load_data(job)
    _check_batch(job, ds)
    B = cfg.batch_size
    say(f"{cfg.name}: {cfg.model.name} ({len(built.graph.ops)} ops) on {cfg.data.kind} ({ds.x_train.shape[0]} "
        f"train / {ds.x_test.shape[0]} test), batch {B}" + (
            f" in micro-batches of {job.graph_batch}" if job.graph_batch != B else "") + f", device {job.device.name}")
    stand_ins = stand_in_backends(job.device)
    if stand_ins:
        say(f"note: device {job.device.name!r} is modeled: its accelerator(s) {', '.join(sorted(stand_ins))} are not "
            f"on this machine, so the plan's ops run here on PORT's C kernels (cpu-c) as stand-ins; predicted "
            f"time and memory are for {job.device.name}, measured ones are this machine's")
    return _Run(config, job, run_dir, say, console, rss0, t_setup, built, ds, stand_ins)


def _check_batch(job: Job, ds: Any) -> None:
    """Every step needs a full batch: ConfigError naming batch_size when the training set is smaller."""
    cfg, B = job.config, job.config.batch_size
    n_train = int(ds.x_train.shape[0])
    if n_train < B:
        d = cfg.data
        raise ConfigError(f"{job.where}key 'batch_size': {B} is larger than the training set: data.kind {d.kind!r} "
                          f"gives {n_train} training samples ({int(ds.x_test.shape[0])} held out by "
                          f"data.test_fraction {d.test_fraction:g}); every step needs a full batch. Fix: set "
                          f"batch_size <= {n_train}, or give more samples (data.num_samples) or a smaller "
                          f"data.test_fraction")


def _plan_run(run: _Run, *, replan: bool, reuse: bool, progress: bool) -> None:
    """profile -> budget -> plan, each written to the run directory (``reuse``: a resumed run keeps its
    plan.json when it was solved for the same graph, profile and budget)."""
    from port.cost.io import save_profile
    job, graph, say, run_dir = run.job, run.built.graph, run.say, run.run_dir
    last_run = None
    if replan:
        mpath = run_dir / "measured.json"
        if not mpath.exists():
            raise ConfigError(f"--replan needs a previous run's measurements at {mpath}; run "
                              f"`port train {run.config}` first")
        last_run = read_measured(mpath)
    prof = get_profile(job, graph, progress=progress, echo=say)
    say(prof.note)
    if last_run is not None:
        prof = replan_profile(job, graph, prof, run_dir, last_run, echo=say)
    save_profile(prof.profile, run_dir / "profile.json")     # every run directory holds the costs its plan used
    bud = resolve_budget(job, graph, prof.profile)
    say(bud.peak_line())
    say(bud.describe())
    solved = None
    if reuse:
        reused = _reuse_plan(run_dir, graph, prof.profile, bud)
        if reused is not None:
            from port.verify.simulate import simulate
            solved = Solved(reused, bud, simulate(reused, graph, prof.profile))
            say(f"plan: reusing {run_dir / 'plan.json'} (same graph, profile and budget)")
    if solved is None:
        solved = solve_plan(job, run.built, prof, bud)
    save_plan_file(solved, job, run.built, prof, run_dir / "plan.json")     # `port show` draws it
    for n in solved.notes:
        say(n)
    say(plan_summary(solved.plan))
    run.prof, run.bud, run.plan = prof, bud, solved.plan


def _make_trainer(run: _Run, resume: bool) -> tuple[Any, dict]:
    """The Trainer with the plan (resumed from the run's checkpoint with ``resume``) and its memory report."""
    from port.config import format_size
    from port.lower.memories import check_caps
    from port.train.trainer import Trainer
    cfg, built, say, plan = run.job.config, run.built, run.say, run.plan
    kw = dict(optimizer=built.optimizer, micro_batch=cfg.train.micro_batch,
              trainable=list(built.trainable) if built.trainable else None, seed=cfg.train.seed, plan=plan,
              on_nonfinite=cfg.train.on_nonfinite, accelerators=run.stand_ins or None,
              threads="auto" if cfg.train.threads in (None, "auto") else None)
    # engines with their own memory: the plan says which (Plan.own_memory, from the profile: port profile reads the
    # device YAML's memory: own), so lowering gives them their own arena without being told here
    st = run.job.device.storage
    if st is not None and st.path and Path(st.path).is_dir():   # a modeled device's path may not exist here
        kw.update(spill_dir=st.path, drop_cache=bool(getattr(st, "drop_cache", False)))
    if resume and run.ckpt.exists():
        tr = Trainer.resume(run.ckpt, built.model, built.example, **kw)
        say(f"resumed from {run.ckpt} at step {tr.step_count}")
    else:
        if resume:
            say(f"no checkpoint at {run.ckpt}; starting from scratch")
        tr = Trainer(built.model, built.example, **kw)
    check_caps(tr.program, {a.backend: a.memory_cap for a in run.job.device.accelerators if a.memory == "own"})
    setup_s = time.perf_counter() - run.t_setup
    mem = tr.memory_report()
    say(f"arena: {format_size(mem['arena_bytes'])} (persistent {format_size(mem['persistent_bytes'])} + scratch "
        f"{format_size(mem['scratch_bytes'])}); plan predicted peak {format_size(plan.predicted_peak_bytes)}; "
        f"set-up {setup_s:.2f} s")
    return tr, mem


def _start_loop(run: _Run, tr: Any, steps: int | None) -> _Loop:
    """The loop's state: the step count to reach and the batches, positioned where a resumed run left off."""
    from port.train import memwatch
    cfg, ds = run.job.config, run.ds
    rss_train0 = _rss_bytes()     # training-time growth is measured from here (set-up excluded)
    hwm_reset = memwatch.reset_peak()   # VmHWM from here: the peak of the steps
    total = steps if steps is not None else cfg.train.steps
    per_epoch = max(1, ds.x_train.shape[0] // cfg.batch_size)
    if cfg.train.epochs and steps is None:
        total = cfg.train.epochs * per_epoch
    epoch = tr.step_count // per_epoch
    it = ds.batches(cfg.batch_size, cfg.train.seed, epoch)
    for _ in range(tr.step_count % per_epoch):          # resume mid-epoch on the same batches
        next(it, None)
    return _Loop(total, per_epoch, epoch, it, tr.step_count, rss_train0, hwm_reset, _rss_bytes())


def _train(run: _Run, tr: Any, loop: _Loop, mem: dict, resume: bool, show: bool) -> None:
    """The training loop, with a progress bar, metrics lines, checkpoints and evaluations; SIGINT / SIGTERM stop
    it after a whole step with a checkpoint written (Interrupted)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from port.config import format_size
    mpath = run.run_dir / "metrics.jsonl"
    if resume and run.ckpt.exists():
        _metrics_upto(mpath, tr.step_count)
        metrics = mpath.open("a", buffering=1)
    else:
        metrics = mpath.open("w", buffering=1)
    t0 = time.perf_counter()
    with metrics, _StopOnSignal() as stop, Progress(
            TextColumn("[progress.description]{task.description}"), BarColumn(),
            TextColumn("{task.completed}/{task.total}"), TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[sps]} steps/s"), TextColumn("mem {task.fields[mem]}"), TimeElapsedColumn(),
            console=run.console, transient=False, disable=not show) as prog:
        task = prog.add_task("train", total=loop.total, completed=tr.step_count, loss="-", sps="-",
                             mem=format_size(mem["arena_bytes"]))
        while tr.step_count < loop.total and stop.signum is None:
            if _step(run, tr, loop, prog, metrics, mpath):
                s = tr.step_count
                if s % 10 == 0 or s == loop.total:
                    loop.rss_peak = max(loop.rss_peak, _rss_bytes())
                    el = time.perf_counter() - t0
                    prog.update(task, completed=s, loss=f"{sum(loop.losses[-10:]) / len(loop.losses[-10:]):.4f}",
                                sps=f"{(s - loop.done0) / max(el, 1e-9):.0f}")
        if stop.signum is not None:
            metrics.flush()
            _stop(run, tr, loop, prog, stop.signum)
    loop.train_s = time.perf_counter() - t0


def _step(run: _Run, tr: Any, loop: _Loop, prog: Any, metrics: Any, mpath: Path) -> bool:
    """One training step with its metrics line, checkpoint and evaluation; False: the epoch ended instead."""
    from port.io import raise_if_disk_full
    cfg, say, ckpt = run.job.config, run.say, run.ckpt
    try:
        x, y = next(loop.it)
    except StopIteration:
        loop.epoch += 1
        loop.it = run.ds.batches(cfg.batch_size, cfg.train.seed, loop.epoch)
        return False
    ts = time.perf_counter()
    skipped0 = tr.skipped_steps
    try:
        loss = tr.step(x, y)
    except NonFiniteError as e:
        prog.stop()
        ck = (f"the last checkpoint ({ckpt}, step {read_header_step(ckpt)}) is intact" if ckpt.exists()
              else "no checkpoint was written")
        raise NonFiniteError(f"{run.job.where}{e}; {ck}", e.step, e.loss) from None
    step_ms = (time.perf_counter() - ts) * 1e3
    loop.walls.append(step_ms)
    _watch_loss(run, tr, loop, loss, skipped0)
    loop.last = (x, y)
    loop.losses.append(loss)
    s = tr.step_count
    try:
        metrics.write(json.dumps({"step": s, "loss": loss, "step_ms": round(step_ms, 4), "epoch": loop.epoch})
                      + "\n")
    except OSError as e:
        prog.stop()
        raise_if_disk_full(e, mpath, kept=f"the lines of the steps before step {s} are kept (a resumed run "
                                          f"drops a torn last line); the last checkpoint is intact")
        raise
    if s % cfg.train.checkpoint_every == 0 or s == loop.total:
        tr.save_checkpoint(ckpt, meta={"config": str(run.config), "epoch": loop.epoch})
    if cfg.train.eval_every and s % cfg.train.eval_every == 0:
        ev = tr.evaluate(run.ds.test_batches(cfg.batch_size))
        say(f"step {s}: test accuracy {ev['accuracy']:.4f}")
    return True


def _watch_loss(run: _Run, tr: Any, loop: _Loop, loss: float, skipped0: int) -> None:
    """Say when a step's update was skipped (non-finite) and, once, when the loss grows past 100x the first."""
    if tr.skipped_steps != skipped0:
        run.say(f"warning: step {tr.step_count}: loss {loss} or a gradient is not finite; update skipped "
                f"(train.on_nonfinite: skip; {tr.skipped_steps} skipped so far)")
    elif loop.first_loss is None:
        loop.first_loss = loss
    elif not loop.warned and abs(loss) > 100 * max(abs(loop.first_loss), 1e-3):
        loop.warned = True
        run.say(f"warning: step {tr.step_count}: loss {loss:.4g} is over 100x the first step's "
                f"{loop.first_loss:.4g}: training may be diverging; lower optimizer.lr (now "
                f"{run.job.config.optimizer.lr:g})")


def _stop(run: _Run, tr: Any, loop: _Loop, prog: Any, signum: int) -> None:
    """After SIGINT / SIGTERM: the checkpoint of the last whole step, then Interrupted."""
    s = tr.step_count
    if not (run.ckpt.exists() and s % run.job.config.train.checkpoint_every == 0):
        tr.save_checkpoint(run.ckpt, meta={"config": str(run.config), "epoch": loop.epoch})
    name = signal.Signals(signum).name
    prog.stop()
    raise Interrupted(signum, f"{name}: stopped at step {s} of {loop.total}; checkpoint written to {run.ckpt} "
                              f"(continue with `port train {run.config} --resume`)")


def _finish(run: _Run, tr: Any, loop: _Loop, mem: dict, export: bool) -> TrainResult:
    """After the loop: evaluate, measure per-op times and memory, write measured.json, the report and the
    exports, and say how prediction and measurement compare."""
    from port.io import atomic_write_text
    cfg, graph, plan = run.job.config, run.built.graph, run.plan
    ev = tr.evaluate(run.ds.test_batches(cfg.batch_size))
    memory = _memory_figures(run, tr, loop, mem)
    # closed loop: measure per-op times on a copy of the state (profile_step restores it)
    x, y = loop.last if loop.last[0] is not None else next(run.ds.batches(cfg.batch_size, cfg.train.seed, 0))
    measured = measure_steps(tr, x, y)
    measured["memory"] = memory
    measured["kernel_step_ms"] = measured["step_ms"]      # sum of the timed calls of an instrumented step
    wall = wall_step_ms(loop.walls)
    if wall is not None:
        measured["wall_step_ms"], measured["wall_steps"] = wall, len(loop.walls)
    summary = _summary(run, tr, loop, mem, measured, ev)
    if cfg.train.threads in (None, "auto"):
        summary["threads"] = _governed_threads(tr)
        measured["thread_events"] = [asdict(e) for e in tr.thread_events]
    flags = build_report(run.run_dir, graph, run.prof.profile, plan, measured, summary)
    sig_of = {o.name: graph.signature(o) for o in graph.ops}
    measured["flagged"] = [r.op for r in flags]
    measured["flagged_signatures"] = sorted({sig_of[r.op] for r in flags if r.op in sig_of})
    measured["predicted_step_ms"] = plan.predicted_step_ms
    if run.job.config_path is not None:
        measured["config_path"] = str(run.job.config_path.resolve())
    atomic_write_text(run.run_dir / "measured.json", json.dumps(measured, indent=1))
    if export:
        _export(run, tr)
    if cfg.train.threads in (None, "auto"):
        run.say(f"threads: {summary['threads']}")
    _say_results(run, tr, loop, mem, measured, len(flags))
    run.say(f"test accuracy {ev['accuracy'] * 100:.2f}% (loss {ev['loss']:.4f}); run directory {run.run_dir}")
    return TrainResult(ev["accuracy"], ev["loss"], tr.step_count, loop.train_s, mem["arena_bytes"],
                       memory["rss_growth_steps_bytes"], run.run_dir, plan, run.prof.path, run.prof.source, measured,
                       tuple(r.op for r in flags))


def _memory_figures(run: _Run, tr: Any, loop: _Loop, mem: dict) -> dict:
    """The process's memory as the device sees it: RSS before Trainer(...), after its set-up, the steps' peak;
    baseline = RSS before Trainer(...) less the module's weights (they move into the arena), so peak - baseline
    is comparable to the plan's predicted peak and the budget (both include the weights)."""
    from port.train import memwatch
    model, plan = run.built.model, run.plan
    steps_peak = max(loop.rss_peak, _rss_bytes(), memwatch.peak_bytes() if loop.hwm_reset else 0)
    weights = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    rss_before = int(tr.rss["before_bytes"])
    return {"rss_before_trainer_bytes": rss_before, "rss_after_setup_bytes": int(tr.rss["after_setup_bytes"]),
            "rss_steps_peak_bytes": int(steps_peak), "rss_end_bytes": _rss_bytes(),
            "peak_method": "VmHWM (reset after set-up)" if loop.hwm_reset else "VmRSS sampled every 10 steps",
            "module_weight_bytes": int(weights), "rss_baseline_bytes": rss_before - int(weights),
            "rss_growth_total_bytes": int(steps_peak) - rss_before,
            "rss_growth_setup_bytes": int(tr.rss["after_setup_bytes"]) - rss_before,
            "rss_growth_steps_bytes": int(steps_peak - loop.rss_train0),
            "arena_bytes": int(mem["arena_bytes"]), "train_arena_bytes": int(mem["train_arena_bytes"]),
            "predicted_peak_bytes": int(plan.predicted_peak_bytes), "budget_bytes": plan.budget_bytes}


def _measured_step(measured: dict) -> str:
    """The measured step time as the report's summary shows it."""
    wall = measured.get("wall_step_ms")
    if wall is None:
        return f"{measured['step_ms']:.2f} ms"
    return (f"{wall:.2f} ms (wall, median of {measured['wall_steps']} training steps; kernels "
            f"{measured['step_ms']:.2f} ms)")


def _summary(run: _Run, tr: Any, loop: _Loop, mem: dict, measured: dict, ev: dict) -> dict:
    """The report's summary table."""
    from port.config import format_size
    cfg, plan, prof, memory = run.job.config, run.plan, run.prof, measured["memory"]
    steps_peak = memory["rss_steps_peak_bytes"]
    return {
        "model": f"{cfg.model.name} ({len(run.built.graph.ops)} ops), batch {cfg.batch_size}",
        "device": run.job.device.name, "profile": str(prof.path) if prof.path else "roofline model",
        "plan": f"{plan.status} by {plan.solver}, gap {plan.gap:.2%}",
        KEEP_EVERYTHING: format_size(run.bud.keep_everything_peak),
        "budget": format_size(plan.budget_bytes),
        "predicted step": f"{plan.predicted_step_ms:.2f} ms", "measured step": _measured_step(measured),
        "predicted peak": format_size(plan.predicted_peak_bytes),
        "arena (planned, allocated)": format_size(mem["arena_bytes"]),
        "process RSS growth while training": format_size(memory["rss_growth_steps_bytes"]),
        "process RSS (before Trainer / after set-up / steps' peak)":
            f"{format_size(memory['rss_before_trainer_bytes'])} / {format_size(memory['rss_after_setup_bytes'])} / "
            f"{format_size(steps_peak)}",
        "process memory for training (steps' peak - RSS before Trainer + module weights; compare with the "
        "predicted peak and the budget)": format_size(steps_peak - memory["rss_baseline_bytes"]),
        "test accuracy": f"{ev['accuracy'] * 100:.2f}%", "steps": tr.step_count,
    }


EXPORTS = {"onnx": "model.onnx", "torch": "model.pt2"}


def export_formats() -> tuple[str, ...]:
    """The run's inference exports: PORT_EXPORT in the environment (formats separated by commas, ``none`` for
    none; the test suite's default: its runs check the exports where they test them), else every format."""
    import os
    v = os.environ.get("PORT_EXPORT", "").strip().lower()
    if not v:
        return tuple(EXPORTS)
    fmts = tuple(f.strip() for f in v.split(",") if f.strip() and f.strip() != "none")
    bad = [f for f in fmts if f not in EXPORTS]
    if bad:
        raise ConfigError(f"environment variable PORT_EXPORT={v!r}: unknown format {bad[0]!r}. Fix: a comma list of "
                          f"{', '.join(EXPORTS)}, or none")
    return fmts


def _export(run: _Run, tr: Any) -> None:
    """The inference exports (ONNX, torch.export) beside the run's files; a failure is said, a full disk stops."""
    from port.errors import DiskFullError
    fmts = export_formats()
    if len(fmts) < len(EXPORTS):
        run.say(f"exports: {', '.join(EXPORTS[f] for f in fmts) or 'none'} (PORT_EXPORT)")
    for fmt, name in ((f, EXPORTS[f]) for f in fmts):
        try:
            tr.export(run.run_dir / name, fmt)
        except DiskFullError:
            raise                   # names the file; the previous export is kept
        except Exception as e:  # noqa: BLE001 - export is a convenience at the end of a run
            run.say(f"export {fmt} failed: {type(e).__name__}: {e}")


def _say_results(run: _Run, tr: Any, loop: _Loop, mem: dict, measured: dict, flagged: int) -> None:
    """Predicted against measured: step time and memory, and how many ops are off their prediction."""
    from port.config import format_size
    plan, say, memory, fs = run.plan, run.say, measured["memory"], format_size
    wall, walls = measured.get("wall_step_ms"), len(loop.walls)
    steps_peak, rss_growth = memory["rss_steps_peak_bytes"], memory["rss_growth_steps_bytes"]
    say(f"trained {tr.step_count - loop.done0} steps in {loop.train_s:.2f} s; step time predicted "
        f"{plan.predicted_step_ms:.2f} ms, measured " + (
            f"{wall:.2f} ms ({(wall - plan.predicted_step_ms) / plan.predicted_step_ms:+.1%}; wall median of "
            f"{walls} steps; kernels {measured['step_ms']:.2f} ms)" if wall is not None and
            plan.predicted_step_ms > 0 else f"{measured['step_ms']:.2f} ms (kernels)"))
    say(f"memory: plan peak {fs(plan.predicted_peak_bytes)}, arena {fs(mem['arena_bytes'])}, "
        f"budget {fs(plan.budget_bytes)}, {KEEP_EVERYTHING} {fs(run.bud.keep_everything_peak)}; "
        f"process RSS growth while training {fs(rss_growth)} (set-up: torch, tracing, solver, arena: "
        f"{fs(loop.rss_train0 - run.rss0)})")
    say(f"process memory (RSS): before Trainer {fs(memory['rss_before_trainer_bytes'])}, after set-up "
        f"{fs(memory['rss_after_setup_bytes'])}, steps' peak {fs(steps_peak)}: growth "
        f"{fs(memory['rss_growth_total_bytes'])} (set-up {fs(memory['rss_growth_setup_bytes'])} "
        f"+ steps {fs(rss_growth)}); with the module's weights ({fs(memory['module_weight_bytes'])}, now in the "
        f"arena) {fs(steps_peak - memory['rss_baseline_bytes'])} against plan peak "
        f"{fs(plan.predicted_peak_bytes)} and budget {fs(plan.budget_bytes)}")
    say(f"{flagged} op(s) off their predicted time by more than 25% and 1% of the step (see report; `--replan` "
        f"corrects the profile with this run's in-plan times and solves again)")
