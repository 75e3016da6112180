"""Seeded fuzzing of port-rt bundles (issue 53): mutated bundles, their SHA-256 trailer recomputed so that each
mutation reaches the loader's header and call checks, are run by the port-rt binary. Each must be refused (exit 2,
naming the problem) or run (exit 0, or 1/2 for a failure the runtime reports: a kernel's status, a diverged loss),
never crash: no signal, and under `make test-asan` (PORT_RT_BIN = the ASan+UBSan build of port-rt,
kernels/build/port-rt-asan) no sanitizer report, so a write outside the arena fails CI.

Mutations: a random byte anywhere in the header, the call table, the zero ranges and the checkpoint template (the
image's bytes are the weights: any value loads); a random byte of the file; and field edits of one call (a pointer,
an integer or float parameter, the workspace, a zero range) to values at the edges: 0, -1, 2^28, 2^62,
arena_bytes - 1, arena_bytes, NaN, infinity. Before the call rule (kernels/runtime/rt_check.c) 2 in 300 random
single-byte mutations crashed port-rt (SIGSEGV), others ran with their output written past the arena.

Three corpora: the call-rule net's bundle, a format-3 bundle of a model with two inputs (its extra-input table
among the structure mutated), and a small net of average pools with ceil mode and count_include_pad=False (issue
52: their iv[14], iv[15] and output sizes among the fields edited). Bounded: PORT_FUZZ_BUNDLES mutants each (48 in
the normal suite, ~10 s; `make test-asan` runs 300)."""
from __future__ import annotations

import collections
import ctypes
import hashlib
import math
import os
import random
import struct
import subprocess
from pathlib import Path

import pytest
import torch

from port.exec import capi
from port.exec.bundle import build_bundle, write_data

