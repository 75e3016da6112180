"""bench/opencl.py (issue 56) writes its section to bench/RESULTS.md the repo's way: the command, CPU and load first,
one row per plan, the headline (plans that use both engines and executed, those within 15%) as its last paragraph.
Rows solved on a --opencl-scale profile are listed but never counted: their prediction is the scaled profile's."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench(name):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", ROOT / "bench" / f"{name}.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def _benches():
    """bench/opencl.py (it takes bench/ off sys.path) and then bench/headlines.py (bench/ on sys.path meanwhile)."""
    ocl = _bench("opencl")
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return ocl, _bench("headlines")
    finally:
        sys.path.remove(str(ROOT / "bench"))


def _row(model, budget, pred, meas, accs=("cpu-c", "opencl"), ocl=5, profile="measured"):
    return {"model": model, "batch": 8, "budget": budget, "memory": "unified", "profile": profile,
            "accelerators": list(accs), "opencl_calls": ocl, "handoff_calls": 2 * ocl, "both_engines": ocl > 0 and
            len(accs) > 1, "predicted_ms": pred, "makespan_ms": pred, "measured_ms": meas, "measured_min_ms": meas,
            "error": (meas - pred) / pred}


def test_section_counts_own_plans_on_both_engines_within_15_percent():
    ocl, heads = _benches()
    rows = [_row("resnet8", 1.0, 10.0, 11.0) | {"runq_ms": 2.46}, _row("resnet8", 0.5, 10.0, 12.0),
            _row("resnet18", 1.0, 50.0, 51.0, accs=("cpu-c",), ocl=0),
            _row("resnet8", 1.0, 10.0, 30.0, profile="opencl conv x0.1")]
    text = ocl.results_text(rows, "`python bench/opencl.py` (date, CPU, 2 CPUs: load average 0.2 at start)", 0.2)
    lines = text.splitlines()
    assert lines[0].startswith("`python bench/opencl.py`") and "quiet" in lines[0] and "CPU timings" in lines[0]
    assert sum(ln.startswith("| resnet") for ln in lines) == 4 and "| +10.0% |" in text and "| +200.0% |" in text
    # the median step's wait for a core (other processes on the engines' cores), where it was read
    assert "| 11.0 | 2.5 | +10.0% |" in text and "| 12.0 | n/a | +20.0% |" in text
    assert lines[-1] == ("OpenCL headline: 2/3 of the ILP's plans use both engines and executed; 1/2 of them within "
                         "15% of their predicted step (target: all; PoCL timings are CPU timings).")
    src, head = heads.headline(ocl.SECTION, text)
    assert src == "bench/opencl.py" and head.startswith("2/3 of the ILP's plans")
    loaded = ocl.results_text(rows[:1], "`python bench/opencl.py`", 3.0)
    assert "UNDER LOAD" in loaded.splitlines()[0] and "UNDER LOAD, indicative only" in loaded.splitlines()[-1]


def test_an_infeasible_budget_is_a_row_not_a_crash():
    """A budget below what any plan needs (ResNet-18 at 50%: static memory with early updates is above it) is a
    row naming the smallest feasible budget; it is neither a plan nor counted as one, and the headline says it."""
    from port.errors import InfeasibleBudgetError
    ocl, heads = _benches()
    err = InfeasibleBudgetError("no plan fits", 89045056, 102533440)
    inf = ocl.infeasible_row("resnet18", 8, 0.5, "unified", "measured", err, 1.0)
    assert inf["infeasible"] == "infeasible: smallest feasible 97.78 MiB (budget 84.92 MiB)"
    unknown = ocl.infeasible_row("resnet18", 8, 0.5, "unified", "measured", InfeasibleBudgetError("x", 10, None), 1.0)
    assert "smallest feasible unknown" in unknown["infeasible"]
    rows = [_row("resnet8", 1.0, 10.0, 11.0), inf, _row("resnet18", 1.0, 50.0, 51.0, accs=("cpu-c",), ocl=0)]
    text = ocl.results_text(rows, "`python bench/opencl.py` (date, CPU, 2 CPUs: load average 0.2 at start)", 0.2)
    lines = text.splitlines()
    row = next(ln for ln in lines if ln.startswith("| resnet18 | 8 | 50%"))
    assert row.count("|") == lines[2].count("|") and "infeasible: smallest feasible 97.78 MiB" in row
    assert lines[-1] == ("OpenCL headline: 1/2 of the ILP's plans use both engines and executed (1 budget infeasible: "
                         "no plan fits); 1/1 of them within 15% of their predicted step (target: all; PoCL timings "
                         "are CPU timings).")
    tab = heads.table(f"## {ocl.SECTION}\n\n{text}\n").splitlines()
    assert tab[2].startswith(f"| {ocl.SECTION} | `bench/opencl.py` | 1/2 of the ILP's plans") and len(tab) == 3


def test_a_solve_without_a_plan_in_time_is_a_row_not_a_crash():
    """A solve that finds no plan in --solve-s (SolverError: MobileNetV2 b8 at 50% split, 20 s, loaded) is a row
    saying so, counted apart from infeasible budgets; the other rows still run and count."""
    from port.errors import SolverError
    ocl, _heads = _benches()
    uns = ocl.unsolved_row("mobilenetv2", 8, 0.5, "split", "measured", 20.0, SolverError("highs found no plan"), 1.0)
    rows = [_row("resnet8", 1.0, 10.0, 11.0), uns]
    text = ocl.results_text(rows, "`python bench/opencl.py` (date, CPU, 2 CPUs: load average 0.2 at start)", 0.2)
    lines = text.splitlines()
    row = next(ln for ln in lines if ln.startswith("| mobilenetv2 | 8 | 50%"))
    assert row.count("|") == lines[2].count("|") and "no plan in 20 s: highs found no plan" in row
    assert lines[-1].startswith("OpenCL headline: 1/1 of the ILP's plans use both engines and executed (1 not "
                                "solved in the solve's time); 1/1 of them")
