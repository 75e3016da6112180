"""One op registry: the profiler times exactly the calls the executor runs.

Every op kind x legal variant x CPU backend of two small graphs (training batch norm with SGD momentum; frozen
batch norm with AdamW) goes through both paths: the profiler's (port.cost.runners: registry calls on scratch
buffers) and the executor's (lower -> Executor on the arena). Both must name the same calls, the same kernel
entry points, and, fed the same inputs, write the same outputs.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn

import port
from port.cost.runners import get_runner
from port.exec import registry
from port.exec.executor import Executor
from port.lower.lower import BACKEND_ACCELERATORS, lower
from port.plan import semantics as SEM
from port.plan import variants as V
from port.plan.types import OpDecision, Plan


class Zoo(nn.Module):
    """Every op kind PORT supports, small and with odd sizes."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)                      # bias
        self.b1 = nn.BatchNorm2d(8)
        self.p1 = nn.MaxPool2d(2)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)          # fusable chain
        self.b2 = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8, bias=False)   # depthwise, stride 2
        self.b3 = nn.BatchNorm2d(8)
        self.pw = nn.Conv2d(8, 8, 1)                                 # pointwise
        self.ap = nn.AvgPool2d(2)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.p1(torch.relu(self.b1(self.c1(x))))
        x = torch.relu(self.b2(self.c2(x))) + x
        x = nn.functional.relu6(self.b3(self.dw(x)))
        x = nn.functional.hardswish(self.pw(x))
        x = self.ap(x)
        x = self.drop(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
        return self.fc(x)


def _graphs():
    torch.manual_seed(0)
    m = Zoo()
    x = torch.randn(3, 3, 18, 18)
    train = port.trace(m, x, optimizer="sgd_momentum", name="zoo-train")
    frozen = port.trace(m.eval(), x, optimizer="adamw", name="zoo-frozen")
    return [train, frozen]


def _plans(graph, backend):
    """Plans that together use every legal variant of every op on ``backend``."""
    acc = BACKEND_ACCELERATORS[backend]
    legal = {o.id: V.variants(graph, o, backend) for o in graph.ops}
    base = [OpDecision(o.id, acc, "plain") for o in graph.ops]

    def with_(pick):
        ops = list(base)
        for o in graph.ops:
            v = pick(o)
            if v and v in legal[o.id]:
                ops[o.id] = OpDecision(o.id, acc, v)
        for f, b in SEM.coupled_variants(graph):
            if ops[f].variant == "inplace":
                ops[b] = OpDecision(b, acc, "inplace")
        # one op of each in-place conflict pair
        for a, b in V.inplace_conflicts(graph):
            if ops[a].variant == "inplace" and ops[b].variant == "inplace":
                ops[b] = OpDecision(b, acc, "plain")
        return Plan(graph.digest(), "", 0, tuple(ops))

    plans = [with_(lambda o: None),
             with_(lambda o: "inplace" if o.kind in ("relu", "relu6", "add") else None),
             with_(lambda o: "inplace" if o.kind == "batch_norm2d" else None),
             with_(lambda o: "inplace" if o.kind in V.BACKWARD_INPLACE_KINDS else None),
             with_(lambda o: "direct"),
             with_(lambda o: "winograd"),
             with_(lambda o: "patch4"),
             with_(lambda o: "patch8")]
    if backend == "c":
        fused = list(base)
        for o in graph.ops:
            ch = V.fusion_chain(graph, o)
            if ch:
                for i in ch:
                    fused[i] = OpDecision(i, acc, "fused")
        plans.append(Plan(graph.digest(), "", 0, tuple(fused)))
    else:   # batch norm in place on the C kernels, its backward from the output on torch
        ops = list(base)
        for f, b in SEM.coupled_variants(graph):
            ops[f] = OpDecision(f, "cpu-c", "inplace")
            ops[b] = OpDecision(b, acc, "inplace")
        plans.append(Plan(graph.digest(), "", 0, tuple(ops)))
    return plans


@pytest.mark.parametrize("backend", ["c", "torch-cpu"])
def test_profiler_runs_what_the_executor_runs(backend):
    covered: set[tuple[str, str, str]] = set()
    wanted: set[tuple[str, str, str]] = set()
    for graph in _graphs():
        runner = get_runner(backend, graph, threads=1, seed=1)
        for o in graph.ops:
            for v in V.variants(graph, o, backend):
                wanted.add((o.kind, v, backend))
        for plan in _plans(graph, backend):
            prog = lower(graph, plan)
            ex = Executor(prog)
            ex.state.opt, ex.state.step = runner.state.opt, runner.state.step
            by_op: dict[int, list] = {}
            for c in prog.calls:
                if c.op >= 0 and c.phase != "recompute" and c.backend == backend:
                    by_op.setdefault(c.op, []).append(c)
            for o in graph.ops:
                d = plan.ops[o.id]
                if o.phase not in ("forward", "loss", "backward", "update") or \
                        _backend(d.accelerator) != backend:
                    continue
                prep = runner.prepare(o, d.variant)
                # a fused chain member without a call of its own times its chain's call (the profiler books the
                # member's FLOP share of it, V.fused_share): the calls the executor runs at the chain's call op
                ch = V.chain_of(graph, o) if d.variant == "fused" else None
                calls = by_op.get(ch.call_of(o.id) if ch is not None else o.id, [])
                # the same calls ...
                assert [(c.kernel, c.variant) for c in prep.calls] == [(c.kernel, c.variant) for c in calls], o.name
                # ... through the same kernel entry points ...
                assert list(prep.entries) == [ex.entries[c.index] for c in calls], o.name
                if backend == "c":    # the documented Python -> C name table
                    for c, e in zip(calls, prep.entries):
                        assert e in registry.C_ENTRIES[c.kernel] or e.startswith("torch."), (c.kernel, e)
                # ... writing the same outputs from the same inputs
                for pc, ec in zip(prep.calls, calls):
                    _same_outputs(runner, prep, pc, ex, ec, o.name)
                covered.add((o.kind, d.variant, backend))
    missing = {w for w in wanted if w not in covered}
    assert not missing, f"op kind x variant pairs no test plan ran: {sorted(missing)}"


def _backend(acc: str) -> str:
    from port.lower.lower import backend_of
    return backend_of(acc)


def _same_outputs(runner, prep, pc, ex, ec, name):
    scratch = prep.buffers
    ins = {t: scratch[t].clone() for t in pc.inputs}
    outs_only = [t for t in pc.outputs if t not in pc.inputs]
    for t in outs_only:
        scratch[t].zero_()
    for t, v in ins.items():
        scratch[t].copy_(v)
    from port.cost.runners import _Scratch
    registry.bind(pc, _Scratch(scratch, prep.workspaces, {t: tuple(scratch[t].shape) for t in scratch},
                               runner.state))()
    want = {t: scratch[t].clone() for t in pc.outputs}
    for t in ec.inputs:
        if t in ins:
            ex.view(t).copy_(ins[t])
    for t in ec.outputs:
        if t not in ec.inputs:
            ex.view(t).zero_()
    for t in ec.inputs:   # in place: the input was overwritten by the zeroing above when they share a slot
        if t in ins:
            ex.view(t).copy_(ins[t])
    ex.bound[ec.index]()
    for t in ec.outputs:
        got = ex.view(t)
        assert torch.equal(got, want[t]), f"{name}: output {t} differs between profiler and executor"


LOWER_WITHOUT_TORCH = """
import sys, torch, port
from port import models
g = port.trace(models.get("resnet8", seed=0), torch.randn(2, 3, 32, 32))
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("lowering imported " + name)
for m in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
    del sys.modules[m]
sys.meta_path.insert(0, NoTorch())
from port.lower.lower import lower, default_plan, recompute_plan
p = lower(g, recompute_plan(g, default_plan(g)))
print(len(p.calls), sum(c.workspace_bytes > 0 for c in p.calls),
      [m for m in sys.modules if m.startswith("port.verify") or m.startswith("port.solver")])
"""


def test_lowering_is_pure():
    """Lowering (workspace queries included) runs with torch unimportable and imports neither the simulator
    nor the solver."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", LOWER_WITHOUT_TORCH], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    ncalls, nws, mods = r.stdout.strip().split(" ", 2)
    assert int(ncalls) > 50 and int(nws) > 0      # convolutions got their workspace from the C query
    assert mods == "[]", f"lowering imported {mods}"


def test_no_second_dispatcher():
    """Only the op records (port/ops/), port/exec/registry.py and the backends it binds map op kinds to
    kernels."""
    import pathlib
    root = pathlib.Path(port.__file__).parent
    offenders = []
    for f in root.rglob("*.py"):
        rel = f.relative_to(root).as_posix()
        if rel.startswith(("exec/backends/", "ops/")) or rel in ("exec/registry.py", "exec/capi.py", "exec/rtcall.py"):
            continue
        # port-rt's runtime entry points (load a bundle, run a whole step) run the registry's encoded calls
        text = f.read_text().replace("raw.port_rt_", "").replace("raw.port_sha256", "")
        if "raw.port_" in text or "aten.native_batch_norm" in text or "port_conv2d_forward" in text:
            offenders.append(rel)
    assert not offenders, f"op dispatch outside the registry: {offenders}"
