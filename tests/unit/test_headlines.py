"""bench/headlines.py: the README's results table is generated from bench/RESULTS.md and kept current; the
coverage chart (bench/coverage.py --figure) reads the same file."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)           # (bench/coverage.py drops bench/ from sys.path: appended after)
    if str(ROOT / "bench") not in sys.path:
        sys.path.append(str(ROOT / "bench"))
    return mod


_bench("coverage")                 # puts bench/ on sys.path (appended: bench/profile.py must not shadow the stdlib)
import headlines as H  # noqa: E402  (the module bench/coverage.py imports too: one HeadlineError)

RESULTS = """# PORT benchmark results

Intro.

## Graph

`python bench/graph.py` (batch 8).

| model | ops |
|---|---|
| mlp | 20 |

HEADLINE graph: worst |ratio-1| over zoo = 0.0005 (target <= 0.01)

## Coverage

`python bench/coverage.py` (2026-11-28).

| model | family | input (batch) | captured | ops C / torch | equal | x |
|---|---|---|---|---|---|---|
| tv.resnet18 | torchvision | 3x64x64 (8) | yes | 250 / 0 | yes | 1 |
| hf.llama_lm | huggingface | 16 tokens (4) | yes | 180 / 156 | NO | 1 |

Coverage headline: 1/2 trained equal to eager (50%, target >= 95%).
"""


def test_readme_table_is_current():
    """The README's table is what bench/RESULTS.md gives: re-run `python bench/headlines.py --write-readme`
    after a benchmark rewrote its section."""
    readme = H.README.read_text()
    assert H.with_table(readme, H.table(H.RESULTS.read_text())) == readme, (
        "README.md's results table is stale: run `python bench/headlines.py --write-readme`")
    assert H.main(["--check"]) == 0


def test_one_row_per_section_with_its_headline():
    tab = H.table(RESULTS).splitlines()
    assert tab[2] == ("| Graph | `bench/graph.py` | worst \\|ratio-1\\| over zoo = 0.0005 (target <= 0.01) |")
    assert tab[3] == ("| Coverage | `bench/coverage.py` | 1/2 trained equal to eager (50%, target >= 95%). |")
    assert len(tab) == 4
    # every section of the real file has one, and the real file has them all
    real = H.table(H.RESULTS.read_text()).splitlines()
    assert len(real) - 2 == len(H.sections(H.RESULTS.read_text())) >= 15


def test_the_predicted_vs_measured_headline():
    """bench/coverage.py --predict's section ends with "within 15%: N/M" (issue 52), parsed as its headline."""
    text = RESULTS + """
## Coverage: predicted vs measured

`python bench/coverage.py --predict all` (2026-11-29).

| model | predicted step ms | measured step ms (median of 15) | measured vs predicted |
|---|---|---|---|
| hand.se_cat_net | 0.40 | 0.43 | +7.5% |

Predicted-vs-measured headline: within 15%: 45/46 models (target: all), 46 ran.
"""
    assert H.table(text).splitlines()[-1] == ("| Coverage: predicted vs measured | `bench/coverage.py` | within 15%: "
                                              "45/46 models (target: all), 46 ran. |")


def test_a_section_without_headline_is_refused():
    with pytest.raises(H.HeadlineError, match="'## Graph' ends without a headline"):
        H.table("## Graph\n\n| a |\n|---|\n| 1 |\n")


def test_stale_readme_fails_the_check(tmp_path, monkeypatch, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{H.BEGIN}\n| old | table |\n{H.END}\n\nrest\n")
    monkeypatch.setattr(H, "README", readme)
    assert H.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert H.main(["--write-readme"]) == 0
    text = readme.read_text()
    assert "| old | table |" not in text and text.endswith(f"{H.END}\n\nrest\n")
    assert H.main(["--check"]) == 0
    readme.write_text("# no markers\n")
    assert H.main(["--write-readme"]) == 2
    assert "markers" in capsys.readouterr().err


def test_coverage_rows_and_figure(tmp_path, monkeypatch):
    C = _bench("coverage")
    rows = C.coverage_rows(RESULTS)
    assert rows == [{"name": "tv.resnet18", "family": "torchvision", "ops_c": 250, "ops_torch": 0, "equal": True},
                    {"name": "hf.llama_lm", "family": "huggingface", "ops_c": 180, "ops_torch": 156,
                     "equal": False}]
    with pytest.raises(H.HeadlineError, match="no '## Coverage' section"):
        C.coverage_rows("## Graph\n\nx\n")
    out = tmp_path / "img" / "coverage.png"
    C.coverage_figure(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
