"""``servelab tour`` (the body of ``make demo``): the lab's experiments, measured.

Starts the local stack (FastAPI PyTorch, FastAPI ONNX, Triton with both
models, Flask UI) on free loopback ports, then runs, in order:

1. FastAPI PyTorch vs ONNX: sequential requests, then 16 concurrent clients.
2. Triton, Python-backend model (``food_classifier``): closed loop at
   concurrency 1, 8, 16 with one instance, then again with two instances
   (reconfigured by reloading the model through Triton's repository API).
3. Triton, ONNX model (``food_classifier_onnx``): its service time and the
   batch-cost curve S(b) (raw ONNX Runtime and through Triton); open loop
   at a rate chosen from the service time (utilization ~0.5), constant and
   Poisson arrivals, without and then with dynamic batching; then a Poisson
   load sweep from 0.3x to 2x one instance's unbatched capacity, batching off
   and on, against the queueing model's prediction from S(b).

Every run is warmed first (after the start and after every reload) and
checked for validity (late sends, a saturated client, other work on the
machine); an invalid run is repeated up to twice (the host's bad spells
last seconds: of 164 idle runs, 4 were invalid twice in a row) and otherwise
reported as inconclusive. Each lesson is a check, ✔ / ✘ / inconclusive, shown in the
report beside its figure; a ✘ repeats its experiment once.

It writes ``results/<timestamp>/`` with ``report.md`` (summary table, plots,
queueing-model comparison), ``results.json``, ``results.csv`` and the PNGs,
prints the summary table and the paths, and stops the services. Every number
in the report comes from that run; ``--scale`` shrinks or grows the runs.
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import json
import sys
import time
import urllib.request
from pathlib import Path

from servelab.bench import load, queueing, table, targets
from servelab.bench.load import Result
from servelab.bench.triton import HostCPUObserver, TritonObserver
from servelab.core import paths
from servelab.course.lab import LONE_REQUEST_SPREAD, decode_seconds, warm_batches
from servelab.measure import evidence
from servelab.measure.tour_report import _machine, _weights_kind, write_report  # the report lives in tour_report
from servelab.measure.tour_state import Tour, TourConfig  # the run's sizes and state

PY_MODEL = "food_classifier"
ONNX_MODEL = "food_classifier_onnx"


def _server_ms(r: Result) -> float:
    """Server compute per request (input + infer + output), ms."""
    pr = (r.server or {}).get("per_request_ms", {})
    return sum(pr.get(k, 0.0) for k in ("compute_input", "compute_infer", "compute_output"))


# --------------------------------------------------------------------------
# The experiments
# --------------------------------------------------------------------------

def _health(url: str) -> dict:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=10) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return {}


def fastapi_experiment(t: Tour, urls: dict) -> None:
    cfg = t.cfg
    t.log("  1. FastAPI: PyTorch vs ONNX, sequential and 16 concurrent clients")

    decode_s = decode_seconds(base64.b64encode(targets.default_images()[0]).decode("ascii"))  # CPU part

    def measure() -> list:
        for name, key in (("FastAPI PyTorch", "fastapi_pt"), ("FastAPI ONNX", "fastapi_onnx")):
            target = targets.FastAPITarget(urls[key], timeout=cfg.timeout)
            health = _health(urls[key])
            workers = int(health.get("workers") or 1)
            load.warm(target, requests=2 * workers, concurrency=workers)
            seq = t.add(name, load.run_checked(target, load.sequential(cfg.n(cfg.seq_requests), warmup=3),
                                               lambda: [HostCPUObserver()], f"{name} · sequential",
                                               attempts=t.attempts(), log=t.log))
            c16 = t.add(name, load.run_checked(target, load.closed(16, requests=cfg.n(cfg.concurrent_requests)),
                                               lambda: [HostCPUObserver()], f"{name} · C=16",
                                               attempts=t.attempts(), log=t.log))
            # The service runs `workers` inferences at once (one per core on the CPU):
            # a closed loop of 16 then waits about 16 / k service times. On CUDA one
            # runs on the GPU while images decode on the CPU beside it (queueing.servers).
            s1 = seq.latency["mean_ms"]
            k = queueing.servers(health, s1 / 1000, decode_s)
            pred = queueing.closed_loop(16, s1 / 1000, k)["latency_s"] * 1000
            t.facts[f"{key}_workers"] = workers
            t.comparisons.append(queueing.Comparison(
                f"{name} C=16", f"max(1, 16/k) x S(1), k = {k:.3g} requests at once", pred,
                c16.latency["mean_ms"]))
        pt, onnx = t.groups["FastAPI PyTorch"], t.groups["FastAPI ONNX"]
        t.facts["fastapi_onnx_vs_pt_sequential"] = onnx[0].throughput / pt[0].throughput
        t.facts["fastapi_onnx_vs_pt_c16"] = onnx[1].throughput / pt[1].throughput
        t.facts["fastapi_pt_c16_vs_seq"] = pt[1].throughput / pt[0].throughput
        f = t.facts
        return [
            evidence.check("fastapi_onnx_faster", "fastapi", f["fastapi_onnx_vs_pt_sequential"] > 1.0,
                           "the ONNX Runtime service answers more requests per second than the PyTorch one "
                           "(sequential requests)",
                           f"ONNX {onnx[0].throughput:.1f} vs PyTorch {pt[0].throughput:.1f} req/s "
                           f"(×{f['fastapi_onnx_vs_pt_sequential']:.2f})", [pt[0], onnx[0]]),
            evidence.check("fastapi_queueing", "fastapi",
                           pt[1].latency["mean_ms"] > 3 * pt[0].latency["mean_ms"],
                           "16 clients against one service make requests queue: mean latency grows several "
                           "times, throughput does not grow 16×",
                           f"PyTorch mean {pt[0].latency['mean_ms']:.1f} ms sequential vs "
                           f"{pt[1].latency['mean_ms']:.1f} ms with 16 clients; throughput "
                           f"×{f['fastapi_pt_c16_vs_seq']:.2f}", [pt[0], pt[1]]),
        ]

    evidence.experiment(t, "FastAPI", measure, t.time_left)


def triton_python_experiment(t: Tour, triton_url: str, grpc_url: str, metrics_url: str) -> None:
    from servelab import triton

    cfg = t.cfg
    target = targets.triton_target(triton_url, PY_MODEL, timeout=cfg.timeout)
    for instances in (1, 2):
        group = f"Triton Python · {instances} instance{'s' if instances > 1 else ''}"
        t.log(f"  2. Triton {PY_MODEL}, {instances} instance(s): concurrency {', '.join(map(str, cfg.concurrency))}")
        reported = triton.model_config(PY_MODEL, grpc_url)
        if triton.instance_count(reported) != instances:   # the stack starts it with one: no reload then
            # the kind stays as configured: GPU copies on a GPU host, CPU ones here
            reported = triton.reload_model(PY_MODEL, triton.set_instances(instances),
                                           grpc_url=grpc_url, verbose=False)
        got = triton.instance_count(reported)
        t.log(f"    Triton reports {got} instance(s)")
        load.warm(target, requests=4 * instances, concurrency=2 * instances)  # every new instance runs once
        warm_batches(triton_url, PY_MODEL, reported)  # and every batch size it can be handed (on a GPU)
        for c in cfg.concurrency:
            t.add(group, load.run_checked(
                target, load.closed(c, duration=cfg.s(cfg.triton_seconds), warmup=max(2, c)),
                lambda: [TritonObserver(triton_url, PY_MODEL, metrics_url=metrics_url)], f"{group} · C={c}",
                attempts=t.attempts(), log=t.log))
        rs = t.groups[group]
        s1 = rs[0].latency["mean_ms"]
        for r in rs[1:]:
            c = int(r.pattern["concurrency"])
            pred = queueing.closed_loop(c, s1 / 1000, instances)["latency_s"] * 1000
            t.comparisons.append(queueing.Comparison(
                f"Python {instances}x C={c}", f"max(1, C/{instances}) x S(1)", pred, r.latency["mean_ms"]))
    one, two = t.groups["Triton Python · 1 instance"], t.groups["Triton Python · 2 instances"]
    for i, c in enumerate(cfg.concurrency):
        t.facts[f"triton_py_2v1_throughput_c{c}"] = two[i].throughput / one[i].throughput
    checks = python_checks(t) + instance_checks(cfg.concurrency, one, two)
    t.checks.extend(checks)
    for ch in checks:
        t.log(f"    {ch.symbol} {ch.expect} — {ch.saw}")
    # The two instances stay loaded (idle, no CPU) until the tour stops the stack.


def instance_checks(concurrency, one, two) -> list:
    """What a second instance buys: nothing with one request in flight (an
    instance alone gets every core either way), throughput once clients overlap."""
    ratio = {c: b.throughput / a.throughput for c, a, b in zip(concurrency, one, two)}
    out = []
    if 1 in ratio:
        # Median latencies: at one request in flight a single slow request (a page fault, a
        # thread pool waking) moves the mean, and with it the throughput, of a short run.
        # The two runs are half a minute apart: "buys nothing" is no gain beyond the spread
        # of a lone request's latency between runs (lab.LONE_REQUEST_SPREAD; notebook 6 too).
        p50 = one[0].latency["p50_ms"] / two[0].latency["p50_ms"]
        out.append(evidence.check(
            "python_instances_c1", "python", p50 <= LONE_REQUEST_SPREAD,
            "at concurrency 1, a second instance buys nothing: a lone request has nobody to run beside",
            f"median latency with 1 instance / with 2 at concurrency 1: ×{p50:.2f} "
            f"(throughput ×{ratio[1]:.2f})", [one[0], two[0]],
            "the second copy ran the lone request faster: the first copy's run was slowed by something else"))
    many = [i for i, c in enumerate(concurrency) if c > 1]
    if many:
        # All the concurrent runs together: on 2 cores the gain is small (one instance already
        # uses both cores for a lone request), so one short run alone is mostly noise.
        gain = sum(two[i].throughput for i in many) / sum(one[i].throughput for i in many)
        cs = " and ".join(str(concurrency[i]) for i in many)
        out.append(evidence.check(
            "python_instances_gain", "python", gain >= 1.0,
            f"with {cs} clients, two instances serve at least as much as one: the gain comes with concurrency",
            f"2 instances / 1 at concurrency {cs}: ×{gain:.2f} ("
            + ", ".join(f"C={concurrency[i]} ×{ratio[concurrency[i]]:.2f}" for i in many) + ")",
            [r for i in many for r in (one[i], two[i])]))
    return out


def python_checks(t: Tour) -> list:
    """The queueing lessons of section 2, on one instance's runs."""
    rs = {int(r.pattern["concurrency"]): r for r in t.groups.get("Triton Python · 1 instance", [])}
    out = []
    if 8 in rs:
        pr = (rs[8].server or {}).get("per_request_ms", {})
        q, inf = pr.get("queue", 0.0), pr.get("compute_infer", 0.0)
        out.append(evidence.check(
            "python_queue_c8", "python", q > inf,
            "with 8 clients and one model instance, requests spend most of their server time in the queue",
            f"queue {q:.1f} ms vs compute {inf:.1f} ms per request", [rs[8]]))
    if 8 in rs and 16 in rs:
        ratio = rs[16].latency["p50_ms"] / rs[8].latency["p50_ms"]
        out.append(evidence.check(
            "python_latency_c16", "python", ratio > 1.3,
            "twice the clients, about twice the latency: each request waits for the ones ahead of it",
            f"median latency ×{ratio:.2f} from 8 to 16 clients", [rs[8], rs[16]]))
    return out


