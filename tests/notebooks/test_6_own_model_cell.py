"""Notebook 6's "add a model to the repository" cell, run in-process on stand-ins for the server.

The compose check found it writing `kind: KIND_GPU` in the CPU stack, where Triton refuses a GPU group
("specifies invalid or unsupported gpu id 0"). The cell now follows the server's own ONNX model."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from servelab.core import paths

NOTEBOOK = paths.REPO_ROOT / "notebooks" / "6_triton.ipynb"


def own_model_cell() -> str:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "code" and "MY_CONFIG = " in c.source)


def describe_cell() -> str:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    source = next(c.source for c in nb.cells if c.cell_type == "code" and "def describe(config)" in c.source)
    return source[:source.index("\n\n\nfor model in")]  # the function, not its use on a live server


class FakeClient:
    def __init__(self, kind: str):
        self.kind = kind

    def get_model_config(self, name):
        group = {"count": 1, "kind": self.kind, **({"gpus": [0]} if self.kind == "KIND_GPU" else {})}
        return {"name": name, "instance_group": [group]}


@pytest.mark.parametrize("kind", ["KIND_CPU", "KIND_GPU"])
def test_the_own_model_runs_where_the_servers_onnx_model_runs(tmp_path, kind):
    repo = tmp_path / "models"
    (repo / "food_classifier_onnx" / "1").mkdir(parents=True)
    (repo / "food_classifier_onnx" / "1" / "model.onnx").write_bytes(b"stand-in")
    scope = {"MODEL_REPOSITORY": repo, "client": FakeClient(kind), "Path": Path, "shutil": shutil,
             "config_path": lambda model: repo / model / "config.pbtxt"}
    exec(describe_cell(), scope)
    exec(own_model_cell(), scope)
    written = (repo / "my_food_classifier_onnx" / "config.pbtxt").read_text()
    assert f"kind: {kind}" in written
    assert ("gpus: [ 0 ]" in written) == (kind == "KIND_GPU")
    assert (repo / "my_food_classifier_onnx" / "1" / "model.onnx").read_bytes() == b"stand-in"
