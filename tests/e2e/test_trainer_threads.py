"""Trainer(threads=...): a fixed count, "auto" (the step-time governor) and bad values."""
import pytest
import torch

from port import models
from port.errors import PortError
from port.exec import kernels as K
from port.train.optim import SGD
from port.train.trainer import Trainer


@pytest.fixture
def two_threads():
    """Kernel threads at 2 for the test, the previous count restored afterwards."""
    prev = K.get_num_threads()
    K.set_num_threads(2)
    yield
    K.set_num_threads(prev)


def _data(b=8):
    g = torch.Generator().manual_seed(0)
    return torch.randn(b, *models.INPUT_SHAPES["digits_cnn"], generator=g), torch.randint(0, 10, (b,), generator=g)


def test_fixed_count_and_bad_values(two_threads):
    x, _ = _data()
    Trainer(models.get("digits_cnn", seed=0), x, optimizer=SGD(0.05), threads=1)
    assert K.get_num_threads() == 1
    for bad in (0, -2, "many", 1.5, True):
        with pytest.raises(PortError, match="threads="):
            Trainer(models.get("digits_cnn", seed=0), x, threads=bad)


def test_auto_trains_like_a_fixed_count_and_records_its_decisions(two_threads):
    x, y = _data()
    fixed = Trainer(models.get("digits_cnn", seed=0), x, optimizer=SGD(0.05))
    auto = Trainer(models.get("digits_cnn", seed=0), x, optimizer=SGD(0.05), threads="auto")
    a = [fixed.step(x, y) for _ in range(20)]
    b = [auto.step(x, y) for _ in range(20)]
    assert b[-1] < b[0]
    assert b == pytest.approx(a, rel=1e-4)          # thread counts change only the low bits
    ev = auto.thread_events
    g = auto._governor
    assert ev and ev[0].step == g.warmup + g.first_probe and ev[0].why == "probe"   # warm-up steps are no evidence
    assert K.get_num_threads() in (1, 2)
    auto.set_threads(None)                           # governor off: the count stays as it is
    assert auto.thread_events == [] and auto._governor is None


def test_profile_step_runs_at_the_settled_count_not_a_probe(two_threads):
    x, y = _data()
    tr = Trainer(models.get("digits_cnn", seed=0), x, optimizer=SGD(0.05), threads="auto")
    g = tr._governor
    while g.current == g.home:        # run until a probe of another count is under way
        tr.step(x, y)
    assert K.get_num_threads() == g.current == 1
    seen = []
    real = K.get_num_threads
    tr._profile_step = lambda *a: seen.append(real()) or {}
    tr.profile_step(x, y)
    assert seen == [g.home] == [2] and K.get_num_threads() == 1    # the probe goes on afterwards


def test_a_rejected_batch_is_no_timing_evidence(two_threads):
    x, y = _data()
    tr = Trainer(models.get("digits_cnn", seed=0), x, optimizer=SGD(0.05), threads="auto")
    with pytest.raises(PortError):
        tr.step(x[:3], y[:3])             # wrong batch size: refused before any kernel runs
    assert tr._governor.steps == 0
    tr.step(x, y)
    assert tr._governor.steps == 1
