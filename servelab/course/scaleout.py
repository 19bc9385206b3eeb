"""Notebook 6c's helpers: run one setup at one offered load and say where the requests went;
one step of the load ramp with the scale-out metric from Prometheus and the HPA rule's decision.

The notebook stays linear; what it calls is here. It runs in the Jupyter container (the
node's Compose stack) or the local Jupyter (``servelab scale up``): both give the same
variables (``SCALE_*``, ``PROMETHEUS_URL``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from servelab import bench
from servelab.core import scaling
from servelab.local.scale import backend_status  # noqa: F401  (the notebook reads HAProxy's table through here)
from servelab.triton import stats

# The Prometheus job of the replicas' metrics ports (servelab.local.scale writes it, locally and
# for the Compose stack's prometheus.yml).
REPLICA_JOB = "triton_replicas"


@dataclass
class SetupRun:
    """One setup at one offered rate: the client's view and each replica's count."""

    setup: str
    rate: float
    result: bench.Result
    per_replica: list[int] = field(default_factory=list)   # requests each Triton served
    compute_ms: float | None = None                        # mean server compute per request

    @property
    def row(self) -> dict:
        lat = self.result.latency
        return {"setup": self.setup, "offered/s": round(self.rate, 1), "ok": self.result.ok,
                "errors": self.result.error_count, "dropped": self.result.dropped,
                "throughput/s": round(self.result.throughput, 1), "p50 ms": round(lat.get("p50_ms", float("nan")), 1),
                "p99 ms": round(lat.get("p99_ms", float("nan")), 1), "per replica": self.per_replica,
                "compute ms": round(self.compute_ms, 1) if self.compute_ms is not None else "",
                "valid": self.result.valid}


def scraped_targets(prometheus_url: str, job: str, want: int, wait_s: float) -> list[dict]:
    """Prometheus's ``up`` series once ``want`` targets of ``job`` are in it, or as it is after
    ``wait_s`` seconds: a target appears only after Prometheus's first scrape of it, so a
    Prometheus started a moment ago answers with none."""
    deadline = time.monotonic() + wait_s
    while True:
        targets = scaling.query(prometheus_url, "up")
        if sum(t["metric"].get("job") == job for t in targets) >= want or time.monotonic() >= deadline:
            return targets
        time.sleep(0.5)


def service_ms(url: str, model: str, requests: int = 40) -> float:
    """Mean compute time (ms) of one request on the Triton at ``url`` while its instance is kept
    busy (two clients, one always waiting): what the queueing model calls S (input + inference +
    output, from Triton's own statistics). A lone request now and then reads slower: the runtime's
    threads go to sleep between requests and must wake up."""
    target = bench.triton_tensor_target(url, model)
    bench.warm(target, requests=8, concurrency=2)
    before = stats.snapshot(url, model)
    bench.run(target, bench.closed(2, requests=requests, warmup=0), progress=False)
    d = stats.stats_delta(before, stats.snapshot(url, model))
    per = d["per_request_ms"]
    return sum(per.get(k, 0.0) for k in ("compute_input", "compute_infer", "compute_output"))


def run_setup(setup: str, url: str, model: str, rate: float, seconds: float, servers: Sequence[str],
              attempts: int = 2, seed: int = 0, warm: bool = True) -> SetupRun:
    """Poisson arrivals at ``rate`` for ``seconds`` (the same schedule for every setup: same
    ``seed``) through ``url``; ``servers``: the Tritons behind it, whose statistics say how many
    requests each served."""
    target = bench.triton_tensor_target(url, model)
    if warm:
        bench.warm(target, requests=8, concurrency=4)
    pattern = bench.open_loop(rate, "poisson", duration=seconds, seed=seed, max_in_flight=64, overflow="drop")
    before = [stats.snapshot(u, model) for u in servers]
    result = bench.run_checked(target, pattern, lambda: [bench.HostCPUObserver()], label=setup,
                               attempts=attempts, progress=False)
    deltas = [stats.stats_delta(b, stats.snapshot(u, model)) for b, u in zip(before, servers)]
    served = sum(d["requests"] for d in deltas)
    compute = sum(sum(d["per_request_ms"].get(k, 0.0) for k in ("compute_input", "compute_infer", "compute_output"))
                  * d["requests"] for d in deltas) / served if served else None
    # run_checked may have run more than once: the counts are of every attempt, scaled to the kept one
    scale = result.ok / served if served and result.attempts > 1 else 1.0
    return SetupRun(setup, rate, result, [round(d["requests"] * scale) for d in deltas], compute)


def metric_over(prometheus_url: str, start: float, end: float, job: str = REPLICA_JOB) -> float:
    """The scale-out metric (µs of queue per request) between Unix times ``start`` and ``end``, as
    Prometheus computes it (servelab.core.scaling.promql, evaluated at ``end``); NaN without requests."""
    expr = scaling.promql(f"{max(1, round(end - start))}s", match=f'job="{job}"')
    got = scaling.query(prometheus_url, expr, at=end)
    return got[0]["value"] if got else float("nan")


@dataclass
class RampStep:
    rate: float
    metric_us: float            # the scale-out metric over the step, from Prometheus
    desired: int                # what the HPA rule asks for, from `current` replicas
    capped: bool                # the rule asked for more replicas than there are
    p99_ms: float               # measured with `current` replicas
    p99_at_desired_ms: float    # measured with the replicas the rule asked for
    runs: list = field(default_factory=list)


def ramp_step(rate: float, seconds: float, model: str, replica_urls: Sequence[str], balanced_url: str,
              prometheus_url: str, target_us: float, scrape_s: float, attempts: int = 2) -> RampStep:
    """One step of the ramp, from one replica (``replica_urls[0]``, called directly): measure it,
    read the metric from Prometheus over exactly that run (quiet counters before and after, so the
    window holds the whole run), apply the HPA rule; when it asks for more replicas, measure the
    same load through the least-connections balancer over ``min(desired, len(replica_urls))``."""
    time.sleep(2 * scrape_s)                  # counters still: the window starts in a quiet stretch
    start = time.time() - 1.5 * scrape_s
    one = run_setup("1 replica", replica_urls[0], model, rate, seconds, replica_urls[:1], attempts, warm=False)
    time.sleep(1.5 * scrape_s)                # scraped after the run
    metric = metric_over(prometheus_url, start, time.time())
    desired = scaling.desired_replicas(1, metric, target_us) if metric == metric else 1
    have = min(desired, len(replica_urls))
    runs = [one]
    p99_desired = one.result.latency["p99_ms"]
    if have > 1:
        more = run_setup(f"{have} replicas", balanced_url, model, rate, seconds, replica_urls[:have], attempts,
                         warm=False)
        runs.append(more)
        p99_desired = more.result.latency["p99_ms"]
    return RampStep(rate, metric, desired, desired > len(replica_urls), one.result.latency["p99_ms"], p99_desired,
                    runs)


def show(rows: Sequence[dict]) -> None:
    """Print ``rows`` (dicts with the same keys) as an aligned text table."""
    if not rows:
        print("(nothing)")
        return
    cols = list(rows[0])
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
