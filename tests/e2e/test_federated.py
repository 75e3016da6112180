"""Federated learning on Flower (issue 17): clients train under their own device's plans, deltas go over a real
local federation (Flower's deployment engine on 127.0.0.1), FedAvg by Flower's own strategy."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from port.errors import InfeasibleBudgetError
from port.federated import (ClientUpdate, client_evaluate, client_plan, client_update, fedavg, global_state,
                            load_federation, partition_label_skew)

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_killing_a_client_mid_round_keeps_the_federation(tmp_path):
    """Client 1's SuperNode is killed while it trains round 1 (as soon as it has received the round's message):
    round 1 ends with client 0's delta alone and records the lost node; PORT starts the SuperNode again, round 2
    waits for it and is not sent to the dead node; the checkpoint and history of both rounds survive,
    and a third round resumes from them."""
    pytest.importorskip("flwr")
    import threading
    import time
    from port.federated.flower import load_checkpoint
    from port.federated.launch import federate
    cfg = tmp_path / "fedkill.yaml"
    cfg.write_text(KILL_CONFIG)
    fed = load_federation(cfg)
    work = tmp_path / "work"
    log1 = work / "logs" / "client1.log"        # the plans are solved before the federation starts: not a signal
    killed = []

    def on_start(lf):
        def kill_when_training():
            t_end = time.time() + 300
            while time.time() < t_end and not (log1.exists() and "Receiving: train message" in log1.read_text()):
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


# -- issue 53: a federation that one client cannot poison, and that can leave loopback safely --------------------

TWO_CONFIG = "name: fedtwo\n" + EXPERIMENT + """federation:
  rounds: 1
  round_timeout_s: 300
  partition: {alpha: 0.5, seed: 1}
  clients:
    - {device: jetson-orin-nano, budget: 100%}
    - {device: raspberry-pi-4b, budget: 100%}
"""


@pytest.fixture(scope="module")
def fed_two(tmp_path_factory):
    p = tmp_path_factory.mktemp("fedtwo") / "fedtwo.yaml"
    p.write_text(TWO_CONFIG)
    return load_federation(p)


def test_clients_refuse_a_global_state_that_does_not_fit(fed_two, tmp_path):
    """A missing parameter used to be trained from the client's own initialisation, an extra key ignored, a
    wrong shape reshaped, NaN trained on: the client refuses each, naming the key."""
    from port.federated import InvalidStateError
    st = global_state(fed_two)
    k = "0.weight"
    cases = {"lacks 1 key(s): 0.weight": {a: v for a, v in st.items() if a != k},
             "unknown key(s): bogus": dict(st, bogus=np.zeros(3, np.float32)),
             "0.weight: shape": dict(st, **{k: st[k].reshape(st[k].shape[0], -1)}),
             "0.weight: dtype float64": dict(st, **{k: st[k].astype(np.float64)}),
             "0.weight: 1 non-finite": dict(st, **{k: np.where(np.arange(st[k].size).reshape(st[k].shape) == 3,
                                                                np.nan, st[k]).astype(np.float32)})}
    for want, bad in cases.items():
        with pytest.raises(InvalidStateError, match="global state received") as ei:
            client_update(fed_two, 0, bad, 1, tmp_path)
        assert want in str(ei.value), (want, str(ei.value))
    assert client_update(fed_two, 0, st, 1, tmp_path).num_examples > 0      # the good state trains


def _replies(monkeypatch, deltas_and_counts, clients=None):
    """Flower reply messages carrying ``(delta, num_examples)`` each, as a SuperNode would send them."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.supercore.task_identity import TaskIdentity
    for name, v in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, v, raising=False)
    out = []
    for i, (d, n) in enumerate(deltas_and_counts):
        q = Message(RecordDict({"config": ConfigRecord({"server-round": 1})}), dst_node_id=100 + i,
                    message_type="train")
        m = {"num-examples": n, "client": float(i if clients is None else clients[i])}
        out.append(Message(RecordDict({"arrays": ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in d.items()}),
                                       "metrics": MetricRecord(m)}), reply_to=q))
    return out


def _aggregate(fed, st, replies, checked=True, **agg):
    """(new global state, the round's failed list) of the server's strategy over ``replies``."""
    from flwr.app import Array, ArrayRecord
    from port.federated import AggregationConfig, delta_keys
    from port.federated.flower import delta_strategy, reply_check
    from port.pipeline import build_graph, load_job
    keys = delta_keys(build_graph(load_job(fed.config_path)).graph, st)
    got = {}
    s = delta_strategy(AggregationConfig(**agg), check=reply_check(fed, st, keys) if checked else None,
                       min_train_nodes=1,
                       min_available_nodes=1,
                       on_round=lambda r, arrays, clients, inf, failed, lost: got.update(failed=failed,
                                                                                          clients=clients))
    s._sent = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in st.items()})
    new, _m = s.aggregate_train(1, replies)
    return {k: v.numpy() for k, v in new.items()}, got["failed"], got["clients"]


