"""LoRA fine-tuning of a tiny Llama-style model on the device, under less memory than PyTorch eager needs.

1. A tiny ``LlamaForCausalLM`` (llama_lora.py: byte vocabulary, RMSNorm, rotary, SwiGLU, grouped-query attention;
   random init, nothing downloaded) is pre-trained briefly, all weights, on one part of the Python standard
   library's source (``--pretrain`` steps; 0 keeps the random init).
2. ``peft`` LoRA (rank 8) on q_proj and v_proj; held-out perplexity (files never trained on) before.
3. PyTorch eager runs the LoRA step in a child process: its measured memory (weights + VmHWM growth of the
   steps) is what eager needs.
4. PORT traces, profiles and solves the same LoRA step under ``--budget`` (a fraction of eager's memory), trains
   ``--steps`` steps, and reports held-out perplexity after, the plan's peak and the process's growth.
5. ``--bundle DIR``: the LoRA trainer as a port-rt bundle with training and held-out windows, so ``port-rt train``
   continues the fine-tuning without Python (refused, naming the ops, while any op lacks a C kernel).

Every op runs on PORT's C kernels (the causal mask and rotary tables HF builds from positions are folded into
buffers at capture, port.ir.fold), so the plan fits below eager's memory and ``--bundle`` continues the
fine-tuning in port-rt, which reports held-out perplexity before and after its steps (`--pretrain 0 --steps 5
--context 32`, 2026-11-29: eager needs 14.1 MiB, PORT's budget 8.5 MiB (60%), plan peak 5.4 MiB). If no plan fits
the budget the script names the smallest feasible one and trains under it. A tiny model with random or briefly
pre-trained weights: it shows the mechanics, not a useful language model.

    python examples/llama_lora/finetune.py                       # 200 pre-training + 100 LoRA steps
    python examples/llama_lora/finetune.py --pretrain 0 --steps 5 --context 32
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))


def eager_memory(state: str, batch: int, context: int, steps: int, lr: float) -> dict:
    """Eager's LoRA steps in a fresh child process: weights + VmHWM growth over the steps (bytes)."""
    code = f"""
import json, sys, torch
sys.path.insert(0, {str(HERE)!r}); sys.path.insert(0, {str(HERE.parents[1])!r})
from llama_lora import base_model, with_lora
from port.train import memwatch
from port.train.text import lm_batches, stdlib_corpus
torch.set_num_threads(2)
b = base_model(); b.load_state_dict(torch.load({state!r}, weights_only=True)); m = with_lora(b)
ps = [p for p in m.parameters() if p.requires_grad]
opt = torch.optim.AdamW(ps, lr={lr}, weight_decay=0.0)
data = list(lm_batches(stdlib_corpus(200_000).train, {batch}, {context}, seed=5, steps={steps}))
weights = sum(t.numel() * t.element_size() for t in list(m.parameters()) + list(m.buffers()))
memwatch.reset_peak(); before = memwatch.status_bytes()["VmRSS"]
for x, y in data:
    z = m(x).logits
    loss = torch.nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
print(json.dumps({{"weights_bytes": weights, "growth_bytes": memwatch.peak_bytes() - before}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def port_rt_binary() -> str | None:
    """The port-rt executable: on PATH, else this checkout's build (``make port-rt``); None when neither."""
    import shutil
    built = HERE.parents[1] / "kernels" / "build" / "port-rt"
    return shutil.which("port-rt") or (str(built) if built.is_file() else None)


def continue_in_port_rt(binary: str, bundle: Path, d: Path, steps: int) -> dict:
    """port-rt evaluates the bundle on the held-out windows, trains ``steps`` more LoRA steps from it
    (checkpoint ``d/rt.port``) and evaluates again: perplexities exp(mean cross-entropy), mean step time and
    its process peak (VmHWM) while training."""
    import math

    def rt(*args) -> dict:
        out = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, check=True).stdout
        lines = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.strip()}
        return lines
    before = rt("eval", bundle, "--data", d / "heldout.portdata")["eval"]
    ck = d / "rt.port"
    ck.unlink(missing_ok=True)
    tr = rt("train", bundle, "--data", d / "train.portdata", "--steps", steps, "--checkpoint", ck)["summary"]
    after = rt("eval", bundle, "--data", d / "heldout.portdata", "--checkpoint", ck)["eval"]
    summary = dict(zip(tr[1::2], tr[2::2]))
    return {"ppl_before": math.exp(float(before[10])), "ppl_after": math.exp(float(after[10])), "steps": steps,
            "step_ms": float(summary["mean_step_ms"]), "vmhwm_bytes": int(summary["vmhwm_kb"]) * 1024}


