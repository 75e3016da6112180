"""The opencl backend's kernels (port/exec/backends/opencl.py) against PyTorch in float64: every op of small
traced CNNs that has an OpenCL kernel runs through the registry on the opencl backend (float32) and through the
op record's torch binding on float64 copies of the same inputs; a backward op reads what the float64 forward
saved (rounded to float32 for the OpenCL run), so each kernel is checked on its own. Weight gradients start
non-zero (they accumulate), input gradients start as garbage (they overwrite).

Skipped with the reason where pyopencl or an OpenCL device (PoCL: pocl-binary-distribution) is missing.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from conftest import close
from port.exec import registry
from port.exec.executor import RunState
from port.lower.program import GRAD_SCALE_ID, Call
from port.plan import variants as V

OK, WHY = registry.available("opencl")
pytestmark = pytest.mark.skipif(not OK, reason=f"opencl backend unavailable: {WHY}")


class Ctx:
    def __init__(self, bufs, state):
        self.bufs, self.state = bufs, state

    def view(self, tid):
        return self.bufs[tid]

    def ptr(self, tid):
        return self.bufs[tid].data_ptr()

    def shape(self, tid):
        return tuple(self.bufs[tid].shape)

    def ws_ptr(self, call):
        return None

    def ws_view(self, call):
        return None


class Net(nn.Module):
    """Every CNN-zoo op kind the opencl backend runs: convs (plain, grouped with bias, depthwise, pointwise,
    strided), batch norm, relu/relu6/hardswish, max/avg/global pools, a residual add, linear, cross-entropy."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.c1(x)))
        x = nn.functional.max_pool2d(x, 2)
        y = nn.functional.relu6(self.c2(x))
        z = nn.functional.hardswish(self.dw(y))
        z = nn.functional.avg_pool2d(self.pw(z), 3, stride=1, padding=1) + y
        return self.fc(nn.functional.adaptive_avg_pool2d(z, 1).flatten(1))


def _graph(opt: str):
    from port.ir.trace import trace_many
    torch.manual_seed(0)
    return trace_many([dict(model=Net(), example_input=torch.randn(3, 3, 12, 12), optimizer=opt, name="ocl")])[0]


def _init(g, tid, gen):
    if tid == GRAD_SCALE_ID:
        return torch.full((1,), 0.5)
    s = g.tensors[tid]
    shape = tuple(s.shape)
    if s.dtype == "int64":
        high = g.tensors[g.logits_id].shape[-1] if tid == g.label_id else 2
        return torch.randint(0, high, shape, generator=gen)
    t = torch.randn(shape, generator=gen)
    if s.role in ("buffer", "optimizer_state"):
        t = t.abs_().add_(0.5)
    return t


def _call(g, op, backend, index=0):
    (spec,) = registry.op_calls(g, op, "plain", backend)
    return Call(index=index, op=op.id, name=op.name, kernel=spec.kernel, backend=backend, variant="plain",
                phase=op.phase, outputs=spec.outputs, inputs=spec.inputs, attrs=spec.attrs)


def _check_op(g, op, opt, state):
    gen = torch.Generator().manual_seed(op.id)
    f64: dict = {}
    calls = []
    if op.forward_op is not None:
        calls.append(("setup", g.ops[op.forward_op]))
    calls.append(("test", op))
    for _, o in calls:
        for t in registry.op_calls(g, o, "plain", "torch-cpu")[0].inputs + o.outputs:
            if t not in f64:
                v = _init(g, t, gen)
                f64[t] = v.double() if v.dtype == torch.float32 else v
    for t in registry.op_calls(g, op, "plain", "torch-cpu")[0].outputs:
        f64.setdefault(t, _init(g, t, gen).double())
    if len(calls) == 2:        # the forward's saved tensors, in float64
        registry.bind(_call(g, calls[0][1], "torch-cpu"), Ctx(f64, state))()
    f32 = {t: (v.float() if v.dtype == torch.float64 else v.clone()) for t, v in f64.items()}
    ref = _call(g, op, "torch-cpu")
    ours = _call(g, op, "opencl")
    registry.bind(ref, Ctx(f64, state))()
    fn = registry.bind(ours, Ctx(f32, state))
    fn()
    fn.sync()
    written = set(ours.outputs) | {ours.inputs[i] for _o, i in registry.inplace_pairs(ours.kernel, dict(ours.attrs))}
    for t in sorted(written):
        if f64[t].dtype == torch.int64:
            assert torch.equal(f32[t], f64[t]), f"{op.name} ({op.kind}): {g.tensors[t].name} differs"
        else:
            close(f32[t], f64[t], atol=1e-4, rtol=1e-4, what=f"{op.name} ({op.kind}) -> {g.tensors[t].name}")


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_every_opencl_op_matches_float64(opt):
    from port.train.optim import SGD, AdamW
    g = _graph(opt)
    o = SGD(0.05, momentum=0.9, weight_decay=1e-4) if opt == "sgd" else AdamW(1e-3, weight_decay=1e-2)
    state = RunState(opt=o, step=3)
    kinds = set()
    for op in g.ops:
        if not V.variants(g, op, "opencl") or not registry.op_calls(g, op, "plain", "opencl"):
            continue
        _check_op(g, op, opt, state)
        kinds.add(op.kind)
    want = {"conv2d", "conv2d.grad_input", "conv2d.grad_weight", "batch_norm2d", "batch_norm2d.grad_input",
            "batch_norm2d.grad_weight", "relu", "relu.grad_input", "relu6", "relu6.grad_input", "hardswish",
            "hardswish.grad_input", "max_pool2d", "max_pool2d.grad_input", "avg_pool2d", "avg_pool2d.grad_input",
            "global_avg_pool2d", "global_avg_pool2d.grad_input", "add", "linear", "linear.grad_input",
            "linear.grad_weight", "cross_entropy", "cross_entropy.grad_input", "update"}
    assert want <= kinds, f"not covered: {sorted(want - kinds)}"


