"""servelab's import graph has no circles (issue 27).

Every import counts: at the top of a module, inside a function, and under
``TYPE_CHECKING``. A circle is a pair (or ring) of modules that each need the
other; cut it by moving the shared piece down a layer, not by hiding the import.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "servelab"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(name: str, is_package: bool, node: ast.AST, known: set[str]) -> list[str]:
    """The servelab modules one import statement reaches."""
    if isinstance(node, ast.Import):
        wanted = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            here = name.split(".") if is_package else name.split(".")[:-1]
            here = here[: len(here) - (node.level - 1)]
            base = ".".join(here + ([node.module] if node.module else []))
        # `from a import b` reaches a.b when b is a module, otherwise a itself
        wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    else:
        return []
    out = []
    for w in wanted:
        while w and w not in known and "." in w:
            w = w.rsplit(".", 1)[0]
        if w in known and w != name:
            out.append(w)
    return out


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    files = {module_name(p, package): p for p in package.rglob("*.py")}
    known = set(files)
    return {name: {t for node in ast.walk(ast.parse(path.read_text()))
                   for t in _targets(name, path.name == "__init__.py", node, known)}
            for name, path in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                ring = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    ring.append(m)
                    if m == node:
                        break
                if len(ring) > 1:
                    found.append(sorted(ring))
    return found


def test_servelab_has_no_import_circles():
    graph = import_graph()
    assert len(graph) > 40, "the walk found servelab's modules"
    assert circles(graph) == []


def test_a_planted_circle_is_found(tmp_path):
    pkg = tmp_path / "servelab"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from servelab.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a  # inside a function still counts\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import servelab.a\n")
    graph = import_graph(pkg)
    assert graph["servelab.a"] == {"servelab.sub.b"}
    assert circles(graph) == [["servelab.a", "servelab.sub.b"]]
