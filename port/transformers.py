"""Small transformers PORT traces and trains on its C kernels, and LoRA adapters for them.

* ``bert_tiny``: an encoder classifier (token + position embeddings, pre-norm blocks of multi-head
  self-attention with a key-padding mask and a GELU MLP, mean pooling, a linear classifier). Input: token ids
  ``[N, T]`` (int64, ``pad_id`` marks padding); output: logits ``[N, classes]``.
* ``gpt_tiny``: a decoder-only byte-level language model (causal attention, output projection tied to the token
  embedding). Input: byte ids ``[N, T]``; output: next-token logits ``[N, T, vocab]`` (the loss is token-level
  cross-entropy; labels equal to -100 are ignored).

LoRA (``lora``): chosen ``nn.Linear`` layers become ``LoRALinear``: the base weight and bias are frozen and a
trainable low-rank update ``(alpha / rank) * B A x`` is added (A: ``[rank, in]``, Kaiming-uniform; B: ``[out,
rank]``, zeros, so the wrapped model starts equal to the base). Tracing sees the frozen base linear (its weight
gradient is pruned: sparse update), two small linears and a scaling. ``merge_lora`` folds the adapters into
plain ``nn.Linear`` weights for inference and export.
"""
from __future__ import annotations

import fnmatch
import math
import numbers
from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from port.errors import ArgumentError


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"hidden size {dim} is not divisible by heads={heads}")
        self.heads, self.causal = heads, causal
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        n, t, d = x.shape
        h = self.heads

        def split(z):
            return z.reshape(n, t, h, d // h).transpose(1, 2)     # [N, H, T, d/H]
        o = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)),
                                           attn_mask=mask, is_causal=self.causal)
        return self.proj(o.transpose(1, 2).reshape(n, t, d))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int, heads: int, causal: bool, mlp_ratio: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, causal)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.drop(self.fc2(self.act(self.fc1(self.ln2(x)))))


class BertTiny(nn.Module):
    def __init__(self, vocab: int = 256, num_classes: int = 2, layers: int = 2, dim: int = 128, heads: int = 2,
                 context: int = 128, pad_id: int = 0, dropout: float = 0.0) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, False, dropout=dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.pool = nn.Linear(dim, dim)
        self.act = nn.Tanh()
        self.head = nn.Linear(dim, num_classes)

    def forward(self, idx):
        mask = (idx != self.pad_id)[:, None, None, :]                 # [N, 1, 1, T]: True = attend
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x, mask)
        return self.head(self.act(self.pool(self.ln(x).mean(dim=1))))


class GptTiny(nn.Module):
    def __init__(self, vocab: int = 256, layers: int = 4, dim: int = 128, heads: int = 4, context: int = 128,
                 dropout: float = 0.0, tie_weights: bool = True) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, True, dropout=dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tie_weights:
            self.head.weight = self.tok.weight                        # weight tying
        self.apply(_gpt_init)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def _gpt_init(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Embedding):
        nn.init.normal_(m.weight, std=0.02)


def bert_tiny(**kw: Any) -> BertTiny:
    return BertTiny(**kw)


def gpt_tiny(**kw: Any) -> GptTiny:
    return GptTiny(**kw)


