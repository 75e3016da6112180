"""Transformer graphs (the sequence-model op records of port.ops) against PyTorch's own accounting: FLOPs (FlopCounterMode), saved bytes
(saved_tensors_hooks), shapes, weight tying and LoRA's sparse update."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import port
from port.ir.fold import is_folded
from port.errors import PortTraceError
from port.transformers import bert_tiny, gpt_tiny, lora, merge_lora
from reference import flop_counts, saved_activation_bytes

N, T = 3, 24


def _models():
    torch.manual_seed(0)
    return {
        "gpt_tiny": (gpt_tiny(layers=2, dim=64, heads=4, context=T), torch.randint(0, 256, (N, T))),
        "bert_tiny": (bert_tiny(layers=2, dim=64, heads=2, context=T), torch.randint(1, 256, (N, T))),
        "gpt_untied": (gpt_tiny(layers=1, dim=32, heads=2, context=T, tie_weights=False), torch.randint(0, 256, (N, T))),
    }


@pytest.mark.parametrize("name", ["gpt_tiny", "bert_tiny", "gpt_untied"])
def test_flops_and_saved_bytes_match_torch(name):
    m, x = _models()[name]
    g = port.trace(m, x, name=name)
    fwd, bwd = flop_counts(m, x)
    t = g.totals()
    assert t["forward_flops"] == pytest.approx(fwd, rel=0.01)
    assert t["backward_flops"] == pytest.approx(bwd, rel=0.01)
    # Byte for byte, with three known differences: (1) torch's CPU attention kernel writes its output in
    # [N, T, H, d] layout, so o.transpose(1, 2).reshape(...) before the output projection is a free view, while
    # PORT's kernels read contiguous tensors and the projection saves a permuted copy (one [N, T, D] per layer);
    # (2) torch turns a boolean key mask into a float mask [N, 1, 1, T] per attention call, PORT keeps the one
    # bool mask; (3) autograd's loss also saves a 4-byte total_weight; (4) position ids built from the sequence
    # length (arange) are a constant the capture folds into a buffer (port.ir.fold): held, not saved.
    folded = sum(g.tensors[o.inputs[0]].bytes for o in g.ops
                 if o.kind == "embedding" and is_folded(g.tensors[o.inputs[0]].name))
    layers = sum(1 for o in g.ops if o.kind == "attention")
    masked = any(o.kind == "attention" and o.attr("mask") is not None for o in g.ops)
    d = g.tensors[next(o for o in g.ops if o.kind == "attention").outputs[0]].shape
    copy = layers * N * T * d[1] * d[3] * 4
    mask = (layers * N * T * 4 - N * T) if masked else 0
    assert t["naive_peak_activation_bytes"] == saved_activation_bytes(m, x) + copy - mask - 4 - folded


def test_shapes_kinds_and_tied_embedding():
    m, x = _models()["gpt_tiny"]
    g = port.trace(m, x)
    kinds = {o.kind for o in g.ops}
    assert {"embedding", "layer_norm", "attention", "gelu", "permute", "add_bcast",
            "attention.grad_input", "embedding.grad_weight"} <= kinds
    # the position ids (arange over the sequence) are folded at capture into one int64 buffer (port.ir.fold)
    assert "arange" not in kinds and [(t.shape, t.dtype) for t in g.tensors if is_folded(t.name)] == [((T,), "int64")]
    assert g.tensors[g.logits_id].shape == (N, T, 256) and g.tensors[g.label_id].shape == (N, T)
    tied = [t for t in g.parameters() if t.name == "tok.weight"]
    assert len(tied) == 1 and "head.weight" not in {t.name for t in g.parameters()}
    # the tied weight gets two gradient contributions (embedding and output projection), accumulated once
    acc = [o for o in g.ops if o.kind == "grad_accumulate" and g.tensors[o.outputs[0]].grad_of == tied[0].id]
    assert len(acc) == 1
    att = next(o for o in g.ops if o.kind == "attention")
    assert att.attr("causal") is True and att.attr("scale") == pytest.approx(1 / 4)
    loss = next(o for o in g.ops if o.kind == "cross_entropy")
    assert loss.attr("ignore_index") == -100


def test_bert_mask_and_pooling():
    m, x = _models()["bert_tiny"]
    g = port.trace(m, x)
    att = next(o for o in g.ops if o.kind == "attention")
    mask = g.tensors[att.inputs[3]]
    assert att.attr("mask") == "bool" and mask.dtype == "bool" and mask.shape == (N, 1, 1, T)
    assert any(o.kind == "ne_scalar" for o in g.ops) and any(o.kind == "mean_mid" for o in g.ops)
    assert g.tensors[g.logits_id].shape == (N, 2)


def test_lora_prunes_base_weight_gradients_and_merges():
    torch.manual_seed(0)
    base = gpt_tiny(layers=2, dim=32, heads=2, context=T)
    m = lora(base, targets=["*.attn.q", "*.attn.v"], rank=4, alpha=8)
    x = torch.randint(0, 256, (N, T))
    g = port.trace(m, x)
    trained = {g.tensors[t.grad_of].name for t in g.tensors if t.role == "gradient" and
               g.tensors[t.grad_of].role == "parameter"}
    assert trained and all(".lora_" in n for n in trained)
    assert len({n for n in trained}) == 2 * 2 * 2                       # 2 layers x (q, v) x (A, B)
    assert not any(o.kind == "linear.grad_weight" and "lora" not in o.layer for o in g.ops)
    assert g.totals()["grad_bytes"] < 0.05 * g.totals()["param_bytes"]
    # adapters start at zero (B = 0): the wrapped model equals the base; merged equals wrapped after a change
    with torch.no_grad():
        for mod in m.modules():
            if hasattr(mod, "lora_b"):
                mod.lora_b.weight.normal_()
    y = m(x)
    merged = merge_lora(m)
    assert not any(hasattr(mod, "lora_a") for mod in merged.modules())
    torch.testing.assert_close(merged(x), y, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="match no nn.Linear"):
        lora(gpt_tiny(layers=1, dim=32, heads=2, context=T), targets=["nothing.*"])


def test_sequence_ops_without_c_kernels_run_on_torch():
    """An embedding with padding_idx is the embedding kind, on C (port_embedding_backward_weight_pad skips the
    padding row); attention with dropout is the attention kind with its probability, on C (its mask drawn from the one
    counter-based generator, so the backward and a re-run draw the same one), not a torch_op."""
    from port import ops as records

    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.e = nn.Embedding(10, 8, padding_idx=0)

        def forward(self, x):
            return self.e(x).sum(1)
    g = port.trace(Bad(), torch.randint(0, 10, (2, 5)))
    e = g.op("e")
    assert e.kind == "embedding" and e.attr("padding_idx") == 0 and records.has_c("embedding", dict(e.attrs))

    class Drop(nn.Module):
        def __init__(self):
            super().__init__()
            self.e = nn.Embedding(10, 8)

        def forward(self, x):
            q = self.e(x).unsqueeze(1)
            return F.scaled_dot_product_attention(q, q, q, dropout_p=0.1).mean(2).flatten(1)
    g = port.trace(Drop(), torch.randint(0, 10, (2, 5)))
    att = [o for o in g.ops if o.kind == "attention"]
    assert att and att[0].attr("p") == pytest.approx(0.1) and records.has_c("attention", dict(att[0].attrs))
    assert not any(o.kind == "torch_op" for o in g.ops)
