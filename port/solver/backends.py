"""Hand a ``formulation.Model`` to a MILP/CP solver; read back values, objective, bound and status.

highs: highspy directly (the HiGHS behind ``pulp.HiGHS``; used directly so that the greedy warm start can
be passed with ``setSolution`` and the bound read from ``getInfo()``); cbc: pulp + CBC through the API PuLP 4.0
keeps (``prob.add_variable``, ``COIN_CMD`` on the executable :func:`cbc_executable` finds; bound parsed from
CBC's log, since pulp reports "Optimal" when CBC stops at the gap limit); scip: OR-Tools pywraplp SCIP;
cpsat: OR-Tools CP-SAT (integer coefficients: bytes exact, milliseconds scaled by TIME_SCALE).
"""
from __future__ import annotations

import math
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from port.solver.formulation import Model

TIME_SCALE = 10_000          # CP-SAT objective units per ms (0.1 us)
INF = float("inf")


@dataclass
class Result:
    status: str                     # optimal | feasible | infeasible | timeout (no solution) | error
    values: list[float] | None
    objective: float | None         # in model units, true (unscaled) coefficients
    bound: float | None
    solve_time_s: float
    backend: str

    @property
    def gap(self) -> float:
        if self.objective is None or self.bound is None:
            return float("inf")
        if self.status == "optimal" and self.bound >= self.objective - 1e-9 * max(1.0, abs(self.objective)):
            return 0.0
        return max(0.0, (self.objective - self.bound) / max(abs(self.objective), 1e-12))


def _true_objective(m: Model, vals: list[float]) -> float:
    """The objective of the plan the values describe: integer variables rounded as the plan extraction rounds
    them (a solver may return a binary within its integrality tolerance, e.g. 1e-6, and times a large cost such
    a residue would price a decision the plan does not take)."""
    return sum(c * (round(vals[j]) if m.integer[j] else vals[j]) for j, c in m.obj.items())


def _arrays(m: Model):
    import numpy as np
    starts, idx, val, lo, hi = [], [], [], [], []
    for _name, terms, l, h in m.rows:
        starts.append(len(idx))
        for k, c in terms.items():
            idx.append(k)
            val.append(c)
        lo.append(l)
        hi.append(h)
    return (np.array(starts, dtype=np.int32), np.array(idx, dtype=np.int32), np.array(val, dtype=np.float64),
            np.array(lo, dtype=np.float64), np.array(hi, dtype=np.float64))


def _highs_model(m: Model, mip: bool = True):
    import highspy
    import numpy as np
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("random_seed", 0)
    n = m.num_vars
    inf = highspy.kHighsInf
    lb = np.array([(-inf if math.isinf(x) else x) for x in m.lb], dtype=np.float64)
    ub = np.array([(inf if math.isinf(x) else x) for x in m.ub], dtype=np.float64)
    cost = np.zeros(n)
    for j, c in m.obj.items():
        cost[j] = c
    h.addCols(n, cost, lb, ub, 0, np.array([], dtype=np.int32), np.array([], dtype=np.int32), np.array([]))
    starts, idx, val, lo, hi = _arrays(m)
    lo = np.where(np.isinf(lo), -inf, lo)
    hi = np.where(np.isinf(hi), inf, hi)
    h.addRows(len(m.rows), lo, hi, len(idx), starts, idx, val)
    if mip:
        ints = [j for j in range(n) if m.integer[j]]
        if ints:
            h.changeColsIntegrality(len(ints), np.array(ints, dtype=np.int32),
                                    np.array([highspy.HighsVarType.kInteger] * len(ints)))
    return h


def solve_lp(m: Model, fixed: dict[int, float] | None = None) -> list[float] | None:
    """The LP relaxation of ``m`` with the columns of ``fixed`` fixed at their values: its optimal values (None
    when it has no optimum)."""
    import highspy
    h = _highs_model(m, mip=False)
    for j, val in (fixed or {}).items():
        h.changeColBounds(j, val, val)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return list(h.getSolution().col_value)


def complete_solution(m: Model, fixed: dict[int, float]) -> list[float] | None:
    """Fix the given integer values (every other integer column at 0) and solve the remaining LP: a full start
    vector (or None if infeasible)."""
    return solve_lp(m, {**{j: 0.0 for j in range(m.num_vars) if m.integer[j]}, **fixed})


_HIGHS_THREADS: list[int | None] = [None]    # the thread count HiGHS's global scheduler was last set up for


