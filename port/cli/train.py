"""`port train CONFIG`: trace -> profile (the location rule; reused, measured when missing) -> solve -> train
-> export -> report, all in port.pipeline.run_training; `port report RUN_DIR` rebuilds a run's report (run_report).

Each run writes ``runs/<name>/``: ``config.yaml`` (resolved), ``profile.json``, ``plan.json``,
``checkpoint.port``, ``metrics.jsonl`` (one line per step), ``measured.json`` (per-op times and the memory
timeline of instrumented steps), ``model.onnx`` / ``model.pt2`` (inference exports: ONNX and torch.export) and
``report.html``.
Ctrl-C (SIGINT) or SIGTERM writes a checkpoint at the current step and exits 130 / 143; ``--resume`` continues.
One `port train` at a time per run directory (``.port.lock``; a second one exits 2 naming the first one's PID);
a full disk stops it with the file named (exit 2), the previous version of that file kept.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def run_report(run_dir: str | Path) -> Path:
    """Rebuild runs/<name>/report.html from the run's files."""
    from port.cost.io import load_profile
    from port.errors import ConfigError
    from port.pipeline import build_graph, build_report, load_job, read_measured
    from port.plan.io import load_plan
    run_dir = Path(run_dir)
    for f in ("config.yaml", "profile.json", "plan.json", "measured.json"):
        if not (run_dir / f).exists():
            raise ConfigError(f"{run_dir}: not a run directory (missing {f}); create one with `port train CONFIG`")
    measured = read_measured(run_dir / "measured.json")
    extra = [Path(measured["config_path"]).parent] if measured.get("config_path") else []
    job = load_job(run_dir / "config.yaml", extra_search_dirs=extra)
    built = build_graph(job)
    profile = load_profile(run_dir / "profile.json", device=job.device.name)
    plan = load_plan(run_dir / "plan.json", graph=built.graph, profile=profile)
    build_report(run_dir, built.graph, profile, plan, measured,
                 {"model": job.config.model.name, "device": job.device.name,
                  "predicted step": f"{plan.predicted_step_ms:.2f} ms",
                  "measured step": f"{measured.get('step_ms', float('nan')):.2f} ms"})
    return run_dir / "report.html"


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(config: Optional[Path] = typer.Argument(None, help="experiment YAML, e.g. configs/default.yaml"),
              model: Optional[str] = typer.Option(None, "--model", "-m", help="instead of CONFIG: a zoo model "
                                                  "name (e.g. resnet8; synthetic data, as `port inspect --model`) "
                                                  "or module:factory"),
              input: Optional[str] = typer.Option(None, "--input", help="with --model: per-sample input shape, "
                                                  "e.g. 3x32x32"),
              batch: Optional[int] = typer.Option(None, "--batch", "-b", min=1, help="batch size"),
              resume: bool = typer.Option(False, "--resume", help="continue from runs/<name>/checkpoint.port"),
              steps: Optional[int] = typer.Option(None, "--steps", min=0, help="override train.steps (the total)"),
              budget: Optional[str] = typer.Option(None, "--budget", help="memory budget: bytes, 64MB, 1.5GiB or "
                                                   "NN% of the keep-everything peak"),
              solver: Optional[str] = typer.Option(None, "--solver", help="highs | cbc | scip | cpsat | greedy | "
                                                   "chen | checkmate | single | single:<accelerator>"),
              profile: Optional[Path] = typer.Option(None, "--profile", help="profile file (default "
                                                     "profiles/<device>/<config name>.json; measured when missing)"),
              replan: bool = typer.Option(False, "--replan", help="correct the profile with the last run's in-plan "
                                          "per-op times and executor overhead, then solve again"),
              out: Path = typer.Option(Path("runs"), "--out", help="directory for runs/<name>/"),
              no_progress: bool = typer.Option(False, "--no-progress", help="no progress bars"),
              on_nonfinite: Optional[str] = typer.Option(None, "--on-nonfinite", help="stop | skip: a step with a "
                                                         "non-finite loss or gradient stops training with an error "
                                                         "(default) or is skipped (overrides train.on_nonfinite)"),
              threads: Optional[str] = typer.Option(None, "--threads", help="the kernels' thread count (fixed), or "
                                                    "auto (the default): picked from the steps' own times, fewer "
                                                    "while other processes keep the cores busy (overrides "
                                                    "train.threads)"),
              ) -> None:
        """Trace, profile (reused from `port profile`), solve under the budget, train with the plan, export
        and report."""
        from port.pipeline import run_training
        if config is not None and (model is not None or input is not None):
            from port.errors import ConfigError
            raise ConfigError(f"give CONFIG ({config}) or --model/--input, not both")
        run_training(config, model=model, input_shape=input, batch=batch, resume=resume, steps=steps, out_dir=out,
                     replan=replan, budget=budget, solver=solver,
                     profile=profile, progress=not no_progress, on_nonfinite=on_nonfinite,
                     threads=int(threads) if threads is not None and threads.isdigit() else threads)

    @app.command("report")
    def report(run_dir: Path = typer.Argument(..., help="a run directory, e.g. runs/digits")) -> None:
        """Write RUN_DIR/report.html: memory predicted vs measured, Gantt chart, placement, flagged ops."""
        typer.echo(f"wrote {run_report(run_dir)}")
