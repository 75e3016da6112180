"""One pipeline for every command (port/pipeline.py): the profile location rule (`port profile` then `port
solve` and `port train` reuse the file, no re-profiling), explicit --profile files, profiles of another CPU,
the budget syntax of the Python API, Ctrl-C / SIGTERM during `port train` (checkpoint, exit 130 / 143, resume
without duplicate metrics lines), and files written with the user's umask."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from portcli import env, ok, port_cli, port_inprocess

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "configs" / "default.yaml"
MLP = ROOT / "configs" / "mlp.yaml"


@pytest.fixture(scope="module")
def quick_profile(digits_profile):
    """A quick profile of the default config (`port profile --quick`), made once per session (tests/conftest.py)."""
    return digits_profile[0]


def test_profile_then_solve_then_train_reuse_the_profile(tmp_path, digits_profile):
    """`port profile` (the session's digits profile: a fresh process under umask 027, at the location rule of its
    folder) then `port solve`, `show`, `inspect` and `port train` in a folder holding that file reuse it."""
    rule = Path("profiles") / "host" / "digits.json"
    made, out = digits_profile
    assert f"wrote {rule}" in out and "keep-everything peak" in out
    assert made.stat().st_mode & 0o777 == 0o640                      # the user's umask, not mkstemp's 0600
    path = tmp_path / rule
    path.parent.mkdir(parents=True)
    shutil.copy2(made, path)                                         # mode and mtime kept
    before = (path.stat().st_mtime_ns, path.read_bytes())

    r = ok(port_cli("solve", DEFAULT, "-o", "plan.json", cwd=tmp_path, umask=0o027))
    assert f"profile: {rule} (" in r.stdout and "measur" not in r.stdout.replace("measured", "")
    assert "keep-everything peak" in r.stdout and "75% of the keep-everything peak" in r.stdout
    assert (tmp_path / "plan.json").stat().st_mode & 0o777 == 0o640
    r = port_inprocess("solve", DEFAULT, "--budget", "50%", cwd=tmp_path)   # below digits' minimum: a clear exit 2
    assert r.returncode in (0, 2) and "Traceback" not in r.stderr and "keep-everything peak" in r.stdout
    if r.returncode == 2:
        assert "smallest feasible budget" in r.stderr
    r = ok(port_inprocess("show", "plan.json", cwd=tmp_path))
    assert "keep-everything peak" in r.stdout and (tmp_path / "plan_memory.png").exists()
    r = ok(port_inprocess("inspect", DEFAULT, cwd=tmp_path))
    assert f"workspace sizes from profile {rule}" in r.stdout

    r = ok(port_inprocess("train", DEFAULT, "--steps", "20", "--no-progress", "--out", "runs", cwd=tmp_path,
                          umask=0o027))
    assert f"profile: {rule} (" in r.stdout and "measuring" not in r.stdout
    assert "keep-everything peak" in r.stdout and "test accuracy" in r.stdout
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before    # not re-profiled, not rewritten
    run = tmp_path / "runs" / "digits"
    for f in ("plan.json", "profile.json", "checkpoint.port", "metrics.jsonl", "measured.json", "report.html"):
        assert (run / f).stat().st_mode & 0o777 == 0o640, f


def test_explicit_profile_is_used_and_never_rewritten(tmp_path, quick_profile):
    before = quick_profile.read_bytes()
    r = ok(port_inprocess("solve", DEFAULT, "--profile", quick_profile, "--budget", "90%", cwd=tmp_path))
    assert f"profile: {quick_profile} (" in r.stdout and "measuring" not in r.stdout
    assert not (tmp_path / "profiles").exists()
    # a profile of another graph (the MLP config's) does not cover this one: named, exit 2, not rewritten
    r = port_inprocess("solve", MLP, "--profile", quick_profile, cwd=tmp_path)
    assert r.returncode == 2 and str(quick_profile) in r.stderr and "does not cover" in r.stderr
    assert quick_profile.read_bytes() == before


def test_profile_from_another_cpu_is_measured_again(tmp_path):
    from dataclasses import replace

    from port.cost.io import load_profile, save_profile
    rule = tmp_path / "profiles" / "host" / "mlp.json"
    ok(port_inprocess("profile", MLP, "--quick", "--no-progress", cwd=tmp_path))
    prof = load_profile(rule)
    host = dict(prof.host)
    host["cpu"] = "Imaginary CPU 9000"
    save_profile(replace(prof, host=tuple(sorted(host.items())), _index={}), rule)
    r = ok(port_inprocess("solve", MLP, "--budget", "100%", cwd=tmp_path))
    assert "Imaginary CPU 9000" in r.stdout and "measuring again" in r.stdout
    assert "another CPU model" in r.stdout
    assert dict(load_profile(rule).host)["cpu"] != "Imaginary CPU 9000"


def test_python_api_budget_forms():
    import torch

    import port
    from port import models
    from port.config import load_device
    from port.cost.roofline import modeled_profile
    from port.errors import ConfigError
    g = port.trace(models.get("digits_cnn", seed=0), torch.randn(16, 1, 8, 8))
    prof = modeled_profile(g, load_device("host"))
    peak = port.keep_everything_peak(g, prof)
    a = port.solve(g, prof, budget="90%", time_limit_s=20)
    b = port.solve(g, prof, int(peak * 90 / 100), solver="greedy")       # the budget is resolved before the
    c = port.solve(g, prof, budget_bytes=int(peak * 90 / 100), solver="greedy")   # solver runs: one ILP solve
    assert a.budget_bytes == b.budget_bytes == c.budget_bytes == int(peak * 90 / 100)
    assert port.solve(g, prof, "64MB", solver="greedy").budget_bytes == 64_000_000
    assert port.solve(g, prof, "1.5GiB", solver="greedy").budget_bytes == int(1.5 * 2**30)
    assert port.solve(g, prof, solver="greedy").budget_bytes == prof.memory_bytes
    with pytest.raises(ConfigError, match="75%"):
        port.solve(g, prof, "lots")
    sim = port.simulate(a, g, prof)
    assert sim.peak_bytes == a.predicted_peak_bytes <= a.budget_bytes


def test_percentage_budget_adds_the_engine_footprint_whole():
    """A measured engine footprint (1.2 MB for the C kernels on a fresh machine) is inside the keep-everything
    peak but no plan can shrink it: NN% scales the rest, so the default config's 75% stays feasible (scaling the
    whole peak put it below the smallest feasible budget on the digits CNN)."""
    from dataclasses import replace

    import torch

    import port
    from port import models
    from port.config import load_device
    from port.cost.roofline import modeled_profile
    from port.pipeline import keep_everything
    g = port.trace(models.get("digits_cnn", seed=0), torch.randn(32, 1, 8, 8), optimizer="sgd_momentum")
    prof0 = modeled_profile(g, load_device("host"))
    prof = replace(prof0, engine_bytes=tuple((a, 1_216_512) for a in prof0.accelerators), _index={})
    peak0, eng0 = keep_everything(g, prof0)
    peak, eng = keep_everything(g, prof)
    assert eng0 == 0 and eng == 1_216_512 and peak == peak0 + eng
    plan = port.solve(g, prof, "75%", time_limit_s=20)
    assert plan.budget_bytes == int(eng + (peak - eng) * 0.75)
    assert plan.predicted_peak_bytes <= plan.budget_bytes
    assert port.solve(g, prof0, "75%", time_limit_s=20).budget_bytes == int(peak0 * 0.75)


def _steps(metrics: Path) -> list[int]:
    return [json.loads(ln)["step"] for ln in metrics.read_text().splitlines()]


def _wait_for_lines(metrics: Path, n: int, proc, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"training ended early (exit {proc.returncode}): {proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"no {n} metrics lines within {timeout} s")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_writes_checkpoint_and_resume_keeps_metrics_unique(tmp_path, quick_profile, sig):
    from port.train.checkpoint import read_header
    run = tmp_path / "runs" / "digits"
    metrics, ckpt = run / "metrics.jsonl", run / "checkpoint.port"
    p = subprocess.Popen([sys.executable, "-m", "port.cli", "train", str(DEFAULT), "--steps", "100000",
                          "--profile", str(quick_profile), "--out", "runs", "--no-progress"], cwd=tmp_path,
                         env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: os.umask(0o022))
    _wait_for_lines(metrics, 30, p)
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, (p.returncode, out[-2000:], err[-2000:])
    assert f"checkpoint written to {Path('runs') / 'digits' / 'checkpoint.port'}" in err
    assert "Traceback" not in err
    steps = _steps(metrics)
    stopped = read_header(ckpt)["step"]
    assert steps == list(range(1, stopped + 1)) and stopped >= 30      # the checkpoint is at the last step
    assert ckpt.stat().st_mode & 0o777 == 0o644
    target = stopped + 15
    r = ok(port_inprocess("train", DEFAULT, "--resume", "--steps", target, "--profile", quick_profile, "--out", "runs",
                          "--no-progress", cwd=tmp_path))
    assert f"resumed from {Path('runs') / 'digits' / 'checkpoint.port'} at step {stopped}" in r.stdout
    assert "plan: reusing" in r.stdout
    assert _steps(metrics) == list(range(1, target + 1))


def test_kill_then_resume_drops_lines_after_the_checkpoint(tmp_path, quick_profile):
    """SIGKILL leaves metrics lines after the last periodic checkpoint: resuming drops them, so every step
    appears exactly once."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(DEFAULT.read_text().replace("checkpoint_every: 200", "checkpoint_every: 25"))
    run = tmp_path / "runs" / "digits"
    metrics = run / "metrics.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "port.cli", "train", str(cfg), "--steps", "100000", "--profile",
                          str(quick_profile), "--out", "runs", "--no-progress"], cwd=tmp_path, env=env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_lines(metrics, 40, p)
    p.kill()
    p.communicate(timeout=60)
    from port.train.checkpoint import read_header
    at = read_header(run / "checkpoint.port")["step"]
    assert at % 25 == 0 and len(_steps(metrics)) >= at
    target = max(_steps(metrics)) + 10
    ok(port_inprocess("train", cfg, "--resume", "--steps", target, "--profile", quick_profile, "--out", "runs",
                      "--no-progress", cwd=tmp_path))
    assert _steps(metrics) == list(range(1, target + 1))
