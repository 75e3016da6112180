"""The closed-loop report of a training run: what the plan predicted against what the run measured.

``render_report`` writes one self-contained HTML page (plots embedded as base64 PNG): the memory timeline
predicted against measured, a Gantt chart of ops on accelerators, and the placement table, with ops whose
measured time is off the prediction by more than ``flag_threshold`` (25%) and by more than 1% of the step
(at least 0.05 ms) flagged; fused chain members are attributed to their chain, ops priced at 0 shown as unpriced. It takes plain data so it
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
FLAG_STEP_FRACTION = 0.01    # ... and off by more than this fraction of the step
FLAG_MIN_MS = 0.05           # ... or this many ms, whichever is larger (timer resolution, noise)
UNPRICED_MS = 1e-3           # a prediction under 1 us is "priced at 0": shown as unpriced, not as an error %


@dataclass(frozen=True)
class OpRow:
    op: str
    layer: str
    kind: str
    phase: str
    accelerator: str
    variant: str
    predicted_ms: float
    measured_ms: float | None     # None: not measured (e.g. zero-cost views, members of a fused chain)
    chain: str | None = None      # a fused chain member: the op (conv) whose call computes it and is booked with it

    @property
    def unpriced(self) -> bool:
        """Measured but priced at (about) 0: a relative error says nothing here."""
        return self.measured_ms is not None and self.predicted_ms < UNPRICED_MS

    @property
    def error(self) -> float | None:
        if self.measured_ms is None or self.predicted_ms < UNPRICED_MS:
            return None
        return (self.measured_ms - self.predicted_ms) / self.predicted_ms

    def describe_error(self) -> str:
        if self.chain is not None:
            return f"in {self.chain}'s chain"
        if self.unpriced:
            return "unpriced"
        return f"{self.error:+.0%}" if self.error is not None else "-"


def step_of(rows: Sequence[OpRow]) -> float:
    """The step the rows make up (the larger of the predicted and measured sums), for the flag rule."""
    return max(sum(r.predicted_ms for r in rows), sum(r.measured_ms or 0.0 for r in rows))


def flagged(rows: Sequence[OpRow], threshold: float = FLAG_THRESHOLD, step_ms: float | None = None,
            step_fraction: float = FLAG_STEP_FRACTION, min_ms: float = FLAG_MIN_MS) -> list[OpRow]:
    """Ops that matter and are mispredicted: measured time off the prediction by more than ``threshold``
    (relative) AND by more than max(``step_fraction`` of the step, ``min_ms``) (absolute). Members of a fused
    chain are never flagged on their own (their time is booked on the chain's conv); an op priced at about 0
    that measured over the absolute bar is flagged as unpriced."""
    step = step_of(rows) if step_ms is None else step_ms
    bar = max(step_fraction * step, min_ms)
    out = []
    for r in rows:
        if r.chain is not None or r.measured_ms is None:
            continue
        if abs(r.measured_ms - r.predicted_ms) <= bar:
            continue
        if r.unpriced or abs(r.error or 0.0) > threshold:
            out.append(r)
    return out


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def memory_plot(predicted: Sequence[int], measured: Sequence[int] | None, budget_bytes: int | None,
                rss: Sequence[int] | None = None, rss_peak_bytes: int | None = None):
    """Predicted (plan) and executed (arena accounting) live bytes per step of the execution order, with the
    budget; ``rss``: the process's measured resident memory per step (above the baseline: RSS before
    Trainer(...) less the module's weights, which move into the arena), ``rss_peak_bytes`` its peak over the
    training steps (same baseline)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 3.6))
    mib = 2**20
    ax.plot([p / mib for p in predicted], label="predicted (plan)", lw=1.6)
    if measured:
        ax.plot([m / mib for m in measured], label="executed program (arena accounting, not measured)", lw=1.0,
                ls="--")
    if rss:
        ax.plot([m / mib for m in rss], label="measured: process RSS (instrumented step)", lw=1.2, color="black")
    if rss_peak_bytes:
        ax.axhline(rss_peak_bytes / mib, color="black", lw=0.8, ls=":", label="measured: RSS peak of the steps")
    if budget_bytes:
        ax.axhline(budget_bytes / mib, color="red", lw=1, label="budget")
    ax.set_xlabel("step of the execution order")
    ax.set_ylabel("memory (MiB)")
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
                  summary: dict[str, object] | None = None, threshold: float = FLAG_THRESHOLD,
                  rss_timeline: Sequence[int] | None = None, memory: dict | None = None) -> list[OpRow]:
    """Write the HTML report; returns the flagged ops. ``rss_timeline``: the process's measured resident memory
    per step (above the baseline, see memory_plot); ``memory``: port.pipeline's measured memory figures
    (measured.json "memory": RSS before Trainer / after set-up / steps' peak, baseline, arena, predicted peak,
    budget), shown as a table next to the chart."""
    from port.io import atomic_write_text

    flags = flagged(rows, threshold)
    bar = max(FLAG_STEP_FRACTION * step_of(rows), FLAG_MIN_MS)
    flag_names = {r.op for r in flags}
    mm = memory or {}
    rss_peak = (mm["rss_steps_peak_bytes"] - mm["rss_baseline_bytes"]
                if mm.get("rss_steps_peak_bytes") and mm.get("rss_baseline_bytes") is not None else None)
    mem = _png(memory_plot(predicted_timeline, measured_timeline, budget_bytes, rss_timeline, rss_peak))
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
    if mm:
        def mb(k):
            v = mm.get(k)
            return f"{v / 2**20:.1f} MiB" if isinstance(v, (int, float)) else "-"
        base = mm.get("rss_baseline_bytes")
        rows_m = [("budget", mb("budget_bytes")), ("plan: predicted peak", mb("predicted_peak_bytes")),
                  ("arena (accounting: the program's offsets, allocated once)", mb("arena_bytes")),
                  ("measured: process RSS before Trainer(...)", mb("rss_before_trainer_bytes")),
                  ("measured: process RSS after set-up", mb("rss_after_setup_bytes")),
                  (f"measured: process RSS peak of the steps ({mm.get('peak_method', '')})",
                   mb("rss_steps_peak_bytes")),
                  ("measured: growth during the steps (peak - after set-up)", mb("rss_growth_steps_bytes")),
                  ("measured: total growth (steps' peak - before Trainer)", mb("rss_growth_total_bytes")),
                  ("module weights (moved into the arena: out of the baseline)", mb("module_weight_bytes"))]
        if rss_peak is not None and base is not None:
            rows_m.append(("measured: training memory = steps' peak - (RSS before Trainer - module weights); "
                           "compare with the predicted peak and the budget", f"{rss_peak / 2**20:.1f} MiB"))
        parts.append("<table>" + "".join(f"<tr><th>{esc(k)}</th><td class='num'>{v}</td></tr>"
                                         for k, v in rows_m) + "</table>")
    parts.append(f"<h2>Ops on accelerators</h2><img src='data:image/png;base64,{gp}'>")
    if gm:
        parts.append(f"<img src='data:image/png;base64,{gm}'>")
    parts.append(f"<h2>Flagged ops ({len(flags)}): measured time off the prediction by more than "
                 f"{threshold:.0%} and by more than {bar:.3f} ms ({FLAG_STEP_FRACTION:.0%} of the step, at least "
                 f"{FLAG_MIN_MS} ms)</h2>")
    if flags:
        parts.append("<ul>" + "".join(f"<li>{esc(r.op)} ({esc(r.kind)} on {esc(r.accelerator)}/{esc(r.variant)}): "
                                      f"predicted {r.predicted_ms:.3f} ms, measured {r.measured_ms:.3f} ms "
                                      f"({esc(r.describe_error())})</li>" for r in flags) + "</ul>")
    parts.append("<h2>Placement</h2><table><tr><th>op</th><th>kind</th><th>phase</th><th>accelerator</th>"
                 "<th>variant</th><th>predicted ms</th><th>measured ms</th><th>error</th></tr>")
    for r in rows:
        cls = " class='flag'" if r.op in flag_names else ""
        m = f"{r.measured_ms:.3f}" if r.measured_ms is not None else "-"
        e = r.describe_error()
        parts.append(f"<tr{cls}><td>{esc(r.op)}</td><td>{esc(r.kind)}</td><td>{esc(r.phase)}</td>"
                     f"<td>{esc(r.accelerator)}</td><td>{esc(r.variant)}</td><td class='num'>{r.predicted_ms:.3f}</td>"
                     f"<td class='num'>{m}</td><td class='num'>{e}</td></tr>")
    parts.append("</table></body></html>")
    atomic_write_text(path, "\n".join(parts))
    return flags
