"""Replace one `## Section` of bench/RESULTS.md, leaving the others alone (file-locked: several benchmarks
write their own sections)."""
from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEADER = ("# PORT benchmark results\n\nEach section is written by the benchmark named in it (medians; this machine "
          "is a noisy 2-vCPU VM, so read ratios measured side by side in one run, not absolute times).\n")


def write_section(title: str, body: str) -> None:
    RESULTS.touch(exist_ok=True)
    with open(RESULTS, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        text = f.read() or HEADER
        block = f"## {title}\n\n{body.strip()}\n"
        pat = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
        text = pat.sub(lambda m: block + "\n", text) if pat.search(text) else text.rstrip() + "\n\n" + block
        f.seek(0)
        f.truncate()
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def checked_kernels():
    """tests/kernels/checked.py, the checked torch-tensor wrappers of the C kernels (test support: ``sgemm``,
    ``conv2d_params``, ...), imported with tests/kernels appended to sys.path (appended: bench/ itself must not
    come first either, its profile.py shadows the stdlib module)."""
    kdir = str(Path(__file__).resolve().parent.parent / "tests" / "kernels")
    if kdir not in sys.path:
        sys.path.append(kdir)
    import checked
    return checked


def sgemm_gflops(n: int = 2048, reps: int = 5, with_torch: bool = False) -> dict:
    """The machine's measured sgemm rate in GFLOP/s (n x n x n, best of ``reps``) at the thread counts in force:
    {"port": PORT's GEMM (OpenBLAS split over the kernel threads)} and, with ``with_torch``, torch.mm's. The one
    measurement every benchmark's "% of sgemm" divides by."""
    import time
    import torch
    K = checked_kernels()
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    fns = {"port": lambda: K.sgemm(a, b, c=c)}
    if with_torch:
        fns["torch"] = lambda: torch.mm(a, b, out=c)
    out = {}
    for tag, f in fns.items():
        f()
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            f()
            best = min(best, time.perf_counter() - t)
        out[tag] = 2 * n ** 3 / best / 1e9
    return out


def machine_line(cmd: str, t0: float, load0: float) -> str:
    """`cmd` (date, CPU model, CPUs: load average at start and now; seconds since t0): every section's first words."""
    import time
    from port.cost.measure import host_info
    return (f"`{cmd}` ({time.strftime('%Y-%m-%d %H:%M')}, {host_info().get('cpu', '?')}, {os.cpu_count()} CPUs: "
            f"load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end; {time.time() - t0:.0f} s)")


def proc_status() -> dict[str, int]:
    """VmRSS and VmHWM of this process in bytes (/proc/self/status)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
    return out


def publish(title: str, text: str, write: bool = True) -> None:
    """Print a benchmark's section and (unless ``write`` is False) put it into bench/RESULTS.md."""
    print(text)
    if write:
        write_section(title, text)


# A Python busy loop that ends by itself once its parent is gone (checked every ~10^6 iterations): a benchmark
# killed mid-run (SIGKILL, Ctrl-C in a shell loop) used to leave it spinning, and every figure taken after that
# ran beside it.
# (The parent's pid is passed in: read with getppid at start-up, a parent killed before the child got there would
# already be init.)
_BUSY = "import os, sys\np = int(sys.argv[1])\nwhile os.getppid() == p:\n    for _ in range(1000000):\n        pass\n"


def busy_process() -> subprocess.Popen:
    """One CPU-bound background process (the loaded phases of bench/train.py and bench/e2e.py)."""
    return subprocess.Popen([sys.executable, "-c", _BUSY, str(os.getpid())])
