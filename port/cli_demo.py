"""`port demo`: the main job on the built-in default config (configs/default.yaml).

It shows the training graph, then trains when the training stack is available (see `port train`)."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def demo() -> None:
        """Run the main job on the built-in default config: inspect, then plan and train the digits CNN."""
        from .cli_inspect import build_graph, graph_report, print_report
        from .config import DEFAULT_CONFIG

        g, title = build_graph(DEFAULT_CONFIG, None, None, None, None, None)
        print_report(graph_report(g), title)
        try:
            from .cli_train import run_training
        except ImportError:
            typer.echo("(training is not available in this build)")
            return
        run_training(DEFAULT_CONFIG)
