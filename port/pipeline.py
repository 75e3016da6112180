"""port.pipeline: config -> model -> graph -> profile -> plan (-> training run), the one path every command takes.

    job    = load_job("configs/default.yaml", budget="50%")   # Job: config, device, profile location, budget
    built  = build_graph(job)                                 # Built: model, example input, traced graph
    prof   = get_profile(job, built.graph)                    # ProfileStep: read, measured now, or modeled
    budget = resolve_budget(job, built.graph, prof.profile)   # Budget: bytes, with the keep-everything peak
    solved = solve_plan(job, built, prof, budget)             # Solved: the plan and its simulation
    result = run_training("configs/default.yaml")             # TrainResult (`port train`: all of the above)

`port inspect`, `profile`, `solve`, `show`, `train` and `demo` are thin wrappers around these functions; the
frozen dataclasses between the steps are what they print.

**Where a profile is** (the one rule): ``profiles/<device>/<config name>.json`` under the working directory
(``<config name>`` is the config's ``name`` key, ``<device>`` the device's ``name``), unless ``--profile PATH``
(``profile=`` here) names another file. ``port profile`` writes it; ``port solve`` and ``port train`` read it.
When it is missing, does not cover the graph, or was measured on another CPU model, the commands measure it
now (with a progress bar, reusing what still applies) and write it there. A file given with ``--profile`` is
never rewritten: if it is missing or does not cover the graph, the command stops and says so. A device with no
accelerator present on this machine (e.g. ``raspberry-pi-4b``) uses the file when one exists (measured there and
copied here) and the roofline model otherwise, and the commands say so; a device with present accelerators never
silently falls back to the roofline.

**Budgets** (one syntax: config key ``budget``, ``--budget``, ``port.solve(..., budget=...)``): bytes, a size
(``64MB``, ``1.5GiB``) or ``NN%`` of the **keep-everything peak**: the simulated peak memory of the plan that
keeps every activation and runs every op plain on one accelerator, which is what PyTorch eager holds
(:func:`keep_everything_peak`, the one definition). No budget: the device's memory.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import math
import re
import signal
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from port.errors import ConfigError, NonFiniteError, PortError, PortTraceError, ProfileError, TokenError

PROFILE_DIR = Path("profiles")       # relative to the working directory
KEEP_EVERYTHING = "keep-everything peak"
PROFILE_MAX_TIME_S = 600.0           # time budget of a profile measured implicitly (solve/train)

Echo = Callable[[str], None]


def _print(msg: str) -> None:
    print(msg, flush=True)


class Interrupted(BaseException):
    """SIGINT or SIGTERM stopped a command (after ``port train`` wrote its checkpoint). A BaseException, so
    no ``except Exception`` on the way swallows it; the CLI exits with 128 + the signal number."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message or f"interrupted by {signal.Signals(signum).name}")
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


# =============================================================================================
# config -> Job
# =============================================================================================
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
    """port.config.parse_budget with the option's name in the error (exit 2)."""
    from port.config import parse_budget
    try:
        return parse_budget(value)
    except ValueError as e:
        raise ConfigError(f"{what} {value!r}: {e}") from None


def parse_shape(text: str, what: str = "--input") -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().replace(",", "x").split("x") if d.strip())
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise ConfigError(f"{what} {text!r}: expected a per-sample shape like 3x32x32 or 64")
    return dims


def load_job(config: str | Path | None = None, *, model: str | None = None, input_shape: str | None = None,
             batch: int | None = None, trainable: Sequence[str] | None = None, optimizer: str | None = None,
             device: str | None = None, profile: str | Path | None = None, budget: Any = None,
             solver: str | None = None, time_limit: float | None = None, gap: float | None = None,
             extra_search_dirs: Sequence[Path] = (), train: dict[str, Any] | None = None) -> Job:
    """Resolve an experiment config (or, without one, ``model``/``input_shape``/``batch`` flags) with
    command-line overrides into a Job. Bad input raises ConfigError naming the file, key, value and fix."""
    from port import config as C

    over: dict[str, Any] = {}
    if config is not None:
        cpath = Path(config)
        data = C.dump_experiment(C.load_experiment(cpath))
        where: str | Path = f"{cpath} (with command-line options)"
        search = [cpath.resolve().parent]
    else:
        from port import models
        cpath = None
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
        where = "command line (--model/--input/--batch)"
        search = []
    if batch is not None:
        over["batch_size"] = batch
    if optimizer is not None:
        data.setdefault("optimizer", {})
        data["optimizer"] = dict(data["optimizer"], name=optimizer)
    if train:      # command-line overrides of train.* keys, checked by the same schema as the file's
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
    data.update(over)
    cfg = C.validate_experiment(data, where)
    # device
    if device is not None:
        dev = C.load_device(device)
    else:
        dev = C.resolve_device(cfg, cpath)
    # budget
    if budget is not None:
        b, origin = parse_budget_option(budget), "--budget"
    elif cfg.budget is not None:
        b, origin = cfg.budget, (f"{cpath}: key 'budget'" if cpath else "config")
    else:
        b, origin = None, f"device {dev.name!r} memory (no budget given)"
    # profile
    if profile is not None:
        ppath, explicit = Path(profile), True
    else:
        ppath, explicit = profile_location(cfg.name, dev.name), False
    cwd = Path.cwd().resolve()
    dirs: list[Path] = []
    for d in [*search, *map(Path, extra_search_dirs), cwd]:
        if d not in dirs:
            dirs.append(d)
    return Job(cfg, cpath, dev, ppath, explicit, b, origin, tuple(dirs))


# =============================================================================================
# Job -> model -> graph
# =============================================================================================
@dataclass(frozen=True)
class Built:
    """The model and the training graph the pipeline profiles, solves and trains."""

    model: Any                        # torch.nn.Module
    example: Any                      # torch tensor [batch_size, *input_shape] (float32, or int64 tokens)
    graph: Any                        # port.ir.types.Graph traced at the job's graph batch
    trainable: Optional[tuple[str, ...]]
    optimizer: Any                    # port.train.optim.SGD | AdamW (from the config)

    @property
    def title(self) -> str:
        g = self.graph
        return (f"{g.name} batch {g.batch_size} input {'x'.join(map(str, self.example.shape[1:]))} "
                f"optimizer {g.optimizer}")


def factory_dir(spec: str, search_dirs: Sequence[Path]) -> Optional[Path]:
    """The first of ``search_dirs`` that holds the top-level module of ``spec``'s ``module`` as a file
    (``mynet.py``) or a regular package (``mynet/__init__.py``); None: it comes from the Python path."""
    from importlib.machinery import PathFinder
    top = spec.partition(":")[0].split(".")[0]
    if not top:
        return None
    for d in search_dirs:
        found = PathFinder.find_spec(top, [str(d)])
        if found is not None and found.origin is not None and found.loader is not None:   # not a bare folder
            return Path(d)
    return None


@contextlib.contextmanager
def scoped_path(folder: Optional[Path]) -> Iterator[None]:
    """``folder`` first on sys.path for the block only (the user's model module and the modules beside it that
    it imports); nothing when ``folder`` is None. The folder never stays on sys.path: a file there named like an
    installed module (``onnxruntime.py``) must not replace that module for the rest of the process."""
    if folder is None:
        yield
        return
    d = str(folder)
    sys.path.insert(0, d)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        try:
            sys.path.remove(d)        # the first occurrence: the one inserted above
        except ValueError:
            pass


def import_factory(spec: str, search_dirs: Sequence[Path], where: str = "") -> Callable[..., Any]:
    """``module:factory`` -> the factory, importing ``module`` from the first of ``search_dirs`` (the config file's
    folder and the working directory, in that order) that holds it, else from the Python path. Only that folder,
    and only during the import, is on sys.path (:func:`scoped_path`). Errors name what was searched (exit 2)."""
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise ConfigError(f"{where}key 'model.name': {spec!r}: expected module:factory (e.g. mynet:make)")
    rel = mod_name.replace(".", "/")
    try:
        with scoped_path(factory_dir(spec, search_dirs)):
            module = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        top = mod_name.split(".")[0]
        if e.name in (mod_name, top) or (e.name and mod_name.startswith(e.name + ".")):
            searched = [str(Path(d) / f"{rel}.py") for d in search_dirs]
            raise ConfigError(f"{where}key 'model.name': cannot import module {mod_name!r} of {spec!r}: looked "
                              f"for {', '.join(searched)} (and packages {rel}/ there) and on the Python path. "
                              f"Fix: put {rel}.py beside the config file or in the working directory, or "
                              f"install the package") from None
        raise ConfigError(f"{where}key 'model.name': importing {mod_name!r} of {spec!r} failed: {e}; install "
                          f"the missing package") from None
    except SyntaxError as e:
        raise ConfigError(f"{where}key 'model.name': {e.filename}:{e.lineno}: syntax error in the model module: "
                          f"{e.msg}") from None
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        have = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(f"{where}key 'model.name': module {mod_name!r} ({getattr(module, '__file__', '?')}) has "
                          f"no callable {attr!r}; it has: {', '.join(have) or 'nothing callable'}")
    return fn