ROOT = Path(__file__).resolve().parents[2]
MUTANTS = int(os.environ.get("PORT_FUZZ_BUNDLES", "48"))
SEED = 53
CALL_BYTES = ctypes.sizeof(capi.RtCall)
SANITIZER = ("AddressSanitizer", "runtime error:", "LeakSanitizer", "UndefinedBehaviorSanitizer")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A bundle of the call-rule test's net (every element-wise, pooling and norm kernel, conv, linear, dropout)
    and a data file for it."""
    import port
    from test_call_rule import Zoo
    d = tmp_path_factory.mktemp("fuzz_bundle")
    torch.manual_seed(0)
    x = torch.randn(4, 3, 16, 16)
    y = torch.randint(0, 10, (4,))
    tr = port.Trainer(Zoo(), x[:2], optimizer=port.optim.SGD(0.05, momentum=0.9))
    data, _ = build_bundle(tr)
    write_data(d / "d.portdata", x.numpy(), y.numpy(), 10)
    return bytes(data), d


@pytest.fixture(scope="module")
def corpus_inputs(tmp_path_factory):
    """A format-3 bundle (a model with input_ids and attention_mask: its extra-input table) and its data file."""
    import port
    from nets54 import TwoInputs
    d = tmp_path_factory.mktemp("fuzz_bundle_inputs")
    g = torch.Generator().manual_seed(0)
    ids, y = torch.randint(1, 13, (4, 6), generator=g), torch.randint(0, 10, (4,), generator=g)
    mask = torch.ones_like(ids)
    mask[::2, -2:] = 0
    tr = port.Trainer(TwoInputs(), {"input_ids": ids[:2], "attention_mask": mask[:2]})
    data, _ = build_bundle(tr)
    assert struct.unpack_from("<I", data, 8)[0] == 3
    write_data(d / "d.portdata", [ids.numpy(), mask.numpy()], y.numpy(), 10)
    return bytes(data), d


@pytest.fixture(scope="module")
def corpus_avg_pools(tmp_path_factory):
    """A bundle of nets54.AvgPools (average pools in ceil mode, with count_include_pad=False) and its data file."""
    import port
    from nets54 import AvgPools
    d = tmp_path_factory.mktemp("fuzz_bundle_avg")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 3, 9, 7, generator=g), torch.randint(0, 3, (4,), generator=g)
    tr = port.Trainer(AvgPools(), x[:2], optimizer=port.optim.SGD(0.05))
    data, _ = build_bundle(tr)
    write_data(d / "d.portdata", x.numpy(), y.numpy(), 3)
    return bytes(data), d


def _sections(b: bytes) -> list[tuple[int, int]]:
    """[start, end) of the header, call table, zero ranges and checkpoint template."""
    co, nc = struct.unpack_from("<Q", b, 48)[0], sum(struct.unpack_from("<II", b, 56))
    zo, nz = struct.unpack_from("<Q", b, 64)[0], struct.unpack_from("<I", b, 72)[0]
    ko = struct.unpack_from("<Q", b, 392)[0]
    kn, fl, tl = struct.unpack_from("<III", b, 400)
    out = [(0, 512), (co, co + nc * CALL_BYTES), (zo, zo + 16 * nz)]
    if ko:
        out.append((ko, ko + 24 * kn + fl + tl))
    if struct.unpack_from("<I", b, 8)[0] == 3:      # the extra-input table (format 3), and its header fields
        k, to = struct.unpack_from("<I", b, 440)[0], struct.unpack_from("<Q", b, 448)[0]
        out += [(to, to + 32 * k), (440, 456)]
    return [(a, e) for a, e in out if e > a]


def _mutate(b: bytes, rng: random.Random) -> tuple[str, bytes]:
    m = bytearray(b)
    total = len(m)
    A = struct.unpack_from("<Q", m, 24)[0]
    how = rng.random()
    if how < 0.35:      # a byte of the structure
        a, e = rng.choice(_sections(b))
        at = rng.randrange(a, e)
        m[at] = rng.choice([v for v in range(256) if v != m[at]])
        what = f"structure byte {at}"
    elif how < 0.5:     # a byte anywhere (mostly the weights)
        at = rng.randrange(0, total - 32)
        m[at] = rng.choice([v for v in range(256) if v != m[at]])
        what = f"byte {at}"
    else:               # a field of one call at an edge value
        co, nc = struct.unpack_from("<Q", m, 48)[0], sum(struct.unpack_from("<II", m, 56))
        i = rng.randrange(nc)
        rec = capi.RtCall.from_buffer_copy(m, co + i * CALL_BYTES)
        field = rng.choice(["ptr", "iv", "fv", "ws_offset", "ws_bytes", "zero_offset", "zero_bytes", "kernel"])
        ints = [0, -1, 1, 1 << 28, 1 << 62, A - 1, A, A - 4, -(1 << 63), 2 ** 63 - 1]
        if field in ("ptr", "iv", "zero_offset", "zero_bytes"):
            arr = getattr(rec, field)
            j = rng.randrange(len(arr))
            arr[j] = rng.choice(ints + [arr[j] * 2, arr[j] + 64, arr[j] - 64])
            what = f"call {i} {field}[{j}]"
        elif field == "fv":
            j = rng.randrange(2)
            rec.fv[j] = rng.choice([math.nan, math.inf, -math.inf, -1.0, 1.0, 2.0, 1e300])
            what = f"call {i} fv[{j}]"
        elif field == "kernel":
            rec.kernel = rng.choice([0, -1, 39, 40, 65, 66, 1000, rng.randrange(1, 66)])
            what = f"call {i} kernel"
        else:
            setattr(rec, field, rng.choice(ints + [getattr(rec, field) // 2]))
            what = f"call {i} {field}"
        m[co + i * CALL_BYTES:co + (i + 1) * CALL_BYTES] = bytes(rec)
    m[total - 32:] = hashlib.sha256(m[:total - 32]).digest()
    return what, bytes(m)


def _loader(b: bytes) -> tuple[int, int]:
    buf = (ctypes.c_uint8 * len(b)).from_buffer_copy(b)
    arena, why = ctypes.c_uint64(0), capi.RtCallProblem()
    return capi.raw.port_rt_bundle_check_why(buf, len(b), ctypes.byref(arena), ctypes.byref(why)), arena.value


@pytest.mark.parametrize("which", ["corpus", "corpus_inputs", "corpus_avg_pools"])
def test_fuzz_bundles_never_crash_port_rt(port_rt, which, request):
    good, d = request.getfixturevalue(which)
    st, A0 = _loader(good)
    assert st == 0
    rng = random.Random(SEED)
    codes: collections.Counter = collections.Counter()
    bad = []
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1"}
    for k in range(MUTANTS):
        what, m = _mutate(good, rng)
        st, A = _loader(m)
        if st == 0 and A > 16 * A0:      # a larger arena the header asks for: valid, but not this test's memory
            codes["big arena"] += 1
            continue
        p = d / "m.portrt"
        p.write_bytes(m)
        try:
            r = subprocess.run([str(port_rt), "train", str(p), "--data", str(d / "d.portdata"), "--steps", "2",
                                "--threads", "1"], capture_output=True, text=True, timeout=120, env=env)
        except subprocess.TimeoutExpired:
            bad.append((what, "timeout", ""))
            continue
        codes[r.returncode] += 1
        if r.returncode < 0 or r.returncode not in (0, 1, 2) or any(s in r.stderr for s in SANITIZER):
            bad.append((what, r.returncode, r.stderr[-1500:]))
        elif st != 0:   # the loader refused it: port-rt says so, exit 2
            assert r.returncode == 2 and "not a valid bundle" in r.stderr, (what, r.returncode, r.stderr[-500:])
    assert not bad, f"{len(bad)} of {MUTANTS} mutants crashed port-rt ({dict(codes)}): {bad[:3]}"
    assert codes[2] > 0 and codes[0] > 0, dict(codes)     # the corpus reaches both outcomes
