"""Versioned binary checkpoints (never pickle), written atomically.

Layout (format 2):  b"PORTCKPT" | u32 format version | u64 header length | 32-byte sha256 | header JSON (utf-8) |
         zero padding to 64 | raw tensor data (each tensor 64-byte aligned, little-endian, C order).
The sha256 covers the header JSON bytes, the padding and the data: editing any byte of the header (``step``, a
tensor's ``offset`` or ``dtype``, the optimizer's ``lr``) or of the data is detected on read. Format 1 (whose
header was outside the checksum) is refused with a message saying how to go on.
Header:  {"format": 2, "step", "rng": {"seed", "dropout_counter"}, "bn_batches", "optimizer": {...},
          "graph_digest", "program": {arena/persistent bytes}, "meta": {...}, "data_bytes",
          "tensors": [{"name", "kind": parameter|buffer|optimizer_state, "dtype", "shape", "offset", "nbytes"}]}
Offsets are relative to the start of the data section.

Atomicity: port.io.atomic_writer writes a temporary file beside it, flushes and fsyncs it, then ``os.replace``s it over the
target and the directory fsync'ed: a crash or kill at any moment leaves either the previous checkpoint or the new
one, never a torn file. Reading verifies magic, version, sizes, the sha256 and every header field (a named
CheckpointError: file, key, value, fix).
"""
from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path
from typing import Any

from port.errors import PortError
from port.io import atomic_writer

MAGIC = b"PORTCKPT"
FORMAT_VERSION = 2
_ALIGN = 64
_PREFIX = len(MAGIC) + 4 + 8 + 32          # magic, version, header length, sha256
DTYPES = ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")
KINDS = ("parameter", "buffer", "optimizer_state")
_FIX = "the file was edited or corrupted: resume from another checkpoint or train again without --resume"


class CheckpointError(PortError, ValueError):
    """A checkpoint file is missing, truncated, corrupt, of another format version or for another model."""


def _pad(n: int) -> int:
    return (-n) % _ALIGN


