"""Execution backends (reached only through port.exec.registry): each turns a lowered ``Call`` into a zero-argument Python callable that runs it on
the shared arena. ``c`` runs PORT's C kernel library on raw arena addresses; ``torch-cpu``/``torch-cuda`` run
the same graph ops through torch (aten) calls on views of the arena.

Interface (``Backend``):
  name: str
  workspace_bytes(kernel, variant, attrs, in_shapes, out_shapes) -> int   (at lowering time)
  bind(call, ctx) -> callable                                             (at executor set-up)
where ``ctx`` (port.exec.executor.BindContext) gives ``ptr(tid)``, ``view(tid)``, ``ws_ptr(call)``,
``ws_view(call)``, ``shape(tid)`` and the mutable run-time ``state`` (step counter, optimizer, dropout seed).
"""
from __future__ import annotations
