"""Hostile inputs (issue 11): no silent wrong result, no hang, no traceback.

Every case checks the exit code (2: bad input), that the message names the input and the fix, and that no
traceback is printed. CLI cases run in-process (port.cli.run); trainer cases on the Python API."""
from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest
import torch

from port import cli
from port import models as M
from port.errors import NonFiniteError, PlanError, PortError
from port.train.checkpoint import CheckpointError, read_checkpoint, read_header
from port.train.optim import SGD
from port.train.trainer import Trainer

MODELED = "jetson-orin-nano"        # fully modeled device: no profiling, so the CLI cases stay fast


def port(capsys, *args) -> tuple[int, str]:
    rc = cli.run([str(a) for a in args])
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text, text
    return rc, text


def cfg(tmp_path: Path, name: str = "t", **over) -> Path:
    d = {"name": name, "model": "mlp", "input_shape": [64], "batch_size": 8, "device": MODELED,
         "data": {"kind": "synthetic", "num_samples": 64}, "train": {"steps": 2, "checkpoint_every": 1}}
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k] = dict(d[k], **v)
        else:
            d[k] = v
    import yaml
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---------------------------------------------------------------------------------------------- A
def _trainer():
    return Trainer(M.get("mlp", seed=0), torch.randn(8, 64), optimizer=SGD(0.05, momentum=0.9))


def _forge(path: Path, edit, recompute: bool) -> Path:
    """Rewrite a format-2 checkpoint's header with ``edit(hdr)``; ``recompute``: fix up the checksum too (a
    forged file), else keep the old one (an edited file)."""
    raw = path.read_bytes()
    ver, hlen = struct.unpack("<IQ", raw[8:20])
    hdr = json.loads(raw[52:52 + hlen])
    edit(hdr)
    hj = json.dumps(hdr, sort_keys=True).encode()
    hpad = b"\0" * ((-(52 + len(hj))) % 64)
    data = raw[52 + hlen + ((-(52 + hlen)) % 64):]
    digest = hashlib.sha256(hj + hpad + data).digest() if recompute else raw[20:52]
    out = path.with_name(path.stem + ".forged.port")
    out.write_bytes(raw[:8] + struct.pack("<IQ", ver, len(hj)) + digest + hj + hpad + data)
    return out


@pytest.mark.parametrize("edit", [
    lambda h: h.update(step=h["step"] + 1000),
    lambda h: h["tensors"][0].update(offset=h["tensors"][1]["offset"]),
    lambda h: h["tensors"][0].update(dtype="float64"),
    lambda h: h["optimizer"].update(lr=10.0),
], ids=["step", "offset", "dtype", "lr"])
def test_checkpoint_header_edit_is_detected(tmp_path, edit):
    tr = _trainer()
    tr.save_checkpoint(tmp_path / "c.port")
    bad = _forge(tmp_path / "c.port", edit, recompute=False)
    with pytest.raises(CheckpointError, match="checksum mismatch.*train again"):
        read_checkpoint(bad)
    with pytest.raises(CheckpointError, match="checksum"):
        Trainer.resume(bad, M.get("mlp", seed=0), torch.randn(8, 64))


@pytest.mark.parametrize("edit,key", [
    (lambda h: h["tensors"][0].update(dtype="float128"), "tensors[0].dtype"),
    (lambda h: h.update(step="7"), "step"),
    (lambda h: h.update(step=1.5), "step"),
    (lambda h: h["tensors"][0].update(nbytes=2**62), "tensors[0].nbytes"),
    (lambda h: h["tensors"][0].update(offset=-64), "tensors[0].offset"),
    (lambda h: h.pop("data_bytes"), "data_bytes"),
    (lambda h: h["rng"].pop("seed"), "rng.seed"),
    (lambda h: h["optimizer"].update(lr=float("inf")), "optimizer"),
    (lambda h: h["tensors"][0].update(shape=[2**62, 2**62]), "tensors[0].shape"),
], ids=["dtype", "str-step", "float-step", "2^62", "neg-offset", "missing", "missing-nested", "inf-lr", "shape"])
def test_checkpoint_header_field_errors_are_named(tmp_path, capsys, edit, key):
    _trainer().save_checkpoint(tmp_path / "c.port")
    bad = _forge(tmp_path / "c.port", edit, recompute=True)
    with pytest.raises(CheckpointError) as ei:
        read_checkpoint(bad)
    msg = str(ei.value)
    assert str(bad) in msg and repr(key) in msg and ("train again" in msg or "resume from" in msg), msg
    assert not isinstance(ei.value, (KeyError, TypeError)) and isinstance(ei.value, PortError)


