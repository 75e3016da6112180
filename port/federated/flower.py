"""PORT's Flower apps (flwr 1.41, the Message API): ``client_app`` checks the global state it receives, trains
one round under the client's own plan and replies with deltas; ``server_app`` checks every reply (keys, shapes,
dtypes, finiteness, the examples claimed) and runs Flower's FedAvg, or the robust strategy of
``federation.aggregation``, on the good ones (``DeltaFedAvg``: Flower's own aggregation of the deltas, then global
+ aggregate), checkpoints the global model after every round and resumes from it.

Run configuration (``flwr run --run-config``): ``port-config`` (the federation YAML, absolute path),
``port-rounds`` (0: federation.rounds) and ``port-workdir`` (where the server keeps checkpoint.npz and
history.json, and the clients their plan cache).
Node configuration (``flower-supernode --node-config``): ``client-index`` (which entry of federation.clients
this device is). `port federate` starts all of this on 127.0.0.1; on a real device run the documented
``flower-supernode`` command against a remote SuperLink (README, "Federated learning").
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, FedMedian, FedTrimmedAvg, Krum

from port.errors import ConfigError, InfeasibleBudgetError

INFEASIBLE_CODE = 4201        # the error code of a client whose budget fits no plan
INVALID_STATE_CODE = 4202     # the error code of a client that refused the global state it received
CHECKPOINT = "checkpoint.npz"
HISTORY = "history.json"

client_app = ClientApp()
server_app = ServerApp()


def _paths(context: Context) -> tuple[Path, Path]:
    rc = context.run_config
    return Path(str(rc["port-config"])), Path(str(rc["port-workdir"]))


def _received(msg: Message, context: Context):
    """(federation, this client's index, the global state sent, work directory) of a message to a client."""
    from port.federated import load_federation
    cfg_path, work = _paths(context)
    fed = load_federation(cfg_path)
    return fed, int(context.node_config["client-index"]), {k: v.numpy() for k, v in msg.content["arrays"].items()}, work


def _infeasible_reply(msg: Message, index: int, e: InfeasibleBudgetError) -> Message:
    """The reply of a client whose budget fits no plan: an error with its budget and smallest feasible one."""
    return Message(Error(INFEASIBLE_CODE, json.dumps({"client": index, "budget_bytes": e.budget_bytes,
                                                      "min_feasible_bytes": e.min_feasible_bytes,
                                                      "message": str(e)})), reply_to=msg)


@client_app.train()
def _train(msg: Message, context: Context) -> Message:
    from port.federated import InvalidStateError, client_update
    fed, index, state, work = _received(msg, context)
    conf = msg.content["config"]
    rnd = int(conf["server-round"]) + int(conf.get("round-offset", 0))
    t0 = time.perf_counter()
    try:
        u = client_update(fed, index, state, rnd, work / "plans")
    except InfeasibleBudgetError as e:
        return _infeasible_reply(msg, index, e)
    except InvalidStateError as e:
        return Message(Error(INVALID_STATE_CODE, str(e)), reply_to=msg)
    m = {k: float(v) for k, v in u.metrics.items()}
    m.update({"num-examples": int(u.num_examples), "client": float(index), "seconds": time.perf_counter() - t0,
              "delta-bytes": float(sum(np.asarray(v).nbytes for v in u.delta.values()))})
    arrays = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in u.delta.items()})
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(m)}), reply_to=msg)


@client_app.evaluate()
def _evaluate(msg: Message, context: Context) -> Message:
    from port.federated import InvalidStateError, client_evaluate
    fed, index, state, work = _received(msg, context)
    try:
        ev = client_evaluate(fed, index, state, work / "plans")
    except InfeasibleBudgetError as e:
        return _infeasible_reply(msg, index, e)
    except InvalidStateError as e:
        return Message(Error(INVALID_STATE_CODE, str(e)), reply_to=msg)
    m = {"num-examples": ev["num_examples"], "client": float(index), "local_loss": ev["local_loss"],
         "local_accuracy": ev["local_accuracy"]}
    return Message(RecordDict({"metrics": MetricRecord(m)}), reply_to=msg)


