"""The lesson files hold their own mechanism (issue 47): they import public libraries and, of the kit,
only servelab.core.food11, the image contract every box shares (the streaming models also the decoder
they serve, servelab.core.tinylm). The Triton image carries exactly the kit files the model folders
import, nothing else of servelab/."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONTRACT = {"servelab.core.food11"}
# Each lesson file, and what of the kit it may import besides the contract.
LESSONS = {
    **{str(p.relative_to(REPO)): set() for p in sorted((REPO / "models_staging").glob("*/1/*.py"))},
    **{str(p.relative_to(REPO)): {"servelab.core.tinylm"}
       for p in sorted((REPO / "models_streaming").glob("*/1/model.py"))},
    "flask_app/app.py": set(),
    "flask_app/triton_client.py": set(),
    "fastapi_pt/app.py": set(),
    "fastapi_onnx/app.py": set(),
}


def kit_imports(source: str) -> set[str]:
    """The servelab modules a file imports (``from servelab.core import food11`` is servelab.core.food11)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "servelab"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "servelab":
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_the_rule_finds_an_import_of_the_kit():
    assert kit_imports("from servelab.serve import threads\nimport servelab.core.paths\n") == \
        {"servelab.serve.threads", "servelab.core.paths"}
    assert kit_imports("from servelab.core import food11  # images\nimport torch\n") == CONTRACT


@pytest.mark.parametrize("lesson", sorted(LESSONS))
def test_a_lesson_file_imports_only_the_image_contract_of_the_kit(lesson):
    extra = kit_imports((REPO / lesson).read_text()) - CONTRACT - LESSONS[lesson]
    assert not extra, f"{lesson} imports {sorted(extra)}: keep its mechanism in the file (issue 47)"


def _file(module: str) -> str:
    return f"servelab/{'/'.join(module.split('.')[1:])}.py"


def test_the_triton_image_carries_what_the_model_folders_import():
    needed = set()
    for lesson in LESSONS:
        if lesson.startswith("models_"):
            needed |= kit_imports((REPO / lesson).read_text())
    assert needed and all((REPO / _file(m)).is_file() for m in needed), needed
    dockerfile = (REPO / "docker" / "Dockerfile.triton").read_text()
    copied = [line.split()[:-1] for line in re.findall(r"^COPY\s+(.*)$", dockerfile, re.M)]
    sources = {src.rstrip("/") for srcs in copied for src in srcs}
    for module in needed:
        path = Path(_file(module))
        assert any(str(path) == src or src in {str(p) for p in path.parents} for src in sources), \
            f"Dockerfile.triton does not copy {path}"
