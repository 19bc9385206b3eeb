"""6b_model_analyzer executed end to end in a real kernel against the kit's real Triton
2.51, with Model Analyzer 1.58.0 starting its own private tritonservers, at the reduced
scale of servelab/course/reference.py (its default configuration and one variant, two
concurrencies, short windows).

The kernel is the kit's venv (the local Jupyter): the lesson runs locally, where Model
Analyzer's local launch mode finds the tritonserver binary; the Jupyter container's SDK
image is not this lesson's place yet (the notebook says so)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from servelab.course import reference

from .nbkit import REPO_ROOT, base_kernel_env, notebook_text, run_notebook
from .test_measurement_notebooks import _no_failed_check

# quiet: Model Analyzer's ranking and the notebook's own sweep are timings
pytestmark = [pytest.mark.quiet, pytest.mark.e2e]

REDUCED = reference.SCALES["reduced"]["6b_model_analyzer"]


def test_6b_model_analyzer_runs_against_a_local_triton(tmp_path):
    from servelab import triton

    repo = tmp_path / "models"
    shutil.copytree(REPO_ROOT / "models_staging", repo, ignore=shutil.ignore_patterns("food_classifier"))
    original = (repo / "food_classifier_onnx" / "config.pbtxt").read_text()
    shm_before = set(Path("/dev/shm").glob("servelab_ma_*"))
    with triton.running(repo, models=["food_classifier_onnx"], **triton.free_ports()) as t:
        env = base_kernel_env(TRITON_SERVER_URL=t.url, TRITON_GRPC_URL=t.grpc_url, TRITON_ADMIN_KEY=t.admin_key,
                              TRITON_MODEL_REPOSITORY=str(repo), SERVELAB_RESULTS_DIR=str(tmp_path / "results"),
                              **REDUCED)
        nb = run_notebook("6b_model_analyzer", env, timeout=600)
        final = t.model_config("food_classifier_onnx")
    text = notebook_text(nb)
    passed = _no_failed_check(text)
    assert len(passed) == 5, passed
    # the hand-in cell (issue 52): a zip with the figures the run measured
    (zipped,) = (tmp_path / "results").glob("6b_model_analyzer-*.zip")
    assert "figures.json: 2 measurement(s)" in text and zipped.stat().st_size > 0
    # the prediction, the tool's rows and ranking, the side-by-side table filled from both
    assert re.search(r"^ 1\. 1 copy, .* infer/s at +\d+ clients, p99", text, re.M)
    tables = [o["data"]["text/markdown"] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "text/markdown" in o.get("data", {})]
    assert tables and "| configuration | tool rank | model rank |" in tables[0]
    filled = [line for line in tables[0].splitlines()[2:] if "–" not in line]
    assert len(filled) == 2, tables[0]   # the default (no batching) and batching to 4: both ranks, both figures
    assert re.search(r"agreement: \d of the model's top 3 are in the tool's top 3", text)
    # the report, in the notebook: its HTML and its plot
    html = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
    assert html and "food_classifier_onnx" in html[0]["data"]["text/html"]
    assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    # the winner applied with the reload, swept, and the file and the server back as shipped
    assert re.search(r"Triton now runs food_classifier_onnx with \d cop(y|ies)\b", text)
    assert re.search(r"^ 2 clients: +[0-9.]+ infer/s", text, re.M)
    assert (repo / "food_classifier_onnx" / "config.pbtxt").read_text() == original
    assert [g.get("count") for g in final["instance_group"]] == [1] and "dynamic_batching" not in final
    assert set(Path("/dev/shm").glob("servelab_ma_*")) <= shm_before
