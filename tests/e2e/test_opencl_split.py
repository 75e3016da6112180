"""The split host (issue 56, configs/devices/host-opencl-split.yaml): the C kernels on one core, PoCL's OpenCL
device on the other. The YAML sets PoCL's thread count (read once a process: checked in a process of its own);
the engine has cores of its own, so the simulator's and the ILP's objective is the makespan; a split plan (the
backward's layer-3 weight gradient and its update on the OpenCL queue, beside the host's input gradients: the
placement the makespan model prefers on the measured split profile of ResNet-8) trains equal to PyTorch eager,
with hand-offs only where the host reads the queue's results.

Whether such plans pay on this 2-core host is a measurement (bench/opencl.py --memory split): PoCL's convolutions
run 3.5-3.7x the C kernels' time a core (ResNet-18 b8; ResNet-8 3.6-10x), so only the deeper layers' weight
gradients, beside the shallower layers' input gradients, fit on the queue (the simulator: ResNet-8 -6%, ResNet-18
-15% against all-C at 1 thread; under load the measured two-engine steps were slower, 1.4-1.6x)."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

import port.models as M
from port.config import load_device
from port.cost.roofline import modeled_profile
from port.exec import registry
from port.lower.lower import default_plan
from port.solver.ilp import _with_objective
from port.solver.instance import build_instance
from port.verify.simulate import overlapping_accelerators, simulate
from _equiv import compare, data, port_opt

OK, WHY = registry.available("opencl")
pytestmark = pytest.mark.skipif(not OK, reason=f"opencl backend unavailable: {WHY}")
SPLIT = "configs/devices/host-opencl-split.yaml"
ON_QUEUE = ("layer3.0.conv1.grad_weight", "layer3.0.conv1.weight.update")


def test_split_yaml_runs_pocl_on_its_thread_count():
    """Loading the split YAML in a fresh process makes PoCL's CPU device run the YAML's one thread (its
    environment variables are set before the engine exists); a GPU or another OpenCL CPU device is left alone."""
    code = ("from port.config import load_device; d = load_device('" + SPLIT + "'); "
            "from port.exec.backends.opencl import engine; e = engine(); "
            "print(e.cpu, 'Portable Computing Language' in e.name, e.device.max_compute_units, "
            "[a.id for a in d.accelerators])")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("POCL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    cpu, pocl, cus, accs = out.stdout.strip().split(" ", 3)
    assert "opencl" in accs
    if cpu == "True" and pocl == "True":
        assert cus == "1"
    # in this process the engine exists already (registry.available above): kept, with a note where its count
    # is not the YAML's
    from port.exec.backends.opencl import engine
    dev = load_device(SPLIT)
    assert "opencl" in {a.id for a in dev.accelerators}
    e = engine()
    assert any("compute threads" in n for n in dev.skipped) == (e.cpu and e.device.max_compute_units != 1)


PIN_PROBE = """
import json, os
def aff():
    return {t: sorted(os.sched_getaffinity(int(t))) for t in os.listdir('/proc/self/task')}
import numpy as np
import torch
from port.config import load_device
allowed, before = sorted(os.sched_getaffinity(0)), aff()
d = load_device('%s')
from port.exec.backends.opencl import engine
e = engine()
z = np.int64(0)
e.run('act_fwd', (64,), None, e.none, z, e.none, z, z, np.int32(0)); e.finish()   # lazy workers exist now
after = aff()
print(json.dumps(dict(allowed=allowed, main=after[str(os.getpid())], new=[after[t] for t in after if t not in before],
                      pocl=e.cpu and 'Portable Computing Language' in e.name, skipped=d.skipped)))
