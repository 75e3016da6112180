"""One budget rule (port.solver.budget) for every path: `port solve/train/compile` (port.pipeline.resolve_budget)
and `port.solve(graph, profile)` agree. No budget means the device's memory: the device description's when the
caller has one (a profile file measured under an earlier description records another figure), else the one the
profile records. Before, the pipeline took the profile's figure first and the device's only when it was 0, and
port.solve refused a profile without one."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from port.config import load_device
from port.cost.roofline import modeled_profile
from port.errors import ConfigError


@pytest.fixture(scope="module")
def graph():
    import torch
    import torch.nn as nn

    from port.ir.trace import trace
    torch.manual_seed(0)
    return trace(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)), torch.randn(4, 8))


def _job(device, budget=None):
    from port.pipeline import Job
    return Job(config=None, config_path=None, device=device, profile_path=Path("p.json"), profile_explicit=False,
               budget=budget, budget_origin="test", search_dirs=())


def test_no_budget_is_the_device_descriptions_memory_on_every_path(graph):
    from port.pipeline import resolve_budget
    from port.solver.budget import budget_bytes
    dev = load_device("host")
    stale = replace(modeled_profile(graph, dev), memory_bytes=3 * dev.memory)   # measured under an older yaml
    assert budget_bytes(None, graph, stale, dev) == dev.memory
    bud = resolve_budget(_job(dev), graph, stale)
    assert bud.bytes == dev.memory and bud.spec is None and bud.keep_everything_peak > 0
    # without a device (port.solve), the figure the profile records
    assert budget_bytes(None, graph, stale) == 3 * dev.memory


def test_port_solve_and_the_pipeline_give_one_budget(graph):
    import port
    from port.pipeline import resolve_budget
    dev = load_device("host")
    prof = modeled_profile(graph, dev)
    for spec in (None, "100%", "250%", 10**7):
        bud = resolve_budget(_job(dev, spec), graph, prof)
        plan = port.solve(graph, prof, spec, solver="greedy")
        assert plan.budget_bytes == bud.bytes, spec


def test_no_budget_and_no_memory_known_names_the_fix(graph):
    import port
    from port.solver.budget import budget_bytes
    dev = load_device("host")
    prof = replace(modeled_profile(graph, dev), memory_bytes=0)
    with pytest.raises(ConfigError, match="memory_bytes.*64MB or 75%"):
        port.solve(graph, prof, solver="greedy")
    assert budget_bytes(None, graph, prof, dev) == dev.memory      # the device description knows it
    with pytest.raises(ConfigError, match="budget 'lots'"):
        budget_bytes("lots", graph, prof, dev)


def test_percentages_keep_the_engine_footprint():
    from port.solver.budget import to_bytes
    assert to_bytes("50%", 1000, None, engine_bytes=400) == 700
    assert to_bytes("100%", 1000, None, engine_bytes=400) == 1000
    assert to_bytes(123, 1000, None, engine_bytes=400) == 123
    with pytest.raises(ConfigError):
        to_bytes(None, 1000, 0)
