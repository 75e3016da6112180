"""Federated learning under per-device plans (issue 17): fleets of 3, 5 and 8 clients whose budgets are 25%, 50%
and 100% of the model's keep-everything peak (devices jetson-orin-nano, raspberry-pi-4b, iphone-15-pro in turn),
label-skewed scikit-learn digits (Dirichlet alpha 0.5), the digits CNN (1x8x8) and ResNet-8 (the digit resized
to 3x16x16), FedAvg over PORT deltas.

Fleets: the rounds run in this process with the functions the Flower apps call (``client_update`` on every
client, ``fedavg`` of their deltas; tests/e2e/test_federated.py checks that a round over Flower gives the same
global model), until the global test accuracy reaches 95% or --max-rounds. Per fleet: rounds to 95%, bytes a
round sends up (the deltas, against full weights), the slowest client's seconds per round (the round's wall time
on a fleet whose devices train in parallel; modeled devices run their plans on PORT's C kernels here), the plan
peak (accounting) and the measured resident-set growth during local training against each client's budget, and
the clients whose budget fits no plan, with their minimum.
Flower: one real local federation (`port federate`: SuperLink + one SuperNode process per client on 127.0.0.1)
of ResNet-8's 3-client fleet for --flower-rounds rounds: wall time per round against the clients' own time,
and each client process's measured peak.

    python bench/federated.py            # up to 40 rounds per fleet, 4 Flower rounds
    python bench/federated.py --quick    # up to 12 rounds, 3- and 8-client fleets, 2 Flower rounds
    options: --max-rounds N --flower-rounds N (0: skip) --no-write
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]   # bench/profile.py != stdlib
sys.path.insert(0, str(ROOT))

TARGET_ACC = 0.95
DEVICES = ("jetson-orin-nano", "raspberry-pi-4b", "iphone-15-pro")
BUDGETS = (25, 50, 100)
MODELS = {"digits_cnn": ("[1, 8, 8]", 16, 0.05), "resnet8": ("[3, 16, 16]", 16, 0.05)}


def fleet_yaml(model: str, n: int, rounds: int, budgets: tuple = BUDGETS, trainable: tuple = ()) -> str:
    shape, batch, lr = MODELS[model]
    clients = "\n".join(f"    - {{device: {DEVICES[i % 3]}, budget: {budgets[i % len(budgets)]}%}}" for i in range(n))
    return (f"name: fed_{model}_{n}\nmodel: {model}\ninput_shape: {shape}\nnum_classes: 10\nbatch_size: {batch}\n"
            f"data: {{kind: digits, seed: 0}}\noptimizer: {{name: sgd_momentum, lr: {lr}, momentum: 0.9}}\n"
            f"solver: {{name: highs, time_limit_s: 20, gap: 0.01}}\n"
            f"train: {{seed: 0{', trainable: [' + ', '.join(trainable) + ']' if trainable else ''}}}\n"
            f"federation:\n  rounds: {rounds}\n  local_epochs: 1\n  round_timeout_s: 300\n"
            f"  partition: {{alpha: 0.5, seed: 0}}\n  clients:\n{clients}\n")


def run_fleet(model: str, n: int, max_rounds: int, work: Path, budgets: tuple = BUDGETS,
              keep_only: bool = False, trainable: tuple = ()) -> dict:
    """One fleet until 95% or ``max_rounds``. ``keep_only``: the fleet without PORT's plans, where a client
    trains only if its budget holds the keep-everything peak (the others could not run)."""
    import numpy as np
    from port.errors import InfeasibleBudgetError
    from port.federated import client_plan, client_update, fedavg, global_state, load_federation
    from port.federated.flower import global_accuracy
    from port.pipeline import load_job, load_model
    cfg = work / f"{model}_{n}_{'-'.join(map(str, budgets))}{'_sparse' if trainable else ''}.yaml"
    cfg.write_text(fleet_yaml(model, n, max_rounds, budgets, trainable))
    fed = load_federation(cfg)
    net = load_model(load_job(cfg))
    state = global_state(fed)
    full_bytes = sum(np.asarray(v).nbytes for v in net.state_dict().values())
    clients, infeasible = [], []
    for i in range(n):
        try:
            cp = client_plan(fed, i, work / "plans")[0]
            if keep_only and cp.budget_bytes < cp.keep_everything_peak_bytes:
                continue
            clients.append({"index": i, "device": DEVICES[i % 3], "budget_pct": budgets[i % len(budgets)],
                            "budget_bytes": cp.budget_bytes, "plan_peak_bytes": int(cp.plan.predicted_peak_bytes),
                            "keep_bytes": cp.keep_everything_peak_bytes, "growth": 0, "seconds": []})
        except InfeasibleBudgetError as e:
            if keep_only:
                continue
            infeasible.append({"index": i, "device": DEVICES[i % 3], "budget_pct": budgets[i % len(budgets)],
                               "budget_bytes": e.budget_bytes, "min_bytes": e.min_feasible_bytes})
    accs, up_bytes, wall, reached = [global_accuracy(fed, net, state)], [], [], None
    for rnd in range(1, max_rounds + 1):
        ups = []
        for c in clients:
            t = time.perf_counter()
            u = client_update(fed, c["index"], state, rnd, work / "plans")
            c["seconds"].append(time.perf_counter() - t)
            c["growth"] = max(c["growth"], int(u.metrics["train_rss_growth_bytes"]))
            ups.append(u)
        state = fedavg(state, ups)
        up_bytes.append(sum(sum(np.asarray(d).nbytes for d in u.delta.values()) for u in ups))
        wall.append(max(c["seconds"][-1] for c in clients))
        accs.append(global_accuracy(fed, net, state))
        print(f"  {model} x{n} round {rnd}: accuracy {accs[-1]:.3f}, slowest client {wall[-1]:.2f} s", flush=True)
        if accs[-1] >= TARGET_ACC:
            reached = rnd
            break
    kind = ("all " if len(set(budgets)) == 1 else "") + "/".join(f"{b}" for b in budgets) + "%"
    kind += f", sparse update ({' + '.join(trainable)} trained)" if trainable else ""
    return {"model": model, "n": n, "fleet": kind + (", keep-everything only" if keep_only else ""),
            "clients": clients, "infeasible": infeasible, "accs": accs,
            "reached": reached, "up_bytes": float(np.median(up_bytes)),
            "full_bytes": full_bytes * len(clients), "wall_s": float(np.median(wall)),
            "examples": int(sum(len(fed.partitions[c["index"]]) for c in clients)),
            "all_examples": int(sum(len(p) for p in fed.partitions))}


def run_flower(rounds: int, work: Path) -> dict:
    from port.federated.launch import federate
    cfg = work / "flower.yaml"
    cfg.write_text(fleet_yaml("resnet8", 3, rounds).replace("round_timeout_s: 300", "round_timeout_s: 120"))
    t = time.time()
    res = federate(cfg, work / "flower", echo=lambda m: print("  " + m, flush=True))
    return {"history": res.history, "seconds": time.time() - t, "status": res.status}


def _mib(b: float) -> str:
    return f"{b / 2 ** 20:.2f} MiB" if b >= 2 ** 20 else f"{b / 1024:.0f} KiB"


def report(fleets: list[dict], flower: dict | None, cmd: str, t0: float, load0: float) -> str:
    sys.path.append(str(ROOT / "bench"))
    from _results import machine_line
    loaded = load0 > 1.5          # at start: the benchmark's own Flower processes raise it later
    lines = [machine_line(cmd, t0, load0) + (". Taken under load (load average above 1.5 on 2 CPUs): wall times "
                                             "are high." if loaded else "."),
             "", "Fleets (rounds in this process with the Flower apps' own `client_update` and `fedavg`; "
             "label-skewed digits, alpha 0.5, one local epoch, batch 16; budgets cycle 25/50/100% of the "
             "keep-everything peak over jetson-orin-nano / raspberry-pi-4b / iphone-15-pro). Up-link bytes: "
             "what the participating clients send per round as deltas, against their full state dicts. Round wall: "
             "the slowest client's seconds (devices train in parallel; modeled devices run their plans on PORT's C "
             "kernels here).", "",
             "| model | budgets | clients (trained / fit no plan) | examples trained | rounds to 95% "
             "| accuracy (round 1, last) | up-link per round: deltas / full weights | round wall s |",
             "|---|---|---|---|---|---|---|---|"]
    for f in fleets:
        rr = f"{f['reached']}" if f["reached"] else f"not in {len(f['accs']) - 1}"
        lines.append(f"| {f['model']} | {f['fleet']} | {f['n']} ({len(f['clients'])} / {len(f['infeasible'])}) | "
                     f"{f['examples']} of {f['all_examples']} | {rr} | {f['accs'][1]:.3f}, {f['accs'][-1]:.3f} | "
                     f"{_mib(f['up_bytes'])} / {_mib(f['full_bytes'])} | {f['wall_s']:.2f} |")
    lines += ["", "Per client (each fleet's first three clients; the rest repeat their device and budget): the "
              "plan's peak (accounting) and the measured growth of the resident set during local training "
              "(VmHWM reset when training starts, in this process) against the budget.", "",
              "| model | clients | client | device | budget | plan peak | RSS growth in training (measured) "
              "| client s / round |", "|---|---|---|---|---|---|---|---|"]
    for f in fleets:
        if f["fleet"] != "25/50/100%":
            continue
        for c in sorted(f["clients"] + f["infeasible"], key=lambda c: c["index"])[:3]:
            if "min_bytes" in c:
                lines.append(f"| {f['model']} | {f['n']} | {c['index']} | {c['device']} | {c['budget_pct']}% = "
                             f"{_mib(c['budget_bytes'])} | no plan fits (smallest feasible "
                             f"{_mib(c['min_bytes']) if c['min_bytes'] else '?'}) | - | - |")
            else:
                s = sorted(c["seconds"])
                lines.append(f"| {f['model']} | {f['n']} | {c['index']} | {c['device']} | {c['budget_pct']}% = "
                             f"{_mib(c['budget_bytes'])} | {_mib(c['plan_peak_bytes'])} | {_mib(c['growth'])} | "
                             f"{s[len(s) // 2]:.2f} |")
    if flower:
        h = flower["history"]
        lines += ["", f"Flower (`port federate`: SuperLink and 3 SuperNodes, one process each, on 127.0.0.1; "
                  f"ResNet-8, the 3-client 25/50/100% fleet; {flower['status']} in {flower['seconds']:.0f} s "
                  f"including start-up). Client s: the client's own time in its train handler, in a fresh process "
                  f"(the federation's config and data loaded, the model traced, the plan read from the cache, a "
                  f"local epoch, evaluation; the clients share 2 CPUs here); the rest of a round is Flower's: a new `flwr-clientapp` "
                  f"process per message (Python, PyTorch and PORT imported again), polling, the server's "
                  f"evaluation. Process peak: the client process's VmHWM during local training (Python and "
                  f"PyTorch included).",
                  "", "| round | global accuracy | round wall s | clients: client s, plan peak / budget, process peak |",
                  "|---|---|---|---|"]
        for r in h["rounds"]:
            cl = "; ".join(f"{int(c['client'])}: {c['seconds']:.1f} s, {_mib(c['predicted_peak_bytes'])} / "
                           f"{_mib(c['budget_bytes'])}, "
                           f"{_mib(c['peak_rss_bytes'])}" for c in sorted(r["clients"], key=lambda c: c["client"]))
            cl += "".join(f"; {c['client']}: no plan fits {_mib(c['budget_bytes'])} (smallest feasible "
                          f"{_mib(c['min_feasible_bytes'])})" for c in r["infeasible"])
            lines.append(f"| {r['round']} | {r['accuracy']:.3f} | {r['seconds']:.1f} | {cl} |")
    def rr(f):
        return f"{f['reached']}" if f["reached"] else f"not in {len(f['accs']) - 1}"
    within = all(c["plan_peak_bytes"] <= c["budget_bytes"] for f in fleets for c in f["clients"])
    reported = all(c["min_bytes"] and c["min_bytes"] > c["budget_bytes"] for f in fleets for c in f["infeasible"])
    ratio = max(f["up_bytes"] / f["full_bytes"] for f in fleets if "sparse" not in f["fleet"])
    sparse = [f"{f['up_bytes'] / f['full_bytes']:.2f}x" for f in fleets if "sparse" in f["fleet"]]
    sparse_txt = f" ({', '.join(sparse)} with a sparse update)" if sparse else ""
    gains = []
    for f in fleets:
        k = next((g for g in fleets if g["model"] == f["model"] and g["n"] == f["n"]
                  and g["fleet"] == f["fleet"] + ", keep-everything only"), None)
        if k is not None:
            gains.append(f"{f['model']} x{f['n']}: {len(f['clients'])} clients train under PORT plans vs "
                         f"{len(k['clients'])} keep-everything, {f['examples']} vs {k['examples']} examples, 95% at "
                         f"round {rr(f)} vs {rr(k)}")
    ref = "; ".join(f"{f['model']} {rr(f)}" for f in fleets if f["fleet"] == "all 100%")
    mixed = "; ".join(f"{f['model']} x{f['n']} {rr(f)}" for f in fleets if f["fleet"] == "25/50/100%")
    lines += ["", f"Federated: rounds to 95% with budgets 25/50/100%: {mixed} (every client at 100%: {ref}); "
              f"{'; '.join(gains) or 'no fleet where PORT plans add clients'}; plans within budgets: "
              f"{'yes' if within else 'NO'}; clients that fit no plan reported with their minimum: "
              f"{'yes' if reported else 'NO'}; up-link deltas {ratio:.2f}x full weights{sparse_txt} (targets: "
              f"plans within budgets, infeasible clients reported, more clients and fewer rounds than keep-everything)"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-rounds", type=int)
    ap.add_argument("--flower-rounds", type=int)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    max_rounds = a.max_rounds or (12 if a.quick else 40)
    flower_rounds = a.flower_rounds if a.flower_rounds is not None else (2 if a.quick else 4)
    sizes = (3, 8) if a.quick else (3, 5, 8)
    t0, load0 = time.time(), os.getloadavg()[0]
    fleets = []
    with tempfile.TemporaryDirectory(prefix="port_fed_") as tmp:
        work = Path(tmp)
        for model in MODELS:
            print(f"{model}, 3 clients, all at 100%", flush=True)
            fleets.append(run_fleet(model, 3, max_rounds, work, budgets=(100,)))
            for n in sizes:
                print(f"{model}, {n} clients, budgets {BUDGETS}", flush=True)
                fleets.append(run_fleet(model, n, max_rounds, work))
                if n == 3 and any(c["budget_bytes"] < c["keep_bytes"] for c in fleets[-1]["clients"]):
                    print(f"{model}, {n} clients, keep-everything only", flush=True)
                    fleets.append(run_fleet(model, n, max_rounds, work, keep_only=True))
        print("resnet8, 3 clients, all at 100%, sparse update", flush=True)
        fleets.append(run_fleet("resnet8", 3, max_rounds, work, budgets=(100,), trainable=("layer3.0.conv2", "fc")))
        flower = run_flower(flower_rounds, work) if flower_rounds else None
    cmd = "python bench/federated.py" + (" --quick" if a.quick else "")
    sys.path.append(str(ROOT / "bench"))
    from _results import publish
    publish("Federated", report(fleets, flower, cmd, t0, load0), not a.no_write)


if __name__ == "__main__":
    main()
