"""`port train` end to end: trace -> profile (the location rule: measured once into the working directory's
profiles/, then reused) -> solve -> train -> export -> report; replan; resume. Runs in a scratch working
directory, so nothing is written into the repository."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import portcli as P

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = str(ROOT / "configs" / "default.yaml")


def port_cli(*args, cwd, inprocess=False, **more_env):
    """`port ARGS` in a fresh process (the run fixture, report, --threads auto: one of each; ``more_env``: variables
    set for it) or in this one."""
    if inprocess:
        assert not more_env, "port_inprocess runs in this process's environment"
        return P.port_inprocess(*args, cwd=cwd, columns=160)
    return P.port_cli(*args, cwd=cwd, columns=160, **more_env)


def _size(n):
    from port.config import format_size
    return format_size(n)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """`port train` of the default config (no profile yet: measured into the working directory), once per session
    (conftest.shared_once); each worker's tests change their own copy of its working directory."""
    from sessionshare import copy_of, shared_once

    def make(work):
        r = port_cli("train", DEFAULT, "--steps", "60", "--out", str(work / "runs"), "--no-progress", cwd=work,
                     PORT_EXPORT="onnx,torch")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        (work / "train.stdout").write_text(r.stdout)

    work = copy_of(tmp_path_factory, shared_once(tmp_path_factory, "train-pipeline-run", make), "work")
    stdout = (work / "train.stdout").read_text()
    assert "no profile at profiles/host/digits.json yet; measuring it now" in stdout
    assert (work / "profiles" / "host" / "digits.json").exists()
    return work / "runs" / "digits", stdout


def test_run_directory_and_plan_within_budget(run):
    d, stdout = run
    for f in ("config.yaml", "plan.json", "checkpoint.port", "metrics.jsonl", "measured.json", "model.onnx",
              "model.pt2", "report.html"):
        assert (d / f).exists(), f
    plan = json.loads((d / "plan.json").read_text())
    assert plan["predicted_peak_bytes"] <= plan["budget_bytes"]
    lines = (d / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 60 and json.loads(lines[-1])["step"] == 60
    m = json.loads((d / "measured.json").read_text())
    assert m["op_ms"] and max(m["timeline_bytes"]) <= plan["budget_bytes"]   # arena accounting within budget
    # the arena the executor allocated (training and inference programs) and the engines fit the budget (issue
    # 53: the demo allocated 2.07 MiB against 1.95 MiB); the run says both
    from port.cost.io import load_profile
    from port.plan.io import load_plan
    from port.plan.semantics import engine_bytes
    eng = engine_bytes(load_plan(d / "plan.json"), load_profile(d / "profile.json"))
    mem = m["memory"]
    assert mem["arena_bytes"] + eng <= mem["budget_bytes"] == plan["budget_bytes"], (mem, eng)
    assert f"arena {_size(mem['arena_bytes'])}, budget {_size(plan['budget_bytes'])}" in stdout
    assert "plan:" in stdout and "test accuracy" in stdout and "keep-everything peak" in stdout
    html = (d / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 2 and "Placement" in html


def test_report_rebuilds(run):
    d, _ = run
    (d / "report.html").unlink()
    r = port_cli("report", str(d), cwd=d.parent.parent)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (d / "report.html").exists()


def test_report_refuses_non_run_dir(tmp_path):
    r = port_cli("report", str(tmp_path), cwd=tmp_path, inprocess=True)
    assert r.returncode == 2 and "not a run directory" in r.stderr


def test_replan_and_resume(run):
    d, _ = run
    out = d.parent
    r = port_cli("train", DEFAULT, "--steps", "70", "--out", str(out), "--resume", "--replan", "--no-progress",
                 cwd=out.parent, inprocess=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resumed from" in r.stdout and "plan:" in r.stdout
    steps = [json.loads(ln)["step"] for ln in (d / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 71))


def test_budget_below_minimum_names_it(run, tmp_path):
    d, _ = run
    r = port_cli("train", DEFAULT, "--steps", "1", "--budget", "20%", "--out", str(tmp_path), cwd=d.parent.parent,
                 inprocess=True)
    assert r.returncode == 2
    assert "smallest feasible budget" in r.stderr and "Traceback" not in r.stderr
    assert "20% of the keep-everything peak" in r.stdout and "measuring" not in r.stdout


def test_micro_batch_plan_is_solved_for_the_micro_batch(run, tmp_path):
    """train.micro_batch: the graph is traced, profiled and solved at the micro-batch, so the Trainer runs
    the plan without a mismatch (and without early updates)."""
    d, _ = run
    cfg = tmp_path / "mb.yaml"
    cfg.write_text(Path(DEFAULT).read_text().replace("train: {", "train: {micro_batch: 8, "))
    r = port_cli("train", str(cfg), "--steps", "5", "--budget", "95%", "--out", str(tmp_path / "runs"), "--no-progress",
                 cwd=d.parent.parent, inprocess=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "in micro-batches of 8" in r.stdout and "early updates 0" in r.stdout
    plan = json.loads((tmp_path / "runs" / "digits" / "plan.json").read_text())
    assert plan["batch_size"] == 8 and plan["early_updates"] == []


def test_threads_auto_from_the_command_line(run, tmp_path, monkeypatch):
    """--threads auto (train.threads: auto): the steps run under the thread governor, whose decisions go to
    measured.json and the output; a bad value is a clear error naming the key. The run gets the machine's
    threads (an xdist worker's OMP_NUM_THREADS share of 1 leaves the governor nothing to try)."""
    d, _ = run
    monkeypatch.setenv("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    r = port_cli("train", DEFAULT, "--steps", "40", "--threads", "auto", "--out", str(tmp_path / "runs"),
                 "--no-progress", cwd=d.parent.parent)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("threads: auto: "))
    bad = port_cli("train", DEFAULT, "--steps", "1", "--threads", "two", "--out", str(tmp_path / "r2"),
                   cwd=d.parent.parent, inprocess=True)
    assert bad.returncode == 2 and "train.threads" in bad.stderr and "'auto'" in bad.stderr
    assert "Traceback" not in bad.stderr
    m = json.loads((tmp_path / "runs" / "digits" / "measured.json").read_text())
    ev = m["thread_events"]
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: the governor has no other count to try")
    # the first decision comes after the warm-up: a probe, or a reaction to slow steps (a busy machine)
    assert ev and ev[0]["why"] in ("probe", "slow") and ev[0]["step"] > 3
    assert all(e["to_threads"] >= 1 and e["why"] in ("probe", "slow", "faster", "kept") for e in ev)
    assert "at the end" in line
