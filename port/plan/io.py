"""Plan files: versioned JSON tied to one graph and one profile by their digests.

    save_plan(plan, path, graph=None)        atomic (tmp file + os.replace); op names written when graph given
    load_plan(path, graph=None, profile=None) -> Plan   refuses corrupt/truncated/wrong-version files and
                                                         plans made for another graph/profile (PlanError)

Every file carries ``sha256``: the checksum of its canonical JSON without that key (like profiles). A file whose
content does not match it (edited or corrupted) is refused; a deliberate edit must remove the key.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from port.errors import PlanError
from port.plan.types import PLAN_FORMAT_VERSION, OpDecision, Plan
from port.ir.types import Graph
from port.cost.types import Profile

FORMAT = "port-plan"


def _canon(d: dict) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()


def plan_checksum(d: dict) -> str:
    """sha256 of a plan file's canonical JSON without its ``sha256`` key."""
    return hashlib.sha256(_canon({k: v for k, v in d.items() if k != "sha256"})).hexdigest()


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
    if plan.inplace_reruns:
        tens["inplace_reruns"] = [[int(a), int(b)] for a, b in plan.inplace_reruns]
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
        **({"joins": [[a, int(t)] for a, t in plan.joins]} if plan.joins else {}),
        "memory_timeline": list(plan.memory_timeline),
    } | ({"own_memory": list(plan.own_memory)} if plan.own_memory else {})


def save_plan(plan: Plan, path: str | Path, graph: Graph | None = None, extra: dict | None = None) -> Path:
    """extra: additional keys (e.g. "gantt", "layers") kept for `port show`; readers ignore unknown keys."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    d = plan_to_dict(plan, graph)
    d.update({k: v for k, v in (extra or {}).items() if k not in d})
    d["sha256"] = plan_checksum(d)
    from port.io import atomic_write_text
    atomic_write_text(path, json.dumps(d, indent=1))
    return path


def _req(d: dict, key: str, typ, path) -> object:
    if key not in d:
        raise PlanError(f"{path}: plan file lacks {key!r} (truncated or not a PORT plan)")
    v = d[key]
    if typ is not None and (not isinstance(v, typ) or isinstance(v, bool)):
        raise PlanError(f"{path}: {key!r} should be {typ.__name__ if isinstance(typ, type) else typ}, got {type(v).__name__}")
    return v


def _int(v, key: str, path, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v < 2**62:
        raise PlanError(f"{path}: key {key!r} = {v!r}: expected an integer >= {lo}; the plan file was edited or "
                        f"corrupted: solve again (`port solve CONFIG -o {path}`)")
    return v


def read_plan_json(path: str | Path) -> dict:
    """A plan file's JSON object, its format, version and checksum checked (PlanError naming the file and fix)."""
    path = Path(path)
    if path.is_dir():
        raise PlanError(f"{path}: is a directory; give a plan file written by `port solve CONFIG -o PLAN.json`")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise PlanError(f"{path}: no such plan file (create one with `port solve CONFIG -o {path}`)") from None
    except UnicodeDecodeError:
        raise PlanError(f"{path}: not a PORT plan file (not UTF-8 text: a checkpoint or another binary file?); give "
                        f"a plan file written by `port solve CONFIG -o PLAN.json`") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanError(f"{path}: corrupt or truncated plan file ({e.msg} at line {e.lineno}); solve again") from None
    except RecursionError:
        raise PlanError(f"{path}: corrupt plan file (nested too deeply); solve again") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise PlanError(f"{path}: not a PORT plan file (format {d.get('format') if isinstance(d, dict) else None!r})")
    ver = d.get("version")
    if ver != PLAN_FORMAT_VERSION:
        raise PlanError(f"{path}: plan format version {ver!r}, this PORT reads version {PLAN_FORMAT_VERSION}; solve again")
    if "sha256" in d and d["sha256"] != plan_checksum(d):
        raise PlanError(f"{path}: checksum mismatch (key 'sha256'): the plan file was edited or corrupted; solve "
                        f"again (`port solve CONFIG -o {path}`), or remove 'sha256' after a deliberate edit")
    return d


