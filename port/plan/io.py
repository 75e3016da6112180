"""Plan files: versioned JSON tied to one graph and one profile by their digests.

    save_plan(plan, path, graph=None)        atomic (tmp file + os.replace); op names written when graph given
    load_plan(path, graph=None, profile=None) -> Plan   refuses corrupt/truncated/wrong-version files and
                                                         plans made for another graph/profile (PlanError)
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from port.errors import PlanError
from port.plan.types import PLAN_FORMAT_VERSION, OpDecision, Plan
from port.ir.types import Graph
from port.cost.types import Profile

FORMAT = "port-plan"


def _num(x: float):
    return x if isinstance(x, (int,)) or math.isfinite(x) else None


def plan_to_dict(plan: Plan, graph: Graph | None = None) -> dict:
    ops = []
    for d in plan.ops:
        e = {"op": d.op, "accelerator": d.accelerator, "variant": d.variant}
        if graph is not None:
            e["name"] = graph.ops[d.op].name
        ops.append(e)
    tens = {"recompute": list(plan.recompute), "paged": list(plan.paged),
            "recompute_at": [[int(a), int(b)] for a, b in plan.recompute_at]}
    if graph is not None:
        tens["recompute_names"] = [graph.tensors[t].name for t in plan.recompute]
        tens["paged_names"] = [graph.tensors[t].name for t in plan.paged]
    return {
        "format": FORMAT, "version": PLAN_FORMAT_VERSION,
        "graph_digest": plan.graph_digest, "profile_digest": plan.profile_digest,
        "graph_name": graph.name if graph is not None else None, "batch_size": plan.batch_size,
        "budget_bytes": plan.budget_bytes, "solver": plan.solver, "status": plan.status,
        "objective_ms": _num(plan.objective_ms), "gap": _num(plan.gap), "solve_time_s": _num(plan.solve_time_s),
        "predicted_step_ms": _num(plan.predicted_step_ms), "predicted_peak_bytes": plan.predicted_peak_bytes,
        "ops": ops, "tensors": tens, "early_updates": list(plan.early_updates),
        "memory_timeline": list(plan.memory_timeline),
    }


def save_plan(plan: Plan, path: str | Path, graph: Graph | None = None, extra: dict | None = None) -> Path:
    """extra: additional keys (e.g. "gantt", "layers") kept for `port show`; readers ignore unknown keys."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    d = plan_to_dict(plan, graph)
    d.update({k: v for k, v in (extra or {}).items() if k not in d})
    from port.io import atomic_write_text
    atomic_write_text(path, json.dumps(d, indent=1))
    return path


def _req(d: dict, key: str, typ, path) -> object:
    if key not in d:
        raise PlanError(f"{path}: plan file lacks {key!r} (truncated or not a PORT plan)")
    v = d[key]
    if typ is not None and v is not None and not isinstance(v, typ):
        raise PlanError(f"{path}: {key!r} should be {typ.__name__ if isinstance(typ, type) else typ}, got {type(v).__name__}")
    return v


def load_plan(path: str | Path, graph: Graph | None = None, profile: Profile | None = None) -> Plan:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise PlanError(f"{path}: no such plan file (create one with `port solve CONFIG -o {path}`)") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanError(f"{path}: corrupt or truncated plan file ({e.msg} at line {e.lineno}); solve again") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise PlanError(f"{path}: not a PORT plan file (format {d.get('format') if isinstance(d, dict) else None!r})")
    ver = d.get("version")
    if ver != PLAN_FORMAT_VERSION:
        raise PlanError(f"{path}: plan format version {ver!r}, this PORT reads version {PLAN_FORMAT_VERSION}; solve again")
    gd = _req(d, "graph_digest", str, path)
    pd = _req(d, "profile_digest", str, path)
    ops = _req(d, "ops", list, path)
    tens = _req(d, "tensors", dict, path)
    try:
        decisions = tuple(OpDecision(int(o["op"]), str(o["accelerator"]), str(o["variant"])) for o in ops)
        rec = tuple(int(t) for t in tens.get("recompute", []))
        pag = tuple(int(t) for t in tens.get("paged", []))
        rat = tuple((int(a), int(b)) for a, b in tens.get("recompute_at", []))   # absent in older files: ()
        early = tuple(int(u) for u in d.get("early_updates", []))
        timeline = tuple(int(x) for x in _req(d, "memory_timeline", list, path))
    except (KeyError, TypeError, ValueError) as e:
        raise PlanError(f"{path}: malformed decisions ({e!r})") from None
    if [o.op for o in decisions] != list(range(len(decisions))):
        raise PlanError(f"{path}: op decisions must list every op once, in op-id order")
    if graph is not None:
        if gd != graph.digest():
            raise PlanError(f"{path}: plan was made for another graph (graph digest {gd[:12]}..., model "
                            f"{d.get('graph_name')!r}); this graph {graph.name!r} has digest {graph.digest()[:12]}...: "
                            f"solve again for this model/batch/optimizer")
        if len(decisions) != len(graph.ops):
            raise PlanError(f"{path}: {len(decisions)} op decisions for a graph of {len(graph.ops)} ops")
    if profile is not None and pd != profile.digest():
        raise PlanError(f"{path}: plan was made for another profile (profile digest {pd[:12]}...); this profile "
                        f"({profile.device!r}) has digest {profile.digest()[:12]}...: solve again")
    f = lambda k, dflt=0.0: float(d[k]) if d.get(k) is not None else (float("nan") if k == "gap" else dflt)
    return Plan(graph_digest=gd, profile_digest=pd, budget_bytes=int(_req(d, "budget_bytes", int, path)),
                ops=decisions, recompute=rec, recompute_at=rat, paged=pag, early_updates=early,
                solver=str(d.get("solver", "")), status=str(d.get("status", "feasible")),
                objective_ms=f("objective_ms"), gap=f("gap"), solve_time_s=f("solve_time_s"),
                predicted_step_ms=f("predicted_step_ms"), predicted_peak_bytes=int(d.get("predicted_peak_bytes") or 0),
                memory_timeline=timeline, batch_size=int(d.get("batch_size") or 0))
