"""Helpers for the reliability tests: start the lab's servers on free
loopback ports, look at the sockets and processes they own, sample memory.

Everything started here is stopped by the caller (fixtures use ``finally``).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path

import psutil
import requests

from servelab.core import paths, procs

REPO = paths.REPO_ROOT
LOG_DIR = Path(os.environ.get("SERVELAB_TEST_LOGS", "/tmp")) / f"servelab-reliability-{os.getpid()}"

APP_DIRS = {"pt": REPO / "fastapi_pt", "onnx": REPO / "fastapi_onnx"}


def sample_bytes() -> list[bytes]:
    return [p.read_bytes() for p in paths.sample_images()]


def predict_body(data: bytes) -> dict:
    return {"image": base64.b64encode(data).decode("ascii")}


# --------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------

def start_fastapi(kind: str, port: int | None = None, env: dict | None = None,
                  host: str = "127.0.0.1", extra_args: list[str] | None = None,
                  timeout: float = 120.0) -> procs.Server:
    """One FastAPI lesson service under uvicorn (the way the kit runs it: servelab.serve.harden)."""
    port = port or procs.free_port()
    cmd = [sys.executable, "-m", "uvicorn", f"servelab.serve.harden:{APP_DIRS[kind].name}",
           "--host", host, "--port", str(port), "--no-access-log", *(extra_args or [])]
    log = LOG_DIR / f"fastapi_{kind}_{port}.log"
    server = procs.start(f"fastapi_{kind}", cmd, f"http://{host}:{port}", log_path=log,
                         env={"SERVELAB_DEVICE": "cpu", **(env or {})}, cwd=str(REPO))
    try:
        procs.wait_http_ok(f"{server.url}/health", timeout=timeout, server=server)
    except BaseException:
        server.stop()
        raise
    return server


def start_flask(backend_url: str, port: int | None = None, env: dict | None = None,
                cwd: str | os.PathLike | None = None, timeout: float = 60.0) -> procs.Server:
    """flask_app/app.py as the kit serves it (gunicorn, servelab.serve.webserver, hardened), backend fastapi."""
    port = port or procs.free_port()
    log = LOG_DIR / f"flask_{port}.log"
    server = procs.start(
        "flask", [sys.executable, "-m", "gunicorn", "--config", "python:servelab.serve.webserver",
                  "servelab.serve.harden:flask_app"], f"http://127.0.0.1:{port}",
        log_path=log, cwd=str(cwd or REPO / "flask_app"),
        env={"HOST": "127.0.0.1", "PORT": str(port), "INFERENCE_BACKEND": "fastapi", "FASTAPI_SERVER_URL": backend_url,
             "PYTHONPATH": str(REPO), **(env or {})},
    )
    try:
        procs.wait_http_ok(f"{server.url}/health", timeout=timeout, server=server)
    except BaseException:
        server.stop()
        raise
    return server


def log_has_traceback(server: procs.Server) -> str:
    """Lines of a server log that show an unhandled error ('' if none)."""
    text = server.log_path.read_text(errors="replace") if server.log_path and server.log_path.exists() else ""
    bad = [ln for ln in text.splitlines() if "Traceback" in ln or "Exception in ASGI" in ln
           or "internal_error" in ln or " 500 " in ln]
    return "\n".join(bad[:20])


# --------------------------------------------------------------------------
# Processes and sockets
# --------------------------------------------------------------------------

def tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants (those still alive)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss(pid: int) -> int:
    total = 0
    for p in tree(pid):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def listening(pids) -> list[tuple[int, str, int]]:
    """(pid, ip, port) of every TCP socket in LISTEN state owned by ``pids``."""
    pids = set(pids)
    out = []
    for c in psutil.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            out.append((c.pid, c.laddr.ip, c.laddr.port))
    return sorted(set(out))


def is_loopback(ip: str) -> bool:
    import ipaddress

    addr = ipaddress.ip_address(ip.split("%")[0])
    if getattr(addr, "ipv4_mapped", None) is not None:   # ::ffff:127.0.0.1
        addr = addr.ipv4_mapped
    return addr.is_loopback


def non_loopback(sockets) -> list[tuple[int, str, int]]:
    """Listening sockets reachable from another machine (0.0.0.0, ::, a NIC address)."""
    return [s for s in sockets if not is_loopback(s[1])]


def procs_named(fragment: str) -> list[psutil.Process]:
    """Live processes whose command line contains ``fragment``."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if fragment in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_gone(pids, timeout: float = 15.0) -> list[int]:
    """PIDs still alive (not zombie) after ``timeout``."""
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if _alive(p)]
        if left:
            time.sleep(0.1)
    return left


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def good_predict(url: str, data: bytes | None = None, timeout: float = 30.0) -> dict:
    data = data or sample_bytes()[0]
    r = requests.post(f"{url}/predict", json=predict_body(data), timeout=timeout)
    assert r.status_code == 200, (r.status_code, r.text[:300])
    body = r.json()
    assert "prediction" in body and 0.0 <= body["probability"] <= 1.0
    return body


def dump(obj) -> str:
    return json.dumps(obj, indent=1, default=str)
