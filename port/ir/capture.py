"""Capture: a torch.nn.Module -> its forward ops, through ``torch.export`` (PyTorch's supported capture path).

``torch.export.export(model, args, kwargs, strict=False)`` runs the user's code as written (shape arithmetic,
``B, T = x.shape``, buffers sliced by a length, optional arguments, norm subclasses with their own ``forward``)
and records aten ops with their module paths (``node.meta["nn_module_stack"]``); ``run_decompositions({})``
then removes mutation (in-place ops become their functional forms, batch-norm running statistics become
outputs) without decomposing any op. Each aten node becomes one forward op of the training graph:

* an op PORT has a kernel kind for (conv2d, batch norm, linear, relu, pools, layer norm, attention, ...) becomes
  that kind, as before;
* a view that keeps the bytes (view, reshape, flatten, (un)squeeze, a full slice, clone) aliases its input;
* every other aten op becomes a ``torch_op``: its forward calls the aten op itself on the torch backend, its
  backward is PyTorch's own derivative of that op (autograd over the op re-run on its saved inputs). Its call
  (the aten overload and its non-tensor arguments) is stored in the op's attributes as JSON (``call``), so the
  graph stays plain data. A model is refused only for what cannot train, never for an unknown op.

Layer names stay module paths: an op that is the first op of a leaf module (a module without children) is named
by the module's path (``layer1.0.conv1``), other ops by their aten node name within their module's path.
"""
from __future__ import annotations

import json
import math
import traceback
from typing import Any, Callable

from port.errors import PortTraceError
from port.ir.types import DTYPE_BYTES, ROLE_ACTIVATION, ROLE_BUFFER, ROLE_INPUT, ROLE_PARAMETER, numel

TORCH_OP = "torch_op"
CONSTANT = "port.tensor_constant"   # the call of a torch_op that makes a small lifted tensor constant
MAX_CONSTANT_NUMEL = 4096     # lifted tensor constants up to this size are stored in the graph (attrs)


# ---------------------------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------------------------
def export(model: Any, args: tuple, kwargs: dict, model_name: str):
    """The functional ExportedProgram of ``model`` on (args, kwargs); PortTraceError naming the user's code
    where export fails."""
    import logging
    import warnings
    import torch
    # fake tensors log every failing meta kernel with its whole traceback at ERROR before export raises: the
    # PortTraceError below says it once, in the user's terms
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    try:
        fake_log.setLevel(logging.CRITICAL)
        with warnings.catch_warnings():     # torch's own deprecation notices about its pytree internals
            warnings.simplefilter("ignore", FutureWarning)
            ep = torch.export.export(model, args, kwargs, strict=False)
            return ep.run_decompositions({})
    except Exception as e:  # noqa: BLE001 - export raises many kinds; one clear error
        msg = str(e).strip().splitlines()
        first = msg[0] if msg else type(e).__name__
        where = f" at module path '{raising_module(e, model) or '<root>'}'{user_frame(e)}"
        if "leaf Variable that requires grad" in str(e):
            raise PortTraceError(
                f"{model_name}: an in-place write to a parameter{where} ({first}): PORT trains parameters "
                f"only through their gradients. Fix: compute a new tensor (w = self.weight * 0.5) instead of "
                f"writing into the parameter.") from None
        what = ("data-dependent control flow or shapes" if any(s in str(e) for s in (
            "data-dependent", "Could not guard", "GuardOnDataDependent", "control flow", "Data dependent"))
            else "code torch.export cannot capture")
        raise PortTraceError(
            f"{model_name}: {what}{where}: PORT captures the model with torch.export and needs a graph "
            f"whose ops and shapes do not depend on the data ({type(e).__name__}: {first}). Fix: make the "
            f"branch or shape depend on sizes only, or move that code out of the trained module.") from None
    finally:
        fake_log.setLevel(level)


def raising_module(e: BaseException, model: Any) -> str:
    """The path of the innermost submodule of ``model`` whose method is on ``e``'s traceback ('' for the root or
    none): the module whose code raised."""
    names = {id(m): n for n, m in model.named_modules()}
    found = ""
    tb = e.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if id(owner) in names:
            found = names[id(owner)]
        tb = tb.tb_next
    return found