def test_the_server_drops_a_bad_reply_and_says_why(fed_two, monkeypatch):
    """An all-NaN delta used to make the global model NaN, a delta of the wrong shape was broadcast onto the
    weight, a client claiming a million examples replaced the model: each reply is refused (under failed, with
    the reason) and the round averages the good ones only."""
    pytest.importorskip("flwr")
    st = global_state(fed_two)
    rng = np.random.default_rng(0)
    good = {k: (rng.standard_normal(v.shape) * 1e-3).astype(v.dtype) for k, v in st.items()}
    n0 = 32
    want = fedavg(st, [ClientUpdate(0, good, n0, {})])
    bias = next(k for k, v in st.items() if v.ndim == 1 and v.size > 1)
    most = len(fed_two.partitions[1])
    bads = {"non-finite": {k: np.full_like(v, np.nan) for k, v in good.items()},
            f"{bias}: shape [1]": dict(good, **{bias: good[bias][:1].copy()}),
            "dtype float64": dict(good, **{bias: good[bias].astype(np.float64)}),
            "lacks 1 key(s)": {k: v for k, v in good.items() if k != bias},
            "unknown key(s): extra": dict(good, extra=np.zeros(2, np.float32)),
            f"num-examples 1000000: expected an integer in [0, {most}]": {k: 700 * v for k, v in good.items()}}
    for why, bad in bads.items():
        n1 = 10 ** 6 if why.startswith("num-examples") else 16
        new, failed, clients = _aggregate(fed_two, st, _replies(monkeypatch, [(good, n0), (bad, n1)]))
        assert [int(c["client"]) for c in clients] == [0]
        (f,) = failed
        assert f["node"] == 101 and f["client"] == 1 and why in f["reason"], (why, f)
        for k in st:
            np.testing.assert_allclose(new[k], want[k], rtol=1e-6, atol=1e-7)
    _new, failed, _c = _aggregate(fed_two, st, _replies(monkeypatch, [(good, n0), (good, 16)], clients=[0, 5]))
    assert "client index 5.0 is not one of 0..1" in failed[0]["reason"]
    # the last guard, should a bad delta get past the checks: an aggregate that is not finite is not applied
    new, failed, _c = _aggregate(fed_two, st, _replies(monkeypatch, [(good, n0), (bads["non-finite"], 16)]),
                                 checked=False)
    assert "the aggregate is not finite" in failed[0]["reason"]
    assert all(np.array_equal(new[k], st[k]) for k in st)


def test_robust_aggregation_withstands_a_boosted_delta(fed_config, monkeypatch):
    """A client sending 700x its delta with an honest example count drags FedAvg's global model with it; the
    median, the trimmed mean (beta 0.34 trims one of three) and Krum keep the global update among the honest
    clients' ones, coordinate by coordinate."""
    pytest.importorskip("flwr")
    fed = load_federation(fed_config)            # three clients
    st = global_state(fed)
    rng = np.random.default_rng(1)
    a, b = ({k: (rng.standard_normal(v.shape) * 1e-3).astype(v.dtype) for k, v in st.items()} for _ in range(2))
    boosted = {k: 700 * v for k, v in b.items()}
    counts = [min(16, len(p)) for p in fed.partitions]

    def update(**agg):
        new, failed, _c = _aggregate(fed, st, _replies(monkeypatch, [(a, counts[0]), (b, counts[1]),
                                                                     (boosted, counts[2])]), **agg)
        assert not failed
        return {k: new[k] - st[k] for k in st}

    lo = {k: np.minimum(a[k], b[k]) for k in st}
    hi = {k: np.maximum(a[k], b[k]) for k in st}
    plain = update()
    assert max(np.abs(plain[k]).max() for k in st) > 100 * max(np.abs(hi[k]).max() for k in st)
    for agg in ({"kind": "median"}, {"kind": "trimmed_mean", "beta": 0.34}, {"kind": "krum"}):
        d = update(**agg)
        for k in st:
            assert (d[k] >= lo[k] - 1e-6).all() and (d[k] <= hi[k] + 1e-6).all(), (agg, k)
    with pytest.raises(Exception, match="beta"):
        load_federation_text(fed_config, "  aggregation: {kind: trimmed_mean, beta: 0.5}\n")


def load_federation_text(base: Path, extra: str):
    p = base.parent / "agg.yaml"
    p.write_text(base.read_text() + extra)
    return load_federation(p)


