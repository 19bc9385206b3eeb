"""flask_app/app.py through Flask's test client, talking to a real FastAPI
ONNX server on loopback (and to nothing, for the backend-down paths)."""

from __future__ import annotations

import io
import re
import sys
import tempfile
import types

import pytest

from servelab.core import food11, paths, procs
from servelab.serve import flask_harden, harden

from .helpers import REPO, bomb_png, first_jpeg, scan_bomb_jpeg, start_flask, truncated_jpeg, truncated_jpeg_with_end


def load_app(monkeypatch, **env):
    """flask_app/app.py afresh with ``env`` (the backend is chosen at import), hardened as the kit
    serves it (servelab.serve.harden:flask_app); ``.app`` is the app, ``.lesson`` the module."""
    for key in ("INFERENCE_BACKEND", "FASTAPI_SERVER_URL", "TRITON_SERVER_URL", "FOOD11_MODEL_NAME"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    app = harden.load("flask_app")
    app.testing = True
    return types.SimpleNamespace(app=app, lesson=sys.modules["app"])


@pytest.fixture()
def client(monkeypatch, onnx_server):
    module = load_app(monkeypatch, INFERENCE_BACKEND="fastapi", FASTAPI_SERVER_URL=onnx_server.url)
    return module.app.test_client()


@pytest.fixture()
def down_client(monkeypatch):
    port = procs.free_port()  # nothing listens here
    module = load_app(monkeypatch, INFERENCE_BACKEND="fastapi", FASTAPI_SERVER_URL=f"http://127.0.0.1:{port}")
    return module.app.test_client()


def upload(client, data: bytes, filename: str = "food.jpg", field: str = "file"):
    return client.post("/predict", data={field: (io.BytesIO(data), filename)}, content_type="multipart/form-data")


def good_upload_works(client):
    r = upload(client, first_jpeg())
    assert r.status_code == 200, r.get_data(as_text=True)[:500]
    html = r.get_data(as_text=True)
    label = re.search(r'<dd id="label">([^<]+)</dd>', html).group(1)
    assert label.replace("&amp;", "&") in food11.LABELS
    return html


def test_page_is_self_contained(client):
    r = client.get("/")
    assert r.status_code == 200
    html = r.get_data(as_text=True)
    assert 'type="file"' in html and 'id="submit"' in html
    # Every script and stylesheet comes from this app (no CDN): no absolute URLs.
    for ref in re.findall(r'(?:src|href)="([^"]+)"', html):
        assert not re.match(r"^(https?:)?//", ref), ref
    assert "default-src 'self'" in r.headers["Content-Security-Policy"]
    for asset in ("/static/style.css", "/static/app.js"):
        assert client.get(asset).status_code == 200


def test_upload_shows_label_probability_backend_latency_and_note(client):
    html = good_upload_works(client)
    prob = float(re.search(r'id="probability" data-value="([^"]+)"', html).group(1))
    latency = float(re.search(r'id="latency" data-value="([^"]+)"', html).group(1))
    assert 0.0 < prob <= 1.0 and latency > 0.0
    assert 'id="answered-by">fastapi' in html
    kind = food11.weights_kind(paths.ONNX_TARGETS[0])
    if kind == "demo":
        assert food11.DEMO_WEIGHTS_NOTE in html
    assert 'id="result-image" src="data:image/jpeg;base64,' in html


@pytest.mark.parametrize("case,data,status", [
    ("not an image", b"this is a text file, not a photo" * 20, 400),
    ("truncated JPEG", None, 400),
    ("empty file", b"", 400),
    ("decompression bomb", None, 413),
    ("truncated JPEG with its end marker", None, 400),  # found by the model server's decoder
    ("progressive JPEG scan bomb", None, 413),          # refused by the page's header check
])
def test_bad_uploads_then_good(client, case, data, status):
    if data is None:
        data = {"truncated JPEG": truncated_jpeg, "decompression bomb": bomb_png,
                "truncated JPEG with its end marker": truncated_jpeg_with_end,
                "progressive JPEG scan bomb": scan_bomb_jpeg}[case]()
    r = upload(client, data)
    assert r.status_code == status, case
    assert 'id="error-message"' in r.get_data(as_text=True)
    good_upload_works(client)


def test_missing_file_field_is_400(client):
    r = client.post("/predict", data={"other": "x"}, content_type="multipart/form-data")
    assert r.status_code == 400
    assert client.post("/predict").status_code == 400
    good_upload_works(client)


def test_body_over_limit_is_413(client):
    r = upload(client, b"\xff" * (flask_harden.MAX_UPLOAD_BYTES + 1024))
    assert r.status_code == 413
    assert "too large" in r.get_data(as_text=True)
    good_upload_works(client)


def test_uploads_never_touch_the_disk(client, monkeypatch):
    """Werkzeug spools uploads over 500 KB to a temporary file; ours stay in memory."""
    def no_disk(*a, **k):
        raise AssertionError("an upload was written to a temporary file")

    import werkzeug.formparser

    for module in (tempfile, werkzeug.formparser):
        for name in ("SpooledTemporaryFile", "TemporaryFile", "NamedTemporaryFile"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, no_disk)
    big_jpeg = max((p for p in paths.sample_images()), key=lambda p: p.stat().st_size).read_bytes()
    padded = big_jpeg + b"\0" * (700 * 1024)  # trailing bytes after the image end are ignored by decoders
    r = upload(client, padded, filename="../../etc/passwd.jpg")
    assert r.status_code == 200, r.get_data(as_text=True)[:300]
    good_upload_works(client)


def test_smoke_route_and_health(client):
    r = client.get("/test")
    assert r.status_code == 200
    body = r.get_json()
    assert body["sample"] == paths.sample_images()[0].name
    assert body["prediction"] in food11.LABELS and 0 < body["probability"] <= 1
    assert body["backend"] == "fastapi" and body["latency_ms"] > 0
    h = client.get("/health")
    assert h.status_code == 200 and h.get_json()["backend"] == "fastapi"


@pytest.mark.integration   # real servers
def test_backend_down_gives_503_not_a_traceback(down_client):
    r = upload(down_client, first_jpeg())
    assert r.status_code == 503
    html = r.get_data(as_text=True)
    assert "not reachable" in html and "Traceback" not in html
    assert down_client.get("/test").status_code == 503
    assert down_client.get("/test").get_json()["error"] == "backend_unavailable"
    assert down_client.get("/health").status_code == 503
    # A bad upload is still a 400, even with the backend down: it is checked first.
    assert upload(down_client, b"not an image at all").status_code == 400


def test_backend_choice_from_env(monkeypatch):
    page = load_app(monkeypatch, INFERENCE_BACKEND="fastapi", FASTAPI_SERVER_URL="http://h:1").lesson
    assert (page.BACKEND, page.FASTAPI_URL) == ("fastapi", "http://h:1")
    page = load_app(monkeypatch, INFERENCE_BACKEND="triton").lesson
    assert (page.TRITON_URL, page.MODEL) == ("127.0.0.1:8000", "food_classifier")
    page = load_app(monkeypatch, INFERENCE_BACKEND="triton_onnx", TRITON_SERVER_URL="triton_server:8000").lesson
    assert (page.TRITON_URL, page.MODEL) == ("triton_server:8000", "food_classifier_onnx")
    assert load_app(monkeypatch, INFERENCE_BACKEND="triton_pipeline").lesson.MODEL == "food_pipeline"
    assert load_app(monkeypatch, INFERENCE_BACKEND="triton_onnx", FOOD11_MODEL_NAME="other").lesson.MODEL == "other"
    with pytest.raises(SystemExit, match="INFERENCE_BACKEND"):
        load_app(monkeypatch, INFERENCE_BACKEND="tensorflow")


@pytest.mark.integration   # real sockets
@pytest.mark.parametrize("backend", ["triton", "triton_onnx", "triton_pipeline"])
def test_triton_down_is_503(monkeypatch, backend):
    port = procs.free_port()   # nothing listens here
    page = load_app(monkeypatch, INFERENCE_BACKEND=backend, TRITON_SERVER_URL=f"127.0.0.1:{port}").app.test_client()
    r = upload(page, first_jpeg())
    assert r.status_code == 503 and "Triton is not reachable" in r.get_data(as_text=True)
    assert page.get("/health").status_code == 503
    assert page.get("/test").get_json()["error"] == "backend_unavailable"
    assert upload(page, b"not an image at all").status_code == 400   # checked first


# --------------------------------------------------------------------------
# The container's web server: slow clients (issue 15, item 3)
# --------------------------------------------------------------------------

def _dockerfile_cmd() -> list[str]:
    import json

    text = (REPO / "flask_app" / "Dockerfile").read_text()
    line = [ln for ln in text.splitlines() if ln.startswith("CMD ")][-1]
    return json.loads(line[4:])


@pytest.fixture(params=["image CMD", "servelab up"])
def container_server(request, onnx_server, tmp_path, monkeypatch):
    """The Flask image's own CMD, run here on loopback (no Docker needed),
    then the local stack's Flask (``servelab up``: the same web server)."""
    import os
    import shutil

    if request.param == "servelab up":
        from servelab.local import stack

        monkeypatch.setenv("FASTAPI_SERVER_URL", onnx_server.url)   # the stack starts only Flask here
        with stack.running(["flask"], free_ports=True, flask_backend="fastapi", log_dir=tmp_path) as st:
            server = st.servers["flask"]
            assert "python:servelab.serve.webserver" in server.proc.args, server.proc.args
            yield server
        return

    cmd = _dockerfile_cmd()
    exe = shutil.which(cmd[0], path=os.path.dirname(sys.executable)) or shutil.which(cmd[0])
    assert exe, f"{cmd[0]} is not installed (pyproject's [serve] extra)"
    # The image binds 0.0.0.0:5000; here the same command binds loopback.
    server = start_flask(tmp_path, {"INFERENCE_BACKEND": "fastapi", "FASTAPI_SERVER_URL": onnx_server.url},
                         cmd=lambda port: [exe] + [a.replace("0.0.0.0:5000", f"127.0.0.1:{port}") for a in cmd[1:]],
                         name="flask_container_cmd", ready="/health")
    try:
        yield server
    finally:
        server.stop()


def _slow_client(port: int, stop, closed_after: list, body: bool = False):
    """A slowloris: a request line, then one header line every 20 s (or full
    headers and a body that never comes). Records when the server hangs up."""
    import socket
    import time

    t0 = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        if body:
            s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                      b"Content-Length: 100000\r\n\r\n--b\r\n")
        else:
            s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n")
        s.settimeout(1.0)
        last = time.monotonic()
        while not stop.is_set():
            try:
                s.recv(65536)  # b"" (hung up) or an error page: either way the server gave up on us
                closed_after.append(time.monotonic() - t0)
                return
            except socket.timeout:
                pass
            if not body and time.monotonic() - last > 20:
                s.sendall(b"X-Slow: 1\r\n")
                last = time.monotonic()
    except OSError:
        closed_after.append(time.monotonic() - t0)
    finally:
        s.close()


