"""GEMM backends side by side (issue 14): OpenBLAS (with the core it runs: DYNAMIC_ARCH picks one when it loads,
or OPENBLAS_CORETYPE names one) against PORT's vendored SGEMM, on the GEMM shapes PORT's convolutions issue, at 1
and 2 threads; which one PORT's default runs for each shape and whether it is the faster.

    python bench/gemm.py [--rounds N] [--no-write]

Paired: in every round each (shape, threads) runs both backends back to back, who goes first alternating; the
table shows medians over the rounds.  Writes the "GEMM backends" section of bench/RESULTS.md; the last line is
the headline with its target (the default runs the faster backend on at least half the shapes at 2 threads).
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._results import checked_kernels, machine_line, publish  # noqa: E402

# (label, m, n, k, trans_a, trans_b): ResNet-18's 3x3 convolutions at batch 8 (per-image im2col GEMMs, 32x32 map
# = 1024 columns; small maps folded to 64+ columns) -- forward W[c_out, K] col[K, P], input gradient
# W^T dY, weight gradient dY col^T -- and a square product
SHAPES = [
    ("fwd 64ch 32x32", 64, 1024, 576, 0, 0),
    ("fwd 128ch 16x16", 128, 256, 1152, 0, 0),
    ("fwd 256ch 8x8", 256, 64, 2304, 0, 0),
    ("fwd 512ch 4x4 (4 images)", 512, 64, 4608, 0, 0),
    ("grad input 64ch 32x32", 576, 1024, 64, 1, 0),
    ("grad input 128ch 16x16", 1152, 256, 128, 1, 0),
    ("grad weight 64ch 32x32", 64, 576, 1024, 0, 1),
    ("grad weight 128ch 16x16", 128, 1152, 256, 0, 1),
    ("square 1024", 1024, 1024, 1024, 0, 0),
    ("patch tile fwd (stem, 4 rows)", 64, 128, 27, 0, 0),
    ("patch tile grad input (stem)", 27, 128, 64, 1, 0),
    ("grad input 512ch 4x4 (1 image)", 4608, 16, 512, 1, 0),
]


def blas_core() -> str:
    """The core OpenBLAS runs kernels for (scipy-openblas32's get_corename), or '-' without it."""
    try:
        import scipy_openblas32 as ob
        lib = ctypes.CDLL(sorted(glob.glob(os.path.join(ob.get_lib_dir(), "*.so*")))[0])
        lib.scipy_openblas_get_corename.restype = ctypes.c_char_p
        return lib.scipy_openblas_get_corename().decode()
    except (ImportError, OSError, IndexError, AttributeError):
        return "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    import torch
    from port.exec import capi
    K = checked_kernels()

    t0, load0 = time.time(), os.getloadavg()[0]
    default = capi.get_gemm_backend()
    core = blas_core()
    rows, speedups, default_wins = [], [], []
    for label, m, n, k, ta, tb in SHAPES:
        a = torch.randn((k, m) if ta else (m, k))
        b = torch.randn((n, k) if tb else (k, n))
        c = torch.empty(m, n)
        cells = []
        for threads in (1, 2):
            capi.set_num_threads(threads)
            times: dict[str, list[float]] = {"blas": [], "vendored": []}
            order = ["blas", "vendored"]
            for be in order:  # warm-up
                capi.set_gemm_backend(be)
                K.sgemm(a, b, bool(ta), bool(tb), c=c)
            for r in range(args.rounds):
                for be in (order if r % 2 == 0 else order[::-1]):
                    capi.set_gemm_backend(be)
                    t = time.perf_counter()
                    K.sgemm(a, b, bool(ta), bool(tb), c=c)
                    times[be].append(time.perf_counter() - t)
            gf = {be: 2 * m * n * k / statistics.median(v) / 1e9 for be, v in times.items()}
            cells.append(gf)
            if threads == 2:
                speedups.append(gf["vendored"] / gf["blas"])
                faster = max(gf, key=gf.get)
                capi.set_gemm_backend(default)
                picked = capi.gemm_backend_for(bool(ta), bool(tb), m, n, k)
                default_wins.append(faster == picked)
        rows.append(f"| {label} | {m}x{n}x{k} | {'T' if ta else 'N'}{'T' if tb else 'N'} | "
                    f"{cells[0]['blas']:.0f} / {cells[0]['vendored']:.0f} | "
                    f"{cells[1]['blas']:.0f} / {cells[1]['vendored']:.0f} | "
                    f"{cells[1]['vendored'] / cells[1]['blas']:.2f} | {picked} |")
    capi.set_gemm_backend(default)
    med = statistics.median(speedups)
    wins = sum(default_wins)
    body = [
        machine_line("python bench/gemm.py", t0, load0) + ".",
        "",
        f"OpenBLAS core: {core} (OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}); CPU has "
        f"AVX-512: {bool(capi.raw.port_cpu_has_avx512())}; PORT's default GEMM here: **{default}** "
        "(kernels/include/port_kernels.h: 'auto' where the CPU and OpenBLAS's core have AVX-512 -- the vendored "
        "GEMM, OpenBLAS for small products and n <= 16 --, the vendored one where only the CPU has it, OpenBLAS "
        "elsewhere; the last column is the backend the default runs for the shape). GFLOP/s = 2mnk / "
        f"median time over {args.rounds} paired rounds (backends alternate who goes first).",
        "",
        "| GEMM | m x n x k | op | 1 thread GFLOP/s OpenBLAS / vendored | 2 threads OpenBLAS / vendored | "
        "vendored / OpenBLAS (2 threads) | default runs |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"gemm: vendored/OpenBLAS median {med:.2f}x at 2 threads (min {min(speedups):.2f}, max {max(speedups):.2f}); "
        f"default '{default}' runs the faster backend on {wins} of {len(speedups)} shapes (target: on at least "
        f"half of them: {'met' if 2 * wins >= len(speedups) else 'NOT met'})",
    ]
    publish("GEMM backends", "\n".join(body), write=not args.no_write)


if __name__ == "__main__":
    main()
