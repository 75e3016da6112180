"""Published models nobody here wrote, built from their constructors (random init: nothing is downloaded), and
the equality check of training them under PORT against PyTorch eager. Used by bench/coverage.py (the whole
list) and tests/e2e/test_published.py (a quick subset).

    MODELS: {name: Spec}     build() -> (model, example input, labels); every model returns logits [N, K] or
                             [N, T, vocab] (token models: labels [N, T]; a UNet: [N, H*W, K] per pixel)
    compare(spec, steps=3)   -> Row: captured, ops on C / on torch, losses of PORT, eager float32 and float64,
                                equal (the issue's rule), step ms of both, set-up seconds, the plan's arena and eager's measured
                                process growth (a warm float32 run, its model copy to its last step: VmHWM reset)

torchvision, timm and transformers come from the ``zoo`` extra (``pip install -e '.[zoo]'``). PyPI's
torchvision for Linux is a CUDA build whose C extension does not load against the CPU torch; ``import_zoo()``
defines the two op schemas it registers fakes for (``torchvision::nms``/``qnms``, used by no classification
model) before importing it.

Dropout and stochastic depth are set to 0 in both runs (``deterministic``): PORT draws its masks from its own
per-call seeds, so with them on the two runs see other masks and no loss can be compared.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

_ZOO: dict = {}
ZOO_NAMES = ("torchvision", "timm", "transformers", "peft")
_TRIED: set = set()


def import_zoo(names: tuple[str, ...] = ZOO_NAMES) -> dict:
    """{"torchvision", "timm", "transformers", "peft"} modules that import here (absent ones left out); ``names``:
    only these (a worker that builds one model imports its own zoo: transformers alone is ~2 s of CPU)."""
    import torch
    if "_lib" not in _ZOO:
        try:
            torch.ops.torchvision.nms          # noqa: B018 - a working torchvision already registered it
            _ZOO["_lib"] = None
        except (AttributeError, RuntimeError):
            lib = torch.library.Library("torchvision", "DEF")   # kept alive in _ZOO
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
            _ZOO["_lib"] = lib
    for name in names:
        if name in _TRIED:
            continue
        _TRIED.add(name)
        try:
            _ZOO[name] = __import__(name)
        except Exception:  # noqa: BLE001 - not installed, or an import that fails here
            pass
    return _ZOO


def zoo_of(family: str) -> tuple[str, ...]:
    """The zoo packages a model of ``family`` (a Spec's) is built from."""
    return {"torchvision": ("torchvision",), "timm": ("timm",), "transformers": ("transformers",),
            "peft": ("transformers", "peft")}.get(family, ())


@dataclass(frozen=True)
class Spec:
    name: str
    family: str                     # torchvision | timm | transformers | peft | hand-written
    build: Callable[[], Any]        # -> nn.Module (seeded inside)
    input_shape: tuple[int, ...]    # per sample
    tokens: int = 0                 # > 0: int64 token ids in [0, tokens)
    classes: int = 10
    label_shape: tuple[int, ...] = ()   # per sample: () for [N, K] logits, (T,) for token/pixel logits
    batch: int = 4
    quick: bool = False             # in the test suite's quick subset
    mask: bool = False              # token models: called with input_ids and an attention_mask (keywords)


def _seed():
    import torch
    torch.manual_seed(0)


def _tv(name: str, **kw):
    def build():
        _seed()
        tv = import_zoo(("torchvision",))["torchvision"]
        return getattr(tv.models, name)(weights=None, num_classes=10, **kw)
    return build


def _timm(name: str, **kw):
    def build():
        _seed()
        return import_zoo(("timm",))["timm"].create_model(name, pretrained=False, num_classes=10, **kw)
    return build


def _hf(config_cls: str, model_cls: str, peft_targets: tuple[str, ...] = (), **cfg):
    def build():
        _seed()
        tr = import_zoo(("transformers",))["transformers"]
        c = getattr(tr, config_cls)(**cfg)
        for k in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
                  "resid_pdrop", "embd_pdrop", "attn_pdrop", "seq_classif_dropout", "classifier_dropout"):
            if hasattr(c, k) and isinstance(getattr(c, k), float):
                setattr(c, k, 0.0)
        m = getattr(tr, model_cls)(c)
        if peft_targets:
            pf = import_zoo(("peft",))["peft"]
            m = pf.get_peft_model(m, pf.LoraConfig(r=4, lora_alpha=8, target_modules=list(peft_targets),
                                                   lora_dropout=0.0))
        return m          # returns its ModelOutput as is: PORT takes ``.logits``
    return build


