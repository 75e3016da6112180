"""Discrete memory (issue 56): the opencl engine with its own memory (configs/devices/host-opencl-discrete.yaml,
``memory: own``; buffers without CL_MEM_USE_HOST_PTR, so PoCL keeps its own bytes). Lowering gives it its own
arena and copy hand-offs (port.lower.memories), the program checker replays the residency rule, and plans that
alternate engines layer by layer, recompute on another engine than the backward reader's, or page a tensor out
of the engine's memory train equal to PyTorch eager."""
from __future__ import annotations

import dataclasses

import pytest

import port.models as M
from port.config import load_device, own_memory_backends
from port.errors import ProgramError
from port.exec import registry
from port.lower.arena import check_program
from port.lower.lower import lower, recompute_plan
from port.lower.program import Program
from port.plan import semantics as SEM
from _equiv import compare, data
from test_opencl_cross import _graph, alternating

OK, WHY = registry.available("opencl")
pytestmark = pytest.mark.skipif(not OK, reason=f"opencl backend unavailable: {WHY}")
OWN = ("opencl",)


def test_discrete_device_yaml_names_the_engine_with_its_own_memory(tmp_path):
    dev = load_device("configs/devices/host-opencl-discrete.yaml")
    assert own_memory_backends(dev) == OWN
    assert own_memory_backends(load_device("configs/devices/host-opencl.yaml")) == ()
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmemory: 1GiB\naccelerators:\n  - {id: cpu-c, kind: cpu, backend: c, "
                   "peak_gflops: 1, mem_gbps: 1, memory: own, memory_cap: 1MiB}\n")
    with pytest.raises(Exception, match="memory: own needs backend opencl"):
        load_device(str(bad))


def _peaks_agree(g, plan, prog):
    """The plan semantics' own-memory peak (op by op) is the program's live bound there (call by call), and the
    arena the packer places reaches it."""
    from port.lower.memories import own_peaks
    sem = SEM.own_memory_peaks(g, plan, {"opencl": "opencl"})["opencl"]
    low = own_peaks(prog)["opencl"]
    assert sem > 0 and sem == low == dict(prog.memories)["opencl"], (sem, low, prog.memories)
    # and the copies the rule makes are the program's copy hand-offs, in number and direction
    from collections import Counter
    want = Counter((a, b) for _r, a, b, *_n in SEM.own_memory_copies(g, plan, {"opencl": "opencl"}))
    assert want == Counter((c.attr("src"), c.attr("dst")) for c in _copies(prog))


def _copies(prog):
    return [c for c in prog.calls if c.kernel == "handoff" and c.attr("copy")]


def _without(prog, drop):
    calls = tuple(dataclasses.replace(c, index=i) for i, c in enumerate(c for c in prog.calls if c is not drop))
    return dataclasses.replace(prog, calls=calls, live_timeline=(), live_until=())


def test_alternating_plan_lowers_to_two_arenas_with_checked_copies():
    _m, g = _graph()
    prog = lower(g, alternating(g), own_memory=OWN)
    _peaks_agree(g, alternating(g), prog)
    (mem, nbytes), = prog.memories
    assert mem == "opencl" and 0 < nbytes < prog.arena_bytes
    cps = _copies(prog)
    assert {(c.attr("src"), c.attr("dst")) for c in cps} == {("host", "opencl"), ("opencl", "host")}
    # no synchronisation-only hand-offs: every crossing into or out of the engine's memory is a copy
    assert all(c.attr("copy") for c in prog.calls if c.kernel == "handoff")
    # every opencl operand has a place in the engine's arena; the program round-trips through JSON
    placed = {r for m, r, _o in prog.memory_slots}
    assert all(prog.slot(t).root in placed for c in prog.calls if c.backend == "opencl" for t in c.inputs)
    assert Program.from_json(prog.to_json()) == prog
    # the checker refuses the program without a copy into the engine, and without the copy back to the host
    to_dev = next(c for c in cps if c.attr("dst") == "opencl")
    with pytest.raises(ProgramError, match="copy hand-off .* is missing"):
        check_program(_without(prog, to_dev))
    back = next(c for c in cps if c.attr("dst") == "host" and c.phase == "update")
    with pytest.raises(ProgramError, match="a copy hand-off to the host is missing"):
        check_program(_without(prog, back))
    # ... and two roots live in the engine's memory at once on the same bytes
    (m, r1, o1), (_m2, r2, _o2) = prog.memory_slots[:2]
    ms = ((m, r1, o1), (m, r2, o1)) + prog.memory_slots[2:]
    with pytest.raises(ProgramError, match="overlap"):
        check_program(dataclasses.replace(prog, memory_slots=ms, _index={}))
    # the engine's arena reaches its live bound (up to packing), and a memory_cap below it is refused
    from port.errors import InfeasibleBudgetError
    from port.lower.memories import check_caps, own_peaks
    peak = own_peaks(prog)["opencl"]
    assert 0 < peak <= nbytes <= 1.1 * peak
    check_caps(prog, {"opencl": nbytes})
    with pytest.raises(InfeasibleBudgetError, match="memory_cap"):
        check_caps(prog, {"opencl": nbytes - 64})
    # a plan without opencl ops on the same device: one arena, the format older readers know
    from port.lower.lower import default_plan
    plain = lower(g, default_plan(g, "c"), own_memory=OWN)
    assert plain.memories == () and plain.version == 2 and not _copies(plain)
    # the one-arena lowering of the same plan keeps synchronisations, no copies
    assert not _copies(lower(g, alternating(g)))


