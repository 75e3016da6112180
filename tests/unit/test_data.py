"""port.train.data: the digits dataset in the shapes models take."""
from __future__ import annotations

import types

import pytest
import torch

from port.errors import ConfigError
from port.train.data import load


def _cfg(shape):
    return types.SimpleNamespace(input_shape=shape, num_classes=10,
                                 data=types.SimpleNamespace(kind="digits", seed=0, test_fraction=0.2))


def test_digits_resized_for_an_image_model():
    flat, img = load(_cfg([1, 8, 8])), load(_cfg([3, 16, 16]))
    assert img.x_train.shape[1:] == (3, 16, 16) and len(img.x_train) == len(flat.x_train)
    assert torch.equal(img.y_train, flat.y_train) and torch.equal(img.x_train[:, 0], img.x_train[:, 2])
    # the same digit: the resized image, pooled back to 8x8, tracks the original (bilinear keeps the layout)
    back = torch.nn.functional.avg_pool2d(img.x_train[:, :1], 2).flatten(1)
    corr = torch.corrcoef(torch.stack([back[:50].flatten(), flat.x_train[:50].flatten()]))[0, 1]
    assert corr > 0.8


def test_digits_in_a_shape_that_is_no_image_is_refused():
    with pytest.raises(ConfigError, match=r"input_shape \[3, 32\] has 96: .*\[C, H, W\]"):
        load(_cfg([3, 32]))


# ----------------------------------------------------------------------------- token data (real text)
def _tcfg(kind, classes, n=200, context=32, frac=0.2):
    return types.SimpleNamespace(input_shape=[context], num_classes=classes,
                                 data=types.SimpleNamespace(kind=kind, seed=3, test_fraction=frac, num_samples=n))


def test_text_is_next_byte_prediction_on_train_and_heldout_files():
    from port.train.text import stdlib_corpus
    ds = load(_tcfg("text", 256))
    assert ds.x_train.shape == ds.y_train.shape == (160, 32) and ds.x_test.shape == (40, 32)
    assert ds.x_train.dtype == ds.y_train.dtype == torch.int64
    assert torch.equal(ds.x_train[:, 1:], ds.y_train[:, :-1]) and torch.equal(ds.x_test[:, 1:], ds.y_test[:, :-1])
    corpus = stdlib_corpus(max_bytes=200_000)
    window = bytes(ds.x_test[0].tolist()) + bytes([int(ds.y_test[0, -1])])
    assert window in corpus.heldout and window not in corpus.train      # test windows: held-out files only
    assert bytes(ds.x_train[0].tolist()) in corpus.train


def test_text_files_labels_the_module_and_keeps_test_bytes_apart():
    from port.train.text import file_windows
    ds = load(_tcfg("text_files", 3, n=90))
    assert ds.x_train.shape == (72, 32) and ds.x_test.shape == (18, 32)
    assert sorted(ds.y_train.unique().tolist()) == [0, 1, 2] and torch.bincount(ds.y_test).tolist() == [6, 6, 6]
    # the same windows again from file_windows (seeded); each test window lies in the last 20% of its file
    xtr, ytr, xte, yte = file_windows(3, 90, 32, 0.2, seed=3)
    assert torch.equal(xtr, ds.x_train) and torch.equal(yte, ds.y_test)
    import os
    from port.train.text import stdlib_files
    big = sorted(f for _, f in sorted(((os.path.getsize(f), f) for f in stdlib_files()), reverse=True)[:3])
    for x, c in zip(ds.x_test, ds.y_test):
        data = open(big[int(c)], "rb").read()
        cut = int(len(data) * 0.8)
        assert bytes(x.tolist()) in data[cut:]
    for x, c in zip(ds.x_train[:10], ds.y_train[:10]):
        data = open(big[int(c)], "rb").read()
        assert bytes(x.tolist()) in data[:int(len(data) * 0.8)]
