"""`port inspect`: the training graph PORT will profile, schedule and execute, layer by layer."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer


def _fmt_flops(f: int) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if f >= div:
            return f"{f / div:.2f}{unit}"
    return str(f)


def _fmt_bytes(b: int) -> str:
    if b == 0:
        return "-"
    from port.config import format_size
    return format_size(b)


def print_report(rep: dict[str, Any], title: str, peak_note: str, all_ops: bool = False) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console(highlight=False, soft_wrap=True)
    t = Table(title=f"PORT training graph: {title}", show_lines=False)
    for col, just in (("layer", "left"), ("op", "left"), ("output shape", "left"), ("FLOPs", "right"),
                      ("saved for backward", "right"), ("parameters", "right")):
        t.add_column(col, justify=just, overflow="fold")
    for o in rep["ops"]:
        if not all_ops and o["phase"] not in ("forward", "loss"):
            continue
        t.add_row(escape(o["name"]), escape(o["kind"] + (" [torch]" if o.get("no_c_kernel") else "")),
                  "x".join(map(str, o["output_shape"])) or "scalar",
                  _fmt_flops(o["flops"]) if o["flops"] else "-", _fmt_bytes(o["saved_bytes"]),
                  _fmt_bytes(o["param_bytes"]))
    con.print(t)
    tot = rep["totals"]
    n_bwd = sum(1 for o in rep["ops"] if o["phase"] == "backward")
    n_upd = sum(1 for o in rep["ops"] if o["phase"] == "update")
    say = lambda s: con.print(s, markup=False)  # noqa: E731
    say(f"ops: {tot['num_forward_ops']} forward, 1 loss, {n_bwd} backward, {n_upd} update")
    say(f"parameters      {_fmt_bytes(tot['param_bytes'])}")
    say(f"gradients       {_fmt_bytes(tot['grad_bytes'])}")
    say(f"optimizer state {_fmt_bytes(tot['optimizer_bytes'])}")
    say(f"naive peak activation memory (all saved tensors alive when backward starts) "
        f"{_fmt_bytes(tot['naive_peak_activation_bytes'])}")
    say(peak_note)
    say(f"FLOPs: forward {_fmt_flops(tot['forward_flops'])}, backward {_fmt_flops(tot['backward_flops'])}")
    fallback = [o for o in rep["ops"] if o.get("no_c_kernel")]
    if fallback:
        n_aten = sum(1 for o in fallback if o["kind"].startswith("torch_op"))
        say(f"[torch]: {len(fallback)} forward op(s) have no C kernel and run on PyTorch's own kernels ({n_aten} "
            f"torch_op: PyTorch's derivative too; the torch engine only, not in port-rt bundles: `port compile` "
            f"refuses them): " + ", ".join(sorted({o["no_c_kernel"] for o in fallback})))


def graph_report(g: Any) -> dict[str, Any]:
    """The JSON form of `port inspect`: ops and totals."""
    from port.ir.capture import aten_of, torch_ops
    T = g.tensors
    no_c = dict(torch_ops(g))        # forward ops without a C kernel -> the aten op or kind that runs them
    counted: set[int] = set()
    ops = []
    for o in g.ops:
        saved = 0
        for t in o.saved:
            r = g.storage_root(t)
            if T[r].role in ("parameter", "buffer") or r in counted:
                continue
            counted.add(r)
            saved += T[r].bytes
        params = sum(T[t].bytes for t in o.inputs if T[t].role == "parameter") if o.phase == "forward" else 0
        out = T[o.outputs[0]].shape if o.outputs else ()
        kind = o.kind if not o.kind.startswith("torch_op") else f"{o.kind} ({aten_of(o)})"
        ops.append({"name": o.name, "layer": o.layer, "kind": kind, "phase": o.phase,
                    "output_shape": list(out), "flops": o.flops, "vector_flops": o.vector_flops,
                    "saved_bytes": saved, "param_bytes": params, "bytes_moved": o.bytes_moved}
                   | ({"no_c_kernel": no_c[o.name]} if o.name in no_c and o.phase == "forward" else {}))
    return {"graph": g.name, "batch_size": g.batch_size, "optimizer": g.optimizer, "digest": g.digest(),
            "ops": ops, "totals": g.totals()}


@dataclass(frozen=True)
class Inspected:
    report: dict                      # graph_report(...) plus keep_everything_peak_bytes and profile
    title: str
    peak_note: str                    # "keep-everything peak ... (workspace sizes from ...)"


def inspect_graph(job: Any, built: Any) -> Inspected:
    """The per-layer report and the keep-everything peak (workspace sizes from the profile at the job's
    location when it exists and covers the graph, else modeled; never measures)."""
    from port.config import format_size
    from port.pipeline import KEEP_EVERYTHING, find_profile, present_accelerators
    from port.solver.budget import keep_everything_peak
    rep = graph_report(built.graph)
    found = find_profile(job, built.graph)
    if found is not None:
        prof, src = found.profile, f"workspace sizes from profile {found.path}"
    else:
        from port.cost.roofline import modeled_profile
        prof = modeled_profile(built.graph, job.device)
        src = (f"workspace sizes modeled: no profile at {job.profile_path} yet" if present_accelerators(job.device)
               else f"device {job.device.name!r} is fully modeled")
    peak = keep_everything_peak(built.graph, prof)
    rep["keep_everything_peak_bytes"] = peak
    rep["profile"] = str(found.path) if found is not None else None
    note = (f"{KEEP_EVERYTHING} {format_size(peak)} ({peak} B: activations, parameters, gradients, optimizer state "
            f"and workspace with every activation kept; {src})")
    return Inspected(rep, built.title, note)



def register(app: typer.Typer) -> None:
    @app.command()
    def inspect(
        config: Optional[Path] = typer.Argument(None, help="experiment YAML (e.g. configs/resnet18.yaml)"),
        model: Optional[str] = typer.Option(None, "--model", "-m", help="zoo model name (or module:factory) "
                                            "instead of a config"),
        input: Optional[str] = typer.Option(None, "--input", help="per-sample input shape, e.g. 3x32x32"),
        batch: Optional[int] = typer.Option(None, "--batch", "-b", min=1, help="batch size"),
        trainable: Optional[list[str]] = typer.Option(None, "--trainable", help="module-name pattern to train "
                                                      "(repeatable); others frozen"),
        optimizer: Optional[str] = typer.Option(None, "--optimizer", help="sgd | sgd_momentum | adamw"),
        profile: Optional[Path] = typer.Option(None, "--profile", help="profile for workspace sizes (default "
                                               "profiles/<device>/<config name>.json when it exists)"),
        json_out: Optional[str] = typer.Option(None, "--json", help="write the report as JSON to PATH ('-' for stdout)"),
        all_ops: bool = typer.Option(False, "--all", help="also list backward and update ops"),
    ) -> None:
        """Trace a model into PORT's training graph and print per-layer figures and totals."""
        from port import pipeline as P
        job = P.load_job(config, model=model, input_shape=input, batch=batch, trainable=trainable,
                         optimizer=optimizer, profile=profile)
        ins = inspect_graph(job, P.build_graph(job))
        if json_out == "-":
            json.dump(ins.report, sys.stdout, indent=1)
            sys.stdout.write("\n")
            return
        print_report(ins.report, ins.title, ins.peak_note, all_ops)
        if json_out:
            from port.io import atomic_write_text
            atomic_write_text(Path(json_out), json.dumps(ins.report, indent=1))
            typer.echo(f"wrote {json_out}")
