"""port-rt (issue 13): a compiled bundle trains without Python, bit for bit like the Python executor.

The same all-C plan runs 20 steps in the Python Trainer and in the `port-rt` binary (built by `make port-rt`,
same thread count, same GEMM): every loss is equal as float32 bits, and so is the inference program's output.
Bundles and data files with a wrong magic, version, size, checksum or an offset outside the arena are refused
by the C loader; a plan with torch-backend ops does not compile (named ops)."""
from __future__ import annotations

import ctypes
import hashlib
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import port
from port import models
from port.exec import capi
from port.exec.bundle import BundleError, check_bundle, write_bundle, write_data

from nets54 import (AvgPools, LastTokenPool, NormPool, PadEmb, PaddedAttn, TwoInputs, Views, WhereNet,
                    WindowEinsumAttn)

ROOT = Path(__file__).resolve().parents[2]
N = 40


def _case(name, shape, B=8, optimizer=None, seed=0):
    torch.manual_seed(seed)
    m = models.get(name, seed=seed)
    x = torch.randn(N, *shape)
    y = torch.randint(0, 10, (N,))
    tr = port.Trainer(m, x[:B], optimizer=optimizer or port.optim.SGD(0.05, momentum=0.9))
    return tr, x, y


def _run(binary, *args):
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("name,shape,opt", [
    ("digits_cnn", (1, 8, 8), "sgd"),
    ("resnet8", (3, 32, 32), "sgd"),
    ("mlp", (64,), "adamw"),
])
def test_port_rt_equals_python_executor_bit_for_bit(port_rt, tmp_path, name, shape, opt):
    o = port.optim.AdamW(1e-3) if opt == "adamw" else port.optim.SGD(0.05, momentum=0.9, weight_decay=5e-4)
    tr, x, y = _case(name, shape, optimizer=o)
    B = tr.batch_size
    info = write_bundle(tr, tmp_path / "m.portrt")
    assert info.train_calls == len(tr.program.calls) and info.arena_bytes >= tr.program.arena_bytes
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), 10)
    threads = capi.get_num_threads()
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata", "--steps", 20,
             "--threads", threads)
    assert r.returncode == 0, r.stderr
    got = [np.float32(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("step ")]
    ref = []
    for s in range(20):
        idx = [(s * B + j) % N for j in range(B)]
        ref.append(np.float32(tr.step(x[idx], y[idx])))
    assert len(got) == 20
    assert [a.tobytes() for a in got] == [b.tobytes() for b in ref], list(zip(ref, got))
    assert "vmhwm_kb" in r.stdout.splitlines()[-1]


def test_port_rt_eval_matches_predict(port_rt, tmp_path):
    tr, x, y = _case("digits_cnn", (1, 8, 8))
    write_bundle(tr, tmp_path / "m.portrt")
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), 10)
    r = _run(port_rt, "eval", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata",
             "--threads", capi.get_num_threads())
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("eval "))
    correct = int(line.split()[4])
    pred = torch.cat([tr.predict(x[i:i + 8]) for i in range(0, N, 8)]).argmax(1)
    assert correct == int((pred == y).sum())


def test_port_rt_info_and_cli_errors(port_rt, tmp_path):
    tr, x, y = _case("mlp", (64,))
    write_bundle(tr, tmp_path / "m.portrt")
    r = _run(port_rt, "info", tmp_path / "m.portrt")
    assert r.returncode == 0 and "training calls" in r.stdout and tr.program.graph_digest[:16] in r.stdout
    assert _run(port_rt, "train", tmp_path / "m.portrt").returncode == 2                   # no --data
    assert _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "nope").returncode == 2
    assert _run(port_rt, "train", tmp_path / "m.portrt", "--steps", "-3").returncode == 2
    assert _run(port_rt, "frobnicate", tmp_path / "m.portrt").returncode == 2
    # data of another shape, and labels out of range
    write_data(tmp_path / "bad.portdata", np.zeros((4, 3)), np.zeros(4), 10)
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "bad.portdata")
    assert r.returncode == 2 and "floats" in r.stderr
    with pytest.raises(BundleError, match="labels"):
        write_data(tmp_path / "bad2.portdata", np.zeros((4, 64)), np.array([0, 1, 2, 10]), 10)


def _rechecksum(b: bytearray) -> bytearray:
    b[-32:] = hashlib.sha256(bytes(b[:-32])).digest()
    return b


def test_bundle_refusals(tmp_path, port_rt):
    tr, x, y = _case("digits_cnn", (1, 8, 8))
    p = tmp_path / "m.portrt"
    write_bundle(tr, p)
    good = bytearray(p.read_bytes())
    assert check_bundle(p) >= tr.program.arena_bytes
    calls_at = struct.unpack_from("<Q", good, 48)[0]
    cases = {
        "magic": _rechecksum(bytearray(b"XORTRTB\0") + good[8:]),
        "version": _rechecksum(good[:8] + struct.pack("<I", 9) + good[12:]),
        "truncated": good[:-100],
        "flipped byte (checksum)": good[:1000] + bytes([good[1000] ^ 1]) + good[1001:],
        "offset outside the arena": _rechecksum(good[:calls_at + 16] + struct.pack("<q", 1 << 40)
                                                + good[calls_at + 24:]),
        "unknown kernel": _rechecksum(good[:calls_at] + struct.pack("<i", 999) + good[calls_at + 4:]),
    }
    for what, data in cases.items():
        q = tmp_path / "bad.portrt"
        q.write_bytes(bytes(data))
        with pytest.raises(BundleError, match="not a valid port-rt bundle"):
            check_bundle(q)
        r = _run(port_rt, "info", q)
        assert r.returncode == 2 and "not a valid bundle" in r.stderr, what


