import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/reference.py
sys.path.append(str(Path(__file__).resolve().parent / "kernels"))  # tests/kernels/checked.py
os.environ.setdefault("OMP_NUM_THREADS", "2")
# Engine footprints (port.cost.footprint) take a fresh process per engine (~2 s each): the quick profiles the
# suite takes by the hundred skip them; tests/unit/test_footprint.py measures them.
os.environ.setdefault("PORT_PROFILE_ENGINE", "0")
# Capture (torch.export) runs in a forked child by default, so a training process never imports the compiler
# stack; the child re-imports it each time (~1.5 s). The suite captures hundreds of models: in this process (the
# stack imported once). tests/e2e/test_memory_measured.py runs the default path in fresh processes.
os.environ.setdefault("PORT_CAPTURE", "inprocess")

# Before torch loads its OpenMP runtime: passive waiting (a spinning pool on an oversubscribed 2-core
# machine makes every parallel region 100x slower; see port/exec/capi.py).
import port  # noqa: E402,F401


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def port_rt():
    """The port-rt binary: PORT_RT_BIN when set (make test-asan: the ASan+UBSan build), else `make port-rt`'s."""
    import shutil
    import subprocess
    if "PORT_RT_BIN" in os.environ:
        b = Path(os.environ["PORT_RT_BIN"])
        assert b.is_file(), f"PORT_RT_BIN={b} does not exist"
        return b
    if shutil.which("gcc") is None:
        pytest.skip("no C compiler: apt-get install -y gcc")
    r = subprocess.run(["make", "-s", "port-rt"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return ROOT / "kernels" / "build" / "port-rt"
