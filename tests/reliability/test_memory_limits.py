"""Nothing a user uploads can exhaust memory — also when many upload at once.

Each upload is bounded (bytes, pixels), but a server decodes uploads on many
threads at once (FastAPI's threadpool: 40; Flask's dev server: one thread per
request), so what one request may cost times how many may decode together is
what a stranger can make the server hold. A small 16-bit or float image
that declares the maximum pixel count is the cheapest way to ask for a lot.

Run scaled down (the pixel limit set to 2 MP through SERVELAB_MAX_IMAGE_PIXELS,
so the test is quick and gentle on the machine); the budget scales with it.
At the real 40 MP limit the same budget is ~2 GiB of extra server memory.
"""

from __future__ import annotations

import io
import threading
import time

import psutil
import pytest
import requests
from PIL import Image

from .relsupport import predict_body, start_fastapi, start_flask, tree_rss

pytestmark = pytest.mark.integration   # real servers under upload load

PIXELS = 2_000_000
SIDE = int(PIXELS ** 0.5)
CONCURRENT = 16
# Extra server memory allowed while CONCURRENT worst-case uploads are in
# flight: 50 bytes per allowed pixel (= ~2 GiB at the real 40 MP limit), e.g.
# a couple of decodes at a time at 10-20 bytes per pixel.
BUDGET = 50 * PIXELS


def _worst_upload() -> bytes:
    img = Image.new("I;16", (SIDE, SIDE), 1000)   # 16-bit greyscale: the costliest mode to flatten to RGB
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def servers(built_models):
    env = {"SERVELAB_MAX_IMAGE_PIXELS": str(PIXELS)}
    api = start_fastapi("onnx", env=env)
    try:
        flask = start_flask(api.url, env=env)
    except BaseException:
        api.stop()
        raise
    try:
        yield {"fastapi_onnx": api, "flask": flask}
    finally:
        flask.stop()
        api.stop()


def _peak_during(pid: int, fn) -> tuple[int, int, list]:
    base = tree_rss(pid)
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss(pid))
            time.sleep(0.01)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        result = fn()
    finally:
        stop.set()
        th.join()
    return base, peak[0], result


def _concurrently(call, n):
    out = [None] * n

    def one(i):
        out[i] = call()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


@pytest.mark.parametrize("name", ["fastapi_onnx", "flask"])
def test_concurrent_worst_case_uploads_stay_within_budget(servers, name):
    server = servers[name]
    data = _worst_upload()
    if name == "flask":
        def call():
            return requests.post(f"{server.url}/predict", files={"file": ("a.png", data, "image/png")},
                                 timeout=120).status_code
    else:
        body = predict_body(data)

        def call():
            return requests.post(f"{server.url}/predict", json=body, timeout=120).status_code

    assert call() == 200  # warm: first-request allocations are not the point
    base, peak, statuses = _peak_during(server.pid, lambda: _concurrently(call, CONCURRENT))
    extra = peak - base
    print(f"\n{name}: {CONCURRENT} concurrent {len(data) / 1e3:.0f} kB uploads of {PIXELS / 1e6:.0f} MP: "
          f"server RSS +{extra / 2**20:.0f} MiB (budget {BUDGET / 2**20:.0f} MiB; "
          f"{extra / PIXELS:.0f} B per allowed pixel); statuses {sorted(set(statuses))}")
    assert set(statuses) <= {200, 503, 429}, statuses
    assert extra <= BUDGET, (
        f"{name} held {extra / 2**20:.0f} MiB extra for {CONCURRENT} uploads of {len(data)} bytes; "
        f"at the real {40} MP limit that is ~{extra / PIXELS * 40e6 / 2**30:.1f} GiB. Bound how many uploads "
        "decode at once, and what one decode costs (servelab.core.food11._to_rgb).")
    assert psutil.pid_exists(server.pid)


# --------------------------------------------------------------------------
# Memory that comes back (issue 15, item 4): glibc's per-thread arenas keep
# what a burst of decodes freed; every launcher caps them at two.
# --------------------------------------------------------------------------

def test_every_launcher_caps_malloc_arenas(triton, tmp_path, monkeypatch):
    from servelab.core import paths
    from servelab.local import stack

    from .relsupport import tree

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    with stack.running(["fastapi_onnx"], free_ports=True, log_dir=tmp_path) as st:
        pids = [p.pid for p in tree(st.servers["fastapi_onnx"].pid)]
        assert pids and all(psutil.Process(pid).environ().get("MALLOC_ARENA_MAX") == "2" for pid in pids)
    stubs = [s.pid for s in triton.stub_processes()]
    assert stubs
    for pid in [triton.pid, *stubs]:
        assert psutil.Process(pid).environ().get("MALLOC_ARENA_MAX") == "2", f"pid {pid} (Triton or a stub) has no arena cap"
    for rel in ("fastapi_pt/Dockerfile", "fastapi_onnx/Dockerfile", "flask_app/Dockerfile",
                "docker/Dockerfile.triton"):
        text = (paths.REPO_ROOT / rel).read_text()
        assert "MALLOC_ARENA_MAX=2" in text, f"{rel} does not cap malloc arenas"
