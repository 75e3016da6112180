"""Roofline calibration: fit the efficiency per op kind on present accelerators from measured entries.

For every measured entry, the roofline at efficiency 1 is ``ideal`` (port.cost.roofline.ideal_ms) and the
measured time minus the launch overhead is ``t``; the efficiency of a kind is the median of ideal / t
over its entries (clipped to (0.001, 1.5]). The fit error is the median |modeled - measured| / measured,
reported before (default efficiencies) and after (calibrated).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from port.cost import roofline as CM
from port.config import DeviceConfig
from port.ir.types import Graph
from port.cost.types import Profile


@dataclass
class Calibration:
    efficiency: dict[str, dict[str, float]] = field(default_factory=dict)  # acc -> kind -> eff
    error_before: dict[str, float] = field(default_factory=dict)          # acc -> median rel. error
    error_after: dict[str, float] = field(default_factory=dict)
    per_kind_error: dict[str, dict[str, float]] = field(default_factory=dict)
    entries: dict[str, int] = field(default_factory=dict)
    launch_us: dict[str, float] = field(default_factory=dict)              # acc -> fitted launch overhead

    def to_dict(self) -> dict:
        return {"efficiency": self.efficiency, "error_before": self.error_before, "error_after": self.error_after,
                "per_kind_error": self.per_kind_error, "entries": self.entries, "launch_us": self.launch_us}

    def yaml_snippet(self) -> str:
        lines = []
        for acc, m in sorted(self.efficiency.items()):
            lines.append(f"  # accelerator {acc}: efficiency fitted by `port profile --calibrate`")
            if acc in self.launch_us:
                lines.append(f"    launch_overhead_us: {self.launch_us[acc]:.3g}")
            lines.append("    efficiency: {" + ", ".join(f"{k}: {v:.3g}" for k, v in sorted(m.items())) + "}")
        return "\n".join(lines)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / b if b > 0 else 0.0


def calibrate(graph: Graph, device: DeviceConfig, profile: Profile) -> Calibration:
    """Fit efficiencies of ``device``'s accelerators from ``profile``'s measured plain entries of ``graph``."""
    rep = {}
    for op in graph.ops:
        rep.setdefault(graph.signature(op), op)
    cal = Calibration()
    ids = {a.id for a in device.accelerators}
    for acc in device.accelerators:
        samples: dict[str, list[tuple[float, float, object]]] = {}
        for e in profile.entries:
            if e.accelerator != acc.id or not e.measured or e.variant != "plain" or e.signature not in rep:
                continue
            op = rep[e.signature]
            ideal = CM.ideal_ms(graph, op, acc, "plain")
            if ideal <= 0:
                continue
            samples.setdefault(op.kind, []).append((ideal, e.latency_ms, op))
        if not samples:
            continue
        # launch overhead: the fastest measured op with real work bounds it from above
        launch = min(t for xs in samples.values() for _, t, _ in xs) * 0.9
        fitted = acc.model_copy(update={"launch_overhead_us": launch * 1e3})
        eff = {}
        for kind, xs in samples.items():
            ratios = [ideal / max(t - launch, 1e-6) for ideal, t, _ in xs]
            eff[kind] = float(min(1.5, max(1e-3, statistics.median(ratios))))
        before, after, per_kind = [], [], {}
        for kind, xs in samples.items():
            errs = []
            for ideal, t, op in xs:
                before.append(_rel(CM.roofline_ms(graph, op, acc, "plain"), t))
                m = CM.roofline_ms(graph, op, fitted, "plain", eff)
                after.append(_rel(m, t))
                errs.append(after[-1])
            per_kind[kind] = float(statistics.median(errs))
        cal.efficiency[acc.id] = eff
        cal.error_before[acc.id] = float(statistics.median(before))
        cal.error_after[acc.id] = float(statistics.median(after))
        cal.per_kind_error[acc.id] = per_kind
        cal.entries[acc.id] = sum(len(v) for v in samples.values())
        cal.launch_us[acc.id] = launch * 1e3
    assert set(cal.efficiency) <= ids
    return cal


def save_calibration(cal: Calibration, path: str | Path) -> Path:
    from port.io import atomic_write_text
    atomic_write_text(path, json.dumps(cal.to_dict(), indent=1, sort_keys=True) + "\n")
    return Path(path)
