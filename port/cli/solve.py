"""`port solve CONFIG`: plan placement, variants and keep/recompute/page under a memory budget;
`port show plan.json`: per-layer table, memory timeline and Gantt chart of a plan."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

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
    view = load_plan_view(plan_path)
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
    p1, p2 = plan_charts(view, out_dir)
    say(f"wrote {p1} and {p2}")


@dataclass(frozen=True)
class PlanView:
    path: Path
    plan: Any
    data: dict                        # the plan file's JSON (with the extras `port solve -o` writes)


def load_plan_view(path: str | Path) -> PlanView:
    """The plan and its file's extras (layers, gantt, ...), each checked: PlanError naming the key and fix."""
    from port.errors import PlanError
    from port.plan.io import load_plan, read_plan_json
    path = Path(path)
    plan = load_plan(path)
    d = read_plan_json(path)
    fix = f"solve again (`port solve CONFIG -o {path}`)"
    gantt = d.get("gantt") or []
    ok = isinstance(gantt, list) and all(
        isinstance(g, list) and len(g) == 4 and isinstance(g[0], str) and isinstance(g[1], str)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in g[2:])
        for g in gantt)
    if not ok:
        raise PlanError(f"{path}: key 'gantt' is malformed (expected a list of [label, accelerator, start ms, end ms]); "
                        f"{fix}")
    layers = d.get("layers")
    if layers is not None and (not isinstance(layers, list) or len(layers) != len(plan.ops) or not all(
            isinstance(x, dict) and (x.get("ms") is None or (isinstance(x["ms"], (int, float))
                                                            and not isinstance(x["ms"], bool)))
            for x in layers)):
        raise PlanError(f"{path}: key 'layers' is malformed (expected one object per op with 'ms'); {fix}")
    tens = d.get("tensors") or {}
    for k in ("recompute_names", "paged_names"):
        v = tens.get(k, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise PlanError(f"{path}: key 'tensors.{k}' is malformed (expected a list of tensor names); {fix}")
    for k in ("keep_everything_peak_bytes",):
        v = d.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise PlanError(f"{path}: key {k!r} = {v!r}: expected a non-negative integer; {fix}")
    return PlanView(path, plan, d)


def plan_charts(view: PlanView, out_dir: Optional[Path] = None) -> tuple[Path, Path]:
    """PNGs of the plan's memory timeline and of its ops on accelerators (Gantt)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from port.pipeline import KEEP_EVERYTHING
    plan, d = view.plan, view.data
    out = Path(out_dir) if out_dir is not None else view.path.parent
    out.mkdir(parents=True, exist_ok=True)
    stem = view.path.stem
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot([b / 2**20 for b in plan.memory_timeline], lw=1, label="predicted memory in use")
    ax.axhline(plan.budget_bytes / 2**20, color="r", ls="--", label="budget")
    peak = d.get("keep_everything_peak_bytes")
    if peak:
        ax.axhline(peak / 2**20, color="gray", ls=":", label=KEEP_EVERYTHING)
    ax.set_xlabel("executed step")
    ax.set_ylabel("MiB")
    ax.legend()
    ax.set_title(f"{stem}: memory timeline")
    fig.tight_layout()
    p1 = out / f"{stem}_memory.png"
    _save_figure(fig, p1)
    gantt = d.get("gantt") or []
    accs = sorted({g[1] for g in gantt})
    fig, ax = plt.subplots(figsize=(10, 1 + 0.6 * max(1, len(accs))))
    for lab, acc, s0, s1 in gantt:
        ax.barh(accs.index(acc), max(s1 - s0, 1e-6), left=s0, height=0.6,
                color="tab:orange" if "recompute" in lab else ("tab:gray" if acc == "storage" else "tab:blue"))
    ax.set_yticks(range(len(accs)))
    ax.set_yticklabels(accs)
    ax.set_xlabel("ms")
    ax.set_title(f"{stem}: ops on accelerators (orange: recompute)")
    fig.tight_layout()
    p2 = out / f"{stem}_gantt.png"
    _save_figure(fig, p2)
    return p1, p2


def _save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """A matplotlib figure as a PNG, rendered in memory and written atomically (then closed)."""
    import io

    import matplotlib.pyplot as plt
    from port.io import atomic_write_bytes
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())



def register(app: typer.Typer) -> None:
    app.command("solve")(solve_cmd)
    app.command("show")(show_cmd)
