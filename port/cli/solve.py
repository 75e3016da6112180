"""`port solve CONFIG`: plan placement, variants and keep/recompute/page under a memory budget;
`port show plan.json`: per-layer table, memory timeline and Gantt chart of a plan."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def solve_cmd(config: Path = typer.Argument(..., help="experiment YAML"),
              budget: Optional[str] = typer.Option(None, "--budget", help="memory budget: bytes, 64MB, 1.5GiB or "
                                                   "NN% of the keep-everything peak (default: the config's, else "
                                                   "the device memory)"),
              solver: Optional[str] = typer.Option(None, "--solver", help="highs|cbc|scip|cpsat|greedy|chen|checkmate|single"
                                                   "|single:<accelerator>"),
              time_limit: Optional[float] = typer.Option(None, "--time-limit", help="seconds"),
              gap: Optional[float] = typer.Option(None, "--gap", help="relative optimality gap"),
              profile: Optional[Path] = typer.Option(None, "--profile", help="profile file (default "
                                                     "profiles/<device>/<config name>.json; measured when missing)"),
              output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the plan JSON here")) -> None:
    """Solve for the fastest plan of one training step that fits the memory budget."""
    from port import pipeline as P
    from port.config import format_size
    job = P.load_job(config, budget=budget, solver=solver, time_limit=time_limit, gap=gap, profile=profile)
    built = P.build_graph(job)
    typer.echo(f"config {config}: {job.config.model.name} batch {built.graph.batch_size} ({len(built.graph.ops)} "
               f"ops), device {job.device.name}")
    prof = P.get_profile(job, built.graph, echo=typer.echo)
    typer.echo(prof.note)
    bud = P.resolve_budget(job, built.graph, prof.profile)
    typer.echo(bud.peak_line())
    typer.echo(bud.describe())
    s = job.config.solver
    typer.echo(f"solver {s.name}, time limit {s.time_limit_s:g} s, gap {s.gap:g}")
    solved = P.solve_plan(job, built, prof, bud)
    plan = solved.plan
    for n in solved.notes:
        typer.echo(n)
    typer.echo(P.plan_summary(plan))
    typer.echo(f"predicted peak {format_size(plan.predicted_peak_bytes)} = "
               f"{plan.predicted_peak_bytes / bud.keep_everything_peak:.0%} of the {P.KEEP_EVERYTHING}")
    if output is not None:
        P.save_plan_file(solved, job, built, prof, output)
        typer.echo(f"plan written to {output}")


def show_cmd(plan_path: Path = typer.Argument(..., help="plan JSON from `port solve -o`"),
             out_dir: Optional[Path] = typer.Option(None, "--out-dir", help="where the PNGs go (default: next to the plan)")) -> None:
    """Per-layer table of a plan, plus PNGs of its memory timeline and of its Gantt chart."""
    from rich.console import Console
    from rich.table import Table
    from port import pipeline as P
    from port.config import format_size
    view = P.load_plan_view(plan_path)
    plan, d = view.plan, view.data
    con = Console(highlight=False, soft_wrap=True)
    t = Table(title=f"{d.get('graph_name')} plan: {plan.solver} {plan.status}, step {plan.predicted_step_ms:.3f} ms, "
                    f"peak {format_size(plan.predicted_peak_bytes)} / budget {format_size(plan.budget_bytes)}")
    for c in ("op", "phase", "kind", "accelerator", "variant", "ms"):
        t.add_column(c)
    layers = d.get("layers") or [{}] * len(plan.ops)
    for e, lay in zip(d["ops"], layers):
        ms = lay.get("ms")
        t.add_row(e.get("name", str(e["op"])), lay.get("phase", ""), lay.get("kind", ""), e["accelerator"],
                  e["variant"], f"{ms:.4f}" if ms is not None else "")
    con.print(t)
    say = lambda s: con.print(s, markup=False)  # noqa: E731
    rec = d["tensors"].get("recompute_names", [])
    if rec or d["tensors"].get("paged_names"):
        say(f"recomputed: {sorted(rec)}\npaged: {d['tensors'].get('paged_names', [])}")
    peak = d.get("keep_everything_peak_bytes")
    if peak:
        say(f"{P.KEEP_EVERYTHING} {format_size(peak)} ({peak} B); budget {format_size(plan.budget_bytes)} "
            f"({plan.budget_bytes / peak:.0%} of it, given as {d.get('budget_spec')})")
    else:
        say(f"{P.KEEP_EVERYTHING}: not recorded in this plan file (solve again with `port solve CONFIG -o PLAN`)")
    if d.get("profile_source"):
        say(f"solved with profile: {d['profile_source']}")
    p1, p2 = P.plan_charts(view, out_dir)
    say(f"wrote {p1} and {p2}")


def register(app: typer.Typer) -> None:
    app.command("solve")(solve_cmd)
    app.command("show")(show_cmd)
