"""Machinery shared by the lab's FastAPI services (fastapi_pt/, fastapi_onnx/).

The service files stay short so students can read them top to bottom; what
they do not need to read to learn the lesson lives here:

* which device to run on (``SERVELAB_DEVICE=cpu|cuda``, unset = auto), logged;
* how many CPU threads this process may really use (affinity, cgroup quota);
* the size limit on request bodies and the JSON schema of the base64 field;
* JSON error responses: every client mistake becomes a 4xx with a sentence a
  student understands, never a 200 carrying an error and never a 500;
* what model is loaded (name, version, demo or trained weights);
* each service's mechanism behind one call: ``pytorch_service()`` and
  ``onnx_service(path)`` (device, CPU threads per inference, decoding limits,
  ONNX Runtime sessions per thread count, warm-up, the /health fields).

The request contract, the body-size middleware and the error handlers live in
``servelab.serve.serving_contract``; this module re-exports them.

torch and onnxruntime are imported lazily, so the ONNX service never imports
torch and the PyTorch service never imports onnxruntime.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from servelab.core import food11, procs
from servelab.serve.serving_contract import (  # noqa: F401 (re-exported: the services use serving.<name>)
    BASE64_PATTERN,
    ERROR_RESPONSES,
    IMAGE_FIELD_DOC,
    MAX_BASE64_CHARS,
    MAX_BODY_BYTES,
    MAX_JSON_CONTAINERS,
    MAX_JSON_ITEMS,
    BodySizeLimit,
    ServerTiming,
    install_error_handlers,
    server_timing,
)
from servelab.serve.threads import CoreShare, TorchShare

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


def core_share(device: str = "cpu", kind: type[CoreShare] = CoreShare) -> CoreShare:
    """The services' thread rule (``servelab.serve.threads``): at most ``workers``
    inferences at once (one per core on CPU; one on CUDA, where the GPU runs
    one pass at a time anyway; ``SERVELAB_INFERENCE_WORKERS`` overrides), and
    each gets ``cores`` intra-op threads when it is alone, an equal share
    (one each, at full load) when others are in flight. Fixed one-thread
    inferences were 1.3-1.6x slower than the library defaults for a lone
    client; fixed all-core ones thrash under concurrency. ``kind``: the
    ``CoreShare`` class to make (``TorchShare`` for PyTorch)."""
    cores = cpu_threads()
    workers = procs.positive_int_env("SERVELAB_INFERENCE_WORKERS")
    if workers is None:
        workers = 1 if device == "cuda" else cores
    share = kind(cores, workers=min(workers, cores))
    log.info("inference: up to %d at once on %d core(s), device %s; a lone request gets %d thread(s), "
             "concurrent ones %d each", share.workers, cores, device, cores, max(1, cores // share.workers))
    return share


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


def onnx_device(session) -> str:
    """The device an ONNX Runtime session actually runs on."""
    return "cuda" if session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), for ``/health``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "CPU"


def torch_device_name(device: str) -> str:
    """What a PyTorch service runs on, by name: the GPU's as the CUDA driver
    reports it (``torch.cuda.get_device_name``), else the CPU's."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device).index or 0)
    return cpu_name()


def onnx_device_name(session) -> str:
    """What an ONNX Runtime session runs on: the CUDA device it was given, or the CPU's name.
    (ONNX Runtime does not report a GPU's name; the PyTorch service does.)"""
    if onnx_device(session) == "cuda":
        options = session.get_provider_options().get("CUDAExecutionProvider", {})
        return f"CUDA device {options.get('device_id', '0')}"
    return cpu_name()


def onnx_sessions(session_with, providers: list) -> tuple[CoreShare, dict]:
    """The ONNX service's sessions, one per thread count the thread rule can
    hand out: ``session_with(threads, providers)`` makes one. The rule is sized
    for the device the first session actually got (``get_providers()``), not
    the one requested: when the CUDA provider fails to load, ONNX Runtime runs
    on the CPU, and one inference at a time would then idle every other core.
    Returns ``(core_share, {threads: session})``."""
    first = session_with(cpu_threads(), providers)
    got = list(first.get_providers())
    device = onnx_device(first)
    if device == "cpu" and "CUDAExecutionProvider" in providers:
        log.warning("ONNX Runtime did not load the CUDA provider (session providers %s): running on the CPU, "
                    "threads sized for the CPU", got)
    cores = core_share(device)
    sessions = {n: first if n == cores.cores else session_with(n, got) for n in cores.shares}
    return cores, sessions