def load_model(job: Job, seed: int | None = None) -> Any:
    """The job's nn.Module: a zoo model (with ``num_classes`` and seeded weights) or ``module:factory``."""
    import inspect

    import torch
    from port import models
    cfg = job.config
    spec, kwargs = cfg.model.name, dict(cfg.model.kwargs)
    seed = cfg.train.seed if seed is None else seed
    if ":" not in spec:
        if spec not in models.ZOO:
            raise ConfigError(f"{job.where}key 'model.name': unknown model {spec!r}; the zoo has: "
                              f"{', '.join(models.names())}; or give module:factory (module.py beside the config "
                              f"file or in the working directory)")
        kwargs.setdefault("num_classes", cfg.num_classes)
        try:     # zoo factories take **kw: a wrong keyword shows up as a TypeError of the call
            return models.get(spec, seed=seed, **kwargs)
        except (TypeError, ValueError) as e:     # a ValueError: a value the zoo model refuses (dim % heads)
            raise ConfigError(f"{job.where}key 'model.kwargs': {kwargs} do not fit zoo model {spec!r}: {e}") from None
        except (RuntimeError, MemoryError) as e:
            if "allocate" not in str(e) and not isinstance(e, MemoryError):
                raise
            raise ConfigError(f"{job.where}keys 'model.kwargs' / 'num_classes': zoo model {spec!r} with {kwargs} "
                              f"does not fit in this machine's memory ({str(e).splitlines()[-1][:200]}). Fix: "
                              f"smaller sizes (num_classes, hidden widths, layers)") from None
    factory = import_factory(spec, job.search_dirs, job.where)
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{job.where}key 'model.kwargs': {kwargs} do not fit {spec!r}: {e}") from None
    except ValueError:       # no signature available (C callables): let the call decide
        pass
    torch.manual_seed(seed)
    with scoped_path(factory_dir(spec, job.search_dirs)):     # a factory's lazy imports of modules beside it
        return factory(**kwargs)  # an exception inside the user's factory is theirs (exit 1, with traceback)


def build_graph(job: Job, seed: int | None = None) -> Built:
    """Model and training graph (traced at the job's graph batch: train.micro_batch when set)."""
    import torch
    from port.ir.trace import trace
    from port.train.optim import from_config
    cfg = job.config
    model = load_model(job, seed)
    gen = torch.Generator().manual_seed(cfg.train.seed if seed is None else seed)
    from port import models
    from port.train.data import is_tokens
    _check_fits(job, cfg.batch_size, "batch_size", "one batch")
    example = models.example_input(cfg.batch_size, tuple(cfg.input_shape), is_tokens(cfg), gen)
    opt = from_config(cfg.optimizer)
    trainable = tuple(cfg.train.trainable) if cfg.train.trainable else None
    x = example[:job.graph_batch]
    import contextlib
    import io
    err = io.StringIO()       # torch's shape propagation prints a traceback before it raises: held back here
    try:
        with contextlib.redirect_stderr(err):
            graph = trace(model, x, trainable=list(trainable) if trainable else None, optimizer=opt.graph_name,
                          name=cfg.model.name)
    except TokenError as e:      # the config's token data does not fit the model's embeddings
        key = {"length": "input_shape", "dtype": "data.kind"}.get(e.kind, "model")
        raise ConfigError(f"{job.where}key {key!r}: the job's inputs (data.kind {cfg.data.kind}" + (
            ": byte ids 0..255" if is_tokens(cfg) else "") + f", input_shape {list(cfg.input_shape)}) do not fit "
            f"model {cfg.model.name!r}: {e}") from None
    except (PortTraceError, RuntimeError):
        why = _eager_failure(model, x)
        if why is not None:   # the model does not even run on this input: the config's input_shape is wrong
            raise ConfigError(f"{job.where}key 'input_shape': {list(cfg.input_shape)} does not fit model "
                              f"{cfg.model.name!r}: running it on a batch of shape {list(x.shape)} fails with "
                              f"{why}. Fix: set input_shape to the per-sample shape the model takes (without the "
                              f"batch dimension)") from None
        sys.stderr.write(err.getvalue())
        raise
    sys.stderr.write(err.getvalue())
    return Built(model, example, graph, trainable, opt)


def _eager_failure(model: Any, x: Any) -> Optional[str]:
    import copy

    import torch
    try:
        m = copy.deepcopy(model).eval()
        with torch.no_grad():
            m(x)
    except Exception as e:  # noqa: BLE001 - any failure of the plain forward pass
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


# =============================================================================================
# graph -> profile
# =============================================================================================
@dataclass(frozen=True)
class ProfileStep:
    """The profile a command uses and where it came from."""

    profile: Any                      # port.cost.types.Profile
    path: Optional[Path]              # the file read or written; None: roofline model, not stored
    source: str                       # "file" | "measured" | "modeled"
    note: str                         # one line every command prints ("profile: ...")


def present_accelerators(device: Any) -> tuple[str, ...]:
    """Ids of the device's accelerators present (measurable) on this machine."""
    if device.modeled:
        return ()
    from port.cost.runners import backend_available
    return tuple(a.id for a in device.accelerators if a.backend != "modeled" and backend_available(a.backend)[0])


def uncovered(profile: Any, graph: Any) -> list[str]:
    """Op signatures of ``graph`` the profile has no entry for."""
    out: list[str] = []
    for o in graph.ops:
        s = graph.signature(o)
        if not profile.options(s) and s not in out:
            out.append(s)
    return out


def _this_cpu() -> str:
    from port.cost.measure import host_info
    return host_info().get("cpu", "")


def stale_reason(profile: Any) -> Optional[str]:
    """Why a profile's measurements do not apply here (measured on another CPU model or with another build of
    the C kernels), or None."""
    if not any(e.measured for e in profile.entries):
        return None
    theirs = dict(profile.host).get("cpu")
    ours = _this_cpu()
    if theirs and ours and theirs != ours:
        return (f"it was measured on another CPU model ({theirs!r}; this machine has {ours!r}): per-op times do "
                f"not carry over between CPU models")
    from port.exec.capi import build_id
    kb, now = dict(profile.host).get("kernels_build", ""), build_id()
    if now and kb != now:
        return (f"it was measured with another build of PORT's C kernels ({kb or 'unrecorded'}, this one is "
                f"{now})")
    return None


def outdated_format(path: Path) -> Optional[str]:
    """Why the profile file at ``path`` is of another (older) format version than this PORT reads, or None.
    Such a file can be neither used nor reused as a cache: it is measured again."""
    from port.cost.types import PROFILE_FORMAT_VERSION
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None                # unreadable: load_profile says so, naming the file
    ver = d.get("version") if isinstance(d, dict) and d.get("format") == "port-profile" else None
    if ver is None or ver == PROFILE_FORMAT_VERSION:
        return None
    return f"it is in profile format version {ver!r}, this PORT reads version {PROFILE_FORMAT_VERSION}"


def _profile_summary(profile: Any, present: Sequence[str]) -> str:
    n = len(profile.entries)
    meas = sum(e.measured for e in profile.entries)
    gaps = sum(1 for e in profile.entries if not e.measured and e.accelerator in present)
    s = f"{n} entries, {meas} measured"
    if gaps:
        s += (f", {gaps} modeled on present accelerators (not reached by --max-time or failed: `port profile` "
              f"measures them)")
    return s


def optimizer_kwargs(cfg: Any) -> dict:
    o = cfg.optimizer
    if o.name == "adamw":
        return {"lr": o.lr, "betas": o.betas, "eps": o.eps, "weight_decay": o.weight_decay}
    return {"lr": o.lr, "momentum": o.momentum, "weight_decay": o.weight_decay}


def find_profile(job: Job, graph: Any) -> Optional[ProfileStep]:
    """The profile at the job's location when it exists and covers ``graph`` (never measures); None else."""
    path = job.profile_path
    if not path.exists():
        if job.profile_explicit:
            raise ProfileError(f"{path}: profile file not found (given with --profile); create it with "
                               f"`port profile {job.command_hint} -o {path}`")
        return None
    if not job.profile_explicit and outdated_format(path):
        return None
    from port.cost.io import load_profile
    prof = load_profile(path, device=job.device.name)
    if uncovered(prof, graph):
        if job.profile_explicit:
            raise ProfileError(f"{path}: does not cover this graph; run `port profile {job.command_hint} -o {path}`")
        return None
    return ProfileStep(prof, path, "file", f"profile: {path} ({_profile_summary(prof, ())})")


def get_profile(job: Job, graph: Any, *, measure: bool = True, replan_signatures: Sequence[str] = (),
                progress: bool = True, echo: Echo = _print, max_time_s: float | None = PROFILE_MAX_TIME_S
                ) -> ProfileStep:
    """The profile ``graph`` is solved with (see the module docstring for the location rule).

    measure=False: never measure; a missing or insufficient file is an error naming it.
    replan_signatures: op signatures to measure again (`port train --replan`)."""
    from port.cost.io import load_profile
    dev, path = job.device, job.profile_path
    present = present_accelerators(dev)
    if not present:     # nothing to measure here: a profile file (e.g. measured on that device) or the roofline
        if job.profile_explicit or (path.exists() and not outdated_format(path)):
            prof = load_profile(path, device=dev.name)
            miss = uncovered(prof, graph)
            if not miss:
                return ProfileStep(prof, path, "file", f"profile: {path} ({_profile_summary(prof, present)})")
            if job.profile_explicit:
                raise ProfileError(f"{path}: does not cover {len(miss)} op signature(s) of this graph (e.g. "
                                   f"{miss[0]}); run `port profile {job.command_hint} -o {path}`")
            echo(f"profile: {path} does not cover {len(miss)} op signature(s) of this graph: not used")
        from port.cost.roofline import modeled_profile
        return ProfileStep(modeled_profile(graph, dev), None, "modeled",
                           f"profile: none at {path}, and none needed: device {dev.name!r} is fully modeled (none "
                           f"of its accelerators is present on this machine), so every cost comes from the "
                           f"roofline model")
    cache = None
    old = outdated_format(path) if path.exists() and not job.profile_explicit else None
    if old:
        why = f"{path} cannot be used: {old}; measuring it again"
    elif path.exists():
        prof = load_profile(path, device=dev.name)      # corrupt / other device: ProfileError naming the file
        miss = uncovered(prof, graph)
        stale = stale_reason(prof)
        if not miss and not stale and not replan_signatures:
            return ProfileStep(prof, path, "file", f"profile: {path} ({_profile_summary(prof, present)})")
        if job.profile_explicit:
            if miss:
                raise ProfileError(f"{path}: does not cover {len(miss)} op signature(s) of this graph (e.g. "
                                   f"{miss[0]}): it was made for another model, batch size or optimizer. Run "
                                   f"`port profile {job.command_hint} -o {path}` to extend it, or drop --profile "
                                   f"to use {profile_location(job.name, dev.name)}")
            if stale:
                echo(f"warning: profile {path}: {stale}; using it because --profile names it")
                return ProfileStep(prof, path, "file", f"profile: {path} ({_profile_summary(prof, present)}; "
                                                       f"measured on another CPU)")
            raise ProfileError(f"{path}: --replan re-measures ops into the profile; it cannot rewrite a file "
                               f"given with --profile: drop --profile")
        if stale:
            why = f"{path} does not apply: {stale}; measuring again"
        elif miss:
            why = (f"{path} lacks {len(miss)} op signature(s) of this graph; measuring them (reusing "
                   f"{sum(e.measured for e in prof.entries)} measured entries)")
            cache = prof
        else:
            keep = tuple(e for e in prof.entries if e.signature not in set(replan_signatures))
            from dataclasses import replace
            cache = replace(prof, entries=keep, _index={})
            why = f"re-measuring {len(set(replan_signatures))} flagged op signature(s) into {path}"
    else:
        if job.profile_explicit:
            raise ProfileError(f"{path}: profile file not found (given with --profile); create it with "
                               f"`port profile {job.command_hint} -o {path}`, or drop --profile to use "
                               f"{profile_location(job.name, dev.name)}")
        why = f"no profile at {path} yet; measuring it now"
    if not measure:
        raise ProfileError(f"{why.split(';')[0]}; run `port profile {job.command_hint}` first")
    echo(f"profile: {why} on {', '.join(present)} (time budget {max_time_s:g} s)" if max_time_s else
         f"profile: {why} on {', '.join(present)}")
    step, _rep = measure_profile(job, graph, path, cache=cache, progress=progress, max_time_s=max_time_s)
    return step


