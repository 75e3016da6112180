"""Federated learning on Flower (issue 17): clients train under their own device's plans, deltas go over a real
local federation (Flower's deployment engine on 127.0.0.1), FedAvg by Flower's own strategy."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from port.errors import InfeasibleBudgetError
from port.federated import (client_evaluate, client_plan, client_update, fedavg, global_state, load_federation,
                            partition_label_skew)

EXPERIMENT = """model: digits_cnn
input_shape: [1, 8, 8]
num_classes: 10
batch_size: 16
data: {kind: digits, seed: 0}
optimizer: {name: sgd_momentum, lr: 0.05, momentum: 0.9}
solver: {name: highs, time_limit_s: 10, gap: 0.01}
train: {seed: 0}
"""

CONFIG = "name: fedtest\n" + EXPERIMENT + """federation:
  rounds: 1
  evaluate_clients: true
  partition: {alpha: 0.5, seed: 1}
  clients:
    - {device: jetson-orin-nano, budget: 65%}
    - {device: raspberry-pi-4b, budget: 100%}
    - {device: iphone-15-pro, budget: 40%}
"""


@pytest.fixture(scope="module")
def fed_config(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("fed") / "fed.yaml"
    p.write_text(CONFIG)
    return p


def test_label_skew_partition_covers_every_example_once():
    import torch
    y = torch.arange(300) % 10
    parts = partition_label_skew(y, 4, alpha=0.3, seed=0)
    allidx = torch.cat(parts).sort().values
    assert torch.equal(allidx, torch.arange(300)) and all(len(p) > 0 for p in parts)
    # skew: with a small alpha some client misses classes, and the same seed gives the same split
    assert min(len(set(y[p].tolist())) for p in parts) < 10
    assert all(torch.equal(a, b) for a, b in zip(parts, partition_label_skew(y, 4, alpha=0.3, seed=0)))


def test_client_updates_are_deltas_under_each_clients_plan(fed_config, tmp_path):
    fed = load_federation(fed_config)
    st = global_state(fed)
    u = client_update(fed, 0, st, 1, tmp_path)
    cp, _job, _b = client_plan(fed, 0, tmp_path)
    assert cp.cached and cp.plan.predicted_peak_bytes <= cp.budget_bytes < cp.keep_everything_peak_bytes
    assert u.metrics["predicted_peak_bytes"] <= u.metrics["budget_bytes"]
    assert u.num_examples == u.metrics["steps"] * fed.config.batch_size > 0
    assert set(u.delta) == set(st) and any(np.abs(d).max() > 0 for d in u.delta.values())
    again = client_update(fed, 0, st, 1, tmp_path)          # deterministic: the federation can be checked
    assert all(np.array_equal(u.delta[k], again.delta[k]) for k in st)
    with pytest.raises(InfeasibleBudgetError) as ei:        # 40% of the keep-everything peak fits no plan
        client_update(fed, 2, st, 1, tmp_path)
    assert ei.value.min_feasible_bytes > ei.value.budget_bytes
    (nofit,) = tmp_path.glob("infeasible-*.json")           # remembered: the next round does not search again
    nofit.write_text(nofit.read_text().replace(str(ei.value.min_feasible_bytes), "123456789"))
    with pytest.raises(InfeasibleBudgetError) as again_e:
        client_update(fed, 2, st, 2, tmp_path)
    assert again_e.value.min_feasible_bytes == 123456789 and again_e.value.budget_bytes == ei.value.budget_bytes


def test_a_sparse_update_sends_only_the_trained_parameters(tmp_path):
    """train.trainable freezes the convolutions: their parameters are not sent (smaller up-link), the trained
    ones and the BN running statistics are, and FedAvg leaves the frozen weights as they were."""
    cfg = tmp_path / "sparse.yaml"
    cfg.write_text(CONFIG.replace("train: {seed: 0}", "train: {seed: 0, trainable: ['8', '12']}")
                   .replace("budget: 65%", "budget: 100%"))
    fed = load_federation(cfg)
    st = global_state(fed)
    ups = [client_update(fed, i, st, 1, tmp_path) for i in (0, 1)]
    assert set(ups[0].delta) == set(ups[1].delta) == {"8.weight", "8.bias", "12.weight", "12.bias",
                                                      "1.running_mean", "1.running_var", "4.running_mean",
                                                      "4.running_var", "8.running_mean", "8.running_var"}
    new = fedavg(st, ups)
    assert np.array_equal(new["0.weight"], st["0.weight"]) and not np.array_equal(new["12.weight"], st["12.weight"])
    assert sum(v.nbytes for v in ups[0].delta.values()) < 0.5 * sum(v.nbytes for v in st.values())


def test_one_round_over_flower_equals_fedavg_by_hand(fed_config, tmp_path):
    """A real local federation (SuperLink + 3 SuperNodes, one process each, loopback): after one round the
    global model equals FedAvg computed by hand from the clients' PORT deltas; the client whose budget fits
    no plan is reported with its minimum, not dropped silently."""
    pytest.importorskip("flwr")     # the optional extra: `make install` installs it
    from port.federated.flower import load_checkpoint
    from port.federated.launch import federate, write_report
    fed = load_federation(fed_config)
    res = federate(fed_config, tmp_path / "work", echo=lambda _m: None)
    assert res.status == "finished:completed"
    state, hist = load_checkpoint(tmp_path / "work")
    (r1,) = hist["rounds"]
    assert sorted(int(c["client"]) for c in r1["clients"]) == [0, 1]
    (bad,) = r1["infeasible"]
    assert bad["client"] == 2 and bad["min_feasible_bytes"] > bad["budget_bytes"]
    st = global_state(fed)
    ups = [client_update(fed, i, st, 1, tmp_path / "plans") for i in (0, 1)]
    want = fedavg(st, ups)
    for k in st:
        np.testing.assert_allclose(state[k], want[k], rtol=1e-5, atol=1e-6)
    assert not all(np.array_equal(state[k], st[k]) for k in st)
    assert "no plan fits" in write_report(res).read_text()
    # federated evaluation: each client's loss and accuracy of the new global model on its own data
    ev = {int(c["client"]): c for c in r1["evaluate"]}
    assert sorted(ev) == [0, 1]
    for i in (0, 1):
        mine = client_evaluate(fed, i, state, tmp_path / "plans")
        assert ev[i]["num-examples"] == mine["num_examples"] == len(fed.partitions[i])
        assert ev[i]["local_accuracy"] == pytest.approx(mine["local_accuracy"], abs=1.5 / mine["num_examples"])
        assert ev[i]["local_loss"] == pytest.approx(mine["local_loss"], rel=1e-4)
    assert r1["delta_bytes"] == sum(sum(v.nbytes for v in u.delta.values()) for u in ups)


KILL_CONFIG = "name: fedkill\n" + EXPERIMENT + """federation:
  rounds: 2
  local_epochs: 3
  round_timeout_s: 120
  partition: {alpha: 0.5, seed: 1}
  clients:
    - {device: jetson-orin-nano, budget: 65%}
    - {device: raspberry-pi-4b, budget: 100%}
