"""The training graph against PyTorch's own accounting, on every zoo model."""
from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn as nn

import port
from port import models
from port.errors import PortTraceError
from port.ir.types import PHASES
from reference import flop_counts, saved_activation_bytes

# the transformers' accounting (byte for byte, with its three documented differences): tests/unit/test_graph_seq.py
ZOO = [n for n in models.names() if n not in models.TOKEN_DATA]
BATCH = 3


def _model(name, **kw):
    if name in ("mlp", "mobilenetv2"):
        kw.setdefault("dropout", 0.0)  # compared separately: PORT keeps a 1-byte mask, torch a float mask
    return models.get(name, seed=0, **kw)


def _x(name, batch=BATCH):
    return torch.randn(batch, *models.INPUT_SHAPES[name], generator=torch.Generator().manual_seed(1))


# the zoo's largest models (their families' smaller members stay: resnet50's bottlenecks, vgg11) in the full tier
ZOO_TIERED = [pytest.param(n, marks=[pytest.mark.slow] if n in ("resnet101", "vgg16") else []) for n in ZOO]


class _Graphs(dict):
    """A zoo model's graph, traced when a test first asks for it (the fast tier never traces the slow ones)."""
    def __missing__(self, name):
        self[name] = g = port.trace(_model(name), _x(name), name=name)
        return g


@pytest.fixture(scope="module")
def graphs():
    return _Graphs()


@pytest.mark.parametrize("name", ZOO_TIERED)
def test_flops_match_flopcountermode(name, graphs):
    g = graphs[name]
    fwd, bwd = flop_counts(_model(name), _x(name))
    t = g.totals()
    assert t["forward_flops"] == pytest.approx(fwd, rel=0.01)
    assert t["backward_flops"] == pytest.approx(bwd, rel=0.01)


@pytest.mark.parametrize("name", ZOO_TIERED)
def test_saved_bytes_match_autograd(name, graphs):
    g = graphs[name]
    ref = saved_activation_bytes(_model(name), _x(name))
    assert g.totals()["naive_peak_activation_bytes"] == pytest.approx(ref, rel=0.05)


def test_dropout_mask_is_one_byte_per_element():
    # torch's CPU dropout saves a float32 mask; PORT's kernels keep a uint8 mask: exactly 3 bytes/element less
    m = models.get("mlp", seed=0, dropout=0.5, hidden=(32,))
    x = _x("mlp")
    g = port.trace(m, x)
    ref = saved_activation_bytes(m, x)
    masks = [t for t in g.tensors if t.name.endswith(":mask")]
    assert len(masks) == 1 and masks[0].dtype == "uint8"
    # (autograd also saves nll_loss's 4-byte total_weight scalar)
    assert ref - g.totals()["naive_peak_activation_bytes"] - 3 * masks[0].numel in (0, 4)


@pytest.mark.parametrize("name", ZOO_TIERED)
def test_shapes_match_a_real_forward_pass(name, graphs):
    g = graphs[name]
    m = _model(name)
    seen = {}
    for path, mod in m.named_modules():
        if len(list(mod.children())) == 0 and not isinstance(mod, nn.Identity):
            mod.register_forward_hook(lambda mod, i, o, p=path: seen.__setitem__(p, tuple(o.shape)))
    logits = m(_x(name))
    fwd = {o.name: o for o in g.ops_in("forward")}
    assert seen, "no leaf modules"
    for path, shape in seen.items():
        if isinstance(m.get_submodule(path), nn.Dropout):
            pass
        assert g.tensor(fwd[path].outputs[0]).shape == shape, path
    assert g.tensor(g.logits_id).shape == tuple(logits.shape)