def test_checkpoint_huge_header_length_and_old_version(tmp_path):
    _trainer().save_checkpoint(tmp_path / "c.port")
    raw = bytearray((tmp_path / "c.port").read_bytes())
    raw[12:20] = struct.pack("<Q", 2**62)
    (tmp_path / "h.port").write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="truncated header"):
        read_header(tmp_path / "h.port")
    raw = bytearray((tmp_path / "c.port").read_bytes())
    raw[8:12] = struct.pack("<I", 1)
    (tmp_path / "v1.port").write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="format version 1.*train again"):
        read_header(tmp_path / "v1.port")


def test_checkpoint_round_trip_still_exact(tmp_path):
    tr = _trainer()
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    tr.step(x, y)
    tr.save_checkpoint(tmp_path / "c.port")
    t2 = Trainer.resume(tmp_path / "c.port", M.get("mlp", seed=1), torch.randn(8, 64))
    assert t2.step_count == 1 and all(torch.equal(v, t2.state_dict()[k]) for k, v in tr.state_dict().items())


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    from port.config import load_device
    from port.cost.roofline import modeled_profile
    from port.ir.trace import trace
    from port.plan.io import save_plan
    from port.solver import solve
    g = trace(M.get("mlp", seed=0), torch.randn(8, 64), name="mlp")
    p = modeled_profile(g, load_device("host"))
    plan = solve(g, p, 10**9)
    f = save_plan(plan, tmp_path_factory.mktemp("plan") / "plan.json", g,
                  extra={"gantt": [["a", "cpu-c", 0.0, 1.0]]})
    return f, plan, g, p


def test_plan_checksum(plan_file, tmp_path, capsys):
    from port.plan.io import load_plan
    f, plan, g, p = plan_file
    d = json.loads(f.read_text())
    assert "sha256" in d and load_plan(f, g, p) == plan
    d["budget_bytes"] += 1
    (tmp_path / "e.json").write_text(json.dumps(d))
    with pytest.raises(PlanError, match=r"e\.json: checksum mismatch.*solve again"):
        load_plan(tmp_path / "e.json")
    rc, text = port(capsys, "show", tmp_path / "e.json")
    assert rc == 2 and "checksum mismatch" in text and "e.json" in text


# ---------------------------------------------------------------------------------------------- B
def test_fewer_samples_than_batch_is_refused_not_a_hang(cwd, capsys):
    c = cfg(cwd, "small", batch_size=100000, data={"kind": "synthetic", "num_samples": 3, "test_fraction": 0.99})
    rc, text = port(capsys, "train", c, "--no-progress")
    assert rc == 2 and "batch_size" in text and "0 training samples" in text and "100000" in text, text


# ---------------------------------------------------------------------------------------------- C
@pytest.mark.parametrize("flag", ["12XB", "-5MB", "lots", "0%", "nan%", "1e999"])
def test_bad_budget_flags(cwd, capsys, flag):
    rc, text = port(capsys, "solve", cfg(cwd), "--budget", flag)
    assert rc == 2 and "--budget" in text and "64MB" in text, text


def test_bad_budget_in_config_and_zero_budget(cwd, capsys):
    rc, text = port(capsys, "solve", cfg(cwd, "p", budget="1001%"))
    assert rc == 2 and "key 'budget'" in text, text
    rc, text = port(capsys, "solve", cfg(cwd, "z", budget=0))
    assert rc == 2 and "no plan fits the memory budget of 0 B" in text, text


# ---------------------------------------------------------------------------------------------- D
def test_config_not_utf8(cwd, capsys):
    p = cwd / "bad.yaml"
    p.write_bytes(b"name: t\nmodel: mlp\x91\ninput_shape: [64]\n")
    rc, text = port(capsys, "inspect", p)
    assert rc == 2 and "bad.yaml: line 2" in text and "UTF-8" in text, text


