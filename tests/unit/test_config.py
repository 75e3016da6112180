"""Config loading: every error names the file, the dotted key, the value and what is allowed."""
from __future__ import annotations

from pathlib import Path

import pytest

from port import config as C
from port.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name="exp.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


BASE = """
name: t
model: resnet8
input_shape: [3, 32, 32]
batch_size: 8
"""


@pytest.mark.parametrize("text,expected", [
    ("64MB", 64_000_000), ("1.5GiB", int(1.5 * 2**30)), ("512KiB", 512 * 1024), (4096, 4096),
    ("4096", 4096), ("2 GB", 2_000_000_000), ("1e3KB", 1_000_000),
])
def test_parse_size(text, expected):
    assert C.parse_size(text) == expected


@pytest.mark.parametrize("bad", ["64XB", "MB", "-5", -5, "1.2.3GB", True, None])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError, match="64MB"):
        C.parse_size(bad)


def test_every_shipped_config_loads():
    paths = sorted((ROOT / "configs").glob("*.yaml"))
    assert len(paths) >= 8
    for p in paths:
        cfg = C.load_experiment(p)
        assert cfg.batch_size >= 1
        C.resolve_device(cfg, p)


def test_zoo_has_a_config_per_model():
    from port import models
    shipped = {C.load_experiment(p).model.name for p in (ROOT / "configs").glob("*.yaml")}
    assert {n for n in models.names() if n not in ("resnet50", "resnet101")} <= shipped


def test_typo_key_is_an_error_with_allowed_keys(tmp_path):
    p = write(tmp_path, BASE + "optimizer: {name: sgd, lrr: 0.1}\n")
    with pytest.raises(ConfigError) as e:
        C.load_experiment(p)
    msg = str(e.value)
    assert str(p) in msg and "optimizer.lrr" in msg and "unknown key" in msg and "lr" in msg


@pytest.mark.parametrize("value,ok", [("2", 2), ("auto", "auto"), ("0", None), ("two", None), ("1.5", None),
                                      ("true", None)])
def test_train_threads_is_a_count_or_auto(tmp_path, value, ok):
    p = write(tmp_path, BASE + f"train: {{threads: {value}}}\n")
    if ok is None:
        with pytest.raises(ConfigError, match=r"key 'train.threads': expected a thread count >= 1 or 'auto'"):
            C.load_experiment(p)
    else:
        assert C.load_experiment(p).train.threads == ok


def test_top_level_typo(tmp_path):
    p = write(tmp_path, BASE + "bacth_size: 4\n")
    with pytest.raises(ConfigError, match=r"key 'bacth_size': unknown key .*allowed keys here: name, model"):
        C.load_experiment(p)


def test_bad_size_names_key_value_and_forms(tmp_path):
    p = write(tmp_path, BASE + "budget: 64XB\n")
    with pytest.raises(ConfigError) as e:
        C.load_experiment(p)
    msg = str(e.value)
    assert "key 'budget'" in msg and "'64XB'" in msg and "1.5GiB" in msg and str(p) in msg


def test_wrong_type_names_key_and_value(tmp_path):
    p = write(tmp_path, BASE.replace("batch_size: 8", "batch_size: many"))
    with pytest.raises(ConfigError) as e:
        C.load_experiment(p)
    assert "key 'batch_size'" in str(e.value) and "'many'" in str(e.value) and "integer" in str(e.value)


def test_bad_enum_lists_allowed(tmp_path):
    p = write(tmp_path, BASE + "solver: {name: gurobi}\n")
    with pytest.raises(ConfigError) as e:
        C.load_experiment(p)
    assert "solver.name" in str(e.value) and "highs" in str(e.value) and "'gurobi'" in str(e.value)


def test_missing_required_key(tmp_path):
    p = write(tmp_path, "name: t\ninput_shape: [3]\n")
    with pytest.raises(ConfigError, match=r"key 'model' is required"):
        C.load_experiment(p)


def test_missing_file():
    with pytest.raises(ConfigError, match=r"nope\.yaml: file not found"):
        C.load_experiment("nope.yaml")


