"""YAML configs -> frozen, typed objects (pydantic, extra="forbid").

Two kinds of file:
* experiment configs (``configs/*.yaml``): model, input, batch, data, device, budget, optimizer, solver, train;
* device descriptions (``configs/devices/*.yaml``): memory, accelerators, hand-off costs, optional storage.

Every error names the file, the dotted key, the bad value and what is allowed. Sizes accept ``64MB``
(10^6), ``1.5GiB`` (2^30) or plain bytes; budgets (``parse_budget``, the one budget syntax of configs, the
CLI's ``--budget`` and ``port.solve``) also accept ``NN%`` of the keep-everything peak.
"""
from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from port.errors import ConfigError
from port.exec.capi import MAX_THREADS


def shipped_dir(name: str) -> Path:
    """A folder of files PORT ships (``configs``: the experiment configs and, under ``devices/``, the device
    descriptions). In an installed wheel it is package data, ``port/<name>/`` (importlib.resources; setup.py's
    build_py copies it there); in a checkout (editable install, PYTHONPATH) the repository's top-level
    ``<name>/``, its one source. Paths a user gives are never looked up here: they are relative to the working
    directory."""
    import importlib.resources
    packaged = importlib.resources.files("port") / name
    if packaged.is_dir():
        return Path(str(packaged))      # a wheel installs unzipped: the Traversable is a file-system path
    return Path(__file__).resolve().parent.parent / name


CONFIG_DIR = shipped_dir("configs")
DEVICE_DIR = CONFIG_DIR / "devices"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
SIZE_HELP = "a size such as 64MB, 1.5GiB, 512KiB or a number of bytes"
BUDGET_HELP = ("a size such as 64MB (10^6), 1.5GiB (2^30) or a number of bytes, or a percentage of the "
               "keep-everything peak such as 75%")


def parse_size(value: Any) -> int:
    """'64MB' -> 64_000_000, '1.5GiB' -> 1610612736, 4096 -> 4096. Raises ValueError with the allowed forms."""
    import numbers
    if isinstance(value, bool):
        raise ValueError(f"expected {SIZE_HELP}")
    if isinstance(value, numbers.Integral):      # int, numpy integers
        if value < 0:
            raise ValueError(f"a size must be >= 0, expected {SIZE_HELP}")
        return int(value)
    if isinstance(value, numbers.Real):          # float, numpy floats
        if value < 0 or not math.isfinite(value) or value >= 2**63:
            raise ValueError(f"expected {SIZE_HELP}")
        return int(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2).lower() in _UNITS:
            n = float(m.group(1)) * _UNITS[m.group(2).lower()]
            if not math.isfinite(n) or n >= 2**63:
                raise ValueError(f"a size must be below 2^63 bytes, expected {SIZE_HELP}")
            return int(n)
    raise ValueError(f"expected {SIZE_HELP}")


