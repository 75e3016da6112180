"""Runs an OR-Tools backend (scip, cpsat) in a child process: OR-Tools bundles its own HiGHS, whose
symbols clash with highspy's in one process. The child also gives a hard wall-clock guard (killed on
timeout). Protocol: pickled (backend, model, time_limit_s, gap, start, threads) on stdin; pickled Result
on stdout."""
from __future__ import annotations

import pickle
import sys


def main() -> None:
    backend, model, tl, gap, start, threads = pickle.load(sys.stdin.buffer)
    from port.solver import backends
    fn = {"scip": backends._solve_scip_inproc, "cpsat": backends._solve_cpsat_inproc}[backend]
    res = fn(model, tl, gap, start=start, threads=threads)
    sys.stdout.buffer.write(pickle.dumps(res))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
