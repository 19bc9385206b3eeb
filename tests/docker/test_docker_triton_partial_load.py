"""One model that fails to load must not take the Triton stack down.

The Compose command (`--exit-on-error=false`, `--strict-readiness=false`) and
the container's health check, run with the real Triton 2.51 binary (the 24.10
container's server) on the CPU copy of the lab's repository. Locally that
binary has no ONNX Runtime backend, so `food_classifier_onnx` really fails to
load: Triton must keep running, serve `food_classifier`, report each model's
readiness, and the health check must pass; with no model loadable, it fails."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from servelab.core import procs
from servelab.node import compose

from .dockerkit import REPO, render, start_compose_triton

pytestmark = pytest.mark.integration   # a real Triton


def _start(tmp_path, repo, command):
    server, base = start_compose_triton(tmp_path, repo, command, health="live")
    return server, base, int(base.rsplit(":", 1)[1])


def _healthcheck(healthcheck: dict, port: int) -> int:
    """Run the container's health check (CMD python3 -c SCRIPT) against this server as Docker
    does: up to `retries` attempts (a busy test machine can miss one 4 s answer); 0 = healthy."""
    test = healthcheck["test"]
    assert test[:3] == ["CMD", "python3", "-c"]
    script = test[3].replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    code = 1
    for _ in range(int(healthcheck.get("retries", 3))):
        code = subprocess.run([sys.executable, "-c", script], timeout=60, check=False).returncode
        if code == 0:
            break
    return code


def test_one_failing_model_leaves_the_other_serving_and_the_stack_healthy(tmp_path, empty_env_file, built_models):
    svc = render("triton+cpu", empty_env_file)["services"]["triton_server"]
    command = svc["command"]
    assert "--exit-on-error=false" in command and "--strict-readiness=false" in command
    repo = tmp_path / "models"
    compose.cpu_repository(REPO / "models_staging", repo)  # both models; the ONNX one cannot load here
    server, base, port = _start(tmp_path, repo, command)
    try:
        procs.wait_http_ok(f"{base}/v2/models/food_classifier/ready", timeout=300, server=server)
        assert server.alive(), "Triton exited because one model failed"
        assert procs.http_status(f"{base}/v2/models/food_classifier/ready") == 200
        assert procs.http_status(f"{base}/v2/models/food_classifier_onnx/ready") == 400
        assert procs.http_status(f"{base}/v2/health/ready") == 200
        assert _healthcheck(svc["healthcheck"], port) == 0
        assert "food_classifier_onnx" in server.log_tail(200)  # the log names the model that failed
    finally:
        server.stop(timeout=20)
        print(server.log_tail(30))
    assert not server.alive()


def test_no_loadable_model_fails_the_health_check(tmp_path, empty_env_file):
    svc = render("triton+cpu", empty_env_file)["services"]["triton_server"]
    repo = tmp_path / "models"
    compose.cpu_repository(REPO / "models_staging", repo)
    shutil.rmtree(repo / "food_classifier")  # only the ONNX model is left, and it cannot load here
    server, base, port = _start(tmp_path, repo, svc["command"])
    try:
        procs.wait_http_ok(f"{base}/v2/health/live", timeout=300, server=server)
        assert server.alive()
        assert procs.http_status(f"{base}/v2/models/food_classifier_onnx/ready") == 400
        assert _healthcheck(svc["healthcheck"], port) == 1
    finally:
        server.stop(timeout=20)
        print(server.log_tail(30))
