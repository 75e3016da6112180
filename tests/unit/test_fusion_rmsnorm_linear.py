"""RMSNorm + linear fused (issue 54, port.plan.variants.FUSIONS "rmsnorm_linear"): rms_norm's output y read only by
linears (one to three: Llama's q/k/v, gate/up, lm_head) and their weight-gradient ops is one chain; y is never
materialised (the norm's one call writes rstd and every linear's output, normalising each row block of x once into
its workspace; the last weight gradient's call rebuilds the blocks once for every weight gradient); refused where y
is read by anything else or viewed; the ILP picks it exactly where the profile says it pays (time, and memory at a tight budget) and its optimum
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
    lins, gws = ch.ops[1:1 + readers], ch.ops[1 + readers:]
    assert ch.calls == (key, gws[-1])                                # the norm's call and the last gradient's
    assert ch.at == (key,) * (1 + readers) + (gws[-1],) * readers
    x, rstd, y = norm.inputs[0], norm.outputs[1], norm.outputs[0]
    assert ch.nonmat == (y,)
    gamma = tuple(norm.inputs[1:])
    assert len(gamma) == int(affine)
    L = [g.ops[i] for i in lins]
    bias = tuple(bool(o.attr("bias")) for o in L)
    c, = registry.op_calls(g, norm, "fused", "c")
    assert (c.kernel, c.outputs, c.covers) == ("rmsnorm_linears", (rstd,) + tuple(o.outputs[0] for o in L), lins)
    assert c.inputs == (x,) + gamma + tuple(o.inputs[1] for o in L) + tuple(o.inputs[2] for o in L if o.attr("bias"))
    assert c.attr_dict()["biases"] == bias and c.attr_dict()["block_rows"] == V.rmslin_block_rows(8, 6) == 65536 // 6
    assert registry.op_workspace_bytes(g, norm, "fused") == 8 * 6 * 4         # one block: 8 rows
    assert registry.op_workspace_bytes(g, norm, "plain") == 0
    for i in lins + gws[:-1]:
        assert registry.op_calls(g, g.ops[i], "fused", "c") == () and not V.runs_fused_call(g, g.ops[i])
    G = [g.ops[i] for i in gws]
    c, = registry.op_calls(g, G[-1], "fused", "c")
    grads_ = [dict(zip(o.attr("grads"), o.outputs)) for o in G]
    assert c.kernel == "rmsnorm_linears.grad_weight" and c.covers == gws[:-1]
    assert c.outputs == tuple(d["weight"] for d in grads_) + tuple(d["bias"] for d in grads_ if "bias" in d)
    assert c.inputs == tuple(o.inputs[0] for o in G) + (x, rstd) + gamma
    # the last weight gradient reads the other linears' dy too (liveness counts it, fused or not)
    assert set(V.fused_reads(g)[gws[-1]]) == {x, rstd} | {o.inputs[0] for o in G[:-1]}
    for i in ch.ops:
        assert "fused" in V.variants(g, g.ops[i], "c") and "fused" not in V.variants(g, g.ops[i], "torch-cpu")
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
    assert "rmsnorm_linears" in [c.kernel for c in got[True][2].program.calls]


def test_ilp_picks_rmsnorm_linear_exactly_when_the_profile_says_it_pays(rms_graph):
    assert_ilp_picks_fused_exactly_when_it_pays(rms_graph, _priced_chain)


def test_the_model_prices_the_calls_below_the_plain_members(rms_graph):
    """The norm's call computes the linears too (y neither written nor read back) and the last weight gradient's
    call every weight gradient: the roofline model books each call at its Fusion's factor on the plain bounds of
    the members it computes, below their plain sum, each member its FLOP share (V.fused_share: identical layers in
    different parts book alike)."""
    g = rms_graph
    ch, = V.chains(g).values()
    assert ch.fusion.modeled_factor < 1.0
    prof = modeled_profile(g, load_device("host"))

    def ms(i, v):
        return prof.lookup(g.signature(g.ops[i]), "cpu-c", v).latency_ms
    for c in ch.calls:
        members = [m for m in ch.ops if ch.call_of(m) == c]
        assert len(members) >= 2 and sum(V.fused_share(g, g.ops[m]) for m in members) == pytest.approx(1.0)
        assert sum(ms(m, "fused") for m in members) < sum(ms(m, "plain") for m in members)
        assert all(ms(m, "fused") > 0.0 for m in members)


def test_ilp_picks_rmsnorm_linear_for_memory_at_a_tight_budget():
    """The fused calls 10% slower than the plain members, the norm and the op before it dear to re-run (10 ms, fused
    or not): with no budget the ILP keeps the chain plain; at the fused plan's peak (the norm's output never
    stored), which the plain chain meets only by re-running one of them, it fuses; the simulator accepts both."""
    g = _graph(batch=4, seq=64, d=48)
    ch, = V.chains(g).values()
    sigs = {g.signature(g.ops[i]): i for i in ch.ops}
    dear = (g.signature(g.ops[ch.ops[0]]), g.signature(g.ops[g.producers()[g.ops[ch.ops[0]].inputs[0]]]))
    prof = modeled_profile(g, load_device("host"))
    plain = {s_: prof.lookup(s_, "cpu-c", "plain").latency_ms for s_ in sigs}

    def price(e):
        if e.signature in dear:
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
    """seq 5: one block of rows (the plain chain's bits); seq 300 with 300 features (600 rows, blocks of 256): within
    rounding."""
    assert V.rmslin_block_rows(10, 300) == V.rmslin_block_rows(600, 300) == 256 and V.rmslin_block_rows(4096, 300) \
        == 1024 and V.rmslin_block_rows(600, 6) == 65536 // 6 and V.rmslin_block_rows(600, 32) == 2048
    d = 6 if seq == 5 else 300
    one_block = V.rmslin_block_rows(2 * seq, d) >= 2 * seq
    assert one_block == (seq == 5)
    m, x, y = _Net(readers=3, d=d), torch.randn(2, seq, 3), torch.tensor([0, 2])
    g = port.trace(copy.deepcopy(m), x, optimizer="sgd_momentum")
    got = {}
    for fuse in (True, False):
        plan = default_plan(g, fusions=("rmsnorm_linear",) if fuse else ())
        tr = port.Trainer(copy.deepcopy(m), x, plan=plan, optimizer=SGD(0.05, momentum=0.9), engine=engine)
        got[fuse] = [float(tr.step(x, y)) for _ in range(3)], tr.state_dict(), tr
    kernels = [c.kernel for c in got[True][2].program.calls]
    assert kernels.count("rmsnorm_linears") == kernels.count("rmsnorm_linears.grad_weight") == 1
    assert "rms_norm" not in kernels and kernels.count("linear.grad_weight") == 2   # emb, out
    assert "rmsnorm_linears" not in [c.kernel for c in got[False][2].program.calls]
    if one_block:
        assert got[True][0] == got[False][0]
        assert all(torch.equal(got[True][1][n], got[False][1][n]) for n in got[True][1])
    else:
        assert got[True][0] == pytest.approx(got[False][0], rel=1e-5)
        for n in got[True][1]:
            torch.testing.assert_close(got[True][1][n], got[False][1][n], rtol=1e-5, atol=1e-6, msg=n)
    assert torch.equal(got[True][2].predict(x), got[False][2].predict(x)) or not one_block
    # the fused program stores no copy of the norm's output: its arena is no larger
    assert got[True][2].program.arena_bytes <= got[False][2].program.arena_bytes
