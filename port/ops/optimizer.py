"""update: one optimizer step of one parameter (SGD, SGD with momentum, AdamW), read-modify-write on the
parameter and its state tensors, with the run state's settings (learning rate, betas, step).
"""
from __future__ import annotations

import math

from port.ir.types import numel
from port.ops import register
from port.ops.base import F32, CallShapeError, Encoded, OpRecord

OPT_STATES = {"sgd": 0, "sgd_momentum": 1, "adamw": 2}       # optimizer-state tensors per parameter


def _shapes(k, attrs, I, O, at):
    opt = attrs.get("optimizer")
    if opt not in OPT_STATES:
        raise CallShapeError(f"attribute optimizer={opt!r}: expected one of {sorted(OPT_STATES)}")
    p = (at(I, 0, "input 0 (parameter)"), F32)
    n = OPT_STATES[opt]
    return [p] * (2 + n), [p] * (1 + n)


def _pairs(k, attrs):
    n = OPT_STATES.get(attrs.get("optimizer"), 0)
    return ((0, 0),) + tuple((1 + i, 2 + i) for i in range(n))


def _encode(kind, a, IS, OS, I, O, variant, call):
    from port.errors import ProgramError
    opt = a.get("optimizer")
    cnt = numel(IS[0])
    if opt in ("sgd", "sgd_momentum"):
        return Encoded("port_sgd_step", (I[0], I[2] if opt == "sgd_momentum" else None, I[1]), (cnt,), (), True)
    if opt == "adamw":
        p, g, m1, m2 = I
        return Encoded("port_adamw_step", (p, m1, m2, g), (cnt,), (), True)
    raise ProgramError(f"call {call.index} ({call.name}, update): unknown optimizer {opt!r}")


def _torch(kind, a, I, O, env):
    from port.errors import ProgramError
    st = env.state
    opt = a.get("optimizer")
    if opt in ("sgd", "sgd_momentum"):
        p, g = I[0], I[1]
        buf = I[2] if opt == "sgd_momentum" else None

        def run():
            o = st.opt
            d = g
            if o.weight_decay:
                d = d.add(p, alpha=o.weight_decay)
            if buf is not None and o.momentum:
                if st.step == 0:
                    buf.copy_(d)
                else:
                    buf.mul_(o.momentum).add_(d, alpha=1.0 - o.dampening)
                d = d.add(buf, alpha=o.momentum) if o.nesterov else buf
            p.add_(d, alpha=-o.lr)
        return run
    if opt == "adamw":
        p, g, m1, m2 = I

        def run():
            o = st.opt
            step = st.step + 1
            b1, b2 = o.betas
            p.mul_(1.0 - o.lr * o.weight_decay)
            m1.lerp_(g, 1.0 - b1)
            m2.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            bc1 = 1.0 - b1 ** step
            bc2 = 1.0 - b2 ** step
            denom = (m2.sqrt() / math.sqrt(bc2)).add_(o.eps)
            p.addcdiv_(m1, denom, value=-(o.lr / bc1))
        return run
    raise ProgramError(f"unknown optimizer {opt!r}")


register(OpRecord(kind="update", family="optimizer", kernels={"update": ("port_sgd_step", "port_adamw_step")},
                  shapes=_shapes, torch=_torch, encode=_encode, inplace_pairs=_pairs, tags=frozenset({"run_state"}),
                  doc=__doc__))
