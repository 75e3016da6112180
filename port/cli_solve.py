"""`port solve CONFIG`: plan placement, variants and keep/recompute/page under a memory budget;
`port show plan.json`: per-layer table, memory timeline and Gantt chart of a plan."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def _profile_for(cfg, device, graph, config_path: Path):
    """(profile, source text): a stored profile at profiles/<device>/<model>.json when port.profile can load
    it, else the roofline model."""
    from .costmodel import modeled_profile
    cands = [Path("profiles") / device.name / f"{cfg.model.name}.json",
             config_path.parent.parent / "profiles" / device.name / f"{cfg.model.name}.json"]
    for p in cands:
        if p.exists():
            try:
                from .profile import load_profile
            except ImportError:
                break
            prof = load_profile(p, device=device.name)
            if all(prof.options(graph.signature(o)) for o in graph.ops):
                return prof, f"measured profile {p}"
            return modeled_profile(graph, device), f"modeled (roofline): {p} does not cover this graph"
    return modeled_profile(graph, device), "modeled (roofline; no profile file at " + str(cands[0]) + ")"


def solve_cmd(config: Path = typer.Argument(..., help="experiment YAML"),
              budget: Optional[str] = typer.Option(None, "--budget", help="memory budget, e.g. 64MB (default: config/device)"),
              solver: Optional[str] = typer.Option(None, "--solver", help="highs|cbc|scip|cpsat|greedy|chen|single:<acc>"),
              time_limit: Optional[float] = typer.Option(None, "--time-limit", help="seconds"),
              gap: Optional[float] = typer.Option(None, "--gap", help="relative optimality gap"),
              output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the plan JSON here")) -> None:
    """Solve for the fastest plan of one training step that fits the memory budget."""
    import torch
    from rich.console import Console
    from . import config as C
    from . import models
    from .config import format_size, parse_size
    from .graph import trace
    from .plan_io import save_plan
    from .simulate import simulate
    from .solve import solve
    con = Console(highlight=False)
    cfg = C.load_experiment(config)
    device = C.resolve_device(cfg, config)
    kwargs = dict(cfg.model.kwargs)
    model = models.load(cfg.model.name, **kwargs)
    x = torch.randn(cfg.batch_size, *cfg.input_shape)
    graph = trace(model, x, optimizer=cfg.optimizer.name, name=cfg.model.name)
    profile, source = _profile_for(cfg, device, graph, config)
    B = parse_size(budget) if budget else (cfg.budget or device.memory)
    s = solver or cfg.solver.name
    tl = time_limit if time_limit is not None else cfg.solver.time_limit_s
    gp = gap if gap is not None else cfg.solver.gap
    con.print(f"model {cfg.model.name} ({len(graph.ops)} ops), device {device.name}, profile: {source}")
    con.print(f"budget {format_size(B)}; solver {s}, time limit {tl:g} s, gap {gp:g}")
    plan = solve(graph, profile, B, solver=s, time_limit_s=tl, gap=gp)
    sim = simulate(plan, graph, profile)
    con.print(f"status {plan.status}; predicted step {plan.predicted_step_ms:.3f} ms, peak "
              f"{format_size(plan.predicted_peak_bytes)} of {format_size(B)}; gap {plan.gap:.4g}; "
              f"solved in {plan.solve_time_s:.2f} s; {len(plan.recompute)} tensors recomputed ({len(plan.recompute_at)} re-runs), {len(plan.paged)} paged, "
              f"{len(plan.early_updates)} early updates")
    if output is not None:
        layers = [{"op": o.name, "layer": o.layer, "kind": o.kind, "phase": o.phase,
                   "ms": profile.lookup(graph.signature(o), plan.ops[o.id].accelerator, plan.ops[o.id].variant).latency_ms}
                  for o in graph.ops]
        save_plan(plan, output, graph, extra={"gantt": [list(g) for g in sim.gantt], "layers": layers,
                                              "steps": [list(s_) for s_ in sim.steps], "device": device.name,
                                              "profile_source": source})
        con.print(f"plan written to {output}")


def show_cmd(plan_path: Path = typer.Argument(..., help="plan JSON from `port solve -o`"),
             out_dir: Optional[Path] = typer.Option(None, "--out-dir", help="where the PNGs go (default: next to the plan)")) -> None:
    """Per-layer table of a plan, plus PNGs of its memory timeline and of its Gantt chart."""
    import json
    from rich.console import Console
    from rich.table import Table
    from .config import format_size
    from .plan_io import load_plan
    plan = load_plan(plan_path)
    d = json.loads(Path(plan_path).read_text())
    con = Console(highlight=False)
    rec = set(d["tensors"].get("recompute_names", []))
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
    if rec or d["tensors"].get("paged_names"):
        con.print(f"recomputed: {sorted(rec)}\npaged: {d['tensors'].get('paged_names', [])}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out = out_dir or Path(plan_path).parent
    out.mkdir(parents=True, exist_ok=True)
    stem = Path(plan_path).stem
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot([b / 2**20 for b in plan.memory_timeline], lw=1, label="predicted memory in use")
    ax.axhline(plan.budget_bytes / 2**20, color="r", ls="--", label="budget")
    ax.set_xlabel("executed step"); ax.set_ylabel("MiB"); ax.legend(); ax.set_title(f"{stem}: memory timeline")
    fig.tight_layout(); p1 = out / f"{stem}_memory.png"; fig.savefig(p1, dpi=110); plt.close(fig)
    gantt = d.get("gantt") or []
    accs = sorted({g[1] for g in gantt})
    fig, ax = plt.subplots(figsize=(10, 1 + 0.6 * max(1, len(accs))))
    for lab, acc, s0, s1 in gantt:
        ax.barh(accs.index(acc), max(s1 - s0, 1e-6), left=s0, height=0.6,
                color="tab:orange" if "recompute" in lab else ("tab:gray" if acc == "storage" else "tab:blue"))
    ax.set_yticks(range(len(accs))); ax.set_yticklabels(accs); ax.set_xlabel("ms")
    ax.set_title(f"{stem}: ops on accelerators (orange: recompute)")
    fig.tight_layout(); p2 = out / f"{stem}_gantt.png"; fig.savefig(p2, dpi=110); plt.close(fig)
    con.print(f"wrote {p1} and {p2}")


def register(app: typer.Typer) -> None:
    app.command("solve")(solve_cmd)
    app.command("show")(show_cmd)
