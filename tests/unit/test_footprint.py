"""Engine footprints (port.cost.footprint): measured in a fresh process, recorded in the profile (file format,
cache reuse), and the graph hand-over to that process (Graph.from_dict)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from port import models
from port.cost import footprint as FP
from port.cost.io import load_profile, profile_from_dict, profile_to_dict, save_profile
from port.errors import ProfileError
from port.ir.trace import trace
from port.ir.types import Graph


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    return trace(models.get("digits_cnn", seed=0), torch.randn(16, 1, 8, 8), optimizer="sgd_momentum",
                 name="digits_cnn")


def test_graph_round_trips_through_its_dict(cnn):
    from port.transformers import gpt_tiny
    gpt = gpt_tiny(layers=1, dim=32, heads=2, context=16)
    g2 = trace(gpt, torch.randint(0, 64, (2, 16)), optimizer="sgd_momentum", name="gpt")
    for g in (cnn, g2):
        back = Graph.from_dict(json.loads(json.dumps(g.to_dict())))
        assert back == g and back.digest() == g.digest()
        assert all(a.attrs == b.attrs for a, b in zip(g.ops, back.ops))
        assert all(back.signature(o) == g.signature(o) for o in g.ops)


def test_torch_engine_keeps_more_resident_than_the_c_kernels(cnn):
    """The all-torch-cpu plan maps libtorch/oneDNN code and keeps caches: megabytes the C kernels do not."""
    c = FP.measure_engine_bytes(cnn, "c", 2)
    t = FP.measure_engine_bytes(cnn, "torch-cpu", 2)
    for r in (c, t):
        assert set(r) >= {"engine_bytes", "anon_bytes", "file_bytes", "arena_bytes", "steps"}
        assert r["engine_bytes"] >= 0 and r["arena_bytes"] > 0
    assert t["engine_bytes"] > c["engine_bytes"] + (4 << 20)


def test_a_failing_child_is_a_clear_error(cnn):
    with pytest.raises(RuntimeError, match="engine footprint of 'nope'"):
        FP.measure_engine_bytes(cnn, "nope", 1)


def test_profile_records_and_reuses_engine_footprints(cnn, tmp_path, monkeypatch):
    from port.cost.measure import profile_with_report
    monkeypatch.setenv("PORT_PROFILE_ENGINE", "1")
    calls = []
    real = FP.measure_engine_bytes

    def spy(graph, backend, threads, **kw):
        calls.append(backend)
        return real(graph, backend, threads, **kw)
    monkeypatch.setattr(FP, "measure_engine_bytes", spy)
    kw = dict(blocks=1, block_ms=1, warmup_ms=1, variants=("plain",), program_order=False, calibrate_peaks=False,
              handoff=False)
    p, rep = profile_with_report(cnn, "host", **kw)
    assert sorted(calls) == ["c", "torch-cpu"]
    eng = dict(p.engine_bytes)
    assert set(eng) == {"cpu-c", "cpu-torch"} and eng["cpu-torch"] > eng["cpu-c"]
    assert any("engine footprint" in n for n in rep.notes)
    path = save_profile(p, tmp_path / "p.json")
    back = load_profile(path)
    assert back.engine_bytes == p.engine_bytes and back.digest() == p.digest()
    # a cache measured on this graph: no new child
    calls.clear()
    p2, _ = profile_with_report(cnn, "host", cache=path, **kw)
    assert calls == [] and p2.engine_bytes == p.engine_bytes
    # switched off: none recorded, and a note says so
    monkeypatch.setenv("PORT_PROFILE_ENGINE", "0")
    p3, rep3 = profile_with_report(cnn, "host", **kw)
    assert p3.engine_bytes == () and any("PORT_PROFILE_ENGINE=0" in n for n in rep3.notes)


def test_engine_footprints_are_measured_past_the_timing_budget(cnn, monkeypatch):
    """A spent timing budget leaves entries modeled, not the engines' footprints: without one a plan puts ops on
    that engine for free (bench/e2e.py's CNN profiles ran out of time and their 50% plans grew the process by
    libtorch's code pages beyond the budget)."""
    from port.cost.measure import profile_with_report
    monkeypatch.setenv("PORT_PROFILE_ENGINE", "1")
    monkeypatch.setattr(FP, "measure_engine_bytes",
                        lambda g, backend, threads, **kw: {"engine_bytes": 4096 * (3 if backend == "c" else 9),
                                                           "steps": 1, "anon_bytes": 0, "file_bytes": 0})
    p, rep = profile_with_report(cnn, "host", max_time_s=0.0, blocks=1, block_ms=1, warmup_ms=1,
                                 variants=("plain",), program_order=False, calibrate_peaks=False, handoff=False)
    assert rep.measured == 0 and rep.budget_modeled > 0
    assert dict(p.engine_bytes) == {"cpu-c": 3 * 4096, "cpu-torch": 9 * 4096}


def test_engine_bytes_in_the_file_format_are_validated(cnn):
    from port.cost.roofline import modeled_profile
    from port.config import load_device
    p = modeled_profile(cnn, load_device("host"))
    assert p.engine_bytes == ()
    d0 = profile_to_dict(p)
    assert d0["engine_bytes"] == {}
    d = {k: v for k, v in d0.items() if k not in ("sha256", "engine_bytes")}    # files written before it existed
    assert profile_from_dict(d).engine_bytes == () and profile_from_dict(d).digest() == p.digest()
    q = dataclasses.replace(p, engine_bytes=(("cpu-torch", 123),))
    assert q.digest() != p.digest() and q.engine_bytes_of("cpu-torch") == 123 and q.engine_bytes_of("cpu-c") == 0
    for bad, msg in (({"gpu9": 1}, "names accelerator 'gpu9'"), ({"cpu-c": -1}, "engine_bytes.cpu-c"),
                     ({"cpu-c": "1MB"}, "expected an integer"), ([1], "should be an object")):
        d = {k: v for k, v in d0.items() if k != "sha256"}
        d["engine_bytes"] = bad
        with pytest.raises(ProfileError, match=msg):
            profile_from_dict(d)
