"""The four model backends the Flask UI (flask_app/app.py) can call.

``INFERENCE_BACKEND`` picks one when the app starts:

* ``fastapi``     POST ``$FASTAPI_SERVER_URL/predict`` with the base64 image
                  (fastapi_pt/ or fastapi_onnx/ answers).
* ``triton``      Triton's Python-backend model ``$FOOD11_MODEL_NAME``
                  (default ``food_classifier``): sends the base64 image as a
                  BYTES tensor ``INPUT_IMAGE``; Triton does pre- and
                  post-processing and returns ``FOOD_LABEL`` and ``PROBABILITY``.
* ``triton_onnx`` Triton's ONNX model (``$FOOD11_MODEL_NAME`` if set, else
                  ``food_classifier_onnx``): preprocessing and softmax run
                  here with servelab.core.food11, Triton only runs the network
                  (FP32 ``input`` [3, 224, 224] → ``output`` [11] logits).
* ``triton_pipeline`` Triton's ensemble ``food_pipeline`` (or
                  ``$FOOD11_MODEL_NAME``): sends the JPEG/PNG bytes as they
                  were uploaded (BYTES ``IMAGE_BYTES``, no base64); Triton
                  decodes, runs the ONNX model and the softmax in its steps.

Every backend answers with a :class:`Result` or raises a
:class:`ClassifyError` carrying the HTTP status the page should get: 400/413
for an upload that is not a usable image, 503 when the backend cannot be
reached, 502 when it answered with an error of its own.

Also here: the in-memory request class (uploads never touch the disk) and the
page's security headers.
"""

from __future__ import annotations

import base64
import io
import logging
import os
import re
import sys
import threading
from dataclasses import asdict, dataclass

import numpy as np
from flask import Request
from PIL import Image

from servelab.core import food11, procs

log = logging.getLogger("servelab.flask")

# How Triton's Python model reports an image it refused: "<code>: <sentence>".
_IMAGE_ERROR = re.compile(r"\b(invalid_base64|not_an_image|truncated_image|image_too_large|invalid_image): (.+)",
                          re.DOTALL)

# Largest upload the page accepts (the form's multipart body), in bytes.
MAX_UPLOAD_BYTES = food11.MAX_IMAGE_BYTES + 64 * 1024

BACKENDS = ("fastapi", "triton", "triton_onnx", "triton_pipeline")

# Names of the Triton models' tensors (see models_staging/*/config.pbtxt).
TRITON_IMAGE_INPUT = "INPUT_IMAGE"
PIPELINE_INPUT = "IMAGE_BYTES"   # food_pipeline: the encoded image's own bytes
ONNX_INPUT = "input"

UNKNOWN_WEIGHTS_NOTE = ("the model server does not report whether its weights are trained; "
                        "`make models` without --weights builds untrained demo weights")


@dataclass
class Result:
    prediction: str
    probability: float
    backend: str          # fastapi | triton | triton_onnx | triton_pipeline
    target: str           # URL and model it went to
    weights_kind: str     # demo | trained | unknown
    note: str
    latency_ms: float = 0.0

    def as_dict(self) -> dict:
        """What the public /test route shows: everything but ``target`` (the
        model server's internal address is for the server log)."""
        out = asdict(self)
        out.pop("target", None)
        return out


class ClassifyError(Exception):
    """A prediction that could not be made; ``status`` is the page's HTTP status."""

    status = 500
    code = "error"

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code


class BadUpload(ClassifyError):
    status = 400
    code = "bad_upload"


class BackendUnavailable(ClassifyError):
    status = 503
    code = "backend_unavailable"


class BackendFailed(ClassifyError):
    status = 502
    code = "backend_error"


def note_for(weights_kind: str) -> str:
    if weights_kind == "demo":
        return food11.DEMO_WEIGHTS_NOTE
    if weights_kind == "trained":
        return "trained Food-11 weights"
    return UNKNOWN_WEIGHTS_NOTE


