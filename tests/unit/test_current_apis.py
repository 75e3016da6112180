"""PORT calls current APIs only: pyproject's pytest config makes a deprecation whose origin is port.* an error,
and the calls that used deprecated APIs (PuLP's LpVariable/PULP_CBC_CMD) run clean with every warning an error."""
from __future__ import annotations

import warnings

import pytest


@pytest.mark.parametrize("category", [DeprecationWarning, PendingDeprecationWarning, FutureWarning])
def test_a_deprecation_from_port_fails_the_test_run(category):
    with pytest.raises(category):
        warnings.warn_explicit("old API", category, "port/solver/backends.py", 1, module="port.solver.backends")
    # another package's deprecation is not PORT's to fix: reported, not raised
    with warnings.catch_warnings(record=True):
        warnings.warn_explicit("old API", category, "x.py", 1, module="portable.x")


def test_cbc_through_the_api_pulp_4_keeps():
    from port.solver import backends as B
    from port.solver.formulation import Model
    m = Model()
    x, y = m.var("x"), m.var("y", 0, 5, integer=False)
    m.row("cover", {x: 1.0, y: 1.0}, lo=2.5)
    m.obj = {x: 1.0, y: 2.0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = B.solve_cbc(m, 5, 0.0, start=[1.0, 1.5])
    assert r.status == "optimal" and r.objective == pytest.approx(4.0) and r.values == pytest.approx([1.0, 1.5])


def test_no_cbc_executable_is_a_config_error_naming_the_fix(monkeypatch):
    import pulp

    from port.errors import ConfigError
    from port.solver import backends as B
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.setattr(pulp.apis.coin_api, "pulp_cbc_path", "/nonexistent/cbc", raising=False)
    with pytest.raises(ConfigError, match="coinor-cbc"):
        B.cbc_executable()
