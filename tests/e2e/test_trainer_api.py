"""Trainer API: checkpoints (format, atomicity, bit-exact resume), export (ONNX checked), evaluate/predict,
dropout reproducibility and rate, parameter_delta, CLI training."""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch

import port.models as M
from port.errors import PortError
from port.train.checkpoint import CheckpointError, read_checkpoint, save_trainer
from port.train.optim import SGD, AdamW
from port.train.trainer import Trainer
from _equiv import data


def _run(tr, batches):
    return [tr.step(x, y) for x, y in batches]


@pytest.mark.parametrize("opt", [SGD(0.05, momentum=0.9), AdamW(1e-3)])
def test_resume_is_bit_exact(tmp_path, opt):
    batches = data("mlp", 8, 10)
    a = Trainer(M.get("mlp", seed=0), batches[0][0], optimizer=copy.deepcopy(opt), seed=3)
    la = _run(a, batches)
    b = Trainer(M.get("mlp", seed=0), batches[0][0], optimizer=copy.deepcopy(opt), seed=3)
    lb = _run(b, batches[:5])
    b.save_checkpoint(tmp_path / "c.port")
    c = Trainer.resume(tmp_path / "c.port", M.get("mlp", seed=1), batches[0][0])
    lc = _run(c, batches[5:])
    assert la == lb + lc
    for k, v in a.state_dict().items():
        assert torch.equal(v, c.state_dict()[k]), k
    assert c.step_count == 10


