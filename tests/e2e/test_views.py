"""Shape ops as arena views (issue 54): a range of a contiguous tensor that is one run of its bytes (split, chunk,
unbind, narrow, select and slices along the outermost non-1 dim) is a ``narrow_view``: an alias at a byte offset
into its base's storage, no call and no arena slot of its own; other ranges stay port_slice_copy calls. The model
trains like eager, the plan's accounting (simulator and ILP) still equals the lowered program's live bytes to the
byte, and the program checker holds a view inside its root's bytes."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import port
from port.config import load_device
from port.cost.roofline import modeled_profile
from port.errors import InfeasibleBudgetError, ProgramError
from port.ir.trace import trace
from port.ir.types import Graph
from port.lower.arena import check_program
from port.lower.lower import lower, recompute_plan
from port.pipeline import budget_bytes
from port.plan import variants as V
from port.solver import solve
from port.verify.simulate import simulate

from nets54 import TwoInputs, Views

N = 8


def _graph():
    return trace(Views(), torch.randn(N, 12), optimizer="sgd_momentum", name="views")


def test_contiguous_ranges_are_views_and_the_others_copies():
    g = _graph()
    views = [o for o in g.ops if o.kind == "narrow_view"]
    copies = [o for o in g.ops if o.kind == "narrow"]
    assert len(views) == 12 and len(copies) == 2, ([o.name for o in views], [o.name for o in copies])
    T = g.tensors
    for o in views:
        y, x = o.outputs[0], o.inputs[0]
        assert T[y].alias_of == x and g.storage_bytes(y) == 0
        inner = T[y].bytes // o.attr("length")
        assert T[y].alias_offset == o.attr("start") * inner
    # unbind of a split's item: a view of a view, its offset into the root summed along the chain
    u3 = next(o for o in views if o.attr("squeeze") and T[o.inputs[0]].alias_of is not None and o.attr("start") == 3)
    assert g.view_offset(u3.outputs[0]) == 23 * N * 4 and g.storage_root(u3.outputs[0]) == g.storage_root(
        T[u3.inputs[0]].alias_of)
    assert Graph.from_dict(g.to_dict()).digest() == g.digest()
    assert Graph.from_dict(g.to_dict()).tensors == g.tensors


@pytest.mark.parametrize("backend,acc", [("c", "cpu-c"), ("torch-cpu", "cpu-torch")])
def test_views_train_like_eager_with_no_call_and_copies_elsewhere(backend, acc):
    x, y = torch.randn(N, 12), torch.randint(0, 10, (N,))
    tr = port.Trainer(Views(), x, optimizer=port.optim.SGD(0.05, momentum=0.9), backend=backend)
    assert all(d.accelerator == acc for d in tr.plan.ops)
    kernels = [c.kernel for c in tr.program.calls]
    assert "narrow_view" not in kernels and kernels.count("narrow") == 2
    assert kernels.count("narrow_view.grad_input") == 12
    prog, g = tr.program, tr.graph
    for o in g.ops:
        if o.kind == "narrow_view" and prog.has_slot(o.outputs[0]):      # (a view no call reads has no slot)
            s, r = prog.slot(o.outputs[0]), prog.slot(prog.slot(o.outputs[0]).root)
            assert s.offset == r.offset + g.view_offset(o.outputs[0]) and s.offset + s.nbytes <= r.offset + r.nbytes
    with torch.no_grad():      # the inference program (forward only, on the training program's arena) too
        assert torch.allclose(torch.as_tensor(tr.predict(x)), Views()(x), rtol=1e-5, atol=1e-6)
    _steps_like_eager(tr, Views(), x, y)


def _steps_like_eager(tr, ref, x, y, steps=3):
    opt = torch.optim.SGD(ref.parameters(), 0.05, momentum=0.9)
    for _ in range(steps):
        loss = tr.step(x, y)
        opt.zero_grad()
        le = torch.nn.functional.cross_entropy(ref(x), y)
        le.backward()
        opt.step()
        assert abs(loss - le.item()) <= 1e-5 * max(1.0, abs(le.item())), (loss, le.item())
    for (n, p), q in zip(ref.named_parameters(), tr.model.parameters()):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), n


@pytest.mark.parametrize("pct", ["75%", "100%"])
def test_simulator_peak_equals_the_program_peak_with_views(pct):
    """Views own no bytes in the plan's accounting (the ILP's and the simulator's) nor in the arena: the
    simulator's arena peak is the lowered program's live bound to the byte."""
    g = _graph()
    prof = modeled_profile(g, load_device("host"))
    budget = budget_bytes(pct, g, prof)
    for _ in range(5):          # at the budget, or at the smallest one the error names (the packing's gaps too)
        try:
            plan = solve(g, prof, budget, solver="highs", time_limit_s=20, gap=0.02)
            break
        except InfeasibleBudgetError as e:
            assert e.min_feasible_bytes > budget, str(e)
            budget = e.min_feasible_bytes
    prog = lower(g, plan)
    assert simulate(plan, g, prof).arena_peak_bytes == prog.peak_live_bytes


def test_the_checker_holds_a_view_inside_its_roots_bytes():
    g = _graph()
    prog = lower(g)
    check_program(prog)
    v = next(o.outputs[0] for o in g.ops if o.kind == "narrow_view" and g.view_offset(o.outputs[0]))
    s, r = prog.slot(v), prog.slot(prog.slot(v).root)
    for off in (r.offset + r.nbytes - s.nbytes + 4, r.offset + r.nbytes):
        bad = dataclasses.replace(prog, slots=tuple(dataclasses.replace(t, offset=off) if t.tensor == v else t
                                                    for t in prog.slots))
        with pytest.raises(ProgramError, match="fall outside the root"):
            check_program(bad)


class _ReluAfterSplit(torch.nn.Module):
    """A relu of h after a view of h was taken and before the view is read: relu may not run in place."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.fc2 = torch.nn.Linear(12, 12), torch.nn.Linear(12, 10)

    def forward(self, x):
        h = self.fc(x).t()
        a = h[:6]                         # a view of h (taken before the relu)
        r = torch.relu(h)
        return self.fc2((r[6:] * 2 + r[:6] * a).repeat(2, 1).t())


