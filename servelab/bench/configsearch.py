"""The kit's queueing model beside Triton Model Analyzer: predict which
configuration sustains the most load under a p99 budget, from a measured
batch-cost curve S(b), before the tool measures the same space.

What Model Analyzer measures is a closed loop: perf_analyzer keeps ``C``
requests in flight (``C`` from its concurrency list) and reports throughput and
p99 latency; a configuration's result is its highest throughput at a
concurrency whose p99 stays within the budget. :func:`simulate_closed` plays
the same loop against a model server:

* ``k`` model copies; a free copy takes what waits in the queue, up to the
  max batch size ``B`` (``B = 1``: dynamic batching off), and serves it in
  ``S(b)``, the measured curve (:class:`servelab.bench.queueing.BatchCost`);
* with a queue delay ``d`` a free copy holding fewer than ``B`` requests waits
  until the oldest has waited ``d`` (or the batch is full), as Triton's
  dynamic batcher does;
* the copies share the hardware: S(b) was measured with one copy using all of
  it, so an execution that starts while ``m`` copies are busy takes
  ``S(b) * m / parallel`` (``parallel = 1``: a CPU, or one GPU, whose copies
  time-share it). This is the model's biggest assumption;
* each request also spends ``overhead`` seconds outside the server (client,
  network), measured at one client as its latency minus S(1).

Service times do not vary, so the simulated p99 is the steady state's
worst case; a real machine adds jitter, which the comparison must allow for.
"""

from __future__ import annotations

import heapq
import math
import os
from typing import Iterable, Mapping, Sequence

from servelab.bench import validity
from servelab.bench.queueing import BatchCost


def machine_watch() -> validity.Watch:
    """A ``validity.Watch`` for a run of a tool this process starts (Model Analyzer): every
    process of the run is a child of this one, so the CPU they use counts as the run's and
    everything else that used the CPU meanwhile is other work (``verdict()`` after the run)."""
    watch = validity.Watch()
    watch.pids, watch.judged = [os.getpid()], True
    watch._start()
    return watch


def key(cfg: Mapping) -> tuple[int, int, int]:
    """What a configuration does: (copies, largest batch that can form, queue delay in us).
    Dynamic batching off, or a max batch size of 1, are the same: batches of 1, no delay."""
    batching = bool(cfg.get("batching", True)) and int(cfg.get("max_batch_size", 1)) > 1
    return (int(cfg["instances"]), int(cfg["max_batch_size"]) if batching else 1,
            int(cfg.get("queue_delay_us", 0)) if batching else 0)


def label(cfg: Mapping) -> str:
    n, b, d = key(cfg)
    return f"{n} cop{'y' if n == 1 else 'ies'}, " + (f"batching to {b}, delay {d} us" if b > 1 else "no batching")