@pytest.mark.parametrize("name", ZOO_TIERED)
def test_graph_structure(name, graphs):
    g = graphs[name]
    m = _model(name)
    # phases in execution order
    order = [PHASES.index(o.phase) for o in g.ops]
    assert order == sorted(order)
    # every read is of a tensor written earlier or alive from the start
    written = {t.id for t in g.tensors if t.role in ("input", "label", "parameter", "buffer")}
    for o in g.ops:
        for t in o.inputs:
            assert t in written or g.tensor(t).role == "optimizer_state", (o.name, g.tensor(t).name)
        written.update(o.outputs)
    # one update per parameter tensor; one weight-gradient op per layer with parameters
    n_params = len(list(m.parameters()))
    assert len(g.ops_in("update")) == n_params
    layers_with_params = {p.rsplit(".", 1)[0] for p, _ in m.named_parameters()}
    assert {o.layer for o in g.ops if o.kind.endswith(".grad_weight")} == layers_with_params
    # every forward op with a gradient path has an input-gradient op, except the first layer's
    grad_in = {o.forward_op for o in g.ops if o.kind.endswith(".grad_input")}
    first = g.ops_in("forward")[0]
    assert first.id not in grad_in
    assert all(o.id in grad_in for o in g.ops_in("forward")[1:]), "missing grad_input"
    # each gradient tensor written once
    prods = [t for o in g.ops if o.phase == "backward" for t in o.outputs]
    assert len(prods) == len(set(prods))
    # optimizer state: momentum = one buffer per parameter
    assert g.totals()["optimizer_bytes"] == g.totals()["param_bytes"]


def test_op_counts_resnet18(graphs):
    g = graphs["resnet18"]
    kinds = [o.kind for o in g.ops_in("forward")]
    assert kinds.count("conv2d") == 20 and kinds.count("batch_norm2d") == 20
    assert kinds.count("relu") == 17 and kinds.count("add") == 8 and kinds.count("linear") == 1
    assert len(g.ops_in("update")) == 62
    assert sum(1 for o in g.ops if o.kind == "grad_accumulate") == 8  # one per residual fork


def test_identical_layers_share_a_signature(graphs):
    g = graphs["resnet18"]
    a, b = g.op("layer1.0.conv1"), g.op("layer1.1.conv1")
    assert g.signature(a) == g.signature(b)
    assert g.signature(a) != g.signature(g.op("layer2.0.conv1"))


def test_graph_is_immutable_and_deterministic(graphs):
    g = graphs["resnet8"]
    with pytest.raises(Exception):
        g.ops[0].name = "x"  # frozen
    again = port.trace(_model("resnet8"), _x("resnet8"), name="resnet8")
    assert again.digest() == g.digest()


@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2"])
def test_memoized_graph_facts_equal_a_fresh_computation(name, graphs):
    """Graph.memo keeps facts the planner asks for thousands of times (storage roots, signatures, in-place
    legality, early-update rules); each must equal its computation on a graph that has cached nothing."""
    from port.errors import PlanError
    from port.plan import semantics as S
    from port.plan import variants as V
    g = graphs[name]
    from port.ir.types import Graph
    fresh = Graph.from_dict(g.to_dict())
    assert not fresh._index
    for _ in range(2):                          # the second round answers from the memo
        for t in g.tensors:
            assert g.storage_root(t.id) == g._root_of(t.id)
        for o in g.ops:
            assert g.signature(o) == g._signature(o) == g.signature(o.id)
            assert V.inplace_legal(g, o) == V._inplace_legal(g, o)
            if o.phase == "update":
                try:
                    want = S._early_update_checked(g, o.id)
                except PlanError as e:
                    with pytest.raises(PlanError, match=re.escape(str(e))):
                        S.early_update_info(g, o.id)
                else:
                    assert S.early_update_info(g, o.id) == want
        assert V.inplace_conflicts(g) == V._inplace_conflicts(g)
    assert S.coupled_variants(g) == S.coupled_variants(fresh) and V.inplace_conflicts(fresh) == V.inplace_conflicts(g)


def test_optimizer_state_sizes():
    m, x = _model("mlp"), _x("mlp")
    p = port.trace(m, x, optimizer="sgd").totals()
    a = port.trace(m, x, optimizer="adamw").totals()
    assert p["optimizer_bytes"] == 0 and a["optimizer_bytes"] == 2 * a["param_bytes"]


