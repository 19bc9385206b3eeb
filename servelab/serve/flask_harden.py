"""What the kit adds to the lesson's Flask page (flask_app/app.py) from outside its file (issue 47).

The lesson file holds what it teaches: the backend chosen by INFERENCE_BACKEND, and one round trip
to the model server (requests for FastAPI, flask_app/triton_client.py for Triton). The page is
public (the node's port 80), so the kit adds, here:

* uploads kept in memory (Werkzeug spools files over 500 KB to disk) and a body limit (413, unread);
* the page's security headers (it loads nothing from elsewhere);
* every failure as the page (or JSON, for /test and /health) with its status and a sentence: 400 not
  an image or no file, 413 too large (and which limit), 503 the model server is down, 502 it failed.
  The model server's internal address goes to the log, never to the public page;
* the weights' kind beside each answer (demo weights say so): FastAPI reports it, Triton's models are
  looked up in their config's parameters or in the build stamps of models_staging/;
* ``GET /test``: classifies a bundled sample (the smoke test), JSON.

``harden(module)`` does it to the lesson module (``servelab.serve.harden:flask_app`` loads it).
"""

from __future__ import annotations

import io
import logging
import re

from flask import Request, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

from servelab.core import food11, paths

log = logging.getLogger("servelab.flask")

# Largest upload the page accepts (the form's multipart body), in bytes.
MAX_UPLOAD_BYTES = food11.MAX_IMAGE_BYTES + 64 * 1024

# The page loads nothing from elsewhere: scripts, styles and images come from
# this app (the preview is a data:/blob: URL).
CONTENT_SECURITY_POLICY = ("default-src 'self'; img-src 'self' data: blob:; object-src 'none'; "
                           "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")

UNKNOWN_WEIGHTS_NOTE = ("the model server does not report whether its weights are trained; "
                        "`make models` without --weights builds untrained demo weights")

# How Triton's Python model reports an image it refused: "<code>: <sentence>".
_IMAGE_ERROR = re.compile(r"\b(invalid_base64|not_an_image|truncated_image|image_too_large|invalid_image): (.+)",
                          re.DOTALL)

JSON_ROUTES = ("/test", "/health")


class InMemoryRequest(Request):
    """Keeps uploaded files in memory; MAX_CONTENT_LENGTH bounds how much that can be."""

    def _get_file_stream(self, total_content_length, content_type, filename=None, content_length=None):
        return io.BytesIO()


def add_security_headers(response):
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    return response


def note_for(weights_kind: str) -> str:
    if weights_kind == "demo":
        return food11.DEMO_WEIGHTS_NOTE
    if weights_kind == "trained":
        return "trained Food-11 weights"
    return UNKNOWN_WEIGHTS_NOTE


def _stamped_kind(models: list[str]) -> str:
    """demo or trained from the build stamps (``*.json`` beside an artifact) of these models in the
    local models_staging/ (what the local Triton serves), else unknown."""
    for model in models:
        for stamp in sorted((paths.MODELS_STAGING / model).glob("*/*.json")):
            kind = food11.weights_kind(stamp.with_suffix(""))
            if kind in ("demo", "trained"):
                return kind
    return "unknown"


def triton_weights_kind(lesson) -> str:
    """The kind of weights the lesson's Triton model serves: its config's ``parameters
    { key: "weights_kind" }`` if Triton reports it, else the stamps of the model (or of an
    ensemble's steps)."""
    client = lesson.triton()
    try:
        config = client.get_model_config(lesson.MODEL)
    finally:
        client.close()
    value = (config.get("parameters") or {}).get("weights_kind", {})
    if isinstance(value, dict):
        value = value.get("string_value", "")
    if value in ("demo", "trained"):
        return str(value)
    steps = [s.get("model_name", "") for s in (config.get("ensemble_scheduling") or {}).get("step") or []]
    return _stamped_kind([lesson.MODEL, *steps])


def with_weights(result: dict, lesson, cache: dict) -> dict:
    """The answer with ``weights_kind`` (demo, trained or unknown: "trained" only when the server
    says exactly that) and its ``note``."""
    if lesson.BACKEND == "fastapi":
        kind = str(result.get("weights_kind", "unknown"))
    else:
        if "kind" not in cache:
            try:
                cache["kind"] = triton_weights_kind(lesson)
            except Exception as err:   # the answer came; its weights' kind is a detail
                log.warning("weights kind of %s not found: %s", lesson.MODEL, err)
                return {**result, "weights_kind": "unknown", "note": UNKNOWN_WEIGHTS_NOTE}
        kind = cache["kind"]
    kind = kind if kind in ("demo", "trained") else "unknown"
    note = str(result.get("note") or "") if lesson.BACKEND == "fastapi" else ""
    return {**result, "weights_kind": kind, "note": note or note_for(kind)}