def _highs_threads(h, threads: int | None) -> None:
    """Run ``h`` on ``threads`` threads (None: HiGHS's default). HiGHS keeps ONE task scheduler per process,
    created by the first solve; a later solve asking for another thread count fails with model status
    "not set" (its log says: global scheduler already initialized) unless the scheduler is reset first."""
    want = int(threads) if threads else None
    if want != _HIGHS_THREADS[0]:
        h.resetGlobalScheduler(True)
        _HIGHS_THREADS[0] = want
    if want:
        h.setOptionValue("threads", want)


def solve_highs(m: Model, time_limit_s: float, gap: float, start: list[float] | None = None,
                threads: int | None = None, target: float | None = None) -> Result:
    """``target``: stop at the first solution with objective <= target (HiGHS's objective_target; status
    "feasible"), e.g. the first plan within a memory budget in the min-peak model."""
    import highspy
    h = _highs_model(m)
    if target is not None:
        h.setOptionValue("objective_target", float(target))
    h.setOptionValue("time_limit", float(max(time_limit_s, 0.01)))
    h.setOptionValue("mip_rel_gap", float(gap))
    # tighter than HiGHS's 1e-7: with the defaults, presolve proved a worse incumbent optimal on resnet8's
    # model (15.67 ms, bound 15.67; CBC and HiGHS without presolve find 15.65 ms): tests/unit/test_solve.py
    h.setOptionValue("primal_feasibility_tolerance", 1e-9)
    h.setOptionValue("dual_feasibility_tolerance", 1e-9)
    _highs_threads(h, threads)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(start)
        sol.value_valid = True
        h.setSolution(sol)
    t0 = time.perf_counter()
    h.run()
    info = h.getInfo()
    has = info.primal_solution_status == 2
    vals = list(h.getSolution().col_value) if has else None
    if start is not None and vals is not None and _stale_start(m, vals, info.objective_function_value):
        # HiGHS 1.16 with a start that its presolve improves ("MIP start solution is feasible in the reduced
        # space" at a lower objective) can return that start's columns unchanged while reporting the improved
        # objective as optimal (tests/unit/test_solve.py: 0.568 ms returned, 0.438 reported and optimal). The
        # same model without presolve maps the start as given.
        left = time_limit_s - (time.perf_counter() - t0)
        if left > 0.05:
            h.setOptionValue("presolve", "off")
            h.setOptionValue("time_limit", float(left))
            h.setSolution(sol)
            h.run()
            info = h.getInfo()
            has = info.primal_solution_status == 2
            if has:
                vals = list(h.getSolution().col_value)
    dt = time.perf_counter() - t0
    st = h.getModelStatus()
    S = highspy.HighsModelStatus
    if st == S.kOptimal:
        status = "optimal"
    elif st == S.kInfeasible:
        status = "infeasible"
    elif has:
        status = "feasible" if st != S.kTimeLimit else "timeout"
    else:
        status = "timeout" if st == S.kTimeLimit else "error"
    obj = _true_objective(m, vals) if vals else None
    bound = info.mip_dual_bound if vals is not None and not math.isinf(info.mip_dual_bound) else None
    if status == "optimal" and bound is None:
        bound = obj
    if status == "optimal" and obj is not None and obj - bound > gap * abs(obj) + 1e-6 * max(1.0, abs(obj)):
        status = "feasible"     # the values returned are not the solution HiGHS proved (see above); 1e-6:
        #                         HiGHS's own absolute and relative gap tolerances at gap 0
    return Result(status, vals, obj, bound, dt, "highs")


def _stale_start(m: Model, vals: list[float], reported: float) -> bool:
    """Whether the returned values price above the objective HiGHS reports for them (beyond its tolerances)."""
    obj = _true_objective(m, vals)
    return obj > reported + 1e-6 * max(1.0, abs(reported))


def to_pulp(m: Model, name: str = "port_solve"):
    import pulp
    prob = pulp.LpProblem(name, pulp.LpMinimize)
    xs = [prob.add_variable(n, lowBound=None if math.isinf(l) else l, upBound=None if math.isinf(u) else u,
                            cat="Integer" if i else "Continuous")
          for n, l, u, i in zip(m.names, m.lb, m.ub, m.integer)]
    prob += pulp.LpAffineExpression([(xs[j], c) for j, c in m.obj.items()])
    for name_, terms, lo, hi in m.rows:
        e = pulp.LpAffineExpression([(xs[k], c) for k, c in terms.items()])
        if lo == hi:
            prob += pulp.LpConstraint(e, pulp.LpConstraintEQ, name_, lo)
        else:
            if not math.isinf(lo):
                prob += pulp.LpConstraint(e, pulp.LpConstraintGE, name_ + ("_lo" if not math.isinf(hi) else ""), lo)
            if not math.isinf(hi):
                prob += pulp.LpConstraint(e, pulp.LpConstraintLE, name_ + ("_hi" if not math.isinf(lo) else ""), hi)
    return prob, xs


