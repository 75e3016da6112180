"""Python API misuse (issue 53): every wrong argument gets a PortError (port.errors.ArgumentError or a subclass)
whose message names the argument and the values allowed, raised before any work: before tracing where the
argument needs no graph, before lowering and the arena where it does (token ids, sequence lengths), and before
the step touches the arena for a batch (no call runs, no counter moves, no weight changes)."""
from __future__ import annotations

import copy
import math

import pytest
import torch

import port
from port import models as M
from port.errors import ArgumentError, LabelError, PortError, TokenError
from port.train.optim import SGD, AdamW, from_dict
from port.train.trainer import Trainer
from port.transformers import LoRALinear, bert_tiny, gpt_tiny, lora

NAN, INF = float("nan"), float("inf")


def _gpt(context=16):
    return gpt_tiny(layers=1, dim=32, heads=2, context=context)


def _ids(*shape, hi=256):
    return torch.randint(0, hi, shape, generator=torch.Generator().manual_seed(0))


@pytest.fixture
def no_trace(monkeypatch):
    """Tracing fails the test: what is checked must be refused before it."""
    import port.ir.trace as T

    def boom(*a, **k):
        raise AssertionError("traced before the argument was checked")
    monkeypatch.setattr(T, "trace_many", boom)
    monkeypatch.setattr(T, "_in_child", boom)


@pytest.fixture
def no_lower(monkeypatch):
    """Lowering (the program, the arena) fails the test: checks that need the graph come before it."""
    import port.train.trainer as TR

    def boom(*a, **k):
        raise AssertionError("lowered before the argument was checked")
    monkeypatch.setattr(TR, "lower", boom)


class Watch:
    """A trainer's step machinery, watched: any kernel call, counter move or weight change is a failure."""

    def __init__(self, tr: Trainer):
        self.tr, self.calls = tr, 0
        self.weights = {k: v.clone() for k, v in tr.state_dict().items()}
        self.counters = (tr.state.step, tr.state.dropout_counter, tr._bn_batches)
        for obj, name in ((tr.executor, "run_main"), (tr.executor, "run"), (tr.eval_executor, "run_main"),
                          (tr._rt, "forward_backward")):
            if obj is not None:
                setattr(obj, name, self._count(getattr(obj, name)))

    def _count(self, fn):
        def wrapped(*a, **k):
            self.calls += 1
            return fn(*a, **k)
        return wrapped

    def untouched(self) -> bool:
        tr = self.tr
        return self.calls == 0 and (tr.state.step, tr.state.dropout_counter, tr._bn_batches) == self.counters and \
            all(torch.equal(v, tr.state_dict()[k]) for k, v in self.weights.items())


