"""The whole local stack (servelab.local.stack: FastAPI PyTorch + ONNX, Triton,
Flask, Jupyter) on free ports: what it exposes, and how it stops.

1. Exposure: every listening socket of every process the stack started
   (Triton's stubs included) is on loopback; Jupyter answers only with its
   token; Triton's repository API refuses a request without the key.
2. Graceful shutdown: with requests in flight on Flask, FastAPI and both
   Triton models, ``stack.stop`` returns in bounded time; every client call
   ends (an answer or a clean connection error, never a hang); no process of
   the stack is left (no ``triton_python_backend_stub``, no uvicorn), no
   Python-backend shared-memory region is left in /dev/shm.
3. Restart on the same ports works at once.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests

from servelab.bench.targets import triton_infer_body
from servelab.core import food11, procs

from .relsupport import listening, non_loopback, sample_bytes, tree, wait_gone

pytestmark = pytest.mark.integration   # the local stack

STOP_LIMIT_S = 60.0      # stack.stop under load, worst case on a busy 2-core machine
CLIENT_TIMEOUT = 120.0   # a client still waiting this long after stop would be a hang
REPORT: dict = {}


@pytest.fixture(scope="module")
def up(tmp_path_factory, built_models):
    from servelab.local import stack

    st = stack.start(None, free_ports=True, fastapi="onnx", flask_backend="fastapi",
                     log_dir=tmp_path_factory.mktemp("stack-logs"), state_file=None, log=None)
    st.stopped = False
    try:
        yield st
    finally:
        if not st.stopped:  # the shutdown test stops it itself
            st.stop()


def _stack_pids(st) -> dict[str, list[int]]:
    return {name: [p.pid for p in tree(s.pid)] for name, s in st.servers.items()}


def test_every_server_listens_on_loopback_only(up):
    socks_by = {}
    for name, pids in _stack_pids(up).items():
        socks = listening(pids)
        socks_by[name] = socks
        assert socks, f"{name} listens nowhere? pids {pids}"
        assert non_loopback(socks) == [], f"{name} listens beyond loopback: {non_loopback(socks)}"
    expected = set(up.ports.values())
    found = {port for socks in socks_by.values() for _, _, port in socks}
    assert expected <= found, f"ports the stack planned but nothing listens on: {expected - found}"
    extra = {(n, ip, port) for n, socks in socks_by.items() for _, ip, port in socks if port not in expected}
    REPORT["sockets"] = socks_by
    print(f"\nlistening sockets: {socks_by}\nbeyond the planned ports: {extra or 'none'}")


def test_jupyter_requires_its_token(up):
    base = up.urls["jupyter"]
    assert requests.get(f"{base}/api/contents", timeout=15).status_code == 403
    assert requests.get(f"{base}/api/contents", params={"token": "wrong"}, timeout=15).status_code == 403
    r = requests.get(f"{base}/lab", timeout=15, allow_redirects=False)
    assert r.status_code in (302, 403) and "JupyterLab" not in r.text[:2000]
    ok = requests.get(f"{base}/api/contents", headers={"Authorization": f"token {up.jupyter_token}"}, timeout=15)
    assert ok.status_code == 200


def test_stack_triton_repository_api_needs_the_key(up):
    base = up.urls["triton"]
    r = requests.post(f"{base}/v2/repository/index", timeout=15)
    assert r.status_code == 403
    r = requests.post(f"{base}/v2/repository/models/food_classifier/unload", timeout=15)
    assert r.status_code == 403
    assert requests.get(f"{base}/v2/models/food_classifier/ready", timeout=10).status_code == 200


class _Clients:
    """Closed-loop clients on every entry point, recording how each call ended."""

    def __init__(self, st):
        self.st, self.stop_evt = st, threading.Event()
        self.outcomes: list[tuple[str, str, float]] = []  # (target, outcome, t_end)
        self.lock = threading.Lock()
        img = sample_bytes()[0]
        tensor = food11.preprocess(img)[None]
        self.jobs = {
            "flask": lambda s: s.post(f"{st.urls['flask']}/predict", files={"file": ("a.jpg", img, "image/jpeg")},
                                      timeout=CLIENT_TIMEOUT),
            "fastapi_onnx": lambda s: s.post(f"{st.urls['fastapi_onnx']}/predict",
                                             json={"image": base64.b64encode(img).decode()}, timeout=CLIENT_TIMEOUT),
            "triton_py": self._triton(st.urls["triton"], "food_classifier",
                                      triton_infer_body([("INPUT_IMAGE", "BYTES", [1, 1], [base64.b64encode(img)])])),
            "triton_onnx": self._triton(st.urls["triton"], "food_classifier_onnx",
                                        triton_infer_body([("input", "FP32", [1, 3, 224, 224], tensor)])),
        }
        self.threads = []

    @staticmethod
    def _triton(base, model, req):
        body, headers = req
        return lambda s: s.post(f"{base}/v2/models/{model}/infer", data=body, headers=headers, timeout=CLIENT_TIMEOUT)

    def _loop(self, name):
        session = requests.Session()
        while not self.stop_evt.is_set():
            try:
                r = self.jobs[name](session)
                outcome = f"HTTP {r.status_code}"
            except requests.Timeout:
                outcome = "TIMEOUT"
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):  # the latter: mid-body
                outcome = "connection closed"
                session.close()
                session = requests.Session()
                time.sleep(0.05)
            with self.lock:
                self.outcomes.append((name, outcome, time.monotonic()))
        session.close()

    def start(self, per_target=3):
        for name in self.jobs:
            for _ in range(per_target):
                th = threading.Thread(target=self._loop, args=(name,), daemon=True)
                th.start()
                self.threads.append(th)

    def join(self, timeout) -> list[threading.Thread]:
        deadline = time.monotonic() + timeout
        for th in self.threads:
            th.join(max(0.0, deadline - time.monotonic()))
        return [th for th in self.threads if th.is_alive()]


def test_stop_under_load_leaves_nothing_and_restarts_at_once(up):
    from servelab import triton
    from servelab.local import stack

    st = up
    pids = _stack_pids(st)
    all_pids = sorted({p for ps in pids.values() for p in ps})
    stubs = [p for p in all_pids if _name(p) == "triton_python_backend_stub"]
    uvicorns = [p for p in all_pids if "uvicorn" in _cmd(p)]
    shm = [Path(f"/dev/shm/{_cmd(p).split()[2]}") for p in stubs]
    assert len(stubs) >= 2 and len(uvicorns) >= 2, (stubs, uvicorns)
    assert all(s.exists() for s in shm), shm

    clients = _Clients(st)
    clients.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until every entry point has answered at least once
        with clients.lock:
            got = {n: sum(1 for t, o, _ in clients.outcomes if t == n and o == "HTTP 200") for n in clients.jobs}
        if all(got.values()):
            break
        time.sleep(0.2)
    assert all(got.values()), f"load did not get going: {got}; {clients.outcomes[-10:]}"
    time.sleep(1.0)  # more requests now in flight everywhere

    stop_times: dict[str, float] = {}
    real_stop = procs.Server.stop

    def timed_stop(self, *a, **kw):  # observe how long each component takes to stop
        t = time.monotonic()
        try:
            return real_stop(self, *a, **kw)
        finally:
            stop_times[self.name] = round(time.monotonic() - t, 2)

    t0 = time.monotonic()
    procs.Server.stop = timed_stop
    try:
        stack.stop(st)
    finally:
        procs.Server.stop = real_stop
        st.stopped = True
    stop_s = time.monotonic() - t0
    clients.stop_evt.set()
    hung = clients.join(timeout=30.0)
    after_stop_s = time.monotonic() - t0

    left = wait_gone(all_pids, timeout=5.0)
    outcomes: dict[str, dict[str, int]] = {}
    for name, outcome, _ in clients.outcomes:
        outcomes.setdefault(name, {}).setdefault(outcome, 0)
        outcomes[name][outcome] += 1
    REPORT["shutdown"] = {"stop_s": stop_s, "clients_done_s": after_stop_s, "outcomes": outcomes}
    REPORT["shutdown"]["per_component_s"] = stop_times
    print(f"\nstack.stop under load: {stop_s:.1f} s {stop_times}; all clients finished {after_stop_s:.1f} s after stop began; "
          f"outcomes {outcomes}")
    print("Triton wrapper log (tail):\n" + "\n".join(
        ln for ln in st.servers["triton"].log_tail(200).splitlines() if "Triton stopped" in ln or "forced" in ln
        or "SIGKILL" in ln or "exit" in ln.lower()))
    assert stop_s < STOP_LIMIT_S
    assert not hung, f"{len(hung)} client(s) still waiting 30 s after the stack stopped (a hang)"
    assert not any(o == "TIMEOUT" for _, o, _ in clients.outcomes), outcomes
    assert not left, f"processes left behind: {[(p, _cmd(p)[:120]) for p in left]}"
    assert not [s for s in shm if s.exists()], f"shared memory left in /dev/shm: {shm}"
    orphan_stubs = [p.pid for p in psutil.process_iter(["cmdline"]) if p.pid in stubs]
    assert not orphan_stubs

    # Restart on the same ports, at once: FastAPI, Flask, Jupyter through the
    # stack; Triton on its three ports (ONNX model only, to keep this quick).
    for key, port in st.ports.items():
        assert procs.port_is_free(port), f"{key} port {port} still taken after stop"
    t1 = time.monotonic()
    again_ports = {k: v for k, v in st.ports.items() if not k.startswith("triton")}
    st2 = stack.start(["fastapi_onnx", "flask", "jupyter"], ports=again_ports, fastapi="onnx",
                      log_dir=st.log_dir, state_file=None, log=None)
    try:
        t = triton.start(models=["food_classifier_onnx"], http_port=st.ports["triton_http"],
                         grpc_port=st.ports["triton_grpc"], metrics_port=st.ports["triton_metrics"],
                         write_state=False)
        try:
            restart_s = time.monotonic() - t1
            assert t.ready()
            r = requests.get(f"{st2.urls['flask']}/test", timeout=60)
            assert r.status_code == 200, r.text[:300]
        finally:
            t.stop()
    finally:
        st2.stop()
    print(f"restart on the same ports: ready in {restart_s:.1f} s")


def _name(pid):
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return ""


def _cmd(pid):
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


# --------------------------------------------------------------------------
# A crashed tritonserver comes back (issue 15, item 10)
# --------------------------------------------------------------------------

def _tritonserver(wrapper_pid: int) -> psutil.Process | None:
    return next((p for p in tree(wrapper_pid) if p.name() == "tritonserver"), None)


def test_servelab_up_restarts_a_crashed_triton(tmp_path):
    """tritonserver dies (here SIGKILL, as the OOM killer or a crash would end
    it): the stack's Triton wrapper reports it in its log and starts it again
    on the same ports, with the same admin key, and inference works again."""
    import signal

    from servelab.local import stack

    with stack.running(["triton"], free_ports=True, log_dir=tmp_path) as st:
        wrapper = st.servers["triton"]
        base = st.urls["triton"]
        deadline = time.monotonic() + 120
        while "Triton ready." not in wrapper.log_path.read_text(errors="replace"):  # the wrapper is watching
            assert time.monotonic() < deadline, wrapper.log_path.read_text(errors="replace")[-2000:]
            time.sleep(0.5)
        first = _tritonserver(wrapper.pid)
        assert first is not None
        os.kill(first.pid, signal.SIGKILL)
        deadline = time.monotonic() + 240
        second = None
        while time.monotonic() < deadline:
            second = _tritonserver(wrapper.pid)
            if second is not None and second.pid != first.pid and \
                    procs.http_status(f"{base}/v2/models/food_classifier_onnx/ready") == 200:
                break
            time.sleep(1.0)
        log = wrapper.log_path.read_text(errors="replace")
        assert second is not None and second.pid != first.pid, f"Triton was not restarted:\n{log[-2000:]}"
        assert procs.http_status(f"{base}/v2/models/food_classifier_onnx/ready") == 200, log[-2000:]
        assert "tritonserver died (signal 9)" in log and "restarting tritonserver" in log, log[-2000:]
        assert wrapper.proc.poll() is None, "the wrapper itself must keep running"
        x = np.zeros((1, 3, 224, 224), np.float32)
        body, headers = triton_infer_body([("input", "FP32", list(x.shape), x)], ["output"])
        r = requests.post(f"{base}/v2/models/food_classifier_onnx/infer", data=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text[:300]
