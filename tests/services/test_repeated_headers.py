"""Repeated framing headers (issue 38, item 1).

The attack: an 11 MB body of ~3.7 million ``{}`` sent with two Content-Type
headers, ``application/json`` and then ``text/plain``. The old body guard
read the last one (text/plain: no JSON-shape count) while FastAPI parsed by
the first, so the whole body was parsed on the event loop; with 4 such
clients an ordinary request took 0.75-1.8 s instead of ~10 ms. Now any
request that repeats Content-Type, Content-Length or Transfer-Encoding is a
400 before its body is read, on both FastAPI services and on the Flask UI's
web server, and the shape count runs on every body whatever its type.

Requests go out over raw sockets: HTTP client libraries merge or refuse
repeated headers, so only a socket really sends both.
"""

from __future__ import annotations

import json
import select
import socket
import statistics
import threading
import time

import pytest
import requests

from .helpers import b64, first_jpeg, start_flask

ATTACK_ITEMS = 3_700_000
ATTACK_BODY = b"[" + b"{}," * (ATTACK_ITEMS - 1) + b"{}]"   # ~11.1 MB, under the 413 limit
ATTACKERS = 4


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _read_answer(s: socket.socket, timeout: float) -> tuple[int, bytes]:
    """Status and body of one HTTP/1.1 answer (the server closes after it)."""
    s.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = [ln.split(b":", 1)[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
            if length and len(body) >= int(length[0]):
                break
    if not data:
        return 0, b""
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def send_raw(port: int, head_lines: list[bytes], body: bytes, wait_before_body: float = 0.2,
             timeout: float = 60.0) -> tuple[int, bytes, bool]:
    """Send a request with exactly these header lines, then ``body``.

    The headers go first; if the server answers within ``wait_before_body``
    the body is never sent. Returns (status, body, body_sent)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(ln + b"\r\n" for ln in head_lines)
                  + b"Connection: close\r\n\r\n")
        answered, _, _ = select.select([s], [], [], wait_before_body)
        body_sent = False
        if not answered:
            try:
                s.sendall(body)
                body_sent = True
            except (BrokenPipeError, ConnectionResetError):
                pass
        status, answer = _read_answer(s, timeout)
        return status, answer, body_sent
    finally:
        s.close()


def attack(port: int) -> tuple[int, bytes, bool]:
    return send_raw(port, [b"Content-Type: application/json", b"Content-Type: text/plain",
                           b"Content-Length: %d" % len(ATTACK_BODY)], ATTACK_BODY)


# --------------------------------------------------------------------------
# Each repeated header is refused, body unread
# --------------------------------------------------------------------------

REPEATS = {
    "Content-Type": [b"Content-Type: application/json", b"Content-Type: text/plain", b"Content-Length: 20"],
    "Content-Length": [b"Content-Type: application/json", b"Content-Length: 20", b"Content-Length: 20"],
    "Transfer-Encoding": [b"Content-Type: application/json", b"Transfer-Encoding: chunked",
                          b"Transfer-Encoding: chunked"],
}


@pytest.mark.parametrize("header", list(REPEATS))
def test_fastapi_refuses_repeated_framing_header(fastapi_server, header):
    status, body, body_sent = send_raw(_port(fastapi_server.url), REPEATS[header], b'{"image": "AAAA"}\r\n',
                                       wait_before_body=2.0)
    assert status == 400, (header, status, body[:300])
    assert not body_sent, "the server waited for the body before refusing"
    if header == "Content-Type":   # uvicorn's parser refuses the other two itself (its plain 400)
        answer = json.loads(body)
        assert answer["error"] == "repeated_header" and header in answer["message"], answer
    r = requests.post(f"{fastapi_server.url}/predict", json={"image": b64(first_jpeg())}, timeout=60)
    assert r.status_code == 200, r.text[:300]


@pytest.mark.parametrize("header", list(REPEATS))
def test_body_guard_refuses_each_repeat_itself(header):
    """The middleware's own rule, for a server that would pass any of the three on."""
    import asyncio

    from servelab.serve.serving_contract import BodySizeLimit

    called, sent = [], []

    async def app(scope, receive, send):
        called.append(1)

    async def receive():
        raise AssertionError("the body was read")

    async def send(message):
        sent.append(message)

    headers = [tuple(part.strip().lower() for part in ln.split(b":", 1)) for ln in REPEATS[header]]
    asyncio.run(BodySizeLimit(app)({"type": "http", "method": "POST", "path": "/predict", "headers": headers},
                                   receive, send))
    assert not called and sent[0]["status"] == 400
    assert json.loads(sent[1]["body"]) == {
        "error": "repeated_header", "message": f"The request repeats the {header} header; send each of these "
                                              "headers once."}


def test_fastapi_refuses_the_attack_before_reading_it(fastapi_server):
    status, body, body_sent = attack(_port(fastapi_server.url))
    assert status == 400 and not body_sent, (status, body[:300], body_sent)
    assert json.loads(body)["error"] == "repeated_header"


@pytest.mark.parametrize("content_type,status", [(b"application/json", 422), (b"text/plain", 415),
                                                  (b"multipart/form-data; boundary=x", 415)])
def test_shape_count_runs_whatever_the_declared_type(content_type, status):
    """The costly body is stopped at its first chunk whatever type it
    declares: 422 as JSON, 415 (not the JSON the endpoint takes) otherwise."""
    import asyncio

    from servelab.serve.serving_contract import BodySizeLimit

    chunks = [ATTACK_BODY[i:i + 65536] for i in range(0, len(ATTACK_BODY), 65536)]
    read = []

    async def receive():
        read.append(1)
        return {"type": "http.request", "body": chunks[len(read) - 1], "more_body": len(read) < len(chunks)}

    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        raise AssertionError("the whole body reached the app")

    async def send(message):
        pass

    with pytest.raises(Exception) as caught:
        asyncio.run(BodySizeLimit(app)({"type": "http", "headers": [(b"content-type", content_type)]}, receive, send))
    assert getattr(caught.value, "status_code", None) == status and len(read) == 1, (caught.value, len(read))


def test_costly_body_declared_as_text_is_refused(fastapi_server):
    status, body, _ = send_raw(_port(fastapi_server.url),
                               [b"Content-Type: text/plain", b"Content-Length: %d" % len(ATTACK_BODY)],
                               ATTACK_BODY, wait_before_body=0.0)
    assert status == 415, (status, body[:300])
    assert json.loads(body)["error"] == "unsupported_media_type"


@pytest.fixture(scope="module")
def flask_gunicorn(onnx_server, service_logs):
    """The Flask UI under its web server (servelab.serve.webserver), on loopback."""
    import os
    import shutil
    import sys

    exe = shutil.which("gunicorn", path=os.path.dirname(sys.executable))
    server = start_flask(service_logs, {"INFERENCE_BACKEND": "fastapi", "FASTAPI_SERVER_URL": onnx_server.url},
                         cmd=lambda port: [exe, "--config", "python:servelab.serve.webserver", "servelab.serve.harden:flask_app"],
                         name="flask_gunicorn", ready="/health")
    try:
        yield server
    finally:
        server.stop()


FLASK_REPEATS = {
    "Content-Type": [b"Content-Type: multipart/form-data; boundary=a", b"Content-Type: text/plain",
                     b"Content-Length: 20"],
    "Content-Length": [b"Content-Type: text/plain", b"Content-Length: 20", b"Content-Length: 20"],
    "Transfer-Encoding": [b"Content-Type: text/plain", b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip"],
}


@pytest.mark.parametrize("header", list(FLASK_REPEATS))
def test_flask_refuses_repeated_framing_header(flask_gunicorn, header):
    status, body, body_sent = send_raw(_port(flask_gunicorn.url), FLASK_REPEATS[header], b"x" * 20,
                                       wait_before_body=2.0)
    assert status == 400 and not body_sent, (header, status, body[:300], body_sent)
    if header == "Content-Type":   # gunicorn refuses the other two itself (its own 400 page)
        assert b"repeats the Content-Type header" in body, body[:300]
    r = requests.post(f"{flask_gunicorn.url}/predict", files={"file": ("food.jpg", first_jpeg(), "image/jpeg")},
                      timeout=60)
    assert r.status_code == 200, r.text[:300]


# --------------------------------------------------------------------------
# The attack beside an ordinary client
# --------------------------------------------------------------------------

SAMPLES = 15


def _ordinary_median(url: str, payload: dict) -> float:
    times = []
    for _ in range(SAMPLES):
        t0 = time.perf_counter()
        r = requests.post(f"{url}/predict", json=payload, timeout=60)
        times.append(time.perf_counter() - t0)
        assert r.status_code == 200, r.text[:300]
    return statistics.median(times)


def _attackers(port: int, stop: threading.Event, answers: list) -> list[threading.Thread]:
    def loop():
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                answers.append(attack(port)[0])
            except OSError as err:
                answers.append(repr(err))
            stop.wait(max(0.0, 0.1 - (time.monotonic() - t0)))   # at most 10 attacks a second each

    return [threading.Thread(target=loop, daemon=True) for _ in range(ATTACKERS)]


@pytest.mark.quiet  # it compares latencies measured in this test: another test beside it moves them
def test_attack_leaves_ordinary_latency_within_2x_of_idle(fastapi_server):
    """4 clients repeat the attack; an ordinary client's median latency
    stays within 2x of its idle median, measured before and after in the
    same test. An attempt over 2x counts against the server only if its two
    idle medians agree within 1.5x; two such attempts fail the test (the old
    code: 38-46x). At most 3 attempts; none within 2x and fewer than two
    steady ones over it: inconclusive (this busy machine moved the baseline)."""
    payload = {"image": b64(first_jpeg())}
    url = fastapi_server.url
    _ordinary_median(url, payload)   # warm-up
    attempts, strikes = [], 0
    for _ in range(3):
        idle_before = _ordinary_median(url, payload)
        stop, answers = threading.Event(), []
        threads = _attackers(_port(url), stop, answers)
        for t in threads:
            t.start()
        try:
            time.sleep(0.5)
            loaded = _ordinary_median(url, payload)
        finally:
            stop.set()
            for t in threads:
                t.join(120)
        idle_after = _ordinary_median(url, payload)
        idle = max(idle_before, idle_after)
        steady = max(idle_before, idle_after) <= 1.5 * min(idle_before, idle_after)
        line = (f"idle {idle_before * 1000:.1f}/{idle_after * 1000:.1f} ms, beside the attack "
                f"{loaded * 1000:.1f} ms ({loaded / idle:.2f}x), {len(answers)} attacks answered "
                f"{sorted(set(map(str, answers)))}")
        print(f"\n{fastapi_server.name}: {line}")
        attempts.append(line)
        if loaded > 2 * idle:
            strikes += steady
            if strikes == 2:   # twice, with a steady baseline: the attack slows other users
                pytest.fail("an ordinary request slowed beside the attack: " + " | ".join(attempts))
            continue
        assert answers and all(a == 400 for a in answers), line
        return
    pytest.skip("inconclusive: the idle baseline itself moved by more than 1.5x in the attempts that "
                "were over 2x (a busy machine): " + " | ".join(attempts))