def test_sgd_first_step_and_eval_batch_norm():
    """SGD's first momentum step copies the gradient (step 0); eval-mode batch norm (an inference graph)."""
    from port.train.optim import SGD
    g = _graph("sgd")
    state = RunState(opt=SGD(0.1, momentum=0.9, weight_decay=0.0), step=0)
    for op in g.ops:
        if op.kind == "update":
            _check_op(g, op, "sgd", state)
            break
    from port.lower.lower import inference_graph
    torch.manual_seed(0)
    gi = inference_graph(Net(), torch.randn(2, 3, 12, 12))
    bn = [op for op in gi.ops if op.kind == "batch_norm2d"]
    assert bn and not bn[0].attr("training")
    _check_op(gi, bn[0], "sgd", state)


def test_a_bound_call_sets_again_the_arguments_that_change_between_runs():
    """A bound call keeps its kernels' arguments set between runs (port.exec.backends.opencl.Engine.run: setting
    them costs the host more than enqueueing) and sets again those that change: one bound SGD update run at step 0
    (its first-step flag) and at steps 1 and 2 with other learning rates matches torch's update every time."""
    from port.train.optim import SGD
    g = _graph("sgd")
    op = next(o for o in g.ops if o.kind == "update")
    state = RunState(opt=SGD(0.1, momentum=0.9, weight_decay=0.0), step=0)
    ref, ours = _call(g, op, "torch-cpu"), _call(g, op, "opencl")
    gen = torch.Generator().manual_seed(1)
    f64 = {t: _init(g, t, gen).double() for t in dict.fromkeys(ref.inputs + ref.outputs + ours.inputs + ours.outputs)}
    f32 = {t: v.float() for t, v in f64.items()}
    run_ref, run_ours = registry.bind(ref, Ctx(f64, state)), registry.bind(ours, Ctx(f32, state))
    written = set(ours.outputs) | {ours.inputs[i] for _o, i in registry.inplace_pairs(ours.kernel, dict(ours.attrs))}
    for step, lr in ((0, 0.1), (1, 0.1), (2, 0.02)):
        state.step, state.opt = step, SGD(lr, momentum=0.9, weight_decay=0.0)
        run_ref()
        run_ours()
        run_ours.sync()
        for t in sorted(written):
            close(f32[t], f64[t], atol=1e-5, rtol=1e-5, what=f"step {step}, lr {lr}: {g.tensors[t].name}")


