"""``servelab tour`` (the body of ``make demo``): the lab's experiments, measured.

Starts the local stack (FastAPI PyTorch, FastAPI ONNX, Triton with both
models, Flask UI) on free loopback ports, then runs, in order:

1. FastAPI PyTorch vs ONNX: sequential requests, then 16 concurrent clients.
2. Triton, Python-backend model (``food_classifier``): closed loop at
   concurrency 1, 8, 16 with one instance, then again with two instances
   (reconfigured by reloading the model through Triton's repository API).
3. Triton, ONNX model (``food_classifier_onnx``): its service time and the
   batch-cost curve S(b) (raw ONNX Runtime and through Triton); open loop
   at a rate chosen from the service time (utilization ~0.7), constant and
   Poisson arrivals, without and then with dynamic batching; then a Poisson
   load sweep from 0.5x to 2x one instance's unbatched capacity, batching off
   and on, against the queueing model's prediction from S(b).

Every run is warmed first (after the start and after every reload) and
checked for validity (late sends, a saturated client, other work on the
machine); an invalid run is repeated once and otherwise reported as
inconclusive. Each lesson is a check, ✔ / ✘ / inconclusive, shown in the
report beside its figure; a ✘ repeats its experiment once.

It writes ``results/<timestamp>/`` with ``report.md`` (summary table, plots,
queueing-model comparison), ``results.json``, ``results.csv`` and the PNGs,
prints the summary table and the paths, and stops the services. Every number
in the report comes from that run; ``--scale`` shrinks or grows the runs.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from servelab import evidence, paths
from servelab.bench import load, queueing, table, targets
from servelab.bench.load import Result
from servelab.bench.triton import HostCPUObserver, TritonObserver

PY_MODEL = "food_classifier"
ONNX_MODEL = "food_classifier_onnx"


@dataclass
class TourConfig:
    """Sizes of the runs. ``scale`` multiplies every count and duration."""

    scale: float = 1.0
    seq_requests: int = 40          # FastAPI sequential
    concurrent_requests: int = 160  # FastAPI, 16 clients
    concurrency: tuple[int, ...] = (1, 8, 16)
    triton_seconds: float = 6.0     # each Triton closed-loop point
    probe_requests: int = 40        # ONNX service-time probe (sequential)
    open_seconds: float = 8.0       # each open-loop run
    utilization: float = 0.7        # target rho for the open-loop runs
    timeout: float = 120.0          # per request: queues at 16 clients can be long on a slow CPU
    arrival_seconds: float = 5.0    # each ONNX arrival-pattern run
    sweep_seconds: float = 3.0      # each point of the load sweep
    sweep_factors: tuple[float, ...] = (0.5, 0.8, 1.0, 1.4, 2.0)  # x one instance's unbatched capacity
    repeat_budget_s: float = 170.0  # no repeats (invalid runs, ✘ checks) once the tour has run this long
    out: Path | None = None

    def n(self, x: int) -> int:
        return max(4, int(round(x * self.scale)))

    def s(self, x: float) -> float:
        return max(1.0, x * self.scale)


@dataclass
class Tour:
    cfg: TourConfig
    out: Path
    results: list[Result] = field(default_factory=list)
    groups: dict[str, list[Result]] = field(default_factory=dict)
    comparisons: list[queueing.Comparison] = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    log: object = print
    checks: list = field(default_factory=list)         # evidence.Check, in order
    discarded: list[Result] = field(default_factory=list)  # runs of an experiment that was repeated
    batch_runs: list[Result] = field(default_factory=list)  # S(b) through Triton
    arrivals: dict = field(default_factory=dict)
    sweep: dict = field(default_factory=dict)
    model_curves: dict = field(default_factory=dict)
    t0: float = field(default_factory=time.perf_counter)

    def time_left(self) -> bool:
        return time.perf_counter() - self.t0 < self.cfg.repeat_budget_s * max(self.cfg.scale, 0.25)

    def attempts(self) -> int:
        """Runs allowed for one measurement: one repeat of an invalid run while time allows."""
        return 2 if self.time_left() else 1

    def add(self, group: str, r: Result) -> Result:
        self.results.append(r)
        self.groups.setdefault(group, []).append(r)
        row = r.row()
        srv = ""
        if r.server and r.server.get("per_request_ms"):
            pr = r.server["per_request_ms"]
            srv = (f"  server queue {pr.get('queue', 0):.1f} ms, infer {pr.get('compute_infer', 0):.1f} ms, "
                   f"batch {r.server.get('avg_batch_size') or 0:.2f}")
        err = f"  errors {r.errors}" if r.errors else ""
        self.log(f"    {r.label:<44} {row['throughput']:8.1f} req/s  p50 {row['p50_ms']:8.1f} ms  "
                 f"p99 {row['p99_ms']:8.1f} ms{srv}{err}")
        return r


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

    def measure() -> list:
        for name, key in (("FastAPI PyTorch", "fastapi_pt"), ("FastAPI ONNX", "fastapi_onnx")):
            target = targets.FastAPITarget(urls[key], timeout=cfg.timeout)
            workers = int(_health(urls[key]).get("workers") or 1)
            load.warm(target, requests=2 * workers, concurrency=workers)
            seq = t.add(name, load.run_checked(target, load.sequential(cfg.n(cfg.seq_requests), warmup=3),
                                               lambda: [HostCPUObserver()], f"{name} · sequential",
                                               attempts=t.attempts(), log=t.log))
            c16 = t.add(name, load.run_checked(target, load.closed(16, requests=cfg.n(cfg.concurrent_requests)),
                                               lambda: [HostCPUObserver()], f"{name} · C=16",
                                               attempts=t.attempts(), log=t.log))
            # The service runs `workers` inferences at once (one per core): a
            # closed loop of 16 then waits about 16 / workers service times.
            s1 = seq.latency["mean_ms"]
            pred = queueing.closed_loop(16, s1 / 1000, workers)["latency_s"] * 1000
            t.facts[f"{key}_workers"] = workers
            t.comparisons.append(queueing.Comparison(
                f"{name} C=16", f"max(1, 16/k) x S(1), k = {workers} inferences at once", pred,
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
        reported = triton.reload_model(
            PY_MODEL, {"instance_group": [{"count": instances, "kind": "KIND_CPU"}]},
            grpc_url=grpc_url, verbose=False)
        got = sum(int(g.get("count", 1)) for g in reported.get("instance_group", []))
        t.log(f"    reloaded: Triton reports {got} instance(s)")
        load.warm(target, requests=4 * instances, concurrency=2 * instances)  # every new instance runs once
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
    # Leave the model as the lab starts it.
    triton.reload_model(PY_MODEL, {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]},
                        grpc_url=grpc_url, verbose=False)


def instance_checks(concurrency, one, two) -> list:
    """What a second instance buys: nothing with one request in flight (an
    instance alone gets every core either way), throughput once clients overlap."""
    ratio = {c: b.throughput / a.throughput for c, a, b in zip(concurrency, one, two)}
    out = []
    if 1 in ratio:
        out.append(evidence.check(
            "python_instances_c1", "python", 0.85 <= ratio[1] <= 1.15,
            "at concurrency 1, two instances match one: a lone request has nobody to run beside",
            f"2 instances / 1 at concurrency 1: ×{ratio[1]:.2f}", [one[0], two[0]]))
    top = max(c for c in ratio if c > 1) if any(c > 1 for c in ratio) else None
    if top is not None:
        i = list(concurrency).index(top)
        out.append(evidence.check(
            "python_instances_gain", "python", ratio[top] >= 1.0,
            f"with {top} clients, two instances serve at least as much as one: the gain comes with concurrency",
            f"2 instances / 1 at concurrency {top}: ×{ratio[top]:.2f}", [one[i], two[i]]))
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
    (``servelab.evidence.onnx_batching``)."""
    from servelab import triton

    cfg = t.cfg
    t.log(f"  3. Triton {ONNX_MODEL}: batch cost S(b), arrivals and dynamic batching, load sweep")
    plan = evidence.BatchingPlan(
        probe_requests=cfg.n(cfg.probe_requests), arrival_seconds=cfg.s(cfg.arrival_seconds),
        sweep_seconds=cfg.s(cfg.sweep_seconds), sweep_factors=cfg.sweep_factors, utilization=cfg.utilization,
        batch_requests=cfg.n(10), raw_repeats=cfg.n(7), timeout=min(cfg.timeout, 10.0))

    def reload(model, edit):
        return triton.reload_model(model, edit, grpc_url=grpc_url, verbose=False)

    try:
        evidence.onnx_batching(t, triton_url, reload, plan,
                               observer=lambda: [TritonObserver(triton_url, ONNX_MODEL)],
                               attempts=t.attempts, can_repeat=t.time_left)
    finally:  # leave the model as the lab starts it
        reload(ONNX_MODEL, {"dynamic_batching": None})


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------

