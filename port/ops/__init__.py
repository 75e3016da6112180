"""The op records: one definition per op kind (port.ops.base.OpRecord), grouped by family.

    conv.py        conv2d (and the fused conv + batch norm + relu kernel)
    linear.py      linear
    norm.py        batch_norm2d, layer_norm (over any trailing dims), rms_norm, group_norm
    activation.py  relu, relu6, hardswish, gelu, tanh, softmax, sigmoid, hardsigmoid, silu
    elementwise.py add, add_bcast, scale, grad_accumulate; mul, add_nd, sub, div with full broadcasting; neg,
                   rsqrt, exp, cos, sin, pow_scalar, abs, shift
    shape.py       reshape (views), permute, arange, ne_scalar, cat, masked_fill, narrow (and its views), expand
    roll_pad.py    roll, constant pad along one dim (range copies); strided_slice (a capture rule: views + narrow)
    pooling.py     max_pool2d, avg_pool2d, global_avg_pool2d, mean_mid, adaptive_avg_pool2d, upsample;
                   reduce_mean, reduce_sum (torch engines only)
    attention.py   matmul, attention (masks of any broadcastable shape, grouped-query, dropout); einsum (a capture
                   rule: permute, reshape and matmul ops)
    mask.py        input-dependent masks: casts, logic, compares, where, index rows, argmax rows
    embedding.py   embedding
    random.py      dropout, bernoulli (stochastic depth), all from PORT's one generator (Philox4x32-10)
    loss.py        cross_entropy
    optimizer.py   update
    fallback.py    torch_op: any other aten op, on PyTorch's kernel and derivative

The tracer (port.ir.trace), the registry and the program checker (port.exec.registry), the C-call encoder
(port.exec.rtcall), the torch backend and the planner's rules (port.plan.variants) read these records; none
keeps its own table of kinds. Adding an op kind means: its record in a family file, its C kernel (or none: it
then runs on the torch engines), its tests.
"""
from __future__ import annotations

from port.ops.base import CallShapeError, Encoded, Fwd, OpRecord  # noqa: F401

RECORDS: dict[str, OpRecord] = {}          # kind -> record
_BY_KERNEL: dict[str, OpRecord] = {}       # kernel name -> the record that owns it


def register(*recs: OpRecord) -> None:
    for r in recs:
        if r.kind in RECORDS:
            raise ValueError(f"op kind {r.kind!r} has two records")
        for k in r.kernels:
            if k in _BY_KERNEL:
                raise ValueError(f"kernel {k!r} is claimed by {_BY_KERNEL[k].kind!r} and {r.kind!r}")
        RECORDS[r.kind] = r
        for k in r.kernels:
            _BY_KERNEL[k] = r


def record(kind: str) -> OpRecord:
    """The record of a forward op kind, or of the kind a backward kind (``relu.grad_input``) derives from."""
    r = RECORDS.get(kind) or _BY_KERNEL.get(kind)
    if r is None:
        raise KeyError(f"no op record for {kind!r}")
    return r


def owner(kernel: str) -> OpRecord | None:
    """The record that owns a kernel name (None: unknown)."""
    return _BY_KERNEL.get(kernel)


def kernels() -> tuple[str, ...]:
    return tuple(_BY_KERNEL)


def c_entries(kernel: str) -> tuple[str, ...]:
    """The C entry points that run ``kernel`` (empty: the torch engines only)."""
    r = _BY_KERNEL.get(kernel)
    return r.c_entries(kernel) if r is not None else ()


def has_c(kernel: str, attrs: dict | None = None) -> bool:
    """A C kernel runs ``kernel`` (with these attributes, where the record's C kernels take only some)."""
    r = _BY_KERNEL.get(kernel)
    if r is None:
        return False
    if kernel in r.views:
        return True
    return bool(r.c_entries(kernel)) and (attrs is None or r.c_supports is None or r.c_supports(attrs))


def with_tag(tag: str) -> tuple[str, ...]:
    """The kinds whose records carry ``tag`` (port.ops.base.TAGS)."""
    return tuple(k for k, r in RECORDS.items() if tag in r.tags)


def op_kinds(kind: str) -> tuple[str, ...]:
    """A forward kind and the graph op kinds derived from it (its kernels that are ``kind`` or ``kind.*``)."""
    return tuple(k for k in record(kind).kernels if k == kind or k.startswith(kind + "."))


def capture_rules() -> dict[str, list]:
    """aten overload packet -> the capture rules that read it, in registration order, records tagged ``pattern``
    first (the first that does not decline wins; a node no rule takes becomes a torch_op)."""
    out: dict[str, list] = {}
    recs = sorted(RECORDS.values(), key=lambda r: "pattern" not in r.tags)   # multi-node patterns first (stable)
    for r in recs:
        if r.capture is None:
            continue
        for a in r.aten:
            if r.capture not in out.setdefault(a, []):
                out[a].append(r.capture)
    return out


from port.ops import (activation, attention, conv, elementwise, embedding, fallback, linear, loss,  # noqa: E402,F401
                      mask, norm, optimizer, pooling, random, roll_pad, shape)
