"""port.profile(graph, device) -> Profile: measured costs for every op signature x variant x present
accelerator; modeled (roofline) costs for accelerators that are not present, entries the time budget did
not reach, and everything of a modeled device."""
from __future__ import annotations

import datetime
import os
import platform
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from port.cost import roofline as CM
from port.plan import variants as V
from port.config import DeviceConfig, load_device
from port.errors import ProfileError
from port.ir.types import Graph, Op
from port.cost.types import HandoffCost, OpCost, Profile
from port.cost.io import load_profile
from port.cost.runners import Runner, backend_available, get_runner
from port.cost.timing import TimingTask, summarize, time_block, time_issue, warm_up
from port.verify.simulate import (CALL_DISPATCH_KEY, RT_ACCELERATORS_KEY, RT_STEP_SAVING_KEY, STATE_SYNC_KEY,
                                  STEP_OVERHEAD_KEY, TIMED_CALL_KEY)

# defaults: 5 blocks of ~20 ms per entry; --quick: 3 blocks of ~5 ms
DEFAULT_BLOCKS, DEFAULT_BLOCK_MS, DEFAULT_WARMUP_MS = 5, 20.0, 10.0
QUICK_BLOCKS, QUICK_BLOCK_MS, QUICK_WARMUP_MS = 3, 5.0, 3.0
# robust timing on a shared machine: entries whose block spread (p75 - p25) is above SPREAD_TARGET of their
# median get more interleaved blocks, until below it or MAX_EXTRA_ROUNDS more rounds / EXTRA_TIME_FRACTION of
# the time taken so far have been spent
SPREAD_TARGET, MAX_EXTRA_ROUNDS, EXTRA_TIME_FRACTION = 0.10, 6, 0.5
SPREAD_FLOOR_MS = 0.002           # spreads under 2 us (timer resolution, empty calls) are never "noisy"
MAX_LIVE_BYTES = 1 << 30          # prepared buffers kept alive at once (chunks beyond this)


@dataclass
class ProfileReport:
    """What a profiling run did (the CLI prints it)."""

    measured: int = 0                 # entries timed in this run
    reused: int = 0                   # measured entries taken from the cache
    budget_modeled: int = 0           # entries the --max-time budget did not reach (modeled)
    absent_modeled: int = 0           # entries of accelerators not present (modeled)
    failed: list[str] = field(default_factory=list)   # "key: error" for entries whose runner failed (modeled)
    notes: list[str] = field(default_factory=list)    # skipped accelerators, absent backends, thread changes
    remeasured: int = 0               # extra timing blocks given to noisy entries
    engine_measured: int = 0          # engine footprints measured in this run (not taken from the cache)
    overhead_measured: bool = False   # the step overhead measured on a cache's entries (another graph's cache)
    seconds: float = 0.0

    @property
    def modeled(self) -> int:
        return self.budget_modeled + self.absent_modeled + len(self.failed)


def entry_keys(graph: Graph, device: DeviceConfig) -> dict[tuple[str, str, str], Op]:
    """Every (signature, accelerator, variant) to cost, with a representative op, in graph order."""
    keys: dict[tuple[str, str, str], Op] = {}
    for op in graph.ops:
        sig = graph.signature(op)
        for acc in device.accelerators:
            if op.kind in acc.unsupported_ops or op.kind.split(".")[0] in acc.unsupported_ops:
                continue
            backend = "c" if acc.backend == "modeled" else acc.backend
            for var in V.variants(graph, op, backend):
                keys.setdefault((sig, acc.id, var), op)
    return keys