def test_show_on_directory_and_checkpoint(cwd, capsys):
    rc, text = port(capsys, "show", cwd)
    assert rc == 2 and "is a directory" in text and "port solve" in text, text
    _trainer().save_checkpoint(cwd / "c.port")
    rc, text = port(capsys, "show", cwd / "c.port")
    assert rc == 2 and "c.port: not a PORT plan file" in text, text


def test_show_malformed_gantt_without_checksum(plan_file, tmp_path, capsys):
    f, *_ = plan_file
    d = json.loads(f.read_text())
    d.pop("sha256")
    d["gantt"] = [["a", "cpu-c", "zero", None]]
    (tmp_path / "g.json").write_text(json.dumps(d))
    rc, text = port(capsys, "show", tmp_path / "g.json")
    assert rc == 2 and "key 'gantt' is malformed" in text and "solve again" in text, text


def test_report_truncated_measured(tmp_path, capsys):
    from port.pipeline import read_measured
    (tmp_path / "measured.json").write_text('{"step_ms": 1.0, "op_ms": {"a": ')
    with pytest.raises(PortError, match=r"measured\.json: corrupt or truncated.*train again"):
        read_measured(tmp_path / "measured.json")
    (tmp_path / "measured.json").write_text('{"op_ms": [1, 2]}')
    with pytest.raises(PortError, match="key 'op_ms' is malformed"):
        read_measured(tmp_path / "measured.json")


@pytest.mark.parametrize("cmd", ["train-out", "solve-o", "inspect-json", "show-out"])
def test_unwritable_locations_name_the_path(cwd, capsys, plan_file, cmd):
    (cwd / "afile").write_text("x")
    c = cfg(cwd)
    args = {"train-out": ["train", c, "--out", "afile/sub", "--no-progress"],
            "solve-o": ["solve", c, "-o", "afile/sub/p.json"],
            "inspect-json": ["inspect", c, "--json", "afile/sub/g.json"],
            "show-out": ["show", plan_file[0], "--out-dir", "afile/sub"]}[cmd]
    rc, text = port(capsys, *args)
    assert rc == 2 and "afile" in text and "choose another location" in text, text


# ---------------------------------------------------------------------------------------------- E
def test_trainer_api_shapes_and_dtypes():
    tr = _trainer()
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    with pytest.raises(PortError, match=r"labels y of an integer dtype.*float32"):
        tr.step(x, y.float() + 0.7)
    with pytest.raises(PortError, match="integer dtype.*torch.bool"):
        tr.step(x, y > 4)
    with pytest.raises(PortError, match=r"labels y of shape \[8\].*\[8, 1\]"):
        tr.step(x, y[:, None])
    with pytest.raises(PortError, match=r"expects x of shape \[8, 64\], got \[8, 63\]"):
        tr.step(x[:, :63], y)
    with pytest.raises(PortError, match=r"predict\(\) expects x of shape \[M, 64\].*\[3, 32\]"):
        tr.predict(torch.randn(3, 32))
    with pytest.raises(PortError, match="B >= 1"):
        Trainer(M.get("mlp", seed=0), torch.randn(0, 64))
    # numpy arrays and lists are converted (like torch.as_tensor), with the same result as tensors
    t2 = _trainer()
    l1 = tr.step(x, y)
    l2 = t2.step(x.numpy(), y.tolist())
    assert l1 == l2 and tr.predict(x[:3]).shape == (3, 10) and t2.predict(x[:3].numpy()).shape == (3, 10)


def test_huge_thread_counts_are_refused(cwd, capsys):
    """threads=10^8 crashed or hung inside libgomp: Trainer(threads=), capi.set_num_threads and `port train
    --threads` refuse counts above max(64, 4 x the CPUs), naming the limit, and the current count is kept."""
    from port.exec import capi
    top, before = capi.max_threads(), capi.get_num_threads()
    for bad in (10**8, top + 1):
        with pytest.raises(PortError, match=rf"threads={bad}: expected 1\.\.{top}"):
            Trainer(M.get("mlp", seed=0), torch.randn(8, 64), threads=bad)
        with pytest.raises(capi.ThreadCountError, match=f"expected 1..{top}"):
            capi.set_num_threads(bad)
        rc, text = port(capsys, "train", cfg(cwd), "--threads", bad)
        assert rc == 2 and "train.threads" in text and f"at most {top}" in text, text
    assert capi.get_num_threads() == before
    assert Trainer(M.get("mlp", seed=0), torch.randn(8, 64), threads=top).threads == top
    capi.set_num_threads(before)