def test_compile_refuses_torch_ops(tmp_path):
    from port.lower.lower import default_plan
    torch.manual_seed(0)
    m = models.get("digits_cnn", seed=0)
    x = torch.randn(8, 1, 8, 8)
    g = port.trace(m, x, optimizer="sgd_momentum")
    plan = default_plan(g, "torch-cpu")
    tr = port.Trainer(m, x, plan=plan, optimizer=port.optim.SGD(0.05, momentum=0.9))
    with pytest.raises(BundleError, match="engine port-rt does not have.*torch-cpu"):
        write_bundle(tr, tmp_path / "m.portrt")


def test_sha256_matches_hashlib():
    raw = capi.raw
    for n in (0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 4097):
        data = bytes((i * 7 + 3) % 256 for i in range(n))
        out = (ctypes.c_uint8 * 32)()
        buf = (ctypes.c_uint8 * max(n, 1)).from_buffer_copy(data or b"\0")
        raw.port_sha256(out, buf, n)
        assert bytes(out) == hashlib.sha256(data).digest(), n


@pytest.mark.parametrize("name,shape,kw,opt", [
    ("mlp", (64,), {"dropout": 0.3}, "adamw"),
    ("resnet8", (3, 32, 32), {}, "sgd"),
    ("resnet8", (3, 32, 32), {}, "adamw"),
])
def test_whole_step_engine_equals_per_call_executor(name, shape, kw, opt):
    """Trainer(engine="rt") (port-rt's runtime on the trainer's arena) and engine="python" (one ctypes call per
    kernel call) give the same bits: losses, weights and the dropout masks' RNG stream. ResNet-8's 78k
    parameters take port_rt_update's one-pass path (the late updates' elements cut evenly over the threads)
    where 2 threads run."""
    torch.manual_seed(0)
    x, y = torch.randn(16, *shape), torch.randint(0, 10, (16,))
    trs = {}
    for eng in ("python", "rt"):
        o = port.optim.AdamW(1e-3, weight_decay=0.01) if opt == "adamw" else port.optim.SGD(0.05, momentum=0.9)
        trs[eng] = port.Trainer(models.get(name, seed=0, **kw), x[:4], optimizer=o, engine=eng, seed=7)
    assert trs["rt"].engine == "rt" and trs["python"].engine == "python"
    losses = {e: [t.step(x[4 * (i % 4):4 * (i % 4) + 4], y[4 * (i % 4):4 * (i % 4) + 4]) for i in range(8)]
              for e, t in trs.items()}
    assert losses["python"] == losses["rt"]
    P = trs["rt"].program.persistent_bytes
    assert torch.equal(trs["rt"].arena[:P], trs["python"].arena[:P])


def test_whole_step_engine_refusals_and_nonfinite():
    from port.errors import NonFiniteError, PortError
    from port.lower.lower import default_plan
    torch.manual_seed(0)
    x = torch.randn(4, 64)
    m = models.get("mlp", seed=0)
    g = port.trace(m, x, optimizer="sgd_momentum")
    with pytest.raises(PortError, match="engine='rt' cannot run this trainer: the plan runs ops on torch-cpu"):
        port.Trainer(m, x, plan=default_plan(g, "torch-cpu"), optimizer=port.optim.SGD(0.05, momentum=0.9),
                     engine="rt")
    with pytest.raises(PortError, match="micro-batching"):
        port.Trainer(models.get("mlp", seed=0), torch.randn(8, 64), micro_batch=4, engine="rt")
    with pytest.raises(PortError, match="engine='jit'"):
        port.Trainer(models.get("mlp", seed=0), x, engine="jit")
    tr = port.Trainer(models.get("mlp", seed=0), x, optimizer=port.optim.SGD(0.05))
    assert tr.engine == "rt"
    before = tr.arena[:tr.program.persistent_bytes].clone()
    bad = x.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(NonFiniteError):
        tr.step(bad, torch.zeros(4, dtype=torch.int64))
    assert tr.step_count == 0
    # the pass wrote gradients but no update ran: the weights are those before the step
    W = [s for s in tr.program.slots if s.role == "parameter" and s.root == s.tensor]
    for s in W:
        assert torch.equal(tr.arena[s.offset:s.offset + s.nbytes], before[s.offset:s.offset + s.nbytes])


def test_checkpoints_resume_across_python_and_port_rt(port_rt, tmp_path):
    """Python trains 5 steps and checkpoints; port-rt resumes from that file, trains 5 more and checkpoints;
    Python resumes from port-rt's file: every loss equals an uninterrupted Python run, bit for bit."""
    tr_ref, x, y = _case("digits_cnn", (1, 8, 8), B=4)
    B = 4

    def batch(s):
        idx = [(s * B + j) % N for j in range(B)]
        return x[idx], y[idx]

    ref = [np.float32(tr_ref.step(*batch(s))) for s in range(12)]
    tr, _, _ = _case("digits_cnn", (1, 8, 8), B=4)
    for s in range(5):
        tr.step(*batch(s))
    ck = tmp_path / "ck.port"
    tr.save_checkpoint(ck)
    port.compile(tr, tmp_path / "m.portrt")
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), 10)
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata", "--steps", 5,
             "--checkpoint", ck, "--resume", "--threads", capi.get_num_threads())
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout and "at step 5" in r.stdout and "checkpoint" in r.stdout.splitlines()[-2]
    got = [np.float32(ln.split()[3]) for ln in r.stdout.splitlines() if ln.startswith("step ")]
    assert [g.tobytes() for g in got] == [v.tobytes() for v in ref[5:10]]
    torch.manual_seed(0)
    tr2 = port.Trainer.resume(ck, models.get("digits_cnn", seed=0), x[:B],
                              optimizer=port.optim.SGD(0.05, momentum=0.9))
    assert tr2.step_count == 10
    assert [np.float32(tr2.step(*batch(s))).tobytes() for s in (10, 11)] == [v.tobytes() for v in ref[10:12]]
    # a checkpoint of another model is refused by port-rt, named
    other, _, _ = _case("mlp", (64,))
    other.save_checkpoint(tmp_path / "other.port")
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata", "--steps", 1,
             "--checkpoint", tmp_path / "other.port", "--resume")
    assert r.returncode == 2 and "not a checkpoint of this bundle" in r.stderr


