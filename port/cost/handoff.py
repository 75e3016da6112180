"""Hand-off cost between present accelerators, measured over tensor sizes and fitted as
latency + bytes / bandwidth (least squares). CPU engines sharing memory (C kernels, torch-cpu) hand
over zero-copy: only the pointer hand-over is timed (bandwidth = inf). The opencl engine on unified memory hands
over as the executor does (port.exec.handoff): to the host, a queued kernel on the tensor and the wait for it;
from the host, nothing to wait for (bandwidth = inf either way: no bytes move). A queued engine's join (Plan.joins)
is measured apart (:func:`measure_joins`): the wait on a queue that has drained, not on a busy one."""
from __future__ import annotations

import math
import statistics

from port.config import DeviceConfig
from port.cost.types import HandoffCost, MODELED_JOIN_MS
from port.cost.timing import time_callable

CPU_BACKENDS = ("c", "torch-cpu")
SIZES = (4 << 10, 256 << 10, 4 << 20, 32 << 20)
QUICK_SIZES = (4 << 10, 1 << 20, 8 << 20)


def fit_latency_bandwidth(sizes: list[int], ms: list[float]) -> tuple[float, float]:
    """Least-squares ms = a + b * bytes -> (latency_ms >= 0, bytes_per_ms; inf if b <= 0)."""
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(ms) / n
    sxx = sum((x - mx) ** 2 for x in sizes)
    b = sum((x - mx) * (y - my) for x, y in zip(sizes, ms)) / sxx if sxx else 0.0
    a = my - b * mx
    if b <= 0:
        return max(0.0, min(ms)), math.inf
    return max(0.0, a), 1.0 / b


def backend_memory(backend: str) -> str:
    """The memory a backend's kernels read and write (a torch device type). ``modeled`` engines of a device
    description run here on the C kernels (port.pipeline.stand_in_backends): host memory."""
    return {"c": "cpu", "torch-cpu": "cpu", "torch-cuda": "cuda", "torch-mps": "mps", "modeled": "cpu",
            "opencl": "cpu"}[backend]


def measure_handoff(device: DeviceConfig, present: list[str], quick: bool = False) -> list[HandoffCost]:
    """Measured hand-off costs for every ordered pair of present accelerators."""
    import torch
    out = []
    sizes = QUICK_SIZES if quick else SIZES
    accs = {a.id: a for a in device.accelerators}
    for s in present:
        for d in present:
            if s == d:
                continue
            bs, bd = accs[s].backend, accs[d].backend
            own = "own" in (accs[s].memory, accs[d].memory)
            xs, ys = [], []
            for nbytes in sizes:
                src_dev = backend_memory(bs)
                t = torch.empty(nbytes // 4, dtype=torch.float32, device=src_dev)
                if bs in CPU_BACKENDS and bd in CPU_BACKENDS:
                    # zero-copy: the receiver checks layout and takes the pointer
                    def run(t=t):
                        return t.is_contiguous() and t.data_ptr()
                    sync = lambda: None  # noqa: E731
                elif "opencl" in (bs, bd) and own:
                    from port.exec.backends.opencl import copy_probe
                    run, sync = copy_probe(t, to_host=bs == "opencl"), (lambda: None)
                elif "opencl" in (bs, bd):
                    from port.exec.backends.opencl import handoff_probe
                    run, sync = handoff_probe(t, to_host=bs == "opencl"), (lambda: None)
                else:
                    dst_dev = backend_memory(bd)
                    def run(t=t, dst_dev=dst_dev):
                        return t.to(dst_dev)
                    def sync():
                        if torch.cuda.is_available():
                            torch.cuda.synchronize()
                med, _, _ = time_callable(run, sync, blocks=3 if quick else 5, block_ms=5 if quick else 10,
                                          warmup_ms=2)
                xs.append(nbytes)
                ys.append(med)
                del t
            if bs in CPU_BACKENDS and bd in CPU_BACKENDS:
                lat, bpm = min(ys), math.inf
            elif "opencl" in (bs, bd) and not own:      # unified memory: a wait, whatever the size
                lat, bpm = statistics.median(ys), math.inf
            else:
                lat, bpm = fit_latency_bandwidth(xs, ys)
            out.append(HandoffCost(s, d, lat, bpm, True))
    return out


JOIN_SAMPLES, QUICK_JOIN_SAMPLES, JOIN_WARMUP = 400, 100, 20


def queued_accelerators(device: DeviceConfig) -> tuple[str, ...]:
    """The ids of ``device``'s engines that queue their calls (port.lower.program.QUEUED_BACKENDS)."""
    from port.lower.program import QUEUED_BACKENDS
    return tuple(a.id for a in device.accelerators if a.backend in QUEUED_BACKENDS)


def modeled_joins(device: DeviceConfig) -> dict[str, float]:
    """Per queued engine of ``device``, its join figure where none is measured: types.MODELED_JOIN_MS."""
    return {a: MODELED_JOIN_MS for a in queued_accelerators(device)}


def measure_joins(device: DeviceConfig, present: list[str], quick: bool = False) -> dict[str, float]:
    """Per present queued engine, the host's join of its drained queue in ms (its ``finish()``; median of
    JOIN_SAMPLES after JOIN_WARMUP): what a plan's ``join`` call costs once the queue's work is done (the wait
    for a busy queue is the simulator's lanes)."""
    import torch
    out = {}
    for a in queued_accelerators(device):
        if a not in present or device.accelerator(a).memory == "own":
            continue
        from port.exec.backends.opencl import join_probe
        t = torch.zeros(16, dtype=torch.float32)
        run = join_probe(t)
        for _ in range(JOIN_WARMUP):
            run()
        out[a] = statistics.median(run() for _ in range(QUICK_JOIN_SAMPLES if quick else JOIN_SAMPLES))
    return out
