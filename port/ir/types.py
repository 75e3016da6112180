"""The training graph: frozen dataclasses of tensors, ops and the graph (the output of ``port.ir.trace``).

trace -> Graph -> (profile) -> Problem -> solve -> Plan -> verify -> lower -> execute

Everything here is immutable, hashable where practical, and uses tuples inside. Units are in the field
names (``*_bytes``, ``*_ms``, ``flops``). Shapes are in comments as ``[N, C, H, W]``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable

DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "int64": 8, "int32": 4, "uint8": 1, "bool": 1}

# Tensor roles.
ROLE_INPUT = "input"
ROLE_LABEL = "label"
ROLE_ACTIVATION = "activation"
ROLE_PARAMETER = "parameter"
ROLE_BUFFER = "buffer"          # non-trainable state of the model (running mean/var of batch norm)
ROLE_GRADIENT = "gradient"
ROLE_OPTIMIZER_STATE = "optimizer_state"
ROLES = (ROLE_INPUT, ROLE_LABEL, ROLE_ACTIVATION, ROLE_PARAMETER, ROLE_BUFFER, ROLE_GRADIENT,
         ROLE_OPTIMIZER_STATE)

# Op phases, in execution order.
PHASE_FORWARD = "forward"
PHASE_LOSS = "loss"
PHASE_BACKWARD = "backward"
PHASE_UPDATE = "update"
PHASES = (PHASE_FORWARD, PHASE_LOSS, PHASE_BACKWARD, PHASE_UPDATE)


def numel(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the training graph.

    ``alias_of`` names the tensor whose storage this one shares (views: flatten, reshape, and the
    pass-through gradients of add; ``narrow_view``: a contiguous range of its base, ``alias_offset`` bytes in).
    Aliases own no bytes of their own; memory accounting follows ``storage_root``.
    """

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str
    alias_of: int | None = None   # id of the tensor whose storage this one views
    grad_of: int | None = None    # for role == gradient: the tensor this is the gradient of
    state_of: int | None = None   # for role == optimizer_state: the parameter it belongs to
    alias_offset: int = 0         # a view's first byte inside ``alias_of``'s bytes (a contiguous range of them)

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def bytes(self) -> int:
        """Bytes of this tensor's data (also for aliases; see Graph.storage_bytes)."""
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Op:
    """One op of the training graph, in execution order.

    kind: a forward kind has an op record (port.ops: ``conv2d``, ``batch_norm2d``, ``relu``, ``linear``,
    ``attention``, ... and ``torch_op``, an aten op no record takes, run by PyTorch: attribute ``call`` holds the
    aten call as JSON, port.ir.capture);
    the loss is ``cross_entropy``; backward kinds are ``<forward kind>.grad_input`` and
    ``<forward kind>.grad_weight`` plus ``grad_accumulate``; updates are ``update``.

    flops follows torch.utils.flop_counter.FlopCounterMode's convention: 2 per multiply-add of
    convolutions and matrix products; ``vector_flops`` counts the elementwise arithmetic that
    FlopCounterMode ignores (normalisation, activations, pooling, updates).
    """

    id: int
    name: str                          # unique, e.g. "layer1.0.conv1", "layer1.0.conv1.grad_input"
    layer: str                         # module path (nn_module_stack), e.g. "layer1.0.conv1"
    kind: str
    phase: str
    attrs: tuple[tuple[str, Any], ...]  # sorted (key, value) pairs; values are ints/floats/bools/str/tuples
    inputs: tuple[int, ...]             # tensor ids read
    outputs: tuple[int, ...]            # tensor ids written
    saved: tuple[int, ...] = ()         # forward ops: tensor ids their backward reads (PyTorch's choice)
    flops: int = 0
    vector_flops: int = 0
    bytes_moved: int = 0                # bytes read + written
    forward_op: int | None = None       # backward ops: id of the forward op they differentiate

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)


