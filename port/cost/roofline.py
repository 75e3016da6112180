"""Roofline cost model for accelerators that are not present (and a prior for those that are).

latency = max(flops / (peak * efficiency), bytes / bandwidth) + launch overhead

``efficiency`` is per op kind (calibrated by ``port profile --calibrate`` on present accelerators and stored
in the device YAML); the defaults below are conservative figures for GEMM-bound and elementwise work.
Workspace estimates follow the C kernels' documented needs (im2col buffer for one sample and group;
a tile's worth for patch variants); measured entries replace them with the kernel's own query.
"""
from __future__ import annotations

import datetime
import math

from port import ops
from port.plan import variants as V
from port.config import AcceleratorConfig, DeviceConfig
from port.ir.types import Graph, Op, numel
from port.cost.types import HandoffCost, OpCost, Profile

DEFAULT_EFFICIENCY = {
    "conv2d": 0.55, "conv2d.grad_input": 0.45, "conv2d.grad_weight": 0.45,
    "linear": 0.5, "linear.grad_input": 0.45, "linear.grad_weight": 0.45,
    "matmul": 0.4, "matmul.grad_input": 0.4, "attention": 0.3, "attention.grad_input": 0.25,
}
# elementwise, pooling, normalisation, loss, update: the bound is bytes / bandwidth or vector FLOPs
ELEMENTWISE_EFFICIENCY = 0.5   # fraction of bandwidth reached by elementwise kernels
# tiled attention: its score tiles stay in the cache and causal tiles above the diagonal are skipped (measured on an
# Intel Xeon, 2 threads, 128 heads x 128 x 128 x 32: forward 0.86x plain causal, 0.98x not; backward 0.95x)
VARIANT_FACTOR = {"plain": 1.0, "inplace": 0.95, "direct": 1.0, "patch4": 1.1, "patch8": 1.2,
                  "tiled": 0.95}     # (``fused``: its Fusion's own, port.plan.variants.Fusion.modeled_factor)
ZERO_COST_KINDS = tuple(k for r in ops.RECORDS.values() for k in r.views)   # views: no call
WINOGRAD_MAC_FACTOR = 16 / 36   # F(2x2, 3x3): 16 multiplies per output tile and channel pair instead of 4 * 9


