"""Bundles (compiled training programs for port-rt) and port-rt data files.

A bundle holds everything port-rt needs to train without Python: the training and inference programs' calls
encoded for ``port_rt_exec`` (port.exec.rtcall), the arena size, the persistent region's initial bytes
(parameters, buffers, optimizer state, constants), the input/label/loss/logits slots, the run state (optimizer
settings, steps done, dropout seed and counter) and the graph and plan digests. Byte layout: the comment at the
top of kernels/include/port_rt.h; the file ends with the SHA-256 of everything before it. Written atomically.

The SHA-256 guards against accidents only (a torn copy, a flipped bit): anyone can edit a bundle and hash it
again. A bundle that travels can be signed: ``write_bundle(..., sign_key=key)`` (``port compile --sign-key FILE``)
appends a 64-byte trailer with HMAC-SHA-256 under a shared key (layout in port_rt.h), which ``port-rt --key FILE``
and ``check_bundle(path, key=...)`` verify; ``--require-signed`` / ``require_signed=True`` refuse unsigned
bundles (stripping the trailer leaves a valid unsigned bundle, so a reader that needs authenticity must refuse
them). A key file holds 32 to 4096 bytes: ``head -c 32 /dev/urandom > port.key`` makes one.

A data file (``.portdata``) holds samples for ``port-rt train --data``:

    0   8   magic b"PORTDATA"
    8   4   u32 format version (2; port-rt reads 1 too: 64-byte header, float32 x, one label per sample)
    12  4   u32 sample rank r (1..4)
    16  8   u64 samples n
    24  32  u64 sample shape[4] (unused dims 0)
    56  8   u64 classes
    64  4   u32 x dtype: 0 float32, 1 int64 (token ids)
    68  4   u32 labels per sample L (1 for a classifier, the sequence length for per-token targets)
    72  8   i64 ignore index (labels equal to it are skipped; only with flags bit 0)
    80  4   u32 flags (bit 0: the ignore index is set)
    84  44  zero
    128 ... x[n, *shape] (4- or 8-byte elements), then int64 y[n, L] (64-byte aligned), then 32-byte SHA-256 of
            everything before

Format 3 (a model with several inputs: ``input_ids`` and ``attention_mask``) has a 256-byte header: bytes 0..128
as format 2 (version 3), then

    128 4   u32 extra inputs k (1..8), after x in the model's order
    132 4   zero
    136 16k {u32 dtype (0 float32, 1 int64), u32 zero, u64 elements per sample} per extra input
    ... zero to 256
    256 ... x[n, *shape], then each extra input [n, elements] (64-byte aligned), then y (64-byte aligned), then
            the SHA-256
"""
from __future__ import annotations

import ctypes
import hashlib
import hmac
import itertools
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from port.errors import PortError
from port.exec import capi, rtcall
from port.io import atomic_writer

MAGIC = b"PORTRTB\0"
VERSION = 2             # a bundle of a model with one input; VERSION_INPUTS: several (port_rt.h, format 3)
VERSION_INPUTS = 3
HEADER_BYTES = 512
MAX_EXTRA_INPUTS = 8    # PORT_RT_MAX_EXTRA_INPUTS
DATA_MAGIC = b"PORTDATA"
DATA_VERSION = 2        # one input a sample; DATA_VERSION_INPUTS: several (a 256-byte header)
DATA_VERSION_INPUTS = 3
DATA_HEADER_BYTES = 128
DATA_HEADER_BYTES_INPUTS = 256
_ALIGN = 64


class BundleError(PortError, ValueError):
    """A bundle or data file is malformed, of another version, or does not fit the runtime."""


SIG_MAGIC = b"PORTSIG\0"
SIG_VERSION = 1
SIG_HMAC_SHA256 = 1
SIG_BYTES = 64
KEY_MIN_BYTES, KEY_MAX_BYTES = 32, 4096
_KEY_ID_MESSAGE = b"port-rt key id"
_KEY_FIX = "make one with `head -c 32 /dev/urandom > port.key` (keep it secret; port-rt --key takes the same file)"