@pytest.mark.slow
def test_vendored_gemm_is_thread_count_independent(port_rt, tmp_path):
    """With --gemm vendored every kernel gives the same bits at 1 and 2 threads (the OpenBLAS build splits
    large GEMMs into per-thread blocks, so it is compared at equal thread counts only)."""
    tr, x, y = _case("mobilenetv2", (3, 32, 32), B=8)
    port.compile(tr, tmp_path / "m.portrt")
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), 10)
    out = []
    for t in (1, 2):
        r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata", "--steps", 3,
                 "--threads", t, "--gemm", "vendored")
        assert r.returncode == 0, r.stderr
        out.append([ln.split()[3] for ln in r.stdout.splitlines() if ln.startswith("step ")])
    assert len(out[0]) == 3 and out[0] == out[1]


def test_port_rt_pages_to_a_spill_file(port_rt, tmp_path):
    """A plan that pages 6 activations: port-rt writes them to a spill file in --spill-dir (deleted on open:
    nothing is left behind) and trains bit for bit like the Python executor, which pages through its own."""
    import dataclasses
    import port.plan.semantics as SEM
    from port.lower.lower import default_plan
    torch.manual_seed(0)
    x, y = torch.randn(N, 3, 32, 32), torch.randint(0, 10, (N,))
    B = 4
    g = port.trace(models.get("resnet8", seed=0), x[:B], optimizer="sgd_momentum")
    roots = SEM.activation_roots(g)
    pages = [r for r, R in sorted(roots.items()) if R.bwd_first is not None and g.ops[R.birth].phase == "forward"
             and R.bwd_first > R.fwd_last + 1][:6]
    plan = dataclasses.replace(default_plan(g, "c", fuse=False, inplace=False), paged=tuple(pages))
    tr = port.Trainer(models.get("resnet8", seed=0), x[:B], plan=plan, spill_dir=tmp_path,
                      optimizer=port.optim.SGD(0.05, momentum=0.9))
    assert tr.engine == "python"            # paging plans keep the per-call executor
    port.compile(tr, tmp_path / "m.portrt")
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), 10)
    spill = tmp_path / "spill"
    spill.mkdir()
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata", "--steps", 4,
             "--threads", capi.get_num_threads(), "--spill-dir", spill)
    assert r.returncode == 0, r.stderr
    got = [np.float32(ln.split()[3]) for ln in r.stdout.splitlines() if ln.startswith("step ")]
    ref = [np.float32(tr.step(x[(s * B) % N:(s * B) % N + B], y[(s * B) % N:(s * B) % N + B])) for s in range(4)]
    assert [a.tobytes() for a in got] == [b.tobytes() for b in ref]
    assert tr.executor.spill_counters()["writes"] == 4 * len(pages)
    assert list(spill.iterdir()) == []
    # without a usable spill directory the run stops with a named error
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata", "--steps", 1,
             "--spill-dir", tmp_path / "no-such-dir")
    assert r.returncode == 2 and "spill file" in r.stderr


def _seq_case(name):
    from port.transformers import bert_tiny, gpt_tiny
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    if name == "gpt_tiny":
        m = gpt_tiny(layers=2, dim=32, heads=2, context=32, vocab=96)
        x = torch.randint(0, 96, (N, 32), generator=g)
        y = torch.roll(x, -1, 1)
        y[::3, :5] = -100                                  # ignored positions (a prompt, padding)
        classes = 96
    else:
        m = bert_tiny(layers=2, dim=32, heads=2, context=32, vocab=64)
        x = torch.randint(1, 64, (N, 32), generator=g)
        for i in range(N):
            x[i, 32 - (i % 7) * 3:] = 0                    # right padding: the key-padding mask
        y = x[:, :4].sum(1) % 2
        classes = 2
    tr = port.Trainer(m, x[:8], optimizer=port.optim.SGD(0.05, momentum=0.9))
    return tr, x, y, classes


@pytest.mark.parametrize("name", ["gpt_tiny", "bert_tiny"])
def test_port_rt_trains_sequence_models_bit_for_bit(port_rt, tmp_path, name):
    """Bundle format 2: int64 token ids in, per-token labels with an ignore index (gpt_tiny) or one label per
    sample (bert_tiny); port-rt trains them with the Python Trainer's float32 bits and evaluates token accuracy
    over the counted positions as Trainer.evaluate does."""
    tr, x, y, classes = _seq_case(name)
    assert tr.engine == "rt"                               # the in-process whole-step engine runs them too
    write_bundle(tr, tmp_path / "m.portrt")
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), classes,
               ignore_index=-100 if name == "gpt_tiny" else None)
    threads = capi.get_num_threads()
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata", "--steps", 8,
             "--threads", threads, "--checkpoint", tmp_path / "c.ckpt")
    assert r.returncode == 0, r.stderr
    got = [np.float32(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("step ")]
    ref = []
    for s in range(8):
        idx = [(s * 8 + j) % N for j in range(8)]
        ref.append(np.float32(tr.step(x[idx], y[idx])))
    assert [a.tobytes() for a in got] == [b.tobytes() for b in ref], list(zip(ref, got))
    r = _run(port_rt, "eval", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata", "--threads", threads,
             "--checkpoint", tmp_path / "c.ckpt")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("eval "))
    what, seen, correct = line.split()[1], int(line.split()[2]), int(line.split()[4])
    counted = int((y != -100).sum())
    assert (what, seen) == (("tokens" if name == "gpt_tiny" else "samples"), counted)
    ev = tr.evaluate([(x[i:i + 8], y[i:i + 8]) for i in range(0, N, 8)])
    assert correct == round(ev["accuracy"] * counted)
    assert float(line.split()[10]) == pytest.approx(ev["loss"], rel=1e-4)    # mean cross-entropy (perplexity: exp)


