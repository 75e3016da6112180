"""port.federated: federated training where every client trains under its own device's plan.

The config is an experiment config (port.config.ExperimentConfig: model, data, optimizer, solver) with a
``federation`` section::

    federation:
      rounds: 5
      local_epochs: 1
      partition: {alpha: 0.5}        # label skew: per class, client shares ~ Dirichlet(alpha)
      round_timeout_s: 600           # how long a round waits for the clients' replies
      evaluate_clients: false        # true: after each round every client evaluates the new global model on its
                                     # own data (a second message per client per round)
      aggregation: {kind: fedavg}    # or trimmed_mean (beta), median, krum (num_malicious): see AggregationConfig
      clients:
        - {device: jetson-orin-nano, budget: 50%}
        - {device: raspberry-pi-4b, budget: 25%}
        - {device: iphone-15-pro}    # budget: the experiment's, else the device's memory

Pure pieces (no Flower needed), used by the Flower apps in port.federated.flower and by the tests:
    partition_label_skew(labels, n_clients, alpha, seed) -> list of index tensors
    client_plan(fed, index, cache_dir) -> ClientPlan (the client's plan, solved once per graph/profile/budget)
    client_update(fed, index, global_state, round, cache_dir) -> ClientUpdate (deltas, examples, metrics)
    client_evaluate(fed, index, global_state, cache_dir) -> the global model's loss/accuracy on the client's data
    fedavg(global_state, updates) -> new global state (FedAvg of the deltas, weighted by examples)
    check_state(state, template, what) -> problems of a state against the expected keys/shapes/dtypes (finite)
    check_delta(delta, expected, num_examples, max_examples) -> why a client's reply is unusable, or None
    global_state(fed) -> the initial global parameters and float buffers (numpy arrays by state-dict name)

Updates are deltas: ``Trainer.parameter_delta`` (new - global) for every trained parameter, with zeros for one
that did not change, and new - global for every float buffer (BN running statistics, which move in training mode
even in frozen layers). Frozen parameters (``train.trainable``) are not sent: their delta is zero on every client,
so the up-link shrinks with a sparse update, and every client sends the same keys (Flower's averaging needs
that). Averaging deltas weighted by examples (a missing key counting zero) and adding them to the global state is
FedAvg exactly. A client whose budget fits no plan raises InfeasibleBudgetError; the server reports it with its
minimum.

Nothing received is trusted: a client refuses a global state with missing or extra keys, another shape or
dtype, or a non-finite value (InvalidStateError, replied as an error); the server drops a reply whose delta has
the wrong keys, shapes or dtypes, a non-finite value, or claims more examples than the client's partition holds
(local_epochs x its size), and records it under ``failed`` with the reason. A delta that is well formed but
large (a boosted update) is what ``aggregation`` is for.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import Field, field_validator

from port.config import ExperimentConfig, _Strict, parse_budget
from port.errors import ConfigError, InfeasibleBudgetError, PortError


class InvalidStateError(PortError):
    """A global state (or a checkpoint) that does not fit the model: missing or extra keys, another shape or
    dtype, or non-finite values; the message lists them."""


class ClientConfig(_Strict):
    device: str = "host"                          # name in configs/devices/ or a device YAML path
    budget: Optional[Union[int, str]] = None      # bytes or "NN%"; None: the experiment's budget, else the device's

    @field_validator("budget", mode="before")
    @classmethod
    def _budget(cls, v: Any) -> Any:
        return None if v is None else parse_budget(v)


class PartitionConfig(_Strict):
    alpha: float = Field(default=0.5, gt=0, allow_inf_nan=False)   # Dirichlet concentration (small: skewed)
    seed: int = 0


class AggregationConfig(_Strict):
    """How the server combines the clients' deltas: one of Flower's strategies (flwr.serverapp.strategy).

    fedavg: the mean weighted by examples, FedAvg exactly and the fastest to converge on skewed data, but one
        client with a large delta (a boosted or broken update) moves the global model as far as it likes.
    trimmed_mean (FedTrimmedAvg): per coordinate, drop the ``beta`` fraction of the highest and of the lowest
        values and average the rest, unweighted; trims only when int(beta * n) >= 1, i.e. with n >= 1/beta
        clients replying (5 at the default 0.2); honest outliers (a client with rare classes) are cut too.
    median (FedMedian): the coordinate-wise median, unweighted; withstands fewer than half the clients being
        bad (with 3 clients, one), but with 2 it is their mean and it converges more slowly than fedavg on
        non-IID data (the minority's updates are ignored).
    krum (Krum): the one delta with the smallest distance to its n - num_malicious - 2 nearest others; needs
        n > 2 num_malicious + 2 clients to exclude anybody and uses one client's update per round (the others'
        data count only by vote), so it is the slowest to converge."""
    kind: Literal["fedavg", "trimmed_mean", "median", "krum"] = "fedavg"
    beta: float = Field(default=0.2, ge=0, lt=0.5, allow_inf_nan=False)   # trimmed_mean: fraction cut per tail
    num_malicious: int = Field(default=0, ge=0)                          # krum: bad clients to tolerate


class FederationSection(_Strict):
    rounds: int = Field(default=5, ge=1)
    local_epochs: int = Field(default=1, ge=1)
    clients: tuple[ClientConfig, ...] = Field(min_length=1)
    partition: PartitionConfig = PartitionConfig()
    round_timeout_s: float = Field(default=600.0, gt=0)
    evaluate_clients: bool = False      # each round, every client also evaluates the new global model on its data
    aggregation: AggregationConfig = AggregationConfig()


class FederatedConfig(ExperimentConfig):
    federation: FederationSection


def load_federated(path: str | Path) -> FederatedConfig:
    from port.config import _format_errors, _read_yaml
    from pydantic import ValidationError
    p = Path(path)
    data = _read_yaml(p)
    if not isinstance(data, dict) or "federation" not in data:
        raise ConfigError(f"{p}: no 'federation' section; add one, e.g. federation: {{rounds: 5, clients: "
                          f"[{{device: jetson-orin-nano, budget: 50%}}, {{device: host}}]}}")
    try:
        return FederatedConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(p, e, data)) from None


@dataclass(frozen=True)
class Federation:
    """A loaded federation: the config, its file (model factories are imported beside it), the dataset and
    the clients' partition of its training split."""
    config: FederatedConfig
    config_path: Path
    dataset: Any = field(repr=False)                     # port.train.data.Dataset
    partitions: tuple[Any, ...] = field(repr=False)      # per client: index tensor into the training split

    @property
    def num_clients(self) -> int:
        return len(self.config.federation.clients)


