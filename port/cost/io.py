"""Profile files: versioned JSON, written atomically, validated on load; merging several into one.

Format (``format: "port-profile"``, ``version: types.PROFILE_FORMAT_VERSION``)::

    {"format": "port-profile", "version": 2, "device": "host",
     "accelerators": ["cpu-c", "cpu-torch"], "threads": 2,
     "host": {"cpu": "...", "cores": "2", "torch": "2.13.0", "date": "...", "graph": "digits_cnn",
              "graph_digest": "...", "threads.cpu-c": "2", ...},
     "memory_bytes": 17179869184, "accelerator_caps": {"gpu": 123}, "storage": {"bandwidth_gbps": .., "latency_ms": ..},
     "engine_bytes": {"cpu-torch": 31457280}, "own_memory": ["opencl"],
     "handoff": [{"src": "cpu-c", "dst": "cpu-torch", "latency_ms": 0.0001, "bytes_per_ms": null, "measured": true}],
     "num_entries": N,
     "entries": [{"signature": "...", "accelerator": "cpu-c", "variant": "plain", "latency_ms": 0.12,
                  "spread_ms": 0.004, "workspace_bytes": 0, "peak_delta_bytes": 0, "measured": true, "samples": 5}],
     "sha256": "<digest of everything above, canonical JSON>"}

``bytes_per_ms: null`` means zero-copy (infinite bandwidth). ``engine_bytes`` (optional; absent in files
written before it existed, read as none): per accelerator, the resident memory its execution engine keeps once
a plan runs any op on it (port.cost.footprint); a plan pays it once per accelerator it uses. ``own_memory``
(optional; absent: none): the accelerators whose engine has its own memory (the device YAML's ``memory: own``):
the solver, the simulator and lowering read it from here. ``shared_compute`` (optional; absent: none):
accelerator -> the accelerator whose cores it computes on (the device YAML's ``shares_compute_with``): the
simulator's and the ILP's makespan do not overlap it. ``join_ms`` (optional; absent: none, read as
types.MODELED_JOIN_MS): queued accelerator -> the host's join of its drained queue in ms (Plan.joins; measured by
``port profile`` where the engine is present: port.cost.handoff.measure_joins); the simulator and the ILP price an
explicit join with it. An entry's ``issue_ms`` (optional; absent: 0): a queued engine's call, the host's time to issue
it (OpCost.issue_ms).
"""
from __future__ import annotations

import hashlib
import json
import math
import statistics
from pathlib import Path
from typing import Any, Iterable

from port.errors import ProfileError
from port.cost.types import PROFILE_FORMAT_VERSION, HandoffCost, OpCost, Profile

FORMAT_TAG = "port-profile"
_ENTRY_FIELDS = {"signature": str, "accelerator": str, "variant": str, "latency_ms": (int, float),
                 "spread_ms": (int, float), "workspace_bytes": int, "peak_delta_bytes": int, "measured": bool,
                 "samples": int}


def _canon(d: dict) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()


def profile_to_dict(p: Profile) -> dict:
    d: dict[str, Any] = {
        "format": FORMAT_TAG,
        "version": PROFILE_FORMAT_VERSION,
        "device": p.device,
        "accelerators": list(p.accelerators),
        "threads": p.threads,
        "host": dict(p.host),
        "memory_bytes": p.memory_bytes,
        "accelerator_caps": dict(p.accelerator_caps),
        "storage": dict(p.storage),
        "engine_bytes": dict(p.engine_bytes),
        **({"own_memory": list(p.own_memory)} if p.own_memory else {}),
        **({"shared_compute": dict(p.shared_compute)} if p.shared_compute else {}),
        **({"join_ms": dict(p.join_ms)} if p.join_ms else {}),
        "handoff": [{"src": h.src, "dst": h.dst, "latency_ms": h.latency_ms,
                     "bytes_per_ms": None if math.isinf(h.bytes_per_ms) else h.bytes_per_ms,
                     "measured": h.measured} for h in p.handoff],
        "num_entries": len(p.entries),
        "entries": [{"signature": e.signature, "accelerator": e.accelerator, "variant": e.variant,
                     "latency_ms": e.latency_ms, "spread_ms": e.spread_ms, "workspace_bytes": e.workspace_bytes,
                     "peak_delta_bytes": e.peak_delta_bytes, "measured": e.measured, "samples": e.samples}
                    | ({"issue_ms": e.issue_ms} if e.issue_ms else {}) for e in p.entries],
    }
    d["sha256"] = hashlib.sha256(_canon(d)).hexdigest()
    return d


