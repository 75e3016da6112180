"""RMSNorm + linear fused (issue 54, port.plan.variants.FUSIONS "rmsnorm_linear"): rms_norm's output y read only by
linears (one or more: Llama's q/k/v, gate/up, lm_head) and their weight-gradient ops is one chain; y is never
materialised (the norm's call writes rstd only, each linear's call normalises row blocks of x into its workspace,
each weight gradient rebuilds them); refused where y is read by anything else, viewed, or a linear's weight is
frozen; the ILP picks it exactly where the profile says it pays (time, and memory at a tight budget) and its optimum
equals a brute force over every plan; the fused plan trains as the plain plan within float rounding (the same
losses here) on the per-call executor and the C step engine."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn as nn

import port
from port.config import load_device
from port.cost.roofline import modeled_profile
from port.exec import registry
from port.ir.trace import trace
from port.lower.lower import default_plan
from port.plan import variants as V
from port.solver import solve
from port.train.optim import SGD
from port.verify.simulate import simulate
from test_fusions import _priced_chain, assert_ilp_picks_fused_exactly_when_it_pays  # tests/unit is on sys.path
from test_solve import assert_ilp_equals_brute_force, naive_peak, two_acc_profile


class _Net(nn.Module):
    """emb -> RMSNorm -> (q, k) -> cat -> out; ``readers``: how many linears read the norm's output; ``extra``: the
    norm's output also added to the result; ``view``: the second reader reads a view of it; ``affine``: a weight."""
    def __init__(self, readers=2, extra=False, view=False, affine=True, d=6):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Linear(3, d)
        self.norm = nn.RMSNorm(d, eps=1e-6, elementwise_affine=affine)
        self.lins = nn.ModuleList([nn.Linear(d, 2 + i, bias=bool(i % 2)) for i in range(readers)])
        self.out = nn.Linear(sum(2 + i for i in range(readers)) + (d if extra else 0), 3)
        self.extra, self.view = extra, view

    def forward(self, x):
        h = self.norm(self.emb(x))
        outs = [lin(h[:, :-1] if self.view and i == 1 else h) for i, lin in enumerate(self.lins)]
        if self.view:
            outs[1] = torch.cat((outs[1], outs[1][:, :1]), 1)
        if self.extra:
            outs.append(h)
        return self.out(torch.cat(outs, -1)).mean(1)


def _graph(trainable=None, batch=2, seq=4, **kw):
    return trace(_Net(**kw), torch.randn(batch, seq, 3), optimizer="sgd", trainable=trainable, name="tiny_rmslin")


@pytest.fixture(scope="module")
def rms_graph():
    return _graph()


@pytest.mark.parametrize("readers,affine", [(1, True), (2, True), (3, False)])
def test_rmsnorm_linear_chain_of_a_training_graph(readers, affine):
    g = _graph(readers=readers, affine=affine)
    (key, ch), = V.chains(g).items()
    norm = g.ops[key]
    kinds = [g.ops[i].kind for i in ch.ops]
    assert ch.fusion.name == "rmsnorm_linear" and not ch.fusion.default
    assert kinds == ["rms_norm"] + ["linear"] * readers + ["linear.grad_weight"] * readers
    assert ch.calls == ch.ops and ch.at == ch.ops                   # every member runs its own call
    x, rstd, y = norm.inputs[0], norm.outputs[1], norm.outputs[0]
    assert ch.nonmat == (y,)
    gamma = tuple(norm.inputs[1:])
    assert len(gamma) == int(affine)
    st, = registry.op_calls(g, norm, "fused", "c")
    assert (st.kernel, st.outputs, st.inputs) == ("rmsnorm_linear.stats", (rstd,), (x,))
    for i in ch.ops[1:1 + readers]:
        o = g.ops[i]
        c, = registry.op_calls(g, o, "fused", "c")
        assert (c.kernel, c.outputs, c.inputs) == ("rmsnorm_linear", o.outputs, (x, rstd) + gamma + o.inputs[1:])
        assert set(V.fused_reads(g)[i]) == {x, rstd}
        assert registry.op_workspace_bytes(g, o, "fused") == 8 * 6 * 4         # one block: 8 rows
        assert registry.op_workspace_bytes(g, o, "plain") == 0
    for i in ch.ops[1 + readers:]:
        o = g.ops[i]
        c, = registry.op_calls(g, o, "fused", "c")
        assert (c.kernel, c.outputs, c.inputs) == ("rmsnorm_linear.grad_weight", o.outputs,
                                                   (o.inputs[0], x, rstd) + gamma)
    for i in ch.ops:
        assert "fused" in V.variants(g, g.ops[i], "c") and "fused" not in V.variants(g, g.ops[i], "torch-cpu")
        assert V.runs_fused_call(g, g.ops[i])
    # the norm's own gradient ops read x, rstd and the summed dy: not members, unchanged
    assert all(g.ops[o.forward_op].id == key for o in g.ops if o.kind.startswith("rms_norm.")) \
        and not any(g.ops[i].kind.startswith("rms_norm.") for i in ch.ops)