def partition_label_skew(labels: Any, n_clients: int, alpha: float, seed: int = 0) -> list[Any]:
    """Non-IID split by label skew: for each class its examples are divided among the clients in proportions
    drawn from Dirichlet(alpha) (small alpha: each client sees few classes). Every example goes to exactly one
    client; each client gets at least one example."""
    import torch
    g = torch.Generator().manual_seed(int(seed))
    y = torch.as_tensor(labels)
    parts: list[list[int]] = [[] for _ in range(n_clients)]
    dist = torch.distributions.Dirichlet(torch.full((n_clients,), float(alpha)))
    torch.manual_seed(int(seed))       # Dirichlet samples from the global generator
    for c in sorted(set(y.tolist())):
        idx = torch.nonzero(y == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        share = dist.sample()
        cuts = (torch.cumsum(share, 0) * len(idx)).round().long().tolist()
        lo = 0
        for k, hi in enumerate(cuts):
            parts[k].extend(idx[lo:hi].tolist())
            lo = hi
    for k in range(n_clients):           # a client left empty takes one example from the largest
        if not parts[k]:
            big = max(range(n_clients), key=lambda j: len(parts[j]))
            parts[k].append(parts[big].pop())
    return [torch.tensor(sorted(p), dtype=torch.int64) for p in parts]


def load_federation(path: str | Path) -> Federation:
    from port.train.data import load
    cfg = load_federated(path)
    ds = load(cfg)
    f = cfg.federation
    parts = partition_label_skew(ds.y_train, len(f.clients), f.partition.alpha, f.partition.seed)
    return Federation(cfg, Path(path).resolve(), ds, tuple(parts))


def _client_job(fed: Federation, index: int):
    from port.pipeline import load_job
    c = fed.config.federation.clients[index]
    return load_job(fed.config_path, device=c.device, budget=c.budget if c.budget is not None else fed.config.budget)


@dataclass(frozen=True)
class ClientPlan:
    index: int
    device: str
    plan: Any                     # port.plan.types.Plan
    budget_bytes: int
    keep_everything_peak_bytes: int
    cached: bool


def client_plan(fed: Federation, index: int, cache_dir: str | Path) -> tuple[ClientPlan, Any, Any]:
    """(ClientPlan, job, built) for client ``index``: its plan under its device's profile and budget, read
    from ``cache_dir`` when one was solved for the same graph, profile and budget (plan-<digest>.json). A
    budget that fits no plan raises InfeasibleBudgetError, and is remembered too (infeasible-<digest>.json:
    message, budget_bytes, min_feasible_bytes), so later rounds do not search for the minimum again."""
    from port.pipeline import build_graph, get_profile, resolve_budget, solve_plan
    from port.plan.io import load_plan, save_plan
    job = _client_job(fed, index)
    built = build_graph(job)
    prof = get_profile(job, built.graph, progress=False, echo=lambda _m: None)
    bud = resolve_budget(job, built.graph, prof.profile)
    key = hashlib.sha256(json.dumps([built.graph.digest(), prof.profile.digest(), bud.bytes,
                                     job.config.solver.model_dump()], sort_keys=True).encode()).hexdigest()[:20]
    path = Path(cache_dir) / f"plan-{key}.json"
    if path.exists():
        return ClientPlan(index, job.device.name, load_plan(path), bud.bytes, bud.keep_everything_peak, True), job, built
    nofit = Path(cache_dir) / f"infeasible-{key}.json"     # the answer for a budget that fits no plan, kept too
    if nofit.exists():
        e = json.loads(nofit.read_text())
        raise InfeasibleBudgetError(e["message"], e["budget_bytes"], e["min_feasible_bytes"])
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    try:
        solved = solve_plan(job, built, prof, bud)       # InfeasibleBudgetError names the minimum
    except InfeasibleBudgetError as e:
        from port.io import atomic_write_text
        atomic_write_text(nofit, json.dumps({"format": "port-infeasible-budget", "version": 1, "message": str(e),
                                             "budget_bytes": e.budget_bytes,
                                             "min_feasible_bytes": e.min_feasible_bytes}))
        raise
    save_plan(solved.plan, path, built.graph)
    return ClientPlan(index, job.device.name, solved.plan, bud.bytes, bud.keep_everything_peak, False), job, built


@dataclass(frozen=True)
class ClientUpdate:
    index: int
    delta: dict                   # state-dict name -> numpy array (new - global): trained parameters, float buffers
    num_examples: int
    metrics: dict                 # train_loss, steps, test_accuracy (the experiment's test split), budget,
                                  # plan peak (simulated); measured: peak_rss_bytes (the process's resident
                                  # high-water mark during local training, VmHWM reset before it) and
                                  # train_rss_growth_bytes (that peak minus the resident set when training began)


def global_state(fed: Federation) -> dict:
    """The initial global model: parameters and floating-point buffers (numpy), seeded by train.seed."""
    from port.pipeline import build_graph, load_job
    job = load_job(fed.config_path)
    model = build_graph(job).model
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items() if v.is_floating_point()}