# ---- sparse update: frozen layers ------------------------------------------------------------
def test_frozen_layers_are_pruned():
    m, x = _model("resnet8"), _x("resnet8")
    full = port.trace(m, x)
    g = port.trace(m, x, trainable=["layer3", "fc"])
    trained = {g.tensor(t).name for o in g.ops_in("update") for t in o.inputs[:1]}
    assert trained and all(n.startswith(("layer3.", "fc.")) for n in trained)
    assert all(o.layer.startswith(("layer3", "fc")) for o in g.ops if o.kind.endswith(".grad_weight"))
    # no gradient flows into layers before layer3: nothing there needs one
    assert not any(o.layer.startswith(("layer1", "layer2", "conv1", "bn1")) for o in g.ops if o.phase == "backward")
    # activations needed only by pruned weight gradients are not saved
    t, tf = g.totals(), full.totals()
    assert t["naive_peak_activation_bytes"] < 0.5 * tf["naive_peak_activation_bytes"]
    assert t["grad_bytes"] < tf["grad_bytes"] and t["param_bytes"] == tf["param_bytes"]


def test_only_classifier_trainable_saves_only_its_input():
    m, x = _model("resnet8"), _x("resnet8")
    g = port.trace(m, x, trainable=["fc"])
    roots = [g.tensor(r) for r in g.saved_activation_roots()]
    names = sorted(r.name for r in roots)
    # the fc input (a view of the pooled features), the loss's probabilities and labels
    assert names == ["labels", "loss:probs", "pool:out"]


def test_requires_grad_false_freezes_and_frozen_bn_uses_running_stats():
    m, x = _model("digits_cnn"), _x("digits_cnn")
    for mod in list(m.modules())[:7]:
        if isinstance(mod, nn.BatchNorm2d):
            mod.eval()
        for p in mod.parameters(recurse=False):
            p.requires_grad_(False)
    g = port.trace(m, x)
    bn0 = g.op("1")
    assert bn0.attr("training") is False and len(bn0.outputs) == 1  # no batch statistics
    assert not any(o.layer in ("0", "1", "3", "4") for o in g.ops if o.kind.endswith(".grad_weight"))
    assert g.op("8").attr("training") is True


# ---- clear errors ----------------------------------------------------------------------------
class _Softplus(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.Softplus())
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.body(x))


class _Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return -self.fc(x)


class _Erf(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4))
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(torch.erf(self.inner(x)))


def test_ops_without_a_kind_run_as_torch_ops_named_by_module_path():
    """An op PORT has no kind for is still captured: a torch_op (PyTorch's kernel and derivative), named by its
    module path like every op, with its gradient ops."""
    g = port.trace(_Softplus(), torch.randn(2, 4))
    sp = g.op("body.1")
    assert sp.kind == "torch_op" and "aten.softplus.default" in sp.attr("call")
    assert any(o.kind == "torch_op.grad_input" and o.forward_op == sp.id for o in g.ops)
    g = port.trace(_Erf(), torch.randn(2, 4))
    erf = [o for o in g.ops if o.kind == "torch_op"]
    assert len(erf) == 1 and "aten.erf.default" in erf[0].attr("call") and erf[0].layer == ""


class _ErfMean(nn.Module):
    """erf: a torch_op; a mean over dims 1 and 3 of a 4-d tensor (reduce_mean): a record with a torch binding
    only."""
    def __init__(self):
        super().__init__()
        self.a, self.fc = nn.Linear(12, 12), nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(torch.erf(self.a(x)).reshape(-1, 2, 3, 2).mean((1, 3)))


