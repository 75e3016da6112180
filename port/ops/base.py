"""What an op record is, and the helpers records share (capture, shape rules, backward assembly).

An ``OpRecord`` is everything PORT knows about one op kind, in one place:

* capture: the aten ops (overload packets) it takes from ``torch.export`` and the rule that turns one such node
  into a forward op (``Fwd``), or declines (``False``: the node then becomes a ``torch_op``);
* the backward it derives (``backward``) and what the forward saves for it (``saved``), as PyTorch autograd's
  plain kernels choose it; the reads and vector FLOPs of its gradient ops;
* its kernels: every kernel name a call can carry (the forward kind, its gradient kinds, kernels lowering emits
  for variants), each with the C entry points that run it (none: the op runs on the torch engines only);
* the shape rule of every kernel (``shapes``: what each input and output of a call must be, from its attributes
  and the slot that fixes its geometry), used by the program checker;
* the torch binding (``torch``: attributes, input views, output views, environment -> a zero-argument run) and
  the C call encoding (``encode``: the port-rt kernel, pointer arguments, integer and float parameters);
* tags that the planner's rules read (``inplace``, ``checkpoint``, ``multi_grad``, ...), instead of kind tuples
  kept in each module.

Nothing here imports torch or the C library: records import them inside the functions that run kernels.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from port.ir.types import PHASE_BACKWARD, ROLE_GRADIENT, numel

F32, I64, U8 = "float32", "int64", "uint8"

# tags a record may carry (what the planner and lowering read from them)
TAGS = {
    "inplace": "the forward has an ``inplace`` variant (its output may take its first input's bytes)",
    "rerun_inplace": "a re-run of the forward may overwrite its first input (Plan.inplace_reruns)",
    "backward_inplace": "its .grad_input may write dx over dy (``inplace``)",
    "checkpoint": "cheap to re-run: recompute_plan drops its output by default",
    "no_grad": "integer results: no gradient flows back",
    "not_recomputable": "never re-run (views cost nothing; a random mask must not be redrawn)",
    "conv_variants": "im2col/direct/winograd/patch/fused variants on the C backend",
    "tiled_variant": "a ``tiled`` variant on the C backend",
    "pattern": "its capture rule recognises a multi-node pattern: tried before the one-node rules of its packets",
    "run_state": "its forward's C call reads the run state (Encoded.state: optimizer settings and step, dropout "
                 "counter): the per-op executor syncs it before each such call, the whole-step engine once",
}


class CallShapeError(ValueError):
    """A call's attributes or tensors do not fit its kernel (the message says which and what was expected)."""


@dataclass
class Fwd:
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


@dataclass(frozen=True)
class Encoded:
    """One C call (port-rt's layout, kernels/include/port_rt.h): the entry point, its pointer arguments as
    ``(tensor id, byte offset)`` pairs (None: NULL, ``WS``: the call's workspace), integer and float
    parameters, and whether it reads the run state (optimizer settings, dropout counter)."""
    entry: str
    ptrs: tuple
    iv: tuple[int, ...] = ()
    fv: tuple[float, ...] = ()
    state: bool = False


WS = "ws"


def _none(*_a: Any, **_k: Any) -> tuple:
    return ()


def _zero(*_a: Any, **_k: Any) -> int:
    return 0


@dataclass(frozen=True, eq=False)
class OpRecord:
    kind: str
    family: str
    kernels: Mapping[str, tuple[str, ...]]            # kernel name -> C entry points (() : torch engines only)
    shapes: Callable[..., tuple[list, list]]          # (kernel, attrs, I, O, at) -> ([(shape, dtype)], [...])
    torch: Callable[..., Callable[[], None]] | None = None     # (kernel, attrs, I, O, env) -> run
    encode: Callable[..., Encoded] | None = None               # (kernel, attrs, IS, OS, I, O, variant, call)
    aten: tuple[str, ...] = ()                        # aten overload packets its capture rule reads
    capture: Callable[[Any], Any] | None = None       # (ctx) -> Fwd | [Fwd] | None | False
    saved: Callable[..., tuple[int, ...]] = _none     # (f, grad_input, grad_weight, wanted) -> tensor ids
    grad_input_reads: Callable[[Fwd], tuple[int, ...]] = _none
    grad_weight_reads: Callable[[Fwd], tuple[int, ...]] = _none
    bwd_vector_flops: Callable[[Fwd, Any], int] = _zero      # (f, tensors) of the gradient ops
    backward: Callable[..., None] | None = None       # (BackwardCtx, f, fwd Op, gy, xs_needing, trained): own rule
    weight_flops: bool = False                        # the weight gradient costs the forward's FLOPs (conv, linear)
    weight_vector_factor: int = 1                     # weight-gradient vector FLOPs per output element
    views: tuple[str, ...] = ()                       # kernels that are views: no call
    inplace_pairs: Callable[[str, dict], tuple] = _none      # (kernel, attrs) -> (output, input) index pairs
    workspace: Callable[..., int] | None = None       # (kernel, variant, attrs, IS, OS) -> bytes (C backend)
    c_supports: Callable[[dict], bool] | None = None  # attributes the C kernels take (None: all of them)
    calls: Callable[..., Any] | None = None           # (graph, op, variant) -> [(kernel, outs, ins, attrs, covers)]
                                                      # or None: one call of the op's kind on its own tensors
    tags: frozenset = field(default_factory=frozenset)
    doc: str = ""

    def c_entries(self, kernel: str) -> tuple[str, ...]:
        return self.kernels.get(kernel, ())


