"""A Python-backend stub killed under load comes back (issue 38, item 2).

The local stack's Triton (``servelab.stack_triton``, as ``servelab up`` runs
it) on free loopback ports; closed-loop clients keep sending to one model;
its stub gets SIGKILL. Before the fix every later request got 500 "Stub
process ... is not healthy" for good, the model stayed READY and the stub a
zombie. Now: the model answers not ready, is serving again within
RECOVERY_LIMIT_S, every request sent after that succeeds, and no zombie is
left. The requests that failed in the gap are counted and printed.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
import requests

from .test_reload_under_load import _script

# From the kill to the model answering again: detection (two 0.5 s looks),
# the unload, and a fresh stub loading its model (the ONNX runner ~0.3 s idle;
# the PyTorch model imports torch: ~3.5 s idle, several times that on a busy
# 2-core machine).
RECOVERY_LIMIT_S = {"food_classifier_onnx": 10.0, "food_classifier": 30.0}
CLIENTS = 3
ZOMBIE_LIMIT_S = 60.0


@pytest.fixture(scope="module")
def stack_triton(tmp_path_factory, built_models):
    from servelab import stack

    log_dir = tmp_path_factory.mktemp("stub-recovery")
    with stack.running(["triton"], free_ports=True, log_dir=log_dir, triton_workdir=log_dir / "triton") as st:
        yield st


def _tritonserver(st) -> psutil.Process:
    wrapper = psutil.Process(st.servers["triton"].pid)
    return next(p for p in wrapper.children(recursive=True) if p.name() == "tritonserver")


def _zombies(server: psutil.Process) -> list[int]:
    out = []
    for p in server.children():
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _readiness(url: str, model: str, stop: threading.Event, seen: list) -> None:
    session = requests.Session()
    while not stop.is_set():
        try:
            code = session.get(f"{url}/v2/models/{model}/ready", timeout=5).status_code
        except requests.RequestException:
            code = 0
        seen.append((time.perf_counter(), code))
        time.sleep(0.05)


@pytest.mark.parametrize("model", ["food_classifier_onnx", "food_classifier"])
def test_killed_stub_is_brought_back(stack_triton, model):
    from servelab.triton.process import stub_processes

    url = stack_triton.urls["triton"]
    server = _tritonserver(stack_triton)
    stubs = [s for s in stub_processes(server.pid) if s.model == model]
    assert stubs, f"no stub of {model} under tritonserver {server.pid}"
    victim = stubs[0]

    load = _script().Load(url, model, CLIENTS, timeout=60.0).start()
    stop, ready_seen = threading.Event(), []
    poller = threading.Thread(target=_readiness, args=(url, model, stop, ready_seen), daemon=True)
    poller.start()
    try:
        time.sleep(2.0)
        before = load.count()
        t_kill = time.perf_counter()
        os.kill(victim.pid, signal.SIGKILL)
        # Serving again: an answer 200 to a request sent after the model was seen not ready.
        deadline = t_kill + RECOVERY_LIMIT_S[model] + 30   # look past the limit, to report the figure
        t_not_ready = t_back = None
        while time.perf_counter() < deadline and t_back is None:
            time.sleep(0.1)
            t_not_ready = t_not_ready or next((t for t, c in list(ready_seen) if t > t_kill and c != 200), None)
            if t_not_ready is not None:
                t_back = next((s.t_done for s in list(load.samples) if s.t_send > t_not_ready and s.status == 200),
                              None)
        time.sleep(3.0)   # more load after the recovery
    finally:
        load.stop()
        stop.set()
        poller.join(10)
    samples = sorted(load.samples, key=lambda s: s.t_send)
    gap = [s for s in samples if s.t_done > t_kill and (t_back is None or s.t_send < t_back)]
    failed_in_gap = [s for s in gap if s.status != 200]
    after = [s for s in samples if t_back is not None and s.t_send >= t_back]
    wrapper_log = (stack_triton.log_dir / "triton.log").read_text(errors="replace")
    triton_log = (stack_triton.log_dir / "triton" / "tritonserver.log").read_text(errors="replace")
    print("\n".join(ln for ln in triton_log.splitlines()[-60:] if model in ln or ln.startswith("E")))
    errors = sorted({s.error[:120] for s in failed_in_gap})
    print(f"\n{model}: {before} requests before the kill; not ready {'%.2f s' % (t_not_ready - t_kill) if t_not_ready else 'never'} "
          f"after it; serving again {'%.2f s' % (t_back - t_kill) if t_back else 'never'} after it "
          f"(limit {RECOVERY_LIMIT_S[model]:.0f} s); {len(failed_in_gap)} of {len(gap)} requests in the gap failed "
          f"{errors}; {len(after)} requests after the recovery, "
          f"{sum(s.status != 200 for s in after)} failed")
    assert t_not_ready is not None, f"{model} never answered not ready after its stub was killed"
    assert t_back is not None and t_back - t_kill <= RECOVERY_LIMIT_S[model], (
        f"{model} not serving again within {RECOVERY_LIMIT_S[model]} s of the kill:\n{wrapper_log[-2000:]}")
    assert len(after) > 5, "the load did not run after the recovery"
    assert all(s.status == 200 for s in after), [s for s in after if s.status != 200][:3]
    assert f"{model}: stub {victim.instance} (pid {victim.pid}) died" in wrapper_log, wrapper_log[-2000:]
    assert f"{model}: ready again after" in wrapper_log, wrapper_log[-2000:]
    # Triton reaps the dead stub when the unloaded instance finishes, which
    # waits on the dead stub first: 27-30 s after the unload, measured here.
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < ZOMBIE_LIMIT_S and _zombies(server):
        time.sleep(0.5)
    print(f"{model}: zombies gone {time.perf_counter() - t_kill:.1f} s after the kill")
    assert not _zombies(server), f"zombie children of tritonserver left: {_zombies(server)}"
    assert len([s for s in stub_processes(server.pid) if s.model == model]) == len(stubs)
