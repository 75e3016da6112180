"""`port demo`: the main job on the built-in default config (configs/default.yaml): the training graph, then
profile (reused when present) -> solve -> train -> report, as `port inspect` and `port train` do."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(no_progress: bool = typer.Option(False, "--no-progress", help="no progress bars")) -> None:
        """Run the main job on the built-in default config: inspect, then profile, plan and train the digits CNN."""
        from port import pipeline as P
        from port.cli.inspect import print_report
        from port.config import DEFAULT_CONFIG

        job = P.load_job(DEFAULT_CONFIG)
        ins = P.inspect_graph(job, P.build_graph(job))
        print_report(ins.report, ins.title, ins.peak_note)
        P.run_training(DEFAULT_CONFIG, progress=not no_progress)