def simulate_closed(concurrency: int, cost: BatchCost, instances: int = 1, max_batch: int = 1,
                    queue_delay_s: float = 0.0, overhead_s: float = 0.0, parallel: float = 1.0,
                    requests: int = 600) -> dict:
    """Throughput (1/s) and latency p50/p99 (s, as the client sees it) of ``concurrency``
    closed-loop clients against the model server above, after a warm-up."""
    if concurrency < 1 or instances < 1 or max_batch < 1:
        raise ValueError("concurrency, instances and max_batch must be >= 1")
    events: list[tuple[float, int, str, object]] = []   # (time, order, kind, data)
    order = 0

    def push(t, kind, data=None):
        nonlocal order
        order += 1
        heapq.heappush(events, (t, order, kind, data))

    for _ in range(concurrency):
        push(0.0, "arrive")
    queue: list[float] = []          # arrival times waiting
    busy = 0
    timer_at: float | None = None
    done: list[tuple[float, float]] = []   # (completion time seen by the client, latency)
    warm = max(concurrency * 2, requests // 5)

    def dispatch(now: float) -> None:
        nonlocal busy, timer_at
        while queue and busy < instances:
            if len(queue) < max_batch and max_batch > 1 and queue_delay_s > 0 and now < queue[0] + queue_delay_s:
                if timer_at is None or timer_at > queue[0] + queue_delay_s:
                    timer_at = queue[0] + queue_delay_s
                    push(timer_at, "timer")
                return
            batch, queue[:] = queue[:max_batch], queue[max_batch:]
            busy += 1
            push(now + cost(len(batch)) * max(1.0, busy / parallel), "finish", batch)

    while events and len(done) < warm + requests:
        now, _, kind, data = heapq.heappop(events)
        if kind == "arrive":
            queue.append(now)
        elif kind == "finish":
            busy -= 1
            for t in data:
                done.append((now + overhead_s, now - t + overhead_s))
                push(now + overhead_s, "arrive")
        elif kind == "timer":
            timer_at = None
        dispatch(now)
    steady = sorted(done[warm:])
    lat = sorted(x for _, x in steady)
    span = steady[-1][0] - steady[0][0] if len(steady) > 1 else math.nan
    return {"throughput": (len(steady) - 1) / span if span and span > 0 else math.nan,
            "p50_s": lat[len(lat) // 2], "p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))]}


def predict(cfg: Mapping, cost: BatchCost, budget_ms: float, concurrency: Sequence[int],
            overhead_s: float = 0.0, parallel: float = 1.0) -> dict:
    """The configuration's predicted result, read as Model Analyzer reads its measurements:
    the highest throughput at a concurrency whose p99 is within ``budget_ms``."""
    n, b, d = key(cfg)
    points = [{"concurrency": c, **simulate_closed(c, cost, n, b, d / 1e6, overhead_s, parallel)}
              for c in concurrency]
    ok = [p for p in points if 1000 * p["p99_s"] <= budget_ms]
    best = max(ok, key=lambda p: p["throughput"]) if ok else min(points, key=lambda p: p["p99_s"])
    return {"key": (n, b, d), "label": label(cfg), "satisfies": bool(ok), "concurrency": best["concurrency"],
            "throughput": best["throughput"], "p99_ms": 1000 * best["p99_s"]}


def rank_predictions(configs: Iterable[Mapping], cost: BatchCost, budget_ms: float, concurrency: Sequence[int],
                     overhead_s: float = 0.0, parallel: float = 1.0) -> list[dict]:
    """Every distinct configuration predicted and ranked, best first: within the budget first,
    then by throughput; throughputs within 1 % of each other are a tie, broken by the cheaper
    configuration (fewer copies, smaller batches, less delay)."""
    seen, out = set(), []
    for cfg in configs:
        k = key(cfg)
        if k not in seen:
            seen.add(k)
            out.append(predict(cfg, cost, budget_ms, concurrency, overhead_s, parallel))
    out.sort(key=lambda p: (not p["satisfies"], -round(math.log(max(p["throughput"], 1e-9)) / 0.01), p["key"]))
    for i, p in enumerate(out, 1):
        p["rank"] = i
    return out


def measured_ranking(best_rows: Sequence[Mapping]) -> list[dict]:
    """Model Analyzer's ranking (``servelab.triton.analyzer.best_per_config``) by distinct
    configuration: where two of its configurations do the same (its default and a max batch
    size of 1: both batches of 1), the better one stands for both."""
    seen, out = set(), []
    for r in best_rows:
        k = key(r)
        if k in seen:
            continue
        seen.add(k)
        out.append({**r, "key": k, "label": label(r), "rank": len(out) + 1})
    return out


def side_by_side(predicted: Sequence[Mapping], measured: Sequence[Mapping], top: int = 3) -> dict:
    """The comparison: one row per configuration the tool measured (its order), with its measured
    and predicted throughput and p99 and both ranks; and the agreement, how many of the model's
    top ``top`` are in the tool's top ``top``."""
    pred = {p["key"]: p for p in predicted}
    rows = []
    for m in measured:
        p = pred.get(m["key"])
        rows.append({"config": m["label"], "tool_config": m.get("config"), "tool_rank": m["rank"],
                     "model_rank": p["rank"] if p else None,
                     "measured_throughput": m["throughput"], "measured_p99_ms": m["p99_ms"],
                     "measured_concurrency": m.get("concurrency"), "measured_ok": m["satisfies"],
                     "predicted_throughput": p["throughput"] if p else None,
                     "predicted_p99_ms": p["p99_ms"] if p else None,
                     "predicted_concurrency": p["concurrency"] if p else None})
    tool_top = {m["key"] for m in measured[:top]}
    model_top = [p["key"] for p in predicted if p["key"] in {m["key"] for m in measured}][:top]
    return {"rows": rows, "agreement": sum(k in tool_top for k in model_top), "top": top,
            "tool_top": [m["label"] for m in measured[:top]],
            "model_top": [label({"instances": k[0], "max_batch_size": k[1], "queue_delay_us": k[2]})
                          for k in model_top]}


def table(comparison: Mapping) -> str:
    """The side-by-side table as markdown."""
    head = ("| configuration | tool rank | model rank | measured infer/s | predicted infer/s "
            "| measured p99 ms | predicted p99 ms | concurrency (tool / model) |\n|---|---|---|---|---|---|---|---|")

    def f(x, fmt="{:.1f}"):
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)

    lines = [head] + [
        f"| {r['config']} | {r['tool_rank']} | {f(r['model_rank'], '{}')} | {f(r['measured_throughput'])}"
        f"{'' if r['measured_ok'] else ' (over budget)'} | {f(r['predicted_throughput'])} | {f(r['measured_p99_ms'])} "
        f"| {f(r['predicted_p99_ms'])} | {f(r['measured_concurrency'], '{}')} / {f(r['predicted_concurrency'], '{}')} |"
        for r in comparison["rows"]]
    return "\n".join(lines)
