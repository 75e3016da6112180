"""Plan files: round trip, digests, refusals."""
from __future__ import annotations

import json

import pytest
import torch

from port import models
from port.config import load_device
from port.cost.roofline import modeled_profile
from port.errors import PlanError
from port.ir.trace import trace
from port.plan.io import load_plan, save_plan
from port.solver import solve


@pytest.fixture(scope="module")
def setup():
    g = trace(models.get("mlp", seed=0), torch.randn(8, 64), name="mlp")
    p = modeled_profile(g, load_device("host"))
    return g, p, solve(g, p, 10**9)


def test_round_trip(setup, tmp_path):
    g, p, plan = setup
    f = save_plan(plan, tmp_path / "plan.json", g)
    back = load_plan(f, g, p)
    assert back == plan
    d = json.loads(f.read_text())
    assert d["ops"][0]["name"] == g.ops[0].name and d["version"] == 1
    assert not list(tmp_path.glob(".*tmp"))


def test_refuses_other_graph_and_profile(setup, tmp_path):
    g, p, plan = setup
    f = save_plan(plan, tmp_path / "plan.json", g)
    g2 = trace(models.get("mlp", seed=0), torch.randn(16, 64), name="mlp")
    with pytest.raises(PlanError, match="another graph"):
        load_plan(f, g2)
    p2 = modeled_profile(g, load_device("jetson-orin-nano"))
    with pytest.raises(PlanError, match="another profile"):
        load_plan(f, g, p2)


def test_refuses_corrupt_truncated_wrong_version(setup, tmp_path):
    g, p, plan = setup
    f = save_plan(plan, tmp_path / "plan.json", g)
    text = f.read_text()
    (tmp_path / "t.json").write_text(text[: len(text) // 2])
    with pytest.raises(PlanError, match="corrupt or truncated"):
        load_plan(tmp_path / "t.json")
    d = json.loads(text)
    d["version"] = 99
    (tmp_path / "v.json").write_text(json.dumps(d))
    with pytest.raises(PlanError, match="version"):
        load_plan(tmp_path / "v.json")
    with pytest.raises(PlanError, match="no such plan"):
        load_plan(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(PlanError, match="not a PORT plan"):
        load_plan(tmp_path / "x.json")


def test_round_trip_chain_and_early(tmp_path):
    from port.plan.types import Plan
    import dataclasses
    g = trace(models.get("mlp", seed=0), torch.randn(8, 64), name="mlp")
    p = modeled_profile(g, load_device("host"))
    plan = solve(g, p, 10**9)
    plan = dataclasses.replace(plan, recompute_at=((0, 12), (1, 12)), inplace_reruns=((1, 12),),
                               early_updates=(18, 19))
    back = load_plan(save_plan(plan, tmp_path / "c.json", g), g, p)
    assert back.recompute_at == ((0, 12), (1, 12)) and back.early_updates == (18, 19) and back == plan
    assert back.inplace_reruns == ((1, 12),)
    # a file without the key (older writers) reads as no re-run in place
    plain = dataclasses.replace(plan, inplace_reruns=())
    assert "inplace_reruns" not in (tmp_path / save_plan(plain, tmp_path / "d.json", g).name).read_text()
    assert load_plan(tmp_path / "d.json", g, p) == plain


def test_round_trip_own_memory(setup, tmp_path):
    """Plan.own_memory (from the profile it was solved on) is written and read back; absent means none; a
    solve on a profile with an own-memory engine records it."""
    import dataclasses
    g, p, plan = setup
    assert plan.own_memory == ()
    own = dataclasses.replace(plan, own_memory=(plan.ops[0].accelerator,))
    f = save_plan(own, tmp_path / "own.json", g)
    assert load_plan(f, g, p) == own
    d = json.loads(f.read_text())
    d["own_memory"] = "cpu"
    from port.plan.io import plan_checksum
    d["sha256"] = plan_checksum({k: v for k, v in d.items() if k != "sha256"})
    f.write_text(json.dumps(d))
    with pytest.raises(PlanError, match="own_memory"):
        load_plan(f, g, p)
    q = dataclasses.replace(p, own_memory=(p.accelerators[0],), _index={})
    assert solve(g, q, 10**9).own_memory == q.own_memory
