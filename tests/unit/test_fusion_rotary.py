"""Rotary position embedding fused (issue 54, port.plan.variants.FUSIONS "rotary"): x cos + rotate_half(x) sin, as
Hugging Face's apply_rotary_pos_emb writes it (mul, narrow, narrow, neg, cat, mul, add, and their nine gradient ops),
is one chain: the add runs the forward call, x's last gradient sum the backward one, every intermediate (and every
partial gradient) is never materialised; refused where x or an intermediate is read elsewhere or the tables train;
the ILP picks it exactly where the profile says it pays and its optimum equals a brute force over every plan; the
fused plan trains to the plain plan's bits."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import port
from port.exec import registry
from port.ir.trace import trace
from port.lower.lower import default_plan
from port.plan import variants as V
from port.train.optim import SGD
from test_fusions import _priced, assert_ilp_picks_fused_exactly_when_it_pays      # tests/unit is on sys.path
from test_solve import assert_ilp_equals_brute_force, naive_peak, two_acc_profile

SEQ, HEADS, D = 5, 2, 4


class _Rope(nn.Module):
    """q = proj(x) as [n, heads, seq, d], rotated by fixed tables; ``extra``: q also read elsewhere; ``train_tables``:
    the tables are parameters (they take a gradient)."""
    def __init__(self, extra: bool = False, train_tables: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.proj, self.head = nn.Linear(3, HEADS * D), nn.Linear(SEQ * HEADS * D, 3)
        ang = torch.arange(SEQ, dtype=torch.float32)[:, None] * torch.tensor([1.0, 0.1, 1.0, 0.1])
        cos, sin = ang.cos()[None, None], ang.sin()[None, None]
        if train_tables:
            self.cos, self.sin = nn.Parameter(cos), nn.Parameter(sin)
        else:
            self.register_buffer("cos", cos)
            self.register_buffer("sin", sin)
        self.extra = extra

    def forward(self, x):
        q = self.proj(x).view(x.shape[0], SEQ, HEADS, D).transpose(1, 2)
        h = D // 2
        r = q * self.cos + torch.cat((-q[..., h:], q[..., :h]), -1) * self.sin
        if self.extra:
            r = r + q
        return self.head(r.transpose(1, 2).flatten(1))


def _graph(**kw):
    return trace(_Rope(**kw), torch.randn(2, SEQ, 3), optimizer="sgd", name="tiny_rope")


@pytest.fixture(scope="module")
def rope_graph():
    return _graph()


def test_rotary_chain_of_a_training_graph(rope_graph):
    g = rope_graph
    (key, ch), = V.chains(g).items()
    kinds = [g.ops[i].kind for i in ch.ops]
    assert ch.fusion.name == "rotary" and kinds[0] == "mul" and kinds[6] == "add"
    assert sorted(kinds[:7]) == sorted(["mul", "narrow", "narrow", "neg", "cat", "mul", "add"])
    assert sorted(kinds[7:]) == sorted(["add.grad_input", "mul.grad_input", "cat.grad_input", "neg.grad_input",
                                        "narrow.grad_input", "narrow.grad_input", "mul.grad_input",
                                        "grad_accumulate", "grad_accumulate"])
    add, last = ch.ops[6], ch.ops[-1]
    assert ch.calls == (add, last) and ch.at == (add,) * 7 + (last,) * 9
    q, cos = g.ops[key].inputs
    assert g.tensors[g.ops[last].outputs[0]].grad_of == q
    dy = next(g.ops[i] for i in ch.ops if g.ops[i].kind == "add.grad_input").inputs[0]
    assert set(ch.nonmat) == {t for i in ch.ops[:6] for t in g.ops[i].outputs} | {
        t for i in ch.ops[7:-1] if g.ops[i].kind != "add.grad_input" for t in g.ops[i].outputs}
    sin = next(t for t in g.ops[ch.ops[5]].inputs if t not in g.ops[ch.ops[4]].outputs)
    fwd, = registry.op_calls(g, g.ops[add], "fused", "c")
    assert (fwd.kernel, fwd.outputs, fwd.inputs, fwd.covers) == ("rotary", g.ops[add].outputs, (q, cos, sin),
                                                                 ch.ops[:6])
    bwd, = registry.op_calls(g, g.ops[last], "fused", "c")
    assert (bwd.kernel, bwd.outputs, bwd.inputs) == ("rotary.grad_input", g.ops[last].outputs, (dy, cos, sin))
    for i in ch.ops:
        assert "fused" in V.variants(g, g.ops[i], "c") and "fused" not in V.variants(g, g.ops[i], "torch-cpu")
        assert V.runs_fused_call(g, g.ops[i]) == (i in (add, last))
        if i not in (add, last):
            assert registry.op_calls(g, g.ops[i], "fused", "c") == ()
    assert ch.inplace == ((add, g.ops[add].outputs[0], q),) and V.fused_inplace(g) == {add: (q, g.ops[add].outputs[0])}
    assert V.fused_reads(g)[add] == (q,)           # (the tables are buffers); dy and its two views, one storage
    assert {g.storage_root(t) for t in V.fused_reads(g)[last]} == {dy}


def test_rotary_refused_where_the_kernels_do_not_compute_the_chain():
    assert V.chains(_graph(extra=True)) == {}
    assert V.chains(_graph(train_tables=True)) == {}


def test_rotary_forward_only_chain():
    """q takes no gradient (its projection frozen): the seven forward ops are the chain, the add its one call."""
    m, x, y = _Rope(), torch.randn(6, SEQ, 3), torch.tensor([0, 1, 2, 1, 0, 2])
    g = trace(m, x, optimizer="sgd", trainable=["head"], name="tiny_rope")
    (key, ch), = V.chains(g).items()
    assert len(ch.ops) == 7 and ch.calls == (ch.ops[6],) and g.ops[ch.ops[6]].kind == "add"
    got = {}
    for fuse in (True, False):
        tr = port.Trainer(copy.deepcopy(m), x, plan=default_plan(g, fuse=fuse), optimizer=SGD(0.1),
                          trainable=["head"])
        got[fuse] = [float(tr.step(x, y)) for _ in range(2)], tr.predict(x), tr
    assert got[True][0] == got[False][0] and torch.equal(got[True][1], got[False][1])
    assert "rotary" in [c.kernel for c in got[True][2].program.calls]


def test_ilp_picks_rotary_exactly_when_the_profile_says_it_pays(rope_graph):
    assert_ilp_picks_fused_exactly_when_it_pays(rope_graph)


def test_ilp_equals_brute_force_with_rotary(rope_graph):
    """Fused or not, recompute, paging: the ILP's optimum is the simulator's over every plan (the chain's
    intermediates never materialised when fused, the calls' reads of q, the tables and dy)."""
    g = rope_graph
    ch, = V.chains(g).values()
    prof = two_acc_profile(g, free_ops=list(ch.ops), storage=True, seed=3, free_accs=("cpu-c",))
    fast = _priced(prof, g, 1e-4)
    p = assert_ilp_equals_brute_force(g, fast, int(naive_peak(g, fast) * 0.8))
    assert p is not None and all(p.ops[i].variant == "fused" for i in ch.ops)


@pytest.mark.parametrize("engine", ["python", "rt"])
def test_fused_rotary_trains_to_the_plain_plans_bits(rope_graph, engine):
    m, x, y = _Rope(), torch.randn(6, SEQ, 3), torch.tensor([0, 1, 2, 1, 0, 2])
    g = port.trace(copy.deepcopy(m), x, optimizer="sgd")
    got = {}
    for fuse in (True, False):
        tr = port.Trainer(copy.deepcopy(m), x, plan=default_plan(g, fuse=fuse), optimizer=SGD(0.1), engine=engine)
        got[fuse] = [float(tr.step(x, y)) for _ in range(3)], tr.state_dict(), tr
    assert got[True][0] == got[False][0]
    assert all(torch.equal(got[True][1][n], got[False][1][n]) for n in got[True][1])
    kernels = [c.kernel for c in got[True][2].program.calls]
    assert kernels.count("rotary") == kernels.count("rotary.grad_input") == 1
    assert "rotary" not in [c.kernel for c in got[False][2].program.calls]
    # the fused plan's arena holds none of the chain's intermediates (no larger than the plain one's), and the
    # forward call writes y over q: one slot
    prog = got[True][2].program
    assert prog.arena_bytes <= got[False][2].program.arena_bytes
    ch, = V.chains(g).values()
    (y, q), = [(yy, xx) for _c, yy, xx in ch.inplace]
    slot = {s_.tensor: s_ for s_ in prog.slots}
    assert slot[y].offset == slot[q].offset and slot[y].root == slot[q].root
