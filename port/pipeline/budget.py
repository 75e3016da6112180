"""Step 4: the budget in bytes, with the keep-everything peak it is measured against (printed by every
command). The rule itself (percentages, and no budget: the device's memory) is port.solver.budget's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from port.pipeline.common import KEEP_EVERYTHING
from port.pipeline.job import Job


@dataclass(frozen=True)
class Budget:
    bytes: int
    spec: int | str | None            # as parsed: bytes, "NN%" or None (device memory)
    origin: str                       # "--budget", "<config>: key 'budget'", ...
    keep_everything_peak: int
    engine_bytes: int = 0             # the keep-everything plan's engine footprint (within its peak)

    def describe(self) -> str:
        from port.config import format_size
        pct = self.bytes / self.keep_everything_peak if self.keep_everything_peak else float("nan")
        if isinstance(self.spec, str):
            what = f"{self.spec} of the {KEEP_EVERYTHING}" + (
                f"'s training memory {format_size(self.keep_everything_peak - self.engine_bytes)} + its engine's "
                f"resident {format_size(self.engine_bytes)}" if self.engine_bytes else "")
        else:
            what = f"{pct:.0%} of the {KEEP_EVERYTHING}"
        return f"budget {format_size(self.bytes)} ({self.bytes} B; {what}; from {self.origin})"

    def peak_line(self) -> str:
        from port.config import format_size
        return (f"{KEEP_EVERYTHING} {format_size(self.keep_everything_peak)} ({self.keep_everything_peak} B: every "
                f"activation kept, every op plain on one accelerator; what PyTorch eager holds)")


def resolve_budget(job: Job, graph: Any, profile: Any) -> Budget:
    """The job's budget in bytes (port.solver.budget.resolve: no budget is the job's device memory)."""
    from port.solver.budget import resolve
    b, peak, eng = resolve(job.budget, graph, profile, job.device, with_peak=True)
    return Budget(b, job.budget, job.budget_origin, int(peak or 0), eng)
