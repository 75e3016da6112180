"""Step 1: config -> Job. The resolved experiment config with command-line overrides, the device, where the
profile is (the location rule, :func:`profile_location`) and the budget as given."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from port.errors import ConfigError
from port.pipeline.common import PROFILE_DIR


@dataclass(frozen=True)
class Job:
    """What to do: the resolved config, the device, where the profile is, and the budget as given."""

    config: Any                       # port.config.ExperimentConfig (frozen)
    config_path: Optional[Path]       # None: built from command-line flags (`port inspect --model`)
    device: Any                       # port.config.DeviceConfig
    profile_path: Path                # the location rule's file, or the --profile file
    profile_explicit: bool            # True: given with --profile (never rewritten)
    budget: int | str | None          # parsed budget: bytes, "NN%" or None (device memory)
    budget_origin: str                # where the budget came from (printed)
    search_dirs: tuple[Path, ...]     # where `module:factory` models are imported from

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def where(self) -> str:
        """Prefix of error messages about config keys."""
        return f"{self.config_path}: " if self.config_path is not None else "command line: "

    @property
    def graph_batch(self) -> int:
        """The batch one program run processes: train.micro_batch when it is set, else batch_size."""
        mb = self.config.train.micro_batch
        return mb if mb and mb < self.config.batch_size else self.config.batch_size

    @property
    def command_hint(self) -> str:
        return str(self.config_path) if self.config_path is not None else "CONFIG"


def profile_location(config_name: str, device_name: str) -> Path:
    """The location rule: profiles/<device>/<config name>.json under the working directory."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", config_name).strip("._") or "model"
    return PROFILE_DIR / device_name / f"{safe}.json"



def parse_budget_option(value: Any, what: str = "--budget") -> int | str:
    """port.config.parse_budget_option (imported when called: port.pipeline imports no pydantic)."""
    from port.config import parse_budget_option as parse
    return parse(value, what)


def parse_shape(text: str, what: str = "--input") -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().replace(",", "x").split("x") if d.strip())
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise ConfigError(f"{what} {text!r}: expected a per-sample shape like 3x32x32 or 64")
    return dims


def _flag_data(model: str | None, input_shape: str | None, batch: int | None) -> dict[str, Any]:
    """Without a config file: the experiment config of `--model NAME [--input SHAPE] [--batch N]`."""
    from port import models
    if model is None:
        raise ConfigError("give a CONFIG file or --model NAME (zoo: " + ", ".join(models.names()) + ")")
    if ":" not in model and model not in models.ZOO:
        raise ConfigError(f"--model {model!r}: unknown model; the zoo has: {', '.join(models.names())} "
                          "(or give module:factory, with module.py in the working directory)")
    shape = parse_shape(input_shape) if input_shape else models.INPUT_SHAPES.get(model)
    if shape is None:
        raise ConfigError(f"--input is required for model {model!r} (e.g. --input 3x32x32)")
    run_name = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("._-") or "model"
    data = {"name": run_name, "model": {"name": model}, "input_shape": list(shape), "batch_size": batch or 8}
    if model in models.TOKEN_DATA:     # a zoo transformer: its own (real) text data, input_shape [T]
        kind, classes = models.TOKEN_DATA[model]
        data.update(data={"kind": kind}, num_classes=classes)
    return data


def _override(data: dict[str, Any], *, batch: int | None, optimizer: str | None, train: dict[str, Any] | None,
              trainable: Sequence[str] | None, solver: str | None, time_limit: float | None,
              gap: float | None) -> None:
    """Command-line overrides into the config data (checked afterwards by the same schema as the file's)."""
    if optimizer is not None:
        data.setdefault("optimizer", {})
        data["optimizer"] = dict(data["optimizer"], name=optimizer)
    if train:      # command-line overrides of train.* keys
        data["train"] = dict(data.get("train", {}), **{k: v for k, v in train.items() if v is not None})
    if trainable:
        data.setdefault("train", {})
        data["train"] = dict(data["train"], trainable=list(trainable))
    if solver is not None or time_limit is not None or gap is not None:
        s = dict(data.get("solver", {}))
        if solver is not None:
            s["name"] = solver
        if time_limit is not None:
            s["time_limit_s"] = time_limit
        if gap is not None:
            s["gap"] = gap
        data["solver"] = s
    if batch is not None:
        data["batch_size"] = batch


def _budget_given(budget: Any, cfg: Any, cpath: Optional[Path], dev: Any) -> tuple[int | str | None, str]:
    """The budget as given (parsed) and where it came from: --budget, else the config's key, else none (the
    device memory: port.solver.budget)."""
    if budget is not None:
        return parse_budget_option(budget), "--budget"
    if cfg.budget is not None:
        return cfg.budget, (f"{cpath}: key 'budget'" if cpath else "config")
    return None, f"device {dev.name!r} memory (no budget given)"


def _search_dirs(first: Sequence[Path], extra: Sequence[Path]) -> tuple[Path, ...]:
    dirs: list[Path] = []
    for d in [*first, *map(Path, extra), Path.cwd().resolve()]:
        if d not in dirs:
            dirs.append(d)
    return tuple(dirs)


def load_job(config: str | Path | None = None, *, model: str | None = None, input_shape: str | None = None,
             batch: int | None = None, trainable: Sequence[str] | None = None, optimizer: str | None = None,
             device: str | None = None, profile: str | Path | None = None, budget: Any = None,
             solver: str | None = None, time_limit: float | None = None, gap: float | None = None,
             extra_search_dirs: Sequence[Path] = (), train: dict[str, Any] | None = None) -> Job:
    """Resolve an experiment config (or, without one, ``model``/``input_shape``/``batch`` flags) with
    command-line overrides into a Job. Bad input raises ConfigError naming the file, key, value and fix."""
    from port import config as C
    if config is not None:
        cpath: Optional[Path] = Path(config)
        data = C.dump_experiment(C.load_experiment(cpath))
        where = f"{cpath} (with command-line options)"
        search = [cpath.resolve().parent]
    else:
        cpath, data, where, search = None, _flag_data(model, input_shape, batch), \
            "command line (--model/--input/--batch)", []
    _override(data, batch=batch, optimizer=optimizer, train=train, trainable=trainable, solver=solver,
              time_limit=time_limit, gap=gap)
    cfg = C.validate_experiment(data, where)
    dev = C.load_device(device) if device is not None else C.resolve_device(cfg, cpath)
    b, origin = _budget_given(budget, cfg, cpath, dev)
    if profile is not None:
        ppath, explicit = Path(profile), True
    else:
        ppath, explicit = profile_location(cfg.name, dev.name), False
    return Job(cfg, cpath, dev, ppath, explicit, b, origin, _search_dirs(search, extra_search_dirs))


def fixed_threads(cfg: Any) -> int | None:
    """train.threads when it is a count (profiling and a fixed-count run use it); None for "auto" / unset."""
    t = cfg.train.threads
    return t if isinstance(t, int) else None


def stand_in_backends(device: Any) -> dict[str, str]:
    """{accelerator id: "c"} for the device's modeled accelerators (absent here): the C kernels stand in."""
    return {a.id: "c" for a in device.accelerators if a.backend == "modeled"}