def triton_onnx_experiment(t: Tour, triton_url: str, grpc_url: str, metrics_url: str) -> None:
    """Section 3: S(b), arrivals with batching off and on, the load sweep
    (``servelab.measure.evidence.onnx_batching``)."""
    from servelab import triton

    cfg = t.cfg
    t.log(f"  3. Triton {ONNX_MODEL}: batch cost S(b), arrivals and dynamic batching, load sweep")
    plan = evidence.BatchingPlan(
        probe_requests=cfg.n(cfg.probe_requests), arrival_seconds=cfg.s(cfg.arrival_seconds),
        sweep_seconds=cfg.s(cfg.sweep_seconds), sweep_factors=cfg.sweep_factors, utilization=cfg.utilization,
        batch_requests=cfg.n(24), raw_repeats=cfg.n(7), timeout=min(cfg.timeout, 10.0))

    def reload(model, edit):
        return triton.reload_model(model, edit, grpc_url=grpc_url, verbose=False)

    try:
        evidence.onnx_batching(t, triton_url, reload, plan,
                               observer=lambda: [TritonObserver(triton_url, ONNX_MODEL)],
                               attempts=t.attempts, can_repeat=t.time_left)
    finally:  # leave the model as the lab starts it
        reload(ONNX_MODEL, {"dynamic_batching": None})


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------