# -- optimizers --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make,arg,allowed", [
    (lambda: SGD(NAN), "lr=nan", ">= 0"),
    (lambda: SGD(-0.1), "lr=-0.1", ">= 0"),
    (lambda: SGD(INF), "lr=inf", ">= 0"),
    (lambda: SGD("0.1"), "lr='0.1'", ">= 0"),
    (lambda: SGD(0.1, momentum=NAN), "momentum=nan", "in [0, 1)"),
    (lambda: SGD(0.1, momentum=-0.5), "momentum=-0.5", "in [0, 1)"),
    (lambda: SGD(0.1, momentum=1.0), "momentum=1.0", "in [0, 1)"),
    (lambda: SGD(0.1, weight_decay=-1e-4), "weight_decay=-0.0001", ">= 0"),
    (lambda: SGD(0.1, dampening=NAN), "dampening=nan", "in [0, 1]"),
    (lambda: SGD(0.1, nesterov=1), "nesterov=1", "True or False"),
    (lambda: SGD(0.1, nesterov=True), "nesterov=True", "momentum > 0 and dampening 0"),
    (lambda: AdamW(NAN), "lr=nan", ">= 0"),
    (lambda: AdamW(-1e-3), "lr=-0.001", ">= 0"),
    (lambda: AdamW(betas=(NAN, 0.999)), "betas[0]=nan", "in [0, 1)"),
    (lambda: AdamW(betas=(0.9, -0.1)), "betas[1]=-0.1", "in [0, 1)"),
    (lambda: AdamW(betas=(0.9, 1.0)), "betas[1]=1.0", "in [0, 1)"),
    (lambda: AdamW(betas=0.9), "betas=0.9", "pair"),
    (lambda: AdamW(eps=0.0), "eps=0.0", "> 0"),
    (lambda: AdamW(weight_decay=NAN), "weight_decay=nan", ">= 0"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_optimizer_settings_are_checked(make, arg, allowed):
    with pytest.raises(ArgumentError) as e:
        make()
    assert arg in str(e.value) and allowed in str(e.value), str(e.value)


def test_optimizer_schedule_assignments_are_checked():
    opt = SGD(0.1, momentum=0.9)
    opt.lr = 0.0                   # a schedule may reach 0 (torch.optim allows it)
    with pytest.raises(ArgumentError, match=r"SGD lr=nan: expected a finite number >= 0"):
        opt.lr = NAN
    with pytest.raises(ArgumentError, match=r"SGD momentum=-0.1"):
        opt.momentum = -0.1
    # settings run in float32 kernels (and port-rt refuses larger ones): 1e308 would be inf there
    with pytest.raises(ArgumentError, match=r"SGD lr=1e\+308: expected a finite number >= 0 and at most 3.403e\+38"):
        opt.lr = 1e308
    opt.lr = 3.0e38                # the largest float32s are still settings
    opt.lr = 0.0
    assert opt.lr == 0.0 and opt.momentum == 0.9       # the refused values were not stored
    a = AdamW()
    with pytest.raises(ArgumentError, match=r"AdamW betas\[0\]=-0.5"):
        a.betas = (-0.5, 0.9)
    assert a.betas == (0.9, 0.999)
    # checkpoints read their optimizer through the same rules; a saved lr of 0 reads back
    assert from_dict(SGD(0.0, momentum=0.5).to_dict()) == SGD(0.0, momentum=0.5)
    with pytest.raises(ValueError, match="lr=nan"):
        from_dict({"name": "SGD", "lr": NAN})


@pytest.mark.parametrize("opt,needle", [
    ("sgd", "optimizer must be port.optim.SGD(...) or port.optim.AdamW(...)"),
    (torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), "got torch.optim.sgd.SGD"),
])
def test_trainer_refuses_other_optimizers_before_tracing(no_trace, opt, needle):
    with pytest.raises(ArgumentError) as e:
        Trainer(M.get("mlp", seed=0), torch.randn(8, 64), optimizer=opt)
    assert needle in str(e.value)


def test_trainer_checks_a_mutated_optimizer_before_tracing(no_trace):
    opt = SGD(0.1, momentum=0.9)
    object.__setattr__(opt, "nesterov", True)    # bypassing the per-field check: the rules between fields hold
    object.__setattr__(opt, "dampening", 0.5)
    with pytest.raises(ArgumentError, match="nesterov=True needs momentum > 0 and dampening 0"):
        Trainer(M.get("mlp", seed=0), torch.randn(8, 64), optimizer=opt)


@pytest.mark.parametrize("kw,needle", [
    (dict(micro_batch=3), "micro_batch=3: expected a positive divisor of the batch size 8"),
    (dict(micro_batch=0), "micro_batch=0: expected None or a positive int"),
    (dict(micro_batch=2.0), "micro_batch=2.0: expected None or a positive int"),
    (dict(engine="jit"), "engine='jit': expected 'auto', 'rt' or 'python'"),
    (dict(backend="cuda"), "backend='cuda': expected one of 'c', 'torch-cpu', 'torch-cuda'"),
    (dict(plan=42), "plan must be a port.Plan, a plan file path or None"),
])
def test_trainer_arguments_checked_before_tracing(no_trace, kw, needle):
    with pytest.raises(ArgumentError) as e:
        Trainer(M.get("mlp", seed=0), torch.randn(8, 64), **kw)
    assert needle in str(e.value), str(e.value)


