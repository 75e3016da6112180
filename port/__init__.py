"""PORT: train neural networks on the device where the data lives, within its memory, across its accelerators.

Pipeline: trace -> profile -> solve -> verify (simulate) -> lower -> execute. Heavy modules (torch, solvers)
are imported lazily so ``import port`` and the CLI start fast.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from .errors import (ConfigError, InfeasibleBudgetError, PlanError, PortError, PortTraceError,  # noqa: F401
                     ProfileError, ProgramError)
from .types import Graph, Op, TensorSpec  # noqa: F401


def trace(model: Any, example_input: Any, loss: str = "cross_entropy", trainable: Any = None,
          optimizer: str = "sgd_momentum", name: str | None = None) -> Graph:
    """Trace a torch.nn.Module into PORT's training graph (see port.graph.trace)."""
    from .graph import trace as _trace
    return _trace(model, example_input, loss=loss, trainable=trainable, optimizer=optimizer, name=name)


def __getattr__(name: str) -> Any:  # lazy submodules/objects
    import importlib
    lazy = {
        "models": ("port.models", None),
        "config": ("port.config", None),
    }
    if name in lazy:
        mod, attr = lazy[name]
        m = importlib.import_module(mod)
        return getattr(m, attr) if attr else m
    raise AttributeError(f"module 'port' has no attribute {name!r}")
