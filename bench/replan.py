"""`port train --replan` convergence (issue 12, time): on the depthwise-separable example with an odd input
size (examples/dsnet: 3x37x37, batch 8), profile once, train, then train twice more with ``--replan``.
Each run's measured.json gives the plan's predicted step and the measured one (median wall time of the
training steps, warm-up left out); the target is within 10% after at most two replan rounds.

    python bench/replan.py            # 300 steps per run
    python bench/replan.py --quick    # 120 steps per run
    options: --steps N --rounds N --no-write
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "dsnet"
TARGET = 0.10


def _cli(args: list[str], cwd: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    r = subprocess.run([sys.executable, "-m", "port.cli", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"port {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def run(steps: int, rounds: int) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix="port_replan_"))
    try:
        for f in ("dsnet.py", "dsnet.yaml"):
            shutil.copy(EXAMPLE / f, work / f)
        t = time.time()
        _cli(["profile", "dsnet.yaml", "--quick", "--no-progress"], work)
        out = [{"round": "profile", "seconds": time.time() - t}]
        for rnd in range(rounds + 1):
            args = ["train", "dsnet.yaml", "--out", "runs", "--steps", str(steps), "--no-progress"]
            if rnd:
                args.append("--replan")
            _cli(args, work)
            m = json.loads((work / "runs" / "dsnet" / "measured.json").read_text())
            pred, wall = float(m["predicted_step_ms"]), float(m["wall_step_ms"])
            out.append({"round": rnd, "predicted_ms": pred, "wall_ms": wall, "err": pred / wall - 1,
                        "kernel_ms": m.get("kernel_step_ms"), "wall_steps": m.get("wall_steps")})
            print(out[-1], flush=True)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(rows: list[dict], steps: int, load0: float, t0: float, quick: bool = False) -> str:
    from _results import machine_line
    runs = [r for r in rows if r["round"] != "profile"]
    lines = [machine_line(f"python bench/replan.py{' --quick' if quick else ''}", t0, load0) + ". "
             f"examples/dsnet (depthwise-separable, 3x37x37, batch 8) on `host`: `port profile --quick`, then "
             f"`port train --steps {steps}` and {len(runs) - 1} more runs with `--replan` (each corrects the profile "
             f"with the previous run's in-plan per-op times and executor overhead, then solves again). Predicted = "
             f"the plan's step time; measured = median wall time of the run's training steps (warm-up left out).",
             "", "| run | predicted ms | measured ms | error | kernels ms (instrumented) |", "|---|---|---|---|---|"]
    for r in runs:
        name = "first (profile only)" if r["round"] == 0 else f"--replan round {r['round']}"
        k = r.get("kernel_ms")
        lines.append(f"| {name} | {r['predicted_ms']:.3f} | {r['wall_ms']:.3f} | {r['err'] * 100:+.1f}% "
                     f"| {k:.3f} |" if k is not None else f"| {name} | {r['predicted_ms']:.3f} | {r['wall_ms']:.3f} "
                     f"| {r['err'] * 100:+.1f}% | - |")
    best = next((r for r in runs if r["round"] > 0 and abs(r["err"]) <= TARGET), None)
    verdict = f"met at round {best['round']}" if best else "NOT met"
    last = runs[-1]
    lines += ["", f"Replan: first run {runs[0]['err'] * 100:+.1f}%, after {last['round']} rounds "
              f"{last['err'] * 100:+.1f}% (target within {TARGET:.0%} in at most two rounds: {verdict})"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    steps = a.steps or (120 if a.quick else 300)
    t0, load0 = time.time(), os.getloadavg()[0]
    rows = run(steps, a.rounds)
    sys.path.insert(0, str(ROOT / "bench"))
    from _results import publish
    publish("Replan", report(rows, steps, load0, t0, a.quick), not a.no_write)


if __name__ == "__main__":
    main()
