"""trace(): any torch.nn.Module -> an immutable training Graph.

Forward ops come from torch.export (port.ir.capture: one op per aten op, module paths kept as layer
names; ops without a PORT kind run as ``torch_op``, PyTorch's kernel and derivative). Backward ops are derived here from the forward ops (input-gradient and weight-gradient as
separate ops), followed by one optimizer-update op per trainable parameter.

Saved tensors follow PyTorch autograd's own choice for the plain kernels (relu saves its output,
batch norm its input and statistics, max-pool its indices, ...) so the graph's memory figures can be
checked against autograd. Frozen parameters get no weight-gradient op, and activations needed only by
pruned weight gradients are not saved (sparse update).
"""
from __future__ import annotations

import copy
import fnmatch
import math
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

from port.errors import PortTraceError
from port.ir import capture as C
from port.ir import seqops
from port.ir.types import DTYPE_BYTES, PHASE_BACKWARD, PHASE_FORWARD, PHASE_LOSS, PHASE_UPDATE, ROLE_ACTIVATION, ROLE_BUFFER, ROLE_GRADIENT, ROLE_INPUT, ROLE_LABEL, ROLE_OPTIMIZER_STATE, ROLE_PARAMETER, Graph, Op, TensorSpec, numel

SUPPORTED_LOSSES = ("cross_entropy",)
IGNORE_INDEX = -100      # token-level cross-entropy skips these labels (torch's default ignore_index)
OPTIMIZERS = {"sgd": 0, "sgd_momentum": 1, "adamw": 2}  # optimizer-state tensors per parameter


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
          optimizer: str = "sgd_momentum", name: str | None = None, output: str | int | None = None) -> Graph:
    """Capture ``model`` on ``example_input`` ([N, ...] float32, or int64 token ids) into a training Graph
    (port.ir.capture: torch.export, one forward op per aten op).

    loss: "cross_entropy" (mean reduction) on the model's [N, K] output (or [N, T, vocab]).
    trainable: module-name patterns (fnmatch, or a prefix such as "layer4" for "layer4.0.conv1");
      parameters outside them are frozen. None trains every parameter with requires_grad.
    optimizer: "sgd" (no state), "sgd_momentum" (one buffer per parameter) or "adamw" (two).
    output: which of the model's outputs are the logits when it returns several: a key of a dict or
      ``ModelOutput`` (default ``"logits"`` where present) or a position; else the first tensor.
    Optional ``forward`` arguments left at their defaults are not inputs.
    """
    return trace_many([dict(model=model, example_input=example_input, loss=loss, trainable=trainable,
                            optimizer=optimizer, name=name, output=output)])[0]


def trace_many(jobs: Sequence[dict]) -> list[Graph]:
    """``trace(**job)`` for each job, the captures not cached run in one capture process (a Trainer's training
    and inference graphs: torch.export's compiler stack is imported once)."""
    prepared = [_prepare(**job) for job in jobs]
    todo = [p for p in prepared if p[0] is None or p[0] not in _CACHE]
    made = _in_child(_capture_all, [p[1] for p in todo]) if todo else []
    for p, g in zip(todo, made):
        p.append(g)
        if p[0] is not None:
            _CACHE[p[0]] = (g, tuple({id(type(m)): type(m) for m in p[1][0].modules()}.values()))
            while len(_CACHE) > 32:
                _CACHE.popitem(last=False)
    out = []
    for p in prepared:
        g = p[2] if len(p) > 2 else _CACHE[p[0]][0]
        if p[0] is not None:
            _CACHE.move_to_end(p[0])
        name = p[1][2]
        out.append(g if g.name == name else replace(g, name=name, _index={}))
    return out


def _prepare(model: Any, example_input: Any, loss: str = "cross_entropy", trainable: Sequence[str] | str | None = None,
             optimizer: str = "sgd_momentum", name: str | None = None, output: str | int | None = None) -> list:
    """[cache key or None, the arguments of _capture]: the job's arguments checked."""
    import torch
    if loss not in SUPPORTED_LOSSES:
        raise PortTraceError(f"loss {loss!r} is not supported; supported losses: {', '.join(SUPPORTED_LOSSES)}")
    if optimizer not in OPTIMIZERS:
        raise PortTraceError(f"optimizer {optimizer!r} is not supported; choose one of {', '.join(OPTIMIZERS)}")
    if not isinstance(model, torch.nn.Module):
        raise PortTraceError(f"trace() needs a torch.nn.Module, got {type(model).__name__}")
    named = example_inputs(example_input)
    batch = int(named[0][1].shape[0])
    for k, v in named:
        if v.shape[0] != batch:
            raise PortTraceError(f"example input {k!r} has batch {v.shape[0]}, the first input {batch}: every input "
                                 f"needs the same batch dimension first")
    if isinstance(trainable, str):
        trainable = [trainable]
    model_name = name or type(model).__name__
    key = capture_key(model, example_input, (loss, tuple(trainable) if trainable else None, optimizer, output))
    return [key, (model, example_input, model_name, trainable, optimizer, output)]


def _capture_all(jobs: list) -> list[Graph]:
    return [_capture(*j) for j in jobs]


# capture_key -> (graph, the model's module classes): this process's last 32 captures. The classes are held so
# that their ids, which the key names, cannot be reused by other classes while the entry lives.
_CACHE: "OrderedDict[str, tuple]" = OrderedDict()


