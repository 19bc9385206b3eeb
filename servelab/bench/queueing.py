"""A small queueing model of one inference server, to explain measurements.

Notation: ``S`` is the service time of one execution (seconds), ``lam`` the
arrival rate (requests/s), ``rho = lam * S`` the utilization, ``C`` the
number of closed-loop clients, ``k`` the number of model instances.

(a) Closed loop, no think time. Each client sends its next request as soon as
    the last one returns, so ``C`` requests are always in the system. With
    ``k`` instances each serving one at a time, throughput is
    ``X = min(C, k) / S`` and by Little's law (``C = X * R``) the latency is
    ``R = max(1, C / k) * S``. One instance: ``R = C * S`` -- "8 clients,
    ~8x the inference delay" -- and throughput does not grow at all.

(b) Open loop at rate ``lam``, deterministic service ``S``, one instance.
    Poisson arrivals (M/D/1, Pollaczek-Khinchine with zero service variance):
    mean wait ``Wq = rho * S / (2 * (1 - rho))``, response ``W = Wq + S``.
    Constant arrivals with ``rho < 1`` (D/D/1): nobody ever waits, ``W = S``.
    Same mean rate, different latency: the queue comes from the bursts.

(c) Dynamic batching. A batch of ``b`` takes ``S(b) = a + c * b`` (fixed cost
    ``a`` per execution plus ``c`` per request; fitted from Triton's
    ``batch_stats``). When the server stays busy, each batch holds the
    requests that arrived while the previous one ran: ``b = lam * S(b)``, so
    ``b* = lam * a / (1 - lam * c)`` (at least 1). A request arriving while a
    batch runs waits on average half of it (the residual of a deterministic
    service) and is served in the next one: ``W ~= rho_b * S(b*) / 2 + S(b*)``
    with ``rho_b = min(1, lam * S(b*) / b*)`` the fraction of time busy. Never
    more than one batch of waiting: the queue cannot build up as in (b) until
    ``lam * c`` reaches 1.

(d) Scale-out: ``c`` servers of rate ``mu = 1/S`` each, Poisson arrivals at ``lam``,
    exponential service (the textbook's assumption: an inference's time varies far less, so
    these models overstate every wait; they rank the setups, they do not time them).
    One queue for all ``c`` (instances inside one Triton): M/M/c; a request waits with the
    Erlang C probability ``Pw`` and then ``Exp(c*mu - lam)``. One queue per server, arrivals
    split blindly at random: ``c`` x M/M/1 at ``lam/c``, response ``Exp(mu - lam/c)``. Split in
    turn (round-robin): each server sees every ``c``-th Poisson arrival, Erlang-``c`` gaps, a
    GI/M/1 queue whose response is ``Exp(mu * (1 - sigma))`` with ``sigma`` the root in (0, 1) of
    ``sigma = (lam / (lam + mu * (1 - sigma)))**c``. Any policy that commits a request to one
    server when it arrives can leave a server idle while another has a queue; one shared queue
    never does, so M/M/c is the floor; joining the shortest queue is the best of those policies
    for identical exponential servers (W. Winston, "Optimality of the shortest line discipline",
    Journal of Applied Probability 14(1), 1977), so a least-connections balancer should land
    between M/M/c and the round-robin split. No closed form for it is used here.

(e) Token streams (``simulate_streams``). A request asks for ``L`` tokens; a decoding step
    of a batch of ``b`` takes ``step(b)``, and a request's prompt ``prefill`` first. Request
    level: an idle model takes up to ``max_batch`` waiting requests and steps until the
    longest is done; a request arriving meanwhile waits for that, so with lengths 16 and
    256 it mostly waits out 256 steps however short it is (head-of-line blocking). Iteration
    level: every step takes in whoever is waiting (up to ``max_batch`` live), so a request
    waits at most one step unless ``max_batch`` are live. Simulated on the run's own
    arrivals and lengths, the gap in time to first token between the two is the model's
    prediction for the measured gap.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence


def closed_loop(concurrency: int, service_s: float, instances: int = 1) -> dict[str, float]:
    """Predicted latency (s) and throughput (1/s) of a closed loop (a)."""
    if concurrency < 1 or instances < 1:
        raise ValueError("concurrency and instances must be >= 1")
    if service_s <= 0:
        raise ValueError("service time must be > 0")
    latency = max(1.0, concurrency / instances) * service_s
    throughput = min(concurrency, instances) / service_s
    return {"latency_s": latency, "throughput": throughput}


def servers(health: Mapping, service_s: float, decode_s: float = 0.0) -> float:
    """``k`` for :func:`closed_loop`: how many requests a FastAPI service works
    on at once, from its ``/health`` (``device``, ``workers``, ``cores``).

    On the CPU: ``workers`` inferences at once (one per core); each request's
    decoding runs on the same cores and is part of ``S``. On CUDA: ``workers``
    inferences (one) on the GPU at a time, while the decoding (``decode_s``, on
    the CPU, up to one per core at once) runs outside that slot, beside the
    GPU's pass. The two stages then finish a request every
    ``max((S - D) / workers, D / cores)``, so ``k = S / max((S - D) / workers, D / cores)``
    (at least 1; ``D = 0`` gives ``workers``)."""
    workers = max(1, int(health.get("workers") or 1))
    if health.get("device") != "cuda":
        return float(workers)
    cores = max(1, int(health.get("cores") or 1))
    decode_s = min(max(0.0, decode_s), service_s)
    per_request = max((service_s - decode_s) / workers, decode_s / cores)
    return max(1.0, service_s / per_request) if per_request > 0 else float(workers)


def utilization(rate: float, service_s: float) -> float:
    return rate * service_s


def md1_wait(rate: float, service_s: float) -> float:
    """Mean queueing delay (s) of M/D/1; ``inf`` when ``rho >= 1``."""
    rho = utilization(rate, service_s)
    if rho >= 1:
        return math.inf
    return rho * service_s / (2.0 * (1.0 - rho))


def md1_response(rate: float, service_s: float) -> float:
    """Mean latency (s) of M/D/1: queueing delay plus service."""
    return md1_wait(rate, service_s) + service_s


def dd1_wait(rate: float, service_s: float) -> float:
    """Mean queueing delay (s) with evenly spaced arrivals: 0 below saturation."""
    return 0.0 if utilization(rate, service_s) <= 1 else math.inf


def dd1_response(rate: float, service_s: float) -> float:
    return dd1_wait(rate, service_s) + service_s


def fit_batch_service(points: Mapping[int, tuple[float, int]]) -> tuple[float, float]:
    """Fit ``S(b) = a + c*b`` to ``{batch_size: (mean_service_s, executions)}``.

    Weighted least squares by the number of executions. With a single batch
    size there is no slope to fit: ``c = 0`` and ``a`` is that mean.
    """
    pts = [(b, s, n) for b, (s, n) in points.items() if n > 0]
    if not pts:
        raise ValueError("no batch statistics to fit")
    if len({b for b, _, _ in pts}) == 1:
        s = sum(s * n for _, s, n in pts) / sum(n for *_, n in pts)
        return s, 0.0
    w = sum(n for *_, n in pts)
    mb = sum(b * n for b, _, n in pts) / w
    ms = sum(s * n for _, s, n in pts) / w
    var = sum(n * (b - mb) ** 2 for b, _, n in pts)
    cov = sum(n * (b - mb) * (s - ms) for b, s, n in pts)
    c = max(0.0, cov / var)
    a = max(0.0, ms - c * mb)
    return a, c


def batched_batch_size(rate: float, a: float, c: float, max_batch: int = 16) -> float:
    """Steady-state batch size ``b* = lam*a / (1 - lam*c)``, within [1, max_batch]."""
    if rate * c >= 1:
        return float(max_batch)
    return min(float(max_batch), max(1.0, rate * a / (1.0 - rate * c)))


def batched_response(rate: float, a: float, c: float, max_batch: int = 16,
                     queue_delay_s: float = 0.0) -> float:
    """Mean latency (s) under dynamic batching, model (c).

    ``queue_delay_s`` is Triton's ``max_queue_delay_microseconds``: when the
    server is idle a request may wait up to that long for company; it is added
    in proportion to the idle fraction.
    """
    b = batched_batch_size(rate, a, c, max_batch)
    s_b = a + c * b
    busy = min(1.0, rate * s_b / b)
    return busy * s_b / 2.0 + s_b + (1.0 - busy) * queue_delay_s


def gap_pct(predicted: float, measured: float) -> float:
    """How far the measurement is from the prediction, in % of the prediction."""
    if predicted == 0 or math.isinf(predicted) or math.isnan(predicted):
        return math.nan
    return 100.0 * (measured - predicted) / predicted


@dataclass
class Comparison:
    """One predicted-vs-measured line of a report."""

    case: str
    model: str
    predicted_ms: float
    measured_ms: float

    @property
    def gap_pct(self) -> float:
        return gap_pct(self.predicted_ms, self.measured_ms)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["gap_pct"] = self.gap_pct
        return d


# --------------------------------------------------------------------------
# (d) Curves by simulation: p50 / p99, not only the mean
# --------------------------------------------------------------------------
#
# Percentiles of these queues have no short closed form, so the kit simulates
# them: Poisson (or evenly spaced) arrivals at rate ``lam``, one model
# instance, first come first served. Without batching the instance serves one
# request in S(1) (M/D/1). With dynamic batching (Triton's scheduler with no
# queue delay) an idle instance starts at once on the first request; a busy
# one, when it finishes, takes every waiting request up to ``max_batch`` and
# serves them together in S(b). The batch cost S(b) is the *measured* curve
# (``BatchCost``), interpolated between the sizes measured.


class BatchCost:
    """S(b): seconds one execution of a batch of ``b`` takes, from measurements
    ``{b: seconds}``; linear between measured sizes and beyond the last."""

    def __init__(self, points: Mapping[int, float]):
        pts = sorted((int(b), float(s)) for b, s in points.items() if s and s > 0)
        if not pts:
            raise ValueError("no batch-cost points")
        self.sizes = [b for b, _ in pts]
        self.seconds = [s for _, s in pts]

    def __call__(self, b: int) -> float:
        xs, ys = self.sizes, self.seconds
        if len(xs) == 1:
            return ys[0] * b / xs[0] if b > xs[0] else ys[0]
        if b <= xs[0]:
            return ys[0]
        for i in range(1, len(xs)):
            if b <= xs[i]:
                f = (b - xs[i - 1]) / (xs[i] - xs[i - 1])
                return ys[i - 1] + f * (ys[i] - ys[i - 1])
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + slope * (b - xs[-1])

    def per_item(self, b: int) -> float:
        return self(b) / b

    def capacity(self, max_batch: int = 1) -> float:
        """Requests/s one instance completes when always busy with full batches."""
        return max(b / self(b) for b in range(1, max_batch + 1))

    def as_dict(self) -> dict:
        return {b: s for b, s in zip(self.sizes, self.seconds)}


def cost_seen(runs: Sequence[Mapping], fallback: BatchCost) -> BatchCost:
    """S(b) as the server showed it during ``runs`` (Triton's per-batch-size
    compute times, ``stats_delta``'s ``per_batch_ms`` / ``batch_histogram``):
    a line a + c*b fitted with each size weighted by its executions. Under
    open-loop load the client and Triton's frontend share the cores, so an
    execution can cost more than in a quiet measurement; a model meant to
    match the load runs uses what those runs saw. ``fallback`` when the runs
    saw fewer than 5 executions, or no sensible line (a < 0, c <= 0)."""
    total: dict[int, list[float]] = {}
    for server in runs:
        hist, per = (server or {}).get("batch_histogram") or {}, (server or {}).get("per_batch_ms") or {}
        for b, n in hist.items():
            ms = per.get(b, per.get(str(b)))
            if ms:
                acc = total.setdefault(int(b), [0.0, 0.0])
                acc[0] += n
                acc[1] += n * ms / 1000
    if sum(n for n, _ in total.values()) < 5:
        return fallback
    pts = {b: (n, s / n) for b, (n, s) in total.items()}
    if len(pts) == 1:
        (b, (_, sec)), = pts.items()
        return BatchCost({1: sec / b})                     # one size seen: S(b) = b x that cost / size
    w = sum(n for n, _ in pts.values())
    mb = sum(n * b for b, (n, _) in pts.items()) / w
    ms = sum(n * sec for n, sec in pts.values()) / w
    var = sum(n * (b - mb) ** 2 for b, (n, _) in pts.items())
    c = sum(n * (b - mb) * (sec - ms) for b, (n, sec) in pts.items()) / var
    a = ms - c * mb
    if c <= 0 or a < 0:
        return fallback
    return BatchCost({1: a + c, 16: a + 16 * c})


def simulate(rate: float, cost: BatchCost, max_batch: int = 1, n: int = 20000,
             distribution: str = "poisson", seed: int = 1, queue_delay_s: float = 0.0) -> dict:
    """Simulated server-side latencies (wait + service, seconds) of ``n`` requests.

    Returns ``{"latencies": ndarray, "arrivals": ndarray, "batches": [sizes], "stable": bool}``;
    ``stable`` is False when the backlog was still growing at the end (the
    offered load is past what the configuration serves)."""
    import numpy as np

    from servelab.bench import schedule
    arr = schedule.offsets(rate, n, distribution, seed)
    lat = np.empty(n)
    batches: list[int] = []
    free = 0.0            # when the instance is next free
    i = 0
    while i < n:
        t = arr[i]
        if free <= t:     # idle: start now (or after the allowed queue delay) with what is there
            start = t + (queue_delay_s if max_batch > 1 else 0.0)
        else:
            start = free
        j = i + 1
        while j < n and j - i < max_batch and arr[j] <= start:
            j += 1
        b = j - i
        end = start + cost(b)
        lat[i:j] = end - arr[i:j]
        batches.append(b)
        free = end
        i = j
    tail = lat[-max(1, n // 10):]
    stable = bool(np.median(tail) < 4 * np.median(lat[: max(1, n // 10)]) + 2 * cost(max_batch))
    return {"latencies": lat, "arrivals": arr, "batches": batches, "stable": stable}


def simulated_percentiles(rate: float, cost: BatchCost, max_batch: int = 1, n: int = 20000,
                          distribution: str = "poisson", seed: int = 1,
                          queue_delay_s: float = 0.0) -> dict:
    """p50 / p99 / mean latency (s) and mean batch of the simulated queue."""
    import numpy as np
    sim = simulate(rate, cost, max_batch, n, distribution, seed, queue_delay_s)
    lat = sim["latencies"][n // 20:]          # drop the empty-queue start
    return {"p50_s": float(np.percentile(lat, 50)), "p99_s": float(np.percentile(lat, 99)),
            "mean_s": float(lat.mean()), "avg_batch": float(np.mean(sim["batches"])),
            "stable": sim["stable"]}


def simulated_run_p99(rate: float, cost: BatchCost, max_batch: int, duration_s: float,
                      max_in_flight: int = 32, overhead_s: float = 0.0, seeds=(1, 2, 3)) -> float:
    """The p99 latency (s) one measured sweep run would show if the server were
    the model: Poisson arrivals for ``duration_s`` at ``rate``, latency plus
    ``overhead_s``; ``inf`` when more than ``max_in_flight`` requests would be
    in the system at once (the load generator drops arrivals then, and such a
    run counts as not sustained). Median over a few seeds."""
    import numpy as np

    n = max(20, int(round(rate * duration_s)))
    out = []
    for seed in seeds:
        sim = simulate(rate, cost, max_batch, n, "poisson", seed)
        lat, arr = sim["latencies"], sim["arrivals"]
        done = arr + lat
        in_system = max(int(np.count_nonzero(done[:i] > arr[i])) + 1 for i in range(n))
        out.append(math.inf if in_system > max_in_flight else float(np.percentile(lat, 99)) + overhead_s)
    return float(np.median(out))


def predicted_crossing(rates, cost: BatchCost, max_batch: int, bound_s: float, duration_s: float,
                       max_in_flight: int = 32, overhead_s: float = 0.0, seeds=(1, 2, 3)) -> float | None:
    """``crossing`` applied to the model at the sweep's own offered rates, run
    lengths and in-flight cap: the measured and the predicted sustained load
    are then read off the same grid, the same way. Pass the sweep's own
    ``seeds=(seed,)`` and the model meets the very arrival times the client
    sent (``schedule.offsets``): a short run's p99 is set by its largest
    burst, so with other arrival times the two p99s differ by chance."""
    return crossing(simulated_sweep(rates, cost, max_batch, duration_s, max_in_flight, overhead_s, seeds), bound_s)


def simulated_sweep(rates, cost: BatchCost, max_batch: int, duration_s: float, max_in_flight: int = 32,
                    overhead_s: float = 0.0, seeds=(1, 2, 3)) -> list[tuple[float, float]]:
    """[(rate, ``simulated_run_p99``)] at each offered rate: the model's sweep curve."""
    return [(r, simulated_run_p99(r, cost, max_batch, duration_s, max_in_flight, overhead_s, seeds)) for r in rates]


def sustained_bound(unloaded_s: float, cost: BatchCost, max_batch: int = 16, factor: float = 10.0) -> float:
    """The p99 (s) a sweep run may show and still count as sustained: ``factor``
    x the unloaded latency, but never less than two full batches, 2 S(max_batch).
    With batching on, a request that just missed a full batch waits for it and
    then rides in the next one, so a server that keeps up still shows up to
    2 S(16) in its tail; a tighter bound would call such a run overloaded and
    the comparison would read the tail of burst-formed batches (whose cost on a
    shared CPU varies run to run), not the load the server holds."""
    return max(factor * unloaded_s, 2.0 * cost(max_batch))


def knee(points, bound: float):
    """The two points a curve's first rise past ``bound`` lies between:
    ((rate, value) of the last point within it, (rate, value) of the first
    past it); None when the curve starts past the bound or never rises past it."""
    pts = sorted(points)
    if not pts or not (pts[0][1] <= bound):
        return None
    for p0, p1 in zip(pts, pts[1:]):
        if not (p1[1] <= bound):
            return p0, p1
    return None


def crossing(points, bound: float) -> float | None:
    """Where a measured curve first rises past ``bound``: ``points`` is
    [(offered rate, value or inf)] sorted by rate. Interpolates linearly
    between the last point within the bound and the first one past it;
    None when the first point is already past it, the last rate when none is."""
    pts = sorted(points)
    if not pts or not (pts[0][1] <= bound):
        return None
    gap = knee(pts, bound)
    if gap is None:
        return pts[-1][0]
    (r0, v0), (r1, v1) = gap
    if math.isinf(v1) or math.isnan(v1):
        return r0
    return r0 + (r1 - r0) * (bound - v0) / (v1 - v0)


def measured_points(runs) -> list[tuple[float, float]]:
    """(offered rate, p99 s) of load-sweep runs (``servelab.bench.Result``) for
    ``crossing``: inf for a run that dropped or lost requests (its p99 only
    covers the requests that came back)."""
    return [(r.pattern["rate"], r.latency["p99_ms"] / 1000 if not (r.dropped or r.error_count) else math.inf)
            for r in runs]


def refine_rates(curves, bound: float, widest: float) -> list[float]:
    """Rates to add to a sweep so that each curve's knee (see ``knee``) is
    bracketed by rates at most ``widest`` x apart: the geometric midpoint of
    every wider knee gap. A run past the bound that dropped requests is read
    as the rate before it, so a coarse grid alone can put two curves a whole
    grid step apart."""
    out = set()
    for pts in curves:
        gap = knee(pts, bound)
        if gap is not None and gap[1][0] > widest * gap[0][0]:
            out.add(round(math.sqrt(gap[0][0] * gap[1][0]), 1))
    return sorted(out)


# --------------------------------------------------------------------------
# (d) Scale-out: one shared queue vs one queue per replica
# --------------------------------------------------------------------------

def erlang_c(servers: int, rate: float, service_s: float) -> float:
    """Probability that an arrival waits in M/M/c (``servers`` = c); 1.0 at or past saturation."""
    a = rate * service_s                       # offered load in servers
    if a >= servers:
        return 1.0
    term, total = 1.0, 1.0
    for k in range(1, servers):
        term *= a / k
        total += term
    last = term * a / servers / (1.0 - a / servers)
    return last / (total + last)


def _quantile(survival, p: float, hi: float) -> float:
    """The time t with P(T > t) = 1 - p, by bisection (survival decreasing)."""
    lo = 0.0
    while survival(hi) > 1.0 - p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if survival(mid) > 1.0 - p else (lo, mid)
    return (lo + hi) / 2.0


def mmc_response(servers: int, rate: float, service_s: float, p: float | None = None) -> float:
    """M/M/c response time (s): the mean, or the ``p``-quantile (``p=0.99``); inf past saturation."""
    mu = 1.0 / service_s
    if rate >= servers * mu:
        return math.inf
    pw, theta = erlang_c(servers, rate, service_s), servers * mu - rate
    if p is None:
        return pw / theta + service_s

    def survival(t: float) -> float:   # wait W (0, or Exp(theta)) plus service Exp(mu)
        if abs(theta - mu) < 1e-12 * mu:
            both = math.exp(-mu * t) * (1.0 + mu * t)
        else:
            both = (theta * math.exp(-mu * t) - mu * math.exp(-theta * t)) / (theta - mu)
        return (1.0 - pw) * math.exp(-mu * t) + pw * both

    return _quantile(survival, p, service_s)


def _exp_response(rate_out: float, p: float | None) -> float:
    if rate_out <= 0:
        return math.inf
    return 1.0 / rate_out if p is None else -math.log(1.0 - p) / rate_out


def random_split_response(servers: int, rate: float, service_s: float, p: float | None = None) -> float:
    """``c`` x M/M/1, each at ``rate / c``: the mean or ``p``-quantile response (s)."""
    return _exp_response(1.0 / service_s - rate / servers, p)


def round_robin_sigma(servers: int, rate: float, service_s: float) -> float:
    """GI/M/1's ``sigma`` for a server that gets every ``c``-th Poisson arrival (Erlang-c gaps)."""
    mu = 1.0 / service_s
    if rate >= servers * mu:
        return 1.0
    sigma = 0.0
    for _ in range(10000):
        new = (rate / (rate + mu * (1.0 - sigma))) ** servers
        if abs(new - sigma) < 1e-13:
            break
        sigma = new
    return sigma


def round_robin_response(servers: int, rate: float, service_s: float, p: float | None = None) -> float:
    """Round-robin split of Poisson arrivals over ``c`` exponential servers: mean or ``p``-quantile (s)."""
    return _exp_response((1.0 - round_robin_sigma(servers, rate, service_s)) / service_s, p)


def scale_out_predictions(servers: int, rate: float, service_s: float) -> dict[str, dict[str, float]]:
    """{model: {"mean_s", "p50_s", "p99_s"}} for one shared queue (M/M/c), a round-robin split
    and a random split, at the same ``rate`` and total capacity ``servers / service_s``."""
    out = {}
    for name, fn in (("M/M/c (one queue)", mmc_response), ("round-robin split (E_c/M/1 each)", round_robin_response),
                     ("random split (c x M/M/1)", random_split_response)):
        out[name] = {"mean_s": fn(servers, rate, service_s), "p50_s": fn(servers, rate, service_s, 0.5),
                     "p99_s": fn(servers, rate, service_s, 0.99)}
    return out


# -- past capacity: a bounded queue ------------------------------------------------------------------

def mmck(servers: int, rate: float, service_s: float, capacity: int) -> dict[str, float]:
    """M/M/c/K: Poisson arrivals, exponential service, ``servers`` copies, at most ``capacity``
    requests in the system (in service + queued); an arrival that finds it full is rejected.
    Returns the rejection probability, the served rate (goodput) and the served requests' mean
    response time (Little's law on the served flow)."""
    if capacity < servers:
        raise ValueError("capacity counts the requests in service too: it must be >= servers")
    a = rate * service_s
    weights = [a ** n / math.factorial(n) if n <= servers
               else a ** servers / math.factorial(servers) * (a / servers) ** (n - servers)
               for n in range(capacity + 1)]
    total = sum(weights)
    p = [w / total for w in weights]
    served = rate * (1 - p[capacity])
    in_system = sum(n * pn for n, pn in enumerate(p))
    return {"reject": p[capacity], "goodput": served, "mean_s": in_system / served if served else math.inf}


def simulate_bounded(rate: float, service_s: float, capacity: int, n: int = 20000, seed: int = 1) -> dict:
    """One server, FIFO, a fixed service time, at most ``capacity`` requests in the system, Poisson
    arrivals: the rejected share and the served requests' latencies (s). ``capacity=None``: no bound."""
    import numpy as np

    from servelab.bench import schedule
    arr = schedule.offsets(rate, n, "poisson", seed)
    ends: list[float] = []          # completion times of the requests still in the system, in order
    lat, rejected, free, head = [], 0, 0.0, 0
    for t in arr:
        while head < len(ends) and ends[head] <= t:
            head += 1
        if capacity is not None and len(ends) - head >= capacity:
            rejected += 1
            continue
        free = max(free, t) + service_s
        ends.append(free)
        lat.append(free - t)
    return {"reject": rejected / n, "latencies": np.array(lat), "arrivals": arr}


# Triton 2.51's dynamic batcher with a queue policy (read in triton-inference-server/core, branch
# r24.10): any default_queue_policy bound, timeout or priority level turns its prefetching off
# (src/scheduler_utils.cc, PriorityQueue's constructor), so the batcher hands a request over only
# when the copy is waiting for one (src/rate_limiter.cc, PayloadSlotAvailable). When the copy
# finishes, the executed payload's callback wakes the batcher (src/payload.cc, Execute), before
# the copy's thread asks for its next payload (src/backend_model_instance.cc, BackendThread); a
# batcher that looks in between finds no copy waiting and sleeps on. An arrival wakes it only if
# it enters the queue: a full queue rejects it before the wake (src/dynamic_batch_scheduler.cc,
# Enqueue). Left alone, the batcher looks again every 500 ms (WaitForPayloadSlotAvailable).
BATCHER_TIMER_S = 0.5


def simulate_missed_wakes(rate: float, service_s: float, queue_size: int, miss: float,
                          timer_s: float = BATCHER_TIMER_S, n: int = 20000, seed: int = 1) -> dict:
    """One copy, a fixed service time, at most ``queue_size`` requests waiting (the one in service
    not counted), Poisson arrivals, and the wake-up rule above (:func:`serve_with_misses`).
    ``miss=0`` is :func:`simulate_bounded` with ``capacity=queue_size + 1``. Returns the rejected
    share, the served requests' latencies (s) and the copy's busy share."""
    from servelab.bench import schedule
    arr = schedule.offsets(rate, n, "poisson", seed)
    out = serve_with_misses(arr, None, service_s, queue_size, miss, timer_s, seed)
    return {**out["all"], "busy": out["busy"]}


def serve_with_misses(arrivals: Sequence[float], levels: Sequence[str] | None, service_s: float,
                      queue_size: int, miss: float, timer_s: float = BATCHER_TIMER_S, seed: int = 1) -> dict:
    """``arrivals`` (s, in order), each of a level ("high" or "low"; ``levels=None``: one level,
    "all"), to one copy with a fixed service time; each level keeps at most ``queue_size``
    requests waiting, and a free copy takes the oldest "high" request first. When the copy
    finishes with requests waiting, the next one starts at once, except with probability
    ``miss``: then the copy idles until an arrival enters a queue (an arrival to a full queue is
    rejected and wakes nothing), or until the batcher's timer, every ``timer_s`` from the last
    hand-over. Returns, per level, the rejected share and the served latencies (s), and the
    copy's busy share."""
    import numpy as np

    if not 0 <= miss <= 1:
        raise ValueError(f"miss is a probability, got {miss}")
    n = len(arrivals)
    levels = ["all"] * n if levels is None else list(levels)
    order = [k for k in ("high", "low", "all") if k in set(levels)]
    waiting: dict[str, deque] = {k: deque() for k in order}
    out = {k: {"sent": 0, "rejected": 0, "latencies": []} for k in order}
    coin = np.random.default_rng(seed + 1).random(max(1, n))
    busy_s, handed = 0.0, 0
    done = stall = math.inf      # the copy's completion; the end of an idle spell with requests waiting
    last = 0.0                   # the last hand-over: the batcher's timer counts from it

    def hand_over(t):
        nonlocal done, stall, last, busy_s
        k = next(k for k in order if waiting[k])
        out[k]["latencies"].append(t + service_s - waiting[k].popleft())
        done, stall, last = t + service_s, math.inf, t
        busy_s += service_s

    i = 0
    while i < n or done < math.inf or stall < math.inf:
        t = min(arrivals[i] if i < n else math.inf, done, stall)
        if t == done:
            done = math.inf
            if any(waiting.values()):
                handed += 1
                if coin[handed % len(coin)] < miss:   # the wake came too early: the batcher sleeps on
                    stall = last + (math.floor((t - last) / timer_s) + 1) * timer_s
                else:
                    hand_over(t)
        elif t == stall:
            hand_over(t)
        else:
            k = levels[i]
            i += 1
            out[k]["sent"] += 1
            if len(waiting[k]) >= queue_size:
                out[k]["rejected"] += 1
                continue
            waiting[k].append(t)
            if done == math.inf:              # idle: the accepted arrival wakes the batcher
                hand_over(t)
    end = max(arrivals[-1], last + service_s) if n else 0.0
    result = {k: {"reject": v["rejected"] / v["sent"] if v["sent"] else math.nan,
                  "latencies": np.array(v["latencies"])} for k, v in out.items()}
    result["busy"] = busy_s / end if end else 0.0
    return result


def miss_share(goodput: float, service_s: float, timer_s: float = BATCHER_TIMER_S) -> float:
    """The share of hand-overs the batcher missed, from a run that kept the queue full (arrivals
    far past capacity, so that no arrival ever ended an idle spell): each completion costs
    ``service_s``, and a missed one also the rest of the timer's period, ``timer_s - service_s``
    (for ``service_s < timer_s``). ``goodput``: requests served per second in that run."""
    if goodput <= 0:
        raise ValueError("goodput must be > 0")
    if not 0 < service_s < timer_s:
        raise ValueError(f"service time {service_s} s: between 0 and the timer's {timer_s} s")
    return min(1.0, max(0.0, (1 / goodput - service_s) / (timer_s - service_s)))


def simulate_priority(rate: float, service_s: float, queue_size: int, every: int, n: int = 20000,
                      seed: int = 1, miss: float = 0.0) -> dict:
    """Poisson arrivals at ``rate`` to one server with a fixed service time: every ``every``-th
    arrival (the 1st, the ``every``+1-th, ...) has the high priority, the rest the low one.
    Served as ``serve_priority`` says, or, with ``miss`` > 0, with Triton's missed hand-overs
    (``serve_with_misses``); returns its figures."""
    from servelab.bench import schedule
    if every < 2:
        raise ValueError("every: at least 2 (one high-priority arrival in every `every`)")
    arr = schedule.offsets(rate, n, "poisson", seed)
    levels = ["high" if i % every == 0 else "low" for i in range(n)]
    if miss:
        return serve_with_misses(arr, levels, service_s, queue_size, miss, seed=seed)
    return serve_priority(arr, levels, service_s, queue_size)


def serve_priority(arrivals: Sequence[float], levels: Sequence[str], service_s: float, queue_size: int) -> dict:
    """One server, a fixed service time, ``arrivals`` (s, in order) each of level "high" or "low".
    A free server takes the oldest high-priority request waiting, else the oldest low one, and
    finishes it (no preemption); each level keeps at most ``queue_size`` requests waiting (the one
    in service not counted): an arrival that finds its own level's queue full is rejected.
    Returns, per level, the rejected share and the served requests' latencies (s)."""
    import numpy as np

    waiting: dict[str, list[float]] = {"high": [], "low": []}   # arrival times, oldest first
    heads = {"high": 0, "low": 0}                              # the first not yet started
    out = {k: {"sent": 0, "rejected": 0, "latencies": []} for k in waiting}
    free_at = 0.0

    def start_until(now: float) -> None:
        """Start the waiting requests the server reaches by ``now`` (every request waiting arrived
        before the server's next free instant: each arrival runs this first)."""
        nonlocal free_at
        while free_at <= now:
            k = next((k for k in ("high", "low") if heads[k] < len(waiting[k])), None)
            if k is None:
                return
            t = waiting[k][heads[k]]
            heads[k] += 1
            free_at = max(free_at, t) + service_s
            out[k]["latencies"].append(free_at - t)

    for t, k in zip(arrivals, levels):
        start_until(t)
        out[k]["sent"] += 1
        if len(waiting[k]) - heads[k] >= queue_size:
            out[k]["rejected"] += 1
            continue
        waiting[k].append(t)
        start_until(t)
    start_until(math.inf)
    return {k: {"reject": v["rejected"] / v["sent"] if v["sent"] else math.nan,
                "latencies": np.array(v["latencies"])} for k, v in out.items()}


def backlog_growth(rate: float, service_s: float, duration_s: float) -> dict[str, float]:
    """No bound past capacity: the queue grows by (rate - 1/service) every second, so the last
    request of a ``duration_s`` run waits about that backlog times the service time."""
    growth = max(0.0, rate - 1.0 / service_s)
    return {"growth_per_s": growth, "backlog": growth * duration_s, "last_wait_s": growth * duration_s * service_s}


def simulate_streams(arrivals: Sequence[tuple[float, int]], step_s, prefill_s: float, max_batch: int,
                     scheduler: str) -> list[dict]:
    """Model (e): ``arrivals`` of ``(due time s, tokens)`` in time order; ``step_s(b)`` one
    decoding step of ``b`` requests. Returns per request ``{"ttft": s, "done": s}`` (from its
    due time), as the models in models_streaming/ schedule them (``scheduler``: "request" or
    "iteration")."""
    if scheduler not in ("request", "iteration"):
        raise ValueError(f"scheduler {scheduler!r}: 'request' or 'iteration'")
    out: list[dict] = [{} for _ in arrivals]
    nxt, t = 0, 0.0                 # the next arrival not yet taken; the model's clock
    live: list[list] = []           # [request index, tokens left]

    def answer_one_token_each():    # every live request gets a token now; the finished leave
        for r in live:
            r[1] -= 1
            if r[1] == 0:
                out[r[0]]["done"] = t - arrivals[r[0]][0]
        return [r for r in live if r[1] > 0]

    while nxt < len(arrivals) or live:
        if not live:
            t = max(t, arrivals[nxt][0])
        # who joins now: waiting requests, up to max_batch live (request level: only when idle)
        joined = []
        if scheduler == "iteration" or not live:
            while nxt < len(arrivals) and arrivals[nxt][0] <= t and len(live) + len(joined) < max_batch:
                joined.append([nxt, arrivals[nxt][1]])
                nxt += 1
        t += prefill_s * len(joined)
        for r in joined:
            out[r[0]]["ttft"] = t - arrivals[r[0]][0]   # its first token, right after the prefills
        live += joined
        live = answer_one_token_each()
        # request level: the batch steps on until its last request is done, nobody joins
        while scheduler == "request" and live:
            t += step_s(len(live))
            live = answer_one_token_each()
        if live:
            t += step_s(len(live))
    return out
