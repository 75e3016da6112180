"""Seeded, time-bounded fuzzing of the files port-rt and Python hand each other (issue 53): data files
(port.exec.bundle.write_data, read by `port-rt train/eval --data`) and checkpoints written by port-rt (read by
port.train.checkpoint and Trainer.resume, and by port-rt itself on --resume / eval --checkpoint).

Mutants: byte flips and truncations (the trailing SHA-256 / the header checksum must catch every one: refused),
and forged edits (header fields and body values set to odd values, the checksum recomputed, so the file is one a
careless writer could have made): refused with a named error, or run. Never a crash (a signal), never exit 1
(port-rt's "a kernel failed"), never a raw Python exception or an InternalError, never a hang (a timeout)."""
from __future__ import annotations

import hashlib
import json
import random
import struct
import subprocess
import time
from pathlib import Path

import pytest
import torch

import port
from port import models
from port.errors import InternalError, PortError
from port.exec.bundle import DATA_HEADER_BYTES, write_data

ROOT = Path(__file__).resolve().parents[2]
SECONDS = 6.0             # per file kind
SEED = 20260531
B, N = 4, 12
ODD_U32 = [0, 1, 2, 3, 5, 0xFFFFFFFF, 0x80000000, 1 << 24, (1 << 24) + 1]
ODD_U64 = [0, 1, 2, 7, 63, 64, 65, N - 1, N + 1, 1 << 30, (1 << 30) + 1, 1 << 40, (1 << 40) + 1, 2**63, 2**64 - 1]
ODD_JSON = ["x", "", [], {}, None, True, -1, 0, 2**70, 1e308, float("nan"), float("inf"), 1.5, [1, "a"]]


@pytest.fixture(scope="module")
def job(port_rt, tmp_path_factory):
    """An mlp bundle (batch 4), its data (12 samples) and a checkpoint port-rt wrote after 2 steps."""
    d = tmp_path_factory.mktemp("rtfuzz")
    torch.manual_seed(0)
    x, y = torch.randn(N, 64), torch.randint(0, 10, (N,))
    tr = port.Trainer(models.get("mlp", seed=0), x[:B], optimizer=port.optim.SGD(0.05, momentum=0.9))
    port.compile(tr, d / "m.portrt")
    tr.close()
    write_data(d / "d.portdata", x.numpy(), y.numpy(), 10)
    r = _run(port_rt, "train", d / "m.portrt", "--data", d / "d.portdata", "--steps", 2, "--checkpoint",
             d / "ck.port")
    assert r.returncode == 0, r.stderr
    return {"dir": d, "bundle": d / "m.portrt", "data": d / "d.portdata", "ckpt": d / "ck.port", "x": x}


def _run(binary, *args, timeout=60):
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _flip_or_cut(raw: bytes, rng: random.Random) -> bytes:
    b = bytearray(raw)
    if rng.random() < 0.3:
        return bytes(b[:rng.randrange(len(b))])
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def _loop(make, check, seconds: float = SECONDS) -> dict:
    """make(rng) -> (bytes, forged?) then check(...) until ``seconds`` pass; returns the counts."""
    rng = random.Random(SEED)
    stats = {"refused": 0, "ran": 0, "n": 0}
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        raw, forged = make(rng)
        stats[check(raw, forged)] += 1
        stats["n"] += 1
    return stats


# -- data files -------------------------------------------------------------------------------------------------------
# (offset, struct format) of the data header's fields (port/exec/bundle.py)
DATA_FIELDS = [(8, "<I"), (12, "<I"), (16, "<Q"), (24, "<Q"), (32, "<Q"), (40, "<Q"), (48, "<Q"), (56, "<Q"),
               (64, "<I"), (68, "<I"), (72, "<q"), (80, "<I")]


def _forge_data(raw: bytes, rng: random.Random) -> bytes:
    """Header fields or body values edited, the trailing SHA-256 recomputed."""
    b = bytearray(raw[:-32])
    for _ in range(rng.randint(1, 2)):
        r = rng.random()
        if r < 0.6:
            off, fmt = rng.choice(DATA_FIELDS)
            pool = ODD_U32 if fmt == "<I" else ODD_U64
            v = rng.choice(pool)
            if fmt == "<q":
                v = rng.choice([-1, -100, 0, 10, 2**62, -2**63])
            struct.pack_into(fmt, b, off, v)
        elif r < 0.8:                          # a label out of range (or the ignore index)
            yoff = len(b) - N * 8
            struct.pack_into("<q", b, yoff + 8 * rng.randrange(N), rng.choice([-1, 10, 11, 2**40, -2**63, -100]))
        else:                                  # a non-finite or huge input value
            struct.pack_into("<f", b, DATA_HEADER_BYTES + 4 * rng.randrange(N * 64),
                             rng.choice([float("nan"), float("inf"), -float("inf"), 3e38]))
    return bytes(b) + hashlib.sha256(b).digest()


