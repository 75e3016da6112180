"""Profiling: measured op costs on present accelerators, roofline costs for the rest.

    prof = port.profile.profile(graph, "host")            # or a DeviceConfig
    save_profile(prof, "profiles/host/model.json"); load_profile(path, device="host")
    merge_profiles([a, b]) ; calibrate(graph, device, prof)

Runners (shared with the executor): ``get_runner(backend, graph, threads) -> Runner`` with
``prepare(op, variant) -> PreparedOp`` (callable ``run()``, ``.workspace_bytes``) and ``sync()``.
"""
from __future__ import annotations

from .calibrate import Calibration, apply_calibration, calibrate, load_calibration, save_calibration
from .core import ProfileReport, entry_keys, host_info, profile, profile_with_report
from .io import load_profile, merge_profiles, profile_from_dict, profile_to_dict, save_profile
from .runners import PreparedOp, Runner, TorchRunner, backend_available, get_runner

__all__ = ["profile", "profile_with_report", "ProfileReport", "entry_keys", "host_info", "load_profile",
           "save_profile", "merge_profiles", "profile_to_dict", "profile_from_dict", "calibrate", "Calibration",
           "save_calibration", "load_calibration", "apply_calibration", "get_runner", "backend_available",
           "Runner", "PreparedOp", "TorchRunner"]


# `port.profile` is both this package and the function: importing any submodule makes the attribute
# `port.profile` the package, so the package itself is callable and `port.profile(graph, device)` works
# either way.
import sys as _sys
import types as _types


class _CallableModule(_types.ModuleType):
    def __call__(self, graph, device, **kw):
        return profile(graph, device, **kw)


_sys.modules[__name__].__class__ = _CallableModule