def _need(d: dict, key: str, typ, where: str) -> Any:
    if key not in d:
        raise ProfileError(f"{where}: key '{key}' is missing")
    v = d[key]
    if typ is not None and (not isinstance(v, typ) or (typ in (int, (int, float)) and isinstance(v, bool))):
        tn = typ.__name__ if isinstance(typ, type) else "number"
        raise ProfileError(f"{where}: key '{key}' should be {tn}, got {type(v).__name__} {v!r}"[:300])
    return v


def profile_from_dict(d: Any, where: str = "profile", device: str | None = None) -> Profile:
    if not isinstance(d, dict):
        raise ProfileError(f"{where}: not a PORT profile (top level is {type(d).__name__}, expected an object)")
    if d.get("format") != FORMAT_TAG:
        raise ProfileError(f"{where}: not a PORT profile (key 'format' is {d.get('format')!r}, expected {FORMAT_TAG!r})")
    ver = d.get("version")
    if ver != PROFILE_FORMAT_VERSION:
        why = (" (version 1 profiles timed kernels the executor does not run: a fused kernel for chains it runs "
               "unfused)" if ver == 1 else "")
        raise ProfileError(f"{where}: profile format version {ver!r} is not supported (this PORT reads version "
                           f"{PROFILE_FORMAT_VERSION}){why}; re-run `port profile`")
    dev = _need(d, "device", str, where)
    if device is not None and dev != device:
        raise ProfileError(f"{where}: profile is for device {dev!r}, not {device!r}; profile this device or pass "
                           f"the matching device")
    if "sha256" in d:
        body = {k: v for k, v in d.items() if k != "sha256"}
        if hashlib.sha256(_canon(body)).hexdigest() != d["sha256"]:
            raise ProfileError(f"{where}: checksum mismatch (key 'sha256'): the file was edited or corrupted; "
                               f"re-run `port profile` (or remove 'sha256' after a deliberate edit)")
    try:
        return _profile_body(d, dev, where)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as e:
        if isinstance(e, ProfileError):
            raise
        raise ProfileError(f"{where}: malformed profile ({type(e).__name__}: {e}); re-run `port profile`") from None


# Sane ranges of a profile's numbers: a latency above MAX_MS (about 28 hours for one op) or a size above MAX_BYTES
# (1 PiB) is a corrupt or hand-edited file, not a measurement (and would wreck the ILP's numerics).
MAX_MS = 1e8
MAX_BYTES = 2**50
MAX_COUNT = 2**31
_RERUN = "re-run `port profile`"


def _number(v: Any, where: str, key: str, lo: float = 0.0, hi: float = MAX_MS, positive: bool = False,
            unit: str = "ms") -> float:
    """A finite number in [lo, hi] (``positive``: > lo); else a ProfileError naming ``where`` and ``key``."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    if ok:
        f = float(v) if not isinstance(v, int) or abs(v) < 2**1000 else math.inf
        ok = math.isfinite(f) and (f > lo if positive else f >= lo) and f <= hi
    if not ok:
        rng = f"{'(' if positive else '['}{lo:g}, {hi:g}]"
        raise ProfileError(f"{where}: key '{key}' = {_shown(v)}: expected a finite number in {rng} ({unit}); "
                           f"{_RERUN}")
    return float(v)


def _integer(v: Any, where: str, key: str, hi: int = MAX_BYTES, unit: str = "bytes") -> int:
    """An integer in [0, hi]; else a ProfileError naming ``where`` and ``key``."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
        top = "2^50 (1 PiB)" if hi == MAX_BYTES else "2^31"
        raise ProfileError(f"{where}: key '{key}' = {_shown(v)}: expected an integer in [0, {top}] ({unit}); "
                           f"{_RERUN}")
    return v