def _nn():
    import torch.nn as nn
    return nn


# ---- hand-written nets (the idioms published code uses) -------------------------------------------------
def _se_net():
    nn = _nn()
    import torch

    class SE(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.fc1, self.fc2 = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

        def forward(self, x):
            g = torch.sigmoid(self.fc2(torch.relu(self.fc1(x.mean((2, 3), keepdim=True)))))
            return x * g

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.SiLU())
            self.se = SE(16)
            self.branch_a = nn.Conv2d(16, 8, 1)
            self.branch_b = nn.Conv2d(16, 8, 3, padding=1)
            self.head = nn.Linear(16, 10)

        def forward(self, x):
            h = self.se(self.stem(x))
            h = torch.cat([self.branch_a(h), self.branch_b(h)], 1)
            return self.head(h.mean([2, 3]))
    _seed()
    return Net()


def _unet():
    nn = _nn()
    import torch
    import torch.nn.functional as F

    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())

    class UNet(nn.Module):
        """Two levels, skip connections by ``torch.cat``, bilinear upsampling; per-pixel logits [N, H*W, K]."""
        def __init__(self, k=4):
            super().__init__()
            self.d1, self.d2, self.mid = block(3, 8), block(8, 16), block(16, 16)
            self.u2, self.u1 = block(32, 8), block(16, 8)
            self.out = nn.Conv2d(8, k, 1)

        def forward(self, x):
            a = self.d1(x)
            b = self.d2(F.max_pool2d(a, 2))
            m = self.mid(F.max_pool2d(b, 2))
            b2 = self.u2(torch.cat([F.interpolate(m, scale_factor=2, mode="bilinear", align_corners=False), b], 1))
            a2 = self.u1(torch.cat([F.interpolate(b2, scale_factor=2, mode="nearest"), a], 1))
            y = self.out(a2)
            n, k, h, w = y.shape
            return y.permute(0, 2, 3, 1).reshape(n, h * w, k)
    _seed()
    return UNet()


def _nanogpt():
    nn = _nn()
    import torch
    import torch.nn.functional as F

    class CausalSelfAttention(nn.Module):
        def __init__(self, d, h, t):
            super().__init__()
            self.c_attn, self.c_proj, self.h = nn.Linear(d, 3 * d), nn.Linear(d, d), h
            self.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(C, dim=2)
            q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
            k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
            v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)

    class Block(nn.Module):
        def __init__(self, d, h, t):
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d), CausalSelfAttention(d, h, t), nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self, v=64, d=32, h=4, t=32, n=2):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(v, d), nn.Embedding(t, d)
            self.h = nn.ModuleList(Block(d, h, t) for _ in range(n))
            self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, v, bias=False)
            self.wte.weight = self.lm_head.weight

        def forward(self, idx, targets=None):
            b, t = idx.size()
            x = self.wte(idx) + self.wpe(torch.arange(0, t, dtype=torch.long, device=idx.device))
            for blk in self.h:
                x = blk(x)
            return self.lm_head(self.ln_f(x))
    _seed()
    return GPT()


_LLAMA = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
_BERT = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=64, num_labels=10)
_GPT2 = dict(vocab_size=128, n_embd=32, n_layer=2, n_head=2, n_positions=64, num_labels=10, pad_token_id=0)
_DBERT = dict(vocab_size=128, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64,
              num_labels=10)

