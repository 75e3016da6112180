"""Step 2: Job -> model, training graph and data. The model is a zoo model or ``module:factory`` (imported
from the config's folder or the working directory, :func:`import_factory`); the graph is traced at the job's
graph batch; the data set is checked against the config (sizes, labels)."""
from __future__ import annotations

import contextlib
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from port.errors import ConfigError, PortTraceError, TokenError
from port.pipeline.job import Job


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