def write_lp(m: Model, path: str) -> None:
    prob, _ = to_pulp(m)
    prob.writeLP(path)


def cbc_executable() -> str:
    """The CBC executable for pulp.COIN_CMD: ``cbc`` on PATH (Debian's coinor-cbc), else the copy PuLP 3.x bundles
    (PuLP 4.0 drops it, with the deprecated PULP_CBC_CMD that ran it). Raises ConfigError naming the fixes."""
    import shutil

    import pulp
    found = shutil.which("cbc")
    if found:
        return found
    bundled = getattr(pulp.apis.coin_api, "pulp_cbc_path", None)
    if bundled and os.path.isfile(bundled) and os.access(bundled, os.X_OK):
        return os.path.realpath(bundled)
    from port.errors import ConfigError
    raise ConfigError("solver 'cbc': no CBC executable found (no `cbc` on PATH, and this PuLP bundles none); "
                      "install one (apt-get install coinor-cbc) or choose another solver (highs, scip, cpsat)")


def solve_cbc(m: Model, time_limit_s: float, gap: float, start: list[float] | None = None,
              threads: int | None = None) -> Result:
    import pulp
    prob, xs = to_pulp(m)
    if start is not None:
        for x, v in zip(xs, start):
            x.setInitialValue(round(v) if x.cat == "Integer" else v)
    fd, log = tempfile.mkstemp(suffix=".log", prefix="port_cbc_")
    os.close(fd)
    try:
        cmd = pulp.COIN_CMD(path=cbc_executable(), msg=False, timeLimit=max(1, int(math.ceil(time_limit_s))),
                            gapRel=gap, warmStart=start is not None, threads=threads, logPath=log)
        t0 = time.perf_counter()
        prob.solve(cmd)
        dt = time.perf_counter() - t0
        text = Path(log).read_text(errors="replace") if os.path.exists(log) else ""
    finally:
        if os.path.exists(log):
            os.remove(log)
    has = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    vals = [x.value() if x.value() is not None else 0.0 for x in xs] if has else None
    obj = _true_objective(m, vals) if vals else None
    bound = None
    mb = re.search(r"Lower bound:\s*([-0-9.eE+]+)", text)
    if mb:
        bound = float(mb.group(1))
    stopped = "Stopped on time" in text or "Stopped on" in text
    if prob.status == pulp.LpStatusInfeasible or "infeasible" in text.lower() and not has:
        status = "infeasible"
    elif has:
        status = "optimal" if ("Optimal solution found" in text and "gap" not in text.split("Result -")[-1].splitlines()[0].lower()) else "feasible"
        if stopped:
            status = "timeout"
    else:
        status = "timeout" if stopped or dt >= time_limit_s else "error"
    if bound is None and status == "optimal":
        bound = obj
    res = Result(status, vals, obj, bound, dt, "cbc")
    if res.status == "feasible" and res.gap <= 1e-9:
        res.status = "optimal"
    return res


def _solve_scip_inproc(m: Model, time_limit_s: float, gap: float, start: list[float] | None = None,
               threads: int | None = None) -> Result:
    from ortools.linear_solver import pywraplp
    s = pywraplp.Solver.CreateSolver("SCIP")
    if s is None:
        return Result("error", None, None, None, 0.0, "scip")
    inf = s.infinity()
    xs = [(s.IntVar if i else s.NumVar)(-inf if math.isinf(l) else l, inf if math.isinf(u) else u, n)
          for n, l, u, i in zip(m.names, m.lb, m.ub, m.integer)]
    for name_, terms, lo, hi in m.rows:
        c = s.RowConstraint(-inf if math.isinf(lo) else lo, inf if math.isinf(hi) else hi, name_)
        for k, v in terms.items():
            c.SetCoefficient(xs[k], v)
    o = s.Objective()
    for j, c in m.obj.items():
        o.SetCoefficient(xs[j], c)
    o.SetMinimization()
    s.SetTimeLimit(int(max(time_limit_s, 0.01) * 1000))
    s.SetSolverSpecificParametersAsString(f"limits/gap = {gap}\nrandomization/randomseedshift = 0\n")
    if start is not None:
        s.SetHint(xs, [float(v) for v in start])
    t0 = time.perf_counter()
    st = s.Solve()
    dt = time.perf_counter() - t0
    has = st in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE)
    vals = [x.solution_value() for x in xs] if has else None
    obj = _true_objective(m, vals) if vals else None
    bound = o.BestBound() if has else None
    if st == pywraplp.Solver.OPTIMAL:
        status = "optimal"
    elif st == pywraplp.Solver.INFEASIBLE:
        status = "infeasible"
    elif has:
        status = "timeout" if dt >= time_limit_s * 0.95 else "feasible"
    else:
        status = "timeout" if dt >= time_limit_s * 0.95 else "error"
    res = Result(status, vals, obj, bound, dt, "scip")
    if status == "optimal" and res.gap > gap + 1e-9:
        res.status = "feasible"
    return res