def test_trainer_model_must_be_a_module(no_trace):
    with pytest.raises(ArgumentError, match="model must be a torch.nn.Module, got function"):
        Trainer(lambda x: x, torch.randn(8, 64))


# -- token ids and sequence lengths -------------------------------------------------------------------------------
def test_example_token_ids_out_of_range_refused_before_lowering(no_lower):
    x = _ids(2, 16)
    x[1, 5] = 300
    with pytest.raises(TokenError) as e:
        Trainer(_gpt(), x)
    msg = str(e.value)
    assert "example_input: token id 300 at index [1, 5]" in msg and "'tok'" in msg and "0 <= id < 256" in msg
    x[1, 5] = -3
    with pytest.raises(TokenError, match=r"token id -3 at index \[1, 5\].*0 <= id < 256"):
        port.trace(_gpt(), x)          # port.trace checks too (before port.profile can run)


def test_example_longer_than_context_refused_before_lowering(no_lower):
    with pytest.raises(TokenError) as e:
        Trainer(_gpt(context=16), _ids(2, 20))
    msg = str(e.value)
    assert e.value.kind == "length"
    assert "sequence length 20 is longer than the model's context" in msg and "'pos' has 16 positions" in msg
    assert "at most 16 tokens" in msg
    with pytest.raises(TokenError, match="sequence length 40"):
        Trainer(bert_tiny(layers=1, dim=32, context=32), _ids(2, 40))


def test_example_float_token_ids_refused_with_the_embedding_named():
    with pytest.raises(TokenError) as e:
        Trainer(_gpt(), _ids(2, 16).float())
    msg = str(e.value)
    assert e.value.kind == "dtype" and "example_input" in msg and "int64" in msg and "tok (256 ids)" in msg


@pytest.fixture(scope="module")
def gpt_trainer():
    tr = Trainer(_gpt(), _ids(2, 16), optimizer=SGD(0.05))
    yield tr
    tr.close()


@pytest.mark.parametrize("edit,err,needle", [
    (lambda x, y: (x.masked_fill(x == x[0, 3], 256), y), TokenError, r"x: token id 256 at index \[0, 3\]"),
    (lambda x, y: (x - 1000, y), TokenError, r"x: token id -\d+ at index \[0, 0\].*0 <= id < 256"),
    (lambda x, y: (x.float(), y), ArgumentError, r"x of token ids of an integer dtype \(int64.*got torch.float32"),
    (lambda x, y: (x.double() + 0.5, y), ArgumentError, "got torch.float64"),
    (lambda x, y: (_ids(2, 20), _ids(2, 20)), ArgumentError,
     r"expects x of shape \[2, 16\], got \[2, 20\].*sequence length 16"),
    (lambda x, y: (_ids(3, 16), _ids(3, 16)), ArgumentError, r"expects x of shape \[2, 16\], got \[3, 16\]"),
    (lambda x, y: (x, y.masked_fill(y == y[1, 2], 256)), LabelError, r"labels y: label 256 .*num_classes = 256"),
    (lambda x, y: (x, y * 0 - 5), LabelError, r"labels y: label -5 .*\(or -100: ignored\)"),
], ids=["id-high", "id-negative", "float-ids", "float64-ids", "longer-sequence", "other-batch", "label-high",
        "label-negative"])
@pytest.mark.parametrize("call", ["step", "profile_step"])
def test_bad_token_batches_refused_before_the_step(gpt_trainer, edit, err, needle, call):
    tr = gpt_trainer
    x, y = edit(_ids(2, 16), _ids(2, 16))
    w = Watch(tr)
    with pytest.raises(err, match=needle):
        getattr(tr, call)(x, y)
    assert w.untouched()


def test_bad_token_ids_refused_by_predict(gpt_trainer):
    w = Watch(gpt_trainer)
    with pytest.raises(TokenError, match=r"x: token id 999 at index \[4, 0\]"):
        gpt_trainer.predict(torch.cat([_ids(4, 16), torch.full((1, 16), 999)]))
    with pytest.raises(ArgumentError, match=r"predict\(\) expects x of token ids of an integer dtype"):
        gpt_trainer.predict(_ids(3, 16).float())
    with pytest.raises(ArgumentError, match=r"predict\(\) expects x of shape \[M, 16\]"):
        gpt_trainer.predict(_ids(3, 17))
    assert w.untouched()
    assert gpt_trainer.predict(_ids(5, 16)).shape == (5, 16, 256)      # good ids still run


