"""Capture-time rewrites of the exported program: constant folding and grouped-query attention.

**Constant folding.** A model's forward builds tensors that do not depend on the batch's values: position ids
(``arange``), causal masks (``arange`` / compare / ``&`` / ``index`` / ``triu`` / ``where``), rotary ``cos``/``sin``
tables from a registered ``inv_freq``, ``token_type_ids`` buffers expanded and gathered, ``new_ones`` of an
input's shape, casts of all of these. Every exported node whose value is a function of constants only is
*constant*:

* a buffer no op of the program writes (a registered buffer export does not report as mutated: not batch-norm
  running statistics) or a lifted tensor constant;
* a call of an aten op that draws no random numbers, whose tensor operands are all constant, where an operand
  read only for its shape and dtype (``SHAPE_ONLY``: ``new_ones(x, size)``, ``zeros_like(x)``, ...) does not
  count as an operand: those ops do not depend on the operand's values. An op with no tensor operand
  (``arange``, ``full``) is constant. A parameter is never constant (a trainable one changes every step; a frozen
  one is the model's own weight, and a folded copy of it would hold its bytes twice).

Constants that a non-constant node reads (the *frontier*) become buffers of the graph (role ``buffer``, named
``port.const.<module path>.<hash>``): held like the model's buffers (in the arena's persistent region, in
checkpoints and bundles, so port-rt sees plain bytes), not ops. Every other constant node disappears from the
graph, and a registered buffer only folded nodes read is no longer a graph tensor. A frontier ``expand`` whose
result is larger than ``EXPAND_HOLD_BYTES`` (and than its operand) stays an op and its operand is held instead:
a long sequence's causal mask stays [1, 1, T, T], not one copy per sample.

A folded tensor keeps the dtype its consumer reads: a float additive mask is float32; a boolean mask (an
attention ``attn_mask``, a ``masked_fill`` condition) is ``bool`` (one byte per element, 0 or 1, as torch
stores it); position or token-type ids are ``int64``.

Its value is not computed at capture (capture runs on meta tensors, in a child process): the graph stores each
folded tensor's *recipe* (``Graph.constants``: name -> JSON), the aten calls from the model's buffers that make
it, and ``evaluate`` runs that recipe once on the model's real buffers when a Trainer loads the model
(port.train.trainer). The name hashes the recipe, so the training and the inference capture of one model
name the same constant alike.

**Grouped-query attention.** Llama's ``repeat_kv`` (k[:, :, None].expand(b, hkv, n_rep, s, d).reshape(b,
hkv * n_rep, s, d), and the same of v) before ``scaled_dot_product_attention`` is folded into the attention op:
the attention reads the hkv heads itself (``enable_gqa``; the op's ``kv_heads`` attribute), so neither the
expand nor the copy is made.
"""
from __future__ import annotations

import hashlib
import json
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

from port.errors import PortError
from port.ir import capture as C

# aten ops whose first operand is read for its shape, dtype and device only (never its values)
SHAPE_ONLY = frozenset({"new_ones", "new_zeros", "new_full", "new_empty", "new_empty_strided", "ones_like",
                        "zeros_like", "full_like", "empty_like"})
