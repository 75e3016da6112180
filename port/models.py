"""The model zoo: CIFAR-sized CNNs, MobileNetV2, small models for scikit-learn's 8x8 digits, and two small
byte-level transformers (port.transformers): ``bert_tiny`` (a sequence classifier) and ``gpt_tiny`` (a language
model whose ``num_classes`` is its vocabulary, 256 byte values).

``port.models.get(name, **kwargs)`` builds a fresh torch.nn.Module (seeded by ``seed=`` when given).
``INPUT_SHAPES[name]`` is the per-sample input shape each model expects by default; ``TOKEN_DATA[name]`` the
data kind of a model whose input is int64 token ids (``example_input`` builds either kind of input).
"""
from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any, Callable

INPUT_SHAPES: dict[str, tuple[int, ...]] = {
    "resnet8": (3, 32, 32), "resnet18": (3, 32, 32), "vgg11": (3, 32, 32), "vgg16": (3, 32, 32),
    "mobilenetv2": (3, 32, 32), "digits_cnn": (1, 8, 8), "mlp": (64,), "resnet50": (3, 32, 32), "resnet101": (3, 32, 32),
    "bert_tiny": (128,), "gpt_tiny": (128,),
}
# token models: the data kind (port.train.data) and class count a run without a config uses
TOKEN_DATA: dict[str, tuple[str, int]] = {"bert_tiny": ("text_files", 4), "gpt_tiny": ("text", 256)}


def example_input(batch: int, shape: tuple[int, ...], tokens: bool, generator: Any = None):
    """A random batch: float32 normal samples, or int64 byte tokens in [1, 256) (0 is bert_tiny's padding id)."""
    import torch
    if tokens:
        return torch.randint(1, 256, (batch, *shape), generator=generator)
    return torch.randn(batch, *shape, generator=generator)


def _nn():
    import torch.nn as nn
    return nn


