"""The /predict request contract of the lab's FastAPI services, and every
client mistake as a JSON 4xx (used through ``servelab.serve.serving``, which
re-exports these names for fastapi_pt/ and fastapi_onnx/):

* what the ``image`` field may hold and how large a body may be, as
  documented in the OpenAPI schema (and so in /docs);
* ``BodySizeLimit``: the ASGI middleware that refuses a body over the limit
  (413) or one built to be costly to parse (422) before it is parsed;
* ``install_error_handlers``: bad base64 or image -> 400/413, non-JSON -> 415,
  malformed JSON or a missing/wrong field -> 422, never a 200 carrying an
  error and never a 500 for a client's mistake.

fastapi and starlette are imported lazily (only when an app installs them).
"""

from __future__ import annotations

import json
import logging
import math
import time

from servelab.core import food11

log = logging.getLogger("servelab")  # configured by servelab.serve.serving

# --------------------------------------------------------------------------
# The request contract
# --------------------------------------------------------------------------

# Standard base64 (RFC 4648 alphabet, '=' padding, no whitespace). The OpenAPI
# schema documents this pattern so schema-driven clients (Swagger's "Try it
# out", schemathesis) generate strings the server can decode; the server
# checks it with servelab.core.food11.decode_base64, which answers 400
# `invalid_base64` with a readable sentence instead of a regex dump.
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"

# The longest base64 string that can decode to MAX_IMAGE_BYTES.
MAX_BASE64_CHARS = 4 * math.ceil(food11.MAX_IMAGE_BYTES / 3)

# Request bodies above this are refused with 413 before they are parsed:
# the largest allowed image in base64 plus room for the JSON around it.
MAX_BODY_BYTES = MAX_BASE64_CHARS + 64 * 1024

IMAGE_FIELD_DOC = {
    "description": (
        "The image file (JPEG or PNG) encoded as base64: standard (the pattern below) or URL-safe, "
        "with or without '=' padding and line breaks. "
        f"At most {food11.MAX_IMAGE_BYTES} bytes before encoding and "
        f"{food11.MAX_IMAGE_PIXELS} pixels."
    ),
    # Documented, not enforced by pydantic: decode_base64 enforces both and
    # gives a better message (and the right status, 400 or 413).
    "json_schema_extra": {
        "pattern": BASE64_PATTERN,
        "minLength": 4,
        "maxLength": MAX_BASE64_CHARS,
        "contentEncoding": "base64",
        "contentMediaType": "image/*",
    },
}


def _error_schema(example_code: str, example_message: str) -> dict:
    return {
        "content": {"application/json": {"schema": {
            "type": "object",
            "required": ["error", "message"],
            "properties": {
                "error": {"type": "string", "description": "stable machine-readable code"},
                "message": {"type": "string", "description": "what went wrong, in a sentence"},
            },
        }, "example": {"error": example_code, "message": example_message}}},
    }


# Documented in the OpenAPI schema (and so in /docs) for POST /predict.
ERROR_RESPONSES: dict = {
    400: {"description": "The image field is not base64, not an image, or a truncated image.",
          **_error_schema("not_an_image", "The data is not an image PIL can read (expected JPEG, PNG, ...).")},
    413: {"description": "The request body or the image is too large (bytes or pixels, or a JPEG whose scans "
                         "would cost decoding out of proportion to a photo).",
          **_error_schema("image_too_large", "The image is 20000x20000 = 400000000 pixels; the limit is 40000000.")},
    415: {"description": "The request body is not JSON (send Content-Type: application/json).",
          **_error_schema("unsupported_media_type", "Send the request body as JSON with Content-Type: application/json.")},
    422: {"description": "The JSON is malformed (or nested/sized to be costly to parse), "
                         "or the `image` field is missing or not a string.",
          "content": {"application/json": {"schema": {
              "type": "object",
              "required": ["error", "message", "detail"],
              "properties": {
                  "error": {"type": "string"},
                  "message": {"type": "string"},
                  "detail": {"type": "array", "items": {
                      "type": "object",
                      "required": ["loc", "msg", "type"],
                      "properties": {
                          "loc": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
                          "msg": {"type": "string"},
                          "type": {"type": "string"},
                      },
                  }},
              },
          }, "example": {"error": "invalid_request",
                         "message": "The field 'image' is required. Send JSON like {\"image\": \"<base64 JPEG/PNG>\"}.",
                         "detail": [{"loc": ["body", "image"], "msg": "Field required", "type": "missing"}]}}}},
}


