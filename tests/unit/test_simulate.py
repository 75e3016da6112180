"""port.verify.simulate on hand-checkable cases."""
from __future__ import annotations

import pytest
import torch

from port.config import load_device
from port.cost.roofline import modeled_profile
from port.errors import PlanError
from port.ir.trace import trace
from port.verify.simulate import simulate
from port.lower.program import align
from port.plan.semantics import static_bytes
from port.plan.types import OpDecision, Plan


class Chain(torch.nn.Module):
    """linear -> relu -> linear: a 3-op forward chain."""
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.r = torch.nn.ReLU()
        self.b = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.b(self.r(self.a(x)))


@pytest.fixture(scope="module")
def chain():
    g = trace(Chain(), torch.randn(5, 4), optimizer="sgd", name="chain")
    return g, modeled_profile(g, load_device("host"))


def plain(g, acc="cpu-c"):
    return tuple(OpDecision(o.id, acc, "plain") for o in g.ops)


def test_chain_memory_timeline_by_hand(chain):
    g, p = chain
    plan = Plan(g.digest(), p.digest(), 10**9, plain(g))
    s = simulate(plan, g, p)
    S = static_bytes(g)
    # every root counts its bytes rounded up to 64 (the arena's alignment: port.plan.semantics, stored bytes).
    # static: input 5x4 f32 (80 -> 128), labels 5 int64 (40 -> 64), params 8x4 (128), 8 (32 -> 64), 2x8 (64),
    # 2 (8 -> 64) and their grads (sgd: no state), plus the loss-gradient scale's 64-byte slot
    assert S == 128 + 64 + 2 * (128 + 64 + 64 + 64) + 64 == 896
    h1, h2, out, loss = 192, 192, 64, 64     # 5x8 f32 (160 -> 192) twice, the logits 5x2 (40 -> 64), the loss
    names = [o.name for o in g.ops]
    t = dict(zip(names, s.timeline))
    # step a: h1 born; step r: h1 (read) + h2; step b: h2 (saved by b and by r's backward) + logits
    assert t[names[0]] == S + h1
    assert t[names[1]] == S + h1 + h2          # h1 freed after r (nobody saves it)
    assert t[names[2]] == S + h2 + out
    # the loss is live from its op to the end of the step (the program keeps it readable): the last op holds it
    ce = next(o for o in g.ops if o.kind == "cross_entropy")
    assert t[ce.name] - t[names[2]] == loss + 64    # h2 and the logits still live; the loss and probs (5x2) born
    assert s.timeline[-1] == S + loss           # the last update: static memory and the loss only
    assert s.peak_bytes == max(s.timeline)
    assert len(s.timeline) == len(g.ops)
    assert s.step_ms == pytest.approx(sum(p.lookup(g.signature(o), "cpu-c", "plain").latency_ms for o in g.ops))


def test_inplace_relu_saves_its_output_bytes(chain):
    g, p = chain
    relu = next(o for o in g.ops if o.kind == "relu")
    ops = list(plain(g))
    ops[relu.id] = OpDecision(relu.id, "cpu-c", "inplace")
    s0 = simulate(Plan("", "", 0, plain(g)), g, p)
    s1 = simulate(Plan("", "", 0, tuple(ops)), g, p)
    assert s0.timeline[relu.id] - s1.timeline[relu.id] == align(5 * 8 * 4)


def test_recompute_inserts_op_and_frees(chain):
    g, p = chain
    relu = next(o for o in g.ops if o.kind == "relu")
    lin_a = g.ops[0]
    # recompute relu alone: its input h1 (read by nobody in backward) stays live until the re-run instead
    only = simulate(Plan("", "", 0, plain(g), recompute=(relu.outputs[0],)), g, p)
    assert [k for k, _ in only.steps].count("recompute") == 1
    loss0 = next(o for o in g.ops if o.kind == "cross_entropy")
    assert only.timeline[only.steps.index(("op", loss0.id))] == \
        simulate(Plan("", "", 0, plain(g)), g, p).timeline[loss0.id]      # h1 (kept) replaces h2: same bytes
    s = simulate(Plan("", "", 0, plain(g), recompute=(relu.outputs[0], lin_a.outputs[0])), g, p)
    assert [k for k, _ in s.steps].count("recompute") == 2
    base = simulate(Plan("", "", 0, plain(g)), g, p)
    assert s.step_ms > base.step_ms
    # h2 is not live across the loss step any more
    loss = next(o for o in g.ops if o.kind == "cross_entropy")
    i = s.steps.index(("op", loss.id))
    assert s.timeline[i] == base.timeline[loss.id] - align(5 * 8 * 4)


def test_paging_requires_storage(chain):
    g, p = chain
    relu = next(o for o in g.ops if o.kind == "relu")
    with pytest.raises(PlanError):
        simulate(Plan("", "", 0, plain(g), paged=(relu.outputs[0],)), g, p)