def check_eager(model: Any, args: tuple, kwargs: dict, model_name: str) -> None:
    """PortTraceError when ``model`` (a copy PORT may run) raises on (args, kwargs) in PyTorch itself: the failure
    is the model's or the example input's, not the capture's (a shape mismatch, a wrong input size)."""
    import torch
    names = {id(m): n for n, m in model.named_modules()}
    running: list[str] = []           # module paths entered and not left: the innermost is where it raised

    def enter(mod, _args) -> None:
        running.append(names[id(mod)])

    def leave(_mod, _args, _out) -> None:
        running.pop()
    hooks = [h for m in model.modules() for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - whatever the user's forward raises
        msg = str(e).strip().splitlines()
        raise PortTraceError(
            f"{model_name}: forward() raises on the example input in PyTorch itself at module path "
            f"'{running[-1] if running and running[-1] else '<root>'}'{user_frame(e)} "
            f"({type(e).__name__}: {msg[0] if msg else ''}); inputs were "
            f"{[tuple(t.shape) for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)]}. "
            f"Fix: make model(example_input) run in PyTorch first (the input's shape and dtype, the layers' "
            f"sizes).") from None
    finally:
        for h in hooks:
            h.remove()


def _is_port_file(fn: str) -> bool:
    """A frame inside PORT's own package (this directory's parent), not any path containing '/port/'."""
    import os
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.abspath(fn).startswith(pkg + os.sep)


def _is_library_file(fn: str) -> bool:
    return (fn.startswith("<") or _is_port_file(fn) or "/torch/" in fn or "/site-packages/torch" in fn
            or "/dist-packages/torch" in fn)


def user_frame(e: BaseException) -> str:
    """' (file:line, in function)' of the innermost frame of the user's code in ``e``'s traceback ('' if none)."""
    tb = traceback.extract_tb(e.__traceback__)
    for fr in reversed(tb):
        if not _is_library_file(fr.filename):
            return f" ({fr.filename}:{fr.lineno}, in {fr.name})"
    return ""


def source_line(node: Any) -> str:
    """'file:line: code' of the user's line that made ``node`` (from export's stack trace; '' if none)."""
    st = node.meta.get("stack_trace") or ""
    lines = st.strip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        s = lines[i].strip()
        if s.startswith('File "'):
            fn = s.split('"')[1]
            if _is_library_file(fn):
                continue
            ln = s.split("line ")[1].split(",")[0] if "line " in s else "?"
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f"{fn}:{ln}" + (f": {code}" if code else "")
    return ""


def module_path(node: Any) -> tuple[str, str]:
    """(innermost module path, its class name) of an exported node ('' for the root)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, cls = list(stack.values())[-1]
    cls = cls if isinstance(cls, str) else getattr(cls, "__qualname__", str(cls))
    return _clean_path(path), cls.rsplit(".", 1)[-1]


def _clean_path(path: str) -> str:
    """export's module path ('L['self'].layer1[0].conv1' forms included) as a dotted path."""
    p = path.replace("L['self'].", "").replace("L['self']", "")
    out = []
    for part in p.replace("[", ".").replace("]", "").split("."):
        part = part.strip("'\"")
        if part:
            out.append(part)
    return ".".join(out)


# ---------------------------------------------------------------------------------------------
# the call of a torch_op, as plain data
# ---------------------------------------------------------------------------------------------
def op_name(target: Any) -> str:
    """'aten.cat.default' for torch.ops.aten.cat.default."""
    return f"{target.namespace}.{target._overloadpacket.__name__}.{target._overloadname}"


def resolve_op(name: str):
    import torch
    ns, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, ns), packet), overload)


def encode_arg(a: Any, tensor_index: Callable[[Any], int]) -> Any:
    """An aten argument as JSON: tensors {"t": i} (the op's i-th input), dtypes {"dtype": name}, devices dropped
    to the one the op runs on ({"device": 1}), lists as lists, numbers and strings as they are."""
    import torch
    import torch.fx as fx
    if isinstance(a, fx.Node):
        return {"t": tensor_index(a)}
    if isinstance(a, (list, tuple)):
        return [encode_arg(x, tensor_index) for x in a]
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).replace("torch.", "")}
    if isinstance(a, torch.device):
        return {"device": 1}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).replace("torch.", "")}
    if isinstance(a, torch.layout):
        return {"layout": str(a).replace("torch.", "")}
    if isinstance(a, float) and not math.isfinite(a):
        return {"float": repr(a)}
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    raise TypeError(f"argument {a!r} ({type(a).__name__})")


