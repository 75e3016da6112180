"""The ``torch-cpu`` / ``torch-cuda`` backends: the graph ops through torch (aten) calls on views of the arena,
as each op record's torch binding (port.ops) says.

Outputs are written into the arena views (``out=`` where aten has it, else ``copy_``); weight gradients
accumulate (``add_``) and input gradients overwrite, the same contract as the C kernels. Dropout draws its
mask from a torch.Generator seeded with the same per-call seed as the C backend (the masks differ between
backends; each is reproducible).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from port import ops
from port.errors import ProgramError


class TorchEnv(NamedTuple):
    """What a record's torch binding may use: the torch module, its functional API and aten ops, the run state
    (seed, dropout counter, optimizer settings) and the call's op id."""
    torch: Any
    F: Any
    aten: Any
    state: Any
    op: int


class TorchBackend:
    def __init__(self, device: str):
        self.device = device
        self.name = f"torch-{device}"

    def bind(self, call, ctx) -> Callable[[], None]:
        import torch
        import torch.nn.functional as F
        aten = torch.ops.aten
        kind = call.kernel
        a = dict(call.attrs)
        I = [ctx.view(t) for t in call.inputs]
        O = [ctx.view(t) for t in call.outputs]
        where = f"call {call.index} ({call.name}, {kind})"
        if call.variant not in ("plain", "inplace"):
            raise ProgramError(f"{where}: variant {call.variant!r} is not available on {self.name}")

        r = ops.owner(kind)
        run = r.torch(kind, a, I, O, TorchEnv(torch, F, aten, ctx.state, call.op)) \
            if r is not None and r.torch is not None else None
        if run is None:
            raise ProgramError(f"{where}: the {self.name} backend has no implementation of {kind!r}")
        return run

    @staticmethod
    def update_graph_key(call, state) -> tuple | None:
        """The Python scalars ``call``'s update reads when it runs (a CUDA graph replays them as captured: the
        executor re-captures when they change), or None when they change every step (AdamW's bias corrections:
        not captured)."""
        o = state.opt
        if call.attr("optimizer") in ("sgd", "sgd_momentum"):
            return (state.step == 0, o.lr, o.weight_decay, getattr(o, "momentum", 0.0),
                    getattr(o, "dampening", 0.0), getattr(o, "nesterov", False))
        return None