def test_rejects_bad_variants(chain):
    g, p = chain
    ops = list(plain(g))
    ops[0] = OpDecision(0, "cpu-c", "inplace")
    with pytest.raises(PlanError):
        simulate(Plan("", "", 0, tuple(ops)), g, p)
    with pytest.raises(PlanError):
        simulate(Plan("", "", 0, plain(g)[:-1]), g, p)


def test_recompute_at_chain_and_refusals(chain):
    g, p = chain
    lin_a, relu = g.ops[0], next(o for o in g.ops if o.kind == "relu")
    rec = tuple(sorted((relu.outputs[0], lin_a.outputs[0])))
    bw_relu = next(o.id for o in g.ops if o.name == relu.name + ".grad_input")
    first_bwd = min(o.id for o in g.ops if o.phase == "backward" and relu.outputs[0] in o.inputs)
    ok = Plan("", "", 0, plain(g), recompute=rec, recompute_at=((lin_a.id, first_bwd), (relu.id, first_bwd)))
    s = simulate(ok, g, p)
    assert [k for k, _ in s.steps].count("recompute") == 2
    # legacy rule gives the same replay here
    assert s.timeline == simulate(Plan("", "", 0, plain(g), recompute=rec), g, p).timeline
    bad = [
        ((relu.id, first_bwd), (lin_a.id, first_bwd)),            # unsorted
        ((relu.id, first_bwd),),                                  # lin_a missing: relu's input not live
        ((lin_a.id, first_bwd), (relu.id, bw_relu + 1)),          # re-run after every reader of its outputs: useless
        ((lin_a.id, 1), (relu.id, first_bwd)),                    # not a backward step
        ((lin_a.id, first_bwd), (lin_a.id, first_bwd), (relu.id, first_bwd)),
    ]
    for at in bad:
        with pytest.raises(PlanError):
            simulate(Plan("", "", 0, plain(g), recompute=rec, recompute_at=at), g, p)
    # relu alone re-run: its input h1 is kept (lives to the re-run, which reads it) instead of its output
    s1 = simulate(Plan("", "", 0, plain(g), recompute=(relu.outputs[0],), recompute_at=((relu.id, first_bwd),)), g, p)
    assert s1.steps.count(("recompute", relu.id)) == 1


def test_early_updates_reduce_peak_and_static(chain):
    g, p = chain
    ups = tuple(o.id for o in g.ops if o.phase == "update")
    base = simulate(Plan("", "", 0, plain(g)), g, p)
    s = simulate(Plan("", "", 0, plain(g), early_updates=ups), g, p)
    grads = sum(align(t.bytes) for t in g.tensors if t.role == "gradient" and t.alias_of is None
                and g.tensors[t.grad_of].role == "parameter")
    assert grads == 128 + 64 + 64 + 64            # stored bytes: each gradient rounded up to 64
    assert s.static_bytes == base.static_bytes - grads
    assert s.peak_bytes < base.peak_bytes
    assert s.step_ms == pytest.approx(base.step_ms)
    # each update runs right after its gradient's producer
    order = [oid for k, oid in s.steps]
    for u in ups:
        gr = g.storage_root(g.ops[u].inputs[1])
        assert order.index(u) == order.index(g.producers()[gr]) + 1 or g.ops[order[order.index(u) - 1]].phase == "update"
    with pytest.raises(PlanError):
        simulate(Plan("", "", 0, plain(g), early_updates=(0,)), g, p)       # not an update op


def test_multi_level_recompute_copies(chain):
    """An op may be re-run more than once (a recomputed segment re-run again later instead of kept): each
    re-run makes a new copy that lives to its last use before the next re-run, and re-runs read copies made by
    other re-runs (nested recompute)."""
    from port.lower.lower import lower
    from port.plan.semantics import schedule
    g, p = chain
    a, r, gw_b, gi_r = 0, 1, 6, 7
    rec = tuple(sorted((g.ops[a].outputs[0], g.ops[r].outputs[0])))
    plan = Plan("", "", 0, plain(g), recompute=rec, recompute_at=((a, gw_b), (r, gw_b), (r, gi_r)))
    s = simulate(plan, g, p)
    assert s.steps.count(("recompute", r)) == 2 and s.steps.count(("recompute", a)) == 1
    sch = schedule(g, plan)
    assert sch.recompute_at == {a: (gw_b,), r: (gw_b, gi_r)}
    ev = [(e.kind, e.op, e.roots) for e in sch.events]
    h1, h2 = g.ops[a].outputs[0], g.ops[r].outputs[0]
    i_op6 = ev.index(("op", gw_b, ()))
    # after op 6 the first re-run copy of h2 is freed; h1 (re-run copy) stays for the second re-run of r
    assert any(k == "free" and h2 in rs and h1 not in rs for k, _o, rs in ev[i_op6 + 1:i_op6 + 2])
    i_rr = ev.index(("recompute", r, ()), i_op6)
    assert ev[i_rr + 1][0] == "free" and ev[i_rr + 1][2] == (h1,)     # h1's last reader was that re-run
    base = simulate(Plan("", "", 0, plain(g), recompute=rec, recompute_at=((a, gw_b), (r, gw_b))), g, p)
    assert s.step_ms > base.step_ms                                      # one more re-run costs its time
    prog = lower(g, plan)                                                # lowering gives each copy its slot
    assert sum(1 for c in prog.calls if c.phase == "recompute") == 3
    # a (op, step) pair twice, and a re-run nobody reads before the next one, are refused
    for at in (((a, gw_b), (r, gw_b), (r, gw_b)), ((a, gw_b), (r, gw_b), (r, gi_r), (r, gi_r + 1))):
        with pytest.raises(PlanError):
            simulate(Plan("", "", 0, plain(g), recompute=rec, recompute_at=at), g, p)