def capture_key(model: Any, example_input: Any, settings: tuple) -> str | None:
    """A digest of everything a capture reads: each module's class (this process's class object: the code),
    mode, plain attributes (flags such as ``causal``, a Hugging Face config) and hooks, the parameters' and
    buffers' names, shapes, dtypes, requires_grad and tying, the example inputs' names, shapes and dtypes, and
    the trace settings. Not the weights' values, which a capture does not read (tensor attributes that are
    neither parameters nor buffers are captured as constants: their values are part of the key). None when a
    module holds something the key cannot describe (an instance-level ``forward``, hooks)."""
    import hashlib
    import torch
    h = hashlib.sha256()

    def put(*xs):
        h.update(repr(xs).encode())
    for name, m in model.named_modules():
        if "forward" in m.__dict__ or m._forward_hooks or m._forward_pre_hooks or \
                getattr(m, "_forward_hooks_with_kwargs", None) or getattr(m, "_backward_hooks", None):
            return None
        put(name, id(type(m)), m.training)
        for k, v in sorted(m.__dict__.items()):
            if k.startswith("_") or k == "training":
                continue
            if isinstance(v, (bool, int, float, str, type(None))) or (
                    isinstance(v, (tuple, list)) and all(isinstance(x, (bool, int, float, str)) for x in v)):
                put(k, v)
            elif isinstance(v, torch.Tensor):
                put(k, tuple(v.shape), str(v.dtype), v.detach().cpu().reshape(-1)[:4096].tolist()
                    if v.device.type != "meta" else None)
            elif hasattr(v, "to_json_string"):
                put(k, v.to_json_string())
            elif callable(v) or isinstance(v, torch.dtype):
                put(k, id(v) if callable(v) else str(v))
            else:
                return None
    first: dict[int, str] = {}
    for qn, p in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False)):
        put(qn, tuple(p.shape), str(p.dtype), bool(p.requires_grad), first.setdefault(id(p), qn))
    for k, v in example_inputs(example_input):
        put(k, tuple(v.shape), str(v.dtype))
    put(type(example_input).__name__, settings)
    return h.hexdigest()


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


def call_args(example_input: Any, fn=lambda v: v) -> tuple[tuple, dict]:
    """(args, kwargs) to call the model with, each tensor mapped by ``fn``."""
    import torch
    if isinstance(example_input, torch.Tensor):
        return (fn(example_input),), {}
    if isinstance(example_input, dict):
        return (), {str(k): fn(v) for k, v in example_input.items()}
    return tuple(fn(v) for v in example_input), {}


def _in_child(fn, *args) -> list[Graph]:
    """``fn(*args)`` (a Graph) computed in a forked child process, so the caller never imports torch.export's
    compiler stack (sympy, torch._dynamo, ...: ~80 MiB that would stay resident in a training process): the
    child inherits the model copy-on-write, captures on meta tensors and sends the graph back as JSON.
    PORT_CAPTURE=inprocess (or a platform without fork) captures in this process."""
    import json
    import os
    import traceback as tb
    if os.environ.get("PORT_CAPTURE") == "inprocess" or not hasattr(os, "fork"):
        return fn(*args)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: capture, write, exit without cleanup
        os.close(r)
        try:
            out = {"graphs": [g.to_dict() for g in fn(*args)]}
        except PortTraceError as e:
            out = {"error": str(e)}
        except BaseException as e:  # noqa: BLE001 - reported by the parent as an internal error
            out = {"internal": f"{type(e).__name__}: {e}", "traceback": tb.format_exc()}
        data = json.dumps(out).encode()
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        from port.errors import InternalError
        raise InternalError(f"the capture process died (wait status {status}); PORT_CAPTURE=inprocess captures "
                            f"in this process to see why")
    out = json.loads(data)
    if "error" in out:
        raise PortTraceError(out["error"])
    if "internal" in out:
        from port.errors import InternalError
        raise InternalError(f"capture failed: {out['internal']}\n{out['traceback']}")
    return [Graph.from_dict(d) for d in out["graphs"]]


def _capture(model: Any, example_input: Any, model_name: str, trainable: Sequence[str] | None, optimizer: str,
             output: str | int | None) -> Graph:
    import torch
    batch = int(example_inputs(example_input)[0][1].shape[0])

    # export runs the model on fake tensors: on a copy whose parameters and buffers are meta tensors (no copy
    # of the weights, the user's running statistics untouched); a model that does not copy that way, or whose
    # code needs real values, is exported from a real copy
    # (a Hugging Face model's key/value cache is for generation, not training: left out, as HF's trainer does)
    kwargs = {"use_cache": False} if getattr(getattr(model, "config", None), "use_cache", False) else {}
    ep = None
    mc = meta_copy(model)
    if mc is not None:
        try:
            a, kw = call_args(example_input, lambda v: torch.empty_like(v, device="meta"))
            ep = C.export(mc, a, kw | kwargs, model_name)
        except PortTraceError:
            ep = None
    if ep is None:
        a, kw = call_args(example_input, lambda v: v.detach().clone())
        ep = C.export(copy.deepcopy(model), a, kw | kwargs, model_name)
    return _from_export(ep, model, example_input, model_name, batch, trainable, optimizer, output)


def _module_is_trainable(trainable: Sequence[str] | None, path: str) -> bool:
    if trainable is None:
        return True
    return any(fnmatch.fnmatchcase(path, p) or path == p or path.startswith(p.rstrip(".") + ".")
               for p in trainable)


def _logits_index(ep: Any, output: str | int | None, model_name: str) -> int:
    """Position of the logits among the exported program's user outputs."""
    import torch.utils._pytree as pytree
    n = sum(1 for s in ep.graph_signature.output_specs if s.kind.name == "USER_OUTPUT")
    import warnings
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            tree = pytree.tree_unflatten(list(range(n)), ep.call_spec.out_spec)
    except Exception:  # noqa: BLE001 - an output container that does not rebuild from ints
        tree = list(range(n))
    if isinstance(tree, int):
        if output not in (None, 0):
            raise PortTraceError(f"{model_name}: output={output!r}, but the model returns one tensor")
        return tree
    keys: dict = {}
    if hasattr(tree, "items"):
        keys = {k: v for k, v in tree.items() if v is not None}
    elif isinstance(tree, (list, tuple)):
        keys = dict(enumerate(tree))
    if output is None:
        output = "logits" if "logits" in keys else next(iter(keys), None)
    if output not in keys:
        raise PortTraceError(f"{model_name}: output={output!r} is not among the model's outputs "
                             f"({', '.join(map(repr, keys))}); pass output= one of them")
    leaf = keys[output]
    leaves = pytree.tree_leaves(leaf)
    if not leaves:
        raise PortTraceError(f"{model_name}: output {output!r} holds no tensor")
    return leaves[0]