def _client_trainer(fed: Federation, index: int, state: dict, cache_dir: str | Path):
    """(Trainer under client ``index``'s plan holding ``state``, ClientPlan, the state as torch tensors)."""
    import numpy as np
    import torch
    from port import Trainer
    from port.pipeline import stand_in_backends
    cp, job, built = client_plan(fed, index, cache_dir)
    template = {k: v for k, v in built.model.state_dict().items() if v.is_floating_point()}
    problems = check_state(state, template, "the global state received")
    if problems:
        raise InvalidStateError(f"client {index}: the global state received does not fit the model of "
                                f"{fed.config_path}: " + "; ".join(problems[:8]) + "; the server runs another "
                                f"config or model (or sent a corrupt state): give both the same config")
    tr = Trainer(built.model, built.example, plan=cp.plan, optimizer=built.optimizer,
                 trainable=list(built.trainable) if built.trainable else None, seed=fed.config.train.seed,
                 accelerators=stand_in_backends(job.device) or None)
    base = {k: torch.from_numpy(np.asarray(v)) for k, v in state.items()}
    tr.load_state_dict(base)
    return tr, cp, base


def client_evaluate(fed: Federation, index: int, state: dict, cache_dir: str | Path) -> dict:
    """Client ``index``'s metrics of the global ``state`` on its own partition (run under its plan, eval mode):
    num_examples, local_loss, local_accuracy."""
    tr, _cp, _base = _client_trainer(fed, index, state, cache_dir)
    idx = fed.partitions[index]
    x, y = fed.dataset.x_train[idx], fed.dataset.y_train[idx]
    B = fed.config.batch_size
    ev = tr.evaluate((x[i:i + B], y[i:i + B]) for i in range(0, len(y), B))
    return {"num_examples": int(len(y)), "local_loss": float(ev["loss"]), "local_accuracy": float(ev["accuracy"])}