def onnx_session(path: str | os.PathLike, threads: int, providers: list):
    """One ONNX Runtime session of the model at ``path`` with ``threads`` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads                    # threads inside one inference
    options.inter_op_num_threads = 1                          # no parallel branches to run
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL  # run nodes one after another
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # fuse conv+bn+relu etc.
    return ort.InferenceSession(str(require_model_file(path)), options, providers=providers)


# --------------------------------------------------------------------------
# Each service's mechanism, behind one call
# --------------------------------------------------------------------------

@dataclass
class PyTorchService:
    """What fastapi_pt/app.py runs its model with (made by ``pytorch_service()``)."""
    device: str
    cores: TorchShare
    decode_slots: threading.BoundedSemaphore

    def warm_up(self, run) -> None:
        """Call ``run()`` (one forward pass) once, under ``torch.inference_mode()``,
        in a short-lived thread, as requests run (FastAPI's threadpool): the first
        call allocates memory and picks kernels. One pass in the main thread made
        every later request ~35 % slower here (21 vs 34 req/s sequential; the main
        thread keeps an OpenMP thread team of its own)."""
        import torch

        def once():
            with torch.inference_mode():
                run()

        warm = threading.Thread(target=once)
        warm.start()
        warm.join()

    def decoding(self) -> threading.BoundedSemaphore:
        """Hold this while decoding one image: a photo at the pixel limit is ~120 MB
        once decoded, so at most one decode per core runs at once, whatever the load."""
        return self.decode_slots

    @contextlib.contextmanager
    def inference(self):
        """Wait for a free inference slot, then run on this request's share of the
        cores (every core alone, an equal share beside others), without autograd."""
        import torch

        with self.cores.torch_threads() as n, torch.inference_mode():
            yield n

    def health_fields(self) -> dict:
        return {"device": self.device, "device_name": torch_device_name(self.device),
                "workers": self.cores.workers, "cores": self.cores.cores}


def pytorch_service() -> PyTorchService:
    """The PyTorch service's device (``torch_device``), its thread rule
    (``core_share``: a lone request gets every core; concurrent ones an equal
    share, one core each at full load; at most one pass per core at once, the
    rest queue; one thread each on a machine busy with other programs), one
    inter-op thread (MobileNetV2 is one chain of ops) and the decoding limit.
    Call it before loading the model."""
    import torch

    device = torch_device()
    cores = core_share(device, kind=TorchShare)
    torch.set_num_interop_threads(1)
    return PyTorchService(device, cores, threading.BoundedSemaphore(cpu_threads()))


@dataclass
class OnnxService:
    """What fastapi_onnx/app.py runs its model with (made by ``onnx_service(path)``)."""
    device: str
    cores: CoreShare
    sessions: dict
    decode_slots: threading.BoundedSemaphore

    @property
    def session(self):
        """The session a lone request runs on (every core)."""
        return self.sessions[self.cores.cores]

    def warm_up(self, feeds: dict) -> None:
        """One run per session: the first run allocates memory."""
        for session in self.sessions.values():
            session.run(None, feeds)

    def decoding(self) -> threading.BoundedSemaphore:
        """Hold this while decoding one image (see ``PyTorchService.decoding``)."""
        return self.decode_slots

    @contextlib.contextmanager
    def inference(self):
        """Wait for a free inference slot, then yield the session sized for this
        request's share of the cores."""
        with self.cores.threads() as n:
            yield self.sessions[n]

    def health_fields(self) -> dict:
        session = self.session
        return {"device": self.device, "device_name": onnx_device_name(session),
                "providers": session.get_providers(), "workers": self.cores.workers, "cores": self.cores.cores}


def onnx_service(path: str | os.PathLike) -> OnnxService:
    """The ONNX service's sessions and thread rule. The rule is the PyTorch
    service's (``core_share``): a lone request gets every core, concurrent ones
    an equal share. A session's thread count is fixed when it is created, so
    there is one session per thread count (``onnx_sessions``; the model is 9 MB)
    and each request runs on the one that matches its share; the rule follows
    the device the first session really got (ONNX Runtime falls back to the CPU
    when the CUDA provider fails to load). ONNX Runtime keeps its default wait
    (spin briefly, then sleep). Plus the decoding limit."""
    providers = onnx_providers()
    decode_slots = threading.BoundedSemaphore(cpu_threads())
    cores, sessions = onnx_sessions(lambda n, got: onnx_session(path, n, got), providers)
    return OnnxService(onnx_device(sessions[cores.cores]), cores, sessions, decode_slots)


# --------------------------------------------------------------------------
# What is loaded
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: Path
    version: str
    weights_kind: str

    @property
    def note(self) -> str:
        if self.weights_kind == "demo":
            return food11.DEMO_WEIGHTS_NOTE
        if self.weights_kind == "trained":
            return "trained Food-11 weights"
        return "weights of unknown origin (no build stamp beside the model file)"

    def response_fields(self) -> dict:
        """What every prediction carries besides label and probability."""
        return {"model": self.name, "model_version": self.version,
                "weights_kind": self.weights_kind, "note": self.note}


def model_info(path: str | os.PathLike, name: str = "food11") -> ModelInfo:
    """Name, version (first 12 hex digits of the file's sha256, as recorded in
    its build stamp) and weights kind of a model artifact."""
    path = Path(path)
    version = None
    try:
        stamp = json.loads(Path(f"{path}.json").read_text(encoding="utf-8"))
        version = str(stamp.get("sha256", ""))[:12] or None
    except (OSError, ValueError, AttributeError):
        pass
    if version is None:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        version = h.hexdigest()[:12]
    return ModelInfo(name=name, path=path, version=version, weights_kind=food11.weights_kind(path))


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