def host_info(graph: Graph | None = None) -> dict[str, str]:
    info = {"hostname": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version(),
            "cores": str(os.cpu_count()), "date": datetime.datetime.now().isoformat(timespec="seconds")}
    try:   # the machine's load while measuring (1, 5, 15 min): a profile taken under load says so
        info["loadavg"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        info["cpu"] = platform.processor() or "unknown"
    try:
        import torch
        info["torch"] = torch.__version__
    except ImportError:
        pass
    try:
        import numpy
        info["numpy"] = numpy.__version__
    except ImportError:
        pass
    try:
        from port.version import __version__
        info["port"] = __version__
    except ImportError:
        pass
    from port.exec.capi import build_id
    info["kernels_build"] = build_id()
    if graph is not None:
        info["graph"] = graph.name
        info["graph_digest"] = graph.digest()
        info["batch_size"] = str(graph.batch_size)
    return info


def _noisy(samples: list[float]) -> bool:
    med, spread = summarize(samples)
    return med > 0 and spread > max(SPREAD_TARGET * med, SPREAD_FLOOR_MS)


def calibrate_host_peaks(threads: int | None = None, seconds: float = 1.0) -> dict[str, float]:
    """This machine's FP32 GEMM rate (GFLOP/s, torch sgemm 512^3 on ``threads`` threads) and memory bandwidth
    (GB/s, a 64 MiB copy: bytes read + written), ~``seconds`` in all: the roofline's peak figures for this
    CPU, measured at profile time instead of one CPU's hard-coded numbers."""
    import torch
    old = torch.get_num_threads()

    def best_ms(fn: Callable[[], Any], budget_ms: float) -> float:
        # peak figures: the fastest of several interleaved-free blocks (a busy neighbour only slows blocks down)
        t = TimingTask(("peak",), fn, lambda: None)
        warm_up(t, 20.0, budget_ms / 5)
        for _ in range(5):
            time_block(t)
        return min(t.block_ms)
    try:
        if threads:
            torch.set_num_threads(int(threads))
        n = 512
        a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
        gflops = 2 * n ** 3 / (best_ms(lambda: torch.mm(a, b, out=c), seconds * 500) * 1e-3) / 1e9
        src = torch.ones(16 << 20)
        dst = torch.empty_like(src)
        gbps = 2 * src.numel() * 4 / (best_ms(lambda: dst.copy_(src), seconds * 500) * 1e-3) / 1e9
    finally:
        torch.set_num_threads(old)
    return {"peak_gflops": round(gflops, 1), "mem_gbps": round(gbps, 2)}


def calibrated_accelerator(acc: Any, host: dict[str, str]) -> Any:
    """``acc`` with the peak GFLOP/s and memory bandwidth measured at profile time (``host`` is a profile's host
    record: ``calibrated.peak_gflops`` / ``calibrated.mem_gbps``) for CPU accelerators; ``acc`` otherwise."""
    if getattr(acc, "kind", "") != "cpu":
        return acc
    upd = {}
    for k in ("peak_gflops", "mem_gbps"):
        try:
            v = float(host.get(f"calibrated.{k}", "nan"))
        except ValueError:
            continue
        if v == v and v > 0:
            upd[k] = v
    return acc.model_copy(update=upd) if upd else acc


def _bytes_of(keep: tuple) -> int:
    n = 0
    for t in keep:
        if hasattr(t, "element_size") and hasattr(t, "numel"):
            n += t.element_size() * t.numel()
    return n


def profile_with_report(graph: Graph, device: DeviceConfig | str | Path, *,
                        cache: Profile | str | Path | None = None, max_time_s: float | None = None,
                        blocks: int = DEFAULT_BLOCKS, block_ms: float = DEFAULT_BLOCK_MS,
                        warmup_ms: float = DEFAULT_WARMUP_MS, accelerators: tuple[str, ...] | None = None,
                        threads: int | None = None, handoff: bool = True, peak_memory: bool = True,
                        progress: bool | Callable[[int, int, str], None] = False,
                        optimizer_kwargs: dict | None = None, seed: int = 0,
                        efficiency: dict[str, dict[str, float]] | None = None,
                        variants: tuple[str, ...] | None = None,
                        program_order: bool = True, calibrate_peaks: bool = True) -> tuple[Profile, ProfileReport]:
    """Profile ``graph`` on ``device``; see :func:`profile`. Returns the profile and a report."""
    t_start = time.perf_counter()
    dev = device if isinstance(device, DeviceConfig) else load_device(device)
    rep = ProfileReport()
    rep.notes += list(dev.skipped)
    load0 = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else ""
    deadline = t_start + max_time_s if max_time_s is not None else None

    # which accelerators are present
    present: dict[str, Runner | None] = {}
    for acc in dev.accelerators:
        if accelerators is not None and acc.id not in accelerators:
            continue
        if dev.modeled or acc.backend == "modeled":
            continue
        ok, why = backend_available(acc.backend)
        if not ok:
            rep.notes.append(f"{acc.id} ({acc.backend}): not present, modeled ({why})")
            continue
        present[acc.id] = None     # runner created lazily (thread settings are per runner)

    # cache
    cached: dict[tuple[str, str, str], OpCost] = {}
    cache_threads: dict[str, str] = {}
    if cache is not None:
        cp = cache if isinstance(cache, Profile) else load_profile(cache, device=dev.name)
        if cp.device != dev.name:
            raise ProfileError(f"cache profile is for device {cp.device!r}, not {dev.name!r}")
        cache_threads = {k[len("threads."):]: v for k, v in cp.host if k.startswith("threads.")}
        cached = {(e.signature, e.accelerator, e.variant): e for e in cp.entries if e.measured}

    keys = entry_keys(graph, dev)
    if variants is not None:   # e.g. ("plain",): a quicker profile with only the default variants
        keys = {k: o for k, o in keys.items() if k[2] in variants}
    results: dict[tuple[str, str, str], OpCost] = {}
    todo: list[tuple[tuple[str, str, str], Op]] = []
    acc_threads: dict[str, int] = {}
    for acc_id in present:
        acc = dev.accelerator(acc_id)
        acc_threads[acc_id] = int(threads or acc.threads)
    stale = set()
    for acc_id, n in acc_threads.items():
        if acc_id in cache_threads and cache_threads[acc_id] != str(n):
            stale.add(acc_id)
            rep.notes.append(f"{acc_id}: cached entries were taken with {cache_threads[acc_id]} threads, "
                             f"now {n}: re-measured")
    if cache is not None:
        theirs, ours = dict(cp.host).get("kernels_build", ""), host_info().get("kernels_build", "")
        for acc_id in acc_threads:
            if dev.accelerator(acc_id).backend == "c" and theirs != ours and acc_id not in stale:
                stale.add(acc_id)
                rep.notes.append(f"{acc_id}: cached entries were measured with another build of the C kernels "
                                 f"({theirs or 'unrecorded'}, now {ours}): re-measured")
    from port.lower.program import QUEUED_BACKENDS
    unissued = {a for a in acc_threads if dev.accelerator(a).backend in QUEUED_BACKENDS}
    for key, op in keys.items():
        if key[1] not in present:
            continue
        if key in cached and key[1] not in stale and not (key[1] in unissued and not cached[key].issue_ms):
            # (a queued engine's entry cached without its issue time, OpCost.issue_ms: re-measured)
            results[key] = cached[key]
            rep.reused += 1
        else:
            todo.append((key, op))

    # measure, accelerator by accelerator, in chunks of bounded live memory, blocks round-robin
    total_units = len(todo) * (blocks + 1)
    done_units = 0
    bar = _Progress(progress, total_units)

    def out_of_time() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    by_acc: dict[str, list[tuple[tuple[str, str, str], Op]]] = {}
    for key, op in todo:
        by_acc.setdefault(key[1], []).append((key, op))
    stopped = False
    issue: dict[tuple[str, str, str], float] = {}
    try:
        for acc_id, items in by_acc.items():
            if stopped:
                break
            acc = dev.accelerator(acc_id)
            runner = get_runner(acc.backend, graph, acc_threads[acc_id], seed=seed, optimizer_kwargs=optimizer_kwargs)
            present[acc_id] = runner
            queued = acc.backend in QUEUED_BACKENDS
            i = 0
            while i < len(items) and not stopped:
                chunk: list[tuple[TimingTask, Any, Op]] = []
                live = 0
                while i < len(items) and live < MAX_LIVE_BYTES:
                    key, op = items[i]
                    i += 1
                    if out_of_time():
                        stopped = True
                        break
                    try:
                        prepared = runner.prepare(op, key[2])
                        task = TimingTask(key, prepared, runner.sync)
                        warm_up(task, warmup_ms, block_ms)
                        if queued:     # the host's part of a call (OpCost.issue_ms): a few runs, each synced
                            issue[key] = time_issue(task)
                        peak = runner.peak_delta_bytes(prepared) if peak_memory else 0
                    except Exception as e:  # noqa: BLE001 - one failing kernel must not lose the run
                        rep.failed.append(f"{key[1]}/{key[2]} {op.kind} ({op.name}): {type(e).__name__}: {e}")
                        done_units += blocks + 1
                        bar.update(done_units, f"{acc_id} {op.kind}")
                        continue
                    chunk.append((task, prepared, op, peak))
                    live += _bytes_of(prepared.tensors)
                    done_units += 1
                    bar.update(done_units, f"warm-up {acc_id} {op.kind}")
                for _b in range(blocks):
                    for task, _p, op, _pk in chunk:
                        if out_of_time():
                            stopped = True
                            break
                        time_block(task)
                        done_units += 1
                        bar.update(done_units, f"{acc_id} {op.kind} {task.key[2]}")
                    if stopped:
                        break
                # noisy entries (a busy neighbour, a slow minute): more interleaved blocks while the spread is
                # above SPREAD_TARGET of the median, within a time cap
                t_cap = time.perf_counter() + EXTRA_TIME_FRACTION * (time.perf_counter() - t_start)
                for _r in range(MAX_EXTRA_ROUNDS):
                    noisy = [c for c in chunk if len(c[0].block_ms) >= 2 and _noisy(c[0].block_ms)]
                    if stopped or not noisy or time.perf_counter() > t_cap:
                        break
                    for task, _p, op, _pk in noisy:
                        if out_of_time():
                            stopped = True
                            break
                        time_block(task)
                    rep.remeasured += len(noisy)
                for task, prepared, op, peak in chunk:
                    if not task.block_ms and task.warm_ms > 0:
                        # warmed up, then the time budget ran out before its blocks (a chunk warms all its entries
                        # first): its warm-up's estimate, one sample, is closer than the roofline (bench/coverage.py
                        # --predict at load 8: 903 of timm MobileNetV3's 915 entries were modeled)
                        task.block_ms.append(task.warm_ms)
                    if not task.block_ms:
                        continue   # never timed: modeled below
                    med, spread = summarize(task.block_ms)
                    sig, aid, var = task.key
                    if var == "fused":      # a chain member: its share of its call's time
                        med, spread = med * V.fused_share(graph, op), spread * V.fused_share(graph, op)
                    results[task.key] = OpCost(sig, aid, var, float(med), float(spread), int(prepared.workspace_bytes),
                                               int(peak), True, len(task.block_ms), float(issue.get(task.key, 0.0)))
                    rep.measured += 1
                del chunk
    finally:
        bar.close()

    # this CPU's peak figures (~1 s), recorded in the profile; the roofline prices present CPU entries with them
    # nothing measured this time (every entry from the cache, or every timing failed) and the cache taken with
    # these thread counts: the cache's machine figures (peaks, hand-off, storage) stand too, so a reused profile
    # is the cache's, not a fresh draw of ~1 s calibrations
    fresh = {k for k, _op in todo if k in results and results[k].measured}    # timed in this run
    reuse_all = cache is not None and not fresh and not stale
    same_graph = _cache_of_graph(cp if cache is not None else None, graph)
    peaks: dict[str, str] = {}
    if reuse_all:
        peaks = {k: v for k, v in cp.host if k.startswith("calibrated.")}
    elif present and calibrate_peaks and not out_of_time():
        try:
            pk = calibrate_host_peaks(max(acc_threads.values()) if acc_threads else None,
                                      seconds=1.0 if block_ms >= DEFAULT_BLOCK_MS else 0.4)
            peaks = {f"calibrated.{k}": str(v) for k, v in pk.items()}
        except Exception as e:  # noqa: BLE001 - the YAML figures stand
            rep.notes.append(f"host peak calibration failed ({type(e).__name__}: {e}); device figures used")
    elif cache is not None:
        peaks = {k: v for k, v in cp.host if k.startswith("calibrated.")}

    # modeled: absent accelerators, budget leftovers, failures
    for key, op in keys.items():
        if key in results:
            continue
        acc = dev.accelerator(key[1])
        if key[1] in present:
            acc = calibrated_accelerator(acc, peaks)
        eff = (efficiency or {}).get(acc.id)
        results[key] = OpCost(key[0], key[1], key[2], CM.roofline_ms(graph, op, acc, key[2], eff), 0.0,
                              CM.workspace_bytes(graph, op, key[2]), 0, False, 0)
        if key[1] in present:
            if not any(f.startswith(f"{key[1]}/{key[2]} {op.kind} ({op.name})") for f in rep.failed):
                rep.budget_modeled += 1
        else:
            rep.absent_modeled += 1

    # hand-off
    hand: dict[tuple[str, str], HandoffCost] = {(h.src, h.dst): h for h in CM.modeled_handoff(dev)}
    cached_hand = {(h.src, h.dst): h for h in cp.handoff if h.measured} if cache is not None else {}
    if reuse_all and cached_hand:
        hand.update(cached_hand)
    elif handoff and len(present) > 1 and not out_of_time():
        from port.cost.handoff import measure_handoff
        try:
            for h in measure_handoff(dev, list(present), quick=block_ms < DEFAULT_BLOCK_MS):
                hand[(h.src, h.dst)] = h
        except Exception as e:  # noqa: BLE001
            rep.notes.append(f"hand-off measurement failed ({type(e).__name__}: {e}); modeled")
    from port.cost.handoff import measure_joins, modeled_joins
    joins = modeled_joins(dev)              # a queued engine's join of its drained queue (Plan.joins)
    cached_join = {a: v for a, v in cp.join_ms if a in present} if cache is not None else {}
    if reuse_all and set(cached_join) >= {a for a in joins if a in present}:
        joins.update(cached_join)
    elif handoff and any(a in present for a in joins) and not out_of_time():
        try:
            joins.update(measure_joins(dev, list(present), quick=block_ms < DEFAULT_BLOCK_MS))
        except Exception as e:  # noqa: BLE001
            rep.notes.append(f"join measurement failed ({type(e).__name__}: {e}); modeled")

    info = host_info(graph)
    info.update(peaks)
    if load0:
        info["loadavg.start"] = load0
    for acc_id, n in acc_threads.items():
        r = present.get(acc_id)
        info[f"threads.{acc_id}"] = str(r.threads if r is not None else n)
    for acc_id, n in cache_threads.items():
        info.setdefault(f"threads.{acc_id}", n)
    for n in dev.skipped:
        info[f"skipped.{n.split(':')[0]}"] = n
    info["blocks"] = str(blocks)
    info["block_ms"] = str(block_ms)
    caps = tuple((a.id, a.memory_cap) for a in dev.accelerators if a.memory_cap is not None)
    from port.cost.storage import profile_storage   # measured on the spill path when the config leaves it out
    if reuse_all and dev.storage is not None and dev.storage.measured and dict(cp.storage).get("measured"):
        storage = tuple(cp.storage)
    else:
        storage = profile_storage(dev, measure=not out_of_time(), quick=block_ms < DEFAULT_BLOCK_MS,
                                  notes=rep.notes)
    entries = tuple(results[k] for k in sorted(results))
    prof = Profile(device=dev.name, accelerators=tuple(a.id for a in dev.accelerators), entries=entries,
                   handoff=tuple(hand[k] for k in sorted(hand)),
                   threads=max(acc_threads.values()) if acc_threads else 0,
                   host=tuple(sorted(info.items())), memory_bytes=dev.memory, accelerator_caps=caps,
                   storage=storage, own_memory=CM.own_memory_accelerators(dev),
                   shared_compute=CM.shared_compute_pairs(dev), join_ms=tuple(sorted(joins.items())))
    engine = _engine_footprints(graph, dev, present, acc_threads, dict(cp.engine_bytes) if same_graph else {},
                                stale, rep, seed)
    if engine:
        prof = replace(prof, engine_bytes=tuple(sorted(engine.items())), _index={})
    # nothing new timed on the graph the cache was measured on: its program-order figures stand (the executor's
    # per-step overhead above all: without it every plan's predicted step loses that time)
    kept = {k: v for k, v in cp.host
            if k.startswith((STEP_OVERHEAD_KEY, CALL_DISPATCH_KEY, STATE_SYNC_KEY, RT_ACCELERATORS_KEY,
                             TIMED_CALL_KEY, RT_STEP_SAVING_KEY, "in_program."))} \
        if same_graph and reuse_all else {}
    if kept:
        prof = replace(prof, host=tuple(sorted({**dict(prof.host), **kept}.items())), _index={})
    elif program_order and (fresh or cache is not None):
        from port.lower.lower import default_plan
        from port.plan.types import Plan
        plans, later = [], []      # later: the extra plans (they book only what the default plans did not run)
        for acc_id in present:
            backend = dev.accelerator(acc_id).backend
            try:
                plan = default_plan(graph, backend)
                unfused = default_plan(graph, backend, fuse=False)
            except Exception:  # noqa: BLE001 - a backend without a default plan is not re-timed
                continue
            # the default plan's variants; all plain when the profile lacks one of them (a profile of
            # variants=("plain",)): every op then runs a call this profile prices. Ops the backend cannot run
            # (no C kernel) stay where the default plan put them (the torch engine of the same memory), when
            # this device has that engine
            own = {o.id for o in graph.ops if V.variants(graph, o, backend)}
            if any(d.op not in own and d.accelerator not in present for d in plan.ops):
                continue
            # then, as extra plans, the default plan without fusion (its in-place calls where the default plan
            # fuses) and the all-plain plan: the solver picks such calls, and entries no program ran were priced
            # by their kind's in-program ratio, taken on the other variants (1 thread, CPU time:
            # tv.regnet_y_400mf's 46 plain convolutions priced 4.11 ms, ran 4.52; its 26 in-place batch norms
            # priced 1.17 ms, ran 2.79; tv.efficientnet_b0's plain conv/grad_weight 8-9% short)
            mine: list = []
            for base, plain in ((plan, False), (unfused, False), (plan, True)):
                ops = tuple(type(d)(d.op, acc_id if d.op in own else d.accelerator,
                                    "plain" if plain or d.op not in own else d.variant) for d in base.ops)
                if all(prof.lookup(graph.signature(o), ops[o.id].accelerator, ops[o.id].variant) for o in graph.ops) \
                        and not any(ops == q.ops for q in mine):
                    mine.append(Plan(graph.digest(), prof.digest(), 0, ops, batch_size=graph.batch_size))
            plans += mine[:1]
            later += mine[1:]
        # the torch engine's entries priced between C calls (the mixed programs), its own program's figures only
        # for entries those did not run
        mixed, t_id = mixed_plans(graph, prof, dev, present)
        own_t = [p for p in plans + later if all(d.accelerator == t_id for d in p.ops)] if mixed else []
        rest = [p for p in plans if not any(p is q for q in own_t)]
        more = [p for p in later if not any(p is q for q in own_t)]
        plans = rest + more + mixed + own_t
        books: list = [None] * len(rest) + [LATER] * len(more) + [frozenset({t_id})] * len(mixed) + \
            [LATER] * len(own_t)
        if plans:
            try:
                timed, notes = calibrate_in_program(graph, prof, plans, seed=seed, fresh=fresh,
                                                    overhead_only=not fresh, books=books)
                if fresh:
                    prof = timed
                    rep.notes += [f"{k}: {v}" for k, v in notes.items()]
                elif STEP_OVERHEAD_KEY in notes:   # every entry cached (another graph): only the step overhead
                    prof = with_step_overhead(prof, float(notes[STEP_OVERHEAD_KEY]),
                                              "profile: untimed step wall - timed calls, default plan")
                    more = {k: notes[k] for k in (CALL_DISPATCH_KEY, STATE_SYNC_KEY, RT_ACCELERATORS_KEY,
                                                  TIMED_CALL_KEY, RT_STEP_SAVING_KEY) if k in notes}
                    prof = replace(prof, host=tuple(sorted({**dict(prof.host), **more}.items())), _index={})
                    rep.overhead_measured = True
                    rep.notes.append(f"{STEP_OVERHEAD_KEY}: {notes[STEP_OVERHEAD_KEY]}")
            except Exception as e:  # noqa: BLE001 - keep the isolated timings
                rep.notes.append(f"program-order re-timing failed ({type(e).__name__}: {e}); isolated timings kept")
    rep.seconds = time.perf_counter() - t_start
    return prof, rep


def _cache_of_graph(cp: Profile | None, graph: Graph) -> bool:
    """Whether the cache profile ``cp`` was measured on ``graph`` (its host record's graph digest): only then do
    its graph-level figures (engine footprints, program-order step overhead) carry over."""
    return cp is not None and dict(cp.host).get("graph_digest") == graph.digest()


def _engine_footprints(graph: Graph, dev: DeviceConfig, present: dict, acc_threads: dict[str, int],
                       cached: dict[str, int], stale: set, rep: ProfileReport, seed: int) -> dict[str, int]:
    """{accelerator: engine footprint bytes} for the present host-memory engines (port.cost.footprint): taken
    from ``cached`` (the cache profile's, when it was measured on this graph; for C engines only if this build of
    the kernels is not ``stale``), else measured in a fresh process, also when the timing budget is spent. Failures and
    PORT_PROFILE_ENGINE=0 leave an accelerator out (noted)."""
    from port.cost import footprint as FP
    out: dict[str, int] = {}
    for acc_id in present:
        backend = dev.accelerator(acc_id).backend
        if backend not in FP.HOST_BACKENDS:
            continue
        if acc_id in cached and acc_id not in stale:
            out[acc_id] = int(cached[acc_id])
            continue
        if not FP.enabled():
            rep.notes.append(f"{acc_id}: engine footprint not measured (PORT_PROFILE_ENGINE=0): plans pay none")
            continue
        # not skipped when the timing budget is spent: a footprint is memory accounting, not a timing
        # refinement, and a profile without one lets the ILP put ops on an engine for free (bench/e2e.py,
        # 2026-11-29: the four CNNs' profiles ran out of their 30 s, the 50% plans put 47 of MobileNetV3-small's
        # 558 ops on cpu-torch, and the steps grew the process by 12.5 MiB of libtorch's code pages beyond the
        # arena). One short child per engine: a few seconds past ``max_time_s``.
        try:
            r = FP.measure_engine_bytes(graph, backend, acc_threads.get(acc_id, 1), seed=seed)
        except Exception as e:  # noqa: BLE001 - the timings stand without it
            rep.notes.append(f"{acc_id}: engine footprint measurement failed ({e}); plans pay none")
            continue
        out[acc_id] = int(r["engine_bytes"])
        rep.engine_measured += 1
        rep.notes.append(f"{acc_id}: engine footprint {r['engine_bytes'] / 2**20:.1f} MiB resident after "
                         f"{r['steps']} steps of the all-{backend} plan (anonymous {r['anon_bytes'] / 2**20:.1f}, "
                         f"file-backed {r['file_bytes'] / 2**20:.1f} MiB)")
    return out


def profile(graph: Graph, device: DeviceConfig | str | Path, **kw: Any) -> Profile:
    """Measured costs of every (op signature, legal variant, present accelerator) of ``graph`` on
    ``device``; modeled (roofline, ``measured=False``) for accelerators not present on this machine.

    Keyword options: ``cache`` (a Profile or file: its measured entries are reused, so re-profiling is
    incremental), ``max_time_s`` (budget; entries not reached are modeled), ``blocks`` / ``block_ms`` /
    ``warmup_ms`` (timing), ``accelerators`` (subset of ids to measure), ``threads`` (override),
    ``handoff`` (measure hand-off costs), ``peak_memory`` (measure peak RSS growth per entry),
    ``progress`` (True: a rich progress bar with ETA; or a callback(done, total, label)), ``variants``
    (only these variant names, e.g. ("plain",)), ``program_order`` (re-time the measured entries in program
    order, see :func:`calibrate_in_program`; default on).
    """
    return profile_with_report(graph, device, **kw)[0]


class _Progress:
    def __init__(self, progress: Any, total: int) -> None:
        self.cb = progress if callable(progress) else None
        self.rich = None
        if progress is True and total > 0:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)
            self.rich = Progress(TextColumn("profiling"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("ETA"),
                                 TimeRemainingColumn(), TextColumn("{task.description}"), transient=True)
            self.rich.start()
            self.task = self.rich.add_task("", total=total)
        self.total = total

    def update(self, done: int, label: str) -> None:
        if self.cb is not None:
            self.cb(done, self.total, label)
        if self.rich is not None:
            self.rich.update(self.task, completed=done, description=label[:40])

    def close(self) -> None:
        if self.rich is not None:
            self.rich.stop()


CALIBRATE_STEPS_KEY = "in_program.steps"           # host record: instrumented steps per re-timed plan
# program-order re-timing: at least `steps` instrumented steps, more until their calls add up to this many ms
CALIBRATE_MIN_MS, CALIBRATE_MAX_STEPS = 150.0, 40


def in_program_times(graph: Graph, plan: Any, rows: list[dict]) -> dict[tuple[str, str, str], float]:
    """Per (signature, accelerator, variant) of ``plan``: the in-program ms of one op, from one instrumented
    step's call rows (``Executor.run(timing=True)["calls"]``: a fused chain's call is split over the members it
    computes by their shares, port.plan.variants.fused_share; re-runs are left out); identical layers share a
    signature, so the per-layer mean."""
    return per_key_times(graph, plan, op_times(graph, plan, rows))


def op_times(graph: Graph, plan: Any, rows: list[dict]) -> dict[int, float]:
    """Op id -> in-program ms of one instrumented step's call rows: a fused chain's call split over the members it
    computes by their shares (port.plan.variants.fused_share, as the profile prices them); re-runs left out."""
    per: dict[int, float] = {}
    for row in rows:
        if row["op"] < 0 or row["recompute"]:
            continue
        o = graph.ops[row["op"]]
        ch = V.chain_of(graph, o) if plan.ops[o.id].variant == "fused" else None
        for m in ([m for m in ch.ops if ch.call_of(m) == o.id] if ch is not None else [o.id]):
            per[m] = per.get(m, 0.0) + row["ms"] * (V.fused_share(graph, graph.ops[m]) if ch is not None else 1.0)
    return per


def per_key_times(graph: Graph, plan: Any, op_ms: dict[int, float]) -> dict[tuple[str, str, str], float]:
    """{(signature, accelerator, variant): mean ms over the plan's ops with that key} from ``op_ms`` (op id ->
    ms; ops without an entry ran no call of their own and count as 0)."""
    tot: dict[tuple[str, str, str], list[float]] = {}
    for o in graph.ops:
        d = plan.ops[o.id]
        tot.setdefault((graph.signature(o), d.accelerator, d.variant), []).append(op_ms.get(o.id, 0.0))
    return {k: sum(v) / len(v) for k, v in tot.items()}


def apply_in_program(graph: Graph, profile: Profile, seen: dict[tuple[str, str, str], list[float]],
                     fresh: set | None = None, scale_others: bool = True, label: str = "in_program"
                     ) -> tuple[Profile, dict[str, str]]:
    """Replace every entry in ``seen`` by the median of its in-program times; scale the other measured entries
    (only those in ``fresh`` when given) by the median in-program / profiled ratio of their op kind on that
    accelerator (else of the accelerator). Returns the profile and notes (also written to its host record)."""
    import statistics as st
    from dataclasses import replace
    kind_of: dict[str, str] = {}
    for o in graph.ops:
        kind_of.setdefault(graph.signature(o), o.kind)
    ratios: dict[tuple[str, str], list[float]] = {}
    new = {}
    for e in profile.entries:
        key = (e.signature, e.accelerator, e.variant)
        if key in seen and (e.latency_ms > 0 or not e.measured):
            ms = float(st.median(seen[key]))
            # a modeled entry (the time budget did not reach it) that ran in the program is now measured
            new[key] = replace(e, latency_ms=ms, measured=True, samples=e.samples or len(seen[key]))
            if ms > 0 and e.measured and e.latency_ms > 0:
                ratios.setdefault((e.accelerator, kind_of.get(e.signature, "?")), []).append(ms / e.latency_ms)
                ratios.setdefault((e.accelerator, "*"), []).append(ms / e.latency_ms)
    med = {k: float(st.median(v)) for k, v in ratios.items()}
    entries = []
    for e in profile.entries:
        key = (e.signature, e.accelerator, e.variant)
        if key in new:
            entries.append(new[key])
        elif scale_others and e.measured and (fresh is None or key in fresh):
            f = med.get((e.accelerator, kind_of.get(e.signature, "?")), med.get((e.accelerator, "*"), 1.0))
            entries.append(replace(e, latency_ms=e.latency_ms * f))
        else:
            entries.append(e)
    notes = {f"{label}.{acc}": f"{len(v)} entries re-timed in program order, median ratio {med[(acc, '*')]:.3f}"
             for (acc, kind), v in ratios.items() if kind == "*"}
    host = dict(profile.host)
    host.update(notes)
    return replace(profile, entries=tuple(entries), host=tuple(sorted(host.items())), _index={}), notes


def with_step_overhead(profile: Profile, overhead_ms: float, how: str) -> Profile:
    """``profile`` with the executor's fixed per-step overhead (wall step - sum of the timed calls; >= 0)
    recorded in its host record; port.verify.simulate adds it to every plan's predicted step."""
    from dataclasses import replace
    host = dict(profile.host)
    host[STEP_OVERHEAD_KEY] = f"{max(0.0, float(overhead_ms)):.4f}"
    host[STEP_OVERHEAD_KEY + ".how"] = how
    return replace(profile, host=tuple(sorted(host.items())), _index={})


def correct_from_run(graph: Graph, profile: Profile, plan: Any, op_ms: dict[int, float],
                     wall_step_ms: float | None, label: str) -> tuple[Profile, int, int, float | None]:
    """The profile corrected by one measured run of ``plan`` (the calibration `port train --replan` and
    bench/e2e.py share): every (signature, accelerator, variant) the plan ran gets its in-plan time (``op_ms``:
    op id -> ms from instrumented steps, in program order, a fused chain booked on its call ops); the other
    measured entries are scaled by the median in-plan / profiled ratio of their op kind on that accelerator;
    the executor's per-step overhead becomes ``wall_step_ms`` minus the plan priced with the corrected
    entries. Returns (profile, entries changed, entries seen, overhead ms or None)."""
    from port.errors import PortError
    from port.verify.simulate import simulate
    before = {(e.signature, e.accelerator, e.variant): e.latency_ms for e in profile.entries}
    seen = {k: [ms] for k, ms in per_key_times(graph, plan, op_ms).items() if k in before}
    p, _notes = apply_in_program(graph, profile, seen, label=label)
    over = None
    if isinstance(wall_step_ms, (int, float)) and wall_step_ms > 0:
        try:
            kern = simulate(plan, graph, with_step_overhead(p, 0.0, label)).step_ms
        except PortError:
            kern = None
        if kern is not None:
            over = max(0.0, float(wall_step_ms) - kern)
            p = with_step_overhead(p, over, f"{label}: wall {wall_step_ms:.3f} ms - priced in-plan op times "
                                            f"{kern:.3f} ms")
    changed = sum(1 for k in seen if abs(before[k] - seen[k][0]) > 1e-9)
    return p, changed, len(seen), over


# the share of a block's calls left out of its mean, slowest first: a call the scheduler preempted (another
# process on the core) carries the whole time slice, milliseconds against ~1 us (bert_seqcls_mask at load 8: its
# dispatch figure took almost the whole price of every call off the plan, predicted 0.04 ms, ran 0.29)
DISPATCH_TRIM = 0.02


def _per_call_us(run: Callable[[], Any], calls: int, blocks: int) -> float:
    """Microseconds of ``run`` timed one call at a time as Executor.run(timing=True) times a call (the same clock,
    a no-op sync): per block the mean over its calls less the slowest DISPATCH_TRIM, the median over blocks."""
    import statistics as st
    clock, per = time.perf_counter, []
    keep = max(1, int(calls * (1.0 - DISPATCH_TRIM)))

    def sync():
        return None
    for _ in range(blocks):
        ts = []
        for _ in range(calls):
            t0 = clock()
            run()
            sync()
            ts.append(clock() - t0)
        per.append(sum(sorted(ts)[:keep]) / keep * 1e6)
    return st.median(per)


def measure_call_dispatch_us(calls: int = 2000, blocks: int = 5) -> float:
    """What Executor.run(timing=True) adds to every C call's time beyond the kernel, in microseconds: a closure
    built as port.exec.backends.c binds a call, whose ``port_rt_exec`` returns at its kernel switch (kernel id -1:
    unsupported), timed as :func:`_per_call_us` times it. Program-order re-timing prices ops with it; the
    whole-step C engine dispatches from C and does not (port.verify.simulate.rt_dispatch_saving_ms)."""
    import ctypes
    from port.exec import capi, rtcall
    rc, state = capi.RtCall(), rtcall.RtState()
    rc.kernel = -1
    ptrs = (ctypes.c_void_p * rtcall.MAX_PTRS)()
    fn, rcp, sp = capi.raw.port_rt_exec, ctypes.byref(rc), ctypes.byref(state)

    def run():
        s = fn(rcp, ptrs, None, sp)
        if not s:
            raise RuntimeError("port_rt_exec ran kernel id -1")
    return _per_call_us(run, calls, blocks)


def measure_state_sync_us(state: Any, calls: int = 2000, blocks: int = 5) -> float:
    """What the per-op executor adds, beyond :func:`measure_call_dispatch_us`, to a C call that reads the run
    state (an optimizer update, a dropout draw: Encoded.state), in microseconds: port.exec.backends.c syncs the
    call's C run state from ``state`` (a port.exec.executor.RunState) before each such call
    (port.exec.rtcall.state_from), the whole-step engine once a half step. Timed as :func:`_per_call_us` times
    it."""
    from port.exec import rtcall
    out, sync = rtcall.RtState(), rtcall.state_from
    return _per_call_us(lambda: sync(state, out), calls, blocks)


def init_parameters(graph: Graph, ex: Any, gen: Any) -> None:
    """Fill the float32 parameters of executor ``ex``'s arena as a model's initialisation does (weights of 2 or
    more dims: normal, std 1/sqrt(fan-in); 1-D weights about 1, biases about 0), so that program-order re-timing
    runs on activations of a trained model's scale. On a zeroed arena every activation is 0 and some kernels run
    several times faster than in training (timm MobileNetV3's batch norms on 4x4 maps: 0.033 ms zeroed, 0.097 ms
    with the model's weights, in the same program: the plan's step predicted 16% short)."""
    import math

    import torch
    from port.ir.types import ROLE_PARAMETER
    for t in graph.tensors:
        if t.role != ROLE_PARAMETER or t.dtype != "float32":
            continue
        try:
            v = ex.view(t.id)
        except Exception:  # noqa: BLE001 - a parameter the program holds no slot for (folded away)
            continue
        shape = tuple(int(d) for d in t.shape)
        r = torch.randn(shape, generator=gen)
        if len(shape) >= 2:
            r.mul_(1.0 / math.sqrt(max(1, math.prod(shape[1:]))))
        else:
            r.mul_(0.1).add_(1.0 if t.name.endswith("weight") else 0.0)
        v.copy_(r.to(v.device))


def init_inputs_as_traced(graph: Graph, ex: Any) -> None:
    """Fill what a model's step reads besides its weights and batch as a Trainer's step has it, so that program-order
    re-timing takes the kernels' paths the model takes: the folded constants (port.ir.fold: causal masks, position
    ids) whose recipes read no model buffer, evaluated (a buffer-made one, a rotary table from ``inv_freq``, stays
    0: the profile has no model), and the further integer inputs no embedding looks up (attention masks) all 1,
    nothing padded (an embedding's ids stay 0, as the main input's). On a zeroed arena a boolean causal mask is all
    False: every attention row is fully masked and the kernel skips its softmax (HF BERT / GPT-2 / LLaMA, 16 tokens:
    the attention calls priced 0.025 ms, 0.059 in the model's steps; the whole step 18-23% over its prediction)."""
    from port.ir.fold import shape_constants
    from port.ir.tokens import token_bounds
    ids = {t.name: t.id for t in graph.tensors}
    for name, value in shape_constants(graph.constants).items():
        try:
            v = ex.view(ids[name])
        except Exception:  # noqa: BLE001 - a constant the program holds no slot for (folded away)
            continue
        v.copy_(value.reshape(v.shape).to(v.device))
    looked_up = {b.input for b in token_bounds(graph)}
    for k, v in enumerate(ex.extra_inputs):
        if k + 1 not in looked_up and not v.dtype.is_floating_point:
            v.fill_(1)


def rt_engine_of(ex: Any, graph: Graph, plan: Any) -> Any:
    """The whole-step C engine on executor ``ex``'s arena (port.exec.rtengine.for_executor), or None when it
    cannot run the program (a further input of another dtype, paging, an old library)."""
    from port.errors import PortError
    from port.exec.rtengine import for_executor
    try:
        return for_executor(ex, graph, plan)
    except (PortError, OSError, AttributeError):
        return None


LATER = "later"     # calibrate_in_program's book: entries no plan before booked


def mixed_plans(graph: Graph, profile: Profile, dev: DeviceConfig, present: dict) -> tuple[list, str]:
    """Two plans that run the torch engine's ops between the C engine's, as a solved plan on a device with both
    puts them: the C engine's all-plain default plan with every other op it runs (by op id: the even ones in the
    first plan, the odd ones in the second) on the torch engine of the same memory, in its default plan's variant
    there. Program-order re-timing prices the torch entries in these (issue 52): timm's MobileNetV3-small-050 at
    batch 8, one thread, CPU time per call, the ILP's mixed plan against the all-torch program its torch entries
    used to be priced from: its torch convolutions 1.5x, batch norms' gradients 1.5x, a ReLU gradient 3.4x, the
    torch calls 1.3x in all. Returns (plans, the torch accelerator's id); no plans unless a C and a torch-cpu
    accelerator of one memory are both present, or when the profile lacks an entry these plans need."""
    from port.lower.lower import BACKEND_ACCELERATORS, default_plan
    from port.plan.types import Plan
    by = {dev.accelerator(a).backend: dev.accelerator(a) for a in present}
    c, t = by.get("c"), by.get("torch-cpu")
    if c is None or t is None or getattr(c, "memory", None) != getattr(t, "memory", None):
        return [], ""
    try:
        base, tplan = default_plan(graph, "c", fuse=False, inplace=False), default_plan(graph, "torch-cpu")
    except Exception:  # noqa: BLE001 - no default plan: nothing to mix
        return [], t.id
    on_c = [d.op for d in base.ops if d.accelerator == BACKEND_ACCELERATORS["c"]]
    ids = {BACKEND_ACCELERATORS["c"]: c.id, BACKEND_ACCELERATORS["torch-cpu"]: t.id}
    out = []
    for parity in (0, 1):
        moved = set(on_c[parity::2])
        ops = tuple(type(d)(d.op, t.id, tplan.ops[d.op].variant) if d.op in moved
                    else type(d)(d.op, ids.get(d.accelerator, d.accelerator), d.variant) for d in base.ops)
        if moved and all(profile.lookup(graph.signature(o), ops[o.id].accelerator, ops[o.id].variant)
                         for o in graph.ops):
            out.append(Plan(graph.digest(), profile.digest(), 0, ops, batch_size=graph.batch_size))
    return out, t.id


def calibrate_in_program(graph: Graph, profile: Profile, plans: list, steps: int = 3, seed: int = 0,
                         fresh: set | None = None, overhead_only: bool = False,
                         min_ms: float = CALIBRATE_MIN_MS, max_steps: int = CALIBRATE_MAX_STEPS,
                         books: list | None = None) -> tuple[Profile, dict[str, str]]:
    """Re-time ``profile``'s measured entries in program order: run each plan's program (lowered exactly as
    training runs it, on a zeroed arena with initialised parameters, the model's masks and a random batch:
    :func:`init_parameters`, :func:`init_inputs_as_traced`) for ``steps`` instrumented steps after one warm-up
    step, and replace every entry a call exercised by the median of its in-program call times. Ops timed alone
    run on cache-hot inputs; in a step their inputs come from the op before, so memory-bound ops in particular
    run slower there. The parameters are initialised as a model's are (:func:`init_parameters`), not left 0: some
    kernels run faster on all-zero activations. At least ``steps`` steps per plan, more while their calls add up
    to less than ``min_ms``
    (up to ``max_steps``): a sub-millisecond step's calls are a few microseconds each, and three samples of them
    caught one busy moment of the machine as often as not (a 0.7 ms step predicted anywhere in 0.54-0.80 ms by
    four profiles of one process; the measured step, a median over 15, moved less). Measured entries no call exercised are scaled by the median in-program / isolated ratio
    of their op kind on that accelerator (else of the accelerator); ``fresh``: only these keys are scaled (entries
    taken from a cache were scaled when they were measured). The first plan's program is also run untimed after each
    instrumented step, as Trainer.step runs it (check the batch's token ids and labels, zero the gradients, copy
    the batch in, run, read the loss, check it and the gradients are finite, update; the checks were left out
    before: hf.llama_lm_mask's all-C plan, 0.4 ms a step, predicted 22% short): the median over these pairs of
    its wall time minus the timed step's calls is the executor's per-step overhead (recorded, see
    :func:`with_step_overhead`; paired, so that a change of load between the timed and the untimed steps does not
    enter it). When the whole-step C engine can run that program (an all-C plan: port.exec.rtengine.for_executor),
    each pair also runs its untimed step on that engine, the two untimed steps in alternating order: the median of
    their difference per timed call is what the engine saves (host ``executor.rt_step_saving_v1_us``, signed;
    port.verify.simulate.rt_dispatch_saving_ms). ``overhead_only``: only that (the first plan's program; no
    entry re-timed: a cache of another graph whose entries were calibrated when measured). Returns the profile
    and notes for its host record. ``books`` (one per plan; None: every plan books every entry it runs):
    a set of accelerator ids books only their entries (the torch engine's in a mixed plan, :func:`mixed_plans`;
    such a plan is an extra context, left out (noted) when it fails to lower); LATER books only entries no plan
    before it booked."""
    import statistics as st
    import time as _time

    import torch
    from port.cost.runners import get_runner
    from port.exec.executor import Executor
    from port.ir.tokens import check_tokens, token_bounds
    from port.lower.lower import lower

    seen: dict[tuple[str, str, str], list[float]] = {}
    bounds = token_bounds(graph)         # the untimed step checks the batch's ids as Trainer.step does
    notes_skipped: list[str] = []
    ncalls = 0
    rt_accs: set[str] = set()
    run_state = None
    gen = torch.Generator().manual_seed(seed)
    overhead = None
    rt_diffs: list[float] = []       # the untimed per-op step less the untimed whole-step engine's, paired
    counts: dict[int, int] = {}
    books = list(books or [None] * len(plans))
    booked_before: set = set()
    for pi, plan in enumerate(plans[:1] if overhead_only else plans):
        book = books[pi] if pi < len(books) else None
        if book == LATER:
            booked_before = set(seen)
        mine: dict[tuple[str, str, str], list[float]] = {}
        try:
            prog = lower(graph, plan, check_digest=False)
            backends = {c.backend for c in prog.calls} - {"host"}
            if backends == {"c"}:
                rt_accs.update(d.accelerator for d in plan.ops)
            runner = get_runner(sorted(backends)[0], graph, None, seed=seed)
            ex = Executor(prog)
            ex.state.opt, ex.state.step = runner.state.opt, runner.state.step
            run_state = run_state or ex.state
            init_parameters(graph, ex, gen)
            init_inputs_as_traced(graph, ex)     # causal masks, attention masks: as a step has them
            x = torch.randn(ex.input.shape, generator=gen) if ex.input.dtype.is_floating_point \
                else torch.zeros(ex.input.shape, dtype=ex.input.dtype)       # token ids: id 0
            ex.input.copy_(x)
            y = None
            if ex.labels is not None:
                y = torch.randint(0, graph.tensors[graph.logits_id].shape[-1], ex.labels.shape, generator=gen)
                ex.labels.copy_(y)
            extras = [v.clone() for v in ex.extra_inputs]
            names = ["x"] + [f"x[{k}]" for k in range(len(extras))]

            def untimed_ms() -> float:     # one step as Trainer.step runs it, its checks of the batch included
                t0 = _time.perf_counter()
                if bounds:
                    check_tokens(bounds, [x, *extras], names)
                if y is not None:
                    ex.check_labels(y)
                ex.zero_grads()
                ex.input.copy_(x)
                for v, e in zip(ex.extra_inputs, extras):
                    v.copy_(e)
                if y is not None:
                    ex.labels.copy_(y)
                ex.run_main()
                ex.nonfinite(float(ex.loss) if ex.labels is not None else 0.0)
                ex.run_updates()
                return (_time.perf_counter() - t0) * 1e3

            rt = rt_engine_of(ex, graph, plan) if pi == 0 and backends == {"c"} else None
            yl = y if y is not None else torch.zeros(0, dtype=torch.int64)

            def rt_ms() -> float:          # the same step on the whole-step C engine, as Trainer.step runs it
                t0 = _time.perf_counter()
                if bounds:
                    check_tokens(bounds, [x, *extras], names)
                if y is not None:
                    ex.check_labels(y)
                loss = rt.forward_backward(x, yl, extras)
                ex.nonfinite(loss)
                rt.update()
                return (_time.perf_counter() - t0) * 1e3

            diffs = []
            timed_ms, k = 0.0, -1
            while True:
                k += 1
                if k > steps and (timed_ms >= min_ms or k > max(steps, max_steps)):
                    break
                ex.zero_grads()
                r = ex.run(timing=True)
                if k == 0:
                    continue
                timed_ms += r["total_ms"]
                counts[pi] = k
                for key, ms in in_program_times(graph, plan, r["calls"]).items():
                    if isinstance(book, frozenset) and key[1] not in book or book == LATER and key in booked_before:
                        continue
                    mine.setdefault(key, []).append(ms)
                if pi == 0:   # paired with the timed step just run: a load change between them cancels out
                    if rt is None:
                        diffs.append(untimed_ms() - r["total_ms"])
                    else:      # the two untimed steps in alternating order, so neither always runs second
                        if k % 2:
                            a, b = untimed_ms(), rt_ms()
                        else:
                            b = rt_ms()
                            a = untimed_ms()
                        diffs.append(a - r["total_ms"])
                        rt_diffs.append(a - b)
                    ncalls = len(r["calls"])
        except Exception as e:  # noqa: BLE001 - a mixed or LATER plan is an extra context; the others stand
            if not isinstance(book, frozenset) and book != LATER:
                raise
            notes_skipped.append(f"extra plan {pi} not re-timed ({type(e).__name__}: {str(e)[:120]})")
            continue
        for key, v in mine.items():
            seen.setdefault(key, []).extend(v)
        if diffs:
            overhead = st.median(diffs)
    prof, notes = (profile, {}) if overhead_only else apply_in_program(graph, profile, seen, fresh)
    if overhead is not None:
        prof = with_step_overhead(prof, overhead, "profile: untimed step wall - timed calls, default plan")
        notes[STEP_OVERHEAD_KEY] = f"{max(0.0, overhead):.4f}"
        # the untimed step shorter than its timed calls: the timers' cost, per call (simulate's
        # timed_call_saving_ms takes it off the plans the per-op executor runs)
        notes[TIMED_CALL_KEY] = f"{max(0.0, -overhead) * 1e3 / max(1, ncalls):.4f}"
    if rt_diffs:     # what the whole-step C engine saves per call over the untimed per-op step (simulate's
        # rt_step_saving_ms); may be negative (the engine slower): recorded as measured
        notes[RT_STEP_SAVING_KEY] = f"{st.median(rt_diffs) * 1e3 / max(1, ncalls):.4f}"
    c_accs = sorted({d.accelerator for p in plans for d in p.ops if d.accelerator in rt_accs})
    if c_accs:     # the whole-step C engine runs plans on these without the per-call dispatch timed above
        notes[CALL_DISPATCH_KEY] = f"{measure_call_dispatch_us():.4f}"
        if run_state is not None:
            notes[STATE_SYNC_KEY] = f"{measure_state_sync_us(run_state):.4f}"
        notes[RT_ACCELERATORS_KEY] = ",".join(c_accs)
    if counts:
        notes[CALIBRATE_STEPS_KEY] = ",".join(str(counts[i]) for i in sorted(counts))
    if notes_skipped:
        notes["in_program.skipped"] = "; ".join(notes_skipped)
    keys = (CALIBRATE_STEPS_KEY, CALL_DISPATCH_KEY, STATE_SYNC_KEY, RT_ACCELERATORS_KEY, TIMED_CALL_KEY,
            RT_STEP_SAVING_KEY)
    if any(k in notes for k in keys):
        host = {**dict(prof.host), **{k: notes[k] for k in keys if k in notes}}
        prof = replace(prof, host=tuple(sorted(host.items())), _index={})
    return prof, notes
