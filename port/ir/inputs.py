"""What a model is called with: its example input as named tensors (port.ir.trace traces with it; port.ir.tokens
checks token ids against it)."""
from __future__ import annotations

from typing import Any

from port.errors import PortTraceError


def example_inputs(example_input: Any) -> list[tuple[str, Any]]:
    """[(name, tensor)] of what a model is called with: one tensor ("input"), a tuple of positional tensors
    ("input", "input1", ...) or a dict of keyword tensors (their keys, e.g. input_ids, attention_mask). The first
    is the graph's main input; each must be a tensor [N, ...] with the batch dimension first."""
    import torch
    if isinstance(example_input, torch.Tensor):
        items = [("input", example_input)]
    elif isinstance(example_input, (tuple, list)) and example_input:
        items = [("input" if i == 0 else f"input{i}", v) for i, v in enumerate(example_input)]
    elif isinstance(example_input, dict) and example_input:
        items = [(str(k), v) for k, v in example_input.items()]
    else:
        raise PortTraceError("example_input must be a tensor [N, ...] with the batch dimension first, a tuple of "
                             "such tensors (positional arguments) or a dict of them (keyword arguments)")
    for k, v in items:
        if not isinstance(v, torch.Tensor) or v.dim() < 1 or (k == items[0][0] and v.dim() < 2 and
                                                               v.is_floating_point()):
            raise PortTraceError(f"example input {k!r} must be a tensor [N, ...] with the batch dimension first, "
                                 f"got {type(v).__name__}{list(v.shape) if isinstance(v, torch.Tensor) else ''}")
    return items
