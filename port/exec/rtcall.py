"""How a C-backend call runs: its port-rt kernel id, pointer arguments, integer and float parameters.

``encode(call, shape)`` is pure (slot shapes in, flat arguments out) and is the one description of a C call:

* the Python executor and the profiler bind it (``bind``) and run it through the C library's
  ``port_rt_exec`` (kernels/runtime/rt_exec.c), one ctypes call per kernel call;
* ``port compile`` writes it into a bundle (port.exec.bundle) that port-rt runs without Python.

Pointer arguments are ``(tensor id, byte offset inside its slot)`` pairs (``None``: NULL, ``WS``: the
call's workspace), in the kernel's argument order. Layouts: kernels/include/port_rt.h.
"""
from __future__ import annotations

import ctypes
from typing import Any, Callable, Optional

from port import ops
from port.errors import ProgramError
from port.ops.base import WS, Encoded  # noqa: F401  (the encoded call; WS: the call's workspace pointer)
from port.exec.capi import RT_MAX_FLOATS as MAX_FLOATS, RT_MAX_INTS as MAX_INTS, RT_MAX_PTRS as MAX_PTRS

LATE_UPDATE = 1


from port.exec.capi import RtCall, RtState  # noqa: E402  (layouts: kernels/include/port_rt.h)

_IDS: dict[str, int] = {}


def kernel_ids() -> dict[str, int]:
    """{entry point name: port-rt kernel id}, read from the C library (PORT_RT_KERNELS in port_rt.h)."""
    if not _IDS:
        from port.exec.capi import raw
        for i in range(1, 256):
            name = raw.port_rt_kernel_name(i)
            if name:
                _IDS[name.decode()] = i
    return _IDS


def encode(call: Any, shape: Callable[[int], tuple[int, ...]]) -> Encoded:
    """The flat C call of ``call`` (a port.lower.program.Call, backend ``c``); ``shape(tid)`` gives slot shapes.
    The kernel's op record (port.ops) holds the encoding."""
    kind, a, variant = call.kernel, dict(call.attrs), call.variant
    ins, outs = list(call.inputs), list(call.outputs)
    r = ops.owner(kind)
    if r is None or r.encode is None or not ops.has_c(kind, a):
        raise ProgramError(f"call {call.index} ({call.name}, {kind}): the c backend has no kernel for {kind!r} "
                           f"(variant {variant})")
    return r.encode(kind, a, [shape(t) for t in ins], [shape(t) for t in outs], [(t, 0) for t in ins],
                    [(t, 0) for t in outs], variant, call)


def state_from(st: Any, out: Optional[RtState] = None) -> RtState:
    """The C run state of a port.exec.executor.RunState (its optimizer's settings and counters)."""
    s = out if out is not None else RtState()
    o = st.opt
    if o is not None:
        name = type(o).__name__
        s.optimizer = 3 if name == "AdamW" else (2 if getattr(o, "momentum", 0.0) else 1)
        s.nesterov = 1 if getattr(o, "nesterov", False) else 0
        s.lr = float(o.lr)
        s.momentum = float(getattr(o, "momentum", 0.0) or 0.0)
        s.dampening = float(getattr(o, "dampening", 0.0) or 0.0)
        s.weight_decay = float(getattr(o, "weight_decay", 0.0) or 0.0)
        b = getattr(o, "betas", (0.0, 0.0))
        s.beta1, s.beta2 = float(b[0]), float(b[1])
        s.eps = float(getattr(o, "eps", 0.0) or 0.0)
    s.step = int(st.step)
    s.seed = int(st.seed) & 0xFFFFFFFFFFFFFFFF
    s.dropout_counter = int(st.dropout_counter)
    return s


def to_struct(enc: Encoded, call: Any, offset: Callable[[int], int], flags: int = 0) -> RtCall:
    """The bundle record of an encoded call: pointer pairs become arena byte offsets (``offset(tid)``)."""
    ids = kernel_ids()
    if enc.entry not in ids:
        raise ProgramError(f"call {call.index} ({call.name}): {enc.entry} is not a port-rt kernel")
    if len(enc.ptrs) > MAX_PTRS or len(enc.iv) > MAX_INTS or len(enc.fv) > MAX_FLOATS:
        raise ProgramError(f"call {call.index} ({call.name}): too many arguments for a port-rt call")
    r = RtCall()
    r.kernel, r.op, r.flags = ids[enc.entry], int(call.op), flags
    for i in range(MAX_PTRS):
        p = enc.ptrs[i] if i < len(enc.ptrs) else None
        r.ptr[i] = -1 if p is None else (int(call.workspace_offset) if p == WS else offset(p[0]) + p[1])
    for i, v in enumerate(enc.iv):
        r.iv[i] = int(v)
    for i, v in enumerate(enc.fv):
        r.fv[i] = float(v)
    r.ws_offset, r.ws_bytes = int(call.workspace_offset), int(call.workspace_bytes)
    return r


def record(call: Any, slot: Callable[[int], Any], flags: int = 0) -> RtCall:
    """The whole port-rt record of a C-backend call: ``to_struct`` of its encoding with its slots' offsets
    (``slot(tid)`` gives a port.lower.program.Slot), and the outputs it zeroes first (attribute zero_outputs)."""
    r = to_struct(encode(call, lambda t: slot(t).shape), call, lambda t: slot(t).offset, flags)
    zero_ranges(r, call, slot)
    return r


def zero_ranges(r: RtCall, call: Any, slot: Callable[[int], Any]) -> None:
    """Set the record's zero ranges: the outputs the call zeroes before its kernel runs (at most 2)."""
    z = call.attr("zero_outputs") or ()
    if len(z) > 2:
        raise ProgramError(f"call {call.index} ({call.name}): {len(z)} outputs to zero first; port-rt takes 2")
    for i, t in enumerate(z):
        s = slot(t)
        r.zero_offset[i], r.zero_bytes[i] = s.offset, s.nbytes


def check_record(r: RtCall, call: Any, arena_bytes: int, persistent_bytes: int) -> None:
    """The call rule (kernels/runtime/rt_check.c, port_rt_call_check: the one the bundle loader applies) on one
    record; ProgramError naming the call, its kernel, the field and the rule."""
    from port.exec.capi import RtCallProblem, raw
    why = RtCallProblem()
    if raw.port_rt_call_check(ctypes.byref(r), int(arena_bytes), int(persistent_bytes), ctypes.byref(why)):
        raise ProgramError(f"call {call.index} ({call.name}, {call.kernel}, C kernel "
                           f"{(raw.port_rt_kernel_name(r.kernel) or b'?').decode()}): {why.text()}: the bytes or "
                           f"parameters the kernel would use are outside the arena or its rule "
                           f"(kernels/runtime/rt_check.c)")


def call_shape(r: RtCall) -> Any:
    """port_rt_call_shape of a record (operand bytes, element sizes, written operands, workspace)."""
    from port.exec.capi import RtCallProblem, RtCallShape, raw
    s, why = RtCallShape(), RtCallProblem()
    if raw.port_rt_call_shape_of(ctypes.byref(r), ctypes.byref(s), ctypes.byref(why)):
        raise ProgramError(f"kernel id {r.kernel}: {why.text()}")
    return s