def test_port_rt_sequence_data_checks(port_rt, tmp_path):
    tr, x, y, classes = _seq_case("gpt_tiny")
    write_bundle(tr, tmp_path / "m.portrt")
    # float samples for a token-id bundle, and per-sample labels for per-token targets: exit 2, both named
    write_data(tmp_path / "f.portdata", x.float().numpy(), y.numpy(), classes, ignore_index=-100)
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "f.portdata")
    assert r.returncode == 2 and "token ids" in r.stderr and "floats" in r.stderr
    write_data(tmp_path / "s.portdata", x.numpy(), y[:, 0].clamp(min=0).numpy(), classes)
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "s.portdata")
    assert r.returncode == 2 and "label(s) each" in r.stderr
    with pytest.raises(BundleError, match="ignore index -100"):
        write_data(tmp_path / "b.portdata", x.numpy(), torch.full_like(y, -7).numpy(), classes, ignore_index=-100)
    # the in-process engine checks every label but the ignore index before anything runs
    from port.errors import LabelError
    bad = y[:8].clone()
    bad[1, 3] = classes
    with pytest.raises(LabelError, match="index 35 "):
        tr.step(x[:8], bad)
    tr.step(x[:8], y[:8])


def test_format_1_bundles_still_load(tmp_path):
    """A format-1 bundle (a classifier compiled before format 2) is format 2 with the new header bytes zero: the
    loader reads both, and refuses a format-1 header whose reserved bytes are not zero."""
    tr, x, y = _case("digits_cnn", (1, 8, 8))
    p = tmp_path / "m.portrt"
    write_bundle(tr, p)
    b = bytearray(p.read_bytes())
    assert struct.unpack_from("<IIq", b, 424) == (0, 1, 0)
    b[8:12] = struct.pack("<I", 1)
    b[424:448] = bytes(24)
    q = tmp_path / "v1.portrt"
    q.write_bytes(bytes(_rechecksum(b)))
    assert check_bundle(q) == check_bundle(p)
    b[428] = 1
    q.write_bytes(bytes(_rechecksum(b)))
    with pytest.raises(BundleError, match="not a valid port-rt bundle"):
        check_bundle(q)