def _data_check(port_rt, bundle: Path, path: Path):
    """check(data, forged) for _loop: port-rt train (or eval) on the mutant data file refuses it with a message
    (exit 2) or runs it (exit 0, only a forged file whose checksum was recomputed); anything else fails."""
    def check(data, forged):
        path.write_bytes(data)
        cmd = "train" if data[-1] % 2 else "eval"
        args = ["--steps", 2] if cmd == "train" else []
        r = _run(port_rt, cmd, bundle, "--data", path, *args)
        assert r.returncode in (0, 2), (r.returncode, r.stderr[-1500:], forged)
        if r.returncode == 0:
            assert forged, "a flipped or truncated data file was accepted (the checksum must catch it)"
            return "ran"
        assert r.stderr.startswith("port-rt: ") and "\n" in r.stderr, r.stderr
        return "refused"
    return check


def test_fuzz_data_files_read_by_port_rt(port_rt, job):
    raw = job["data"].read_bytes()
    path = job["dir"] / "mutant.portdata"

    def make(rng):
        if rng.random() < 0.4:
            return _flip_or_cut(raw, rng), False
        return _forge_data(raw, rng), True

    stats = _loop(make, _data_check(port_rt, job["bundle"], path))
    print("data", stats)
    assert stats["n"] >= 30 and stats["refused"] > 0


def test_data_labels_out_of_range_are_bad_input(port_rt, job):
    """A data file whose labels are not class indices (forged: the checksum recomputed) is bad input, exit 2 with
    the label named, in train and in eval."""
    b = bytearray(job["data"].read_bytes()[:-32])
    struct.pack_into("<q", b, len(b) - N * 8 + 8 * 5, 10)
    path = job["dir"] / "labels.portdata"
    path.write_bytes(bytes(b) + hashlib.sha256(b).digest())
    for cmd in (["train", "--steps", 3], ["eval"]):
        r = _run(port_rt, cmd[0], job["bundle"], "--data", path, *cmd[1:])
        assert r.returncode == 2 and "label" in r.stderr, (r.returncode, r.stderr)


# -- checkpoints written by port-rt -----------------------------------------------------------------------------------
def _ckpt_parts(raw: bytes) -> tuple[int, int, dict, bytes]:
    ver, hlen = struct.unpack("<IQ", raw[8:20])
    hdr = json.loads(raw[52:52 + hlen])
    return ver, hlen, hdr, raw[52 + hlen + ((-(52 + hlen)) % 64):]


def _edit(d, rng: random.Random):
    import copy
    d = copy.deepcopy(d)
    paths = []

    def walk(o, p):
        paths.append(p)
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, p + (k,))
        elif isinstance(o, list):
            for i, v in enumerate(o[:4]):
                walk(v, p + (i,))
    walk(d, ())
    p = rng.choice(paths[1:])
    parent = d
    for k in p[:-1]:
        parent = parent[k]
    r = rng.random()
    if r < 0.2 and isinstance(parent, dict):
        del parent[p[-1]]
    elif r < 0.3 and isinstance(parent, dict):
        parent["unknown_" + str(rng.randrange(50))] = rng.choice(ODD_JSON)
    else:
        parent[p[-1]] = copy.deepcopy(rng.choice(ODD_JSON))
    return d


