"""Fine-tune gpt_tiny on real text that ships with every Python: the standard library's own source.

A byte-level gpt_tiny is first pre-trained briefly on one part of the standard library (``--pretrain`` steps),
then fine-tuned on another part twice from the same weights: full fine-tuning and LoRA (rank 8 on the
attention's q and v and the MLP's first layer; the base weights frozen, their gradients pruned from the graph).
Both run on PORT's C kernels; perplexity on held-out files (never trained on) before and after each.

    python examples/text/finetune_gpt.py                 # 300 pre-training steps, 200 fine-tuning steps
    python examples/text/finetune_gpt.py --steps 20 --pretrain 20 --context 64
    python examples/text/finetune_gpt.py ... --bundle runs/gpt  # + the LoRA trainer as a port-rt bundle

``--bundle DIR`` compiles the LoRA trainer (after its fine-tuning) into ``DIR/gpt_lora.portrt`` (bundle format
2: int64 token ids in, next-byte labels per position) with fine-tuning windows ``DIR/train.portdata`` and
held-out windows ``DIR/heldout.portdata``, so ``port-rt train`` continues the fine-tuning without Python.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def run(steps: int = 200, pretrain: int = 300, batch: int = 8, context: int = 128, layers: int = 4, dim: int = 128,
        lr: float = 3e-3, seed: int = 0, verbose: bool = True, bundle: str | None = None) -> dict:
    import torch
    import port
    from port.train.optim import AdamW
    from port.train.text import eval_windows, lm_batches, perplexity, stdlib_corpus
    from port.transformers import gpt_tiny, lora, merge_lora

    torch.manual_seed(seed)
    corpus = stdlib_corpus(600_000)
    cut = len(corpus.train) // 2
    pre_text, ft_text = corpus.train[:cut], corpus.train[cut:]      # pre-training and fine-tuning: other files
    held = eval_windows(corpus.heldout, batch, context)
    model = gpt_tiny(layers=layers, dim=dim, heads=4, context=context)
    x0 = next(lm_batches(pre_text, batch, context, seed=seed, steps=1))[0]
    log = (lambda *a: print(*a, flush=True)) if verbose else (lambda *a: None)

    def train(m, text, n, tag):
        tr = port.Trainer(m, x0, optimizer=AdamW(lr, weight_decay=0.0))
        t = time.perf_counter()
        for i, (x, y) in enumerate(lm_batches(text, batch, context, seed=seed + 1, steps=n)):
            loss = tr.step(x, y)
            if verbose and (i % max(1, n // 5) == 0 or i == n - 1):
                log(f"  {tag} step {i:4d}  loss {loss:.3f}")
        ms = (time.perf_counter() - t) * 1e3 / max(n, 1)
        tr.to_torch(m)
        return tr, ms

    out: dict = {"random_ppl": perplexity(model, held)}
    log(f"held-out perplexity, random init: {out['random_ppl']:.1f} ({corpus.heldout_files} held-out files)")
    if pretrain:
        train(model, pre_text, pretrain, "pre-train")
    out["base_ppl"] = perplexity(model, held)
    log(f"held-out perplexity, base model: {out['base_ppl']:.2f}")

    full = copy.deepcopy(model)
    tr, out["full_step_ms"] = train(full, ft_text, steps, "full")
    out["full_ppl"] = perplexity(full, held)
    out["full_trained_params"] = sum(t.numel for t in tr.graph.trainable_parameters())

    small = lora(copy.deepcopy(model), targets=["*.attn.q", "*.attn.v", "*.fc1"], rank=8, alpha=16)
    tr, out["lora_step_ms"] = train(small, ft_text, steps, "lora")
    out["lora_ppl"] = perplexity(small, held)
    out["lora_trained_params"] = sum(t.numel for t in tr.graph.trainable_parameters())
    if bundle:
        from port.exec.bundle import write_bundle, write_data
        d = Path(bundle)
        info = write_bundle(tr, d / "gpt_lora.portrt")
        for name, text, n in (("train", ft_text, 64), ("heldout", corpus.heldout, 16)):
            xs, ys = zip(*lm_batches(text, batch, context, seed=seed + 2, steps=n // batch))
            write_data(d / f"{name}.portdata", torch.cat(xs).numpy(), torch.cat(ys).numpy(), small.tok.num_embeddings,
                       ignore_index=tr.executor.ignore_index)
        log(f"port-rt bundle {info.path} ({info.total_bytes} bytes, arena {info.arena_bytes} bytes) at step "
            f"{tr.step_count}; data {d / 'train.portdata'}, {d / 'heldout.portdata'}")
    merged = merge_lora(small)                       # plain nn.Linear weights again, for inference / export
    out["merged_ppl"] = perplexity(merged, held)
    log(f"held-out perplexity after {steps} steps: full {out['full_ppl']:.2f} "
        f"({out['full_trained_params']} trained parameters, {out['full_step_ms']:.0f} ms/step), "
        f"LoRA {out['lora_ppl']:.2f} ({out['lora_trained_params']} trained, {out['lora_step_ms']:.0f} ms/step), "
        f"LoRA merged {out['merged_ppl']:.2f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--pretrain", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--bundle", default=None, help="write the LoRA trainer as a port-rt bundle (and data) here")
    a = ap.parse_args()
    run(a.steps, a.pretrain, a.batch, a.context, lr=a.lr, bundle=a.bundle)


if __name__ == "__main__":
    main()