class _Delta:
    """A Flower strategy over client deltas (mixed into FedAvg or one of its robust subclasses): its aggregate
    of the replies' arrays is the aggregate delta, added to the global model sent this round. Records per-client
    metrics, the clients that reported an infeasible budget, the replies that are errors (a SuperNode that
    stopped heartbeating, a crashed client, a client that refused the global state) or that ``check`` refuses
    (``check(arrays, metrics)`` -> the reason, or None: keys, shapes, dtypes, non-finite values, the examples
    claimed), and the nodes that did not reply within the round's timeout, and checkpoints the global model
    after each round (``on_round``). A refused reply is left out of that round's aggregate; an aggregate that
    is not finite (overflow) is not applied: the global model stays and the round records why.

    A node that did not reply in time (or whose reply says it is unavailable) is taken for gone: the next round
    waits up to ``rejoin_wait_s`` for ``expected_nodes`` other nodes (a restarted SuperNode registers as a new
    node) and does not send to the gone one, which the SuperLink still lists until it misses two heartbeats
    (about a minute in flwr 1.41). If too few nodes come, the round is sent to every node listed."""

    def __init__(self, on_round=None, expected_nodes: int = 0, rejoin_wait_s: float = 0.0, on_evaluate=None,
                 check=None, **kw):
        super().__init__(**kw)
        self.check = check
        self.on_evaluate = on_evaluate
        self._sent: ArrayRecord | None = None
        self._asked: list[int] = []
        self._gone: set[int] = set()
        self.on_round = on_round
        self.expected_nodes = expected_nodes
        self.rejoin_wait_s = rejoin_wait_s

    def configure_train(self, server_round, arrays, config, grid):
        self._sent = arrays
        if self._gone:
            t_end = time.monotonic() + self.rejoin_wait_s
            while (len(set(grid.get_node_ids()) - self._gone) < self.expected_nodes
                   and time.monotonic() < t_end):
                time.sleep(0.5)
        msgs = list(super().configure_train(server_round, arrays, config, grid))
        live = [m for m in msgs if int(m.metadata.dst_node_id) not in self._gone]
        if len(live) >= max(1, self.expected_nodes):
            msgs = live
        self._asked = [int(m.metadata.dst_node_id) for m in msgs]
        return msgs

    def configure_evaluate(self, server_round, arrays, config, grid):
        return [m for m in super().configure_evaluate(server_round, arrays, config, grid)
                if int(m.metadata.dst_node_id) not in self._gone]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        replies = list(replies)
        if self.on_evaluate is not None:
            self.on_evaluate(server_round, [{k: v for k, v in m.content["metrics"].items()}
                                            for m in replies if not m.has_error()])
        return super().aggregate_evaluate(server_round, replies)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        replies = list(replies)
        clients, infeasible, failed, good = [], [], [], []
        for m in replies:
            if not m.has_error():
                met = {k: v for k, v in m.content["metrics"].items()} if "metrics" in m.content else {}
                why = self.check(m.content, met) if self.check is not None else None
                if why is None:
                    clients.append(met)
                    good.append(m)
                else:
                    failed.append({"node": int(m.metadata.src_node_id), "client": met.get("client"),
                                   "reason": f"reply refused: {why}"[:500]})
                continue
            good.append(m)
            if m.error.code == INFEASIBLE_CODE:
                infeasible.append(json.loads(m.error.reason))
            else:       # a SuperLink's "node unavailable" reply does not name the node: it is among ``lost``
                failed.append({"node": None if m.error.code == ErrorCode.NODE_UNAVAILABLE
                               else int(m.metadata.src_node_id), "reason": str(m.error.reason)[:500]})
        replied = {int(m.metadata.src_node_id) for m in replies
                   if not (m.has_error() and m.error.code == ErrorCode.NODE_UNAVAILABLE)}
        lost = [n for n in self._asked if n not in replied]     # no reply in time, or reported unavailable
        self._gone |= set(lost)
        avg, metrics = super().aggregate_train(server_round, good)
        new = self._sent
        if avg is not None:
            new = ArrayRecord({k: Array(self._sent[k].numpy() + avg[k].numpy().astype(self._sent[k].numpy().dtype))
                               if k in avg else self._sent[k] for k in self._sent})     # frozen: not sent
            bad = [k for k, v in new.items() if not np.isfinite(v.numpy()).all()]
            if bad:
                failed.append({"node": None, "client": None, "reason": f"the aggregate is not finite ({bad[0]}, "
                               f"{len(bad)} array(s)): not applied, the global model stays"})
                new = self._sent
        if self.on_round is not None:
            self.on_round(server_round, new, clients, infeasible, failed, lost)
        return new, metrics


