"""Files PORT writes and reads (issue 53, section 3): device names stay inside profiles/, a config's model module
does not stay on sys.path, one `port train` per run directory, a full disk keeps the previous artifacts, and a
profile's numbers are range-checked on load (file and key named). CLI cases run in-process (port.cli.run)."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from port import models as M
from port.errors import DiskFullError, LockedError
from port.io import LOCK_NAME, atomic_write_text, dir_lock
from test_hostile_inputs import MODELED, cfg, port   # tests/unit is on sys.path (rootdir conftest)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    work = tmp_path / "a" / "b" / "c" / "work"      # deep enough that ../../../../ stays inside tmp_path
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    return work


# ---------------------------------------------------------------------------------------------- device names
@pytest.mark.parametrize("name", ["../../../../elsewhere/x", "ABS", "a/b", ".hidden", "..", "x" * 101, ""])
def test_device_name_cannot_leave_profiles(cwd, capsys, tmp_path, name):
    if name == "ABS":
        name = str(tmp_path / "abs" / "x")
    dev = yaml.safe_load((ROOT / "configs" / "devices" / f"{MODELED}.yaml").read_text())
    dev["name"] = name
    (cwd / "dev.yaml").write_text(yaml.safe_dump(dev))
    c = cfg(cwd, device="dev.yaml")
    rc, text = port(capsys, "profile", c)
    assert rc == 2 and "dev.yaml" in text and "key 'name'" in text and "a device name" in text, text
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "abs").exists()
    assert not (cwd / "profiles").exists()


# ---------------------------------------------------------------------------------------------- model modules
def test_model_module_folder_does_not_stay_on_sys_path(tmp_path, monkeypatch):
    """A config naming an installed factory must not make a file beside it (onnxruntime.py) importable later;
    a module beside the config still imports its own neighbours while it is imported and called."""
    from port.pipeline import import_factory, load_job, load_model
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "onnxruntime.py").write_text("raise SystemExit('the onnxruntime.py beside the config ran')\n")
    (proj / "port_probe_beside.py").write_text("X = 1\n")
    before = list(sys.path)
    fn = import_factory("port.models:get", [proj, tmp_path])
    assert fn is M.get and sys.path == before
    import importlib.util
    assert importlib.util.find_spec("port_probe_beside") is None
    # the user's module beside the config: its sibling imports work (eager and lazy, in the factory)
    (proj / "port_probe_helper.py").write_text("WIDTH = 8\n")
    (proj / "port_probe_net.py").write_text(
        "import torch.nn as nn\nimport port_probe_helper\n\n"
        "def make(num_classes=10):\n    import port_probe_helper as h\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, h.WIDTH), nn.ReLU(), nn.Linear(h.WIDTH, num_classes))\n")
    c = cfg(proj, model={"name": "port_probe_net:make"})
    monkeypatch.chdir(tmp_path)
    try:
        model = load_model(load_job(c))
        assert model[1].out_features == 8 and sys.path == before
        assert importlib.util.find_spec("port_probe_beside") is None
    finally:
        for m in ("port_probe_net", "port_probe_helper"):
            sys.modules.pop(m, None)


# ---------------------------------------------------------------------------------------------- run lock
def test_second_train_on_a_run_directory_is_refused_with_the_holders_pid(cwd, capsys):
    c = cfg(cwd)
    run_dir = cwd / "runs" / "t"
    run_dir.mkdir(parents=True)
    code = ("import sys\nfrom pathlib import Path\nfrom port.io import dir_lock\n"
            "with dir_lock(Path(sys.argv[1])):\n    print('held', flush=True)\n    sys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert holder.stdout.readline().strip() == "held"
        rc, text = port(capsys, "train", c, "--no-progress")
        assert rc == 2 and f"PID {holder.pid}" in text and str(Path("runs") / "t") in text, text
        assert not (run_dir / "config.yaml").exists()           # nothing of the run was written
        holder.send_signal(signal.SIGKILL)                        # a holder that dies keeps no lock
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
    assert (run_dir / LOCK_NAME).read_text().strip() == str(holder.pid)     # its stale PID is still written
    with dir_lock(run_dir) as lock:
        assert lock.read_text().strip() == str(os.getpid())


def test_run_lock_is_released_when_training_stops(cwd, capsys):
    d = cwd / "d"
    d.mkdir()
    with dir_lock(d):
        with pytest.raises(LockedError, match=f"PID {os.getpid()}") as e:   # a second holder, even in-process
            with dir_lock(d):
                pass
        assert e.value.pid == os.getpid()
    with dir_lock(d):
        pass
    # a run that fails after taking the lock (batch larger than the data) releases it
    c = cfg(cwd, batch_size=64)
    rc, text = port(capsys, "train", c, "--no-progress")
    assert rc == 2 and "batch_size" in text, text
    with dir_lock(cwd / "runs" / "t"):
        pass


# ---------------------------------------------------------------------------------------------- disk full
def _fsync_full(names: tuple[str, ...]):
    """An os.fsync that fails with ENOSPC for the temporary files of ``names`` (Linux: /proc/self/fd)."""
    real = os.fsync

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        if any(f"/.{n}." in target for n in names):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)
    return fsync


needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")


@needs_proc
def test_atomic_write_on_a_full_disk_keeps_the_previous_file(tmp_path, monkeypatch):
    import port.io as io_mod
    p = tmp_path / "plan.json"
    atomic_write_text(p, "old")
    monkeypatch.setattr(io_mod.os, "fsync", _fsync_full(("plan.json", "new.json")))
    with pytest.raises(DiskFullError) as e:
        atomic_write_text(p, "new" * 1000)
    msg = str(e.value)
    assert str(p) in msg and "no space left" in msg and "previous plan.json is kept" in msg and "free" in msg
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(p)
    assert p.read_text() == "old" and sorted(q.name for q in tmp_path.iterdir()) == ["plan.json"]
    with pytest.raises(DiskFullError, match="no new.json was written"):
        atomic_write_text(tmp_path / "new.json", "x")
    # other write errors stay what they are
    monkeypatch.setattr(io_mod.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError) as e2:
        atomic_write_text(p, "x")
    assert not isinstance(e2.value, DiskFullError) and p.read_text() == "old"


@needs_proc
def test_train_on_a_full_disk_names_the_export_and_keeps_the_previous_one(cwd, capsys, monkeypatch):
    import onnxruntime as ort
    monkeypatch.setenv("PORT_EXPORT", "onnx,torch")

    import port.io as io_mod
    c = cfg(cwd)
    rc, text = port(capsys, "train", c, "--no-progress")
    assert rc == 0, text
    run_dir = cwd / "runs" / "t"
    old = {n: (run_dir / n).read_bytes() for n in ("model.onnx", "model.pt2", "checkpoint.port", "plan.json")}
    assert torch.export.load(str(run_dir / "model.pt2")) is not None             # written whole through memory
    ort.InferenceSession(str(run_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    monkeypatch.setattr(io_mod.os, "fsync", _fsync_full(("model.onnx", "model.pt2")))
    rc, text = port(capsys, "train", c, "--no-progress", "--steps", "3")
    assert rc == 2 and str(Path("runs") / "t" / "model.onnx") in text and "no space left" in text, text
    assert "previous model.onnx is kept" in text
    assert (run_dir / "model.onnx").read_bytes() == old["model.onnx"]
    assert (run_dir / "model.pt2").read_bytes() == old["model.pt2"]
    assert not [q.name for q in run_dir.iterdir() if q.name.endswith(".tmp")]
    # a full disk at the checkpoint: named, the previous checkpoint kept
    ck = (run_dir / "checkpoint.port").read_bytes()
    monkeypatch.setattr(io_mod.os, "fsync", _fsync_full(("checkpoint.port",)))
    rc, text = port(capsys, "train", c, "--no-progress", "--steps", "4")
    assert rc == 2 and "checkpoint.port" in text and "no space left" in text, text
    assert (run_dir / "checkpoint.port").read_bytes() == ck


def test_metrics_on_a_full_disk_is_named(cwd, capsys, monkeypatch):
    c = cfg(cwd)
    real_open = Path.open

    class Full:
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, s):
            self.n += 1
            if self.n > 1:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.f.write(s)

        def __getattr__(self, k):
            return getattr(self.f, k)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

    def fake_open(self, *a, **k):
        f = real_open(self, *a, **k)
        return Full(f) if self.name == "metrics.jsonl" else f
    monkeypatch.setattr(Path, "open", fake_open)
    rc, text = port(capsys, "train", c, "--no-progress")
    assert rc == 2 and "metrics.jsonl" in text and "step 2" in text and "checkpoint is intact" in text, text


# ---------------------------------------------------------------------------------------------- profile ranges
@pytest.fixture(scope="module")
def profile_dict(tmp_path_factory):
    from port.config import load_device
    from port.cost.io import profile_to_dict
    from port.cost.roofline import modeled_profile
    from port.ir.trace import trace
    g = trace(M.get("mlp", seed=0), torch.randn(8, 64), name="mlp")
    d = profile_to_dict(modeled_profile(g, load_device(MODELED)))
    d.pop("sha256")
    d["storage"] = {"bandwidth_gbps": 2.0, "latency_ms": 0.1}
    d["accelerator_caps"] = {d["accelerators"][0]: 2**30}
    d["engine_bytes"] = {d["accelerators"][0]: 2**20}
    return d


def _set(path: str, value):
    def edit(d):
        *head, last = path.split(".")
        for k in head:
            d = d[int(k)] if isinstance(d, list) else d[k]
        if isinstance(d, list):
            d[int(last)] = value
        else:
            d[last] = value
    return edit


@pytest.mark.parametrize("path,value,key", [
    ("entries.0.latency_ms", float("nan"), "entries[0]: key 'latency_ms'"),
    ("entries.0.latency_ms", -1.0, "entries[0]: key 'latency_ms'"),
    ("entries.1.latency_ms", 1e300, "entries[1]: key 'latency_ms'"),
    ("entries.0.spread_ms", float("inf"), "entries[0]: key 'spread_ms'"),
    ("entries.0.workspace_bytes", -1, "entries[0]: key 'workspace_bytes'"),
    ("entries.2.workspace_bytes", 10**300, "entries[2]: key 'workspace_bytes'"),
    ("entries.0.peak_delta_bytes", -(2**40), "entries[0]: key 'peak_delta_bytes'"),
    ("entries.0.samples", -3, "entries[0]: key 'samples'"),
    ("handoff.0.latency_ms", float("nan"), "handoff[0]: key 'latency_ms'"),
    ("handoff.0.bytes_per_ms", 0.0, "handoff[0]: key 'bytes_per_ms'"),
    ("handoff.0.bytes_per_ms", -5.0, "handoff[0]: key 'bytes_per_ms'"),
    ("handoff.0.src", "nope", "handoff[0]: accelerator 'nope'"),
    ("memory_bytes", 10**300, "key 'memory_bytes'"),
    ("memory_bytes", -1, "key 'memory_bytes'"),
    ("threads", -2, "key 'threads'"),
    ("accelerator_caps.cpu", -5, "key 'accelerator_caps.cpu'"),
    ("engine_bytes.cpu", 2**60, "key 'engine_bytes.cpu'"),
    ("storage.bandwidth_gbps", -1.0, "key 'storage.bandwidth_gbps'"),
    ("storage.latency_ms", float("nan"), "key 'storage.latency_ms'")])
def test_profile_numbers_are_range_checked(cwd, capsys, profile_dict, path, value, key):
    d = json.loads(json.dumps(profile_dict))
    assert d["accelerators"][0] == "cpu"
    _set(path, value)(d)
    f = cwd / "p.json"
    f.write_text(json.dumps(d))
    rc, text = port(capsys, "solve", cfg(cwd), "--profile", f)
    assert rc == 2 and f"{f}: {key}" in text and "re-run `port profile`" in text, text
    assert "internal error" not in text and len(text) < 2000


def test_profile_in_range_still_solves(cwd, capsys, profile_dict):
    f = cwd / "p.json"
    f.write_text(json.dumps(profile_dict))
    rc, text = port(capsys, "solve", cfg(cwd), "--profile", f, "--budget", "100%")
    assert rc == 0, text


@pytest.mark.parametrize("key,value", [("op_ms", {"a": float("nan")}), ("op_ms", {"a": -1.0}),
                                       ("step_ms", 1e300), ("timeline_bytes", [1, -5])])
def test_measured_numbers_are_range_checked(tmp_path, key, value):
    from port.errors import PortError
    from port.pipeline import read_measured
    (tmp_path / "measured.json").write_text(json.dumps({key: value}))
    with pytest.raises(PortError, match=f"measured.json: key '{key}' is malformed or out of range"):
        read_measured(tmp_path / "measured.json")
