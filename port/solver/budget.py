"""port.solver.budget: THE budget rule, the one place every path (``port.solve``, the pipeline's commands,
federated clients, benchmarks) turns a budget into bytes.

A budget is given in one syntax (port.config.parse_budget): bytes, a size (``64MB``, ``1.5GiB``) or ``NN%``.

* ``NN%``: of the **keep-everything peak**, the simulated peak memory of the plan that keeps every activation
  and runs every op plain on one accelerator (what PyTorch eager holds; :func:`keep_everything`). More exactly:
  the keep-everything plan's engine footprint (code pages and caches of the engine: a fixed cost no plan
  shrinks) plus NN% of the rest of that peak, so a percentage scales what a plan decides.
* none: **the device's memory**, from the device description (``memory:`` in ``configs/devices/<name>.yaml``)
  when the caller has it (every pipeline command: the job's device), else the memory the profile records
  (``Profile.memory_bytes``: the description's figure when the profile was measured or modeled). The
  description wins because it is what the user states now: a profile file measured under an earlier
  description (or merged from several, which keeps the largest) may carry another figure.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from port.errors import ConfigError, PortError

if TYPE_CHECKING:
    from port.cost.types import Profile
    from port.ir.types import Graph
    from port.plan.types import Plan


def keep_everything(graph: "Graph", profile: "Profile") -> tuple[int, int]:
    """(peak, engine bytes) of the plan that keeps every activation and runs every op plain on one accelerator
    (the profile's first that runs them all) -- what PyTorch eager holds: its simulated peak memory and, within
    it, the resident footprint of its engine (port.plan.semantics.engine_bytes; 0 when the profile records none)."""
    from port.plan.semantics import engine_bytes
    from port.solver.baselines import solve_single
    err: Exception | None = None
    for acc in profile.accelerators:
        try:
            plan = solve_single(graph, profile, 10**15, accelerator=acc)
        except PortError as e:     # this accelerator cannot run every op: try the next
            err = e
            continue
        return int(plan.predicted_peak_bytes), int(engine_bytes(plan, profile))
    raise PortError(f"no accelerator of {profile.device!r} runs every op of {graph.name!r}: {err}")


def keep_everything_peak(graph: "Graph", profile: "Profile") -> int:
    """THE keep-everything peak (keep_everything's first figure)."""
    return keep_everything(graph, profile)[0]


def device_memory(profile: "Profile", device: Any = None) -> int:
    """The budget when none is given: ``device``'s memory (a port.config.DeviceConfig) when given, else the
    device memory ``profile`` records. ConfigError when neither is known."""
    mem = int(device.memory) if device is not None else int(profile.memory_bytes or 0)
    if mem <= 0:
        where = (f"device {device.name!r} has memory {device.memory!r}" if device is not None else
                 f"the profile of {profile.device!r} records no device memory (memory_bytes)")
        raise ConfigError(f"no budget given and the device memory is unknown ({where}); give a budget such as "
                          f"64MB or 75%")
    return mem


def to_bytes(spec: int | str | None, keep_everything_peak: int | None, memory: int | None,
             engine_bytes: int = 0) -> int:
    """A parsed budget in bytes: sizes as they are; ``NN%``: ``engine_bytes`` (the keep-everything plan's engine
    footprint, within its peak) + NN% of the rest of ``keep_everything_peak``; None: ``memory`` (the device's,
    :func:`device_memory`)."""
    if spec is None:
        if not memory:
            raise ConfigError("no budget given and the device memory is unknown; give a budget such as 64MB or 75%")
        return int(memory)
    if isinstance(spec, str):
        if keep_everything_peak is None:
            raise ValueError("a percentage budget needs the keep-everything peak")
        return int(engine_bytes + (keep_everything_peak - engine_bytes) * float(spec[:-1]) / 100)
    return int(spec)


def parse(budget: Any, what: str = "budget") -> int | str | None:
    """port.config.parse_budget_option (``what`` named in a ConfigError); None stays None."""
    from port.config import parse_budget_option
    return None if budget is None else parse_budget_option(budget, what)


def resolve(budget: Any, graph: "Graph", profile: "Profile", device: Any = None, *,
            with_peak: bool = False) -> tuple[int, int | None, int]:
    """(bytes, keep-everything peak, its engine bytes) of ``budget`` in any accepted form (see the module
    docstring). The peak is computed when the budget is a percentage or ``with_peak`` (else None, 0)."""
    spec = parse(budget)
    peak, eng = keep_everything(graph, profile) if with_peak or isinstance(spec, str) else (None, 0)
    mem = device_memory(profile, device) if spec is None else None
    return to_bytes(spec, peak, mem, engine_bytes=eng), peak, eng


def budget_bytes(budget: Any, graph: "Graph", profile: "Profile", device: Any = None) -> int:
    """A budget in any accepted form (bytes, "64MB", "1.5GiB", "75%", None: the device memory) -> bytes."""
    return resolve(budget, graph, profile, device)[0]


def arena_bytes(graph: "Graph", profile: "Profile", plan: "Plan") -> int | None:
    """What the executor holds for ``plan`` in the budget's terms: its lowered training program's arena (packed
    offsets) plus the engines' resident footprint (port.plan.semantics.engine_bytes). None where this machine
    cannot lower the plan (an accelerator without a known backend whose variants the C backend does not share)."""
    from port.errors import PlanError
    from port.lower.lower import ACCELERATOR_BACKENDS, lower
    from port.plan.semantics import engine_bytes
    stand_in = {a: "c" for a in profile.accelerators if a not in ACCELERATOR_BACKENDS}   # modeled: priced as C
    try:
        prog = lower(graph, plan, accelerators=stand_in, check=False)
    except PlanError:
        return None
    return prog.arena_bytes + engine_bytes(plan, profile)