def test_container_server_survives_more_slow_clients_than_workers(container_server):
    """More slowloris connections than the server has workers x threads: a
    normal upload is still answered, and the server hangs up on clients that
    never finish their headers or body."""
    import threading
    import time

    import requests

    port = int(container_server.url.rsplit(":", 1)[1])
    stop = threading.Event()
    header_closed, body_closed = [], []
    slow = [threading.Thread(target=_slow_client, args=(port, stop, header_closed), daemon=True) for _ in range(24)]
    slow += [threading.Thread(target=_slow_client, args=(port, stop, body_closed, True), daemon=True)
             for _ in range(8)]
    opened = time.monotonic()
    for t in slow:
        t.start()
    try:
        time.sleep(2.0)  # every slow connection is open and has sent its first bytes
        for _ in range(3):
            t0 = time.monotonic()
            r = requests.post(f"{container_server.url}/predict",
                              files={"file": ("food.jpg", first_jpeg(), "image/jpeg")}, timeout=10)
            took = time.monotonic() - t0
            assert r.status_code == 200, r.text[:300]
            assert re.search(r'<dd id="label">([^<]+)</dd>', r.text)
            print(f"\nupload answered in {took:.2f} s beside {len(slow)} slow connections")
            time.sleep(1.0)
        # the header and body timeouts expire: wait until the server has hung up on every slow
        # client, or until the longest time one may stay open (asserted below) has passed
        while (len(header_closed) < 24 or len(body_closed) < 8) and time.monotonic() - opened < 30:
            time.sleep(0.2)
    finally:
        stop.set()
        for t in slow:
            t.join(45)
    assert len(header_closed) == 24 and max(header_closed) < 15, (
        f"the server kept slow-header clients open: closed after {sorted(header_closed)}")
    assert len(body_closed) == 8 and max(body_closed) < 30, (
        f"the server kept clients that never send their body: closed after {sorted(body_closed)}")


