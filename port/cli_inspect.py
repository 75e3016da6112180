"""`port inspect`: the training graph PORT will profile, schedule and execute, layer by layer."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from .errors import ConfigError


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().replace(",", "x").split("x") if d.strip())
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise ConfigError(f"--input {text!r}: expected a per-sample shape like 3x32x32 or 64")
    return dims


def build_graph(config: Optional[Path], model: Optional[str], input_shape: Optional[str], batch: Optional[int],
                trainable: Optional[list[str]], optimizer: Optional[str]):
    """(graph, description) from an experiment config or from --model/--input/--batch."""
    import torch
    from . import config as C
    from . import models
    from .graph import trace

    if config is not None:
        cfg = C.load_experiment(config)
        name, kwargs = cfg.model.name, dict(cfg.model.kwargs)
        shape = cfg.input_shape
        bs = batch or cfg.batch_size
        opt = optimizer or cfg.optimizer.name
        tr = trainable or (list(cfg.train.trainable) if cfg.train.trainable else None)
        kwargs.setdefault("num_classes", cfg.num_classes) if ":" not in name else None
    else:
        if model is None:
            raise ConfigError("give a CONFIG file or --model NAME (zoo: " + ", ".join(models.names()) + ")")
        if ":" not in model and model not in models.ZOO:
            raise ConfigError(f"--model {model!r}: unknown model; the zoo has: {', '.join(models.names())} "
                              "(or give package.module:factory)")
        name, kwargs = model, {}
        shape = parse_shape(input_shape) if input_shape else models.INPUT_SHAPES.get(model)
        if shape is None:
            raise ConfigError(f"--input is required for model {model!r} (e.g. --input 3x32x32)")
        bs = batch or 8
        opt = optimizer or "sgd_momentum"
        tr = trainable
    try:
        net = models.load(name, **kwargs)
    except TypeError as e:
        raise ConfigError(f"model {name!r}: bad model arguments {kwargs}: {e}") from None
    torch.manual_seed(0)
    g = trace(net, torch.randn(bs, *shape), trainable=tr, optimizer=opt, name=name)
    return g, f"{name} batch {bs} input {'x'.join(map(str, shape))} optimizer {opt}"


def graph_report(g) -> dict[str, Any]:
    """The JSON form of `port inspect`: ops and totals."""
    T = g.tensors
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
        ops.append({"name": o.name, "layer": o.layer, "kind": o.kind, "phase": o.phase,
                    "output_shape": list(out), "flops": o.flops, "vector_flops": o.vector_flops,
                    "saved_bytes": saved, "param_bytes": params, "bytes_moved": o.bytes_moved})
    return {"graph": g.name, "batch_size": g.batch_size, "optimizer": g.optimizer, "digest": g.digest(),
            "ops": ops, "totals": g.totals()}


def _fmt_flops(f: int) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if f >= div:
            return f"{f / div:.2f}{unit}"
    return str(f)


def _fmt_bytes(b: int) -> str:
    if b == 0:
        return "-"
    from .config import format_size
    return format_size(b)


def print_report(rep: dict[str, Any], title: str, all_ops: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"PORT training graph: {title}", show_lines=False)
    for col, just in (("layer", "left"), ("op", "left"), ("output shape", "left"), ("FLOPs", "right"),
                      ("saved for backward", "right"), ("parameters", "right")):
        t.add_column(col, justify=just, overflow="fold")
    for o in rep["ops"]:
        if not all_ops and o["phase"] not in ("forward", "loss"):
            continue
        t.add_row(o["name"], o["kind"], "x".join(map(str, o["output_shape"])) or "scalar",
                  _fmt_flops(o["flops"]) if o["flops"] else "-", _fmt_bytes(o["saved_bytes"]),
                  _fmt_bytes(o["param_bytes"]))
    con.print(t)
    tot = rep["totals"]
    n_bwd = sum(1 for o in rep["ops"] if o["phase"] == "backward")
    n_upd = sum(1 for o in rep["ops"] if o["phase"] == "update")
    con.print(f"ops: {tot['num_forward_ops']} forward, 1 loss, {n_bwd} backward, {n_upd} update")
    con.print(f"parameters      {_fmt_bytes(tot['param_bytes'])}")
    con.print(f"gradients       {_fmt_bytes(tot['grad_bytes'])}")
    con.print(f"optimizer state {_fmt_bytes(tot['optimizer_bytes'])}")
    con.print(f"naive peak activation memory (all saved tensors alive when backward starts) "
              f"{_fmt_bytes(tot['naive_peak_activation_bytes'])}")
    con.print(f"FLOPs: forward {_fmt_flops(tot['forward_flops'])}, backward {_fmt_flops(tot['backward_flops'])}")


def register(app: typer.Typer) -> None:
    @app.command()
    def inspect(
        config: Optional[Path] = typer.Argument(None, help="experiment YAML (e.g. configs/resnet18.yaml)"),
        model: Optional[str] = typer.Option(None, "--model", "-m", help="zoo model name instead of a config"),
        input: Optional[str] = typer.Option(None, "--input", help="per-sample input shape, e.g. 3x32x32"),
        batch: Optional[int] = typer.Option(None, "--batch", "-b", min=1, help="batch size"),
        trainable: Optional[list[str]] = typer.Option(None, "--trainable", help="module-name pattern to train (repeatable); others frozen"),
        optimizer: Optional[str] = typer.Option(None, "--optimizer", help="sgd | sgd_momentum | adamw"),
        json_out: Optional[str] = typer.Option(None, "--json", help="write the report as JSON to PATH ('-' for stdout)"),
        all_ops: bool = typer.Option(False, "--all", help="also list backward and update ops"),
    ) -> None:
        """Trace a model into PORT's training graph and print per-layer figures and totals."""
        g, title = build_graph(config, model, input, batch, trainable, optimizer)
        rep = graph_report(g)
        if json_out == "-":
            json.dump(rep, sys.stdout, indent=1)
            sys.stdout.write("\n")
            return
        print_report(rep, title, all_ops)
        if json_out:
            from .io import atomic_write_text
            atomic_write_text(Path(json_out), json.dumps(rep, indent=1))
            typer.echo(f"wrote {json_out}")