# A photo at the pixel limit is ~120 MB once decoded: at most one decode per
# core runs at once, however many uploads arrive together.
_decode_slots = threading.BoundedSemaphore(procs.cpu_cores())


def check_image(data: bytes) -> None:
    """The page's own check of an upload, before anything is sent on: not an
    image → 400, too many bytes or pixels (or pixels per byte) → 413.
    Reads only the header: the model server decodes the image itself (the
    FastAPI services, Triton's Python model), so decoding it here too would
    double the CPU a costly image takes. A truncated file is found by the
    decoder there and comes back as a 400 all the same."""
    if not data:
        raise BadUpload("The uploaded file is empty.", code="empty_upload")
    try:
        food11.check_image_header(data)
    except food11.ImageDecodeError as err:
        raise BadUpload(err.message, status=err.status, code=err.code) from None


def preprocess_upload(data: bytes) -> np.ndarray:
    """Decode and preprocess here (the ``triton_onnx`` backend, whose model
    server only runs the network): float32 [3, 224, 224]; the decoded image
    is freed before the backend call. Bad input → 400/413 as check_image."""
    try:
        pool = _gevent_threads()
        if pool is not None:  # the container's gevent workers: keep the event loop free
            return pool.apply(food11.preprocess, (data,))
        with _decode_slots:
            return food11.preprocess(data)
    except food11.ImageDecodeError as err:
        raise BadUpload(err.message, status=err.status, code=err.code) from None


_gevent_pool = None


def _gevent_threads():
    """Under gunicorn's gevent workers (servelab/serve/webserver.py), a pool of one
    real thread per core for decoding: CPU work in a greenlet would stall every
    other connection of the worker, and a fixed set of decode threads keeps
    the allocator's per-thread arenas few. None elsewhere (Flask's own server,
    tests): there each request already has its own thread."""
    global _gevent_pool
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("threading"):
        return None
    if _gevent_pool is None:
        from gevent.threadpool import ThreadPool

        _gevent_pool = ThreadPool(procs.cpu_cores())
    return _gevent_pool


# --------------------------------------------------------------------------
# FastAPI
# --------------------------------------------------------------------------

