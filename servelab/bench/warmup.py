"""The first request after a model (re)load, with and without the config's
``model_warmup``, side by side.

``first_request_after_load(url, model)`` loads the model alternately without
its ``model_warmup`` and with it (``rounds`` times each, so the machine's
drift hits both alike), and after each load times the first request, then a
few more (the steady state). Returns, per arm, every first and steady latency
and their medians: the first request's extra cost is ``first - steady``.

It works on the kit's local Triton (the edit goes through the runtime
repository) and on the node's (a config override on ``load_model``); both
need the admin key (found for a local server, ``TRITON_ADMIN_KEY`` otherwise).
"""

from __future__ import annotations

import statistics
import time
import urllib.request

from servelab.bench import http
from servelab.bench.targets import triton_target


def _grpc_url(url: str, grpc_url: str | None) -> str:
    if grpc_url:
        return grpc_url
    host, port, _ = http.split_url(url)
    from servelab.triton.state import read_state

    state = read_state(http_port=port) if host in ("127.0.0.1", "localhost") else None
    if state is None:
        raise ValueError(f"no local Triton on {url}: pass grpc_url= (and the admin key)")
    return f"{host}:{state['grpc_port']}"


def _post(url: str, body: bytes, headers: dict, timeout: float) -> float:
    t0 = time.perf_counter()
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()
    return (time.perf_counter() - t0) * 1000


def first_request_after_load(url: str, model: str, *, rounds: int = 3, steady: int = 5,
                             grpc_url: str | None = None, admin_key: str | None = None,
                             timeout: float = 120.0) -> dict:
    """``{"without": {...}, "with": {...}, "warmup_sizes": [...]}``, each arm
    holding ``first_ms`` and ``steady_ms`` (lists) and their ``*_median``.
    The model is left loaded with its warm-up, as its config asks."""
    from servelab.triton import control
    from servelab.triton.config import warmed_sizes

    grpc_url = _grpc_url(url, grpc_url)
    config = control.model_config(model, grpc_url=grpc_url)
    warmup = config.get("model_warmup")
    if not warmup:
        raise ValueError(f"{model}'s config has no model_warmup: nothing to compare")
    target = triton_target(url, model)           # one pre-encoded request, sent synchronously below
    host, port, _ = http.split_url(url)
    infer = f"http://{host}:{port}{target.path}"
    head, body = target.requests[0].split(b"\r\n\r\n", 1)
    headers = dict(line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:]
                   if not line.lower().startswith(("host:", "content-length:", "connection:")))
    arms: dict = {"without": {"first_ms": [], "steady_ms": []}, "with": {"first_ms": [], "steady_ms": []}}
    for _ in range(max(1, rounds)):
        for arm, edit in (("without", {"model_warmup": None}), ("with", {"model_warmup": warmup})):
            control.reload_model(model, edit, grpc_url=grpc_url, admin_key=admin_key, timeout=timeout,
                                 verbose=False)
            arms[arm]["first_ms"].append(_post(infer, body, headers, timeout))
            arms[arm]["steady_ms"].append(statistics.median(_post(infer, body, headers, timeout)
                                                            for _ in range(max(1, steady))))
    for arm in arms.values():
        arm["first_median"] = statistics.median(arm["first_ms"])
        arm["steady_median"] = statistics.median(arm["steady_ms"])
    reported = control.model_config(model, grpc_url=grpc_url)
    return {**arms, "model": model, "warmup_sizes": sorted(warmed_sizes(reported))}
