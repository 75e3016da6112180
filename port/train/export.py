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


def conv_bn_pairs(graph: Any) -> list[tuple[str, str]]:
    """(conv module path, batch norm module path) of every forward conv2d of ``graph`` (the captured training graph:
    its layers are module paths) whose output only a batch_norm2d reads, each module called once."""
    from collections import Counter
    from port.ir.types import PHASE_FORWARD
    fwd = [o for o in graph.ops if o.phase == PHASE_FORWARD]
    calls = Counter(o.layer for o in fwd if o.kind in ("conv2d", "batch_norm2d"))
    readers: dict[int, list] = {}
    for o in fwd:
        for t in set(o.inputs):
            readers.setdefault(t, []).append(o)
    pairs = []
    for c in fwd:
        if c.kind != "conv2d" or c.outputs[0] == graph.logits_id:
            continue
        r = readers.get(c.outputs[0], [])
        if len(r) == 1 and r[0].kind == "batch_norm2d" and r[0].inputs[0] == c.outputs[0] and \
                calls[c.layer] == 1 and calls[r[0].layer] == 1:
            pairs.append((c.layer, r[0].layer))
    return pairs


def folded_module(model: Any, graph: Any = None):
    """An eval-mode copy of ``model`` with every nn.Conv2d -> nn.BatchNorm2d pair of ``graph`` (conv_bn_pairs: the
    capture's own graph, no second tracer) folded: the convolution takes the norm's running statistics and affine
    (torch.nn.utils.fusion.fuse_conv_bn_eval), the norm becomes nn.Identity."""
    import torch.nn as nn
    from torch.nn.utils.fusion import fuse_conv_bn_eval
    m = copy.deepcopy(model).eval()
    if graph is None:
        return m
    for cp, bp in conv_bn_pairs(graph):
        try:
            conv, bn = m.get_submodule(cp), m.get_submodule(bp)
        except AttributeError:
            continue
        if type(conv) is not nn.Conv2d or type(bn) is not nn.BatchNorm2d or bn.running_mean is None:
            continue              # a subclass with its own forward, or a norm without running statistics
        for path, new in ((cp, fuse_conv_bn_eval(conv, bn)), (bp, nn.Identity())):
            parent, _, name = path.rpartition(".")
            setattr(m.get_submodule(parent) if parent else m, name, new)
    return m


def export(trainer, path: str | Path, format: str = "onnx", check: bool = True, atol: float = 1e-4) -> Path:
    import torch
    path = Path(path)
    model = trainer.to_torch(_own_copy(trainer.model))
    folded = _one_input(folded_module(model, trainer.graph))
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
    return OneInput(model).eval()    # the inner copy is eval already; the exporters warn on a training wrapper


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
