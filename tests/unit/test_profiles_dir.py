"""profiles/: the committed profiles of the modeled devices are current (regenerated here and compared byte for
byte), the location rule finds them, and measured profiles stay out of git."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from port import config as C
from port.cli.profile import committed_set, regenerate_modeled

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "profiles"
FIX = "regenerate them with `port profile --all-modeled` (make profiles) and commit profiles/"


def stale(fresh_dir: Path, committed_dir: Path, paths: list[Path]) -> list[str]:
    """The committed files that differ from (or lack) the fresh ones written under ``fresh_dir``."""
    bad = []
    for p in paths:
        rel = p.relative_to(fresh_dir)
        old = committed_dir / rel
        if not old.is_file():
            bad.append(f"{rel}: missing")
        elif old.read_bytes() != p.read_bytes():
            bad.append(f"{rel}: stale")
    return bad


def _quiet(msg: str) -> None:
    pass


def test_a_small_part_of_the_set_is_current(tmp_path):
    pairs = [pr for pr in committed_set() if pr[0].stem in ("mlp", "digits_m4")]
    assert len(pairs) == 5          # mlp on the four modeled devices, digits_m4 on cortex-m4f
    written = regenerate_modeled(tmp_path, echo=_quiet, pairs=pairs)
    assert stale(tmp_path, COMMITTED, written) == [], FIX


@pytest.mark.slow
def test_every_committed_profile_is_current_and_none_is_extra(tmp_path):
    written = regenerate_modeled(tmp_path, echo=_quiet)
    assert stale(tmp_path, COMMITTED, written) == [], FIX
    want = {p.relative_to(tmp_path) for p in written}
    have = {p.relative_to(COMMITTED) for p in COMMITTED.glob("*/*.json")}
    assert have - want == set(), f"profiles/ holds files the set does not make: {sorted(have - want)}"


def test_the_comparison_catches_a_stale_and_a_missing_file(tmp_path):
    """The check above can fail: a copy of the committed files with one cost changed and one file removed."""
    pairs = [pr for pr in committed_set() if pr[0].stem == "mlp"][:2]
    fresh = tmp_path / "fresh"
    written = regenerate_modeled(fresh, echo=_quiet, pairs=pairs)
    old = tmp_path / "old"
    for p in written:
        (old / p.relative_to(fresh)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, old / p.relative_to(fresh))
    assert stale(fresh, old, written) == []
    first = old / written[0].relative_to(fresh)
    first.write_text(first.read_text().replace('"latency_ms": ', '"latency_ms": 1', 1))
    (old / written[1].relative_to(fresh)).unlink()
    assert [s.split(": ")[1] for s in stale(fresh, old, written)] == ["stale", "missing"]


def test_the_set_covers_every_modeled_device_and_git_keeps_only_them():
    modeled = {n for n in C.device_names() if C.load_device(n, present_only=False).modeled}
    assert {"cortex-m4f", "iphone-15-pro", "jetson-orin-nano", "raspberry-pi-4b"} <= modeled
    assert {d for _, d in committed_set()} == modeled
    assert {p.name for p in COMMITTED.iterdir() if p.is_dir()} >= modeled
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")

    def ignored(rel: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", rel], cwd=ROOT).returncode == 0
    for d in sorted(modeled):
        assert not ignored(f"profiles/{d}/resnet8.json"), f".gitignore hides profiles/{d}/: add !/profiles/{d}/"
    assert ignored("profiles/host/resnet8.json"), "measured host profiles must stay out of git"
    assert not ignored("profiles/README.md")


def test_the_location_rule_finds_the_committed_profile(monkeypatch):
    """From the checkout, a modeled device's job reads the committed file instead of modelling anew."""
    from port import pipeline as P
    monkeypatch.chdir(ROOT)
    job = P.load_job(C.CONFIG_DIR / "mlp.yaml", device="jetson-orin-nano")
    step = P.get_profile(job, P.build_graph(job).graph, echo=_quiet)
    assert step.path == Path("profiles") / "jetson-orin-nano" / "mlp.json" and step.source == "file"
