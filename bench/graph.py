"""Graph accounting against PyTorch, and CLI start-up time.

    python bench/graph.py [--quick]

For every zoo model: forward/backward FLOPs against FlopCounterMode (with the upstream grouped-conv fix,
pytorch/pytorch#183405), saved-activation bytes against autograd's saved-tensor hooks, and trace time;
then `port --help` wall time (median of 7 runs). Last line: the headline.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

import torch  # noqa: E402

import port  # noqa: E402
from port import models
from reference import flop_counts, saved_activation_bytes  # noqa: E402
from _results import write_section  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    batch = 2 if args.quick else 8
    rows = []
    worst = 0.0
    for name in (n for n in models.names() if n not in models.TOKEN_DATA):   # transformers: bench/transformers.py
        kw = {"dropout": 0.0} if name in ("mlp", "mobilenetv2") else {}
        m = models.get(name, seed=0, **kw)
        x = torch.randn(batch, *models.INPUT_SHAPES[name])
        t = time.perf_counter()
        g = port.trace(m, x, name=name)
        trace_s = time.perf_counter() - t
        fwd, bwd = flop_counts(m, x)
        saved = saved_activation_bytes(m, x)
        tot = g.totals()
        r = (tot["forward_flops"] / fwd, tot["backward_flops"] / bwd, tot["naive_peak_activation_bytes"] / saved)
        worst = max(worst, *(abs(v - 1) for v in r))
        rows.append(f"| {name} | {len(g.ops)} | {r[0]:.4f} | {r[1]:.4f} | {r[2]:.4f} | {trace_s * 1e3:.0f} |")
        print(rows[-1], flush=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    times = []
    for _ in range(7):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "port.cli", "--help"], capture_output=True, env=env, check=True)
        times.append(time.perf_counter() - t)
    help_s = statistics.median(times)
    body = (f"`python bench/graph.py{' --quick' if args.quick else ''}` (batch {batch}). Ratios are PORT's graph "
            "over PyTorch's own accounting (FlopCounterMode with the grouped-conv weight-gradient fix of "
            "pytorch/pytorch#183405; unique storage bytes seen by `saved_tensors_hooks`, dropout disabled "
            "because PORT's mask is 1 byte/element where torch's CPU dropout keeps a float32 mask).\n\n"
            "| model | ops | fwd FLOPs ratio | bwd FLOPs ratio | saved bytes ratio | trace ms |\n|---|---|---|---|---|---|\n"
            + "\n".join(rows) + f"\n\n`port --help` wall time (fresh interpreter, median of 7): {help_s * 1e3:.0f} ms "
            "(target < 300 ms).\n")
    head = (f"HEADLINE graph: worst |ratio-1| over zoo = {worst:.4f} (target <= 0.01 FLOPs, <= 0.05 bytes); "
            f"port --help {help_s * 1e3:.0f} ms (target < 300 ms)")
    write_section("Graph", body + "\n" + head + "\n")   # the headline last: bench/headlines.py reads it there
    print(head)


if __name__ == "__main__":
    main()
