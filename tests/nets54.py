"""Small nets with the ops of issue 54's kernels (and issue 52's average pools), shared by the port-rt and
call-rule tests (tests/ is on sys.path: tests/conftest.py)."""
from __future__ import annotations

import torch


class LlamaRMSNorm(torch.nn.Module):
    """Llama's RMSNorm as transformers writes it (exported as pow, mean, add, rsqrt, mul, casts, mul)."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, d))
        self.eps = eps

    def forward(self, h):
        dt = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dt)


class NormPool(torch.nn.Module):
    """Group norm (affine and not), a dilated ceil-mode max pool, bilinear and nearest resizes, adaptive average
    pooling to 1x5, Llama's RMSNorm and F.rms_norm: issue 54's norms, pooling and resize."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        nn = torch.nn
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.gn, self.gn2 = nn.GroupNorm(3, 6), nn.GroupNorm(2, 6, affine=False)
        self.rms = LlamaRMSNorm(5)
        self.w2 = nn.Parameter(torch.linspace(1.5, 0.5, 5))
        self.fc = nn.Linear(6 * 5, 10)

    def forward(self, x):
        F = torch.nn.functional
        h = self.gn2(self.gn(self.conv(x)))
        h = F.max_pool2d(h, 3, 2, 1, dilation=2, ceil_mode=True)
        h = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)
        h = F.interpolate(h, size=(7, 9), mode="nearest")
        h = F.interpolate(h, size=(8, 10), mode="bilinear", align_corners=True)
        h = F.adaptive_avg_pool2d(h, (1, 5)).flatten(2)
        return self.fc((self.rms(h) + F.rms_norm(h, (5,), self.w2, 1e-5)).flatten(1))


class PadEmb(torch.nn.Module):
    """nn.Embedding with padding_idx (HF BERT/GPT-2/Llama token tables): the padding row gets no gradient
    (port_embedding_backward_weight_pad); ids [n, t] in, 10 classes out."""

    def __init__(self, vocab=11, dim=6):
        super().__init__()
        torch.manual_seed(0)
        self.e = torch.nn.Embedding(vocab, dim, padding_idx=0)
        self.fc = torch.nn.Linear(dim, 10)

    def forward(self, ids):
        return self.fc(self.e(ids).mean(1))


class Views(torch.nn.Module):
    """Shape ops as arena views (issue 54): chunk, split, unbind (of a view), narrow, select and slices along dim 0
    of a contiguous [24, N] map and a batch split are views of its bytes; a slice and a split along dim 1 of
    [N, 24] are copies."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.fc2 = torch.nn.Linear(12, 24), torch.nn.Linear(8, 10)

    def forward(self, x):
        h = self.fc(x)                                 # [N, 24]
        ht = h.t()                                     # [24, N] (a permute: a copy, contiguous)
        a, b, c = ht.chunk(3, 0)                       # views at 0, 8N and 16N floats
        p, q = ht.split([20, 4], 0)
        u0, u1, u2, u3 = q.unbind(0)                   # views of a view
        g = torch.relu(a) + b * c + ht.narrow(0, 5, 8) + (u1 * ht[7] - u3).unsqueeze(0) + p[12:20]
        d = h[:, 3:11]                                 # copies: ranges along dim 1 of [N, 24]
        e0, e1 = h.split([16, 8], 1)
        h1, h2 = (g.t() + d + e1).chunk(2, 0)          # a batch split: views
        return self.fc2(torch.cat([h1 * 0.5, h2], 0))


class PaddedAttn(torch.nn.Module):
    """HF's padding-mask chain (transformers' sdpa_mask) on int64 token ids with 0 as padding: ids.bool(),
    mask[batch_arange, kv_arange] by two broadcast index tensors, and with a registered causal mask, expand to
    [B, 1, T, T] (a copy: a cast reads it too), then attention under that boolean mask; a float copy of the mask
    scales the output, and so does a mask from compares (tensor < tensor, tensor > number), not and or."""

    def __init__(self, t=7, d=12):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(11, d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.register_buffer("causal", torch.ones(t, t, dtype=torch.bool).tril()[None, None])
        self.fc = torch.nn.Linear(t * d, 10)

    def forward(self, ids):                                 # [N, T] int64
        n, t = ids.shape
        m = ids.to(torch.bool)
        b_idx, kv = torch.arange(n)[:, None, None, None], torch.arange(t)[None, None, None, :]
        mask = (m[b_idx, kv] | self.causal.logical_not()).__and__(self.causal).expand(n, 1, t, t)
        e = self.emb(ids)
        q, k, v = self.qkv(e).unsqueeze(1).chunk(3, -1)
        h = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).squeeze(1)
        h = h * mask.to(torch.float32).squeeze(1).mean(1)[..., None]            # a cast reads the expand: a copy
        keep = torch.logical_not(h < e) | (e > 0.1)
        return self.fc((h * keep.to(torch.float32) * m.to(torch.float32)[..., None]).reshape(n, -1))


class TwoInputs(torch.nn.Module):
    """A model with two inputs as Hugging Face's take them, ``forward(input_ids, attention_mask)``: token
    embeddings masked by the padding mask (int64 0/1), attention under the mask's key padding, a linear head."""

    def __init__(self, t=6, d=8, vocab=13):
        super().__init__()
        torch.manual_seed(1)
        self.emb = torch.nn.Embedding(vocab, d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.fc = torch.nn.Linear(t * d, 10)

    def forward(self, input_ids, attention_mask):          # [N, T] int64 each
        n, t = input_ids.shape
        m = attention_mask.to(torch.bool)
        e = self.emb(input_ids) * m.to(torch.float32)[..., None]
        q, k, v = self.qkv(e).unsqueeze(1).chunk(3, -1)
        h = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m[:, None, None, :].expand(n, 1, t, t))
        return self.fc(h.squeeze(1).reshape(n, -1))


