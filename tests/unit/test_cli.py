"""The `port` CLI: help, inspect, JSON, exit codes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "port.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


def test_help_is_fast_and_lists_commands():
    best = min(_timed(lambda: run("--help")) for _ in range(3))
    r = run("--help")
    assert r.returncode == 0 and "inspect" in r.stdout
    # no torch import at start-up (checked directly, not by the clock)
    probe = subprocess.run([sys.executable, "-c", "import sys, port.cli; print(any(m in sys.modules for m in "
                            "('torch', 'pydantic', 'pulp', 'highspy', 'ortools', 'numpy')))"],
                           capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert probe.stdout.strip() == "False", probe.stderr
    assert best < 5.0  # sanity only; the 0.3 s figure is measured in bench, not asserted here


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def test_inspect_config_prints_table_and_totals():
    r = run("inspect", "configs/resnet8.yaml")
    assert r.returncode == 0, r.stderr
    for needle in ("layer1.0.conv1", "conv2d", "32x16x32x32", "naive peak activation memory", "optimizer state"):
        assert needle in r.stdout


def test_inspect_model_flags_json_stdout():
    r = run("inspect", "--model", "vgg11", "--input", "3x32x32", "--batch", "8", "--json", "-")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    op = rep["ops"][0]
    assert set(op) >= {"name", "kind", "phase", "output_shape", "flops", "saved_bytes", "param_bytes"}
    assert op["output_shape"] == [8, 64, 32, 32]
    assert set(rep["totals"]) >= {"param_bytes", "grad_bytes", "optimizer_bytes", "naive_peak_activation_bytes",
                                  "forward_flops", "backward_flops"}
    assert sum(o["saved_bytes"] for o in rep["ops"]) == rep["totals"]["naive_peak_activation_bytes"]
    assert {o["phase"] for o in rep["ops"]} == {"forward", "loss", "backward", "update"}


def test_inspect_json_file(tmp_path):
    out = tmp_path / "g.json"
    r = run("inspect", "configs/mlp.yaml", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["graph"] == "mlp"


def test_inspect_trainable_prunes():
    full = json.loads(run("inspect", "--model", "resnet8", "--json", "-").stdout)
    part = json.loads(run("inspect", "--model", "resnet8", "--trainable", "fc", "--json", "-").stdout)
    assert part["totals"]["grad_bytes"] < full["totals"]["grad_bytes"]


@pytest.mark.parametrize("args,needle", [
    (("inspect", "missing.yaml"), "file not found"),
    (("inspect", "--model", "nope"), "unknown model"),
    (("inspect", "--model", "mlp", "--input", "axb"), "per-sample shape"),
    (("inspect", "--bogus"), "No such option"),
])
def test_bad_input_exits_2_with_message(args, needle):
    r = run(*args)
    assert r.returncode == 2
    assert needle in r.stderr + r.stdout
    assert "Traceback" not in r.stderr


def test_bad_config_key_exits_2(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nmodel: mlp\ninput_shape: [64]\nbatchsize: 3\n")
    r = run("inspect", str(p))
    assert r.returncode == 2 and "batchsize" in r.stderr and "Traceback" not in r.stderr


def test_internal_error_exits_1(tmp_path):
    # a model factory that raises an unexpected error is an internal error (exit 1), not bad input
    mod = tmp_path / "boom_models.py"
    mod.write_text("def make(**kw):\n    raise RuntimeError('boom')\n")
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")
    r = subprocess.run([sys.executable, "-m", "port.cli", "inspect", "--model", "boom_models:make", "--input", "4"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 1 and "boom" in r.stderr