def _solve_cpsat_inproc(m: Model, time_limit_s: float, gap: float, start: list[float] | None = None,
                threads: int | None = None) -> Result:
    """Needs a model built with mem_unit=1 (integer byte coefficients)."""
    from ortools.sat.python import cp_model
    cm = cp_model.CpModel()
    BIG = 2 ** 50
    xs = []
    for n, l, u, i in zip(m.names, m.lb, m.ub, m.integer):
        lo = -BIG if math.isinf(l) else int(math.floor(l + 1e-9))
        hi = BIG if math.isinf(u) else int(math.floor(u + 1e-9))
        xs.append(cm.NewIntVar(lo, max(lo, hi), n))
    for name_, terms, lo, hi in m.rows:
        coefs = {}
        for k, v in terms.items():
            iv = int(round(v))
            if abs(iv - v) > 1e-6:
                raise ValueError(f"CP-SAT row {name_} has a fractional coefficient {v}: build with mem_unit=1")
            coefs[k] = iv
        expr = sum(c * xs[k] for k, c in coefs.items())
        l = -BIG if math.isinf(lo) else int(math.ceil(lo - 1e-9))
        h = BIG if math.isinf(hi) else int(math.floor(hi + 1e-9))
        cm.AddLinearConstraint(expr, l, h)
    scale = TIME_SCALE if any(abs(c - round(c)) > 1e-9 for c in m.obj.values()) else 1
    cm.Minimize(sum(int(round(c * scale)) * xs[j] for j, c in m.obj.items()))
    if start is not None:
        for x, v, i in zip(xs, start, m.integer):
            cm.AddHint(x, int(round(v)))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(max(time_limit_s, 0.01))
    solver.parameters.num_workers = int(threads or 8)
    solver.parameters.relative_gap_limit = float(gap)
    solver.parameters.random_seed = 0
    t0 = time.perf_counter()
    st = solver.Solve(cm)
    dt = time.perf_counter() - t0
    has = st in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    vals = [float(solver.Value(x)) for x in xs] if has else None
    obj = _true_objective(m, vals) if vals else None
    bound = None
    if has:
        # the scaled bound, brought back to model units (rounding of coefficients: <= 0.5/scale per term)
        bound = solver.BestObjectiveBound() / scale
        scaled_obj = solver.ObjectiveValue() / scale
        bound = min(bound - (scaled_obj - obj if scaled_obj > obj else 0.0), obj)
    if st == cp_model.OPTIMAL:
        status = "optimal"
    elif st == cp_model.INFEASIBLE:
        status = "infeasible"
    elif has:
        status = "timeout" if dt >= time_limit_s * 0.95 else "feasible"
    else:
        status = "timeout" if dt >= time_limit_s * 0.95 else "error"
    res = Result(status, vals, obj, bound, dt, "cpsat")
    if status == "optimal" and res.gap > gap + 1e-6:
        res.status = "feasible"
    return res


def _in_child(backend: str, m: Model, time_limit_s: float, gap: float, start, threads) -> Result:
    import pickle
    import subprocess
    import sys
    payload = pickle.dumps((backend, m, time_limit_s, gap, start, threads))
    guard = time_limit_s * 1.5 + 20.0
    t0 = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-m", "port.solver._worker"], input=payload, capture_output=True,
                             timeout=guard, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                 [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]
                                 + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))})
    except subprocess.TimeoutExpired:
        return Result("timeout", None, None, None, time.perf_counter() - t0, backend)
    if out.returncode != 0:
        raise RuntimeError(f"{backend} worker failed: {out.stderr.decode(errors='replace')[-2000:]}")
    return pickle.loads(out.stdout)


def solve_scip(m: Model, time_limit_s: float, gap: float, start=None, threads=None) -> Result:
    return _in_child("scip", m, time_limit_s, gap, start, threads)


def solve_cpsat(m: Model, time_limit_s: float, gap: float, start=None, threads=None) -> Result:
    return _in_child("cpsat", m, time_limit_s, gap, start, threads)


BACKENDS = {"highs": solve_highs, "cbc": solve_cbc, "scip": solve_scip, "cpsat": solve_cpsat}