def test_unsupported_ops_stay_on_other_engines():
    """Token-level cross-entropy (ignore_index) and dropout have no OpenCL kernel: no variants, so plans keep
    them on the C/torch engines."""
    from port.exec.backends.opencl import supports
    assert not supports("cross_entropy", {"ignore_index": -100, "label_smoothing": 0.0})
    assert not supports("dropout", {"p": 0.5})
    assert not supports("max_pool2d", {"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0), "ceil_mode": True})
    pool = {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)}
    assert supports("avg_pool2d", pool) and not supports("avg_pool2d.grad_input", pool | {"count_include_pad": False})
    assert not supports("avg_pool2d", pool | {"ceil_mode": True})
    assert supports("conv2d", {})


def test_profiler_runs_and_hands_off_through_the_engine():
    """The profiler times opencl ops through the registry (its runner waits for the queue) and measures the
    engine's hand-offs: a wait to the host, nothing from it, no bytes moved (bandwidth inf) on unified memory."""
    import math
    from port.config import load_device
    from port.cost.handoff import measure_handoff
    from port.cost.runners import get_runner
    g = _graph("sgd")
    r = get_runner("opencl", g, threads=1)
    conv = next(o for o in g.ops if o.kind == "conv2d.grad_weight")
    run = r.prepare(conv)
    run()
    r.sync()
    assert run.entries == ("opencl:conv2d.grad_weight",)
    dev = load_device("configs/devices/host-opencl.yaml")
    hs = {(h.src, h.dst): h for h in measure_handoff(dev, ["cpu-c", "opencl"], quick=True)}
    assert set(hs) == {("cpu-c", "opencl"), ("opencl", "cpu-c")}
    assert all(math.isinf(h.bytes_per_ms) and h.measured for h in hs.values())
    assert hs[("opencl", "cpu-c")].latency_ms > 0


def test_profiler_measures_copies_to_and_from_an_engine_with_its_own_memory():
    """With ``memory: own`` (host-opencl-discrete.yaml) a hand-off copies bytes: a finite fitted bandwidth each
    way, and the copy probe moves the tensor's bytes (a round trip returns them)."""
    import math
    import torch
    from port.config import load_device
    from port.cost.handoff import measure_handoff
    from port.exec.backends.opencl import copy_probe
    dev = load_device("configs/devices/host-opencl-discrete.yaml")
    hs = {(h.src, h.dst): h for h in measure_handoff(dev, ["cpu-c", "opencl"], quick=True)}
    assert set(hs) == {("cpu-c", "opencl"), ("opencl", "cpu-c")}
    assert all(h.measured and math.isfinite(h.bytes_per_ms) and h.bytes_per_ms > 0 for h in hs.values())
    t = torch.arange(1024, dtype=torch.float32)
    to_dev = copy_probe(t, to_host=False)
    to_dev()
    back = torch.zeros_like(t)
    from port.exec.backends.opencl import engine
    engine().copy(back.view(torch.uint8), to_dev.keep, 0, True)
    assert torch.equal(back, t)


class ConvNet(nn.Module):
    """Convolutions whose GEMMs have full 8 x 8 blocks and ragged edges (13 and 24 output channels, 90 and 45
    output pixels): strided 5x5, pointwise (its forward and input gradient read the image as the column matrix)
    and grouped with bias."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 13, 5, stride=2, padding=2, bias=False)
        self.pw = nn.Conv2d(13, 16, 1)
        self.gc = nn.Conv2d(16, 24, 3, stride=(2, 1), padding=1, groups=2)
        self.fc = nn.Linear(24, 3)

    def forward(self, x):
        x = self.gc(torch.relu(self.pw(self.c1(x))))
        return self.fc(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


@pytest.mark.parametrize("images_per_launch", [5, 2, 1])
def test_conv_gemm_blocks_edges_and_image_chunks_match_float64(monkeypatch, images_per_launch):
    """The convolutions' batched GEMM (gemm_n8) on full and ragged blocks, with the 5 images in one launch, at
    most 2 a launch (the smallest conv: 2 + 2 + 1) and one by one (port.exec.backends.opencl.SCRATCH_IMAGES_BYTES
    bounds a launch's column matrices)."""
    from port.exec.backends import opencl
    from port.ir.trace import trace_many
    from port.train.optim import SGD
    g = trace_many([dict(model=ConvNet(), example_input=torch.randn(5, 3, 19, 17), optimizer="sgd",
                         name="oclconv")])[0]
    T = g.tensors
    per_image = [4 * math.prod(T[o.inputs[1]].shape[1:]) * math.prod(T[o.outputs[0]].shape[2:])   # 4 * K * P
                 for o in g.ops if o.kind == "conv2d"]
    monkeypatch.setattr(opencl, "SCRATCH_IMAGES_BYTES", min(per_image) * images_per_launch)
    state = RunState(opt=SGD(0.05, momentum=0.9), step=3)
    kinds = set()
    for op in g.ops:
        if op.kind.startswith("conv2d"):
            _check_op(g, op, "sgd", state)
            kinds.add(op.kind)
    assert kinds == {"conv2d", "conv2d.grad_input", "conv2d.grad_weight"}
