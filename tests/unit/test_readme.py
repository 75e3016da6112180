"""Documentation is code: every fenced code block of README.md runs here, so a README example that breaks
fails the suite (DESIGN.md, "Lessons of the first version": the old README's `port.solve(...)` never worked).

* ```python blocks: executed in README order, in one namespace, in a scratch directory;
* ```bash blocks: run with bash (-e, -o pipefail), each in its own scratch directory holding a `configs` link
  to the repository's configs and a `.venv/bin/port` that runs this interpreter's PORT. The block with
  `make demo` / `make test` is NOT run as written (`make test` would recurse into this suite): instead
  `make -n demo test` checks that the targets exist, and `port demo` (what `make demo` runs) runs once;
* ```yaml blocks: parsed and loaded through the config loader (experiment configs, or device descriptions
  when they list accelerators);
* ``` blocks without a language (diagrams) are skipped, and only if they contain no command.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LANGS = ("python", "bash", "yaml", "")
# a line that looks like a command: what a diagram block must not contain
COMMAND_RE = re.compile(r"^\s*(\$ |port |\.venv/|make |python|pip |bash |cd |mkdir |cat |import |from \w+ import )",
                        re.M)


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int          # 1-based line of the opening fence

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.lang or 'no language'})"


def readme_blocks(text: str | None = None) -> list[Block]:
    text = README.read_text() if text is None else text
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
            raise AssertionError(f"README.md:{start + 1}: code block is never closed")
        out.append(Block(lang, "\n".join(body) + "\n", start + 1))
        i += 1
    return out


BLOCKS = readme_blocks()
BASH = [b for b in BLOCKS if b.lang == "bash"]


def test_extractor_finds_every_block():
    assert len(BLOCKS) >= 8
    assert {"python", "bash", "yaml"} <= {b.lang for b in BLOCKS}
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
        code = compile("\n" * b.line + b.text, str(README), "exec")   # tracebacks point at README lines
        try:
            exec(code, ns)
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"{b} failed: {type(e).__name__}: {e}") from e


def test_python_blocks_run_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    py = [b for b in BLOCKS if b.lang == "python"]
    assert len(py) >= 4
    run_python_blocks(py, {"__name__": "__readme__"})


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


def test_readme_has_no_stale_references():
    text = README.read_text()
    for stale in ("port/graph.py", "costmodel.py", "cli_", "port/types.py", "budget_bytes=",
                  "profiles/<device>/<model>.json", "runs/<name>/profile.json` or"):
        assert stale not in text, stale
    for path in re.findall(r"`(port/[\w/]+\.py|port/\w+/)`", text):
        assert (ROOT / path).exists(), f"README names {path}, which does not exist"
