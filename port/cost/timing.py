"""Timing: warm-up, repeated blocks spread in time (round-robin over entries), median and spread.

Traps handled (see DESIGN.md "Capture and profiling"): the thread count is fixed by the runner and
recorded; each entry's blocks are interleaved with every other entry's (a slow minute hurts all entries a
little instead of one entry a lot); grad mode is never touched outside ``torch.no_grad`` blocks inside
the prepared callables; sync happens once per block (the device's queue drains like in a real step).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class TimingTask:
    key: tuple                       # (signature, accelerator, variant)
    run: Callable[[], Any]
    sync: Callable[[], None]
    reps: int = 1                    # runs per block (set by warm-up)
    block_ms: list[float] = field(default_factory=list)   # mean ms per run, one per block
    warm: bool = False
    warm_ms: float = 0.0             # warm-up's clean estimate (ms per run, its last runs)


def warm_up(task: TimingTask, warmup_ms: float, target_block_ms: float, max_reps: int = 100000) -> float:
    """Run until ``warmup_ms`` have passed (at least 2 runs); set ``task.reps``; return ms per run."""
    t0 = time.perf_counter()
    n = 0
    while True:
        out = task.run()
        del out
        n += 1
        if n >= 2:
            task.sync()
            el = (time.perf_counter() - t0) * 1e3
            if el >= warmup_ms or n >= max_reps:
                break
    # a clean estimate after the caches are warm
    t1 = time.perf_counter()
    m = max(1, min(n, 3))
    for _ in range(m):
        task.run()
    task.sync()
    per = max((time.perf_counter() - t1) * 1e3 / m, 1e-5)
    task.reps = int(min(max_reps, max(1, math.ceil(target_block_ms / per))))
    task.warm, task.warm_ms = True, per
    return per


def time_block(task: TimingTask) -> float:
    """One block: ``reps`` runs back to back, one sync; appends and returns ms per run."""
    run, reps = task.run, task.reps
    task.sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        run()
    task.sync()
    ms = (time.perf_counter() - t0) * 1e3 / reps
    task.block_ms.append(ms)
    return ms


ISSUE_SAMPLES = 7


def time_issue(task: TimingTask, samples: int = ISSUE_SAMPLES) -> float:
    """A queued engine's call: the host's time to issue one run on an idle queue (``run`` returns once its kernels
    are enqueued), ms, the median of ``samples`` (each between two syncs). Its ``block_ms`` are runs back to back
    (issue and device work overlap there: their time is the queue's); this is what the host thread itself spends
    per call (ResNet-8 b8 on PoCL, split host, 2026-11-29: a weight gradient's im2col + GEMM 0.31 ms, an SGD
    update 0.09 ms, 0.10 and 0.025 with the kernels' arguments kept set between runs, port.exec.backends.opencl)."""
    out = []
    for _ in range(max(1, samples)):
        task.sync()
        t0 = time.perf_counter()
        task.run()
        out.append((time.perf_counter() - t0) * 1e3)
    task.sync()
    return statistics.median(out)


def summarize(samples: list[float]) -> tuple[float, float]:
    """(median, p75 - p25) of block means."""
    if not samples:
        return float("nan"), 0.0
    med = statistics.median(samples)
    if len(samples) < 2:
        return med, 0.0
    qs = statistics.quantiles(samples, n=4, method="inclusive")
    return med, max(0.0, qs[2] - qs[0])


def time_callable(run: Callable[[], Any], sync: Callable[[], None] = lambda: None, blocks: int = 5,
                  block_ms: float = 20.0, warmup_ms: float = 10.0) -> tuple[float, float, int]:
    """Time one callable (not interleaved): (median ms, spread ms, blocks)."""
    t = TimingTask(("",), run, sync)
    warm_up(t, warmup_ms, block_ms)
    for _ in range(blocks):
        time_block(t)
    med, spread = summarize(t.block_ms)
    return med, spread, len(t.block_ms)
