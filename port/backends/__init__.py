"""Execution backends: each turns a lowered ``Call`` into a zero-argument Python callable that runs it on
the shared arena. ``c`` runs PORT's C kernel library on raw arena addresses; ``torch-cpu``/``torch-cuda`` run
the same graph ops through torch (aten) calls on views of the arena.

Interface (``Backend``):
  name: str
  workspace_bytes(kernel, variant, attrs, in_shapes, out_shapes) -> int   (at lowering time)
  bind(call, ctx) -> callable                                             (at executor set-up)
where ``ctx`` (port.executor.BindContext) gives ``ptr(tid)``, ``view(tid)``, ``ws_ptr(call)``,
``ws_view(call)``, ``shape(tid)`` and the mutable run-time ``state`` (step counter, optimizer, dropout seed).
"""
from __future__ import annotations

_BACKENDS: dict = {}


def get_backend(name: str):
    b = _BACKENDS.get(name)
    if b is not None:
        return b
    if name == "c":
        from .c import CBackend
        b = CBackend()
    elif name == "torch-cpu":
        from .torch_backend import TorchBackend
        b = TorchBackend("cpu")
    elif name == "torch-cuda":
        from .torch_backend import TorchBackend
        b = TorchBackend("cuda")
    else:
        from ..errors import PlanError
        raise PlanError(f"unknown backend {name!r}; known: c, torch-cpu, torch-cuda")
    _BACKENDS[name] = b
    return b


def dropout_seed(base_seed: int, counter: int, op: int) -> int:
    """Per-call dropout seed: a 64-bit mix of (run seed, forward-pass counter, op id) (splitmix64)."""
    z = (base_seed * 0x9E3779B97F4A7C15 + counter * 0xBF58476D1CE4E5B9 + op * 0x94D049BB133111EB + 1) \
        & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)
