"""`port federate CONFIG`: a local federation on this machine with Flower's deployment engine.

One SuperLink and one SuperNode per client (separate processes), all on 127.0.0.1 on free ports, with
telemetry and update checks off and a scratch FLWR_HOME inside the work directory; the run is submitted with
``flwr run`` and followed with ``flwr ls`` until it finishes. A SuperNode that dies is started again (as a
new node) and joins from the next round; the round in progress waits for the lost node's reply until
federation.round_timeout_s or until the SuperLink reports the node unavailable (two missed heartbeats, about a
minute in flwr 1.41), then averages the replies it has and records the node under ``lost``; the next round waits
(up to the same timeout) for the restarted node and does not send to the lost one (see DeltaFedAvg). The server
checkpoints the global model after every round, so an interrupted federation resumes where it stopped.
Flower's Ray-based simulation engine is not used.

Before any process starts, every client's device file and budget are loaded and its plan solved (into the plan
cache the clients read), and the checkpoint and history are read and checked against the model: a bad device
file, a federation where no client's budget fits a plan, or a corrupt or foreign checkpoint is a ConfigError
naming the file and the fix (exit 2), not a round that fails on every client.

Security (off loopback): ``tls=TlsFiles(ca, cert, key)`` runs the SuperLink with ``--ssl-ca-certfile/
--ssl-certfile/--ssl-keyfile`` and the SuperNodes (and ``flwr``) with ``--root-certificates`` (the CA) instead
of ``--insecure``; ``auth_supernodes=True`` has the SuperLink admit only registered SuperNodes
(``--enable-supernode-auth``): each client gets an EC key pair (``<work>/keys/client<I>``, made once), its
public key is registered with ``flwr supernode register`` and the SuperNode signs with its private key
(``--auth-supernode-private-key``); ``trusted_entities`` (a YAML of public key ids to ed25519 keys) makes the
SuperNodes run only FABs signed by one of them (``--trusted-entities``; a FAB ``flwr run`` builds from a local
directory is unsigned, so it is refused: use it with a FAB published and verified on Flower's platform).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from port.errors import ConfigError, PortError

APP_PYPROJECT = """[project]
name = "port-federated"
version = "1.0.0"
description = "PORT: every client trains under its own device's plan"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "port"

[tool.flwr.app.components]
serverapp = "port_federated_app.server:app"
clientapp = "port_federated_app.client:app"

[tool.flwr.app.config]
port-config = ""
port-workdir = ""
port-rounds = 0
"""


def flower_env(home: Path) -> dict:
    env = dict(os.environ)
    env.update(FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", FLWR_HOME=str(home))
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def write_app(app_dir: Path) -> Path:
    """The Flower App (shipped by ``flwr run`` as a FAB): two modules re-exporting PORT's apps."""
    pkg = app_dir / "port_federated_app"
    pkg.mkdir(parents=True, exist_ok=True)
    (app_dir / "pyproject.toml").write_text(APP_PYPROJECT)
    (pkg / "__init__.py").write_text('"""PORT federated app (see port.federated.flower)."""\n')
    (pkg / "server.py").write_text("from port.federated import flower\n\napp = flower.server_app\n")
    (pkg / "client.py").write_text("from port.federated import flower\n\napp = flower.client_app\n")
    return app_dir


def free_ports(n: int) -> list[int]:
    socks, out = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        out.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return out


@dataclass(frozen=True)
class TlsFiles:
    """The SuperLink's TLS files (PEM): the CA certificate (the SuperNodes' and flwr's root certificates), the
    server certificate (valid for 127.0.0.1) and its private key."""
    ca: Path
    cert: Path
    key: Path

    def check(self) -> "TlsFiles":
        for flag, f in (("--ssl-ca-certfile", self.ca), ("--ssl-certfile", self.cert), ("--ssl-keyfile", self.key)):
            if not Path(f).is_file():
                raise ConfigError(f"{flag} {f}: no such file; give the PEM file (all three of --ssl-ca-certfile, "
                                  f"--ssl-certfile and --ssl-keyfile for TLS)")
        return TlsFiles(Path(self.ca).resolve(), Path(self.cert).resolve(), Path(self.key).resolve())