# ---------------------------------------------------------------------------------------------
# LoRA
# ---------------------------------------------------------------------------------------------
class LoRALinear(nn.Module):
    """y = base(x) + lora_b((alpha / rank) * lora_a(x)), base frozen. The scale is applied to the rank-r
    intermediate, not to the output: the same function, but the only full-width tensors are base's output,
    lora_b's output and their sum (scaling the output would add a fourth, as large, to the step's peak)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        _check_rank_alpha(rank, alpha)
        if not isinstance(base, nn.Linear):
            raise ArgumentError(f"LoRALinear base: expected an nn.Linear, got {type(base).__name__}")
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.rank, self.alpha = int(rank), float(alpha)
        self.scaling = self.alpha / self.rank
        self.lora_a = nn.Linear(base.in_features, rank, bias=False)
        self.lora_b = nn.Linear(rank, base.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_a.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_b.weight)
        self.to(base.weight.device)

    def forward(self, x):
        return self.base(x) + self.lora_b(self.lora_a(x) * self.scaling)

    def merged(self) -> nn.Linear:
        """A plain nn.Linear with the adapter folded into its weight."""
        lin = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
        with torch.no_grad():
            lin.weight.copy_(self.base.weight + self.scaling * (self.lora_b.weight @ self.lora_a.weight))
            if self.base.bias is not None:
                lin.bias.copy_(self.base.bias)
        return lin.to(self.base.weight.device)


def _check_rank_alpha(rank: Any, alpha: Any) -> None:
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 1:
        raise ArgumentError(f"lora rank={rank!r}: expected an int >= 1 (the adapters' inner width, e.g. 8)")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not math.isfinite(alpha) or alpha <= 0:
        raise ArgumentError(f"lora alpha={alpha!r}: expected a finite number > 0 (the update is scaled by "
                            f"alpha / rank; e.g. alpha = 2 * rank)")


def _patterns(what: str, pats: Any) -> list[str]:
    pats = [pats] if isinstance(pats, str) else pats
    if not isinstance(pats, (list, tuple)) or not all(isinstance(p, str) and p for p in pats):
        raise ArgumentError(f"lora {what}={pats!r}: expected a list of module-path patterns (fnmatch, e.g. "
                            f"['*.attn.q', '*.attn.v'])")
    return list(pats)


def lora(model: nn.Module, targets: Sequence[str] = ("*.q", "*.v"), rank: int = 8, alpha: float = 16.0,
         train: Sequence[str] = ()) -> nn.Module:
    """Wrap the ``nn.Linear`` layers whose module path matches one of ``targets`` (fnmatch patterns) in
    LoRALinear, in place, and freeze every other parameter except those of modules matching ``train`` (e.g. a
    new classifier head). Returns ``model``. Every argument is checked before the model changes: a rank that is
    not an int >= 1, an alpha that is not a finite number > 0, or a pattern of ``targets`` (``train``) that
    matches no nn.Linear (no module with parameters) raises port.errors.ArgumentError (a ValueError) naming
    it and what is allowed (the model's linear layers)."""
    if not isinstance(model, nn.Module):
        raise ArgumentError(f"lora model: expected a torch.nn.Module, got {type(model).__name__}")
    _check_rank_alpha(rank, alpha)
    targets, train = _patterns("targets", targets), _patterns("train", train)
    if not targets:
        raise ArgumentError("lora targets=[]: give at least one pattern of the linear layers to adapt")
    named = list(model.named_modules())
    linears = [n for n, m in named if isinstance(m, nn.Linear)]
    hits = [n for n in linears if any(fnmatch.fnmatchcase(n, t) for t in targets)]
    idle = [t for t in targets if not any(fnmatch.fnmatchcase(n, t) for n in linears)]
    if idle:
        raise ArgumentError(f"lora targets: {idle} match no nn.Linear; the model's linear layers are "
                            f"{linears[:12]}{' ...' if len(linears) > 12 else ''}")
    with_params = [n for n, m in named if n and next(m.parameters(), None) is not None]
    idle = [t for t in train if not any(fnmatch.fnmatchcase(n, t) for n in with_params)]
    if idle:
        raise ArgumentError(f"lora train: {idle} match no module with parameters; the model's are "
                            f"{with_params[:12]}{' ...' if len(with_params) > 12 else ''}")
    for p in model.parameters():
        p.requires_grad_(False)
    for name in hits:
        parent, _, attr = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, attr, LoRALinear(getattr(owner, attr), rank, alpha))
    for name, m in model.named_modules():
        if any(fnmatch.fnmatchcase(name, t) for t in train):
            for p in m.parameters():
                p.requires_grad_(True)
    return model


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every LoRALinear by its merged nn.Linear, in place; returns ``model``."""
    for name, m in list(model.named_modules()):
        if isinstance(m, LoRALinear):
            parent, _, attr = name.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            setattr(owner, attr, m.merged())
    return model
