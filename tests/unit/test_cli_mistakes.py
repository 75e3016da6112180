"""The CLI exits 2 for every user mistake (issue 53): for each command, a missing file, a folder, a binary file and
a file of another kind (a plan where a config goes, a profile where a plan goes, a checkpoint anywhere), bad
option values, and configs whose values cannot work (a sequence longer than the model's context, float data for
a token model, a batch or data set larger than the machine's memory, a thread count the OpenMP runtime crashes
on, a model too large to build). Every case: exit 2, a message naming the file or key, no traceback.
In-process (port.cli.run) and on a fully modeled device, so nothing is measured."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from port import cli
from port import models as M

MODELED = "jetson-orin-nano"


def port(capsys, *args) -> tuple[int, str]:
    rc = cli.run([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out + out.err


def _yaml(path: Path, **d) -> Path:
    import yaml
    base = {"name": path.stem, "model": "mlp", "input_shape": [64], "batch_size": 8, "device": MODELED,
            "data": {"kind": "synthetic", "num_samples": 64}, "train": {"steps": 1, "checkpoint_every": 1}}
    base.update(d)
    path.write_text(yaml.safe_dump(base))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A config, its plan and profile, a checkpoint, a folder, a binary and a text file, and configs that cannot
    work. Made once (one modeled solve)."""
    d = tmp_path_factory.mktemp("mistakes")
    c = _yaml(d / "c.yaml")
    tiny_gpt = {"name": "gpt_tiny", "kwargs": {"layers": 1, "dim": 32, "heads": 2, "context": 16}}
    f = {
        "config": c,
        "dir": d / "adir",
        "binary": d / "blob.bin",
        "text": d / "notes.txt",
        "checkpoint": d / "ckpt.port",
        "plan": d / "plan.json",
        "profile": d / f"profiles/{MODELED}/c.json",
        "long_seq": _yaml(d / "longseq.yaml", model=tiny_gpt, input_shape=[40], num_classes=256,
                          data={"kind": "text", "num_samples": 16}),
        "float_tokens": _yaml(d / "floattok.yaml", model=tiny_gpt, input_shape=[16], num_classes=256),
        "huge_batch": _yaml(d / "hugebatch.yaml", batch_size=10**11),
        "huge_data": _yaml(d / "hugedata.yaml", data={"kind": "synthetic", "num_samples": 10**11}),
        "huge_model": _yaml(d / "hugemodel.yaml", num_classes=10**11),
        "bad_heads": _yaml(d / "badheads.yaml", model={"name": "gpt_tiny", "kwargs": {"dim": 32, "heads": 3}},
                           input_shape=[16], num_classes=256, data={"kind": "text", "num_samples": 16}),
        "few_classes": _yaml(d / "fewclasses.yaml", num_classes=5, data={"kind": "digits"}),
        "typo_trainable": _yaml(d / "typo.yaml", model="resnet8", input_shape=[3, 8, 8],
                                train={"steps": 1, "trainable": ["fc", "layer9"]}),
    }
    f["dir"].mkdir()
    f["binary"].write_bytes(bytes(range(256)) * 4)
    f["text"].write_text("just some notes\n")
    from port.train.optim import SGD
    from port.train.trainer import Trainer
    tr = Trainer(M.get("mlp", seed=0), torch.randn(8, 64), optimizer=SGD(0.1))
    tr.save_checkpoint(f["checkpoint"])
    tr.close()
    import os
    cwd = os.getcwd()
    os.chdir(d)
    try:
        rc = cli.run(["profile", str(c)]) or cli.run(["solve", str(c), "-o", str(f["plan"])])
    finally:
        os.chdir(cwd)
    assert rc == 0 and f["plan"].exists() and f["profile"].exists()
    assert json.loads(f["plan"].read_text())["format"] == "port-plan"
    return f