# -- a batch of another shape than the example --------------------------------------------------------------------
@pytest.mark.parametrize("x,needle", [
    (torch.randn(4, 64), r"expects x of shape \[8, 64\], got \[4, 64\]"),
    (torch.randn(8, 65), r"expects x of shape \[8, 64\], got \[8, 65\]"),
    (torch.randn(8, 64, 1), r"expects x of shape \[8, 64\], got \[8, 64, 1\]"),
    (torch.randn(8), r"expects x of shape \[8, 64\], got \[8\]"),
    (torch.tensor(1.0), r"expects x of shape \[8, 64\], got \[\]"),
    (torch.randn(8, 64).to(torch.complex64), "real number dtype"),
], ids=["batch", "features", "rank-up", "rank-down", "scalar", "complex"])
@pytest.mark.parametrize("engine", ["rt", "python"])
def test_batch_of_another_shape_refused_before_the_step(x, needle, engine):
    tr = Trainer(M.get("mlp", seed=0), torch.randn(8, 64), optimizer=SGD(0.05, momentum=0.9), engine=engine)
    w = Watch(tr)
    with pytest.raises(ArgumentError, match=needle):
        tr.step(x, torch.randint(0, 10, (8,)))
    assert w.untouched()
    assert math.isfinite(tr.step(torch.randn(8, 64), torch.randint(0, 10, (8,))))   # and a right one still runs
    tr.close()


# -- LoRA -----------------------------------------------------------------------------------------------------------
def _snapshot(m):
    return ([(n, type(mod).__name__) for n, mod in m.named_modules()],
            {n: (p.requires_grad, p.detach().clone()) for n, p in m.named_parameters()})


def _same(a, b):
    return a[0] == b[0] and a[1].keys() == b[1].keys() and all(
        a[1][k][0] == b[1][k][0] and torch.equal(a[1][k][1], b[1][k][1]) for k in a[1])


@pytest.mark.parametrize("kw,needle", [
    (dict(rank=0), "lora rank=0: expected an int >= 1"),
    (dict(rank=-2), "lora rank=-2: expected an int >= 1"),
    (dict(rank=2.5), "lora rank=2.5: expected an int >= 1"),
    (dict(rank=True), "lora rank=True: expected an int >= 1"),
    (dict(alpha=NAN), "lora alpha=nan: expected a finite number > 0"),
    (dict(alpha=-8.0), "lora alpha=-8.0: expected a finite number > 0"),
    (dict(alpha=INF), "lora alpha=inf: expected a finite number > 0"),
    (dict(targets=["*.attn.q", "*.atn.v"]), "lora targets: ['*.atn.v'] match no nn.Linear; the model's linear "
                                            "layers are ['blocks.0.attn.q'"),
    (dict(targets=["nothing.*"]), "match no nn.Linear"),
    (dict(targets=[]), "lora targets=[]: give at least one pattern"),
    (dict(targets=[3]), "lora targets=[3]: expected a list of module-path patterns"),
    (dict(train=["haed"]), "lora train: ['haed'] match no module with parameters; the model's are ['tok'"),
], ids=lambda v: str(v)[:30] if not isinstance(v, str) else "")
def test_lora_arguments_checked_before_the_model_changes(kw, needle):
    m = bert_tiny(layers=1, dim=32)
    before = _snapshot(m)
    with pytest.raises(ArgumentError) as e:
        lora(m, **kw)
    assert needle in str(e.value), str(e.value)
    assert isinstance(e.value, ValueError)          # callers that caught lora's ValueError still do
    assert _same(before, _snapshot(m))               # nothing wrapped, nothing frozen


