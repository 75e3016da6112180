"""trace(): any supported torch.nn.Module -> an immutable training Graph.

Forward ops come from torch.fx symbolic tracing plus shape propagation (module paths kept as layer
names). Backward ops are derived here from the forward ops (input-gradient and weight-gradient as
separate ops), followed by one optimizer-update op per trainable parameter.

Saved tensors follow PyTorch autograd's own choice for the plain kernels (relu saves its output,
batch norm its input and statistics, max-pool its indices, ...) so the graph's memory figures can be
checked against autograd. Frozen parameters get no weight-gradient op, and activations needed only by
pruned weight gradients are not saved (sparse update).
"""
from __future__ import annotations

import copy
import fnmatch
import operator
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from port.errors import PortTraceError
from port.ir import seqops
from port.ir.types import DTYPE_BYTES, PHASE_BACKWARD, PHASE_FORWARD, PHASE_LOSS, PHASE_UPDATE, ROLE_ACTIVATION, ROLE_BUFFER, ROLE_GRADIENT, ROLE_INPUT, ROLE_LABEL, ROLE_OPTIMIZER_STATE, ROLE_PARAMETER, Graph, Op, TensorSpec, numel

SUPPORTED_OPS = (
    "conv2d (any groups, stride, padding, bias or not)", "batch_norm2d (training or frozen/eval)",
    "relu", "relu6", "hardswish", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d to 1x1 / mean over H,W",
    "flatten/view/reshape", "linear (on [..., features])", "add (residual; a trailing-shape operand broadcast)",
    "dropout", "identity", "embedding", "layer_norm (last dim)", "gelu (exact, tanh)", "tanh",
    "softmax (last dim)", "matmul/bmm", "scaled_dot_product_attention (causal, key-padding mask)",
    "transpose/permute", "contiguous", "mul/div by a constant", "mean over a non-last dim", "arange", "!= constant",
)
SUPPORTED_LOSSES = ("cross_entropy",)
IGNORE_INDEX = -100      # token-level cross-entropy skips these labels (torch's default ignore_index)
OPTIMIZERS = {"sgd": 0, "sgd_momentum": 1, "adamw": 2}  # optimizer-state tensors per parameter


def _supported_list() -> str:
    return ", ".join(SUPPORTED_OPS)


# ---------------------------------------------------------------------------------------------
# builder
# ---------------------------------------------------------------------------------------------
@dataclass
class _Builder:
    tensors: list[TensorSpec] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    names: set[str] = field(default_factory=set)

    def tensor(self, name: str, shape: Sequence[int], dtype: str, role: str, **kw: Any) -> int:
        tid = len(self.tensors)
        self.tensors.append(TensorSpec(tid, name, tuple(int(s) for s in shape), dtype, role, **kw))
        return tid

    def unique(self, name: str) -> str:
        base, i = name, 1
        while name in self.names:
            i += 1
            name = f"{base}_{i}"
        self.names.add(name)
        return name

    def op(self, name: str, layer: str, kind: str, phase: str, attrs: dict[str, Any],
           inputs: Iterable[int], outputs: Iterable[int], saved: Iterable[int] = (), flops: int = 0,
           vector_flops: int = 0, forward_op: int | None = None) -> int:
        inputs, outputs = tuple(inputs), tuple(outputs)
        moved = sum(self.tensors[t].bytes for t in inputs + outputs)
        oid = len(self.ops)
        norm_attrs = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))
        self.ops.append(Op(oid, self.unique(name), layer, kind, phase, norm_attrs, inputs, outputs,
                           tuple(dict.fromkeys(saved)), int(flops), int(vector_flops), int(moved),
                           forward_op))
        return oid


@dataclass
class _Fwd:
    """A forward op before it is frozen into an Op: what backward generation needs to know."""
    name: str
    layer: str
    kind: str
    attrs: dict[str, Any]
    x: tuple[int, ...]                  # activation inputs (may carry gradients)
    params: dict[str, int]              # "weight"/"bias" -> parameter tensor id
    buffers: dict[str, int]             # "running_mean"/"running_var" -> buffer tensor id
    outputs: tuple[int, ...]            # first is the main output; others auxiliary (indices, mask, stats)
    flops: int = 0
    vector_flops: int = 0
    op_id: int = -1


def meta_copy(model: Any) -> Any:
    """A deep copy of ``model`` whose parameters and buffers are meta tensors (same shapes, dtypes,
    requires_grad and sharing: a tied parameter stays one object), so the copy holds no tensor memory.
    None if the model cannot be copied that way."""
    import torch
    memo: dict[int, Any] = {}
    try:
        for t in list(model.parameters()) + list(model.buffers()):
            if id(t) in memo:
                continue
            m = torch.empty_like(t, device="meta")
            if isinstance(t, torch.nn.Parameter):
                m = torch.nn.Parameter(m, requires_grad=t.requires_grad)
            memo[id(t)] = m
        return copy.deepcopy(model, memo)
    except Exception:  # noqa: BLE001 - a module that does not deep-copy this way
        return None


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _dtype_name(dt: Any) -> str:
    s = str(dt).replace("torch.", "")
    if s not in DTYPE_BYTES:
        raise PortTraceError(f"unsupported tensor dtype {s}; PORT trains float32 models")
    return s


