"""Capture-time constant folding (port.ir.fold): tensors a model builds from its buffers and shapes alone
(position ids, causal masks, rotary tables, token-type rows) become buffers of the graph, computed once when a
Trainer loads the model; the ops that made them are gone, the rest trains like eager."""
from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn as nn

import port
from port.ir import fold as F
from port.ir.capture import torch_ops
from port.ir.types import Graph
from port.train.optim import SGD

T, V, D = 7, 11, 8


class _Causal(nn.Module):
    """A decoder's input-independent tensors, each made in forward() the ways real models make them: position
    ids (arange, unsqueeze, expand over the batch), a token-type row (a registered buffer expanded), a causal
    additive mask (ones / tril / where / float min), a rotary table (an ``inv_freq`` buffer, outer product,
    cos and sin) and a plain float ``new_ones`` of an activation's shape."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Embedding(T, D)
        self.typ = nn.Embedding(2, D)
        self.register_buffer("token_type_ids", torch.zeros(1, T, dtype=torch.long), persistent=False)
        self.register_buffer("inv_freq", 1.0 / (100.0 ** (torch.arange(0, D, 2).float() / D)), persistent=False)
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.head = nn.Linear(D, 3)

    def forward(self, ids):
        b, t = ids.shape
        pos = torch.arange(t, device=ids.device).unsqueeze(0).expand(b, t)
        typ = self.token_type_ids[:, :t].expand(b, t)
        h = self.tok(ids) + self.pos(pos) + self.typ(typ)
        f = torch.outer(torch.arange(t, dtype=torch.float32, device=ids.device), self.inv_freq)
        cos, sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()
        q, k = self.q(h), self.k(h)
        q = q * cos + torch.cat([-q[..., D // 2:], q[..., :D // 2]], -1) * sin
        k = k * cos + torch.cat([-k[..., D // 2:], k[..., :D // 2]], -1) * sin
        keep = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        mask = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
        a = torch.softmax(q @ k.transpose(1, 2) / D ** 0.5 + mask, -1)
        h = h + a @ self.v(h) * h.new_ones(h.shape)
        return self.head(h.mean(1))


def _batch(n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (n, T), generator=g), torch.randint(0, 3, (n,), generator=g)


def test_input_independent_tensors_are_folded_into_buffers_and_train_like_eager():
    model = _Causal()
    ref = copy.deepcopy(model)
    x, y = _batch()
    tr = port.Trainer(model, x, optimizer=SGD(0.1))
    g = tr.graph
    names = [k for k, _ in g.constants]
    assert names and all(F.is_folded(k) for k in names), names
    assert torch_ops(g) == [], torch_ops(g)                 # arange, tril, where, outer, cos... are gone
    kinds = {o.kind for o in g.ops}
    assert "torch_op" not in kinds and not any("arange" in o.name for o in g.ops), kinds
    held = {t.name: t for t in g.tensors if F.is_folded(t.name)}
    assert set(held) == set(names) and all(t.role == "buffer" for t in held.values())
    # the two bool/int64 tables keep their dtypes; the float ones are float32
    assert {t.dtype for t in held.values()} <= {"float32", "int64", "bool"}, {t.dtype for t in held.values()}
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for s in range(4):
        xb, yb = _batch(seed=s + 2)
        got = float(tr.step(xb, yb))
        opt.zero_grad()
        want = nn.functional.cross_entropy(ref(xb), yb)
        want.backward()
        opt.step()
        assert abs(got - want.item()) < 1e-5, (s, got, want.item())
    # folded constants are not the model's state: a strict load into a fresh model works
    sd = tr.state_dict()
    assert not any(F.is_folded(k) for k in sd)
    fresh = _Causal()
    fresh.load_state_dict(sd, strict=False)
    assert set(sd) == set(dict(fresh.named_parameters()))


def test_folded_values_equal_the_models_own_and_names_hash_the_recipe():
    model = _Causal()
    x, _ = _batch()
    g = port.trace(model, x)
    again = port.trace(_Causal(), x)
    assert [k for k, _ in g.constants] == [k for k, _ in again.constants]     # one recipe, one name
    assert Graph.from_dict(json.loads(json.dumps(g.to_dict()))) == g         # the recipes travel with the graph
    values = F.model_constants(g.constants, model)
    by_shape = {tuple(v.shape): v for v in values.values()}
    mask = by_shape.get((T, T))
    assert mask is not None and mask.dtype == torch.float32, {k: (v.shape, v.dtype) for k, v in values.items()}
    want = torch.where(torch.ones(T, T, dtype=torch.bool).tril(), 0.0, torch.finfo(torch.float32).min)
    assert torch.equal(mask, want)
    # a recipe run on buffers other than the captured ones says so
    name, recipe = next((k, r) for k, r in g.constants if "inv_freq" in r)
    with pytest.raises(F.FoldError, match="trace again"):
        F.evaluate(recipe, lambda b: torch.zeros(3) if b == "inv_freq" else dict(model.named_buffers())[b])


class _NotConstant(nn.Module):
    """What must not fold: batch norm's running statistics (written by the op), a parameter's function, a
    random draw."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.bn = nn.BatchNorm1d(5)
        self.w = nn.Parameter(torch.randn(5))
        self.fc = nn.Linear(5, 3)

    def forward(self, x):
        noise = torch.rand(5, device=x.device) * 0          # a random op: never folded (re-drawn every call)
        return self.fc(self.bn(x) * self.w.exp() + noise)


