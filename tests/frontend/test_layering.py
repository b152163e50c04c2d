"""The package is layered: no module imports a module that imports it back, directly or
through others. Every import counts: at module level, inside functions, and names imported
only for annotations (under `if TYPE_CHECKING:`), since a type a module names is a type it
depends on."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "ptxdsl"


def _module_name(path: Path, pkg: Path) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    mods = {_module_name(p, pkg): p for p in pkg.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                mod = node.module or ""
                full = (f"{base}.{mod}" if mod else base) if node.level else mod
                targets = [full] + [f"{full}.{a.name}" for a in node.names]
            for t in targets:
                if t in mods and t != name:
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_cycles(pkg: Path = PKG) -> list[list[str]]:
    graph = import_graph(pkg)
    # A package's __init__ re-exporting its submodules is not a cycle of the layering: drop
    # the edge from a submodule to its own package's __init__ (Python resolves those first).
    for m, deps in graph.items():
        graph[m] = {d for d in deps if not m.startswith(d + ".")}
    return cycles(graph)


def test_no_import_cycles():
    found = package_cycles()
    assert found == [], f"import cycles: {found}"


def test_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_checker_finds_a_type_only_cycle(tmp_path):
    """A module that names another's type only for annotations still depends on it."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "state.py").write_text("from typing import TYPE_CHECKING\n\n"
                                  "if TYPE_CHECKING:\n    from .step import Step\n")
    (pkg / "step.py").write_text("from .state import State\n")
    assert package_cycles(pkg) == [["pkg.state", "pkg.step"]]
    (pkg / "state.py").write_text("class State: ...\n")
    assert package_cycles(pkg) == []


def test_every_package_ships():
    """pyproject.toml lists every package directory: a package left out imports from a
    checkout but not from an installed wheel."""
    import re

    text = (PKG.parent / "pyproject.toml").read_text()
    block = re.search(r"\[tool\.setuptools\]\s*packages\s*=\s*\[(.*?)\]", text, re.S)
    assert block, "pyproject.toml lists the packages under [tool.setuptools]"
    listed = set(re.findall(r'"([^"]+)"', block.group(1)))
    found = {_module_name(p.parent / "__init__.py", PKG) for p in PKG.rglob("__init__.py")}
    assert found - listed == set(), "add these packages to pyproject.toml"