# ---------------------------------------------------------------------------------------------
# trace
# ---------------------------------------------------------------------------------------------
def trace(model: Any, example_input: Any, loss: str = "cross_entropy", trainable: Sequence[str] | str | None = None,
          optimizer: str = "sgd_momentum", name: str | None = None) -> Graph:
    """Trace ``model`` on ``example_input`` ([N, ...], float32) into a training Graph.

    loss: "cross_entropy" (mean reduction) on the model's [N, K] output.
    trainable: module-name patterns (fnmatch, or a prefix such as "layer4" for "layer4.0.conv1");
      parameters outside them are frozen. None trains every parameter with requires_grad.
    optimizer: "sgd" (no state), "sgd_momentum" (one buffer per parameter) or "adamw" (two).
    """
    import torch
    import torch.fx as fx
    from torch.fx.passes.shape_prop import ShapeProp

    if loss not in SUPPORTED_LOSSES:
        raise PortTraceError(f"loss {loss!r} is not supported; supported losses: {', '.join(SUPPORTED_LOSSES)}")
    if optimizer not in OPTIMIZERS:
        raise PortTraceError(f"optimizer {optimizer!r} is not supported; choose one of {', '.join(OPTIMIZERS)}")
    if not isinstance(model, torch.nn.Module):
        raise PortTraceError(f"trace() needs a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(example_input, torch.Tensor) or example_input.dim() < 2:
        raise PortTraceError("example_input must be a tensor [N, ...] with the batch dimension first")
    if isinstance(trainable, str):
        trainable = [trainable]
    model_name = name or type(model).__name__

    # shape propagation runs the model: on a copy (the user's running stats stay intact) whose parameters and
    # buffers are meta tensors (shapes and dtypes only), so tracing allocates no copy of the weights and no
    # activations; a model whose ops have no meta kernel falls back to a real copy
    user_model = model
    model = meta_copy(user_model)
    on_meta = model is not None
    if model is None:
        model = copy.deepcopy(user_model)

    class _Proxy(fx.Proxy):
        """fx's Proxy has no __iadd__, so ``h += y`` would trace as ``h = h + y`` and lose the mutation
        that other names of ``h`` see in eager mode; record it as operator.iadd (an in-place add)."""
        def __iadd__(self, other):
            return self.tracer.create_proxy("call_function", operator.iadd, (self, other), {}, name="add")

        def __isub__(self, other):
            return self.tracer.create_proxy("call_function", operator.isub, (self, other), {}, name="sub")

        def __imul__(self, other):
            return self.tracer.create_proxy("call_function", operator.imul, (self, other), {}, name="mul")

        def __itruediv__(self, other):
            return self.tracer.create_proxy("call_function", operator.itruediv, (self, other), {}, name="truediv")

    class _Tracer(fx.Tracer):
        def proxy(self, node):
            return _Proxy(node, self)

        def create_node(self, *args, **kwargs):
            n = super().create_node(*args, **kwargs)
            n.meta["port_src"] = _caller_source()
            return n

    tracer = _Tracer()
    try:
        fx_graph = tracer.trace(model)
    except Exception as e:  # noqa: BLE001 - fx raises many kinds; turn them into one clear error
        where = list(tracer.module_stack.keys())[-1] if getattr(tracer, "module_stack", None) else ""
        frame = _user_frame(e)
        what = "data-dependent control flow" if "control flow" in str(e) or "iteration" in str(e) else "untraceable code"
        raise PortTraceError(
            f"{model_name}: {what} at module path '{where or '<root>'}'{frame}: PORT traces models "
            f"symbolically and needs a static graph ({type(e).__name__}: {str(e).splitlines()[0]}). "
            f"Supported ops: {_supported_list()}.") from None
    gm = fx.GraphModule(model, fx_graph)
    try:
        if on_meta:
            try:
                with torch.no_grad():
                    ShapeProp(gm).propagate(torch.empty_like(example_input, device="meta"))
            except Exception:  # noqa: BLE001 - an op without a meta kernel: propagate on real tensors
                model = copy.deepcopy(user_model)
                fx_graph = tracer.trace(model)
                gm = fx.GraphModule(model, fx_graph)
                on_meta = False
        if not on_meta:
            with torch.no_grad():
                ShapeProp(gm).propagate(example_input.detach().clone())  # in-place ops must not touch the caller's
    except Exception as e:  # noqa: BLE001
        raise PortTraceError(f"{model_name}: running the model on an input of shape "
                             f"{tuple(example_input.shape)} failed: {type(e).__name__}: {e}") from None

    b = _Builder()
    batch = int(example_input.shape[0])
    env: dict[str, int] = {}          # fx node name -> tensor id of its value
    fwds: list[_Fwd] = []
    param_ids: dict[str, int] = {}    # qualified parameter name -> tensor id
    trainable_params: set[int] = set()

    def module_is_trainable(path: str) -> bool:
        if trainable is None:
            return True
        return any(fnmatch.fnmatchcase(path, p) or path == p or path.startswith(p.rstrip(".") + ".")
                   for p in trainable)

    # shared (tied) parameters and buffers: one tensor per object, named by its first state_dict name
    # (model.named_parameters()'s choice), trainable if any module holding it is; every use then adds a
    # weight-gradient contribution to that one tensor (accumulated like any tensor used twice)
    obj_names: dict[int, list[str]] = {}
    for qn, p in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False)):
        obj_names.setdefault(id(p), []).append(qn)
    obj_ids: dict[int, int] = {}      # id(parameter or buffer object) -> tensor id

    def param(mod_path: str, mod: Any, attr: str) -> int | None:
        p = getattr(mod, attr, None)
        if p is None:
            return None
        q = f"{mod_path}.{attr}" if mod_path else attr
        if q in param_ids:
            return param_ids[q]
        if id(p) in obj_ids:
            param_ids[q] = obj_ids[id(p)]
            return param_ids[q]
        names = obj_names.get(id(p)) or [q]
        if isinstance(p, torch.nn.Parameter):
            tid = b.tensor(names[0], p.shape, _dtype_name(p.dtype), ROLE_PARAMETER)
            if p.requires_grad and any(module_is_trainable(n.rsplit(".", 1)[0] if "." in n else "")
                                       for n in names):
                trainable_params.add(tid)
        else:
            tid = b.tensor(names[0], p.shape, _dtype_name(p.dtype), ROLE_BUFFER)
        param_ids[q] = tid
        obj_ids[id(p)] = tid
        return tid

    def out_tensor(node: Any, opname: str) -> int:
        tm = node.meta.get("tensor_meta")
        if tm is None or not hasattr(tm, "shape"):
            raise PortTraceError(f"{model_name}: op '{opname}' does not produce a single tensor; "
                                 f"supported ops: {_supported_list()}")
        return b.tensor(f"{opname}:out", tuple(tm.shape), _dtype_name(tm.dtype), ROLE_ACTIVATION)

    def scope_of(node: Any) -> str:
        stack = node.meta.get("nn_module_stack")
        if stack:
            return list(stack.keys())[-1] if not isinstance(stack, dict) else list(stack)[-1]
        return ""

    def located(node: Any) -> str:
        """"at module path '<path>' (fx node '<name>', <source line>)": where an error message points."""
        path = node.target if node.op == "call_module" else scope_of(node) or "<root>"
        src = node.meta.get("port_src", "")
        return f"at module path '{path}' (fx node '{node.name}'{', ' + src if src else ''})"

    def unsupported(node: Any, what: str) -> PortTraceError:
        return PortTraceError(
            f"{model_name}: unsupported op {what} {located(node)}. "
            f"Supported ops: {_supported_list()}; loss: {', '.join(SUPPORTED_LOSSES)}. Replace the layer "
            f"or freeze it outside the traced model.")

    # functionalization of in-place ops: an in-place op's result replaces the mutated tensor for every later
    # use, under any name (fx node, identity alias): latest[t] is the tensor that now holds t's value.
    latest: dict[int, int] = {}

    def resolve(t: int) -> int:
        while t in latest:
            t = latest[t]
        return t

    def tensor_arg(node: Any, a: Any) -> int:
        if isinstance(a, fx.Node) and a.name in env:
            return resolve(env[a.name])
        raise unsupported(node, f"with a non-tensor or constant operand ({a!r})")

    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    fx_nodes = {n.name: n for n in gm.graph.nodes}

    def storage_root(t: int) -> int:
        while b.tensors[t].alias_of is not None:
            t = b.tensors[t].alias_of
        return t

    def check_inplace(node: Any, opname: str, t: int) -> None:
        """Refuse, by name, an in-place op whose mutation PORT's functional graph cannot reproduce."""
        T = b.tensors
        why = None
        root = storage_root(t)
        group = {x.id for x in T if storage_root(x.id) == root}     # t, the tensor it views, its other views
        readers = [f for f in fwds if any(x in group for x in f.x)]
        producer = next((f for f in fwds if root in f.outputs), None)
        unsafe = [f for f in readers if f.kind not in _INPLACE_SAFE_READERS and f.kind != "reshape"]
        # another alias (view or viewed tensor) of t read at or after this op would see the mutation
        others = {x for x in group if x != t}
        alias_later = next((n for n in env if resolve(env[n]) in others for u in fx_nodes[n].users
                            if u is node or order[u.name] > order[node.name]), None)
        if root == input_id:
            why = "the model input (PyTorch would modify the caller's batch)"
        elif T[root].role in (ROLE_PARAMETER, ROLE_BUFFER):
            why = f"the {T[root].role} '{T[root].name}'"
        elif alias_later is not None:
            what = "a view of" if T[t].alias_of is not None else "a tensor viewed by"
            why = (f"{what} '{T[env[alias_later]].name}', which is read later (fx node '{alias_later}'): the "
                   f"mutation would show through the alias")
        elif unsafe:
            r = unsafe[0]
            why = (f"a tensor the earlier op '{r.name}' ({r.kind}) saved for its backward (PyTorch autograd fails "
                   f"with 'modified by an inplace operation')")
        elif producer is not None and producer.kind == "relu":
            why = (f"the output of '{producer.name}' ({producer.kind}), which its backward reads (PyTorch autograd "
                   f"fails with 'modified by an inplace operation')")
        if why is not None:
            raise PortTraceError(
                f"{model_name}: in-place op '{opname}' {located(node)} modifies {why}. PORT traces in-place ops by replacing the "
                f"modified tensor with the result, which is only sound when nothing else observes the old "
                f"value. Fix: use the out-of-place form and rebind the name (e.g. h = F.relu(h), h = h + y, "
                f"nn.ReLU(inplace=False)).")

    input_id = -1
    logits_id = -1
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if input_id >= 0:
                raise PortTraceError(f"{model_name}: forward() takes more than one input ('{node.name}'); "
                                     "PORT models take one input tensor")
            input_id = b.tensor("input", example_input.shape, _dtype_name(example_input.dtype), ROLE_INPUT)
            env[node.name] = input_id
            continue
        if node.op == "output":
            res = node.args[0]
            if isinstance(res, (tuple, list)) or not isinstance(res, fx.Node) or res.name not in env:
                raise PortTraceError(f"{model_name}: forward() must return one logits tensor [N, classes]")
            logits_id = resolve(env[res.name])
            continue
        if node.op == "get_attr":
            raise unsupported(node, f"direct parameter access '{node.target}' (functional layers)")

        tm = node.meta.get("tensor_meta")
        if node.op == "call_method" and node.target in ("size", "dim"):
            continue  # python ints feeding view(): no tensor
        if tm is None or not hasattr(tm, "shape"):
            if node.op == "call_function" and (node.target is getattr or not any(
                    _is_tensor_node(a) for a in _flat_nodes((node.args, node.kwargs)))):
                continue      # python arithmetic on sizes (N, T = x.shape; d // h): no tensor
            raise unsupported(node, f"'{getattr(node.target, '__name__', node.target)}' returning a non-tensor")

        mutated = _inplace_operand(node, gm, unsupported)
        if mutated is not None:
            check_inplace(node, _op_label(node), tensor_arg(node, mutated))
        f = _forward_from_node(node, gm, b, env, param, out_tensor, tensor_arg, unsupported, scope_of, batch)
        if f is None:  # identity: alias the input
            continue
        fwds.append(f)
        env[node.name] = f.outputs[0]
        if mutated is not None and f.x and f.x[0] != f.outputs[0]:
            latest[f.x[0]] = f.outputs[0]     # later uses of the mutated tensor read the result

    if logits_id < 0:
        raise PortTraceError(f"{model_name}: forward() returned no tensor")
    logits = b.tensors[logits_id]
    if len(logits.shape) not in (2, 3) or logits.shape[0] != batch or logits.dtype != "float32":
        raise PortTraceError(f"{model_name}: cross_entropy needs float32 logits [N, classes] (or [N, T, vocab] for a "
                             f"token-level loss); the model returns {list(logits.shape)} ({logits.dtype}). "
                             f"Flatten before the classifier.")
    if not trainable_params:
        raise PortTraceError(f"{model_name}: no trainable parameters (trainable={trainable!r} matched "
                             f"no module with parameters)")
    return _assemble(b, fwds, model_name, batch, input_id, logits_id, trainable_params, optimizer)


