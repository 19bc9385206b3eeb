"""A tiny keep-alive HTTP/1.1 server of our own, for unit-level checks of the
load generator (status codes, chunked bodies, closed connections, a slow
single-file server for queueing). Real services are tested in
test_fastapi_e2e.py and test_triton_e2e.py."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.tiers import tier


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True  # headers and body go in two writes
    slow_lock = threading.Lock()
    counts: dict = {}

    def log_message(self, *a):  # quiet
        pass

    def _send(self, status: int, body: bytes, extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _route(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        key = url.path
        _Handler.counts[key] = _Handler.counts.get(key, 0) + 1
        if url.path == "/ok":
            self._send(200, b'{"ok": true}')
        elif url.path.startswith("/status/"):
            self._send(int(url.path.rsplit("/", 1)[1]), b'{"detail": "as asked"}')
        elif url.path == "/mixed":  # every 4th request fails with 503
            c = _Handler.counts[key]
            self._send(503 if c % 4 == 0 else 200, b"{}")
        elif url.path == "/echo":
            self._send(200, body)
        elif url.path == "/predict":  # the FastAPI contract, for FastAPITarget checks
            ok = body.startswith(b'{"image": "')
            self._send(200 if ok else 422, b'{"prediction": "Bread", "probability": 0.5}' if ok else b"{}")
        elif url.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"hello ", b"chunked ", b"world"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        elif url.path == "/close":
            self._send(200, b"bye", {"Connection": "close"})
            self.close_connection = True
        elif url.path == "/slow":  # one request at a time, ms each: a 1-server queue
            ms = float(q.get("ms", ["20"])[0])
            with _Handler.slow_lock:
                time.sleep(ms / 1000)
            self._send(200, b"{}")
        elif url.path == "/hang":
            time.sleep(float(q.get("s", ["2"])[0]))
            self._send(200, b"{}")
        else:
            self._send(404, b'{"detail": "not found"}')

    do_GET = _route
    do_POST = _route


@pytest.fixture(scope="module")
@tier("integration")
def tiny_server():
    """URL of a threaded keep-alive server on a free loopback port."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
