"""PORT's Flower apps (flwr 1.41, the Message API): ``client_app`` trains one round under the client's own plan
and replies with deltas; ``server_app`` runs Flower's FedAvg on those deltas (``DeltaFedAvg``: Flower's own
weighted averaging, then global + average delta), checkpoints the global model after every round and resumes
from it.

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
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from port.errors import InfeasibleBudgetError

INFEASIBLE_CODE = 4201        # the error code of a client whose budget fits no plan
CHECKPOINT = "checkpoint.npz"
HISTORY = "history.json"

client_app = ClientApp()
server_app = ServerApp()


def _paths(context: Context) -> tuple[Path, Path]:
    rc = context.run_config
    return Path(str(rc["port-config"])), Path(str(rc["port-workdir"]))


@client_app.train()
def _train(msg: Message, context: Context) -> Message:
    from port.federated import client_update, load_federation
    cfg_path, work = _paths(context)
    index = int(context.node_config["client-index"])
    fed = load_federation(cfg_path)
    state = {k: v.numpy() for k, v in msg.content["arrays"].items()}
    conf = msg.content["config"]
    rnd = int(conf["server-round"]) + int(conf.get("round-offset", 0))
    t0 = time.perf_counter()
    try:
        u = client_update(fed, index, state, rnd, work / "plans")
    except InfeasibleBudgetError as e:
        return Message(Error(INFEASIBLE_CODE, json.dumps({"client": index, "budget_bytes": e.budget_bytes,
                                                          "min_feasible_bytes": e.min_feasible_bytes,
                                                          "message": str(e)})), reply_to=msg)
    m = {k: float(v) for k, v in u.metrics.items()}
    m.update({"num-examples": int(u.num_examples), "client": float(index), "seconds": time.perf_counter() - t0})
    arrays = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in u.delta.items()})
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(m)}), reply_to=msg)


class DeltaFedAvg(FedAvg):
    """Flower's FedAvg over client deltas: its weighted average of the replies' arrays is the average delta,
    added to the global model sent this round. Records per-client metrics and the clients that reported an
    infeasible budget, and checkpoints the global model after each round (``on_round``)."""

    def __init__(self, on_round=None, **kw):
        super().__init__(**kw)
        self._sent: ArrayRecord | None = None
        self.on_round = on_round

    def configure_train(self, server_round, arrays, config, grid):
        self._sent = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        replies = list(replies)
        clients, infeasible, failed = [], [], []
        for m in replies:
            if not m.has_error():
                clients.append({k: v for k, v in m.content["metrics"].items()})
            elif m.error.code == INFEASIBLE_CODE:
                infeasible.append(json.loads(m.error.reason))
            else:
                failed.append({"node": int(m.metadata.src_node_id), "reason": str(m.error.reason)[:500]})
        avg, metrics = super().aggregate_train(server_round, replies)
        new = self._sent
        if avg is not None:
            new = ArrayRecord({k: Array(self._sent[k].numpy() + avg[k].numpy().astype(self._sent[k].numpy().dtype))
                               for k in self._sent})
        if self.on_round is not None:
            self.on_round(server_round, new, clients, infeasible, failed)
        return new, metrics


def _save(work: Path, arrays: ArrayRecord, history: dict) -> None:
    import io
    from port.io import atomic_write_bytes, atomic_write_text
    buf = io.BytesIO()
    np.savez(buf, **{k: v.numpy() for k, v in arrays.items()})
    atomic_write_bytes(work / CHECKPOINT, buf.getvalue())
    atomic_write_text(work / HISTORY, json.dumps(history, indent=1))


def load_checkpoint(work: Path) -> tuple[dict | None, dict]:
    """(global state or None, history) from a federation's work directory."""
    h = work / HISTORY
    history = json.loads(h.read_text()) if h.exists() else {"rounds": []}
    c = work / CHECKPOINT
    if not c.exists() or not history["rounds"]:
        return None, {"rounds": []}
    with np.load(c) as z:
        return {k: z[k] for k in z.files}, history


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
    if state is None:
        state = global_state(fed)
        history = {"rounds": [], "initial_accuracy": global_accuracy(fed, model, state)}
    total = int(context.run_config.get("port-rounds", 0) or 0) or f.rounds
    left = total - done
    if left <= 0:
        return
    n = fed.num_clients
    t_last = [time.time()]

    def on_round(server_round, arrays, clients, infeasible, failed):
        st = {k: v.numpy() for k, v in arrays.items()}
        now = time.time()
        history["rounds"].append({"round": done + server_round, "accuracy": global_accuracy(fed, model, st),
                                  "seconds": now - t_last[0], "clients": clients, "infeasible": infeasible,
                                  "failed": failed,
                                  "delta_bytes": int(sum(v.nbytes for v in st.values())) * len(clients)})
        t_last[0] = now
        _save(work, arrays, history)

    strategy = DeltaFedAvg(on_round=on_round, fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n,
                           min_evaluate_nodes=0, min_available_nodes=n)
    strategy.start(grid=grid, initial_arrays=ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in state.items()}),
                   num_rounds=left, timeout=f.round_timeout_s, train_config=ConfigRecord({"round-offset": done}))