# earlier readers that leave a tensor free to be modified in place: their backward does not read it
# (add saves nothing, relu its output, dropout its mask), as in PyTorch autograd
_INPLACE_SAFE_READERS = ("add", "relu", "dropout")
_INPLACE_FUNCTIONS = ("iadd", "isub", "imul", "itruediv", "relu_")
_INPLACE_KWARG_FUNCTIONS = ("relu", "relu6", "hardswish", "dropout", "hardtanh", "elu", "leaky_relu", "silu",
                            "threshold", "celu", "selu", "rrelu", "mish", "hardsigmoid")


def _op_label(node: Any) -> str:
    if node.op == "call_module":
        return node.target
    t = node.target
    name = t if isinstance(t, str) else getattr(t, "__name__", str(t))
    return {"iadd": "+= (iadd)", "isub": "-= (isub)", "imul": "*= (imul)", "itruediv": "/= (itruediv)"}.get(name, name)


def _inplace_operand(node: Any, gm: Any, unsupported: Any) -> Any:
    """The fx node an in-place op modifies (its first argument), or None for an out-of-place op.
    In-place: tensor methods ending in '_' (relu_, add_, ...), ``x += y`` (operator.iadd, recorded by
    trace's tracer), torch.relu_ / F.relu_, functionals called with inplace=True and modules built with
    inplace=True. ``out=`` is refused."""
    import torch.fx as fx
    import torch.nn as nn
    if node.kwargs.get("out") is not None:
        raise unsupported(node, f"'{_op_label(node)}' with out= (write the result to a new tensor instead)")
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        hit = bool(getattr(mod, "inplace", False)) and not (isinstance(mod, nn.Dropout) and not mod.training)
    elif node.op == "call_method":
        hit = node.target.endswith("_") and not node.target.startswith("_")
    elif node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        hit = name in _INPLACE_FUNCTIONS or (name in _INPLACE_KWARG_FUNCTIONS and bool(node.kwargs.get("inplace")))
        if not hit and name in _INPLACE_KWARG_FUNCTIONS and node.args[-1:] == (True,) and len(node.args) > 1:
            hit = name != "dropout" or len(node.args) == 4   # F.relu(x, True); F.dropout(x, p, training, True)
    else:
        return None
    if not hit or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    return node.args[0]