def _timing(quick: bool, blocks: int | None = None, block_ms: float | None = None) -> dict:
    """Timing blocks of a measurement: the quick ones (`--quick`) or the defaults, single values overridden."""
    from port.cost import measure as M
    return dict(blocks=blocks or (M.QUICK_BLOCKS if quick else M.DEFAULT_BLOCKS),
                block_ms=block_ms or (M.QUICK_BLOCK_MS if quick else M.DEFAULT_BLOCK_MS),
                warmup_ms=M.QUICK_WARMUP_MS if quick else M.DEFAULT_WARMUP_MS)


def reusable_profile(path: Path, device_name: str, *, strict: bool, echo: Echo = _print) -> Any:
    """The profile file at ``path`` as a cache of measured entries, or None: missing, of an outdated format, or
    measured on another CPU model or C-kernel build (``stale_reason``; said). A corrupt or truncated file, or
    one for another device, is an error when ``strict`` (`port profile`), else said and measured again."""
    from port.cost.io import load_profile
    if not path.exists():
        return None
    old = outdated_format(path)
    if old:
        echo(f"profile: {path}: {old}; measuring everything again")
        return None
    try:
        cache = load_profile(path, device=device_name)
    except ProfileError as e:
        if strict:
            raise ProfileError(f"{e} (the existing profile is reused as a cache; pass --fresh to overwrite "
                               f"it)") from None
        echo(f"profile: {path}: {e}; measuring everything again")
        return None
    stale = stale_reason(cache)
    if stale:
        echo(f"profile: {path}: {stale}; measuring everything again")
        return None
    return cache


def measure_profile(job: Job, graph: Any, path: Path, *, cache: Any = None, quick: bool = False,
                    blocks: int | None = None, block_ms: float | None = None, threads: int | None = None,
                    max_time_s: float | None = None, progress: bool = True) -> tuple[ProfileStep, Any]:
    """Measure ``graph`` on the job's device (reusing ``cache``'s measured entries) and write ``path``."""
    from port.cost.io import save_profile
    from port.cost.measure import profile_with_report
    cfg = job.config
    prof, rep = profile_with_report(graph, job.device, cache=cache, max_time_s=max_time_s,
                                    threads=threads or _fixed_threads(cfg), progress=progress,
                                    optimizer_kwargs=optimizer_kwargs(cfg), **_timing(quick, blocks, block_ms))
    if cache is not None:   # keep the file's entries of other graphs (another batch size, say): no ping-pong
        from dataclasses import replace
        have = {(e.signature, e.accelerator, e.variant) for e in prof.entries}
        extra = [e for e in cache.entries
                 if (e.signature, e.accelerator, e.variant) not in have and e.accelerator in prof.accelerators]
        if extra:
            entries = sorted((*prof.entries, *extra), key=lambda e: (e.signature, e.accelerator, e.variant))
            prof = replace(prof, entries=tuple(entries), _index={})
    save_profile(prof, path)
    present = present_accelerators(job.device)
    note = (f"profile: measured {rep.measured} entries now, reused {rep.reused}, modeled {rep.modeled} "
            f"in {rep.seconds:.1f} s -> {path} ({_profile_summary(prof, present)})")
    return ProfileStep(prof, path, "measured", note), rep


def profile_to_file(job: Job, graph: Any, *, fresh: bool = False, echo: Echo = _print, **measure_kw: Any
                    ) -> tuple[ProfileStep, Any]:
    """`port profile`: measure ``graph`` into the job's profile file, reusing the measured entries of an
    existing file (unless ``fresh`` or it was measured on another CPU). Returns (step, ProfileReport)."""
    path = job.profile_path
    cache = None if fresh else reusable_profile(path, job.device.name, strict=True, echo=echo)
    present = present_accelerators(job.device)
    echo(f"profile: {path} ({'updating' if cache is not None else 'writing'}; device {job.device.name}: "
         + (f"measuring on {', '.join(present)}" if present else
            "fully modeled, every entry from the roofline model") + ")")
    return measure_profile(job, graph, path, cache=cache, **measure_kw)


def remeasure(graph: Any, device: Any, path: Path, *, quick: bool = True, max_time_s: float | None = None,
              threads: int | None = None, echo: Echo = _print) -> tuple[Any, Any]:
    """For benchmarks, which keep one profile file per (model, batch) outside any config: measure ``graph`` on
    ``device`` into ``path``, reusing the file's measured entries where ``reusable_profile`` allows; the file
    is rewritten only when something was measured (an entry; or, the graph having changed, an engine footprint or
    the step overhead), so a rerun takes every figure from it. Returns (profile, ProfileReport)."""
    from port.cost.io import save_profile
    from port.cost.measure import profile_with_report
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cache = reusable_profile(path, device.name, strict=False, echo=echo)
    prof, rep = profile_with_report(graph, device, cache=cache, max_time_s=max_time_s, threads=threads,
                                    **_timing(quick))
    if rep.measured or rep.engine_measured or rep.overhead_measured:
        save_profile(prof, path)
    return prof, rep


def merge_profile_files(inputs: Sequence[Path], output: Path, device: str | None = None) -> Any:
    from port.cost.io import merge_profiles, save_profile
    if len(inputs) < 2:
        raise ProfileError("--merge needs at least two profile files")
    merged = merge_profiles(list(inputs), device=device)
    save_profile(merged, output)
    return merged


# =============================================================================================
# budget: one syntax, one definition of the keep-everything peak
# =============================================================================================
def keep_everything(graph: Any, profile: Any) -> tuple[int, int]:
    """(peak, engine bytes) of the plan that keeps every activation and runs every op plain on one accelerator
    (the profile's first that runs them all) -- what PyTorch eager holds: its simulated peak memory and, within
    it, the resident footprint of its engine (port.plan.semantics.engine_bytes; 0 when the profile records none)."""
    from port.plan.semantics import engine_bytes
    from port.solver import SOLVERS
    err: Exception | None = None
    for acc in profile.accelerators:
        try:
            plan = SOLVERS["single"](graph, profile, 10**15, accelerator=acc)
        except PortError as e:     # this accelerator cannot run every op: try the next
            err = e
            continue
        return int(plan.predicted_peak_bytes), int(engine_bytes(plan, profile))
    raise PortError(f"no accelerator of {profile.device!r} runs every op of {graph.name!r}: {err}")


def keep_everything_peak(graph: Any, profile: Any) -> int:
    """THE keep-everything peak (keep_everything's first figure). ``NN%`` budgets are NN% of its training memory
    (the peak less its engine's resident footprint) plus that footprint: an engine's code pages and caches are a
    fixed cost a plan cannot shrink, so a percentage scales what the plan decides."""
    return keep_everything(graph, profile)[0]


def budget_bytes(budget: Any, graph: Any, profile: Any) -> int:
    """A budget in any accepted form (bytes, "64MB", "1.5GiB", "75%", None: the device memory) -> bytes."""
    from port.config import budget_to_bytes
    spec = None if budget is None else parse_budget_option(budget, "budget")
    peak, eng = keep_everything(graph, profile) if isinstance(spec, str) else (None, 0)
    return budget_to_bytes(spec, peak, profile.memory_bytes, engine_bytes=eng)


@dataclass(frozen=True)
class Budget:
    bytes: int
    spec: int | str | None            # as parsed: bytes, "NN%" or None (device memory)
    origin: str                       # "--budget", "<config>: key 'budget'", ...
    keep_everything_peak: int
    engine_bytes: int = 0             # the keep-everything plan's engine footprint (within its peak)

    def describe(self) -> str:
        from port.config import format_size
        pct = self.bytes / self.keep_everything_peak if self.keep_everything_peak else float("nan")
        if isinstance(self.spec, str):
            what = f"{self.spec} of the {KEEP_EVERYTHING}" + (
                f"'s training memory {format_size(self.keep_everything_peak - self.engine_bytes)} + its engine's "
                f"resident {format_size(self.engine_bytes)}" if self.engine_bytes else "")
        else:
            what = f"{pct:.0%} of the {KEEP_EVERYTHING}"
        return f"budget {format_size(self.bytes)} ({self.bytes} B; {what}; from {self.origin})"

    def peak_line(self) -> str:
        from port.config import format_size
        return (f"{KEEP_EVERYTHING} {format_size(self.keep_everything_peak)} ({self.keep_everything_peak} B: every "
                f"activation kept, every op plain on one accelerator; what PyTorch eager holds)")


