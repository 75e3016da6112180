"""The capture's forked child (port.ir.trace._in_child) after the parent has run OpenMP parallel regions: libgomp's
pool does not survive fork, and a child that entered a parallel region waited forever at the team barrier (seen as
a hung `make profiles` once the capture key checked the weights for zeros in the parent)."""
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import torch, port
    torch.set_num_threads(2)
    assert bool((torch.ones(4_000_000) == 0).any()) is False   # a parallel region before the capture forks
    g = port.trace(port.models.get("resnet8"), torch.randn(2, 3, 32, 32))
    print("captured", len(g.ops))
""")


def test_the_capture_child_runs_after_parallel_regions_in_the_parent():
    env = {k: v for k, v in os.environ.items() if k != "PORT_CAPTURE"}      # the forked child, as users run it
    env["OMP_NUM_THREADS"] = "2"
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("captured "), r.stdout
    assert int(r.stdout.split()[1]) > 50