# ---------------------------------------------------------------------------------------------
# capture helpers
# ---------------------------------------------------------------------------------------------
def pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        return int(v[0]), int(v[1])
    return int(v), int(v)


def arg(node: Any, i: int, name: str, default: Any = None) -> Any:
    """Argument ``i`` (or keyword ``name``) of an exported node."""
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def float32(ctx: Any, *ts: int) -> bool:
    return all(ctx.dtype(t) == F32 for t in ts)


def fwd(ctx: Any, kind: str, attrs: dict, x: tuple, outs: tuple, flops: int = 0, vector_flops: int = 0,
        params: dict | None = None, buffers: dict | None = None) -> Fwd:
    return Fwd(ctx.opname, ctx.scope, kind, attrs, tuple(x), dict(params or {}), dict(buffers or {}), tuple(outs),
               int(flops), int(vector_flops))


# ---------------------------------------------------------------------------------------------
# shape-rule helpers
# ---------------------------------------------------------------------------------------------
def attr_pair(attrs: dict, key: str, lo: int) -> tuple[int, int]:
    v = attrs.get(key)
    if (not isinstance(v, tuple) or len(v) != 2 or not all(type(x) is int for x in v)
            or not all(x >= lo for x in v)):
        raise CallShapeError(f"attribute {key}={v!r}: expected a pair of ints >= {lo}")
    return v


def rank(shape, r: int, what: str) -> tuple[int, ...]:
    if shape is None or len(shape) != r:
        raise CallShapeError(f"{what} has shape {list(shape) if shape is not None else None}: expected {r} dims")
    return tuple(shape)


def grads(attrs: dict, shapes: dict) -> list:
    """The outputs of a weight-gradient call (attribute ``grads``: parameter names in parameter order)."""
    g = attrs.get("grads")
    order = list(shapes)      # outputs in parameter order (weight, bias): the only order lowering emits
    if not isinstance(g, tuple) or not g or any(n not in shapes for n in g) or \
            [order.index(n) for n in g] != sorted({order.index(n) for n in g}):
        raise CallShapeError(f"attribute grads={g!r}: expected distinct names among {order}, in that order")
    return [(shapes[n], F32) for n in g]


def unit_float(attrs: dict, key: str, hi_open: bool = True) -> float:
    p = attrs.get(key)
    inside = isinstance(p, float) and (0.0 <= p < 1.0 if hi_open else 0.0 <= p <= 1.0)
    if not inside:
        raise CallShapeError(f"attribute {key}={p!r}: expected a float in [0, 1{')' if hi_open else ']'}")
    return p


def same_shape(k: str, attrs: dict, I, O, at, n_in: int = 1, n_grad_in: int = 2) -> tuple[list, list]:
    """An element-wise kernel: every operand has the first input's shape (float32)."""
    x = at(I, 0, "input 0")
    n = n_grad_in if k.endswith(".grad_input") else n_in
    return [(x, F32)] * n, [(x, F32)]


# ---------------------------------------------------------------------------------------------
# backward assembly
# ---------------------------------------------------------------------------------------------
@dataclass
class BackwardCtx:
    """What a record's backward rule needs: the graph builder, gradient bookkeeping."""
    b: Any
    new_grad: Callable[[int, str], int]
    contribute: Callable[[int, int, str], None]

    @property
    def T(self):
        return self.b.tensors

    def view_grad(self, x: int, gy: int) -> int:
        """A gradient of ``x`` that is ``gy``'s bytes (a view)."""
        return self.b.tensor(f"grad({self.T[x].name})", self.T[x].shape, F32, ROLE_GRADIENT, grad_of=x, alias_of=gy)

    def op(self, name: str, layer: str, kind: str, attrs: dict, ins, outs, flops: int = 0, vector_flops: int = 0,
           forward_op: int | None = None) -> int:
        return self.b.op(name, layer, kind, PHASE_BACKWARD, attrs, ins, outs, (), flops, vector_flops,
                         forward_op=forward_op)


def public_attrs(f: Fwd) -> dict:
    return {k: v for k, v in f.attrs.items() if not k.startswith("_")}


def default_backward(rec: OpRecord, bc: BackwardCtx, f: Fwd, fo: Any, gy: int, xs_needing: list[int],
                     trained: set[int]) -> None:
    """One ``<kind>.grad_input`` op for the first input, one ``<kind>.grad_weight`` op for the trained
    parameters (accumulating)."""
    T = bc.T
    if xs_needing:
        x = f.x[0]
        g = bc.new_grad(x, "")
        bc.op(f"{f.name}.grad_input", f.layer, f"{f.kind}.grad_input", public_attrs(f),
              (gy,) + rec.grad_input_reads(f), (g,), flops=f.flops, vector_flops=rec.bwd_vector_flops(f, T),
              forward_op=fo.id)
        bc.contribute(x, g, f.layer)
    mine = [p for p in f.params.values() if p in trained]
    if mine:
        outs = [(p, bc.new_grad(p, "")) for p in mine]
        bc.op(f"{f.name}.grad_weight", f.layer, f"{f.kind}.grad_weight",
              public_attrs(f) | {"grads": tuple(n for n, p in f.params.items() if p in trained)},
              (gy,) + rec.grad_weight_reads(f), tuple(g for _, g in outs),
              flops=f.flops if rec.weight_flops else 0,
              vector_flops=numel(T[f.outputs[0]].shape) * rec.weight_vector_factor, forward_op=fo.id)
        for p, g in outs:
            bc.contribute(p, g, f.layer)
