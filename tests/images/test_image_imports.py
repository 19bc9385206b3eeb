"""Every file that runs in a Compose image, on the node or in Chameleon's Jupyter imports
only what that place has: the walk of the import graph (tests/images/imagekit.py) from
each place's entry files, the kit's own modules followed transitively, every third-party
import checked against the distributions the place's requirements install (with their
dependencies) and what its base provides; and the files compile with the place's Python."""

from __future__ import annotations

import ast
import subprocess

import pytest

from servelab.course import lessons

from . import imagekit as k

# Where the notebooks' host and Chameleon cells run, and with which Python: the node is
# CC-Ubuntu24.04-CUDA (notebook 2), whose system Python is Ubuntu 24.04's 3.12; Chameleon's
# Jupyter Python is not stated anywhere the kit reads: this machine's 3.11 stands in.
NODE_PYTHON = "3.12"
CHAMELEON_PYTHON = "3.11"

# An import the walk reaches that the place lacks on purpose, with the guard that keeps it
# from running there: (place, file, module) -> (the guarded call, the guard it must sit under).
GUARDED = {
    ("jupyter-sdk", "servelab/bench/batchcost.py", "onnxruntime"):
        ("batchcost.raw_onnx", "batchcost.onnxruntime_available"),
}


def node_roots() -> list[str]:
    """`python3 -m servelab...` in the node's shell blocks (test_host_shell reads them)."""
    from tests.notebooks.test_host_shell import node_commands

    roots = set()
    for les in lessons.LESSONS:
        for argv in node_commands(les.slug):
            if argv[:2] in (["python3", "-m"], ["python", "-m"]) and argv[2].startswith("servelab"):
                roots.add("-m " + argv[2])
    return sorted(roots)


def _cells(slugs, label) -> list[tuple[str, str]]:
    return [(f"{s}[{i}]", c) for s in slugs for i, c in enumerate(k.notebook_cells(s, label))]


def place(name: str) -> dict:
    """roots, cells, python, distributions and base-provided modules of one place."""
    if name == "node":
        return {"roots": node_roots(), "cells": [], "python": NODE_PYTHON, "dists": set(),
                "provides": k.PLACE_PROVIDES["node"]}
    if name == "chameleon":
        slugs = [les.slug for les in lessons.LESSONS if les.runs == "chameleon"]
        return {"roots": [], "cells": _cells(slugs, lessons.RUNS_CHAMELEON_JUPYTER), "python": CHAMELEON_PYTHON,
                "dists": set(), "provides": k.PLACE_PROVIDES["chameleon"]}
    im = k.images()[name]
    roots = [r for r in im.runs if not r.startswith("notebook:")]
    cells = _cells([r.split(":", 1)[1] for r in im.runs if r.startswith("notebook:")], lessons.RUNS_JUPYTER_CONTAINER)
    return {"roots": roots, "cells": cells, "python": im.python,
            "dists": k.closure(k.env_requirements(im), im.python), "provides": im.provides()}


PLACES = [*k.images(), "node", "chameleon"]


def unresolved(name: str) -> tuple[set[str], list[k.Use]]:
    p = place(name)
    files, external = k.walk(p["roots"], p["cells"])
    bad = [u for u in k.unresolved(external, p["python"], p["dists"], p["provides"]) if not u.guarded]
    return files, bad


def _guard_holds(cells: list[tuple[str, str]], call: str, guard: str) -> bool:
    """Every call of ``call`` in the cells sits under an `if` whose test calls ``guard``."""
    found = False
    for _, src in cells:
        tree = ast.parse(k._source_of_cells([src]))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == call]
        guarded = {id(c) for n in ast.walk(tree) if isinstance(n, ast.If) and guard in ast.unparse(n.test)
                   for b in n.body for c in ast.walk(b) if isinstance(c, ast.Call)}
        for c in calls:
            found = True
            if id(c) not in guarded:
                return False
    return found


@pytest.mark.parametrize("name", PLACES)
def test_every_import_resolves_where_the_file_runs(name):
    files, bad = unresolved(name)
    assert files or name == "chameleon", f"{name}: the walk reached none of the kit's files"
    p = place(name)
    left = []
    for u in bad:
        key = (name, u.source, u.module.split(".")[0])
        if key in GUARDED and _guard_holds(p["cells"], *GUARDED[key]):
            continue
        left.append(f"{u.source}:{u.line} imports {u.module}" + (" (in a function)" if u.lazy else ""))
    assert not left, f"{name} ({p['python']}) lacks what these need:\n" + "\n".join(left)