def test_an_op_does_not_run_in_place_over_a_tensor_a_live_view_reads():
    g = trace(_ReluAfterSplit(), torch.randn(N, 12), optimizer="sgd", name="relu_after_split")
    relu = next(o for o in g.ops if o.kind == "relu")
    assert not V.inplace_legal(g, relu)
    x, y = torch.randn(N, 12), torch.randint(0, 10, (N,))
    _steps_like_eager(port.Trainer(_ReluAfterSplit(), x, optimizer=port.optim.SGD(0.05, momentum=0.9)),
                      _ReluAfterSplit(), x, y)


def test_a_recomputed_base_remakes_its_views():
    """Recompute everything recomputable: the permute whose output the views range over re-runs in the backward
    pass, and its views (read by the backward of mul and relu) are re-made at their offsets in the new copy; the
    simulator's peak is the program's, and training is bit for bit the keep-everything run."""
    x, y = torch.randn(N, 12), torch.randint(0, 10, (N,))
    keep = port.Trainer(Views(), x, optimizer=port.optim.SGD(0.05, momentum=0.9))
    g = keep.graph
    rc = recompute_plan(g, keep.plan, checkpoint_kinds=())
    ht = next(o for o in g.ops if o.kind == "permute" and o.phase == "forward")
    assert ht.outputs[0] in rc.recompute
    views_read_in_backward = {t for o in g.ops if o.phase == "backward" for t in o.inputs
                              if g.tensors[t].alias_offset and g.storage_root(t) == ht.outputs[0]}
    assert views_read_in_backward
    prog = lower(g, rc)
    check_program(prog)
    assert simulate(rc, g, modeled_profile(g, load_device("host"))).arena_peak_bytes == prog.peak_live_bytes
    tr = port.Trainer(Views(), x, plan=rc, optimizer=port.optim.SGD(0.05, momentum=0.9))
    assert any(c.phase == "recompute" for c in tr.program.calls)
    assert [tr.step(x, y) for _ in range(3)] == [keep.step(x, y) for _ in range(3)]


