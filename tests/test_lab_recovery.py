"""Recovery helpers the notebooks call: wait_for_backend says what it waits for and gives up
with the swap command; servelab.node.configs restores the model configurations without git."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from servelab.core import paths
from servelab.course import lab
from servelab.node import configs
from tests.tiers import tier


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
@tier("integration")   # a real HTTP server on loopback
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


def test_wait_for_backend_defaults_to_minutes_not_a_quarter_hour(server, monkeypatch, capsys):
    """Called as the notebook calls it (no timeout given), against a server that never swaps: on a
    clock that jumps at each poll instead of sleeping, it gives up after minutes, within five."""
    url, _ = server
    clock = [1000.0]   # lab's own clock only (the real time module stays as it is for everything else)
    monkeypatch.setattr(lab, "time", types.SimpleNamespace(
        monotonic=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s)))
    with pytest.raises(TimeoutError) as err:
        lab.wait_for_backend(url, "pytorch")
    waited = clock[0] - 1000.0
    assert 60 <= waited <= 300 + 5, f"gave up after {waited:.0f} s"
    assert f"within {round(waited / 60)} min" in str(err.value)
    assert capsys.readouterr().out.count("waiting up to") == 1


def test_the_swap_commands_match_the_stack():
    """The compose file, variable and service the swap commands name exist."""
    text = (paths.REPO_ROOT / "docker" / "docker-compose-fastapi.yaml").read_text()
    assert "${FASTAPI_APP:-fastapi_pt}" in text and "container_name: fastapi_server" in text
    # FASTAPI_STACK is that compose file, in the kit's folder on the node (where notebook 2 puts the kit)
    home, _, rel = lab.FASTAPI_STACK.partition("/docker/")
    assert home == f"~/{paths.KIT_DIR_ON_NODE}", lab.FASTAPI_STACK
    assert (paths.REPO_ROOT / "docker" / rel).read_text() == text, lab.FASTAPI_STACK
    # and notebook 4 tells the learner the same swap command the helper prints
    assert lab.SWAP_TO["onnxruntime"] in (paths.REPO_ROOT / "notebooks" / "src" / "4_fastapi.md").read_text()


def test_the_kits_record_of_the_configs_is_the_shipped_configs():
    """servelab/pristine holds exactly models_staging's config.pbtxt files, and every model_warmup
    block is the one written from its first entry (python -m servelab.triton.warmupgen writes both)."""
    from servelab.triton import warmupgen

    shipped = sorted(p.parent.name for p in paths.MODELS_STAGING.glob("*/config.pbtxt"))
    assert configs.models() == shipped
    assert configs.changed(paths.MODELS_STAGING) == [], "run: python -m servelab.triton.warmupgen"
    assert warmupgen.sync(write=False) == [], "run: python -m servelab.triton.warmupgen"


def test_warmup_entries_and_pristine_copies_are_written_from_one_source(tmp_path):
    from servelab.triton import warmupgen

    repo, pristine = tmp_path / "models_staging", tmp_path / "pristine"
    shutil.copytree(paths.MODELS_STAGING, repo, ignore=shutil.ignore_patterns("[0-9]", "warmup"))
    cfg = repo / "food_classifier_onnx" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("max_batch_size: 16", "max_batch_size: 4"))
    changed = warmupgen.sync(repo, pristine)
    assert cfg in changed and pristine / "food_classifier_onnx" / "config.pbtxt" in changed
    sizes = [int(b) for b in re.findall(r'batch_size: (\d+) inputs \{ key: "input"', cfg.read_text())]
    assert sizes == [1, 2, 3, 4]
    assert (pristine / "food_classifier_onnx" / "config.pbtxt").read_text() == cfg.read_text()
    # the other configs only got their pristine copy; a second run finds nothing to do
    assert all(p.parent.parent == pristine for p in changed if p != cfg)
    assert warmupgen.sync(repo, pristine) == []
    with pytest.raises(ValueError, match="first model_warmup entry"):
        warmupgen.warmup_block("max_batch_size: 2\nmodel_warmup [\n  { name: \"b\" }\n]\n")


def test_restore_puts_edited_configs_back_without_git(tmp_path):
    repo = tmp_path / "models_staging"
    shutil.copytree(paths.MODELS_STAGING, repo, ignore=shutil.ignore_patterns("1"))
    (repo / "food_classifier" / "config.pbtxt").write_text("instance_group [{ count: 4 kind: KIND_GPU }]\n")
    (repo / "food_classifier_onnx" / "config.pbtxt").unlink()
    assert configs.changed(repo) == ["food_classifier", "food_classifier_onnx"]
    # as on the node: the system python3, standard library only, no git
    out = subprocess.run([sys.executable, "-S", "-m", "servelab.node.configs", "restore", "--repository", str(repo)],
                         cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "restored food_classifier/config.pbtxt, food_classifier_onnx/config.pbtxt" in out.stdout
    assert configs.changed(repo) == []
    again = subprocess.run([sys.executable, "-S", "-m", "servelab.node.configs", "restore", "--repository", str(repo)],
                           cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert "nothing to restore" in again.stdout


def _run_prepare(tmp_path, fail_on: tuple[str, ...] = ()):
    """docker/prepare-node.sh as on the node: HOME with the kit in ~/serve-system-chi, a stand-in `docker`
    on PATH that logs its arguments (and fails on ``fail_on``), the real python3 for servelab.node.compose."""
    home = tmp_path / "home"
    kit = home / "serve-system-chi"
    for part in ("servelab", "docker"):
        shutil.copytree(paths.REPO_ROOT / part, kit / part, ignore=shutil.ignore_patterns("__pycache__", ".env"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "docker-calls"
    pattern = "|".join('*"%s"*' % f for f in fail_on)  # a shell case pattern: any of them fails
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        + (f'case "$*" in {pattern}) echo "error: $1 failed" >&2; exit 1;; esac\n' if fail_on else "")
        + "exit 0\n")
    (bin_dir / "docker").chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    log = home / "prepare-node.log"
    with open(log, "w") as out:
        rc = subprocess.run(["sh", str(kit / "docker" / "prepare-node.sh")], env=env, stdout=out,
                            stderr=subprocess.STDOUT, timeout=120).returncode
    return rc, log, calls.read_text().splitlines(), kit


def test_prepare_node_builds_in_the_notebooks_order_and_the_doctor_reads_it(tmp_path):
    from servelab.node import doctor

    rc, log, calls, kit = _run_prepare(tmp_path)
    assert rc == 0, log.read_text()
    assert [c.split(" -f ")[-1] if " -f " in c else c for c in calls] == [
        f"{kit}/docker/docker-compose-models.yaml build",
        f"{kit}/docker/docker-compose-models.yaml run --rm models",
        f"{kit}/docker/docker-compose-fastapi.yaml build",
        f"{kit}/docker/docker-compose-fastapi.yaml build fastapi_server",
        "pull nvcr.io/nvidia/tritonserver:24.10-py3",
        "pull nvcr.io/nvidia/tritonserver:24.10-py3-sdk",
        f"{kit}/docker/docker-compose-triton.yaml build",
    ]
    env_file = kit / "docker" / ".env"
    assert "JUPYTER_TOKEN=" in env_file.read_text() and "TRITON_ADMIN_KEY=" in env_file.read_text()
    assert doctor.check_preparation(log, ("fastapi", "triton")).status == doctor.PASS


def test_a_failed_background_step_is_reported_and_the_doctor_says_so(tmp_path):
    from servelab.node import doctor

    # the pull fails and the image is not here either (with the image already here the script goes on:
    # tests/docker/test_compose_check.py)
    rc, log, calls, _ = _run_prepare(tmp_path, fail_on=("pull", "image inspect"))
    assert rc != 0
    text = log.read_text()
    assert "FastAPI part ready" in text and "Triton part ready" not in text
    assert "stopped with an error (exit 1)" in text.splitlines()[-1]
    assert not any("triton.yaml build" in c for c in calls), "nothing runs after the failed step"
    fastapi = doctor.check_preparation(log, ("fastapi",))
    assert fastapi.status == doctor.WARN and "stopped with an error" in fastapi.detail
    # still running: the FastAPI part is ready, the Triton part not yet
    log.write_text("== 08:01:02 FastAPI part ready\n== 08:01:03 Triton server and SDK images (notebook 5)\n")
    assert doctor.check_preparation(log, ("fastapi",)).status == doctor.PASS
    triton = doctor.check_preparation(log, ("triton",))
    assert triton.status == doctor.WARN and "Triton part ready" in triton.fix
    assert doctor.check_preparation(tmp_path / "none.log", ("triton",)).status == doctor.SKIP


@pytest.mark.parametrize("stack", ["fastapi", "triton"])
def test_the_jupyter_container_sees_the_lease_end_notebook_2_writes(stack):
    """Notebook 2 writes ~/serve-system-chi/lease-end.txt on the node; the Jupyter container mounts that
    folder (the compose file's ..) and its servelab reads SERVELAB_ROOT/lease-end.txt."""
    import yaml

    from servelab.node import leaseclock

    spec = yaml.safe_load((paths.REPO_ROOT / "docker" / f"docker-compose-{stack}.yaml").read_text())
    jupyter = spec["services"]["jupyter"]
    root = jupyter["environment"]["SERVELAB_ROOT"]
    mounts = [v for v in jupyter["volumes"] if isinstance(v, str) and v.split(":")[1] == root]
    assert mounts and mounts[0].split(":")[0] == "..", "the kit's folder (docker/..) is mounted at SERVELAB_ROOT"
    assert leaseclock.LEASE_END_FILE == "lease-end.txt"
    nb2 = (paths.REPO_ROOT / "notebooks" / "src" / "2_create_server_nvidia.md").read_text()
    assert "> ~/{KIT_DIR}/lease-end.txt" in nb2


def test_triton_log_since_waits_for_a_line_that_comes_late(tmp_path):
    """The Python backend queues a model's own log lines: the line may come after the model is READY."""
    log = tmp_path / "triton.log"
    log.write_text("I0 old line about m_0_0\n")
    mark = (str(log), log.stat().st_size)
    late = "I1 m_0_0: onnxruntime runner, sessions with [1] thread(s)\n"

    def append():
        with log.open("a") as f:
            f.write(late)

    writer = threading.Timer(0.5, append)
    writer.start()
    try:
        assert lab.triton_log_since(mark, "m_0_0") == "(Triton logged nothing about m_0_0)"  # not yet
        t0 = time.monotonic()
        assert lab.triton_log_since(mark, "m_0_0", wait_for="onnxruntime") == late.strip()
        assert time.monotonic() - t0 < 5
    finally:
        writer.join()
    t0 = time.monotonic()  # a line that never comes: what there is, after the timeout
    assert lab.triton_log_since(mark, "m_0_0", wait_for="openvino", timeout=0.3) == late.strip()
    assert 0.3 <= time.monotonic() - t0 < 3


def test_a_model_with_one_version_out_of_service_is_still_ready(monkeypatch):
    """Triton's repository index lists each version; notebook 6a's rollout leaves version 2 UNAVAILABLE
    beside version 1 READY: the model serves, and the listing says READY."""
    import tritonclient.grpc as grpcclient

    index = {"models": [{"name": "food_classifier_onnx", "version": "1", "state": "READY"},
                        {"name": "food_classifier_onnx", "version": "2", "state": "UNAVAILABLE"},
                        {"name": "planted", "version": "1", "state": "UNAVAILABLE"},
                        {"name": "food_pipeline", "version": "1", "state": "READY"}]}

    class Client:
        def __init__(self, url):
            pass

        def get_model_repository_index(self, headers=None, as_json=False):
            return index

        def close(self):
            pass

    monkeypatch.setattr(grpcclient, "InferenceServerClient", Client)
    assert lab.models_in_repository("127.0.0.1:1") == {"food_classifier_onnx": "READY", "planted": "UNAVAILABLE",
                                                       "food_pipeline": "READY"}