class _Gates(torch.nn.Module):
    """SiLU, sigmoid and hardsigmoid activations and a squeeze-excitation gate (a broadcast mul) and a layer
    scale (a parameter operand): issue 54's first C kernels."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        nn = torch.nn
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.se1, self.se2 = nn.Linear(8, 4), nn.Linear(4, 8)
        self.gamma = nn.Parameter(torch.linspace(0.5, 1.5, 16))
        self.fc1, self.fc2 = nn.Linear(8 * 36, 16), nn.Linear(16, 10)

    def forward(self, x):
        h = torch.nn.functional.silu(self.conv(x))
        s = torch.nn.functional.hardsigmoid(self.se2(torch.relu(self.se1(h.mean((2, 3))))))
        h = (h * s.view(s.shape[0], -1, 1, 1)).flatten(1)
        return self.fc2(torch.sigmoid(self.fc1(h)) * self.gamma)


def _trains_bit_for_bit(port_rt, tmp_path, model, x, y, kinds_on_c, classes=10, B=8):
    """``model`` runs every op on C (``kinds_on_c`` among them), compiles into a bundle and trains 6 steps in
    port-rt bit for bit like the Python executor."""
    tr = port.Trainer(model, x[:B], optimizer=port.optim.SGD(0.05, momentum=0.9))
    on_c = {o.kind for o in tr.graph.ops if tr.plan.ops[o.id].accelerator == "cpu-c"}
    assert set(kinds_on_c) <= on_c, set(kinds_on_c) - on_c
    _trains_like_the_trainer(port_rt, tmp_path, tr, x, y, B, classes=classes)


def _trains_like_the_trainer(port_rt, tmp_path, tr, x, y, B, steps=6, classes=10):
    """Every op of ``tr``'s plan is on C; compiled into a bundle, port-rt trains ``steps`` steps on (x, y) with the
    same losses, bit for bit, as the Trainer."""
    assert all(d.accelerator == "cpu-c" for d in tr.plan.ops)
    write_bundle(tr, tmp_path / "m.portrt")
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), classes)
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata", "--steps", steps,
             "--threads", capi.get_num_threads())
    assert r.returncode == 0, r.stderr
    got = [np.float32(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("step ")]
    ref = [np.float32(tr.step(x[[(s * B + j) % N for j in range(B)]], y[[(s * B + j) % N for j in range(B)]]))
           for s in range(steps)]
    assert [a.tobytes() for a in got] == [b.tobytes() for b in ref], list(zip(ref, got))


def test_port_rt_runs_sigmoid_hardsigmoid_silu_bit_for_bit(port_rt, tmp_path):
    """sigmoid, hardsigmoid, silu and broadcast mul run on C kernels (forward and backward), compile into a bundle
    and train in port-rt bit for bit like the Python executor."""
    x, y = torch.randn(N, 3, 6, 6), torch.randint(0, 10, (N,))
    _trains_bit_for_bit(port_rt, tmp_path, _Gates(), x, y,
                        {"sigmoid", "hardsigmoid", "silu", "sigmoid.grad_input", "hardsigmoid.grad_input",
                         "silu.grad_input", "mul", "mul.grad_input", "mul.grad_weight"})


def test_port_rt_runs_norms_pools_and_resize_bit_for_bit(port_rt, tmp_path):
    """group_norm, rms_norm (Llama's pattern and F.rms_norm), max_pool2d with dilation and ceil_mode, upsample
    (bilinear both ways, nearest) and adaptive_avg_pool2d run on C, compile and train in port-rt bit for bit."""
    x, y = torch.randn(N, 3, 9, 11), torch.randint(0, 10, (N,))
    _trains_bit_for_bit(port_rt, tmp_path, NormPool(), x, y,
                        {k + g for k in ("group_norm", "rms_norm") for g in ("", ".grad_input", ".grad_weight")}
                        | {k + g for k in ("max_pool2d", "upsample", "adaptive_avg_pool2d") for g in ("", ".grad_input")})


def test_port_rt_runs_avg_pool_ceil_mode_and_count_include_pad_bit_for_bit(port_rt, tmp_path):
    """avg_pool2d with ceil_mode and count_include_pad=False (torch_op before issue 52) runs on C, compiles and
    trains in port-rt bit for bit."""
    x, y = torch.randn(N, 3, 9, 7), torch.randint(0, 3, (N,))
    _trains_bit_for_bit(port_rt, tmp_path, AvgPools(), x, y, {"avg_pool2d", "avg_pool2d.grad_input"}, classes=3)


def test_port_rt_runs_embedding_padding_idx_bit_for_bit(port_rt, tmp_path):
    """embedding with padding_idx runs on C (port_embedding_backward_weight_pad), compiles and trains in port-rt
    bit for bit like the Python executor."""
    g = torch.Generator().manual_seed(4)
    x, y = torch.randint(0, 11, (N, 7), generator=g), torch.randint(0, 10, (N,), generator=g)
    x[:, -2:] = 0                                          # padding positions
    _trains_bit_for_bit(port_rt, tmp_path, PadEmb(), x, y, {"embedding", "embedding.grad_weight"})


class _RngAttn(torch.nn.Module):
    """Issue 54's random ops and attention forms: grouped-query attention (enable_gqa) under a boolean mask with
    attention dropout, attention under an additive mask, dropout, and stochastic depth (timm's drop path:
    new_empty(...).bernoulli_(keep).div_(keep))."""

    def __init__(self, d=12, t=6):
        super().__init__()
        torch.manual_seed(0)
        nn = torch.nn
        self.inp = nn.Linear(d, 24)
        self.q, self.kv = nn.Linear(24, 24), nn.Linear(24, 12)      # 4 query heads of 6, 2 key/value heads
        self.fc = nn.Linear(24, 10)
        g = torch.Generator().manual_seed(1)
        m = torch.rand(1, 1, t, t, generator=g) > 0.4
        m[..., 0] = True
        self.register_buffer("bmask", m)
        self.register_buffer("amask", torch.randn(1, 4, 1, t, generator=g))

    def forward(self, x):
        F = torch.nn.functional
        n, t, _ = x.shape
        h = self.inp(x)
        q = self.q(h).view(n, t, 4, 6).transpose(1, 2)
        k, v = self.kv(h).view(n, t, 2, 6).transpose(1, 2), self.kv(h * 0.5).view(n, t, 2, 6).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bmask, dropout_p=0.25, enable_gqa=True)
        a = F.scaled_dot_product_attention(a, q, q, attn_mask=self.amask)
        a = a.transpose(1, 2).reshape(n, t, 24)
        keep = a.new_empty((n, 1, 1)).bernoulli_(0.7).div_(0.7)
        h = h + F.dropout(a, 0.2, self.training) * keep
        return self.fc(h.mean(1))


def test_port_rt_runs_random_ops_and_attention_bit_for_bit(port_rt, tmp_path):
    """Dropout, drop path and attention (GQA, boolean and additive masks, attention dropout) run on C kernels,
    compile into a bundle and train in port-rt bit for bit like the Trainer: the masks come from one generator
    keyed by (seed, forward pass, op), the same in both. The torch backend draws the same masks (losses equal to
    float32 rounding)."""
    x, y = torch.randn(N, 6, 12), torch.randint(0, 10, (N,))
    B = 8
    tr = port.Trainer(_RngAttn(), x[:B], optimizer=port.optim.SGD(0.05, momentum=0.9), seed=11)
    kinds = {o.kind for o in tr.graph.ops}
    assert {"attention", "attention.grad_input", "dropout", "dropout.grad_input", "bernoulli"} <= kinds
    att = [o for o in tr.graph.ops if o.kind == "attention"]
    assert [o.attr("kv_heads") for o in att] == [2, None] and [o.attr("mask") for o in att] == ["bool", "add"]
    assert all(d.accelerator == "cpu-c" for d in tr.plan.ops)
    write_bundle(tr, tmp_path / "m.portrt")
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), 10)
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata", "--steps", 6,
             "--threads", capi.get_num_threads())
    assert r.returncode == 0, r.stderr
    got = [np.float32(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("step ")]
    batches = [[(s * B + j) % N for j in range(B)] for s in range(6)]
    ref = [np.float32(tr.step(x[b], y[b])) for b in batches]
    assert [a.tobytes() for a in got] == [b.tobytes() for b in ref], list(zip(ref, got))
    tt = port.Trainer(_RngAttn(), x[:B], optimizer=port.optim.SGD(0.05, momentum=0.9), seed=11, backend="torch-cpu")
    assert all(d.accelerator == "cpu-torch" for d in tt.plan.ops)
    other = [tt.step(x[b], y[b]) for b in batches]
    assert np.allclose(other, ref, rtol=1e-4, atol=1e-5), list(zip(ref, other))
    t2 = port.Trainer(_RngAttn(), x[:B], optimizer=port.optim.SGD(0.05, momentum=0.9), seed=12)
    assert not np.allclose([t2.step(x[b], y[b]) for b in batches], ref, rtol=1e-4, atol=1e-5)  # another seed


class _Grouped(torch.nn.Module):
    """Grouped convolutions (ResNeXt / RegNet blocks, issue 54): 8 groups of 3 channels, then a stride-2 one of 4
    groups, 6 channels in and 9 out each, on C's grouped driver (one parallel region over the groups)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        nn = torch.nn
        self.c1 = nn.Conv2d(3, 24, 3, padding=1)
        self.c2 = nn.Conv2d(24, 24, 3, padding=1, groups=8, bias=False)
        self.c3 = nn.Conv2d(24, 36, 3, stride=2, padding=1, groups=4)
        self.fc = nn.Linear(36 * 16, 10)

    def forward(self, x):
        h = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.fc(torch.relu(self.c3(h)).flatten(1))


def test_port_rt_runs_grouped_convolutions_bit_for_bit(port_rt, tmp_path):
    """Grouped convolutions (several groups, widths 3, 6 and 9, stride 1 and 2) compile into a bundle and train in
    port-rt bit for bit like the Python executor."""
    x, y = torch.randn(N, 3, 8, 8), torch.randint(0, 10, (N,))
    _trains_bit_for_bit(port_rt, tmp_path, _Grouped(), x, y, {"conv2d", "conv2d.grad_input", "conv2d.grad_weight"})


class _Shapes(torch.nn.Module):
    """Issue 54's shape copies and unary math: a channel split and cats (a DenseNet / ShuffleNet block), slices, a
    class token expanded over the batch, RMSNorm's pow / shift / rsqrt, rotary cos / sin / neg, exp and abs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        nn = torch.nn
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.cls = nn.Parameter(torch.randn(1, 1, 5) * 0.1)
        self.fc = nn.Linear(12 * 36 + 5, 10)

    def forward(self, x):
        h = self.conv(x)                                          # [N, 6, 6, 6]
        a, b = h.split([2, 4], dim=1)
        h = torch.cat([b, (a * 0.5).exp(), -a], 1)                # 8 channels
        h = h * torch.rsqrt(h.pow(2).mean(1).unsqueeze(1) + 1e-6)
        h = torch.cat([h[:, :4].cos() * h[:, 4:], h[:, 2:6].sin()], 1)
        t = self.cls.expand(x.shape[0], -1, -1).flatten(1)
        return self.fc(torch.cat([torch.cat([h, h[:, 1:5].abs()], 1).flatten(1), t], 1))


def test_port_rt_runs_shape_copies_and_unary_math_bit_for_bit(port_rt, tmp_path):
    """cat, narrow (split, slices), expand and the unary math (exp, neg, pow, shift, rsqrt, cos, sin, abs) run on
    C kernels forward and backward, compile into a bundle and train in port-rt bit for bit like the Trainer."""
    x, y = torch.randn(N, 3, 6, 6), torch.randint(0, 10, (N,))
    B = 8
    tr = port.Trainer(_Shapes(), x[:B], optimizer=port.optim.SGD(0.05, momentum=0.9))
    kinds = {o.kind for o in tr.graph.ops}
    assert {"cat", "cat.grad_input", "narrow", "narrow.grad_input", "expand", "expand.grad_weight", "exp", "neg",
            "pow_scalar", "shift", "rsqrt", "cos", "sin", "abs", "cos.grad_input", "rsqrt.grad_input"} <= kinds
    _trains_like_the_trainer(port_rt, tmp_path, tr, x, y, B)


def test_port_rt_runs_arena_views_bit_for_bit(port_rt, tmp_path):
    """Shape ops as arena views (split, chunk, unbind, narrow, select, slices along dim 0: aliases at a byte offset,
    no call) beside slice copies (dim 1): the bundle is just offsets, port-rt trains bit for bit like the Trainer."""
    x, y = torch.randn(N, 12), torch.randint(0, 10, (N,))
    B = 8
    tr = port.Trainer(Views(), x[:B], optimizer=port.optim.SGD(0.05, momentum=0.9))
    kernels = {c.kernel for c in tr.program.calls}
    assert {"narrow", "narrow_view.grad_input"} <= kernels and "narrow_view" not in kernels
    _trains_like_the_trainer(port_rt, tmp_path, tr, x, y, B)


class _Conv1DNet(torch.nn.Module):
    """Hugging Face GPT-2's Conv1D (transformers.pytorch_utils.Conv1D: addmm(b, x, W), W stored [in, out]) with and
    without a bias (mm), between linears."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w1, self.b1 = torch.nn.Parameter(torch.randn(7, 13) * 0.3), torch.nn.Parameter(torch.randn(13) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(13, 9) * 0.3)
        self.fc = torch.nn.Linear(9, 10)

    def forward(self, x):                                  # [N, 5, 7]
        h = torch.addmm(self.b1, x.reshape(-1, 7), self.w1)
        h = torch.mm(torch.tanh(h), self.w2).reshape(x.shape[0], 5, 9)
        return self.fc(torch.tanh(h).mean(1))


def test_port_rt_runs_gpt2_conv1d_bit_for_bit(port_rt, tmp_path):
    """A linear whose weight is stored [in, out] (GPT-2's Conv1D) runs on C (port_linear_t_*), compiles and trains
    in port-rt bit for bit like the Python executor."""
    x, y = torch.randn(N, 5, 7), torch.randint(0, 10, (N,))
    tr = port.Trainer(_Conv1DNet(), x[:8], optimizer=port.optim.SGD(0.05, momentum=0.9))
    assert sum(bool(o.attr("weight_t")) for o in tr.graph.ops if o.kind == "linear") == 2
    _trains_like_the_trainer(port_rt, tmp_path, tr, x, y, 8)


class _ShiftedWindows(torch.nn.Module):
    """Swin-T's copies: an NHWC map padded to whole windows (F.pad over two dims), cyclically shifted (torch.roll
    over two dims) and back, plus a relative-position bias: a parameter table picked by a constant index buffer
    (table[idx], a gather whose gradient scatter-adds)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(3, 5)
        self.table = torch.nn.Parameter(torch.randn(7, 5) * 0.2)
        self.register_buffer("idx", torch.tensor([3, 0, 6, 3, 1, 5, 2, 2, 4, 0, 6, 1, 5, 4, 3, 0, 2, 6]))
        self.fc = torch.nn.Linear(5, 10)

    def forward(self, x):                                  # [N, 4, 5, 3]
        h = torch.tanh(self.proj(x))
        h = torch.nn.functional.pad(h, (0, 0, 0, 1, 1, 1))  # [N, 6, 6, 5]
        h = torch.roll(h, (-2, 3), (1, 2))
        h = h.reshape(h.shape[0], 36, 5)[:, :18] * self.table[self.idx]
        h = torch.roll(torch.tanh(h), 5, 1)
        return self.fc(h.mean(1))


def test_port_rt_runs_roll_pad_and_table_gather_bit_for_bit(port_rt, tmp_path):
    """roll and pad (port_slice_copy ranges) and a parameter table indexed by a buffer (embedding) run on C,
    compile and train in port-rt bit for bit like the Python executor."""
    x, y = torch.randn(N, 4, 5, 3), torch.randint(0, 10, (N,))
    _trains_bit_for_bit(port_rt, tmp_path, _ShiftedWindows(), x, y,
                        {"roll", "roll.grad_input", "pad", "pad.grad_input", "embedding", "embedding.grad_weight"})


class _CausalScores(torch.nn.Module):
    """nanoGPT's attention: scores masked_fill'ed with -inf where a registered lower-triangular buffer is 0
    (folded at capture into a boolean mask), softmax."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.qk = torch.nn.Linear(6, 16)
        self.register_buffer("bias", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))
        self.fc = torch.nn.Linear(128, 10)

    def forward(self, x):                                   # [N, 8, 6]
        q, k = self.qk(x).view(x.shape[0], 8, 2, 8).transpose(1, 2).chunk(2, -1)
        s = (q @ k.transpose(-1, -2)).masked_fill(self.bias[:, :, :8, :8] == 0, float("-inf"))
        return self.fc(s.softmax(-1).reshape(x.shape[0], 128))


