"""Optimizer settings for port.Trainer. The update math runs in the executor (C kernels ``port_sgd_step`` /
``port_adamw_step``, or the torch backend), matching torch.optim.SGD / torch.optim.AdamW (single-tensor, foreach
off). Objects are mutable so a learning-rate schedule can set ``opt.lr`` between steps."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class SGD:
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    dampening: float = 0.0

    @property
    def graph_name(self) -> str:
        """The optimizer name port.trace uses (decides optimizer-state tensors)."""
        return "sgd_momentum" if self.momentum else "sgd"

    def to_dict(self) -> dict:
        return {"name": "SGD", **asdict(self)}


@dataclass
class AdamW:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2

    graph_name = "adamw"

    def to_dict(self) -> dict:
        return {"name": "AdamW", "lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                "weight_decay": self.weight_decay}


def from_dict(d: dict):
    """The inverse of ``to_dict``; raises ValueError naming the key for unknown names/keys or values that are
    not finite numbers in range (a checkpoint header is read through here)."""
    import math
    if not isinstance(d, dict):
        raise ValueError(f"expected an object, got {type(d).__name__}")
    d = dict(d)
    name = d.pop("name", None)
    cls = {"SGD": SGD, "AdamW": AdamW}.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown optimizer {name!r} (SGD or AdamW)")
    fields = set(cls.__dataclass_fields__)
    unknown = sorted(set(d) - fields)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} for {name}")

    def num(k, v, lo=0.0, lo_open=False, hi=None):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo or \
                (lo_open and v == lo) or (hi is not None and v >= hi):
            raise ValueError(f"key {k!r} = {v!r} is not a finite number in range")
        return float(v)
    for k, v in list(d.items()):
        if k == "nesterov":
            if not isinstance(v, bool):
                raise ValueError(f"key 'nesterov' = {v!r} is not a boolean")
        elif k == "betas":
            if not isinstance(v, (list, tuple)) or len(v) != 2:
                raise ValueError(f"key 'betas' = {v!r} is not a pair of numbers")
            d[k] = tuple(num("betas", b, hi=1.0) for b in v)
        else:
            d[k] = num(k, v, lo_open=k in ("lr", "eps"))
    return cls(**d)


def from_config(cfg) -> "SGD | AdamW":
    """port.config.OptimizerConfig -> optimizer object."""
    if cfg.name == "adamw":
        return AdamW(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    return SGD(lr=cfg.lr, momentum=cfg.momentum if cfg.name == "sgd_momentum" else 0.0,
               weight_decay=cfg.weight_decay, nesterov=cfg.nesterov)