def _make_tls(d: Path):
    """A throw-away CA and a server certificate for 127.0.0.1/localhost signed by it (PEM files in ``d``)."""
    import datetime
    import ipaddress
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    from port.federated.launch import TlsFiles
    d.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)

    def cert(subject, issuer, key, sign_key, ca: bool):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - day).not_valid_after(now + day)
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                             x509.DNSName("localhost")]), critical=False)
        return b.sign(sign_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "PORT test CA")])
    (d / "ca.pem").write_bytes(cert(ca_name, ca_name, ca_key, ca_key, True))
    (d / "server.pem").write_bytes(cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]),
                                        ca_name, key, ca_key, False))
    (d / "server.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))
    return TlsFiles(d / "ca.pem", d / "server.pem", d / "server.key")


POISON_CLIENT = '''"""Test only: client 1 sends an all-NaN weight, a vector of the wrong shape, 700x deltas and
claims 10**6 examples."""
import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from port.federated import flower

app = ClientApp()
app.evaluate()(flower._evaluate)


@app.train()
def _train(msg, context):
    reply = flower._train(msg, context)
    if int(context.node_config["client-index"]) != 1 or reply.has_error():
        return reply
    d = {k: 700 * v.numpy() for k, v in reply.content["arrays"].items()}
    w = next(k for k, v in d.items() if v.ndim > 1)
    b = next(k for k, v in d.items() if v.ndim == 1 and v.size > 1)
    d[w] = np.full_like(d[w], np.nan)
    d[b] = d[b][:1].copy()
    m = dict(reply.content["metrics"])
    m["num-examples"] = 10 ** 6
    return Message(RecordDict({"arrays": ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in d.items()}),
                               "metrics": MetricRecord(m)}), reply_to=msg)
'''


@pytest.mark.slow
def test_tls_node_auth_and_a_poisoning_client_over_flower(tmp_path, monkeypatch):
    """A real federation over TLS (a CA and a 127.0.0.1 certificate made here; SuperNodes and flwr trust only that
    CA) with SuperNode authentication (each client's EC key registered; a SuperNode with an unregistered key is
    refused and gets no work). Client 1 is poisoned (NaN weight, wrong-shape bias, 700x deltas, a million
    examples claimed): its reply is refused with every reason, and the global model is client 0's update alone,
    finite."""
    pytest.importorskip("flwr")
    import subprocess
    from port.federated import launch
    from port.federated.flower import load_checkpoint
    cfg = tmp_path / "fedtwo.yaml"
    cfg.write_text(TWO_CONFIG)
    fed = load_federation(cfg)
    tls = _make_tls(tmp_path / "tls")
    real_write_app = launch.write_app

    def poisoned_app(app_dir):
        out = real_write_app(app_dir)
        (app_dir / "port_federated_app" / "client.py").write_text(POISON_CLIENT)
        return out
    monkeypatch.setattr(launch, "write_app", poisoned_app)
    work = tmp_path / "work"
    intruder = []

    def on_start(lf):          # a SuperNode whose key nobody registered, claiming to be client 0
        (priv, _pub), = launch.supernode_keys(tmp_path / "intruder", 1)
        intruder.append(subprocess.Popen(
            ["flower-supernode", "--root-certificates", str(lf.tls.ca), "--superlink", f"127.0.0.1:{lf.link_port}",
             "--host", "127.0.0.1", "--port", str(launch.free_ports(1)[0]), "--node-config", "client-index=0",
             "--auth-supernode-private-key", str(priv), "--max-retries", "0"], env=lf.env, cwd=lf.work,
            stdout=open(tmp_path / "intruder.log", "wb"), stderr=subprocess.STDOUT))
    try:
        res = launch.federate(cfg, work, tls=tls, auth_supernodes=True, echo=lambda _m: None, on_start=on_start)
    finally:
        for p in intruder:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert res.status == "finished:completed"
    state, hist = load_checkpoint(work)
    (r1,) = hist["rounds"]
    assert [int(c["client"]) for c in r1["clients"]] == [0]        # not the intruder, not the poisoner
    (f,) = r1["failed"]
    assert f["client"] == 1
    st = global_state(fed)
    w = next(k for k, v in st.items() if v.ndim > 1)
    b = next(k for k, v in st.items() if v.ndim == 1 and v.size > 1)
    for why in (f"{w}: {st[w].size} non-finite", f"{b}: shape [1]", "num-examples 1000000"):
        assert why in f["reason"], (why, f["reason"])
    want = fedavg(st, [client_update(fed, 0, st, 1, work / "plans")])
    for k in st:
        assert np.isfinite(state[k]).all()
        np.testing.assert_allclose(state[k], want[k], rtol=1e-5, atol=1e-6)
    assert "https://127.0.0.1" in (work / "logs" / "superlink.log").read_text()     # served over TLS
    assert "insecure" not in " ".join((work / "logs" / f"client{i}.log").read_text().lower() for i in (0, 1))
    assert "Failed to activate SuperNode" in (tmp_path / "intruder.log").read_text()
    assert "No SuperNode found with the given public key" in (work / "logs" / "superlink.log").read_text()


def test_bad_setups_are_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    """Found up front, each a ConfigError (exit 2) naming the file and the fix, with no SuperLink started: every
    client infeasible (used to "complete" with exit 0 and no round), a bad device file (used to fail every round
    for 100 s), a truncated checkpoint.npz or corrupt history.json (used to end in a traceback), a checkpoint of
    another model."""
    pytest.importorskip("flwr")
    from port.cli import run as cli
    from port.errors import ConfigError
    from port.federated import launch
    monkeypatch.setattr(launch.LocalFederation, "start", lambda self: pytest.fail("a process was started"))
    cfg = tmp_path / "f.yaml"
    cfg.write_text(TWO_CONFIG.replace("budget: 100%", "budget: 40%"))
    with pytest.raises(ConfigError, match=r"no client's budget fits a plan.*client 0 \(jetson-orin-nano\): budget "
                                          r".*smallest feasible .*client 1 .*raise federation.clients"):
        launch.federate(cfg, tmp_path / "w0", echo=lambda _m: None)
    dev = tmp_path / "broken-device.yaml"
    dev.write_text("name: broken\nmemory: lots\n")
    cfg.write_text(TWO_CONFIG.replace("device: raspberry-pi-4b", f"device: {dev}"))
    with pytest.raises(ConfigError, match=r"federation.clients\[1\] .*broken-device.yaml"):
        launch.federate(cfg, tmp_path / "w1", echo=lambda _m: None)
    # a work directory with a round done: then its files are damaged
    cfg.write_text(TWO_CONFIG)
    fed = load_federation(cfg)
    work = tmp_path / "w2"
    work.mkdir()
    st = global_state(fed)
    np.savez(work / "checkpoint.npz", **st)
    (work / "history.json").write_text('{"rounds": [{"round": 1}]}')
    blob = (work / "checkpoint.npz").read_bytes()
    (work / "checkpoint.npz").write_bytes(blob[:len(blob) // 2])
    with pytest.raises(ConfigError, match=r"checkpoint.npz: unreadable checkpoint .*--fresh"):
        launch.federate(cfg, work, echo=lambda _m: None)
    np.savez(work / "checkpoint.npz", **dict(st, **{"0.weight": st["0.weight"][:1]}))
    with pytest.raises(ConfigError, match=r"checkpoint.npz does not fit this config's model: 0.weight: shape "
                                          r".*--fresh"):
        launch.federate(cfg, work, echo=lambda _m: None)
    (work / "history.json").write_text('{"rounds": [{"round"')
    assert cli(["federate", str(cfg), "--out", str(work)]) == 2          # the CLI: exit 2, not a traceback
    with pytest.raises(ConfigError, match=r"history.json: not a federation history .*--fresh"):
        launch.federate(cfg, work, echo=lambda _m: None)
    assert cli(["federate", str(cfg), "--out", str(work), "--fresh", "--ssl-certfile", str(cfg)]) == 2
    assert "TLS needs all three" in capsys.readouterr().err


def test_trusted_entities_refuse_an_unsigned_fab(tmp_path):
    """--trusted-entities: the SuperNodes run only FABs signed by a trusted key; the FAB built from a local
    directory is unsigned, so every client refuses it, and a federation where no client's update was applied
    does not "complete": it raises, naming the reason. A trusted-entities file that is not ed25519 keys is
    refused up front."""
    pytest.importorskip("flwr")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from port.errors import ConfigError, PortError
    from port.federated.launch import federate
    cfg = tmp_path / "fedtwo.yaml"
    cfg.write_text(TWO_CONFIG)
    trusted = tmp_path / "trusted.yaml"
    trusted.write_text("fpk_test: 'ssh-rsa AAAAB3Nza'\n")
    with pytest.raises(ConfigError, match="fpk_test.*not an OpenSSH ed25519 public key"):
        federate(cfg, tmp_path / "work", trusted_entities=trusted, echo=lambda _m: None)
    pub = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                                         serialization.PublicFormat.OpenSSH)
    trusted.write_text(f"fpk_test: '{pub.decode()} test'\n")
    with pytest.raises(PortError, match="no client's update was applied .*FAB could not be verified"):
        federate(cfg, tmp_path / "work", trusted_entities=trusted, echo=lambda _m: None)
