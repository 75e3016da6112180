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

from port.errors import ArgumentError, PortTraceError
from port.ir import capture as C
from port.ir import fold as F
from port.ir.inputs import example_inputs  # noqa: F401  (its home before port.ir.inputs; the trainer's import)
from port import ops
from port.ops.base import BackwardCtx, Fwd, default_backward
from port.ops.fallback import capture_node
from port.ops.shape import view_fwd
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
    todo = []
    for p in prepared:         # cached graphs taken now: storing this batch's captures may evict them
        if p[0] is not None and p[0] in _CACHE:
            p.append(_CACHE[p[0]][0])
            _CACHE.move_to_end(p[0])
        else:
            todo.append(p)
    try:
        made = _in_child(_capture_all, [p[1] for p in todo]) if todo else []
    except PortTraceError as e:
        from port.ir.tokens import explain_float_ids
        explain_float_ids([p[1] for p in todo], e)   # raises a TokenError when float ids were the cause
        raise
    for p, g in zip(todo, made):
        p.append(g)
        if p[0] is not None:
            _CACHE[p[0]] = (g, tuple({id(type(m)): type(m) for m in p[1][0].modules()}.values()))
            while len(_CACHE) > CACHE_ENTRIES:
                _CACHE.popitem(last=False)
    out = []
    from port.ir.tokens import check_example
    for p in prepared:
        g = p[2]
        check_example(g, example_inputs(p[1][1]), p[1][0])   # token ids and sequence length (not in the cache key)
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
    if trainable is not None:
        _check_trainable(model, model_name, trainable)
    key = capture_key(model, example_input, (loss, tuple(trainable) if trainable else None, optimizer, output))
    return [key, (model, example_input, model_name, trainable, optimizer, output)]


def _capture_all(jobs: list) -> list[Graph]:
    return [_capture(*j) for j in jobs]


# capture_key -> (graph, the model's module classes): this process's last 32 captures. The classes are held so
# that their ids, which the key names, cannot be reused by other classes while the entry lives.
_CACHE: "OrderedDict[str, tuple]" = OrderedDict()
CACHE_ENTRIES = 32


def capture_key(model: Any, example_input: Any, settings: tuple) -> str | None:
    """A digest of everything a capture reads: each module's class (this process's class object: the code),
    mode, plain attributes (flags such as ``causal``, a Hugging Face config) and hooks, the parameters' and
    buffers' names, shapes, dtypes, requires_grad and tying, which parameters hold an entry exactly 0, the example
    inputs' names, shapes and dtypes, and the trace settings. Not the weights' other values, which a capture does
    not read (tensor attributes that are neither parameters nor buffers are captured as constants: their values
    are part of the key). Dicts and lists
    of plain data count by their JSON text (every timm and Hugging Face model holds some: without them no such
    model's capture was ever reused, and a Trainer after ``port.trace`` captured it again). None when a
    module holds something the key cannot describe (an instance-level ``forward``, hooks, other objects)."""
    import hashlib
    import json
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
            elif isinstance(v, (dict, tuple, list)):
                try:     # configuration kept as plain data (timm's pretrained_cfg and feature_info, HF's tied keys)
                    put(k, json.dumps(v, sort_keys=True))
                except (TypeError, ValueError):
                    return None
            else:
                return None
    first: dict[int, str] = {}
    for qn, p in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False)):
        put(qn, tuple(p.shape), str(p.dtype), bool(p.requires_grad), first.setdefault(id(p), qn))
    # the one thing a capture reads of the weights' values: which parameters have an entry exactly 0 (a batch norm
    # scale with one is never in place, attr gamma_has_zero; _capture's ``zeroed``)
    put(sorted(qn for qn, p in model.named_parameters(remove_duplicate=False) if p.numel() and
               p.dtype.is_floating_point and p.device.type != "meta" and bool((p.detach() == 0).any())))
    for k, v in example_inputs(example_input):
        put(k, tuple(v.shape), str(v.dtype))
    put(type(example_input).__name__, settings)
    return h.hexdigest()


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
    import sys
    import traceback as tb
    if os.environ.get("PORT_CAPTURE") == "inprocess" or not hasattr(os, "fork"):
        return fn(*args)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: capture, write, exit without cleanup
        os.close(r)
        try:
            # libgomp's thread pool does not survive fork: once the parent has run a parallel region (any torch
            # op on a large tensor, the capture key's zero check), the child's first region waits forever at
            # the team barrier for workers it does not have. One thread makes every region the calling thread's.
            if "torch" in sys.modules:
                sys.modules["torch"].set_num_threads(1)
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
        try:
            ep = C.export(copy.deepcopy(model), a, kw | kwargs, model_name)
        except PortTraceError:
            C.check_eager(copy.deepcopy(model), a, kw | kwargs, model_name)   # the model's own error, if it has one
            raise
    return _from_export(ep, model, example_input, model_name, batch, trainable, optimizer, output)


