"""`servelab triton start` in the foreground: URLs printed, Ctrl-C stops it
with nothing left behind; a killed owner's leftovers are reaped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from servelab import triton
from servelab.core import procs

# quiet, though it times nothing: with the other tests beside it on two workers (2026-11-26, two runs
# of two), `servelab triton start` did not exit within 100 s of Ctrl-C; alone it exits in seconds. The
# cause is not found yet (stop's one gRPC call without a timeout has one now); until it is, it runs alone.
pytestmark = [pytest.mark.quiet, pytest.mark.integration]   # integration: a real Triton


def _start_cli(tmp_path, artifacts):
    ports = [procs.free_port() for _ in range(3)]
    cmd = [str(procs.venv_bin() / "python"), "-m", "servelab.triton", "start",
           "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
           "--models", "food_classifier_onnx", "--workdir", str(tmp_path / "work")]
    log = open(tmp_path / "cli.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while "Ready." not in (tmp_path / "cli.log").read_text():
        assert proc.poll() is None, (tmp_path / "cli.log").read_text()
        assert time.monotonic() < deadline, "not ready in time"
        time.sleep(0.25)
    state = json.loads(triton.state_path(ports[0]).read_text())
    return proc, ports, state, (tmp_path / "cli.log")


def _leftovers(state) -> tuple[list, list]:
    stubs = [s.pid for s in triton.stub_processes(state["pid"], state["shm_prefix"])]
    shm = list(Path("/dev/shm").glob(f"{state['shm_prefix']}*"))
    return stubs, shm


def test_foreground_start_prints_urls_and_ctrl_c_stops_cleanly(tmp_path, artifacts):
    proc, ports, state, log = _start_cli(tmp_path, artifacts)
    try:
        text = log.read_text()
        assert f"http://127.0.0.1:{ports[0]}" in text and f"127.0.0.1:{ports[1]}" in text
        assert f"http://127.0.0.1:{ports[2]}/metrics" in text
        assert "no onnxruntime backend" in text
        # the device line: the lab's KIND_GPU copy runs on a GPU where there is one, else on the CPU
        assert ("KIND_GPU" if triton.gpu_count() else "KIND_CPU") in text
        assert ("runs as KIND_CPU" in text) == (triton.gpu_count() == 0)
        assert triton.stub_processes(state["pid"], state["shm_prefix"])
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends
        # within stop's own bound: unload_all (<= 2 x 30 s), then SIGTERM, the exit timeout and 20 s
        # (60 s ran out once with the other phase-1 tests beside it)
        assert proc.wait(timeout=100) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "stopped." in log.read_text()
    assert not Path(f"/proc/{state['pid']}").exists()
    assert _leftovers(state) == ([], [])
    assert not triton.state_path(ports[0]).exists()
    assert all(procs.port_is_free(p) for p in ports)


def test_a_killed_owner_leaves_nothing_after_stop_running(tmp_path, artifacts):
    proc, ports, state, _ = _start_cli(tmp_path, artifacts)
    os.kill(proc.pid, signal.SIGKILL)  # no chance to clean up
    proc.wait(timeout=10)
    # The server was told to stop when its owner died (PR_SET_PDEATHSIG) ...
    deadline = time.monotonic() + 60
    while Path(f"/proc/{state['pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{state['pid']}").exists()
    # ... and `servelab triton stop` (or the next start on that port) reaps
    # whatever it left: hung stubs and their shared memory.
    assert triton.stop_running(ports[0]) is False  # no server was running
    assert _leftovers(state) == ([], [])
    assert not triton.state_path(ports[0]).exists()


def test_start_refuses_a_busy_port(artifacts):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(triton.TritonError, match=f"port {port}"):
            triton.start(http_port=port, grpc_port=procs.free_port(), metrics_port=procs.free_port())
