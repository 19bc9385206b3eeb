"""Recovery helpers the notebooks call: wait_for_backend says what it waits for and gives up
with the swap command; servelab.configs restores the model configurations without git."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from servelab import configs, lab, paths


class _Health(BaseHTTPRequestHandler):
    backend = "onnxruntime"

    def do_GET(self):  # noqa: N802
        body = json.dumps({"backend": type(self).backend, "device": "cpu"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    handler = type("H", (_Health,), {"backend": "onnxruntime"})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


def test_wait_for_backend_names_the_swap_back_and_gives_up(server, capsys):
    """After a kernel restart past the ONNX swap, waiting for PyTorch says what the server serves,
    prints the command that swaps it back, and stops at the timeout instead of waiting silently."""
    url, _ = server
    began = time.monotonic()
    with pytest.raises(TimeoutError) as err:
        lab.wait_for_backend(url, "pytorch", timeout_s=1.0, poll_s=0.2)
    assert time.monotonic() - began < 10
    out = capsys.readouterr().out
    assert f"for {url}/health to report backend 'pytorch' (it says: onnxruntime)" in out
    assert lab.SWAP_TO["pytorch"] in out and lab.SWAP_TO["pytorch"] in str(err.value)
    assert "FASTAPI_APP" not in lab.SWAP_TO["pytorch"], "the default app is the PyTorch one"
    assert out.count("waiting up to") == 1, "said once while the answer does not change"


def test_wait_for_backend_returns_when_the_swap_lands(server, capsys):
    url, handler = server
    threading.Timer(0.5, lambda: setattr(handler, "backend", "pytorch")).start()
    health = lab.wait_for_backend(url, "pytorch", timeout_s=30, poll_s=0.1)
    assert health["backend"] == "pytorch"
    assert "serves pytorch now" in capsys.readouterr().out


def test_wait_for_backend_defaults_to_minutes_not_a_quarter_hour():
    import inspect

    assert inspect.signature(lab.wait_for_backend).parameters["timeout_s"].default <= 300


def test_the_swap_commands_match_the_stack():
    """The compose file, variable and service the swap commands name exist."""
    text = (paths.REPO_ROOT / "docker" / "docker-compose-fastapi.yaml").read_text()
    assert "${FASTAPI_APP:-fastapi_pt}" in text and "container_name: fastapi_server" in text
    assert lab.FASTAPI_STACK == "~/serve-system-chi/docker/docker-compose-fastapi.yaml"


def test_the_kits_record_of_the_configs_is_the_shipped_configs():
    """servelab/pristine holds exactly models_staging's config.pbtxt files (update both together)."""
    shipped = sorted(p.parent.name for p in paths.MODELS_STAGING.glob("*/config.pbtxt"))
    assert configs.models() == shipped
    assert configs.changed(paths.MODELS_STAGING) == [], "copy models_staging/*/config.pbtxt into servelab/pristine"


def test_restore_puts_edited_configs_back_without_git(tmp_path):
    repo = tmp_path / "models_staging"
    shutil.copytree(paths.MODELS_STAGING, repo, ignore=shutil.ignore_patterns("1"))
    (repo / "food_classifier" / "config.pbtxt").write_text("instance_group [{ count: 4 kind: KIND_GPU }]\n")
    (repo / "food_classifier_onnx" / "config.pbtxt").unlink()
    assert configs.changed(repo) == ["food_classifier", "food_classifier_onnx"]
    # as on the node: the system python3, standard library only, no git
    out = subprocess.run([sys.executable, "-S", "-m", "servelab.configs", "restore", "--repository", str(repo)],
                         cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "restored food_classifier/config.pbtxt, food_classifier_onnx/config.pbtxt" in out.stdout
    assert configs.changed(repo) == []
    again = subprocess.run([sys.executable, "-S", "-m", "servelab.configs", "restore", "--repository", str(repo)],
                           cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert "nothing to restore" in again.stdout