class DeltaFedAvg(_Delta, FedAvg):
    """Flower's FedAvg (the examples-weighted mean) over client deltas (see _Delta)."""


class DeltaTrimmedMean(_Delta, FedTrimmedAvg):
    """Flower's FedTrimmedAvg (coordinate-wise trimmed mean, ``beta`` cut per tail) over client deltas."""


class DeltaMedian(_Delta, FedMedian):
    """Flower's FedMedian (coordinate-wise median) over client deltas."""


class DeltaKrum(_Delta, Krum):
    """Flower's Krum (the delta nearest its n - f - 2 neighbours) over client deltas."""


def delta_strategy(aggregation, **kw) -> _Delta:
    """The strategy of ``federation.aggregation`` (port.federated.AggregationConfig) over deltas."""
    if aggregation.kind == "trimmed_mean":
        return DeltaTrimmedMean(beta=aggregation.beta, **kw)
    if aggregation.kind == "median":
        return DeltaMedian(**kw)
    if aggregation.kind == "krum":
        return DeltaKrum(num_malicious_nodes=aggregation.num_malicious, **kw)
    return DeltaFedAvg(**kw)


def reply_check(fed, state: dict, keys: list):
    """``check`` for _Delta: a reply's delta must have exactly ``keys`` with the global state's shapes and
    dtypes, finite values, a valid client index, and at most local_epochs x that client's partition size as
    num-examples."""
    from port.federated import check_delta

    def check(content, metrics: dict):
        if "arrays" not in content:
            return "no arrays in the reply"
        c = metrics.get("client")
        if not (isinstance(c, (int, float)) and float(c).is_integer() and 0 <= c < fed.num_clients):
            return f"client index {c!r} is not one of 0..{fed.num_clients - 1}"
        most = fed.config.federation.local_epochs * len(fed.partitions[int(c)])
        delta = {k: v.numpy() for k, v in content["arrays"].items()}
        return check_delta(delta, state, keys, metrics.get("num-examples"), most)
    return check


def _save(work: Path, arrays: ArrayRecord, history: dict) -> None:
    import io
    from port.io import atomic_write_bytes, atomic_write_text
    buf = io.BytesIO()
    np.savez(buf, **{k: v.numpy() for k, v in arrays.items()})
    atomic_write_bytes(work / CHECKPOINT, buf.getvalue())
    atomic_write_text(work / HISTORY, json.dumps(history, indent=1))


def load_checkpoint(work: Path) -> tuple[dict | None, dict]:
    """(global state or None, history) from a federation's work directory. An unreadable history.json or
    checkpoint.npz raises ConfigError naming the file and the fix (``--fresh``)."""
    h = work / HISTORY
    fix = "run `port federate` with --fresh to start again from round 0 (or restore the file)"
    try:
        history = json.loads(h.read_text()) if h.exists() else {"rounds": []}
        if not isinstance(history, dict) or not isinstance(history.get("rounds"), list):
            raise ValueError("no 'rounds' list")
    except (ValueError, OSError) as e:
        raise ConfigError(f"{h}: not a federation history ({e}); {fix}") from None
    c = work / CHECKPOINT
    if not c.exists() or not history["rounds"]:
        return None, {"rounds": []}
    try:
        with np.load(c, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}, history
    except Exception as e:      # zipfile.BadZipFile, EOFError, ValueError, OSError: a truncated or foreign file
        raise ConfigError(f"{c}: unreadable checkpoint ({type(e).__name__}: {e}); {fix}") from None


