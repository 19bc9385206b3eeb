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


PROBE = '''import json, os, sys
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        seen = {"sys_path": sys.path, "PYTHONPATH": os.environ.get("PYTHONPATH")}
        with open(os.path.join(args["model_repository"], "seen.json"), "w") as f:
            json.dump(seen, f)

    def execute(self, requests):
        return []
'''


def test_the_python_backend_stub_ignores_pythonpath_so_the_image_uses_a_pth_file(tmp_path):
    """The compose check's first Triton stack: every Python model failed with "No module named 'servelab'"
    although the image set PYTHONPATH=/opt/servelab. Triton 2.51's stub starts its interpreter without
    reading PYTHONPATH (shown here on the real stub); Dockerfile.triton puts servelab on the path with a
    .pth file in site-packages, which the stub reads like any interpreter."""
    repo = tmp_path / "models"
    (repo / "probe" / "1").mkdir(parents=True)
    (repo / "probe" / "1" / "model.py").write_text(PROBE)
    (repo / "probe" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\ninput [{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
        'output [{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }]\ninstance_group [{ kind: KIND_CPU count: 1 }]\n')
    server, base = start_compose_triton(tmp_path, repo, ["tritonserver", "--model-repository=/models"])
    try:
        procs.wait_http_ok(server.url, timeout=120, server=server)
    finally:
        server.stop(timeout=20)
        print(server.log_tail(30))
    import json

    seen = json.loads((repo / "probe" / "seen.json").read_text())
    assert seen["PYTHONPATH"] == str(REPO)  # the stub has the variable ...
    assert str(REPO) not in seen["sys_path"]  # ... and does not use it
    dockerfile = (REPO / "docker" / "Dockerfile.triton").read_text()
    assert "site.getsitepackages()[0], 'servelab.pth').write_text('/opt/servelab" in dockerfile