def _caller_source() -> str:
    """'file:line: code' of the user's line that created the fx node being traced ('' if none)."""
    import linecache
    import sys
    fr = sys._getframe(1)
    while fr is not None:
        fn = fr.f_code.co_filename
        if "/torch/" not in fn and fn != __file__ and not fn.startswith("<"):
            line = linecache.getline(fn, fr.f_lineno).strip()
            return f"{fn}:{fr.f_lineno}" + (f": {line}" if line else "")
        fr = fr.f_back
    return ""


def _user_frame(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    for fr in reversed(tb):
        if "/torch/" not in fr.filename and "/port/" not in fr.filename:
            return f" ({fr.filename}:{fr.lineno}, in {fr.name})"
    return ""


def _forward_from_node(node, gm, b: _Builder, env, param, out_tensor, tensor_arg, unsupported, scope_of,
                       batch) -> _Fwd | None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def shape(t: int) -> tuple[int, ...]:
        return b.tensors[t].shape

    if node.op == "call_module":
        path = node.target
        mod = gm.get_submodule(path)
        x = tensor_arg(node, node.args[0]) if node.args else None
        if len(node.args) != 1 or node.kwargs:
            raise unsupported(node, f"{type(mod).__name__} called with {len(node.args)} arguments")
        if isinstance(mod, nn.Identity):
            env[node.name] = x
            return None
        if isinstance(mod, nn.Dropout) and (not mod.training or mod.p == 0):     # p = 0: the identity (as aten)
            env[node.name] = x
            return None
        y = out_tensor(node, path)
        ys = shape(y)
        if isinstance(mod, nn.Conv2d):
            if mod.dilation not in ((1, 1), 1) or mod.padding_mode != "zeros" or isinstance(mod.padding, str) and mod.padding != "valid":
                raise unsupported(node, "conv2d with dilation, non-zero padding mode or 'same' padding")
            pad = (0, 0) if mod.padding == "valid" else _pair(mod.padding)
            kh, kw = mod.kernel_size
            w = param(path, mod, "weight")
            bias = param(path, mod, "bias")
            attrs = dict(stride=_pair(mod.stride), padding=pad, groups=int(mod.groups), kernel=(kh, kw),
                         bias=bias is not None)
            flops = 2 * batch * ys[1] * ys[2] * ys[3] * (mod.in_channels // mod.groups) * kh * kw
            params = {"weight": w} | ({"bias": bias} if bias is not None else {})
            return _Fwd(path, path, "conv2d", attrs, (x,), params, {}, (y,), flops, numel(ys) if bias is not None else 0)
        if isinstance(mod, nn.BatchNorm2d):
            if not mod.affine:
                raise unsupported(node, "batch_norm2d without affine scale and shift")
            training = bool(mod.training or not mod.track_running_stats)
            params = {"weight": param(path, mod, "weight"), "bias": param(path, mod, "bias")}
            buffers = {}
            if mod.track_running_stats:
                buffers = {"running_mean": param(path, mod, "running_mean"),
                           "running_var": param(path, mod, "running_var")}
            outs: tuple[int, ...] = (y,)
            if training:  # save_mean and save_invstd, [2, C]
                outs = (y, b.tensor(f"{path}:stats", (2, ys[1]), "float32", ROLE_ACTIVATION))
            attrs = dict(training=training, eps=float(mod.eps),
                         momentum=float(mod.momentum) if mod.momentum is not None else 0.1)
            return _Fwd(path, path, "batch_norm2d", attrs, (x,), params, buffers, outs, 0,
                        (8 if training else 2) * numel(ys))
        if isinstance(mod, (nn.ReLU, nn.ReLU6, nn.Hardswish)):
            kind = {nn.ReLU: "relu", nn.ReLU6: "relu6", nn.Hardswish: "hardswish"}[type(mod)]
            return _Fwd(path, path, kind, {}, (x,), {}, {}, (y,), 0, numel(ys) * (4 if kind == "hardswish" else 1))
        if isinstance(mod, nn.MaxPool2d):
            if mod.dilation not in (1, (1, 1)) or mod.ceil_mode or mod.return_indices:
                raise unsupported(node, "max_pool2d with dilation, ceil_mode or return_indices")
            k = _pair(mod.kernel_size)
            s = _pair(mod.stride if mod.stride is not None else mod.kernel_size)
            idx = b.tensor(f"{path}:indices", ys, "int64", ROLE_ACTIVATION)
            return _Fwd(path, path, "max_pool2d", dict(kernel=k, stride=s, padding=_pair(mod.padding)),
                        (x,), {}, {}, (y, idx), 0, numel(ys) * k[0] * k[1])
        if isinstance(mod, nn.AvgPool2d):
            if mod.ceil_mode or not mod.count_include_pad or mod.divisor_override:
                raise unsupported(node, "avg_pool2d with ceil_mode, count_include_pad=False or divisor_override")
            k = _pair(mod.kernel_size)
            s = _pair(mod.stride if mod.stride is not None else mod.kernel_size)
            return _Fwd(path, path, "avg_pool2d", dict(kernel=k, stride=s, padding=_pair(mod.padding)),
                        (x,), {}, {}, (y,), 0, numel(ys) * k[0] * k[1])
        if isinstance(mod, nn.AdaptiveAvgPool2d):
            if _pair(mod.output_size) != (1, 1):
                raise unsupported(node, f"adaptive_avg_pool2d to {mod.output_size} (only 1x1 is supported)")
            return _Fwd(path, path, "global_avg_pool2d", {}, (x,), {}, {}, (y,), 0, numel(shape(x)))
        if isinstance(mod, nn.Flatten):
            return _view(b, path, path, x, y)
        if isinstance(mod, nn.Linear):
            w = param(path, mod, "weight")
            bias = param(path, mod, "bias")
            xs = shape(x)
            params = {"weight": w} | ({"bias": bias} if bias is not None else {})
            return _Fwd(path, path, "linear", dict(bias=bias is not None), (x,), params, {}, (y,),
                        2 * numel(xs[:-1]) * mod.in_features * mod.out_features, numel(ys) if bias is not None else 0)
        if isinstance(mod, nn.Dropout):
            mask = b.tensor(f"{path}:mask", ys, "uint8", ROLE_ACTIVATION)
            return _Fwd(path, path, "dropout", dict(p=float(mod.p)), (x,), {}, {}, (y, mask), 0, 2 * numel(ys))
        f = seqops.module_forward(node, mod, path, x, y, b, param, shape, unsupported, _Fwd)
        if f is not None:
            return f
        raise unsupported(node, type(mod).__name__)

    # call_function / call_method
    scope = scope_of(node)
    tgt = node.target
    fname = tgt if isinstance(tgt, str) else getattr(tgt, "__name__", str(tgt))
    fname = {"iadd": "add"}.get(fname, fname)   # ``h += y``: named as before in-place adds were recorded
    opname = f"{scope}.{fname}" if scope else node.name
    args = list(node.args)
    is_m = node.op == "call_method"

    if tgt in (operator.add, torch.add, operator.iadd) or (is_m and tgt in ("add", "add_")):
        if len(args) != 2 or node.kwargs:
            raise unsupported(node, "add with alpha or a constant")
        a, c = tensor_arg(node, args[0]), tensor_arg(node, args[1])
        if shape(a) != shape(c):
            return seqops.broadcast_add(node, opname, scope, a, c, out_tensor, shape, unsupported, _Fwd)
        y = out_tensor(node, opname)
        return _Fwd(opname, scope, "add", {}, (a, c), {}, {}, (y,), 0, numel(shape(y)))
    if tgt in (F.relu, torch.relu, F.relu_, torch.relu_) or (is_m and tgt in ("relu", "relu_")):
        x = tensor_arg(node, args[0]); y = out_tensor(node, opname)
        return _Fwd(opname, scope, "relu", {}, (x,), {}, {}, (y,), 0, numel(shape(y)))
    if tgt is F.relu6:
        x = tensor_arg(node, args[0]); y = out_tensor(node, opname)
        return _Fwd(opname, scope, "relu6", {}, (x,), {}, {}, (y,), 0, numel(shape(y)))
    if tgt is F.hardswish:
        x = tensor_arg(node, args[0]); y = out_tensor(node, opname)
        return _Fwd(opname, scope, "hardswish", {}, (x,), {}, {}, (y,), 0, 4 * numel(shape(y)))
    if tgt is torch.flatten or tgt is torch.reshape or (is_m and tgt in ("flatten", "view", "reshape")):
        x = tensor_arg(node, args[0]); y = out_tensor(node, opname)
        return _view(b, opname, scope, x, y)
    if tgt is F.adaptive_avg_pool2d:
        x = tensor_arg(node, args[0])
        if _pair(args[1] if len(args) > 1 else node.kwargs.get("output_size")) != (1, 1):
            raise unsupported(node, "adaptive_avg_pool2d to a size other than 1x1")
        y = out_tensor(node, opname)
        return _Fwd(opname, scope, "global_avg_pool2d", {}, (x,), {}, {}, (y,), 0, numel(shape(x)))
    if (is_m and tgt == "mean") or tgt is torch.mean:
        x = tensor_arg(node, args[0])
        dims = args[1] if len(args) > 1 else node.kwargs.get("dim")
        dims = tuple(d % len(shape(x)) for d in (dims if isinstance(dims, (tuple, list)) else (dims,))) if dims is not None else ()
        if len(shape(x)) != 4 or sorted(dims) != [2, 3]:
            f = seqops.function_forward(node, opname, scope, b, tensor_arg, out_tensor, shape, unsupported, _Fwd,
                                        _view)
            if f is not None:
                return f
            raise unsupported(node, f"mean over dims {dims} (only the spatial mean of [N, C, H, W] and the mean "
                                    f"over one non-last dim are supported)")
        y = out_tensor(node, opname)
        return _Fwd(opname, scope, "global_avg_pool2d", {}, (x,), {}, {}, (y,), 0, numel(shape(x)))
    f = seqops.function_forward(node, opname, scope, b, tensor_arg, out_tensor, shape, unsupported, _Fwd, _view)
    if f == "identity":
        env[node.name] = tensor_arg(node, args[0])
        return None
    if f is not None:
        return f
    raise unsupported(node, f"'{fname}'")


def _flat_nodes(args: Any) -> list:
    import torch.fx as fx
    out: list = []
    fx.node.map_arg(args, out.append)
    return out


def _is_tensor_node(a: Any) -> bool:
    tm = getattr(a, "meta", {}).get("tensor_meta") if a is not None else None
    return tm is not None and hasattr(tm, "shape")


def _view(b: _Builder, name: str, layer: str, x: int, y: int) -> _Fwd:
    t = b.tensors[y]
    b.tensors[y] = TensorSpec(t.id, t.name, t.shape, t.dtype, t.role, alias_of=x)
    return _Fwd(name, layer, "reshape", dict(shape=t.shape), (x,), {}, {}, (y,), 0, 0)


# ---------------------------------------------------------------------------------------------
# backward and updates
# ---------------------------------------------------------------------------------------------
def _assemble(b: _Builder, fwds: list[_Fwd], model_name: str, batch: int, input_id: int, logits_id: int,
              trainable_params: set[int], optimizer: str) -> Graph:
    T = b.tensors

    # which activations carry gradients: anything downstream of a trainable parameter
    needs_grad: set[int] = set(trainable_params)
    for f in fwds:
        if any(t in needs_grad for t in f.x) or any(p in needs_grad for p in f.params.values()):
            needs_grad.add(f.outputs[0])
    # prune: a gradient is only needed if it leads to a trainable parameter. Walk backwards.
    wanted: set[int] = {logits_id} if logits_id in needs_grad else set()
    grad_in_needed: dict[int, bool] = {}
    for f in reversed(fwds):
        in_needed = f.outputs[0] in wanted and any(t in needs_grad for t in f.x)
        grad_in_needed[id(f)] = in_needed
        if in_needed:
            wanted.update(t for t in f.x if t in needs_grad)

    # forward ops with their saved tensors (PyTorch's choice for the plain kernels)
    for f in fwds:
        w_trainable = any(p in trainable_params for p in f.params.values())
        gi = grad_in_needed[id(f)]
        w_needed = w_trainable and f.outputs[0] in wanted   # the loss depends on this op's output
        saved = _saved_for(f, T, gi, w_needed, wanted if gi else set())
        inputs = f.x + tuple(f.params.values()) + tuple(f.buffers.values())
        f.op_id = b.op(f.name, f.layer, f.kind, PHASE_FORWARD, f.attrs, inputs, f.outputs, saved,
                       f.flops, f.vector_flops)
        f.attrs["_grad_input"] = gi
        f.attrs["_grad_weight"] = w_needed

    # loss
    lshape = T[logits_id].shape
    K, rows = lshape[-1], numel(lshape[:-1])
    loss_attrs = {"reduction": "mean", "label_smoothing": 0.0}
    if len(lshape) == 3:        # token-level loss over [N, T, vocab]: labels [N, T], IGNORE_INDEX skipped
        loss_attrs["ignore_index"] = IGNORE_INDEX
    label_id = b.tensor("labels", lshape[:-1], "int64", ROLE_LABEL)
    loss_id = b.tensor("loss", (), "float32", ROLE_ACTIVATION)
    probs = b.tensor("loss:probs", lshape, "float32", ROLE_ACTIVATION)
    loss_op = b.op("loss", "loss", "cross_entropy", PHASE_LOSS, loss_attrs,
                   (logits_id, label_id), (loss_id, probs), (probs, label_id), 0, 4 * rows * K)

    # backward, reverse order. grads[t] = current gradient tensor id of activation/parameter t
    grads: dict[int, int] = {}

    def new_grad(t: int, tag: str) -> int:
        src = T[t]
        return b.tensor(f"grad({src.name}){tag}", src.shape, "float32", ROLE_GRADIENT, grad_of=t)

    def contribute(t: int, g: int, layer: str) -> None:
        if t not in grads:
            grads[t] = g
            return
        acc = new_grad(t, f"#{sum(1 for x in b.tensors if x.grad_of == t)}")
        b.op(f"{T[t].name}.grad_accumulate", layer, "grad_accumulate", PHASE_BACKWARD, {},
             (grads[t], g), (acc,), (), 0, numel(T[t].shape))
        grads[t] = acc

    g_logits = new_grad(logits_id, "")
    b.op("loss.grad_input", "loss", "cross_entropy.grad_input", PHASE_BACKWARD,
         dict(loss_attrs), (probs, label_id), (g_logits,), (), 0,
         2 * rows * K, forward_op=loss_op)
    grads[logits_id] = g_logits

    for f in reversed(fwds):
        y = f.outputs[0]
        if y not in grads:
            continue
        gy = grads[y]
        fo = b.ops[f.op_id]
        gi, gw = f.attrs["_grad_input"], f.attrs["_grad_weight"]
        xs_needing = [t for t in f.x if t in wanted] if gi else []
        if f.kind == "reshape":
            if xs_needing:
                x = f.x[0]
                g = b.tensor(f"grad({T[x].name})", T[x].shape, "float32", ROLE_GRADIENT, grad_of=x, alias_of=gy)
                b.op(f"{f.name}.grad_input", f.layer, "reshape.grad_input", PHASE_BACKWARD,
                     dict(shape=T[x].shape), (gy,), (g,), forward_op=fo.id)
                contribute(x, g, f.layer)
            continue
        if f.kind == "add":
            outs = []
            for x in xs_needing:
                outs.append((x, b.tensor(f"grad({T[x].name})", T[x].shape, "float32", ROLE_GRADIENT,
                                         grad_of=x, alias_of=gy)))
            if outs:
                b.op(f"{f.name}.grad_input", f.layer, "add.grad_input", PHASE_BACKWARD, {}, (gy,),
                     tuple(g for _, g in outs), forward_op=fo.id)
                for x, g in outs:
                    contribute(x, g, f.layer)
            continue
        if f.kind == "add_bcast":
            a, c = f.x
            if a in xs_needing:            # the full-shape operand: the output gradient itself (a view)
                g = b.tensor(f"grad({T[a].name})", T[a].shape, "float32", ROLE_GRADIENT, grad_of=a, alias_of=gy)
                b.op(f"{f.name}.grad_input", f.layer, "add.grad_input", PHASE_BACKWARD, {}, (gy,), (g,),
                     forward_op=fo.id)
                contribute(a, g, f.layer)
            if c in xs_needing:            # the broadcast operand: summed over the leading dims
                g = new_grad(c, "")
                b.op(f"{f.name}.grad_input", f.layer, "add_bcast.grad_input", PHASE_BACKWARD, {}, (gy,), (g,),
                     vector_flops=numel(T[y].shape), forward_op=fo.id)
                contribute(c, g, f.layer)
            continue
        if f.kind in seqops.MULTI_GRAD_KINDS:
            need = tuple(i for i, t in enumerate(f.x[:3]) if t in xs_needing)
            if need:
                outs = [(f.x[i], new_grad(f.x[i], "")) for i in need]
                fl = (f.flops // 2) * len(need) if f.kind == "matmul" else f.flops * 10 // 4
                b.op(f"{f.name}.grad_input", f.layer, f"{f.kind}.grad_input", PHASE_BACKWARD,
                     {k: v for k, v in f.attrs.items() if not k.startswith("_")} | {"grads": need},
                     (gy,) + _grad_input_reads(f, T), tuple(g for _, g in outs), flops=fl,
                     vector_flops=_bwd_vector_flops(f, T), forward_op=fo.id)
                for x, g in outs:
                    contribute(x, g, f.layer)
            continue
        if xs_needing:
            x = f.x[0]
            g = new_grad(x, "")
            ins = (gy,) + _grad_input_reads(f, T)
            b.op(f"{f.name}.grad_input", f.layer, f"{f.kind}.grad_input", PHASE_BACKWARD,
                 {k: v for k, v in f.attrs.items() if not k.startswith("_")}, ins, (g,),
                 flops=f.flops, vector_flops=_bwd_vector_flops(f, T), forward_op=fo.id)
            contribute(x, g, f.layer)
        if gw:
            outs = []
            for pname, p in f.params.items():
                if p in trainable_params:
                    outs.append((p, new_grad(p, "")))
            ins = (gy,) + _grad_weight_reads(f, T)
            b.op(f"{f.name}.grad_weight", f.layer, f"{f.kind}.grad_weight", PHASE_BACKWARD,
                 {k: v for k, v in f.attrs.items() if not k.startswith("_")}
                 | {"grads": tuple(n for n, p in f.params.items() if p in trainable_params)},
                 ins, tuple(g for _, g in outs),
                 flops=f.flops if f.kind in ("conv2d", "linear") else 0,
                 vector_flops=numel(T[y].shape) * (2 if f.kind in ("batch_norm2d", "layer_norm") else 1),
                 forward_op=fo.id)
            for p, g in outs:
                contribute(p, g, f.layer)

    # optimizer updates: one per trainable parameter, in parameter order
    n_state = OPTIMIZERS[optimizer]
    state_names = {0: (), 1: ("momentum",), 2: ("exp_avg", "exp_avg_sq")}[n_state]
    for p in sorted(trainable_params):
        if p not in grads:
            continue
        pt = T[p]
        states = tuple(b.tensor(f"{pt.name}:{s}", pt.shape, "float32", ROLE_OPTIMIZER_STATE, state_of=p)
                       for s in state_names)
        b.op(f"{pt.name}.update", pt.name.rsplit(".", 1)[0], "update", PHASE_UPDATE, {"optimizer": optimizer},
             (p, grads[p]) + states, (p,) + states, (), 0, {0: 2, 1: 4, 2: 12}[n_state] * pt.numel)

    # drop the private attrs we stashed on forward ops
    ops = []
    for o in b.ops:
        ops.append(o if not any(k.startswith("_") for k, _ in o.attrs)
                   else Op(o.id, o.name, o.layer, o.kind, o.phase, tuple((k, v) for k, v in o.attrs if not k.startswith("_")),
                           o.inputs, o.outputs, o.saved, o.flops, o.vector_flops, o.bytes_moved, o.forward_op))
    return Graph(model_name, tuple(b.tensors), tuple(ops), input_id, label_id, loss_id, logits_id, optimizer, batch)


def _saved_for(f: _Fwd, T, grad_input: bool, grad_weight: bool, wanted: set[int] = frozenset()) -> tuple[int, ...]:
    """Tensors a forward op's backward reads, as PyTorch's plain kernels choose them."""
    x = f.x[0] if f.x else None
    k = f.kind
    if not grad_input and not grad_weight:
        return ()
    if k in ("conv2d", "linear"):
        s = []
        if grad_weight:
            s.append(x)
        if grad_input:
            s.append(f.params["weight"])
        return tuple(s)
    if k == "batch_norm2d":
        if f.attrs["training"]:
            return (x, f.outputs[1], f.params["weight"])
        s = [f.params["weight"], f.buffers["running_var"]] if grad_input else []
        if grad_weight:
            s = [x, f.buffers["running_mean"], f.buffers["running_var"]] + s
        return tuple(s)
    if k == "relu":
        return (f.outputs[0],)     # backward from the output's mask (as autograd)
    if k in ("relu6", "hardswish"):
        return (x,)                # autograd saves the input; PORT's in-place relu6 reads the output instead
    if k == "max_pool2d":
        return (f.outputs[1],)     # indices
    if k == "dropout":
        return (f.outputs[1],)     # mask
    if k == "embedding":
        return (x,) if grad_weight else ()
    if k == "layer_norm":
        return (x, f.outputs[1]) + ((f.params["weight"],) if grad_input and "weight" in f.params else ())
    if k == "gelu":
        return (x,)
    if k in ("tanh", "softmax"):
        return (f.outputs[0],)
    if k == "matmul":
        a, c = f.x
        return tuple(t for t, need in ((c, a in wanted), (a, c in wanted)) if need)
    if k == "attention":
        return f.x[:3] + f.outputs + f.x[3:]      # q, k, v, o, lse (and the key mask)
    return ()                      # add, reshape, avg/global pool, scale, permute, mean: shapes only


def _grad_input_reads(f: _Fwd, T) -> tuple[int, ...]:
    k = f.kind
    if k in ("conv2d", "linear"):
        return (f.params["weight"],)
    if k == "batch_norm2d":
        if f.attrs["training"]:
            return (f.x[0], f.outputs[1], f.params["weight"])
        return (f.params["weight"], f.buffers["running_var"])
    if k == "relu":
        return (f.outputs[0],)
    if k in ("relu6", "hardswish"):
        return (f.x[0],)
    if k in ("max_pool2d", "dropout"):
        return (f.outputs[1],)
    if k == "layer_norm":
        return (f.x[0], f.outputs[1]) + ((f.params["weight"],) if "weight" in f.params else ())
    if k == "gelu":
        return (f.x[0],)
    if k in ("tanh", "softmax"):
        return (f.outputs[0],)
    if k == "matmul":
        return f.x                                  # (a, b): da = dc b^T, db = a^T dc
    if k == "attention":
        return f.x[:3] + f.outputs + f.x[3:]        # (q, k, v, o, lse[, mask])
    return ()


def _grad_weight_reads(f: _Fwd, T) -> tuple[int, ...]:
    if f.kind in ("conv2d", "linear", "embedding"):
        return (f.x[0],)
    if f.kind == "layer_norm":
        return (f.x[0], f.outputs[1])
    if f.kind == "batch_norm2d":
        if f.attrs["training"]:
            return (f.x[0], f.outputs[1])
        return (f.x[0], f.buffers["running_mean"], f.buffers["running_var"])
    return ()


def _bwd_vector_flops(f: _Fwd, T) -> int:
    n = numel(T[f.outputs[0]].shape)
    if f.kind == "attention":
        q, k = T[f.x[0]].shape, T[f.x[1]].shape
        return 8 * q[0] * q[1] * q[2] * k[2]
    return {"batch_norm2d": 8 * n, "layer_norm": 8 * n, "gelu": 10 * n, "tanh": 2 * n, "softmax": 3 * n,
            "scale": n, "mean_mid": numel(T[f.x[0]].shape),
            "hardswish": 4 * n, "relu": n, "relu6": 2 * n, "dropout": n,
            "max_pool2d": n, "avg_pool2d": numel(T[f.x[0]].shape), "global_avg_pool2d": numel(T[f.x[0]].shape)}.get(f.kind, 0)