def run(steps: int = 100, pretrain: int = 200, batch: int = 8, context: int = 64, lr: float = 3e-3,
        budget: float = 0.6, out: str = "runs/llama_lora_example", bundle: str | None = None,
        verbose: bool = True, rt_steps: int = 20) -> dict:
    import torch
    import port
    from port.errors import InfeasibleBudgetError
    from port.train import memwatch
    from port.train.optim import AdamW
    from port.train.text import eval_windows, lm_batches, perplexity, stdlib_corpus
    from llama_lora import base_model, with_lora

    log = (lambda *a: print(*a, flush=True)) if verbose else (lambda *a: None)
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    corpus = stdlib_corpus(400_000)
    cut = len(corpus.train) // 2
    pre_text, ft_text = corpus.train[:cut], corpus.train[cut:]
    held = eval_windows(corpus.heldout, batch, context, max_batches=4)
    res: dict = {}
    base = base_model()
    ppl = lambda m: perplexity(lambda x: m(x).logits, held)                      # noqa: E731
    x0 = next(lm_batches(pre_text, batch, context, seed=1, steps=1))[0]
    if pretrain:
        tr = port.Trainer(base, x0, optimizer=AdamW(lr, weight_decay=0.0))
        for i, (x, y) in enumerate(lm_batches(pre_text, batch, context, seed=2, steps=pretrain)):
            loss = tr.step(x, y)
            if i % max(1, pretrain // 4) == 0 or i == pretrain - 1:
                log(f"  pre-train step {i:4d}  loss {loss:.3f}")
        tr.to_torch(base)
        tr.close()
    state = d / "base.pt"
    torch.save(base.state_dict(), state)
    model = with_lora(base)
    res["ppl_before"] = ppl(model)
    log(f"held-out perplexity before LoRA: {res['ppl_before']:.2f} ({corpus.heldout_files} held-out files)")

    eager = eager_memory(str(state), batch, context, 4, lr)
    res["eager_bytes"] = eager["weights_bytes"] + eager["growth_bytes"]
    res["budget_bytes"] = int(budget * res["eager_bytes"])
    g = port.trace(model, x0, optimizer="adamw")
    prof = port.profile(g, "host")
    if bundle:      # port-rt runs the C kernels only: the plan may not pick a torch engine for a faster op
        import dataclasses
        prof = dataclasses.replace(prof, entries=tuple(e for e in prof.entries if e.accelerator == "cpu-c"),
                                   _index={})
    try:
        plan = port.solve(g, prof, res["budget_bytes"], time_limit_s=20)
    except InfeasibleBudgetError as e:
        # (ops on PyTorch's kernels make the plan price torch's resident footprint: then no plan may fit)
        if e.min_feasible_bytes is None:
            raise
        log(f"no plan fits {budget:.0%} of eager's memory: {e}")
        res["budget_bytes"] = e.min_feasible_bytes
        plan = port.solve(g, prof, e.min_feasible_bytes, time_limit_s=20)
    res["torch_ops"] = sum(d.accelerator.endswith("torch") for d in plan.ops)
    res["plan_peak_bytes"] = plan.predicted_peak_bytes
    memwatch.reset_peak()
    rss0 = memwatch.status_bytes()["VmRSS"]
    tr = port.Trainer(model, x0, plan=plan, optimizer=AdamW(lr, weight_decay=0.0))
    t0 = time.perf_counter()
    for i, (x, y) in enumerate(lm_batches(ft_text, batch, context, seed=3, steps=steps)):
        loss = tr.step(x, y)
        if i % max(1, steps // 4) == 0 or i == steps - 1:
            log(f"  LoRA step {i:4d}  loss {loss:.3f}")
    res["step_ms"] = (time.perf_counter() - t0) * 1e3 / max(steps, 1)
    res["port_growth_bytes"] = memwatch.peak_bytes() - rss0
    tr.to_torch(model)
    res["ppl_after"] = ppl(model)
    res["trained_params"] = sum(t.numel for t in tr.graph.trainable_parameters())
    mib = 1 << 20
    log(f"held-out perplexity after {steps} LoRA steps: {res['ppl_after']:.2f}; {res['trained_params']} trained "
        f"parameters; {res['step_ms']:.1f} ms/step")
    log(f"memory: eager needs {res['eager_bytes'] / mib:.1f} MiB (weights + measured growth); PORT's budget "
        f"{res['budget_bytes'] / mib:.1f} MiB ({res['budget_bytes'] / res['eager_bytes']:.0%} of eager's), plan peak "
        f"{res['plan_peak_bytes'] / mib:.1f} MiB, process growth while training {res['port_growth_bytes'] / mib:.1f} "
        f"MiB; {res['torch_ops']} ops on PyTorch's kernels")
    if bundle:
        from port.exec.bundle import write_bundle, write_data
        b = Path(bundle)
        info = write_bundle(tr, b / "llama_lora.portrt")
        for name, text, n in (("train", ft_text, 64), ("heldout", corpus.heldout, 16)):
            xs, ys = zip(*lm_batches(text, batch, context, seed=4, steps=n // batch))
            write_data(b / f"{name}.portdata", torch.cat(xs).numpy(), torch.cat(ys).numpy(), 256,
                       ignore_index=tr.executor.ignore_index)
        res["bundle"] = str(info.path)
        log(f"port-rt bundle {info.path} ({info.total_bytes} bytes); continue with: port-rt train {info.path} "
            f"--data {b / 'train.portdata'} --steps 20 --checkpoint {b / 'rt.port'}")
        rt = port_rt_binary()
        if rt is not None:
            res["rt"] = continue_in_port_rt(rt, info.path, b, rt_steps)
            r = res["rt"]
            log(f"port-rt (no Python): held-out perplexity {r['ppl_before']:.2f} -> {r['ppl_after']:.2f} over "
                f"{r['steps']} more LoRA steps, {r['step_ms']:.1f} ms/step, process peak (VmHWM) "
                f"{r['vmhwm_bytes'] / mib:.1f} MiB")
    tr.close()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--pretrain", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--budget", type=float, default=0.6, help="PORT's budget as a fraction of eager's memory")
    ap.add_argument("--out", default="runs/llama_lora_example")
    ap.add_argument("--bundle", default=None, help="also compile a port-rt bundle into this directory and, where "
                    "port-rt is built, continue the fine-tuning there (held-out perplexity before and after)")
    ap.add_argument("--rt-steps", type=int, default=20, help="port-rt's further LoRA steps (with --bundle)")
    a = ap.parse_args(argv)
    run(a.steps, a.pretrain, a.batch, a.context, a.lr, a.budget, a.out, a.bundle, rt_steps=a.rt_steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