def test_running_statistics_parameters_and_random_draws_are_not_folded():
    g = port.trace(_NotConstant(), torch.randn(4, 5))
    held = [t.name for t in g.tensors if F.is_folded(t.name)]
    assert all("rand" not in r and "running" not in r for _, r in g.constants), g.constants
    assert any(t.name.endswith("running_mean") for t in g.tensors)
    assert any("exp" in o.name for o in g.ops if o.phase == "forward"), [o.name for o in g.ops]
    assert any("rand" in a for _, a in torch_ops(g)), torch_ops(g)
    assert len(held) == len(g.constants)


class _BigMask(nn.Module):
    def __init__(self, t, copy=True):
        super().__init__()
        self.t, self.copy = t, copy
        self.fc = nn.Linear(t, 3)

    def forward(self, x):                                # x [N, t, t]
        m = torch.ones(self.t, self.t, device=x.device).tril()[None].expand(x.shape[0], self.t, self.t)
        h = torch.cat([x * m, m], 1) if self.copy else x * m      # (cat reads the expanded bytes: a copy)
        return self.fc(h.mean(1))


def test_a_large_constant_expand_stays_an_op_and_its_operand_is_held(monkeypatch):
    monkeypatch.setenv("PORT_CAPTURE", "inprocess")
    monkeypatch.setattr(F, "EXPAND_HOLD_BYTES", 1024)
    x = torch.randn(4, 16, 16)                           # the expanded mask: 4 KiB > 1 KiB
    g = port.trace(_BigMask(16), x)
    held = [t for t in g.tensors if F.is_folded(t.name)]
    assert [list(t.shape) for t in held] == [[1, 16, 16]], [(t.name, t.shape) for t in held]
    assert any(o.kind == "expand" for o in g.ops), [o.kind for o in g.ops]
    small = port.trace(_BigMask(8), torch.randn(4, 8, 8))     # 1 KiB: held expanded, no expand op
    assert [list(t.shape) for t in small.tensors if F.is_folded(t.name)] == [[4, 8, 8]]
    assert not any(o.kind == "expand" for o in small.ops)
    g = port.trace(_BigMask(16, copy=False), x)          # mul alone reads it: mul broadcasts the held [1, 16, 16]
    mul = next(o for o in g.ops if o.kind == "mul")
    assert not any(o.kind == "expand" for o in g.ops) and [g.tensors[t].shape for t in mul.inputs] == [
        (4, 16, 16), (1, 16, 16)], [o.kind for o in g.ops]


