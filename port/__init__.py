"""PORT: train neural networks on the device where the data lives, within its memory, across its accelerators.

Pipeline: trace -> profile -> solve -> verify (simulate) -> lower -> execute.

    graph   = port.trace(model, example_input, trainable=None, optimizer="sgd_momentum")
    profile = port.profile(graph, "host", quick=True)          # measured (present) + modeled (absent) costs
    plan    = port.solve(graph, profile, budget="75%")         # the ILP; bytes, "64MB", "1.5GiB" or "NN%" of
                                                               # the keep-everything peak; verified by simulate
    sim     = port.simulate(plan, graph, profile)              # predicted step time and memory timeline
    trainer = port.Trainer(model, example_input, plan=plan, optimizer=port.optim.SGD(0.05, momentum=0.9))

``port.pipeline`` chains the same steps from a config file (what every `port` command runs).
Heavy modules (torch, pydantic, numpy, solvers) are imported lazily so ``import port`` and the CLI start fast.
"""
from __future__ import annotations

import importlib
from typing import Any

from port.version import __version__  # noqa: F401

# Before any OpenMP runtime loads (torch's or the kernels'): passive waiting, so idle pool threads do not
# spin on CPUs that other threads need (on a 2-core device a spinning pool costs 100x; see bench/RESULTS.md).
from port.exec import capi as _capi  # noqa: E402  (imports no torch, loads no library)

_capi.configure_openmp_env()

from port.errors import (ArgumentError, ConfigError, InfeasibleBudgetError, PlanError,  # noqa: E402,F401
                         PortError, PortTraceError, ProfileError, ProgramError, TokenError)
from port.ir.types import Graph, Op, TensorSpec  # noqa: E402,F401
from port.cost.types import OpCost, Profile  # noqa: E402,F401
from port.plan.types import OpDecision, Plan  # noqa: E402,F401


def trace(model: Any, example_input: Any, loss: str = "cross_entropy", trainable: Any = None,
          optimizer: str = "sgd_momentum", name: str | None = None, output: Any = None) -> Graph:
    """Capture a torch.nn.Module into PORT's training graph (see port.ir.trace.trace)."""
    from port.ir.trace import trace as _trace
    return _trace(model, example_input, loss=loss, trainable=trainable, optimizer=optimizer, name=name,
                  output=output)


def profile(graph: Graph, device: Any, quick: bool = False, **kw: Any) -> Profile:
    """Measure (present accelerators) or model (the rest) every op of ``graph`` on ``device`` (a device name,
    a path to a device YAML or a DeviceConfig). ``quick=True``: fewer, shorter timing blocks (as
    `port profile --quick`). Other options: see port.cost.measure.profile (cache, max_time_s, progress, ...)."""
    from port.cost import measure as M
    if quick:
        kw.setdefault("blocks", M.QUICK_BLOCKS)
        kw.setdefault("block_ms", M.QUICK_BLOCK_MS)
        kw.setdefault("warmup_ms", M.QUICK_WARMUP_MS)
    return M.profile(graph, device, **kw)


def solve(graph: Graph, profile: Profile, budget: Any = None, solver: str = "highs", **kw: Any) -> Plan:
    """The fastest plan of one training step of ``graph`` within the memory ``budget``: bytes (int),
    ``"64MB"``, ``"1.5GiB"`` or ``"75%"`` of the keep-everything peak (port.solver.budget.keep_everything_peak);
    None: the device memory. Keywords: time_limit_s, gap, allow_early_updates, ... (port.solver.solve)."""
    from port.solver import solve as _solve
    return _solve(graph, profile, budget, solver=solver, **kw)


def simulate(plan: Plan, graph: Graph, profile: Profile) -> Any:
    """Replay ``plan``: predicted step time and memory timeline (port.verify.simulate.SimResult)."""
    from port.verify.simulate import simulate as _simulate
    return _simulate(plan, graph, profile)


def compile(trainer: Any, path: Any, sign_key: bytes | None = None) -> Any:   # noqa: A001 - the verb users expect
    """Write ``trainer`` (its plan's programs and current state) as a port-rt bundle at ``path``; returns
    port.exec.bundle.BundleInfo. Plans with torch-backend ops are refused, naming them. ``sign_key``
    (port.exec.bundle.load_key): sign it with HMAC-SHA-256 for `port-rt --key FILE --require-signed`."""
    from port.exec.bundle import write_bundle
    return write_bundle(trainer, path, sign_key=sign_key)


# name -> (module, attribute or None for the module itself)
_LAZY = {
    "models": ("port.models", None),
    "config": ("port.config", None),
    "kernels": ("port.exec.capi", None),    # the C library's settings: threads, GEMM backend
    "optim": ("port.train.optim", None),
    "Trainer": ("port.train.trainer", "Trainer"),
    "default_plan": ("port.lower.lower", "default_plan"),
    "load_plan": ("port.plan.io", "load_plan"),
    "save_plan": ("port.plan.io", "save_plan"),
    "load_profile": ("port.cost.io", "load_profile"),
    "save_profile": ("port.cost.io", "save_profile"),
    "modeled_profile": ("port.cost.roofline", "modeled_profile"),
    "load_device": ("port.config", "load_device"),
    "load_experiment": ("port.config", "load_experiment"),
    "keep_everything_peak": ("port.solver.budget", "keep_everything_peak"),
    "run_training": ("port.pipeline", "run_training"),
}

# the stages, one folder each (importing one never imports torch or a solver by itself)
_SUBPACKAGES = ("ir", "plan", "cost", "solver", "verify", "lower", "exec", "train", "cli", "pipeline", "io",
                "errors")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        mod, attr = _LAZY[name]
        m = importlib.import_module(mod)
        return getattr(m, attr) if attr else m
    if name in _SUBPACKAGES:
        return importlib.import_module(f"port.{name}")
    raise AttributeError(f"module 'port' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
