"""A Llama-style language model fine-tuned with LoRA on the device: the factory `port train` loads.

``make()`` builds a tiny Hugging Face ``LlamaForCausalLM`` from its constructor (random init; nothing is downloaded:
byte-level vocabulary of 256, RMSNorm, rotary embeddings, SwiGLU MLP, grouped-query attention with fewer key/value
heads than query heads) and wraps it with ``peft`` LoRA on the attention's q and v projections: the base weights are
frozen, only the adapters train. ``base=PATH`` starts from saved base weights (``finetune.py --pretrain`` writes
them) instead of the random init.
"""
from __future__ import annotations

import torch

LLAMA = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, attention_dropout=0.0,
             tie_word_embeddings=False, use_cache=False)


def import_hf():
    """transformers and peft. The PyPI torchvision is a CUDA build that fails to import against the CPU torch
    (transformers imports it): defining the two op schemas it registers fakes for lets it import."""
    try:
        torch.ops.torchvision.nms          # noqa: B018 - a working torchvision registered it already
    except (AttributeError, RuntimeError):
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
        import_hf.lib = lib                # kept alive
    import peft
    import transformers
    return transformers, peft


def base_model(seed: int = 0, **overrides):
    """The tiny LlamaForCausalLM (random init, seeded)."""
    transformers, _ = import_hf()
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**LLAMA, **overrides}))


def with_lora(model, rank: int = 8, alpha: float = 16.0):
    """peft LoRA on q_proj and v_proj (base frozen)."""
    _, peft = import_hf()
    cfg = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return peft.get_peft_model(model, cfg)


def make(num_classes: int = 256, rank: int = 8, alpha: float = 16.0, base: str | None = None, seed: int = 0):
    """The factory a config names (``model: llama_lora:make``): LoRA-wrapped tiny Llama over byte tokens."""
    if num_classes != LLAMA["vocab_size"]:
        raise ValueError(f"llama_lora: num_classes must be {LLAMA['vocab_size']} (byte vocabulary), got {num_classes}")
    m = base_model(seed)
    if base:
        m.load_state_dict(torch.load(base, weights_only=True))
    return with_lora(m, rank, alpha)
