"""bench/e2e.py's memory figures (issue 12): the steps' memory is the arena's pages set-up writes (the weights: the
CPU arena is an anonymous mapping, resident as written) plus what the steps add beyond the set-up (the rest of the
arena as it is first written, anything outside it), held against the plan's peak; the total growth from before Trainer(...) is held against the budget plus
the fixed runtime allowance. Pure arithmetic on a worker's record: no worker runs here."""
import pytest

MB = 1 << 20


@pytest.fixture(scope="module")
def e2e(bench_e2e):
    return bench_e2e


def _figures(e2e, arena_mb, sim_peak_mb, setup_mb, steps_mb, budget_mb, weights_mb=8.0):
    pre = 300 * MB
    p = {"param_bytes": int(weights_mb * MB), "buffer_bytes": 0, "pre": pre,
         "setup_hwm": pre + int(setup_mb * MB), "peak": pre + int((setup_mb + steps_mb) * MB)}
    d = {"arena": int(arena_mb * MB), "arena_all": int(arena_mb * MB), "sim_peak": int(sim_peak_mb * MB),
         "p_growth": p["peak"] - pre, "p_steps": int(steps_mb * MB), "budget": int(budget_mb * MB)}
    return e2e._memory_figures(d, p, 200 * MB)


def test_steps_memory_is_arena_plus_growth_during_steps(e2e):
    # set-up: the weights (8) and its objects; steps: the other 45 MiB of the arena's pages and 2 MiB more
    f = _figures(e2e, arena_mb=53.0, sim_peak_mb=54.6, setup_mb=17.0, steps_mb=47.0, budget_mb=55.0)
    assert f["mem_steps"] == 55 * MB
    assert f["mem_plan"] == int(54.6 * MB)
    assert f["mem_vs_arena_ok"]                       # 55 <= 54.6 * 1.02 + 4
    assert f["mem_total"] == 64 * MB
    assert f["mem_vs_budget_ok"] == (64 <= 55 + e2e.RUNTIME_OVERHEAD_MIB)
    assert f["mem_overhead"] == (64 + 8 - 53) * MB     # growth + weights - arena
    assert f["mem_vs_eager"] == pytest.approx(64 / 200)


def test_steps_allocating_outside_the_arena_miss_the_target(e2e):
    # a torch op's temporaries or glibc's retained heap: 8 MiB beyond the set-up during steps, unpriced
    f = _figures(e2e, arena_mb=53.0, sim_peak_mb=54.6, setup_mb=17.0, steps_mb=53.0, budget_mb=55.0)
    assert not f["mem_vs_arena_ok"]
    parts = e2e.memory_headline_parts([dict(f, **{"frac": 0.25, "budget": 55 * MB})])
    assert "NOT met (1)" in parts[0]


def test_total_growth_beyond_the_runtime_allowance_misses(e2e):
    over = 55.0 + e2e.RUNTIME_OVERHEAD_MIB + 1
    f = _figures(e2e, arena_mb=53.0, sim_peak_mb=54.6, setup_mb=over - 1.0, steps_mb=1.0, budget_mb=55.0)
    assert f["mem_vs_arena_ok"] and not f["mem_vs_budget_ok"]
