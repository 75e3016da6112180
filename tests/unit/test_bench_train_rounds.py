"""bench/train.py's driver (pure, with stand-in workers): blocks of consecutive steps alternate between the
implementations, who goes first rotates, a block's first step (beside the previous worker's spinning OpenMP
threads) is never timed, and the warm-up is whole untimed rounds."""
import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "train.py"


def _train_module():
    spec = importlib.util.spec_from_file_location("bench_train", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeWorker:
    """Answers "steps k" with k step times: a block's first step costs `first`, the others `step`."""

    def __init__(self, name, log, step=0.01, first=0.05):
        self.name, self.log, self.step, self.first, self.error = name, log, step, first, None

    def steps(self, k):
        self.log.append((self.name, k))
        return {"t": [self.first] + [self.step] * (k - 1), "c": [0.0] * k, "n": 2}


def test_rounds_time_blocks_without_their_first_step():
    tr = _train_module()
    log = []
    order = ("torch", "torchp", "port")
    W = {n: FakeWorker(n, log) for n in order}
    rec = tr._rounds(W, order, warmup=2, steps=12, max_s=60.0, block=4)
    # 2 warm-up rounds, then rounds of 3 timed steps each until every worker has 12: 4 timed rounds
    assert len(log) == 3 * (2 + 4) and all(k == 4 for _, k in log)
    for n in order:
        assert len(rec[n]) == 12 and all(o["t"] == 0.01 for o in rec[n])     # no block's first step
    firsts = [log[3 * r][0] for r in range(6)]
    assert firsts == ["torch", "torchp", "port", "torch", "torchp", "port"]  # who goes first rotates


def test_single_step_blocks_time_every_step_and_need_three_rounds():
    tr = _train_module()
    log = []
    W = {n: FakeWorker(n, log, first=0.02) for n in ("torch", "port")}
    rec = tr._rounds(W, ("torch", "port"), warmup=1, steps=1, max_s=60.0, block=1)
    assert all(len(v) == 3 for v in rec.values())        # at least 3 timed rounds
    assert all(o["t"] == 0.02 for v in rec.values() for o in v)


def test_block_size_lasts_the_block_time_and_is_capped():
    tr = _train_module()
    log = []
    slow = {n: FakeWorker(n, log, step=0.5, first=1.0) for n in ("torch", "port")}
    assert tr._block_size(slow, ("torch", "port")) == 2
    fast = {n: FakeWorker(n, log, step=1e-4, first=1.0) for n in ("torch", "port")}   # a cold first step
    assert tr._block_size(fast, ("torch", "port")) == tr.MAX_BLOCK