def _shown(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else f"{r[:20]}...({len(r)} characters)"


def _profile_body(d: dict, dev: str, where: str) -> Profile:
    accs = _need(d, "accelerators", list, where)
    if not all(isinstance(a, str) for a in accs):
        raise ProfileError(f"{where}: key 'accelerators' should be a list of accelerator ids; re-run `port profile`")
    entries_raw = _need(d, "entries", list, where)
    n = d.get("num_entries")
    if n is not None and n != len(entries_raw):
        raise ProfileError(f"{where}: truncated: key 'num_entries' says {n} entries, found {len(entries_raw)}")
    entries = []
    for i, e in enumerate(entries_raw):
        w = f"{where}: entries[{i}]"
        if not isinstance(e, dict):
            raise ProfileError(f"{w}: expected an object, got {type(e).__name__}")
        vals = {k: _need(e, k, t, w) for k, t in _ENTRY_FIELDS.items()}
        if vals["accelerator"] not in accs:
            raise ProfileError(f"{w}: accelerator {vals['accelerator']!r} is not one of {accs}")
        entries.append(OpCost(vals["signature"], vals["accelerator"], vals["variant"],
                              _number(vals["latency_ms"], w, "latency_ms"), _number(vals["spread_ms"], w, "spread_ms"),
                              _integer(vals["workspace_bytes"], w, "workspace_bytes"),
                              _integer(vals["peak_delta_bytes"], w, "peak_delta_bytes"),
                              vals["measured"], _integer(vals["samples"], w, "samples", MAX_COUNT, "a count"),
                              _number(e.get("issue_ms", 0.0), w, "issue_ms")))
    hand = []
    for i, h in enumerate(d.get("handoff", [])):
        w = f"{where}: handoff[{i}]"
        if not isinstance(h, dict):
            raise ProfileError(f"{w}: expected an object")
        src, dst = _need(h, "src", str, w), _need(h, "dst", str, w)
        for end in (src, dst):
            if end not in accs:
                raise ProfileError(f"{w}: accelerator {end!r} is not one of {accs}; {_RERUN}")
        bpm = h.get("bytes_per_ms")
        hand.append(HandoffCost(src, dst, _number(_need(h, "latency_ms", (int, float), w), w, "latency_ms"),
                                math.inf if bpm is None else _number(bpm, w, "bytes_per_ms", hi=1e300, positive=True,
                                                                     unit="bytes per ms; null: zero-copy"),
                                bool(h.get("measured", False))))
    host = d.get("host", {})
    if not isinstance(host, dict):
        raise ProfileError(f"{where}: key 'host' should be an object")
    threads = _integer(d.get("threads", 0), where, "threads", MAX_COUNT, "a count")
    memory = _integer(d.get("memory_bytes", 0), where, "memory_bytes")
    for k in ("accelerator_caps", "storage", "engine_bytes"):
        if not isinstance(d.get(k, {}), dict):
            raise ProfileError(f"{where}: key {k!r} should be an object; re-run `port profile`")
    caps, engine = {}, {}
    for key, out in (("accelerator_caps", caps), ("engine_bytes", engine)):
        for k, v in d.get(key, {}).items():
            if k not in accs:
                raise ProfileError(f"{where}: key '{key}' names accelerator {k!r}, not one of {accs}; {_RERUN}")
            out[k] = _integer(v, where, f"{key}.{k}")
    storage = {}
    for k, v in d.get("storage", {}).items():      # bandwidths in GB/s (> 0), latencies in ms, flags 0/1
        gbps = k.endswith("_gbps")
        storage[k] = _number(v, where, f"storage.{k}", hi=1e6 if gbps else MAX_MS, positive=gbps,
                             unit="GB/s" if gbps else ("ms" if k.endswith("_ms") else "a number"))
    own = d.get("own_memory", [])       # absent in files written before it existed: every engine on host memory
    if not isinstance(own, list) or not all(isinstance(a, str) and a in accs for a in own):
        raise ProfileError(f"{where}: key 'own_memory' = {_shown(own)}: expected a list of accelerator ids among "
                           f"{accs}; {_RERUN}")
    shared = d.get("shared_compute", {})  # absent in files written before it existed: no engines share compute
    if not isinstance(shared, dict) or not all(isinstance(a, str) and isinstance(b, str) and a in accs and b in accs
                                               and a != b for a, b in shared.items()):
        raise ProfileError(f"{where}: key 'shared_compute' = {_shown(shared)}: expected a mapping accelerator id -> "
                           f"another accelerator id among {accs}; {_RERUN}")
    joins = d.get("join_ms", {})          # absent in files written before it existed: MODELED_JOIN_MS
    if not isinstance(joins, dict) or not all(isinstance(a, str) and a in accs for a in joins):
        raise ProfileError(f"{where}: key 'join_ms' = {_shown(joins)}: expected a mapping accelerator id -> ms "
                           f"among {accs}; {_RERUN}")
    join = {a: _number(v, where, f"join_ms.{a}") for a, v in joins.items()}
    entries.sort(key=lambda e: (e.signature, e.accelerator, e.variant))
    return Profile(device=dev, accelerators=tuple(accs), entries=tuple(entries),
                   handoff=tuple(sorted(hand, key=lambda h: (h.src, h.dst))),
                   threads=threads, host=tuple(sorted((str(k), str(v)) for k, v in host.items())),
                   memory_bytes=memory, accelerator_caps=tuple(sorted(caps.items())),
                   storage=tuple(sorted(storage.items())), engine_bytes=tuple(sorted(engine.items())),
                   own_memory=tuple(sorted(set(own))), shared_compute=tuple(sorted(shared.items())),
                   join_ms=tuple(sorted(join.items())))


def save_profile(p: Profile, path: str | Path) -> Path:
    """Write ``p`` as JSON atomically (tmp file + fsync + os.replace)."""
    from port.io import atomic_write_text
    path = Path(path)
    atomic_write_text(path, json.dumps(profile_to_dict(p), indent=1) + "\n")
    return path


def load_profile(path: str | Path, device: str | None = None) -> Profile:
    """Read and validate a profile file; ``device`` (a name) must match when given."""
    path = Path(path)
    if not path.exists():
        raise ProfileError(f"{path}: profile file not found; create it with `port profile CONFIG -o {path}`")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"{path}: cannot read profile ({e})") from None
    if not text.strip():
        raise ProfileError(f"{path}: empty profile file (truncated write?); re-run `port profile`")
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: truncated or corrupt profile (invalid JSON at line {e.lineno}, column "
                           f"{e.colno}: {e.msg}); re-run `port profile`") from None
    except RecursionError:
        raise ProfileError(f"{path}: corrupt profile (nested too deeply); re-run `port profile`") from None
    return profile_from_dict(d, str(path), device)


