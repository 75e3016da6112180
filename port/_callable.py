"""Make a stage module callable, so ``port.solve(...)``, ``port.profile(...)`` and ``port.simulate(...)`` work
as functions while ``port.solve`` etc. stay importable packages/modules (importing a submodule rebinds the
parent package's attribute to the module, so a plain function of the same name would be shadowed)."""
from __future__ import annotations

import sys
import types


def make_callable(module_name: str, function_name: str) -> None:
    mod = sys.modules[module_name]

    class _CallableModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return getattr(self, function_name)(*args, **kwargs)

    _CallableModule.__name__ = f"CallableModule[{module_name}]"
    _CallableModule.__call__.__doc__ = getattr(mod, function_name).__doc__
    mod.__class__ = _CallableModule
