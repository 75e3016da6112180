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
    d = dict(d)
    name = d.pop("name")
    if name == "SGD":
        return SGD(**d)
    if name == "AdamW":
        d["betas"] = tuple(d["betas"])
        return AdamW(**d)
    raise ValueError(f"unknown optimizer {name!r}")


def from_config(cfg) -> "SGD | AdamW":
    """port.config.OptimizerConfig -> optimizer object."""
    if cfg.name == "adamw":
        return AdamW(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    return SGD(lr=cfg.lr, momentum=cfg.momentum if cfg.name == "sgd_momentum" else 0.0,
               weight_decay=cfg.weight_decay, nesterov=cfg.nesterov)