def parse_budget(value: Any) -> int | str:
    """The one budget syntax (config key ``budget``, ``--budget``, ``port.solve(..., budget=...)``): a number of
    bytes, a size (``64MB`` = 64 * 10^6, ``1.5GiB`` = 1.5 * 2^30) or ``NN%`` of the keep-everything peak.
    Returns the bytes (int) or the normalised percentage text (``"75%"``); raises ValueError naming the forms.
    Turned into bytes by port.solver.budget, the one budget rule (percentages, and no budget)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            pct = float(value.strip()[:-1])
        except ValueError:
            pct = -1.0
        if not (0 < pct <= 1000) or not math.isfinite(pct):
            raise ValueError(f"a percentage budget must be in (0%, 1000%]; or give {SIZE_HELP}")
        return f"{pct:g}%"
    try:
        return parse_size(value)
    except ValueError:
        raise ValueError(f"expected {BUDGET_HELP}") from None


def parse_budget_option(value: Any, what: str = "--budget") -> int | str:
    """parse_budget with the option or key (``what``) named in the error: ConfigError (exit 2)."""
    try:
        return parse_budget(value)
    except ValueError as e:
        raise ConfigError(f"{what} {value!r}: {e}") from None


def format_budget(spec: int | str | None) -> str:
    """A parsed budget as text: '75%' stays, bytes are formatted with their exact value."""
    if spec is None:
        return "the device memory"
    if isinstance(spec, str):
        return spec
    return f"{format_size(spec)} ({spec} B)"


def format_size(n: int | float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


NAME_HELP = ("a run name: letters, digits, '.', '_' or '-', starting with a letter or digit, at most 100 "
             "characters (it names runs/<name>/ and profiles/<device>/<name>.json)")
DEVICE_NAME_HELP = ("a device name: letters, digits, '.', '_' or '-', starting with a letter or digit, at most 100 "
                    "characters (it names the folder profiles/<device>/)")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def check_name(v: str, help: str = NAME_HELP) -> str:
    """A name that becomes one path component (runs/<name>/, profiles/<device>/): no separators, no '..', not
    hidden, not absolute. Raises ValueError naming the allowed form."""
    if not isinstance(v, str) or not _NAME_RE.match(v) or ".." in v:
        raise ValueError(f"expected {help}")
    return v


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _size_field(v: Any) -> Optional[int]:
    if v is None:
        return None
    return parse_size(v)


# ---------------------------------------------------------------------------------------------
# device descriptions
# ---------------------------------------------------------------------------------------------
class AcceleratorConfig(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    kind: Literal["cpu", "gpu", "npu"]
    backend: Literal["c", "torch-cpu", "torch-cuda", "torch-mps", "opencl", "modeled"]
    threads: int = Field(default=1, ge=1, le=MAX_THREADS)
    peak_gflops: float = Field(gt=0)            # for the roofline model
    mem_gbps: float = Field(gt=0)               # memory bandwidth, GB/s
    memory_cap: Optional[int] = None            # bytes this engine may use (None: the device memory)
    memory: Literal["host", "own"] = "host"     # own: the engine has its own memory (discrete), its own arena
                                                # of at most memory_cap, copies at hand-offs (port.lower.memories)
    shares_compute_with: Optional[str] = None   # another accelerator whose cores this engine computes on (PoCL's
                                                # CPU device and the C kernels): no overlap between them
    # the CPUs (Linux CPU numbers) this engine's threads run on; None: wherever the OS puts them. Acted on for an
    # opencl engine on cores of its own (host-opencl-split.yaml): its threads are created pinned there and the
    # creating (host) thread is then pinned to the host engines' (c, torch-cpu) cpus
    # (port.exec.backends.opencl.engine); a no-op, with a note in DeviceConfig.skipped, where this process may not
    # use them all (fewer CPUs) or the OS has no sched_setaffinity
    cpus: Optional[tuple[int, ...]] = None
    unsupported_ops: tuple[str, ...] = ()       # op kinds it cannot run (e.g. "max_pool2d")
    launch_overhead_us: float = Field(default=0.0, ge=0)
    power_w: Optional[float] = Field(default=None, gt=0)       # typical active power of this engine
    idle_power_w: Optional[float] = Field(default=None, ge=0)  # idle power (energy estimates)
    efficiency: dict[str, float] = Field(default_factory=dict)  # per op kind, from calibration (0..1]
    # present-or-skip: an optional accelerator whose requirement is not met on this machine is dropped
    # by load_device (with a note in DeviceConfig.skipped) instead of failing.
    optional: bool = False
    requires: Optional[Literal["cuda", "mps", "c-kernels", "opencl"]] = None

    _cap = field_validator("memory_cap", mode="before")(classmethod(lambda cls, v: _size_field(v)))

    @field_validator("cpus")
    @classmethod
    def _cpus(cls, v: Optional[tuple[int, ...]]) -> Optional[tuple[int, ...]]:
        if v is not None and (not v or min(v) < 0 or len(set(v)) != len(v)):
            raise ValueError("cpus: a non-empty list of distinct CPU numbers >= 0, e.g. [1]")
        return v

    @field_validator("efficiency")
    @classmethod
    def _eff_range(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if not (0 < x <= 1.5)}
        if bad:
            raise ValueError(f"efficiency values must be in (0, 1.5]; bad: {bad}")
        return v


def own_memory_backends(device: "DeviceConfig") -> tuple[str, ...]:
    """The backends of ``device``'s engines with their own memory (``memory: own``): lowering's own_memory."""
    return tuple(sorted({a.backend for a in device.accelerators if a.memory == "own"}))


class HandoffConfig(_Strict):
    src: str
    dst: str
    latency_us: float = Field(ge=0)
    gbps: float = Field(gt=0)                   # .inf for zero-copy (shared buffers)


class StorageConfig(_Strict):
    """Where paged tensors go. Figures given: used as they are (modeled devices must give them). Figures left
    out: ``port profile`` measures them on ``path`` (port.cost.storage); a modeled profile then has no storage
    (plans do not page). ``path``: directory of the spill files (default $PORT_SPILL_DIR, else the temp dir);
    ``drop_cache``: fdatasync + fadvise(DONTNEED) every page-out so the OS page cache does not keep the bytes."""
    bandwidth_gbps: Optional[float] = Field(default=None, gt=0)
    latency_ms: Optional[float] = Field(default=None, ge=0)
    capacity: Optional[int] = None
    path: Optional[str] = None
    drop_cache: bool = False

    @model_validator(mode="after")
    def _both_or_none(self) -> "StorageConfig":
        if (self.bandwidth_gbps is None) != (self.latency_ms is None):
            raise ValueError("storage: give both bandwidth_gbps and latency_ms, or neither (measured by "
                             "`port profile`)")
        return self

    @property
    def measured(self) -> bool:
        """True when the figures are to be measured (none declared)."""
        return self.bandwidth_gbps is None

    _cap = field_validator("capacity", mode="before")(classmethod(lambda cls, v: _size_field(v)))


class DeviceConfig(_Strict):
    name: str
    description: str = ""
    memory: int                                 # bytes available to training (unified memory)
    accelerators: tuple[AcceleratorConfig, ...] = Field(min_length=1)
    handoff: tuple[HandoffConfig, ...] = ()
    storage: Optional[StorageConfig] = None
    modeled: bool = False                       # True: a description of hardware that is not this machine
    skipped: tuple[str, ...] = ()               # filled by load_device: "<id>: <why>" for dropped optional engines
                                                # (and an OpenCL engine that runs another thread count)

    _mem = field_validator("memory", mode="before")(classmethod(lambda cls, v: parse_size(v)))
    _name = field_validator("name")(classmethod(lambda cls, v: check_name(v, DEVICE_NAME_HELP)))

    @model_validator(mode="after")
    def _check_ids(self) -> "DeviceConfig":
        ids = [a.id for a in self.accelerators]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"accelerator ids must be unique; repeated: {sorted(dup)}")
        for h in self.handoff:
            for end in (h.src, h.dst):
                if end not in ids:
                    raise ValueError(f"handoff names accelerator {end!r}, which is not one of {ids}")
        for a in self.accelerators:
            if a.shares_compute_with is not None and (a.shares_compute_with not in ids or a.shares_compute_with == a.id):
                raise ValueError(f"accelerator {a.id!r}: shares_compute_with {a.shares_compute_with!r} is not another "
                                 f"accelerator of this device; give one of {[i for i in ids if i != a.id]}")
            if a.memory == "own" and (a.backend != "opencl" or a.memory_cap is None):
                raise ValueError(f"accelerator {a.id!r}: memory: own needs backend opencl (the engine with a device "
                                 f"arena and copying hand-offs) and a memory_cap (its memory's size); got backend "
                                 f"{a.backend!r}, memory_cap {a.memory_cap}")
            if a.memory_cap is not None and a.memory_cap > self.memory:
                raise ValueError(f"accelerator {a.id!r}: memory_cap {a.memory_cap} exceeds the device memory "
                                 f"{self.memory}")
        return self

    @model_validator(mode="after")
    def _modeled_storage(self) -> "DeviceConfig":
        if self.modeled and self.storage is not None and self.storage.measured:
            raise ValueError("storage: a modeled device cannot measure its storage; give bandwidth_gbps and "
                             "latency_ms")
        return self

    def accelerator(self, aid: str) -> AcceleratorConfig:
        for a in self.accelerators:
            if a.id == aid:
                return a
        raise KeyError(f"device {self.name!r} has no accelerator {aid!r}; it has {[a.id for a in self.accelerators]}")


def requirement_met(req: Optional[str], threads: Optional[int] = None, cpus: Optional[tuple[int, ...]] = None,
                    host_cpus: tuple[int, ...] = ()) -> tuple[bool, str]:
    """(met, why not) for an accelerator's ``requires``; imports torch only when it must. ``threads``, ``cpus``:
    the accelerator's, ``host_cpus``: the host engines' (opencl: a CPU OpenCL device is set to run that many
    threads, the engine created pinned to ``cpus`` and the host thread to ``host_cpus``,
    port.exec.backends.opencl.available)."""
    import os
    if req is None:
        return True, ""
    if req == "cuda":
        if not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia")):
            return False, "no NVIDIA GPU on this machine"
        import torch
        return (True, "") if torch.cuda.is_available() else (False, "torch reports no usable CUDA device")
    if req == "mps":
        import sys
        if sys.platform != "darwin":
            return False, "MPS needs Apple silicon (macOS)"
        import torch
        return (True, "") if torch.backends.mps.is_available() else (False, "torch reports MPS unavailable")
    if req == "c-kernels":
        try:
            from port.exec import capi
            capi.load()
            return True, ""
        except Exception as e:  # noqa: BLE001 - any load failure means "not present"
            return False, f"PORT C kernels not loadable ({type(e).__name__}: {e})"
    if req == "opencl":
        from port.exec.backends.opencl import available
        return available(threads, cpus, host_cpus)
    return False, f"unknown requirement {req!r}"


def drop_absent(dev: DeviceConfig) -> DeviceConfig:
    """Drop optional accelerators whose ``requires`` is not met here (and hand-offs naming them)."""
    keep, notes = [], list(dev.skipped)
    for a in dev.accelerators:
        if a.optional:
            # an OpenCL engine on cores of its own (no shares_compute_with: host-opencl-split.yaml) runs its
            # YAML's thread count where this process has not created the engine yet (else a note says what it
            # runs); one sharing the C kernels' cores runs what the OpenCL device gives
            # and is created on its YAML's cpus (the host thread then on the host engines' cpus)
            own_cores = a.backend == "opencl" and a.shares_compute_with is None
            host_cpus = tuple(sorted({c for b in dev.accelerators if b.backend in ("c", "torch-cpu") for c in
                                      b.cpus or ()}))
            ok, why = requirement_met(a.requires, a.threads if own_cores else None, a.cpus if own_cores else None,
                                      host_cpus)
            if not ok:
                notes.append(f"{a.id}: skipped ({why})")
                continue
            if own_cores:
                from port.exec.backends.opencl import pin_note, thread_note
                notes += [f"{a.id}: {n}" for n in (thread_note(a.threads), pin_note(a.cpus)) if n]
        keep.append(a)
    if len(keep) == len(dev.accelerators):
        return dev if len(notes) == len(dev.skipped) else dev.model_copy(update={"skipped": tuple(notes)})
    if not keep:
        raise ConfigError(f"device {dev.name!r}: every accelerator is optional and absent: {'; '.join(notes)}")
    ids = {a.id for a in keep}
    hand = tuple(h for h in dev.handoff if h.src in ids and h.dst in ids)
    return dev.model_copy(update={"accelerators": tuple(keep), "handoff": hand, "skipped": tuple(notes)})


# ---------------------------------------------------------------------------------------------
# experiment configs
# ---------------------------------------------------------------------------------------------
class ModelConfig(_Strict):
    name: str                                   # zoo name or 'package.module:factory'
    kwargs: dict[str, Any] = Field(default_factory=dict)


class DataConfig(_Strict):
    # synthetic | digits: float samples of input_shape; text | text_files: int64 byte tokens, input_shape [T]
    # (port.train.data)
    kind: Literal["synthetic", "digits", "text", "text_files"] = "synthetic"
    num_samples: int = Field(default=512, ge=1)
    test_fraction: float = Field(default=0.2, ge=0, lt=1, allow_inf_nan=False)
    seed: int = 0


class OptimizerConfig(_Strict):
    name: Literal["sgd", "sgd_momentum", "adamw"] = "sgd_momentum"
    lr: float = Field(default=0.05, gt=0, allow_inf_nan=False)
    momentum: float = Field(default=0.9, ge=0, lt=1, allow_inf_nan=False)
    nesterov: bool = False
    weight_decay: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(default=1e-8, gt=0, allow_inf_nan=False)

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(math.isfinite(b) and 0 <= b < 1 for b in v):
            raise ValueError("betas must be two numbers in [0, 1), e.g. [0.9, 0.999]")
        return v


SOLVER_NAMES = ("highs", "cbc", "scip", "cpsat", "greedy", "chen", "checkmate", "single")


class SolverConfig(_Strict):
    name: str = "highs"                         # one of SOLVER_NAMES, or single:<accelerator id>
    time_limit_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    gap: float = Field(default=0.01, ge=0, lt=1, allow_inf_nan=False)
    max_reruns: int = Field(default=3, ge=1, le=8)   # how often the ILP may re-run one op (multi-level recompute)

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v == "chen_sqrt":        # the name older configs used for Chen's sqrt(n) checkpointing
            return "chen"
        if v in SOLVER_NAMES or (v.startswith("single:") and len(v) > len("single:")):
            return v
        raise ValueError(f"unknown solver; choose one of {', '.join(SOLVER_NAMES)} or single:<accelerator id>")


class TrainConfig(_Strict):
    steps: int = Field(default=100, ge=0)
    epochs: Optional[int] = Field(default=None, ge=1)
    micro_batch: Optional[int] = Field(default=None, ge=1)
    trainable: Optional[tuple[str, ...]] = None
    checkpoint_every: int = Field(default=50, ge=1)
    eval_every: int = Field(default=0, ge=0)
    seed: int = 0
    # the kernels' thread count: an int (fixed), or "auto" (port.exec.threads.ThreadGovernor picks it from the
    # steps' own times: fewer while other processes keep the cores busy; the same bits as a fixed count);
    # None (unset) is "auto"
    threads: Optional[Union[int, Literal["auto"]]] = None
    # a step whose loss (or gradients) is not finite: "stop" (error naming the step; exit 2) or "skip" (the
    # update is not applied; a warning), e.g. when a too-large learning rate makes training diverge
    on_nonfinite: Literal["stop", "skip"] = "stop"

    @field_validator("threads", mode="before")
    @classmethod
    def _threads(cls, v: Any) -> Any:
        from port.exec.capi import max_threads   # max(64, 4 x the CPUs): huge counts crash the OpenMP runtime
        if v is None or v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= max_threads()):
            return v
        raise ValueError(f"expected a thread count >= 1 or 'auto', at most {max_threads()} (max(64, 4 x this "
                         f"machine's CPUs)) (e.g. train: {{threads: auto}} or --threads auto)")


class ExperimentConfig(_Strict):
    name: str
    model: ModelConfig
    input_shape: tuple[int, ...] = Field(min_length=1)   # per sample, e.g. [3, 32, 32]
    num_classes: int = Field(default=10, ge=2)
    batch_size: int = Field(default=8, ge=1)
    data: DataConfig = DataConfig()
    device: str = "host"                        # name in configs/devices/ or a path to a device YAML
    budget: Optional[Union[int, str]] = None    # bytes, or "NN%" of the naive peak (None: the device's memory)
    optimizer: OptimizerConfig = OptimizerConfig()
    solver: SolverConfig = SolverConfig()
    train: TrainConfig = TrainConfig()
    # `port federate`'s section (checked there, by port.federated.FederationSection); other commands ignore it
    federation: Optional[dict[str, Any]] = None

    @field_validator("budget", mode="before")
    @classmethod
    def _budget(cls, v: Any) -> Any:
        return None if v is None else parse_budget(v)

    _name = field_validator("name")(classmethod(lambda cls, v: check_name(v)))

    @field_validator("model", mode="before")
    @classmethod
    def _model_str(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @field_validator("input_shape")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(d <= 0 for d in v):
            raise ValueError("every dimension must be a positive integer, e.g. [3, 32, 32]")
        return v

    @model_validator(mode="after")
    def _token_data(self) -> "ExperimentConfig":
        kind = self.data.kind
        if kind not in ("text", "text_files"):
            return self
        if len(self.input_shape) != 1:
            raise ValueError(f"data.kind {kind} gives token sequences: input_shape must be one number, the "
                             f"sequence length (e.g. [128]); got {list(self.input_shape)}")
        if kind == "text" and self.num_classes != 256:
            raise ValueError(f"data.kind text is next-byte prediction over 256 byte values: num_classes must be "
                             f"256 (the vocabulary); got {self.num_classes}")
        return self

    @model_validator(mode="after")
    def _micro_batch_divides(self) -> "ExperimentConfig":
        mb = self.train.micro_batch
        if mb is not None and self.batch_size % mb:
            raise ValueError(f"train.micro_batch {mb} must divide batch_size {self.batch_size} (micro-batches "
                             f"accumulate gradients over the batch); use a divisor of {self.batch_size}")
        return self


class ProfileOptions(_Strict):
    """`port profile`'s measuring options (the CLI flags go through this schema: one set of rules)."""
    max_time_s: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)
    blocks: Optional[int] = Field(default=None, ge=1)
    block_ms: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)
    threads: Optional[int] = Field(default=None, ge=1, le=MAX_THREADS)