def test_port_rt_runs_masked_fill_bit_for_bit(port_rt, tmp_path):
    """masked_fill (port_masked_fill: a folded causal mask with -inf, broadcast over batch and heads) runs on C
    forward and backward, compiles and trains in port-rt bit for bit like the Python executor."""
    x, y = torch.randn(N, 8, 6), torch.randint(0, 10, (N,))
    _trains_bit_for_bit(port_rt, tmp_path, _CausalScores(), x, y, {"masked_fill", "masked_fill.grad_input"})


def test_port_rt_runs_padding_mask_chain_bit_for_bit(port_rt, tmp_path):
    """The mask kernels (port_mask_cast, port_mask_index2, port_mask_logic, port_expand_mask: HF's
    attention_mask chain; port_mask_compare and its scalar form, not) run on C, compile and train in port-rt bit
    for bit like the Python executor."""
    g = torch.Generator().manual_seed(5)
    x, y = torch.randint(1, 11, (N, 7), generator=g), torch.randint(0, 10, (N,), generator=g)
    x[::2, -2:] = 0                                         # padded rows
    _trains_bit_for_bit(port_rt, tmp_path, PaddedAttn(), x, y, {"mask_cast", "mask_index2", "mask_logic",
                                                                  "expand_mask", "mask_compare"})