def load_plan(path: str | Path, graph: Graph | None = None, profile: Profile | None = None) -> Plan:
    path = Path(path)
    d = read_plan_json(path)
    gd = _req(d, "graph_digest", str, path)
    pd = _req(d, "profile_digest", str, path)
    ops = _req(d, "ops", list, path)
    tens = _req(d, "tensors", dict, path)
    def ints(v, key):
        if not isinstance(v, list):
            raise PlanError(f"{path}: key {key!r} should be a list, got {type(v).__name__}; solve again")
        return tuple(_int(x, key, path) for x in v)

    def strs(o, k, i):
        v = o.get(k)
        if not isinstance(v, str) or not v:
            raise PlanError(f"{path}: key 'ops[{i}].{k}' = {v!r}: expected a non-empty string; solve again")
        return v
    try:
        decisions = []
        for i, o in enumerate(ops):
            if not isinstance(o, dict):
                raise PlanError(f"{path}: key 'ops[{i}]' = {o!r}: expected an object; solve again")
            decisions.append(OpDecision(_int(o.get("op"), f"ops[{i}].op", path), strs(o, "accelerator", i),
                                        strs(o, "variant", i)))
        decisions = tuple(decisions)
        rec = ints(tens.get("recompute", []), "tensors.recompute")
        pag = ints(tens.get("paged", []), "tensors.paged")
        rat_raw = tens.get("recompute_at", [])     # absent in older files: ()
        if not isinstance(rat_raw, list) or any(not isinstance(p, list) or len(p) != 2 for p in rat_raw):
            raise PlanError(f"{path}: key 'tensors.recompute_at' should be a list of [op, before-op] pairs; solve again")
        rat = tuple((_int(a, "tensors.recompute_at", path), _int(b, "tensors.recompute_at", path)) for a, b in rat_raw)
        ipr_raw = tens.get("inplace_reruns", [])   # absent: no re-run runs in place
        if not isinstance(ipr_raw, list) or any(not isinstance(p, list) or len(p) != 2 for p in ipr_raw):
            raise PlanError(f"{path}: key 'tensors.inplace_reruns' should be a list of [op, step] pairs; solve again")
        ipr = tuple((_int(a, "tensors.inplace_reruns", path), _int(b, "tensors.inplace_reruns", path))
                    for a, b in ipr_raw)
        early = ints(d.get("early_updates", []), "early_updates")
        own = d.get("own_memory", [])        # absent: every engine on host memory
        if not isinstance(own, list) or not all(isinstance(a, str) for a in own):
            raise PlanError(f"{path}: key 'own_memory' should be a list of accelerator ids; solve again")
        timeline = ints(_req(d, "memory_timeline", list, path), "memory_timeline")
        jn_raw = d.get("joins", [])          # absent: no explicit join
        if not isinstance(jn_raw, list) or any(not isinstance(p, list) or len(p) != 2 or not isinstance(p[0], str)
                                               for p in jn_raw):
            raise PlanError(f"{path}: key 'joins' should be a list of [accelerator, step] pairs; solve again")
        joins = tuple((a, _int(t, "joins", path)) for a, t in jn_raw)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, PlanError):
            raise
        raise PlanError(f"{path}: malformed decisions ({e!r}); solve again") from None
    if [o.op for o in decisions] != list(range(len(decisions))):
        raise PlanError(f"{path}: op decisions must list every op once, in op-id order")
    if graph is not None:
        if gd != graph.digest():
            raise PlanError(f"{path}: plan was made for another graph (graph digest {gd[:12]}..., model "
                            f"{d.get('graph_name')!r}); this graph {graph.name!r} has digest {graph.digest()[:12]}...: "
                            f"solve again for this model/batch/optimizer")
        if len(decisions) != len(graph.ops):
            raise PlanError(f"{path}: {len(decisions)} op decisions for a graph of {len(graph.ops)} ops")
        nt, no = len(graph.tensors), len(graph.ops)
        if any(t >= nt for t in rec + pag) or any(a >= no or b >= no for a, b in rat + ipr) or any(u >= no for u in early):
            raise PlanError(f"{path}: tensor or op ids out of range for graph {graph.name!r}; solve again")
    if profile is not None and pd != profile.digest():
        raise PlanError(f"{path}: plan was made for another profile (profile digest {pd[:12]}...); this profile "
                        f"({profile.device!r}) has digest {profile.digest()[:12]}...: solve again")
    def f(k, dflt=0.0):
        v = d.get(k)
        if v is None:
            return float("nan") if k == "gap" else dflt
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -1e300 < v < 1e300:
            raise PlanError(f"{path}: key {k!r} = {v!r}: expected a finite number; solve again")
        return float(v)
    for k in ("solver", "status"):
        if k in d and not isinstance(d[k], str):
            raise PlanError(f"{path}: key {k!r} = {d[k]!r}: expected a string; solve again")
    opt_int = lambda k: _int(d.get(k) or 0, k, path)  # noqa: E731
    return Plan(graph_digest=gd, profile_digest=pd, budget_bytes=_int(_req(d, "budget_bytes", int, path), "budget_bytes", path),
                ops=decisions, recompute=rec, recompute_at=rat, inplace_reruns=ipr, paged=pag, early_updates=early,
                solver=str(d.get("solver", "")), status=str(d.get("status", "feasible")),
                objective_ms=f("objective_ms"), gap=f("gap"), solve_time_s=f("solve_time_s"),
                predicted_step_ms=f("predicted_step_ms"), predicted_peak_bytes=opt_int("predicted_peak_bytes"),
                memory_timeline=timeline, batch_size=opt_int("batch_size"), own_memory=tuple(own), joins=joins)
