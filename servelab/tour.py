"""``servelab tour`` (the body of ``make demo``): the lab's experiments, measured.

Starts the local stack (FastAPI PyTorch, FastAPI ONNX, Triton with both
models, Flask UI) on free loopback ports, then runs, in order:

1. FastAPI PyTorch vs ONNX: sequential requests, then 16 concurrent clients.
2. Triton, Python-backend model (``food_classifier``): closed loop at
   concurrency 1, 8, 16 with one instance, then again with two instances
   (reconfigured by reloading the model through Triton's repository API).
3. Triton, ONNX model (``food_classifier_onnx``): open loop at a rate chosen
   from its measured service time (utilization ~0.7), constant and Poisson
   arrivals, without and then with dynamic batching (again a reload).

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

from servelab import paths
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

def fastapi_experiment(t: Tour, urls: dict) -> None:
    cfg = t.cfg
    t.log("  1. FastAPI: PyTorch vs ONNX, sequential and 16 concurrent clients")
    for name, key in (("FastAPI PyTorch", "fastapi_pt"), ("FastAPI ONNX", "fastapi_onnx")):
        target = targets.FastAPITarget(urls[key], timeout=cfg.timeout)
        seq = t.add(name, load.run(target, load.sequential(cfg.n(cfg.seq_requests), warmup=3),
                                   [HostCPUObserver()], f"{name} · sequential"))
        c16 = t.add(name, load.run(target, load.closed(16, requests=cfg.n(cfg.concurrent_requests)),
                                   [HostCPUObserver()], f"{name} · C=16"))
        s1 = seq.latency["mean_ms"]
        t.comparisons.append(queueing.Comparison(
            f"{name} C=16", "16 x S(1): one model at a time", 16 * s1, c16.latency["mean_ms"]))
    pt, onnx = t.groups["FastAPI PyTorch"], t.groups["FastAPI ONNX"]
    t.facts["fastapi_onnx_vs_pt_sequential"] = onnx[0].throughput / pt[0].throughput
    t.facts["fastapi_onnx_vs_pt_c16"] = onnx[1].throughput / pt[1].throughput
    t.facts["fastapi_pt_c16_vs_seq"] = pt[1].throughput / pt[0].throughput


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
        for c in cfg.concurrency:
            obs = TritonObserver(triton_url, PY_MODEL, metrics_url=metrics_url)
            t.add(group, load.run(target, load.closed(c, duration=cfg.s(cfg.triton_seconds), warmup=max(2, c)),
                                  [obs], f"{group} · C={c}"))
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
    # Leave the model as the lab starts it.
    triton.reload_model(PY_MODEL, {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]},
                        grpc_url=grpc_url, verbose=False)


def triton_onnx_experiment(t: Tour, triton_url: str, grpc_url: str, metrics_url: str) -> None:
    from servelab import triton

    cfg = t.cfg
    target = targets.triton_target(triton_url, ONNX_MODEL, timeout=cfg.timeout)
    t.log(f"  3. Triton {ONNX_MODEL}: constant vs Poisson arrivals, without and with dynamic batching")
    triton.reload_model(ONNX_MODEL, {"dynamic_batching": None}, grpc_url=grpc_url, verbose=False)
    probe = t.add("ONNX probe", load.run(target, load.sequential(cfg.n(cfg.probe_requests), warmup=3),
                                         [TritonObserver(triton_url, ONNX_MODEL)],
                                         "Triton ONNX · sequential probe"))
    s_server = _server_ms(probe) / 1000            # what queues: the model's compute
    l1 = probe.latency["mean_ms"] / 1000           # unloaded latency seen by the client
    rate = round(cfg.utilization / s_server, 1)
    t.facts.update(onnx_service_ms=s_server * 1000, onnx_unloaded_ms=l1 * 1000, onnx_rate=rate,
                   onnx_rho=rate * s_server)
    t.log(f"    service time S(1) = {s_server * 1000:.2f} ms -> offered load {rate:g} req/s (rho {rate * s_server:.2f})")
    runs: dict[tuple[str, str], Result] = {}
    for batching in ("off", "on"):
        if batching == "on":
            reported = triton.reload_model(ONNX_MODEL, {"dynamic_batching": {}}, grpc_url=grpc_url,
                                           verbose=False)
            t.log(f"    reloaded with dynamic_batching: {json.dumps(reported.get('dynamic_batching', {}))}")
        group = f"Triton ONNX · batching {batching}"
        for dist in ("constant", "poisson"):
            obs = TritonObserver(triton_url, ONNX_MODEL, metrics_url=metrics_url)
            pat = load.open_loop(rate, dist, duration=cfg.s(cfg.open_seconds), warmup=10, seed=11)
            runs[(batching, dist)] = t.add(group, load.run(target, pat, [obs], f"{group} · {dist} {rate:g}/s",
                                                           progress=None))
    # Queueing model. Without batching: M/D/1 for Poisson, no wait for constant.
    for dist in ("constant", "poisson"):
        wq = queueing.md1_wait(rate, s_server) if dist == "poisson" else queueing.dd1_wait(rate, s_server)
        t.comparisons.append(queueing.Comparison(
            f"ONNX {dist}, no batching", "M/D/1 wait + unloaded latency" if dist == "poisson"
            else "no wait (D/D/1) + unloaded latency", (l1 + wq) * 1000, runs[("off", dist)].latency["mean_ms"]))
    # With batching: S(b) = a + c*b fitted from the executions Triton timed.
    points: dict[int, tuple[float, int]] = {1: (s_server, probe.server["executions"])}
    for dist in ("constant", "poisson"):
        srv = runs[("on", dist)].server
        for b, ms in srv["per_batch_ms"].items():
            n = srv["batch_histogram"][b]
            old_s, old_n = points.get(int(b), (0.0, 0))
            points[int(b)] = ((old_s * old_n + ms / 1000 * n) / (old_n + n), old_n + n)
    a, c = queueing.fit_batch_service(points)
    t.facts.update(onnx_fit_a_ms=a * 1000, onnx_fit_c_ms=c * 1000,
                   onnx_pred_batch=queueing.batched_batch_size(rate, a, c))
    pred_b = (l1 - s_server + queueing.batched_response(rate, a, c)) * 1000
    t.comparisons.append(queueing.Comparison("ONNX poisson, batching", "half a batch wait + S(b*)", pred_b,
                                             runs[("on", "poisson")].latency["mean_ms"]))
    t.comparisons.append(queueing.Comparison("ONNX constant, batching", "no wait (D/D/1) + unloaded latency",
                                             l1 * 1000, runs[("on", "constant")].latency["mean_ms"]))
    for key, r in runs.items():
        t.facts[f"onnx_{key[0]}_{key[1]}_avg_batch"] = r.server.get("avg_batch_size")
        t.facts[f"onnx_{key[0]}_{key[1]}_p99_ms"] = r.latency["p99_ms"]
    triton.reload_model(ONNX_MODEL, {"dynamic_batching": None}, grpc_url=grpc_url, verbose=False)


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


def write_report(t: Tour, meta: dict) -> Path:
    files = _plots(t)
    load.save_json(t.results, t.out / "results.json")
    load.save_csv(t.results, t.out / "results.csv")
    (t.out / "queueing.json").write_text(json.dumps([c.as_dict() for c in t.comparisons], indent=1))
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
    if "onnx_rate" in f:
        L.append(f"- Triton ONNX at {f['onnx_rate']:g} req/s (S(1) = {f['onnx_service_ms']:.2f} ms, utilization "
                 f"{f['onnx_rho']:.2f}): p99 {_fmt(f['onnx_off_constant_p99_ms'])} ms constant vs "
                 f"{_fmt(f['onnx_off_poisson_p99_ms'])} ms Poisson without batching; with dynamic batching "
                 f"{_fmt(f['onnx_on_constant_p99_ms'])} / {_fmt(f['onnx_on_poisson_p99_ms'])} ms, average batch "
                 f"{_fmt(f['onnx_on_constant_avg_batch'], 2)} (constant) / {_fmt(f['onnx_on_poisson_avg_batch'], 2)} (Poisson).")
    if "flask" in meta:
        L.append(f"- Flask UI smoke test (`GET /test` through the FastAPI backend): {meta['flask']}.")
    L += ["", "## 1. FastAPI: PyTorch vs ONNX", "",
          "![latency CDF](fastapi_latency_cdf.png)", "", "![throughput](fastapi_throughput.png)", "",
          "## 2. Triton, Python backend: concurrency and instances", "",
          "Each point is a closed loop: C clients, each sending its next request when the last returns. "
          "With one instance, requests queue; a second instance helps only if the CPU has room for it "
          "(threads per instance are sized to cores ÷ instances).", "",
          "![latency](triton_python_latency.png)", "", "![throughput](triton_python_throughput.png)", "",
          "![queue vs compute](triton_python_queue_compute.png)", "",
          "![utilization](triton_python_utilization.png)", "",
          "## 3. Triton, ONNX model: arrivals and dynamic batching", "",
          "Open loop at a fixed rate: requests go out on schedule whatever the server does, and latency counts "
          "from the scheduled time. Poisson arrivals come in bursts, constant ones evenly spaced.", "",
          "![latency CDF](onnx_latency_cdf.png)", "", "![batch sizes](onnx_batch_histogram.png)", "",
          "![queue vs compute](onnx_queue_compute.png)", "",
          "## 4. Queueing model vs measurement", "",
          "S(1) is the measured mean latency at concurrency 1 (closed loop), or for the ONNX runs Triton's "
          "compute time per request at concurrency 1 (what requests queue for) plus the unloaded client latency.",
          "",
          "- Closed loop, k instances: latency ≈ max(1, C/k)·S(1) (Little's law with C requests always in the system).",
          "- Poisson arrivals at rate λ, one instance, ρ = λS: M/D/1 wait Wq = ρS / (2(1−ρ)); constant "
          "arrivals below saturation wait 0.",
          "- Dynamic batching: S(b) = a + c·b fitted from Triton's batch statistics "
          + (f"(a = {f['onnx_fit_a_ms']:.2f} ms, c = {f['onnx_fit_c_ms']:.2f} ms per request); " if "onnx_fit_a_ms" in f else "; ")
          + "batch b* = λa/(1−λc); a request waits about half a batch, then is served: W ≈ ρ_b·S(b*)/2 + S(b*).",
          "", "| case | model | predicted ms | measured ms | gap |", "|---|---|---:|---:|---:|"]
    for c in t.comparisons:
        L.append(f"| {c.case} | {c.model} | {c.predicted_ms:.1f} | {c.measured_ms:.1f} | {c.gap_pct:+.0f}% |")
    L += ["", "Gap = (measured − predicted) / predicted. Where it is large, the model's assumptions do not hold: "
          "e.g. the FastAPI services decode images in parallel outside the model lock (less than C·S), CPU "
          "instances share two cores (more than C/k·S), service times vary (M/D/1 assumes they do not).", "",
          "![predicted vs measured](queueing_model.png)", "",
          "## Files", "", "- `results.json` — every run, with per-request latencies; `results.csv` — the summary table;",
          "- `queueing.json` — the model comparison; `*.png` — the plots above.", ""]
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
    ap = argparse.ArgumentParser(prog="python -m servelab.tour")
    sub = ap.add_subparsers(dest="command", required=True)
    add_parser(sub)
    ns = ap.parse_args(["tour", *sys.argv[1:]])
    raise SystemExit(ns.func(ns))
