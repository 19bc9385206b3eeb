"""The Triton stack's command line, run by the real Triton 2.51 binary (the
same server as the 24.10 container, from nvidia-pytriton) on the KIND_CPU
copy the CPU override makes: the model loads READY, and the repository API
answers 403 without the admin key and 200 with it."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request

import pytest

from servelab.core import procs
from servelab.node import compose

from .dockerkit import REPO, SECRETS, render, start_compose_triton

pytestmark = pytest.mark.integration   # the compose file's Triton command on the real server


def _post(url: str, key: str | None = None) -> int:
    req = urllib.request.Request(url, data=b"{}", method="POST", headers={"admin-key": key} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_compose_triton_command_on_the_real_server(tmp_path, empty_env_file, built_models):
    repo = tmp_path / "models"
    compose.cpu_repository(REPO / "models_staging", repo)
    shutil.rmtree(repo / "food_classifier_onnx")  # the local binary has no onnxruntime backend

    command = render("triton+cpu", empty_env_file)["services"]["triton_server"]["command"]
    assert command[0] == "tritonserver" and "--model-repository=/models" in command
    server, base = start_compose_triton(tmp_path, repo, command)
    try:
        procs.wait_http_ok(server.url, timeout=120, server=server)
        assert procs.http_status(f"{base}/v2/models/food_classifier/ready") == 200
        assert _post(f"{base}/v2/repository/index") == 403
        assert _post(f"{base}/v2/repository/index", "wrong-key") == 403
        assert _post(f"{base}/v2/repository/index", SECRETS["TRITON_ADMIN_KEY"]) == 200
    finally:
        server.stop(timeout=20)
        print(server.log_tail(30))  # shown by pytest when the test fails
    assert not server.alive()
