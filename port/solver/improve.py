"""Rolling-horizon improvement of an ILP incumbent (fix-and-optimize; solver/FORMULATION.md, "Phases").

Long graphs (ResNet-101: 1245 ops, 8k binaries) leave HiGHS with a good LP bound but no way to improve a
warm start in a minute: its sub-MIP heuristics fail to repair. Here every integer variable is anchored to the
forward ops it decides (an op's own options; a backward op's options anchor to the forward ops whose outputs it
reads; re-run, held-copy and paging variables to the producer; an early update to the backward op producing
its gradient). A window of W consecutive forward ops is freed, every other integer variable is fixed to the
incumbent, and the (small) sub-MIP is solved to optimality from the incumbent; the window slides by W/2 over
the forward pass, sweep after sweep, until a sweep improves nothing or the deadline passes. Each accepted
solution is a solution of the full model, so the result is always feasible and never worse than the start.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

from port.ir.types import PHASE_FORWARD
from port.solver.backends import BACKENDS, _true_objective
from port.solver.formulation import Model, Vars
from port.solver.instance import Instance

DEFAULT_WINDOW_OPS = 60      # forward ops freed at once (sub-MIPs of a few hundred binaries: ~1 s each)
SUB_LIMIT_S = 5.0            # time limit of one sub-MIP


@dataclass(frozen=True)
class Improvement:
    values: list[float]
    objective: float
    start_objective: float
    sweeps: int
    windows: int
    time_s: float


def anchors(inst: Instance, v: Vars) -> dict[int, tuple[int, ...]]:
    """Integer variable index -> the forward positions (0 = first forward op) it decides."""
    g = inst.graph
    fwd = [o.id for o in g.ops if o.phase == PHASE_FORWARD]
    fpos = {o: k for k, o in enumerate(fwd)}
    prods = g.producers()
    pos: dict[int, tuple[int, ...]] = {}
    for o in g.ops:
        if o.id in fpos:
            pos[o.id] = (fpos[o.id],)
        else:
            pos[o.id] = tuple(sorted({fpos[prods[u]] for u in o.inputs if prods.get(u) in fpos}))
    out: dict[int, tuple[int, ...]] = {}
    for (i, _k), j in v.x.items():
        out[j] = pos[i]
    for (p, _k), j in v.rcx.items():
        out[j] = pos[p]
    for (_lv, p, _k), j in v.rcx_more.items():
        out[j] = pos[p]
    for (p, _t), j in v.rt.items():
        out[j] = pos[p]
    for (r, _t), j in list(v.st.items()) + list(v.en.items()):
        out[j] = pos[inst.roots[r].birth]
    for r, j in v.pg.items():
        out[j] = pos[inst.roots[r].birth]
    for u, j in v.e.items():
        out[j] = pos[inst.early[u][1]]
    for r, j in v.ps.items():           # a paged optimizer state: where its update's gradient is complete
        u = inst.state_pages[r][0]
        if u in inst.early:
            out[j] = pos[inst.early[u][1]]
    return out


def rolling_horizon(inst: Instance, m: Model, v: Vars, values: list[float], deadline: float,
                    backend: str = "highs", window_ops: int = DEFAULT_WINDOW_OPS, threads: int | None = None,
                    sub_limit_s: float = SUB_LIMIT_S) -> Improvement:
    """Improve ``values`` (a solution of ``m``) window by window until ``deadline`` (time.perf_counter())."""
    t0 = time.perf_counter()
    solve = BACKENDS[backend]
    anc = anchors(inst, v)
    nfwd = sum(1 for o in inst.graph.ops if o.phase == PHASE_FORWARD)
    w = max(2, min(window_ops, nfwd))
    step = max(1, w // 2)
    cur = list(values)
    start = obj = _true_objective(m, cur)
    sweeps = windows = 0
    while time.perf_counter() < deadline:
        sweeps += 1
        before = obj
        for lo in range(0, max(1, nfwd - w + step), step):
            left = deadline - time.perf_counter()
            if left <= 0.05:
                break
            hi = lo + w
            sub = copy.copy(m)
            sub.lb, sub.ub = list(m.lb), list(m.ub)
            for j, ps in anc.items():
                if not any(lo <= q < hi for q in ps):
                    sub.lb[j] = sub.ub[j] = float(round(cur[j]))
            for j in range(m.num_vars):          # integer variables without an anchor stay as they are
                if m.integer[j] and j not in anc:
                    sub.lb[j] = sub.ub[j] = float(round(cur[j]))
            res = solve(sub, min(sub_limit_s, left), 0.0, start=cur, threads=threads)
            windows += 1
            if res.values is not None and res.objective is not None and res.objective < obj - 1e-9 * max(1.0, obj):
                cur, obj = list(res.values), res.objective
        if obj >= before - 1e-9 * max(1.0, before) or w >= nfwd:   # one window: the full model, solved
            break
    return Improvement(cur, obj, start, sweeps, windows, time.perf_counter() - t0)
