"""`port compile CONFIG -o DIR`: a bundle port-rt trains without Python, plus the config's data."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def compile_cmd(config: Path = typer.Argument(..., help="experiment YAML"),
                output: Path = typer.Option(..., "-o", "--output", help="directory for <name>.portrt, "
                                            "train.portdata and test.portdata"),
                plan: Optional[Path] = typer.Option(None, "--plan", help="plan JSON (from `port solve -o`) instead "
                                                    "of solving; it must use only C-kernel accelerators"),
                budget: Optional[str] = typer.Option(None, "--budget", help="memory budget: bytes, 64MB, 1.5GiB or "
                                                     "NN% of the keep-everything peak"),
                profile: Optional[Path] = typer.Option(None, "--profile", help="profile file (default "
                                                       "profiles/<device>/<config name>.json)"),
                emit_c: bool = typer.Option(False, "--emit-c", help="also write the bundle and a few training "
                                            "samples as C source (port_bundle.c/.h, port_data.c) for targets "
                                            "without a file system"),
                emit_samples: int = typer.Option(16, "--emit-samples", min=1, help="samples in port_data.c"),
                sign_key: Optional[Path] = typer.Option(None, "--sign-key", help="key file (32+ secret bytes: "
                                                        "`head -c 32 /dev/urandom > port.key`): sign the bundle "
                                                        "with HMAC-SHA-256 for `port-rt --key FILE "
                                                        "--require-signed`; unsigned, its SHA-256 guards against "
                                                        "accidents only")) -> None:
    """Compile the config's training job into a port-rt bundle (C kernels only) and write its data."""
    from port import pipeline as P
    P.compile_bundle(config, output, plan_path=plan, budget=budget, profile=profile, emit_c=emit_c,
                     emit_samples=emit_samples, echo=typer.echo, sign_key=sign_key)


def register(app: typer.Typer) -> None:
    app.command("compile")(compile_cmd)
