"""The Flask upload page fuzzed over real HTTP, backed by a real FastAPI ONNX
service: hostile files, hostile file names, malformed multipart bodies.

Properties: no 5xx (the backend is up), every answer one the page documents
(200 result page, 400 not an image / no file, 413 too large), no hang; an
upload is never written to disk, under the name the user chose or any other
(the app runs with its own empty working directory and TMPDIR, which must
stay empty, and no file carrying the probe names appears anywhere it could
have been written).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests
from hypothesis import given, note
from hypothesis import strategies as st

from servelab.core import food11
from servelab.serve import flask_harden

from .fuzzimages import FINDINGS, expected_status, fuzz_settings, hostile_images, valid_images
from .relsupport import REPO, log_has_traceback, sample_bytes, start_fastapi, start_flask

pytestmark = [pytest.mark.filterwarnings("ignore:IM image format is deprecated:DeprecationWarning"), pytest.mark.integration]   # integration: fuzzes the real Flask server

TIMEOUT = 30
PROBE = f"servelab-probe-{uuid.uuid4().hex[:12]}"
CASES = {"uploads": 0, "bodies": 0}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, built_models):
    cwd = tmp_path_factory.mktemp("flask-cwd")
    tmpdir = tmp_path_factory.mktemp("flask-tmp")
    api = start_fastapi("onnx")
    try:
        flask = start_flask(api.url, cwd=cwd, env={"TMPDIR": str(tmpdir), "TMP": str(tmpdir), "TEMP": str(tmpdir)})
    except BaseException:
        api.stop()
        raise
    session = requests.Session()
    try:
        yield {"api": api, "flask": flask, "cwd": cwd, "tmp": tmpdir, "session": session}
    finally:
        session.close()
        alive = flask.alive()
        tail = flask.log_tail(60)
        flask.stop()
        api.stop()
        assert alive, f"Flask died during fuzzing:\n{tail}"


_filenames = st.one_of(
    st.sampled_from([
        f"../../{PROBE}", f"../../../../tmp/{PROBE}", f"/tmp/{PROBE}", f"..\\..\\{PROBE}.jpg",
        f"{PROBE}.jpg", f"./{PROBE}/../../{PROBE}.png", f"%2e%2e%2f{PROBE}", f"{PROBE}\x00.jpg",
        f"~/{PROBE}", f"C:\\Windows\\{PROBE}.png", f"{PROBE}" + "A" * 300, f"{PROBE}.jpg\n.png",
    ]),
    st.builds(lambda t: f"{PROBE}-{t}", st.text(max_size=40)),
)
_content_types = st.sampled_from(["image/jpeg", "image/png", "application/octet-stream", "text/html",
                                  "../../x", "", "image/svg+xml"])


@fuzz_settings(scale=0.4)
@given(data=st.one_of(hostile_images(), valid_images(max_side=48)), filename=_filenames,
       content_type=_content_types)
def test_uploads_get_documented_answers(stack, data, filename, content_type):
    CASES["uploads"] += 1
    note(f"{filename!r} {content_type!r} {len(data)} bytes {data[:16]!r}")
    try:
        r = stack["session"].post(f"{stack['flask'].url}/predict", files={"file": (filename, data, content_type)},
                                  timeout=TIMEOUT)
    except ValueError:
        return  # requests itself refuses some header values (e.g. a newline in the file name)
    assert r.status_code in (200, 400, 413), (r.status_code, r.text[:500])
    if r.status_code == 200:
        assert any(label in r.text for label in food11.LABELS)


_bodies = st.one_of(st.binary(max_size=600),
                    st.builds(lambda b: b"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\n"
                              + b, st.binary(max_size=300)))


@fuzz_settings(scale=0.3)
@given(body=_bodies, content_type=st.sampled_from([None, "multipart/form-data; boundary=x", "multipart/form-data",
                                                   "application/json", "text/plain",
                                                   "application/x-www-form-urlencoded",
                                                   "multipart/form-data; boundary=" + "b" * 200]),
       path=st.sampled_from(["/predict", "/predict", "/", "/test", "/health", "/static/../app.py",
                             "/static/%2e%2e/app.py"]),
       method=st.sampled_from(["POST", "POST", "GET", "PUT"]))
def test_malformed_requests_never_5xx(stack, body, content_type, path, method):
    CASES["bodies"] += 1
    headers = {} if content_type is None else {"Content-Type": content_type}
    r = stack["session"].request(method, f"{stack['flask'].url}{path}", data=body, headers=headers, timeout=TIMEOUT)
    note(f"{method} {path} {content_type!r} → {r.status_code}")
    assert r.status_code < 500, r.text[:500]
    if path.startswith("/static"):
        assert r.status_code in (404, 405)  # no way out of the static folder
        assert "import" not in r.text


@pytest.mark.parametrize("name", list(FINDINGS))
def test_fuzzer_findings_get_4xx_or_a_label(stack, name):
    r = requests.post(f"{stack['flask'].url}/predict", files={"file": ("x.img", FINDINGS[name], "image/png")},
                      timeout=TIMEOUT)
    assert r.status_code == expected_status(FINDINGS[name]), (r.status_code, r.text[:300])


def test_upload_size_limit(stack):
    limit = flask_harden.MAX_UPLOAD_BYTES
    big = b"\xff\xd8" + b"\0" * (limit + 1024)
    r = requests.post(f"{stack['flask'].url}/predict", files={"file": ("big.jpg", big, "image/jpeg")},
                      timeout=TIMEOUT)
    assert r.status_code == 413

    def chunks():  # no Content-Length: Werkzeug must still stop at the limit
        yield b"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.jpg\"\r\n\r\n"
        for _ in range(limit // (1 << 20) + 2):
            yield b"\0" * (1 << 20)
        yield b"\r\n--x--\r\n"

    try:
        r = requests.post(f"{stack['flask'].url}/predict", data=chunks(), timeout=TIMEOUT,
                          headers={"Content-Type": "multipart/form-data; boundary=x"})
        assert r.status_code == 413, r.status_code
    except requests.ConnectionError:
        pass  # the server may close the connection once the limit is passed: also refused
    assert requests.get(f"{stack['flask'].url}/health", timeout=10).status_code == 200


def test_upload_with_traversal_name_writes_nothing(stack):
    """A real image under hostile names: classified, and nothing appears on disk."""
    data = sample_bytes()[0]
    big = data + b"\0" * (3 * 1024 * 1024)  # > Werkzeug's 500 KB spool-to-disk threshold; JPEG ignores the tail
    for name in (f"../../{PROBE}", f"/tmp/{PROBE}", f"../../../etc/{PROBE}", f"{PROBE}.jpg"):
        for payload in (data, big):
            r = requests.post(f"{stack['flask'].url}/predict", files={"file": (name, payload, "image/jpeg")},
                              timeout=TIMEOUT)
            assert r.status_code == 200, (r.status_code, r.text[:300])


def _open_files(pid: int) -> list[str]:
    out = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("/") and not target.startswith(("/dev/", "/proc/")):
            out.append(target)
    return out


def test_upload_is_not_spooled_to_a_file_while_it_arrives(stack):
    """Werkzeug spools multipart files over 500 KB to an (already unlinked)
    temporary file; the lab's app must keep them in memory. Checked from the
    outside while a 3 MB upload is half sent: the Flask process may hold no
    regular file open besides its log."""
    flask = stack["flask"]
    before = set(_open_files(flask.pid))
    half_sent, may_finish = threading.Event(), threading.Event()
    image = sample_bytes()[0]

    def body():
        yield (b"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"../../" + PROBE.encode()
               + b".jpg\"\r\nContent-Type: image/jpeg\r\n\r\n" + image)
        for _ in range(24):
            yield b"\0" * (64 * 1024)  # 1.5 MB after the JPEG (decoders ignore trailing bytes)
        half_sent.set()
        may_finish.wait(10)
        for _ in range(24):
            yield b"\0" * (64 * 1024)
        yield b"\r\n--x--\r\n"

    result = {}

    def send():
        r = requests.post(f"{flask.url}/predict", data=body(), timeout=TIMEOUT,
                          headers={"Content-Type": "multipart/form-data; boundary=x"})
        result["status"] = r.status_code

    th = threading.Thread(target=send)
    th.start()
    try:
        assert half_sent.wait(20)
        time.sleep(0.5)  # let the server read what was sent
        during = set(_open_files(flask.pid)) - before
    finally:
        may_finish.set()
        th.join(TIMEOUT)
    assert not during, f"Flask holds files open while receiving an upload: {during}"
    assert result.get("status") == 200, result


def test_nothing_written_to_disk(stack):
    """Runs after every upload above (module order)."""
    cwd, tmp = Path(stack["cwd"]), Path(stack["tmp"])
    assert list(cwd.iterdir()) == [], f"Flask wrote into its working directory: {list(cwd.iterdir())}"
    assert list(tmp.iterdir()) == [], f"Flask wrote into TMPDIR: {list(tmp.iterdir())}"
    # Wherever a traversal name could resolve to, relative to the app's cwd,
    # the app folder, /tmp, or the repository.
    roots = [cwd, cwd.parent, cwd.parent.parent, Path("/tmp"), REPO / "flask_app", REPO, Path("/etc")]
    hits = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in (".venv", ".git", "node_modules")]
            if dirpath.count(os.sep) - str(root).count(os.sep) > 3:
                dirnames[:] = []
            hits += [os.path.join(dirpath, f) for f in filenames + dirnames if PROBE in f]
    assert not hits, f"upload written under a user-chosen name: {hits}"


def test_flask_healthy_after_fuzzing(stack):
    url = stack["flask"].url
    assert requests.get(f"{url}/health", timeout=10).status_code == 200
    r = requests.get(f"{url}/test", timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["prediction"] in food11.LABELS
    print(f"\nflask fuzz cases: {CASES}")
    for server in (stack["flask"], stack["api"]):
        unhandled = log_has_traceback(server)
        assert not unhandled, f"unhandled errors in {server.name}'s log:\n{unhandled}"