def client_update(fed: Federation, index: int, state: dict, server_round: int, cache_dir: str | Path) -> ClientUpdate:
    """One round of client ``index``: local epochs over its partition under its own plan, from ``state``."""
    import numpy as np
    import torch
    from port.train.memwatch import peak_bytes, reset_peak, rss_bytes
    tr, cp, base = _client_trainer(fed, index, state, cache_dir)
    cfg = fed.config
    ds = fed.dataset
    idx = fed.partitions[index]
    x, y = ds.x_train[idx], ds.y_train[idx]
    B = cfg.batch_size
    gen = torch.Generator().manual_seed(cfg.train.seed * 1009 + index * 7919 + server_round)
    losses = []
    reset_peak()
    rss0 = rss_bytes()
    for _ep in range(cfg.federation.local_epochs):
        perm = torch.randperm(len(y), generator=gen)
        for i in range(0, len(perm) - B + 1, B):        # full batches only: the plan is for batch B
            b = perm[i:i + B]
            losses.append(float(tr.step(x[b], y[b])))
    train_growth = max(0, peak_bytes() - rss0)
    new = tr.state_dict()
    changed = tr.parameter_delta(base)
    params = {t.name for t in tr.graph.parameters()}
    delta = {}
    for k in delta_keys(tr.graph, state):
        if k in params:                         # a trained parameter
            d = changed.get(k)
            delta[k] = (d.numpy() if d is not None else np.zeros_like(new[k].numpy())).reshape(np.shape(state[k]))
        elif k in new:                          # a float buffer
            delta[k] = (new[k] - base[k].reshape(new[k].shape).to(new[k].dtype)).numpy().reshape(np.shape(state[k]))
    ev = tr.evaluate(ds.test_batches(B))
    metrics = {"train_loss": float(np.mean(losses)) if losses else float("nan"), "steps": len(losses),
               "test_accuracy": ev["accuracy"], "budget_bytes": cp.budget_bytes,
               "predicted_peak_bytes": int(cp.plan.predicted_peak_bytes), "peak_rss_bytes": int(peak_bytes()),
               "train_rss_growth_bytes": int(train_growth),
               "keep_everything_peak_bytes": cp.keep_everything_peak_bytes}
    return ClientUpdate(index, delta, len(losses) * B, metrics)