def load_key(path: str | Path) -> bytes:
    """The signing key in a key file (its bytes as they are, 32 to 4096 of them)."""
    try:
        key = Path(path).read_bytes()
    except OSError as e:
        raise BundleError(f"{path}: cannot read the key file ({e.strerror}). Fix: {_KEY_FIX}") from None
    if not KEY_MIN_BYTES <= len(key) <= KEY_MAX_BYTES:
        raise BundleError(f"{path}: a key file holds {KEY_MIN_BYTES} to {KEY_MAX_BYTES} bytes, this one {len(key)}. "
                          f"Fix: {_KEY_FIX}")
    return key


def key_id(key: bytes) -> str:
    """The key's id as a signed bundle records it (hex of the first 8 bytes of HMAC-SHA-256(key, "port-rt key
    id")): names the key in errors without revealing it."""
    return hmac.new(key, _KEY_ID_MESSAGE, hashlib.sha256).digest()[:8].hex()


def signature_trailer(bundle: bytes | bytearray, key: bytes) -> bytes:
    """The 64-byte trailer that signs ``bundle`` (an unsigned bundle's bytes) under ``key``: magic, version,
    algorithm, key id, then HMAC-SHA-256(key, bundle + the trailer's first 32 bytes)."""
    if len(bundle) < HEADER_BYTES + 32 or bytes(bundle[:8]) != MAGIC or \
            struct.unpack_from("<Q", bundle, 16)[0] != len(bundle):
        raise BundleError("signature_trailer: not an unsigned bundle (magic or size field)")
    head = SIG_MAGIC + struct.pack("<II", SIG_VERSION, SIG_HMAC_SHA256) + bytes.fromhex(key_id(key)) + bytes(8)
    h = hmac.new(key, memoryview(bundle), hashlib.sha256)
    h.update(head)
    return head + h.digest()


def _pad(n: int) -> int:
    return (-n) % _ALIGN


def compile_check(program: Any) -> None:
    """Refuse a program port-rt cannot run, naming the ops: only C-backend calls and page calls compile."""
    bad = [f"{c.name} ({c.backend}:{c.kernel})" for c in program.calls
           if not (c.backend == "c" or (c.backend == "host" and c.kernel in ("page_out", "page_in")))]
    state = [c.name for c in program.calls if c.backend == "host" and c.attr("state")]
    if state:
        raise BundleError(f"the plan pages optimizer state ({', '.join(state[:4])}{' ...' if len(state) > 4 else ''}"
                          f"), which port-rt does not run (its spill file holds no state between steps). Fix: "
                          f"solve with a larger budget, or train with port.Trainer")
    if bad:
        raise BundleError(f"the plan runs {len(bad)} op(s) on an engine port-rt does not have: "
                          f"{', '.join(bad[:8])}{' ...' if len(bad) > 8 else ''}. Fix: solve a plan for the C kernels "
                          f"only (port solve ... --accelerators cpu-c, or a device whose only engine is cpu-c)")


def _encode_program(program: Any, layout: dict[int, tuple[int, int]]) -> Iterator[rtcall.RtCall]:
    """The program's calls as port-rt call records, one at a time (the caller copies each into the bundle)."""
    for c in program.calls:
        late = c.phase == "update" and not c.attr("early")
        flags = rtcall.LATE_UPDATE if late else 0
        if c.backend == "host":
            r = rtcall.RtCall()
            r.kernel = rtcall.kernel_ids()["port_rt_" + c.kernel]
            r.op, r.flags = int(c.op), flags
            for i in range(rtcall.MAX_PTRS):
                r.ptr[i] = -1
            tid = c.inputs[0] if c.kernel == "page_out" else c.outputs[0]
            s = program.slot(tid)
            foff, n = layout[int(c.attr("key"))]
            r.ptr[0], r.iv[0], r.iv[1] = s.offset, s.nbytes, foff
            rtcall.zero_ranges(r, c, program.slot)
        else:
            r = rtcall.record(c, program.slot, flags)
        yield r


@dataclass(frozen=True)
class BundleInfo:
    path: Path
    total_bytes: int
    arena_bytes: int
    persistent_bytes: int
    train_calls: int
    eval_calls: int
    batch_size: int
    classes: int
    graph_digest: str
    plan_digest: str
    key_id: str | None = None       # a signed bundle's key id (the trailer after total_bytes), None: unsigned


