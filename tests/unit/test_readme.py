"""Documentation is code: every fenced code block of README.md and of docs/*.md runs here, so an example that
breaks fails the suite (DESIGN.md, "Lessons of the first version": the old README's `port.solve(...)` never
worked).

* ```python blocks: executed in page order, one namespace per page, in a scratch directory;
* ```bash blocks: run with bash (-e, -o pipefail), each in its own scratch directory holding `configs`,
  `examples` and `bench` links to the repository's and a `.venv/bin/port` that runs this interpreter's PORT. The
  block with `make demo` / `make test` is NOT run as written (`make test` would recurse into this suite): instead
  `make -n demo test` checks that the targets exist, and `port demo` (what `make demo` runs) runs once;
* ```yaml blocks: parsed and loaded through the config loader (experiment configs, or device descriptions
  when they list accelerators);
* ``` blocks without a language (diagrams) are skipped, and only if they contain no command; ```text blocks
  only include a file (pymdownx.snippets: `--8<-- "path:first:last"`), checked below.

A block that trains (TRAINS_RE) is marked slow; a page's Python blocks share a namespace, so they run as one
test, slow when any of them trains. `mkdocs build --strict` runs here too (test_site_builds_strict).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from buildlock import build_lock

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
LANGS = ("python", "bash", "yaml", "text", "")
# what trains (a Trainer step, a training command, a federation): the blocks marked slow
TRAINS_RE = re.compile(r"\.step\(|\bTrainer\(|\bport (train|demo|federate)\b|port-rt train|finetune_gpt|^make demo",
                       re.M)
SNIPPET_RE = re.compile(r'^--8<-- "([^"]+?)(?::(\d+):(\d+)|:([a-z][-_0-9a-z]*))?"$', re.M)
# a line that looks like a command: what a diagram block must not contain
COMMAND_RE = re.compile(r"^\s*(\$ |port |\.venv/|make |python|pip |bash |cd |mkdir |cat |import |from \w+ import )",
                        re.M)


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int          # 1-based line of the opening fence
    page: str = "README.md"    # relative to the repository

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.lang or 'no language'})"

    @property
    def trains(self) -> bool:
        return bool(TRAINS_RE.search(self.text))


def readme_blocks(text: str | None = None, page: Path = README) -> list[Block]:
    """The fenced code blocks of a Markdown page (README.md unless said), in order."""
    text = page.read_text() if text is None else text
    name = str(page.relative_to(ROOT))
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, lang, body = i, m.group(2), []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        if i >= len(lines):
            raise AssertionError(f"{name}:{start + 1}: code block is never closed")
        out.append(Block(lang, "\n".join(body) + "\n", start + 1, name))
        i += 1
    return out


def _slow_if(trains: bool, value, id_: str):
    return pytest.param(value, id=id_, marks=[pytest.mark.slow] if trains else [])


BLOCKS = [b for p in PAGES for b in readme_blocks(page=p)]
# a bash block repeated word for word on another page (the set-up commands: README and docs/index.md) runs once
_FIRST: dict[str, Block] = {}
for _b in BLOCKS:
    if _b.lang == "bash":
        _FIRST.setdefault(_b.text, _b)
BASH = [_slow_if(b.trains, b, str(b)) for b in _FIRST.values()]
PYTHON_PAGES = {}
for _b in BLOCKS:
    if _b.lang == "python":
        PYTHON_PAGES.setdefault(_b.page, []).append(_b)


def test_extractor_finds_every_block():
    assert len(DOCS) >= 10, "docs/ has lost its pages"
    assert len(BLOCKS) >= 20
    assert {"python", "bash", "yaml"} <= {b.lang for b in BLOCKS}
    assert {"python", "bash"} <= {b.lang for b in BLOCKS if b.page == "README.md"}
    # the extractor itself: fences with and without a language, in order
    demo = "x\n```bash\necho 1\n```\ntext\n```\nA --> B\n```\n"
    assert [(b.lang, b.text, b.line) for b in readme_blocks(demo)] == [("bash", "echo 1\n", 2), ("", "A --> B\n", 6)]


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_block_language_is_handled(block):
    assert block.lang in LANGS, f"{block}: no runner for language {block.lang!r}; add one to this test"
    if block.lang == "":
        assert not COMMAND_RE.search(block.text), f"{block}: a block without a language holds a command; tag it"


def run_python_blocks(blocks: list[Block], ns: dict) -> None:
    for b in blocks:
        code = compile("\n" * b.line + b.text, str(ROOT / b.page), "exec")   # tracebacks point at the page's lines
        try:
            exec(code, ns)
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"{b} failed: {type(e).__name__}: {e}") from e


@pytest.mark.parametrize("page", [_slow_if(any(b.trains for b in bs), p, p) for p, bs in PYTHON_PAGES.items()])
def test_python_blocks_run_in_order(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_python_blocks(PYTHON_PAGES[page], {"__name__": "__readme__"})


def test_training_blocks_are_marked_slow():
    """The marks follow TRAINS_RE: the README's example (a Trainer step) is slow, a graph-only block is not."""
    assert Block("python", "trainer.step(x, y)\n", 1).trains
    assert Block("bash", "port train configs/default.yaml --steps 5\n", 1).trains
    assert not Block("bash", "port solve configs/default.yaml\n", 1).trains
    marked = {p.id for p in BASH if p.marks}
    assert any("port demo" in b.text or "make demo" in b.text for b in BLOCKS if str(b) in marked)


