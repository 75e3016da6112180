"""A small depthwise-separable (MobileNet-like) net: the custom-model example, and the case `port train
--replan` is measured on (bench/replan.py, tests/e2e/test_replan.py). Run from this directory:

    port train dsnet.yaml
"""
import torch.nn as nn


def make(num_classes: int = 10, width: int = 8) -> nn.Module:
    def dw_sep(cin: int, cout: int, stride: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.ReLU(),
                nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
    w = width
    return nn.Sequential(nn.Conv2d(3, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                         *dw_sep(w, 2 * w, 1), *dw_sep(2 * w, 2 * w, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * w, num_classes))
