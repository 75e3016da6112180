"""The wheel works anywhere: built with `python -m build` (sdist, then the wheel from it), installed into a fresh
venv outside the checkout, `port train --model` runs from an empty directory and the shipped configs are
package data. .ci/wheel does the full round (a real install through constraints.txt, `port demo`, `port train
--model resnet8 --steps 5`, port-rt from the sdist: minutes of host profiling); here the venv borrows this
environment's dependencies through a .pth file (nothing is downloaded) and trains the small MLP.

In CI the wheel is built once: .ci/run runs test-all with PORT_WHEEL_TESTS=ci-wheel (this file skips) and
.ci/wheel runs this file at its end with PORT_WHEEL_VENV / PORT_WHEEL_DIST naming its own venv (the wheel
installed with its dependencies) and dist folder (the isolated build), instead of building it a second time."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(cmd, cwd, timeout=900, env=None):
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv python, port script, dist folder): the wheel built from this checkout, installed in a new venv;
    .ci/wheel's (PORT_WHEEL_VENV, PORT_WHEEL_DIST) when it runs this file."""
    if os.environ.get("PORT_WHEEL_TESTS") == "ci-wheel":
        pytest.skip("PORT_WHEEL_TESTS=ci-wheel: .ci/wheel runs this file against the wheel it builds (.ci/run)")
    if os.environ.get("PORT_WHEEL_VENV"):
        venv, dist = Path(os.environ["PORT_WHEEL_VENV"]), Path(os.environ["PORT_WHEEL_DIST"])
        assert (venv / "bin" / "port").is_file() and len(sorted(dist.glob("port-*.whl"))) == 1, (venv, dist)
        return venv / "bin" / "python", venv / "bin" / "port", dist
    pytest.importorskip("build", reason="the dev extra's `build` (pip install -c constraints.txt build)")
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "-o", dist, ROOT], cwd=tmp)
    wheels = sorted(dist.glob("port-*.whl"))
    assert len(wheels) == 1 and len(sorted(dist.glob("port-*.tar.gz"))) == 1, sorted(dist.iterdir())
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp)
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).stdout.strip())
    (site / "_borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: the borrowed environment may hold PORT itself (an editable install); never touch it
    _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--ignore-installed",
          wheels[0]], cwd=tmp)
    return py, venv / "bin" / "port", dist


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PORT_KERNELS_LIB")}
    return dict(env, PORT_CAPTURE="inprocess", PORT_PROFILE_ENGINE="0", PORT_EXPORT="onnx,torch")


def test_the_wheel_carries_configs_and_kernels_not_the_checkout(installed, tmp_path):
    py, _, dist = installed
    out = _run([py, "-c", "import port, port.config as C, port.exec.capi as K; "
                "print(port.__file__); print(C.DEFAULT_CONFIG); print(len(C.device_names())); print(K.library_path())"],
               cwd=tmp_path, env=_env()).stdout.split()
    site = str(Path(out[0]).parent.parent)
    assert str(ROOT) not in out[0] and out[1].startswith(site) and out[3].startswith(site), out
    assert int(out[2]) >= 5
    import tarfile
    names = tarfile.open(next(dist.glob("port-*.tar.gz"))).getnames()
    for need in ("Makefile", "kernels/cli/port_rt_main.c", "kernels/include/port_kernels.h", "configs/default.yaml"):
        assert any(n.endswith("/" + need) for n in names), need


def test_train_from_an_empty_directory(installed, tmp_path):
    _, port, _ = installed
    r = _run([port, "train", "--model", "mlp", "--steps", "5", "--no-progress"], cwd=tmp_path, env=_env())
    run = tmp_path / "runs" / "mlp"
    assert "test accuracy" in r.stdout and "export onnx failed" not in r.stdout, r.stdout[-2000:]
    assert all((run / f).is_file() for f in ("checkpoint.port", "model.onnx", "model.pt2")), sorted(run.iterdir())
    assert (tmp_path / "profiles" / "host" / "mlp.json").is_file()      # the location rule: under the cwd
    # a config path is the user's, relative to the working directory: named, not looked up in the package
    r = subprocess.run([str(port), "train", "configs/resnet8.yaml"], cwd=tmp_path, capture_output=True, text=True,
                       env=_env())
    assert r.returncode == 2 and "configs/resnet8.yaml: file not found" in r.stderr, r.stderr
    assert "PORT ships one by that name" in r.stderr and "site-packages" in r.stderr, r.stderr
