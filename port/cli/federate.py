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
                 ssl_ca_certfile: Optional[Path] = typer.Option(None, "--ssl-ca-certfile", help="TLS: the CA "
                                                                "certificate (PEM); the SuperNodes' and flwr's "
                                                                "--root-certificates"),
                 ssl_certfile: Optional[Path] = typer.Option(None, "--ssl-certfile", help="TLS: the SuperLink's "
                                                             "certificate (PEM, valid for 127.0.0.1)"),
                 ssl_keyfile: Optional[Path] = typer.Option(None, "--ssl-keyfile", help="TLS: the SuperLink's "
                                                            "private key (PEM)"),
                 auth_supernodes: bool = typer.Option(False, "--auth-supernodes", help="admit only registered "
                                                      "SuperNodes: an EC key pair per client in <out>/keys, "
                                                      "registered with `flwr supernode register`"),
                 trusted_entities: Optional[Path] = typer.Option(None, "--trusted-entities", help="YAML of "
                                                                 "trusted public keys: SuperNodes run only FABs "
                                                                 "signed by one of them"),
                 ) -> None:
        """Run a federation on this machine: a SuperLink and one SuperNode per client (loopback only), FedAvg
        (or federation.aggregation) over PORT deltas checked on both sides, a checkpoint per round (an
        interrupted federation resumes); TLS with --ssl-*, SuperNode authentication with --auth-supernodes."""
        from port.errors import ConfigError
        from port.federated.launch import TlsFiles, federate as run, write_report
        given = [f for f in (ssl_ca_certfile, ssl_certfile, ssl_keyfile) if f is not None]
        if given and len(given) < 3:
            raise ConfigError("TLS needs all three of --ssl-ca-certfile, --ssl-certfile and --ssl-keyfile")
        tls = TlsFiles(ssl_ca_certfile, ssl_certfile, ssl_keyfile) if given else None
        res = run(config, out, rounds=rounds, fresh=fresh, echo=lambda m: typer.echo(m), tls=tls,
                  auth_supernodes=auth_supernodes, trusted_entities=trusted_entities)
        typer.echo(f"wrote {write_report(res)}")
