"""Seeded fuzzing of lowered programs (issue 11): every mutant of a valid program (slot offsets, sizes, shapes,
call attributes, zero ranges, call order, tensor ids, workspaces, program ids) either is refused with a named
PortError (by check_program or the executor/kernels) or runs to exactly the unmutated run's result (loss and every
persistent byte, bit for bit). Never a crash, a hang (a watchdog kills the process) or a write outside the arena
(canary bytes on both sides of the arena are checked after every run).

Bounded in time: ~20 s (PORT_FUZZ_MUTANTS per model; fewer under PORT_KERNELS_QUICK=1, as `make test-asan` runs
it against the ASan build of the kernels)."""
from __future__ import annotations

import dataclasses
import faulthandler
import os
import random
import time

import pytest
import torch

import port
import port.models as M
from port.errors import PortError
from port.exec.executor import Executor, RunState
from port.lower.arena import check_program
from port.lower.lower import default_plan, lower
from port.train.optim import SGD
from test_hostile_program import canaries_intact, guarded_arena   # tests/unit is on sys.path (rootdir conftest)

QUICK = os.environ.get("PORT_KERNELS_QUICK") == "1"
MUTANTS = int(os.environ.get("PORT_FUZZ_MUTANTS", "150" if QUICK else "250"))
BUDGET_S = float(os.environ.get("PORT_FUZZ_SECONDS", "12" if QUICK else "6"))   # per model
WATCHDOG_S = 120      # one mutant (check + bind + step) may take at most this long: else dump stacks and exit

MODELS = {
    "digits_cnn": (lambda: M.get("digits_cnn", seed=0), (4, 1, 8, 8)),
    "mlp": (lambda: M.get("mlp", seed=0, hidden=(32, 16)), (4, 64)),
    "resnet8": (lambda: M.get("resnet8", seed=0), (2, 3, 8, 8)),
}


def run_once(program, state_dict, x, y, check=True):
    """(loss bytes, persistent bytes, canaries intact) of one step of ``program`` on a guarded arena."""
    arena, full = guarded_arena(max(program.arena_bytes, 64))
    try:
        ex = Executor(program, RunState(opt=SGD(0.1, momentum=0.9)), arena=arena, check=check)
        for k, v in state_dict.items():
            try:
                ex.view(program.slot_by_name(k).tensor).copy_(v)
            except KeyError:
                pass
        ex.input.copy_(x)
        ex.labels.copy_(y)
        ex.zero_grads()
        ex.run()
        persist = {s.name: arena[s.offset:s.offset + s.nbytes].clone() for s in program.slots
                   if s.region == "persistent"}
        return ex.loss.clone(), persist, True
    finally:
        if not canaries_intact(full):
            raise AssertionError("a write outside the arena (canary bytes changed)")


# ---------------------------------------------------------------------------------------------------------
# mutations
# ---------------------------------------------------------------------------------------------------------
def _rslot(p, rnd, pred=lambda s: True):
    return rnd.choice([s for s in p.slots if pred(s)])


def _with_slot(p, s, **kw):
    return dataclasses.replace(p, slots=tuple(dataclasses.replace(t, **kw) if t.tensor == s.tensor else t
                                              for t in p.slots), _index={})


def _with_call(p, i, **kw):
    calls = list(p.calls)
    calls[i] = dataclasses.replace(calls[i], **kw)
    return dataclasses.replace(p, calls=tuple(calls), _index={})


def m_slot_offset(p, rnd):
    s = _rslot(p, rnd)
    off = rnd.choice([s.offset + rnd.choice([-1, 1]) * 64 * rnd.randint(1, 64), s.offset + 4,
                      rnd.randrange(-8192, p.arena_bytes + 8192), p.arena_bytes - 64, -64,
                      rnd.choice(p.slots).offset])
    return _with_slot(p, s, offset=off)