def _from_export(ep: Any, user_model: Any, example_input: Any, model_name: str, batch: int,
                 trainable: Sequence[str] | None, optimizer: str, output: str | int | None) -> Graph:
    """The training graph of an exported (functional) program."""
    import torch
    import torch.fx as fx

    sig = ep.graph_signature
    b = _Builder()
    fwds: list[_Fwd] = []
    env: dict[str, int] = {}                 # node name -> tensor id of its value
    multi: dict[str, dict[int, int]] = {}    # multi-output node -> {index: tensor id} made by its rule
    trainable_params: set[int] = set()
    kinds_of: dict[int, str] = {}            # placeholder tensor id -> role

    # tied parameters: export lifts each object once, under its first name; trainable if any holder is
    names_of: dict[int, list[str]] = {}
    for qn, p in user_model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(qn)
    qual = {qn: id(p) for qn, p in user_model.named_parameters(remove_duplicate=False)}
    frozen = {qn for qn, p in user_model.named_parameters(remove_duplicate=False) if not p.requires_grad}

    # which nodes the logits depend on (the rest: buffer updates PORT's kernels do themselves, asserts)
    user_outs = [s for s in sig.output_specs if s.kind.name == "USER_OUTPUT"]
    li = _logits_index(ep, output, model_name)
    out_node_name = user_outs[li].arg.name
    nodes = {n.name: n for n in ep.graph.nodes}
    needed: set[str] = set()
    stack = [out_node_name]
    while stack:
        nm = stack.pop()
        if nm in needed or nm not in nodes:
            continue
        needed.add(nm)
        for a in nodes[nm].all_input_nodes:
            stack.append(a.name)
    for s in sig.output_specs:
        if s.kind.name == "PARAMETER_MUTATION":
            raise PortTraceError(f"{model_name}: forward() modifies the parameter '{s.target}' in place; PORT "
                                 f"trains parameters only through their gradients. Fix: compute a new tensor "
                                 f"instead of writing into the parameter.")

    input_id = -1
    extra: list[tuple[str, int]] = []        # further inputs (name, tensor id)
    by_name = dict(example_inputs(example_input))          # matched by name first, else in pytree order
    order = list(by_name)
    obj_tensor: dict = {}                    # id(parameter object) -> tensor id
    in_specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
    for node in ep.graph.nodes:
        if node.op != "placeholder":
            continue
        spec = in_specs.get(node.name)
        kind = spec.kind.name if spec is not None else "USER_INPUT"
        val = C.val_of(node)
        if kind == "USER_INPUT":
            if not isinstance(val, torch.Tensor):
                continue                          # a constant Python argument
            k = node.name if node.name in by_name else next((n for n in order if n in by_name), None)
            if k is None:
                raise PortTraceError(f"{model_name}: the exported program has an input '{node.name}' PORT cannot "
                                     f"match to the example inputs {list(dict(example_inputs(example_input)))}")
            v = by_name.pop(k)
            tid = b.tensor("input" if input_id < 0 else k, v.shape, _dtype_name(v.dtype), ROLE_INPUT)
            if input_id < 0:
                input_id = tid
            else:
                extra.append((k, tid))
            env[node.name] = tid
        elif kind == "PARAMETER":
            qn = spec.target
            obj = qual.get(qn, qn)
            if obj in obj_tensor:              # a tied parameter lifted under a second name: the same tensor
                env[node.name] = obj_tensor[obj]
                continue
            holders = names_of.get(obj, [qn])
            tid = obj_tensor[obj] = b.tensor(holders[0], val.shape, _dtype_name(val.dtype), ROLE_PARAMETER)
            if qn not in frozen and any(_module_is_trainable(trainable, h.rsplit(".", 1)[0] if "." in h else "")
                                        for h in holders):
                trainable_params.add(tid)
            env[node.name] = tid
            kinds_of[tid] = ROLE_PARAMETER
        elif kind == "BUFFER":
            tid = b.tensor(spec.target, val.shape, _dtype_name(val.dtype), ROLE_BUFFER)
            env[node.name] = tid
            kinds_of[tid] = ROLE_BUFFER
        elif kind == "CONSTANT_TENSOR":
            if node.name not in needed:
                continue
            value = ep.constants[spec.target]
            if value.numel() > C.MAX_CONSTANT_NUMEL:
                raise PortTraceError(
                    f"{model_name}: the tensor constant '{spec.target}' ({list(value.shape)}) is made in forward() "
                    f"or kept as a plain attribute; PORT keeps constants of at most {C.MAX_CONSTANT_NUMEL} "
                    f"elements in the graph. Fix: register it as a buffer (self.register_buffer(...)).")
            y = b.tensor(f"{spec.target}:const", value.shape, _dtype_name(value.dtype), ROLE_ACTIVATION)
            fwds.append(_Fwd(f"constant.{spec.target}", "", C.TORCH_OP, dict(call=C.constant_call(value)), (), {}, {},
                             (y,), 0, 0))
            env[node.name] = y
        else:
            raise PortTraceError(f"{model_name}: unsupported input kind {kind} ('{node.name}')")
    if input_id < 0:
        raise PortTraceError(f"{model_name}: forward() takes no tensor input")

    leaf_seen: set[str] = set()
    leafs = {n for n, m in user_model.named_modules() if not any(True for _ in m.children())}
    ctx = _Ctx(b, env, multi, kinds_of, model_name, batch)
    for node in ep.graph.nodes:
        if node.op != "call_function" or node.name not in needed:
            continue
        path, _cls = C.module_path(node)
        if path in leafs and path not in leaf_seen:
            opname = path
            leaf_seen.add(path)
        else:
            opname = f"{path}.{node.name}" if path else node.name
        ctx.node, ctx.opname, ctx.scope = node, opname, path
        made = _translate(ctx)
        if made is None:
            continue
        made = made if isinstance(made, list) else [made]
        fwds.extend(made)
        if node.name not in env and node.name not in multi:
            env[node.name] = made[-1].outputs[0]

    res = nodes[out_node_name]
    if res.name not in env:
        raise PortTraceError(f"{model_name}: forward() returned no tensor")
    logits_id = env[res.name]
    logits = b.tensors[logits_id]
    if len(logits.shape) not in (2, 3) or logits.shape[0] != batch or logits.dtype != "float32":
        raise PortTraceError(f"{model_name}: cross_entropy needs float32 logits [N, classes] (or [N, T, vocab] for a "
                             f"token-level loss); the model returns {list(logits.shape)} ({logits.dtype}). "
                             f"Flatten before the classifier, or pick another output with output=.")
    if b.tensors[logits_id].role != ROLE_ACTIVATION or not any(logits_id in f.outputs for f in fwds):
        raise PortTraceError(f"{model_name}: forward() returns a tensor no op computes ({logits.name})")
    if not trainable_params:
        raise PortTraceError(f"{model_name}: no trainable parameters (trainable={trainable!r} matched "
                             f"no module with parameters)")
    g = _assemble(b, fwds, model_name, batch, input_id, logits_id, trainable_params, optimizer)
    return replace(g, extra_inputs=tuple(extra)) if extra else g


