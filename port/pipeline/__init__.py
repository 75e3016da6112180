"""port.pipeline: config -> model -> graph -> profile -> plan (-> training run), the one path every command takes.

    job    = load_job("configs/default.yaml", budget="50%")   # Job: config, device, profile location, budget
    built  = build_graph(job)                                 # Built: model, example input, traced graph
    prof   = get_profile(job, built.graph)                    # ProfileStep: read, measured now, or modeled
    budget = resolve_budget(job, built.graph, prof.profile)   # Budget: bytes, with the keep-everything peak
    solved = solve_plan(job, built, prof, budget)             # Solved: the plan and its simulation
    result = run_training("configs/default.yaml")             # TrainResult (`port train`: all of the above)

`port inspect`, `profile`, `solve`, `show`, `train` and `demo` are thin wrappers around these functions; the
frozen dataclasses between the steps are what they print. One module per step:

    job.py       config -> Job (the location rule of profiles, the budget as given)
    build.py     Job -> model, training graph, data
    profiles.py  graph -> profile (read, measured now, or modeled; `port profile`, --replan's correction)
    budget.py    the budget in bytes and the keep-everything peak (the rule: port.solver.budget)
    solve.py     profile + budget -> plan (one per memory), the plan file, its summary
    train.py     the training run (`port train`); runs.py: the run directory's files and measurements
    compile.py   `port compile`: a port-rt bundle
Helpers only one command uses live with that command (port/cli/inspect.py, solve.py's `show`, train.py's
`report`).

**Where a profile is** (the one rule): ``profiles/<device>/<config name>.json`` under the working directory
(``<config name>`` is the config's ``name`` key, ``<device>`` the device's ``name``), unless ``--profile PATH``
(``profile=`` here) names another file. ``port profile`` writes it; ``port solve`` and ``port train`` read it.
When it is missing, does not cover the graph, or was measured on another CPU model, the commands measure it
now (with a progress bar, reusing what still applies) and write it there. A file given with ``--profile`` is
never rewritten: if it is missing or does not cover the graph, the command stops and says so. A device with no
accelerator present on this machine (e.g. ``raspberry-pi-4b``) uses the file when one exists (measured there and
copied here) and the roofline model otherwise, and the commands say so; a device with present accelerators never
silently falls back to the roofline.

**Budgets** (one syntax: config key ``budget``, ``--budget``, ``port.solve(..., budget=...)``): bytes, a size
(``64MB``, ``1.5GiB``) or ``NN%`` of the **keep-everything peak**: the simulated peak memory of the plan that
keeps every activation and runs every op plain on one accelerator, which is what PyTorch eager holds
(port.solver.budget.keep_everything_peak, the one definition). No budget: the device's memory (the device
description's; port.solver.budget holds the whole rule, which `port.solve` uses too).
"""
from __future__ import annotations

from typing import Any

from port.pipeline.common import KEEP_EVERYTHING, PROFILE_DIR, PROFILE_MAX_TIME_S, Echo, Interrupted  # noqa: F401
from port.pipeline.job import (Job, fixed_threads, load_job, parse_budget_option, parse_shape,  # noqa: F401
                               profile_location, stand_in_backends)
from port.pipeline.build import (Built, build_graph, factory_dir, import_factory, load_data,  # noqa: F401
                                 load_model, scoped_path)
from port.pipeline.profiles import (ProfileStep, find_profile, get_profile, measure_profile,  # noqa: F401
                                    merge_profile_files, optimizer_kwargs, outdated_format, present_accelerators,
                                    profile_to_file, remeasure, replan_profile, reusable_profile, stale_reason,
                                    uncovered)
from port.pipeline.budget import Budget, resolve_budget  # noqa: F401
from port.pipeline.solve import Solved, memory_groups, plan_summary, save_plan_file, solve_plan  # noqa: F401
from port.pipeline.runs import (align_timeline, build_report, measure_steps, read_measured,  # noqa: F401
                                wall_step_ms)
from port.pipeline.train import TrainResult, run_training  # noqa: F401
from port.pipeline.compile import Compiled, c_only_profile, compile_bundle  # noqa: F401

# the budget rule's functions, under the names this module has always had (imported on first use: the solver
# package is not imported by `import port.pipeline`)
_BUDGET_RULE = ("keep_everything", "keep_everything_peak", "budget_bytes")


def __getattr__(name: str) -> Any:
    if name in _BUDGET_RULE:
        from port.solver import budget
        return getattr(budget, name)
    raise AttributeError(f"module 'port.pipeline' has no attribute {name!r}")
