"""servelab.bench: one load generator for the lab's FastAPI services and Triton.

Quick use (a script or a notebook)::

    from servelab import bench
    t = bench.FastAPITarget("http://127.0.0.1:8011")
    r = bench.run(t, bench.closed(16, requests=200))
    print(r.throughput, r.latency["p50_ms"])

    t = bench.triton_target("127.0.0.1:8000", "food_classifier_onnx")
    r = bench.run(t, bench.open_loop(100, "poisson", duration=10),
                  observers=[bench.TritonObserver("127.0.0.1:8000", "food_classifier_onnx")])
    print(r.server["per_request_ms"], r.server["batch_histogram"])

Modules: ``patterns``, ``load`` (engine, results), ``targets``, ``http`` (the
client), ``schedule`` (arrivals), ``stats``, ``triton`` (statistics and
metrics), ``queueing`` (the model), ``plots``, ``cli``.
"""

from servelab.bench.load import (
    Observer,
    Result,
    load_json,
    run,
    run_checked,
    save_csv,
    save_json,
    sweep,
    warm,
)
from servelab.bench.patterns import Pattern, closed, open_loop, sequential
from servelab.bench.targets import (
    FastAPITarget,
    HTTPTarget,
    TritonGRPCTarget,
    TritonHTTPTarget,
    triton_image_target,
    triton_target,
    triton_tensor_target,
)

__all__ = [
    "FastAPITarget", "HTTPTarget", "Observer", "Pattern", "Result", "TritonGRPCTarget",
    "TritonHTTPTarget", "TritonObserver", "HostCPUObserver", "closed", "load_json", "open_loop",
    "run", "run_checked", "save_csv", "save_json", "sequential", "sweep", "triton_image_target", "triton_target",
    "triton_tensor_target", "warm",
]


def __getattr__(name):  # imported lazily: they pull in more than the client needs
    if name in ("TritonObserver", "HostCPUObserver"):
        from servelab.bench import triton
        return getattr(triton, name)
    raise AttributeError(name)
