"""torch_op: any aten op no record captures, run by PyTorch (port.ir.capture).

Forward: the aten call (attribute ``call``: the overload and its non-tensor arguments as JSON) on the torch
engine, its result copied into the op's arena slot. Backward: PyTorch's own derivative, autograd over the call
re-run on the saved inputs: ``torch_op.grad_input`` overwrites the activation inputs' gradients,
``torch_op.grad_weight`` accumulates the parameters'. What is saved is measured at capture: the call runs on meta
tensors under ``torch.autograd.graph.saved_tensors_hooks`` and the operands autograd packs are the ones kept
(attribute ``saves``: their positions); the re-run gets zeros for the others (the derivative does not read
them: a pad, flip or slice_scatter saves nothing, a product the other operand). When autograd saves its output
or a tensor of its own (exp, sigmoid, index's index list), or the probe fails, every input is saved. Random ops (``random``) are seeded per call from
(run seed, forward-pass counter, op), so the re-run draws the same values. FLOPs from torch's FlopCounterMode on
meta tensors. No C kernel: torch engines only, never in a port-rt bundle.

The operands are views of the arena (one storage of the whole plan). aten's scatter ops (slice_scatter,
select_scatter, diagonal_scatter) start with ``clone_preserve_strides``, which copies their input's whole
*storage*: on an arena view that is the arena (hundreds of MB per call: Swin's shifted-window mask, 36 tiny
slice_scatters, took 23 of a 28 s step). Their operands are handed over as compact copies of the slot
(``OWN_STORAGE``), as small as the result the op makes anyway.
"""
from __future__ import annotations

from typing import Any

from port.ir.types import numel
from port.ops import register
from port.ops.base import CallShapeError, Fwd, OpRecord

TORCH_OP = "torch_op"
# aten ops whose kernel clones its operand's whole storage (ATen's clone_preserve_strides), forward or derivative
OWN_STORAGE = frozenset({"aten.slice_scatter.default", "aten.select_scatter.default",
                         "aten.diagonal_scatter.default"})


def capture_node(ctx, src: Any, index: int | None = None) -> Fwd:
    """A torch_op running ``src``'s aten op (its ``index``-th output), differentiated by PyTorch."""
    import torch
    import torch.fx as fx
    from port.ir import capture as C
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
    if not isinstance(v, torch.Tensor):
        raise ctx.error(f"'{src.target}' returning {type(v).__name__}, not a tensor")
    y = ctx.out()
    attrs: dict[str, Any] = dict(call=call)
    if C.is_random(call):
        attrs["random"] = True
    if not _differentiable(src, index):
        attrs["no_grad"] = True          # new_zeros(x, ...), comparisons: no gradient flows back
    else:
        names = [a.name for a in xs + ps + bs]
        missing = {names.index(a.name): m for a in xs + ps if (m := _no_derivative(src, index, a.name))}
        if missing:     # refused by the backward pass only if the loss needs a gradient through such an operand
            attrs["_no_derivative"] = tuple(sorted(missing)), ctx.message(
                f"'{C.op_name(src.target)}' has no derivative in PyTorch ({next(iter(missing.values()))}), and "
                f"the loss needs a "
                f"gradient through it", "detach what flows into it (x.detach()) if no gradient should pass there, "
                f"freeze the parameters before it (trainable=...), or compute it with differentiable ops")
        saves = _saved_operands(src, names)
        if saves is not None and not attrs.get("random") and len(saves) < len(order):
            attrs["saves"] = saves
    return Fwd(ctx.opname, ctx.scope, TORCH_OP, attrs, tuple(ctx.t(a) for a in xs),
               {f"in{order[a.name]}": ctx.t(a) for a in ps}, {f"in{order[a.name]}": ctx.t(a) for a in bs}, (y,),
               _flops(src, index), numel(tuple(v.shape)))


def _meta_args(src: Any, grad: bool):
    import torch
    import torch.fx as fx
    from port.ir import capture as C

    def meta(a):
        v = C.val_of(a)
        if not isinstance(v, torch.Tensor):
            return v
        t = torch.empty(v.shape, dtype=v.dtype, device="meta")
        return t.requires_grad_(True) if grad and t.is_floating_point() else t
    return fx.node.map_arg(src.args, meta), fx.node.map_arg(src.kwargs, meta)