@dataclass(frozen=True)
class Graph:
    """An immutable training graph: tensors and ops in one topological execution order."""

    name: str
    tensors: tuple[TensorSpec, ...]   # indexed by id: tensors[i].id == i
    ops: tuple[Op, ...]               # indexed by id, in execution order
    input_id: int
    label_id: int
    loss_id: int
    logits_id: int
    optimizer: str                    # "sgd", "sgd_momentum", "adamw": decides optimizer-state tensors
    batch_size: int
    extra_inputs: tuple[tuple[str, int], ...] = ()   # further model inputs (keyword name, tensor id), e.g.
                                      # an attention mask beside the token ids; ``input_id`` is the first
    constants: tuple[tuple[str, str], ...] = ()      # folded constants (buffer name, recipe JSON): buffers the
                                      # capture computed from the model's buffers (port.ir.fold), not model state
    _index: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def input_ids(self) -> tuple[int, ...]:
        """Every model input's tensor id, the main one first."""
        return (self.input_id,) + tuple(t for _, t in self.extra_inputs)

    # -- lookup -------------------------------------------------------------------------------
    def tensor(self, tid: int) -> TensorSpec:
        return self.tensors[tid]

    def op(self, key: int | str) -> Op:
        if isinstance(key, int):
            return self.ops[key]
        idx = self._index.get("op_by_name")
        if idx is None:
            idx = {o.name: o.id for o in self.ops}
            self._index["op_by_name"] = idx
        try:
            return self.ops[idx[key]]
        except KeyError:
            raise KeyError(f"graph {self.name!r} has no op named {key!r}") from None

    def ops_in(self, phase: str) -> tuple[Op, ...]:
        return tuple(o for o in self.ops if o.phase == phase)

    def storage_root(self, tid: int) -> int:
        return self.memo("roots", self._roots)[tid]

    def _roots(self) -> list[int]:
        roots: list[int] = []
        for t in self.tensors:      # topological: a view's base comes before it
            a = t.alias_of
            roots.append(t.id if a is None else (roots[a] if a < t.id else self._root_of(a)))
        return roots

    def _root_of(self, tid: int) -> int:
        t = self.tensors[tid]
        while t.alias_of is not None:
            t = self.tensors[t.alias_of]
        return t.id

    def view_offset(self, tid: int) -> int:
        """The byte offset of tensor ``tid`` inside its storage root's bytes (0 but for ranges of a view chain:
        ``TensorSpec.alias_offset`` summed along ``alias_of``)."""
        def chain(t) -> int:
            off = 0
            while t.alias_of is not None:
                off, t = off + t.alias_offset, self.tensors[t.alias_of]
            return off
        return self.memo("view_offsets", lambda: [chain(t) for t in self.tensors])[tid]

    def memo(self, key, fn):
        """``fn()``, computed once per graph: facts derived from an immutable graph (the planner asks for
        the same ones thousands of times while solving)."""
        try:
            return self._index[key]
        except KeyError:
            out = self._index[key] = fn()
            return out

    def owns(self, op: Op) -> bool:
        """Whether ``op`` is this graph's op of its id (facts about it may be memoized by id)."""
        return 0 <= op.id < len(self.ops) and self.ops[op.id] is op

    def writers(self, tid: int) -> int:
        """How many ops write tensor ``tid``'s storage root (through any view); counted once per graph."""
        w = self._index.get("writers")
        if w is None:
            w = {}
            for o in self.ops:
                for t in set(self.storage_root(t) for t in o.outputs):
                    w[t] = w.get(t, 0) + 1
            self._index["writers"] = w
        return w.get(self.storage_root(tid), 0)

    def storage_bytes(self, tid: int) -> int:
        """Bytes this tensor owns: 0 for views (their root owns the storage)."""
        t = self.tensors[tid]
        return 0 if t.alias_of is not None else t.bytes

    def producers(self) -> dict[int, int]:
        """tensor id -> id of the op that writes it."""
        p = self._index.get("producers")
        if p is None:
            p = {}
            for o in self.ops:
                for t in o.outputs:
                    p.setdefault(t, o.id)
            self._index["producers"] = p
        return p

    def consumers(self) -> dict[int, tuple[int, ...]]:
        """tensor id -> ids of ops that read it, in execution order."""
        c = self._index.get("consumers")
        if c is None:
            acc: dict[int, list[int]] = {}
            for o in self.ops:
                for t in o.inputs:
                    acc.setdefault(t, []).append(o.id)
            c = {k: tuple(v) for k, v in acc.items()}
            self._index["consumers"] = c
        return c

    # -- figures ------------------------------------------------------------------------------
    def tensors_with_role(self, role: str) -> tuple[TensorSpec, ...]:
        return tuple(t for t in self.tensors if t.role == role)

    def parameters(self) -> tuple[TensorSpec, ...]:
        return self.tensors_with_role(ROLE_PARAMETER)

    def trainable_parameters(self) -> tuple[TensorSpec, ...]:
        trained = {t.grad_of for t in self.tensors if t.role == ROLE_GRADIENT}
        return tuple(t for t in self.parameters() if t.id in trained)

    def saved_activation_roots(self) -> tuple[int, ...]:
        """Unique storage roots saved for backward by forward and loss ops, excluding parameters and
        buffers (they are alive anyway). Sorted by id."""
        roots = set()
        for o in self.ops:
            if o.phase in (PHASE_FORWARD, PHASE_LOSS):
                for t in o.saved:
                    r = self.storage_root(t)
                    if self.tensors[r].role not in (ROLE_PARAMETER, ROLE_BUFFER):
                        roots.add(r)
        return tuple(sorted(roots))

    def totals(self) -> dict[str, int]:
        param_bytes = sum(t.bytes for t in self.parameters())
        grad_bytes = sum(t.bytes for t in self.tensors if t.role == ROLE_GRADIENT and t.grad_of is not None
                         and self.tensors[t.grad_of].role == ROLE_PARAMETER)
        opt_bytes = sum(t.bytes for t in self.tensors_with_role(ROLE_OPTIMIZER_STATE))
        saved = sum(self.tensors[r].bytes for r in self.saved_activation_roots())
        fwd = sum(o.flops for o in self.ops if o.phase in (PHASE_FORWARD, PHASE_LOSS))
        bwd = sum(o.flops for o in self.ops if o.phase == PHASE_BACKWARD)
        return {
            "param_bytes": param_bytes,
            "buffer_bytes": sum(t.bytes for t in self.tensors_with_role(ROLE_BUFFER)),
            "grad_bytes": grad_bytes,
            "optimizer_bytes": opt_bytes,
            "naive_peak_activation_bytes": saved,
            "forward_flops": fwd,
            "backward_flops": bwd,
            "update_vector_flops": sum(o.vector_flops for o in self.ops if o.phase == PHASE_UPDATE),
            "num_ops": len(self.ops),
            "num_forward_ops": sum(1 for o in self.ops if o.phase == PHASE_FORWARD),
        }

    # -- identity -----------------------------------------------------------------------------
    def signature(self, op: Op | int) -> str:
        """Profiling key: identical layers (kind, input/output shapes, attributes) share it."""
        o = self.ops[op] if isinstance(op, int) else op
        if self.owns(o):
            return self.memo(("signature", o.id), lambda: self._signature(o))
        return self._signature(o)

    def _signature(self, o: Op) -> str:
        shapes_in = [list(self.tensors[t].shape) for t in o.inputs]
        shapes_out = [list(self.tensors[t].shape) for t in o.outputs]
        return json.dumps([o.kind, shapes_in, shapes_out, [[k, v] for k, v in o.attrs]],
                          separators=(",", ":"), default=list)

    def to_dict(self) -> dict:
        extra = {"extra_inputs": [[k, t] for k, t in self.extra_inputs]} if self.extra_inputs else {}
        if self.constants:
            extra["constants"] = [[k, r] for k, r in self.constants]
        return extra | {
            "name": self.name,
            "optimizer": self.optimizer,
            "batch_size": self.batch_size,
            "input_id": self.input_id, "label_id": self.label_id,
            "loss_id": self.loss_id, "logits_id": self.logits_id,
            "tensors": [
                {"id": t.id, "name": t.name, "shape": list(t.shape), "dtype": t.dtype, "role": t.role,
                 "alias_of": t.alias_of, "grad_of": t.grad_of, "state_of": t.state_of}
                | ({"alias_offset": t.alias_offset} if t.alias_offset else {})
                for t in self.tensors
            ],
            "ops": [
                {"id": o.id, "name": o.name, "layer": o.layer, "kind": o.kind, "phase": o.phase,
                 "attrs": {k: (list(v) if isinstance(v, tuple) else v) for k, v in o.attrs},
                 "inputs": list(o.inputs), "outputs": list(o.outputs), "saved": list(o.saved),
                 "flops": o.flops, "vector_flops": o.vector_flops, "bytes_moved": o.bytes_moved,
                 "forward_op": o.forward_op}
                for o in self.ops
            ],
        }

    @staticmethod
    def from_dict(d: dict) -> "Graph":
        """The graph ``to_dict`` wrote (lists back to tuples); its digest is the original's."""
        def tup(v: Any) -> Any:
            return tuple(tup(x) for x in v) if isinstance(v, list) else v
        tensors = tuple(TensorSpec(t["id"], t["name"], tuple(t["shape"]), t["dtype"], t["role"], t.get("alias_of"),
                                   t.get("grad_of"), t.get("state_of"), t.get("alias_offset", 0))
                        for t in d["tensors"])
        ops = tuple(Op(o["id"], o["name"], o["layer"], o["kind"], o["phase"],
                       tuple(sorted((k, tup(v)) for k, v in o["attrs"].items())), tuple(o["inputs"]),
                       tuple(o["outputs"]), tuple(o.get("saved", ())), o.get("flops", 0), o.get("vector_flops", 0),
                       o.get("bytes_moved", 0), o.get("forward_op")) for o in d["ops"])
        return Graph(d["name"], tensors, ops, d["input_id"], d["label_id"], d["loss_id"], d["logits_id"],
                     d["optimizer"], d["batch_size"], tuple((str(k), int(t)) for k, t in d.get("extra_inputs", ())),
                     tuple((str(k), str(r)) for k, r in d.get("constants", ())))

    def digest(self) -> str:
        """sha256 of the canonical JSON form without the display name: plans and profiles refer to graphs
        by it, so the same model traced under another name is the same graph. Computed once (the graph is
        immutable; the JSON form of a transformer's graph is megabytes of transient memory)."""
        h = self._index.get("digest")
        if h is None:
            d = self.to_dict()
            d.pop("name")
            blob = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
            h = self._index["digest"] = hashlib.sha256(blob).hexdigest()
        return h
