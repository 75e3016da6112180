"""Grouped 3x3 convolutions (ResNeXt-50 32x4d's, RegNet's), PORT's C kernels against torch (issue 54).

Each layer at batch 8 (the Coverage table's 3x64x64 inputs: ResNeXt-50's four stages on 16x16 .. 2x2 maps, and
the stride-2 first convolutions of stages 2 and 4; two RegNet-like layers of group width 8 and 8): forward,
input gradient and weight gradient, PORT (algo auto, workspace allocated once) against F.conv2d and autograd.
The best of 15 blocks of 5 calls; --threads 1 times the calling thread's CPU time (a loaded machine does not
change it), more threads wall time.

    python bench/grouped_conv.py --threads 1
    python bench/grouped_conv.py --threads 2
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
from port.exec import capi

capi.configure_openmp_env()  # before torch loads the OpenMP runtime (PORT's wait policy)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.append(os.path.join(ROOT, "bench"))   # last: bench/profile.py shadows the stdlib module
from _results import checked_kernels  # noqa: E402

K = checked_kernels()
LAYERS = [(8, 128, 16, 32, 1), (8, 256, 16, 32, 2), (8, 256, 8, 32, 1), (8, 512, 4, 32, 1), (8, 1024, 4, 32, 2),
          (8, 48, 16, 6, 1), (8, 104, 8, 13, 2)]  # n, channels, map side, groups, stride (3x3, padding 1)


def best_ms(fn, clock, blocks=15, reps=5):
    fn()
    out = []
    for _ in range(blocks):
        s = clock()
        for _ in range(reps):
            fn()
        out.append((clock() - s) / reps * 1e3)
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    capi.set_num_threads(a.threads)
    clock = time.thread_time if a.threads == 1 else time.perf_counter
    print(f"threads {a.threads} ({'CPU time of the thread' if a.threads == 1 else 'wall'}), ms PORT / torch")
    for n, c, side, g, s in LAYERS:
        x, wt, b = torch.randn(n, c, side, side), torch.randn(c, c // g, 3, 3), torch.randn(c)
        y = F.conv2d(x, wt, b, s, 1, 1, g)
        dy = torch.randn_like(y)
        ws = torch.empty(K.conv2d_workspace_bytes(K.conv2d_params(x.shape, wt.shape, s, 1, g)) // 4 + 1)
        dw, db = torch.zeros_like(wt), torch.zeros(c)
        port = [best_ms(lambda: K.conv2d_forward(x, wt, b, s, 1, g, workspace=ws), clock),
                best_ms(lambda: K.conv2d_backward_input(dy, wt, x.shape, s, 1, g, workspace=ws), clock),
                best_ms(lambda: K.conv2d_backward_weight(dy, x, wt.shape, s, 1, g, dw=dw, db=db, workspace=ws),
                        clock)]
        xr, wr = x.clone().requires_grad_(), wt.clone().requires_grad_()
        yr = F.conv2d(xr, wr, None, s, 1, 1, g)
        ref = [best_ms(lambda: F.conv2d(x, wt, b, s, 1, 1, g), clock),
               best_ms(lambda: torch.autograd.grad(yr, xr, dy, retain_graph=True), clock),
               best_ms(lambda: torch.autograd.grad(yr, wr, dy, retain_graph=True), clock)]
        cells = "  ".join(f"{k} {p:.3f} / {t:.3f}" for k, p, t in zip(("fwd", "bwd_in", "bwd_w"), port, ref))
        print(f"n{n} c{c} {side}x{side} g{g} s{s}: {cells}")


if __name__ == "__main__":
    main()