IMG = (3, 32, 32)
# the test suite's quick CNNs at 64x64, batch 8: at batch 4 on 32x32 inputs batch norm over a handful of values makes
# float32 training chaotic (eager float32 lands 0.1 from float64 within 3 steps), and a test must not fail by chance
IMG64 = (3, 64, 64)
MODELS: dict[str, Spec] = {s.name: s for s in [
    # torchvision classification: every family, at the smallest input it accepts
    Spec("tv.resnet18", "torchvision", _tv("resnet18"), IMG64, batch=8, quick=True),
    Spec("tv.resnet50", "torchvision", _tv("resnet50"), IMG64, batch=8),
    Spec("tv.resnext50_32x4d", "torchvision", _tv("resnext50_32x4d"), IMG64, batch=8),
    Spec("tv.wide_resnet50_2", "torchvision", _tv("wide_resnet50_2"), IMG64, batch=8),
    Spec("tv.vgg11_bn", "torchvision", _tv("vgg11_bn", dropout=0.0), IMG),
    Spec("tv.alexnet", "torchvision", _tv("alexnet", dropout=0.0), (3, 64, 64)),
    Spec("tv.squeezenet1_1", "torchvision", _tv("squeezenet1_1", dropout=0.0), IMG),
    Spec("tv.densenet121", "torchvision", _tv("densenet121"), IMG64, batch=8),
    Spec("tv.shufflenet_v2_x0_5", "torchvision", _tv("shufflenet_v2_x0_5"), IMG64, batch=8, quick=True),
    Spec("tv.mobilenet_v2", "torchvision", _tv("mobilenet_v2", dropout=0.0), IMG64, batch=8),
    Spec("tv.mobilenet_v3_small", "torchvision", _tv("mobilenet_v3_small", dropout=0.0), IMG64, batch=8,
         quick=True),
    Spec("tv.mobilenet_v3_large", "torchvision", _tv("mobilenet_v3_large", dropout=0.0), IMG),
    Spec("tv.mnasnet0_5", "torchvision", _tv("mnasnet0_5", dropout=0.0), IMG64, batch=8),
    Spec("tv.efficientnet_b0", "torchvision", _tv("efficientnet_b0", dropout=0.0, stochastic_depth_prob=0.0), IMG64, batch=8),
    Spec("tv.efficientnet_v2_s", "torchvision", _tv("efficientnet_v2_s", dropout=0.0, stochastic_depth_prob=0.0),
         IMG64, batch=8),
    Spec("tv.regnet_y_400mf", "torchvision", _tv("regnet_y_400mf"), IMG64, batch=8),
    Spec("tv.regnet_x_400mf", "torchvision", _tv("regnet_x_400mf"), IMG),
    Spec("tv.convnext_tiny", "torchvision", _tv("convnext_tiny", stochastic_depth_prob=0.0), IMG),
    Spec("tv.googlenet", "torchvision", _tv("googlenet", aux_logits=False, init_weights=True, dropout=0.0), IMG64, batch=8),
    Spec("tv.inception_v3", "torchvision", _tv("inception_v3", aux_logits=False, init_weights=True, dropout=0.0),
         (3, 75, 75)),
    Spec("tv.vit_b_16", "torchvision", _tv("vit_b_16", image_size=32), IMG),
    Spec("tv.swin_t", "torchvision", _tv("swin_t"), (3, 64, 64)),
    # MaxViT's 7x7 block and grid partitions at stride 32: 224x224 is the smallest input it accepts
    Spec("tv.maxvit_t", "torchvision", _tv("maxvit_t"), (3, 224, 224)),
    # timm's mobile and ViT families
    Spec("timm.mobilenetv3_small_050", "timm", _timm("mobilenetv3_small_050"), IMG64, batch=8, quick=True),
    Spec("timm.efficientnet_b0", "timm", _timm("efficientnet_b0"), IMG),
    Spec("timm.mixnet_s", "timm", _timm("mixnet_s"), IMG64, batch=8),
    Spec("timm.lcnet_050", "timm", _timm("lcnet_050"), IMG64, batch=8),
    Spec("timm.ghostnet_050", "timm", _timm("ghostnet_050"), IMG64, batch=8),
    Spec("timm.regnetx_002", "timm", _timm("regnetx_002"), IMG),
    Spec("timm.convnext_atto", "timm", _timm("convnext_atto"), IMG),
    Spec("timm.vit_tiny_patch16_224", "timm", _timm("vit_tiny_patch16_224", img_size=32), IMG, quick=True),
    Spec("timm.deit_tiny_patch16_224", "timm", _timm("deit_tiny_patch16_224", img_size=32), IMG),
    Spec("timm.mobilevit_xxs", "timm", _timm("mobilevit_xxs"), (3, 64, 64)),
    # Hugging Face transformers, tiny configs, random init
    Spec("hf.bert_seqcls", "transformers", _hf("BertConfig", "BertForSequenceClassification", **_BERT), (16,),
         tokens=128, quick=True),
    Spec("hf.bert_seqcls_mask", "transformers", _hf("BertConfig", "BertForSequenceClassification", **_BERT), (16,),
         tokens=128, mask=True, quick=True),
    Spec("hf.distilbert_seqcls_mask", "transformers", _hf("DistilBertConfig", "DistilBertForSequenceClassification",
                                                          **_DBERT), (16,), tokens=128, mask=True),
    Spec("hf.llama_lm_mask", "transformers", _hf("LlamaConfig", "LlamaForCausalLM", **_LLAMA), (16,), tokens=128,
         classes=128, label_shape=(16,), mask=True),
    Spec("hf.gpt2_lm_mask", "transformers", _hf("GPT2Config", "GPT2LMHeadModel", **_GPT2), (16,), tokens=128,
         classes=128, label_shape=(16,), mask=True),
    Spec("hf.distilbert_seqcls", "transformers", _hf("DistilBertConfig", "DistilBertForSequenceClassification",
                                                     **_DBERT), (16,), tokens=128),
    Spec("hf.gpt2_lm", "transformers", _hf("GPT2Config", "GPT2LMHeadModel", **_GPT2), (16,), tokens=128,
         classes=128, label_shape=(16,), quick=True),
    Spec("hf.gpt2_seqcls", "transformers", _hf("GPT2Config", "GPT2ForSequenceClassification", **_GPT2), (16,),
         tokens=128),
    Spec("hf.llama_lm", "transformers", _hf("LlamaConfig", "LlamaForCausalLM", **_LLAMA), (16,), tokens=128,
         classes=128, label_shape=(16,), quick=True),
    Spec("hf.llama_seqcls", "transformers", _hf("LlamaConfig", "LlamaForSequenceClassification", num_labels=10,
                                                **_LLAMA), (16,), tokens=128),
    Spec("peft.lora_gpt2_lm", "peft", _hf("GPT2Config", "GPT2LMHeadModel", ("c_attn",), **_GPT2), (16,),
         tokens=128, classes=128, label_shape=(16,)),
    Spec("peft.lora_llama_lm", "peft", _hf("LlamaConfig", "LlamaForCausalLM", ("q_proj", "v_proj"), **_LLAMA),
         (16,), tokens=128, classes=128, label_shape=(16,)),
    # hand-written nets with the idioms published code uses
    Spec("hand.se_cat_net", "hand-written", _se_net, IMG, quick=True),
    Spec("hand.nanogpt", "hand-written", _nanogpt, (32,), tokens=64, classes=64, label_shape=(32,), quick=True),
    Spec("hand.unet_per_pixel", "hand-written", _unet, (3, 16, 16), classes=4, label_shape=(256,), quick=True),
]}


