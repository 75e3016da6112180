"""`port federate CONFIG`: a local federation (Flower's deployment engine on 127.0.0.1) where every client
trains under its own device's plan; port.federated.launch does the work."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("federate")
    def federate(config: Path = typer.Argument(..., help="federation YAML, e.g. configs/federated_digits.yaml"),
                 rounds: Optional[int] = typer.Option(None, "--rounds", help="override federation.rounds"),
                 out: Optional[Path] = typer.Option(None, "--out", help="work directory (default "
                                                    "runs/<name>-federated): checkpoint, history, logs"),
                 fresh: bool = typer.Option(False, "--fresh", help="start from round 0 instead of resuming"),
                 ) -> None:
        """Run a federation on this machine: a SuperLink and one SuperNode per client (loopback only), FedAvg
        over PORT deltas, a checkpoint per round (an interrupted federation resumes)."""
        from port.federated.launch import federate as run, write_report
        res = run(config, out, rounds=rounds, fresh=fresh, echo=lambda m: typer.echo(m))
        typer.echo(f"wrote {write_report(res)}")
