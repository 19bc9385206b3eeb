"""Inputs and servers shared by the service tests (imported by conftest.py
and the test modules)."""

from __future__ import annotations

import base64
import functools
import io
import struct
import sys
import zlib
from pathlib import Path

import requests
from PIL import Image

from servelab.core import food11, paths, procs

REPO = paths.REPO_ROOT


def start_fastapi(folder: str, log_dir: Path, env: dict | None = None) -> procs.Server:
    """``folder``'s app.py as the kit starts it (``uvicorn servelab.serve.harden:<folder>``) on a free
    port; waits for /health."""
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    server = procs.start(
        folder,
        [sys.executable, "-m", "uvicorn", f"servelab.serve.harden:{folder}", "--host", "127.0.0.1", "--port", str(port)],
        url,
        log_path=log_dir / f"{folder}-{port}.log",
        env={"PYTHONPATH": str(REPO), **(env or {})},
        cwd=REPO / folder,
    )
    try:
        procs.wait_http_ok(f"{url}/health", timeout=120, server=server)
    except BaseException:
        server.stop()
        raise
    return server


def start_flask(log_dir: Path, env: dict, cmd=None, name: str = "flask_app", ready: str = "/") -> procs.Server:
    """The Flask UI in flask_app/ on a free loopback port; waits until ``ready`` answers.
    ``cmd(port)`` gives its command line (default: the kit's, gunicorn with servelab.serve.webserver
    and the lesson app hardened)."""
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    server = procs.start(
        name,
        cmd(port) if cmd else [sys.executable, "-m", "gunicorn", "--config", "python:servelab.serve.webserver",
                               "servelab.serve.harden:flask_app"],
        url,
        log_path=log_dir / f"{name}-{port}.log",
        env={"PYTHONPATH": str(REPO), "HOST": "127.0.0.1", "PORT": str(port), **env},
        cwd=REPO / "flask_app",
    )
    try:
        procs.wait_http_ok(f"{url}{ready}", timeout=60, server=server)
    except BaseException:
        server.stop()
        raise
    return server


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------

def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def sample_bytes(name: str | None = None) -> bytes:
    images = paths.sample_images()
    if name is None:
        return images[0].read_bytes()
    return next(p for p in images if p.name == name).read_bytes()


def first_jpeg() -> bytes:
    return next(p for p in paths.sample_images() if p.suffix.lower() in (".jpg", ".jpeg")).read_bytes()


def truncated_jpeg() -> bytes:
    data = first_jpeg()
    return data[: len(data) // 2]


def truncated_jpeg_with_end() -> bytes:
    """A JPEG cut short and given its end marker back (issue 48: classified "Bread" before)."""
    return sample_bytes("rice_plate.jpg")[:1000] + b"\xff\xd9"


@functools.lru_cache(maxsize=None)
def scan_bomb_jpeg(repeats: int = 200, size: tuple[int, int] = (6000, 6600)) -> bytes:
    """A progressive-JPEG scan bomb (issue 48): a flat grey picture of ``size`` (~40 megapixels,
    under the pixel limit) whose last scan (~60 bytes) is repeated ``repeats`` times before the end
    marker. libjpeg decodes every scan over all 618,750 blocks: ~44 ms of CPU per repeat here, so
    the issue's 2,000 cost 88 s; 200 keep a decode on code without the check to seconds."""
    buf = io.BytesIO()
    Image.new("L", size, 128).save(buf, "JPEG", progressive=True)
    data = buf.getvalue()
    last_scan, end = data.rindex(b"\xff\xda"), data.rindex(b"\xff\xd9")
    return data[:end] + data[last_scan:end] * repeats + data[end:]


def png_declaring(width: int, height: int) -> bytes:
    """A small PNG whose header declares ``width`` x ``height`` pixels (a
    decompression bomb as far as the header is concerned)."""
    buf = io.BytesIO()
    Image.new("L", (8, 8)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    # IHDR chunk: 8-byte signature, 4-byte length, b"IHDR", width, height, ...
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[12:29])) & 0xFFFFFFFF
    data[29:33] = struct.pack(">I", crc)
    return bytes(data)


def bomb_png() -> bytes:
    side = int((food11.MAX_IMAGE_PIXELS * 4) ** 0.5)
    return png_declaring(side, side)


def post_good(url: str, timeout: float = 60) -> requests.Response:
    r = requests.post(f"{url}/predict", json={"image": b64(first_jpeg())}, timeout=timeout)
    assert r.status_code == 200, r.text
    assert r.json()["prediction"] in food11.LABELS
    return r