def batch_of(spec: Spec, seed: int = 0):
    import torch
    g = torch.Generator().manual_seed(seed)
    if spec.tokens:
        x = torch.randint(1, spec.tokens, (spec.batch, *spec.input_shape), generator=g)
    else:
        x = torch.randn(spec.batch, *spec.input_shape, generator=g)
    y = torch.randint(0, spec.classes, (spec.batch, *spec.label_shape), generator=g)
    if spec.mask:         # padded sequences: the last quarter of every other row is padding
        m = torch.ones_like(x)
        m[::2, -spec.input_shape[-1] // 4:] = 0
        x = {"input_ids": x, "attention_mask": m}
    return x, y


@dataclass
class Row:
    name: str
    family: str
    captured: bool = False
    trained_equal: bool = False
    ops_c: int = 0
    ops_torch: int = 0
    losses_port: list = field(default_factory=list)
    losses_eager: list = field(default_factory=list)
    losses_f64: list = field(default_factory=list)
    losses_eager_1t: list = field(default_factory=list)     # eager float32 on one thread (other reduction orders)
    strict_equal: bool = False      # the criterion against the default-threads eager run alone
    port_step_ms: float = 0.0
    eager_step_ms: float = 0.0
    setup_s: float = 0.0
    plan_peak_bytes: int = 0        # the default plan's arena (weights, gradients, states, activations)
    eager_growth_bytes: int = 0     # eager float32's measured process growth over a warm run (VmHWM - VmRSS before)
    error: str = ""
    internal: bool = False          # the failure was PORT's (not a clear refusal)
    rt: str = ""                    # port-rt (compare(rt_binary=...)): "yes", "no (why)", "n/a (...)"; "": not run


def deterministic(model):
    """Dropout and stochastic depth off (p = 0) in every module: PORT seeds its own masks, eager draws others."""
    import torch.nn as nn
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
        if hasattr(m, "drop_prob") and isinstance(m.drop_prob, float):
            m.drop_prob = 0.0
    return model


def _eager(model, x, y, steps: int, dtype, lr: float):
    import torch
    m = copy.deepcopy(model).to(dtype)
    cast = lambda t: t.to(dtype) if t.is_floating_point() else t  # noqa: E731
    xx = {k: cast(v) for k, v in x.items()} if isinstance(x, dict) else cast(x)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=lr, momentum=0.9)
    out, times = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = eager_loss(m, xx, y)
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
        out.append(float(loss))
    return out, times


