"""Export a trained model for inference, batch norm folded into the preceding convolutions.

format="onnx": PyTorch's torch.export-based ONNX exporter (``torch.onnx.export(dynamo=True)``, which needs
onnxscript, a dependency of PORT), the batch dimension dynamic where the model allows it; checked with onnxruntime
against the trained model (logits within 1e-4). format="torch": a ``torch.export`` ExportedProgram
(``torch.export.save``; load it with ``torch.export.load(path).module()``), the same batch rule.

Both are serialized into memory first and written with port.io.atomic_write_bytes: the exporters' own file
writers are C++ that aborts the process (std::terminate) when the disk is full and leaves a truncated file; here
a full disk is a port.errors.DiskFullError naming the file, and the previous export is kept.
"""
from __future__ import annotations

import contextlib
import copy
import io
import logging
from pathlib import Path
from typing import Any, Iterator

from port.errors import PortError
from port.io import atomic_write_bytes


def folded_module(model: Any):
    """An eval-mode copy of ``model`` with every conv -> batch_norm folded (torch.fx fuse)."""
    from torch.fx.experimental.optimization import fuse
    m = copy.deepcopy(model).eval()
    try:
        return fuse(m)
    except Exception:  # noqa: BLE001 - untraceable models: export unfolded
        return m


def export(trainer, path: str | Path, format: str = "onnx", check: bool = True, atol: float = 1e-4) -> Path:
    import torch
    path = Path(path)
    model = trainer.to_torch(_own_copy(trainer.model))
    folded = _one_input(folded_module(model))
    if trainer.example_tokens is not None:       # token ids: the ones the model was traced with
        x = trainer.example_tokens
    else:
        x = torch.randn(trainer.micro_batch, *trainer.example_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = trainer.predict(x)
    buf = io.BytesIO()
    # the batch dimension is dynamic unless the model's code fixes it (Dim.AUTO specialises instead of failing)
    dynamic = ({0: torch.export.Dim.AUTO},)
    if format == "onnx":
        try:
            import onnxscript  # noqa: F401 - the exporter's dependency, named here so that its absence reads well
        except ImportError:
            raise PortError("ONNX export needs onnxscript (a dependency of PORT): pip install -c constraints.txt "
                            "onnxscript, or export with format='torch'") from None
        with torch.no_grad(), _quiet_logger("torch.onnx._internal.exporter._registration"):
            program = torch.onnx.export(folded, (x,), dynamo=True, input_names=["input"], output_names=["logits"],
                                        dynamic_shapes=dynamic, verbose=False)
        buf.write(program.model_proto.SerializeToString())
        if check:
            import onnxruntime as ort
            sess = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
            got = torch.from_numpy(sess.run(None, {"input": x.numpy()})[0])
            err = float((got - want).abs().max())
            if err > atol * max(1.0, float(want.abs().max())):
                raise PortError(f"exported ONNX model differs from the trained model by {err:.2e}")
    elif format == "torch":
        with torch.no_grad():
            program = torch.export.export(folded, (x,), dynamic_shapes=dynamic)
        torch.export.save(program, buf)
    else:
        raise PortError(f"unknown export format {format!r}; choose 'onnx' or 'torch'")
    atomic_write_bytes(path, buf.getvalue())      # checked first, then written whole (or not at all)
    return path


def _one_input(model: Any):
    """``model`` behind a ``forward(x)``: the exporters match dynamic shapes to forward's parameters, and a model
    whose forward takes ``*args`` (peft's wrappers) has none for x (torch.export: "inputs[0] is a tuple, but
    dynamic_shapes[0] is a dict", so `port train` of examples/llama_lora exported nothing)."""
    import torch

    class OneInput(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)
    return OneInput(model)


@contextlib.contextmanager
def _quiet_logger(name: str) -> Iterator[None]:
    """Raise logger ``name`` to ERROR for the block: the exporter's registry logs a line per torchvision op it
    skips when torchvision is absent (not PORT's concern: PORT exports no torchvision op)."""
    log = logging.getLogger(name)
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(old)


def _own_copy(model: Any):
    """A deep copy of ``model`` with its own parameter and buffer storage: the trainer's module holds views of
    the arena, which deepcopy would copy whole (once per storage); tensors are cloned one by one instead."""
    import torch
    memo: dict[int, Any] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in memo:
            c = t.detach().clone()
            memo[id(t)] = torch.nn.Parameter(c, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else c
    return copy.deepcopy(model, memo)