def test_the_walk_finds_a_missing_package():
    """Controls: a cell importing what the Jupyter image lacks is caught; so is notebook
    6's batch-cost call without its guard (the defect of issue 28), and a node command
    whose module needs numpy."""
    std = k.images()["jupyter"]
    dists = k.closure(k.env_requirements(std), std.python)
    _, ext = k.walk([], [("cell", "import onnxruntime\nimport torch\nimport numpy\nimport requests")])
    assert {u.module for u in k.unresolved(ext, std.python, dists, std.provides())} == {"onnxruntime", "torch"}
    unguarded = [("cell", "from servelab.bench import batchcost\nbatchcost.raw_onnx('m.onnx')")]
    guarded = [("cell", "from servelab.bench import batchcost\n"
                        "if batchcost.onnxruntime_available():\n    batchcost.raw_onnx('m.onnx')")]
    sdk = k.images()["jupyter-sdk"]
    _, ext = k.walk([], unguarded)
    bad = k.unresolved(ext, sdk.python, k.closure(k.env_requirements(sdk), sdk.python), sdk.provides())
    assert [(u.source, u.module) for u in bad] == [("servelab/bench/batchcost.py", "onnxruntime")]
    assert not _guard_holds(unguarded, *GUARDED[("jupyter-sdk", "servelab/bench/batchcost.py", "onnxruntime")])
    assert _guard_holds(guarded, *GUARDED[("jupyter-sdk", "servelab/bench/batchcost.py", "onnxruntime")])
    _, ext = k.walk(["-m servelab.serve.models"])
    assert "numpy" in {u.module.split(".")[0] for u in k.unresolved(ext, NODE_PYTHON, set(), {})}


def test_a_function_nobody_calls_does_not_count():
    """The walk follows an import inside a function only where running code names the
    function: fastapi_pt never calls serving.onnx_providers (onnxruntime), fastapi_onnx does."""
    for name, expect in (("fastapi_pt", False), ("fastapi_onnx", True)):
        _, ext = k.walk(k.images()[name].runs)
        assert any(u.module == "onnxruntime" for u in ext) is expect, name


def test_requirements_are_read_from_the_dockerfile(tmp_path, monkeypatch):
    """The package list follows the Dockerfile: the SDK base skips the guarded tritonclient
    install; an added requirement line shows up."""
    jup, sdk = k.images()["jupyter"], k.images()["jupyter-sdk"]
    assert "tritonclient[http,grpc]==2.50.0" in jup.requirements()
    assert not any(r.startswith("tritonclient") for r in sdk.requirements())
    assert k.env_requirements(sdk)[-1] == k.SDK_STAND_IN[-1]
    req = tmp_path / "req.txt"
    req.write_text("numpy==1.26.4  # pinned\nscipy==1.15.0 ; python_version < '3.11'\n")
    df = tmp_path / "Dockerfile"
    df.write_text(f"FROM {k.PY311_SLIM}\nCOPY {req} /tmp/r.txt\nRUN pip install -r /tmp/r.txt \\\n"
                  "    && pip install \"extra-pkg==1.0\"\n")
    assert k.Image("t", df, k._from(df), []).requirements() == [
        "numpy==1.26.4", "scipy==1.15.0 ; python_version < '3.11'", "extra-pkg==1.0"]


@pytest.mark.parametrize("name,python", [("triton", "3.10"), ("jupyter-sdk", "3.10"), ("node", NODE_PYTHON)])
def test_files_compile_with_the_places_python(name, python):
    """Syntax the place's Python lacks (a 3.11 feature in a 3.10 image) fails here."""
    exe = k.find_python(python)
    if exe is None:
        pytest.skip(f"no Python {python} on this machine ({name} runs it)")
    files, _ = unresolved(name)
    code = ("import sys\nfor f in sys.argv[1:]:\n    compile(open(f).read(), f, 'exec')\n")
    out = subprocess.run([exe, "-c", code, *sorted(str(k.REPO / f) for f in files)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