def eager_loss(model, x, y):
    """The training loss of ``model`` on a batch of batch_of() in eager PyTorch: cross-entropy of its logits
    (``.logits`` of a ModelOutput, else the first output), [N, K] or per token/pixel [N, T, K]."""
    import torch
    import torch.nn.functional as F
    z = model(**x) if isinstance(x, dict) else model(x)
    z = getattr(z, "logits", z) if not isinstance(z, torch.Tensor) else z
    z = z if isinstance(z, torch.Tensor) else z[0]
    return F.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1))


def equal(port: list, f32: list, f64: list, f32_more: tuple[list, ...] = ()) -> bool:
    """PORT's losses within 1e-4 of eager float32's, or no farther from float64 eager's than 2x float32 eager's
    distance + 1e-4 (step by step). ``f32_more``: further float32 eager runs with other reduction orders (one
    thread): float32 eager's distance is then the largest of the runs' (one run is one sample of float32's noise
    on a chaotic net; the runs together estimate its spread)."""
    runs = (f32, *f32_more)
    for i, (p, d) in enumerate(zip(port, f64)):
        a = f32[i]
        floor = max(abs(r[i] - d) for r in runs)
        if not (abs(p - a) <= 1e-4 * max(1.0, abs(a)) or abs(p - d) <= 2 * floor + 1e-4):
            return False
    return len(port) == len(f32) and all(math.isfinite(p) for p in port)


LR = 1e-3     # small steps: at batch 4 on 32x32 maps deep nets amplify float32 rounding (see equal())


def compare(spec: Spec, steps: int = 3, lr: float = LR, rt_binary: str | None = None) -> Row:
    """Train ``spec``'s model ``steps`` SGD-momentum steps under PORT (default plan: C kernels, torch_ops on the
    torch engine) and in eager float32 and float64, from the same weights and batch. ``rt_binary`` (a port-rt
    executable): an all-C default plan is also compiled (port.compile, before the Trainer's steps) and trained
    the same steps by port-rt; Row.rt says whether every loss and every parameter, buffer and optimizer state
    tensor after the steps equal the Trainer's bit for bit (rt_check)."""
    import torch
    from port.errors import PortError
    from port.train.optim import SGD
    from port.train.trainer import Trainer
    row = Row(spec.name, spec.family)
    model = deterministic(spec.build())
    model.train()
    x, y = batch_of(spec)
    from port.train import memwatch
    row.losses_eager, et = _eager(model, x, y, steps, torch.float32, lr)
    row.losses_f64, _ = _eager(model, x, y, steps, torch.float64, lr)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # eager's memory, measured on this warm float32 run (libtorch's code pages and pools already mapped by the
        # first; freed heap handed back): its model copy, gradients, momentum, activations and temporaries
        memwatch.release_freed_heap()
        pre, reset = memwatch.rss_bytes(), memwatch.reset_peak()
        row.losses_eager_1t, _ = _eager(model, x, y, steps, torch.float32, lr)
        row.eager_growth_bytes = max(0, memwatch.peak_bytes() - pre) if reset else 0
    finally:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        tr = Trainer(copy.deepcopy(model), x, optimizer=SGD(lr, momentum=0.9))
    except PortError as e:
        row.error = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        return row
    except Exception as e:  # noqa: BLE001 - an internal failure: reported as such
        row.error, row.internal = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}", True
        return row
    row.setup_s = time.perf_counter() - t0
    row.captured = True
    fwd = [o for o in tr.graph.ops]
    acc = {d.op: d.accelerator for d in tr.plan.ops}
    row.ops_torch = sum(1 for o in fwd if acc[o.id] != "cpu-c")
    row.ops_c = len(fwd) - row.ops_torch
    row.plan_peak_bytes = int(tr.program.arena_bytes) if hasattr(tr.program, "arena_bytes") else 0
    rt = None
    if rt_binary is not None:
        if row.ops_torch:
            row.rt = f"n/a ({row.ops_torch} ops on torch)"
        else:
            rt = RtCheck(rt_binary, tr, x, y, spec.classes)
    pt = []
    try:
        for _ in range(steps):
            t1 = time.perf_counter()
            row.losses_port.append(float(tr.step(x, y)))
            pt.append((time.perf_counter() - t1) * 1e3)
    except Exception as e:  # noqa: BLE001
        row.error, row.internal = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}", True
        return row
    if rt is not None:
        row.rt = rt.run(tr, row.losses_port)
    row.port_step_ms, row.eager_step_ms = min(pt), min(et)
    row.strict_equal = equal(row.losses_port, row.losses_eager, row.losses_f64)
    row.trained_equal = equal(row.losses_port, row.losses_eager, row.losses_f64, (row.losses_eager_1t,))
    return row


