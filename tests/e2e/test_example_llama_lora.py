"""examples/llama_lora/finetune.py (issue 54, section 3): a tiny HF Llama with peft LoRA on q/v trains with every
op on C under 60% of eager's measured memory, and its bundle continues the fine-tuning in port-rt, whose
held-out perplexity falls."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from published_zoo import published  # tests/published_zoo.py: bench/published.py as a module

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_llama_lora_example_fits_below_eager_and_continues_in_port_rt(port_rt, tmp_path, monkeypatch):
    if "peft" not in published().import_zoo():   # (torchvision's op schemas before transformers)
        pytest.skip("peft does not import here")
    monkeypatch.setenv("PATH", f"{Path(port_rt).parent}:{__import__('os').environ['PATH']}")
    spec = importlib.util.spec_from_file_location("llama_finetune", ROOT / "examples" / "llama_lora" / "finetune.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = mod.run(steps=3, pretrain=0, context=16, out=str(tmp_path / "run"), bundle=str(tmp_path / "b"),
                  verbose=False, rt_steps=12)
    assert res["torch_ops"] == 0
    assert res["budget_bytes"] == int(0.6 * res["eager_bytes"])        # 60% of eager's: feasible, not raised
    assert res["plan_peak_bytes"] <= res["budget_bytes"]
    rt = res["rt"]
    assert math.isfinite(rt["ppl_after"]) and rt["ppl_after"] < rt["ppl_before"], rt