def test_rmsnorm_linear_refused_where_the_kernels_do_not_compute_the_chain():
    """y also read by a cat (extra), a reader taking a view of y, the linears' weights frozen (a weight gradient
    op computing the bias only, or none at all, is not the kernels' call): no chain, no ``fused`` variant."""
    assert V.chains(_graph(extra=True)) == {}
    assert V.chains(_graph(view=True)) == {}
    frozen = _graph(trainable=["emb", "norm", "out"])         # the linears take no gradient at all: legal
    (key, ch), = V.chains(frozen).items()
    assert [frozen.ops[i].kind for i in ch.ops] == ["rms_norm", "linear", "linear"]
    g = _graph(readers=2)
    for o in g.ops:       # a bias-only weight gradient (weight frozen) is refused
        if o.kind == "linear.grad_weight" and o.attr("bias") and g.ops[o.forward_op].inputs[0] in g.ops[1].outputs:
            bias_only = dataclasses.replace(o, attrs=tuple((k, ("bias",) if k == "grads" else v) for k, v in o.attrs))
            ops_ = list(g.ops)
            ops_[o.id] = bias_only
            h = dataclasses.replace(g, ops=tuple(ops_), _index={})
            assert V.chains(h) == {}
            break
    else:
        raise AssertionError("no biased linear reads the norm")


def test_rmsnorm_linear_forward_only_chain():
    """Only the head trains (no gradient reaches the norm): the norm and its two readers are the chain; the fused
    plan trains to the plain plan's bits and predicts alike."""
    m, x, y = _Net(), torch.randn(3, 4, 3), torch.tensor([0, 1, 2])
    g = trace(m, x, optimizer="sgd", trainable=["out"], name="tiny_rmslin")
    (key, ch), = V.chains(g).items()
    assert [g.ops[i].kind for i in ch.ops] == ["rms_norm", "linear", "linear"]
    got = {}
    for fuse in (True, False):
        plan = default_plan(g, fusions=("rmsnorm_linear",) if fuse else ())
        tr = port.Trainer(copy.deepcopy(m), x, plan=plan, optimizer=SGD(0.1), trainable=["out"])
        got[fuse] = [float(tr.step(x, y)) for _ in range(2)], tr.predict(x), tr
    assert got[True][0] == got[False][0] and torch.equal(got[True][1], got[False][1])
    assert "rmsnorm_linear" in [c.kernel for c in got[True][2].program.calls]


def test_ilp_picks_rmsnorm_linear_exactly_when_the_profile_says_it_pays(rms_graph):
    assert_ilp_picks_fused_exactly_when_it_pays(rms_graph, _priced_chain)


def test_the_model_prices_the_calls_above_the_plain_members(rms_graph):
    """No traffic saved (each call normalises x again): the roofline model books every call at 1.05x its plain
    member (not the 0.8x of the other fusions), so with memory to spare the ILP on it keeps the chain plain."""
    g = rms_graph
    ch, = V.chains(g).values()
    assert ch.fusion.modeled_factor > 1.0 and all(f.modeled_factor < 1.0 for f in V.FUSIONS if f is not ch.fusion)
    prof = modeled_profile(g, load_device("host"))
    for i in ch.ops:
        s_ = g.signature(g.ops[i])
        assert prof.lookup(s_, "cpu-c", "fused").latency_ms > prof.lookup(s_, "cpu-c", "plain").latency_ms
    p = solve(g, prof, None, gap=0.0, time_limit_s=30)
    assert not any(p.ops[i].variant == "fused" for i in ch.ops)


