"""Where a PORT training step's time goes, per kernel family (issue 14).

For each model and batch, PORT's default all-C plan (``Trainer(model, x, backend="c")``) runs instrumented steps
(``Trainer.profile_step``: every kernel call timed, in program order) and the per-call times are summed by family:
conv forward (plain and the fused conv+bn+relu), conv input gradient, conv weight gradient (each split into
depthwise and the rest), batch-norm forward/backward, activations and their gradients, pooling, linear, loss,
gradient accumulation and the optimizer update. Median of the instrumented steps; the wall time of plain steps
(``trainer.step``) is reported beside it.

    python bench/families.py [--quick] [--models resnet18,mobilenetv2] [--batches 8,32] [--no-write]

Writes the `## Kernel families` section of bench/RESULTS.md; the last line is the headline.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [str(ROOT)] + [q for q in sys.path if Path(q or ".").resolve() != ROOT / "bench"] + [str(ROOT / "bench")]
import _results  # noqa: E402  (now: importing torch rebuilds sys.path without bench/; later imports find it loaded)

import port  # noqa: E402  (first: PORT's OpenMP wait policy is set before torch loads the runtime)
from port.exec import capi  # noqa: E402
import torch  # noqa: E402

FAMILIES = ("conv fwd", "conv fwd (depthwise)", "conv grad input", "conv grad input (depthwise)",
            "conv grad weight", "conv grad weight (depthwise)", "batch norm fwd", "batch norm bwd",
            "activation fwd", "activation bwd", "pool", "linear", "loss", "add / grad accumulate", "update", "other")


def family(call: dict, graph) -> str:
    k = call["kernel"]
    dw = False
    if k.startswith("conv2d"):
        op = graph.ops[call["op"]] if isinstance(call.get("op"), int) else None
        if op is not None:
            fwd = graph.ops[op.forward_op] if getattr(op, "forward_op", None) is not None else op
            g = dict(fwd.attrs).get("groups", 1)
            dw = g > 1 and g == graph.tensors[fwd.inputs[0]].shape[1]
    suffix = " (depthwise)" if dw else ""
    if k in ("conv2d", "conv2d_bn_relu"):
        return "conv fwd" + suffix
    if k == "conv2d.grad_input":
        return "conv grad input" + suffix
    if k == "conv2d.grad_weight":
        return "conv grad weight" + suffix
    if k.startswith("batch_norm2d"):
        return "batch norm fwd" if k == "batch_norm2d" else "batch norm bwd"
    if k in ("relu", "relu6", "hardswish", "dropout"):
        return "activation fwd"
    if k.endswith(".grad_input") and k.split(".")[0] in ("relu", "relu6", "hardswish", "dropout"):
        return "activation bwd"
    if "pool" in k:
        return "pool"
    if k.startswith("linear"):
        return "linear"
    if k.startswith("cross_entropy"):
        return "loss"
    if k in ("add", "grad_accumulate"):
        return "add / grad accumulate"
    if k == "update":
        return "update"
    return "other"


def measure(name: str, batch: int, steps: int) -> dict:
    model = port.models.get(name, seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *port.models.INPUT_SHAPES[name], generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    tr = port.Trainer(model, x, optimizer=port.optim.SGD(0.01, momentum=0.9), backend="c")
    for _ in range(2):
        tr.step(x, y)
    fam = collections.defaultdict(list)
    tot = []
    for _ in range(steps):
        r = tr.profile_step(x, y)
        d = collections.defaultdict(float)
        for c in r["calls"]:
            d[family(c, tr.graph)] += c["ms"]
        for f in FAMILIES:
            fam[f].append(d.get(f, 0.0))
        tot.append(r["step_ms"])
    wall = []
    for _ in range(steps):
        t0 = time.perf_counter()
        tr.step(x, y)
        wall.append((time.perf_counter() - t0) * 1e3)
    return {"fam": {f: statistics.median(v) for f, v in fam.items()}, "kernels_ms": statistics.median(tot),
            "wall_ms": statistics.median(wall), "engine": getattr(tr, "engine", "?")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default="resnet18,vgg11,mobilenetv2")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    capi.set_num_threads(a.threads)
    torch.set_num_threads(a.threads)
    steps = 3 if a.quick else 7
    t0, load0 = time.time(), os.getloadavg()[0]
    cols, res = [], {}
    for b in [int(v) for v in a.batches.split(",")]:
        for name in a.models.split(","):
            res[(name, b)] = measure(name, b, steps)
            cols.append((name, b))
            print(f"{name} b{b}: kernels {res[(name, b)]['kernels_ms']:.1f} ms, step {res[(name, b)]['wall_ms']:.1f} ms",
                  flush=True)
    hdr = "| family | " + " | ".join(f"{n} b{b} ms (%)" for n, b in cols) + " |"
    lines = [hdr, "|" + "---|" * (len(cols) + 1)]
    for f in FAMILIES:
        if all(res[c]["fam"][f] == 0.0 for c in cols):
            continue
        cells = []
        for c in cols:
            v, t = res[c]["fam"][f], res[c]["kernels_ms"]
            cells.append(f"{v:.1f} ({100 * v / t:.0f}%)")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    lines.append("| **sum of kernel calls** | " + " | ".join(f"{res[c]['kernels_ms']:.1f}" for c in cols) + " |")
    lines.append("| plain step (wall) | " + " | ".join(f"{res[c]['wall_ms']:.1f}" for c in cols) + " |")
    conv = {c: sum(v for f, v in res[c]["fam"].items() if f.startswith("conv")) / res[c]["kernels_ms"] for c in cols}
    top = {c: max(res[c]["fam"], key=res[c]["fam"].get) for c in cols}
    head = ("families: conv share of kernel time " + ", ".join(f"{n} b{b} {100 * conv[(n, b)]:.0f}%" for n, b in cols)
            + "; largest family " + ", ".join(f"{n} b{b} {top[(n, b)]}" for n, b in cols))
    from _results import machine_line, publish
    text = "\n".join([
        machine_line("python bench/families.py" + (" --quick" if a.quick else ""), t0, load0), "",
        f"PORT's default all-C plan (`Trainer(model, x, backend=\"c\")`, SGD momentum, {a.threads} threads); per-call "
        f"times of {steps} instrumented steps (`Trainer.profile_step`) summed per kernel family, median over the "
        "steps (ms and share of the summed kernel time); the fused conv+bn+relu forward is booked as conv forward. "
        "The last row is the median wall time of plain `trainer.step` calls.", "", *lines, "", head])
    publish("Kernel families", text, write=not a.no_write)


if __name__ == "__main__":
    main()