_FLAG_OF = {"max_time_s": "--max-time", "blocks": "--blocks", "block_ms": "--block-ms", "threads": "--threads",
            "time_limit_s": "--time-limit", "gap": "--gap", "steps": "--steps"}


def validate_options(model: type[BaseModel], values: dict[str, Any]) -> BaseModel:
    """Command-line flags through a config schema; errors name the flag, the value and what is allowed."""
    try:
        return model.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as e:
        lines = []
        for x in e.errors(include_url=False):
            key = str(x["loc"][0]) if x["loc"] else "?"
            lines.append(f"{_FLAG_OF.get(key, key)} {x.get('input')!r}: {x['msg']}")
        raise ConfigError("\n".join(lines)) from None


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------
def _format_errors(path: Path | str, err: ValidationError, data: Any) -> str:
    lines = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"]) or "<top level>"
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if e["type"] == "extra_forbidden":
            parent = e["loc"][:-1]
            allowed = _allowed_keys(err, parent)
            msg = f"unknown key (typo?); allowed keys here: {allowed}" if allowed else "unknown key (typo?)"
            lines.append(f"{path}: key '{loc}': {msg}")
            continue
        if e["type"] == "missing":
            lines.append(f"{path}: key '{loc}' is required but missing")
            continue
        if not e["loc"]:     # a check across keys (model validator): the message names the keys
            lines.append(f"{path}: {msg}")
            continue
        val = e.get("input")
        lines.append(f"{path}: key '{loc}': {msg} (got {val!r})")
    return "\n".join(lines)


