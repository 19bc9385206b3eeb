"""servelab's import graph: layers, and no circles (issue 27).

Every import counts: at the top of a module, inside a function, and under
``TYPE_CHECKING``. A circle is a pair (or ring) of modules that each need the
other; cut it by moving the shared piece down a layer, not by hiding the import.

The subpackages stand in layers (CONTRIBUTING.md has the map). A module imports
its own subpackage and the layers below it, never a layer above or a sibling on
its own layer. A new subpackage gets its place in ``LAYERS``.
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


# Lowest first. Each entry: the subpackages (or top-level modules) on that layer.
LAYERS = [
    {"servelab", "servelab.cli"},          # the package's docstring; the CLI dispatcher (imports by name only)
    {"servelab.core"},                     # Food-11 contract, paths, process plumbing
    {"servelab.serve", "servelab.node"},   # what the services share / what runs on the node (stdlib only)
    {"servelab.deploy"},                   # the Kubernetes manifests: build, schema, consistency (no cluster)
    {"servelab.triton_runner"},            # runs inside Triton's stubs
    {"servelab.triton"},                   # the local Triton: install, configs, server, reloads, stubs
    {"servelab.bench"},                    # load generator, statistics, queueing model, plots
    {"servelab.local"},                    # the local stack (`servelab up`)
    {"servelab.course"},                   # lessons, notebooks, site, answer keys, the notebooks' helpers
    {"servelab.measure"},                  # the tour: experiments, checks, report
    {"servelab.gpucheck",                  # the whole GPU run in one command (models, services, Triton, tour)
     "servelab.composecheck"},             # the Compose stacks for real on a local Docker engine (stand-ins)
    {"servelab.__main__"},
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def unit(module: str, package: Path = PACKAGE) -> str:
    """The subpackage a module belongs to (``servelab.triton.server`` -> ``servelab.triton``)."""
    parts = module.split(".")
    if len(parts) > 1 and (package / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module


def layer_violations(graph: dict[str, set[str]], package: Path = PACKAGE) -> list[str]:
    bad = []
    for a, targets in sorted(graph.items()):
        ua = unit(a, package)
        if ua not in RANK:
            bad.append(f"{a}: {ua} has no layer in LAYERS")
            continue
        for b in sorted(targets):
            ub = unit(b, package)
            if ub != ua and RANK.get(ub, len(LAYERS)) >= RANK[ua]:
                bad.append(f"{a} imports {b}: {ub} is not below {ua}")
    return bad


def test_servelab_imports_only_downwards():
    assert layer_violations(import_graph()) == []


def test_an_upward_import_is_found(tmp_path):
    pkg = tmp_path / "servelab"
    for sub in ("core", "bench"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "bench" / "load.py").write_text("from servelab.core import paths\n")
    (pkg / "core" / "paths.py").write_text("def f():\n    from servelab.bench import load\n")
    assert layer_violations(import_graph(pkg), pkg) == [
        "servelab.core.paths imports servelab.bench.load: servelab.bench is not below servelab.core"]


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