def delta_keys(graph: Any, state: dict) -> list[str]:
    """The keys of ``state`` a client sends a delta for: the trained parameters and the float buffers (not the
    frozen parameters), in the state's order."""
    trained = {t.name for t in graph.trainable_parameters()}
    params = {t.name for t in graph.parameters()}
    return [k for k in state if k in trained or k not in params]


def _dtype(v: Any) -> str:
    import numpy as np
    return str(v.dtype).replace("torch.", "") if hasattr(v, "dtype") else str(np.asarray(v).dtype)


def check_state(state: dict, template: dict, what: str, keys: Optional[list] = None) -> list[str]:
    """The problems of ``state`` against ``template`` (arrays or tensors by name): missing and extra keys (of
    ``keys`` when given, else the template's), another shape or dtype, non-finite values. [] when it fits."""
    import numpy as np
    want = list(template) if keys is None else list(keys)
    out = []
    missing = [k for k in want if k not in state]
    extra = [k for k in state if k not in set(want)]
    if missing:
        out.append(f"{what} lacks {len(missing)} key(s): {', '.join(missing[:5])}")
    if extra:
        out.append(f"{what} has {len(extra)} unknown key(s): {', '.join(map(str, extra[:5]))}")
    for k in want:
        if k not in state:
            continue
        v, t = state[k], template[k]
        shape, tshape = tuple(np.shape(v)), tuple(t.shape)
        if shape != tshape:
            out.append(f"{k}: shape {list(shape)}, the model's is {list(tshape)}")
            continue
        dt, tdt = _dtype(v), _dtype(t)
        if dt != tdt:
            out.append(f"{k}: dtype {dt}, the model's is {tdt}")
            continue
        a = np.asarray(v)
        if not np.isfinite(a).all():
            out.append(f"{k}: {int(np.size(a) - np.isfinite(a).sum())} non-finite value(s)")
    return out


def check_delta(delta: dict, state: dict, keys: list, num_examples: Any, max_examples: int) -> Optional[str]:
    """Why a client's reply is unusable (its delta against the global ``state`` and the expected ``keys``, its
    claimed example count against ``max_examples``), or None when it is fine."""
    problems = check_state(delta, state, "the delta", keys)
    n = num_examples
    if not (isinstance(n, (int, float)) and math.isfinite(n) and float(n).is_integer() and 0 <= n <= max_examples):
        problems.append(f"num-examples {num_examples!r}: expected an integer in [0, {max_examples}] (local "
                        f"epochs x the client's partition)")
    return "; ".join(problems[:8]) or None


def fedavg(state: dict, updates: list[ClientUpdate]) -> dict:
    """FedAvg from the deltas: state + sum_i n_i * delta_i / sum_i n_i (clients with no examples count zero)."""
    import numpy as np
    n = sum(u.num_examples for u in updates)
    if n == 0:
        return {k: np.array(v, copy=True) for k, v in state.items()}
    return {k: (np.asarray(v) + sum(u.num_examples * np.asarray(u.delta[k], dtype=np.float64)
                                    for u in updates if k in u.delta) / n)
            .astype(np.asarray(v).dtype) for k, v in state.items()}     # averaged in float64, kept in the state's dtype


__all__ = ["FederatedConfig", "Federation", "AggregationConfig", "InvalidStateError", "check_state", "check_delta",
           "delta_keys", "ClientUpdate", "ClientPlan", "load_federated", "load_federation",
           "partition_label_skew", "client_plan", "client_update", "client_evaluate", "fedavg", "global_state"]