# (command line with {placeholders} from ``files``, what the message must name)
CASES = {
    # a missing file, a folder, a binary file, a file of another kind: every command that reads one
    "inspect-missing": ("inspect {dir}/missing.yaml", "missing.yaml"),
    "inspect-dir": ("inspect {dir}", "adir"),
    "inspect-binary": ("inspect {binary}", "blob.bin"),
    "inspect-checkpoint": ("inspect {checkpoint}", "ckpt.port"),
    "inspect-plan": ("inspect {plan}", "plan.json"),
    "inspect-text": ("inspect {text}", "notes.txt"),
    "inspect-profile-is-plan": ("inspect {config} --profile {plan}", "plan.json"),
    "profile-missing": ("profile {dir}/missing.yaml", "missing.yaml"),
    "profile-checkpoint": ("profile {checkpoint}", "ckpt.port"),
    "profile-merge-plan": ("profile --merge {profile} {plan} -o {dir}/m.json", "plan.json"),
    "profile-merge-binary": ("profile --merge {profile} {binary} -o {dir}/m.json", "blob.bin"),
    "profile-merge-missing": ("profile --merge {profile} {dir}/nope.json -o {dir}/m.json", "nope.json"),
    "solve-profile-is-plan": ("solve {config} --profile {plan}", "plan.json"),
    "solve-profile-is-checkpoint": ("solve {config} --profile {checkpoint}", "ckpt.port"),
    "solve-profile-is-dir": ("solve {config} --profile {dir}", "adir"),
    "solve-config-is-profile": ("solve {profile}", "c.json"),
    "show-missing": ("show {dir}/nope.json", "nope.json"),
    "show-profile": ("show {profile}", "c.json"),
    "show-checkpoint": ("show {checkpoint}", "ckpt.port"),
    "show-config": ("show {config}", "c.yaml"),
    "show-dir": ("show {dir}", "adir"),
    "train-config-is-plan": ("train {plan} --no-progress", "plan.json"),
    "train-profile-is-checkpoint": ("train {config} --profile {checkpoint} --out {dir}/runs --no-progress",
                                    "ckpt.port"),
    "report-file": ("report {config}", "c.yaml"),
    "report-empty-dir": ("report {dir}", "adir"),
    "compile-plan-is-profile": ("compile {config} -o {dir}/out1 --plan {profile}", "c.json"),
    "compile-plan-is-checkpoint": ("compile {config} -o {dir}/out2 --plan {checkpoint}", "ckpt.port"),
    "compile-out-is-file": ("compile {config} -o {text}", "notes.txt"),
    "federate-no-federation": ("federate {config}", "federation"),
    "federate-plan": ("federate {plan}", "plan.json"),
    "demo-profile-is-plan": ("demo --profile {plan} --no-progress", "plan.json"),
    # bad option values
    "inspect-batch-0": ("inspect {config} --batch 0", "--batch"),
    "inspect-input": ("inspect --model mlp --input 0x3", "--input"),
    "solve-budget": ("solve {config} --budget lots", "--budget"),
    "solve-gap": ("solve {config} --gap 2", "solver.gap"),
    "solve-time-limit": ("solve {config} --time-limit nan", "solver.time_limit_s"),
    "train-threads-0": ("train {config} --threads 0 --no-progress", "train.threads"),
    "train-threads-huge": ("train {config} --threads 100000 --no-progress", "(got 100000)"),
    "train-on-nonfinite": ("train {config} --on-nonfinite maybe --no-progress", "train.on_nonfinite"),
    "train-config-and-model": ("train {config} --model resnet8 --no-progress", "or --model/--input, not both"),
    "train-neither-config-nor-model": ("train --no-progress", "give a CONFIG file or --model NAME"),
    "train-unknown-model": ("train --model resnet9 --no-progress", "--model 'resnet9': unknown model"),
    "profile-all-modeled-and-config": ("profile {config} --all-modeled", "--all-modeled takes no CONFIG"),
    "profile-threads-huge": ("profile {config} --threads 5000", "--threads 5000"),
    "profile-max-time": ("profile {config} --max-time -1", "--max-time"),
    "compile-emit-samples": ("compile {config} -o {dir}/out3 --emit-samples 0", "--emit-samples"),
    # configs whose values cannot work
    "sequence-longer-than-context": ("inspect {long_seq}", "key 'input_shape'"),
    "train-sequence-longer-than-context": ("train {long_seq} --out {dir}/runs --no-progress", "sequence length 40"),
    "float-data-for-token-model": ("inspect {float_tokens}", "key 'data.kind'"),
    "batch-beyond-memory": ("inspect {huge_batch}", "key 'batch_size'"),
    "batch-flag-beyond-memory": ("inspect --model mlp --input 64 --batch 100000000000", "key 'batch_size'"),
    "data-beyond-memory": ("train {huge_data} --out {dir}/runs --no-progress", "key 'data.num_samples'"),
    "model-beyond-memory": ("inspect {huge_model}", "does not fit in this machine's memory"),
    "zoo-kwargs-refused": ("inspect {bad_heads}", "not divisible by heads=3"),
    "labels-beyond-num-classes": ("train {few_classes} --out {dir}/runs --no-progress", "key 'num_classes'"),
    "trainable-typo": ("inspect {typo_trainable}", "['layer9'] matched no module with parameters"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_user_mistake_exits_2_with_a_named_message(files, capsys, case):
    line, needle = CASES[case]
    args = [a.format(**files) for a in line.split()]
    rc, text = port(capsys, *args)
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]
    assert rc == 2, (rc, text[-2000:])
    assert needle in text, text[-2000:]
