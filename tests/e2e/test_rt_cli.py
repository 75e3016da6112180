"""port-rt's command line against hostile and interrupted use (issue 53): signed bundles (HMAC-SHA-256 under a
key given to `port compile --sign-key` and `port-rt --key`, `--require-signed`), thread counts capped at
max(64, 4 x the CPUs), checkpoints every --every steps and on SIGINT / SIGTERM (exit 130 / 143, resumable bit
for bit), a lock on the checkpoint, data files' labels and token ids checked before the first step, and every
checkpoint header field range-checked on load (the file and key named)."""
from __future__ import annotations

import ctypes
import hashlib
import hmac
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import port
from port.errors import PortError
from port.exec import capi
from port.exec.bundle import (BundleError, check_bundle, key_id, load_key, signature_trailer, write_bundle,
                              write_data)
from test_rt import _case, _rechecksum, _run, _seq_case

ROOT = Path(__file__).resolve().parents[2]
N = 40


# ------------------------------------------------------------------------------------------------ HMAC-SHA-256
RFC4231 = [   # (key, data, HMAC-SHA-256) of RFC 4231 test cases 1-4, 6, 7
    (b"\x0b" * 20, b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (b"Jefe", b"what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
    (b"\xaa" * 20, b"\xdd" * 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
    (bytes(range(1, 26)), b"\xcd" * 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
    (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First",
     "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
    (b"\xaa" * 131, b"This is a test using a larger than block-size key and a larger than block-size data. The key "
                    b"needs to be hashed before being used by the HMAC algorithm.",
     "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
]


def _c_hmac(key: bytes, data: bytes) -> bytes:
    out = (ctypes.c_uint8 * 32)()
    capi.raw.port_hmac_sha256(out, key or b"\0", len(key), data or b"\0", len(data))
    return bytes(out)


def test_hmac_sha256_matches_rfc4231_and_python():
    for key, data, want in RFC4231:
        assert _c_hmac(key, data).hex() == want == hmac.new(key, data, hashlib.sha256).hexdigest()
    for kn in (0, 1, 32, 63, 64, 65, 200):          # keys around the 64-byte block, data around its padding
        for dn in (0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 4097):
            key = bytes((i * 13 + 5) % 256 for i in range(kn))
            data = bytes((i * 7 + 3) % 256 for i in range(dn))
            assert _c_hmac(key, data) == hmac.new(key, data, hashlib.sha256).digest(), (kn, dn)


# ------------------------------------------------------------------------------------------------ signed bundles
def _keys(tmp_path):
    a, b = tmp_path / "a.key", tmp_path / "b.key"
    a.write_bytes(bytes(range(32)))
    b.write_bytes(bytes(range(1, 33)))
    return a, b


def test_signed_bundles_verify_and_refuse_edits(port_rt, tmp_path):
    tr, x, y = _case("mlp", (64,))
    ka, kb = _keys(tmp_path)
    key = load_key(ka)
    p, u = tmp_path / "s.portrt", tmp_path / "u.portrt"
    info = write_bundle(tr, p, sign_key=key)
    write_bundle(tr, u)
    signed, plain = p.read_bytes(), u.read_bytes()
    assert info.key_id == key_id(key) and len(signed) == len(plain) + 64 and signed[:len(plain)] == plain
    assert signed[len(plain):len(plain) + 8] == b"PORTSIG\0"
    assert signed[len(plain):] == signature_trailer(plain, key)
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), 10)
    A = check_bundle(u)
    assert check_bundle(p) == check_bundle(p, key=key) == check_bundle(p, key=key, require_signed=True) == A

    def rt(bundle, *extra):
        return _run(port_rt, "train", bundle, "--data", tmp_path / "d.portdata", "--steps", 2, "--threads", 1, *extra)

    r = _run(port_rt, "info", p, "--key", ka, "--require-signed")
    assert r.returncode == 0 and f"signed (key id {key_id(key)}), verified" in r.stdout, r.stderr
    assert "not verified (no --key)" in _run(port_rt, "info", p).stdout
    good, plain_run = rt(p, "--key", ka, "--require-signed"), rt(u)
    assert good.returncode == 0 and plain_run.returncode == 0, good.stderr
    assert len(_losses(good)) == 2 and _losses(good) == _losses(plain_run)     # the same program runs

    # another key: refused, both key ids named
    r = rt(p, "--key", kb)
    assert r.returncode == 2 and "signed with another key" in r.stderr and key_id(key) in r.stderr, r.stderr
    with pytest.raises(BundleError, match="signed with another key"):
        check_bundle(p, key=load_key(kb))
    # an edited byte with the SHA-256 recomputed (what anyone can do): the unsigned copy loads, the signed one not
    lr_at = 176 + 8                                  # port_rt_state.lr
    lr = struct.unpack_from("<d", plain, lr_at)[0]
    forged = _rechecksum(bytearray(plain[:lr_at]) + struct.pack("<d", lr * 1000) + plain[lr_at + 8:])
    q = tmp_path / "forged.portrt"
    q.write_bytes(bytes(forged) + signed[len(plain):])
    r = rt(q, "--key", ka)
    assert r.returncode == 2 and "changed after it was signed" in r.stderr, r.stderr
    with pytest.raises(BundleError, match="changed after it was signed"):
        check_bundle(q, key=key)
    # the trailer stripped off: a valid unsigned bundle, which --require-signed refuses (--key alone warns)
    q.write_bytes(bytes(forged))
    assert check_bundle(q) == A and rt(q).returncode == 0
    r = rt(q, "--key", ka, "--require-signed")
    assert r.returncode == 2 and "unsigned" in r.stderr and "--sign-key" in r.stderr, r.stderr
    with pytest.raises(BundleError, match="unsigned bundle refused"):
        check_bundle(q, key=key, require_signed=True)
    r = rt(u, "--key", ka)
    assert r.returncode == 0 and "warning" in r.stderr and "unsigned" in r.stderr
    # a tampered trailer (key id, tag), a truncated one, and arguments: exit 2, named
    for at in (len(plain) + 16, len(signed) - 1):
        bad = bytearray(signed)
        bad[at] ^= 1
        q.write_bytes(bytes(bad))
        assert rt(q, "--key", ka).returncode == 2
    q.write_bytes(signed[:-10])
    r = rt(q, "--key", ka)
    assert r.returncode == 2 and "not a valid bundle" in r.stderr
    r = rt(p, "--require-signed")
    assert r.returncode == 2 and "--require-signed needs --key" in r.stderr
    (tmp_path / "short.key").write_bytes(b"secret")
    r = rt(p, "--key", tmp_path / "short.key")
    assert r.returncode == 2 and "holds 6 bytes" in r.stderr and "/dev/urandom" in r.stderr
    with pytest.raises(BundleError, match="holds 32 to 4096 bytes, this one 6"):
        load_key(tmp_path / "short.key")
    with pytest.raises(BundleError, match="needs the key"):
        check_bundle(p, require_signed=True)


def test_port_compile_sign_key(tmp_path):
    """`port compile --sign-key FILE` writes a signed bundle that port-rt verifies; a key file of the wrong size
    is refused before anything is solved."""
    ka, kb = _keys(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = tmp_path / "out"
    (tmp_path / "short.key").write_bytes(b"x" * 31)
    r = subprocess.run([sys.executable, "-m", "port.cli", "compile", "configs/digits_m4.yaml", "-o", str(out),
                        "--sign-key", str(tmp_path / "short.key")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 2 and "32 to 4096 bytes, this one 31" in r.stdout + r.stderr, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "port.cli", "compile", "configs/digits_m4.yaml", "-o", str(out),
                        "--sign-key", str(ka), "--emit-c"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    key = load_key(ka)
    assert f"key id {key_id(key)}" in r.stdout
    b = out / "digits_m4.portrt"
    assert check_bundle(b, key=key, require_signed=True) > 0
    with pytest.raises(BundleError, match="another key"):
        check_bundle(b, key=load_key(kb))
    # the C source for a board holds the bundle without its trailer (no key there)
    total = struct.unpack_from("<Q", b.read_bytes(), 16)[0]
    assert f"port_bundle_bytes = {total}u" in (out / "port_bundle.c").read_text()


# ------------------------------------------------------------------------------------------------ threads
def test_thread_counts_are_capped(port_rt, tmp_path):
    top = capi.max_threads()
    assert top == max(64, 4 * (os.cpu_count() or 1))
    before = capi.get_num_threads()
    for bad in (10**8, top + 1, 0, -3):
        with pytest.raises(capi.ThreadCountError, match=rf"expected 1\.\.{top}|thread count"):
            capi.set_num_threads(bad)
        with pytest.raises(PortError, match=f"threads={bad}"):
            port.Trainer(port.models.get("mlp", seed=0), torch.randn(4, 64), threads=bad)
    assert capi.get_num_threads() == before
    tr, x, y = _case("mlp", (64,))
    write_bundle(tr, tmp_path / "m.portrt")
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), 10)
    for bad in (10**8, top + 1):
        r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata", "--threads", bad)
        assert r.returncode == 2 and f"at most {top}" in r.stderr, r.stderr
    r = _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata", "--steps", 1,
             "--threads", top)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------------------------------------ checkpoints
def _losses(r):
    return {int(ln.split()[1]): ln.split()[3] for ln in r.stdout.splitlines() if ln.startswith("step ")}


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < timeout, f"{path} never appeared"
        time.sleep(0.02)


@pytest.fixture
def long_run(port_rt, tmp_path):
    """(bundle, data, checkpoint, start): a digits-CNN bundle and a function starting a run of 10^8 steps that
    checkpoints every 20."""
    tr, x, y = _case("digits_cnn", (1, 8, 8), B=4)
    b, d, ck = tmp_path / "m.portrt", tmp_path / "d.portdata", tmp_path / "ck.port"
    write_bundle(tr, b)
    write_data(d, x.numpy(), y.numpy(), 10)

    def start(*extra):
        return subprocess.Popen([str(port_rt), "train", str(b), "--data", str(d), "--steps", str(10**8), "--every",
                                 "20", "--checkpoint", str(ck), "--threads", "1", *map(str, extra)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return b, d, ck, start


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_checkpoints_the_steps_done_and_resumes(port_rt, tmp_path, long_run, sig, code):
    """SIGINT / SIGTERM while training: the step under way finishes, the checkpoint holds every step done, the
    exit code is 128 + the signal, and --resume continues with the losses of an uninterrupted run."""
    from port.train.checkpoint import read_header
    b, d, ck, start = long_run
    p = start()
    _wait_for(ck, p)                                   # the first periodic checkpoint (step 20)
    assert read_header(ck)["step"] % 20 == 0
    time.sleep(0.2)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    done = read_header(ck)["step"]
    assert f"after {done} of 100000000 steps" in err and f"checkpoint {ck} at step {done}" in out, (out, err)
    assert done > 20 and not list(tmp_path.glob("ck.port.tmp*"))
    print(f"{signal.Signals(sig).name}: exit {code}, checkpoint at step {done}")
    r = _run(port_rt, "train", b, "--data", d, "--steps", 3, "--checkpoint", ck, "--resume", "--threads", 1)
    assert r.returncode == 0 and f"resumed from {ck} at step {done}" in r.stdout, r.stderr
    ref = _run(port_rt, "train", b, "--data", d, "--steps", done + 3, "--threads", 1, "--every", 1)
    want = _losses(ref)
    assert _losses(r) == {s: want[s] for s in (done + 1, done + 2, done + 3)}


def test_checkpoint_every_k_steps_and_the_lock(port_rt, tmp_path, long_run):
    """--every K writes the checkpoint every K steps; a second train on the same checkpoint exits 2 naming the
    first one's PID, and runs once the first has ended."""
    from port.train.checkpoint import read_header
    b, d, ck, start = long_run
    r = _run(port_rt, "train", b, "--data", d, "--steps", 7, "--every", 3, "--checkpoint", ck, "--threads", 1)
    assert r.returncode == 0 and sorted(_losses(r)) == [3, 6, 7] and read_header(ck)["step"] == 7
    ck.unlink()
    p = start()
    _wait_for(ck, p)
    second = _run(port_rt, "train", b, "--data", d, "--steps", 1, "--checkpoint", ck, "--resume")
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    assert p.returncode == 143
    assert second.returncode == 2 and f"in use: process {p.pid} holds {ck}.lock" in second.stderr, second.stderr
    r = _run(port_rt, "train", b, "--data", d, "--steps", 1, "--checkpoint", ck, "--resume")
    assert r.returncode == 0, r.stderr


def _forge_ckpt(src: Path, dst: Path, edit) -> Path:
    """``src`` with its JSON header edited by ``edit(hdr)`` and the SHA-256 recomputed (anyone can)."""
    raw = src.read_bytes()
    hl = struct.unpack_from("<Q", raw, 12)[0]
    data0 = 52 + hl + (-(52 + hl)) % 64
    hdr = json.loads(raw[52:52 + hl])
    edit(hdr)
    hj = json.dumps(hdr, sort_keys=True).encode()
    pad = b"\0" * ((-(52 + len(hj))) % 64)
    body = hj + pad + raw[data0:]
    dst.write_bytes(b"PORTCKPT" + struct.pack("<IQ", 2, len(hj)) + hashlib.sha256(body).digest() + body)
    return dst


def _set(path, value):
    def edit(h):
        d = h
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return edit


def _resume_case(tmp_path, optimizer) -> tuple:
    """An mlp trained one step with ``optimizer``: its bundle, data and checkpoint (good.port) in tmp_path; the
    port-rt arguments that resume from a checkpoint named next."""
    tr, x, y = _case("mlp", (64,), optimizer=optimizer)
    tr.step(x[:8], y[:8])
    write_bundle(tr, tmp_path / "m.portrt")
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), 10)
    tr.save_checkpoint(tmp_path / "good.port")
    args = ("train", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata", "--steps", 1, "--resume",
            "--checkpoint")
    return args


@pytest.mark.parametrize("opt,edit,key,shown", [
    ("sgd", _set(["step"], 2**57), "step", str(2**57)),
    ("sgd", _set(["step"], -1), "step", "-1"),
    ("sgd", _set(["step"], 10**30), "step", str(10**30)),
    ("sgd", _set(["rng", "dropout_counter"], 2**60), "rng.dropout_counter", str(2**60)),
    ("sgd", _set(["rng", "seed"], 2**70), "rng.seed", str(2**70)),
    ("sgd", _set(["bn_batches"], -5), "bn_batches", "-5"),
    ("sgd", _set(["optimizer", "lr"], 1e308), "optimizer.lr", "1e+308"),
    ("sgd", _set(["optimizer", "lr"], float("nan")), "optimizer.lr", "NaN"),
    ("sgd", _set(["optimizer", "lr"], -0.1), "optimizer.lr", "-0.1"),
    ("sgd", _set(["optimizer", "momentum"], -0.5), "optimizer.momentum", "-0.5"),
    ("sgd", _set(["optimizer", "weight_decay"], float("inf")), "optimizer.weight_decay", "Infinity"),
    ("adamw", _set(["optimizer", "betas"], [0.9, 1.5]), "optimizer.betas", "[0.9, 1.5]"),
    ("adamw", _set(["optimizer", "eps"], -1e-8), "optimizer.eps", "-1e-08"),
    ("sgd", _set(["format"], 3), "format", "3"),
    ("sgd", _set(["data_bytes"], 12), "data_bytes", "12"),
    ("sgd", _set(["graph_digest"], "0" * 64), "graph_digest", '"0000'),
])
def test_checkpoint_fields_are_range_checked(port_rt, tmp_path, opt, edit, key, shown):
    o = port.optim.AdamW(1e-3) if opt == "adamw" else port.optim.SGD(0.05, momentum=0.9)
    args = _resume_case(tmp_path, o)
    ok = _run(port_rt, *args, _forge_ckpt(tmp_path / "good.port", tmp_path / "same.port", lambda h: None))
    assert ok.returncode == 0 and "at step 1" in ok.stdout, ok.stderr
    bad = _forge_ckpt(tmp_path / "good.port", tmp_path / "bad.port", edit)
    r = _run(port_rt, *args, bad)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{bad} is not a checkpoint of this bundle: {key} = {shown}" in r.stderr, r.stderr
    assert "expected" in r.stderr


def test_checkpoint_settings_follow_the_python_rule(port_rt, tmp_path):
    """One rule for optimizer settings in both readers: lr 0 (torch.optim allows it: a schedule may start there)
    loads in port-rt as in Python; a value beyond float32 is refused by both."""
    from port.train.checkpoint import CheckpointError, read_checkpoint
    args = _resume_case(tmp_path, port.optim.SGD(0.05, momentum=0.9))
    zero = _forge_ckpt(tmp_path / "good.port", tmp_path / "zero.port", _set(["optimizer", "lr"], 0.0))
    assert read_checkpoint(zero)[0]["optimizer"]["lr"] == 0.0
    r = _run(port_rt, *args, zero)
    assert r.returncode == 0 and "at step 1" in r.stdout, r.stdout + r.stderr
    big = _forge_ckpt(tmp_path / "good.port", tmp_path / "big.port", _set(["optimizer", "lr"], 1e308))
    with pytest.raises(CheckpointError, match="optimizer"):
        read_checkpoint(big)
    assert _run(port_rt, *args, big).returncode == 2


# ------------------------------------------------------------------------------------------------ data files
def _forge_data(src: Path, dst: Path, edit) -> Path:
    """A data file with ``edit(x, y)`` applied to its int64 arrays in place and the SHA-256 recomputed."""
    b = bytearray(src.read_bytes())
    n, = struct.unpack_from("<Q", b, 16)
    shape = [s for s in struct.unpack_from("<4Q", b, 24) if s]
    dtype, L = struct.unpack_from("<II", b, 64)
    per = int(np.prod(shape))
    xb = n * per * (8 if dtype else 4)
    yoff = 128 + xb + (-(128 + xb)) % 64
    x = np.frombuffer(b, dtype=np.int64 if dtype else np.float32, count=n * per, offset=128).reshape(n, per).copy()
    y = np.frombuffer(b, dtype=np.int64, count=n * L, offset=yoff).reshape(n, L).copy()
    edit(x, y)
    b[128:128 + xb] = x.tobytes()
    b[yoff:yoff + n * L * 8] = y.tobytes()
    dst.write_bytes(bytes(_rechecksum(b)))
    return dst


def test_out_of_range_labels_are_refused_by_eval_and_train(port_rt, tmp_path):
    tr, x, y = _case("digits_cnn", (1, 8, 8))
    write_bundle(tr, tmp_path / "m.portrt")
    good = write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), 10)

    def edit(xa, ya):
        ya[13, 0] = 10
    bad = _forge_data(good, tmp_path / "bad.portdata", edit)
    for cmd in ("eval", "train"):
        r = _run(port_rt, cmd, tmp_path / "m.portrt", "--data", bad)
        assert r.returncode == 2 and f"{bad}: record 13 has label 10: not a class index 0..9" in r.stderr, r.stderr
    assert _run(port_rt, "eval", tmp_path / "m.portrt", "--data", good).returncode == 0


def test_out_of_range_token_ids_are_named(port_rt, tmp_path):
    tr, x, y, classes = _seq_case("gpt_tiny")           # vocabulary 96
    write_bundle(tr, tmp_path / "m.portrt")
    good = write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), classes, ignore_index=-100)

    def ids(v):
        def edit(xa, ya):
            xa[5, 7] = v
        return edit

    def label(xa, ya):
        ya[2, 30] = 96
    for v in (500, -1, 96):
        bad = _forge_data(good, tmp_path / "bad.portdata", ids(v))
        for cmd in ("train", "eval"):
            r = _run(port_rt, cmd, tmp_path / "m.portrt", "--data", bad)
            assert r.returncode == 2 and f"{bad}: record 5 position 7 has token id {v}: the model's embedding " \
                                         f"takes ids 0..95" in r.stderr, r.stderr
    bad = _forge_data(good, tmp_path / "bad.portdata", label)
    r = _run(port_rt, "eval", tmp_path / "m.portrt", "--data", bad)
    assert r.returncode == 2 and "record 2 position 30 has label 96: not a class index 0..95 or the ignore index " \
                                 "-100" in r.stderr, r.stderr
    assert _run(port_rt, "eval", tmp_path / "m.portrt", "--data", good).returncode == 0
