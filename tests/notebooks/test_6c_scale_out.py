"""6c_scale_out executed end to end in a real kernel (the Triton stack's Jupyter image, as notebook 6)
against the real local scale-out lab (servelab.local.scale: Triton replicas, HAProxy, Prometheus),
at the reduced sizes of servelab/course/reference.py SCALES["reduced"]["6c_scale_out"]."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servelab.course import reference
from servelab.local import scale
from tests.images import imagekit

from .nbkit import LAST_KERNEL_ARGV, base_kernel_env, image_kernel_env, notebook_text
from .test_measurement_notebooks import _no_failed_check, _run_with_one_retry

# quiet: the notebook's lesson checks time runs and judge whether other work spoiled them
pytestmark = [pytest.mark.quiet, pytest.mark.e2e]

REDUCED = reference.SCALES["reduced"]["6c_scale_out"]


def test_6c_runs_against_the_local_scale_out_lab(tmp_path, jupyter_sdk_image_env):
    sdk = jupyter_sdk_image_env
    with scale.running(2, workdir=tmp_path / "scale", scrape_interval="1s") as st:
        kernel_env = (lambda **kw: image_kernel_env(sdk, imagekit.sdk_tools(), **kw)) if sdk else base_kernel_env
        env = kernel_env(**st.env, **REDUCED, SERVELAB_RESULTS_DIR=str(tmp_path / "results"))
        nb = _run_with_one_retry("6c_scale_out", env, python_env=sdk)
        # the image's Python, not the venv's (build/image-envs may be a link: compare the folders)
        assert not sdk or Path(LAST_KERNEL_ARGV[0]).parent.resolve() == (sdk / "bin").resolve()
    text = notebook_text(nb)
    # the hand-in cell (issue 52): a zip with the figures the run measured
    assert len(list((tmp_path / "results").glob("6c_scale_out-*.zip"))) == 1 and "figures.json: 2 measurement(s)" in text
    passed = _no_failed_check(text)
    assert len(passed) == 7, passed
    # the three setups measured, each replica's count shown, predictions beside them
    for setup in ("1 Triton x 2 instances", "2 Tritons, round-robin", "2 Tritons, least connections"):
        assert re.search(rf"rho 0\.60: {re.escape(setup)} +p99 +[0-9.]+ ms, per replica \[\d+(, \d+)?\]", text), setup
    assert "random split p99 (c x M/M/1)" in text and " .. " in text   # least connections: a bracket
    # the ramp: Prometheus's metric and the rule's decision at each step
    assert "sum(delta(nv_inference_queue_duration_us{job=\"triton_replicas\"}" in text
    ramp_rows = re.findall(r"^(0\.3|0\.6|1\.3) +[0-9.]+ +(\d+) +\d+ +(\d+) ", text, re.M)
    assert [r[0] for r in ramp_rows] == ["0.3", "0.6", "1.3"], text
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) == 3