def supernode_keys(key_dir: Path, n: int) -> list[tuple[Path, Path]]:
    """(private, public) OpenSSH EC (NIST P-384) key pair files for SuperNode authentication, one per client
    (``client<I>`` and ``client<I>.pub`` in ``key_dir``); existing pairs are kept."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    key_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        priv, pub = key_dir / f"client{i}", key_dir / f"client{i}.pub"
        if not (priv.exists() and pub.exists()):
            k = ec.generate_private_key(ec.SECP384R1())
            fd = os.open(priv, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                        serialization.NoEncryption()))
            pub.write_bytes(k.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                        serialization.PublicFormat.OpenSSH))
        out.append((priv, pub))
    return out


@dataclass
class LocalFederation:
    """The processes of a local federation (SuperLink + SuperNodes); ``stop()`` ends them all."""
    work: Path
    n_clients: int
    env: dict
    link_port: int
    node_ports: list
    link: Optional[subprocess.Popen] = None
    nodes: Optional[list] = None
    restarts: int = 0
    tls: Optional[TlsFiles] = None
    auth_keys: Optional[list] = None             # per client: (private, public) key files; None: no node auth
    trusted_entities: Optional[Path] = None

    def _security(self, node: bool) -> list[str]:
        if self.tls is None:
            return ["--insecure"]
        if node:
            return ["--root-certificates", str(self.tls.ca)]
        return ["--ssl-ca-certfile", str(self.tls.ca), "--ssl-certfile", str(self.tls.cert),
                "--ssl-keyfile", str(self.tls.key)]

    def _log(self, name: str):
        return open(self.work / "logs" / f"{name}.log", "ab")

    def start(self) -> "LocalFederation":
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        home = Path(self.env["FLWR_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        sec = (f'root-certificates = "{self.tls.ca}"\n' if self.tls is not None else "insecure = true\n")
        (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
                                          f'address = "127.0.0.1:{self.link_port}"\n{sec}')
        self.link = subprocess.Popen(["flower-superlink", *self._security(node=False), "--host", "127.0.0.1",
                                      "--port", str(self.link_port), "--disable-runtime-dependency-installation",
                                      *(["--enable-supernode-auth"] if self.auth_keys else [])],
                                     env=self.env, stdout=self._log("superlink"), stderr=subprocess.STDOUT,
                                     cwd=self.work)
        if self.auth_keys:
            self._register()
        self.nodes = [self._node(i) for i in range(self.n_clients)]
        return self

    def _register(self, wait_s: float = 60.0) -> None:
        """Register every client's public key with the SuperLink (retried while it starts listening)."""
        for i, (_priv, pub) in enumerate(self.auth_keys):
            t_end = time.time() + wait_s
            while True:
                out = _flwr(self.env, self.work, "supernode", "register", str(pub), "local", check=False)
                if out.get("success") or "already" in json.dumps(out).lower():
                    break
                if self.link.poll() is not None or time.time() > t_end:
                    raise PortError(f"could not register client {i}'s SuperNode key {pub}: {json.dumps(out)[:600]}; "
                                    f"see {self.work / 'logs' / 'superlink.log'}")
                time.sleep(0.5)

    def _node(self, i: int) -> subprocess.Popen:
        extra = []
        if self.auth_keys:
            extra += ["--auth-supernode-private-key", str(self.auth_keys[i][0])]
        if self.trusted_entities is not None:
            extra += ["--trusted-entities", str(self.trusted_entities)]
        return subprocess.Popen(["flower-supernode", *self._security(node=True), "--superlink",
                                 f"127.0.0.1:{self.link_port}", "--host", "127.0.0.1", "--port",
                                 str(self.node_ports[i]), "--node-config", f"client-index={i}", *extra],
                                env=self.env, stdout=self._log(f"client{i}"), stderr=subprocess.STDOUT, cwd=self.work)

    def watch(self) -> list[int]:
        """Start again every SuperNode that exited; returns their indices."""
        again = []
        for i, p in enumerate(self.nodes or []):
            if p.poll() is not None:
                self.nodes[i] = self._node(i)
                self.restarts += 1
                again.append(i)
        if self.link is not None and self.link.poll() is not None:
            raise PortError(f"the Flower SuperLink exited (code {self.link.returncode}); see "
                            f"{self.work / 'logs' / 'superlink.log'}")
        return again

    def stop(self) -> None:
        procs = [p for p in (self.nodes or []) + [self.link] if p is not None]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        t_end = time.time() + 15
        for p in procs:
            try:
                p.wait(max(0.1, t_end - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _flwr(env: dict, cwd: Path, *args: str, timeout: float = 120.0, check: bool = True) -> dict:
    r = subprocess.run(["flwr", *args, "--format", "json"], env=env, cwd=cwd, capture_output=True, text=True,
                       timeout=timeout)
    out = r.stdout.strip()
    try:
        return json.loads(out[out.index("{"):]) if "{" in out else {}
    except ValueError:
        if not check:
            return {"success": False, "output": out[-600:] + r.stderr[-600:]}
        raise PortError(f"flwr {' '.join(args)} printed no JSON (exit {r.returncode}): {out[-800:]} "
                        f"{r.stderr[-800:]}") from None


@dataclass(frozen=True)
class FederationResult:
    work_dir: Path
    history: dict
    status: str
    seconds: float
    restarts: int


def federate(config: str | Path, work_dir: str | Path | None = None, rounds: Optional[int] = None,
             fresh: bool = False, echo: Callable[[str], None] = print,
             on_start: Optional[Callable[[LocalFederation], None]] = None, tls: Optional[TlsFiles] = None,
             auth_supernodes: bool = False, trusted_entities: str | Path | None = None) -> FederationResult:
    """Run the federation of ``config`` locally (see the module docstring); returns its history."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise ConfigError("port federate needs Flower: pip install 'port[federated]' (flwr==1.41.0)") from None
    from port.federated import global_state, load_federation
    from port.federated.flower import check_checkpoint, load_checkpoint
    cfg_path = Path(config).resolve()
    fed = load_federation(cfg_path)
    if rounds is not None:
        if rounds < 1:
            raise ConfigError(f"--rounds {rounds}: give 1 or more")
    work = Path(work_dir or Path("runs") / f"{fed.config.name}-federated").resolve()
    if fresh and work.exists():
        for name in ("checkpoint.npz", "history.json"):
            (work / name).unlink(missing_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    tls = tls.check() if tls is not None else None
    if trusted_entities is not None:
        check_trusted_entities(Path(trusted_entities))
    hist = load_checkpoint(work)[1]         # ConfigError naming the file and --fresh when unreadable
    check_checkpoint(work, global_state(fed))
    check_clients(fed, work / "plans", echo)
    if hist["rounds"]:
        echo(f"resuming from {work / 'checkpoint.npz'} after round {len(hist['rounds'])}")
    app = write_app(work / "app")
    env = flower_env(work / "flwr-home")
    ports = free_ports(fed.num_clients + 1)
    keys = supernode_keys(work / "keys", fed.num_clients) if auth_supernodes else None
    lf = LocalFederation(work, fed.num_clients, env, ports[0], ports[1:], tls=tls, auth_keys=keys,
                         trusted_entities=Path(trusted_entities).resolve() if trusted_entities else None)
    try:
        lf.start()
    except BaseException:
        lf.stop()
        raise
    t0 = time.time()
    status = "unknown"
    try:
        if on_start is not None:
            on_start(lf)
        rc = f'port-config="{cfg_path}" port-workdir="{work}" port-rounds={int(rounds or 0)}'
        sub = {}
        for _try in range(30):      # the SuperLink takes a few seconds to listen
            sub = _flwr(env, work, "run", str(app), "local", "--run-config", rc)
            if sub.get("success") and sub.get("run-id") is not None:
                break
            lf.watch()
            time.sleep(1.0)
        if not sub.get("success"):
            raise PortError(f"flwr run failed: {json.dumps(sub)[:800]}; see {work / 'logs'}")
        run_id = str(sub["run-id"])
        echo(f"federation: run {run_id}, {fed.num_clients} clients on 127.0.0.1 (SuperLink :{ports[0]}), "
             f"logs in {work / 'logs'}")
        seen = seen0 = len(hist["rounds"])
        while True:
            time.sleep(1.0)
            for i in lf.watch():
                echo(f"client {i}: its SuperNode exited; started again")
            hist = load_checkpoint(work)[1]
            for r in hist["rounds"][seen:]:
                echo(_round_line(r))
            seen = len(hist["rounds"])
            ls = _flwr(env, work, "ls", "--run-id", run_id)
            runs = ls.get("runs") or []
            status = str(runs[0].get("status", "")) if runs else ""
            if status.startswith("finished"):
                break
    finally:
        lf.stop()
    hist = load_checkpoint(work)[1]
    if status != "finished:completed":
        raise PortError(f"the federation ended with status {status!r} after {len(hist['rounds'])} round(s); see "
                        f"{work / 'logs'}; run again to resume from the checkpoint")
    ran = hist["rounds"][seen0:]
    if not ran or not any(r["clients"] for r in ran):
        why = "; ".join(f"{f.get('reason', '')[:200]}" for r in ran for f in r.get("failed", [])[:2])
        raise PortError(f"the federation finished but no client's update was applied ({len(ran)} round(s) "
                        f"recorded{': ' + why if why else ''}); see {work / 'history.json'} and {work / 'logs'}")
    return FederationResult(work, hist, status, time.time() - t0, lf.restarts)


def check_trusted_entities(path: Path) -> None:
    """A --trusted-entities file must map public key ids to OpenSSH ed25519 public keys (what flower-supernode
    accepts; it exits on anything else, which would have the SuperNodes restarted for ever)."""
    import yaml
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key
    fix = "give a YAML mapping public key ids to ed25519 keys, e.g. {fpk_1: 'ssh-ed25519 AAAA... comment'}"
    if not path.is_file():
        raise ConfigError(f"--trusted-entities {path}: no such file; {fix}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not YAML ({e}); {fix}") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: not a non-empty mapping; {fix}")
    for k, v in data.items():
        try:
            ok = isinstance(load_ssh_public_key(str(v).encode()), ed25519.Ed25519PublicKey)
        except (ValueError, TypeError):
            ok = False
        if not ok:
            raise ConfigError(f"{path}: key {k!r}: {str(v)[:40]!r} is not an OpenSSH ed25519 public key; {fix}")


def check_clients(fed, plan_dir: Path, echo: Callable[[str], None] = print) -> None:
    """Load every client's device file and budget and solve its plan (into ``plan_dir``, the cache the clients
    read) before anything starts: a bad device file raises its ConfigError naming the client; a federation where
    no client's budget fits a plan raises ConfigError listing each budget and its smallest feasible one; an
    infeasible client among feasible ones is said (the server lists it every round)."""
    from port.config import format_size
    from port.errors import InfeasibleBudgetError
    from port.federated import client_plan
    bad = []
    for i, c in enumerate(fed.config.federation.clients):
        try:
            client_plan(fed, i, plan_dir)
        except InfeasibleBudgetError as e:
            low = format_size(e.min_feasible_bytes) if e.min_feasible_bytes else "unknown"
            bad.append(f"client {i} ({c.device}): budget {format_size(e.budget_bytes)} fits no plan (smallest "
                       f"feasible {low})")
        except ConfigError as e:
            raise ConfigError(f"{fed.config_path}: federation.clients[{i}] (device {c.device!r}): {e}") from None
    if len(bad) == fed.num_clients:
        raise ConfigError(f"{fed.config_path}: no client's budget fits a plan, so no round could train: "
                          + "; ".join(bad) + "; raise federation.clients[*].budget to at least the smallest "
                          "feasible one")
    for b in bad:
        echo(f"warning: {b}; it will be listed every round and send no update")


def _round_line(r: dict) -> str:
    from port.config import format_size
    parts = [f"round {r['round']}: global accuracy {r['accuracy']:.3f} ({r['seconds']:.1f} s)"]
    for c in sorted(r["clients"], key=lambda c: c["client"]):
        parts.append(f"client {int(c['client'])}: loss {c['train_loss']:.3f}, plan peak "
                     f"{format_size(c['predicted_peak_bytes'])} of {format_size(c['budget_bytes'])}")
    for c in r["infeasible"]:
        parts.append(f"client {c['client']}: budget {format_size(c['budget_bytes'])} fits no plan (smallest "
                     f"feasible {format_size(c['min_feasible_bytes']) if c['min_feasible_bytes'] else 'unknown'})")
    if r.get("evaluate"):
        parts.append("on their own data: " + ", ".join(f"client {int(c['client'])} {c['local_accuracy']:.3f}"
                                                        for c in r["evaluate"]))
    if r.get("lost"):
        parts.append(f"{len(r['lost'])} node(s) did not reply in time")
    if r.get("failed"):
        parts.append(f"{len(r['failed'])} error repl{'y' if len(r['failed']) == 1 else 'ies'} "
                     f"({r['failed'][0]['reason'][:80]})")
    return "; ".join(parts)


def write_report(res: FederationResult) -> Path:
    """history.md (accuracy per round and per client, infeasible clients with their minimum) and
    accuracy.png in the work directory; returns the markdown's path."""
    from port.config import format_size
    from port.io import atomic_write_text
    h = res.history
    lines = [f"# Federation ({res.status}, {res.seconds:.0f} s, {res.restarts} SuperNode restart(s))", "",
             f"initial global accuracy: {h.get('initial_accuracy', float('nan')):.3f}", "",
             "| round | global accuracy | seconds | clients (loss, accuracy on the test split, plan peak / budget) |",
             "|---|---|---|---|"]
    for r in h["rounds"]:
        cl = "; ".join(f"{int(c['client'])}: {c['train_loss']:.3f}, {c['test_accuracy']:.3f}, "
                       f"{format_size(c['predicted_peak_bytes'])} / {format_size(c['budget_bytes'])}"
                       for c in sorted(r["clients"], key=lambda c: c["client"]))
        cl += "".join(f"; {c['client']}: no plan fits {format_size(c['budget_bytes'])} (smallest feasible "
                      f"{format_size(c['min_feasible_bytes']) if c['min_feasible_bytes'] else 'unknown'})"
                      for c in r["infeasible"])
        cl += "".join(f"; {int(c['client'])}: {c['local_accuracy']:.3f} on its own data"
                      for c in r.get("evaluate", []))
        cl += "".join(f"; node {n}: no reply in time" for n in r.get("lost", []))
        cl += "".join(f"; {'node ' + str(c['node']) if c['node'] is not None else 'a node'}: error "
                      f"({c['reason'][:60]})" for c in r.get("failed", []))
        lines.append(f"| {r['round']} | {r['accuracy']:.3f} | {r['seconds']:.1f} | {cl} |")
    out = res.work_dir / "history.md"
    atomic_write_text(out, "\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.plot([0] + [r["round"] for r in h["rounds"]],
                [h.get("initial_accuracy", float("nan"))] + [r["accuracy"] for r in h["rounds"]], marker="o")
        ax.set_xlabel("round")
        ax.set_ylabel("global test accuracy")
        fig.tight_layout()
        fig.savefig(res.work_dir / "accuracy.png", dpi=100)
        plt.close(fig)
    except ImportError:
        pass
    return out