def write_bundle(trainer: Any, path: str | Path, sign_key: bytes | None = None) -> BundleInfo:
    """Compile ``trainer`` (a port.Trainer: its plan, programs and current state) into a bundle at ``path``;
    ``sign_key`` (load_key): signed with HMAC-SHA-256 (the trailer: port_rt.h), for port-rt --key to verify."""
    if sign_key is not None and not KEY_MIN_BYTES <= len(sign_key) <= KEY_MAX_BYTES:
        raise BundleError(f"sign_key: {len(sign_key)} bytes; a key is {KEY_MIN_BYTES} to {KEY_MAX_BYTES}. "
                          f"Fix: {_KEY_FIX}")
    data, info = build_bundle(trainer)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path) as f:
        f.write(data)
        if sign_key is not None:
            f.write(signature_trailer(data, sign_key))
    return BundleInfo(path, *info, key_id=key_id(sign_key) if sign_key is not None else None)


NO_IMAGE = 1       # PORT_RT_FLAG_NO_IMAGE
IGNORE_FLAG = 2    # PORT_RT_FLAG_IGNORE_INDEX
INPUT_DTYPES = {"float32": 0, "int64": 1}   # PORT_RT_INPUT_F32, PORT_RT_INPUT_I64


def io_format(trainer: Any) -> tuple[int, int, int | None]:
    """(input dtype code, int64 labels per sample, ignore index or None) of ``trainer``'s training program:
    what bundle format 2 adds to format 1 (float32 inputs, one label per sample, no ignored label)."""
    tp = trainer.program
    dt = tp.slot(tp.input_id).dtype
    if dt not in INPUT_DTYPES:
        raise BundleError(f"the program's input is {dt}; port-rt takes float32 samples or int64 token ids")
    per = tp.slot(tp.label_id).nbytes // 8 // tp.batch_size
    return INPUT_DTYPES[dt], per, trainer.executor.ignore_index


def extra_inputs(trainer: Any) -> list[tuple[int, int, int, int]]:
    """The table of format 3: (training offset, evaluation offset, bytes, dtype code) of each further input of
    ``trainer``'s model (an attention mask ...), in the model's order; empty for a model with one input."""
    tp, ep = trainer.program, trainer.eval_program
    if len(tp.extra_input_ids) > MAX_EXTRA_INPUTS:
        raise BundleError(f"the model takes {1 + len(tp.extra_input_ids)} inputs; port-rt takes at most "
                          f"{1 + MAX_EXTRA_INPUTS}")
    if tuple(ep.extra_input_ids) != tuple(tp.extra_input_ids):
        raise BundleError("the inference program's inputs differ from the training program's")
    rows = []
    for t in tp.extra_input_ids:
        s, e = tp.slot(t), ep.slot(t)
        if s.dtype not in INPUT_DTYPES or e.nbytes != s.nbytes:
            raise BundleError(f"input tensor {t} is {s.dtype}; port-rt takes float32 or int64 inputs")
        rows.append((s.offset, e.offset, s.nbytes, INPUT_DTYPES[s.dtype]))
    return rows


