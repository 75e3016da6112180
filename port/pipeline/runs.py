"""A training run's files and figures (runs/<name>/): the measured per-op times and memory timelines
(measured.json), the metrics lines, the report, and a resumed run's plan and checkpoint step."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Optional, Sequence

from port.errors import ConfigError, PortError
from port.pipeline.budget import Budget


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


def measure_steps(trainer: Any, x: Any, y: Any, repeats: int = 5) -> dict[str, Any]:
    """Per-op measured times (median over ``repeats`` instrumented steps) and the measured memory timeline."""
    runs = [trainer.profile_step(x, y) for _ in range(repeats)]
    per: dict[str, list[float]] = {}
    for r in runs:
        for name, ms in r["op_ms"].items():
            per.setdefault(name, []).append(ms)
    return {"step_ms": statistics.median(r["step_ms"] for r in runs),
            "op_ms": {k: statistics.median(v) for k, v in per.items()},
            "timeline_bytes": list(runs[-1].get("timeline_bytes", [])),
            # which graph op (and whether a recompute) each timeline point belongs to, to align with the plan
            "timeline_ops": [[int(c["op"]), bool(c.get("recompute"))] for c in runs[-1].get("calls", [])],
            # the process's resident memory after each call of the last instrumented step (port.train.memwatch)
            "rss_timeline_bytes": list(runs[-1].get("rss_timeline_bytes", [])),
            "peak_bytes": max(runs[-1].get("timeline_bytes", [0]) or [0])}


def wall_step_ms(walls: Sequence[float]) -> Optional[float]:
    """The measured step time: the median wall time of the training steps, the first ones (warm-up) left out."""
    if not walls:
        return None
    skip = min(3, len(walls) // 2)
    return float(statistics.median(walls[skip:]))


def align_timeline(sim_steps: Sequence[tuple[str, int]], measured: dict, key: str = "timeline_bytes") -> list[int]:
    """The measured (arena) timeline (``key``: or another per-call series, e.g. "rss_timeline_bytes") on the
    simulator's step axis: each executor call is matched to the plan step of the same op (recompute or not);
    steps without a call of their own (views, ops inside a fused kernel) carry the previous value."""
    tl, ops = measured.get(key) or [], measured.get("timeline_ops") or []
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


def build_report(run_dir: Path, graph: Any, profile: Any, plan: Any, measured: dict, summary: dict) -> list:
    from port.train.report import OpRow, render_report
    from port.verify.simulate import simulate
    sim = simulate(plan, graph, profile)
    pred: dict[str, float] = {}
    for label, acc, start, end in sim.gantt:
        pred[label] = pred.get(label, 0.0) + (end - start)
    rows = []
    op_ms = measured.get("op_ms", {})
    from port.plan.variants import chain_of
    for d in plan.ops:
        o = graph.ops[d.op]
        ch = chain_of(graph, o) if d.variant == "fused" else None
        head = ch.call_of(o.id) if ch is not None and ch.call_of(o.id) != o.id else None
        rows.append(OpRow(o.name, o.layer, o.kind, o.phase, d.accelerator, d.variant,
                          pred.get(o.name, 0.0), op_ms.get(o.name),
                          chain=graph.ops[head].name if head is not None else None))
    acc_of = {label: acc for label, acc, _, _ in sim.gantt}
    for label in pred:
        if label.endswith(" (recompute)"):
            rows.append(OpRow(label, label[:-len(" (recompute)")], "recompute", "recompute", acc_of.get(label, "-"),
                              "-", pred[label], op_ms.get(label)))
    mem = measured.get("memory") or {}
    rss = None
    if mem.get("rss_baseline_bytes") is not None and measured.get("rss_timeline_bytes"):
        rss = [max(0, v - mem["rss_baseline_bytes"])
               for v in align_timeline(sim.steps, measured, "rss_timeline_bytes")]
    return render_report(run_dir / "report.html", f"PORT run {run_dir.name}", rows, list(sim.timeline),
                         align_timeline(sim.steps, measured) or None, plan.budget_bytes, summary,
                         rss_timeline=rss, memory=mem or None)


def _metrics_upto(path: Path, step: int) -> None:
    """Keep only the metrics lines of steps <= ``step`` (a resumed run continues after its checkpoint)."""
    from port.io import atomic_write_text
    if not path.exists():
        return
    keep, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            s = int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            dropped += 1
            continue
        if s <= step:
            keep.append(line)
        else:
            dropped += 1
    if dropped:
        atomic_write_text(path, "".join(f"{ln}\n" for ln in keep))


def _reuse_plan(run_dir: Path, graph: Any, profile: Any, budget: Budget) -> Any:
    """The run's plan.json when it was solved for this graph, profile and budget (resume), else None."""
    from port.errors import PlanError
    from port.plan.io import load_plan
    p = run_dir / "plan.json"
    if not p.exists():
        return None
    try:
        plan = load_plan(p, graph=graph, profile=profile)
    except PlanError:
        return None
    return plan if plan.budget_bytes == budget.bytes else None


def read_measured(path: Path) -> dict:
    """A run's measured.json, checked (ConfigError naming the file, key and fix: train again)."""
    fix = "train again (`port train CONFIG`) to rewrite it"
    try:
        d = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(f"{path}: corrupt or truncated measurements file ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); {fix}") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: not a measurements file (top level is {type(d).__name__}); {fix}")

    from port.cost.io import MAX_BYTES, MAX_MS

    def num(v, hi=MAX_MS):       # a time (ms) or a size (bytes): finite, >= 0, below the profiles' sane maxima
        return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= hi
    checks = {"step_ms": num, "config_path": lambda v: isinstance(v, str),
              "op_ms": lambda v: isinstance(v, dict) and all(num(x) for x in v.values()),
              "timeline_bytes": lambda v: isinstance(v, list) and all(num(x, MAX_BYTES) for x in v),
              "rss_timeline_bytes": lambda v: isinstance(v, list) and all(num(x, MAX_BYTES) for x in v),
              "memory": lambda v: isinstance(v, dict),
              "timeline_ops": lambda v: isinstance(v, list) and all(
                  isinstance(x, list) and len(x) == 2 and isinstance(x[0], int) for x in v),
              "flagged_signatures": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)}
    for k, ok in checks.items():
        if k in d and not ok(d[k]):
            raise ConfigError(f"{path}: key {k!r} is malformed or out of range ({d[k]!r:.60}; times and sizes "
                              f"must be finite numbers >= 0); {fix}")
    return d


def read_header_step(path: Path) -> Any:
    try:
        from port.train.checkpoint import read_header
        return read_header(path)["step"]
    except PortError:
        return "?"


def _governed_threads(tr: Any) -> str:
    """One line on a threads="auto" run (the default): the count it ended at and the governor's changes."""
    ev = [e for e in tr.thread_events if e.from_threads != e.to_threads]
    moves = ", ".join(f"step {e.step}: {e.from_threads}->{e.to_threads} ({e.why})" for e in ev[-4:])
    return (f"auto: {tr.threads} at the end, {len(ev)} change{'s' if len(ev) != 1 else ''}"
            + (f" (last: {moves})" if moves else ""))