@dataclass
class _Ctx:
    """What translating one exported node needs: the builder, node -> tensor maps, the node and its name."""
    b: _Builder
    env: dict
    multi: dict
    roles: dict
    model_name: str
    batch: int
    node: Any = None
    opname: str = ""
    scope: str = ""

    def shape(self, t: int) -> tuple[int, ...]:
        return self.b.tensors[t].shape

    def dtype(self, t: int) -> str:
        return self.b.tensors[t].dtype

    def t(self, a: Any) -> int:
        """Tensor id of an argument node."""
        try:
            return self.env[a.name]
        except (KeyError, AttributeError):
            raise self.error(f"an operand ({a!r}) that is not a tensor PORT tracked") from None

    def out(self, suffix: str = "", val: Any = None) -> int:
        v = C.val_of(self.node) if val is None else val
        return self.b.tensor(f"{self.opname}{suffix}:out" if not suffix else f"{self.opname}:{suffix}",
                             tuple(v.shape), C.dtype_name(v.dtype), ROLE_ACTIVATION)

    def is_param(self, a: Any) -> bool:
        return hasattr(a, "name") and self.roles.get(self.env.get(a.name, -1)) == ROLE_PARAMETER

    def is_buffer(self, a: Any) -> bool:
        return hasattr(a, "name") and self.roles.get(self.env.get(a.name, -1)) == ROLE_BUFFER

    def error(self, what: str) -> PortTraceError:
        src = C.source_line(self.node)
        return PortTraceError(f"{self.model_name}: {what} at module path '{self.scope or '<root>'}' (aten node "
                              f"'{self.node.name}' {self.node.target}{', ' + src if src else ''})")

    def alias(self, x: int) -> None:
        """The node's value is ``x``'s bytes (the same shape, or a reshape of them)."""
        v = C.val_of(self.node)
        if tuple(v.shape) == self.shape(x) and C.dtype_name(v.dtype) == self.dtype(x):
            self.env[self.node.name] = x
            return None
        y = self.out()
        return _view(self.b, self.opname, self.scope, x, y)


