"""bench/e2e.py's published-model mode (issue 54): which models a run takes, their targets, one (model, batch)
record from the workers' answers, the headline, and a published Spec built at another batch. No worker runs."""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


@pytest.fixture(scope="module")
def e2e(bench_e2e):
    return bench_e2e


@pytest.fixture(scope="module")
def published(e2e):
    spec = importlib.util.spec_from_file_location("bench_published_under_test", ROOT / "bench" / "published.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod           # its dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules[spec.name]


def test_the_speed_list_names_models_of_the_coverage_list(e2e, published):
    assert set(e2e.SPEED_LIST) <= set(published.MODELS)
    assert set(e2e.MEMORY_LIST) <= set(e2e.SPEED_LIST)
    assert e2e.speed_target("tv.mobilenet_v3_small") == 0.85
    assert e2e.speed_target("hf.llama_lm") == 0.9
    assert e2e.speed_target("tv.resnet18") == e2e.SPEED_ANY == 1.2


def test_model_names(e2e):
    assert e2e.model_names(None, True, False) == list(e2e.SPEED_LIST)
    assert e2e.model_names(None, False, True, ["a.x", "b.y"]) == ["a.x", "b.y"]
    assert e2e.model_names("tv.resnet18,hf.gpt2_lm", False, False) == ["tv.resnet18", "hf.gpt2_lm"]
    assert e2e.model_names(None, False, False) == []         # the zoo's defaults
    assert e2e.model_names("resnet18,vgg11", False, False) == ["resnet18", "vgg11"]
    with pytest.raises(SystemExit, match="zoo and published"):
        e2e.model_names("resnet18,tv.resnet18", False, False)
    with pytest.raises(SystemExit, match="exclusive"):
        e2e.model_names("tv.resnet18", True, False)


def _row(e2e, name="tv.mobilenet_v3_small", half=None):
    pre = 300 * MIB
    eager = {"median_ms": 40.0, "times": [0.040, 0.040, 0.050], "peak": pre + 100 * MIB, "pre": pre,
             "ms_by_kernel": {"aten::convolution_backward": 12.0, "aten::mm": 3.0}}
    port = {"median_ms": 30.0, "times": [0.030, 0.036, 0.030], "calls_by_backend": {"c": 90, "torch": 4},
            "ms_by_kernel": {"conv2d": 9.0}, "peak": pre, "pre": pre}
    budgets = {"1": {"frac": 1.0, "default_plan": True, "port": port}}
    if half is not None:
        budgets["0.5"] = half
    return {"model": name, "batch": 8, "budgets": budgets, "eager": eager}


def test_speed_record_ratios_and_growth_at_half(e2e):
    pre = 300 * MIB
    p5 = {"pre": pre, "setup_hwm": pre + 20 * MIB, "peak": pre + 55 * MIB, "times": [0.03]}
    d = e2e.speed_record(_row(e2e, half={"frac": 0.5, "port": p5}))
    assert d["ratio"] == pytest.approx(0.75)
    assert d["paired"] == pytest.approx(0.75)             # per-round ratios 0.75, 0.9, 0.6
    assert d["met"] and d["target"] == 0.85
    assert d["p_growth"] == 55 * MIB and d["e_growth"] == 100 * MIB
    assert d["mem_ratio"] == pytest.approx(0.55)
    tab = e2e.speed_table([d], "test run")
    assert ("| tv.mobilenet_v3_small | 8 | 40.0 | 30.0 | 0.75 (0.75) | 0.85 | met | 90 / 4 | 55.0 / 100.0 (0.55) "
            "| met |") in tab
    last = tab.splitlines()[-1]
    assert last.startswith("Speed headline: at batch 8, 1/1 of the issue's models") and last.endswith("(test run)")


def test_speed_record_misses_and_refusals(e2e):
    r = _row(e2e, "hf.bert_seqcls", half={"frac": 0.5, "infeasible": 80 * MIB})
    r["budgets"]["1"]["port"]["median_ms"] = 38.0
    slow = e2e.speed_record(r)
    assert slow["ratio"] == pytest.approx(0.95) and not slow["met"]      # over BERT's 0.9
    assert slow["mem_note"] == "infeasible (smallest 80 MiB)" and "mem_ratio" not in slow
    bad = _row(e2e, "tv.efficientnet_b0")
    bad["budgets"]["1"] = {"frac": 1.0, "error": "port worker: boom"}
    e = e2e.speed_record(bad)
    assert "ratio" not in e and e["error"] == "port worker: boom"
    head = e2e.speed_headline([slow, e], "x")
    assert "0/2 of the issue's models within target" in head and "1 errors" in head
    assert "| tv.efficientnet_b0 | 8 | 40.0 | error: port worker: boom |" in e2e.speed_table([e], "x")


def test_build_case_takes_a_published_spec_at_another_batch(e2e):
    model, x, y, loss_of = e2e.build_case("hand.nanogpt", 3)
    assert tuple(x.shape) == (3, 32) and tuple(y.shape) == (3, 32) and model.training
    assert float(loss_of(model, x, y).detach()) > 0
    model, x, y, _ = e2e.build_case("hand.se_cat_net", 5)
    assert tuple(x.shape) == (5, 3, 32, 32) and tuple(y.shape) == (5,)


def test_eager_and_port_growth_are_one_figure(e2e):
    """Both workers' growth is process_growth: from the baseline to the larger of the set-up's peak (VmHWM
    reset at the baseline) and the steps' peak; eager's set-up peak counts as PORT's does."""
    pre = 300 * MIB
    row = _row(e2e, half={"frac": 0.5, "port": {"pre": pre, "setup_hwm": pre + 30 * MIB, "peak": pre + 20 * MIB,
                                                 "times": [0.03]}})
    row["eager"]["setup_hwm"] = pre + 120 * MIB           # above its steps' 100 MiB
    d = e2e.speed_record(row)
    assert d["e_growth"] == 120 * MIB and d["p_growth"] == 30 * MIB
    assert d["mem_ratio"] == pytest.approx(0.25)
    assert e2e.process_growth({"pre": pre, "peak": pre + 7 * MIB}) == 7 * MIB     # records without setup_hwm


def test_a_memory_only_run_shows_its_growth(e2e):
    """--budgets 0.5 alone (no default plan): the row has no speed but keeps the growth and its target."""
    pre = 300 * MIB
    row = _row(e2e, half={"frac": 0.5, "port": {"pre": pre, "setup_hwm": pre, "peak": pre + 70 * MIB,
                                                 "times": [0.03]}})
    del row["budgets"]["1"]
    d = e2e.speed_record(row)
    assert "ratio" not in d and "memory only" in d["error"] and d["mem_ratio"] == pytest.approx(0.7)
    assert "| 70.0 / 100.0 (0.70) | NOT met |" in e2e.speed_table([d], "x")


def test_predict_profile_settings_fit_the_row_budget(published):
    """bench/coverage.py --predict all (issue 52): a row's profile is timed within its share of the run's budget:
    blocks shortened from the default's 20 ms (3 of them, not 5, on models with many entries), never under
    MIN_BLOCK_MS, no per-entry peak-memory runs, a hard stop at twice the budget; no budget: the full profile."""
    from port.cost.measure import EXTRA_TIME_FRACTION
    P = published
    assert P.profile_settings(500, None) == {}
    small = P.profile_settings(50, 12.0)                    # a small net: the default's blocks fit
    assert (small["blocks"], small["block_ms"], small["warmup_ms"]) == (5, 20.0, 10.0)
    for n in (300, 1000, 2500):
        s = P.profile_settings(n, 12.0)
        assert s["peak_memory"] is False and s["max_time_s"] == 24.0
        assert P.MIN_BLOCK_MS <= s["block_ms"] < 20.0 and s["warmup_ms"] == pytest.approx(s["block_ms"] / 2, abs=0.01)
        per_entry_ms = (s["warmup_ms"] + s["blocks"] * s["block_ms"]) * (1 + EXTRA_TIME_FRACTION) + P.ENTRY_SETUP_MS
        assert n * per_entry_ms / 1e3 <= 12.0 or s["block_ms"] == P.MIN_BLOCK_MS
    assert P.profile_settings(1000, 12.0)["blocks"] == 3
    assert P.profile_settings(2500, 12.0)["block_ms"] == P.MIN_BLOCK_MS      # past the budget: the hard stop models


def test_a_model_imports_its_own_zoo(published):
    assert published.zoo_of("hand-written") == ()
    assert published.zoo_of("peft") == ("transformers", "peft")
    assert {published.zoo_of(s.family) != () for s in published.MODELS.values()} == {True, False}


def test_the_predict_cache_keeps_each_rows_entries_without_summing_samples(published):
    """The shared profile of a --predict run after a row: the row's entries (a reused one as it was), then the
    cache's other keys, sorted; the samples of a reused entry stay its own (merge_profiles would add them up, and
    29 rows of doubling passed the 2^31 a profile file may hold)."""
    from port.cost.types import OpCost, Profile
    a, b, c = (OpCost(s, "cpu-c", "plain", 1.0, measured=True, samples=5) for s in ("a", "b", "c"))
    cache = Profile("host", ("cpu-c",), (a, c))
    row = Profile("host", ("cpu-c",), (a, b))
    out = cache
    for _ in range(40):
        out = published._cache_update(out, row)
    assert [(e.signature, e.samples) for e in out.entries] == [("a", 5), ("b", 5), ("c", 5)]
    assert published._cache_update(None, row) is row


def test_calls_by_kind_books_every_op_of_the_plan_once(published):
    """bench/coverage.py --predict-calls: per (op kind, accelerator, variant) of the plan, the ops, their price
    (the profile entries the simulator uses) and their in-plan time from the Trainer's instrumented steps; every op
    in one group, the largest in-plan - price gap first, training state unchanged (profile_step restores it)."""
    import torch
    import torch.nn as nn
    import port
    from port.config import load_device
    from port.cost.roofline import modeled_profile
    from port.lower.lower import default_plan
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                      nn.Linear(4 * 36, 3))
    x, y = torch.randn(2, 3, 6, 6), torch.tensor([0, 2])
    g = port.trace(m, x, optimizer="sgd_momentum")
    prof, plan = modeled_profile(g, load_device("host")), default_plan(g, "c")
    tr = port.Trainer(m, x, plan=plan, optimizer=port.train.optim.SGD(1e-3, momentum=0.9))
    before = tr.arena[:tr.program.persistent_bytes].clone()
    rows = published.calls_by_kind(tr, g, plan, prof, x, y, steps=2)
    assert torch.equal(tr.arena[:tr.program.persistent_bytes], before)
    assert sum(r[3] for r in rows) == len(g.ops)
    assert len({tuple(r[:3]) for r in rows}) == len(rows)
    gaps = [r[5] - r[4] for r in rows]
    assert gaps == sorted(gaps, reverse=True)
    assert any(r[0] == "update" and r[5] > 0 for r in rows)
    # a fused conv+bn+relu call's members book their share of it, as the profile prices them (not 0 and all)
    import dataclasses
    from port.plan import variants as V
    from port.plan.types import OpDecision
    ops = list(plan.ops)
    for o in g.ops:
        for i in V.fusion_chain(g, o) or ():
            ops[i] = OpDecision(i, ops[i].accelerator, "fused")
    fplan = dataclasses.replace(plan, ops=tuple(ops))
    tr.close()
    tr = port.Trainer(m, x, plan=fplan, optimizer=port.train.optim.SGD(1e-3, momentum=0.9))
    fused = [r for r in published.calls_by_kind(tr, g, fplan, prof, x, y, steps=2) if r[2] == "fused"]
    assert {r[0] for r in fused} >= {"conv2d", "batch_norm2d", "relu"} and all(r[5] > 0 for r in fused), fused
