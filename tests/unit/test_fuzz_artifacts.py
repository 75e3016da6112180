"""Seeded, time-bounded fuzzing of PORT's files (issue 11): plans, profiles and checkpoints are mutated (byte
flips, truncation, JSON field edits: wrong types, negative/huge/non-finite numbers, missing and unknown keys)
and loading must either raise a named PortError of the bad-input kind (exit 2) or give back an object equal
to the original: never a raw KeyError/TypeError/ValueError, a crash or a hang."""
from __future__ import annotations

import copy
import hashlib
import json
import random
import struct
import time

import pytest
import torch

from port import models as M
from port.errors import InternalError, PortError

SECONDS = 6.0          # per artifact kind (~20 s in all)
SEED = 20240611
ODD_VALUES = ["x", "", [], {}, None, True, False, -1, 0, 2**70, -2**70, 1e308, -1e308, float("nan"),
              float("inf"), 1.5, [1, "a"], {"k": 1}]


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:6]):
            yield from _paths(v, prefix + (i,))


def _edit_json(d, rng: random.Random):
    d = copy.deepcopy(d)
    paths = [p for p in _paths(d) if p]
    p = rng.choice(paths)
    parent = d
    for k in p[:-1]:
        parent = parent[k]
    how = rng.random()
    if how < 0.2 and isinstance(parent, dict):
        del parent[p[-1]]
    elif how < 0.3 and isinstance(parent, dict):
        parent["unknown_key_" + str(rng.randrange(100))] = rng.choice(ODD_VALUES)
    else:
        parent[p[-1]] = copy.deepcopy(rng.choice(ODD_VALUES))
    return d


def _mutate_bytes(raw: bytes, rng: random.Random) -> bytes:
    b = bytearray(raw)
    if rng.random() < 0.4:
        return bytes(b[:rng.randrange(len(b))])
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def _check(load, same, raw_or_text, path, rng, stats):
    try:
        obj = load(path)
    except InternalError as e:        # exit 1: never for a bad file
        pytest.fail(f"internal error for a mutated file: {e!r}")
    except PortError as e:
        assert str(path) in str(e), str(e)
        stats["error"] += 1
        return
    assert same(obj), f"accepted a mutated file with a different content: {raw_or_text[:300]!r}"
    stats["equal"] += 1


@pytest.fixture(scope="module")
def artifacts():
    from port.config import load_device
    from port.cost.roofline import modeled_profile
    from port.ir.trace import trace
    from port.solver import solve
    g = trace(M.get("mlp", seed=0), torch.randn(8, 64), name="mlp")
    p = modeled_profile(g, load_device("host"))
    return g, p, solve(g, p, 10**9)


def _run(kind, make_bad, load, same, tmp_path):
    rng = random.Random(SEED + hash(kind) % 1000)
    stats = {"error": 0, "equal": 0}
    t0, i = time.perf_counter(), 0
    while time.perf_counter() - t0 < SECONDS:
        data = make_bad(rng)
        path = tmp_path / f"{kind}{i % 7}.bin"
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        _check(load, same, data, path, rng, stats)
        i += 1
    assert i >= 20 and stats["error"] > 0
    print(kind, i, stats)


def test_fuzz_plans(artifacts, tmp_path):
    from port.plan.io import load_plan, plan_to_dict, save_plan
    from port.plan.types import Plan
    g, p, plan = artifacts
    f = save_plan(plan, tmp_path / "orig.json", g)
    text = f.read_text()
    d = json.loads(text)
    want = plan_to_dict(plan, g)

    def make_bad(rng):
        r = rng.random()
        if r < 0.3:
            return _mutate_bytes(text.encode(), rng)
        e = _edit_json(d, rng)
        if r < 0.65:          # a deliberate edit: checksum removed, the structure checks must hold
            e.pop("sha256", None)
        return json.dumps(e)

    def load(path):
        return load_plan(path, g, p)

    def same(obj):
        return isinstance(obj, Plan) and (plan_to_dict(obj, g) == want or "sha256" not in json.loads(
            open(obj_path_holder[0]).read()))
    obj_path_holder = [None]

    def load_and_remember(path):
        obj_path_holder[0] = path
        return load(path)
    _run("plan", make_bad, load_and_remember, same, tmp_path)


def test_fuzz_profiles(artifacts, tmp_path):
    from port.cost.io import load_profile, profile_to_dict, save_profile
    g, p, _ = artifacts
    save_profile(p, tmp_path / "orig.json")
    text = (tmp_path / "orig.json").read_text()
    d = json.loads(text)
    want = profile_to_dict(load_profile(tmp_path / "orig.json"))
    holder = [None]

    def make_bad(rng):
        r = rng.random()
        if r < 0.3:
            return _mutate_bytes(text.encode(), rng)
        e = _edit_json(d, rng)
        if r < 0.65:
            e.pop("sha256", None)
        return json.dumps(e)

    def load(path):
        holder[0] = path
        return load_profile(path)

    def same(obj):
        # with the checksum in place only the original is accepted; without it (a deliberate edit) any
        # profile that passes the structure checks is fine
        return profile_to_dict(obj) == want or "sha256" not in json.loads(open(holder[0]).read())
    _run("profile", make_bad, load, same, tmp_path)


def test_fuzz_checkpoints(tmp_path):
    from port.train.checkpoint import read_checkpoint
    from port.train.optim import SGD
    from port.train.trainer import Trainer
    tr = Trainer(M.get("mlp", seed=0), torch.randn(8, 64), optimizer=SGD(0.05, momentum=0.9))
    tr.save_checkpoint(tmp_path / "orig.port")
    raw = (tmp_path / "orig.port").read_bytes()
    hdr0, t0 = read_checkpoint(tmp_path / "orig.port")
    ver, hlen = struct.unpack("<IQ", raw[8:20])
    data = raw[52 + hlen + ((-(52 + hlen)) % 64):]

    forged = [False]

    def make_bad(rng):
        forged[0] = False
        if rng.random() < 0.5:
            return _mutate_bytes(raw, rng)
        e = _edit_json(hdr0, rng)     # header edits, with the checksum fixed up half the time (forged)
        hj = json.dumps(e, sort_keys=True).encode()
        hpad = b"\0" * ((-(52 + len(hj))) % 64)
        forged[0] = rng.random() < 0.5
        dig = hashlib.sha256(hj + hpad + data).digest() if forged[0] else raw[20:52]
        return raw[:8] + struct.pack("<IQ", ver, len(hj)) + dig + hj + hpad + data

    def same(obj):
        # a forged file (checksum recomputed over the edited header) is indistinguishable from one PORT wrote:
        # it must pass every header check (no crash); any other change must be refused
        h, t = obj
        if forged[0]:
            return set(t) == {e["name"] for e in h["tensors"]}
        return h == hdr0 and set(t) == set(t0) and all(torch.equal(t[k], t0[k]) for k in t0)
    _run("checkpoint", make_bad, read_checkpoint, same, tmp_path)