def write_checkpoint(path: str | Path, header: dict, tensors: list[tuple[dict, Any]], _fail_after: int | None = None) -> None:
    """tensors: [(entry {"name", "kind"}, torch tensor)]. ``_fail_after`` (tests) raises after that many
    data bytes were written, simulating a crash mid-write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    entries, blobs = [], []
    off = 0
    for e, t in tensors:
        a = t.detach().cpu().contiguous().numpy()
        b = a.tobytes()
        entries.append(dict(e, dtype=str(a.dtype), shape=list(a.shape), offset=off, nbytes=len(b)))
        blobs.append(b)
        off += len(b) + _pad(len(b))
    hdr = dict(header, format=FORMAT_VERSION, tensors=entries, data_bytes=off)
    hdr.pop("data_sha256", None)
    hj = json.dumps(hdr, sort_keys=True).encode()
    hpad = b"\0" * _pad(_PREFIX + len(hj))
    h = hashlib.sha256(hj)
    h.update(hpad)
    for b in blobs:
        h.update(b)
        h.update(b"\0" * _pad(len(b)))
    pre = MAGIC + struct.pack("<IQ", FORMAT_VERSION, len(hj)) + h.digest() + hj + hpad
    written = 0
    with atomic_writer(path) as f:
        f.write(pre)
        for b in blobs:
            if _fail_after is not None and written + len(b) > _fail_after:
                f.write(b[: max(0, _fail_after - written)])
                f.flush()
                raise OSError("simulated failure while writing the checkpoint")
            f.write(b)
            f.write(b"\0" * _pad(len(b)))
            written += len(b)


def read_header(path: str | Path) -> dict:
    """The verified header (the whole file is checksummed, so this reads it all)."""
    return _read(path, data=False)[0]


def read_checkpoint(path: str | Path) -> tuple[dict, dict[str, Any]]:
    """-> (header, {name: torch tensor})."""
    return _read(path, data=True)


def _bad(path: Path, key: str, value: Any, want: str) -> CheckpointError:
    v = repr(value)
    if len(v) > 80:
        v = v[:77] + "..."
    return CheckpointError(f"{path}: checkpoint header key {key!r} = {v}: expected {want}; {_FIX}")


def _int(path: Path, d: dict, key: str, where: str = "", lo: int = 0, hi: int = 2**53) -> int:
    k = f"{where}{key}"
    if key not in d:
        raise CheckpointError(f"{path}: checkpoint header lacks key {k!r}; {_FIX}")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _bad(path, k, v, f"an integer in [{lo}, {hi}]")
    return v


def validate_header(path: str | Path, hdr: Any, data_len: int | None = None) -> dict:
    """Check every field a reader uses; raises CheckpointError naming the file, key, value and fix."""
    path = Path(path)
    if not isinstance(hdr, dict):
        raise _bad(path, "<top level>", hdr, "a JSON object")
    if hdr.get("format") != FORMAT_VERSION:
        raise _bad(path, "format", hdr.get("format"), str(FORMAT_VERSION))
    if "step" in hdr:              # a trainer's checkpoint has step and rng (load_into_trainer requires them)
        _int(path, hdr, "step")
    rng = hdr.get("rng", {"seed": 0, "dropout_counter": 0})
    if not isinstance(rng, dict):
        raise _bad(path, "rng", rng, "an object {seed, dropout_counter}")
    _int(path, rng, "seed", "rng.", -2**63, 2**64)
    _int(path, rng, "dropout_counter", "rng.")
    if "bn_batches" in hdr:
        _int(path, hdr, "bn_batches")
    opt = hdr.get("optimizer")
    if opt is not None:
        from port.train.optim import from_dict
        try:
            from_dict(opt)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise _bad(path, "optimizer", opt, f"optimizer settings with finite values ({e})") from None
    known = {"format", "step", "rng", "bn_batches", "optimizer", "graph_digest", "model", "batch_size",
             "micro_batch", "program", "meta", "data_bytes", "tensors"}
    unknown = sorted(set(hdr) - known)
    if unknown:
        raise _bad(path, unknown[0], hdr[unknown[0]], f"no such key (known: {', '.join(sorted(known))})")
    for k in ("batch_size", "micro_batch"):
        if k in hdr:
            _int(path, hdr, k, lo=1)
    for k in ("graph_digest", "model"):
        if k in hdr and not isinstance(hdr[k], str):
            raise _bad(path, k, hdr[k], "a string")
    if "meta" in hdr and not isinstance(hdr["meta"], dict):
        raise _bad(path, "meta", hdr["meta"], "an object")
    prog = hdr.get("program", {})
    if not isinstance(prog, dict):
        raise _bad(path, "program", prog, "an object {arena_bytes, persistent_bytes}")
    for k in prog:
        _int(path, prog, k, "program.")
    if sorted(rng) != ["dropout_counter", "seed"]:
        raise _bad(path, "rng", rng, "an object with exactly the keys seed, dropout_counter")
    total = _int(path, hdr, "data_bytes", hi=2**48)
    if data_len is not None and total != data_len:
        raise CheckpointError(f"{path}: truncated data ({data_len} of {total} bytes); {_FIX}")
    tens = hdr.get("tensors")
    if not isinstance(tens, list):
        raise _bad(path, "tensors", tens, "a list of tensor entries")
    import numpy as np
    names = set()
    for i, e in enumerate(tens):
        w = f"tensors[{i}]."
        if not isinstance(e, dict):
            raise _bad(path, f"tensors[{i}]", e, "an object {name, kind, dtype, shape, offset, nbytes}")
        name = e.get("name")
        if not isinstance(name, str) or not name or name in names:
            raise _bad(path, w + "name", name, "a unique non-empty string")
        names.add(name)
        if sorted(e) != ["dtype", "kind", "name", "nbytes", "offset", "shape"]:
            raise _bad(path, f"tensors[{i}]", sorted(e), "exactly the keys dtype, kind, name, nbytes, offset, shape")
        if e.get("kind") not in KINDS:
            raise _bad(path, w + "kind", e.get("kind"), f"one of {', '.join(KINDS)}")
        if e.get("dtype") not in DTYPES:
            raise _bad(path, w + "dtype", e.get("dtype"), f"one of {', '.join(DTYPES)}")
        shape = e.get("shape")
        if not isinstance(shape, list) or len(shape) > 8 or any(
                isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= 2**40 for s in shape):
            raise _bad(path, w + "shape", shape, "a list of at most 8 non-negative integers")
        off = _int(path, e, "offset", w, hi=total)
        nb = _int(path, e, "nbytes", w, hi=total)
        want = math.prod(shape) * np.dtype(e["dtype"]).itemsize
        if nb != want:
            raise _bad(path, w + "nbytes", nb, f"{want} (shape {shape} of {e['dtype']})")
        if off % _ALIGN or off + nb > total:
            raise _bad(path, w + "offset", off, f"a multiple of {_ALIGN} with offset + nbytes <= data_bytes {total}")
    return hdr


def _read(path: str | Path, data: bool):
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file; give the checkpoint.port file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(20)
        if len(head) < 20 or head[:8] != MAGIC:
            raise CheckpointError(f"{path}: not a PORT checkpoint (bad magic)")
        ver, hlen = struct.unpack("<IQ", head[8:])
        if ver == 1:
            raise CheckpointError(f"{path}: checkpoint format version 1 (written by an older PORT; its header is "
                                  f"not checksummed): this PORT reads version {FORMAT_VERSION}; train again without "
                                  f"--resume (or with the PORT that wrote it)")
        if ver != FORMAT_VERSION:
            raise CheckpointError(f"{path}: checkpoint format version {ver}; this PORT reads {FORMAT_VERSION}")
        if _PREFIX + hlen > size:
            raise CheckpointError(f"{path}: truncated header (header length {hlen} bytes, file {size} bytes); {_FIX}")
        digest = f.read(32)
        hj = f.read(hlen)
        if len(digest) != 32 or len(hj) != hlen:
            raise CheckpointError(f"{path}: truncated header; {_FIX}")
        hpad = f.read(_pad(_PREFIX + hlen))
        blob = f.read()
    h = hashlib.sha256(hj)
    h.update(hpad)
    h.update(blob)
    if h.digest() != digest:
        try:
            claimed = json.loads(hj).get("data_bytes")
        except (ValueError, AttributeError, UnicodeDecodeError):
            claimed = None
        if isinstance(claimed, int) and not isinstance(claimed, bool) and len(blob) < claimed:
            raise CheckpointError(f"{path}: truncated data ({len(blob)} of {claimed} bytes); {_FIX}")
        raise CheckpointError(f"{path}: checksum mismatch (corrupt file: header or data changed); {_FIX}")
    try:
        hdr = json.loads(hj)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt header: {e}") from None
    validate_header(path, hdr, len(blob))
    if not data:
        return hdr, {}
    import numpy as np
    import torch
    out = {}
    for e in hdr["tensors"]:
        a = np.frombuffer(blob, dtype=np.dtype(e["dtype"]), count=math.prod(e["shape"]),
                          offset=e["offset"]).reshape(e["shape"])
        out[e["name"]] = torch.from_numpy(a.copy())
    return hdr, out


# ---------------------------------------------------------------------------------------------
def trainer_tensors(tr) -> list[tuple[dict, Any]]:
    """[({"name", "kind"}, tensor view)] of a trainer's checkpointed state, in file order."""
    from port.ir.types import ROLE_BUFFER, ROLE_OPTIMIZER_STATE, ROLE_PARAMETER
    kinds = {ROLE_PARAMETER: "parameter", ROLE_BUFFER: "buffer", ROLE_OPTIMIZER_STATE: "optimizer_state"}
    return [({"name": s.name, "kind": kinds[s.role]}, tr._view(s)) for s in tr._named_slots(tuple(kinds))]


