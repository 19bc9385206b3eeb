"""Triton's side of a load-generator run: statistics around it, metrics during it.

``TritonObserver`` snapshots the model's statistics just before and just
after the measured window and stores ``servelab.triton.stats_delta`` of the
two in ``Result.server`` (the one vocabulary: ``requests``, ``inferences``,
``executions``, ``avg_batch_size``, ``per_request_ms``, ``batch_histogram``,
``per_batch_ms``). ``asnapshot`` is ``servelab.triton.snapshot`` on the
load generator's event loop.

The metrics endpoint (Prometheus text on the metrics port, 8002 by default)
is sampled during the run: ``nv_gpu_utilization`` per GPU where there is one,
``nv_cpu_utilization`` (the host's CPU, 0..1) otherwise, plus the model's
``nv_inference_pending_request_count`` (requests waiting). Triton refreshes
GPU/CPU figures every ``--metrics-interval-ms`` (2000 ms unless the launcher
sets it lower).
"""

from __future__ import annotations

import asyncio
import json
import time

from servelab.bench import http, tasks
from servelab.bench.load import Observer, Result
from servelab.triton import stats


async def asnapshot(url: str, model: str, version: str | int | None = None, timeout: float = 10.0) -> dict:
    """``servelab.triton.snapshot``, without blocking the event loop."""
    resp = await http.get(stats.base_url(url) + stats.stats_path(model, version), timeout)
    if resp.status != 200:
        raise RuntimeError(f"stats for {model}: HTTP {resp.status} {resp.body[:200]!r}")
    return stats.pick(json.loads(resp.body), model, version)


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """``name{label="v",...} value`` lines -> (name, labels, value); comments skipped."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        try:
            head, value = line.rsplit(" ", 1)
            val = float(value)
        except ValueError:
            continue
        labels: dict[str, str] = {}
        if "{" in head:
            name, _, rest = head.partition("{")
            for part in rest.rstrip("}").split(","):
                if "=" in part:
                    k, _, v = part.partition("=")
                    labels[k.strip()] = v.strip().strip('"')
        else:
            name = head
        out.append((name.strip(), labels, val))
    return out


def utilization_sample(text: str, model: str | None = None) -> dict[str, float]:
    """The series the kit plots, from one metrics page."""
    sample: dict[str, float] = {}
    for name, labels, val in parse_prometheus(text):
        if name == "nv_gpu_utilization":
            sample[f"GPU {labels.get('gpu_uuid', '?')[:12]}"] = val
        elif name == "nv_cpu_utilization":
            sample["CPU"] = val
        elif name == "nv_inference_pending_request_count" and model and labels.get("model") == model:
            sample["pending requests"] = sample.get("pending requests", 0.0) + val
    return sample


class MetricsSampler:
    """Polls a Triton metrics URL every ``interval`` seconds on the running loop."""

    def __init__(self, metrics_url: str, model: str | None = None, interval: float = 0.5):
        host, port, path = http.split_url(metrics_url)
        self.url = f"http://{host}:{port}{path or '/metrics'}"
        self.model, self.interval = model, interval
        self.t: list[float] = []
        self.series: dict[str, list[float]] = {}
        self._task: asyncio.Task | None = None
        self._t0 = 0.0
        self.errors = 0

    async def _poll(self) -> None:
        while True:
            t = time.perf_counter() - self._t0
            try:
                resp = await http.get(self.url, timeout=2.0)
                sample = utilization_sample(resp.body.decode("utf-8", "replace"), self.model)
            except (http.HTTPError, OSError):
                self.errors += 1
                sample = None
            if sample:
                n = len(self.t)
                self.t.append(t)
                for k, v in sample.items():
                    self.series.setdefault(k, [float("nan")] * n).append(v)
                for k, vs in self.series.items():
                    if len(vs) < n + 1:
                        vs.append(float("nan"))
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._task = asyncio.ensure_future(self._poll())

    async def stop(self) -> dict:
        await tasks.cancel_and_wait(self._task)
        return {"source": self.url, "interval_s": self.interval, "t": self.t, "series": self.series}


class TritonObserver(Observer):
    """Snapshot a model's statistics around the run; optionally sample metrics.

    ``url`` is Triton's HTTP ``host:port``; ``metrics_url`` its metrics
    endpoint (e.g. ``127.0.0.1:8002``), or None to skip sampling.
    """

    def __init__(self, url: str, model: str, version: str | int | None = None,
                 metrics_url: str | None = None, interval: float = 0.5):
        self.url, self.model, self.version = url, model, version
        self.sampler = MetricsSampler(metrics_url, model, interval) if metrics_url else None
        self._before: dict | None = None

    async def _settled(self, want: int = 0) -> dict:
        """``stats.settled`` on a thread of its own: after a run, the successes cover every one
        the client saw (``want``) beyond the snapshot before it."""
        at_least = stats.success(self._before) + want if self._before else 0
        return await asyncio.to_thread(stats.settled, self.url, self.model, self.version, at_least)

    async def before(self) -> None:
        self._before = None
        self._before = await self._settled()
        if self.sampler:
            self.sampler.start()

    async def after(self, result: Result) -> None:
        if self.sampler:
            result.utilization = await self.sampler.stop()
        after = await self._settled(want=result.ok)
        result.server = stats.stats_delta(self._before, after)


class HostCPUObserver(Observer):
    """Samples this host's CPU utilization (psutil) during a run, 0..1.

    For endpoints without a metrics port (the FastAPI services run locally).
    """

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self._task = None
        self.t: list[float] = []
        self.values: list[float] = []

    async def _poll(self) -> None:
        import psutil
        psutil.cpu_percent(None)
        t0 = time.perf_counter()
        while True:
            await asyncio.sleep(self.interval)
            self.t.append(time.perf_counter() - t0)
            self.values.append(psutil.cpu_percent(None) / 100.0)

    async def before(self) -> None:
        self._task = asyncio.ensure_future(self._poll())

    async def after(self, result: Result) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        result.utilization = {"source": "host CPU (psutil)", "interval_s": self.interval,
                              "t": self.t, "series": {"CPU": self.values}}