def build_bundle(trainer: Any, image: bool = True) -> tuple[bytearray, tuple]:
    """The bundle bytes of ``trainer`` and BundleInfo's fields after ``path``. ``image=False``: without the
    persistent region's bytes (flag PORT_RT_FLAG_NO_IMAGE), for a runtime on the trainer's own arena.
    Written into one buffer of the bundle's size, each call record copied in as it is encoded: a Trainer's
    set-up builds one (port.exec.rtengine) and its transient copies were the set-up's memory peak."""
    from port.exec.spill import spill_layout
    tp, ep = trainer.program, trainer.eval_program
    if trainer.micro_batch != trainer.batch_size:
        raise BundleError(f"micro_batch={trainer.micro_batch} (batch {trainer.batch_size}): port-rt runs whole "
                          f"batches. Fix: compile a Trainer without micro_batch")
    dtype, per_sample, ignore = io_format(trainer)
    for p in (tp, ep):
        compile_check(p)
    pages = {int(c.attr("key")): tp.slot(c.inputs[0]).nbytes for c in tp.calls
             if c.backend == "host" and c.kernel == "page_out"}
    layout, _ = spill_layout(pages)
    n_calls = len(tp.calls) + len(ep.calls)
    A = max(tp.arena_bytes, ep.arena_bytes)
    P = tp.persistent_bytes
    image = bytes(trainer.arena[:P].numpy().tobytes()) if image else b""
    zeros = b"".join(struct.pack("<qq", o, n) for o, n in tp.zero_ranges)
    extras = b"".join(struct.pack("<qqqII", *r, 0) for r in extra_inputs(trainer))
    sl = tp.slot
    batch = tp.batch_size
    classes = tp.slot(tp.logits_id).shape[-1]
    if ep.slot(ep.input_id).nbytes != sl(tp.input_id).nbytes:
        raise BundleError("the inference program's input differs from the training program's")
    state = rtcall.state_from(trainer.state)
    ckpt = _checkpoint_template(trainer)
    hdr = bytearray(HEADER_BYTES)
    sec_image = HEADER_BYTES
    sec_calls = sec_image + len(image) + _pad(len(image))
    rec = ctypes.sizeof(rtcall.RtCall)
    call_bytes = n_calls * rec
    sec_zero = sec_calls + call_bytes + _pad(call_bytes)
    sec_ckpt = sec_zero + len(zeros) + _pad(len(zeros))
    sec_inputs = sec_ckpt + len(ckpt[0]) + _pad(len(ckpt[0]))
    end = sec_inputs + len(extras) + _pad(len(extras))
    total = end + 32
    has_loss = ep.loss_id >= 0 and ep.has_slot(ep.loss_id)
    has_label = ep.label_id >= 0 and ep.has_slot(ep.label_id)
    struct.pack_into("<8sIIQQQQQIIQII", hdr, 0, MAGIC, VERSION_INPUTS if extras else VERSION, HEADER_BYTES, total, A, P, sec_image, sec_calls,
                     len(tp.calls), len(ep.calls), sec_zero, len(tp.zero_ranges), 0 if image else NO_IMAGE)
    struct.pack_into("<12q", hdr, 80, sl(tp.input_id).offset, sl(tp.input_id).nbytes, sl(tp.label_id).offset,
                     sl(tp.label_id).nbytes, sl(tp.loss_id).offset, sl(tp.logits_id).offset, batch, classes,
                     ep.slot(ep.input_id).offset, ep.slot(ep.logits_id).offset,
                     ep.slot(ep.loss_id).offset if has_loss else -1,
                     ep.slot(ep.label_id).offset if has_label else -1)
    hdr[176:264] = bytes(state)
    struct.pack_into("<QIIIIQ", hdr, 392, sec_ckpt, *ckpt[1:4], 0, ckpt[4])
    struct.pack_into("<IIq", hdr, 424, dtype, per_sample, 0 if ignore is None else int(ignore))
    if extras:
        struct.pack_into("<IIQ", hdr, 440, len(extras) // 32, 0, sec_inputs)
    if ignore is not None:
        struct.pack_into("<I", hdr, 76, struct.unpack_from("<I", hdr, 76)[0] | IGNORE_FLAG)
    gd, pd = tp.graph_digest.encode()[:64], _plan_digest(trainer).encode()[:64]
    hdr[264:264 + len(gd)] = gd
    hdr[328:328 + len(pd)] = pd
    body = bytearray(total)                  # zero-filled: the sections' padding
    body[:HEADER_BYTES] = hdr
    body[sec_image:sec_image + len(image)] = image
    del image
    view = (ctypes.c_char * total).from_buffer(body)
    at = ctypes.addressof(view) + sec_calls
    for r in itertools.chain(_encode_program(tp, layout), _encode_program(ep, layout)):
        ctypes.memmove(at, ctypes.addressof(r), rec)
        at += rec
    del view                                 # the buffer export (a bytearray with one cannot be resized)
    body[sec_zero:sec_zero + len(zeros)] = zeros
    body[sec_ckpt:sec_ckpt + len(ckpt[0])] = ckpt[0]
    body[sec_inputs:sec_inputs + len(extras)] = extras
    body[end:] = hashlib.sha256(memoryview(body)[:end]).digest()
    return body, (total, A, P, len(tp.calls), len(ep.calls), batch, classes, tp.graph_digest, pd.decode())


def _checkpoint_template(trainer: Any) -> tuple[bytes, int, int, int, int]:
    """(section bytes, tensors, fixed JSON bytes, tensors JSON bytes, data bytes): what port-rt needs to write and
    read checkpoints in the Trainer's format (port.train.checkpoint: the same header fields and tensor table)."""
    import json
    from port.train import checkpoint as CK
    tensors = CK.trainer_tensors(trainer)
    entries, data_bytes = CK.tensor_table(tensors)
    base = trainer.arena.data_ptr()
    table = b"".join(struct.pack("<qqq", t.data_ptr() - base, e["nbytes"], e["offset"])
                     for e, (_, t) in zip(entries, tensors))
    fixed = json.dumps(CK.trainer_fixed_header(trainer), sort_keys=True)[1:-1].encode()
    tj = json.dumps(entries, sort_keys=True).encode()
    return table + fixed + tj, len(entries), len(fixed), len(tj), data_bytes


def _plan_digest(trainer: Any) -> str:
    """The plan's checksum as a plan file records it (port.plan.io.plan_checksum)."""
    from port.plan.io import plan_checksum, plan_to_dict
    return plan_checksum(plan_to_dict(trainer.plan))


_ERR_UNSIGNED, _ERR_SIGNATURE = 30, 31     # PORT_RT_ERR_UNSIGNED, PORT_RT_ERR_SIGNATURE


def check_bundle(path: str | Path, key: bytes | None = None, require_signed: bool = False) -> int:
    """Check a bundle with the C loader's own checks (port_rt_bundle_split, port_rt_bundle_verify,
    port_rt_bundle_check); returns its arena bytes. ``key``: a signed bundle's tag must verify under it;
    ``require_signed``: an unsigned bundle is refused (needs ``key``), as port-rt --key FILE --require-signed."""
    if require_signed and key is None:
        raise BundleError("check_bundle(require_signed=True) needs the key the bundle was signed with (key=...)")
    data = Path(path).read_bytes()
    buf = (ctypes.c_uint8 * max(len(data), 1)).from_buffer_copy(data or b"\0")
    body, signed = ctypes.c_uint64(0), ctypes.c_int(0)
    st = capi.raw.port_rt_bundle_split(buf, len(data), ctypes.byref(body), ctypes.byref(signed))
    if not st and not signed.value and require_signed:
        raise BundleError(f"{path}: unsigned bundle refused (require_signed): its SHA-256 guards against accidents "
                          f"only, anyone can edit a bundle and hash it again. Fix: compile it with `port compile "
                          f"... --sign-key KEYFILE`")
    if not st and signed.value and key is not None:
        vst = capi.raw.port_rt_bundle_verify(buf, len(data), key, len(key))
        if vst == _ERR_SIGNATURE:
            theirs = bytes(data[body.value + 16:body.value + 24]).hex()
            why = (f"it was signed with another key (key id {theirs}; this key's id is {key_id(key)})"
                   if theirs != key_id(key) else "the bundle was changed after it was signed (the key ids match)")
            raise BundleError(f"{path}: the signature does not verify: {why}. Fix: use the key it was signed with, "
                              f"or compile it again with `port compile ... --sign-key KEYFILE`")
        st = vst
    arena = ctypes.c_uint64(0)
    if not st:
        st = capi.raw.port_rt_bundle_check(buf, body.value, ctypes.byref(arena))
    if st:
        raise BundleError(refusal(path, data, st))
    return int(arena.value)


def refusal(path: str | Path, data: bytes, status: int) -> str:
    """Why the C loader refuses a bundle (port_rt_bundle_check_why): the header rule, or the call (index, kernel),
    its field and the call rule it breaks (kernels/runtime/rt_check.c). ``data``: the file's bytes (a trailer
    after the bundle's own ``total`` bytes is left out)."""
    n = len(data)
    if n >= 24:
        n = min(n, struct.unpack_from("<Q", data, 16)[0]) or n
    buf = (ctypes.c_uint8 * max(n, 1)).from_buffer_copy(data[:n] or b"\0")
    why = capi.RtCallProblem()
    why.call = -1
    capi.raw.port_rt_bundle_check_why(buf, n, None, ctypes.byref(why))
    at = "" if why.call < 0 else (f"call {why.call} (kernel {why.kernel}, "
                                  f"{(capi.raw.port_rt_kernel_name(why.kernel) or b'?').decode()}): ")
    return (f"{path}: not a valid port-rt bundle (status {status}): {at}{why.text()}. Fix: compile it again with "
            f"`port compile`")


def _data_array(x: Any) -> tuple[Any, bool]:
    """x as the data file stores it (int64 when integer or boolean, else float32, C order), and whether int64."""
    import numpy as np
    xr = np.asarray(x)
    tokens = np.issubdtype(xr.dtype, np.integer) or xr.dtype == np.bool_
    return np.ascontiguousarray(xr.astype(np.int64 if tokens else np.float32, copy=False)), tokens


def write_data(path: str | Path, x: Any, y: Any, classes: int, ignore_index: int | None = None) -> Path:
    """Write samples as a port-rt data file: x float32 [n, ...] (or int64 token ids [n, T]), y int64 [n] (or
    [n, L] per-token targets, where ``ignore_index`` marks positions the loss skips). A model with several
    inputs: x a tuple or list of arrays [n, ...] in the model's order (``Trainer.input_tensors(batch)`` gives that
    order: e.g. ``(input_ids, attention_mask)``); integer and boolean arrays are stored as int64 (format 3)."""
    import numpy as np
    if isinstance(x, dict):
        raise BundleError("data: x is a dict; port-rt's data file keeps the inputs in the model's order. Fix: pass "
                          "a tuple in that order (trainer.input_tensors(batch) returns it)")
    parts = list(x) if isinstance(x, (tuple, list)) else [x]
    if not 1 <= len(parts) <= 1 + MAX_EXTRA_INPUTS:
        raise BundleError(f"data: {len(parts)} inputs; a data file holds 1 to {1 + MAX_EXTRA_INPUTS}")
    xa, tokens = _data_array(parts[0])
    extra = [_data_array(p) for p in parts[1:]]
    ya = np.ascontiguousarray(np.asarray(y, dtype=np.int64))
    ya = ya.reshape(ya.shape[0], -1) if ya.ndim else ya.reshape(-1, 1)
    if xa.ndim < 2 or xa.ndim > 5 or xa.shape[0] != ya.shape[0] or xa.shape[0] == 0 or ya.shape[1] == 0:
        raise BundleError(f"data: x of shape {tuple(xa.shape)} and y of shape {tuple(np.shape(y))}: expected "
                          f"x [n, d1..d4] and y [n] (or [n, L] per-token labels) with n > 0")
    for i, (e, _) in enumerate(extra):
        if e.ndim < 2 or e.shape[0] != xa.shape[0] or e.size == 0:
            raise BundleError(f"data: input {i + 2} of shape {tuple(e.shape)}: expected [{xa.shape[0]}, ...] (one "
                              f"row per sample, as the first input)")
    ok = (ya >= 0) & (ya < classes)
    if ignore_index is not None:
        ok |= ya == ignore_index
    if not ok.all():
        bad = ya[~ok]
        raise BundleError(f"data: labels must lie in [0, {classes})" +
                          (f" or equal the ignore index {ignore_index}" if ignore_index is not None else "") +
                          f", found {int(bad.min())}..{int(bad.max())}")
    shape = list(xa.shape[1:]) + [0] * (5 - xa.ndim)
    head = DATA_MAGIC + struct.pack("<IIQ4QQ", DATA_VERSION_INPUTS if extra else DATA_VERSION, xa.ndim - 1,
                                    xa.shape[0], *shape, classes)
    head += struct.pack("<IIqI", 1 if tokens else 0, ya.shape[1], 0 if ignore_index is None else int(ignore_index),
                        0 if ignore_index is None else 1)
    head += b"\0" * (DATA_HEADER_BYTES - len(head))
    if extra:
        head += struct.pack("<II", len(extra), 0) + b"".join(
            struct.pack("<IIQ", 1 if t else 0, 0, e.size // e.shape[0]) for e, t in extra)
        head += b"\0" * (DATA_HEADER_BYTES_INPUTS - len(head))
    body = bytearray(head)
    for a in [xa] + [e for e, _ in extra]:      # each input 64-byte aligned (the header's sizes are)
        body += b"\0" * _pad(len(body)) + a.tobytes()
    body += b"\0" * _pad(len(body)) + ya.tobytes()
    body = bytes(body)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path) as f:
        f.write(body)
        f.write(hashlib.sha256(body).digest())
    return path


def _c_bytes(data: bytes, per_line: int = 24) -> str:
    return ",\n".join("    " + ", ".join(f"0x{b:02x}" for b in data[i:i + per_line])
                      for i in range(0, len(data), per_line))


def emit_c(bundle: bytes, out_dir: str | Path, x: Any = None, y: Any = None) -> list[Path]:
    """Write a bundle as C source for targets without a file system: ``port_bundle.c`` (the bytes, 64-byte
    aligned, and their count), ``port_bundle.h`` (PORT_ARENA_BYTES, PORT_BATCH, PORT_BATCH_FLOATS for a static
    arena and batch buffers) and, with samples ``x`` [n, ...] / ``y`` [n], ``port_data.c`` (float32 values as
    exact hexadecimal literals, int64 labels). kernels/mcu/main_m4.c is a program built from them."""
    import numpy as np
    if bundle[:8] != MAGIC:
        raise BundleError("emit_c: not a bundle (wrong magic)")
    bundle = bundle[:struct.unpack_from("<Q", bundle, 16)[0]]   # a signature trailer stays out (no key on board)
    A = struct.unpack_from("<Q", bundle, 24)[0]
    in_bytes, batch = struct.unpack_from("<q", bundle, 88)[0], struct.unpack_from("<q", bundle, 128)[0]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    src = ("/* A port-rt bundle as C data (port compile --emit-c). Layout: kernels/include/port_rt.h. */\n"
           "#include <stdint.h>\n"
           f"const uint8_t port_bundle[{len(bundle)}] __attribute__((aligned(64))) = {{\n{_c_bytes(bundle)}\n}};\n"
           f"const uint64_t port_bundle_bytes = {len(bundle)}u;\n")
    hdr = ("/* Sizes of the compiled-in bundle (port compile --emit-c). */\n#pragma once\n"
           f"#define PORT_ARENA_BYTES {A}u\n#define PORT_BATCH {batch}\n#define PORT_BATCH_FLOATS {in_bytes // 4}\n")
    for name, text in (("port_bundle.c", src), ("port_bundle.h", hdr)):
        with atomic_writer(out / name) as f:
            f.write(text.encode())
        files.append(out / name)
    if struct.unpack_from("<I", bundle, 8)[0] == VERSION_INPUTS:
        raise BundleError("emit_c: the bundle's model takes several inputs; a bundle as C data feeds one input "
                          "tensor (kernels/mcu/main_m4.c). Fix: run it with port-rt, or compile a model with one input")
    if x is not None and (struct.unpack_from("<I", bundle, 424)[0] or struct.unpack_from("<I", bundle, 428)[0] > 1):
        raise BundleError("emit_c: samples as C data are float32 inputs with one label each (what "
                          "kernels/mcu/main_m4.c reads); this bundle takes token ids or per-token labels. Fix: emit "
                          "the bundle without samples (no --data) and feed batches through port_rt_step")
    if x is not None:
        xa = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
        ya = np.asarray(y, dtype=np.int64).reshape(-1)
        n, F = xa.shape[0], int(np.prod(xa.shape[1:]))
        vals = [float(v).hex() + "f" for v in xa.reshape(-1).astype(np.float64)]
        body = ",\n".join("    " + ", ".join(vals[i:i + 6]) for i in range(0, len(vals), 6))
        text = ("/* Samples for port-rt without a file system (port compile --emit-c). */\n#include <stdint.h>\n"
                f"const float port_data_x[{n * F}] = {{\n{body}\n}};\n"
                f"const int64_t port_data_y[{n}] = {{{', '.join(str(int(v)) for v in ya)}}};\n"
                f"const int64_t port_data_n = {n}, port_data_sample_floats = {F};\n")
        with atomic_writer(out / "port_data.c") as f:
            f.write(text.encode())
        files.append(out / "port_data.c")
    return files