def trainer_fixed_header(tr, meta: dict | None = None) -> dict:
    """The header fields that do not change while training (the rest: step, rng, bn_batches, data_bytes,
    tensors, format)."""
    return {"optimizer": tr.opt.to_dict(), "graph_digest": tr.graph.digest(), "model": tr.graph.name,
            "batch_size": tr.batch_size, "micro_batch": tr.micro_batch,
            "program": {"arena_bytes": tr.program.arena_bytes, "persistent_bytes": tr.program.persistent_bytes},
            "meta": meta or {}}


def tensor_table(tensors: list[tuple[dict, Any]]) -> tuple[list[dict], int]:
    """The header's "tensors" entries (data offsets 64-byte aligned, as write_checkpoint lays them out) and the
    data section's length."""
    entries, off = [], 0
    for e, t in tensors:
        n = t.numel() * t.element_size()
        dtype = str(t.dtype).replace("torch.", "")
        entries.append(dict(e, dtype=dtype, shape=list(t.shape), offset=off, nbytes=n))
        off += n + _pad(n)
    return entries, off


def save_trainer(tr, path: str | Path, meta: dict | None = None, _fail_after: int | None = None) -> None:
    st = tr.state
    header = {"step": st.step, "rng": {"seed": st.seed, "dropout_counter": st.dropout_counter},
              "bn_batches": tr._bn_batches, **trainer_fixed_header(tr, meta)}
    write_checkpoint(path, header, trainer_tensors(tr), _fail_after=_fail_after)


def load_into_trainer(tr, path: str | Path) -> dict:
    hdr, tensors = read_checkpoint(path)
    for k in ("step", "rng"):
        if k not in hdr:
            raise CheckpointError(f"{path}: checkpoint header lacks key {k!r} (not a trainer checkpoint?); {_FIX}")
    slots = {s.name: s for s in tr._named_slots(("parameter", "buffer", "optimizer_state"))}
    missing = sorted(set(slots) - set(tensors))
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {len(missing)} tensors of this model, e.g. {missing[:3]} "
                              f"(was it written for another model or optimizer?)")
    for name, s in slots.items():
        t = tensors[name]
        if tuple(t.shape) != tuple(s.shape):
            raise CheckpointError(f"{path}: tensor {name!r} has shape {list(t.shape)}, the model needs {list(s.shape)}")
        v = tr._view(s)
        if t.dtype != v.dtype:
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {t.dtype}, the model needs {v.dtype}; {_FIX}")
        tr._write(s, t)
    tr.state.step = int(hdr["step"])
    tr.state.seed = int(hdr["rng"]["seed"])
    tr.state.dropout_counter = int(hdr["rng"]["dropout_counter"])
    tr._bn_batches = int(hdr.get("bn_batches", 0))
    return hdr
