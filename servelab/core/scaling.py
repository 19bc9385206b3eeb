"""The scale-out lesson's one metric and one rule, shared by every place that uses them.

Prometheus (local replicas, the node's Compose stack), prometheus-adapter and the
HorizontalPodAutoscaler in ``k8s/``, and the notebooks all read the names from here, so
the metric a notebook computes is the one the autoscaler would act on.

The metric is Triton's average queue time per request over a window: the rise of
``nv_inference_queue_duration_us`` (cumulative microseconds requests spent queued)
divided by the rise of ``nv_inference_request_success`` (cumulative requests served),
both from Triton's metrics port. The rule is the HorizontalPodAutoscaler's
(Kubernetes documentation, "Horizontal Pod Autoscaling", algorithm details):
``desired = ceil(current * metric / target)``, unchanged while ``metric / target`` is
within the tolerance (the controller's default ``--horizontal-pod-autoscaler-tolerance``
is 0.1).
"""

from __future__ import annotations

import math

# The Prometheus recording rule / adapter metric name (snake case: also a valid
# Kubernetes custom-metric name).
METRIC = "servelab_queue_us_per_request"
# The window Prometheus takes the rise over. Long enough for several scrapes at the
# scrape interval below, short enough for the lesson's ramp steps.
WINDOW = "30s"
SCRAPE_INTERVAL = "5s"
# Triton's cumulative counters the metric is made of.
QUEUE_COUNTER = "nv_inference_queue_duration_us"
SUCCESS_COUNTER = "nv_inference_request_success"
# HPA's default tolerance: no change while metric/target is within 1 +/- 0.1.
TOLERANCE = 0.1


def promql(window: str = WINDOW, by: str = "", match: str = "") -> str:
    """The metric as a PromQL expression, summed over every replica (or ``by`` a label).

    ``match``: label matchers that pick the series, e.g. ``'job="triton_replicas"'``
    (prometheus-adapter passes ``<<.LabelMatchers>>``).
    """
    group = f" by ({by})" if by else ""
    sel = f"{{{match}}}" if match else ""
    return (f"sum{group}(delta({QUEUE_COUNTER}{sel}[{window}])) / "
            f"sum{group}(delta({SUCCESS_COUNTER}{sel}[{window}]))")


def query(prometheus_url: str, expr: str, at: float | None = None, timeout: float = 10.0) -> list[dict]:
    """Prometheus's HTTP API (``/api/v1/query``): the instant vector ``expr`` at time ``at``
    (Unix seconds; default now), as ``[{"metric": {labels}, "value": float}, ...]``."""
    params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    return _api(prometheus_url, "query", params, timeout)


def query_range(prometheus_url: str, expr: str, start: float, end: float, step: float,
                timeout: float = 10.0) -> list[dict]:
    """Prometheus's ``/api/v1/query_range``: ``expr`` every ``step`` seconds from ``start`` to ``end``
    (Unix seconds), as ``[{"metric": {labels}, "values": [(time, float), ...]}, ...]``."""
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    return _api(prometheus_url, "query_range", params, timeout)


def _api(prometheus_url: str, endpoint: str, params: dict, timeout: float) -> list[dict]:
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    expr = params["query"]
    url = prometheus_url.rstrip("/") + f"/api/v1/{endpoint}?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            doc = json.loads(r.read())
    except urllib.error.HTTPError as err:   # a bad query: Prometheus says why in a JSON body
        try:
            doc = json.loads(err.read())
        except ValueError:
            raise RuntimeError(f"Prometheus answered HTTP {err.code} for {expr}") from None
    if doc.get("status") != "success":
        raise RuntimeError(f"Prometheus answered {doc.get('errorType')}: {doc.get('error')} for {expr}")
    data = doc["data"]
    if data["resultType"] == "matrix":   # query_range
        return [{"metric": e["metric"], "values": [(float(t), float(v)) for t, v in e["values"]]}
                for e in data["result"]]
    if data["resultType"] == "scalar":
        return [{"metric": {}, "value": float(data["result"][1])}]
    return [{"metric": e["metric"], "value": float(e["value"][1])} for e in data["result"]]


def desired_replicas(current: int, metric: float, target: float, *, tolerance: float = TOLERANCE,
                     minimum: int = 1, maximum: int | None = None) -> int:
    """What the HorizontalPodAutoscaler asks for, given ``current`` replicas and the metric's value."""
    if current < 1 or target <= 0:
        raise ValueError(f"current={current} must be >= 1 and target={target} > 0")
    ratio = metric / target
    want = current if abs(ratio - 1.0) <= tolerance else math.ceil(current * ratio)
    want = max(minimum, want)
    return min(maximum, want) if maximum is not None else want


# The autoscaler's target, from the queueing model (servelab.bench.queueing's notation:
# S = S(1), one request's service time; rho = the utilization of one replica).
# The p99 budget is BUDGET_FACTOR x S(1), the kit's bound for a load that is still held
# (servelab.bench.queueing.sustained_bound: 10x the unloaded latency).
BUDGET_FACTOR = 10.0


def p99_response(rho: float, service: float) -> float:
    """A conservative p99 response at utilization ``rho`` of one replica fed Poisson arrivals:
    M/M/1's waiting-time tail, P(Wq > t) = rho * exp(-(1 - rho) t / S), whose exponential
    service is more variable than the deterministic S(1) of a GPU model, plus S itself."""
    if not 0 <= rho < 1:
        raise ValueError(f"utilization {rho} must be within [0, 1)")
    wait = service / (1 - rho) * math.log(100 * rho) if rho > 0.01 else 0.0
    return service + max(0.0, wait)


def held_utilization(budget_factor: float = BUDGET_FACTOR) -> float:
    """The highest utilization whose conservative p99 stays within ``budget_factor`` x S(1)."""
    if budget_factor <= 1:
        raise ValueError("the p99 budget must exceed one service time")
    lo, hi = 0.0, 1.0 - 1e-9
    for _ in range(100):  # p99_response rises with rho: bisection
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p99_response(mid, 1.0) <= budget_factor else (lo, mid)
    return lo


def queue_target_us(service_us: float, budget_factor: float = BUDGET_FACTOR) -> float:
    """The HPA's target for METRIC (queue microseconds per request): the mean queue time one
    replica shows at :func:`held_utilization`, from M/D/1 (Pollaczek-Khinchine with a
    deterministic S(1)): Wq = rho * S / (2 (1 - rho)). Above it, replicas are added before
    the conservative p99 leaves the budget."""
    if service_us <= 0:
        raise ValueError(f"S(1) = {service_us} us must be > 0")
    rho = held_utilization(budget_factor)
    return rho * service_us / (2 * (1 - rho))