# --------------------------------------------------------------------------
# Request body size limit
# --------------------------------------------------------------------------

def _body_too_large_message(limit: int) -> dict:
    return {"error": "body_too_large",
            "message": f"The request body is larger than the {limit} byte limit "
                       f"(an image may be at most {food11.MAX_IMAGE_BYTES} bytes before base64)."}


def _new_body_too_large():
    # A starlette HTTPException, so FastAPI passes it through when it is
    # raised while reading the body, and install_error_handlers answers it.
    from starlette.exceptions import HTTPException

    class BodyTooLarge(HTTPException):
        def __init__(self, limit: int):
            super().__init__(status_code=413, detail=_body_too_large_message(limit)["message"])

    return BodyTooLarge


# The /predict body is one flat object ({"image": "..."}; base64 holds no
# brackets, commas or colons). FastAPI parses JSON on the event loop, so a
# body built to be slow to parse (a million keys: ~0.8 s) would stall every
# request, /health included; one nested 10,000 deep fails the parser itself.
# Both are refused while the body arrives, before it is parsed.
MAX_JSON_CONTAINERS = 64     # objects + arrays in one body
MAX_JSON_ITEMS = 1000        # commas + colons in one body


def _new_json_too_complex():
    from starlette.exceptions import HTTPException

    class JsonTooComplex(HTTPException):
        error = "invalid_request"

        def __init__(self, message: str, status_code: int = 422, error: str = "invalid_request"):
            super().__init__(status_code=status_code, detail=message)
            self.error = error

    return JsonTooComplex


JsonTooComplex = None  # the class, made on first use (starlette is imported lazily)


def _media_type_message(content_type: str | None) -> str:
    sent = f"was sent as {content_type.split(';')[0].strip()}" if content_type else "has no Content-Type"
    return (f"The request body {sent}; send JSON with Content-Type: application/json, "
            "like {\"image\": \"<base64 JPEG/PNG>\"}.")


class _JsonShape:
    """Counts a body's objects/arrays and items chunk by chunk, whatever its
    declared type (a body declared as something else that trips the count is
    a 415: it is not the JSON the endpoint takes)."""

    def __init__(self, content_type: str | None = None):
        self.containers = self.items = 0
        self.content_type = content_type
        self.declared_json = not content_type or _is_json_content_type(content_type)

    def _refuse(self, message: str):
        if not self.declared_json:
            raise JsonTooComplex(_media_type_message(self.content_type), 415, "unsupported_media_type")
        raise JsonTooComplex(message)

    def feed(self, chunk: bytes) -> None:
        self.containers += chunk.count(b"{") + chunk.count(b"[")
        self.items += chunk.count(b",") + chunk.count(b":")
        if self.containers > MAX_JSON_CONTAINERS:
            self._refuse(f"The JSON body nests or holds more than {MAX_JSON_CONTAINERS} objects/arrays; "
                         "send one flat object like {\"image\": \"<base64 JPEG/PNG>\"}.")
        if self.items > MAX_JSON_ITEMS:
            self._refuse(f"The JSON body holds more than {MAX_JSON_ITEMS} items (keys or values); "
                         "send one flat object like {\"image\": \"<base64 JPEG/PNG>\"}.")


# Headers that say how a body is framed or what it is: sent twice, one part of
# the stack may believe the first and another the last (a smuggling classic;
# here it once let a costly body past the shape count below).
FRAMING_HEADERS = ("content-type", "content-length", "transfer-encoding")


def repeated_framing_headers(headers) -> list[str]:
    """The framing headers (lower case) that ``headers`` holds more than once.
    ``headers``: (name, value) pairs, bytes (ASGI) or str (WSGI servers)."""
    seen: dict[str, int] = {}
    for key, _ in headers:
        name = (key.decode("latin-1") if isinstance(key, bytes) else str(key)).lower()
        if name in FRAMING_HEADERS:
            seen[name] = seen.get(name, 0) + 1
    return [name for name in FRAMING_HEADERS if seen.get(name, 0) > 1]