def decode_arg(a: Any, tensors: list, device: Any) -> Any:
    import torch
    if isinstance(a, list):
        return [decode_arg(x, tensors, device) for x in a]
    if isinstance(a, dict):
        if "t" in a:
            return tensors[a["t"]]
        if "dtype" in a:
            return getattr(torch, a["dtype"])
        if "device" in a:
            return device
        if "memory_format" in a:
            return getattr(torch, a["memory_format"])
        if "layout" in a:
            return getattr(torch, a["layout"])
        if "float" in a:
            return float(a["float"])
    return a


def call_json(target: Any, args: Any, kwargs: dict, index: int | None, tensor_index) -> str:
    d = {"op": op_name(target), "args": encode_arg(list(args), tensor_index),
         "kwargs": {k: encode_arg(v, tensor_index) for k, v in sorted(kwargs.items())}}
    if index is not None:
        d["index"] = index
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def make_call(call: str, device: Any) -> Callable[[list], Any]:
    """fn(tensors) -> the op's result (its ``index``-th output for a multi-output op), from a ``call`` JSON."""
    import torch
    d = json.loads(call)
    if d["op"] == CONSTANT:
        value = torch.tensor(d["values"], dtype=getattr(torch, d["dtype"]), device=device).reshape(d["shape"])
        return lambda tensors: value
    fn = resolve_op(d["op"])
    args, kwargs, index = d["args"], d["kwargs"], d.get("index")

    def run(tensors: list):
        r = fn(*decode_arg(args, tensors, device), **{k: decode_arg(v, tensors, device) for k, v in kwargs.items()})
        return r[index] if index is not None else r
    return run


def is_random(call: str) -> bool:
    """The aten op draws random numbers (PORT seeds it per call: a re-run draws the same values)."""
    import torch
    name = json.loads(call)["op"]
    return name != CONSTANT and torch.Tag.nondeterministic_seeded in resolve_op(name).tags


def check_constant(value: Any, target: str, model_name: str = "") -> None:
    """PortTraceError when a lifted tensor constant is too large to store in the graph (register it as a buffer)."""
    if value.numel() > MAX_CONSTANT_NUMEL:
        raise PortTraceError(
            f"{model_name + ': ' if model_name else ''}the tensor constant '{target}' ({list(value.shape)}) is made "
            f"in forward() or kept as a plain attribute; PORT keeps constants of at most {MAX_CONSTANT_NUMEL} "
            f"elements in the graph. Fix: register it as a buffer (self.register_buffer(...)).")


def constant_call(value: Any) -> str:
    """The call of a torch_op that makes a small lifted tensor constant (its values stored in the graph)."""
    return json.dumps({"op": CONSTANT, "dtype": str(value.dtype).replace("torch.", ""),
                       "shape": list(value.shape), "values": value.detach().reshape(-1).tolist()},
                      sort_keys=True, separators=(",", ":"))


def aten_of(op: Any) -> str:
    """The aten op a torch_op runs ('aten.silu.default'; 'tensor constant' for a stored constant)."""
    d = json.loads(op.attr("call"))
    return "tensor constant" if d["op"] == CONSTANT else d["op"]


def torch_ops(graph: Any) -> list[tuple[str, str]]:
    """(op name, what runs it) of every forward op with no C kernel, which therefore runs on PyTorch's kernels
    (the torch engines) and cannot go into a port-rt bundle: a ``torch_op`` (named by its aten op) or an op
    whose record has a torch binding only (named by its kind)."""
    from port import ops
    return [(o.name, aten_of(o) if o.kind == TORCH_OP else o.kind) for o in graph.ops
            if o.phase == "forward" and not ops.has_c(o.kind, dict(o.attrs))]


def dtype_name(dt: Any) -> str:
    s = str(dt).replace("torch.", "")
    if s not in DTYPE_BYTES:
        raise PortTraceError(f"unsupported tensor dtype {s}; PORT's tensors are "
                             f"{', '.join(sorted(DTYPE_BYTES))}")
    return s


def val_of(node: Any):
    """The fake tensor (or tuple of them) export recorded as ``node``'s value."""
    return node.meta.get("val")


def is_float(dtype: str) -> bool:
    return dtype.startswith("float")


__all__ = ["TORCH_OP", "export", "make_call", "call_json", "constant_call", "is_random", "module_path",
           "source_line", "user_frame", "val_of", "dtype_name", "check_constant", "ROLE_ACTIVATION", "ROLE_BUFFER",
           "ROLE_INPUT", "ROLE_PARAMETER", "numel", "MAX_CONSTANT_NUMEL"]