class _ChannelSplit(torch.nn.Module):
    """A ShuffleNet-style channel split of an N=1 map (views: one run of bytes each) feeding convolutions, whose C
    kernels read the second half at its offset (4-byte, not 64-byte, aligned: 5 channels of 7x7 floats in)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        nn = torch.nn
        self.conv, self.c1, self.c2 = nn.Conv2d(3, 11, 3, padding=1), nn.Conv2d(5, 4, 3), nn.Conv2d(6, 4, 3, 2, 1)
        self.fc = nn.Linear(4 * 25 + 4 * 16, 10)

    def forward(self, x):
        a, b = self.conv(x).split([5, 6], 1)
        return self.fc(torch.cat([self.c1(torch.relu(a)).flatten(1), self.c2(b).flatten(1)], 1))


def test_a_channel_split_of_a_batch_of_one_is_a_view_the_c_kernels_read():
    x, y = torch.randn(1, 3, 7, 7), torch.tensor([3])
    tr = port.Trainer(_ChannelSplit(), x, optimizer=port.optim.SGD(0.05, momentum=0.9))
    assert [o.kind for o in tr.graph.ops if o.kind.startswith("narrow") and o.phase == "forward"] == \
        ["narrow_view"] * 2
    assert all(d.accelerator == "cpu-c" for d in tr.plan.ops)
    b = next(o.outputs[0] for o in tr.graph.ops if o.kind == "narrow_view" and o.attr("start") == 5)
    assert (tr.program.slot(b).offset - tr.program.slot(tr.program.slot(b).root).offset) == 5 * 49 * 4
    _steps_like_eager(tr, _ChannelSplit(), x, y)


class _ExpandGates(torch.nn.Module):
    """expand read by ops that broadcast anyway: a squeeze-excitation gate (expand_as then mul), a layer scale
    (a parameter expanded), a bool mask expanded over the channels into where and masked_fill; and one expand
    also read by a reshape (a copy: the reshape needs the expanded bytes), its input read elsewhere too."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.se = torch.nn.Linear(6, 6)
        self.gamma = torch.nn.Parameter(torch.rand(6, 1, 1) + 0.5)
        self.fc = torch.nn.Linear(6 + 24, 10)

    def forward(self, x):                                          # x [N, 3, 5, 5]
        h = self.conv(x)
        s = torch.sigmoid(self.se(h.mean((2, 3))))                 # [N, 6]
        h = h * s[:, :, None, None].expand_as(h)                   # folded: mul broadcasts s
        h = h + self.gamma.expand(6, 5, 5) * h                     # folded: a parameter into mul
        m = (h[:, :1] > 0).expand(-1, 6, -1, -1)                   # folded bool masks
        h = torch.where(m, h, 0.1 * h).masked_fill((h[:, :, :1] < 0).expand(-1, -1, 5, -1), 0.0) + h
        e = s[:, :, None].expand(-1, 6, 4)                         # kept: a reshape reads it too
        k = (e * s[:, :1, None]).reshape(-1, 24) + e.reshape(-1, 24)
        return self.fc(torch.cat([h.mean((2, 3)), k], 1))


def test_an_expand_only_broadcasting_ops_read_is_no_op():
    g = trace(_ExpandGates(), torch.randn(N, 3, 5, 5), optimizer="sgd", name="expand_gates")
    kinds = [o.kind for o in g.ops]
    assert kinds.count("expand") == 1 and "expand_mask" not in kinds, kinds      # the reshape's copy alone
    e = next(o for o in g.ops if o.kind == "expand")
    assert g.tensors[e.outputs[0]].shape == (N, 6, 4)
    mul = next(o for o in g.ops if o.kind == "mul" and g.tensors[o.outputs[0]].shape == (N, 6, 5, 5))
    assert [g.tensors[t].shape for t in mul.inputs] == [(N, 6, 5, 5), (N, 6, 1, 1)]     # the gate, not [N, 6, 5, 5]


@pytest.mark.parametrize("backend,acc", [("c", "cpu-c"), ("torch-cpu", "cpu-torch")])
def test_expand_gates_train_like_eager(backend, acc):
    x, y = torch.randn(N, 3, 5, 5), torch.randint(0, 10, (N,))
    tr = port.Trainer(_ExpandGates(), x, optimizer=port.optim.SGD(0.05, momentum=0.9), backend=backend)
    kinds = {tr.graph.ops[d.op].kind: d.accelerator for d in tr.plan.ops}
    assert kinds["mul"] == kinds["where"] == kinds["masked_fill"] == kinds["expand"] == acc, kinds
    assert [c.kernel for c in tr.program.calls].count("expand") == 1
    _steps_like_eager(tr, _ExpandGates(), x, y)


@pytest.mark.parametrize("backend", ["c", "torch-cpu"])
def test_an_attention_mask_expand_is_read_unexpanded(backend):
    """HF's padding mask m[:, None, None, :].expand(n, 1, t, t) into attention: the kernel broadcasts the [N, 1,
    1, T] mask itself (no expand_mask copy of N T T bytes); the model trains like eager."""
    g = torch.Generator().manual_seed(7)
    ids, y = torch.randint(1, 13, (N, 6), generator=g), torch.randint(0, 10, (N,), generator=g)
    mask = torch.ones_like(ids)
    mask[::3, -2:] = 0
    x = {"input_ids": ids, "attention_mask": mask}
    tr = port.Trainer(TwoInputs(), x, optimizer=port.optim.SGD(0.05, momentum=0.9), backend=backend)
    att = next(o for o in tr.graph.ops if o.kind == "attention")
    assert "expand_mask" not in {o.kind for o in tr.graph.ops} and att.attr("mask_dims") == (N, 1, 1, 6)
    ref = TwoInputs()
    opt = torch.optim.SGD(ref.parameters(), 0.05, momentum=0.9)
    for _ in range(3):
        loss = tr.step(x, y)
        opt.zero_grad()
        le = torch.nn.functional.cross_entropy(ref(ids, mask), y)
        le.backward()
        opt.step()
        assert abs(loss - le.item()) <= 1e-5 * max(1.0, abs(le.item())), (loss, le.item())
