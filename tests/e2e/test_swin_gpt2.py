"""Issue 54 for Swin-T and GPT-2: a tiny torchvision Swin block (shifted windows: pad to whole windows, roll,
the relative-position bias gathered from its table, the shifted-window mask, patch merging's strided slices) and
a tiny Hugging Face GPT-2 (Conv1D: addmm with W [in, out]) train like eager, with those ops on C."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import port
from port.ir.capture import torch_ops
from port.train.optim import SGD
from published_zoo import published  # tests/published_zoo.py: bench/published.py as a module

ZOO = published().import_zoo()


def _like_eager(model, x, y, steps=3, lr=0.05, loss=None):
    ref = copy.deepcopy(model)
    tr = port.Trainer(model, x, optimizer=SGD(lr))
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    for _ in range(steps):
        got = float(tr.step(x, y))
        opt.zero_grad()
        want = loss(ref, x, y)
        want.backward()
        opt.step()
        assert abs(got - want.item()) < 2e-5, (got, want.item())
    return tr


class _TinySwin(nn.Module):
    def __init__(self):
        super().__init__()
        from torchvision.models.swin_transformer import PatchMerging, SwinTransformerBlock
        torch.manual_seed(0)
        self.embed = nn.Conv2d(3, 8, 2, 2)
        self.b0 = SwinTransformerBlock(8, 2, [3, 3], [0, 0])
        self.b1 = SwinTransformerBlock(8, 2, [3, 3], [1, 1])       # shifted: roll, mask
        self.merge = PatchMerging(8)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):                                          # [N, 3, 10, 10] -> a 5 x 5 map: padded to 6
        h = self.embed(x).permute(0, 2, 3, 1)
        h = self.merge(self.b1(self.b0(h)))
        return self.fc(h.mean((1, 2)))


def test_tiny_swin_trains_like_eager_with_its_copies_on_c():
    if "torchvision" not in ZOO:
        pytest.skip("torchvision does not import here")
    x, y = torch.randn(2, 3, 10, 10), torch.tensor([1, 4])
    tr = _like_eager(_TinySwin(), x, y, loss=lambda m, x, y: nn.functional.cross_entropy(m(x), y))
    kinds = {o.kind for o in tr.graph.ops}
    assert {"roll", "pad", "embedding", "embedding.grad_weight", "narrow"} <= kinds, kinds
    # the shifted-window mask is built from shapes alone: folded at capture into one buffer (port.ir.fold);
    # only the mean over two dims remains on torch
    assert len(tr.graph.constants) == 1 and [a for _, a in torch_ops(tr.graph)] == ["reduce_mean"], \
        torch_ops(tr.graph)


def test_tiny_gpt2_trains_like_eager_with_conv1d_on_c():
    if "transformers" not in ZOO:
        pytest.skip("transformers does not import here")
    transformers = ZOO["transformers"]
    cfg = transformers.GPT2Config(vocab_size=37, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    m = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 37, (2, 9), generator=g)
    y = torch.roll(x, -1, 1)

    def loss(ref, x, y):
        logits = ref(x).logits
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    tr = _like_eager(m, x, y, loss=loss)
    lin = [o for o in tr.graph.ops if o.kind == "linear" and o.attr("weight_t")]
    assert len(lin) == 4, [o.name for o in lin]                   # c_attn, c_proj, mlp c_fc, mlp c_proj
    acc = {d.op: d.accelerator for d in tr.plan.ops}
    assert all(acc[o.id] == "cpu-c" for o in tr.graph.ops if o.kind.startswith("linear"))


@pytest.mark.parametrize("name", ["hf.bert_seqcls", "hf.llama_lm", "peft.lora_llama_lm"])
def test_folded_hf_models_run_all_c_and_train_in_port_rt_bit_for_bit(port_rt, tmp_path, name):
    """Hugging Face BERT (position ids, the token-type buffer expanded), Llama (the causal mask, rotary cos/sin
    from ``inv_freq``) and Llama with LoRA: capture folds their input-independent tensors into buffers
    (port.ir.fold), so every op is on C, and the compiled bundle trains in port-rt bit for bit like the Trainer."""
    import numpy as np
    from port.exec import capi
    from port.exec.bundle import write_bundle, write_data
    from port.ir.fold import is_folded
    P = published()
    if name.split(".")[0] == "peft" and "peft" not in ZOO or "transformers" not in ZOO:
        pytest.skip("transformers/peft do not import here")
    spec = P.MODELS[name]
    n = 16
    g = torch.Generator().manual_seed(2)
    x = torch.randint(1, spec.tokens, (n, *spec.input_shape), generator=g)
    y = torch.randint(0, spec.classes, (n, *spec.label_shape), generator=g)
    tr = port.Trainer(spec.build(), x[:4], optimizer=port.optim.SGD(0.05, momentum=0.9))
    assert tr.graph.constants and torch_ops(tr.graph) == [], torch_ops(tr.graph)
    assert all(d.accelerator == "cpu-c" for d in tr.plan.ops)
    if "llama" in name:         # repeat_kv's copies of the 2 key/value heads folded into the attention's reads
        att = [o for o in tr.graph.ops if o.kind == "attention"]
        assert att and all(o.attr("kv_heads") == 2 for o in att), [dict(o.attrs) for o in att]
    write_bundle(tr, tmp_path / "m.portrt")
    write_data(tmp_path / "d.portdata", x.numpy(), y.numpy(), spec.classes)
    import subprocess
    r = subprocess.run([str(port_rt), "train", str(tmp_path / "m.portrt"), "--data", str(tmp_path / "d.portdata"),
                        "--steps", "4", "--threads", str(capi.get_num_threads())], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    got = [np.float32(ln.split()[3]) for ln in r.stdout.splitlines() if ln.startswith("step ")]
    ref = [np.float32(tr.step(x[s * 4:(s + 1) * 4], y[s * 4:(s + 1) * 4])) for s in range(4)]
    assert [a.tobytes() for a in got] == [b.tobytes() for b in ref], list(zip(ref, got))
    assert not any(is_folded(k) for k in tr.state_dict())