def _plots(t: Tour) -> dict[str, str]:
    from servelab.bench import plots  # matplotlib, imported only when drawing

    out, files = t.out, {}

    def save(name, fn, *a, **kw):
        fn(*a, path=out / name, **kw)
        files[name] = name

    fa = {k: t.groups[k] for k in ("FastAPI PyTorch", "FastAPI ONNX") if k in t.groups}
    if fa:
        save("fastapi_latency_cdf.png", plots.latency_cdf, [r for rs in fa.values() for r in rs],
             title="FastAPI: latency CDF, sequential and 16 clients", log_x=True)
        save("fastapi_throughput.png", plots.throughput_vs_concurrency, fa, title="FastAPI: throughput vs clients")
    py = {k: v for k, v in t.groups.items() if k.startswith("Triton Python")}
    if py:
        save("triton_python_latency.png", plots.latency_vs_concurrency, py, percentiles=(50, 95),
             title="Triton Python model: latency vs concurrency")
        save("triton_python_throughput.png", plots.throughput_vs_concurrency, py,
             title="Triton Python model: throughput vs concurrency")
        save("triton_python_queue_compute.png", plots.queue_vs_compute, [r for rs in py.values() for r in rs],
             title="Triton Python model: queue vs compute per request")
        py_runs = [r for rs in py.values() for r in rs]
        gpu = any(k.startswith("GPU") for r in py_runs for k in (r.utilization or {}).get("series", {}))
        save("triton_python_utilization.png", plots.utilization, py_runs, series="GPU" if gpu else "CPU",
             title="Triton Python model: utilization during each run")
    onnx = [r for k, rs in t.groups.items() if k.startswith("Triton ONNX · batching") for r in rs]
    if onnx:
        save("onnx_latency_cdf.png", plots.latency_cdf, onnx, title="Triton ONNX: latency CDF by arrivals and batching")
        save("onnx_batch_histogram.png", plots.batch_histogram, onnx, title="Triton ONNX: batch sizes executed")
        save("onnx_queue_compute.png", plots.queue_vs_compute, onnx, title="Triton ONNX: queue vs compute per request")
    if t.sweep:
        save("onnx_sweep_latency.png", plots.load_sweep, t.sweep, model=t.model_curves,
             bound_ms=t.facts.get("sweep_bound_ms"),
             title="Triton ONNX: latency vs offered load (Poisson), measured and model")
        save("onnx_sweep_throughput.png", plots.throughput_vs_offered, t.sweep,
             title="Triton ONNX: throughput vs offered load")
    curves = {k: v for k, v in (("raw ONNX Runtime", t.facts.get("batch_cost_raw_s")),
                                ("through Triton", t.facts.get("batch_cost_triton_s"))) if v}
    if curves:
        save("onnx_batch_cost.png", plots.batch_cost, curves)
    if t.comparisons:
        save("queueing_model.png", plots.predicted_vs_measured, t.comparisons)
    return files


