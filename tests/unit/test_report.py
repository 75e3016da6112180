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


def test_flag_rule_needs_relative_and_absolute_error():
    """Flagged only when off by > 25% AND by > max(1% of the step, 0.05 ms); chain members go with their chain;
    an op priced at 0 is 'unpriced', never a "+113404%" line."""
    rs = [OpRow("big", "c", "conv2d", "forward", "cpu-c", "plain", 10.0, 10.5),               # +5%: no
          OpRow("small", "r", "relu", "forward", "cpu-c", "plain", 0.04, 0.08),             # +100% but 0.04 ms
          OpRow("mid", "b", "batch_norm2d", "forward", "cpu-c", "plain", 0.5, 0.8),         # +60%, 0.3 ms > 0.1
          OpRow("bn", "b", "batch_norm2d", "forward", "cpu-c", "fused", 0.0, None, chain="conv"),
          OpRow("zero", "v", "add", "forward", "cpu-c", "plain", 0.0, 0.4)]                 # unpriced
    names = [r.op for r in flagged(rs)]
    assert names == ["mid", "zero"]
    assert rs[4].unpriced and rs[4].error is None and rs[4].describe_error() == "unpriced"
    assert rs[3].describe_error() == "in conv's chain"
    # 1% of a 100 ms step is 1 ms: the 0.3 ms miss no longer matters
    assert [r.op for r in flagged(rs, step_ms=100.0)] == []


def test_report_shows_unpriced_not_a_percentage(tmp_path):
    rs = rows() + [OpRow("zero", "v", "add", "forward", "cpu-c", "plain", 0.000001, 1.2)]
    out = tmp_path / "r.html"
    flags = render_report(out, "run", rs, [1, 2], None, None)
    text = out.read_text()
    assert "zero" in [r.op for r in flags] and "unpriced" in text and "%)" not in text.split("zero")[1][:120]