def _saved_operands(src: Any, names: list[str]) -> tuple[int, ...] | None:
    """Positions (in ``names``) of the operands autograd saves for the aten call's backward, every floating operand
    requiring a gradient (probed on meta tensors with saved_tensors_hooks); None when it saves anything else (its
    output, a tensor it made) or the probe fails: then the backward needs every input."""
    import torch
    import torch.fx as fx
    from port.ir import capture as C
    made: dict[int, int] = {}

    def meta(a):
        v = C.val_of(a)
        if not isinstance(v, torch.Tensor):
            return v
        t = torch.empty(v.shape, dtype=v.dtype, device="meta")
        t = t.requires_grad_(True) if t.is_floating_point() else t
        made[id(t)] = names.index(a.name)
        return t
    packed: list = []
    try:
        args, kwargs = fx.node.map_arg(src.args, meta), fx.node.map_arg(src.kwargs, meta)
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t,
                                                                           lambda t: t):
            src.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - no meta kernel: save everything
        return None
    pos = set()
    for t in packed:
        if id(t) not in made:
            return None
        pos.add(made[id(t)])
    return tuple(sorted(pos))


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


def _no_derivative(src: Any, index: int | None, operand: str) -> str:
    """The error of PyTorch's backward of the aten call with respect to its operand node ``operand`` when that
    derivative is not implemented (autograd's ``not_implemented`` formula: zeta's first argument, ...), probed on
    meta tensors; '' when it has one, the operand is not floating, or the probe fails."""
    import torch
    import torch.fx as fx
    from port.ir import capture as C
    leaf: list = []

    def meta(a):
        v = C.val_of(a)
        if not isinstance(v, torch.Tensor):
            return v
        t = torch.empty(v.shape, dtype=v.dtype, device="meta")
        if a.name == operand and t.is_floating_point():
            leaf.append(t.requires_grad_(True))
        return t
    try:
        args, kwargs = fx.node.map_arg(src.args, meta), fx.node.map_arg(src.kwargs, meta)
        if not leaf:
            return ""
        with torch.enable_grad():
            r = src.target(*args, **kwargs)
            r = r[index] if index is not None else r
            if not r.requires_grad:
                return ""
            torch.autograd.grad(r, leaf[:1], torch.empty_like(r), allow_unused=True)
    except NotImplementedError as e:
        msg = str(e).strip().splitlines()
        return msg[0] if msg and "derivative" in msg[0] else ""
    except Exception:  # noqa: BLE001 - no meta kernel for the backward: PyTorch's own run says
        return ""
    return ""


def _flops(src: Any, index: int | None) -> int:
    """FLOPs of an aten call by torch.utils.flop_counter (counted on meta tensors of the recorded shapes)."""
    from torch.utils.flop_counter import FlopCounterMode
    try:
        args, kwargs = _meta_args(src, False)
        with FlopCounterMode(display=False) as fc:
            src.target(*args, **kwargs)
        return int(fc.get_total_flops())
    except Exception:  # noqa: BLE001 - an op without a meta kernel: counted as elementwise work only
        return 0


def _backward(bc, f, fo, gy, xs_needing, trained):
    """One ``torch_op.grad_input`` op writing the gradients of the activation inputs that need one
    (overwriting), one ``torch_op.grad_weight`` op those of its trained parameters (accumulating)."""
    ins = fo.inputs
    call = f.attrs["call"]
    saves = f.attrs.get("saves")
    kept = tuple(range(len(ins))) if saves is None else tuple(saves)
    extra = {} if saves is None else {"saves": kept, "absent": tuple((i, bc.T[ins[i]].shape, bc.T[ins[i]].dtype)
                                                                     for i in range(len(ins)) if i not in kept)}
    for kind, pos in (("grad_input", [i for i, t in enumerate(ins) if t in xs_needing and i < len(f.x)]),
                      ("grad_weight", [i for i, t in enumerate(ins) if t in trained and t in f.params.values()])):
        if not pos:
            continue
        outs = [(ins[i], bc.new_grad(ins[i], "")) for i in pos]
        bc.op(f"{f.name}.{kind}", f.layer, f"{TORCH_OP}.{kind}",
              dict(call=call, grads=tuple(pos)) | extra | ({"random": True} if f.attrs.get("random") else {}),
              (gy,) + tuple(ins[i] for i in kept), tuple(g for _, g in outs), flops=2 * f.flops, vector_flops=2 * f.vector_flops,
              forward_op=fo.id)
        for t, g in outs:
            bc.contribute(t, g, f.layer)


