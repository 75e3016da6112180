"""The closed-loop report of a training run: what the plan predicted against what the run measured.

``render_report`` writes one self-contained HTML page (plots embedded as base64 PNG): the memory timeline
predicted against measured, a Gantt chart of ops on accelerators, and the placement table, with ops whose
measured time is off the prediction by more than ``flag_threshold`` (25%) flagged. It takes plain data so it
is testable without running anything.
"""
from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

FLAG_THRESHOLD = 0.25


@dataclass(frozen=True)
class OpRow:
    op: str
    layer: str
    kind: str
    phase: str
    accelerator: str
    variant: str
    predicted_ms: float
    measured_ms: float | None     # None: not measured (e.g. zero-cost views)

    @property
    def error(self) -> float | None:
        if self.measured_ms is None or self.predicted_ms <= 0:
            return None
        return (self.measured_ms - self.predicted_ms) / self.predicted_ms


def flagged(rows: Sequence[OpRow], threshold: float = FLAG_THRESHOLD, min_ms: float = 0.02) -> list[OpRow]:
    """Ops whose measured time is off the prediction by more than ``threshold`` (ignoring ops under
    ``min_ms`` in both, where timer resolution dominates)."""
    out = []
    for r in rows:
        e = r.error
        if e is None or max(r.predicted_ms, r.measured_ms or 0.0) < min_ms:
            continue
        if abs(e) > threshold:
            out.append(r)
    return out


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def memory_plot(predicted: Sequence[int], measured: Sequence[int] | None, budget_bytes: int | None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 3.6))
    mib = 2**20
    ax.plot([p / mib for p in predicted], label="predicted (plan)", lw=1.6)
    if measured:
        ax.plot([m / mib for m in measured], label="executed program (arena accounting)", lw=1.0, ls="--")
    if budget_bytes:
        ax.axhline(budget_bytes / mib, color="red", lw=1, label="budget")
    ax.set_xlabel("step of the execution order")
    ax.set_ylabel("live memory (MiB)")
    ax.legend(loc="upper right")
    ax.set_title("Memory timeline")
    return fig


def gantt_plot(rows: Sequence[OpRow], use_measured: bool = False):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    accs = sorted({r.accelerator for r in rows})
    fig, ax = plt.subplots(figsize=(10, 0.6 + 0.7 * len(accs)))
    colors = {"forward": "#4C72B0", "loss": "#8172B2", "backward": "#DD8452", "update": "#55A868", "recompute": "#C44E52"}
    t = 0.0
    for r in rows:
        d = (r.measured_ms if use_measured and r.measured_ms is not None else r.predicted_ms) or 0.0
        if d > 0:
            ax.barh(accs.index(r.accelerator), d, left=t, color=colors.get(r.phase, "#999999"), edgecolor="none")
        t += d
    ax.set_yticks(range(len(accs)), accs)
    ax.set_xlabel("time (ms)")
    ax.set_title("Ops on accelerators (" + ("measured" if use_measured else "predicted") + ")")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, list(colors), loc="upper right", fontsize=8, ncol=5)
    return fig


def render_report(path: str | Path, title: str, rows: Sequence[OpRow], predicted_timeline: Sequence[int],
                  measured_timeline: Sequence[int] | None, budget_bytes: int | None,
                  summary: dict[str, object] | None = None, threshold: float = FLAG_THRESHOLD) -> list[OpRow]:
    """Write the HTML report; returns the flagged ops."""
    from port.io import atomic_write_text

    flags = flagged(rows, threshold)
    flag_names = {r.op for r in flags}
    mem = _png(memory_plot(predicted_timeline, measured_timeline, budget_bytes))
    gp = _png(gantt_plot(rows))
    gm = _png(gantt_plot(rows, use_measured=True)) if any(r.measured_ms is not None for r in rows) else None
    esc = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>",
             "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px}"
             "tr.flag{background:#fde2e2}td.num{text-align:right}</style></head><body>",
             f"<h1>{esc(title)}</h1>"]
    if summary:
        parts.append("<table>")
        for k, v in summary.items():
            parts.append(f"<tr><th>{esc(str(k))}</th><td>{esc(str(v))}</td></tr>")
        parts.append("</table>")
    parts.append(f"<h2>Memory: predicted against measured</h2><img src='data:image/png;base64,{mem}'>")
    parts.append(f"<h2>Ops on accelerators</h2><img src='data:image/png;base64,{gp}'>")
    if gm:
        parts.append(f"<img src='data:image/png;base64,{gm}'>")
    parts.append(f"<h2>Flagged ops ({len(flags)}): measured time off the prediction by more than "
                 f"{threshold:.0%}</h2>")
    if flags:
        parts.append("<ul>" + "".join(f"<li>{esc(r.op)} ({esc(r.kind)} on {esc(r.accelerator)}/{esc(r.variant)}): "
                                      f"predicted {r.predicted_ms:.3f} ms, measured {r.measured_ms:.3f} ms "
                                      f"({r.error:+.0%})</li>" for r in flags) + "</ul>")
    parts.append("<h2>Placement</h2><table><tr><th>op</th><th>kind</th><th>phase</th><th>accelerator</th>"
                 "<th>variant</th><th>predicted ms</th><th>measured ms</th><th>error</th></tr>")
    for r in rows:
        cls = " class='flag'" if r.op in flag_names else ""
        m = f"{r.measured_ms:.3f}" if r.measured_ms is not None else "-"
        e = f"{r.error:+.0%}" if r.error is not None else "-"
        parts.append(f"<tr{cls}><td>{esc(r.op)}</td><td>{esc(r.kind)}</td><td>{esc(r.phase)}</td>"
                     f"<td>{esc(r.accelerator)}</td><td>{esc(r.variant)}</td><td class='num'>{r.predicted_ms:.3f}</td>"
                     f"<td class='num'>{m}</td><td class='num'>{e}</td></tr>")
    parts.append("</table></body></html>")
    atomic_write_text(path, "\n".join(parts))
    return flags