def test_wrong_input_shape_names_key_without_traceback(cwd, capsys):
    rc, text = port(capsys, "inspect", cfg(cwd, "s", model="digits_cnn", input_shape=[3, 32]))
    assert rc == 2 and "key 'input_shape'" in text and "[3, 32]" in text, text


# ---------------------------------------------------------------------------------------------- F
@pytest.mark.parametrize("lr", [".inf", ".nan"])
def test_nonfinite_lr_refused_by_schema(cwd, capsys, lr):
    p = cwd / "lr.yaml"
    p.write_text(f"name: lr\nmodel: mlp\ninput_shape: [64]\noptimizer: {{lr: {lr}}}\n")
    rc, text = port(capsys, "inspect", p)
    assert rc == 2 and "optimizer.lr" in text and "finite" in text, text


def test_diverging_training_stops_with_named_error(cwd, capsys):
    c = cfg(cwd, "big", optimizer={"lr": 1e30, "name": "sgd"}, train={"steps": 20, "checkpoint_every": 1})
    rc, text = port(capsys, "train", c, "--no-progress")
    assert rc == 2 and "not finite" in text and "step " in text and "lower the learning rate" in text, text
    assert "checkpoint" in text
    hdr = read_header(cwd / "runs" / "big" / "checkpoint.port")
    assert hdr["step"] >= 1        # the last good step's checkpoint is intact and readable
    rc, text = port(capsys, "train", c, "--no-progress", "--on-nonfinite", "skip", "--out", "runs2")
    assert rc == 0 and "update skipped" in text, text


def test_trainer_nonfinite_policy():
    tr = Trainer(M.get("mlp", seed=0), torch.randn(8, 64), optimizer=SGD(1e30))
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    with pytest.raises(NonFiniteError, match="lower the learning rate"):
        for _ in range(20):
            tr.step(x, y)
    before = tr.state_dict()
    with pytest.raises(NonFiniteError):
        tr.step(x, y)
    assert all(torch.equal(v, tr.state_dict()[k]) for k, v in before.items())   # the update was not applied
    tr2 = Trainer(M.get("mlp", seed=0), torch.randn(8, 64), optimizer=SGD(1e30), on_nonfinite="skip")
    for _ in range(20):
        tr2.step(x, y)
    assert tr2.skipped_steps > 0 and tr2.step_count == 20


