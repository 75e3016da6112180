"""`port demo`: the main job on the built-in default config (configs/default.yaml): the training graph, then
profile (reused when present) -> solve -> train -> report, as `port inspect` and `port train` do."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(profile: Optional[Path] = typer.Option(None, "--profile", help="profile file (default "
                                                    "profiles/<device>/digits.json; measured when missing)"),
             no_progress: bool = typer.Option(False, "--no-progress", help="no progress bars")) -> None:
        """Run the main job on the built-in default config: inspect, then profile, plan and train the digits CNN."""
        from port import pipeline as P
        from port.cli.inspect import inspect_graph, print_report
        from port.config import DEFAULT_CONFIG

        job = P.load_job(DEFAULT_CONFIG, profile=profile)
        ins = inspect_graph(job, P.build_graph(job))
        print_report(ins.report, ins.title, ins.peak_note)
        P.run_training(DEFAULT_CONFIG, profile=profile, progress=not no_progress)