def _check_trainable(model: Any, model_name: str, trainable: Any) -> None:
    """Before the capture: every pattern of ``trainable`` matches a module with parameters (a typo would
    silently freeze what it meant to train)."""
    if not isinstance(trainable, (list, tuple)) or not all(isinstance(p, str) for p in trainable):
        raise ArgumentError(f"{model_name}: trainable={trainable!r}: expected None (train every parameter) or a list "
                            f"of module-name patterns (fnmatch, or a prefix such as 'layer4')")
    owners = sorted({qn.rsplit(".", 1)[0] if "." in qn else "" for qn, _ in
                     model.named_parameters(remove_duplicate=False)})
    idle = [p for p in trainable if not any(_module_is_trainable([p], o) for o in owners)]
    if idle:
        raise ArgumentError(f"{model_name}: trainable pattern(s) {idle} matched no module with parameters; the "
                            f"model's are {owners[:12]}{' ...' if len(owners) > 12 else ''}")


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
    fwds: list[Fwd] = []
    env: dict[str, int] = {}                 # node name -> tensor id of its value
    multi: dict[str, dict[int, int]] = {}    # multi-output node -> {index: tensor id} made by its rule
    trainable_params: set[int] = set()
    kinds_of: dict[int, str] = {}            # placeholder tensor id -> role
    zero_params: set[int] = set()            # parameters with an entry exactly 0 at capture (see zeroed)

    # tied parameters: export lifts each object once, under its first name; trainable if any holder is
    names_of: dict[int, list[str]] = {}
    for qn, p in user_model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(qn)
    qual = {qn: id(p) for qn, p in user_model.named_parameters(remove_duplicate=False)}
    # parameters with an entry exactly 0 at capture (timm's zero-initialised last batch-norm scale of a residual
    # block): a batch norm whose scale has one cannot run in place (x-hat is not rebuilt from y where gamma is 0)
    zeroed = {id(p) for _qn, p in user_model.named_parameters(remove_duplicate=False)
              if p.numel() and p.dtype.is_floating_point and p.device.type != "meta" and bool((p.detach() == 0).any())}
    frozen = {qn for qn, p in user_model.named_parameters(remove_duplicate=False) if not p.requires_grad}

    # which nodes the logits depend on (the rest: buffer updates PORT's kernels do themselves, asserts)
    user_outs = [s for s in sig.output_specs if s.kind.name == "USER_OUTPUT"]
    li = _logits_index(ep, output, model_name)
    out_node_name = user_outs[li].arg.name
    nodes = {n.name: n for n in ep.graph.nodes}
    F.fold_repeat_kv(ep)                     # Llama's repeat_kv before attention: the attention's kv_heads
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

    # constants (position ids, masks, rotary tables) computed once, held as buffers: port.ir.fold
    folding = F.plan(ep, needed, out_node_name)
    needed = folding.needed
    constants: dict[str, str] = {}           # folded buffer name -> recipe
    const_ids: dict[str, int] = {}           # folded buffer name -> tensor id (equal recipes: one tensor)

    def folded_buffer(node: Any) -> None:
        name, recipe = folding.frontier[node.name]
        if name not in constants:
            constants[name] = recipe
            v = C.val_of(node)
            const_ids[name] = b.tensor(name, v.shape, _dtype_name(v.dtype), ROLE_BUFFER)
            kinds_of[const_ids[name]] = ROLE_BUFFER
        env[node.name] = const_ids[name]

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
            if obj in zeroed:
                zero_params.add(tid)
        elif kind == "BUFFER":
            if node.name in folding.folded:
                continue                          # read by folded constants only
            tid = b.tensor(spec.target, val.shape, _dtype_name(val.dtype), ROLE_BUFFER)
            env[node.name] = tid
            kinds_of[tid] = ROLE_BUFFER
        elif kind == "CONSTANT_TENSOR":
            if node.name not in needed:
                continue
            if node.name in folding.frontier:
                folded_buffer(node)
                continue
            value = ep.constants[spec.target]
            C.check_constant(value, spec.target, model_name)
            y = b.tensor(f"{spec.target}:const", value.shape, _dtype_name(value.dtype), ROLE_ACTIVATION)
            fwds.append(Fwd(f"constant.{spec.target}", "", C.TORCH_OP, dict(call=C.constant_call(value)), (), {}, {},
                             (y,), 0, 0))
            env[node.name] = y
        else:
            raise PortTraceError(f"{model_name}: unsupported input kind {kind} ('{node.name}')")
    if input_id < 0:
        raise PortTraceError(f"{model_name}: forward() takes no tensor input")

    leaf_seen: set[str] = set()
    leafs = {n for n, m in user_model.named_modules() if not any(True for _ in m.children())}
    ctx = _Ctx(b, env, multi, kinds_of, model_name, batch, zero_params=frozenset(zero_params))
    for node in ep.graph.nodes:
        if node.op != "call_function" or node.name not in needed or node.name in ctx.skip:
            continue
        if node.name in folding.frontier:
            folded_buffer(node)
            continue
        path, _cls = C.module_path(node)
        if path in leafs and path not in leaf_seen:
            opname = path
            leaf_seen.add(path)
        else:
            opname = f"{path}.{node.name}" if path else node.name
        ctx.node, ctx.opname, ctx.scope = node, opname, path
        _check_static(ctx)
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
    return replace(g, extra_inputs=tuple(extra), constants=tuple(sorted(constants.items())))


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
    src: Any = None          # a getitem's multi-output node (rules keyed "<packet>[]"), and the item's index
    index: int | None = None
    skip: set = field(default_factory=set)   # nodes an earlier rule fused into its op (rms_norm's pattern)
    zero_params: frozenset = frozenset()     # parameter tensors with an entry exactly 0 at capture

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

    def error(self, what: str, fix: str = "") -> PortTraceError:
        return PortTraceError(self.message(what, fix))

    def message(self, what: str, fix: str = "") -> str:
        """'model: what at module path ... (aten node ..., file:line: code)[. Fix: fix]'."""
        src = C.source_line(self.node)
        return (f"{self.model_name}: {what} at module path '{self.scope or '<root>'}' (aten node "
                f"'{self.node.name}' {self.node.target}{', ' + src if src else ''})" + (f". Fix: {fix}" if fix else ""))

    def alias(self, x: int) -> None:
        """The node's value is ``x``'s bytes (the same shape, or a reshape of them)."""
        v = C.val_of(self.node)
        if tuple(v.shape) == self.shape(x) and C.dtype_name(v.dtype) == self.dtype(x):
            self.env[self.node.name] = x
            return None
        y = self.out()
        return view_fwd(self.b, self.opname, self.scope, x, y)