def _two_input_batches(steps=6, B=8):
    g = torch.Generator().manual_seed(7)
    ids, y = torch.randint(1, 13, (N, 6), generator=g), torch.randint(0, 10, (N,), generator=g)
    mask = torch.ones_like(ids)
    mask[::3, -2:] = 0                                      # padded rows
    at = [[(s * B + j) % N for j in range(B)] for s in range(steps)]
    return ids, mask, y, at


def test_port_rt_trains_a_model_with_two_inputs_bit_for_bit(port_rt, tmp_path):
    """A model taking (input_ids, attention_mask) compiles into a format-3 bundle (its extra input's table), the
    data file holds both inputs a sample (format 3, in the model's order: Trainer.input_tensors), and port-rt
    trains 6 steps with the Trainer's losses bit for bit; the in-process whole-step engine takes such a model too
    (equal bits to the per-op executor). A data file with one input for that bundle, or inputs given as a dict,
    is refused by name."""
    ids, mask, y, at = _two_input_batches()
    B = 8
    batch = lambda s: {"input_ids": ids[at[s]], "attention_mask": mask[at[s]]}   # noqa: E731
    opt = lambda: port.optim.SGD(0.05, momentum=0.9)   # noqa: E731
    tr = port.Trainer(TwoInputs(), batch(0), optimizer=opt())
    assert tr.engine == "rt" and len(tr.program.extra_input_ids) == 1
    assert all(d.accelerator == "cpu-c" for d in tr.plan.ops)
    info = write_bundle(tr, tmp_path / "m.portrt")
    raw = (tmp_path / "m.portrt").read_bytes()
    assert struct.unpack_from("<I", raw, 8)[0] == 3 and struct.unpack_from("<I", raw, 440)[0] == 1
    assert check_bundle(tmp_path / "m.portrt") == info.arena_bytes
    write_data(tmp_path / "d.portdata", [t.numpy() for t in tr.input_tensors({"input_ids": ids,
                                                                              "attention_mask": mask})],
               y.numpy(), 10)
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata", "--steps", 6,
             "--threads", capi.get_num_threads())
    assert r.returncode == 0, r.stderr
    got = [np.float32(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("step ")]
    ref = [np.float32(tr.step(batch(s), y[at[s]])) for s in range(6)]
    assert [a.tobytes() for a in got] == [b.tobytes() for b in ref], list(zip(ref, got))
    py = port.Trainer(TwoInputs(), batch(0), optimizer=opt(), engine="python")
    assert [np.float32(py.step(batch(s), y[at[s]])).tobytes() for s in range(6)] == [b.tobytes() for b in ref]
    r = _run(port_rt, "eval", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata")
    assert r.returncode == 0 and "eval samples 40" in r.stdout, r.stderr
    write_data(tmp_path / "one.portdata", ids.numpy(), y.numpy(), 10)
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "one.portdata")
    assert r.returncode == 2 and "holds 1 input(s) a sample; the bundle's model takes 2" in r.stderr
    from port.exec.bundle import emit_c
    with pytest.raises(BundleError, match="several inputs"):        # the MCU program feeds one input tensor
        emit_c(raw, tmp_path / "c")
    with pytest.raises(BundleError, match="model's order"):
        write_data(tmp_path / "x.portdata", {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}, y.numpy(), 10)
    bad = ids.clone()
    bad[3, 2] = 13                                          # outside the embedding's 13 ids: checked before step 1
    write_data(tmp_path / "bad.portdata", [bad.numpy(), mask.numpy()], y.numpy(), 10)
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "bad.portdata")
    assert r.returncode == 2 and "record 3 position 2 has token id 13" in r.stderr, r.stderr