def _trainer_graph(opt="sgd"):
    """The graph compare's trainer traces (its optimizer object): the plans below are made for it."""
    from port.train.trainer import Trainer
    from _equiv import port_opt
    tr = Trainer(M.get("resnet8", seed=0), data("resnet8", 4, 1)[0][0],
                 optimizer=port_opt(opt, 0.01 if opt == "sgd" else 1e-3))
    tr.close()
    return tr.graph


def _train(plan, opt="sgd"):
    batches = data("resnet8", 4, 3)
    _pl, _tl, tr = compare(M.get("resnet8", seed=0), batches, opt=opt, plan=plan, own_memory=OWN)
    prog = tr.executor.program
    assert prog.memories and tr.executor.own["opencl"] is not None
    return prog, tr


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_discrete_alternating_resnet8_trains_equal_to_eager(opt):
    g = _trainer_graph(opt)
    prog, _tr = _train(alternating(g), opt)
    assert len(_copies(prog)) >= 40 and sum(c.backend == "opencl" for c in prog.calls) >= 40


def test_discrete_recompute_on_another_engine_trains_equal_to_eager():
    g = _trainer_graph()
    plan = recompute_plan(g, alternating(g))
    SEM.schedule(g, plan)
    prog, _tr = _train(plan)
    _peaks_agree(g, plan, prog)
    # a re-run on opencl whose output a backward call on the C kernels reads: copied out of the engine's memory
    rec = {t for c in prog.calls if c.phase == "recompute" and c.backend == "opencl" for t in c.outputs}
    read_c = {t for c in prog.calls if c.backend == "c" and c.phase == "backward" for t in c.inputs}
    both = {prog.slot(t).root for t in rec & read_c}
    assert both and both <= {prog.slot(c.inputs[0]).root for c in _copies(prog) if c.attr("dst") == "host"}


def test_discrete_paging_out_of_the_engine_memory_trains_equal_to_eager(tmp_path, monkeypatch):
    monkeypatch.setenv("PORT_SPILL_DIR", str(tmp_path))
    g = _trainer_graph()
    base = alternating(g)
    from test_paging import page_candidates
    on_ocl = {d.op for d in base.ops if d.accelerator == "opencl"}
    paged = []
    for r in page_candidates(g):
        if SEM.activation_roots(g)[r].birth in on_ocl and len(paged) < 6:
            try:                 # (a root an in-place op of the plan writes over cannot page)
                SEM.schedule(g, dataclasses.replace(base, paged=tuple(paged + [r])))
                paged.append(r)
            except Exception:  # noqa: BLE001 - PlanError: not pageable under this plan
                pass
    assert paged
    plan = dataclasses.replace(base, paged=tuple(paged))
    SEM.schedule(g, plan)
    prog, tr = _train(plan)
    _peaks_agree(g, plan, prog)
    outs = [c for c in prog.calls if c.kernel == "page_out"]
    assert outs
    # each page-out of an opencl-written tensor reads it from the host arena after a copy out of the engine's
    for c in outs:
        i = c.index
        r = prog.slot(c.inputs[0]).root
        assert any(k.kernel == "handoff" and k.attr("copy") and prog.slot(k.inputs[0]).root == r
                   for k in prog.calls[:i])
    assert tr.executor.spill_counters()["bytes_written"] > 0


def test_simulator_prices_the_copies_lowering_makes_and_gives_the_own_arena():
    """simulate(..., own=...) prices every copy of the residency rule (parameters copied into the engine every
    step included) from the engine pair's latency + bytes / bandwidth: the sum over the lowered program's copy
    hand-offs; its own-memory peak is the program's own arena."""
    from port.config import load_device
    from port.cost.roofline import modeled_profile
    from port.lower.program import align
    from port.verify.simulate import simulate
    _m, g = _graph()
    plan = alternating(g)
    prof = modeled_profile(g, load_device("configs/devices/host-opencl-discrete.yaml"))
    prog = lower(g, plan, own_memory=OWN)
    acc = {"host": "cpu-c", "opencl": "opencl"}       # every host-side op of this plan is on the C kernels
    want = sum(prof.handoff_cost(acc[c.attr("src")], acc[c.attr("dst")]).cost_ms(align(prog.slot(c.inputs[0]).nbytes))
               for c in _copies(prog))
    sim = simulate(plan, g, prof, own={"opencl": "opencl"})
    assert want > 0 and abs(sim.breakdown["handoff_ms"] - want) <= 1e-9 * want
    assert sim.breakdown["own_memory_peaks"] == {"opencl": dict(prog.memories)["opencl"]}
    # the profile says which engines have their own memory: simulate reads it there when not told
    assert prof.own_memory == OWN and simulate(plan, g, prof).breakdown == sim.breakdown
    # the unified reading of the same plan prices one hand-off per crossing edge, and no parameter copies
    assert simulate(plan, g, prof, own={}).breakdown["handoff_ms"] < want
