"""Datasets for `port train`: ``digits`` (scikit-learn's 8x8 handwritten digits, real data), ``synthetic``
(seeded random inputs labelled by a random linear teacher, so it is learnable), and two token datasets of real
text that ships with Python (port.train.text): ``text`` (next-byte prediction, labels [N, T]: a language model's)
and ``text_files`` (which standard-library module a window of bytes comes from: a sequence classifier's)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator


@dataclass
class Dataset:
    x_train: Any
    y_train: Any
    x_test: Any
    y_test: Any

    def batches(self, batch_size: int, seed: int = 0, epoch: int = 0) -> Iterator[tuple[Any, Any]]:
        """Shuffled full batches of the training split (the last partial batch is dropped)."""
        import torch
        g = torch.Generator().manual_seed(seed * 100003 + epoch)
        perm = torch.randperm(self.x_train.shape[0], generator=g)
        for i in range(0, len(perm) - batch_size + 1, batch_size):
            idx = perm[i:i + batch_size]
            yield self.x_train[idx], self.y_train[idx]

    def test_batches(self, batch_size: int) -> Iterator[tuple[Any, Any]]:
        for i in range(0, self.x_test.shape[0], batch_size):
            yield self.x_test[i:i + batch_size], self.y_test[i:i + batch_size]


TOKEN_KINDS = ("text", "text_files")     # data kinds whose samples are int64 token ids (byte values)


def is_tokens(cfg) -> bool:
    return cfg.data.kind in TOKEN_KINDS


def load(cfg) -> Dataset:
    """From an ExperimentConfig (cfg.data, cfg.input_shape, cfg.num_classes)."""
    import torch
    shape = tuple(cfg.input_shape)
    d = cfg.data
    if d.kind in TOKEN_KINDS:
        from port.train import text as T
        (context,) = shape          # the config schema checks input_shape is [T] for token data
        n_test = int(round(d.num_samples * d.test_fraction))
        if d.kind == "text":
            corpus = T.stdlib_corpus(max_bytes=max(200_000, 4 * d.num_samples * context))
            xtr, ytr = T.lm_windows(corpus.train, d.num_samples - n_test, context, seed=d.seed)
            xte, yte = T.lm_windows(corpus.heldout, n_test, context, seed=d.seed + 1)
            return Dataset(xtr, ytr, xte, yte)
        return Dataset(*T.file_windows(cfg.num_classes, d.num_samples, context, d.test_fraction, seed=d.seed))
    if d.kind == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
        ds = load_digits()
        x = torch.tensor(ds.data, dtype=torch.float32) / 16.0
        y = torch.tensor(ds.target, dtype=torch.int64)
        if int(torch.tensor(shape).prod()) != 64:
            if len(shape) != 3:
                from port.errors import ConfigError
                raise ConfigError(f"data.kind digits gives 64 features per sample (an 8x8 image); input_shape "
                                  f"{list(shape)} has {int(torch.tensor(shape).prod())}: give 64 features "
                                  f"([64], [1, 8, 8]) or an image shape [C, H, W] to resize it to")
            # an image model's input: the 8x8 digit resized (bilinear) to H x W and repeated over C channels
            import torch.nn.functional as F
            x = F.interpolate(x.reshape(-1, 1, 8, 8), size=shape[1:], mode="bilinear", align_corners=False)
            x = x.repeat(1, shape[0], 1, 1).flatten(1)
        idx = list(range(len(y)))
        tr_idx, te_idx = train_test_split(idx, test_size=d.test_fraction, random_state=d.seed, stratify=ds.target)
        xtr, xte = x[tr_idx], x[te_idx]
        mean, std = xtr.mean(0), xtr.std(0) + 1e-3
        xtr, xte = (xtr - mean) / std, (xte - mean) / std
        return Dataset(xtr.reshape(-1, *shape).contiguous(), y[tr_idx], xte.reshape(-1, *shape).contiguous(), y[te_idx])
    g = torch.Generator().manual_seed(d.seed)
    n = d.num_samples
    x = torch.randn(n, *shape, generator=g)
    teacher = torch.randn(int(torch.tensor(shape).prod()), cfg.num_classes, generator=g)
    y = (x.flatten(1) @ teacher).argmax(1)
    n_test = int(round(n * d.test_fraction))
    return Dataset(x[n_test:], y[n_test:], x[:n_test], y[:n_test])
