"""The whole-step C engine of the Python Trainer: the trainer's programs compiled into a bundle in memory and run
by port-rt's ``port_rt_forward_backward`` / ``port_rt_update`` on the trainer's own arena, one C call per half
step instead of one ctypes call per kernel (``Trainer(engine="rt")``, the default for all-C plans on the CPU).
The calls are the ones the per-op executor runs (port.exec.rtcall), so the two engines give the same bits."""
from __future__ import annotations

import ctypes
from typing import Any

from port.errors import LabelError, ProgramError
from port.exec import capi, rtcall

RT_INPUT_DTYPES = ("float32", "int64")     # the dtypes of model inputs a port-rt bundle takes


def eligible(trainer: Any) -> str:
    """'' when the whole-step engine can run ``trainer``'s training program, else why not."""
    if trainer.arena.device.type != "cpu":
        return "the arena is not in CPU memory"
    if trainer.micro_batch != trainer.batch_size:
        return "micro-batching"
    odd = [trainer.program.slot(t).dtype for t in trainer.program.extra_input_ids
           if trainer.program.slot(t).dtype not in RT_INPUT_DTYPES]
    if odd:
        return f"an input of dtype {odd[0]} (port-rt takes float32 and int64 inputs)"
    other = sorted({c.backend for c in trainer.program.calls} - {"c", "host"})
    if other:
        return f"the plan runs ops on {', '.join(other)}"
    if any(c.backend == "host" for c in trainer.program.calls):
        return ("the plan pages tensors (the Python executor's spill file keeps the I/O counters and page-cache "
                "control; port-rt pages by itself)")
    return ""


class RtEngine:
    def __init__(self, trainer: Any):
        from port.exec.bundle import build_bundle
        why = eligible(trainer)
        if why:
            raise ProgramError(f"engine='rt' cannot run this trainer: {why}")
        raw = capi.raw
        if ctypes.sizeof(capi.Rt) != raw.port_rt_struct_bytes():
            raise ProgramError("port_rt struct of the binding and the library differ: rebuild the C library")
        data, _info = build_bundle(trainer, image=False)   # the arena already holds the state
        n8 = (len(data) + 7) // 8
        # the call table is read in place: 8-byte aligned (malloc'ed bytearrays are; else one aligned copy)
        b = (ctypes.c_uint64 * n8).from_buffer(data) if len(data) % 8 == 0 else None
        if b is None or ctypes.addressof(b) % 8:
            b = (ctypes.c_uint64 * n8)()
            ctypes.memmove(b, bytes(data), len(data))
        self._bundle = b
        self.rt = capi.Rt()
        arena = trainer.arena
        st = raw.port_rt_load(ctypes.byref(self.rt), ctypes.cast(self._bundle, ctypes.c_void_p), len(data),
                              arena.data_ptr(), arena.numel())
        if st:
            raise ProgramError(f"port_rt_load failed with status {st} on the trainer's own bundle")
        spill = trainer.executor.spill
        self.rt.spill_fd = spill.fd if spill is not None else -1
        self.trainer = trainer
        self._loss = ctypes.c_float()
        self._fb, self._up = raw.port_rt_forward_backward, raw.port_rt_update
        self._rtp = ctypes.byref(self.rt)
        self._lossp = ctypes.byref(self._loss)

    def forward_backward(self, x: Any, y: Any, extra: list = ()) -> float:
        """x [B, ...] (float32, or int64 token ids) and y int64 [B] (or [B, T]), contiguous CPU tensors of the
        program's dtypes; ``extra``: the model's further inputs (program order, their slots' dtypes). Returns the
        loss."""
        rtcall.state_from(self.trainer.state, self.rt.state)
        if self.rt.n_extra_inputs:      # port_rt_step takes every input's batch in one buffer, in order
            import torch
            x = torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in (x, *extra)])
        st = self._fb(self._rtp, x.data_ptr(), y.data_ptr(), self._lossp)
        if st:
            self._fail(st)
        return float(self._loss.value)

    def update(self) -> None:
        rtcall.state_from(self.trainer.state, self.rt.state)
        st = self._up(self._rtp)
        if st:
            self._fail(st)

    def _fail(self, st: int) -> None:
        rt = self.rt
        if st == 22:   # PORT_RT_ERR_LABEL
            raise LabelError(f"label {rt.bad_label} at index {rt.bad_label_index} of the batch is not a class "
                             f"index: expected 0 <= label < num_classes = {rt.classes}")
        c = self.trainer.program.calls[rt.failed_call] if 0 <= rt.failed_call < len(self.trainer.program.calls) \
            else None
        where = f"call {c.index} ({c.name}, {c.kernel})" if c is not None else "port-rt step"
        capi.check(st, where)
        raise ProgramError(f"{where}: port-rt status {st}")


class _ProgramHost:
    """What RtEngine reads of a Trainer, taken from a bare executor of a training program (port profile's
    program-order re-timing runs one, without a model): the training program stands for the inference one too
    (the whole-step engine's training half step never runs it)."""

    def __init__(self, ex: Any, graph: Any, plan: Any):
        self.program = self.eval_program = ex.program
        self.batch_size = self.micro_batch = ex.program.batch_size
        self.executor, self.arena, self.state = ex, ex.arena, ex.state
        self.graph, self.plan, self.opt = graph, plan, ex.state.opt

    def _named_slots(self, roles: Any) -> list:     # as Trainer._named_slots (a profile pages no state)
        return self.executor.own_slots(len(self.graph.tensors), roles)

    def _view(self, slot: Any) -> Any:
        return self.executor.view(slot.tensor)


def for_executor(ex: Any, graph: Any, plan: Any) -> RtEngine:
    """The whole-step engine on executor ``ex``'s arena (its training program, ``plan`` of ``graph``), as a
    Trainer of that plan builds it; ProgramError when it cannot run it (eligible's rules)."""
    return RtEngine(_ProgramHost(ex, graph, plan))
