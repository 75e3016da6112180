"""bench/gemm.py (issue 14) runs and ends on its headline: the GEMM backends side by side and the default's rule."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gemm_bench_headline():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gemm.py"), "--rounds", "1", "--no-write"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    rows = [ln for ln in lines if ln.startswith("| ") and "x" in ln.split("|")[2]]
    assert len(rows) == 13  # header + 12 shapes
    assert all(ln.rstrip(" |").split("|")[-1].strip() in ("blas", "vendored") for ln in rows[1:]), rows
    assert re.match(r"gemm: vendored/OpenBLAS median \d+\.\d\dx at 2 threads .* default '(blas|vendored|auto)' runs "
                    r"the faster backend on \d+ of 12 shapes \(target: .*: (met|NOT met)\)$", lines[-1]), lines[-1]
