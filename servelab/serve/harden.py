"""What the kit adds to a lesson's FastAPI app from outside its file (issue 47).

fastapi_pt/app.py and fastapi_onnx/app.py hold their lesson: the model, the thread rule, the request
and the answer. What any public service needs besides, and the lesson is not about, comes from here,
so the files stay short and import only public libraries and servelab.core.food11:

* a limit on the request body (413 before it is read), and on its JSON shape;
* JSON 4xx errors a student can read (a bad image 400/413, a bad body 415/422), never a 500;
* Swagger UI and ReDoc served by the app itself (FastAPI's default pages load from a CDN);
* ``app;dur=`` in the Server-Timing header, after the endpoint's own stages;
* the error answers and the image field's rules in the OpenAPI schema.

The kit starts a lesson app hardened (the stack, the Docker images, the tests)::

    uvicorn servelab.serve.harden:fastapi_pt     # fastapi_pt/app.py, hardened
    uvicorn servelab.serve.harden:fastapi_onnx
    gunicorn --config python:servelab.serve.webserver servelab.serve.harden:flask_app

``harden(app)`` does it to any app made with ``FastAPI(...)``; the Flask page's own hardening is
servelab/serve/flask_harden.py.
"""

from __future__ import annotations

import importlib.util
import sys

from servelab.core import paths
from servelab.serve import serving
from servelab.serve.serving_contract import (
    ERROR_RESPONSES,
    IMAGE_FIELD_DOC,
    MAX_BODY_BYTES,
    BodySizeLimit,
    ServerTiming,
    install_error_handlers,
)

LESSON_APPS = ("fastapi_pt", "fastapi_onnx", "flask_app")
CDN_DOCS = ("/docs", "/docs/oauth2-redirect", "/redoc")


def harden(app):
    """The kit's hardening, on a lesson's ``FastAPI`` app (before it serves); returns the app."""
    from fastapi.routing import APIRoute

    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) not in CDN_DOCS]
    app.docs_url = app.redoc_url = None
    serving.install_offline_docs(app)                             # /docs and /redoc without a CDN
    app.add_middleware(BodySizeLimit, max_bytes=MAX_BODY_BYTES)   # bigger bodies: 413, unread
    install_error_handlers(app)                                   # bad input -> JSON 4xx
    app.add_middleware(ServerTiming)                              # Server-Timing: app;dur=<ms>
    for route in app.router.routes:
        if isinstance(route, APIRoute) and "POST" in route.methods:
            route.responses = {**ERROR_RESPONSES, **route.responses}
    plain_openapi = app.openapi

    def openapi():
        if app.openapi_schema is None:
            schema = plain_openapi()
            for model in schema.get("components", {}).get("schemas", {}).values():
                image = model.get("properties", {}).get("image")
                if image is not None and image.get("type") == "string":
                    image.update({"description": IMAGE_FIELD_DOC["description"],
                                  **IMAGE_FIELD_DOC["json_schema_extra"]})
        return app.openapi_schema

    app.openapi = openapi
    return app


def load(name: str, root=None):
    """``<root>/<name>/app.py`` (the kit's folder by default) imported as module ``app``, as
    ``uvicorn app:app`` in that folder would (its folder on sys.path, for the files beside it);
    returns its ``app``, hardened."""
    if name not in LESSON_APPS:
        raise ValueError(f"no lesson app {name!r}: one of {', '.join(LESSON_APPS)}")
    folder = (root or paths.REPO_ROOT) / name
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("app", folder / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["app"] = module
    spec.loader.exec_module(module)
    if name == "flask_app":
        from servelab.serve import flask_harden

        return flask_harden.harden(module)
    return harden(module.app)


def __getattr__(name: str):
    """``uvicorn servelab.serve.harden:fastapi_pt``: uvicorn reads the attribute; the app is loaded then."""
    if name in LESSON_APPS:
        app = load(name)
        globals()[name] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