@dataclass
class PredictRow:
    name: str
    predicted_ms: float = 0.0
    measured_ms: float = 0.0
    profile_s: float = 0.0
    error: str = ""
    # where the time went: CPU seconds (this process and its waited-for children: the capture's fork) per phase
    # (load-proof, unlike wall time), the wall seconds of the whole row, and the profile's figures
    cpu_s: dict = field(default_factory=dict)
    wall_s: float = 0.0
    entries: dict = field(default_factory=dict)     # measured / reused (shared cache) / modeled, block_ms
    # predict(calls=True): per (op kind, accelerator, variant) of the plan: [ops, priced ms, in-plan ms], the
    # in-plan time the median over instrumented steps of the Trainer (Trainer.profile_step), largest gap first
    by_kind: list = field(default_factory=list)

    @property
    def rel_error(self) -> float:
        return (self.measured_ms - self.predicted_ms) / self.predicted_ms if self.predicted_ms else float("nan")


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children (resource.getrusage)."""
    import resource
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


# the profile's timing settings under a per-model budget: each entry costs its warm-up plus its blocks, up to half
# again for noisy entries' extra blocks (port.cost.measure.EXTRA_TIME_FRACTION), and its set-up; blocks shorter than
# MIN_BLOCK_MS time the timer more than the kernel; under FEW_BLOCKS_BELOW_MS an entry gets 3 blocks, not 5
MIN_BLOCK_MS, FEW_BLOCKS_BELOW_MS, ENTRY_SETUP_MS, PROFILE_SHARE_OF_ROW = 2.0, 25.0, 4.0, 0.6


def profile_settings(n_entries: int, budget_s: float | None) -> dict:
    """port.profile's keyword arguments that time ``n_entries`` entries in about ``budget_s`` seconds (None: the
    default, full profile): 5 blocks (3 when an entry's share is under FEW_BLOCKS_BELOW_MS), each up to the
    default's 20 ms and at least MIN_BLOCK_MS, warm-up half a block, no per-entry peak-memory runs (accounting a
    plan at the device's memory does not bind on), and a hard stop at twice the budget (entries past it are
    modeled, and counted)."""
    from port.cost.measure import DEFAULT_BLOCK_MS, DEFAULT_BLOCKS, DEFAULT_WARMUP_MS, EXTRA_TIME_FRACTION, QUICK_BLOCKS
    if budget_s is None:
        return {}
    per_entry_ms = 1e3 * budget_s / max(1, n_entries) / (1 + EXTRA_TIME_FRACTION) - ENTRY_SETUP_MS
    blocks = DEFAULT_BLOCKS if per_entry_ms >= FEW_BLOCKS_BELOW_MS else QUICK_BLOCKS
    block_ms = max(MIN_BLOCK_MS, min(DEFAULT_BLOCK_MS, per_entry_ms / (blocks + 0.5)))
    return {"blocks": blocks, "block_ms": round(block_ms, 2), "peak_memory": False, "max_time_s": 2 * budget_s,
            "warmup_ms": round(min(DEFAULT_WARMUP_MS, block_ms / 2), 2)}


def _cache_update(cp, prof):
    """The shared cache after a row: this row's entries (reused ones as they were, new ones measured, all as its
    profile holds them), then the cache's entries of keys this row does not have. Not merge_profiles: it sums the
    samples of duplicate keys, and every reused entry is one, so the counts doubled per row (past 2^31 after ~30
    rows: the cache failed to load for every later row)."""
    import dataclasses
    if cp is None:
        return prof
    mine = {(e.signature, e.accelerator, e.variant) for e in prof.entries}
    rest = tuple(e for e in cp.entries if (e.signature, e.accelerator, e.variant) not in mine)
    ents = sorted(tuple(prof.entries) + rest, key=lambda e: (e.signature, e.accelerator, e.variant))
    return dataclasses.replace(prof, entries=tuple(ents), _index={})


def predict(spec: Spec, steps: int = 15, max_profile_s: float = 300.0, budget_s: float | None = None,
            cache: str | None = None, calls: bool = False) -> PredictRow:
    """The plan held to what runs, on a model nobody tuned for: ``port.profile`` on ``host``, then
    ``port.solve`` (device memory), then port.Trainer with that plan; the plan's predicted step against the median
    of ``steps`` measured steps (after 3 warm-up steps), as a user would run it (no --replan), at the profile's
    thread count. ``budget_s`` (None: the default, full profile): the row's time budget; the profile's isolated
    timing gets PROFILE_SHARE_OF_ROW of it, spread over the entries it measures (:func:`profile_settings`; the
    program-order re-timing that prices the default plans' entries is the same as in a full profile). ``cache``: a
    profile file shared by the rows of one run (entries of the same op key measured by an earlier model are reused,
    this model's measured entries are merged into it). The engine footprints are not measured (PORT_PROFILE_ENGINE=0,
    set by bench/coverage.py: memory accounting that a plan at the device's memory does not bind). ``calls``: after
    the timed steps, the plan's calls timed in program (:func:`calls_by_kind`, in ``row.by_kind``)."""
    import statistics
    from pathlib import Path
    import port
    from port.config import load_device
    from port.cost.io import load_profile, save_profile
    from port.cost.measure import entry_keys, profile_with_report
    from port.train.optim import SGD
    row = PredictRow(spec.name)
    w0 = time.perf_counter()
    c = cpu_seconds()

    def lap(phase: str) -> None:
        nonlocal c
        now = cpu_seconds()
        row.cpu_s[phase] = round(now - c, 2)
        c = now
    try:
        model = deterministic(spec.build())
        x, y = batch_of(spec)
        lap("build")
        g = port.trace(model, x, optimizer="sgd_momentum")
        lap("trace")
        dev = load_device("host")
        cp = load_profile(cache, device=dev.name) if cache and Path(cache).is_file() else None
        keys = entry_keys(g, dev)
        have = {(e.signature, e.accelerator, e.variant) for e in cp.entries if e.measured} if cp else set()
        todo = sum(1 for k in keys if k not in have)
        kw = profile_settings(todo, None if budget_s is None else PROFILE_SHARE_OF_ROW * budget_s)
        kw.setdefault("max_time_s", max_profile_s)
        t0 = time.perf_counter()
        prof, rep = profile_with_report(g, "host", cache=cp, **kw)
        row.profile_s = time.perf_counter() - t0
        row.entries = {"measured": rep.measured, "reused": rep.reused, "modeled": rep.budget_modeled + len(rep.failed),
                       "blocks": kw.get("blocks", 5), "block_ms": kw.get("block_ms", 20.0)}
        lap("profile")
        if cache:
            save_profile(_cache_update(cp, prof), cache)
        plan = port.solve(g, prof, None, time_limit_s=30)
        lap("solve")
        # the thread count the profile was taken with: the plan's times hold for it (Trainer's default governor
        # moves to fewer threads when that is faster: then the run is not the plan's)
        threads = int(dict(prof.host).get("threads.cpu-c", 0)) or "auto"
        tr = port.Trainer(model, x, plan=plan, optimizer=SGD(1e-3, momentum=0.9), threads=threads)
        lap("trainer")
        for _ in range(3):
            tr.step(x, y)
        ts = []
        for _ in range(steps):
            t1 = time.perf_counter()
            tr.step(x, y)
            ts.append((time.perf_counter() - t1) * 1e3)
        row.predicted_ms, row.measured_ms = plan.predicted_step_ms, statistics.median(ts)
        lap("steps")
        if calls:
            row.by_kind = calls_by_kind(tr, g, plan, prof, x, y)
    except Exception as e:  # noqa: BLE001 - reported in the table
        row.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    row.wall_s = round(time.perf_counter() - w0, 2)
    return row


def calls_by_kind(tr, graph, plan, prof, x, y, steps: int = 7) -> list:
    """Where a plan's predicted step and its run part: per (op kind, accelerator, variant), [kind, accelerator,
    variant, ops, priced ms (the profile entries the simulator used), in-plan ms (per op the median over ``steps``
    instrumented steps of the Trainer, its calls booked as port.cost.measure.in_program_times books them)], the
    largest in-plan - priced gap first. The instrumented steps run on the per-op executor, with its timers."""
    import statistics

    from port.cost.measure import op_times
    per: dict[int, list[float]] = {o.id: [] for o in graph.ops}
    for _ in range(steps):
        ms = op_times(graph, plan, tr.profile_step(x, y)["calls"])   # fused calls booked by shares, as priced
        for o in graph.ops:
            per[o.id].append(ms.get(o.id, 0.0))
    out: dict[tuple, list] = {}
    for o in graph.ops:
        d = plan.ops[o.id]
        e = prof.lookup(graph.signature(o), d.accelerator, d.variant)
        a = out.setdefault((o.kind, d.accelerator, d.variant), [o.kind, d.accelerator, d.variant, 0, 0.0, 0.0])
        a[3] += 1
        a[4] += e.latency_ms if e is not None else 0.0
        a[5] += statistics.median(per[o.id])
    return sorted(([*a[:4], round(a[4], 4), round(a[5], 4)] for a in out.values()), key=lambda a: a[4] - a[5])


class RtCheck:
    """port-rt against the Trainer (issue 54): ``RtCheck(binary, trainer, x, y, classes)`` compiles the trainer's
    bundle (its state now, before any step) and writes the batch as a port-rt data file (n = the batch: every
    port-rt step trains on it, as Trainer.step(x, y) does); ``run(trainer, losses)`` after the Trainer's steps
    trains port-rt as many steps at the Trainer's kernel thread count and returns "yes" when every loss (float32
    bits) and every checkpointed tensor (parameters, buffers, optimizer state) equal the Trainer's, else
    "no (the first difference)". A bundle port.compile refuses is "no (its error)"."""

    def __init__(self, binary: str, tr, x, y, classes: int):
        import tempfile
        self.binary, self.dir, self.why = binary, tempfile.TemporaryDirectory(prefix="port_rt_cov_"), ""
        try:
            import port
            from port.exec.bundle import io_format, write_data
            port.compile(tr, f"{self.dir.name}/m.portrt")
            write_data(f"{self.dir.name}/d.portdata", [t.numpy() for t in tr.input_tensors(x)], y.numpy(), classes,
                       ignore_index=io_format(tr)[2])
        except Exception as e:  # noqa: BLE001 - a refusal (BundleError) or a failure: the column says which
            self.why = f"no ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})"

    def run(self, tr, losses: list[float]) -> str:
        if self.why:
            return self.why
        import subprocess
        import numpy as np
        from port.exec import capi
        from port.train.checkpoint import read_checkpoint, trainer_tensors
        d = self.dir.name
        try:
            r = subprocess.run([self.binary, "train", f"{d}/m.portrt", "--data", f"{d}/d.portdata", "--steps",
                                str(len(losses)), "--threads", str(capi.get_num_threads()), "--checkpoint",
                                f"{d}/rt.port"], capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                return f"no (port-rt exit {r.returncode}: {(r.stderr.strip().splitlines() or ['?'])[-1][:160]})"
            got = [np.float32(ln.split()[3]) for ln in r.stdout.splitlines() if ln.startswith("step ")]
            want = [np.float32(v) for v in losses]
            if [g.tobytes() for g in got] != [w.tobytes() for w in want]:
                return f"no (losses {[float(g) for g in got]} vs the Trainer's {[float(w) for w in want]})"
            _, theirs = read_checkpoint(f"{d}/rt.port")
            for meta, t in trainer_tensors(tr):
                o = theirs.get(meta["name"])
                if o is None or o.shape != t.shape or o.numpy().tobytes() != t.detach().contiguous().numpy().tobytes():
                    return f"no ({meta['kind']} {meta['name']} differs)"
            return "yes"
        except Exception as e:  # noqa: BLE001
            return f"no ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})"
        finally:
            self.dir.cleanup()
