"""The torch-cuda backend on a real GPU (skipped, with the reason, where torch sees no CUDA device).

Each test is the CUDA twin of a CPU test elsewhere: a default plan trains like PyTorch eager (test_plans.py), a
recompute plan equals the keep-everything plan on the same backend and holds less GPU memory (measured by the
CUDA caching allocator, not accounted), a paged plan pages through the pinned staging buffer (test_paging.py),
the profiler measures every op on the GPU, and a plan the solver makes for `host` with its `cuda` engine present
runs.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device: the torch-cuda backend's tests need a GPU")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "e2e"))

import port.models as M  # noqa: E402
from port.config import load_device  # noqa: E402
from port.ir.trace import trace  # noqa: E402
from port.lower.lower import default_plan, lower, recompute_plan  # noqa: E402
from port.train.trainer import Trainer  # noqa: E402
from _equiv import compare, data, port_opt  # noqa: E402

LR = 0.005


@pytest.fixture(autouse=True)
def _deterministic():
    """cuDNN may pick a non-deterministic backward algorithm; the bitwise comparisons below need one."""
    old = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = old


def _losses(model, batches, plan, **kw):
    tr = Trainer(copy.deepcopy(model), batches[0][0], optimizer=port_opt("sgd", LR), backend="torch-cuda",
                 plan=plan, **kw)
    return [tr.step(x, y) for x, y in batches], tr


def test_default_plan_trains_like_eager_and_replays_one_cuda_graph(monkeypatch):
    """Steps 1-2 run the calls, step 2 captures them, steps 3-5 replay the graph: every step's loss and the final
    weights as eager's, and the replayed steps bit for bit the steps of an executor that never captures."""
    model = M.get("resnet8", seed=0)
    batches = data("resnet8", 2, 5)
    g = trace(model, batches[0][0], optimizer="sgd_momentum")
    plan = default_plan(g, "torch-cuda")
    _pl, _tl, tr = compare(copy.deepcopy(model), batches, "sgd", lr=LR, plan=plan, backend="torch-cuda")
    assert tr.arena.device.type == "cuda"
    assert tr.executor.cuda_graph == "replayed"
    graphed, _ = _losses(model, batches, plan)
    monkeypatch.setenv("PORT_CUDA_GRAPH", "0")
    eager, tr0 = _losses(model, batches, plan)
    assert tr0.executor.cuda_graph == "eager: PORT_CUDA_GRAPH=0"
    assert graphed == eager