def _shapes(k, attrs, I, O, at):       # the aten op itself checks its operands; the graph fixed their shapes
    if not isinstance(attrs.get("call"), str):
        raise CallShapeError(f"attribute call={attrs.get('call')!r}: expected the aten call as JSON")
    return [(s, None) for s in I], [(s, None) for s in O]


def seeded(random: bool, st, op: int, torch):
    """A context that seeds torch's generator for a random aten op from the run's seed, the forward-pass counter
    and the op (as dropout's masks): a re-run in the same step draws the same values."""
    import contextlib
    if not random:
        return contextlib.nullcontext()
    from port.ops.random import dropout_seed

    @contextlib.contextmanager
    def ctx():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(dropout_seed(st.seed, st.dropout_counter, op) & 0x7FFFFFFFFFFFFFFF)
            yield
    return ctx()


def _compact(call: str, torch):
    """For an OWN_STORAGE op: a map giving each tensor operand its own storage (a contiguous copy of the arena
    view); for any other op the identity (no copy)."""
    import json
    if json.loads(call)["op"] not in OWN_STORAGE:
        return lambda ts: ts
    return lambda ts: [t.clone(memory_format=torch.contiguous_format) for t in ts]


def _torch(kind, a, I, O, env):
    """Forward: the aten call on the input views, its result copied into the output's arena slot (aten allocates
    it: the torch engine's transient memory). Backward (``grads``: input positions): the call re-run under
    autograd on the saved inputs and differentiated by PyTorch (torch.autograd.grad); input gradients overwrite
    their slots, weight gradients (``torch_op.grad_weight``) accumulate."""
    from port.ir.capture import make_call
    torch, st, op = env.torch, env.state, env.op
    random = bool(a.get("random"))
    if kind == TORCH_OP:
        dev = O[0].device if O else (I[0].device if I else None)
        fn = make_call(a["call"], dev)
        own = _compact(a["call"], torch)
        y = O[0]

        def run():
            with torch.no_grad(), seeded(random, st, op, torch):
                y.copy_(fn(own(I)))
        return run
    fn = make_call(a["call"], I[0].device)
    own = _compact(a["call"], torch)
    grads = tuple(a["grads"])
    acc = kind == "torch_op.grad_weight"
    gy, xs = I[0], list(I[1:])
    if "saves" in a:       # operands the derivative does not read: zeros of their shape (floating ones in gy's dtype)
        for i, shape, dtype in a["absent"]:
            xs.insert(i, torch.zeros(shape, dtype=gy.dtype if dtype.startswith("float") else getattr(torch, dtype),
                                     device=gy.device))

    def run():
        with torch.enable_grad(), seeded(random, st, op, torch):
            ins = own(xs)
            leaves = [x.detach().requires_grad_(True) if i in grads else x for i, x in enumerate(ins)]
            out = fn(leaves)
            gs = torch.autograd.grad(out, [leaves[i] for i in grads], own([gy])[0], allow_unused=True)
        for o, g in zip(O, gs):
            if g is None:
                if not acc:
                    o.zero_()
            elif acc:
                o.add_(g.reshape(o.shape))
            else:
                o.copy_(g.reshape(o.shape))
    return run


register(OpRecord(
    kind=TORCH_OP, family="fallback",
    kernels={TORCH_OP: (), "torch_op.grad_input": (), "torch_op.grad_weight": ()},
    shapes=_shapes, torch=_torch, backward=_backward,
    saved=lambda f, gi, gw, wanted: _saved(f), doc=__doc__))


def _saved(f) -> tuple[int, ...]:
    ins = f.x + tuple(f.params.values()) + tuple(f.buffers.values())
    saves = f.attrs.get("saves")
    return ins if saves is None else tuple(ins[i] for i in saves)