# --------------------------------------------------------------------------
# Issue 15: one decode per upload (item 5), honest limit messages (item 8),
# no internal address on public pages (item 10)
# --------------------------------------------------------------------------

def _count_decodes(monkeypatch) -> list:
    calls = []
    real = food11.load_image

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(food11, "load_image", counting)
    return calls


def test_flask_does_not_decode_what_the_backend_decodes(client, monkeypatch):
    """The FastAPI services and Triton's Python model decode the upload
    themselves: the page only checks the header (format, size, pixels), so a
    costly image is not decoded twice."""
    calls = _count_decodes(monkeypatch)
    good_upload_works(client)
    assert calls == [], "Flask decoded an upload that the FastAPI backend decodes again"
    assert upload(client, b"not an image at all").status_code == 400   # still refused up front
    assert upload(client, bomb_png()).status_code == 413


@pytest.mark.parametrize("kind,decodes", [("triton", 0), ("triton_onnx", 1)])
@pytest.mark.integration   # real servers
def test_triton_backends_decode_once(monkeypatch, kind, decodes):
    port = procs.free_port()  # nothing listens: the call fails after the check
    module = load_app(monkeypatch, INFERENCE_BACKEND=kind, TRITON_SERVER_URL=f"127.0.0.1:{port}")
    calls = _count_decodes(monkeypatch)
    r = upload(module.app.test_client(), first_jpeg())
    assert r.status_code == 503
    assert len(calls) == decodes, f"{kind}: {len(calls)} decode(s) in Flask"