def _eager_gpu_peak(model, batches) -> int:
    """PyTorch eager's GPU memory for the same training (caching allocator's peak allocated bytes)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    m = copy.deepcopy(model).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9)
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(m(x.cuda()), y.cuda()).backward()
        opt.step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def test_recompute_plan_equals_keep_plan_and_holds_less_gpu_memory():
    """Measured GPU memory (the caching allocator's peak over set-up and steps: arena, aten temporaries, cuDNN
    workspaces, the CUDA graphs' pools): keep-everything within 1.25x eager's, recomputation below it."""
    model = M.get("resnet8", seed=0)
    batches = data("resnet8", 64, 4)
    g = trace(model, batches[0][0], optimizer="sgd_momentum")
    keep = default_plan(g, "torch-cuda", fuse=False, inplace=False)
    rec = recompute_plan(g, keep)
    assert rec.recompute
    assert lower(g, rec).arena_bytes < lower(g, keep).arena_bytes
    eager = _eager_gpu_peak(model, batches)
    peaks, runs = {}, {}
    for name, plan in (("keep", keep), ("recompute", rec)):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        runs[name], tr = _losses(model, batches, plan)
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated() - base
        print(name, "arena", tr.arena.numel(), "GPU peak", peaks[name], "eager", eager, tr.executor.cuda_graph)
        del tr
    assert runs["recompute"] == runs["keep"]           # same backend, same kernels: bit for bit
    assert peaks["keep"] <= 1.25 * eager, (peaks, eager)
    assert peaks["recompute"] < peaks["keep"], peaks


def test_graph_replay_follows_learning_rate_changes_and_adamw_stays_eager(monkeypatch):
    """A learning-rate change mid-run re-captures the graphs (the updates' scalars are part of what they
    replay); AdamW's per-step bias corrections keep its update passes eager. Either way the run is bit for bit
    the run of an executor that never captures."""
    from port.train.optim import AdamW, SGD
    model = M.get("resnet8", seed=0)
    batches = data("resnet8", 4, 8)
    g = trace(model, batches[0][0], optimizer="sgd_momentum")
    plan = default_plan(g, "torch-cuda")
    ga = trace(model, batches[0][0], optimizer="adamw")
    plan_a = default_plan(ga, "torch-cuda")

    def run(opt, plan):
        tr = Trainer(copy.deepcopy(model), batches[0][0], optimizer=opt, backend="torch-cuda", plan=plan)
        out = []
        for i, (x, y) in enumerate(batches):
            if i == 5:
                tr.opt.lr = tr.opt.lr / 2
            out.append(tr.step(x, y))
        return out, {k: v.cpu() for k, v in tr.state_dict().items()}, tr

    a, wa, tr = run(SGD(LR, momentum=0.9, weight_decay=1e-4), plan)
    assert tr.executor.cuda_graph == "replayed" and tr.executor.update_graph == "replayed"
    assert tr.executor._graph_updates.captures == 2              # before and after the change
    b, wb, tr = run(AdamW(1e-3), plan_a)
    assert "AdamW" in tr.executor.update_graph
    monkeypatch.setenv("PORT_CUDA_GRAPH", "0")
    a0, wa0, _ = run(SGD(LR, momentum=0.9, weight_decay=1e-4), plan)
    b0, wb0, _ = run(AdamW(1e-3), plan_a)
    assert a == a0 and b == b0
    assert all(torch.equal(wa[k], wa0[k]) for k in wa) and all(torch.equal(wb[k], wb0[k]) for k in wb)


def test_paged_plan_pages_through_the_staging_buffer(tmp_path, monkeypatch):
    from test_paging import page_candidates
    monkeypatch.setenv("PORT_SPILL_DIR", str(tmp_path))
    model = M.get("resnet8", seed=0)
    batches = data("resnet8", 2, 3)
    g = trace(model, batches[0][0], optimizer="sgd_momentum")
    keep = default_plan(g, "torch-cuda", fuse=False, inplace=False)
    paged = tuple(page_candidates(g)[:6])
    assert len(paged) == 6
    a, _ = _losses(model, batches, keep)
    b, tr = _losses(model, batches, dataclasses.replace(keep, paged=paged))
    assert a == b
    c = tr.executor.spill_counters()
    assert c["writes"] == c["reads"] == len(batches) * len(paged)
    assert tr.executor._staging.is_pinned()
    assert "pages to storage" in tr.executor.cuda_graph        # host file I/O cannot be captured


def test_profile_measures_every_op_on_the_gpu():
    from port.cost.measure import profile_with_report
    model = M.get("resnet8", seed=0)
    g = trace(model, torch.randn(4, *M.INPUT_SHAPES["resnet8"]), optimizer="sgd_momentum")
    prof, rep = profile_with_report(g, "host", accelerators=("cuda",), handoff=False, blocks=2, block_ms=1.0,
                                    warmup_ms=0.5)
    assert rep.failed == []
    cuda = [e for e in prof.entries if e.accelerator == "cuda"]
    assert cuda and all(e.measured for e in cuda)
    assert all(e.latency_ms > 0 for e in cuda if e.signature.startswith('["conv2d'))    # views cost 0
    assert {g.signature(o) for o in g.ops} <= {e.signature for e in cuda}


def test_host_has_its_cuda_engine():
    dev = load_device("host")
    assert "cuda" in [a.id for a in dev.accelerators]
    assert not any(s.startswith("cuda:") for s in dev.skipped)


def test_a_plan_solved_for_host_with_its_gpu_runs():
    """`port train` on a machine with a GPU: the profile measures cpu-c, cpu-torch and cuda; the plan the pipeline
    solves runs in one memory (tests/unit/test_devices.py: the plain ILP mixes them) and trains like eager; the
    Trainer puts its arena where the plan's calls run (here without backend="torch-cuda")."""
    import port.pipeline as P
    from port.cost.measure import profile_with_report
    from port.exec.executor import program_device
    job = P.load_job(model="resnet8", batch=8, budget="60%")
    built = P.build_graph(job)
    prof, _rep = profile_with_report(built.graph, job.device, blocks=2, block_ms=1.0, warmup_ms=0.5)
    assert "cuda" in prof.accelerators
    step = P.ProfileStep(prof, None, "measured", "measured")
    plan = P.solve_plan(job, built, step, P.resolve_budget(job, built.graph, prof)).plan
    where = program_device(lower(built.graph, plan))
    print("plan on", where, sorted({d.accelerator for d in plan.ops}))
    batches = data("resnet8", 8, 3)
    _pl, _tl, tr = compare(copy.deepcopy(built.model), batches, "sgd", lr=LR, plan=plan)
    assert tr.arena.device.type == where
