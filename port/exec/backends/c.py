"""The ``c`` backend (reached through port.exec.registry): PORT's C kernels through ``port_rt_exec``.

Every call is encoded once at bind time (port.exec.rtcall.encode: the port-rt kernel id, resolved pointers,
parameters); a bound call is a closure doing one ctypes call and a status check. port-rt runs the same
encoded calls from a bundle, so a C call means the same thing in both.
"""
from __future__ import annotations

import ctypes
from typing import Callable

from port.exec import capi


class CBackend:
    """Kernel threads follow port.exec.capi.set_num_threads (one OpenMP pool shared with torch).

    Every call is encoded once (port.exec.rtcall.encode: kernel id, pointer arguments, parameters) and runs
    through the C library's ``port_rt_exec``, the same dispatcher port-rt uses."""
    name = "c"

    def bind(self, call, ctx) -> Callable[[], None]:
        from port.exec import rtcall
        raw, check = capi.raw, capi.check
        enc = rtcall.encode(call, ctx.shape)
        rc = rtcall.to_struct(enc, call, lambda t: 0)     # pointers are passed resolved, below
        ws = ctx.ws_ptr(call)
        ptrs = (ctypes.c_void_p * rtcall.MAX_PTRS)(*[
            None if p is None else (ws if p == rtcall.WS else ctx.ptr(p[0]) + p[1]) for p in enc.ptrs])
        st = ctx.state
        state = rtcall.RtState()
        if enc.state:
            rtcall.state_from(st, state)
        where = f"call {call.index} ({call.name}, {call.kernel})"
        fn, rcp, sp = raw.port_rt_exec, ctypes.byref(rc), ctypes.byref(state)
        keep = (rc, ptrs, state)    # noqa: F841  (alive with the closure)
        if enc.entry.startswith("port_softmax_xent"):
            return self._loss(call, ctx, fn, rcp, ptrs, sp, where, enc)
        if enc.state:
            sync = rtcall.state_from

            def run():
                sync(st, state)
                s = fn(rcp, ptrs, ws, sp)
                if s:
                    check(s, where)
        else:
            def run():
                s = fn(rcp, ptrs, ws, sp)
                if s:
                    check(s, where)
        run.entry = enc.entry
        run.keep = keep
        return run

    def _loss(self, call, ctx, fn, rcp, ptrs, sp, where, enc):
        """Cross-entropy: a label outside [0, classes) is named (value, index, num_classes)."""
        kk = enc.iv[1]
        lab_tid = call.inputs[1]
        ws = ctx.ws_ptr(call)

        def run():
            st = fn(rcp, ptrs, ws, sp)
            if st:
                from port.errors import LabelError
                y = ctx.view(lab_tid).reshape(-1)
                bad = ((y < 0) | (y >= kk)).nonzero()
                if st == capi.PORT_ERR_ARG and len(bad):
                    i = int(bad[0])
                    raise LabelError(f"{where}: label {int(y[i])} at index {i} of the batch is not a class "
                                     f"index: expected 0 <= label < num_classes = {kk}")
                capi.check(st, where)
        run.entry = enc.entry
        run.keep = (rcp, ptrs, sp)
        return run
