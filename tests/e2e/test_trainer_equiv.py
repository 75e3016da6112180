"""PORT (C executor, default plan: fusion + in-place) against PyTorch eager, step for step: 20 steps of SGD with
momentum and of AdamW from the same initial weights and data; the loss at every step within 1e-4 relative and
the final weights within 1e-4 relative (see _equiv.check_weights for the exact metric). Where float32 training
is chaotic (AdamW on the deep nets: one ReLU input within rounding of zero decides the trajectory, and which way
it goes depends on the CPU's kernels) PORT is compared one step at a time from PyTorch's state instead
(_equiv.compare_synced), so the result does not depend on the machine."""
from __future__ import annotations

import copy

import pytest
import torch

import port.models as M
from _equiv import compare_to_float64, compare_synced, check_weights, compare, data

def _freeze_bn(m):
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.eval()
    return m


# (model, batch, kwargs, freeze_bn); dropout models with p=0 for equality (dropout has its own tests).
# Deep nets with training-mode BN at batch 2 are ill-conditioned in float32 (BN over a handful of values:
# PyTorch's own float32 gradients differ from float64 by up to 1e-2 there), so they are held to 1e-4 with
# frozen BN, and separately, with training-mode BN, to what float32 allows (test_train_bn_deep_nets_close).
ZOO = [
    ("mlp", 4, {"dropout": 0.0}, False),
    ("digits_cnn", 4, {}, False),
    ("resnet8", 2, {}, False),
    ("vgg11", 2, {}, True),
    ("resnet18", 2, {}, True),
    ("vgg16", 2, {}, True),
    ("resnet50", 2, {}, True),
]
LARGEST = {"vgg11", "resnet18", "vgg16", "resnet50"}      # the zoo's largest: the slow tier (make test-all)
LR = {"sgd": 0.005, "adamw": 1e-4}
# AdamW on these (frozen BN, batch 2) is chaotic in float32, so a free-running comparison with PyTorch passes on
# some CPUs and fails on others. vgg11: the failure seen on an AVX-512 Xeon (step 16: 1.53077 PORT vs 1.52999
# PyTorch) is reproduced to every printed digit here with PyTorch's oneDNN convolution switched off (PyTorch then
# uses its im2col path): PyTorch float32 puts a step-4 ReLU input that is -7.3e-8 in float64 on the positive side
# (1 of ~300k ReLU inputs per step), and AdamW amplifies that: at step 16 PORT is 1.3e-6 from float64, PyTorch
# 5.1e-4; 3 of 8 PyTorch runs with one ulp of weight noise take the same branch. resnet18: knife-edge steps at 2,
# 3 and 18 (the ReLU flip root-caused there before). mobilenetv2 (test below): with 1 thread, ATen DEFAULT,
# OpenBLAS Prescott and oneDNN SSE4.1 PORT ended 2.2e-4 (global) from PyTorch's weights, a BN bias 19% off;
# PyTorch runs with one ulp of weight noise end 6e-7..2.3e-4 from float64, the same bias 18% off.
SYNCED_ADAMW = {"vgg11", "resnet18", "vgg16", "resnet50"}


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
@pytest.mark.parametrize("name,batch,kw,freeze", [pytest.param(*z, id=z[0], marks=[pytest.mark.slow] if z[0] in LARGEST
                                                                 else []) for z in ZOO])
def test_zoo_matches_pytorch(name, batch, kw, freeze, opt, request):
    m = M.get(name, seed=0, **kw)
    if freeze:
        _freeze_bn(m)
    if opt == "adamw" and name in SYNCED_ADAMW:
        # One step at a time from PyTorch's state (see compare_synced): a ReLU knife edge costs one step's
        # update ~1e-3 (measured 7e-4..2.3e-3) instead of a diverged trajectory; a real error shows in every step.
        compare_synced(m, data(name, batch, 20), opt, lr=LR[opt])
        return
    compare(m, data(name, batch, 20), opt, lr=LR[opt])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vgg11", "resnet18"])
def test_train_bn_deep_nets_as_accurate_as_pytorch(name):
    """Training-mode BN in deep nets at batch 2 (BN over a handful of values late in the net): float32 runs
    diverge chaotically with summation order (PyTorch on 1 vs 2 threads differ by ~1e-3 within 10 steps), so
    the oracle is PyTorch float64 and PORT must be as close to it as PyTorch float32 is."""
    compare_to_float64(M.get(name, seed=0), data(name, 2, 10), "sgd", lr=LR["sgd"])


@pytest.mark.slow
@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_mobilenetv2_frozen_bn_matches_pytorch(opt):
    """MobileNetV2 with frozen (eval-mode) batch norm: 1e-4 like the rest of the zoo; AdamW one step at a time
    from PyTorch's state, like the other deep nets (SYNCED_ADAMW: free-running it failed on one CPU code path)."""
    m = _freeze_bn(M.get("mobilenetv2", seed=0, dropout=0.0))
    if opt == "adamw":
        compare_synced(m, data("mobilenetv2", 2, 20), opt, lr=LR[opt])
        return
    compare(m, data("mobilenetv2", 2, 20), opt, lr=LR[opt])


