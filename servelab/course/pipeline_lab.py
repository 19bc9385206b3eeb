"""What notebook 6a calls: three ways to serve the same photo through Triton,
measured side by side, and the queueing model's prediction for each.

* ``python``: the Python-backend ``food_classifier`` (the client sends the
  JPEG as base64; decode + PyTorch in one step on the server);
* ``client+onnx``: the client decodes and normalizes, and sends the FP32
  tensor to ``food_classifier_onnx`` (one step on the server);
* ``ensemble``: the client sends the JPEG's bytes to ``food_pipeline``;
  Triton runs ``food_preprocess`` -> ``food_classifier_onnx`` ->
  ``food_postprocess`` (three steps).

The load generator sends requests built ahead of time, so its runs measure
the network and the server; what the client spends to build one request
from a JPEG (base64, or decode + resize + normalize) is measured apart
(``client_cpu_ms``, CPU time of this process per request).
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field

from servelab import bench
from servelab.bench import queueing
from servelab.bench.load import Observer
from servelab.bench.targets import triton_infer_body
from servelab.core import food11

WAYS = {
    "python": ("food_classifier", ("food_classifier",)),
    "client+onnx": ("food_classifier_onnx", ("food_classifier_onnx",)),
    "ensemble": ("food_pipeline", ("food_preprocess", "food_classifier_onnx", "food_postprocess")),
}


@dataclass
class Way:
    name: str
    model: str
    steps: tuple[str, ...]
    target: object
    bytes_per_request: int          # the HTTP request Triton receives (head + body)
    client_cpu_ms: float            # CPU to turn the JPEG into that request, here
    instances: dict = field(default_factory=dict)  # step -> model copies (from Triton's configs)


def _request(name: str, jpeg: bytes) -> bytes:
    if name == "python":
        return triton_infer_body([("INPUT_IMAGE", "BYTES", [1, 1], [base64.b64encode(jpeg)])],
                                 ("FOOD_LABEL", "PROBABILITY"))[0]
    if name == "client+onnx":
        return triton_infer_body([("input", "FP32", [1, 3, 224, 224], food11.preprocess(jpeg)[None])], ("output",))[0]
    return triton_infer_body([("IMAGE_BYTES", "BYTES", [1, 1], [jpeg])], ("FOOD_LABEL", "PROBABILITY"))[0]


def client_cpu_ms(name: str, jpeg: bytes, repeats: int = 20) -> float:
    """CPU time (ms, this process) to build one request of ``name`` from the JPEG: median of ``repeats``."""
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.process_time()
        _request(name, jpeg)
        times.append((time.process_time() - t0) * 1000)
    return sorted(times)[len(times) // 2]


def ways(url: str, jpeg: bytes, repeats: int = 20) -> dict[str, Way]:
    from servelab.triton import control
    from servelab.triton.config import instance_count

    out = {}
    for name, (model, steps) in WAYS.items():
        if name == "client+onnx":
            target = bench.triton_tensor_target(url, model, [food11.preprocess(jpeg)])
        else:
            target = bench.triton_target(url, model, images=[jpeg])
        grpc = _grpc(url)
        instances = {s: instance_count(control.model_config(s, grpc_url=grpc)) for s in steps}
        out[name] = Way(name, model, steps, target, len(target.requests[0]), client_cpu_ms(name, jpeg, repeats),
                        instances)
    return out


def _grpc(url: str) -> str:
    import os

    from servelab.bench.warmup import _grpc_url

    try:
        return _grpc_url(url, os.environ.get("TRITON_GRPC_URL"))
    except ValueError:
        host = url.split("://")[-1].rsplit(":", 1)[0]
        return f"{host}:8001"


class StepsObserver(Observer):
    """Triton's statistics of every step of a way, before and after a run:
    ``result.extra["steps"][model]`` is ``servelab.triton.stats.stats_delta``."""

    def __init__(self, url: str, models):
        self.url, self.models = url, list(models)

    async def before(self) -> None:
        from servelab.bench.triton import asnapshot

        self._before = {m: await asnapshot(self.url, m) for m in self.models}

    async def after(self, result) -> None:
        import asyncio

        from servelab.bench.triton import asnapshot
        from servelab.triton.stats import stats_delta

        await asyncio.sleep(0.2)  # Triton counts a request just after its answer leaves
        result.extra["steps"] = {m: stats_delta(self._before[m], await asnapshot(self.url, m))
                                 for m in self.models}


def closed(url: str, way: Way, concurrency: int, requests: int, log=None):
    """A closed loop of ``concurrency`` clients (``run_checked``: repeated while invalid)."""
    return bench.run_checked(way.target, bench.closed(concurrency, requests=requests),
                             lambda: [StepsObserver(url, way.steps)], label=f"{way.name} x{concurrency}",
                             progress=False, log=log)


def poisson(url: str, way: Way, rate: float, seconds: float, log=None):
    return bench.run_checked(way.target, bench.open_loop(rate, "poisson", duration=seconds, seed=3),
                             lambda: [StepsObserver(url, way.steps)], label=f"{way.name} {rate:.0f}/s",
                             progress=False, log=log)


def step_times_ms(result) -> dict[str, dict[str, float]]:
    """Per step: mean queue and compute (input + infer + output) ms per request."""
    out = {}
    for model, d in (result.extra.get("steps") or {}).items():
        per = d.get("per_request_ms", {})
        out[model] = {"queue": per.get("queue", 0.0),
                      "compute": sum(per.get(k, 0.0) for k in ("compute_input", "compute_infer", "compute_output"))}
    return out


def predict(way: Way, service_ms: dict[str, float], concurrency: int) -> dict[str, float]:
    """The queueing model with one stage per step (servelab.bench.queueing,
    closed loop): each step is a station of ``instances`` copies taking
    ``service_ms`` per request; the slowest station (largest S/k) sets the
    throughput, and a request's latency is at least the sum of the steps."""
    stations = {s: queueing.closed_loop(concurrency, service_ms[s] / 1000, way.instances.get(s, 1))
                for s in way.steps}
    throughput = min(st["throughput"] for st in stations.values())
    unloaded = sum(service_ms[s] for s in way.steps) / 1000
    latency = max(unloaded, concurrency / throughput)  # Little's law: C = X * R
    bottleneck = min(stations, key=lambda s: stations[s]["throughput"])
    return {"throughput": throughput, "latency_ms": latency * 1000, "bottleneck": bottleneck}


def row(way: Way, result) -> dict:
    steps = step_times_ms(result)
    return {"way": way.name, "KB/request": way.bytes_per_request / 1024, "client CPU ms": way.client_cpu_ms,
            "p50 ms": result.latency.get("p50_ms", float("nan")), "p99 ms": result.latency.get("p99_ms", float("nan")),
            "req/s": result.throughput, "failed": result.error_count,
            "queue ms": sum(v["queue"] for v in steps.values()),
            "compute ms": " + ".join(f"{v['compute']:.1f}" for v in steps.values()),
            "valid": result.valid}


def table(rows: list[dict]) -> str:
    cols = ["way", "KB/request", "client CPU ms", "p50 ms", "p99 ms", "req/s", "queue ms", "compute ms", "failed"]
    lines = [" | ".join(f"{c:>13}" for c in cols)]
    for r in rows:
        cells = [f"{r[c]:13.1f}" if isinstance(r[c], float) else f"{r[c]!s:>13}" for c in cols]
        lines.append(" | ".join(cells) + ("" if r["valid"] else "   (inconclusive: machine busy)"))
    return "\n".join(lines)