def test_inspect_marks_ops_without_c_kernels_and_compile_refuses_them_by_name(monkeypatch, tmp_path, capsys):
    """`port inspect` marks every forward op without a C kernel (torch_ops by their aten op, torch-only records by
    kind: it marked torch_ops alone), and `port compile` refuses a graph with them, naming the ops and kernels."""
    from types import SimpleNamespace
    from pathlib import Path
    from port.cli.inspect import graph_report, print_report
    from port.pipeline import compile as PC
    g = port.trace(_ErfMean(), torch.randn(4, 12))
    rep = graph_report(g)
    marked = {o["no_c_kernel"] for o in rep["ops"] if o.get("no_c_kernel")}
    assert marked == {"aten.erf.default", "reduce_mean"}, marked
    monkeypatch.setenv("COLUMNS", "200")     # rich's table: one line per op
    print_report(rep, "erf", "")
    out = capsys.readouterr().out
    assert "[torch]: 2 forward op(s) have no C kernel" in out and "aten.erf.default, reduce_mean" in out
    assert "torch_op (aten.erf.default) [torch]" in out and "reduce_mean [torch]" in out
    monkeypatch.setattr(PC, "build_graph", lambda job: SimpleNamespace(graph=g))
    with pytest.raises(port.errors.PortError) as e:
        PC.compile_bundle(Path(__file__).resolve().parents[2] / "configs" / "mlp.yaml", tmp_path)
    assert "2 op(s)" in str(e.value) and "Missing C kernels: aten.erf.default, reduce_mean" in str(e.value)


class _Einsum(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.fc = nn.Linear(6, 10), nn.Linear(2, 3)

    def forward(self, x):      # i summed within one operand: not a matrix product, a torch_op (port/ops/attention.py)
        h = self.a(x).view(-1, 2, 5)
        return self.fc(torch.einsum("bij,bkj->bk", h, h))


def test_torch_op_flops_come_from_flopcountermode():
    """A torch_op's FLOPs are torch's FlopCounterMode count of its aten call (this einsum: i summed, then a batched
    matmul), its backward twice that."""
    from torch.utils.flop_counter import FlopCounterMode
    g = port.trace(_Einsum(), torch.randn(3, 6))
    e = next(o for o in g.ops if o.kind == "torch_op" and "einsum" in o.attr("call"))
    h = torch.randn(3, 2, 5)
    with FlopCounterMode(display=False) as fc:
        torch.einsum("bij,bkj->bk", h, h)
    assert e.flops == fc.get_total_flops() == 2 * 3 * 1 * 2 * 5
    assert sum(o.flops for o in g.ops if o.forward_op == e.id) == 2 * e.flops


def test_data_dependent_control_flow_is_a_clear_error():
    with pytest.raises(PortTraceError) as e:
        port.trace(_Branchy(), torch.randn(2, 4))
    msg = str(e.value)
    assert "control flow" in msg and "_Branchy" in msg and "Traceback" not in msg
    assert "at module path '<root>'" in msg and f"{__file__}:" in msg and "Fix:" in msg
    with pytest.raises(PortTraceError, match=r"at module path '1\.1'"):      # named by its module's path
        port.trace(nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), _Branchy())), torch.randn(2, 4))


class _MaskIndex(nn.Module):
    """x[mask]: a result whose shape depends on the data (torch.export records it with an unbacked size)."""
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = self.a(x)
        return self.b(h[h.sum(1) > 0])


def test_data_dependent_shape_is_a_clear_error():
    """Refused at capture with the user's line, the module path and what to do (it was an InternalError from
    inside PORT: the graph builder met the unbacked size)."""
    with pytest.raises(PortTraceError) as e:
        port.trace(_MaskIndex(), torch.randn(2, 6))
    msg = str(e.value)
    assert "shape depends on the data" in msg and "Fix:" in msg and "x[mask]" in msg
    assert f"{__file__}:" in msg and "h[h.sum(1) > 0]" in msg and "module path '<root>'" in msg


class _Zeta(nn.Module):
    """torch.special.zeta(x, q): PyTorch has no derivative for x, one for q. mode: the gradient passes through x
    ("x"), through nothing ("detached") or through q alone ("q")."""
    def __init__(self, mode: str):
        super().__init__()
        self.mode = mode
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = self.a(x).abs() + 2
        if self.mode == "q":
            return self.b(torch.special.zeta(torch.full_like(h, 3.0), h))
        return self.b(torch.special.zeta(h.detach() if self.mode == "detached" else h, 3.0))


