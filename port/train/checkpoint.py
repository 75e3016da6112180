"""Versioned binary checkpoints (never pickle), written atomically.

Layout:  b"PORTCKPT" | u32 format version | u64 header length | header JSON (utf-8) | zero padding to 64 |
         raw tensor data (each tensor 64-byte aligned, little-endian, C order).
Header:  {"format": 1, "step", "rng": {"seed", "dropout_counter"}, "bn_batches", "optimizer": {...},
          "graph_digest", "program": {arena/persistent bytes}, "meta": {...}, "data_bytes", "data_sha256",
          "tensors": [{"name", "kind": parameter|buffer|optimizer_state, "dtype", "shape", "offset", "nbytes"}]}
Offsets are relative to the start of the data section.

Atomicity: port.io.atomic_writer writes a temporary file beside it, flushes and fsyncs it, then ``os.replace``s it over the
target and the directory fsync'ed: a crash or kill at any moment leaves either the previous checkpoint or the new
one, never a torn file. Reading verifies magic, version, sizes and the sha256 of the data.
"""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

from port.errors import PortError
from port.io import atomic_writer

MAGIC = b"PORTCKPT"
FORMAT_VERSION = 1
_ALIGN = 64


class CheckpointError(PortError, ValueError):
    """A checkpoint file is missing, truncated, corrupt, of another format version or for another model."""


def _pad(n: int) -> int:
    return (-n) % _ALIGN


def write_checkpoint(path: str | Path, header: dict, tensors: list[tuple[dict, Any]], _fail_after: int | None = None) -> None:
    """tensors: [(entry {"name", "kind"}, torch tensor)]. ``_fail_after`` (tests) raises after that many
    data bytes were written, simulating a crash mid-write."""
    import numpy as np
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    entries, blobs = [], []
    off = 0
    h = hashlib.sha256()
    for e, t in tensors:
        a = t.detach().cpu().contiguous().numpy()
        b = a.tobytes()
        entries.append(dict(e, dtype=str(a.dtype), shape=list(a.shape), offset=off, nbytes=len(b)))
        blobs.append(b)
        h.update(b)
        h.update(b"\0" * _pad(len(b)))
        off += len(b) + _pad(len(b))
    hdr = dict(header, format=FORMAT_VERSION, tensors=entries, data_bytes=off, data_sha256=h.hexdigest())
    hj = json.dumps(hdr, sort_keys=True).encode()
    pre = MAGIC + struct.pack("<IQ", FORMAT_VERSION, len(hj)) + hj
    pre += b"\0" * _pad(len(pre))
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
    return _read(path, data=False)[0]


def read_checkpoint(path: str | Path) -> tuple[dict, dict[str, Any]]:
    """-> (header, {name: torch tensor})."""
    return _read(path, data=True)


def _read(path: str | Path, data: bool):
    import numpy as np
    import torch
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint")
    with open(path, "rb") as f:
        head = f.read(20)
        if len(head) < 20 or head[:8] != MAGIC:
            raise CheckpointError(f"{path}: not a PORT checkpoint (bad magic)")
        ver, hlen = struct.unpack("<IQ", head[8:])
        if ver != FORMAT_VERSION:
            raise CheckpointError(f"{path}: checkpoint format version {ver}; this PORT reads {FORMAT_VERSION}")
        hj = f.read(hlen)
        if len(hj) != hlen:
            raise CheckpointError(f"{path}: truncated header")
        try:
            hdr = json.loads(hj)
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: corrupt header: {e}") from None
        if not data:
            return hdr, {}
        f.seek(20 + hlen + _pad(20 + hlen))
        blob = f.read()
    if len(blob) != hdr["data_bytes"]:
        raise CheckpointError(f"{path}: truncated data ({len(blob)} of {hdr['data_bytes']} bytes)")
    if hashlib.sha256(blob).hexdigest() != hdr["data_sha256"]:
        raise CheckpointError(f"{path}: data checksum mismatch (corrupt file)")
    out = {}
    for e in hdr["tensors"]:
        a = np.frombuffer(blob, dtype=np.dtype(e["dtype"]), count=int(np.prod(e["shape"], dtype=np.int64)),
                          offset=e["offset"]).reshape(e["shape"])
        out[e["name"]] = torch.from_numpy(a.copy())
    return hdr, out


# ---------------------------------------------------------------------------------------------
def save_trainer(tr, path: str | Path, meta: dict | None = None, _fail_after: int | None = None) -> None:
    from port.ir.types import ROLE_BUFFER, ROLE_OPTIMIZER_STATE, ROLE_PARAMETER
    kinds = {ROLE_PARAMETER: "parameter", ROLE_BUFFER: "buffer", ROLE_OPTIMIZER_STATE: "optimizer_state"}
    tensors = [({"name": s.name, "kind": kinds[s.role]}, tr._view(s))
               for s in tr._named_slots(tuple(kinds))]
    st = tr.state
    header = {"step": st.step, "rng": {"seed": st.seed, "dropout_counter": st.dropout_counter},
              "bn_batches": tr._bn_batches, "optimizer": tr.opt.to_dict(), "graph_digest": tr.graph.digest(),
              "model": tr.graph.name, "batch_size": tr.batch_size, "micro_batch": tr.micro_batch,
              "program": {"arena_bytes": tr.program.arena_bytes, "persistent_bytes": tr.program.persistent_bytes},
              "meta": meta or {}}
    write_checkpoint(path, header, tensors, _fail_after=_fail_after)


def load_into_trainer(tr, path: str | Path) -> dict:
    hdr, tensors = read_checkpoint(path)
    slots = {s.name: s for s in tr._named_slots(("parameter", "buffer", "optimizer_state"))}
    missing = sorted(set(slots) - set(tensors))
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {len(missing)} tensors of this model, e.g. {missing[:3]} "
                              f"(was it written for another model or optimizer?)")
    for name, s in slots.items():
        t = tensors[name]
        if tuple(t.shape) != tuple(s.shape):
            raise CheckpointError(f"{path}: tensor {name!r} has shape {list(t.shape)}, the model needs {list(s.shape)}")
        tr._view(s).copy_(t)
    tr.state.step = int(hdr["step"])
    tr.state.seed = int(hdr["rng"]["seed"])
    tr.state.dropout_counter = int(hdr["rng"]["dropout_counter"])
    tr._bn_batches = int(hdr.get("bn_batches", 0))
    return hdr
