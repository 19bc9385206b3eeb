"""A minimal HTTP/1.1 keep-alive client on asyncio, built for load generation.

Why not aiohttp or httpx: at the request rates the kit needs (thousands per
second on a 2-core laptop, sharing the CPU with the server under test) their
per-request bookkeeping costs more CPU than the server we measure. This client
keeps one socket per concurrent request, sends pre-encoded request bytes and
parses only the status line, headers and a ``Content-Length`` or chunked body.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit


class HTTPError(Exception):
    """Transport-level failure (connection refused/reset, bad response)."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


def split_url(url: str) -> tuple[str, int, str]:
    """(host, port, base path) of ``http://host:port/base`` or ``host:port``."""
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"only plain http:// is supported by the load generator, got {url!r}")
    if not parts.hostname:
        raise ValueError(f"no host in URL {url!r}")
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


def build_request(method: str, host: str, port: int, path: str, body: bytes = b"",
                  headers: dict[str, str] | None = None) -> bytes:
    """Encode one HTTP/1.1 request (kept alive) as bytes, ready to send."""
    lines = [f"{method} {path or '/'} HTTP/1.1", f"Host: {host}:{port}", "Connection: keep-alive"]
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Protocol(asyncio.Protocol):
    """Parses responses as bytes arrive; one request outstanding at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future | None = None
        self.closed = False
        self._head: tuple[int, dict[str, str], int] | None = None  # status, headers, body start

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(HTTPError("connection closed", str(exc or "by server")))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is None or self.waiter.done():
            return
        try:
            resp = self._parse()
        except HTTPError as e:
            self.waiter.set_exception(e)
            return
        if resp is not None:
            self.waiter.set_result(resp)

    def _parse(self) -> Response | None:
        buf = self.buf
        if self._head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > 65536:
                    raise HTTPError("bad response", "header too long")
                return None
            head = bytes(buf[:end]).decode("latin-1").split("\r\n")
            try:
                status = int(head[0].split(" ", 2)[1])
            except (IndexError, ValueError):
                raise HTTPError("bad response", f"status line {head[0]!r}") from None
            headers = {}
            for line in head[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            self._head = (status, headers, end + 4)
        status, headers, start = self._head
        if "content-length" in headers:
            n = int(headers["content-length"])
            if len(buf) - start < n:
                return None
            body = bytes(buf[start:start + n])
            del buf[:start + n]
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parsed = _parse_chunked(buf, start)
            if parsed is None:
                return None
            body, consumed = parsed
            del buf[:consumed]
        elif status in (204, 304) or 100 <= status < 200:
            body = b""
            del buf[:start]
        else:  # body runs until the server closes: not keep-alive friendly
            raise HTTPError("bad response", "no Content-Length")
        self._head = None
        if headers.get("connection", "").lower() == "close":
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        return Response(status, headers, body)


def _parse_chunked(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    out = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        try:
            size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
        except ValueError:
            raise HTTPError("bad response", "bad chunk size") from None
        pos = eol + 2
        if size == 0:
            end = buf.find(b"\r\n", pos)  # (no trailers expected)
            if end < 0:
                return None
            return bytes(out), end + 2
        if len(buf) < pos + size + 2:
            return None
        out += buf[pos:pos + size]
        pos += size + 2


def _expire(fut: asyncio.Future, timeout: float) -> None:
    if not fut.done():
        fut.set_exception(HTTPError("timeout", f"no response within {timeout:g} s"))


class Connection:
    """One keep-alive connection; ``request()`` reconnects if the server closed it."""

    def __init__(self, host: str, port: int, timeout: float = 30.0):
        self.host, self.port, self.timeout = host, port, timeout
        self._proto: _Protocol | None = None

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, self._proto = await asyncio.wait_for(
                loop.create_connection(_Protocol, self.host, self.port), self.timeout)
        except asyncio.TimeoutError:
            raise HTTPError("timeout", "connect") from None
        except ConnectionRefusedError as e:
            raise HTTPError("connection refused", str(e)) from None
        except OSError as e:
            raise HTTPError("connection error", str(e)) from None

    async def request(self, raw: bytes) -> Response:
        if self._proto is None or self._proto.closed:
            await self.connect()
        proto = self._proto
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        proto.waiter = fut
        # A timer instead of asyncio.wait_for: no extra task per request.
        timer = loop.call_later(self.timeout, _expire, fut, self.timeout)
        proto.transport.write(raw)
        try:
            return await fut
        except HTTPError:
            self.close()  # a late response must not be read as the next one's
            raise
        finally:
            timer.cancel()
            proto.waiter = None

    def close(self) -> None:
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.close()
        self._proto = None


async def get(url: str, timeout: float = 5.0) -> Response:
    """One GET on a fresh connection (for stats and metrics endpoints)."""
    host, port, path = split_url(url)
    conn = Connection(host, port, timeout)
    try:
        return await conn.request(build_request("GET", host, port, path or "/"))
    finally:
        conn.close()
