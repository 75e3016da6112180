"""Optimizer settings for port.Trainer. The update math runs in the executor (C kernels ``port_sgd_step`` /
``port_adamw_step``, or the torch backend), matching torch.optim.SGD / torch.optim.AdamW (single-tensor, foreach
off). Objects are mutable so a learning-rate schedule can set ``opt.lr`` between steps."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from port.errors import ArgumentError

#: the largest float32: settings run in float32 kernels (C and port-rt), so a larger value would become inf there
#: (port-rt's loader and checkpoint reader hold the same bound, PORT_RT_MAX_SETTING in port_rt.h)
FLOAT32_MAX = 3.4028234663852886e38


def _number(owner: str, key: str, v: object, lo: float, hi: float | None = None, lo_open: bool = False,
            hi_open: bool = True) -> float:
    """``v`` as a float when it is a finite real number in the range (and a finite float32: at most
    FLOAT32_MAX), else an ArgumentError naming ``owner``'s ``key``, the value and the range."""
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and abs(v) <= FLOAT32_MAX \
        and (v > lo if lo_open else v >= lo) and (hi is None or (v < hi if hi_open else v <= hi))
    if not ok:
        rng = (f"{'>' if lo_open else '>='} {lo:g}" if hi is None else
               f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}")
        if hi is None:
            rng += f" and at most {FLOAT32_MAX:.4g} (a float32)"
        raise ArgumentError(f"{owner} {key}={v!r}: expected a finite number {rng}")
    return float(v)


class _Checked:
    """Every field is checked when it is set (at construction and by a schedule between steps, e.g.
    ``opt.lr = 0.01``), with an ArgumentError naming it, the value and the allowed values."""

    def __setattr__(self, key: str, value: object) -> None:
        if key in self.__dataclass_fields__:
            value = self._field(key, value)
        object.__setattr__(self, key, value)

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Every field again, and the rules between fields (Trainer calls this before it traces)."""
        for k in self.__dataclass_fields__:
            self._field(k, getattr(self, k))


@dataclass
class SGD(_Checked):
    """torch.optim.SGD's settings and rules: lr >= 0, momentum in [0, 1), weight_decay >= 0, dampening in
    [0, 1], nesterov only with momentum > 0 and dampening 0."""
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    dampening: float = 0.0

    def _field(self, key: str, v: object) -> object:
        if key == "nesterov":
            if not isinstance(v, bool):
                raise ArgumentError(f"SGD nesterov={v!r}: expected True or False")
            return v
        if key == "momentum":
            return _number("SGD", key, v, 0.0, 1.0)
        if key == "dampening":
            return _number("SGD", key, v, 0.0, 1.0, hi_open=False)
        return _number("SGD", key, v, 0.0)

    def check(self) -> None:
        super().check()
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ArgumentError(f"SGD nesterov=True needs momentum > 0 and dampening 0 (as torch.optim.SGD), got "
                                f"momentum={self.momentum!r}, dampening={self.dampening!r}")

    @property
    def graph_name(self) -> str:
        """The optimizer name port.trace uses (decides optimizer-state tensors)."""
        return "sgd_momentum" if self.momentum else "sgd"

    def to_dict(self) -> dict:
        return {"name": "SGD", **asdict(self)}


@dataclass
class AdamW(_Checked):
    """torch.optim.AdamW's settings: lr >= 0, betas two numbers in [0, 1), eps > 0, weight_decay >= 0."""
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2

    graph_name = "adamw"

    def _field(self, key: str, v: object) -> object:
        if key == "betas":
            if not isinstance(v, (list, tuple)) or len(v) != 2:
                raise ArgumentError(f"AdamW betas={v!r}: expected a pair (beta1, beta2) of numbers in [0, 1), "
                                    f"e.g. (0.9, 0.999)")
            return tuple(_number("AdamW", f"betas[{i}]", b, 0.0, 1.0) for i, b in enumerate(v))
        return _number("AdamW", key, v, 0.0, lo_open=key == "eps")

    def to_dict(self) -> dict:
        return {"name": "AdamW", "lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                "weight_decay": self.weight_decay}


def from_dict(d: dict):
    """The inverse of ``to_dict``; raises ValueError (ArgumentError for a value) naming the key for unknown
    names/keys or values outside the optimizer's rules (a checkpoint header is read through here)."""
    if not isinstance(d, dict):
        raise ValueError(f"expected an object, got {type(d).__name__}")
    d = dict(d)
    name = d.pop("name", None)
    cls = {"SGD": SGD, "AdamW": AdamW}.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown optimizer {name!r} (SGD or AdamW)")
    unknown = sorted(set(d) - set(cls.__dataclass_fields__))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} for {name}")
    return cls(**d)


def from_config(cfg) -> "SGD | AdamW":
    """port.config.OptimizerConfig -> optimizer object."""
    if cfg.name == "adamw":
        return AdamW(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    return SGD(lr=cfg.lr, momentum=cfg.momentum if cfg.name == "sgd_momentum" else 0.0,
               weight_decay=cfg.weight_decay, nesterov=cfg.nesterov)