def _check_static(ctx: _Ctx) -> None:
    """PortTraceError when the node's result has a shape that depends on the data (torch.export records it with
    an unbacked size such as u0: boolean-mask indexing, nonzero, unique, ...): PORT plans fixed shapes."""
    import torch
    v = C.val_of(ctx.node)
    for t in (v if isinstance(v, (tuple, list)) else (v,)):
        if isinstance(t, torch.Tensor) and not all(isinstance(s, int) for s in t.shape):
            raise ctx.error(
                f"a tensor whose shape depends on the data ({[str(s) for s in t.shape]}: boolean-mask indexing, "
                f"nonzero, unique, ...)",
                "PORT plans every tensor's memory before training, so shapes must follow from the input's size "
                "alone: keep the shape fixed (torch.where(mask, x, 0) or x * mask instead of x[mask])")


def _translate(ctx: _Ctx) -> Fwd | None:
    """The forward op of ``ctx.node``: a PORT kind where a record's capture rule takes it (port.ops), else a
    torch_op; None when the node only names another tensor (alias, getitem of a rule's output)."""
    import operator
    node = ctx.node
    if node.target is operator.getitem:
        src, i = node.args
        if src.name in ctx.multi:
            if i not in ctx.multi[src.name]:
                raise ctx.error(f"output {i} of '{src.name}', which PORT does not keep")
            ctx.env[node.name] = ctx.multi[src.name][i]
            return None
        if hasattr(src.target, "_overloadpacket"):       # an item of split, unbind, ...: "<packet>[]" rules
            ctx.src, ctx.index = src, i
            try:
                for rule in _rules().get(src.target._overloadpacket.__name__ + "[]", ()):
                    f = rule(ctx)
                    if f is not False:
                        return f
            finally:
                ctx.src, ctx.index = None, None
        return capture_node(ctx, src, index=i)
    if not hasattr(node.target, "_overloadpacket"):
        raise ctx.error(f"a call of {node.target!r}, which is not an aten op")
    for rule in _rules().get(node.target._overloadpacket.__name__, ()):
        f = rule(ctx)
        if f is not False:
            return f
    if isinstance(C.val_of(node), (tuple, list)):
        return None          # a multi-output op: each getitem of it becomes its own torch_op
    return capture_node(ctx, node)