def test_rerun_in_place_takes_over_its_input_copy(chain):
    """Plan.inplace_reruns: relu re-run right after linear a, in the same group, writes its output over a's
    re-made output h1 (read by relu alone): the group holds one copy instead of two, lowering gives both the
    same bytes and runs relu's inplace call; the re-runs that cannot do so are refused."""
    from dataclasses import replace
    from port.lower.lower import lower
    from port.plan import variants as V
    from port.plan.semantics import schedule, with_inplace_reruns
    g, p = chain
    lin_a, relu = g.ops[0], next(o for o in g.ops if o.kind == "relu")
    assert V.rerun_inplace_inputs(g) == {relu.id: lin_a.outputs[0]}
    first_bwd = min(o.id for o in g.ops if o.phase == "backward" and relu.outputs[0] in o.inputs)
    rec = tuple(sorted((relu.outputs[0], lin_a.outputs[0])))
    out = Plan("", "", 0, plain(g), recompute=rec, recompute_at=((lin_a.id, first_bwd), (relu.id, first_bwd)))
    assert schedule(g, out).inplace_ok == {(relu.id, first_bwd)}
    inp = with_inplace_reruns(g, out)
    assert inp.inplace_reruns == ((relu.id, first_bwd),)
    s0, s1 = simulate(out, g, p), simulate(inp, g, p)
    k = s0.steps.index(("recompute", relu.id))
    assert s0.timeline[k] - s1.timeline[k] == align(5 * 8 * 4)           # h2's copy needs no bytes of its own
    assert s1.step_ms == s0.step_ms
    prog = lower(g, inp)
    c = next(c for c in prog.calls if c.phase == "recompute" and c.op == relu.id)
    slot = {s.tensor: s for s in prog.slots}
    assert c.variant == "inplace" and slot[c.outputs[0]].offset == slot[c.inputs[0]].offset
    assert lower(g, out).live_timeline[c.index] - prog.live_timeline[c.index] == align(5 * 8 * 4)
    # refused: h1 not re-made in the group (kept instead), linear is no relu/add, a step without that re-run
    only = Plan("", "", 0, plain(g), recompute=(relu.outputs[0],), recompute_at=((relu.id, first_bwd),))
    for bad in (replace(only, inplace_reruns=((relu.id, first_bwd),)),
                replace(out, inplace_reruns=((lin_a.id, first_bwd),)),
                replace(out, inplace_reruns=((relu.id, first_bwd + 1),))):
        with pytest.raises(PlanError, match="cannot run in place"):
            simulate(bad, g, p)


def test_input_gradient_in_place_writes_dx_over_dy(chain):
    """The element-wise input gradients' ``inplace`` variant: relu.grad_input writes dx over dy (read by no
    later op); one buffer instead of two at that step, and the same bytes in the lowered program."""
    from port.lower.lower import lower
    from port.plan import variants as V
    g, p = chain
    gi = next(o for o in g.ops if o.kind == "relu.grad_input")
    assert V.variants(g, gi, "c") == ("plain", "inplace") and V.variants(g, gi, "torch-cpu") == ("plain", "inplace")
    ops = list(plain(g))
    ops[gi.id] = OpDecision(gi.id, "cpu-c", "inplace")
    s0, s1 = simulate(Plan("", "", 0, plain(g)), g, p), simulate(Plan("", "", 0, tuple(ops)), g, p)
    assert s0.timeline[gi.id] - s1.timeline[gi.id] == align(5 * 8 * 4)
    prog = lower(g, Plan("", "", 0, tuple(ops)))
    c = next(c for c in prog.calls if c.op == gi.id)
    slot = {s.tensor: s for s in prog.slots}
    assert slot[c.outputs[0]].offset == slot[c.inputs[0]].offset
    # dy read again later (a second reader) makes it illegal
    lin_b_gi = next(o for o in g.ops if o.kind == "linear.grad_input")
    assert not V.inplace_legal(g, lin_b_gi)