def resolve_budget(job: Job, graph: Any, profile: Any) -> Budget:
    from port.config import budget_to_bytes
    peak, eng = keep_everything(graph, profile)
    mem = profile.memory_bytes or job.device.memory
    return Budget(budget_to_bytes(job.budget, peak, mem, engine_bytes=eng), job.budget, job.budget_origin, peak,
                  eng)


# =============================================================================================
# profile -> plan
# =============================================================================================
@dataclass(frozen=True)
class Solved:
    plan: Any                         # port.plan.types.Plan
    budget: Budget
    sim: Any                          # port.verify.simulate.SimResult of the plan
    notes: tuple[str, ...] = ()       # one line per memory solved apart (a host with a GPU), else none


def memory_groups(device: Any, profile: Any) -> dict[str, tuple[str, ...]]:
    """The profile's accelerators grouped by the memory their kernels run in on this machine
    (port.cost.handoff.backend_memory): {"cpu": ("cpu-c", "cpu-torch"), "cuda": ("cuda",)} on a host with a
    GPU. Accelerators the device description does not name count as host memory."""
    from port.cost.handoff import backend_memory
    backends = {a.id: a.backend for a in device.accelerators}
    out: dict[str, list[str]] = {}
    for acc in profile.accelerators:
        out.setdefault(backend_memory(backends.get(acc, "c")), []).append(acc)
    return {m: tuple(a) for m, a in out.items()}


def solve_plan(job: Job, built: Built, prof: ProfileStep, budget: Budget) -> Solved:
    """Solve the job's graph under ``budget`` (early updates off with micro-batching) and simulate it."""
    from port.solver import solve
    from port.verify.simulate import simulate
    s = job.config.solver
    groups = memory_groups(job.device, prof.profile)

    def one(profile: Any) -> Any:
        return solve(built.graph, profile, budget.bytes, solver=s.name, time_limit_s=s.time_limit_s, gap=s.gap,
                     allow_early_updates=job.graph_batch == job.config.batch_size, max_reruns=s.max_reruns)
    notes: list[str] = []
    if len(groups) <= 1:
        plan = one(prof.profile)
    else:
        # the executor runs a program in one memory (no GPU<->CPU hand-off copies): one plan per memory, the
        # fastest that fits is kept (else the smallest peak, refused below with the floor)
        found, errors, notes = [], [], []
        for mem, accs in groups.items():
            try:
                p = one(prof.profile.only(accs))
            except PortError as e:
                errors.append(e)
                notes.append(f"{mem} memory ({', '.join(accs)}): no plan ({str(e).splitlines()[0][:160]})")
                continue
            found.append((mem, p))
            notes.append(f"{mem} memory ({', '.join(accs)}): predicted step {p.predicted_step_ms:.3f} ms, "
                         f"peak {p.predicted_peak_bytes} B ({p.status})")
        if not found:
            raise errors[0]
        fits = [mp for mp in found if mp[1].status != "infeasible"]
        mem, plan = (min(fits, key=lambda mp: mp[1].predicted_step_ms) if fits
                     else min(found, key=lambda mp: mp[1].predicted_peak_bytes))
        import dataclasses
        plan = dataclasses.replace(plan, profile_digest=prof.profile.digest())
        notes.append(f"plan: the {mem} memory's (the executor runs a program in one memory: no GPU<->CPU "
                     f"hand-offs)")
    if plan.status == "infeasible":   # a baseline's best plan is over the budget: never hand it on as a plan
        from port.config import format_size
        from port.errors import InfeasibleBudgetError
        from port.solver import min_feasible_budget
        from port.solver.instance import build_instance
        mn, _p, proven = min_feasible_budget(build_instance(built.graph, prof.profile, prune=True),
                                             allow_early_updates=job.graph_batch == job.config.batch_size)
        floor = (f"; the smallest budget any plan fits is {format_size(mn)} ({mn} B)"
                 f"{'' if proven else ' (best found, not proven minimal)'}, found by the ILP (--solver highs)"
                 if mn is not None else "")
        raise InfeasibleBudgetError(
            f"solver {s.name!r} finds no plan within the budget of {format_size(budget.bytes)} ({budget.bytes} B): "
            f"its best plan peaks at {format_size(plan.predicted_peak_bytes)} ({plan.predicted_peak_bytes} B)"
            f"{floor}. Raise --budget, or use --solver highs", budget.bytes, mn, ())
    return Solved(plan, budget, simulate(plan, built.graph, prof.profile), tuple(notes))


def save_plan_file(solved: Solved, job: Job, built: Built, prof: ProfileStep, path: Path) -> Path:
    """The plan file (with what `port show` draws), written with the user's umask."""
    from port.plan.io import save_plan
    graph, profile, plan, sim = built.graph, prof.profile, solved.plan, solved.sim
    layers = []
    for o in graph.ops:
        d = plan.ops[o.id]
        c = profile.lookup(graph.signature(o), d.accelerator, d.variant)
        layers.append({"op": o.name, "layer": o.layer, "kind": o.kind, "phase": o.phase,
                       "ms": c.latency_ms if c is not None else None})
    extra = {"gantt": [list(g) for g in sim.gantt], "layers": layers, "steps": [list(s) for s in sim.steps],
             "device": job.device.name, "config": job.name, "batch_size": graph.batch_size,
             "profile_source": str(prof.path) if prof.path is not None else "roofline model",
             "keep_everything_peak_bytes": solved.budget.keep_everything_peak,
             "budget_spec": solved.budget.spec if solved.budget.spec is not None else "device memory"}
    save_plan(plan, path, graph, extra=extra)
    return Path(path)


def plan_summary(plan: Any) -> str:
    from collections import Counter

    from port.config import format_size
    accs = Counter(d.accelerator for d in plan.ops)
    vars_ = Counter(d.variant for d in plan.ops if d.variant != "plain")
    gap = "-" if plan.gap != plan.gap else f"{plan.gap:.2%}"
    return (f"plan: {plan.status} by {plan.solver} in {plan.solve_time_s:.2f} s (gap {gap}); predicted step "
            f"{plan.predicted_step_ms:.3f} ms, peak {format_size(plan.predicted_peak_bytes)} of budget "
            f"{format_size(plan.budget_bytes)}\n  placement: " + ", ".join(f"{a} {n}" for a, n in sorted(accs.items()))
            + "; variants: " + (", ".join(f"{v} {n}" for v, n in sorted(vars_.items())) or "all plain")
            + f"; recomputed tensors {len(plan.recompute)} ({len(plan.recompute_at)} re-runs), early updates "
              f"{len(plan.early_updates)}, paged {len(plan.paged)}")


# =============================================================================================
# inspect
# =============================================================================================
def graph_report(g: Any) -> dict[str, Any]:
    """The JSON form of `port inspect`: ops and totals."""
    from port.ir.capture import aten_of
    T = g.tensors
    counted: set[int] = set()
    ops = []
    for o in g.ops:
        saved = 0
        for t in o.saved:
            r = g.storage_root(t)
            if T[r].role in ("parameter", "buffer") or r in counted:
                continue
            counted.add(r)
            saved += T[r].bytes
        params = sum(T[t].bytes for t in o.inputs if T[t].role == "parameter") if o.phase == "forward" else 0
        out = T[o.outputs[0]].shape if o.outputs else ()
        kind = o.kind if not o.kind.startswith("torch_op") else f"{o.kind} ({aten_of(o)})"
        ops.append({"name": o.name, "layer": o.layer, "kind": kind, "phase": o.phase,
                    "output_shape": list(out), "flops": o.flops, "vector_flops": o.vector_flops,
                    "saved_bytes": saved, "param_bytes": params, "bytes_moved": o.bytes_moved})
    return {"graph": g.name, "batch_size": g.batch_size, "optimizer": g.optimizer, "digest": g.digest(),
            "ops": ops, "totals": g.totals()}


@dataclass(frozen=True)
class Inspected:
    report: dict                      # graph_report(...) plus keep_everything_peak_bytes and profile
    title: str
    peak_note: str                    # "keep-everything peak ... (workspace sizes from ...)"


def inspect_graph(job: Job, built: Built) -> Inspected:
    """The per-layer report and the keep-everything peak (workspace sizes from the profile at the job's
    location when it exists and covers the graph, else modeled; never measures)."""
    from port.config import format_size
    rep = graph_report(built.graph)
    found = find_profile(job, built.graph)
    if found is not None:
        prof, src = found.profile, f"workspace sizes from profile {found.path}"
    else:
        from port.cost.roofline import modeled_profile
        prof = modeled_profile(built.graph, job.device)
        src = (f"workspace sizes modeled: no profile at {job.profile_path} yet" if present_accelerators(job.device)
               else f"device {job.device.name!r} is fully modeled")
    peak = keep_everything_peak(built.graph, prof)
    rep["keep_everything_peak_bytes"] = peak
    rep["profile"] = str(found.path) if found is not None else None
    note = (f"{KEEP_EVERYTHING} {format_size(peak)} ({peak} B: activations, parameters, gradients, optimizer state "
            f"and workspace with every activation kept; {src})")
    return Inspected(rep, built.title, note)


# =============================================================================================
# show
# =============================================================================================
@dataclass(frozen=True)
class PlanView:
    path: Path
    plan: Any
    data: dict                        # the plan file's JSON (with the extras `port solve -o` writes)