def test_lora_accepts_numpy_ints_and_wraps_as_asked():
    import numpy as np
    m = lora(bert_tiny(layers=1, dim=32), targets=["*.attn.q"], rank=np.int64(4), alpha=8, train=["head"])
    assert isinstance(m.blocks[0].attn.q, LoRALinear) and m.blocks[0].attn.q.rank == 4
    with pytest.raises(ArgumentError, match="LoRALinear base: expected an nn.Linear"):
        LoRALinear(torch.nn.Conv1d(2, 2, 1), 4, 8.0)


def test_trainable_patterns_matching_nothing_refused_before_capture(monkeypatch):
    import port.ir.trace as T
    monkeypatch.setattr(T, "_in_child", lambda *a, **k: pytest.fail("captured before trainable was checked"))
    monkeypatch.setattr(T, "_CACHE", type(T._CACHE)())
    with pytest.raises(ArgumentError) as e:
        Trainer(M.get("resnet8", seed=0), torch.randn(2, 3, 8, 8), trainable=["fc", "layer9"])
    assert "trainable pattern(s) ['layer9'] matched no module with parameters" in str(e.value)
    assert "'fc'" in str(e.value)       # the model's modules are listed


# -- two Trainers on one module ----------------------------------------------------------------------------------------
def test_two_trainers_on_one_module(monkeypatch):
    m = M.get("mlp", seed=0)
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    a = Trainer(m, x, optimizer=SGD(0.1))
    import port.ir.trace as T
    real = T.trace_many
    monkeypatch.setattr(T, "trace_many", lambda *a_, **k: pytest.fail("traced before the module was checked"))
    for target in (m, next(m.children())):                                   # the module or a part of it
        with pytest.raises(ArgumentError) as e:
            Trainer(target, x, optimizer=SGD(0.1))
        assert "another live Trainer trains this module" in str(e.value)
        assert "copy.deepcopy(model)" in str(e.value) and "close()" in str(e.value)
    parent = torch.nn.Sequential(m)                                           # or a module holding it
    with pytest.raises(ArgumentError, match="another live Trainer"):
        Trainer(parent, x, optimizer=SGD(0.1))
    monkeypatch.setattr(T, "trace_many", real)
    # a copy trains on its own
    b = Trainer(copy.deepcopy(m), x, optimizer=SGD(0.1))
    la = a.step(x, y)
    assert b.step(x, y) == la
    # close() hands the module back with the trained weights as its own tensors; a new Trainer may take it
    trained = {k: v.clone() for k, v in a.state_dict().items()}
    a.close()
    assert all(torch.equal(p.detach(), trained[k]) for k, p in m.state_dict().items() if k in trained)
    for call in (lambda: a.step(x, y), lambda: a.predict(x), lambda: a.to_torch()):
        with pytest.raises(PortError, match="closed"):
            call()
    c = Trainer(m, x, optimizer=SGD(0.1))
    c.step(x, y)
    assert all(torch.equal(v, a.state_dict()[k]) for k, v in trained.items())   # a's weights did not move
    # a trainer nobody holds any more does not block the module (even in a reference cycle)
    del c
    d = Trainer(m, x, optimizer=SGD(0.1))
    d.close()
    b.close()


def test_evaluate_checks_labels_before_predicting():
    tr = Trainer(M.get("mlp", seed=0), torch.randn(8, 64), optimizer=SGD(0.05))
    x = torch.randn(5, 64)
    w = Watch(tr)
    for y, err, needle in ((torch.tensor([0, 1, 12, 3, 4]), LabelError, r"labels y: label 12 at index 2"),
                           (torch.tensor([0, 1, -1, 3, 4]), LabelError, "label -1"),
                           (torch.zeros(5), ArgumentError, "integer dtype")):
        with pytest.raises(err, match=needle):
            tr.evaluate([(x, y)])
    assert w.untouched()                                  # refused before predict ran
    with pytest.raises(ArgumentError, match=r"labels y of shape \[5\] \(one per sample of x\), got \[4\]"):
        tr.evaluate([(x, torch.zeros(4, dtype=torch.int64))])
    assert set(tr.evaluate([(x, torch.tensor([0, 1, 2, 3, 4]))])) == {"loss", "accuracy"}
    tr.close()