class WhereNet(torch.nn.Module):
    """torch.where (issue 54) of two activations under a computed mask, of an activation and a number under a
    broadcast mask, of an activation and a 0-d buffer (HF GPT-2's mask value), and of a number and an activation
    under a per-row mask: the activation operands differentiated."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.fc2 = torch.nn.Linear(5, 6), torch.nn.Linear(6, 10)
        self.register_buffer("floor", torch.tensor(-0.75))

    def forward(self, x):                                   # [N, 5]
        h = self.fc(x)
        keep = h > 0.1
        g = torch.where(keep, h, torch.tanh(h) * 0.5)
        g = torch.where(h < 0.9, g, self.floor)
        g = torch.where(keep[:1], g, -1.5)
        return self.fc2(torch.where(x[:, 1:2] > 0, 2.0, g))


class LastTokenPool(torch.nn.Module):
    """HF's sequence-classifier pooling (GPT2/LlamaForSequenceClassification) on int64 token ids with 0 as padding:
    per-token logits, (ids != 0).to(int32) * arange(T, int32), argmax(-1), logits[arange(B), last]."""

    def __init__(self, d=6):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(11, d)
        self.fc = torch.nn.Linear(d, 10)

    def forward(self, ids):                                 # [N, T] int64
        logits = self.fc(torch.tanh(self.emb(ids)))
        non_pad = (ids != 0).to(ids.device, torch.int32)
        last = (torch.arange(ids.shape[-1], device=ids.device, dtype=torch.int32) * non_pad).argmax(-1)
        return logits[torch.arange(ids.shape[0], device=ids.device), last]


class AvgPools(torch.nn.Module):
    """Average pools torch_op ran before issue 52: ceil mode (with and without padding in the divisor) and
    count_include_pad=False, on an odd map with stride 2."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        nn = torch.nn
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * (5 * 4 + 5 * 4 + 3 * 3), 3)

    def forward(self, x):                                    # [N, 3, 9, 7]
        F = torch.nn.functional
        h = torch.relu(self.conv(x))
        a = F.avg_pool2d(h, 3, 2, 1, ceil_mode=True, count_include_pad=False)          # [N, 4, 5, 4]
        b = F.avg_pool2d(h, (2, 3), 2, (1, 1), count_include_pad=False)                # [N, 4, 5, 4]
        c = F.avg_pool2d(F.avg_pool2d(h, 2, 2, ceil_mode=True), 3, 2, 1, ceil_mode=True)  # [N, 4, 3, 3]
        return self.fc(torch.cat([a.flatten(1), b.flatten(1), c.flatten(1)], 1))


class WindowEinsumAttn(torch.nn.Module):
    """Attention within windows as MaxViT writes it: q, k, v [B, G, H, P, D] from one projection, the scores by
    einsum "B G H I D, B G H J D -> B G H I J" plus a relative-position bias picked from a table by an index
    buffer, softmax, and einsum "B G H I J, B G H J D -> B G H I D" (issue 52: matmuls with permutes)."""

    def __init__(self, d=6, heads=2, p=4):
        super().__init__()
        torch.manual_seed(0)
        self.h, self.p = heads, p
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.table = torch.nn.Parameter(torch.randn(2 * p - 1, heads) * 0.1)
        self.register_buffer("idx", (torch.arange(p)[:, None] - torch.arange(p)[None, :] + p - 1).reshape(-1))
        self.merge = torch.nn.Linear(d, d)
        self.fc = torch.nn.Linear(3 * p * d, 10)

    def forward(self, x):                                   # [B, 3, 4, 6]: B, windows G, positions P, features
        b, g, p, d = x.shape
        q, k, v = (t.reshape(b, g, p, self.h, d // self.h).permute(0, 1, 3, 2, 4) for t in self.qkv(x).chunk(3, -1))
        s = torch.einsum("B G H I D, B G H J D -> B G H I J", q, k * d ** -0.5)
        s = s + self.table[self.idx].view(p, p, self.h).permute(2, 0, 1).unsqueeze(0)
        o = torch.einsum("B G H I J, B G H J D -> B G H I D", s.softmax(-1), v)
        return self.fc(self.merge(o.permute(0, 1, 3, 2, 4).reshape(b, g, p, d)).flatten(1))
