"""Federated learning on Flower (issue 17): clients train under their own device's plans, deltas go over a real
local federation (Flower's deployment engine on 127.0.0.1), FedAvg by Flower's own strategy."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from port.errors import InfeasibleBudgetError
from port.federated import (client_plan, client_update, fedavg, global_state, load_federation,
                            partition_label_skew)

CONFIG = """name: fedtest
model: digits_cnn
input_shape: [1, 8, 8]
num_classes: 10
batch_size: 16
data: {kind: digits, seed: 0}
optimizer: {name: sgd_momentum, lr: 0.05, momentum: 0.9}
solver: {name: highs, time_limit_s: 10, gap: 0.01}
train: {seed: 0}
federation:
  rounds: 1
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
