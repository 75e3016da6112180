"""port.exec.threads.ThreadGovernor: the thread count a training loop runs with, from its own step times. The
decision is pure, so these feed it synthetic step times of a machine that gets busy and quiet again."""
import pytest

from port.exec.threads import ThreadGovernor

# step ms per thread count: quiet, 2 threads are fastest; with a busy process beside them the 2-thread steps
# stall at every barrier (measured on a 2-vCPU VM: 55 -> 224 ms) while 1 thread barely changes (94 -> 96 ms)
QUIET = {2: 55.0, 1: 94.0}
LOADED = {2: 224.0, 1: 96.0}


def _drive(g: ThreadGovernor, times: dict, steps: int) -> list[int]:
    used = []
    n = g.current
    for _ in range(steps):
        used.append(n)
        n = g.record(times[n])
    return used


def test_quiet_machine_keeps_all_threads_and_probes_once():
    """At the largest count each other count is probed once after the warm-up; then only a slowdown probes."""
    g = ThreadGovernor(2)
    used = _drive(g, QUIET, 300)
    assert g.home == 2 and used[-1] == 2
    assert used.count(1) == g.probe_steps
    assert [e.why for e in g.events] == ["probe", "kept"] and g.events[0].step == g.warmup + g.first_probe


def test_a_small_net_faster_on_one_thread_stays_there_and_probes_back():
    """A net too small for two threads (faster on one even when quiet): the first probe moves it, and probes of
    two threads go on at doubling intervals below the largest count."""
    g = ThreadGovernor(2)
    used = _drive(g, {2: 2.0, 1: 1.5}, 300)
    assert g.home == 1
    assert [e.why for e in g.events[:2]] == ["probe", "faster"]
    probes = [e for e in g.events if e.why == "probe" and e.to_threads == 2]
    assert 3 <= len(probes) <= 2 + 300 // g.probe_every and g.interval == g.probe_every
    assert used[-g.probe_every:].count(2) <= g.probe_steps


def test_load_moves_to_fewer_threads_and_back_when_it_ends():
    g = ThreadGovernor(2)
    _drive(g, QUIET, 40)
    loaded = _drive(g, LOADED, 60)
    assert g.home == 1
    switched = next(i for i, e in enumerate(g.events) if e.why == "faster")
    assert g.events[switched].to_threads == 1
    assert loaded[-20:].count(1) >= 16                   # settled: only probes run 2 threads
    first_one = loaded.index(1)
    assert first_one <= 8                                 # the slowdown is noticed within a few steps
    quiet = _drive(g, QUIET, 80)
    assert g.home == 2 and quiet[-8:].count(2) >= 6


def test_single_thread_machine_never_changes():
    g = ThreadGovernor(1)
    assert g.candidates == [1]
    assert set(_drive(g, {1: 10.0}, 50)) == {1} and not g.events


def test_noise_does_not_flip_between_equal_counts():
    g = ThreadGovernor(4)
    assert g.candidates == [4, 2, 1]
    _drive(g, {4: 30.0, 2: 50.0, 1: 90.0}, 200)
    assert g.home == 4
    assert {e.to_threads for e in g.events if e.why == "probe"} == {2, 1}   # both others are tried


def test_bad_max_threads():
    with pytest.raises(ValueError, match="max_threads"):
        ThreadGovernor(0)
