"""Fused variants declared once (port.plan.variants.FUSIONS, issue 54): conv -> bn -> relu, SwiGLU (silu(a) * b) and
squeeze-excitation are entries of one table read by variants(), fused_into(), the ILP, the simulator and lowering. SwiGLU: the chain
found where the C kernels compute it and refused elsewhere, its profile entries, the ILP choosing it exactly where
the profile says it pays (brute force over every plan), and its calls."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn

from port import ops
from port.config import load_device
from port.cost.roofline import modeled_profile
from port.exec import registry
from port.ir.trace import trace
from port.plan import semantics as SEM
from port.plan import variants as V
from port.solver import solve
from port.verify.simulate import simulate
from test_solve import assert_ilp_equals_brute_force, naive_peak, two_acc_profile   # tests/unit is on sys.path


class _SwiGLU(nn.Module):
    """Llama's MLP, tiny: down(silu(gate(x)) * up(x)); ``extra``: the silu output also read elsewhere."""
    def __init__(self, extra: bool = False, swap: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.gate, self.up = nn.Linear(4, 6, bias=False), nn.Linear(4, 6, bias=False)
        self.down = nn.Linear(6, 3)
        self.extra, self.swap = extra, swap

    def forward(self, x):
        s = nn.functional.silu(self.gate(x))
        h = self.up(x) * s if self.swap else s * self.up(x)
        return self.down(h + s if self.extra else h)


def _graph(trainable=None, **kw):
    return trace(_SwiGLU(**kw), torch.randn(2, 4), optimizer="sgd", trainable=trainable, name="tiny_swiglu")


@pytest.fixture(scope="module")
def swiglu_graph():
    return _graph()


def test_the_table_names_each_fusion_once_with_kernels_the_c_library_runs():
    assert [f.name for f in V.FUSIONS] == ["conv_bn_relu", "swiglu", "rotary", "se", "rmsnorm_linear"]
    assert V.FUSED_KERNELS == ("conv2d_bn_relu", "swiglu", "swiglu.grad_input", "rotary", "rotary.grad_input", "se",
                               "se.grad_weight", "se.grad_input", "rmsnorm_linears", "rmsnorm_linears.grad_weight")
    for k in V.FUSED_KERNELS:
        assert ops.owner(k) is not None and ops.owner(k).c_entries(k), k
        assert registry.known_variant(k, "fused", "c") and not registry.known_variant(k, "plain", "c")


@pytest.mark.parametrize("swap", [False, True])
def test_swiglu_chain_of_a_training_graph(swap):
    """silu -> mul forward, mul.grad_input -> silu.grad_input backward: the mul runs the forward call (covering the
    silu), the mul's gradient the backward one (covering the silu's); s and ds are never materialised; the calls
    read a (the silu's input) beyond their own inputs, so a lives to them fused or not."""
    g = _graph(swap=swap)
    kinds = [o.kind for o in g.ops]
    silu, mul, mg, sg = (kinds.index(k) for k in ("silu", "mul", "mul.grad_input", "silu.grad_input"))
    (key, ch), = V.chains(g).items()
    assert key == silu and ch.fusion.name == "swiglu" and ch.ops == (silu, mul, mg, sg)
    assert ch.at == (mul, mul, mg, mg) and ch.calls == (mul, mg)
    s, ds = g.ops[silu].outputs[0], g.ops[sg].inputs[0]
    assert ch.nonmat == (s, ds)
    a = g.ops[silu].inputs[0]
    assert V.fused_reads(g) == {mul: (a,), mg: (a,)}
    r = SEM.activation_roots(g)[a]                 # a pages out after the mul, is back by the mul's gradient
    assert (r.fwd_last, r.bwd_first) == (mul, mg)
    for i in ch.ops:
        assert "fused" in V.variants(g, g.ops[i], "c") and "fused" not in V.variants(g, g.ops[i], "torch-cpu")
        assert V.chain_of(g, g.ops[i]) is ch
        assert V.fused_into(g, g.ops[i]) == (None if i == silu else silu)
        assert V.runs_fused_call(g, g.ops[i]) == (i in (mul, mg))
    b = g.ops[mul].inputs[0 if swap else 1]
    fwd, = registry.op_calls(g, g.ops[mul], "fused", "c")
    assert (fwd.kernel, fwd.outputs, fwd.inputs, fwd.covers) == ("swiglu", g.ops[mul].outputs, (a, b), (silu,))
    bwd, = registry.op_calls(g, g.ops[mg], "fused", "c")
    db = g.ops[mg].outputs[0 if swap else 1]
    assert (bwd.kernel, bwd.outputs, bwd.inputs) == ("swiglu.grad_input", (g.ops[sg].outputs[0], db),
                                                     (g.ops[mg].inputs[0], a, b))
    assert registry.op_calls(g, g.ops[silu], "fused", "c") == registry.op_calls(g, g.ops[sg], "fused", "c") == ()


def test_swiglu_refused_where_the_kernels_do_not_compute_the_chain():
    """The silu output read by another op, or the up projection frozen (mul's gradient op computes ds only): no
    chain, no ``fused`` variant."""
    assert V.chains(_graph(extra=True)) == {}
    frozen = _graph(trainable=["gate", "down"])
    assert not any(o.kind == "mul.grad_input" and o.attr("grads") == (0, 1) for o in frozen.ops)
    assert V.chains(frozen) == {}
    assert not any("fused" in V.variants(frozen, o, "c") for o in frozen.ops)


def test_conv_bn_relu_is_the_tables_other_entry():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.c, self.b, self.fc = nn.Conv2d(1, 2, 3, padding=1, bias=False), nn.BatchNorm2d(2), nn.Linear(72, 3)

        def forward(self, x):
            return self.fc(torch.flatten(torch.relu(self.b(self.c(x))), 1))
    g = trace(Net(), torch.randn(2, 1, 6, 6), optimizer="sgd")
    (key, ch), = V.chains(g).items()
    assert ch.fusion.name == "conv_bn_relu" and g.ops[key].kind == "conv2d" and ch.at == (key,) * 3
    assert V.fusion_chain(g, g.ops[key]) == ch.ops and ch.nonmat == (g.ops[ch.ops[1]].outputs[0],)
    assert V.fused_reads(g) == {}
    call, = registry.op_calls(g, g.ops[key], "fused", "c")
    assert call.kernel == "conv2d_bn_relu" and call.covers == ch.ops[1:]


def test_swiglu_profile_entries_exist(swiglu_graph):
    g = swiglu_graph
    prof = modeled_profile(g, load_device("host"))
    ch, = V.chains(g).values()
    for i in ch.ops:
        assert prof.lookup(g.signature(g.ops[i]), "cpu-c", "fused") is not None, g.ops[i].kind
    # each member books its share of the call (V.fused_share, by FLOPs): the covered silu and the mul together
    ms = [prof.lookup(g.signature(g.ops[i]), "cpu-c", "fused").latency_ms for i in ch.ops[:2]]
    shares = [V.fused_share(g, g.ops[i]) for i in ch.ops[:2]]
    assert min(ms) > 0.0 and sum(shares) == pytest.approx(1.0) and ms[0] / ms[1] == pytest.approx(shares[0] / shares[1])


def _priced(prof, g, fused_ms: float):
    """``prof`` with each SwiGLU call op's fused entry at ``fused_ms`` (the covered members at 0)."""
    ch, = V.chains(g).values()
    sig = {g.signature(g.ops[i]): i for i in ch.ops}
    ents = tuple(dataclasses.replace(e, latency_ms=(fused_ms if sig[e.signature] in ch.calls else 0.0))
                 if e.variant == "fused" and e.signature in sig else e for e in prof.entries)
    return dataclasses.replace(prof, entries=ents, _index={})


def assert_ilp_picks_fused_exactly_when_it_pays(g, priced=None):
    """The graph's one chain, its calls priced at a quarter of its plain members' time and at four times it
    (``priced``: _priced): the ILP runs the chain fused in the first profile only (every member alike) and the
    simulator accepts both plans."""
    priced = priced or _priced
    ch, = V.chains(g).values()
    prof = modeled_profile(g, load_device("host"))
    plain = sum(prof.lookup(g.signature(g.ops[i]), "cpu-c", "plain").latency_ms for i in ch.ops) / len(ch.calls)
    for fused_ms, want in ((plain * 0.25, "fused"), (plain * 4.0, "plain")):
        p = solve(g, priced(prof, g, fused_ms), None, gap=0.0, time_limit_s=30)
        got = {p.ops[i].variant for i in ch.ops}
        assert got == {want} or (want == "plain" and "fused" not in got), (fused_ms, got)
        simulate(p, g, priced(prof, g, fused_ms))


def test_ilp_picks_swiglu_exactly_when_the_profile_says_it_pays(swiglu_graph):
    assert_ilp_picks_fused_exactly_when_it_pays(swiglu_graph)


@pytest.mark.parametrize("frac", [1.0, 0.75])
def test_ilp_equals_brute_force_with_swiglu(swiglu_graph, frac):
    """Fused or not, in-place silu gradient, recompute, paging: the ILP's optimum is the simulator's over every
    plan (the chain's births at its call ops, its never-materialised s and ds, the calls' reads of a)."""
    g = swiglu_graph
    ch, = V.chains(g).values()
    prof = two_acc_profile(g, free_ops=list(ch.ops), storage=True, seed=3, free_accs=("cpu-c",))
    assert {e.variant for o in g.ops for e in prof.options(g.signature(o))} >= {"fused", "inplace"}
    fast = _priced(prof, g, 1e-4)
    p = assert_ilp_equals_brute_force(g, fast, int(naive_peak(g, fast) * frac))
    assert p is not None and all(p.ops[i].variant == "fused" for i in ch.ops)


# ---- squeeze-excitation: pool -> fc1 -> act -> fc2 -> gate -> mul with x (h54-se) ---------------------------------
class _SE(nn.Module):
    """torchvision's SqueezeExcitation on a conv's output; ``residual``: x also read by an add (its gradient then
    accumulates a third term), ``extra``: the gate also read elsewhere."""
    def __init__(self, act=nn.ReLU, gate=nn.Hardsigmoid, residual=False, extra=False, c=5, s=3, hw=3):
        super().__init__()
        torch.manual_seed(0)
        self.c = nn.Conv2d(2, c, 1)
        self.fc1, self.fc2, self.act, self.gate = nn.Conv2d(c, s, 1), nn.Conv2d(s, c, 1), act(), gate()
        self.fc = nn.Linear(c * hw * hw, 3)
        self.residual, self.extra = residual, extra

    def forward(self, x):
        x = self.c(x)
        g = self.gate(self.fc2(self.act(self.fc1(nn.functional.adaptive_avg_pool2d(x, 1)))))
        y = g * x
        y = y + x if self.residual else y
        y = y + g if self.extra else y
        return self.fc(torch.flatten(y, 1))


def _se_graph(trainable=None, hw=3, **kw):
    return trace(_SE(hw=hw, **kw), torch.randn(2, 2, hw, hw), optimizer="sgd", trainable=trainable, name="tiny_se")


SE_PAIRS = [(nn.ReLU, nn.Hardsigmoid), (nn.SiLU, nn.Sigmoid), (nn.ReLU, nn.Sigmoid)]


@pytest.mark.parametrize("act,gate", SE_PAIRS)
def test_se_chain_of_a_training_graph(act, gate):
    """The forward six and their nine gradient ops (the grad_accumulate of the mul's and the pool's dx among them):
    the mul runs se (covering the forward five), the mul's gradient op se.grad_weight then se.grad_input (covering
    the rest); never stored: the pooled mean, act(h), the gate and every gradient inside the chain but dh."""
    g = _se_graph(act=act, gate=gate)
    (key, ch), = V.chains(g).items()
    kinds = [g.ops[i].kind for i in ch.ops]
    a, gk = act.__name__.lower(), gate.__name__.lower()
    assert ch.fusion.name == "se" and g.ops[key].kind == "global_avg_pool2d" and len(ch.ops) == 15
    assert kinds[:6] == ["global_avg_pool2d", "conv2d", a, "conv2d", gk, "mul"]
    assert sorted(kinds[6:]) == sorted(["mul.grad_input", f"{gk}.grad_input", "conv2d.grad_input", "conv2d.grad_weight",
                                        f"{a}.grad_input", "conv2d.grad_input", "conv2d.grad_weight",
                                        "global_avg_pool2d.grad_input", "grad_accumulate"])
    mul, mg = ch.ops[5], ch.ops[6]
    assert kinds[6] == "mul.grad_input" and ch.calls == (mul, mg) and ch.at == (mul,) * 6 + (mg,) * 9
    O = g.ops
    pool, fc1, actop, fc2, gate_op = (O[i] for i in ch.ops[:5])
    acc = next(O[i] for i in ch.ops if O[i].kind == "grad_accumulate")
    dh = next(O[i] for i in ch.ops if O[i].kind == f"{a}.grad_input").outputs[0]
    inner = {t for i in ch.ops[6:] for t in O[i].outputs
             if O[i].kind not in ("conv2d.grad_weight", "grad_accumulate")} - {dh}
    assert set(ch.nonmat) == {pool.outputs[0], actop.outputs[0], gate_op.outputs[0]} | inner and len(inner) == 6
    x, h, z = pool.inputs[0], fc1.outputs[0], fc2.outputs[0]
    fwd, = registry.op_calls(g, O[mul], "fused", "c")
    assert (fwd.kernel, fwd.outputs, fwd.inputs) == ("se", (O[mul].outputs[0], h, z),
                                                     (x, fc1.inputs[1], fc1.inputs[2], fc2.inputs[1], fc2.inputs[2]))
    assert fwd.attr_dict() == {"act": a, "gate": gk} and fwd.covers == ch.ops[:5]
    bw, bi = registry.op_calls(g, O[mg], "fused", "c")
    dy = O[mg].inputs[0]
    assert (bw.kernel, bw.inputs, bw.outputs[-1]) == ("se.grad_weight", (dy, x, fc2.inputs[1], h, z), dh)
    assert (bi.kernel, bi.outputs, bi.inputs) == ("se.grad_input", acc.outputs, (dy, z, fc1.inputs[1], dh))
    assert all(registry.op_calls(g, O[i], "fused", "c") == () for i in ch.ops if i not in (mul, mg))
    assert set(V.fused_reads(g)[mg]) >= {h, z, dh}             # h and z live to the backward call fused or not
    r = SEM.activation_roots(g)
    assert r[h].bwd_first == mg and r[z].bwd_first == mg
    for i in ch.ops:
        assert "fused" in V.variants(g, O[i], "c") and "fused" not in V.variants(g, O[i], "torch-cpu")
    from port.lower.lower import default_plan
    assert not any(d.variant == "fused" for d in default_plan(g).ops)     # not a default: the ILP picks it


def test_se_refused_where_the_kernels_do_not_compute_the_chain():
    """x also read by a residual add (its gradient sums three terms), the gate read elsewhere, the SE frozen (no
    weight gradients to compute): no chain, no ``fused`` variant."""
    assert V.chains(_se_graph(residual=True)) == {}
    assert V.chains(_se_graph(extra=True)) == {}
    frozen = _se_graph(trainable=["c", "fc"])
    assert V.chains(frozen) == {} and not any("fused" in V.variants(frozen, o, "c") for o in frozen.ops)


@pytest.fixture(scope="module")
def se_graph():
    return _se_graph()


def test_se_profile_entries_exist(se_graph):
    g = se_graph
    prof = modeled_profile(g, load_device("host"))
    ch, = V.chains(g).values()
    for i in ch.ops:
        e = prof.lookup(g.signature(g.ops[i]), "cpu-c", "fused")
        assert e is not None, g.ops[i].kind
        assert e.latency_ms > 0.0 and 0.0 < V.fused_share(g, g.ops[i]) <= 1.0, g.ops[i].kind   # its share
    for c in ch.calls:
        assert sum(V.fused_share(g, g.ops[m]) for m in ch.ops if ch.call_of(m) == c) == pytest.approx(1.0)


def test_ilp_picks_se_exactly_when_the_profile_says_it_pays(se_graph):
    assert_ilp_picks_fused_exactly_when_it_pays(se_graph, _priced_chain)


def _priced_chain(prof, g, fused_ms: float, keep=None):
    """``prof`` with the one chain's call ops' fused entries at ``fused_ms`` (the covered members at 0); ``keep``:
    a filter of the entries kept."""
    ch, = V.chains(g).values()
    sig = {g.signature(g.ops[i]): i for i in ch.ops}
    ents = tuple(dataclasses.replace(e, latency_ms=(fused_ms if sig[e.signature] in ch.calls else 0.0))
                 if e.variant == "fused" and e.signature in sig else e for e in prof.entries
                 if keep is None or keep(e))
    return dataclasses.replace(prof, entries=ents, _index={})


@pytest.mark.parametrize("frac", [1.0, 0.8])
def test_ilp_equals_brute_force_with_se(se_graph, frac):
    """Fused or not, recompute and paging: the ILP's optimum is the simulator's over every plan (the chain's
    births at its two call ops, its never-stored pooled mean, act(h), gate and inner gradients, its calls' reads
    of h and z in the backward)."""
    g = se_graph
    ch, = V.chains(g).values()
    sigs = {g.signature(g.ops[i]) for i in ch.ops}
    prof = two_acc_profile(g, free_ops=list(ch.ops), storage=True, seed=5, free_accs=("cpu-c",))
    prof = _priced_chain(prof, g, 1e-4, keep=lambda e: e.signature not in sigs or e.variant in ("plain", "fused"))
    assert {e.variant for i in ch.ops for e in prof.options(g.signature(g.ops[i]))} == {"plain", "fused"}
    p = assert_ilp_equals_brute_force(g, prof, int(naive_peak(g, prof) * frac))
    assert p is not None and all(p.ops[i].variant == "fused" for i in ch.ops)