PREFIX = "port.const."
# a constant ``expand`` whose result is larger than this stays an op (its operand is held): a causal mask of a
# long sequence is not held once per sample; below it the expanded tensor is held (a position-id or token-type
# row over a batch is a few KiB, and an expand of a buffer would be an op on the torch engines)
EXPAND_HOLD_BYTES = 256 * 1024
# ops that check rather than compute (no value to fold; export keeps them for its own guards), and ops whose
# result has no defined values (an ``empty`` a random op fills in place: folding it would hold uninitialised
# bytes in the arena, checkpoints and bundles)
_CHECKS = frozenset({"_assert_tensor_metadata", "_assert_scalar", "_assert_async", "sym_constrain_range_for_size",
                     "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})


def is_folded(name: str) -> bool:
    """The graph tensor ``name`` is a folded constant (not the model's state: left out of its state_dict)."""
    return name.startswith(PREFIX)


class FoldError(PortError):
    """A folded constant's recipe cannot be evaluated on this model (a buffer it reads is missing)."""


@dataclass
class Folding:
    """What the folding pass decided about an exported program's nodes."""
    frontier: dict[str, tuple[str, str]] = field(default_factory=dict)  # node -> (buffer name, recipe JSON)
    needed: set[str] = field(default_factory=set)     # nodes the graph still needs (frontier nodes included)
    folded: set[str] = field(default_factory=set)     # constant nodes the graph no longer computes


def _packet(node: Any) -> str:
    t = node.target
    return t._overloadpacket.__name__ if hasattr(t, "_overloadpacket") else ""


def _operands(node: Any) -> list:
    """The exported node's tensor operands whose values it reads (a SHAPE_ONLY op's first operand excluded)."""
    import torch.fx as fx
    ins: list = []
    skip = node.args[0] if _packet(node) in SHAPE_ONLY and node.args and isinstance(node.args[0], fx.Node) \
        else None
    rest = (node.args[1:] if skip is not None else node.args, node.kwargs)
    fx.node.map_arg(rest, lambda a: ins.append(a) if a not in ins else None)
    return ins


def _is_constant_call(node: Any, const: set[str]) -> bool:
    import torch
    if node.target is operator.getitem:
        return node.args[0].name in const
    if not hasattr(node.target, "_overloadpacket") or _packet(node) in _CHECKS:
        return False
    if torch.Tag.nondeterministic_seeded in node.target.tags:
        return False
    v = C.val_of(node)
    if not (isinstance(v, torch.Tensor) or (isinstance(v, (tuple, list)) and v
                                              and all(isinstance(x, torch.Tensor) for x in v))):
        return False
    return all(a.name in const for a in _operands(node))


def plan(ep: Any, needed: set[str], out_name: str) -> Folding:
    """The folding of ``ep``'s nodes that the logits (node ``out_name``) need (see the module's docstring)."""
    sig = ep.graph_signature
    mutated = {s.target for s in sig.output_specs if s.kind.name == "BUFFER_MUTATION"}
    specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
    nodes = {n.name: n for n in ep.graph.nodes}
    const: set[str] = set()
    for node in ep.graph.nodes:
        if node.name not in needed:
            continue
        if node.op == "placeholder":
            s = specs.get(node.name)
            k = s.kind.name if s is not None else ""
            if (k == "BUFFER" and s.target not in mutated) or k == "CONSTANT_TENSOR":
                const.add(node.name)
        elif node.op == "call_function" and _is_constant_call(node, const):
            const.add(node.name)
    if not const:
        return Folding(needed=set(needed))

    def is_buffer(n: Any) -> bool:
        s = specs.get(n.name)
        return n.op == "placeholder" and s is not None and s.kind.name == "BUFFER"

    # nodes computed as ops: the non-constant ones, and frontier expands that would hold more than they read
    ops = {n for n in needed if n not in const}
    while True:
        frontier = _frontier(nodes, ops, const) - ops
        grow = {f for f in frontier if _packet(nodes[f]) == "expand" and _bytes(nodes[f]) > EXPAND_HOLD_BYTES
                and _bytes(nodes[f]) > _bytes(nodes[f].args[0])}
        if not grow:
            break
        ops |= grow
    frontier = {f for f in frontier if not is_buffer(nodes[f])}     # a buffer read as it is stays that buffer
    if not frontier:
        return Folding(needed=set(needed))
    out = Folding()
    for f in sorted(frontier, key=list(nodes).index):
        out.frontier[f] = _recipe(ep, nodes[f], const, specs)
    # what the graph still needs: from the logits, not through the frontier's operands
    stack = [out_name]
    while stack:
        nm = stack.pop()
        if nm in out.needed or nm not in nodes:
            continue
        out.needed.add(nm)
        if nm not in out.frontier:
            stack.extend(a.name for a in nodes[nm].all_input_nodes)
    out.folded = {n for n in const if n not in out.needed}
    return out


def _frontier(nodes: dict, ops: set[str], const: set[str]) -> set[str]:
    """Constant nodes an op node reads."""
    import torch.fx as fx
    fr: set[str] = set()
    for n in ops:
        node = nodes[n]
        args = (node.args, node.kwargs)
        fx.node.map_arg(args, lambda a: fr.add(a.name) if a.name in const else None)
    return fr


def _bytes(node: Any) -> int:
    v = C.val_of(node)
    return C.numel(tuple(v.shape)) * v.element_size() if hasattr(v, "shape") else 0


def _recipe(ep: Any, node: Any, const: set[str], specs: dict) -> tuple[str, str]:
    """(buffer name, recipe JSON) of the constant ``node``: the aten calls, in program order, that make it from
    the model's buffers, lifted constants and shapes."""
    import torch.fx as fx
    order: list = []
    seen: set[str] = set()

    def visit(n: Any) -> None:
        if n.name in seen:
            return
        seen.add(n.name)
        if n.op == "call_function":
            src = n.args[0] if n.target is operator.getitem else n
            for a in _operands(src):
                visit(a)
        order.append(n)
    visit(node)
    index: dict[str, int] = {}
    steps: list[dict] = []
    for n in order:
        if n.op == "placeholder":
            s = specs[n.name]
            if s.kind.name == "BUFFER":
                index[n.name] = len(steps)
                steps.append({"buffer": s.target})
                continue
            value = ep.constants[s.target]
            C.check_constant(value, s.target)
            index[n.name] = len(steps)
            steps.append({"call": C.constant_call(value), "in": []})
            continue
        src, item = (n.args[0], n.args[1]) if n.target is operator.getitem else (n, None)
        ins: list = []
        fx.node.map_arg((src.args, src.kwargs), lambda a: ins.append(a) if a not in ins else None)
        refs = []
        for a in ins:
            if a.name in index:
                refs.append({"step": index[a.name]})
            else:                                     # an operand read for its shape only
                v = C.val_of(a)
                refs.append({"like": [list(v.shape), C.dtype_name(v.dtype)]})
        call = C.call_json(src.target, src.args, src.kwargs, item, lambda a: ins.index(a))
        index[n.name] = len(steps)
        steps.append({"call": call, "in": refs})
    v = C.val_of(node)
    recipe = json.dumps({"steps": steps, "shape": list(v.shape), "dtype": C.dtype_name(v.dtype)},
                        sort_keys=True, separators=(",", ":"))
    path = C.module_path(node)[0] if node.op != "placeholder" else specs[node.name].target
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    return f"{PREFIX}{path + '.' if path else ''}{digest}", recipe


def evaluate(recipe: str, buffer: Callable[[str], Any], device: Any = "cpu"):
    """The value of a folded constant: its recipe's calls run on ``buffer(name)`` (the model's buffers)."""
    import torch
    d = json.loads(recipe)
    vals: list = []
    for s in d["steps"]:
        if "buffer" in s:
            vals.append(buffer(s["buffer"]).to(device))
            continue
        ins = [vals[r["step"]] if "step" in r else
               torch.empty(r["like"][0], dtype=getattr(torch, r["like"][1]), device=device) for r in s["in"]]
        vals.append(C.make_call(s["call"], device)(ins))
    out = vals[-1]
    if list(out.shape) != d["shape"] or C.dtype_name(out.dtype) != d["dtype"]:
        raise FoldError(f"a folded constant evaluated to {list(out.shape)} {out.dtype}, the graph holds "
                        f"{d['shape']} {d['dtype']}: the model's buffers differ from the captured ones; trace again")
    return out.contiguous()


def model_constants(constants: Any, model: Any, device: Any = "cpu") -> dict:
    """{name: value} of a graph's folded constants (``Graph.constants``), from ``model``'s buffers."""
    import torch
    bufs = dict(model.named_buffers(remove_duplicate=False))
    sd: dict | None = None

    def buffer(name: str):
        nonlocal sd
        if name in bufs:
            return bufs[name].detach()
        if sd is None:
            sd = model.state_dict()
        if name not in sd:
            raise FoldError(f"the model has no buffer {name!r}, which a folded constant of its graph reads; "
                            f"trace the model again")
        return sd[name].detach()
    with torch.no_grad():
        return {name: evaluate(r, buffer, device) for name, r in constants}


def shape_constants(constants: Any, device: Any = "cpu") -> dict:
    """{name: value} of those of a graph's folded constants (``Graph.constants``) whose recipes read no model
    buffer (causal masks, position ids: made from shapes alone), for a caller without the model (the profiler:
    its inputs look like a step's). One that reads a buffer (a rotary table from ``inv_freq``) is left out."""
    import torch

    def no_buffer(name: str):
        raise FoldError(f"buffer {name!r}: no model here")
    out = {}
    with torch.no_grad():
        for name, r in constants:
            try:
                out[name] = evaluate(r, no_buffer, device)
            except FoldError:
                continue
    return out


# ---------------------------------------------------------------------------------------------
# grouped-query attention: repeat_kv folded into the attention op
# ---------------------------------------------------------------------------------------------
_VIEWS = frozenset({"view", "_unsafe_view", "reshape"})


def _repeat_kv_base(node: Any, heads: int):
    """(base node, kv heads) when ``node`` is base[:, :, None].expand(b, hkv, n_rep, s, d).reshape(b, hkv * n_rep,
    s, d) (clone and views between allowed) with hkv * n_rep == ``heads``, else None."""
    n = node
    if _packet(n) not in _VIEWS:
        return None
    n = n.args[0]
    if _packet(n) == "clone":
        n = n.args[0]
    if _packet(n) != "expand":
        return None
    u = n.args[0]
    if _packet(u) != "unsqueeze" or u.args[1] not in (2, -3):
        return None
    base = u.args[0]
    bv, ev, ov = C.val_of(base), C.val_of(n), C.val_of(node)
    if not all(hasattr(v, "shape") for v in (bv, ev, ov)) or len(bv.shape) != 4:
        return None
    b, hkv, s, d = bv.shape
    if tuple(ev.shape) != (b, hkv, heads // max(hkv, 1), s, d) or tuple(ov.shape) != (b, heads, s, d) \
            or heads % hkv:
        return None
    return base, hkv


def fold_repeat_kv(ep: Any) -> int:
    """Rewrite every ``scaled_dot_product_attention`` of ``ep`` whose key and value are repeat_kv copies of
    hkv heads to read the hkv heads with ``enable_gqa=True`` (in place); the number of attentions rewritten."""
    done = 0
    for node in ep.graph.nodes:
        if node.op != "call_function" or _packet(node) != "scaled_dot_product_attention" or len(node.args) < 3:
            continue
        q = C.val_of(node.args[0])
        if not hasattr(q, "shape") or len(q.shape) != 4:
            continue
        k, v = _repeat_kv_base(node.args[1], q.shape[1]), _repeat_kv_base(node.args[2], q.shape[1])
        if k is None or v is None or k[1] != v[1]:
            continue
        node.args = (node.args[0], k[0], v[0]) + tuple(node.args[3:])
        node.kwargs = dict(node.kwargs) | {"enable_gqa": True}
        done += 1
    return done