def _forge_ckpt(raw: bytes, rng: random.Random) -> bytes:
    ver, _hlen, hdr, data = _ckpt_parts(raw)
    if rng.random() < 0.8:
        hdr = _edit(hdr, rng)
    else:                                      # a tensor's bytes: NaN weights or optimizer state
        data = bytearray(data)
        struct.pack_into("<f", data, 4 * rng.randrange(len(data) // 4), float("nan"))
        data = bytes(data)
    hj = json.dumps(hdr, sort_keys=True).encode()
    hpad = b"\0" * ((-(52 + len(hj))) % 64)
    return raw[:8] + struct.pack("<IQ", ver, len(hj)) + hashlib.sha256(hj + hpad + data).digest() + hj + hpad + data


def test_fuzz_port_rt_checkpoints_read_by_python_and_port_rt(port_rt, job):
    from port.train.checkpoint import read_checkpoint
    raw = job["ckpt"].read_bytes()
    hdr0, t0 = read_checkpoint(job["ckpt"])
    assert hdr0["step"] == 2
    path = job["dir"] / "mutant.port"
    accepted = []

    def make(rng):
        if rng.random() < 0.4:
            return _flip_or_cut(raw, rng), False
        return _forge_ckpt(raw, rng), True

    def check(data, forged):
        path.write_bytes(data)
        try:
            h, t = read_checkpoint(path)
        except InternalError as e:
            pytest.fail(f"internal error for a mutated checkpoint: {e!r}")
        except PortError as e:
            assert str(path) in str(e), str(e)
            ok = False
        else:
            ok = True
            if not forged:
                assert h == hdr0 and all(torch.equal(t[k], t0[k]) for k in t0), "a flipped checkpoint was accepted"
        # port-rt reads the same file (eval --checkpoint): refused (2) or run (0), never a crash or exit 1
        r = _run(port_rt, "eval", job["bundle"], "--data", job["data"], "--checkpoint", path)
        assert r.returncode in (0, 2), (r.returncode, r.stderr[-1500:])
        if not forged:
            assert (r.returncode == 0) == ok, (r.returncode, r.stderr[-500:], ok)
        if ok and forged and len(accepted) < 4:
            accepted.append((data, h["step"]))
        return "ran" if ok else "refused"
    stats = _loop(make, check, seconds=SECONDS)
    # what Python's reader accepts of the forged files, Trainer.resume loads or refuses by name
    for data, step in accepted:
        path.write_bytes(data)
        try:
            tr = port.Trainer.resume(path, models.get("mlp", seed=0), job["x"][:B])
        except InternalError as e:
            pytest.fail(f"internal error resuming a forged checkpoint: {e!r}")
        except PortError as e:
            assert str(path) in str(e) or "checkpoint" in str(e), str(e)
        else:
            assert tr.step_count == step
            tr.close()
    print("rt checkpoint", stats, len(accepted), "resumed")
    assert stats["n"] >= 20 and stats["refused"] > 0 and stats["ran"] > 0


# (offset, struct format) of format 3's fields: the extra inputs' count and the first one's dtype and elements
DATA3_FIELDS = [(8, "<I"), (128, "<I"), (132, "<I"), (136, "<I"), (140, "<I"), (144, "<Q"), (152, "<I"), (160, "<Q")]


def test_fuzz_data_files_with_two_inputs(port_rt, tmp_path):
    """Format-3 data files (a model with input_ids and attention_mask) mutated as above, with forged edits to the
    extra inputs' count, dtype and element count: refused with a message or run, never a crash or exit 1."""
    import sys
    sys.path.insert(0, str(ROOT / "tests"))
    from nets54 import TwoInputs
    g = torch.Generator().manual_seed(1)
    ids, y = torch.randint(1, 13, (N, 6), generator=g), torch.randint(0, 10, (N,), generator=g)
    mask = torch.ones_like(ids)
    mask[::2, -2:] = 0
    tr = port.Trainer(TwoInputs(), {"input_ids": ids[:B], "attention_mask": mask[:B]})
    port.compile(tr, tmp_path / "m.portrt")
    tr.close()
    write_data(tmp_path / "d.portdata", [ids.numpy(), mask.numpy()], y.numpy(), 10)
    raw = (tmp_path / "d.portdata").read_bytes()
    assert struct.unpack_from("<I", raw, 8)[0] == 3
    assert _run(port_rt, "train", tmp_path / "m.portrt", "--data", tmp_path / "d.portdata").returncode == 0
    path = tmp_path / "mutant.portdata"

    def make(rng):
        if rng.random() < 0.3:
            return _flip_or_cut(raw, rng), False
        b = bytearray(raw[:-32])
        off, fmt = rng.choice(DATA3_FIELDS)
        struct.pack_into(fmt, b, off, rng.choice(ODD_U32 if fmt == "<I" else ODD_U64))
        return bytes(b) + hashlib.sha256(b).digest(), True

    stats = _loop(make, _data_check(port_rt, tmp_path / "m.portrt", path), seconds=4.0)
    assert stats["n"] >= 20 and stats["refused"] > 0, stats
