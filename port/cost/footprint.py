"""Engine footprints: the resident memory an execution engine keeps once a training step ran its kernels.

A plan that runs one op through PyTorch's CPU kernels pays more than that op's temporaries: the process maps
and touches libtorch's and oneDNN's code for that kernel, oneDNN caches a primitive (and reordered weights)
per convolution shape, and glibc keeps the freed temporaries' heap. None of it is in the arena, none of it is
a per-call temporary (``OpCost.peak_delta_bytes``), and it stays for the whole run: measured on MobileNetV2 at
batch 8 (2026-11-24), a 50%-budget plan with 149 of its 580 ops on ``cpu-torch`` grew the process by 30 MiB
beyond its arena during steps, the same plan with every op on the C kernels by 1.3 MiB.

:func:`measure_engine_bytes` measures it per accelerator, in a fresh Python process (this one has run every
kernel already while profiling): the graph's default plan for that accelerator's backend (every op on it)
is lowered, its arena written once, then ``STEPS`` training steps run; the footprint is the process's
resident memory (VmRSS: anonymous and file-backed pages) at the steps' peak (VmHWM, reset before them) or
after them, whichever is larger, minus before them. The peak includes the largest op's temporaries, which
the profile also prices per op (``peak_delta_bytes``): an overestimate by that much, kept because a mixed
plan's heap fragments more than the all-one-engine plan's (MobileNetV2 at batch 8, 2026-11-24: 173 ops on
torch grew steps by 55 MB where the all-torch plan's steady state kept 47.8). It is an upper
bound for plans that run only some ops there. The profile records it (``Profile.engine_bytes``); the
simulator and the ILP charge it once per accelerator a plan uses (port.plan.semantics.engine_bytes).

Only engines that work in host memory are measured (backends ``c`` and ``torch-cpu``); PORT_PROFILE_ENGINE=0
skips the measurement (the test suite's quick profiles do; the engines then cost nothing in plans). A spent
timing budget (``max_time_s``) does not: an engine priced at nothing is an engine the ILP uses for free.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from port.ir.types import Graph

HOST_BACKENDS = ("c", "torch-cpu")
STEPS = 3
TIMEOUT_S = 600.0


def enabled() -> bool:
    return os.environ.get("PORT_PROFILE_ENGINE", "1").strip().lower() not in ("0", "false", "no", "off")


def measure_engine_bytes(graph: Graph, backend: str, threads: int, seed: int = 0,
                         timeout_s: float = TIMEOUT_S) -> dict[str, int]:
    """{"engine_bytes", "anon_bytes", "file_bytes", "arena_bytes", "steps"} for ``backend`` running ``graph``'s
    default plan in a fresh process (see the module docstring). Raises RuntimeError with the child's error."""
    req = json.dumps({"graph": graph.to_dict(), "backend": backend, "threads": int(threads), "seed": int(seed)})
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    p = subprocess.run([sys.executable, "-m", "port.cost.footprint"], input=req, capture_output=True, text=True,
                       timeout=timeout_s, env=env)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"engine footprint of {backend!r}: child exited {p.returncode}: {' | '.join(tail)}")
    return json.loads(lines[-1])


def _child(req: dict[str, Any]) -> dict[str, int]:
    from port.exec import capi
    from port.train.memwatch import release_freed_heap, reset_peak, status_bytes
    capi.configure_openmp_env()
    import torch

    from port.cost.runners import get_runner
    from port.exec.executor import Executor
    from port.lower.lower import default_plan, lower

    threads, backend = int(req["threads"]), str(req["backend"])
    torch.set_num_threads(max(1, threads))
    graph = Graph.from_dict(req["graph"])
    plan = default_plan(graph, backend)
    prog = lower(graph, plan, check_digest=False)
    runner = get_runner(backend, graph, threads, seed=int(req.get("seed", 0)))
    ex = Executor(prog)
    ex.state.opt, ex.state.step = runner.state.opt, runner.state.step
    gen = torch.Generator().manual_seed(int(req.get("seed", 0)))
    ex.arena.zero_()                      # every arena page resident before the baseline
    ex.input.copy_(torch.randn(ex.input.shape, generator=gen).to(ex.input.dtype)
                   if ex.input.dtype.is_floating_point else torch.zeros(ex.input.shape, dtype=ex.input.dtype))
    if ex.labels is not None:
        ex.labels.copy_(torch.randint(0, graph.tensors[graph.logits_id].shape[-1], ex.labels.shape, generator=gen))
    release_freed_heap()
    s0 = status_bytes()
    reset = reset_peak() and status_bytes().get("VmHWM", 1 << 62) <= s0["VmRSS"] + (1 << 20)
    for _ in range(STEPS):
        ex.zero_grads()
        ex.run_main()
        if ex.labels is not None:
            float(ex.loss)
        ex.run_updates()
    import gc
    gc.collect()
    s1 = status_bytes()
    top = s1.get("VmHWM", 0) if reset else 0    # the steps' peak: temporaries the engine frees but glibc keeps
    return {"engine_bytes": max(0, max(s1["VmRSS"], top) - s0["VmRSS"]), "rss_after_bytes": s1["VmRSS"] - s0["VmRSS"],
            "anon_bytes": s1.get("RssAnon", 0) - s0.get("RssAnon", 0),
            "file_bytes": s1.get("RssFile", 0) - s0.get("RssFile", 0),
            "arena_bytes": int(prog.arena_bytes), "steps": STEPS}


if __name__ == "__main__":
    out = _child(json.loads(sys.stdin.read()))
    sys.stdout.write(json.dumps(out) + "\n")