def load_plan_view(path: str | Path) -> PlanView:
    """The plan and its file's extras (layers, gantt, ...), each checked: PlanError naming the key and fix."""
    from port.errors import PlanError
    from port.plan.io import load_plan, read_plan_json
    path = Path(path)
    plan = load_plan(path)
    d = read_plan_json(path)
    fix = f"solve again (`port solve CONFIG -o {path}`)"
    gantt = d.get("gantt") or []
    ok = isinstance(gantt, list) and all(
        isinstance(g, list) and len(g) == 4 and isinstance(g[0], str) and isinstance(g[1], str)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in g[2:])
        for g in gantt)
    if not ok:
        raise PlanError(f"{path}: key 'gantt' is malformed (expected a list of [label, accelerator, start ms, end ms]); "
                        f"{fix}")
    layers = d.get("layers")
    if layers is not None and (not isinstance(layers, list) or len(layers) != len(plan.ops) or not all(
            isinstance(x, dict) and (x.get("ms") is None or (isinstance(x["ms"], (int, float))
                                                            and not isinstance(x["ms"], bool)))
            for x in layers)):
        raise PlanError(f"{path}: key 'layers' is malformed (expected one object per op with 'ms'); {fix}")
    tens = d.get("tensors") or {}
    for k in ("recompute_names", "paged_names"):
        v = tens.get(k, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise PlanError(f"{path}: key 'tensors.{k}' is malformed (expected a list of tensor names); {fix}")
    for k in ("keep_everything_peak_bytes",):
        v = d.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise PlanError(f"{path}: key {k!r} = {v!r}: expected a non-negative integer; {fix}")
    return PlanView(path, plan, d)


def plan_charts(view: PlanView, out_dir: Optional[Path] = None) -> tuple[Path, Path]:
    """PNGs of the plan's memory timeline and of its ops on accelerators (Gantt)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plan, d = view.plan, view.data
    out = Path(out_dir) if out_dir is not None else view.path.parent
    out.mkdir(parents=True, exist_ok=True)
    stem = view.path.stem
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot([b / 2**20 for b in plan.memory_timeline], lw=1, label="predicted memory in use")
    ax.axhline(plan.budget_bytes / 2**20, color="r", ls="--", label="budget")
    peak = d.get("keep_everything_peak_bytes")
    if peak:
        ax.axhline(peak / 2**20, color="gray", ls=":", label=KEEP_EVERYTHING)
    ax.set_xlabel("executed step")
    ax.set_ylabel("MiB")
    ax.legend()
    ax.set_title(f"{stem}: memory timeline")
    fig.tight_layout()
    p1 = out / f"{stem}_memory.png"
    _save_figure(fig, p1)
    gantt = d.get("gantt") or []
    accs = sorted({g[1] for g in gantt})
    fig, ax = plt.subplots(figsize=(10, 1 + 0.6 * max(1, len(accs))))
    for lab, acc, s0, s1 in gantt:
        ax.barh(accs.index(acc), max(s1 - s0, 1e-6), left=s0, height=0.6,
                color="tab:orange" if "recompute" in lab else ("tab:gray" if acc == "storage" else "tab:blue"))
    ax.set_yticks(range(len(accs)))
    ax.set_yticklabels(accs)
    ax.set_xlabel("ms")
    ax.set_title(f"{stem}: ops on accelerators (orange: recompute)")
    fig.tight_layout()
    p2 = out / f"{stem}_gantt.png"
    _save_figure(fig, p2)
    return p1, p2


def _save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """A matplotlib figure as a PNG, rendered in memory and written atomically (then closed)."""
    import io

    import matplotlib.pyplot as plt
    from port.io import atomic_write_bytes
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


# =============================================================================================
# train: profile -> solve -> train -> export -> report, with checkpoints and resume
# =============================================================================================
@dataclass(frozen=True)
class TrainResult:
    accuracy: float
    test_loss: float
    steps: int
    train_s: float
    arena_bytes: int
    rss_growth_bytes: int
    run_dir: Path
    plan: Any
    profile_path: Optional[Path]
    profile_source: str
    measured: dict = field(default_factory=dict)
    flagged: tuple[str, ...] = ()


def _rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _check_fits(job: Job, n: int, key: str, what: str) -> None:
    """ConfigError naming ``key`` when ``n`` samples of input_shape (float32 or int64 ids, with their labels)
    take more than half of this machine's physical memory: allocating them would fail (exit 1) or end in the
    OOM killer, not in a message."""
    import math
    import os
    from port.config import format_size
    from port.train.data import is_tokens
    cfg = job.config
    per = math.prod(cfg.input_shape) * (16 if is_tokens(cfg) else 4) + 8     # x (and per-token labels) + a label
    need = n * per
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return
    if need > phys // 2:
        raise ConfigError(f"{job.where}key {key!r}: {what} of {n} samples of shape {list(cfg.input_shape)} takes "
                          f"{format_size(need)}, more than half of this machine's memory ({format_size(phys)}). "
                          f"Fix: a smaller {key}")


def load_data(job: Job) -> Any:
    from port.train import data as D
    if job.config.data.kind != "digits":        # digits: scikit-learn's 1797 samples, whatever num_samples says
        _check_fits(job, job.config.data.num_samples, "data.num_samples", "the data set")
    try:
        ds = D.load(job.config)
    except ConfigError as e:
        raise ConfigError(f"{job.where}key 'input_shape': {e}. Fix: input_shape must match the data "
                          f"(data.kind {job.config.data.kind!r})") from None
    K = job.config.num_classes
    for y in (ds.y_train, ds.y_test):      # the labels fit the model's classes (every step would refuse them)
        v = y[y != -100] if y.dim() > 1 else y
        if v.numel() and (int(v.min()) < 0 or int(v.max()) >= K):
            raise ConfigError(f"{job.where}key 'num_classes': data.kind {job.config.data.kind!r} has labels "
                              f"{int(v.min())}..{int(v.max())}, but num_classes is {K}. Fix: num_classes "
                              f"{int(v.max()) + 1} (or more)")
    return ds


def measure_steps(trainer: Any, x: Any, y: Any, repeats: int = 5) -> dict[str, Any]:
    """Per-op measured times (median over ``repeats`` instrumented steps) and the measured memory timeline."""
    runs = [trainer.profile_step(x, y) for _ in range(repeats)]
    per: dict[str, list[float]] = {}
    for r in runs:
        for name, ms in r["op_ms"].items():
            per.setdefault(name, []).append(ms)
    return {"step_ms": statistics.median(r["step_ms"] for r in runs),
            "op_ms": {k: statistics.median(v) for k, v in per.items()},
            "timeline_bytes": list(runs[-1].get("timeline_bytes", [])),
            # which graph op (and whether a recompute) each timeline point belongs to, to align with the plan
            "timeline_ops": [[int(c["op"]), bool(c.get("recompute"))] for c in runs[-1].get("calls", [])],
            # the process's resident memory after each call of the last instrumented step (port.train.memwatch)
            "rss_timeline_bytes": list(runs[-1].get("rss_timeline_bytes", [])),
            "peak_bytes": max(runs[-1].get("timeline_bytes", [0]) or [0])}


def align_timeline(sim_steps: Sequence[tuple[str, int]], measured: dict, key: str = "timeline_bytes") -> list[int]:
    """The measured (arena) timeline (``key``: or another per-call series, e.g. "rss_timeline_bytes") on the
    simulator's step axis: each executor call is matched to the plan step of the same op (recompute or not);
    steps without a call of their own (views, ops inside a fused kernel) carry the previous value."""
    tl, ops = measured.get(key) or [], measured.get("timeline_ops") or []
    if not tl or len(ops) != len(tl):
        return list(tl)
    at: dict[tuple[int, bool], int] = {}
    for (op, rc), b in zip(ops, tl):
        at[(op, rc)] = max(at.get((op, rc), 0), b)
    out, last = [], tl[0]
    for kind, op in sim_steps:
        last = at.get((op, kind == "recompute"), last)
        out.append(last)
    return out


def build_report(run_dir: Path, graph: Any, profile: Any, plan: Any, measured: dict, summary: dict) -> list:
    from port.train.report import OpRow, render_report
    from port.verify.simulate import simulate
    sim = simulate(plan, graph, profile)
    pred: dict[str, float] = {}
    for label, acc, start, end in sim.gantt:
        pred[label] = pred.get(label, 0.0) + (end - start)
    rows = []
    op_ms = measured.get("op_ms", {})
    from port.plan.variants import fused_into
    for d in plan.ops:
        o = graph.ops[d.op]
        head = fused_into(graph, o) if d.variant == "fused" and o.kind != "conv2d" else None
        rows.append(OpRow(o.name, o.layer, o.kind, o.phase, d.accelerator, d.variant,
                          pred.get(o.name, 0.0), op_ms.get(o.name),
                          chain=graph.ops[head].name if head is not None else None))
    acc_of = {label: acc for label, acc, _, _ in sim.gantt}
    for label in pred:
        if label.endswith(" (recompute)"):
            rows.append(OpRow(label, label[:-len(" (recompute)")], "recompute", "recompute", acc_of.get(label, "-"),
                              "-", pred[label], op_ms.get(label)))
    mem = measured.get("memory") or {}
    rss = None
    if mem.get("rss_baseline_bytes") is not None and measured.get("rss_timeline_bytes"):
        rss = [max(0, v - mem["rss_baseline_bytes"])
               for v in align_timeline(sim.steps, measured, "rss_timeline_bytes")]
    return render_report(run_dir / "report.html", f"PORT run {run_dir.name}", rows, list(sim.timeline),
                         align_timeline(sim.steps, measured) or None, plan.budget_bytes, summary,
                         rss_timeline=rss, memory=mem or None)


class _StopOnSignal:
    """While training: SIGINT / SIGTERM only set a flag, which the loop checks between steps (so the checkpoint
    it then writes is of a whole step). A second signal stops at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._old: dict = {}

    def _on(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:
            raise Interrupted(signum, f"{signal.Signals(signum).name} again: stopped before the checkpoint "
                                      f"was written (the previous checkpoint is intact)")
        self.signum = signum

    def __enter__(self) -> "_StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.getsignal(s)
                signal.signal(s, self._on)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def _metrics_upto(path: Path, step: int) -> None:
    """Keep only the metrics lines of steps <= ``step`` (a resumed run continues after its checkpoint)."""
    from port.io import atomic_write_text
    if not path.exists():
        return
    keep, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            s = int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            dropped += 1
            continue
        if s <= step:
            keep.append(line)
        else:
            dropped += 1
    if dropped:
        atomic_write_text(path, "".join(f"{ln}\n" for ln in keep))


def _reuse_plan(run_dir: Path, graph: Any, profile: Any, budget: Budget) -> Any:
    """The run's plan.json when it was solved for this graph, profile and budget (resume), else None."""
    from port.errors import PlanError
    from port.plan.io import load_plan
    p = run_dir / "plan.json"
    if not p.exists():
        return None
    try:
        plan = load_plan(p, graph=graph, profile=profile)
    except PlanError:
        return None
    return plan if plan.budget_bytes == budget.bytes else None


def stand_in_backends(device: Any) -> dict[str, str]:
    """{accelerator id: "c"} for the device's modeled accelerators (absent here): the C kernels stand in."""
    return {a.id: "c" for a in device.accelerators if a.backend == "modeled"}


def _governed_threads(tr: Any) -> str:
    """One line on a threads="auto" run (the default): the count it ended at and the governor's changes."""
    ev = [e for e in tr.thread_events if e.from_threads != e.to_threads]
    moves = ", ".join(f"step {e.step}: {e.from_threads}->{e.to_threads} ({e.why})" for e in ev[-4:])
    return (f"auto: {tr.threads} at the end, {len(ev)} change{'s' if len(ev) != 1 else ''}"
            + (f" (last: {moves})" if moves else ""))


def _fixed_threads(cfg: Any) -> int | None:
    """train.threads when it is a count (profiling and a fixed-count run use it); None for "auto" / unset."""
    t = cfg.train.threads
    return t if isinstance(t, int) else None


def run_training(config: str | Path | None = None, *, model: str | None = None, input_shape: str | None = None,
                 batch: int | None = None, resume: bool = False, steps: int | None = None,
                 out_dir: str | Path = "runs", quiet: bool = False, replan: bool = False, budget: Any = None,
                 solver: str | None = None, profile: str | Path | None = None, export: bool = True,
                 progress: bool = True, on_nonfinite: str | None = None,
                 threads: int | str | None = None) -> TrainResult:
    """`port train CONFIG` (or `--model NAME`, as load_job takes it): trace -> profile (the location rule) ->
    solve -> train -> export -> report.

    SIGINT / SIGTERM while training writes a checkpoint at the current step and raises Interrupted (the CLI
    exits 130 / 143); ``resume=True`` continues from it, keeping runs/<name>/metrics.jsonl free of duplicates.
    The run directory is locked for the whole run (port.io.dir_lock): a second `port train` on it stops with a
    LockedError naming the first one's PID (exit 2) before it writes anything there."""
    with contextlib.ExitStack() as held:
        job = load_job(config, model=model, input_shape=input_shape, batch=batch, budget=budget, solver=solver,
                       profile=profile, train={"steps": steps, "on_nonfinite": on_nonfinite, "threads": threads})
        return _run_training(job, held, resume=resume, steps=steps, out_dir=out_dir, quiet=quiet, replan=replan,
                             export=export, progress=progress, overrides=budget is not None or solver is not None)


def _run_training(job: Job, held: contextlib.ExitStack, *, resume: bool, steps: int | None,
                  out_dir: str | Path, quiet: bool, replan: bool, export: bool, progress: bool,
                  overrides: bool) -> TrainResult:
    """run_training's body; ``held`` keeps the run directory's lock until run_training returns or raises;
    ``overrides``: --budget or --solver was given (a resumed run solves again instead of reusing its plan)."""
    import yaml
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from port import config as C
    from port.config import format_size
    from port.cost.io import save_profile
    from port.exec import capi
    from port.io import atomic_write_text, dir_lock, raise_if_disk_full
    from port.train.trainer import Trainer

    console = Console(quiet=quiet, highlight=False, soft_wrap=True)

    def say(msg: str) -> None:
        console.print(msg, markup=False)

    config = job.command_hint        # how the messages name the job: the config file, or CONFIG
    cfg = job.config
    if _fixed_threads(cfg):
        capi.set_num_threads(_fixed_threads(cfg))
    run_dir = Path(out_dir) / cfg.name
    run_dir.mkdir(parents=True, exist_ok=True)
    held.enter_context(dir_lock(run_dir))
    atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(C.dump_experiment(cfg), sort_keys=False))
    ckpt = run_dir / "checkpoint.port"

    rss0 = _rss_bytes()
    t_setup = time.perf_counter()
    built = build_graph(job)
    graph = built.graph
    ds = load_data(job)
    B = cfg.batch_size
    n_train = int(ds.x_train.shape[0])
    if n_train < B:
        d = cfg.data
        raise ConfigError(f"{job.where}key 'batch_size': {B} is larger than the training set: data.kind {d.kind!r} "
                          f"gives {n_train} training samples ({int(ds.x_test.shape[0])} held out by "
                          f"data.test_fraction {d.test_fraction:g}); every step needs a full batch. Fix: set "
                          f"batch_size <= {n_train}, or give more samples (data.num_samples) or a smaller "
                          f"data.test_fraction")
    say(f"{cfg.name}: {cfg.model.name} ({len(graph.ops)} ops) on {cfg.data.kind} ({ds.x_train.shape[0]} train / "
        f"{ds.x_test.shape[0]} test), batch {B}" + (f" in micro-batches of {job.graph_batch}" if job.graph_batch != B
                                                     else "") + f", device {job.device.name}")

    stand_ins = stand_in_backends(job.device)
    if stand_ins:
        say(f"note: device {job.device.name!r} is modeled: its accelerator(s) {', '.join(sorted(stand_ins))} are not "
            f"on this machine, so the plan's ops run here on PORT's C kernels (cpu-c) as stand-ins; predicted "
            f"time and memory are for {job.device.name}, measured ones are this machine's")

    # profile -> budget -> plan
    last_run = None
    if replan:
        mpath = run_dir / "measured.json"
        if not mpath.exists():
            raise ConfigError(f"--replan needs a previous run's measurements at {mpath}; run "
                              f"`port train {config}` first")
        last_run = read_measured(mpath)
    prof = get_profile(job, graph, progress=progress and not quiet, echo=say)
    say(prof.note)
    if last_run is not None:
        prof = replan_profile(job, graph, prof, run_dir, last_run, echo=say)
    save_profile(prof.profile, run_dir / "profile.json")     # every run directory holds the costs its plan used
    bud = resolve_budget(job, graph, prof.profile)
    say(bud.peak_line())
    say(bud.describe())
    solved = None
    if resume and not replan and not overrides:
        reused = _reuse_plan(run_dir, graph, prof.profile, bud)
        if reused is not None:
            from port.verify.simulate import simulate
            solved = Solved(reused, bud, simulate(reused, graph, prof.profile))
            say(f"plan: reusing {run_dir / 'plan.json'} (same graph, profile and budget)")
    if solved is None:
        solved = solve_plan(job, built, prof, bud)
    plan = solved.plan
    save_plan_file(solved, job, built, prof, run_dir / "plan.json")     # `port show` draws it
    for n in solved.notes:
        say(n)
    say(plan_summary(plan))

    # train
    kw = dict(optimizer=built.optimizer, micro_batch=cfg.train.micro_batch,
              trainable=list(built.trainable) if built.trainable else None, seed=cfg.train.seed, plan=plan,
              on_nonfinite=cfg.train.on_nonfinite, accelerators=stand_ins or None,
              threads="auto" if cfg.train.threads in (None, "auto") else None)
    st = job.device.storage
    if st is not None and st.path and Path(st.path).is_dir():   # a modeled device's path may not exist here
        kw.update(spill_dir=st.path, drop_cache=bool(getattr(st, "drop_cache", False)))
    if resume and ckpt.exists():
        tr = Trainer.resume(ckpt, built.model, built.example, **kw)
        say(f"resumed from {ckpt} at step {tr.step_count}")
    else:
        if resume:
            say(f"no checkpoint at {ckpt}; starting from scratch")
        tr = Trainer(built.model, built.example, **kw)
    setup_s = time.perf_counter() - t_setup
    mem = tr.memory_report()
    say(f"arena: {format_size(mem['arena_bytes'])} (persistent {format_size(mem['persistent_bytes'])} + scratch "
        f"{format_size(mem['scratch_bytes'])}); plan predicted peak {format_size(plan.predicted_peak_bytes)}; "
        f"set-up {setup_s:.2f} s")
    rss_train0 = _rss_bytes()     # training-time growth is measured from here (set-up excluded)
    from port.train import memwatch
    hwm_reset = memwatch.reset_peak()   # VmHWM from here: the peak of the steps
    total = steps if steps is not None else cfg.train.steps
    per_epoch = max(1, ds.x_train.shape[0] // B)
    if cfg.train.epochs and steps is None:
        total = cfg.train.epochs * per_epoch
    epoch = tr.step_count // per_epoch
    it = ds.batches(B, cfg.train.seed, epoch)
    for _ in range(tr.step_count % per_epoch):          # resume mid-epoch on the same batches
        next(it, None)
    losses: list[float] = []
    done0 = tr.step_count
    rss_peak = _rss_bytes()
    mpath = run_dir / "metrics.jsonl"
    if resume and ckpt.exists():
        _metrics_upto(mpath, tr.step_count)
        metrics = mpath.open("a", buffering=1)
    else:
        metrics = mpath.open("w", buffering=1)
    last = (None, None)
    first_loss, warned = None, False
    walls: list[float] = []       # wall ms of every training step (Trainer.step), the measured step time
    t0 = time.perf_counter()
    with metrics, _StopOnSignal() as stop, Progress(
            TextColumn("[progress.description]{task.description}"), BarColumn(),
            TextColumn("{task.completed}/{task.total}"), TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[sps]} steps/s"), TextColumn("mem {task.fields[mem]}"), TimeElapsedColumn(),
            console=console, transient=False, disable=quiet or not progress) as prog:
        task = prog.add_task("train", total=total, completed=tr.step_count, loss="-", sps="-",
                             mem=format_size(mem["arena_bytes"]))
        while tr.step_count < total and stop.signum is None:
            try:
                x, y = next(it)
            except StopIteration:
                epoch += 1
                it = ds.batches(B, cfg.train.seed, epoch)
                continue
            ts = time.perf_counter()
            skipped0 = tr.skipped_steps
            try:
                loss = tr.step(x, y)
            except NonFiniteError as e:
                prog.stop()
                ck = (f"the last checkpoint ({ckpt}, step {read_header_step(ckpt)}) is intact" if ckpt.exists()
                      else "no checkpoint was written")
                raise NonFiniteError(f"{job.where}{e}; {ck}", e.step, e.loss) from None
            step_ms = (time.perf_counter() - ts) * 1e3
            walls.append(step_ms)
            if tr.skipped_steps != skipped0:
                say(f"warning: step {tr.step_count}: loss {loss} or a gradient is not finite; update skipped "
                    f"(train.on_nonfinite: skip; {tr.skipped_steps} skipped so far)")
            elif first_loss is None:
                first_loss = loss
            elif not warned and abs(loss) > 100 * max(abs(first_loss), 1e-3):
                warned = True
                say(f"warning: step {tr.step_count}: loss {loss:.4g} is over 100x the first step's "
                    f"{first_loss:.4g}: training may be diverging; lower optimizer.lr (now {cfg.optimizer.lr:g})")
            last = (x, y)
            losses.append(loss)
            s = tr.step_count
            try:
                metrics.write(json.dumps({"step": s, "loss": loss, "step_ms": round(step_ms, 4), "epoch": epoch})
                              + "\n")
            except OSError as e:
                prog.stop()
                raise_if_disk_full(e, mpath, kept=f"the lines of the steps before step {s} are kept (a resumed run "
                                                  f"drops a torn last line); the last checkpoint is intact")
                raise
            if s % cfg.train.checkpoint_every == 0 or s == total:
                tr.save_checkpoint(ckpt, meta={"config": str(config), "epoch": epoch})
            if cfg.train.eval_every and s % cfg.train.eval_every == 0:
                ev = tr.evaluate(ds.test_batches(B))
                say(f"step {s}: test accuracy {ev['accuracy']:.4f}")
            if s % 10 == 0 or s == total:
                rss_peak = max(rss_peak, _rss_bytes())
                el = time.perf_counter() - t0
                prog.update(task, completed=s, loss=f"{sum(losses[-10:]) / len(losses[-10:]):.4f}",
                            sps=f"{(s - done0) / max(el, 1e-9):.0f}")
        if stop.signum is not None:
            s = tr.step_count
            metrics.flush()
            if not (ckpt.exists() and s % cfg.train.checkpoint_every == 0):
                tr.save_checkpoint(ckpt, meta={"config": str(config), "epoch": epoch})
            name = signal.Signals(stop.signum).name
            prog.stop()
            raise Interrupted(stop.signum, f"{name}: stopped at step {s} of {total}; checkpoint written to {ckpt} "
                                           f"(continue with `port train {config} --resume`)")
    train_s = time.perf_counter() - t0
    ev = tr.evaluate(ds.test_batches(B))
    steps_peak = max(rss_peak, _rss_bytes(), memwatch.peak_bytes() if hwm_reset else 0)
    rss_growth = steps_peak - rss_train0
    setup_rss = rss_train0 - rss0
    weights = sum(t.numel() * t.element_size() for t in list(built.model.parameters()) + list(built.model.buffers()))
    rss_before = int(tr.rss["before_bytes"])
    # the process's memory as the device sees it: RSS before Trainer(...), after its set-up, the steps' peak;
    # baseline = RSS before Trainer(...) less the module's weights (they move into the arena), so peak - baseline
    # is comparable to the plan's predicted peak and the budget (both include the weights)
    memory = {"rss_before_trainer_bytes": rss_before, "rss_after_setup_bytes": int(tr.rss["after_setup_bytes"]),
              "rss_steps_peak_bytes": int(steps_peak), "rss_end_bytes": _rss_bytes(),
              "peak_method": "VmHWM (reset after set-up)" if hwm_reset else "VmRSS sampled every 10 steps",
              "module_weight_bytes": int(weights), "rss_baseline_bytes": rss_before - int(weights),
              "rss_growth_total_bytes": int(steps_peak) - rss_before,
              "rss_growth_setup_bytes": int(tr.rss["after_setup_bytes"]) - rss_before,
              "rss_growth_steps_bytes": int(rss_growth),
              "arena_bytes": int(mem["arena_bytes"]), "train_arena_bytes": int(mem["train_arena_bytes"]),
              "predicted_peak_bytes": int(plan.predicted_peak_bytes), "budget_bytes": plan.budget_bytes}

    # closed loop: measure per-op times on a copy of the state (profile_step restores it)
    x, y = last if last[0] is not None else next(ds.batches(B, cfg.train.seed, 0))
    measured = measure_steps(tr, x, y)
    measured["memory"] = memory
    measured["kernel_step_ms"] = measured["step_ms"]      # sum of the timed calls of an instrumented step
    wall = wall_step_ms(walls)
    if wall is not None:
        measured["wall_step_ms"], measured["wall_steps"] = wall, len(walls)
    summary = {
        "model": f"{cfg.model.name} ({len(graph.ops)} ops), batch {B}",
        "device": job.device.name, "profile": str(prof.path) if prof.path else "roofline model",
        "plan": f"{plan.status} by {plan.solver}, gap {plan.gap:.2%}",
        KEEP_EVERYTHING: format_size(bud.keep_everything_peak),
        "budget": format_size(plan.budget_bytes),
        "predicted step": f"{plan.predicted_step_ms:.2f} ms", "measured step": (f"{wall:.2f} ms (wall, median of {len(walls)} training steps; kernels "
                          f"{measured['step_ms']:.2f} ms)" if wall is not None else f"{measured['step_ms']:.2f} ms"),
        "predicted peak": format_size(plan.predicted_peak_bytes),
        "arena (planned, allocated)": format_size(mem["arena_bytes"]),
        "process RSS growth while training": format_size(rss_growth),
        "process RSS (before Trainer / after set-up / steps' peak)":
            f"{format_size(rss_before)} / {format_size(memory['rss_after_setup_bytes'])} / {format_size(steps_peak)}",
        "process memory for training (steps' peak - RSS before Trainer + module weights; compare with the "
        "predicted peak and the budget)": format_size(steps_peak - memory["rss_baseline_bytes"]),
        "test accuracy": f"{ev['accuracy'] * 100:.2f}%", "steps": tr.step_count,
    }
    if cfg.train.threads in (None, "auto"):
        summary["threads"] = _governed_threads(tr)
        measured["thread_events"] = [asdict(e) for e in tr.thread_events]
    flags = build_report(run_dir, graph, prof.profile, plan, measured, summary)
    sig_of = {o.name: graph.signature(o) for o in graph.ops}
    measured["flagged"] = [r.op for r in flags]
    measured["flagged_signatures"] = sorted({sig_of[r.op] for r in flags if r.op in sig_of})
    measured["predicted_step_ms"] = plan.predicted_step_ms
    if job.config_path is not None:
        measured["config_path"] = str(job.config_path.resolve())
    atomic_write_text(run_dir / "measured.json", json.dumps(measured, indent=1))
    if export:
        from port.errors import DiskFullError
        for fmt, name in (("onnx", "model.onnx"), ("torch", "model.pt2")):
            try:
                tr.export(run_dir / name, fmt)
            except DiskFullError:
                raise                   # names the file; the previous export is kept
            except Exception as e:  # noqa: BLE001 - export is a convenience at the end of a run
                say(f"export {fmt} failed: {type(e).__name__}: {e}")
    if cfg.train.threads in (None, "auto"):
        say(f"threads: {summary['threads']}")
    say(f"trained {tr.step_count - done0} steps in {train_s:.2f} s; step time predicted "
        f"{plan.predicted_step_ms:.2f} ms, measured " + (
            f"{wall:.2f} ms ({(wall - plan.predicted_step_ms) / plan.predicted_step_ms:+.1%}; wall median of "
            f"{len(walls)} steps; kernels {measured['step_ms']:.2f} ms)" if wall is not None and
            plan.predicted_step_ms > 0 else f"{measured['step_ms']:.2f} ms (kernels)"))
    say(f"memory: plan peak {format_size(plan.predicted_peak_bytes)}, arena {format_size(mem['arena_bytes'])}, "
        f"budget {format_size(plan.budget_bytes)}, {KEEP_EVERYTHING} {format_size(bud.keep_everything_peak)}; "
        f"process RSS growth while training {format_size(rss_growth)} (set-up: torch, tracing, solver, arena: "
        f"{format_size(setup_rss)})")
    say(f"process memory (RSS): before Trainer {format_size(rss_before)}, after set-up "
        f"{format_size(memory['rss_after_setup_bytes'])}, steps' peak {format_size(steps_peak)}: growth "
        f"{format_size(memory['rss_growth_total_bytes'])} (set-up {format_size(memory['rss_growth_setup_bytes'])} "
        f"+ steps {format_size(rss_growth)}); with the module's weights ({format_size(weights)}, now in the arena) "
        f"{format_size(steps_peak - memory['rss_baseline_bytes'])} against plan peak "
        f"{format_size(plan.predicted_peak_bytes)} and budget {format_size(plan.budget_bytes)}")
    say(f"{len(flags)} op(s) off their predicted time by more than 25% and 1% of the step (see report; `--replan` "
        f"corrects the profile with this run's in-plan times and solves again)")
    say(f"test accuracy {ev['accuracy'] * 100:.2f}% (loss {ev['loss']:.4f}); run directory {run_dir}")
    return TrainResult(ev["accuracy"], ev["loss"], tr.step_count, train_s, mem["arena_bytes"], rss_growth, run_dir,
                       plan, prof.path, prof.source, measured, tuple(r.op for r in flags))


def wall_step_ms(walls: Sequence[float]) -> Optional[float]:
    """The measured step time: the median wall time of the training steps, the first ones (warm-up) left out."""
    if not walls:
        return None
    skip = min(3, len(walls) // 2)
    return float(statistics.median(walls[skip:]))


def c_only_profile(job: Job, profile: Any) -> Any:
    """``profile`` restricted to the accelerators the C kernels run on (what port-rt executes): backend ``c``
    here, or a modeled CPU of a device that is not here (an MCU's core: port-rt's C kernels are what it runs)."""
    import dataclasses
    keep = {a.id for a in job.device.accelerators
            if a.backend == "c" or (a.backend == "modeled" and a.kind == "cpu")}
    if not keep:
        raise ConfigError(f"{job.where}device {job.device.name!r} has no CPU the C kernels run on: port-rt runs "
                          f"the C kernels only. Fix: compile for a device with a cpu-c accelerator (e.g. host)")
    ents = tuple(e for e in profile.entries if e.accelerator in keep)
    return dataclasses.replace(profile, entries=ents, _index={})


@dataclass(frozen=True)
class Compiled:
    bundle: Path
    train_data: Path
    test_data: Path
    info: Any
    plan: Any


def compile_bundle(config: str | Path, out_dir: str | Path, *, plan_path: str | Path | None = None,
                   budget: Any = None, profile: str | Path | None = None, emit_c: bool = False,
                   emit_samples: int = 16, echo: Echo = _print, sign_key: str | Path | None = None) -> Compiled:
    """`port compile`: solve the config's job for the C kernels only (or take --plan), build the Trainer and write
    ``<out>/<name>.portrt`` plus the config's data as ``train.portdata`` / ``test.portdata``; ``emit_c``: also
    the bundle and the first ``emit_samples`` training samples as C source (port.exec.bundle.emit_c);
    ``sign_key``: a key file, the bundle signed with HMAC-SHA-256 under it (port.exec.bundle.load_key)."""
    from port.config import format_size
    from port.exec import bundle as BU
    from port.exec.bundle import write_bundle, write_data
    from port.plan.io import load_plan
    from port.train.trainer import Trainer
    key = BU.load_key(sign_key) if sign_key is not None else None   # a bad key file fails before the solve
    job = load_job(config, budget=budget, profile=profile)
    cfg = job.config
    built = build_graph(job)
    from port.ir.capture import torch_ops
    missing = torch_ops(built.graph)
    if missing:
        names = ", ".join(f"{n} ({a})" for n, a in missing[:12]) + (", ..." if len(missing) > 12 else "")
        raise PortError(f"{config}: port-rt runs C kernels only, and {len(missing)} op(s) of {built.graph.name} have "
                        f"none: they run on PyTorch's kernels (torch_op): {names}. Missing C kernels: "
                        f"{', '.join(sorted({a for _, a in missing}))}. Train it with `port train` instead, or "
                        f"replace those layers.")
    out = Path(out_dir)
    if plan_path is not None:
        plan = load_plan(plan_path, graph=built.graph)
        echo(f"plan: {plan_path}")
    else:
        prof = get_profile(job, built.graph, echo=echo)
        echo(prof.note)
        cprof = ProfileStep(c_only_profile(job, prof.profile), prof.path, prof.source, prof.note)
        bud = resolve_budget(job, built.graph, cprof.profile)
        echo(bud.describe())
        solved = solve_plan(job, built, cprof, bud)
        plan = solved.plan
        echo(plan_summary(plan) + " (C kernels only)")
    tr = Trainer(built.model, built.example, plan=plan, optimizer=built.optimizer, seed=cfg.train.seed,
                 trainable=list(built.trainable) if built.trainable else None,
                 accelerators=stand_in_backends(job.device) or None)
    bundle = out / f"{cfg.name}.portrt"
    info = write_bundle(tr, bundle, sign_key=key)
    ds = load_data(job)
    ign = tr.executor.ignore_index
    trd = write_data(out / "train.portdata", ds.x_train.numpy(), ds.y_train.numpy(), cfg.num_classes, ign)
    ted = write_data(out / "test.portdata", ds.x_test.numpy(), ds.y_test.numpy(), cfg.num_classes, ign)
    echo(f"bundle {bundle}: {format_size(info.total_bytes)}, arena {format_size(info.arena_bytes)}, "
         f"{info.train_calls} training + {info.eval_calls} inference calls; data {trd} ({ds.x_train.shape[0]} "
         f"samples), {ted} ({ds.x_test.shape[0]})")
    if info.key_id is not None:
        echo(f"signed with HMAC-SHA-256, key id {info.key_id} ({sign_key}): port-rt ... --key {sign_key} "
             f"--require-signed refuses it edited or unsigned")
    echo(f"run it: port-rt train {bundle} --data {trd} --steps {cfg.train.steps}  (build: make port-rt)")
    if emit_c:
        n = max(1, min(int(emit_samples), ds.x_train.shape[0]))
        files = BU.emit_c(bundle.read_bytes(), out, ds.x_train[:n].numpy(), ds.y_train[:n].numpy())
        echo(f"C source: {', '.join(str(f) for f in files)} ({n} samples); a Cortex-M4 build: "
             f"make port-rt-m4 M4_BUNDLE={out}")
    return Compiled(bundle, trd, ted, info, plan)


def replan_profile(job: Job, graph: Any, prof: ProfileStep, run_dir: Path, last: dict, echo: Echo = _print
                   ) -> ProfileStep:
    """`port train --replan`: correct the profile with the last run's measurements of its plan, then solve again.

    Every (signature, accelerator, variant) the last plan ran gets its in-plan time (median of the instrumented
    steps' per-op call times: in program order, with the neighbouring ops' cache effects, a fused chain booked
    on its conv); the other measured entries of the profile are scaled by the median in-plan / profiled ratio of
    their op kind on that accelerator; the executor's per-step overhead becomes the last run's wall step time
    minus its kernel time. The corrected profile is written back to the profile file (not to a file given with
    --profile)."""
    from port.cost.measure import correct_from_run
    from port.errors import PlanError
    from port.plan.io import load_plan
    ppath = run_dir / "plan.json"
    try:
        plan = load_plan(ppath, graph=graph)
    except (PlanError, OSError) as e:
        echo(f"replan: the last run's plan cannot be read ({e}); solving again with the profile as it is")
        return prof
    if plan.graph_digest != graph.digest():
        echo(f"replan: {ppath} was solved for another graph; solving again with the profile as it is")
        return prof
    ids = {o.name: o.id for o in graph.ops}
    op_ms = {ids[k]: float(v) for k, v in (last.get("op_ms") or {}).items() if k in ids}
    if not op_ms:
        echo("replan: the last run recorded no per-op times; solving again with the profile as it is")
        return prof
    wall = last.get("wall_step_ms")
    p, changed, nseen, over = correct_from_run(graph, prof.profile, plan, op_ms,
                                               wall if isinstance(wall, (int, float)) else None,
                                               f"replan (run {run_dir.name})")
    pred = last.get("predicted_step_ms")
    echo(f"replan: corrected {changed} of {nseen} in-plan entries with the last run's in-plan times"
         + (f", executor overhead {over:.3f} ms per step" if over is not None else "")
         + (f" (last run: predicted {pred:.2f} ms, measured {wall:.2f} ms)" if isinstance(pred, (int, float))
            and isinstance(wall, (int, float)) else ""))
    if prof.path is not None and prof.source != "modeled" and not job.profile_explicit:
        from port.cost.io import save_profile
        save_profile(p, prof.path)
    return ProfileStep(p, prof.path, prof.source, prof.note + "; corrected by --replan")


def read_measured(path: Path) -> dict:
    """A run's measured.json, checked (ConfigError naming the file, key and fix: train again)."""
    fix = "train again (`port train CONFIG`) to rewrite it"
    try:
        d = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(f"{path}: corrupt or truncated measurements file ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); {fix}") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: not a measurements file (top level is {type(d).__name__}); {fix}")

    from port.cost.io import MAX_BYTES, MAX_MS

    def num(v, hi=MAX_MS):       # a time (ms) or a size (bytes): finite, >= 0, below the profiles' sane maxima
        return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= hi
    checks = {"step_ms": num, "config_path": lambda v: isinstance(v, str),
              "op_ms": lambda v: isinstance(v, dict) and all(num(x) for x in v.values()),
              "timeline_bytes": lambda v: isinstance(v, list) and all(num(x, MAX_BYTES) for x in v),
              "rss_timeline_bytes": lambda v: isinstance(v, list) and all(num(x, MAX_BYTES) for x in v),
              "memory": lambda v: isinstance(v, dict),
              "timeline_ops": lambda v: isinstance(v, list) and all(
                  isinstance(x, list) and len(x) == 2 and isinstance(x[0], int) for x in v),
              "flagged_signatures": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)}
    for k, ok in checks.items():
        if k in d and not ok(d[k]):
            raise ConfigError(f"{path}: key {k!r} is malformed or out of range ({d[k]!r:.60}; times and sizes "
                              f"must be finite numbers >= 0); {fix}")
    return d


def read_header_step(path: Path) -> Any:
    try:
        from port.train.checkpoint import read_header
        return read_header(path)["step"]
    except PortError:
        return "?"


def run_report(run_dir: str | Path) -> Path:
    """Rebuild runs/<name>/report.html from the run's files."""
    from port.cost.io import load_profile
    from port.plan.io import load_plan
    run_dir = Path(run_dir)
    for f in ("config.yaml", "profile.json", "plan.json", "measured.json"):
        if not (run_dir / f).exists():
            raise ConfigError(f"{run_dir}: not a run directory (missing {f}); create one with `port train CONFIG`")
    measured = read_measured(run_dir / "measured.json")
    extra = [Path(measured["config_path"]).parent] if measured.get("config_path") else []
    job = load_job(run_dir / "config.yaml", extra_search_dirs=extra)
    built = build_graph(job)
    profile = load_profile(run_dir / "profile.json", device=job.device.name)
    plan = load_plan(run_dir / "plan.json", graph=built.graph, profile=profile)
    build_report(run_dir, built.graph, profile, plan, measured,
                 {"model": job.config.model.name, "device": job.device.name,
                  "predicted step": f"{plan.predicted_step_ms:.2f} ms",
                  "measured step": f"{measured.get('step_ms', float('nan')):.2f} ms"})
    return run_dir / "report.html"
