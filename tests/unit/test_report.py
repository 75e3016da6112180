"""The run report: flags and a self-contained page."""
from __future__ import annotations

from port.train.report import OpRow, flagged, render_report


def rows():
    return [
        OpRow("conv1", "conv1", "conv2d", "forward", "cpu-c", "plain", 1.0, 1.1),
        OpRow("bn1", "bn1", "batch_norm2d", "forward", "cpu-torch", "plain", 0.5, 0.9),     # +80%: flagged
        OpRow("view", "flatten", "reshape", "forward", "cpu-c", "plain", 0.0, None),
        OpRow("tiny", "relu", "relu", "forward", "cpu-c", "inplace", 0.001, 0.01),         # below resolution
        OpRow("fc.grad_weight", "fc", "linear.grad_weight", "backward", "cpu-c", "plain", 2.0, 1.4),  # -30%
    ]


def test_flagged_threshold_and_resolution():
    names = [r.op for r in flagged(rows())]
    assert names == ["bn1", "fc.grad_weight"]
    assert [r.op for r in flagged(rows(), threshold=0.9)] == []


def test_render_report(tmp_path):
    out = tmp_path / "report.html"
    flags = render_report(out, "run", rows(), [10, 20, 30], [11, 19, 29], 40, {"step time": "3 ms"})
    text = out.read_text()
    assert len(flags) == 2
    assert text.count("data:image/png;base64,") == 3          # memory, predicted Gantt, measured Gantt
    assert "class='flag'" in text and "bn1" in text and "step time" in text
