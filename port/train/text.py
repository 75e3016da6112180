"""Real text that ships on every machine PORT runs on: the Python standard library's own source files (code,
comments and docstrings), as bytes for byte-level language models (``gpt_tiny``, vocabulary 256).

Files are taken in sorted path order from the running interpreter's ``Lib`` directory (top-level modules only,
no tests); every ``holdout_every``-th file goes to the held-out split, so the two splits never share a file.
Nothing is downloaded.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator


def stdlib_dir() -> str:
    return os.path.dirname(os.__file__)


def stdlib_files() -> list[str]:
    d = stdlib_dir()
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".py") and not f.startswith(("test", "_")))


@dataclass(frozen=True)
class TextCorpus:
    train: bytes
    heldout: bytes
    train_files: int
    heldout_files: int


def stdlib_corpus(max_bytes: int = 2_000_000, holdout_every: int = 10) -> TextCorpus:
    """Up to ``max_bytes`` of training text and ``max_bytes // holdout_every`` held-out text (whole files)."""
    train, held = bytearray(), bytearray()
    nt = nh = 0
    for i, path in enumerate(stdlib_files()):
        with open(path, "rb") as f:
            data = f.read()
        if i % holdout_every == holdout_every - 1:
            if len(held) < max_bytes // holdout_every:
                held += data
                nh += 1
        elif len(train) < max_bytes:
            train += data
            nt += 1
        if len(train) >= max_bytes and len(held) >= max_bytes // holdout_every:
            break
    return TextCorpus(bytes(train[:max_bytes]), bytes(held[:max_bytes // holdout_every]), nt, nh)


def lm_batches(text: bytes, batch: int, context: int, seed: int = 0, steps: int | None = None) -> Iterator:
    """Random windows of ``context + 1`` bytes: (x = window[:-1], y = window[1:]) as int64 [batch, context]."""
    import torch
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).to(torch.int64)
    g = torch.Generator().manual_seed(seed)
    k = 0
    while steps is None or k < steps:
        starts = torch.randint(0, len(data) - context - 1, (batch,), generator=g)
        w = torch.stack([data[s:s + context + 1] for s in starts.tolist()])
        yield w[:, :-1].contiguous(), w[:, 1:].contiguous()
        k += 1


def eval_windows(text: bytes, batch: int, context: int, max_batches: int = 8) -> list:
    """Consecutive non-overlapping windows of the held-out text (a fixed evaluation set)."""
    import torch
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).to(torch.int64)
    n = min((len(data) - 1) // context, batch * max_batches) // batch * batch
    xs = data[:n * context].view(n, context)
    ys = data[1:n * context + 1].view(n, context)
    return [(xs[i:i + batch], ys[i:i + batch]) for i in range(0, n, batch)]


def perplexity(logits_fn, windows) -> float:
    """exp(mean next-byte cross-entropy) of ``logits_fn(x) -> [N, T, 256]`` over ``windows``."""
    import math
    import torch
    import torch.nn.functional as F
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for x, y in windows:
            z = logits_fn(x)
            tot += float(F.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1), reduction="sum"))
            cnt += y.numel()
    return math.exp(tot / max(cnt, 1))