def _machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPU(s) {model}".strip() + f", {platform.system()} {platform.release()}, Python {platform.python_version()}"


def _weights_kind() -> str:
    try:
        from servelab import food11
        return food11.weights_kind(paths.ONNX_TARGETS[0])
    except Exception:
        return "unknown"


def _fmt(x, d=1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def _checks_table(t: Tour, section: str) -> list[str]:
    """'What you should see / what this run saw' for one section's checks."""
    cs = [c for c in t.checks if c.section == section]
    if not cs:
        return []
    out = ["| what you should see | what this run saw | |", "|---|---|---|"]
    for c in cs:
        saw = c.saw
        if c.repeated and c.earlier:
            saw += f" (repeated once: first attempt {evidence.SYMBOL[c.earlier[0]['status']]})"
        if c.status == evidence.FAIL and c.cause:
            saw += f". Likely cause: {c.cause}"
        out.append(f"| {c.expect} | {saw.replace('|', '/')} | {c.symbol} |")
    return [*out, ""]


def _batch_cost_text(t: Tour) -> list[str]:
    f = t.facts
    raw, tri = f.get("batch_cost_raw_s") or {}, f.get("batch_cost_triton_s") or {}
    if not raw and not tri:
        return []
    out = ["First the fact that decides what dynamic batching can do: the time one execution of a batch of b "
           "takes, S(b), and the time per image, S(b)/b.", "",
           "| b | raw ONNX Runtime S(b) ms | S(b)/b ms | through Triton S(b) ms | S(b)/b ms |", "|---:|---:|---:|---:|---:|"]
    for b in sorted(set(raw) | set(tri), key=int):
        r, q = raw.get(b), tri.get(b)
        out.append(f"| {b} | {_fmt(r and 1000 * r, 2)} | {_fmt(r and 1000 * r / int(b), 2)} | "
                   f"{_fmt(q and 1000 * q, 2)} | {_fmt(q and 1000 * q / int(b), 2)} |")
    gain = f.get("batch_gain_per_image")
    out += ["", f"Raw: ONNX Runtime in the tour's own process with {f.get('batch_cost_threads')} threads (what "
            "one Triton instance gets here). Through Triton: client batches sent one at a time, timed by "
            "Triton's per-batch statistics, so S(b) includes what the backend adds per execution.", ""]
    if gain:
        out += [f"Through Triton an image costs {1000 * tri.get(16, math.nan) / 16:.2f} ms in a batch of 16 and "
                f"{1000 * tri.get(1, math.nan):.2f} ms alone: batching makes it "
                + (f"{gain:.2f}× cheaper. " if gain >= 1 else f"{1 / gain:.2f}× *more* expensive. ")
                + ("That is little: on this CPU the work grows almost linearly with the batch, so batching "
                   "cannot add much capacity; it mostly makes each request wait for the others in its batch. "
                   if gain < 1.5 else
                   "Batches are markedly cheaper per image here, so batching adds capacity. ")
                + "On a GPU a batch of 16 costs little more than one image (the earlier lab's P100: "
                "656.6 inferences/s in client batches of 16 vs 51.5 unbatched, though that figure decoded only one "
                "image per request; ONNX at 1 instance 138.4 infer/s): there S(b)/b falls steeply and dynamic "
                "batching multiplies what one instance serves.", ""]
    out += ["![batch cost](onnx_batch_cost.png)", ""]
    return out


def _sweep_text(t: Tour) -> list[str]:
    f = t.facts
    if not t.sweep:
        return []
    out = [f"Offered loads {', '.join(f'{x:g}×' for x in t.cfg.sweep_factors)} one instance's unbatched capacity "
           f"1/S(1) = {f['onnx_capacity']:.1f} req/s, each {t.cfg.s(t.cfg.sweep_seconds):g} s, batching on then "
           "off. Past capacity the queue grows: at most 32 requests are kept in flight and later arrivals "
           "are dropped (counted), so an overloaded run ends on time. Dashed and dotted lines: the model's p50 "
           "and p99 (plus the unloaded client overhead); hollow circles: invalid runs; x: runs that dropped "
           "requests or timed out.", "",
           "| offered req/s | batching | served req/s | p50 ms | p99 ms | avg batch | dropped | timed out/failed | valid |",
           "|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, rs in t.sweep.items():
        for r in rs:
            out.append(f"| {r.pattern['rate']:g} | {name.split()[-1]} | {r.throughput:.1f} | "
                       f"{r.latency['p50_ms']:.1f} | {r.latency['p99_ms']:.1f} | {_fmt(r.server and r.server.get('avg_batch_size'), 2)} | "
                       f"{r.dropped} | {r.error_count} | {'yes' if r.valid else 'no'} |")
    sus, pred = f.get("sweep_sustained", {}), f.get("sweep_predicted", {})
    out += ["", f"Sustained load: the highest offered load whose p99 stays within {f['sweep_bound_ms']:.0f} ms "
            "(10× the unloaded latency) with nothing dropped, interpolated between sweep points; the model's "
            "figure is the same bound applied to its simulated p99.", "",
            "| configuration | measured req/s | model req/s | gap |", "|---|---:|---:|---:|"]
    for key, name in (("off", "batching off"), ("on", "batching on")):
        m, p = sus.get(key), pred.get(key)
        gap = f"{100 * (m - p) / p:+.0f} %" if m and p else "-"
        out.append(f"| {name} | {_fmt(m)} | {_fmt(p)} | {gap} |")
    return [*out, ""]


def write_report(t: Tour, meta: dict) -> Path:
    _plots(t)
    load.save_json(t.results, t.out / "results.json")
    load.save_csv(t.results, t.out / "results.csv")
    (t.out / "queueing.json").write_text(json.dumps([c.as_dict() for c in t.comparisons], indent=1))
    (t.out / "checks.json").write_text(json.dumps([c.as_dict() for c in t.checks], indent=1))
    f = t.facts
    L = [f"# ServeLab tour — {meta['started']}", "",
         f"Machine: {meta['machine']}. Weights: **{meta['weights']}**"
         + (" (untrained demo weights: labels are not meaningful; timings are)." if meta["weights"] == "demo" else "."),
         f"Triton 2.51 (nvidia-pytriton binary), local runner for the ONNX model. Tour took {meta['elapsed_s']:.0f} s. "
         "Every number below was measured in this run.", "",
         "## Summary", "", table.markdown(t.results), "",
         "Columns: requests sent, succeeded, failed; throughput of successful requests; client-side latency "
         "(open-loop runs from each request's *scheduled* send time); Triton's own per-request queue and "
         "compute time and average batch size for that run only (statistics before/after).", "",
         "## Headline ratios (this run)", ""]
    if "fastapi_onnx_vs_pt_c16" in f:
        L.append(f"- FastAPI ONNX vs PyTorch throughput: {f['fastapi_onnx_vs_pt_sequential']:.2f}× sequential, "
                 f"{f['fastapi_onnx_vs_pt_c16']:.2f}× with 16 clients. PyTorch with 16 clients vs sequential: "
                 f"{f['fastapi_pt_c16_vs_seq']:.2f}× (one server process queues requests; it does not serve them faster).")
    for c in t.cfg.concurrency:
        k = f"triton_py_2v1_throughput_c{c}"
        if k in f:
            L.append(f"- Triton Python model, 2 instances vs 1 at concurrency {c}: {f[k]:.2f}× throughput.")
    if "sweep_sustained" in f:
        sus, pred = f["sweep_sustained"], f["sweep_predicted"]
        L.append(f"- Triton ONNX, highest Poisson load held with p99 ≤ {f['sweep_bound_ms']:.0f} ms: "
                 f"{_fmt(sus.get('off'))} req/s without batching (model {pred['off']:.1f}), "
                 f"{_fmt(sus.get('on'))} req/s with dynamic batching (model {pred['on']:.1f}); "
                 f"one instance's unbatched capacity 1/S(1) = {f['onnx_capacity']:.1f} req/s.")
    if "flask" in meta:
        L.append(f"- Flask UI smoke test (`GET /test` through the FastAPI backend): {meta['flask']}.")
    n_inc = sum(c.status == evidence.INCONCLUSIVE for c in t.checks)
    n_bad = sum(not r.valid for r in t.results)
    L += ["", "## Lesson checks", "",
          f"{sum(c.status == evidence.PASS for c in t.checks)} ✔, {sum(c.status == evidence.FAIL for c in t.checks)} ✘, "
          f"{n_inc} inconclusive, of {len(t.checks)} checks; {n_bad} of {len(t.results)} runs invalid."]
    if n_bad:
        L.append("A run is invalid when the client missed its schedule (> 1 % late sends or event-loop ticks), "
                 "its loop thread used > 90 % of a core, or other work on the machine used > 0.25 core: "
                 "its figures are not evidence, and the checks that rest on it say *inconclusive: the machine "
                 "was busy*. Run the tour again on a quiet machine.")
    L += ["", "## 1. FastAPI: PyTorch vs ONNX", "",
          "![latency CDF](fastapi_latency_cdf.png)", "", "![throughput](fastapi_throughput.png)", "",
          *_checks_table(t, "fastapi"),
          "## 2. Triton, Python backend: concurrency and instances", "",
          "Each point is a closed loop: C clients, each sending its next request when the last returns. "
          "With one instance, requests queue; a second instance helps only if the CPU has room for it. "
          "An instance running alone uses every core, busy instances share them (servelab/threads.py), "
          "so at concurrency 1 one and two instances match: the gain appears with concurrency.", "",
          "![latency](triton_python_latency.png)", "", "![throughput](triton_python_throughput.png)", "",
          "![queue vs compute](triton_python_queue_compute.png)", "",
          "![utilization](triton_python_utilization.png)", "",
          *_checks_table(t, "python"),
          "## 3. Triton, ONNX model: what a batch costs, arrivals, dynamic batching", "",
          *_batch_cost_text(t),
          "Open loop at a fixed rate: requests go out on schedule whatever the server does, and latency counts "
          "from the scheduled time. Poisson arrivals come in bursts, constant ones evenly spaced. The same rate "
          "is measured without batching (the baseline) and with it.", "",
          "![latency CDF](onnx_latency_cdf.png)", "", "![batch sizes](onnx_batch_histogram.png)", "",
          "![queue vs compute](onnx_queue_compute.png)", "",
          *_checks_table(t, "onnx"),
          "### Load sweep: Poisson arrivals from half to twice one instance's capacity", "",
          *_sweep_text(t),
          "![latency vs offered load](onnx_sweep_latency.png)", "",
          "![throughput vs offered load](onnx_sweep_throughput.png)", "",
          *_checks_table(t, "sweep"),
          "## 4. Queueing model vs measurement", "",
          "S(1) is the measured mean latency at concurrency 1 (closed loop), or for the ONNX runs Triton's "
          "compute time per request at concurrency 1 (what requests queue for) plus the unloaded client latency.",
          "",
          "- FastAPI, closed loop of C clients against a service that runs k inferences at once (one per "
          "core, k from its /health): latency ≈ max(1, C/k)·S(1). Assumes decoding is negligible next to "
          "inference and the k inferences do not slow each other.",
          "- Triton, closed loop, k instances: latency ≈ max(1, C/k)·S(1) (Little's law with C requests always "
          "in the system). Assumes the instances have a core each.",
          "- Poisson arrivals at rate λ, one instance, ρ = λS: M/D/1 wait Wq = ρS / (2(1−ρ)); constant "
          "arrivals below saturation wait 0. Assumes a constant service time and a server alone on its cores.",
          "- Dynamic batching: a simulated queue (Poisson arrivals, one instance, first come first served) in "
          "which a free instance takes every waiting request up to 16 and serves them in the *measured* S(b). "
          "Assumes S(b) does not depend on load (the client shares the cores).",
          "", "| case | model | predicted ms | measured ms | gap |", "|---|---|---:|---:|---:|"]
    for c in t.comparisons:
        L.append(f"| {c.case} | {c.model} | {c.predicted_ms:.1f} | {c.measured_ms:.1f} | {c.gap_pct:+.0f}% |")
    L += ["", "Gap = (measured − predicted) / predicted. Where it is large, the model's assumptions above do not hold.",
          "", "![predicted vs measured](queueing_model.png)", "",
          "## Files", "", "- `results.json` — every run, with per-request latencies and validity; `results.csv` — "
          "the summary table;",
          "- `queueing.json` — the model comparison; `checks.json` — the lesson checks; `*.png` — the plots above.", ""]
    report = t.out / "report.md"
    report.write_text("\n".join(L))
    return report


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------

def run_tour(cfg: TourConfig, log=print, components=("fastapi_pt", "fastapi_onnx", "triton", "flask")) -> Path:
    from servelab import models, stack

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
    p.add_argument("--utilization", type=float, default=0.7,
                   help="target utilization of the ONNX open-loop runs (default 0.7)")
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

    raise SystemExit(cli.run_alone("servelab.tour", "tour"))
