"""`port train` on the transformer configs' data kinds (configs/gpt_tiny.yaml, configs/bert_tiny.yaml): int64 byte
tokens from the standard library's source, traced, profiled, solved under a budget, trained and exported, with
small model sizes so the run stays short."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def port_cli(*args, cwd, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="160", PORT_EXPORT="onnx,torch")   # transformers' exports
    return subprocess.run([sys.executable, "-m", "port.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)


@pytest.mark.parametrize("name", ["gpt_tiny", "bert_tiny"])
def test_port_train_on_a_transformer_config(tmp_path, name):
    cfg = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())
    cfg["model"]["kwargs"] = dict(layers=1, dim=32, heads=2, context=32)
    cfg.update(input_shape=[32], batch_size=4, budget="75%")
    cfg["data"] = dict(cfg["data"], num_samples=96)
    cfg["train"] = {"steps": 4, "checkpoint_every": 2, "eval_every": 2}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = port_cli("train", str(path), "--out", "runs", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    d = tmp_path / "runs" / name
    plan = json.loads((d / "plan.json").read_text())
    assert plan["predicted_peak_bytes"] <= plan["budget_bytes"]
    lines = [json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    assert "test accuracy" in r.stdout and (d / "model.onnx").exists()
    assert "export onnx failed" not in r.stdout and "export torch failed" not in r.stdout