@pytest.mark.slow
def test_mobilenetv2_train_bn_as_accurate_as_pytorch():
    """MobileNetV2 with training-mode BN at batch 2 is ill-conditioned at initialisation: PyTorch's own float32
    run leaves float64 training by ~1e-2 within a few steps, and any change of summation order (the C kernels,
    or PyTorch on another thread count) gives another trajectory. So the oracle is float64: PORT must be as
    close to it as PyTorch float32 (the frozen-BN test above holds MobileNetV2's kernels to 1e-4 against
    PyTorch directly)."""
    m = M.get("mobilenetv2", seed=0, dropout=0.0)
    lp, l32, l64 = compare_to_float64(m, data("mobilenetv2", 2, 10), "sgd", lr=LR["sgd"])
    assert lp[-1] < lp[0]


def test_micro_batch_equals_full_batch():
    """micro_batch=2 of a batch of 8 == the full batch in PyTorch (mlp without dropout: no batch statistics)."""
    m = M.get("mlp", seed=0, dropout=0.0)
    compare(m, data("mlp", 8, 20), "sgd", lr=0.05, micro_batch=2)
    m = M.get("mlp", seed=1, dropout=0.0)
    compare(m, data("mlp", 8, 20), "adamw", lr=1e-3, micro_batch=4)


def test_micro_batch_frozen_bn_cnn():
    m = _freeze_bn(M.get("resnet8", seed=0))
    compare(m, data("resnet8", 4, 20), "sgd", lr=LR["sgd"], micro_batch=2)


def test_frozen_layers():
    """trainable= restricts training to some modules; PyTorch freezes the same parameters."""
    m = M.get("resnet8", seed=0)
    keep = lambda n: n.startswith(("layer3", "fc"))
    _, _, tr = compare(m, data("resnet8", 2, 20), "sgd", lr=LR["sgd"], trainable=["layer3", "fc"],
                       freeze_torch=keep)
    init = M.get("resnet8", seed=0).state_dict()
    delta = tr.parameter_delta(init)
    assert delta and all(keep(k) for k in delta)
    m = M.get("digits_cnn", seed=0)
    compare(m, data("digits_cnn", 4, 20), "adamw", lr=LR["adamw"], trainable=["12"],
            freeze_torch=lambda n: n.startswith("12."))


def test_comparator_catches_drift():
    """The comparison must fail on a real drift: a 1% different learning rate in PyTorch is caught."""
    import port.train.optim as O
    from port.train.trainer import Trainer
    import torch.nn.functional as F
    m = M.get("digits_cnn", seed=0)
    ref = copy.deepcopy(m)
    batches = data("digits_cnn", 4, 20)
    tr = Trainer(m, batches[0][0], optimizer=O.SGD(0.005, momentum=0.9, weight_decay=1e-4))
    opt = torch.optim.SGD(ref.parameters(), lr=0.005 * 1.01, momentum=0.9, weight_decay=1e-4)
    for x, y in batches:
        tr.step(x, y)
        opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        opt.step()
    with pytest.raises(AssertionError):
        check_weights(tr.state_dict(), ref.state_dict())


@pytest.mark.slow
def test_deep_net_gradients_match_float64():
    """One step's parameter gradients of a deep net (resnet18, frozen BN, batch 2) within a few times PyTorch
    float32's own error from float64, tensor by tensor: the guard for kernel bugs that AdamW exposes (it normalises
    every gradient element, so a small tensor with a large relative error gets lr-sized wrong updates)."""
    import torch.nn.functional as F
    from port.train.optim import AdamW
    from port.train.trainer import Trainer
    from port.ir.types import ROLE_GRADIENT, ROLE_PARAMETER
    m = _freeze_bn(M.get("resnet18", seed=0))
    x, y = data("resnet18", 2, 1)[0]
    r32, r64 = copy.deepcopy(m), copy.deepcopy(m).double()
    tr = Trainer(m, x, optimizer=AdamW(1e-4))
    ex, g = tr.executor, tr.graph
    ex.zero_grads()
    ex.input.copy_(x)
    ex.labels.copy_(y)
    ex.run_main()
    pg = {g.tensors[t.grad_of].name: ex.view(t.id).double() for t in g.tensors
          if t.role == ROLE_GRADIENT and t.grad_of is not None and g.tensors[t.grad_of].role == ROLE_PARAMETER}
    F.cross_entropy(r32(x), y).backward()
    F.cross_entropy(r64(x.double()), y).backward()
    g32 = dict(r32.named_parameters())
    for n, p in r64.named_parameters():
        ref = p.grad
        e_port = float((pg[n].reshape(ref.shape) - ref).norm() / ref.norm())
        e_torch = float((g32[n].grad.double() - ref).norm() / ref.norm())
        assert e_port <= 5 * e_torch + 1e-6, f"{n}: gradient {e_port:.2e} from float64, PyTorch float32 {e_torch:.2e}"