def test_checkpoint_format_not_pickle(tmp_path):
    tr = Trainer(M.get("digits_cnn", seed=0), torch.randn(4, 1, 8, 8), optimizer=SGD(0.1, momentum=0.9))
    tr.save_checkpoint(tmp_path / "c.port")
    raw = (tmp_path / "c.port").read_bytes()
    assert raw[:8] == b"PORTCKPT" and b"\x80\x04" not in raw[:16]
    hdr, t = read_checkpoint(tmp_path / "c.port")
    assert hdr["format"] == 2 and "0.weight" in t and any(e["kind"] == "optimizer_state" for e in hdr["tensors"])
    bad = bytearray(raw)
    bad[-5] ^= 0xFF
    (tmp_path / "bad.port").write_bytes(bytes(bad))
    with pytest.raises(CheckpointError, match="checksum"):
        read_checkpoint(tmp_path / "bad.port")
    (tmp_path / "trunc.port").write_bytes(raw[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        read_checkpoint(tmp_path / "trunc.port")


def test_failed_write_keeps_previous_checkpoint(tmp_path):
    x, y = data("mlp", 8, 1)[0]
    tr = Trainer(M.get("mlp", seed=0), x, optimizer=SGD(0.05, momentum=0.9))
    tr.step(x, y)
    path = tmp_path / "c.port"
    tr.save_checkpoint(path)
    before = path.read_bytes()
    tr.step(x, y)
    with pytest.raises(OSError, match="simulated"):
        save_trainer(tr, path, _fail_after=1000)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["c.port"]
    assert read_checkpoint(path)[0]["step"] == 1


def test_kill_during_write_keeps_previous_checkpoint(tmp_path):
    """A subprocess killed (SIGKILL) while writing a large checkpoint leaves the previous one intact."""
    import signal
    import subprocess
    import sys
    import time
    path = tmp_path / "c.port"
    code = f"""
import sys, torch, port.train.checkpoint as C
C.write_checkpoint({str(path)!r}, {{"step": 1}}, [({{"name": "w", "kind": "parameter"}}, torch.ones(1000))])
print("ready", flush=True)
big = torch.randn(60_000_000)
while True:
    C.write_checkpoint({str(path)!r}, {{"step": 2}}, [({{"name": "w", "kind": "parameter"}}, big)])
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert p.stdout.readline().strip() == b"ready"
    deadline = time.time() + 60
    # the writer's temporary file is `.c.port.p<pid>.XXXX.tmp` (port/io.py): kill while it exists
    while time.time() < deadline and not any(n.endswith(".tmp") for n in os.listdir(tmp_path)):
        time.sleep(0.005)
    seen = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert seen, "the writer never had a temporary file beside the checkpoint"
    hdr, t = read_checkpoint(path)   # previous (or a complete new) checkpoint, never torn
    assert hdr["step"] in (1, 2)


def test_export_onnx_and_torch(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    batches = data("resnet8", 4, 3)
    tr = Trainer(M.get("resnet8", seed=0), batches[0][0], optimizer=SGD(0.05, momentum=0.9))
    _run(tr, batches)
    p = tr.export(tmp_path / "m.onnx")   # checks onnxruntime logits vs the trained model within 1e-4
    import onnx
    g = onnx.load(str(p))
    assert not any(n.op_type == "BatchNormalization" for n in g.graph.node)
    sess = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
    x = torch.randn(5, 3, 32, 32)                  # another batch size than the export's: the batch is dynamic
    assert sess.get_inputs()[0].shape[0] != 4
    assert torch.allclose(torch.from_numpy(sess.run(None, {"input": x.numpy()})[0]), tr.predict(x), atol=1e-4,
                          rtol=1e-4)
    tr.export(tmp_path / "m.pt2", format="torch")
    ts = torch.export.load(str(tmp_path / "m.pt2")).module()
    assert torch.allclose(ts(x), tr.predict(x), atol=1e-4, rtol=1e-4)


class _VarArgs(torch.nn.Module):
    """forward(*args, **kwargs), as peft's wrappers take their input (examples/llama_lora)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, *args, **kwargs):
        return self.fc(torch.tanh(args[0]))


def test_export_a_model_whose_forward_takes_varargs(tmp_path):
    """Both formats export a model whose forward takes *args with the batch dynamic (torch.export refused the
    dynamic shapes before: "inputs[0] is a tuple, but dynamic_shapes[0] is a dict")."""
    pytest.importorskip("onnxruntime")
    x = torch.randn(4, 6)
    tr = Trainer(_VarArgs(), x, optimizer=SGD(0.1))
    tr.step(x, torch.tensor([0, 1, 2, 3]))
    tr.export(tmp_path / "m.onnx")              # checked against the trained model by onnxruntime
    tr.export(tmp_path / "m.pt2", format="torch")
    x5 = torch.randn(5, 6)
    assert torch.allclose(torch.export.load(str(tmp_path / "m.pt2")).module()(x5), tr.predict(x5), atol=1e-5)


class _ConvBN(torch.nn.Module):
    """conv -> bn (folded at export); conv -> bn whose conv output a residual also reads (kept); a norm with its
    own forward (kept)."""

    class _MyBN(torch.nn.BatchNorm2d):
        def forward(self, x):
            return super().forward(x) * 0.5

    def __init__(self):
        super().__init__()
        nn = torch.nn
        torch.manual_seed(0)
        self.c1, self.b1 = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.c2, self.b2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.c3, self.b3 = nn.Conv2d(4, 4, 1), self._MyBN(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        z = self.c2(h)
        h = self.b3(self.c3(self.b2(z) + z))
        return self.fc(h.mean((2, 3)))


def test_export_folds_conv_bn_from_the_captured_graph(monkeypatch):
    """Batch norms are folded into the convolutions the captured graph shows feeding only them, without a second
    tracer (torch.fx.symbolic_trace, which torch.fx's fuse ran, is made to fail here), and the folded module
    predicts what the Trainer does."""
    import torch.fx
    from port.train.export import folded_module

    def no_fx(*a, **k):
        raise AssertionError("torch.fx symbolic tracing used")
    monkeypatch.setattr(torch.fx, "symbolic_trace", no_fx)      # (torch.export's own make_fx tracer is not this)
    x, y = torch.randn(4, 3, 6, 6), torch.tensor([0, 1, 2, 0])
    tr = Trainer(_ConvBN(), x, optimizer=SGD(0.05, momentum=0.9))
    _run(tr, [(x, y)] * 3)
    f = folded_module(tr.to_torch(), tr.graph)
    assert isinstance(f.b1, torch.nn.Identity) and type(f.c1) is torch.nn.Conv2d
    assert type(f.b2) is torch.nn.BatchNorm2d and type(f.b3) is _ConvBN._MyBN     # read twice; own forward
    with torch.no_grad():
        torch.testing.assert_close(f(x), tr.predict(x), rtol=1e-4, atol=1e-5)


def test_evaluate_predict_to_torch():
    from port.train.data import load
    from port import config as C
    cfg = C.load_experiment("configs/default.yaml")
    ds = load(cfg)
    m = M.get("digits_cnn", seed=0)
    tr = Trainer(m, ds.x_train[:32], optimizer=SGD(0.05, momentum=0.9, weight_decay=5e-4))
    for i, (x, y) in enumerate(ds.batches(32)):
        tr.step(x, y)
    ev = tr.evaluate(ds.test_batches(50))     # odd batch sizes are padded
    assert ev["accuracy"] > 0.7
    tm = tr.to_torch().eval()
    with torch.no_grad():
        ref = tm(ds.x_test)
    assert torch.allclose(tr.predict(ds.x_test), ref, atol=1e-4, rtol=1e-4)
    assert int(tm[1].num_batches_tracked) == tr.step_count


def test_dropout_reproducible_with_right_rate():
    x, y = data("mlp", 64, 1)[0]
    a = Trainer(M.get("mlp", seed=0, dropout=0.5), x, optimizer=SGD(0.0), seed=7)
    b = Trainer(M.get("mlp", seed=0, dropout=0.5), x, optimizer=SGD(0.0), seed=7)
    la, lb = _run(a, [(x, y)] * 3), _run(b, [(x, y)] * 3)
    assert la == lb and la[0] != la[1]       # same seed: same masks; new step: new mask
    ex = a.executor
    mask_id = next(s.tensor for s in a.program.slots if s.name.endswith(":mask"))
    m = ex.view(mask_id).float()
    assert abs(float(m.mean()) - 0.5) < 0.02
    drop = next(c for c in a.program.calls if c.kernel == "dropout")
    xin, yout = ex.view(drop.inputs[0]), ex.view(drop.outputs[0])
    # inverted dropout scale 1/(1-p); the output may alias the input (in place), so check kept entries only
    kept = m.bool()
    assert torch.all(yout[~kept] == 0)


def test_parameter_delta_only_changed():
    x, y = data("resnet8", 2, 1)[0]
    base = M.get("resnet8", seed=0).state_dict()
    tr = Trainer(M.get("resnet8", seed=0), x, optimizer=SGD(0.05), trainable=["fc"])
    tr.step(x, y)
    d = tr.parameter_delta(base)
    assert set(d) == {"fc.weight", "fc.bias"}


def test_run_training_resume(tmp_path, monkeypatch):
    from port.pipeline import run_training
    monkeypatch.chdir(tmp_path)             # the profile goes to ./profiles/host/t.json, not the repository
    cfgp = tmp_path / "c.yaml"
    cfgp.write_text("name: t\nmodel: mlp\ninput_shape: [64]\nbatch_size: 16\ndata: {kind: digits}\n"
                    "train: {steps: 20, checkpoint_every: 10}\n")
    r = run_training(cfgp, steps=10, out_dir=tmp_path, quiet=True)
    assert r.steps == 10 and r.profile_source == "measured"
    assert r.profile_path == Path("profiles") / "host" / "t.json"
    r2 = run_training(cfgp, resume=True, out_dir=tmp_path, quiet=True)
    assert r2.steps == 20 and r2.accuracy > 0.5 and r2.profile_source == "file"


def _plan_for(model, x, **kw):
    import port
    from port.config import load_device
    from port.cost.roofline import modeled_profile
    g = port.trace(model, x, **kw)
    prof = modeled_profile(g, load_device("host"))
    return port.solve(g, prof, "100%", solver="greedy"), g


def test_plan_of_another_batch_is_refused_naming_both_batches(tmp_path):
    x8 = torch.randn(8, 64)
    plan4, g4 = _plan_for(M.get("mlp", seed=0), torch.randn(4, 64), optimizer="sgd_momentum")
    with pytest.raises(PortError) as e:
        Trainer(M.get("mlp", seed=0), x8, plan=plan4, optimizer=SGD(0.05, momentum=0.9))
    assert "allow_plan_mismatch" in str(e.value) and "batch 8" in str(e.value)
    # the batch the plan was solved for is named when the plan file records it (port.pipeline writes it)
    from port.plan.io import save_plan
    save_plan(plan4, tmp_path / "p4.json", g4, extra={"batch_size": 4})
    with pytest.raises(PortError) as e:
        Trainer(M.get("mlp", seed=0), x8, plan=tmp_path / "p4.json", optimizer=SGD(0.05, momentum=0.9))
    assert "solved for batch 4" in str(e.value) and "runs batch 8" in str(e.value)
    # explicit override: runs its decisions, with a warning
    with pytest.warns(UserWarning, match="allow_plan_mismatch"):
        tr = Trainer(M.get("mlp", seed=0), x8, plan=plan4, optimizer=SGD(0.05, momentum=0.9),
                     allow_plan_mismatch=True)
    assert tr.step(x8, torch.randint(0, 10, (8,))) > 0


def test_micro_batch_with_a_full_batch_plan_names_both_batches():
    x8 = torch.randn(8, 64)
    plan8, _ = _plan_for(M.get("mlp", seed=0, dropout=0.0), x8, optimizer="sgd_momentum")
    assert not plan8.early_updates
    with pytest.raises(PortError) as e:
        Trainer(M.get("mlp", seed=0, dropout=0.0), x8, plan=plan8, optimizer=SGD(0.05, momentum=0.9), micro_batch=4)
    msg = str(e.value)
    assert "solved for batch 8" in msg and "runs batch 4" in msg and "micro_batch" in msg
    plan4, _ = _plan_for(M.get("mlp", seed=0, dropout=0.0), x8[:4], optimizer="sgd_momentum")
    tr = Trainer(M.get("mlp", seed=0, dropout=0.0), x8, plan=plan4, optimizer=SGD(0.05, momentum=0.9), micro_batch=4)
    assert tr.step(x8, torch.randint(0, 10, (8,))) > 0


def test_checkpoint_follows_umask(tmp_path):
    tr = Trainer(M.get("mlp", seed=0), torch.randn(4, 64), optimizer=SGD(0.1))
    old = os.umask(0o027)
    try:
        tr.save_checkpoint(tmp_path / "c.port")
    finally:
        os.umask(old)
    assert (tmp_path / "c.port").stat().st_mode & 0o777 == 0o640