def check_checkpoint(work: Path, initial: dict) -> None:
    """Refuse a checkpoint that does not fit the config's model (``initial``: its global state): ConfigError
    naming the file, the mismatches and ``--fresh``."""
    from port.federated import check_state
    state, _h = load_checkpoint(work)
    if state is None:
        return
    problems = check_state(state, initial, "the checkpoint")
    if problems:
        raise ConfigError(f"{work / CHECKPOINT} does not fit this config's model: {'; '.join(problems[:6])}; "
                          f"run `port federate` with --fresh to start again from round 0, or --out another "
                          f"work directory")


def global_accuracy(fed, model, state: dict) -> float:
    """Test accuracy of a global state (loaded into ``model``) on the experiment's test split (PyTorch eager,
    on the server)."""
    import torch
    sd = model.state_dict()
    sd.update({k: torch.from_numpy(np.asarray(v)).reshape(sd[k].shape) for k, v in state.items()})
    model.load_state_dict(sd)
    model.eval()
    ds = fed.dataset
    with torch.no_grad():
        pred = torch.cat([model(x).argmax(1) for x, _ in ds.test_batches(256)])
    return float((pred == ds.y_test).float().mean())


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
    from port.federated import global_state, load_federation
    from port.pipeline import load_job, load_model
    cfg_path, work = _paths(context)
    work.mkdir(parents=True, exist_ok=True)
    fed = load_federation(cfg_path)
    model = load_model(load_job(cfg_path))
    f = fed.config.federation
    state, history = load_checkpoint(work)
    done = len(history["rounds"])
    initial = global_state(fed)
    check_checkpoint(work, initial)
    if state is None:
        state = initial
        history = {"rounds": [], "initial_accuracy": global_accuracy(fed, model, state)}
    total = int(context.run_config.get("port-rounds", 0) or 0) or f.rounds
    left = total - done
    if left <= 0:
        return
    n = fed.num_clients
    t_last = [time.time()]

    def on_round(server_round, arrays, clients, infeasible, failed, lost):
        st = {k: v.numpy() for k, v in arrays.items()}
        now = time.time()
        history["rounds"].append({"round": done + server_round, "accuracy": global_accuracy(fed, model, st),
                                  "seconds": now - t_last[0], "clients": clients, "infeasible": infeasible,
                                  "failed": failed, "lost": lost,
                                  "delta_bytes": int(sum(c.get("delta-bytes", 0) for c in clients))})
        t_last[0] = now
        last[0] = st
        _save(work, arrays, history)

    def on_evaluate(server_round, clients):
        if not clients or not history["rounds"]:
            return
        history["rounds"][-1]["evaluate"] = sorted(clients, key=lambda c: c["client"])
        _save(work, ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in last[0].items()}), history)

    last = [state]
    from port.pipeline import build_graph
    from port.federated import delta_keys
    keys = delta_keys(build_graph(load_job(cfg_path)).graph, state)
    strategy = delta_strategy(f.aggregation, check=reply_check(fed, initial, keys), on_round=on_round,
                              on_evaluate=on_evaluate, expected_nodes=n, rejoin_wait_s=f.round_timeout_s,
                              fraction_train=1.0, fraction_evaluate=1.0 if f.evaluate_clients else 0.0,
                              min_train_nodes=n, min_evaluate_nodes=n if f.evaluate_clients else 0,
                              min_available_nodes=n)
    strategy.start(grid=grid, initial_arrays=ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in state.items()}),
                   num_rounds=left, timeout=f.round_timeout_s, train_config=ConfigRecord({"round-offset": done}))