def _allowed_keys(err: ValidationError, parent: tuple) -> str:
    model = _MODEL_FOR_ERROR.get(err.title)
    if model is None:
        return ""
    for p in parent:
        if isinstance(p, int):
            continue
        field = model.model_fields.get(str(p))
        if field is None:
            return ""
        ann = field.annotation
        inner = getattr(ann, "__args__", None)
        cand = [a for a in (inner or (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not cand:
            return ""
        model = cand[0]
    return ", ".join(model.model_fields)


_MODEL_FOR_ERROR: dict[str, type[BaseModel]] = {"ExperimentConfig": ExperimentConfig, "DeviceConfig": DeviceConfig}


@functools.lru_cache(maxsize=None)
def _unique_loader():
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        """safe_load that refuses a key given twice in one mapping (YAML would silently keep the last)."""

        def construct_mapping(self, node, deep=False):
            seen: dict = {}
            for k, _ in node.value:
                key = self.construct_object(k, deep=deep)
                try:
                    hash(key)
                except TypeError:
                    continue
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice (first on line {seen[key]}, again on line "
                        f"{k.start_mark.line + 1}); keep one", k.start_mark)
                seen[key] = k.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)
    return UniqueKeyLoader


def _read_yaml(path: Path) -> Any:
    import yaml
    if not path.exists():
        shipped = CONFIG_DIR / path.name
        hint = (f"; PORT ships one by that name: {shipped} (copy it, or give that path)"
                if not path.is_absolute() and shipped.is_file() and path.resolve() != shipped.resolve() else "")
        raise ConfigError(f"{path}: file not found (paths are relative to the working directory). Give a path "
                          f"to a YAML file (e.g. configs/default.yaml){hint}.")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory; give a YAML file.")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise ConfigError(f"{path}: line {line}: byte 0x{e.object[e.start]:02x} is not UTF-8 text; save the file "
                          f"as UTF-8") from None
    try:
        data = yaml.load(text, Loader=_unique_loader())
    except yaml.constructor.ConstructorError as e:
        if e.problem and e.problem.startswith("key ") and e.problem_mark is not None:
            raise ConfigError(f"{path}: line {e.problem_mark.line + 1}: {e.problem}") from None
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    return data


def load_device(name_or_path: str | Path, present_only: bool = True) -> DeviceConfig:
    """A device by name (configs/devices/<name>.yaml) or by path.

    present_only: drop ``optional`` accelerators whose ``requires`` is not met on this machine (noted in
    ``DeviceConfig.skipped``); False keeps the description as written (schema checks, modeled use)."""
    p = Path(name_or_path)
    if not p.suffix and not p.exists():
        p = DEVICE_DIR / f"{name_or_path}.yaml"
        if not p.exists():
            known = sorted(q.stem for q in DEVICE_DIR.glob("*.yaml"))
            raise ConfigError(f"device '{name_or_path}': no file {p}; known devices: {', '.join(known)}")
    data = _read_yaml(p)
    try:
        dev = DeviceConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(p, e, data)) from None
    return drop_absent(dev) if present_only else dev


