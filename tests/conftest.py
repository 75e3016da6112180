import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/reference.py
sys.path.append(str(Path(__file__).resolve().parent / "kernels"))  # tests/kernels/checked.py
# Two threads, or under pytest-xdist (`make test`) each worker's share of the CPUs, so N workers x threads do not
# oversubscribe the machine (tests that need a thread count set it themselves: capi.set_num_threads). A value the
# user set is kept; the one this file set in xdist's controller (which the workers inherit) is redone per worker.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if os.environ.get("OMP_NUM_THREADS", "") in ("", os.environ.get("PORT_TESTS_OMP_DEFAULT")):
    os.environ["OMP_NUM_THREADS"] = os.environ["PORT_TESTS_OMP_DEFAULT"] = str(
        max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))
# Engine footprints (port.cost.footprint) take a fresh process per engine (~2 s each): the quick profiles the
# suite takes by the hundred skip them; tests/unit/test_footprint.py measures them.
os.environ.setdefault("PORT_PROFILE_ENGINE", "0")
# The commands the suite runs (`port train` with no profile yet, `port profile`) measure with the quick timing
# blocks (port/pipeline/profiles.py::_timing): 25-35% of a transformer config's `port train` test. The default
# blocks are what users get; tests/unit/test_profile.py times with its own.
os.environ.setdefault("PORT_PROFILE_QUICK", "1")
# `port train` runs skip their ONNX / torch.export files (5 s each run) unless a test asks for them
# (tests/e2e/test_train_pipeline.py's run, test_token_configs, test_file_safety, the wheel's)
os.environ.setdefault("PORT_EXPORT", "none")
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

    from buildlock import make
    if "PORT_RT_BIN" in os.environ:
        b = Path(os.environ["PORT_RT_BIN"])
        assert b.is_file(), f"PORT_RT_BIN={b} does not exist"
        return b
    if shutil.which("gcc") is None:
        pytest.skip("no C compiler: apt-get install -y gcc")
    r = make("port-rt")      # under the build lock: xdist workers share kernels/build
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return ROOT / "kernels" / "build" / "port-rt"


def _shared_profile(tmp_path_factory, config: Path, name: str) -> tuple[Path, str]:
    """`port profile CONFIG --quick` (a fresh process, umask 027) at the location rule of a folder of its own
    (profiles/host/NAME.json), made once per test session (shared_once). The CLI tests of one config share
    this measurement (a quick profile of the digits CNN is 20-40 s); tests read it, and copy it into tmp_path to
    change it."""
    import subprocess

    def make(root: Path) -> None:
        r = subprocess.run([sys.executable, "-m", "port.cli", "profile", str(config), "--quick", "--no-progress"],
                           capture_output=True, text=True, cwd=root, timeout=900,
                           env=dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200"),
                           preexec_fn=lambda: os.umask(0o027))
        assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        (root / "port-profile.stdout").write_text(r.stdout)

    from sessionshare import shared_once
    root = shared_once(tmp_path_factory, f"profile-{name}", make)
    return root / "profiles" / "host" / f"{name}.json", (root / "port-profile.stdout").read_text()


@pytest.fixture(scope="session")
def digits_profile(tmp_path_factory) -> tuple[Path, str]:
    """(profiles/host/digits.json, `port profile`'s stdout) of configs/default.yaml: see _shared_profile."""
    return _shared_profile(tmp_path_factory, ROOT / "configs" / "default.yaml", "digits")



@pytest.fixture(scope="module")
def bench_e2e():
    """bench/e2e.py as a module (bench/ on sys.path while the module's tests run: it imports bench/train.py)."""
    import importlib.util
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("bench_e2e_under_test", ROOT / "bench" / "e2e.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(ROOT / "bench"))


# The garbage collector's full passes (gc.collect) walk every tracked object: a Trainer's set-up runs three
# (port.train.memwatch.release_freed_heap), ~0.1 s in a fresh process with torch loaded, but 0.5-2 s in a test
# worker that holds the objects of torch.export, the zoo packages and earlier modules' imports (170k-470k
# objects). At the first test of each test module: collect everything once, then freeze what survived (gc.freeze:
# long-lived objects, left out of later passes; reference counting still frees them), so the passes within the
# module walk only what the module made. Nothing outlives a module boundary uncollected.
_GC_MODULE: list = [None]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    import gc
    module = item.nodeid.split("::")[0]
    if module != _GC_MODULE[0]:
        _GC_MODULE[0] = module
        gc.unfreeze()
        gc.collect()
        gc.freeze()
