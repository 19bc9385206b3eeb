"""6e_accelerate executed end to end in a real kernel (the kit's venv: the lesson's first part needs
PyTorch, ONNX Runtime and OpenVINO, which the Jupyter images lack) against the kit's real Triton 2.51,
at the reduced scale of servelab/course/reference.py (no torch.compile, three short rounds).
60 s on a 2-core machine shared with other jobs (load average 6.5; 2026-11-27)."""

from __future__ import annotations

import re
import shutil

import nbformat
import pytest

from servelab.course import lab, reference

from .nbkit import REPO_ROOT, base_kernel_env, cell_output, notebook_text, run_notebook
from .test_measurement_notebooks import _no_failed_check

# quiet: the notebook's table and its perf_analyzer runs are timings
pytestmark = [pytest.mark.quiet, pytest.mark.e2e]

REDUCED = reference.SCALES["reduced"]["6e_accelerate"]
VARIANTS = ("PyTorch eager", "ONNX Runtime", "OpenVINO", "ONNX Runtime INT8")


def test_6e_accelerate_runs_against_a_local_triton(tmp_path):
    from servelab import triton
    from servelab.serve import models

    if not models.artifacts_ready():
        models.build(log=lambda *a, **k: None)
    repo = tmp_path / "models"
    for name in ("food_classifier", "food_classifier_onnx"):
        shutil.copytree(REPO_ROOT / "models_staging" / name, repo / name, symlinks=False)
    with triton.running(repo, models=["food_classifier_onnx"], **triton.free_ports()) as t:
        env = base_kernel_env(TRITON_SERVER_URL=t.url, TRITON_GRPC_URL=t.grpc_url, TRITON_ADMIN_KEY=t.admin_key,
                              TRITON_MODEL_REPOSITORY=str(repo), **REDUCED)
        nb = run_notebook("6e_accelerate", env, timeout=300)
        left = set(lab.models_in_repository(t.grpc_url, t.admin_key)) - {"food_classifier_onnx"}
    (tmp_path / "6e_accelerate.ipynb").write_text(nbformat.writes(nb))  # for a look after a failure
    text = notebook_text(nb)
    passed = _no_failed_check(text)
    assert len(passed) == 5, passed
    # the table: one row per variant (torch.compile left out at this scale), fidelity beside the timings
    table = [o["data"]["text/markdown"] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
             if "text/markdown" in o.get("data", {})][0]
    for variant in VARIANTS:
        assert re.search(rf"^\| {re.escape(variant)} \| [0-9.]+ \| [0-9.]+ \|", table, re.M), table
    assert "torch.compile left out" in text and "| torch.compile |" not in table
    assert "max abs Δlogit" in table and "p50 / ONNX Runtime" in table
    assert re.search(r"cannot be told apart at batch 1 \(per-round figures overlap\): ", text)
    assert re.search(r"cannot be told apart at batch 16 \(per-round figures overlap\): ", text)
    # Triton: the accelerator named in the log, both copies measured, the planted name refused
    assert "food_classifier_onnx_openvino: cpu_execution_accelerator openvino (OpenVINO " in text
    assert re.search(r"batch 16  food_classifier_onnx_openvino +compute infer [0-9.]+ ms", text)
    assert "unknown Execution Accelerator 'openvinox' is requested" in text
    assert "no GPU visible here" in cell_output(nb, "TENSORRT_BLOCK") or "compute capability" in text
    # FP16 (issue 49): servelab models build's FP16 file served beside an fp32 copy, on the CPU here
    fp16 = cell_output(nb, "FP16_FILE = paths.ONNX_FP16")
    assert re.search(r"KIND_CPU: max \|Δlogit\| FP16 against fp32 0\.\d+, the same class for 100% of the \d+ samples",
                     fp16), fp16
    assert re.search(r"batch 16  food_classifier_onnx_fp16 +compute infer [0-9.]+ ms", fp16), fp16
    assert "food_classifier_onnx_fp16" not in left and "food_classifier_onnx_fp32" not in left
    # the copies are gone again: from the repository and from Triton's index
    assert sorted(p.name for p in repo.iterdir()) == ["food_classifier", "food_classifier_onnx"]
    assert not left, left