def _arg(node: Any, i: int, name: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _translate(ctx: _Ctx) -> _Fwd | None:
    """The forward op of ``ctx.node``: a PORT kind where a rule applies, else a torch_op; None when the node only
    names another tensor (alias, getitem of a rule's output)."""
    import operator
    node = ctx.node
    if node.target is operator.getitem:
        src, i = node.args
        if src.name in ctx.multi:
            if i not in ctx.multi[src.name]:
                raise ctx.error(f"output {i} of '{src.name}', which PORT does not keep")
            ctx.env[node.name] = ctx.multi[src.name][i]
            return None
        return _torch_op(ctx, src, index=i)
    if not hasattr(node.target, "_overloadpacket"):
        raise ctx.error(f"a call of {node.target!r}, which is not an aten op")
    rule = _RULES.get(node.target._overloadpacket.__name__)
    if rule is not None:
        f = rule(ctx)
        if f is not False:
            return f
    if isinstance(C.val_of(node), (tuple, list)):
        return None          # a multi-output op: each getitem of it becomes its own torch_op
    return _torch_op(ctx, node)


def _torch_op(ctx: _Ctx, src: Any, index: int | None = None) -> _Fwd:
    """A torch_op running ``src``'s aten op (its ``index``-th output), differentiated by PyTorch."""
    import torch.fx as fx
    node = ctx.node
    operands: list = []
    fx.node.map_arg((src.args, src.kwargs), lambda a: operands.append(a) if a.name not in
                    [o.name for o in operands] else None)
    xs = [a for a in operands if not ctx.is_param(a) and not ctx.is_buffer(a)]
    ps = [a for a in operands if ctx.is_param(a)]
    bs = [a for a in operands if ctx.is_buffer(a)]
    order = {a.name: i for i, a in enumerate(xs + ps + bs)}
    try:
        call = C.call_json(src.target, src.args, src.kwargs, index, lambda a: order[a.name])
    except TypeError as e:
        raise ctx.error(f"an argument PORT cannot store ({e})") from None
    v = C.val_of(node)
    import torch
    if not isinstance(v, torch.Tensor):
        raise ctx.error(f"'{src.target}' returning {type(v).__name__}, not a tensor")
    y = ctx.out()
    attrs: dict[str, Any] = dict(call=call)
    if C.is_random(call):
        attrs["random"] = True
    if not _differentiable(src, index):
        attrs["no_grad"] = True          # new_zeros(x, ...), comparisons: no gradient flows back
    flops = _torch_op_flops(src, index)
    return _Fwd(ctx.opname, ctx.scope, C.TORCH_OP, attrs, tuple(ctx.t(a) for a in xs),
                {f"in{order[a.name]}": ctx.t(a) for a in ps}, {f"in{order[a.name]}": ctx.t(a) for a in bs}, (y,),
                flops, numel(tuple(v.shape)))


def _meta_args(src: Any, grad: bool):
    import torch
    import torch.fx as fx

    def meta(a):
        v = C.val_of(a)
        if not isinstance(v, torch.Tensor):
            return v
        t = torch.empty(v.shape, dtype=v.dtype, device="meta")
        return t.requires_grad_(True) if grad and t.is_floating_point() else t
    return fx.node.map_arg(src.args, meta), fx.node.map_arg(src.kwargs, meta)


def _differentiable(src: Any, index: int | None) -> bool:
    """Whether autograd tracks the aten call's result (probed on meta tensors); True when the probe fails."""
    import torch
    try:
        args, kwargs = _meta_args(src, True)
        with torch.enable_grad():
            r = src.target(*args, **kwargs)
        r = r[index] if index is not None else r
        return bool(r.requires_grad)
    except Exception:  # noqa: BLE001 - an op without a meta kernel
        return True


def _torch_op_flops(src: Any, index: int | None) -> int:
    """FLOPs of an aten call by torch.utils.flop_counter (counted on meta tensors of the recorded shapes)."""
    import torch
    import torch.fx as fx
    from torch.utils.flop_counter import FlopCounterMode
    try:
        args, kwargs = _meta_args(src, False)
        with FlopCounterMode(display=False) as fc:
            src.target(*args, **kwargs)
        return int(fc.get_total_flops())
    except Exception:  # noqa: BLE001 - an op without a meta kernel: counted as elementwise work only
        return 0


# ---------------------------------------------------------------------------------------------
# rules: aten op -> PORT kind (False: not this kind here, the op becomes a torch_op)
# ---------------------------------------------------------------------------------------------
def _float32(ctx: _Ctx, *ts: int) -> bool:
    return all(ctx.dtype(t) == "float32" for t in ts)


def _r_alias(ctx: _Ctx):
    x = ctx.t(ctx.node.args[0])
    v = C.val_of(ctx.node)
    if numel(tuple(v.shape)) != numel(ctx.shape(x)) or C.dtype_name(v.dtype) != ctx.dtype(x):
        return False
    return ctx.alias(x)


def _r_slice(ctx: _Ctx):
    x = ctx.t(ctx.node.args[0])
    v = C.val_of(ctx.node)
    if tuple(v.shape) == ctx.shape(x) and _arg(ctx.node, 4, "step", 1) == 1:
        return ctx.alias(x)           # a slice over the whole dim
    return False


def _r_to_copy(ctx: _Ctx):
    x = ctx.t(ctx.node.args[0])
    v = C.val_of(ctx.node)
    if C.dtype_name(v.dtype) == ctx.dtype(x):
        return ctx.alias(x)
    return False


def _r_copy(ctx: _Ctx):
    """aten.copy(self, src) (functionalized slice assignment): a tensor of self's shape holding src's values."""
    n = ctx.node
    dst, src = ctx.t(n.args[0]), ctx.t(n.args[1])
    if ctx.shape(dst) == ctx.shape(src) and ctx.dtype(dst) == ctx.dtype(src):
        return ctx.alias(src)
    return False


def _r_conv2d(ctx: _Ctx):
    n = ctx.node
    xa, wa, ba = n.args[0], n.args[1], _arg(n, 2, "bias")
    stride, pad, dil, groups = (_arg(n, 3, "stride", [1, 1]), _arg(n, 4, "padding", [0, 0]),
                                _arg(n, 5, "dilation", [1, 1]), _arg(n, 6, "groups", 1))
    x = ctx.t(xa)
    if (len(ctx.shape(x)) != 4 or isinstance(pad, str) or _pair(dil) != (1, 1) or not ctx.is_param(wa)
            or (ba is not None and not ctx.is_param(ba)) or not _float32(ctx, x)):
        return False
    w = ctx.t(wa)
    kh, kw = ctx.shape(w)[2:]
    y = ctx.out()
    ys = ctx.shape(y)
    bias = ctx.t(ba) if ba is not None else None
    attrs = dict(stride=_pair(stride), padding=_pair(pad), groups=int(groups), kernel=(kh, kw), bias=bias is not None)
    flops = 2 * ctx.batch * ys[1] * ys[2] * ys[3] * ctx.shape(w)[1] * kh * kw
    params = {"weight": w} | ({"bias": bias} if bias is not None else {})
    return _Fwd(ctx.opname, ctx.scope, "conv2d", attrs, (x,), params, {}, (y,), flops,
                numel(ys) if bias is not None else 0)


def _r_batch_norm(ctx: _Ctx):
    """_native_batch_norm_legit_functional (training: outputs y, mean, rstd, new running mean/var) and
    _native_batch_norm_legit_no_training (eval: y, and two empty tensors)."""
    n = ctx.node
    packet = n.target._overloadpacket.__name__
    training = packet == "_native_batch_norm_legit_functional"
    if training:
        xa, wa, ba, rma, rva, tr, mom, eps = n.args[:8]
        if not tr:
            return False
    else:
        xa, wa, ba, rma, rva, mom, eps = n.args[:7]
    x = ctx.t(xa)
    if (len(ctx.shape(x)) != 4 or not ctx.is_param(wa) or not ctx.is_param(ba) or not ctx.is_buffer(rma)
            or not ctx.is_buffer(rva) or not _float32(ctx, x)):
        return False
    vals = C.val_of(n)
    y = ctx.out(val=vals[0])
    outs: tuple[int, ...] = (y,)
    ys = ctx.shape(y)
    if training:
        outs = (y, ctx.b.tensor(f"{ctx.opname}:stats", (2, ys[1]), "float32", ROLE_ACTIVATION))
    ctx.multi[n.name] = {0: y}
    attrs = dict(training=training, eps=float(eps), momentum=float(mom))
    return _Fwd(ctx.opname, ctx.scope, "batch_norm2d", attrs, (x,), {"weight": ctx.t(wa), "bias": ctx.t(ba)},
                {"running_mean": ctx.t(rma), "running_var": ctx.t(rva)}, outs, 0, (8 if training else 2) * numel(ys))


def _unary(kind: str, vf: int):
    def rule(ctx: _Ctx):
        x = ctx.t(ctx.node.args[0])
        if not _float32(ctx, x):
            return False
        y = ctx.out()
        return _Fwd(ctx.opname, ctx.scope, kind, {}, (x,), {}, {}, (y,), 0, vf * numel(ctx.shape(y)))
    return rule


def _r_hardtanh(ctx: _Ctx):
    n = ctx.node
    if (float(_arg(n, 1, "min_val", -1.0)), float(_arg(n, 2, "max_val", 1.0))) != (0.0, 6.0):
        return False
    return _unary("relu6", 1)(ctx)


def _pool_args(ctx: _Ctx):
    """(x, kernel, stride, padding) of an aten pool call, or None where PORT's pool kernels do not apply (not a
    float32 [N, C, H, W] input, or padding over half the kernel)."""
    n = ctx.node
    x = ctx.t(n.args[0])
    k = _pair(n.args[1])
    s = _pair(_arg(n, 2, "stride", []) or k)
    p = _pair(_arg(n, 3, "padding", 0))
    if len(ctx.shape(x)) != 4 or 2 * p[0] > k[0] or 2 * p[1] > k[1] or not _float32(ctx, x):
        return None
    return x, k, s, p


def _r_max_pool2d(ctx: _Ctx):
    n, a = ctx.node, _pool_args(ctx)
    if a is None or _pair(_arg(n, 4, "dilation", 1)) != (1, 1) or _arg(n, 5, "ceil_mode", False):
        return False
    x, k, s, p = a
    y = ctx.out()
    idx = ctx.b.tensor(f"{ctx.opname}:indices", ctx.shape(y), "int64", ROLE_ACTIVATION)
    return _Fwd(ctx.opname, ctx.scope, "max_pool2d", dict(kernel=k, stride=s, padding=p), (x,), {}, {}, (y, idx),
                0, numel(ctx.shape(y)) * k[0] * k[1])


def _r_avg_pool2d(ctx: _Ctx):
    n, a = ctx.node, _pool_args(ctx)
    if (a is None or _arg(n, 4, "ceil_mode", False) or not _arg(n, 5, "count_include_pad", True)
            or _arg(n, 6, "divisor_override") is not None):
        return False
    x, k, s, p = a
    y = ctx.out()
    return _Fwd(ctx.opname, ctx.scope, "avg_pool2d", dict(kernel=k, stride=s, padding=p), (x,), {}, {}, (y,), 0,
                numel(ctx.shape(y)) * k[0] * k[1])


def _global_pool(ctx: _Ctx, x: int) -> _Fwd:
    """The spatial mean of [N, C, H, W] as global_avg_pool2d ([N, C, 1, 1]), then a view to the node's shape."""
    v = C.val_of(ctx.node)
    n_, c = ctx.shape(x)[:2]
    y = ctx.b.tensor(f"{ctx.opname}:out", (n_, c, 1, 1), "float32", ROLE_ACTIVATION)
    f = _Fwd(ctx.opname, ctx.scope, "global_avg_pool2d", {}, (x,), {}, {}, (y,), 0, numel(ctx.shape(x)))
    if tuple(v.shape) == (n_, c, 1, 1):
        return f
    return [f, _view(ctx.b, f"{ctx.opname}.view", ctx.scope, y, ctx.b.tensor(
        f"{ctx.opname}.view:out", tuple(v.shape), "float32", ROLE_ACTIVATION))]


def _r_adaptive_avg(ctx: _Ctx):
    x = ctx.t(ctx.node.args[0])
    if len(ctx.shape(x)) != 4 or _pair(ctx.node.args[1]) != (1, 1) or not _float32(ctx, x):
        return False
    return _global_pool(ctx, x)


def _r_mean(ctx: _Ctx):
    n = ctx.node
    x = ctx.t(n.args[0])
    xs = ctx.shape(x)
    dims = _arg(n, 1, "dim")
    keep = bool(_arg(n, 2, "keepdim", False))
    if dims is None or n.kwargs.get("dtype") is not None or not _float32(ctx, x):
        return False
    dims = sorted(d % len(xs) for d in (dims if isinstance(dims, (list, tuple)) else [dims]))
    if len(xs) == 4 and dims == [2, 3]:
        return _global_pool(ctx, x)
    if len(dims) == 1 and not keep and dims[0] != len(xs) - 1 and len(xs) >= 2:
        y = ctx.out()
        return _Fwd(ctx.opname, ctx.scope, "mean_mid", dict(dim=dims[0]), (x,), {}, {}, (y,), 0, numel(xs))
    return False


def _r_linear(ctx: _Ctx):
    n = ctx.node
    xa, wa, ba = n.args[0], n.args[1], _arg(n, 2, "bias")
    x = ctx.t(xa)
    if (not ctx.is_param(wa) or (ba is not None and not ctx.is_param(ba)) or len(ctx.shape(x)) < 2
            or not _float32(ctx, x)):
        return False
    w = ctx.t(wa)
    y = ctx.out()
    bias = ctx.t(ba) if ba is not None else None
    params = {"weight": w} | ({"bias": bias} if bias is not None else {})
    rows = numel(ctx.shape(x)[:-1])
    return _Fwd(ctx.opname, ctx.scope, "linear", dict(bias=bias is not None), (x,), params, {}, (y,),
                2 * rows * ctx.shape(w)[0] * ctx.shape(w)[1], rows * ctx.shape(w)[0] if bias is not None else 0)


def _r_add(ctx: _Ctx):
    n = ctx.node
    a, c = n.args[0], n.args[1]
    if not hasattr(a, "name") or not hasattr(c, "name") or _arg(n, 2, "alpha", 1) != 1:
        return False
    ta, tc = ctx.t(a), ctx.t(c)
    if not _float32(ctx, ta, tc):
        return False
    sa, sc = ctx.shape(ta), ctx.shape(tc)
    if sa == sc:
        y = ctx.out()
        return _Fwd(ctx.opname, ctx.scope, "add", {}, (ta, tc), {}, {}, (y,), 0, numel(sa))
    if len(sc) > len(sa):
        ta, tc, sa, sc = tc, ta, sc, sa
    if sc and len(sc) < len(sa) and tuple(sa[len(sa) - len(sc):]) == tuple(sc):
        y = ctx.out()
        return _Fwd(ctx.opname, ctx.scope, "add_bcast", {}, (ta, tc), {}, {}, (y,), 0, numel(sa))
    return False


def _r_dropout(ctx: _Ctx):
    """native_dropout(x, p, train) -> (y, mask); dropout(x, p, train) -> y."""
    n = ctx.node
    x = ctx.t(n.args[0])
    p, train = float(_arg(n, 1, "p")), _arg(n, 2, "train", True)
    if not train or p == 0.0:
        if n.target._overloadpacket.__name__ == "native_dropout":
            ctx.multi[n.name] = {0: x}
            return None
        return ctx.alias(x)
    if not _float32(ctx, x) or not 0.0 < p < 1.0:
        return False
    v = C.val_of(n)
    y = ctx.out(val=v[0] if isinstance(v, (tuple, list)) else v)
    mask = ctx.b.tensor(f"{ctx.opname}:mask", ctx.shape(y), "uint8", ROLE_ACTIVATION)
    if isinstance(v, (tuple, list)):
        ctx.multi[n.name] = {0: y}
    return _Fwd(ctx.opname, ctx.scope, "dropout", dict(p=p), (x,), {}, {}, (y, mask), 0, 2 * numel(ctx.shape(y)))


def _r_embedding(ctx: _Ctx):
    n = ctx.node
    wa, ia = n.args[0], n.args[1]
    if (_arg(n, 2, "padding_idx", -1) != -1 or _arg(n, 3, "scale_grad_by_freq", False) or _arg(n, 4, "sparse", False)
            or not ctx.is_param(wa) or ctx.dtype(ctx.t(ia)) != "int64"):
        return False
    y = ctx.out()
    return _Fwd(ctx.opname, ctx.scope, "embedding", {}, (ctx.t(ia),), {"weight": ctx.t(wa)}, {}, (y,), 0, 0)


def _r_layer_norm(ctx: _Ctx):
    n = ctx.node
    x = ctx.t(n.args[0])
    shape_ = list(n.args[1])
    wa, ba, eps = _arg(n, 2, "weight"), _arg(n, 3, "bias"), float(_arg(n, 4, "eps", 1e-5))
    xs = ctx.shape(x)
    if (len(shape_) != 1 or shape_[0] != xs[-1] or (wa is not None and not ctx.is_param(wa))
            or (ba is not None and not ctx.is_param(ba)) or (wa is None and ba is not None) or not _float32(ctx, x)):
        return False
    params = {}
    if wa is not None:
        params["weight"] = ctx.t(wa)
    if ba is not None:
        params["bias"] = ctx.t(ba)
    y = ctx.out()
    stats = ctx.b.tensor(f"{ctx.opname}:stats", (2, numel(xs[:-1])), "float32", ROLE_ACTIVATION)
    return _Fwd(ctx.opname, ctx.scope, "layer_norm", dict(eps=eps, affine=tuple(params)), (x,), params, {},
                (y, stats), 0, 8 * numel(xs))


def _r_gelu(ctx: _Ctx):
    n = ctx.node
    x = ctx.t(n.args[0])
    approx = n.kwargs.get("approximate", "none")
    if approx not in ("none", "tanh") or not _float32(ctx, x):
        return False
    y = ctx.out()
    return _Fwd(ctx.opname, ctx.scope, "gelu", dict(approximate=approx), (x,), {}, {}, (y,), 0, 8 * numel(ctx.shape(y)))


def _r_softmax(ctx: _Ctx):
    n = ctx.node
    x = ctx.t(n.args[0])
    d = n.args[1]
    if d % len(ctx.shape(x)) != len(ctx.shape(x)) - 1 or not _float32(ctx, x) or \
            (n.target._overloadpacket.__name__ == "_softmax" and n.args[2]) or n.kwargs.get("dtype") is not None \
            or (len(n.args) > 2 and n.target._overloadpacket.__name__ == "softmax" and n.args[2] is not None):
        return False
    y = ctx.out()
    return _Fwd(ctx.opname, ctx.scope, "softmax", {}, (x,), {}, {}, (y,), 0, 4 * numel(ctx.shape(y)))


def _r_matmul(ctx: _Ctx):
    a, c = ctx.t(ctx.node.args[0]), ctx.t(ctx.node.args[1])
    sa, sc = ctx.shape(a), ctx.shape(c)
    if len(sa) < 2 or len(sa) != len(sc) or sa[:-2] != sc[:-2] or sa[-1] != sc[-2] or not _float32(ctx, a, c):
        return False
    y = ctx.out()
    return _Fwd(ctx.opname, ctx.scope, "matmul", {}, (a, c), {}, {}, (y,), 2 * numel(sa[:-2]) * sa[-2] * sc[-1] * sa[-1], 0)


def _r_sdpa(ctx: _Ctx):
    n = ctx.node
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    a = dict(zip(names, n.args)) | dict(n.kwargs)
    if float(a.get("dropout_p", 0.0) or 0.0) != 0.0 or a.get("enable_gqa"):
        return False
    q, k, v = (ctx.t(a[x]) for x in ("query", "key", "value"))
    sq, sk, sv = ctx.shape(q), ctx.shape(k), ctx.shape(v)
    if len(sq) != 4 or sk != sv or sq[:2] != sk[:2] or sq[3] != sk[3] or not _float32(ctx, q, k, v):
        return False
    n_, h, tq, d = sq
    tk = sk[2]
    scale = a.get("scale")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    ins = (q, k, v)
    mask = a.get("attn_mask")
    if mask is not None:
        m = ctx.t(mask)
        if ctx.dtype(m) != "bool" or tuple(ctx.shape(m)) != (n_, 1, 1, tk):
            return False
        ins = ins + (m,)
    y = ctx.out()
    lse = ctx.b.tensor(f"{ctx.opname}:lse", (n_, h, tq), "float32", ROLE_ACTIVATION)
    attrs = dict(causal=bool(a.get("is_causal", False)), scale=scale, masked=mask is not None)
    return _Fwd(ctx.opname, ctx.scope, "attention", attrs, ins, {}, {}, (y, lse), 4 * n_ * h * tq * tk * d,
                6 * n_ * h * tq * tk)


def _r_permute(ctx: _Ctx):
    n = ctx.node
    x = ctx.t(n.args[0])
    r = len(ctx.shape(x))
    packet = n.target._overloadpacket.__name__
    if packet == "permute":
        perm = [d % r for d in n.args[1]]
    else:
        d0, d1 = (n.args[1], n.args[2]) if packet == "transpose" else (0, 1)
        perm = list(range(r))
        perm[d0 % r], perm[d1 % r] = perm[d1 % r], perm[d0 % r]
    if perm == list(range(r)):
        return ctx.alias(x)
    if r > 6 or not _float32(ctx, x):
        return False
    y = ctx.out()
    return _Fwd(ctx.opname, ctx.scope, "permute", dict(perm=tuple(perm)), (x,), {}, {}, (y,), 0, 0)


def _r_scale(ctx: _Ctx):
    n = ctx.node
    a, c = n.args[0], n.args[1]
    if not hasattr(a, "name") or hasattr(c, "name") or isinstance(c, bool) or not isinstance(c, (int, float)) \
            or n.kwargs.get("rounding_mode"):
        return False
    x = ctx.t(a)
    if not _float32(ctx, x):
        return False
    alpha = float(c) if n.target._overloadpacket.__name__ == "mul" else 1.0 / float(c)
    y = ctx.out()
    return _Fwd(ctx.opname, ctx.scope, "scale", dict(alpha=alpha), (x,), {}, {}, (y,), 0, numel(ctx.shape(y)))


def _r_ne(ctx: _Ctx):
    n = ctx.node
    x = ctx.t(n.args[0])
    c = n.args[1]
    if ctx.dtype(x) != "int64" or not isinstance(c, int) or isinstance(c, bool):
        return False
    y = ctx.out()
    return _Fwd(ctx.opname, ctx.scope, "ne_scalar", dict(value=int(c)), (x,), {}, {}, (y,), 0, numel(ctx.shape(y)))


def _r_arange(ctx: _Ctx):
    n = ctx.node
    v = C.val_of(n)
    if len(n.args) != 1 or C.dtype_name(v.dtype) != "int64":
        return False
    y = ctx.out()
    return _Fwd(ctx.opname, ctx.scope, "arange", dict(start=0), (), {}, {}, (y,), 0, 0)


_RULES: dict[str, Callable[[_Ctx], Any]] = {
    **{k: _r_alias for k in C._ALIAS_OPS}, "slice": _r_slice, "_to_copy": _r_to_copy, "copy": _r_copy, "to": _r_to_copy,
    "conv2d": _r_conv2d, "_native_batch_norm_legit_functional": _r_batch_norm,
    "_native_batch_norm_legit_no_training": _r_batch_norm,
    "relu": _unary("relu", 1), "relu6": _unary("relu6", 1), "hardswish": _unary("hardswish", 4),
    "hardtanh": _r_hardtanh,
    "tanh": _unary("tanh", 4), "max_pool2d": _r_max_pool2d, "avg_pool2d": _r_avg_pool2d,
    "adaptive_avg_pool2d": _r_adaptive_avg, "mean": _r_mean, "linear": _r_linear, "add": _r_add,
    "dropout": _r_dropout, "native_dropout": _r_dropout, "embedding": _r_embedding, "layer_norm": _r_layer_norm,
    "gelu": _r_gelu, "softmax": _r_softmax, "_softmax": _r_softmax, "matmul": _r_matmul, "bmm": _r_matmul,
    "scaled_dot_product_attention": _r_sdpa, "transpose": _r_permute, "permute": _r_permute, "t": _r_permute,
    "mul": _r_scale, "div": _r_scale, "ne": _r_ne, "arange": _r_arange,
}


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
        if (any(t in needs_grad for t in f.x) or any(p in needs_grad for p in f.params.values())) \
                and T[f.outputs[0]].dtype.startswith("float") and not f.attrs.get("no_grad"):
            # (integer and boolean results carry none, nor results autograd does not track)
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
        if f.kind == C.TORCH_OP:
            _torch_op_backward(b, f, fo, gy, xs_needing, trainable_params if gw else set(), new_grad, contribute)
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


def _torch_op_backward(b: _Builder, f: _Fwd, fo: Op, gy: int, xs_needing: list[int], trained: set[int],
                       new_grad, contribute) -> None:
    """A torch_op's backward: PyTorch's derivative of its aten call, re-run on the op's inputs (all saved). One
    ``torch_op.grad_input`` op writes the gradients of the activation inputs that need one (overwriting), one
    ``torch_op.grad_weight`` op those of its trained parameters (accumulating, as every weight gradient)."""
    T = b.tensors
    ins = fo.inputs
    call = f.attrs["call"]
    for kind, pos in (("grad_input", [i for i, t in enumerate(ins) if t in xs_needing and i < len(f.x)]),
                      ("grad_weight", [i for i, t in enumerate(ins) if t in trained and t in f.params.values()])):
        if not pos:
            continue
        outs = [(ins[i], new_grad(ins[i], "")) for i in pos]
        b.op(f"{f.name}.{kind}", f.layer, f"{C.TORCH_OP}.{kind}", PHASE_BACKWARD,
             dict(call=call, grads=tuple(pos)) | ({"random": True} if f.attrs.get("random") else {}),
             (gy,) + ins, tuple(g for _, g in outs), flops=2 * f.flops, vector_flops=2 * f.vector_flops,
             forward_op=fo.id)
        for t, g in outs:
            contribute(t, g, f.layer)


def _saved_for(f: _Fwd, T, grad_input: bool, grad_weight: bool, wanted: set[int] = frozenset()) -> tuple[int, ...]:
    """Tensors a forward op's backward reads, as PyTorch's plain kernels choose them (a torch_op's backward
    re-runs its aten call: it reads every input)."""
    x = f.x[0] if f.x else None
    k = f.kind
    if not grad_input and not grad_weight:
        return ()
    if k == C.TORCH_OP:
        return f.x + tuple(f.params.values()) + tuple(f.buffers.values())
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
