"""No import circles among the project's packages (issue 31).

Every ``.py`` under the five packages is parsed with ``ast``; each import statement anywhere in a
module (function-local lazy imports included, relative ones resolved) is an edge from that module
to the module it imports. ``from pkg import name`` points at ``pkg.name`` when that is a submodule,
else at ``pkg`` itself (whose ``__init__`` then runs). A strongly connected component of more than
one module, or a module importing itself, is a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("mnemos", "workers", "api", "bench", "integrations")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _project_modules() -> dict[str, Path]:
    return {_module_name(path): path
            for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """The project modules that module ``name`` (at ``path``) imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        yield from (target for target in targets if target in known)


def _graph() -> dict[str, set[str]]:
    modules = _project_modules()
    known = set(modules)
    return {name: set(_imports(name, path, known)) for name, path in modules.items()}


def _circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module, or a self-import."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_cycle_finder_finds_a_constructed_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}}
    assert _circles(graph) == [["a", "b", "c"], ["e"]]


def test_the_graph_resolves_submodules_relative_and_lazy_imports() -> None:
    graph = _graph()
    assert "workers.launch.supervisor" in graph["workers.cli"]  # imported inside a command function
    assert graph["mnemos"]  # the package's __init__ re-exports from its submodules


def test_no_import_circles() -> None:
    circles = _circles(_graph())
    assert circles == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)