def winograd_transform_bytes(graph: Graph, op: Op) -> int:
    """Bytes of the transformed tiles a Winograd conv writes and reads back: 16 values per 2x2 tile for every
    input and output channel (kernels/src/winograd.c)."""
    fwd = graph.ops[op.forward_op] if op.forward_op is not None else op
    n, ci = graph.tensors[fwd.inputs[0]].shape[:2]
    _, co, ho, wo = graph.tensors[fwd.outputs[0]].shape
    tiles = n * ((ho + 1) // 2) * ((wo + 1) // 2)
    return 2 * 4 * 16 * (ci + co) * tiles


def im2col_bytes(graph: Graph, op: Op) -> int:
    """Bytes of one image's im2col matrix for one group (0 for a pointwise conv: its image is its own matrix), the
    scratch a conv writes and reads back per image and group.  From the shapes, not the workspace query: the C
    drivers' workspace holds several images or several threads' slots at once (kernels/src/conv.c), not the
    traffic."""
    fwd = graph.ops[op.forward_op] if op.forward_op is not None else op
    kh, kw = op.attr("kernel")
    if (kh, kw) == (1, 1) and tuple(op.attr("stride")) == (1, 1) and tuple(op.attr("padding")) == (0, 0):
        return 0
    c_in = graph.tensors[fwd.inputs[0]].shape[1]
    ho, wo = graph.tensors[fwd.outputs[0]].shape[2:4]
    return 4 * (c_in // op.attr("groups")) * kh * kw * ho * wo


def workspace_bytes(graph: Graph, op: Op, variant: str) -> int:
    """Scratch bytes of ``op`` with ``variant``: the C kernels' own workspace queries for the calls the op
    registry runs (modeled accelerators are priced as the C backend; measured entries record the same)."""
    from port.exec import registry
    return registry.op_workspace_bytes(graph, op, variant, "c")


VECTOR_FRACTION = 0.25          # elementwise arithmetic reaches ~1/4 of the FMA peak


def efficiency_for(acc: AcceleratorConfig, kind: str, efficiency: dict[str, float] | None = None) -> float:
    """Efficiency of ``kind`` on ``acc``: an explicit map, then the accelerator's (calibrated) map, then the
    defaults (by exact kind, then by base kind), then the elementwise default."""
    base = kind.split(".")[0]
    for m in (efficiency or {}, acc.efficiency, DEFAULT_EFFICIENCY):
        if kind in m:
            return m[kind]
        if base in m and m is not DEFAULT_EFFICIENCY:
            return m[base]
    return DEFAULT_EFFICIENCY.get(base, ELEMENTWISE_EFFICIENCY)


def ideal_ms(graph: Graph, op: Op, acc: AcceleratorConfig, variant: str) -> float:
    """The roofline bound at efficiency 1: max(FLOPs / peak, vector FLOPs / (peak/4), bytes / bandwidth)."""
    if op.kind in ZERO_COST_KINDS:
        return 0.0
    if variant == "fused":        # its share (V.fused_share) of its call's bound: the members' plain bounds
        ch = V.chain_of(graph, op)
        group = [graph.ops[m] for m in ch.ops if ch.call_of(m) == ch.call_of(op.id)]
        return sum(ideal_ms(graph, m, acc, "plain") for m in group) * ch.fusion.modeled_factor \
            * V.fused_share(graph, op)
    peak = acc.peak_gflops * 1e9
    compute_ms = op.flops / peak * 1e3 if op.flops else 0.0
    vec_ms = op.vector_flops / (peak * VECTOR_FRACTION) * 1e3 if op.vector_flops else 0.0
    moved = op.bytes_moved
    if op.kind in V.CONV_KINDS and variant == "winograd":
        compute_ms *= WINOGRAD_MAC_FACTOR
        moved += winograd_transform_bytes(graph, op)
    elif op.kind in V.CONV_KINDS and variant != "direct":
        fwd = graph.ops[op.forward_op] if op.forward_op is not None else op
        moved += 2 * im2col_bytes(graph, op) * graph.tensors[fwd.inputs[0]].shape[0]
    mem_ms = moved / (acc.mem_gbps * 1e9) * 1e3
    factor = VARIANT_FACTOR.get(variant, 1.0)
    return max(compute_ms, vec_ms, mem_ms) * factor


def roofline_ms(graph: Graph, op: Op, acc: AcceleratorConfig, variant: str,
                efficiency: dict[str, float] | None = None) -> float:
    """max(FLOPs / peak, bytes / bandwidth) / efficiency(kind) + launch overhead (0 for views and
    ops folded into a fused kernel)."""
    ideal = ideal_ms(graph, op, acc, variant)
    if ideal == 0.0 and op.kind in ZERO_COST_KINDS:
        return 0.0
    launch = acc.launch_overhead_us * 1e-3 * (V.fused_share(graph, op) if variant == "fused" else 1.0)
    return ideal / efficiency_for(acc, op.kind, efficiency) + launch


def modeled_entries(graph: Graph, device: DeviceConfig, accelerators: tuple[str, ...] | None = None,
                    efficiency: dict[str, dict[str, float]] | None = None) -> list[OpCost]:
    """Roofline entries for every (signature, accelerator, legal variant); ``efficiency`` maps
    accelerator id -> {kind: efficiency} and overrides the device description's maps."""
    out: dict[tuple[str, str, str], OpCost] = {}
    for acc in device.accelerators:
        if accelerators is not None and acc.id not in accelerators:
            continue
        backend = "c" if acc.backend == "modeled" else acc.backend
        for op in graph.ops:
            if op.kind.split(".")[0] in acc.unsupported_ops or op.kind in acc.unsupported_ops:
                continue
            sig = graph.signature(op)
            for var in V.variants(graph, op, backend):
                key = (sig, acc.id, var)
                if key in out:
                    continue
                eff = (efficiency or {}).get(acc.id)
                out[key] = OpCost(sig, acc.id, var, roofline_ms(graph, op, acc, var, eff), 0.0,
                                  workspace_bytes(graph, op, var), 0, False, 0)
    return [out[k] for k in sorted(out)]


def modeled_handoff(device: DeviceConfig) -> list[HandoffCost]:
    out = []
    for h in device.handoff:
        bpm = math.inf if math.isinf(h.gbps) else h.gbps * 1e9 / 1e3
        out.append(HandoffCost(h.src, h.dst, h.latency_us * 1e-3, bpm, False))
    ids = [a.id for a in device.accelerators]
    have = {(h.src, h.dst) for h in out}
    for a in ids:  # undeclared pairs: a copy through memory at the slower engine's bandwidth
        for b in ids:
            if a != b and (a, b) not in have:
                bw = min(device.accelerator(a).mem_gbps, device.accelerator(b).mem_gbps)
                out.append(HandoffCost(a, b, 0.01, bw * 1e9 / 1e3 / 2, False))
    return sorted(out, key=lambda h: (h.src, h.dst))


def own_memory_accelerators(device: DeviceConfig) -> tuple[str, ...]:
    """The ids of ``device``'s accelerators with their own memory (``memory: own``), as a profile records them."""
    return tuple(sorted(a.id for a in device.accelerators if a.memory == "own"))


def shared_compute_pairs(device: DeviceConfig) -> tuple[tuple[str, str], ...]:
    """(accelerator, the accelerator whose compute it shares) for ``device``'s ``shares_compute_with`` entries whose
    both ends are present (an optional engine may have been dropped), as a profile records them."""
    ids = {a.id for a in device.accelerators}
    return tuple(sorted((a.id, a.shares_compute_with) for a in device.accelerators
                        if a.shares_compute_with is not None and a.shares_compute_with in ids))


def modeled_profile(graph: Graph, device: DeviceConfig) -> Profile:
    """A fully modeled Profile of ``graph`` on ``device`` (every accelerator, every legal variant)."""
    from port.cost.handoff import modeled_joins
    caps = tuple((a.id, a.memory_cap) for a in device.accelerators if a.memory_cap is not None)
    from port.cost.storage import declared_storage   # () when the config leaves the figures to `port profile`
    storage = declared_storage(device)
    return Profile(
        device=device.name,
        accelerators=tuple(a.id for a in device.accelerators),
        entries=tuple(modeled_entries(graph, device)),
        handoff=tuple(modeled_handoff(device)),
        threads=0,
        host=(("kind", "modeled"), ("date", datetime.date.today().isoformat())),
        memory_bytes=device.memory,
        accelerator_caps=caps,
        storage=storage,
        own_memory=own_memory_accelerators(device),
        shared_compute=shared_compute_pairs(device),
        join_ms=tuple(sorted(modeled_joins(device).items())),
    )
