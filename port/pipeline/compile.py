"""Step 7: `port compile`: the job solved for the C kernels only (what port-rt runs), written as a port-rt
bundle with the config's data (and, on request, as C source for a microcontroller build)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from port.errors import ConfigError, PortError
from port.pipeline.budget import resolve_budget
from port.pipeline.build import build_graph, load_data
from port.pipeline.common import Echo, _print
from port.pipeline.job import Job, load_job, stand_in_backends
from port.pipeline.profiles import ProfileStep, get_profile
from port.pipeline.solve import plan_summary, solve_plan


def c_only_profile(job: Job, profile: Any) -> Any:
    """``profile`` restricted to the accelerators the C kernels run on (what port-rt executes): backend ``c``
    here, or a modeled CPU of a device that is not here (an MCU's core: port-rt's C kernels are what it runs).
    Its storage keeps no optimizer state between steps (port-rt's spill file holds a step's pages only), so the
    solver offers no plan that pages it (activations may still be paged)."""
    import dataclasses
    from port.cost.types import STATE_PAGES_KEY
    keep = {a.id for a in job.device.accelerators
            if a.backend == "c" or (a.backend == "modeled" and a.kind == "cpu")}
    if not keep:
        raise ConfigError(f"{job.where}device {job.device.name!r} has no CPU the C kernels run on: port-rt runs "
                          f"the C kernels only. Fix: compile for a device with a cpu-c accelerator (e.g. host)")
    ents = tuple(e for e in profile.entries if e.accelerator in keep)
    storage = tuple(sorted({**dict(profile.storage), STATE_PAGES_KEY: 0.0}.items())) if profile.storage else ()
    return dataclasses.replace(profile, entries=ents, storage=storage, _index={})


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