def test_nonfinite_check_covers_every_gradient():
    """The gradient check sums a few runs of the arena (adjacent gradient slots merged): every gradient's bytes lie
    in a run, the runs hold nothing else but alignment padding, and a non-finite value in any gradient, with a
    finite loss, is found."""
    tr = Trainer(M.get("resnet8", seed=0), torch.randn(4, 3, 32, 32))
    tr.step(torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))
    from port.ir.types import ROLE_GRADIENT
    grads = [s for s in tr.program.slots if s.role == ROLE_GRADIENT and s.region == "persistent"]
    base = tr.arena.data_ptr()
    from port.exec.executor import grad_runs     # the runs Executor.nonfinite sums (Trainer.step's check)
    runs = [(r.data_ptr() - base, r.numel() * r.element_size())
            for r in grad_runs(tr.program, tr.arena, tr.executor.update_calls)]
    assert len(grads) > 10 and len(runs) < len(grads)
    for g in grads:
        assert any(o <= g.offset and g.offset + g.nbytes <= o + n for o, n in runs), g.name
    assert sum(n for _, n in runs) < sum(g.nbytes for g in grads) + 64 * len(grads)
    assert not tr._nonfinite(1.0)
    for g in (grads[0], grads[len(grads) // 2], grads[-1]):
        v = tr.arena[g.offset:g.offset + g.nbytes].view(torch.float32)
        keep = v[-1].item()
        v[-1] = float("inf")
        assert tr._nonfinite(1.0), g.name
        v[-1] = keep


# ---------------------------------------------------------------------------------------------- G
@pytest.mark.parametrize("name", ["../../escape", "", "a/b", ".hidden", "x" * 200])
def test_names_are_validated(cwd, capsys, name):
    c = cwd / "n.yaml"
    c.write_text(json.dumps({"name": name, "model": "mlp", "input_shape": [64], "device": MODELED}))
    rc, text = port(capsys, "train", c, "--no-progress", "--out", "o/x")
    assert rc == 2 and "key 'name'" in text and "letters, digits" in text, text
    assert not (cwd / "escape").exists() and not (cwd / "o").exists()


# ---------------------------------------------------------------------------------------------- H
@pytest.mark.parametrize("args,flag", [
    (["solve", "{c}", "--gap", "-1"], "solver.gap"), (["solve", "{c}", "--time-limit", "0"], "solver.time_limit_s"),
    (["solve", "{c}", "--gap", "nan"], "solver.gap"), (["train", "{c}", "--steps", "-5"], "--steps"),
    (["profile", "{c}", "--max-time", "-1"], "--max-time"), (["profile", "{c}", "--block-ms", "-5"], "--block-ms"),
    (["profile", "{c}", "--max-time", "nan"], "--max-time"),
    (["train", "{c}", "--on-nonfinite", "ignore"], "train.on_nonfinite")])
def test_cli_flags_checked_like_the_schema(cwd, capsys, args, flag):
    c = cfg(cwd)
    rc, text = port(capsys, *[str(c) if a == "{c}" else a for a in args])
    assert rc == 2 and flag in text, text


def test_duplicate_yaml_key_and_solver_names(cwd, capsys):
    p = cwd / "dup.yaml"
    p.write_text("name: d\nmodel: mlp\ninput_shape: [64]\nbatch_size: 8\nbatch_size: 16\n")
    rc, text = port(capsys, "inspect", p)
    assert rc == 2 and "dup.yaml: line 5: key 'batch_size' is given twice (first on line 4" in text, text
    from port.config import SOLVER_NAMES, SolverConfig
    from port.solver import SOLVERS
    assert set(SOLVER_NAMES) == set(SOLVERS)
    assert SolverConfig(name="chen_sqrt").name == "chen"


# ---------------------------------------------------------------------------------------------- I
def test_train_on_modeled_device_runs_with_a_stand_in(cwd, capsys):
    c = cfg(cwd, "jet", model="digits_cnn", input_shape=[1, 8, 8], batch_size=16)
    rc, text = port(capsys, "train", c, "--no-progress")
    assert rc == 0, text
    assert "is modeled" in text and "stand-ins" in text and "predicted time and memory are for" in text


# ---------------------------------------------------------------------------------------------- J
def test_stale_temp_files_cleaned_on_next_write(tmp_path):
    from port.io import atomic_write_text
    import subprocess
    import sys
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / f".checkpoint.port.p{dead}.abc123.tmp"
    old = tmp_path / ".checkpoint.port.zz9q_x1.tmp"            # older PORTs' name, from a long-gone writer
    live = tmp_path / f".checkpoint.port.p{os.getpid()}.live12.tmp"
    other = tmp_path / ".other.p1.abc.tmp"
    for f in (stale, old, live, other):
        f.write_text("partial")
    os.utime(old, (1, 1))
    _trainer().save_checkpoint(tmp_path / "checkpoint.port")
    assert not stale.exists() and not old.exists() and live.exists() and other.exists()
    atomic_write_text(tmp_path / "checkpoint.port", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["checkpoint.port", live.name, other.name])


def test_baseline_over_budget_is_an_error_not_a_plan(cwd, capsys):
    """`--solver chen` under an impossible budget used to print "plan: infeasible", exit 0 and write the plan."""
    rc, text = port(capsys, "solve", cfg(cwd), "--solver", "chen", "--budget", "1KB", "-o", cwd / "p.json")
    assert rc == 2 and "solver 'chen' finds no plan within the budget" in text and "--solver highs" in text, text
    assert not (cwd / "p.json").exists()