def run_tour(cfg: TourConfig, log=print, components=("fastapi_pt", "fastapi_onnx", "triton", "flask")) -> Path:
    from servelab.local import stack
    from servelab.serve import models

    started = _dt.datetime.now()
    t0 = time.perf_counter()
    out = cfg.out or (paths.RESULTS_DIR / started.strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    if not models.artifacts_ready():
        log("Model artifacts missing: building them (python -m servelab models build) ...")
        models.build()
    log("Starting the local stack on free loopback ports (FastAPI PyTorch + ONNX, Triton, Flask UI) ...")
    tour = Tour(cfg, out, log=log)
    meta = {"started": started.strftime("%Y-%m-%d %H:%M"), "machine": _machine(), "weights": _weights_kind()}
    with stack.running(list(components), free_ports=True, fastapi="pt", flask_backend="fastapi",
                       log_dir=out / "logs", log=lambda m: log(m)) as s:
        log(f"  stack up in {time.perf_counter() - t0:.0f} s")
        if "flask" in s.urls:
            with urllib.request.urlopen(s.urls["flask"] + "/test", timeout=60) as r:
                reply = json.loads(r.read())
            meta["flask"] = f"HTTP 200, prediction {reply.get('prediction')!r} from backend {reply.get('backend')!r}"
        if "fastapi_pt" in s.urls and "fastapi_onnx" in s.urls:
            fastapi_experiment(tour, s.urls)
        if "triton" in s.urls:
            tri, grpc, metrics = s.env["TRITON_SERVER_URL"], s.urls["triton_grpc"], s.urls["triton_metrics"]
            triton_python_experiment(tour, tri, grpc, metrics)
            triton_onnx_experiment(tour, tri, grpc, metrics)
        log("Stopping the stack ...")
    meta["elapsed_s"] = time.perf_counter() - t0
    report = write_report(tour, meta)
    log("")
    log(table.text(tour.results))
    log("")
    log("Queueing model vs measurement (mean latency):")
    for c in tour.comparisons:
        log(f"  {c.case:<28} predicted {c.predicted_ms:8.1f} ms   measured {c.measured_ms:8.1f} ms   gap {c.gap_pct:+5.0f}%")
    log("")
    log("Lesson checks:")
    for c in tour.checks:
        log(f"  {c.symbol:<12} {c.expect}")
    log("")
    log(f"Report:  {report}")
    log(f"Data:    {out / 'results.json'}, {out / 'results.csv'}")
    log(f"Plots:   {', '.join(sorted(p.name for p in out.glob('*.png')))}")
    log(f"Tour finished in {meta['elapsed_s']:.0f} s; services stopped.")
    return report


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "tour", help="run the lab's experiments on the local stack and write results/<timestamp>/report.md",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every run's size (default 1.0: a few minutes on 2 cores)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default results/<timestamp>)")
    p.add_argument("--utilization", type=float, default=TourConfig.utilization,
                   help=f"target utilization of the ONNX open-loop runs (default {TourConfig.utilization})")
    p.set_defaults(func=_cmd_tour)


def _cmd_tour(args) -> int:
    if not 0 < args.scale <= 10:
        print("error: --scale must be within (0, 10]", file=sys.stderr)
        return 2
    if not 0 < args.utilization < 1:
        print("error: --utilization must be within (0, 1)", file=sys.stderr)
        return 2
    try:
        run_tour(TourConfig(scale=args.scale, out=args.out, utilization=args.utilization))
    except Exception as err:  # a readable line, and the logs' location
        print(f"error: the tour failed: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from servelab import cli

    raise SystemExit(cli.run_alone("servelab.measure.tour", "tour"))