def test_ilp_picks_rmsnorm_linear_for_memory_at_a_tight_budget():
    """The fused linears 10% slower than the plain ones, the norm dear to re-run (10 ms, fused or not): with no
    budget the ILP keeps the chain plain; at the fused plan's peak (the norm's output never stored), which the plain
    chain meets only by re-running the norm, it fuses; the simulator accepts both."""
    g = _graph(batch=4, seq=64, d=48)
    ch, = V.chains(g).values()
    sigs = {g.signature(g.ops[i]): i for i in ch.ops}
    norm = g.signature(g.ops[ch.ops[0]])
    prof = modeled_profile(g, load_device("host"))
    plain = {s_: prof.lookup(s_, "cpu-c", "plain").latency_ms for s_ in sigs}

    def price(e):
        if e.signature == norm:
            return dataclasses.replace(e, latency_ms=10.0)
        if e.variant == "fused" and e.signature in sigs:
            return dataclasses.replace(e, latency_ms=plain[e.signature] * 1.1 + 1e-3)
        return e
    prof = dataclasses.replace(prof, entries=tuple(price(e) for e in prof.entries if e.accelerator == "cpu-c" and (
        e.signature not in sigs or e.variant in ("plain", "fused"))), storage=(), _index={})
    free = solve(g, prof, None, gap=0.0, time_limit_s=30)
    assert not any(free.ops[i].variant == "fused" for i in ch.ops)
    fused = dataclasses.replace(free, ops=tuple(dataclasses.replace(d, variant="fused") if d.op in ch.ops else d
                                                for d in free.ops))
    budget = simulate(fused, g, prof).peak_bytes
    assert budget < simulate(free, g, prof).peak_bytes
    tight = solve(g, prof, budget, gap=0.0, time_limit_s=30)
    assert all(tight.ops[i].variant == "fused" for i in ch.ops)
    assert simulate(tight, g, prof).peak_bytes <= budget


@pytest.mark.parametrize("frac", [1.0, 0.8])
def test_ilp_equals_brute_force_with_rmsnorm_linear(rms_graph, frac):
    """Fused or not, recompute and paging: the ILP's optimum is the simulator's over every plan (y never stored
    when fused, the calls' reads of x and rstd)."""
    g = rms_graph
    ch, = V.chains(g).values()
    sigs = {g.signature(g.ops[i]) for i in ch.ops}
    prof = two_acc_profile(g, free_ops=list(ch.ops), storage=True, seed=7, free_accs=("cpu-c",))
    prof = _priced_chain(prof, g, 1e-4, keep=lambda e: e.signature not in sigs or e.variant in ("plain", "fused"))
    p = assert_ilp_equals_brute_force(g, prof, int(naive_peak(g, prof) * frac))
    assert p is not None and all(p.ops[i].variant == "fused" for i in ch.ops)


@pytest.mark.parametrize("engine", ["python", "rt"])
@pytest.mark.parametrize("seq", [5, 300])
def test_fused_rmsnorm_linear_trains_as_the_plain_chain(engine, seq):
    """seq 5: one block of rows (the plain chain's bits); seq 300 (600 rows, blocks of 256): within rounding."""
    assert V.rmslin_block_rows(10) == V.rmslin_block_rows(600) == 256 and V.rmslin_block_rows(4096) == 1024
    m, x, y = _Net(readers=3), torch.randn(2, seq, 3), torch.tensor([0, 2])
    g = port.trace(copy.deepcopy(m), x, optimizer="sgd_momentum")
    got = {}
    for fuse in (True, False):
        plan = default_plan(g, fusions=("rmsnorm_linear",) if fuse else ())
        tr = port.Trainer(copy.deepcopy(m), x, plan=plan, optimizer=SGD(0.05, momentum=0.9), engine=engine)
        got[fuse] = [float(tr.step(x, y)) for _ in range(3)], tr.state_dict(), tr
    kernels = [c.kernel for c in got[True][2].program.calls]
    assert kernels.count("rmsnorm_linear") == kernels.count("rmsnorm_linear.grad_weight") == 3
    assert kernels.count("rmsnorm_linear.stats") == 1 and "rms_norm" not in kernels
    assert "rmsnorm_linear" not in [c.kernel for c in got[False][2].program.calls]
    if seq * 2 <= V.RMSLIN_MIN_BLOCK_ROWS:
        assert got[True][0] == got[False][0]
        assert all(torch.equal(got[True][1][n], got[False][1][n]) for n in got[True][1])
    else:
        assert got[True][0] == pytest.approx(got[False][0], rel=1e-5)
        for n in got[True][1]:
            torch.testing.assert_close(got[True][1][n], got[False][1][n], rtol=1e-5, atol=1e-6, msg=n)
    assert torch.equal(got[True][2].predict(x), got[False][2].predict(x)) or seq * 2 > V.RMSLIN_MIN_BLOCK_ROWS
    # the fused program stores no copy of the norm's output: its arena is no larger
    assert got[True][2].program.arena_bytes <= got[False][2].program.arena_bytes