class _DropPath(nn.Module):
    """Stochastic depth as torchvision writes it: an ``empty`` tensor of the batch's shape filled in place by
    ``bernoulli_``: the empty tensor has no values to fold (holding it would put uninitialised bytes in the
    arena), the draw is an op."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        keep = torch.empty(x.shape[0], 1, device=x.device).bernoulli_(0.7).div_(0.7)
        return self.fc(x) * keep + x


def test_an_empty_tensor_a_random_op_fills_is_not_folded():
    g = port.trace(_DropPath(), torch.randn(4, 5))
    assert g.constants == () and "bernoulli" in {o.kind for o in g.ops}, (g.constants, [o.kind for o in g.ops])


def test_a_cached_capture_survives_its_batch_filling_the_cache(monkeypatch):
    """trace_many takes the cached graphs before it stores the batch's new captures: with a full cache, a job
    that hit it is not evicted by its neighbour's capture before it is read (a KeyError once the suite's
    in-process CLI runs filled the 32 entries)."""
    import port.ir.trace as T
    monkeypatch.setattr(T, "CACHE_ENTRIES", 1)
    monkeypatch.setattr(T, "_CACHE", type(T._CACHE)())
    a, b = _NotConstant(), _DropPath()
    x = torch.randn(4, 5)
    first = T.trace(a, x)
    got = T.trace_many([dict(model=a, example_input=x), dict(model=b, example_input=x)])
    assert got[0] == first and len(T._CACHE) == 1


def test_modules_holding_plain_data_dicts_are_captured_once(monkeypatch):
    """A module attribute that is a dict or list of plain data (timm's pretrained_cfg, Hugging Face's tied-weight
    keys) is part of the capture key by its JSON text (issue 52): the second capture of such a model is the cached
    one (it used to make the key None: a Trainer after port.trace captured every timm and HF model again); a
    different value is another key, and an attribute the key cannot describe still disables the cache."""
    import port.ir.trace as T
    monkeypatch.setattr(T, "_CACHE", type(T._CACHE)())
    m = _NotConstant()
    m.cfg = {"url": "", "input_size": (3, 8, 8), "mean": [0.5, 0.5, 0.5]}
    x = torch.randn(4, 5)
    key = T.capture_key(m, x, ())
    assert key is not None and T.capture_key(m, x, ()) == key
    T.trace(m, x)
    monkeypatch.setattr(T, "_in_child", lambda *a, **k: pytest.fail("captured again"))
    T.trace(m, x)
    m.cfg["input_size"] = (3, 9, 9)
    assert T.capture_key(m, x, ()) not in (None, key)
    m.cfg["obj"] = object()
    assert T.capture_key(m, x, ()) is None


def test_zoo_models_reuse_their_capture_and_a_zero_scale_is_captured_again(monkeypatch):
    """Two models.get("resnet8") are one class (port.models._classes): the second capture is the cached one (every
    factory call made a new class, whose id the key names: no zoo CNN's capture was ever reused). A batch norm
    scale zeroed since (gamma_has_zero, read at capture) is another key: captured again, not taken stale."""
    import port.ir.trace as T
    from port import models
    monkeypatch.setattr(T, "_CACHE", type(T._CACHE)())
    x = torch.randn(2, *models.INPUT_SHAPES["resnet8"])
    g = T.trace(models.get("resnet8", seed=0), x)
    assert not any(o.attr("gamma_has_zero") for o in g.ops if o.kind == "batch_norm2d")
    real = T._in_child
    monkeypatch.setattr(T, "_in_child", lambda *a, **k: pytest.fail("captured again"))
    assert T.trace(models.get("resnet8", seed=1), x) == g
    m = models.get("resnet8", seed=0)
    with torch.no_grad():
        m.layer1[0].bn2.weight[3] = 0.0
    monkeypatch.setattr(T, "_in_child", real)
    z = T.trace(m, x)
    assert [o.name for o in z.ops if o.kind == "batch_norm2d" and o.attr("gamma_has_zero")] != []
