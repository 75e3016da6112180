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