def test_not_yaml_and_not_mapping(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        C.load_experiment(write(tmp_path, "a: [1, 2\n"))
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        C.load_experiment(write(tmp_path, "- 1\n- 2\n"))


def test_negative_shape(tmp_path):
    p = write(tmp_path, BASE.replace("[3, 32, 32]", "[3, -1, 32]"))
    with pytest.raises(ConfigError, match=r"key 'input_shape'.*positive"):
        C.load_experiment(p)


def test_configs_are_frozen():
    cfg = C.load_experiment(ROOT / "configs" / "default.yaml")
    with pytest.raises(Exception):
        cfg.batch_size = 3


def test_device_typo_and_unknown_device(tmp_path):
    p = write(tmp_path, "name: d\nmemory: 1GB\naccelerators:\n  - {id: cpu, kind: cpu, backend: c, peak_gflop: 10, mem_gbps: 5}\n", "d.yaml")
    with pytest.raises(ConfigError) as e:
        C.load_device(p)
    assert "accelerators.0.peak_gflop" in str(e.value) and "peak_gflops" in str(e.value)
    with pytest.raises(ConfigError, match="known devices: .*host"):
        C.load_device("no-such-device")


def test_device_handoff_must_name_known_accelerators(tmp_path):
    p = write(tmp_path, "name: d\nmemory: 1GB\naccelerators:\n  - {id: cpu, kind: cpu, backend: c, peak_gflops: 10, mem_gbps: 5}\n"
                        "handoff:\n  - {src: cpu, dst: gpu, latency_us: 1, gbps: 1}\n", "d.yaml")
    with pytest.raises(ConfigError, match="'gpu'"):
        C.load_device(p)


def test_host_device():
    d = C.load_device("host")
    ids = [a.id for a in d.accelerators]
    assert "cpu-c" in ids and "cpu-torch" in ids
    assert d.memory > 2**30


def test_budget_as_percentage(tmp_path):
    cfg = C.load_experiment(write(tmp_path, BASE + "budget: 60%\n"))
    from port.solver.budget import to_bytes
    assert cfg.budget == "60%" and to_bytes(cfg.budget, 1000, 10**9) == 600
    cfg = C.load_experiment(write(tmp_path, BASE + "budget: 64MB\n"))
    assert to_bytes(cfg.budget, 1000, 10**9) == 64_000_000
    assert C.load_experiment(write(tmp_path, BASE)).budget is None
    with pytest.raises(ConfigError, match="percentage"):
        C.load_experiment(write(tmp_path, BASE + "budget: 0%\n"))


@pytest.mark.parametrize("text,expected", [
    ("75%", "75%"), (" 12.5 % ", "12.5%"), ("64MB", 64_000_000), ("1.5GiB", int(1.5 * 2**30)), (4096, 4096),
    ("4096", 4096),
])
def test_parse_budget_one_syntax(text, expected):
    assert C.parse_budget(text) == expected


@pytest.mark.parametrize("bad", ["0%", "-5%", "abc%", "1001%", "64XB", "fast", True, -1])
def test_parse_budget_rejects_with_the_forms(bad):
    with pytest.raises(ValueError) as e:
        C.parse_budget(bad)
    assert "64MB" in str(e.value) or "percentage" in str(e.value)


def test_budget_to_bytes():
    from port.solver.budget import to_bytes
    assert to_bytes("50%", 1000, 10**9) == 500
    # an engine's resident footprint (within the peak) is a fixed cost: the percentage scales the rest
    assert to_bytes("50%", 1000, 10**9, engine_bytes=400) == 400 + 300
    assert to_bytes("100%", 1000, 10**9, engine_bytes=400) == 1000
    assert to_bytes(123, 1000, 10**9, engine_bytes=400) == 123
    assert to_bytes(123, 1000, 10**9) == 123
    assert to_bytes(None, 1000, 777) == 777
    with pytest.raises(ConfigError, match="budget"):
        to_bytes(None, 1000, 0)


def test_solver_names(tmp_path):
    assert C.load_experiment(write(tmp_path, BASE + "solver: {name: chen_sqrt}\n")).solver.name == "chen"
    assert C.load_experiment(write(tmp_path, BASE + "solver: {name: single:cpu-c}\n")).solver.name == "single:cpu-c"
    with pytest.raises(ConfigError, match=r"solver.name.*single:<accelerator id>"):
        C.load_experiment(write(tmp_path, BASE + "solver: {name: 'single:'}\n"))


def test_micro_batch_must_divide_batch_size(tmp_path):
    with pytest.raises(ConfigError) as e:
        C.load_experiment(write(tmp_path, BASE + "train: {micro_batch: 3}\n"))
    msg = str(e.value)
    assert str(tmp_path) in msg and "train.micro_batch 3" in msg and "batch_size 8" in msg
    assert C.load_experiment(write(tmp_path, BASE + "train: {micro_batch: 4}\n")).train.micro_batch == 4


def test_every_solver_name_is_a_solver():
    from port.solver import SOLVERS
    assert set(C.SOLVER_NAMES) <= set(SOLVERS)


@pytest.mark.parametrize("extra,match", [
    ("input_shape: [3, 32]\nnum_classes: 256\ndata: {kind: text}\n", r"input_shape must be one number"),
    ("input_shape: [64]\nnum_classes: 10\ndata: {kind: text}\n", r"num_classes must be 256"),
    ("input_shape: [3, 8, 8]\nnum_classes: 4\ndata: {kind: text_files}\n", r"input_shape must be one number"),
])
def test_token_data_needs_a_sequence_shape(tmp_path, extra, match):
    p = write(tmp_path, "name: t\nmodel: gpt_tiny\nbatch_size: 4\n" + extra)
    with pytest.raises(ConfigError, match=match) as e:
        C.load_experiment(p)
    assert str(p) in str(e.value)


def test_a_zoo_transformer_without_config_gets_its_text_data():
    from port.pipeline import load_job
    job = load_job(model="gpt_tiny")
    assert job.config.data.kind == "text" and job.config.num_classes == 256 and job.config.input_shape == (128,)
    job = load_job(model="bert_tiny", batch=2, input_shape="64")
    assert job.config.data.kind == "text_files" and job.config.num_classes == 4 and job.config.input_shape == (64,)


def test_a_missing_config_named_like_a_shipped_one_says_where_that_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"configs/resnet8\.yaml: file not found .*relative to the working "
                       r"directory.*PORT ships one by that name: ") as e:
        C.load_experiment("configs/resnet8.yaml")
    assert str(C.CONFIG_DIR / "resnet8.yaml") in str(e.value)
    with pytest.raises(ConfigError) as e:
        C.load_experiment("configs/mine.yaml")
    assert "ships" not in str(e.value)


def test_shipped_files_are_package_data_in_a_wheel_and_the_checkout_s_otherwise(tmp_path, monkeypatch):
    """port.config.shipped_dir: port/configs/ when the installed package has it (setup.py's build_py copies it
    into the wheel), else the checkout's top-level configs/."""
    import importlib.resources
    assert C.shipped_dir("configs") == ROOT / "configs" == C.CONFIG_DIR       # this checkout: no port/configs/
    (tmp_path / "configs").mkdir()
    monkeypatch.setattr(importlib.resources, "files", lambda pkg: tmp_path if pkg == "port" else None)
    assert C.shipped_dir("configs") == tmp_path / "configs"
