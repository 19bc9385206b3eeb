"""The Triton stack's command line, run by the real Triton 2.51 binary (the
same server as the 24.10 container, from nvidia-pytriton) on the KIND_CPU
copy the CPU override makes: the model loads READY, and the repository API
answers 403 without the admin key and 200 with it."""

from __future__ import annotations

import os
import shutil
import sysconfig
import urllib.error
import urllib.request
from pathlib import Path

from servelab import compose, procs

from .dockerkit import REPO, SECRETS, render


def _post(url: str, key: str | None = None) -> int:
    req = urllib.request.Request(url, data=b"{}", method="POST", headers={"admin-key": key} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_compose_triton_command_on_the_real_server(tmp_path, empty_env_file, built_models):
    from servelab import triton

    install = triton.find_install()
    repo = tmp_path / "models"
    compose.cpu_repository(REPO / "models_staging", repo)
    shutil.rmtree(repo / "food_classifier_onnx")  # the local binary has no onnxruntime backend
    backends = triton.prepare_backends(tmp_path, install)

    command = render("triton+cpu", empty_env_file)["services"]["triton_server"]["command"]
    assert command[0] == "tritonserver" and "--model-repository=/models" in command
    ports = [procs.free_port() for _ in range(3)]
    cmd = [str(install.server)] + [a.replace("=/models", f"={repo}") for a in command[1:]] + [
        f"--backend-directory={backends}", "--http-address=127.0.0.1", f"--http-port={ports[0]}",
        "--grpc-address=127.0.0.1", f"--grpc-port={ports[1]}", f"--metrics-port={ports[2]}"]
    # What the container provides: the server's libraries, libpython for the stub, servelab importable.
    libs = [str(install.libs)]
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if libdir and soname and (Path(libdir) / soname).exists():
        libs.insert(0, libdir)
    env = {"LD_LIBRARY_PATH": os.pathsep.join(libs), "PYTHONPATH": str(REPO), "SERVELAB_DEVICE": "cpu"}

    base = f"http://127.0.0.1:{ports[0]}"
    server = procs.start("triton", cmd, f"{base}/v2/health/ready", log_path=tmp_path / "triton.log", env=env)
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