class FastAPIBackend:
    name = "fastapi"

    def __init__(self, url: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        if "://" not in self.url:
            self.url = "http://" + self.url
        self.timeout = timeout
        self.target = f"{self.url}/predict"

    def ready(self) -> tuple[bool, str]:
        import requests

        try:
            r = requests.get(f"{self.url}/health", timeout=3)
        except requests.RequestException as err:
            log.warning("FastAPI server %s: %s", self.url, err)
            return False, f"the FastAPI server is not reachable ({type(err).__name__})"
        return r.status_code == 200, f"the FastAPI server's /health answered {r.status_code}"

    def classify(self, data: bytes, tensor: np.ndarray | None = None) -> Result:
        import requests

        payload = {"image": base64.b64encode(data).decode("ascii")}
        try:
            r = requests.post(self.target, json=payload, timeout=(3, self.timeout))
        except (requests.ConnectionError, requests.Timeout) as err:
            log.warning("FastAPI server %s: %s", self.url, err)   # the address goes to the log only
            raise BackendUnavailable(
                f"The FastAPI server is not reachable ({type(err).__name__}). "
                "Is it running? Check FASTAPI_SERVER_URL.") from None
        except requests.RequestException as err:
            log.warning("FastAPI server %s: %s", self.url, err)
            raise BackendFailed(f"Calling the FastAPI server failed ({type(err).__name__}).") from None
        try:
            body = r.json()
        except ValueError:
            body = {}
        if 400 <= r.status_code < 500 and r.status_code not in (404, 405):
            # The server refused this image (same checks as check_image).
            raise BadUpload(body.get("message") or f"The FastAPI server refused the image (HTTP {r.status_code}).",
                            status=413 if r.status_code == 413 else 400, code=body.get("error"))
        if r.status_code != 200 or "prediction" not in body:
            raise BackendFailed(f"The FastAPI server answered HTTP {r.status_code}: "
                                f"{body.get('message') or r.text[:200]}")
        kind = str(body.get("weights_kind", "unknown"))
        kind = kind if kind in ("demo", "trained") else "unknown"   # the page says "trained" only for trained weights
        return Result(prediction=str(body["prediction"]), probability=float(body["probability"]),
                      backend=self.name, target=self.target, weights_kind=kind,
                      note=str(body.get("note") or note_for(kind)))


# --------------------------------------------------------------------------
# Triton (HTTP, tritonclient)
# --------------------------------------------------------------------------

def _close_quietly(client) -> None:
    if client is not None:
        try:
            client.close()
        except Exception:
            pass


class _TritonBase:
    name = "triton"

    def __init__(self, url: str, model: str, timeout: float = 30.0):
        self.url = url.split("://", 1)[-1].rstrip("/")  # tritonclient wants host:port
        self.model = model
        self.timeout = timeout
        self.target = f"{self.url} model {model}"
        self._config: dict | None = None

    def _client(self):
        # A new client per call: tritonclient.http runs on gevent, whose
        # sockets belong to the thread that made them, and Flask serves each
        # request on its own thread.
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(self.url, connection_timeout=3.0, network_timeout=self.timeout)

    def _call(self, fn):
        from tritonclient.utils import InferenceServerException

        client = None
        try:
            client = self._client()
            return fn(client)
        except InferenceServerException as err:
            self._raise_triton_error(err)
        except (OSError, TimeoutError) as err:
            log.warning("Triton %s: %s", self.url, err)   # the address goes to the log only
            raise BackendUnavailable(
                f"Triton is not reachable ({type(err).__name__}). "
                "Is it running? Check TRITON_SERVER_URL.") from None
        except Exception as err:  # gevent timeouts and friends
            if "timeout" in type(err).__name__.lower():
                raise BackendUnavailable("Triton did not answer in time.") from None
            raise
        finally:
            _close_quietly(client)

    def _raise_triton_error(self, err) -> None:
        """Triton's error, as the UI's: a refused upload (4xx), unavailable, or failed."""
        msg = err.message() or str(err)
        status = str(err.status() or "")
        lowered = msg.lower()
        refused = _IMAGE_ERROR.search(msg)
        if status == "400" and refused:  # the Python model's decode check (food11): the upload's fault
            code, text = refused.group(1), refused.group(2).strip()
            raise BadUpload(text, status=413 if code == "image_too_large" else 400, code=code) from None
        log.warning("Triton %s model %s: HTTP %s %s", self.url, self.model, status, msg)
        if not status or "unknown model" in lowered or "not ready" in lowered or "unavailable" in lowered \
                or "connect" in lowered or "timed out" in lowered:
            raise BackendUnavailable(f"Triton cannot serve model {self.model} right now. "
                                     "Is it running? Check TRITON_SERVER_URL.") from None
        raise BackendFailed(f"Triton answered HTTP {status} for model {self.model}.") from None

    def config(self) -> dict:
        if self._config is None:
            self._config = self._call(lambda c: c.get_model_config(self.model))
        return self._config

    def batched(self) -> bool:
        """Models with ``max_batch_size > 0`` take an extra leading batch dim."""
        return int(self.config().get("max_batch_size", 0) or 0) > 0

    def weights_kind(self) -> str:
        """From the model config's ``parameters { key: "weights_kind" }`` if
        Triton reports it, else from the build stamp of this model in the
        local models_staging/ (what the local Triton serves), else unknown."""
        params = self.config().get("parameters", {}) or {}
        value = params.get("weights_kind", {})
        if isinstance(value, dict):
            value = value.get("string_value", "")
        if value in ("demo", "trained"):
            return str(value)
        from servelab.core import paths

        for stamp in sorted((paths.MODELS_STAGING / self.model).glob("*/*.json")):
            kind = food11.weights_kind(stamp.with_suffix(""))
            if kind in ("demo", "trained"):
                return kind
        return "unknown"

    def ready(self) -> tuple[bool, str]:
        try:
            ok = self._call(lambda c: c.is_model_ready(self.model))
        except ClassifyError as err:
            return False, err.message
        return bool(ok), f"model {self.model} {'ready' if ok else 'not ready'}"


def _checked(name: str, datatype: str, array: np.ndarray) -> None:
    """Never send Triton an input it would answer with a 500 or a bare NaN
    (servelab.core.triton_inputs); such an input is a bug here, not the user's."""
    from servelab.core.triton_inputs import BadTritonInput, check_input

    try:
        check_input(name, datatype, array.shape, array)
    except BadTritonInput as err:
        log.error("not sent to Triton: %s", err)
        raise ClassifyError("The image could not be turned into a valid model input; see the server log.",
                            status=500, code="invalid_model_input") from None


def lesson_client():
    """``flask_app/triton_client.py``: the lesson file that holds the Triton calls the page makes (the
    InferInput / infer code students read). Loaded from its path: the Flask app's folder is not a package."""
    import importlib.util
    import sys

    module = sys.modules.get("servelab_flask_triton_client")
    if module is None:
        from servelab.core import paths

        spec = importlib.util.spec_from_file_location("servelab_flask_triton_client",
                                                      paths.REPO_ROOT / "flask_app" / "triton_client.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[spec.name] = module
    return module


class TritonBackend(_TritonBase):
    """Sends the encoded image; the Python-backend model does the rest (flask_app/triton_client.py)."""

    name = "triton"
    input_name = TRITON_IMAGE_INPUT

    def _payload(self, data: bytes) -> bytes:
        return base64.b64encode(data)                                      # base64 text

    def classify(self, data: bytes, tensor: np.ndarray | None = None) -> Result:
        payload, batched = self._payload(data), self.batched()
        _checked(self.input_name, "BYTES", np.array([[payload]] if batched else [payload], dtype=object))
        label, prob = self._call(lambda c: lesson_client().classify_image(c, self.model, payload, self.input_name,
                                                                          batched))
        kind = self.weights_kind()
        return Result(prediction=label, probability=prob, backend=self.name, target=self.target,
                      weights_kind=kind, note=note_for(kind))


class TritonPipelineBackend(TritonBackend):
    """Sends the uploaded bytes as they are (a quarter fewer than base64, and
    ~600 KB fewer than the float tensor); the ensemble's steps decode,
    classify and apply the softmax inside Triton. Its outputs have the
    Python model's names (FOOD_LABEL, PROBABILITY)."""

    name = "triton_pipeline"
    input_name = PIPELINE_INPUT

    def _payload(self, data: bytes) -> bytes:
        return bytes(data)                                                 # the file itself

    def weights_kind(self) -> str:
        """An ensemble has no weights of its own: its steps' stamps say it."""
        kind = super().weights_kind()
        if kind != "unknown":
            return kind
        from servelab.core import paths

        for step in (self.config().get("ensemble_scheduling") or {}).get("step") or []:
            for stamp in sorted((paths.MODELS_STAGING / step.get("model_name", "")).glob("*/*.json")):
                kind = food11.weights_kind(stamp.with_suffix(""))
                if kind in ("demo", "trained"):
                    return kind
        return "unknown"


class TritonOnnxBackend(_TritonBase):
    """Preprocesses here, sends the float tensor; Triton ranks and names the classes (label_filename),
    the softmax of the scores is applied here (flask_app/triton_client.py)."""

    name = "triton_onnx"

    def classify(self, data: bytes, tensor: np.ndarray | None = None) -> Result:
        x = tensor if tensor is not None else preprocess_upload(data)      # float32 [3, 224, 224]
        batched = self.batched()
        _checked(ONNX_INPUT, "FP32", x[np.newaxis] if batched else x)
        label, prob = self._call(lambda c: lesson_client().classify_tensor(c, self.model, x, batched,
                                                                           food11.NUM_CLASSES))
        kind = self.weights_kind()
        return Result(prediction=label, probability=prob, backend=self.name,
                      target=self.target, weights_kind=kind, note=note_for(kind))


# --------------------------------------------------------------------------
# Choosing the backend from the environment
# --------------------------------------------------------------------------

def from_env(env: dict | None = None):
    """The backend ``INFERENCE_BACKEND`` names, configured from the lab's env
    variables (defaults: the local stack's ports)."""
    env = os.environ if env is None else env
    kind = (env.get("INFERENCE_BACKEND") or "fastapi").strip().lower()
    if kind == "fastapi":
        return FastAPIBackend(env.get("FASTAPI_SERVER_URL") or "http://127.0.0.1:8000")
    triton_url = env.get("TRITON_SERVER_URL") or "127.0.0.1:8000"
    if kind == "triton":
        return TritonBackend(triton_url, env.get("FOOD11_MODEL_NAME") or "food_classifier")
    if kind == "triton_onnx":
        return TritonOnnxBackend(triton_url, env.get("FOOD11_MODEL_NAME") or "food_classifier_onnx")
    if kind == "triton_pipeline":
        return TritonPipelineBackend(triton_url, env.get("FOOD11_MODEL_NAME") or "food_pipeline")
    raise SystemExit(f"INFERENCE_BACKEND must be one of {', '.join(BACKENDS)}; got {kind!r}")


# --------------------------------------------------------------------------
# Flask plumbing: in-memory uploads, security headers, preview data URL
# --------------------------------------------------------------------------

def http_error_message(err, request) -> str:
    """The page's sentence for an HTTP error Flask/Werkzeug raised itself.
    A 413 says which limit was hit: the whole body, the number of form parts
    (Werkzeug's max_form_parts), or one text field (max_form_memory_size)."""
    if err.code != 413:
        return f"{err.code} {err.name}: {err.description}"
    mib = MAX_UPLOAD_BYTES // (1024 * 1024)
    if request.content_length is not None and request.content_length > MAX_UPLOAD_BYTES:
        return f"The file is too large: the limit is {mib} MiB."
    tb, where = err.__traceback__, ""
    while tb is not None:
        where, tb = tb.tb_frame.f_code.co_filename, tb.tb_next
    if where.endswith("multipart.py"):   # werkzeug/sansio/multipart.py counts the parts
        return (f"The form has too many parts (the limit is {request.max_form_parts}); "
                "send just the image, in the field 'file'.")
    if where.endswith("formparser.py"):  # werkzeug/formparser.py measures each text field
        return (f"A text field of the form is too large (the limit is {request.max_form_memory_size} bytes); "
                "send just the image, in the field 'file'.")
    return (f"The request is too large: at most {mib} MiB, {request.max_form_parts} form parts and "
            f"{request.max_form_memory_size} bytes per text field.")


class InMemoryRequest(Request):
    """Keeps uploaded files in memory (Werkzeug would spool files over 500 KB
    to a temporary file). MAX_CONTENT_LENGTH bounds how much that can be."""

    def _get_file_stream(self, total_content_length, content_type, filename=None, content_length=None):
        return io.BytesIO()


# The page loads nothing from elsewhere: scripts, styles and images come from
# this app (the preview is a data:/blob: URL).
CONTENT_SECURITY_POLICY = ("default-src 'self'; img-src 'self' data: blob:; object-src 'none'; "
                           "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def add_security_headers(response):
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    return response


_PREVIEW_TYPES = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif", "WEBP": "image/webp"}


def preview_data_url(data: bytes, max_bytes: int = 2 * 1024 * 1024) -> str | None:
    """A data: URL of an upload (already checked by check_image) to show
    beside the result: only formats browsers display, up to ``max_bytes``."""
    if len(data) > max_bytes:
        return None
    try:
        with Image.open(io.BytesIO(data)) as probe:   # reads the header only
            mime = _PREVIEW_TYPES.get(probe.format or "")
    except Exception:
        return None
    if mime is None:
        return None
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
