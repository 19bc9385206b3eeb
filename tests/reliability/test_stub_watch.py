"""The stub watch (servelab.triton.supervise.StubWatch) without a Triton: fast tests of
what it decides from the process table. test_stub_recovery runs it beside a real Triton.

The "server" here is this test process: its children stand in for stubs (a Python
run under the stub's name with a stub's argv), and a fake gRPC client records what
the watch asks of Triton.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servelab.triton import supervise
from servelab.triton.process import StubProcess


class FakeClient:
    def __init__(self, calls: list):
        self.calls = calls

    def is_model_ready(self, model, **kw):
        return True

    def unload_model(self, model, **kw):
        self.calls.append(("unload", model))

    def load_model(self, model, **kw):
        self.calls.append(("load", model))

    def get_model_config(self, model, **kw):
        return {"config": {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]}}

    def close(self):
        pass


class FakeServer:
    def __init__(self, pid: int):
        self.pid = pid
        self.admin_key = "k"
        self.log_path = Path("triton.log")
        self.calls: list = []

    def grpc_client(self):
        return FakeClient(self.calls)


def _stub_child(tmp_path: Path, model: str) -> subprocess.Popen:
    """A child of this process whose argv reads as a Python-backend stub of ``model``."""
    stub = tmp_path / "triton_python_backend_stub"
    if not stub.exists():
        stub.symlink_to(sys.executable)
    script = tmp_path / model / "1" / "model.py"
    script.parent.mkdir(parents=True)
    script.write_text("import sys\nprint('up', flush=True)\nsys.stdin.readline()\n")   # a line: exit 0
    argv = [str(stub), str(script), "/shm_region", "1", "1", str(os.getpid()), "/lib", "ipc", f"{model}_0_0"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, executable=str(stub))
    assert proc.stdout.readline() == b"up\n"
    return proc


def _watch(server) -> tuple[supervise.StubWatch, list[str]]:
    lines: list[str] = []
    return supervise.StubWatch(server, log=lines.append), lines


def test_a_killed_stub_is_reloaded(tmp_path):
    """A real child killed by SIGKILL and left a zombie: the watch reloads its model once."""
    server = FakeServer(os.getpid())
    proc = _stub_child(tmp_path, "food_x")
    try:
        watch, lines = _watch(server)
        assert watch.tick() == []
        assert [s.model for s in watch.known.values()] == ["food_x"]
        os.kill(proc.pid, signal.SIGKILL)
        deadline, reloaded = time.monotonic() + 10, []
        while time.monotonic() < deadline and not reloaded:   # not waited for: it stays a zombie
            time.sleep(0.05)
            reloaded = watch.tick()
        assert reloaded == ["food_x"], lines
        assert server.calls == [("unload", "food_x"), ("load", "food_x")]
        assert "died (signal 9) and is a zombie" in lines[0], lines
        assert watch.tick() == [], "reloaded twice for one death"
    finally:
        proc.kill()
        proc.wait()


def test_a_stub_that_exits_cleanly_is_left_alone(tmp_path):
    """A stub Triton stops in a reload exits 0 and is a zombie until Triton reaps it:
    never reloaded."""
    server = FakeServer(os.getpid())
    proc = _stub_child(tmp_path, "food_y")
    try:
        watch, lines = _watch(server)
        watch.tick()
        proc.stdin.write(b"stop\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and supervise._state_and_parent(proc.pid)[0] != "Z":
            time.sleep(0.05)
        assert supervise._state_and_parent(proc.pid)[::2] == ("Z", 0)   # not waited for: a zombie, exit 0
        for _ in range(3):
            assert watch.tick() == [], lines
        assert server.calls == [] and proc.pid not in watch.known
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_stub_still_dying_is_not_forgotten(monkeypatch):
    """The order the process table showed for a SIGKILLed 3 GB process on a busy machine
    (measured here, four busy loops on 2 cores): argv readable and state R for 0.4-20 ms,
    then argv empty and still R for up to 0.9 s, then a zombie with status 9. A look in the
    middle must not drop the stub: CI's stop-34 run lost one that way (no reload, 100 s of
    500 answers)."""
    server = FakeServer(4242)
    stub = StubProcess(pid=777, model="food_z", instance="food_z_0_0", shm_region="r")
    table = iter([
        ([stub], None),                    # alive
        ([], ("R", 4242, 9)),              # killed: memory gone, not yet a zombie
        ([], ("R", 4242, 9)),
        ([], ("Z", 4242, 9)),              # a zombie: died of signal 9
    ])
    state: dict = {}

    def stubs(server_pid, shm_prefix=None):
        state["live"], state["info"] = next(table)
        return state["live"]

    monkeypatch.setattr(supervise, "stub_processes", stubs)
    monkeypatch.setattr(supervise, "_state_and_parent", lambda pid: state["info"])
    watch, lines = _watch(server)
    assert [watch.tick() for _ in range(4)] == [[], [], [], ["food_z"]], lines
    assert server.calls == [("unload", "food_z"), ("load", "food_z")]


@pytest.mark.parametrize("info", [None, ("S", 1, 0)], ids=["gone", "pid-reused"])
def test_a_vanished_stub_is_counted_missing_after_the_grace(monkeypatch, info):
    """A stub gone from the table (or its PID now another process's) counts as missing once
    GONE_GRACE_S has passed and the model still runs fewer stubs than its config asks for."""
    server = FakeServer(4242)
    stub = StubProcess(pid=777, model="food_w", instance="food_w_0_0", shm_region="r")
    live = [[stub], [], []]
    monkeypatch.setattr(supervise, "stub_processes", lambda server_pid, shm_prefix=None: live.pop(0))
    monkeypatch.setattr(supervise, "_state_and_parent", lambda pid: info)
    monkeypatch.setattr(supervise, "GONE_GRACE_S", 0.0)
    watch, lines = _watch(server)
    assert watch.tick() == []
    assert watch.tick() == ["food_w"], lines
    assert "1 of its stubs are gone" in lines[0]
