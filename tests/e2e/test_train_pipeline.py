"""`port train` end to end: trace -> profile (cached) -> solve -> train -> export -> report; replan; resume."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def port_cli(*args, cwd=ROOT, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="160")
    return subprocess.run([sys.executable, "-m", "port.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    r = port_cli("train", "configs/default.yaml", "--steps", "60", "--out", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out / "digits", r.stdout


def test_run_directory_and_plan_within_budget(run):
    d, stdout = run
    for f in ("config.yaml", "plan.json", "checkpoint.port", "metrics.jsonl", "measured.json", "model.onnx",
              "model.pt", "report.html"):
        assert (d / f).exists(), f
    plan = json.loads((d / "plan.json").read_text())
    assert plan["predicted_peak_bytes"] <= plan["budget_bytes"]
    lines = (d / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 60 and json.loads(lines[-1])["step"] == 60
    m = json.loads((d / "measured.json").read_text())
    assert m["op_ms"] and max(m["timeline_bytes"]) <= plan["budget_bytes"]   # arena accounting within budget
    assert "plan:" in stdout and "test accuracy" in stdout
    html = (d / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 2 and "Placement" in html


def test_report_rebuilds(run):
    d, _ = run
    (d / "report.html").unlink()
    r = port_cli("report", str(d))
    assert r.returncode == 0, r.stderr[-2000:]
    assert (d / "report.html").exists()


def test_report_refuses_non_run_dir(tmp_path):
    r = port_cli("report", str(tmp_path))
    assert r.returncode == 2 and "not a run directory" in r.stderr


def test_replan_and_resume(run):
    d, _ = run
    out = d.parent
    r = port_cli("train", "configs/default.yaml", "--steps", "70", "--out", str(out), "--resume", "--replan")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resumed from" in r.stdout and "plan:" in r.stdout
    lines = (d / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["step"] == 70


def test_budget_below_minimum_names_it(tmp_path):
    r = port_cli("train", "configs/default.yaml", "--steps", "1", "--budget", "20%", "--out", str(tmp_path))
    assert r.returncode == 2
    assert "smallest feasible budget" in r.stderr and "Traceback" not in r.stderr
