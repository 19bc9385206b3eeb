"""Kit machinery around the FastAPI lesson services (fastapi_pt/, fastapi_onnx/) and the benchmarks
that time their models.

The lesson files hold their own mechanism (model, device, thread rule: issue 47). What serves the
kit lives here and in ``servelab.serve.harden``, which adds it from outside the files:

* the device the benchmarks run a model on (``SERVELAB_DEVICE=cpu|cuda``, unset = auto), logged;
* how many CPU threads this process may really use (affinity, cgroup quota);
* a model file that is missing, said in one line;
* Swagger UI and ReDoc served by the app itself (offline).

The request contract, the body-size middleware and the error handlers live in
``servelab.serve.serving_contract`` (harden.py installs them); this module re-exports its limits.

torch and onnxruntime are imported lazily.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from servelab.core import procs
from servelab.serve.serving_contract import (  # noqa: F401 (re-exported: the tests read the limits as serving.<name>)
    BASE64_PATTERN,
    MAX_BASE64_CHARS,
    MAX_BODY_BYTES,
)

log = logging.getLogger("servelab")
if not log.handlers:
    # uvicorn configures only its own loggers; give ours a plain handler so the
    # device choice and thread sizing show up in the server log.
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("%(levelname)s:     [servelab] %(message)s"))
    log.addHandler(_handler)
    log.setLevel(logging.INFO)
    log.propagate = False


# --------------------------------------------------------------------------
# Threads and devices
# --------------------------------------------------------------------------

def cpu_threads() -> int:
    """CPU cores this process may use: ``servelab.core.procs.cpu_cores`` (the kit's
    one count: ``SERVELAB_THREADS``, affinity mask, cgroup CPU quota)."""
    return procs.cpu_cores()


def requested_device() -> str:
    """``SERVELAB_DEVICE``: 'cpu', 'cuda' or 'auto' (unset or empty)."""
    value = os.environ.get("SERVELAB_DEVICE", "").strip().lower() or "auto"
    if value not in ("auto", "cpu", "cuda"):
        raise ValueError(f"SERVELAB_DEVICE must be 'cpu', 'cuda' or unset (auto), got {value!r}")
    return value


def _choose(requested: str, cuda_available: bool, what: str) -> str:
    if requested == "cpu":
        device = "cpu"
        why = "SERVELAB_DEVICE=cpu"
    elif cuda_available:
        device = "cuda"
        why = "SERVELAB_DEVICE=cuda" if requested == "cuda" else f"auto: {what} sees a CUDA device"
    else:
        device = "cpu"
        if requested == "cuda":
            log.warning("SERVELAB_DEVICE=cuda but %s sees no CUDA device: falling back to CPU", what)
            why = "SERVELAB_DEVICE=cuda requested, none available"
        else:
            why = f"auto: {what} sees no CUDA device"
    log.info("device: %s (%s)", device, why)
    return device


def torch_device() -> str:
    """'cuda' or 'cpu' for PyTorch, honouring ``SERVELAB_DEVICE``; logged."""
    requested = requested_device()
    import torch

    available = requested != "cpu" and torch.cuda.is_available()
    return _choose(requested, available, "PyTorch")


def onnx_providers() -> list[str]:
    """ONNX Runtime execution providers, honouring ``SERVELAB_DEVICE``; logged.
    With CUDA the CPU provider stays as the fallback for unsupported nodes."""
    requested = requested_device()
    import onnxruntime as ort

    available = requested != "cpu" and "CUDAExecutionProvider" in ort.get_available_providers()
    device = _choose(requested, available, "ONNX Runtime")
    if device == "cuda":
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


# --------------------------------------------------------------------------
# What is loaded
# --------------------------------------------------------------------------

def require_model_file(path: str | os.PathLike) -> Path:
    """Fail at start-up with a hint, rather than with a pickle traceback."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(
            f"Model file not found: {path}\n"
            "Build it with `make models` (or `python -m servelab models build`), "
            "or point MODEL_PATH at an existing file."
        )
    return path


# --------------------------------------------------------------------------
# API docs (/docs, /redoc) served by the app itself, offline
# --------------------------------------------------------------------------

DOCS_STATIC_PATH = "/docs-static"


def docs_assets_dir() -> Path:
    """Swagger UI and ReDoc's JavaScript/CSS, as shipped by the pinned
    ``fastapi-offline`` package (its ``static/`` folder). Only its files are
    used; the pages themselves come from FastAPI's own helpers."""
    import fastapi_offline

    return Path(fastapi_offline.__file__).resolve().parent / "static"


def install_offline_docs(app) -> None:
    """Serve Swagger UI at ``/docs`` and ReDoc at ``/redoc`` from this app.

    FastAPI's default pages load their JavaScript from a CDN, so on a node or
    laptop without that network they are blank. This is FastAPI's documented
    self-hosting recipe ("Custom Docs UI Static Assets"): create the app with
    ``docs_url=None, redoc_url=None``, mount the assets, add the two pages."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
    from fastapi.staticfiles import StaticFiles

    if app.docs_url or app.redoc_url:
        raise ValueError("create the app with FastAPI(..., docs_url=None, redoc_url=None): "
                         "install_offline_docs serves /docs and /redoc itself")
    assets = docs_assets_dir()
    # The pages may load only from this app: ReDoc's sidebar would otherwise
    # fetch its vendor's logo from the network (cosmetic; blocked here).
    csp = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                      "script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
                                      "worker-src 'self' blob:; connect-src 'self'"}
    app.mount(DOCS_STATIC_PATH, StaticFiles(directory=assets), name="docs-static")
    favicon = f"{DOCS_STATIC_PATH}/favicon.png"
    redirect_url = "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui_html():
        page = get_swagger_ui_html(
            openapi_url=app.openapi_url, title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=redirect_url,
            swagger_js_url=f"{DOCS_STATIC_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_STATIC_PATH}/swagger-ui.css",
            swagger_favicon_url=favicon,
        )
        page.headers.update(csp)
        return page

    @app.get(redirect_url, include_in_schema=False)
    def swagger_ui_redirect():
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc_html():
        page = get_redoc_html(
            openapi_url=app.openapi_url, title=f"{app.title} - ReDoc",
            redoc_js_url=f"{DOCS_STATIC_PATH}/redoc.standalone.js",
            redoc_favicon_url=favicon, with_google_fonts=False,
        )
        page.headers.update(csp)
        return page