def http_error_message(err) -> str:
    """The page's sentence for an HTTP error Flask/Werkzeug raised (or the lesson's abort).
    A 413 says which limit was hit: the whole body, the number of form parts (Werkzeug's
    max_form_parts), or one text field (max_form_memory_size)."""
    if err.code != 413:
        return str(err.description) if err.code == 400 else f"{err.code} {err.name}: {err.description}"
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


def _fastapi_error(err, lesson) -> tuple[int, str, str]:
    """requests' exceptions, as the page's (status, code, sentence)."""
    import requests

    if isinstance(err, requests.HTTPError) and err.response is not None:
        r = err.response
        try:
            body = r.json()
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        if 400 <= r.status_code < 500 and r.status_code not in (404, 405):   # it refused this image
            status = 413 if r.status_code == 413 else 400
            return status, str(body.get("error") or "bad_upload"), str(
                body.get("message") or f"The FastAPI server refused the image (HTTP {r.status_code}).")
        return 502, "backend_error", (f"The FastAPI server answered HTTP {r.status_code}: "
                                      f"{str(body.get('message') or r.text)[:200]}")
    log.warning("FastAPI server %s: %s", lesson.FASTAPI_URL, err)   # the address goes to the log only
    if isinstance(err, (requests.ConnectionError, requests.Timeout)):
        return 503, "backend_unavailable", (f"The FastAPI server is not reachable ({type(err).__name__}). "
                                            "Is it running? Check FASTAPI_SERVER_URL.")
    return 502, "backend_error", f"Calling the FastAPI server failed ({type(err).__name__})."


def _triton_error(err, lesson) -> tuple[int, str, str]:
    """tritonclient's InferenceServerException, as the page's (status, code, sentence)."""
    msg = err.message() or str(err)
    status = str(err.status() or "")
    refused = _IMAGE_ERROR.search(msg)
    if status == "400" and refused:   # the Python model's decode check (food11): the upload's fault
        code = refused.group(1)
        return (413 if code == "image_too_large" else 400), code, refused.group(2).strip()
    log.warning("Triton %s model %s: HTTP %s %s", lesson.TRITON_URL, lesson.MODEL, status, msg)
    lowered = msg.lower()
    if not status or any(w in lowered for w in ("unknown model", "not ready", "unavailable", "connect", "timed out")):
        return 503, "backend_unavailable", (f"Triton cannot serve model {lesson.MODEL} right now. "
                                            "Is it running? Check TRITON_SERVER_URL.")
    return 502, "backend_error", f"Triton answered HTTP {status} for model {lesson.MODEL}."


def _unreachable(err, lesson) -> tuple[int, str, str]:
    """A socket error or a timeout on the way to Triton (tritonclient.http runs on gevent)."""
    log.warning("model server %s: %s", lesson.TRITON_URL, err)
    if "timeout" in type(err).__name__.lower():
        return 503, "backend_unavailable", "Triton did not answer in time."
    return 503, "backend_unavailable", (f"Triton is not reachable ({type(err).__name__}). "
                                        "Is it running? Check TRITON_SERVER_URL.")


def harden(lesson):
    """The kit's hardening, on the lesson module (before it serves); returns its Flask app."""
    import requests
    from tritonclient.utils import InferenceServerException

    app = lesson.app
    app.request_class = InMemoryRequest
    app.config["MAX_CONTENT_LENGTH"] = MAX_UPLOAD_BYTES
    app.after_request(add_security_headers)
    weights_cache: dict = {}

    def failure(status: int, code: str, message: str):
        if request.path in JSON_ROUTES:
            return jsonify(error=code, message=message, backend=lesson.BACKEND), status
        return render_template("index.html", backend=lesson.BACKEND, model=lesson.MODEL, error=message), status

    app.register_error_handler(food11.ImageDecodeError, lambda e: failure(e.status, e.code, e.message))
    app.register_error_handler(HTTPException, lambda e: failure(e.code, "bad_request", http_error_message(e)))
    app.register_error_handler(requests.RequestException, lambda e: failure(*_fastapi_error(e, lesson)))
    app.register_error_handler(InferenceServerException, lambda e: failure(*_triton_error(e, lesson)))
    app.register_error_handler(OSError, lambda e: failure(*_unreachable(e, lesson)))   # TimeoutError too

    @app.errorhandler(Exception)
    def anything_else(err):
        if "timeout" in type(err).__name__.lower():   # gevent's timeouts (tritonclient.http runs on gevent)
            return failure(*_unreachable(err, lesson))
        log.exception("the page failed")                # a bug of the page: the log has the traceback
        return failure(500, "error", "The page failed; the server log says why.")

    plain_classify = lesson.classify

    def classify(data: bytes) -> dict:
        return with_weights(plain_classify(data), lesson, weights_cache)

    lesson.classify = classify   # the lesson's routes call classify(data) by its name

    @app.get("/test")
    def test():
        """Classify the first bundled sample (JSON): the smoke test of the page and its backend."""
        sample = paths.sample_images()[0]
        return jsonify(sample=sample.name, **classify(sample.read_bytes()))

    return app