def test_a_broken_block_fails(tmp_path):
    """The runners fail on a broken block (and say which README line it starts at)."""
    with pytest.raises(AssertionError, match=r"README.md:7 \(python\) failed: NameError"):
        run_python_blocks([Block("python", "x = 1\nprint(undefined_name)\n", 7)], {})
    with pytest.raises(AssertionError, match=r"README.md:9 \(bash\).*exited 1"):
        run_bash_block(Block("bash", "true\nfalse\necho not reached\n", 9), tmp_path)


def _scratch(tmp: Path) -> dict:
    (tmp / "configs").symlink_to(ROOT / "configs")
    venv_bin = tmp / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    port = venv_bin / "port"
    port.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m port.cli "$@"\n')
    port.chmod(0o755)
    (tmp / "examples").symlink_to(ROOT / "examples")
    (tmp / "bench").symlink_to(ROOT / "bench")
    py = venv_bin / "python"
    py.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    return dict(os.environ, PATH=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
                PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", COLUMNS="200")


def _run(cmd: list[str], cwd: Path, env: dict, block: Block, timeout: int = 900) -> None:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (f"{block}: `{' '.join(cmd)[:200]}` exited {r.returncode}\n--- stdout\n"
                               f"{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-4000:]}")


@pytest.mark.parametrize("block", BASH, ids=str)
def test_bash_block_runs(block, tmp_path):
    run_bash_block(block, tmp_path)


def run_bash_block(block: Block, tmp_path: Path) -> None:
    env = _scratch(tmp_path)
    cmds = [ln.split("#", 1)[0].strip() for ln in block.text.splitlines()]
    make = [c for c in cmds if c.startswith("make ")]
    if make:
        # not run as written: `make test` would run this very suite again. Check the targets exist (dry run),
        # then run what `make demo` runs, once.
        assert len(make) == len([c for c in cmds if c]), f"{block}: mixes make with other commands"
        targets = [t for c in make for t in c.split()[1:]]
        _run(["make", "-n", "-C", str(ROOT), *targets], tmp_path, env, block)
        _run([str(tmp_path / ".venv" / "bin" / "port"), "demo", "--no-progress"], tmp_path, env, block)
        assert (tmp_path / "runs" / "digits" / "report.html").exists()
        assert (tmp_path / "profiles" / "host" / "digits.json").exists()
        return
    if "port-rt " in block.text:   # the runtime binary: built by `make port-rt`, on PATH as `port-rt`
        with build_lock():      # xdist workers share kernels/build
            _run(["make", "-s", "-C", str(ROOT), "port-rt"], tmp_path, env, block)
        (tmp_path / ".venv" / "bin" / "port-rt").symlink_to(ROOT / "kernels" / "build" / "port-rt")
    script = tmp_path / "block.sh"
    script.write_text(block.text)
    _run(["bash", "-e", "-o", "pipefail", str(script)], tmp_path, env, block)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "yaml"], ids=str)
