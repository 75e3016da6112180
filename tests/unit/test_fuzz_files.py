"""Seeded, time-bounded fuzzing of PORT's files where they are used, not only where they are read (issue 53):
test_fuzz_artifacts.py holds the loaders (load_plan, load_profile, read_checkpoint) to "a named PortError or
the original"; here every mutant a loader accepts goes on to what consumes it, and that must hold too:
* a plan file handed to ``Trainer(plan=path)`` (lowered, bound, one step run): a named bad-input PortError
  (exit 2) or a trainer whose step gives a finite loss, never an InternalError (exit 1: a ProgramError from
  lowering, a KernelError) or a raw Python exception;
* a profile file handed to ``port.solve`` and ``port.simulate``: a named PortError or a plan.
Data files, port-rt checkpoints and bundles: tests/e2e/test_fuzz_rt_files.py (they need the port-rt binary)."""
from __future__ import annotations

import json
import math
import random
import time

import pytest
import torch

from port import models as M
from port.errors import InternalError, PortError
from test_fuzz_artifacts import _edit_json, _mutate_bytes   # tests/unit is on sys.path (rootdir conftest)

SECONDS = 6.0
SEED = 20260601


@pytest.fixture(scope="module")
def solved():
    from port.config import load_device
    from port.cost.roofline import modeled_profile
    from port.ir.trace import trace
    from port.solver import solve
    x = torch.randn(8, 64)
    g = trace(M.get("mlp", seed=0), x, name="mlp", optimizer="sgd")
    p = modeled_profile(g, load_device("host"))
    return g, p, solve(g, p, int(0.8 * _peak(g, p))), x


def _peak(g, p):
    from port.pipeline import keep_everything_peak
    return keep_everything_peak(g, p)


def _mutants(text: str, d: dict, rng: random.Random) -> str | bytes:
    r = rng.random()
    if r < 0.25:
        return _mutate_bytes(text.encode(), rng)
    e = _edit_json(d, rng)
    if r < 0.8:                 # a deliberate edit: the checksum removed, so the structure checks are all there is
        e.pop("sha256", None)
    return json.dumps(e)


def _loop(kind, make, use, tmp_path) -> dict:
    rng = random.Random(SEED + len(kind))
    stats = {"refused": 0, "used": 0}
    t0, i = time.perf_counter(), 0
    while time.perf_counter() - t0 < SECONDS or i < 10:      # at least 10 files, however loaded the machine
        data = make(rng)
        path = tmp_path / f"{kind}{i % 5}.json"
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        try:
            use(path)
        except InternalError as e:
            pytest.fail(f"{kind}: internal error (exit 1) for a user's edited file: {e!r}\n{str(data)[:600]}")
        except PortError as e:
            assert str(path) in str(e) or "plan" in str(e) or "profile" in str(e), str(e)
            stats["refused"] += 1
        else:
            stats["used"] += 1
        i += 1
    print(kind, i, stats)
    assert i >= 10 and stats["refused"] > 0 and stats["used"] > 0
    return stats


def test_fuzz_plan_files_through_the_trainer(solved, tmp_path):
    from port.plan.io import save_plan
    from port.train.optim import SGD
    from port.train.trainer import Trainer
    g, p, plan, x = solved
    f = save_plan(plan, tmp_path / "orig.json", g)
    text = f.read_text()
    d = json.loads(text)
    y = torch.randint(0, 10, (8,))

    def use(path):
        tr = Trainer(M.get("mlp", seed=0), x, plan=path, optimizer=SGD(0.05), threads=None)
        try:
            loss = tr.step(x, y)
            assert math.isfinite(loss), loss
        finally:
            tr.close()
    _loop("plan", lambda rng: _mutants(text, d, rng), use, tmp_path)


def test_fuzz_profile_files_through_solve_and_simulate(solved, tmp_path):
    import port
    from port.cost.io import load_profile, save_profile
    g, p, _plan, _x = solved
    save_profile(p, tmp_path / "orig.json")
    text = (tmp_path / "orig.json").read_text()
    d = json.loads(text)
    budget = int(0.8 * _peak(g, p))

    def use(path):
        prof = load_profile(path)
        plan = port.solve(g, prof, budget, solver="greedy")
        port.simulate(plan, g, prof)
    _loop("profile", lambda rng: _mutants(text, d, rng), use, tmp_path)


def test_a_plan_file_with_an_illegal_variant_is_refused_naming_the_file(solved, tmp_path):
    """A variant lowering refuses (the fuzz loop found one: no file named in the message) names the plan file."""
    from port.train.optim import SGD
    from port.plan.io import save_plan
    from port.train.trainer import Trainer
    g, p, plan, x = solved
    d = json.loads(save_plan(plan, tmp_path / "orig.json", g).read_text())
    d.pop("sha256", None)
    d["ops"][1]["variant"] = "x"
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d))
    with pytest.raises(PortError) as e:
        Trainer(M.get("mlp", seed=0), x, plan=path, optimizer=SGD(0.05), threads=None).close()
    assert str(path) in str(e.value) and "'x'" in str(e.value), str(e.value)
