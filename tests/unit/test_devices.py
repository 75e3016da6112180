"""Device descriptions: every shipped YAML loads; schema errors name the key."""
from __future__ import annotations

from pathlib import Path

import pytest

from port.config import DEVICE_DIR, device_names, load_device
from port.errors import ConfigError

MODELED = ("raspberry-pi-4b", "jetson-orin-nano", "iphone-15-pro", "cortex-m4f")


def test_shipped_devices_load():
    names = device_names()
    for n in ("host",) + MODELED:
        assert n in names
    for n in names:
        full = load_device(n, present_only=False)
        here = load_device(n)
        assert full.memory > 0 and here.accelerators
        assert {a.id for a in here.accelerators} <= {a.id for a in full.accelerators}


def test_host_has_two_cpu_engines_and_optional_cuda():
    full = load_device("host", present_only=False)
    ids = [a.id for a in full.accelerators]
    assert ids[:2] == ["cpu-c", "cpu-torch"]
    cuda = full.accelerator("cuda")
    assert cuda.optional and cuda.requires == "cuda"
    here = load_device("host")
    if "cuda" not in [a.id for a in here.accelerators]:
        assert any(s.startswith("cuda:") for s in here.skipped)
        assert all("cuda" not in (h.src, h.dst) for h in here.handoff)


def test_modeled_devices_cite_sources_and_are_modeled():
    for n in MODELED:
        d = load_device(n)
        assert d.modeled and all(a.backend == "modeled" for a in d.accelerators)
        text = (DEVICE_DIR / f"{n}.yaml").read_text()
        assert "Sources:" in text or "Source" in text
    assert load_device("cortex-m4f").memory <= 256 * 1024
    assert {a.kind for a in load_device("iphone-15-pro").accelerators} == {"cpu", "gpu", "npu"}
    assert {a.kind for a in load_device("jetson-orin-nano").accelerators} == {"cpu", "gpu"}


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "dev.yaml"
    p.write_text(text)
    return p


BASE = """name: t
memory: 1GiB
accelerators:
  - {id: a, kind: cpu, backend: modeled, peak_gflops: 10, mem_gbps: 1}
"""


def test_typo_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"accelerators\.0\.peak_gflop"):
        load_device(_write(tmp_path, BASE.replace("peak_gflops: 10", "peak_gflops: 10, peak_gflop: 3")))
    with pytest.raises(ConfigError, match=r"'memroy'.*unknown key"):
        load_device(_write(tmp_path, BASE + "memroy: 3GB\n"))


def test_bad_size_and_wrong_type_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"key 'memory'.*size"):
        load_device(_write(tmp_path, BASE.replace("1GiB", "lots")))
    with pytest.raises(ConfigError, match=r"accelerators\.0\.peak_gflops"):
        load_device(_write(tmp_path, BASE.replace("peak_gflops: 10", "peak_gflops: fast")))
    with pytest.raises(ConfigError, match=r"accelerators\.0\.kind"):
        load_device(_write(tmp_path, BASE.replace("kind: cpu", "kind: tpu")))
    with pytest.raises(ConfigError, match=r"memory_cap"):
        load_device(_write(tmp_path, BASE.replace("mem_gbps: 1", "mem_gbps: 1, memory_cap: 2GiB")))
    with pytest.raises(ConfigError, match=r"handoff"):
        load_device(_write(tmp_path, BASE + "handoff:\n  - {src: a, dst: nope, latency_us: 1, gbps: 1}\n"))
    for bad in ("[]", "[-1]", "[1, 1]"):      # cpus: a non-empty list of distinct CPU numbers
        with pytest.raises(ConfigError, match=r"accelerators\.0\.cpus"):
            load_device(_write(tmp_path, BASE.replace("mem_gbps: 1", f"mem_gbps: 1, cpus: {bad}")))
    assert load_device(_write(tmp_path, BASE.replace("mem_gbps: 1", "mem_gbps: 1, cpus: [0, 1]"))
                       ).accelerators[0].cpus == (0, 1)


def test_optional_absent_accelerator_is_skipped(tmp_path):
    text = BASE + "  - {id: g, kind: gpu, backend: torch-mps, optional: true, requires: mps, peak_gflops: 1, mem_gbps: 1}\n"
    import sys
    d = load_device(_write(tmp_path, text))
    if sys.platform != "darwin":
        assert [a.id for a in d.accelerators] == ["a"] and d.skipped and d.skipped[0].startswith("g:")
    assert len(load_device(_write(tmp_path, text), present_only=False).accelerators) == 2


def test_plans_for_a_host_with_a_gpu_stay_in_one_memory():
    """With its GPU present `host` has engines in two memories; the executor runs a program in one (no hand-off
    copies), so the pipeline solves one plan per memory and keeps the faster: the plain ILP mixes them here."""
    import dataclasses
    import port.pipeline as P
    from port.cost.roofline import modeled_profile
    from port.errors import ProgramError
    from port.exec.executor import program_device
    from port.lower.lower import lower
    from port.solver import solve
    full = load_device("host", present_only=False)
    job = dataclasses.replace(P.load_job(model="resnet8", batch=8, budget="60%"), device=full)
    built = P.build_graph(job)
    prof = P.ProfileStep(modeled_profile(built.graph, full), None, "modeled", "roofline model")
    groups = P.memory_groups(full, prof.profile)
    assert groups == {"cpu": ("cpu-c", "cpu-torch"), "cuda": ("cuda",)}
    mem = {a: m for m, accs in groups.items() for a in accs}
    bud = P.resolve_budget(job, built.graph, prof.profile)
    mixed = solve(built.graph, prof.profile, bud.bytes, time_limit_s=20)
    assert {mem[d.accelerator] for d in mixed.ops} == {"cpu", "cuda"}
    with pytest.raises(ProgramError, match="hand-off"):
        program_device(lower(built.graph, mixed))
    solved = P.solve_plan(job, built, prof, bud)
    plan = solved.plan
    assert [n.split(" ")[0] for n in solved.notes] == ["cpu", "cuda", "plan:"]
    assert {mem[d.accelerator] for d in plan.ops} == {"cuda"}     # modeled: the GPU engine is far faster
    assert plan.profile_digest == prof.profile.digest() and plan.predicted_peak_bytes <= bud.bytes
    assert program_device(lower(built.graph, plan)) == "cuda"