def repeated_message(names: list[str]) -> str:
    shown = ", ".join("-".join(part.capitalize() for part in n.split("-")) for n in names)
    return f"The request repeats the {shown} header; send each of these headers once."


def server_timing(**seconds: float) -> str:
    """A ``Server-Timing`` header value: ``decode;dur=3.120, wait;dur=0.010, ...`` (milliseconds)."""
    return ", ".join(f"{name};dur={s * 1000:.3f}" for name, s in seconds.items())


class ServerTiming:
    """ASGI middleware: adds ``app;dur=<ms>`` to every response's ``Server-Timing`` header, the time
    from the request's head reaching the app to its response head leaving it (reading and parsing
    the body, the endpoint, encoding the answer). An endpoint's own stages (``server_timing``) stay
    in front of it; ``servelab.bench.breakdown`` reads them all."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()

        async def timed(message):
            if message["type"] == "http.response.start":
                app_ms = f"app;dur={(time.perf_counter() - t0) * 1000:.3f}".encode()
                headers = list(message.get("headers", ()))
                own = [v for k, v in headers if k.lower() == b"server-timing"]
                headers = [(k, v) for k, v in headers if k.lower() != b"server-timing"]
                message = {**message, "headers": headers + [(b"server-timing", b", ".join(own + [app_ms]))]}
            await send(message)

        await self.app(scope, receive, timed)


class BodySizeLimit:
    """ASGI middleware: answer 413 (JSON) to a request body over ``max_bytes``.

    A declared ``Content-Length`` over the limit is refused before a byte of
    the body is read; a chunked body is counted as it arrives and refused as
    soon as it passes the limit. Either way the server never holds more than
    ``max_bytes`` of one request in memory.

    A JSON body is also counted for its shape as it arrives (C-speed byte
    counts per chunk): more than ``MAX_JSON_CONTAINERS`` objects/arrays or
    ``MAX_JSON_ITEMS`` items is a 422 ``invalid_request`` before parsing.
    The shape is counted on every body, whatever its ``Content-Type``.

    A request that repeats ``Content-Type``, ``Content-Length`` or
    ``Transfer-Encoding`` is a 400 ``repeated_header`` before its body is read."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES):
        global JsonTooComplex
        self.app = app
        self.max_bytes = int(max_bytes)
        self.too_large = _new_body_too_large()
        if JsonTooComplex is None:
            JsonTooComplex = _new_json_too_complex()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", ())
        repeated = repeated_framing_headers(headers)
        if repeated:
            # Two Content-Type (or -Length, Transfer-Encoding) headers: parts of
            # a stack may each believe a different one. Refused, body unread.
            await self._send_json(send, 400, {"error": "repeated_header", "message": repeated_message(repeated)})
            return
        declared = None
        for key, value in headers:
            if key.lower() == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
        if declared is not None and declared > self.max_bytes:
            await self._send_413(send)
            return
        # Every body is counted for its shape, whatever type it declares: the
        # /predict body is one flat JSON object, and what FastAPI parses does
        # not depend on what this middleware believes the type is.
        content_type = next((v.decode("latin-1") for k, v in headers if k.lower() == b"content-type"), None)
        shape = _JsonShape(content_type)

        received = 0
        started = False

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                received += len(chunk)
                if received > self.max_bytes:
                    raise self.too_large(self.max_bytes)
                if shape is not None:
                    shape.feed(chunk)
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except self.too_large:
            if started:
                raise
            await self._send_413(send)

    async def _send_413(self, send):
        await self._send_json(send, 413, _body_too_large_message(self.max_bytes))

    @staticmethod
    async def _send_json(send, status: int, message: dict):
        body = json.dumps(message).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


# --------------------------------------------------------------------------
# Errors → JSON responses
# --------------------------------------------------------------------------