def device_names() -> list[str]:
    """Names of the shipped device descriptions (configs/devices/*.yaml)."""
    return sorted(q.stem for q in DEVICE_DIR.glob("*.yaml"))


def load_experiment(path: str | Path) -> ExperimentConfig:
    p = Path(path)
    return validate_experiment(_read_yaml(p), p)


def validate_experiment(data: Any, where: str | Path) -> ExperimentConfig:
    """An ExperimentConfig from a mapping (a YAML file's content, or one built from command-line flags);
    errors name ``where``, the dotted key, the value and what is allowed."""
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(where, e, data)) from None


def resolve_device(cfg: ExperimentConfig, config_path: str | Path | None = None) -> DeviceConfig:
    """The experiment's device; a relative path is taken relative to the config file."""
    dev = cfg.device
    if config_path is not None and ("/" in dev or dev.endswith((".yaml", ".yml"))):
        cand = Path(config_path).parent / dev
        if cand.exists():
            return load_device(cand)
    try:
        return load_device(dev)
    except ConfigError as e:
        where = f"{config_path}: key 'device': " if config_path else ""
        raise ConfigError(f"{where}{e}") from None


def dump_experiment(cfg: ExperimentConfig) -> dict:
    d = cfg.model_dump(mode="json")
    if d.get("federation") is None:
        d.pop("federation", None)
    return d
