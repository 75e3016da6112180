"""Capture must not cost the training process its memory (issue 52): a user's script, measured in fresh processes.

    python bench/capture_memory.py [--no-write]

Per net (a depthwise-separable net outside the zoo at 3x40x48 batch 16, the digits CNN at batch 32, ResNet-8 at
batch 16): a set-up process captures the graph, takes a modeled host profile, solves a plan at 70% of the
keep-everything peak and saves it. Then, in a fresh process per capture mode, the user's script: import torch and
port, build the model, read VmRSS, reset VmHWM (/proc/self/clear_refs), ``Trainer(model, x, plan=saved_plan)``,
20 SGD-momentum steps, read VmHWM. Growth = VmHWM - VmRSS before ``Trainer``: measured process memory, not
the plan's accounting. Modes: ``child`` (the default: torch.export runs in a forked child) and ``inprocess``
(PORT_CAPTURE=inprocess: the compiler stack imported by the training process, for comparison). Target: growth
<= plan budget + 16 MiB in the default mode, on all three nets (headline, last line).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]   # bench/profile.py != stdlib
sys.path.insert(0, str(ROOT))
MB = 2 ** 20

NETS = {   # name -> (builder source: an expression over torch.nn as nn, input shape, batch)
    "depthwise (3x40x48)": ("""nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, 2, 1, groups=32, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))""", (3, 40, 48), 16),
    "digits_cnn": ("__import__('port').models.get('digits_cnn', seed=0)", (1, 8, 8), 32),
    "resnet8": ("__import__('port').models.get('resnet8', seed=0)", (3, 32, 32), 16),
}

_SETUP = """
import sys, torch, torch.nn as nn, port
torch.manual_seed(0)
model = eval(sys.argv[1]); shape = eval(sys.argv[2]); batch = int(sys.argv[3])
g = port.trace(model, torch.randn(batch, *shape), optimizer="sgd_momentum")
prof = port.modeled_profile(g, port.load_device("host"))
plan = port.solve(g, prof, "70%", time_limit_s=20)
port.save_plan(plan, sys.argv[4], graph=g)
print("BUDGET", plan.budget_bytes)
"""

_USER = """
import sys, json, torch, torch.nn as nn, port
from port.train.optim import SGD
def status():
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS:", "VmHWM:")):
            k, v = line.split(":"); out[k] = int(v.split()[0]) * 1024
    return out
torch.manual_seed(0)
model = eval(sys.argv[1]); shape = eval(sys.argv[2]); batch = int(sys.argv[3])
x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))
before = status()["VmRSS"]
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
tr = port.Trainer(model, x, plan=sys.argv[4], optimizer=SGD(0.01, momentum=0.9))
for _ in range(20):
    tr.step(x, y)
after = status()
print("ROW " + json.dumps({"growth": after["VmHWM"] - before, "arena": tr.program.arena_bytes,
                          "modules": len(sys.modules), "dynamo": "torch._dynamo" in sys.modules}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    sys.path.append(str(ROOT / "bench"))
    from _results import machine_line, publish
    t0, load0 = time.time(), os.getloadavg()[0]
    env0 = {k: v for k, v in os.environ.items() if k != "PORT_CAPTURE"} | {"PYTHONPATH": str(ROOT)}
    rows, ok = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (src, shape, batch) in NETS.items():
            plan = str(Path(tmp) / "plan.json")
            s = subprocess.run([sys.executable, "-c", _SETUP, src, repr(shape), str(batch), plan], capture_output=True,
                               text=True, env=env0, timeout=600)
            budget = next((int(line.split()[1]) for line in s.stdout.splitlines() if line.startswith("BUDGET")), None)
            if budget is None:
                raise SystemExit(f"{name}: set-up failed: {s.stderr[-2000:]}")
            res = {}
            for mode in ("child", "inprocess"):
                env = env0 | ({"PORT_CAPTURE": "inprocess"} if mode == "inprocess" else {})
                r = subprocess.run([sys.executable, "-c", _USER, src, repr(shape), str(batch), plan],
                                   capture_output=True, text=True, env=env, timeout=600)
                line = next((ln for ln in r.stdout.splitlines() if ln.startswith("ROW ")), None)
                if line is None:
                    raise SystemExit(f"{name} ({mode}): {r.stderr[-2000:]}")
                res[mode] = json.loads(line[4:])
            met = res["child"]["growth"] <= budget + 16 * MB
            ok += met
            rows.append(f"| {name} | {budget / MB:.1f} | {res['child']['arena'] / MB:.1f} | "
                        f"{res['child']['growth'] / MB:.1f} ({'met' if met else 'NOT met'}) | "
                        f"{res['inprocess']['growth'] / MB:.1f} | {res['child']['modules']} / "
                        f"{res['inprocess']['modules']} | {res['child']['dynamo']} / {res['inprocess']['dynamo']} |")
            print(rows[-1], flush=True)
    lines = [machine_line("python bench/capture_memory.py", t0, load0) + ".", "",
             "| net | plan budget MiB | arena MiB | growth, capture in a child MiB (target <= budget + 16) | growth, "
             "capture in process MiB | modules loaded child / in process | torch._dynamo imported child / in "
             "process |", "|---|---|---|---|---|---|---|", *rows, "",
             f"Capture memory headline: {ok}/{len(NETS)} nets grow <= plan budget + 16 MiB in a fresh process with "
             f"the default capture (target 3/3)."]
    publish("Capture memory", "\n".join(lines), not a.no_write)


if __name__ == "__main__":
    main()
