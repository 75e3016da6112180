"""Step 3: graph -> profile: per-op costs on the job's device, read from the profile file (the location rule:
port.pipeline.job.profile_location), measured now (reusing what still applies) or modeled (a device with
nothing present here). See port/pipeline/__init__.py for the rule in full."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from port.errors import ProfileError
from port.pipeline.common import PROFILE_MAX_TIME_S, Echo, _print
from port.pipeline.job import Job, fixed_threads, profile_location


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


def memory_mismatch(profile: Any, device: Any) -> Optional[str]:
    """Why a profile does not describe ``device``'s memories (the device YAML's ``memory: own`` engines are not the
    profile's ``own_memory``: a profile measured before the YAML changed, or before profiles recorded it), or
    None. The profile is the one place the solver, the simulator and lowering read it from."""
    from port.cost.roofline import own_memory_accelerators
    want = tuple(a for a in own_memory_accelerators(device) if a in profile.accelerators)
    if tuple(profile.own_memory) != want:
        return (f"its engines with their own memory are {list(profile.own_memory)}, the device description "
                f"{device.name!r} says {list(want)} (memory: own)")
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
    if uncovered(prof, graph) or memory_mismatch(prof, job.device):
        if job.profile_explicit:
            why = memory_mismatch(prof, job.device) or "does not cover this graph"
            raise ProfileError(f"{path}: {why}; run `port profile {job.command_hint} -o {path}`")
        return None
    return ProfileStep(prof, path, "file", f"profile: {path} ({_profile_summary(prof, ())})")



def get_profile(job: Job, graph: Any, *, measure: bool = True, replan_signatures: Sequence[str] = (),
                progress: bool = True, echo: Echo = _print, max_time_s: float | None = PROFILE_MAX_TIME_S
                ) -> ProfileStep:
    """The profile ``graph`` is solved with (see port/pipeline/__init__.py for the location rule).

    measure=False: never measure; a missing or insufficient file is an error naming it.
    replan_signatures: op signatures to measure again (`port train --replan`)."""
    present = present_accelerators(job.device)
    if not present:     # nothing to measure here: a profile file (e.g. measured on that device) or the roofline
        return _unmeasured(job, graph, echo)
    found = _usable_file(job, graph, present, replan_signatures, echo)
    if isinstance(found, ProfileStep):
        return found
    why, cache = found
    if not measure:
        raise ProfileError(f"{why.split(';')[0]}; run `port profile {job.command_hint}` first")
    echo(f"profile: {why} on {', '.join(present)} (time budget {max_time_s:g} s)" if max_time_s else
         f"profile: {why} on {', '.join(present)}")
    step, _rep = measure_profile(job, graph, job.profile_path, cache=cache, progress=progress, max_time_s=max_time_s)
    return step


def _unmeasured(job: Job, graph: Any, echo: Echo) -> ProfileStep:
    """A device none of whose accelerators is present here: its profile file when one exists and covers the
    graph (measured on that device and copied here), else the roofline model."""
    from port.cost.io import load_profile
    dev, path = job.device, job.profile_path
    if job.profile_explicit or (path.exists() and not outdated_format(path)):
        prof = load_profile(path, device=dev.name)
        miss = uncovered(prof, graph)
        if not miss:
            return ProfileStep(prof, path, "file", f"profile: {path} ({_profile_summary(prof, ())})")
        if job.profile_explicit:
            raise ProfileError(f"{path}: does not cover {len(miss)} op signature(s) of this graph (e.g. "
                               f"{miss[0]}); run `port profile {job.command_hint} -o {path}`")
        echo(f"profile: {path} does not cover {len(miss)} op signature(s) of this graph: not used")
    from port.cost.roofline import modeled_profile
    return ProfileStep(modeled_profile(graph, dev), None, "modeled",
                       f"profile: none at {path}, and none needed: device {dev.name!r} is fully modeled (none "
                       f"of its accelerators is present on this machine), so every cost comes from the "
                       f"roofline model")


def _usable_file(job: Job, graph: Any, present: Sequence[str], replan_signatures: Sequence[str], echo: Echo
                 ) -> ProfileStep | tuple[str, Any]:
    """The profile file when it is used as it is; else (why it is measured, the profile whose measured entries
    are reused or None)."""
    from port.cost.io import load_profile
    path = job.profile_path
    old = outdated_format(path) if path.exists() and not job.profile_explicit else None
    if old:
        return f"{path} cannot be used: {old}; measuring it again", None
    if not path.exists():
        if job.profile_explicit:
            raise ProfileError(f"{path}: profile file not found (given with --profile); create it with "
                               f"`port profile {job.command_hint} -o {path}`, or drop --profile to use "
                               f"{profile_location(job.name, job.device.name)}")
        return f"no profile at {path} yet; measuring it now", None
    prof = load_profile(path, device=job.device.name)      # corrupt / other device: ProfileError naming the file
    mm = memory_mismatch(prof, job.device)
    if mm and job.profile_explicit:
        raise ProfileError(f"{path}: {mm}: plans solved on it would not run as this device does; re-measure it "
                           f"with `port profile {job.command_hint} -o {path}`")
    miss, stale = uncovered(prof, graph), stale_reason(prof) or mm
    if not miss and not stale and not replan_signatures:
        return ProfileStep(prof, path, "file", f"profile: {path} ({_profile_summary(prof, present)})")
    if job.profile_explicit:
        return _explicit_file(job, prof, miss, stale, present, echo)
    if stale:
        return f"{path} does not apply: {stale}; measuring again", None
    if miss:
        return (f"{path} lacks {len(miss)} op signature(s) of this graph; measuring them (reusing "
                f"{sum(e.measured for e in prof.entries)} measured entries)"), prof
    from dataclasses import replace
    keep = tuple(e for e in prof.entries if e.signature not in set(replan_signatures))
    return (f"re-measuring {len(set(replan_signatures))} flagged op signature(s) into {path}",
            replace(prof, entries=keep, _index={}))


def _explicit_file(job: Job, prof: Any, miss: Sequence[str], stale: Optional[str], present: Sequence[str],
                   echo: Echo) -> ProfileStep:
    """A file given with --profile that does not cover the graph, is stale or is asked to be re-measured: never
    rewritten; used with a warning when only stale, else an error naming the fix."""
    path = job.profile_path
    if miss:
        raise ProfileError(f"{path}: does not cover {len(miss)} op signature(s) of this graph (e.g. "
                           f"{miss[0]}): it was made for another model, batch size or optimizer. Run "
                           f"`port profile {job.command_hint} -o {path}` to extend it, or drop --profile "
                           f"to use {profile_location(job.name, job.device.name)}")
    if stale:
        echo(f"warning: profile {path}: {stale}; using it because --profile names it")
        return ProfileStep(prof, path, "file", f"profile: {path} ({_profile_summary(prof, present)}; "
                                               f"measured on another CPU)")
    raise ProfileError(f"{path}: --replan re-measures ops into the profile; it cannot rewrite a file "
                       f"given with --profile: drop --profile")


def _timing(quick: bool, blocks: int | None = None, block_ms: float | None = None) -> dict:
    """Timing blocks of a measurement: the quick ones (`--quick`, or PORT_PROFILE_QUICK=1 in the environment: the
    test suite's setting, so the commands it runs measure their profiles quickly) or the defaults, single values
    overridden."""
    import os

    from port.cost import measure as M
    quick = quick or os.environ.get("PORT_PROFILE_QUICK", "0").strip() == "1"
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
                                    threads=threads or fixed_threads(cfg), progress=progress,
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


def replan_profile(job: Job, graph: Any, prof: ProfileStep, run_dir: Path, last: dict, echo: Echo = _print
                   ) -> ProfileStep:
    """`port train --replan`: correct the profile with the last run's measurements of its plan, then solve again.

    Every (signature, accelerator, variant) the last plan ran gets its in-plan time (median of the instrumented
    steps' per-op call times: in program order, with the neighbouring ops' cache effects, a fused chain booked
    on its call ops); the other measured entries of the profile are scaled by the median in-plan / profiled ratio of
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