""" % SPLIT


@pytest.mark.parametrize("only_cpu0", [False, True], ids=["all-cpus", "cpu0-only"])
def test_split_yaml_pins_pocl_and_the_host_to_their_cpus(only_cpu0):
    """The YAML's cpus: in a fresh process, the engine's threads (those started by loading the YAML and running
    a kernel: PoCL's workers) run on the opencl engine's CPU only and the host (main) thread on the host engines'
    (port.exec.backends.opencl._pinned_engine); where this process may not use both CPUs (cpu0-only: started on
    CPU 0 alone; all-cpus on a 1-CPU machine) nothing is pinned and the device notes why."""
    import json
    import os
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity on this OS")
    env = {k: v for k, v in os.environ.items() if not k.startswith("POCL_")}
    out = subprocess.run([sys.executable, "-c", PIN_PROBE], capture_output=True, text=True, env=env, timeout=300,
                         preexec_fn=(lambda: os.sched_setaffinity(0, {0})) if only_cpu0 else None)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    dev = load_device(SPLIT, present_only=False)
    cpus = {a.id: a.cpus for a in dev.accelerators}
    assert cpus["opencl"] == (1,) and cpus["cpu-c"] == cpus["cpu-torch"] == (0,)
    if {0, 1} <= set(r["allowed"]):
        assert r["main"] == [0]
        assert not any("not pinned" in n for n in r["skipped"])
        if r["pocl"]:
            assert r["new"] and all(a == [1] for a in r["new"]), r["new"]
    else:
        assert r["main"] == r["allowed"]
        assert any("not pinned" in n for n in r["skipped"]), r["skipped"]


def _resnet8_graph():
    from port.train.trainer import Trainer
    tr = Trainer(M.get("resnet8", seed=0), data("resnet8", 4, 1)[0][0], optimizer=port_opt("sgd", 0.01))
    tr.close()
    return tr.graph


def test_split_plan_overlaps_and_trains_equal_to_eager():
    g = _resnet8_graph()
    prof = modeled_profile(g, load_device(SPLIT, present_only=False))
    assert overlapping_accelerators(["cpu-c", "opencl"], prof) == {"opencl"}     # cores of its own
    assert _with_objective(build_instance(g, prof), "auto").objective == "makespan"
    base = default_plan(g, "c", fuse=False)
    assert set(ON_QUEUE) <= {o.name for o in g.ops}
    plan = dataclasses.replace(base, ops=tuple(dataclasses.replace(d, accelerator="opencl", variant="plain")
                                               if o.name in ON_QUEUE else d for o, d in zip(g.ops, base.ops)))
    sim = simulate(plan, g, prof)
    assert sim.breakdown["makespan_ms"] < sim.step_ms        # the queue's calls overlap the host's
    _pl, _tl, tr = compare(M.get("resnet8", seed=0), data("resnet8", 4, 2), plan=plan)
    calls = tr.executor.program.calls
    assert sorted(c.name for c in calls if c.backend == "opencl") == sorted(ON_QUEUE)
    assert any(c.kernel == "handoff" for c in calls)
    tr.close()


def test_a_plan_with_explicit_joins_trains_equal_to_eager():
    """Plan.joins run: the host waits for the queue at each join call (port.exec.handoff.bind_handoff: the engine's
    finish), the arena reuses the bytes the queue held after it, and the step trains equal to eager (the layer-3
    weight gradients and their updates on the queue, a join a few steps after each gradient; the ILP's plan for
    ResNet-8 b8 at 100% on the measured split profile has this shape)."""
    from port.lower.lower import lower
    from port.plan.semantics import early_update_candidates
    g = _resnet8_graph()
    names = ("layer3.0.conv1.grad_weight", "layer3.0.conv1.weight.update", "layer3.0.conv2.grad_weight",
             "layer3.0.conv2.weight.update")
    base = default_plan(g, "c", fuse=False)
    early = tuple(sorted(u for u in early_update_candidates(g) if g.ops[u].name in names))
    plan = dataclasses.replace(base, early_updates=early, ops=tuple(
        dataclasses.replace(d, accelerator="opencl", variant="plain") if o.name in names else d
        for o, d in zip(g.ops, base.ops)))
    grads = sorted(o.id for o in g.ops if o.name in names[::2])
    joined = dataclasses.replace(plan, joins=tuple(("opencl", i + 3) for i in grads))
    prof = modeled_profile(g, load_device(SPLIT, present_only=False))
    assert simulate(joined, g, prof).peak_bytes < simulate(plan, g, prof).peak_bytes
    assert lower(g, joined).peak_live_bytes < lower(g, plan).peak_live_bytes
    _pl, _tl, tr = compare(M.get("resnet8", seed=0), data("resnet8", 4, 2), plan=joined)
    calls = tr.executor.program.calls
    assert [c.kernel for c in calls].count("join") == len(grads)
    assert sorted(c.name for c in calls if c.backend == "opencl") == sorted(names)
    tr.close()


@pytest.mark.slow
def test_the_ilps_joined_plan_trains_equal_to_eager():
    """The ILP places explicit joins itself (the slow tier: its solve runs 30 s): with OpenCL's weight gradients
    priced to pay (x0.3 on the modeled split profile), the 100% solve runs gradients and updates on the queue
    with joins, within the budget that the same plan without its joins breaks, and the plan trains equal to eager.
    (On the measured split profile the lead benchmarks, ResNet-8 b8 at 100% solves to such a plan: a layer-3
    gradient and its update on the queue, a join at step 67.)"""
    import port
    g = _resnet8_graph()
    prof = modeled_profile(g, load_device(SPLIT, present_only=False))
    fast = dataclasses.replace(prof, entries=tuple(
        dataclasses.replace(e, latency_ms=e.latency_ms * 0.3)
        if e.accelerator == "opencl" and "grad_weight" in e.signature else e for e in prof.entries))
    plan = port.solve(g, fast, budget="100%", time_limit_s=30)
    assert "opencl" in {d.accelerator for d in plan.ops} and plan.joins
    assert simulate(plan, g, fast).peak_bytes <= plan.budget_bytes
    assert simulate(dataclasses.replace(plan, joins=()), g, fast).peak_bytes > plan.budget_bytes
    _pl, _tl, tr = compare(M.get("resnet8", seed=0), data("resnet8", 4, 2), plan=plan)
    assert [c.kernel for c in tr.executor.program.calls].count("join") == len(plan.joins)
    tr.close()


def test_the_split_profile_measures_the_queues_join(tmp_path):
    """``port profile`` of the split YAML (quick: two tiny blocks, the plain variants) measures each opencl call's
    issue on the host and the opencl engine's join of its drained queue (Profile.join_ms: its finish(), median of
    many): what a plan's ``join`` call costs, well under the hand-off latency from the queue (a kernel's run and the
    wait for it); both survive save/load, and a cache without issue times has its opencl entries measured again."""
    import port
    from port.cost.io import load_profile, save_profile
    from port.cost.measure import profile_with_report
    from port.cost.types import MODELED_JOIN_MS
    import torch
    g = port.trace(M.get("digits_cnn", seed=0), torch.randn(2, 1, 8, 8), optimizer="sgd_momentum")
    prof, rep = profile_with_report(g, SPLIT, blocks=2, block_ms=1.0, warmup_ms=0.5, variants=("plain",),
                                    peak_memory=False, program_order=False, calibrate_peaks=False)
    if "opencl" not in {a for a, _v in prof.join_ms} or not any(h.measured for h in prof.handoff if h.src == "opencl"):
        pytest.skip(f"the opencl engine was not measured here: {rep.notes}")
    j = dict(prof.join_ms)["opencl"]
    assert j != MODELED_JOIN_MS and 0 < j < min(h.latency_ms for h in prof.handoff if h.src == "opencl" and h.measured)
    back = load_profile(save_profile(prof, tmp_path / "p.json"))
    assert back.join_ms == prof.join_ms
    # each measured opencl entry has the host's time to issue one call (OpCost.issue_ms: binding and enqueueing,
    # the makespan's host lane); the C kernels' calls are synchronous: none
    ocl = [e for e in prof.entries if e.accelerator == "opencl" and e.measured]
    assert ocl and all(e.issue_ms > 0 for e in ocl)
    assert all(e.issue_ms == 0 for e in prof.entries if e.accelerator != "opencl")
    assert back.entries == prof.entries and back.digest() == prof.digest()
    # a profile written before issue times were measured, given as the cache: its C entries are reused, its opencl
    # entries measured again (issue 0 would price a queued call as free on the host)
    old = dataclasses.replace(prof, entries=tuple(dataclasses.replace(e, issue_ms=0.0) for e in prof.entries),
                              _index={})
    again, rep2 = profile_with_report(g, SPLIT, cache=old, blocks=2, block_ms=1.0, warmup_ms=0.5,
                                      variants=("plain",), peak_memory=False, program_order=False,
                                      calibrate_peaks=False)
    assert rep2.reused == sum(e.measured and e.accelerator != "opencl" for e in prof.entries)
    assert all(e.issue_ms > 0 for e in again.entries if e.accelerator == "opencl" and e.measured)