def _is_json_content_type(value: str | None) -> bool:
    if not value:
        return False
    mime = value.split(";", 1)[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


def _validation_message(errors: list[dict]) -> str:
    """One sentence for a student, from pydantic's error list."""
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        kind = err.get("type", "")
        field = ".".join(loc)
        if kind == "json_invalid":
            return "The request body is not valid JSON. Send {\"image\": \"<base64 JPEG/PNG>\"}."
        if kind == "missing" and not loc:
            return "The request body is empty. Send JSON like {\"image\": \"<base64 JPEG/PNG>\"}."
        if kind == "missing":
            return f"The field '{field}' is required. Send JSON like {{\"image\": \"<base64 JPEG/PNG>\"}}."
        if kind in ("string_type", "str_type"):
            return f"The field '{field}' must be a string (the base64-encoded image)."
        if kind in ("model_type", "model_attributes_type", "dict_type") or not loc:
            return "The request body must be a JSON object like {\"image\": \"<base64 JPEG/PNG>\"}."
    first = errors[0] if errors else {}
    return f"Invalid request: {first.get('msg', 'validation failed')}."


def _body_parse_error(exc) -> str | None:
    """A sentence for FastAPI's 400 "There was an error parsing the body",
    from the exception the JSON parser raised; None for any other error."""
    if getattr(exc, "status_code", None) != 400 or exc.detail != "There was an error parsing the body":
        return None
    cause = exc.__cause__
    example = "Send JSON like {\"image\": \"<base64 JPEG/PNG>\"}."
    if isinstance(cause, RecursionError):
        return f"The JSON body is nested too deeply to parse. {example}"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return f"The JSON body holds a number with too many digits ({cause}). {example}"
    return f"The request body could not be parsed as JSON ({type(cause).__name__}). {example}"


def install_error_handlers(app) -> None:
    """Map every client mistake to a JSON 4xx ``{"error": code, "message": ...}``.

    * ``food11.ImageDecodeError`` (bad base64, not an image, truncated, too
      many bytes/pixels) → its own ``status`` (400 or 413);
    * a non-JSON body → 415; malformed JSON, missing field, wrong type → 422
      (the body keeps FastAPI's ``detail`` list, without echoing the input);
    * the body-size limit → 413;
    * anything unexpected → 500 ``internal_error``, logged with its traceback.
    """
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(food11.ImageDecodeError)
    async def image_error(request: Request, exc: food11.ImageDecodeError):
        return JSONResponse({"error": exc.code, "message": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        errors = list(exc.errors())
        # FastAPI hands a body that is not declared as JSON to validation as
        # raw bytes; say what is really wrong (415) instead of "Input should be
        # a valid dictionary". An empty body stays a 422 ("body is empty").
        content_type = request.headers.get("content-type")
        body_sent = not any(e.get("type") == "missing" and tuple(e.get("loc", ())) == ("body",) for e in errors)
        if body_sent and request.method in ("POST", "PUT", "PATCH") and not _is_json_content_type(content_type):
            return JSONResponse({"error": "unsupported_media_type", "message": _media_type_message(content_type)},
                                status_code=415)
        detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
                  for e in errors]
        return JSONResponse(
            {"error": "invalid_request", "message": _validation_message(errors), "detail": detail},
            status_code=422,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        parse_error = _body_parse_error(exc)
        if exc.status_code == 413:
            body = {"error": "body_too_large", "message": str(exc.detail)}
        elif getattr(exc, "error", None) == "unsupported_media_type":
            body = {"error": "unsupported_media_type", "message": str(exc.detail)}
        elif getattr(exc, "error", None) == "invalid_request" or parse_error:
            # The contract's 422 for a body that is not the documented JSON
            # (FastAPI's own answer to a parser failure is a bare 400).
            return JSONResponse({"error": "invalid_request", "message": parse_error or str(exc.detail),
                                 "detail": []}, status_code=422)
        else:
            body = {"error": f"http_{exc.status_code}", "message": str(exc.detail), "detail": exc.detail}
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception):
        log.exception("unexpected error while serving %s %s", request.method, request.url.path)
        return JSONResponse({"error": "internal_error", "message": "The server failed; see its log."},
                            status_code=500)