@functools.cache
def _classes() -> SimpleNamespace:
    """The zoo's module classes, made once per process (torch is imported on first use, not with this module).
    One class object per model kind: port.ir.trace's capture cache keys a module by its class, so a class made
    anew by every factory call never let a second ``get("resnet8")`` reuse the first one's capture."""
    nn = _nn()

    class BasicBlock(nn.Module):
        def __init__(self, in_c: int, out_c: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(in_c, out_c, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(out_c)
            self.relu1 = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(out_c, out_c, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(out_c)
            self.relu2 = nn.ReLU(inplace=True)
            if stride != 1 or in_c != out_c:
                self.shortcut = nn.Sequential(nn.Conv2d(in_c, out_c, 1, stride, bias=False), nn.BatchNorm2d(out_c))
            else:
                self.shortcut = nn.Identity()

        def forward(self, x):
            out = self.relu1(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu2(out + self.shortcut(x))

    class Bottleneck(nn.Module):
        def __init__(self, in_c: int, mid: int, stride: int) -> None:
            super().__init__()
            out_c = mid * 4
            self.conv1 = nn.Conv2d(in_c, mid, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(mid)
            self.relu1 = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(mid)
            self.relu2 = nn.ReLU(inplace=True)
            self.conv3 = nn.Conv2d(mid, out_c, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(out_c)
            self.relu3 = nn.ReLU(inplace=True)
            if stride != 1 or in_c != out_c:
                self.shortcut = nn.Sequential(nn.Conv2d(in_c, out_c, 1, stride, bias=False), nn.BatchNorm2d(out_c))
            else:
                self.shortcut = nn.Identity()

        def forward(self, x):
            out = self.relu1(self.bn1(self.conv1(x)))
            out = self.relu2(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu3(out + self.shortcut(x))

    class ResNet(nn.Module):
        def __init__(self, blocks: tuple[int, ...], widths: tuple[int, ...], num_classes: int,
                     bottleneck: bool) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(widths[0])
            self.relu = nn.ReLU(inplace=True)
            layers = []
            in_c = widths[0]
            for i, (n, w) in enumerate(zip(blocks, widths)):
                stage = []
                for j in range(n):
                    stride = 2 if (i > 0 and j == 0) else 1
                    if bottleneck:
                        stage.append(Bottleneck(in_c, w, stride))
                        in_c = w * 4
                    else:
                        stage.append(BasicBlock(in_c, w, stride))
                        in_c = w
                layers.append(nn.Sequential(*stage))
            for i, l in enumerate(layers):
                setattr(self, f"layer{i + 1}", l)
            self.n_stages = len(layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.flatten = nn.Flatten()
            self.fc = nn.Linear(in_c, num_classes)

        def forward(self, x):
            x = self.relu(self.bn1(self.conv1(x)))
            for i in range(self.n_stages):
                x = getattr(self, f"layer{i + 1}")(x)
            return self.fc(self.flatten(self.pool(x)))

    class InvertedResidual(nn.Module):
        def __init__(self, inp: int, oup: int, stride: int, expand: int) -> None:
            super().__init__()
            hidden = int(round(inp * expand))
            self.use_res = stride == 1 and inp == oup
            layers = []
            if expand != 1:
                layers.append(_conv_bn(inp, hidden, 1, 1))
            layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden), _conv_bn(hidden, oup, 1, 1, act=False)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            if self.use_res:
                return x + self.conv(x)
            return self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self, feats: list, last: int, num_classes: int, dropout: float) -> None:
            super().__init__()
            self.features = nn.Sequential(*feats)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.flatten = nn.Flatten()
            self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
            self.classifier = nn.Linear(last, num_classes)

        def forward(self, x):
            return self.classifier(self.dropout(self.flatten(self.pool(self.features(x)))))

    return SimpleNamespace(BasicBlock=BasicBlock, Bottleneck=Bottleneck, ResNet=ResNet,
                           InvertedResidual=InvertedResidual, MobileNetV2=MobileNetV2)


def _conv_bn(inp: int, oup: int, k: int, s: int, groups: int = 1, act: bool = True):
    nn = _nn()
    mods = [nn.Conv2d(inp, oup, k, s, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(oup)]
    if act:
        mods.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*mods)


def resnet_cifar(blocks: tuple[int, ...], widths: tuple[int, ...], num_classes: int = 10, bottleneck: bool = False):
    """CIFAR ResNet: 3x3 stem at stride 1, no max-pool, stages of basic (or bottleneck) blocks."""
    return _classes().ResNet(tuple(blocks), tuple(widths), num_classes, bottleneck)


VGG_CFG = {
    "vgg11": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
}


def vgg_cifar(cfg: tuple, num_classes: int = 10, dropout: float = 0.0):
    """VGG with batch norm for 32x32 inputs: conv-bn-relu stacks, 2x2 max-pools, one linear classifier."""
    nn = _nn()
    layers: list[Any] = []
    c = 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(c, v, 3, 1, 1, bias=False), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
            c = v
    head: list[Any] = [nn.Flatten()]
    if dropout:
        head.append(nn.Dropout(dropout))
    head.append(nn.Linear(c, num_classes))
    return nn.Sequential(nn.Sequential(*layers), nn.Sequential(*head))


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def mobilenetv2_cifar(num_classes: int = 10, width_mult: float = 1.0, dropout: float = 0.2):
    """MobileNetV2 for 32x32 inputs: stride-1 stem and first two stages at stride 1 (as in CIFAR ports)."""
    C = _classes()
    # t, c, n, s   (CIFAR: strides of the first two stages set to 1)
    settings = [(1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]
    inp = _make_divisible(32 * width_mult)
    last = _make_divisible(1280 * max(1.0, width_mult))
    feats: list[Any] = [_conv_bn(3, inp, 3, 1)]
    for t, c, n, s in settings:
        out = _make_divisible(c * width_mult)
        for i in range(n):
            feats.append(C.InvertedResidual(inp, out, s if i == 0 else 1, t))
            inp = out
    feats.append(_conv_bn(inp, last, 1, 1))
    return C.MobileNetV2(feats, last, num_classes, dropout)


def digits_cnn(num_classes: int = 10, width: int = 16):
    """A small CNN for scikit-learn's 8x8 handwritten digits ([N, 1, 8, 8])."""
    nn = _nn()
    return nn.Sequential(
        nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        nn.Conv2d(width, 2 * width, 3, 1, 1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(2 * width, 2 * width, 3, 1, 1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, num_classes),
    )


def mlp(in_features: int = 64, hidden: tuple[int, ...] = (128, 64), num_classes: int = 10, dropout: float = 0.1):
    """A multi-layer perceptron (default: flattened 8x8 digits)."""
    nn = _nn()
    layers: list[Any] = []
    d = in_features
    for h in hidden:
        layers += [nn.Linear(d, h), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        d = h
    layers.append(nn.Linear(d, num_classes))
    return nn.Sequential(*layers)


ZOO: dict[str, Callable[..., Any]] = {
    "resnet8": lambda **kw: resnet_cifar((1, 1, 1), (16, 32, 64), **kw),
    "resnet18": lambda **kw: resnet_cifar((2, 2, 2, 2), (64, 128, 256, 512), **kw),
    "resnet50": lambda **kw: resnet_cifar((3, 4, 6, 3), (64, 128, 256, 512), bottleneck=True, **kw),
    "resnet101": lambda **kw: resnet_cifar((3, 4, 23, 3), (64, 128, 256, 512), bottleneck=True, **kw),
    "vgg11": lambda **kw: vgg_cifar(VGG_CFG["vgg11"], **kw),
    "vgg16": lambda **kw: vgg_cifar(VGG_CFG["vgg16"], **kw),
    "mobilenetv2": mobilenetv2_cifar,
    "digits_cnn": digits_cnn,
    "mlp": mlp,
    "bert_tiny": lambda **kw: _transformers().bert_tiny(**kw),
    # a language model's classes are its vocabulary
    "gpt_tiny": lambda num_classes=256, **kw: _transformers().gpt_tiny(vocab=num_classes, **kw),
}


def _transformers():
    from port import transformers
    return transformers


def names() -> list[str]:
    return sorted(ZOO)


def get(name: str, seed: int | None = None, **kwargs: Any):
    """Build zoo model ``name``; ``seed`` fixes its initial weights."""
    if name not in ZOO:
        raise KeyError(f"unknown model {name!r}; the zoo has: {', '.join(names())} "
                       f"(or give 'package.module:factory' in a config)")
    import torch
    if seed is not None:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return ZOO[name](**kwargs)
    return ZOO[name](**kwargs)


def load(spec: str, **kwargs: Any):
    """A zoo name or 'package.module:factory'."""
    if ":" in spec:
        import importlib
        mod, _, fn = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError) as e:
            raise KeyError(f"cannot load model factory {spec!r}: {e}") from None
        return factory(**kwargs)
    return get(spec, **kwargs)
