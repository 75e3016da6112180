"""Real text that ships on every machine PORT runs on: the Python standard library's own source files (code,
comments and docstrings), as bytes for byte-level language models (``gpt_tiny``, vocabulary 256).

Files are taken in sorted path order from the running interpreter's ``Lib`` directory (top-level modules only,
no tests); every ``holdout_every``-th file goes to the held-out split, so the two splits never share a file.
Nothing is downloaded.

Two datasets for configs (``data.kind``, port.train.data): ``text`` -- next-byte prediction windows (x = bytes
[t, t+T), y = bytes [t+1, t+T+1)) from the training and the held-out files; ``text_files`` -- which of
``num_classes`` standard-library modules a window of T bytes comes from (training windows from the first part of
each file, test windows from the rest).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator


BYTE_VOCAB = 256     # byte-level token ids 0..255


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
        yield _windows(data, batch, context, g)
        k += 1


def _windows(data, n: int, context: int, g) -> tuple:
    """``n`` windows of ``context + 1`` tokens at random starts drawn from ``g``: (x, y = x shifted by one)."""
    import torch
    starts = torch.randint(0, len(data) - context - 1, (n,), generator=g)
    w = torch.stack([data[s:s + context + 1] for s in starts.tolist()])
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


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


def lm_windows(text: bytes, n: int, context: int, seed: int = 0) -> tuple:
    """``n`` random windows of ``text`` (seeded): x [n, context] and y = x shifted by one byte, int64."""
    import torch
    if len(text) < context + 2:
        raise ValueError(f"{len(text)} bytes of text cannot hold a window of {context + 1}")
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).to(torch.int64)
    return _windows(data, n, context, torch.Generator().manual_seed(seed))


def file_windows(num_classes: int, n: int, context: int, test_fraction: float = 0.2, seed: int = 0) -> tuple:
    """Windows of ``context`` bytes labelled by the module they come from: ``num_classes`` standard-library
    files (the largest, taken in sorted path order among those of at least 40 windows), ``n`` windows in all,
    about ``n * test_fraction`` of them for testing, drawn from the last ``test_fraction`` of each file (training
    windows from the part before it, so no byte is in both).  Returns x_train, y_train, x_test, y_test (int64)."""
    import torch
    sized = [(os.path.getsize(f), f) for f in stdlib_files()]
    big = sorted(f for size, f in sorted(sized, reverse=True)[:num_classes] if size >= 40 * context)
    if len(big) < num_classes:
        raise ValueError(f"the standard library has {len(big)} modules of at least {40 * context} bytes; "
                         f"{num_classes} classes asked")
    g = torch.Generator().manual_seed(seed)
    n_test = int(round(n * test_fraction))
    parts: list[list] = [[], [], [], []]
    for c, path in enumerate(big):
        with open(path, "rb") as f:
            data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).to(torch.int64)
        cut = int(len(data) * (1 - test_fraction)) if test_fraction > 0 else len(data)
        for k, (lo, hi, m) in enumerate(((0, cut, (n - n_test) // num_classes + (c < (n - n_test) % num_classes)),
                                         (cut, len(data), n_test // num_classes + (c < n_test % num_classes)))):
            if m == 0:
                continue
            starts = torch.randint(lo, max(hi - context, lo + 1), (m,), generator=g)
            parts[2 * k].append(torch.stack([data[s:s + context] for s in starts.tolist()]))
            parts[2 * k + 1].append(torch.full((m,), c, dtype=torch.int64))
    cat = [torch.cat(p) if p else torch.empty(0, *((context,) if i % 2 == 0 else ()), dtype=torch.int64)
           for i, p in enumerate(parts)]
    return tuple(cat)