"""


def test_killing_a_client_mid_round_keeps_the_federation(tmp_path):
    """Client 1's SuperNode is killed while it trains round 1 (as soon as it has written its plan): round 1
    ends with client 0's delta alone and records the lost node; PORT starts the SuperNode again,
    round 2 waits for it and is not sent to the dead node; the checkpoint and history of both rounds survive,
    and a third round resumes from them."""
    pytest.importorskip("flwr")
    import threading
    import time
    from port.federated.flower import load_checkpoint
    from port.federated.launch import federate
    cfg = tmp_path / "fedkill.yaml"
    cfg.write_text(KILL_CONFIG)
    fed = load_federation(cfg)
    client_plan(fed, 1, tmp_path / "probe")                 # which plan file client 1 writes
    (plan1,) = [p.name for p in (tmp_path / "probe").iterdir()]
    work = tmp_path / "work"
    killed = []

    def on_start(lf):
        def kill_when_training():
            t_end = time.time() + 300
            while time.time() < t_end and not (work / "plans" / plan1).exists():
                time.sleep(0.02)
            lf.nodes[1].kill()
            killed.append(time.time())
        threading.Thread(target=kill_when_training, daemon=True).start()

    res = federate(cfg, work, echo=lambda _m: None, on_start=on_start)
    assert killed and res.status == "finished:completed" and res.restarts == 1
    state, hist = load_checkpoint(work)
    r1, r2 = hist["rounds"]
    # the killed node is lost: no reply within the round's timeout or, first, the SuperLink's "node unavailable"
    # error once it misses two heartbeats (then also under failed, without a node id)
    assert [int(c["client"]) for c in r1["clients"]] == [0] and len(r1["lost"]) == 1
    assert all(f["node"] is None and "Node Unavailable" in f["reason"] for f in r1["failed"])
    assert sorted(int(c["client"]) for c in r2["clients"]) == [0, 1] and not r2["lost"] and not r2["failed"]
    assert r2["accuracy"] > r1["accuracy"] > hist["initial_accuracy"]
    # round 1's global model is client 0's update alone (its accuracy, within one test example)
    from port.federated.flower import global_accuracy
    from port.pipeline import load_job, load_model
    st = global_state(fed)
    alone = fedavg(st, [client_update(fed, 0, st, 1, work / "plans")])
    both = fedavg(st, [client_update(fed, i, st, 1, work / "plans") for i in (0, 1)])
    model = load_model(load_job(cfg))
    acc_alone, acc_both = global_accuracy(fed, model, alone), global_accuracy(fed, model, both)
    assert abs(acc_alone - r1["accuracy"]) < 1.5 / len(fed.dataset.y_test) < abs(acc_both - r1["accuracy"])
    assert state is not None and set(state) == set(alone)
    # an interrupted (or extended) federation resumes from its checkpoint: round 3 runs, rounds 1-2 are kept
    said = []
    res3 = federate(cfg, work, rounds=3, echo=said.append)
    assert any("resuming" in m and "after round 2" in m for m in said)
    assert [r["round"] for r in res3.history["rounds"]] == [1, 2, 3] and res3.history["rounds"][:2] == [r1, r2]
