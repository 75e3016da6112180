"""Hostile programs and inputs (issue 11): every field of a program is validated before it runs, call attributes
must agree with the slots' shapes (in Python and in the C kernels), NaN/Inf propagate as in PyTorch, and a bad
label is refused, by name, before the step touches the arena."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import port
import port.models as M
from port.errors import LabelError, PortError, ProgramError
from port.exec.executor import Executor, RunState
from port.lower.arena import check_program
from port.lower.lower import default_plan, lower
from port.train.optim import SGD

CANARY = 4096
PATTERN = 0xA5


@pytest.fixture(scope="module")
def digits():
    model = M.get("digits_cnn", seed=0)
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    g = port.trace(model, x)
    return model, x, g, lower(g, default_plan(g, "c"))


def guarded_arena(nbytes: int):
    """(arena, full buffer): a 64-byte aligned arena with CANARY bytes of PATTERN on each side."""
    full = torch.full((nbytes + 2 * CANARY + 64,), PATTERN, dtype=torch.uint8)
    pad = (-(full.data_ptr() + CANARY)) % 64
    arena = full[pad + CANARY:pad + CANARY + nbytes]
    arena.zero_()
    return arena, full[pad:pad + 2 * CANARY + nbytes]


def canaries_intact(full) -> bool:
    return bool((full[:CANARY] == PATTERN).all()) and bool((full[-CANARY:] == PATTERN).all())


def executor(program, model, check=True, backend_arena=None):
    arena, full = guarded_arena(program.arena_bytes)
    ex = Executor(program, RunState(opt=SGD(0.1, momentum=0.9)), arena=arena, check=check)
    for k, v in model.state_dict().items():
        try:
            ex.view(program.slot_by_name(k).tensor).copy_(v)
        except KeyError:
            pass
    return ex, full


def step(ex, x, y):
    ex.input.copy_(x)
    ex.labels.copy_(y)
    ex.zero_grads()
    ex.run()


def _calls(p, i, **kw):
    calls = list(p.calls)
    calls[i] = dataclasses.replace(calls[i], **kw)
    return dataclasses.replace(p, calls=tuple(calls), _index={})


def _attr(p, i, key, value):
    c = p.calls[i]
    return _calls(p, i, attrs=tuple((k, value if k == key else v) for k, v in c.attrs))


# ---------------------------------------------------------------------------------------------------------
# 1. every program field is checked
# ---------------------------------------------------------------------------------------------------------
def _update_writes_another(p):
    """An update call whose parameter output names another parameter of the same shape (its state stays)."""
    for c in p.calls:
        if c.kernel != "update":
            continue
        shp = p.slot(c.inputs[0]).shape
        other = next((s.tensor for s in p.slots if s.role == "parameter" and s.shape == shp and s.tensor != c.inputs[0]),
                     None)
        if other is not None:
            return (_calls(p, c.index, outputs=(other,) + tuple(c.outputs[1:])),)
    raise AssertionError("no two parameters of one shape in the program")


def field_mutants(p):
    """(label, mutant, regex the ProgramError must match)."""
    A, P = p.arena_bytes, p.persistent_bytes
    param = p.slot_by_name("0.weight")
    R = dataclasses.replace
    return [
        ("zero past the arena", R(p, zero_ranges=((A - 64, 8192),)), r"zero_ranges\[0\] = \(\d+, 8192\)"),
        ("zero before the arena", R(p, zero_ranges=((-4096, 4096),)), r"zero_ranges\[0\] = \(-4096, 4096\)"),
        ("zero over a parameter", R(p, zero_ranges=((param.offset, param.nbytes),)), r"covers parameter '0.weight'"),
        ("zero scratch", R(p, zero_ranges=((P, 64),)), "inside the persistent region"),
        ("zero of size 0", R(p, zero_ranges=((0, 0),)), "non-empty"),
        ("zero range not ints", R(p, zero_ranges=((0.5, 64),)), "zero_ranges"),
        ("persistent > arena", R(p, persistent_bytes=A + 64), "persistent_bytes"),
        ("negative arena", R(p, arena_bytes=-1), "arena_bytes"),
        ("arena not an int", R(p, arena_bytes=float(A)), "arena_bytes"),
        ("unknown input id", R(p, input_id=10_000), "input_id"),
        ("input id is the labels", R(p, input_id=p.label_id), "input_id"),
        ("unknown label id", R(p, label_id=10_000), "label_id"),
        ("label id of a float tensor", R(p, label_id=p.input_id), "label_id"),
        ("unknown loss id", R(p, loss_id=10_000), "loss_id"),
        ("loss id of a big tensor", R(p, loss_id=p.input_id), "loss_id"),
        ("unknown logits id", R(p, logits_id=10_000), "logits_id"),
        ("version", R(p, version=99), "version"),
        ("live_until of a parameter", R(p, live_until=((param.tensor, 0),)), "live_until"),
        ("live_until past the end", R(p, live_until=((p.input_id, len(p.calls) + 5),)), "live_until"),
        ("live_timeline length", R(p, live_timeline=(1, 2)), "live_timeline"),
        ("call index", _calls(p, 3, index=7), "index"),
        ("call index type", _calls(p, 3, index="3"), "index"),
        ("unknown backend", _calls(p, 2, backend="cuda9"), "backend 'cuda9'"),
        ("unknown kernel", _calls(p, 2, kernel="max_pool3d"), "kernel 'max_pool3d'"),
        ("kernel of another op", _calls(p, 2, kernel="avg_pool2d"), "avg_pool2d"),
        ("unknown variant", _calls(p, 1, variant="patch3"), "variant 'patch3'"),
        ("unknown phase", _calls(p, 1, phase="sideways"), "phase"),
        ("negative workspace offset", _calls(p, 0, workspace_offset=-64), "workspace"),
        ("workspace too small", _calls(p, 0, workspace_bytes=p.calls[0].workspace_bytes - 4), "workspace_bytes"),
        ("misaligned workspace", _calls(p, 0, workspace_offset=p.calls[0].workspace_offset + 9), "not 64-byte aligned"),
        ("attrs not pairs", _calls(p, 2, attrs=(("kernel",),)), "attrs"),
        ("outputs not a tuple", _calls(p, 2, outputs=[19, 20]), "outputs"),
        ("slot nbytes negative", dataclasses.replace(p, slots=tuple(
            dataclasses.replace(s, nbytes=-4) if s.name == "0.weight" else s for s in p.slots), _index={}),
         "nbytes"),
        ("update writes another parameter", *_update_writes_another(p), "in place"),
        ("relu-like call writes a parameter", _calls(p, 4, outputs=(p.slot_by_name("1.running_mean").tensor,)),
         r"output 0 '1.running_mean'"),
    ]


def test_every_program_field_is_checked(digits):
    model, x, g, p = digits
    check_program(p)
    for label, mutant, pattern in field_mutants(p):
        with pytest.raises(ProgramError, match=pattern):
            check_program(mutant)
        with pytest.raises(ProgramError):
            Executor(mutant)


def test_zero_ranges_out_of_arena_never_run(digits):
    model, x, g, p = digits
    bad = dataclasses.replace(p, zero_ranges=((p.arena_bytes - 64, 8192),))
    with pytest.raises(ProgramError, match=r"zero_ranges\[0\].*expected a non-empty range inside the persistent"):
        Executor(bad)


# ---------------------------------------------------------------------------------------------------------
# 2. call attributes against slot shapes (Python checker and C kernels)
# ---------------------------------------------------------------------------------------------------------
def attr_mutants(p):
    pool = next(c.index for c in p.calls if c.kernel == "max_pool2d")
    pool_b = next(c.index for c in p.calls if c.kernel == "max_pool2d.grad_input")
    conv = next(c.index for c in p.calls if c.kernel == "conv2d_bn_relu")
    conv_gi = next(c.index for c in p.calls if c.kernel == "conv2d.grad_input")
    conv_gw = next(c.index for c in p.calls if c.kernel == "conv2d.grad_weight")
    lin = next(c.index for c in p.calls if c.kernel == "linear")
    lin_gw = next(c.index for c in p.calls if c.kernel == "linear.grad_weight")
    upd = next(c.index for c in p.calls if c.kernel == "update")
    bn_gw = next(c.index for c in p.calls if c.kernel == "batch_norm2d.grad_weight")
    return [
        ("max-pool stride 2 -> 1", _attr(p, pool, "stride", (1, 1))),
        ("max-pool kernel 2 -> 3", _attr(p, pool, "kernel", (3, 3))),
        ("max-pool padding 0 -> 1", _attr(p, pool, "padding", (1, 1))),
        ("max-pool backward stride", _attr(p, pool_b, "stride", (1, 1))),
        ("conv kernel 3 -> 1", _attr(p, conv, "kernel", (1, 1))),
        ("conv stride 1 -> 2", _attr(p, conv, "stride", (2, 2))),
        ("conv padding 1 -> 0", _attr(p, conv, "padding", (0, 0))),
        ("conv groups 1 -> 2", _attr(p, conv, "groups", 2)),
        ("conv stride not a pair", _attr(p, conv, "stride", 2)),
        ("conv grad_input kernel", _attr(p, conv_gi, "kernel", (1, 1))),
        ("conv grad_weight padding", _attr(p, conv_gw, "padding", (2, 2))),
        ("conv grad_weight grads", _attr(p, conv_gw, "grads", ("weight", "bias"))),
        ("linear bias dropped", _attr(p, lin, "bias", False)),
        ("linear grads", _attr(p, lin_gw, "grads", ("weight",))),
        ("bn grads", _attr(p, bn_gw, "grads", ("bias", "weight", "weight"))),
        ("optimizer", _attr(p, upd, "optimizer", "adamw")),
        ("bn training flag", _attr(p, bn_gw, "training", False)),
    ]


def test_call_attributes_against_shapes(digits):
    model, x, g, p = digits
    for label, mutant in attr_mutants(p):
        with pytest.raises(ProgramError, match=r"call \d+ \("):
            check_program(mutant)


def test_c_kernels_refuse_inconsistent_params(digits):
    """Without the Python check (as a future C runtime would run it), the kernels themselves refuse a max-pool
    whose stride implies another output size, and nothing outside the arena is written."""
    from port.exec.capi import KernelValueError
    model, x, g, p = digits
    pool = next(c.index for c in p.calls if c.kernel == "max_pool2d")
    conv = next(c.index for c in p.calls if c.kernel == "conv2d_bn_relu")
    for mutant in (_attr(p, pool, "stride", (1, 1)), _attr(p, conv, "padding", (0, 0)),
                   _attr(p, conv, "stride", (2, 2))):
        ex, full = executor(mutant, model, check=False)
        with pytest.raises(KernelValueError, match="inconsistent shape"):
            step(ex, x, torch.tensor([1, 2, 3, 4]))
        assert canaries_intact(full)


def test_c_kernel_params_out_dims():
    from port.exec import capi
    p = capi.Pool2dParams(1, 1, 8, 8, 2, 2, 2, 2, 0, 0, 4, 4)
    assert capi.raw.port_pool2d_out_h(p) == 4
    y, i, x = torch.zeros(16), torch.zeros(16, dtype=torch.int64), torch.randn(64)
    assert capi.raw.port_maxpool2d_forward(y.data_ptr(), i.data_ptr(), x.data_ptr(), p) == 0
    p.stride_h = p.stride_w = 1
    assert capi.raw.port_maxpool2d_forward(y.data_ptr(), i.data_ptr(), x.data_ptr(), p) == capi.PORT_ERR_SHAPE
    c = capi.Conv2dParams(1, 1, 8, 8, 2, 3, 3, 1, 1, 1, 1, 1, 8, 8)
    assert capi.raw.port_conv2d_check(c) == 0
    c.kh = c.kw = 1
    assert capi.raw.port_conv2d_check(c) == capi.PORT_ERR_SHAPE


# ---------------------------------------------------------------------------------------------------------
# 3. NaN / Inf propagate as in PyTorch
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name", ["digits_cnn", "mlp"])
def test_non_finite_input_propagates(name, bad):
    model = M.get(name, seed=0)
    shape = (4, 1, 8, 8) if name == "digits_cnn" else (4, 64)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    x.view(-1)[5] = bad
    y = torch.tensor([1, 2, 3, 4])
    ref = torch.nn.functional.cross_entropy(M.get(name, seed=0).train()(x), y)
    g = port.trace(model, torch.randn(*shape))
    for backend in ("c", "torch-cpu"):
        p = lower(g, default_plan(g, backend))
        ex, full = executor(p, model)
        step(ex, x, y)
        got = float(ex.loss)
        assert (got != got) == bool(ref.isnan()), (backend, got, float(ref))
        assert canaries_intact(full)


@pytest.mark.parametrize("kernel", ["relu", "relu6"])
def test_activations_keep_nan(kernel):
    from port.exec import capi
    x = torch.tensor([float("nan"), -1.0, 0.5, 7.0, -0.0, float("inf"), -float("inf")] * 3)
    y = torch.empty_like(x)
    assert getattr(capi.raw, f"port_{kernel}_forward")(y.data_ptr(), x.data_ptr(), x.numel()) == 0
    ref = torch.relu(x) if kernel == "relu" else torch.nn.functional.relu6(x)
    assert torch.equal(y.isnan(), ref.isnan()) and torch.equal(y.nan_to_num(), ref.nan_to_num())
    dy, dx = torch.randn(x.numel()), torch.empty_like(x)
    assert getattr(capi.raw, f"port_{kernel}_backward")(dx.data_ptr(), dy.data_ptr(), y.data_ptr(), x.numel()) == 0
    xr = ref.clone().requires_grad_()     # torch's backward from the output, as PORT's
    (torch.relu(xr) if kernel == "relu" else torch.nn.functional.relu6(xr)).backward(dy)
    assert torch.equal(dx.nan_to_num(), xr.grad.nan_to_num())


# ---------------------------------------------------------------------------------------------------------
# 4. labels are validated before the step runs
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [10, -1, 1 << 40])
def test_bad_label_named_and_arena_untouched(digits, bad):
    model, x, g, p = digits
    ex, full = executor(p, model)
    ex.input.copy_(x)
    ex.labels.copy_(torch.tensor([1, 2, bad, 4]))
    ex.zero_grads()
    before = ex.arena.clone()
    with pytest.raises(LabelError, match=rf"label {bad} at index 2 of the batch .*num_classes = 10"):
        ex.run()
    assert torch.equal(ex.arena, before)      # BN running statistics, weights: all untouched
    assert canaries_intact(full)
    assert isinstance(LabelError("x"), PortError)


def test_c_loss_kernel_label_error_is_named(digits):
    """Called directly (no executor pre-check), the C loss call still names the label, its index and K."""
    model, x, g, p = digits
    ex, full = executor(p, model)
    ex.labels.copy_(torch.tensor([1, 2, 3, 12]))
    i = next(c.index for c in p.calls if c.kernel == "cross_entropy")
    with pytest.raises(LabelError, match=r"call \d+ \(loss, cross_entropy\): label 12 at index 3 .*= 10"):
        ex.bound[i]()


def test_bad_label_in_a_later_micro_batch_changes_no_state():
    """With micro-batching the whole batch's labels are checked before the first micro-batch runs: a bad label
    in the second half leaves parameters, optimizer state and BN running statistics as they were."""
    from port import models as M
    from port.train.optim import SGD
    from port.train.trainer import Trainer
    torch.manual_seed(0)
    x = torch.randn(8, 1, 8, 8)
    tr = Trainer(M.get("digits_cnn", seed=0), x, optimizer=SGD(0.1, momentum=0.9), micro_batch=4)
    before = tr.arena[:tr.program.persistent_bytes].clone()
    y = torch.tensor([0, 1, 2, 3, 4, 5, 10, 7])
    with pytest.raises(LabelError, match=r"label 10 at index 6 .*num_classes = 10"):
        tr.step(x, y)
    assert torch.equal(tr.arena[:tr.program.persistent_bytes], before)