def test_form_limits_say_what_was_too_large(client):
    many = {f"f{i}": "x" for i in range(1200)}
    r = client.post("/predict", data=many, content_type="multipart/form-data")
    assert r.status_code == 413
    html = r.get_data(as_text=True)
    assert "too many parts" in html and "text field" not in html and "The file is too large" not in html
    r = client.post("/predict", data={"note": "x" * 600_000, "file": (io.BytesIO(first_jpeg()), "a.jpg")},
                    content_type="multipart/form-data")
    assert r.status_code == 413
    html = r.get_data(as_text=True)
    assert "text field of the form is too large" in html and "parts" not in html
    assert "The file is too large" not in html
    good_upload_works(client)


def test_public_pages_do_not_show_the_internal_address(client, down_client, onnx_server):
    """/health, /test and the page are public (port 80 on the node); the model
    server's internal URL is for the server log, not for strangers."""
    hidden = onnx_server.url.split("://", 1)[1]           # 127.0.0.1:<port>
    for path in ("/", "/health", "/test"):
        text = client.get(path).get_data(as_text=True)
        assert hidden not in text and onnx_server.url not in text, (path, text[:400])
    text = upload(client, first_jpeg()).get_data(as_text=True)
    assert hidden not in text
    for r in (down_client.get("/health"), down_client.get("/test"), upload(down_client, first_jpeg()),
              down_client.get("/")):
        text = r.get_data(as_text=True)
        assert "127.0.0.1:" not in text, text[:400]


@pytest.mark.parametrize("reported, shown", [("trained", "trained"), ("demo", "demo"), ("unknown", "unknown"),
                                             ("TRAINED!", "unknown"), (None, "unknown")])
def test_the_page_says_trained_only_for_trained_weights(monkeypatch, reported, shown):
    """The page shows the weights kind the model server reports (from its build stamp), and says "trained"
    only when that is "trained"."""
    import requests

    module = load_app(monkeypatch, INFERENCE_BACKEND="fastapi", FASTAPI_SERVER_URL="http://fastapi_server:8000")
    body = {"prediction": "Bread", "probability": 0.9}
    if reported is not None:
        body["weights_kind"] = reported

    class Answer:
        status_code = 200
        text = ""

        def json(self):
            return body

        def raise_for_status(self):
            pass

    monkeypatch.setattr(requests, "post", lambda *a, **k: Answer())   # no server: the backend's answer only
    r = upload(module.app.test_client(), first_jpeg())
    assert r.status_code == 200
    html = r.get_data(as_text=True)
    assert f'<span class="badge {shown}">{shown}</span>' in html
    assert ('class="badge trained"' in html) == ("trained Food-11 weights" in html) == (shown == "trained")