def merge_profiles(profiles: Iterable[Profile | str | Path], device: str | None = None) -> Profile:
    """Merge profiles of the same device (e.g. taken on several machines of one kind) into one.

    Duplicate keys (signature, accelerator, variant): measured beats modeled; several measured entries
    combine to the median latency, the largest spread, workspace and peak, and the summed samples.
    Profiles naming another device are refused unless ``device`` names the merged device explicitly.
    """
    ps = [p if isinstance(p, Profile) else load_profile(p) for p in profiles]
    if not ps:
        raise ProfileError("merge_profiles: no profiles given")
    names = sorted({p.device for p in ps})
    if device is None:
        if len(names) > 1:
            raise ProfileError(f"merge_profiles: profiles are for different devices {names}; pass device=... "
                               f"(--device) to merge them into one device profile deliberately")
        device = names[0]
    groups: dict[tuple, list[OpCost]] = {}
    for p in ps:
        for e in p.entries:
            groups.setdefault((e.signature, e.accelerator, e.variant), []).append(e)
    merged = []
    for key in sorted(groups):
        es = groups[key]
        meas = [e for e in es if e.measured]
        if not meas:
            merged.append(es[0])
            continue
        merged.append(OpCost(key[0], key[1], key[2], float(statistics.median(e.latency_ms for e in meas)),
                             max(e.spread_ms for e in meas), max(e.workspace_bytes for e in meas),
                             max(e.peak_delta_bytes for e in meas), True, sum(e.samples for e in meas),
                             float(statistics.median(e.issue_ms for e in meas))))
    hand: dict[tuple, HandoffCost] = {}
    for p in ps:
        for h in p.handoff:
            cur = hand.get((h.src, h.dst))
            if cur is None or (h.measured and not cur.measured):
                hand[(h.src, h.dst)] = h
    accs: list[str] = []
    for p in ps:
        accs += [a for a in p.accelerators if a not in accs]
    host = dict(ps[0].host)
    host["merged_from"] = "; ".join(f"{dict(p.host).get('hostname', '?')}@{dict(p.host).get('date', '?')}" for p in ps)
    caps: dict[str, int] = {}
    engine: dict[str, int] = {}
    for p in ps:
        caps.update(dict(p.accelerator_caps))
        for k, v in p.engine_bytes:       # the largest footprint measured: what any of the machines kept
            engine[k] = max(engine.get(k, 0), v)
    joins: dict[str, list[float]] = {}     # per queued engine, the median of the machines' joins
    for p in ps:
        for k, v in p.join_ms:
            joins.setdefault(k, []).append(v)
    return Profile(device=device, accelerators=tuple(accs), entries=tuple(merged),
                   handoff=tuple(hand[k] for k in sorted(hand)), threads=max(p.threads for p in ps),
                   host=tuple(sorted(host.items())), memory_bytes=max(p.memory_bytes for p in ps),
                   accelerator_caps=tuple(sorted(caps.items())), storage=ps[0].storage,
                   engine_bytes=tuple(sorted(engine.items())),
                   own_memory=tuple(sorted({a for p in ps for a in p.own_memory})),
                   shared_compute=tuple(sorted({x for p in ps for x in p.shared_compute})),
                   join_ms=tuple((a, float(statistics.median(v))) for a, v in sorted(joins.items())))
