"""The local stack: real processes on free loopback ports, health waits,
the URLs/env a notebook needs, Jupyter's token, and no orphans after stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from servelab.core import paths, procs
from servelab.local import stack

pytestmark = pytest.mark.integration   # the local stack


def _tree(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _listening(pids) -> set[tuple[str, int]]:
    out = set()
    for p in pids:
        try:
            for c in p.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN:
                    out.add((c.laddr.ip, c.laddr.port))
        except psutil.NoSuchProcess:
            pass
    return out


def _get(url: str, timeout: float = 30):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_fastapi_flask_jupyter_on_free_ports(built_models):
    with stack.running(["fastapi_onnx", "flask", "jupyter"], free_ports=True, fastapi="onnx",
                       flask_backend="fastapi") as s:
        assert set(s.servers) == {"fastapi_onnx", "flask", "jupyter"}
        # the env a notebook needs points at what was started
        assert s.env["FASTAPI_SERVER_URL"] == s.urls["fastapi_onnx"]
        assert "TRITON_SERVER_URL" not in s.env
        status, body = _get(s.urls["fastapi_onnx"] + "/health")
        assert status == 200 and json.loads(body)["backend"]
        # Flask calls the FastAPI service it was given
        status, body = _get(s.urls["flask"] + "/test")
        assert status == 200, body
        reply = json.loads(body)
        assert reply["backend"] == "fastapi" and 0 <= reply["probability"] <= 1
        # Jupyter refuses API calls without its token
        assert _get(s.urls["jupyter"] + "/api/contents")[0] == 403
        assert _get(s.urls["jupyter"] + f"/api/contents?token={s.jupyter_token}")[0] == 200
        assert s.urls["jupyter_login"].endswith(f"token={s.jupyter_token}")
        # everything listens on loopback only
        pids = [p for srv in s.servers.values() for p in _tree(srv.pid)]
        listening = _listening(pids)
        assert {port for _, port in listening} >= {s.ports["fastapi_onnx"], s.ports["flask"], s.ports["jupyter"]}
        assert {ip for ip, _ in listening} == {"127.0.0.1"}
        groups = [srv.pid for srv in s.servers.values()]
        summary = s.summary()
        assert s.urls["flask"] in summary and "export FASTAPI_SERVER_URL=" in summary
    assert all(procs.group_pids(g) == [] for g in groups)
    assert all(procs.port_is_free(p) for p in s.ports.values())


def test_port_in_use_and_bad_names_are_clear_errors():
    import socket

    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        with pytest.raises(stack.StackError, match=f"fastapi_onnx={port}"):
            stack.start(["fastapi_onnx"], ports={"fastapi_onnx": port}, log=None)
    with pytest.raises(stack.StackError, match="unknown component"):
        stack.start(["tensorflow_serving"], free_ports=True, log=None)
    with pytest.raises(stack.StackError, match="flask backend"):
        stack.start(["flask"], free_ports=True, flask_backend="grpc", log=None)


def test_up_and_down_leave_no_orphans(built_models, tmp_path):
    """`servelab up` in one process, `servelab down` in another: the state
    file is enough to stop everything, Triton's stubs and shared memory included."""
    env = dict(os.environ, SERVELAB_STACK_DIR=str(tmp_path / "stack"),
               PYTHONPATH=str(paths.REPO_ROOT))
    ports = {k: procs.free_port() for k in ("fastapi-onnx", "triton-http", "triton-grpc", "triton-metrics")}
    args = [f"--{k}-port={v}" for k, v in ports.items()]
    up = subprocess.run([sys.executable, "-m", "servelab.local.stack", "up", "--only", "fastapi_onnx,triton", *args],
                        env=env, capture_output=True, text=True, timeout=400, cwd=paths.REPO_ROOT)
    state_file = tmp_path / "stack" / "state.json"
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"TRITON_SERVER_URL=127.0.0.1:{ports['triton-http']}" in up.stdout
        assert f"http://127.0.0.1:{ports['fastapi-onnx']}" in up.stdout
        state = json.loads(state_file.read_text())
        assert oct(state_file.stat().st_mode & 0o777) == "0o600"
        assert (tmp_path / "stack" / "env.sh").read_text().count("export ") >= 3
        everything = [p for info in state["processes"].values() for p in _tree(info["pid"])]
        names = " ".join(" ".join(p.cmdline()) for p in everything)
        assert "tritonserver" in names and "triton_python_backend_stub" in names
        assert _get(f"http://127.0.0.1:{ports['triton-http']}/v2/models/food_classifier/ready")[0] == 200
        from servelab import triton
        # Triton answers /v2/health/ready a moment before its launcher writes
        # the run file (after its own readiness checks): give it a few seconds.
        run_file = triton.state_path(ports["triton-http"])
        deadline = time.monotonic() + 30
        while not run_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        triton_state = json.loads(run_file.read_text())
        shm_prefix = triton_state["shm_prefix"]
        assert list(Path("/dev/shm").glob(f"{shm_prefix}*"))
        # a second `up` on the same state refuses instead of starting twice
        again = subprocess.run([sys.executable, "-m", "servelab.local.stack", "up", "--only", "fastapi_onnx", *args],
                               env=env, capture_output=True, text=True, timeout=60, cwd=paths.REPO_ROOT)
        assert again.returncode == 1 and "already up" in again.stderr
    finally:
        down = subprocess.run([sys.executable, "-m", "servelab.local.stack", "down"], env=env,
                              capture_output=True, text=True, timeout=120, cwd=paths.REPO_ROOT)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped" in down.stdout
    psutil.wait_procs(everything, timeout=10)
    assert [p.pid for p in everything if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    assert list(Path("/dev/shm").glob(f"{shm_prefix}*")) == []
    assert not state_file.exists()
    assert all(procs.port_is_free(p) for p in ports.values())