def m_slot_size(p, rnd):
    s = _rslot(p, rnd)
    return _with_slot(p, s, nbytes=rnd.choice([0, s.nbytes // 2, s.nbytes + 4, s.nbytes * 2, -4, s.nbytes + 4096]))


def m_slot_shape(p, rnd):
    s = _rslot(p, rnd, lambda s: len(s.shape) >= 1)
    sh = list(s.shape)
    how = rnd.randrange(4)
    if how == 0 and len(sh) >= 2:          # same numel, other layout
        i, j = rnd.sample(range(len(sh)), 2)
        if sh[i] % 2 == 0:
            sh[i] //= 2
            sh[j] *= 2
    elif how == 1:
        rnd.shuffle(sh)
    elif how == 2:
        i = rnd.randrange(len(sh))
        sh[i] = max(sh[i] + rnd.choice([-1, 1]), 0)
    else:
        sh = sh[1:] if len(sh) > 1 else sh + [1]
    nb = s.nbytes if rnd.random() < 0.5 else None
    from port.ir.types import DTYPE_BYTES, numel
    return _with_slot(p, s, shape=tuple(sh), nbytes=nb if nb is not None else numel(sh) * DTYPE_BYTES[s.dtype])


def m_slot_dtype(p, rnd):
    s = _rslot(p, rnd)
    return _with_slot(p, s, dtype=rnd.choice(["int64", "float32", "uint8", "float64", "bogus"]))


ATTR_VALUES = [(1, 1), (2, 2), (3, 3), (0, 0), (1, 2), (4, 4), 1, 2, 0, -1, True, False, None, "x",
               ("weight",), ("bias",), ("weight", "bias"), ("bias", "weight"), "sgd", "adamw", "sgd_momentum",
               (9, 9), (2, 1)]


def m_call_attr(p, rnd):
    i = rnd.choice([c.index for c in p.calls if c.attrs])
    c = p.calls[i]
    k = rnd.randrange(len(c.attrs))
    key, val = c.attrs[k]
    new = rnd.choice(ATTR_VALUES)
    attrs = list(c.attrs)
    if rnd.random() < 0.1:
        del attrs[k]
    else:
        attrs[k] = (key, new)
    return _with_call(p, i, attrs=tuple(attrs))


def m_zero_ranges(p, rnd):
    A, P = p.arena_bytes, p.persistent_bytes
    r = rnd.choice([(A - 64, 8192), (-4096, 4096), (0, P), (rnd.randrange(0, A), rnd.randrange(1, 9000)),
                    (P, A - P), (rnd.choice(p.slots).offset, 64), (0, 0), (0, -64)])
    zr = list(p.zero_ranges)
    if zr and rnd.random() < 0.5:
        zr[rnd.randrange(len(zr))] = r
    else:
        zr.append(r)
    return dataclasses.replace(p, zero_ranges=tuple(zr))


def m_call_order(p, rnd):
    n = len(p.calls)
    i, j = rnd.sample(range(n), 2)
    calls = list(p.calls)
    calls[i], calls[j] = calls[j], calls[i]
    if rnd.random() < 0.8:
        calls = [dataclasses.replace(c, index=k) for k, c in enumerate(calls)]
    return dataclasses.replace(p, calls=tuple(calls), _index={})


def m_call_ids(p, rnd):
    i = rnd.randrange(len(p.calls))
    c = p.calls[i]
    field = "inputs" if (c.inputs and (not c.outputs or rnd.random() < 0.5)) else "outputs"
    ids = list(getattr(c, field))
    if not ids:
        return _with_call(p, i, inputs=(p.input_id,))
    k = rnd.randrange(len(ids))
    how = rnd.randrange(4)
    if how == 0:
        ids[k] = 99_999
    elif how == 1:
        ids[k] = rnd.choice(p.slots).tensor
    elif how == 2:
        del ids[k]
    else:
        ids.append(rnd.choice(p.slots).tensor)
    return _with_call(p, i, **{field: tuple(ids)})


def m_call_fields(p, rnd):
    i = rnd.randrange(len(p.calls))
    c = p.calls[i]
    what = rnd.randrange(5)
    if what == 0:
        return _with_call(p, i, kernel=rnd.choice(["relu", "add", "linear", "conv2d", "max_pool2d", "nope",
                                                   "update", "cross_entropy", "avg_pool2d"]))
    if what == 1:
        # (another valid backend is a valid program whose rounding may differ: not a mutant this test judges)
        return _with_call(p, i, backend=rnd.choice(["c", "host", "gpu", ""]))
    if what == 2:
        return _with_call(p, i, variant=rnd.choice(["plain", "direct", "patch4", "patch8", "fused", "inplace", "x"]))
    if what == 3:
        return _with_call(p, i, workspace_offset=rnd.choice([-64, 0, p.persistent_bytes, p.arena_bytes - 64,
                                                             rnd.randrange(0, p.arena_bytes)]))
    return _with_call(p, i, workspace_bytes=rnd.choice([0, 4, c.workspace_bytes * 2, max(c.workspace_bytes - 4, 0),
                                                        1 << 20]))


def m_program_ids(p, rnd):
    f = rnd.choice(["input_id", "label_id", "loss_id", "logits_id"])
    return dataclasses.replace(p, **{f: rnd.choice([99_999, -1, -5, rnd.choice(p.slots).tensor]), "_index": {}})


def m_program_sizes(p, rnd):
    f = rnd.choice(["arena_bytes", "persistent_bytes"])
    v = getattr(p, f)
    return dataclasses.replace(p, **{f: rnd.choice([v - 64, v + 64, v // 2, 0, -64, v * 2])})


def diff(p, m) -> str:
    """What a mutant changed (for failure messages)."""
    out = []
    for f in dataclasses.fields(p):
        if f.name in ("slots", "calls", "_index"):
            continue
        if getattr(p, f.name) != getattr(m, f.name):
            out.append(f"{f.name}: {getattr(p, f.name)!r} -> {getattr(m, f.name)!r}")
    out += [f"slot {a} -> {b}" for a, b in zip(p.slots, m.slots) if a != b]
    out += [f"call {a} -> {b}" for a, b in zip(p.calls, m.calls) if a != b]
    return "; ".join(out)


MUTATORS = {
    "slot offset": m_slot_offset, "slot size": m_slot_size, "slot shape": m_slot_shape, "slot dtype": m_slot_dtype,
    "call attribute": m_call_attr, "zero ranges": m_zero_ranges, "call order": m_call_order,
    "tensor ids": m_call_ids, "call fields": m_call_fields, "program ids": m_program_ids,
    "program sizes": m_program_sizes,
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def base(request):
    make, shape = MODELS[request.param]
    model = make()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen)
    y = torch.randint(0, 10, (shape[0],), generator=gen)
    g = port.trace(model, x)
    p = lower(g, default_plan(g, "c"))
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    return request.param, p, sd, x, y


def test_fuzz_mutated_programs(base):
    name, p, sd, x, y = base
    ref_loss, ref_persist, _ = run_once(p, sd, x, y)
    assert torch.isfinite(ref_loss)
    rnd = random.Random(f"port-fuzz-{name}")
    counts: dict[str, list[int]] = {k: [0, 0] for k in MUTATORS}     # [named errors, equal runs]
    t0 = time.perf_counter()
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    try:
        for n in range(MUTANTS):
            if time.perf_counter() - t0 > BUDGET_S and n >= 20:
                break
            kind = rnd.choice(sorted(MUTATORS))
            mutant = MUTATORS[kind](p, rnd)
            try:
                check_program(mutant)
                loss, persist, _ = run_once(mutant, sd, x, y)
            except PortError:
                counts[kind][0] += 1
                continue
            same = loss.view(torch.int32).equal(ref_loss.view(torch.int32)) and persist.keys() == ref_persist.keys() \
                and all(torch.equal(persist[k], ref_persist[k]) for k in persist)
            assert same, f"{name}: a {kind} mutant passed every check but computed a different step: {diff(p, mutant)}"
            counts[kind][1] += 1
            faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)   # re-arm per mutant
    finally:
        faulthandler.cancel_dump_traceback_later()
    total = sum(a + b for a, b in counts.values())
    print(f"\nfuzz {name}: {total} mutants in {time.perf_counter() - t0:.1f} s; "
          + ", ".join(f"{k}: {a} errors/{b} equal" for k, (a, b) in sorted(counts.items()) if a + b))
    assert total >= 20
