"""PORT: train neural networks on the device where the data lives, within its memory, across its accelerators.

Pipeline: trace -> profile -> solve -> verify (simulate) -> lower -> execute.

    graph   = port.trace(model, example_input, trainable=None, optimizer="sgd_momentum")
    profile = port.profile(graph, "host")                      # measured + modeled costs
    plan    = port.solve(graph, profile, budget_bytes)         # the ILP; verified by port.simulate
    trainer = port.Trainer(model, example_input, plan=plan, optimizer=port.optim.SGD(0.05, momentum=0.9))

Heavy modules (torch, solvers) are imported lazily so ``import port`` and the CLI start fast.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Before any OpenMP runtime loads (torch's or the kernels'): passive waiting, so idle pool threads do not
# spin on CPUs that other threads need (on a 2-core device a spinning pool costs 100x; see bench/RESULTS.md).
from . import _native as _native_env  # noqa: E402  (imports no torch)

_native_env.configure_openmp_env()

from .errors import (ConfigError, InfeasibleBudgetError, PlanError, PortError, PortTraceError,  # noqa: F401
                     ProfileError, ProgramError)
from .types import Graph, Op, OpCost, OpDecision, Plan, Profile, TensorSpec  # noqa: F401


def trace(model: Any, example_input: Any, loss: str = "cross_entropy", trainable: Any = None,
          optimizer: str = "sgd_momentum", name: str | None = None) -> Graph:
    """Trace a torch.nn.Module into PORT's training graph (see port.graph.trace)."""
    from .graph import trace as _trace
    return _trace(model, example_input, loss=loss, trainable=trainable, optimizer=optimizer, name=name)


# name -> (module, attribute or None for the module itself)
_LAZY = {
    "models": ("port.models", None),
    "config": ("port.config", None),
    "kernels": ("port.kernels", None),
    "optim": ("port.optim", None),
    "variants": ("port.variants", None),
    "solve": ("port.solve", None),          # callable module: port.solve(graph, profile, budget_bytes, ...)
    "simulate": ("port.simulate", None),    # callable module: port.simulate(plan, graph, profile)
    "profile": ("port.profile", None),      # callable module: port.profile(graph, device, ...)
    "Trainer": ("port.trainer", "Trainer"),
    "default_plan": ("port.lower", "default_plan"),
    "lower": ("port.lower", "lower"),
    "load_plan": ("port.plan_io", "load_plan"),
    "save_plan": ("port.plan_io", "save_plan"),
    "load_profile": ("port.profile", "load_profile"),
    "save_profile": ("port.profile", "save_profile"),
    "modeled_profile": ("port.costmodel", "modeled_profile"),
    "load_device": ("port.config", "load_device"),
    "load_experiment": ("port.config", "load_experiment"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        mod, attr = _LAZY[name]
        m = importlib.import_module(mod)
        return getattr(m, attr) if attr else m
    raise AttributeError(f"module 'port' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