def test_yaml_block_loads(block, tmp_path):
    import yaml
    from port import config as C
    p = tmp_path / "block.yaml"
    p.write_text(block.text)
    data = yaml.safe_load(block.text)
    assert isinstance(data, dict), f"{block}: not a mapping"
    if "accelerators" in data:
        C.load_device(p)
    else:
        cfg = C.load_experiment(p)
        C.resolve_device(cfg, ROOT / "configs" / "x.yaml")


# a path in the repository a page or an example names (a file that must exist)
REPO_PATH = r"(?:port|bench|kernels|solver|configs|tests|examples|docs)/[\w/.-]+\.(?:py|h|c|md|yaml)"
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*") if p.suffix in (".py", ".yaml"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_has_no_stale_references(page):
    text = page.read_text()
    for stale in ("port/graph.py", "costmodel.py", "cli_", "port/types.py", "budget_bytes=",
                  "profiles/<device>/<model>.json", "runs/<name>/profile.json` or"):
        assert stale not in text, stale
    for path in re.findall(rf"`({REPO_PATH})`", text):
        assert (ROOT / path).exists(), f"{page.name} names {path}, which does not exist"
    for link in re.findall(r"\]\(([^)#:]+?)(?:#[^)]*)?\)", text):     # relative Markdown links and images
        assert (page.parent / link).exists(), f"{page.name} links {link}, which does not exist"


@pytest.mark.parametrize("src", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_names_files_that_exist(src):
    """A path an example's comments or docstrings name exists (examples/llama_lora/llama_lora.yaml sent readers
    to a README.md the example never had)."""
    for path in re.findall(rf"(?<![\w/.-])({REPO_PATH})(?![\w/-])", src.read_text()):
        assert (ROOT / path).exists(), f"{src.relative_to(ROOT)} names {path}, which does not exist"


def test_readme_is_short():
    """The README says what PORT is, how to set it up, an example, the commands, the results and where to read
    on (issue 55); the rest lives in docs/."""
    assert len(README.read_text().splitlines()) <= 200


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "text"], ids=str)
def test_text_block_only_includes(block):
    """A ```text block holds one include (`--8<-- "path:first:last"`) of a file that exists, with a line range
    that still holds what the page says it does."""
    m = SNIPPET_RE.fullmatch(block.text.strip())
    assert m, f"{block}: a text block holds one `--8<-- \"path:first:last\"` include and nothing else"
    src = ROOT / m.group(1)
    assert src.exists(), f"{block}: includes {m.group(1)}, which does not exist"
    if m.group(2):
        lines = src.read_text().splitlines()[int(m.group(2)) - 1:int(m.group(3))]
        if src.name == "port_rt.h":   # docs/runtime.md: the bundle layout comment, whole
            assert "Bundle layout" in lines[0] and "port_rt_call record" in lines[-1], (
                f"{block}: kernels/include/port_rt.h's bundle layout comment moved; fix the line range")


def test_snippet_includes_exist():
    """Every page's `--8<--` include names a file (and section) that exists: the site would not build."""
    for page in DOCS:
        for m in SNIPPET_RE.finditer(page.read_text()):
            src = ROOT / m.group(1)
            assert src.exists(), f"{page.name} includes {m.group(1)}, which does not exist"
            if m.group(4):
                assert f"--8<-- [start:{m.group(4)}]" in src.read_text(), f"{page.name}: no section {m.group(4)}"


def test_site_builds_strict(tmp_path):
    """`mkdocs build --strict` (the docs extra): a broken link, a missing image or snippet, or an API object that
    no longer exists fails it."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert (tmp_path / "site" / "api" / "index.html").exists()