def test_bundle_refuses_a_bad_extra_input_table(tmp_path):
    """The loader's rules for format 3's extra-input table (port_rt.h): count 1..8, the table inside the file and
    aligned, each slot a whole batch inside the arena, aligned to a known dtype; reserved bytes zero."""
    ids, mask, y, at = _two_input_batches()
    tr = port.Trainer(TwoInputs(), {"input_ids": ids[:8], "attention_mask": mask[:8]})
    p = tmp_path / "m.portrt"
    write_bundle(tr, p)
    good = bytearray(p.read_bytes())
    assert check_bundle(p) > 0
    to = struct.unpack_from("<Q", good, 448)[0]
    A = struct.unpack_from("<Q", good, 24)[0]

    def edit(fmt, off, *v):
        b = bytearray(good)
        struct.pack_into(fmt, b, off, *v)
        return _rechecksum(b)
    cases = {
        "count 0": (edit("<I", 440, 0), "count out of range"),
        "count 9": (edit("<I", 440, 9), "count out of range"),
        "table outside": (edit("<Q", 448, len(good)), "extra-input table lies outside"),
        "table unaligned": (edit("<Q", 448, to + 4), "extra-input table lies outside"),
        "slot outside": (edit("<q", to, A - 8), "extra input's slot lies outside the arena"),
        "eval slot negative": (edit("<q", to + 8, -64), "extra input's slot lies outside the arena"),
        "bytes not a batch": (edit("<q", to + 16, 8 * 6 * 8 + 8), "extra input's slot lies outside the arena"),
        "slot unaligned": (edit("<q", to, struct.unpack_from("<q", good, to)[0] + 4), "not aligned"),
        "dtype": (edit("<I", to + 24, 2), "unknown dtype"),
        "reserved": (edit("<I", 460, 1), "reserved header bytes"),
        "version 2 with a table": (edit("<I", 8, 2), "reserved header bytes"),
    }
    for name, (data, why) in cases.items():
        q = tmp_path / f"{name.replace(' ', '_')}.portrt"
        q.write_bytes(data)
        with pytest.raises(BundleError, match=why):
            check_bundle(q)


def test_port_rt_runs_where_bit_for_bit(port_rt, tmp_path):
    """where (port_where_forward/backward: two activations, a number on either side, broadcast masks) runs on C
    forward and backward, compiles and trains in port-rt bit for bit like the Python executor."""
    x, y = torch.randn(N, 5), torch.randint(0, 10, (N,))
    _trains_bit_for_bit(port_rt, tmp_path, WhereNet(), x, y, {"where", "where.grad_input"})


def test_port_rt_runs_last_token_pooling_bit_for_bit(port_rt, tmp_path):
    """HF's sequence-classifier pooling (an int32 cast of ids != pad, times an arange, argmax, the gather of each
    row's last non-pad logits and its scatter gradient) runs on C, compiles and trains in port-rt bit for bit like
    the Python executor, on batches padded at other lengths than the captured one."""
    g = torch.Generator().manual_seed(7)
    x, y = torch.randint(1, 11, (N, 7), generator=g), torch.randint(0, 10, (N,), generator=g)
    for i in range(N):
        x[i, 7 - i % 5:] = 0                                 # 0..4 trailing pads (row 0: none)
    _trains_bit_for_bit(port_rt, tmp_path, LastTokenPool(), x, y,
                        {"mask_cast", "int_binary", "argmax_rows", "index2_rows", "index2_rows.grad_input"})


def test_port_rt_runs_maxvit_einsum_attention_bit_for_bit(port_rt, tmp_path):
    """MaxViT's window attention (einsum "B G H I D, B G H J D -> B G H I J" and the attn @ v one, a torch_op
    before) captures as permute, reshape and matmul ops: every op on C, training like eager, and in port-rt bit
    for bit like the Trainer."""
    from _equiv import compare
    x, y = torch.randn(N, 3, 4, 6), torch.randint(0, 10, (N,))
    tr = port.Trainer(WindowEinsumAttn(), x[:8], optimizer=port.optim.SGD(0.05, momentum=0.9))
    kinds = [o.kind for o in tr.graph.ops if o.phase == "forward"]
    assert "torch_op" not in kinds and kinds.count("matmul") == 2, kinds
    _trains_like_the_trainer(port_rt, tmp_path, tr, x, y, 8)
    compare(WindowEinsumAttn(), [(x[:8], y[:8]), (x[8:16], y[8:16])] * 2)