_RULES: dict[str, list] = {}


def _rules() -> dict[str, list]:
    if not _RULES:
        _RULES.update(ops.capture_rules())
    return _RULES


# ---------------------------------------------------------------------------------------------
# backward and updates
# ---------------------------------------------------------------------------------------------
def _assemble(b: _Builder, fwds: list[Fwd], model_name: str, batch: int, input_id: int, logits_id: int,
              trainable_params: set[int], optimizer: str) -> Graph:
    T = b.tensors

    # which activations carry gradients: anything downstream of a trainable parameter
    needs_grad: set[int] = set(trainable_params)
    for f in fwds:
        if (any(t in needs_grad for t in f.x) or any(p in needs_grad for p in f.params.values())) \
                and T[f.outputs[0]].dtype.startswith("float") and not f.attrs.get("no_grad") \
                and "no_grad" not in ops.record(f.kind).tags:
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
        if f.attrs.get("_no_derivative"):      # a torch_op: operands PyTorch cannot differentiate it by
            bad, msg = f.attrs["_no_derivative"]
            params = {int(k[2:]): t for k, t in f.params.items()}
            if any((gi and i < len(f.x) and f.x[i] in wanted) or (w_needed and params.get(i) in trainable_params)
                   for i in bad):
                raise PortTraceError(msg)       # the loss needs a gradient PyTorch cannot give
        saved = _saved_for(f, gi, w_needed, wanted if gi else set())
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

    bc = BackwardCtx(b, new_grad, contribute)
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
        rec = ops.record(f.kind)
        trained = trainable_params if gw else set()
        if rec.backward is not None:
            rec.backward(bc, f, fo, gy, xs_needing, trained)
        else:
            default_backward(rec, bc, f, fo, gy, xs_needing, trained)

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
    frozen = []
    for o in b.ops:
        frozen.append(o if not any(k.startswith("_") for k, _ in o.attrs)
                   else Op(o.id, o.name, o.layer, o.kind, o.phase, tuple((k, v) for k, v in o.attrs if not k.startswith("_")),
                           o.inputs, o.outputs, o.saved, o.flops, o.vector_flops, o.bytes_moved, o.forward_op))
    return Graph(model_name, tuple(b.tensors), tuple(frozen), input_id, label_id, loss_id, logits_id, optimizer, batch)


def _saved_for(f: Fwd, grad_input: bool, grad_weight: bool, wanted: set[int] = frozenset()) -> tuple[int, ...]:
    """Tensors a forward op's backward reads, as PyTorch's plain kernels choose them (its record's rule)."""
    if not grad_input and not grad_weight:
        return ()
    return tuple(ops.record(f.kind).saved(f, grad_input, grad_weight, wanted))
