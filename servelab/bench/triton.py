"""Triton's side of a run: statistics deltas and metrics sampling.

Triton's ``/v2/models/<m>/versions/<v>/stats`` counters are cumulative since
the model loaded (and survive an identical-config reload), so one run's
figures come from the difference of two snapshots taken just before and just
after its measured window. Per-request times divide each phase's
nanoseconds by its count; the batch-size histogram counts executions per
batch size from ``batch_stats``.

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
import urllib.request

from servelab.bench import http
from servelab.bench.load import Observer, Result

PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def _base(url: str) -> str:
    host, port, _ = http.split_url(url)
    return f"http://{host}:{port}"


def stats_path(model: str, version: str | int | None = None) -> str:
    v = f"/versions/{version}" if version not in (None, "") else ""
    return f"/v2/models/{model}{v}/stats"


def _pick(doc: dict, model: str, version) -> dict:
    entries = [e for e in doc.get("model_stats", []) if e.get("name") == model]
    if version not in (None, ""):
        entries = [e for e in entries if str(e.get("version")) == str(version)] or entries
    if not entries:
        raise LookupError(f"no statistics for model {model!r} (is it loaded?)")
    return entries[0]


def snapshot(url: str, model: str, version: str | int | None = None, timeout: float = 10.0) -> dict:
    """The model's statistics entry now (synchronous)."""
    with urllib.request.urlopen(_base(url) + stats_path(model, version), timeout=timeout) as r:
        return _pick(json.loads(r.read()), model, version)


async def asnapshot(url: str, model: str, version: str | int | None = None, timeout: float = 10.0) -> dict:
    resp = await http.get(_base(url) + stats_path(model, version), timeout)
    if resp.status != 200:
        raise RuntimeError(f"stats for {model}: HTTP {resp.status} {resp.body[:200]!r}")
    return _pick(json.loads(resp.body), model, version)


def _d(after: dict, before: dict, *keys) -> int:
    a, b = after, before
    for k in keys:
        a, b = (a or {}).get(k, {}), (b or {}).get(k, {})
    return int(a or 0) - int(b or 0)


def stats_delta(before: dict, after: dict) -> dict:
    """What happened between two snapshots of one model's statistics.

    Returns counts (``requests`` = successful requests, ``failures``,
    ``inferences``, ``executions``), ``avg_batch_size``, ``per_request_ms``
    (queue / compute_input / compute_infer / compute_output, and ``total``
    = server time of a successful request), ``batch_histogram``
    ({batch_size: executions}) and ``per_batch_ms`` ({batch_size: mean
    compute time of one execution, input+infer+output}).
    """
    ib, ia = before.get("inference_stats", {}), after.get("inference_stats", {})
    out = {
        "model": after.get("name"), "version": after.get("version"),
        "requests": _d(ia, ib, "success", "count"),
        "failures": _d(ia, ib, "fail", "count"),
        "inferences": _d(after, before, "inference_count"),
        "executions": _d(after, before, "execution_count"),
    }
    out["avg_batch_size"] = out["inferences"] / out["executions"] if out["executions"] else None
    per_req = {}
    for ph in PHASES:
        n = _d(ia, ib, ph, "count")
        if n > 0:
            per_req[ph] = _d(ia, ib, ph, "ns") / n / 1e6
    n = _d(ia, ib, "success", "count")
    if n > 0:
        per_req["total"] = _d(ia, ib, "success", "ns") / n / 1e6
    out["per_request_ms"] = per_req
    bb = {e["batch_size"]: e for e in before.get("batch_stats", [])}
    hist, per_batch = {}, {}
    for e in after.get("batch_stats", []):
        b = e["batch_size"]
        prev = bb.get(b, {})
        n = _d(e, prev, "compute_infer", "count")
        if n <= 0:
            continue
        hist[b] = n
        ns = sum(_d(e, prev, ph, "ns") for ph in ("compute_input", "compute_infer", "compute_output"))
        per_batch[b] = ns / n / 1e6
    out["batch_histogram"] = dict(sorted(hist.items()))
    out["per_batch_ms"] = dict(sorted(per_batch.items()))
    return out


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
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
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

    async def _settled(self, want: int | None = None) -> dict:
        """A snapshot once Triton has finished counting.

        Triton counts a request a moment *after* its response leaves, so an
        immediate snapshot can miss the last answers (of the warm-up, before
        a run; of the run, after it). Poll until the success count stops
        moving and, after a run, covers every success the client saw (2 s
        at most: other clients, or failed requests, may keep it apart)."""
        deadline = time.perf_counter() + 2.0
        prev = await asnapshot(self.url, self.model, self.version)
        while time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
            snap = await asnapshot(self.url, self.model, self.version)
            count = _success(snap)
            if count == _success(prev) and (want is None or count - _success(self._before) >= want):
                return snap
            prev = snap
        return prev

    async def before(self) -> None:
        self._before = None
        self._before = await self._settled()
        if self.sampler:
            self.sampler.start()

    async def after(self, result: Result) -> None:
        if self.sampler:
            result.utilization = await self.sampler.stop()
        after = await self._settled(want=result.ok)
        result.server = stats_delta(self._before, after)


def _success(snap: dict) -> int:
    return int(snap.get("inference_stats", {}).get("success", {}).get("count", 0))


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
