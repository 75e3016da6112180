"""The import graph of port/ has no cycle: every ``import`` and ``from ... import`` in a module counts, also the
ones inside functions (a lazy import is still a dependency: port.pipeline imported port.solver, whose solve()
imported port.pipeline's budget rule). Read from the source with ast; cycles found with networkx.

One cycle is left, named here in full so that it cannot grow unseen: the op records' registry (port.ops and
its family modules, which register into it, and the readers of the records the families call back into:
port.ir.capture, port.plan.variants, port.exec.registry and its backends). Any other cycle fails this test,
and so does that one gaining or losing a module (then update KNOWN_CYCLE, or delete it once it is gone).
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]

KNOWN_CYCLE = frozenset({
    "port.ops", "port.ops.activation", "port.ops.attention", "port.ops.conv", "port.ops.elementwise",
    "port.ops.embedding", "port.ops.fallback", "port.ops.linear", "port.ops.loss", "port.ops.mask", "port.ops.norm",
    "port.ops.optimizer", "port.ops.pooling", "port.ops.random", "port.ops.roll_pad", "port.ops.shape",
    "port.ir.capture",
    "port.plan.variants", "port.exec.registry", "port.exec.rtcall", "port.exec.backends.c",
    "port.exec.backends.torch_backend",
})


def _modules(root: Path, package: str) -> dict[str, Path]:
    out = {}
    for f in sorted((root / package).rglob("*.py")):
        parts = list(f.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def import_graph(root: Path, package: str = "port") -> nx.DiGraph:
    """module -> the modules of ``package`` it imports (``from a.b import c``: a.b.c when that is a module, else
    a.b; relative imports resolved). Importing a submodule is not counted as importing its parent package."""
    mods = _modules(root, package)
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for m, f in mods.items():
        pkg = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    g.add_edge(m, t)
    return g


def cycles(g: nx.DiGraph) -> list[frozenset[str]]:
    return [frozenset(c) for c in nx.strongly_connected_components(g) if len(c) > 1]


def test_port_has_no_import_cycle_but_the_known_one():
    found = cycles(import_graph(ROOT))
    others = [c for c in found if c != KNOWN_CYCLE]
    g = import_graph(ROOT)
    shown = []
    for c in others:
        sub = g.subgraph(c)
        shown.append(" -> ".join(nx.find_cycle(sub)[i][0] for i in range(len(nx.find_cycle(sub)))))
    assert not others, "import cycles in port/ (e.g. " + "; ".join(shown) + ")"
    assert KNOWN_CYCLE in found or not any(c & KNOWN_CYCLE for c in found), \
        "the op registry's cycle changed: " + ", ".join(sorted(next(c for c in found if c & KNOWN_CYCLE)))


def test_pipeline_and_solver_import_each_other_no_more():
    g = import_graph(ROOT)
    for a in [m for m in g if m.startswith("port.solver")]:
        assert not any(b.startswith("port.pipeline") for b in g.successors(a)), a
    assert not nx.has_path(g, "port.solver", "port.pipeline")


def test_the_checker_finds_a_lazy_cycle(tmp_path):
    """The checker itself: a cycle through a function-local relative import is found, a parent package's
    import of its submodule alone is not a cycle."""
    pkg = tmp_path / "port"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from port import a\n")
    (pkg / "a.py").write_text("import port.sub.b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n    return a\n")
    g = import_graph(tmp_path)
    assert cycles(g) == [frozenset({"port.a", "port.sub.b"})]
    (pkg / "sub" / "b.py").write_text("def f():\n    return 1\n")
    assert cycles(import_graph(tmp_path)) == []


def test_pipeline_steps_are_short_functions():
    """port/pipeline/ is one module per step, each function at most 60 lines (run_training was 281)."""
    long = []
    for f in sorted((ROOT / "port" / "pipeline").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{f.name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long