def test_op_without_a_derivative_is_refused_only_where_a_gradient_must_pass():
    """An op PyTorch cannot differentiate is refused at capture, naming it, the user's line and what to do, when the
    loss needs a gradient through an operand it has no derivative for (eager's backward would raise; PORT raised a
    bare NotImplementedError inside its first step); through no operand or only through one it can
    differentiate by, the model trains like eager."""
    with pytest.raises(PortTraceError) as e:
        port.trace(_Zeta("x"), torch.randn(2, 6))
    msg = str(e.value)
    assert "'aten.special_zeta.other_scalar' has no derivative" in msg and "Fix:" in msg and f"{__file__}:" in msg
    for mode in ("detached", "q"):
        torch.manual_seed(0)
        m = _Zeta(mode)
        ref = copy.deepcopy(m)
        x, y = torch.randn(2, 6), torch.tensor([0, 2])
        tr = port.Trainer(m, x, optimizer=port.optim.SGD(0.1))
        assert any(o.kind == "torch_op" for o in tr.graph.ops)
        assert any(o.kind == "torch_op.grad_input" for o in tr.graph.ops) == (mode == "q")
        opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for _ in range(2):
            lp = tr.step(x, y)
            opt.zero_grad()
            lt = torch.nn.functional.cross_entropy(ref(x), y)
            lt.backward()
            opt.step()
            assert abs(lp - lt.item()) <= 1e-5 * abs(lt.item()) + 1e-6, (mode, lp, lt.item())


_USER_NET = """
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        if x.sum() > 0:   # the user's line
            return self.fc(x)
        return -self.fc(x)
"""


def test_errors_name_the_users_line_in_a_checkout_named_port(tmp_path, monkeypatch):
    """README's layout: the user's code and a venv inside a checkout named ``port``. Frames are skipped as PORT's
    own by the package's path, not by '/port/' in the path: the user's file and a library inside that venv are
    still named."""
    from port.ir import capture as C
    root = tmp_path / "port"
    (root / "examples").mkdir(parents=True)
    (root / "examples" / "user_net_a52.py").write_text(_USER_NET)
    monkeypatch.syspath_prepend(str(root / "examples"))
    import user_net_a52
    with pytest.raises(PortTraceError) as e:
        port.trace(user_net_a52.Net(), torch.randn(2, 4))
    assert f"{root / 'examples' / 'user_net_a52.py'}:11" in str(e.value), str(e.value)
    lib = root / ".venv" / "lib" / "python3.11" / "site-packages" / "transformers" / "modeling_x.py"
    assert not C._is_library_file(str(lib)) and not C._is_library_file(str(root / "port.py"))
    assert C._is_library_file(C.__file__) and C._is_library_file(port.__file__)
    assert C._is_library_file(torch.__file__)


class _Mismatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.c, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(5, 3)

    def forward(self, x):
        return self.fc(self.c(x).mean((2, 3)))        # 4 channels into a Linear(5, ...): the model's own bug


def test_a_model_that_fails_in_eager_is_named_as_such_without_tracebacks(capfd):
    """A forward that raises in PyTorch itself (a size mismatch, a wrong input) is reported as the model's error:
    the module, the user's line, the input shapes and what to do, not as code torch.export cannot capture with a
    data-dependence fix; and torch's fake-tensor logger prints no traceback of the failing meta kernel."""
    with pytest.raises(PortTraceError) as e:
        port.trace(_Mismatch(), torch.randn(2, 3, 6, 6))
    msg = str(e.value)
    assert "raises on the example input in PyTorch itself at module path 'fc'" in msg, msg
    assert f"{__file__}:" in msg and "[(2, 3, 6, 6)]" in msg and "Fix:" in msg and "depend" not in msg
    with pytest.raises(PortTraceError, match="at module path 'c'"):
        port.trace(_Mismatch(), torch.randn(2, 5, 6, 6))
    err = capfd.readouterr().err
    assert "Traceback" not in err and "failed while attempting to run meta" not in err, err[-2000:]


def test_bad_logits_shape():
    with pytest.raises(PortTraceError, match=r"logits \[N, classes\]"):
        port.trace(nn.Sequential(nn.Conv2d(1, 2, 3)), torch.randn(2, 1, 5, 5))
