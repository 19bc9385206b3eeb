"""The tour's report: ``results/<timestamp>/report.md``, its plots and data
files, written from a finished :class:`servelab.measure.tour_state.Tour` (split out of
``servelab.measure.tour``; ``servelab.measure.tour.write_report`` is this module's)."""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path

from servelab.bench import batchcost, load, queueing, table
from servelab.core import paths, procs
from servelab.measure import evidence
from servelab.measure.tour_state import Tour

# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------

def _plots(t: Tour) -> dict[str, str]:
    from servelab.bench import plots  # matplotlib, imported only when drawing

    out, files = t.out, {}

    def save(name, fn, *a, **kw):
        fn(*a, path=out / name, **kw)
        files[name] = name

    for section in (_fastapi_plots, _python_plots, _onnx_plots, _model_plots):
        section(t, plots, save)
    return files


def _fastapi_plots(t: Tour, plots, save) -> None:
    fa = {k: t.groups[k] for k in ("FastAPI PyTorch", "FastAPI ONNX") if k in t.groups}
    if fa:
        save("fastapi_latency_cdf.png", plots.latency_cdf, [r for rs in fa.values() for r in rs],
             title="FastAPI: latency CDF, sequential and 16 clients", log_x=True)
        save("fastapi_throughput.png", plots.throughput_vs_concurrency, fa, title="FastAPI: throughput vs clients")


def _python_plots(t: Tour, plots, save) -> None:
    py = {k: v for k, v in t.groups.items() if k.startswith("Triton Python")}
    if not py:
        return
    save("triton_python_latency.png", plots.latency_vs_concurrency, py, percentiles=(50, 95),
         title="Triton Python model: latency vs concurrency")
    save("triton_python_throughput.png", plots.throughput_vs_concurrency, py,
         title="Triton Python model: throughput vs concurrency")
    save("triton_python_queue_compute.png", plots.queue_vs_compute, [r for rs in py.values() for r in rs],
         title="Triton Python model: queue vs compute per request")
    py_runs = [r for rs in py.values() for r in rs]
    gpu = any(k.startswith("GPU") for r in py_runs for k in (r.utilization or {}).get("series", {}))
    # On a GPU host the CPU still decodes every image: show it beside the GPUs.
    save("triton_python_utilization.png", plots.utilization, py_runs, series=("CPU", "GPU") if gpu else "CPU",
         title="Triton Python model: utilization during each run")


def _onnx_plots(t: Tour, plots, save) -> None:
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


def _model_plots(t: Tour, plots, save) -> None:
    curves = {k: v for k, v in (("raw ONNX Runtime", t.facts.get("batch_cost_raw_s")),
                                ("through Triton", t.facts.get("batch_cost_triton_s"))) if v}
    if curves:
        save("onnx_batch_cost.png", plots.batch_cost, curves)
    if t.comparisons:
        save("queueing_model.png", plots.predicted_vs_measured, t.comparisons)


def _machine() -> str:
    return f"{os.cpu_count()} CPU(s) {procs.cpu_model()}".strip() + f", {platform.system()} {platform.release()}, Python {platform.python_version()}"


def _weights_kind() -> str:
    try:
        from servelab.core import food11
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
            "one Triton instance gets here). Through Triton: client batches of b from four clients at once, so "
            "the instance is always busy and the client shares the cores with it, as under load; S(b) is the "
            "time between completions, so it includes what the backend and the client add per execution.", ""]
    if gain:
        out += [f"Through Triton an image costs {1000 * tri.get(16, math.nan) / 16:.2f} ms in a batch of 16 and "
                f"{1000 * tri.get(1, math.nan):.2f} ms alone: batching makes it "
                + (f"{gain:.2f}× cheaper. " if gain >= 1 else f"{1 / gain:.2f}× *more* expensive. ")
                + ("That is little: on this CPU the work grows almost linearly with the batch, so batching "
                   "cannot add much capacity; it mostly makes each request wait for the others in its batch. "
                   if gain < 1.5 else
                   "Batches are markedly cheaper per image here, so batching adds capacity. ")
                + "On a GPU a batch of 16 costs little more than one image: " + batchcost.GPU_REFERENCE
                + " There S(b)/b falls steeply and dynamic batching multiplies what one instance serves.", ""]
    out += ["![batch cost](onnx_batch_cost.png)", ""]
    return out


def _sweep_text(t: Tour) -> list[str]:
    f = t.facts
    if not t.sweep:
        return []
    out = [f"Offered loads {', '.join(f'{x:g}×' for x in t.cfg.sweep_factors)} one instance's unbatched capacity "
           f"1/S(1) = {f['onnx_capacity']:.1f} req/s, each {t.cfg.s(t.cfg.sweep_seconds):g} s, batching on then "
           "off; where the measured or the model's curve first rises past the bound between two loads more than "
           f"{100 * evidence.BatchingPlan.refine_step:.0f} % apart, their midpoint is measured too (up to "
           f"{evidence.BatchingPlan.refine_rounds} rounds), so both are read on a grid finer than the "
           f"±{100 * evidence.BatchingPlan.tolerance:.0f} % check. Past capacity the queue grows: at most 32 "
           "requests are kept in flight and later arrivals are dropped (counted), so an overloaded run ends on time. Dashed and dotted lines: the model's p50 "
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
            "(10× the unloaded median latency, and at least two full batches, 2 S(16): a request that just misses a "
            "full batch waits for it and rides in the next even when the server keeps up) with nothing dropped, "
            "interpolated between sweep points; the "
            "model's figure is read the same way from its simulated p99 at the same offered rates, run lengths "
            "and in-flight cap. The model takes S(b) as Triton timed it per batch during the sweep (a line "
            "fitted to its per-batch-size statistics): with the client sending on the same cores an execution "
            "costs more than in the quiet S(b) measurement above, whose prediction is shown beside it.", "",
            "| configuration | measured req/s | model req/s | gap | S(1) in the sweep, ms | model from the quiet S(b), req/s |",
            "|---|---:|---:|---:|---:|---:|"]
    quiet, seen = f.get("sweep_predicted_quiet", {}), f.get("sweep_cost_seen_s", {})
    for key, name in (("off", "batching off"), ("on", "batching on")):
        m, p = sus.get(key), pred.get(key)
        gap = f"{100 * (m - p) / p:+.0f} %" if m and p else "-"
        s1 = queueing.BatchCost(seen[key])(1) * 1000 if key in seen else None
        out.append(f"| {name} | {_fmt(m)} | {_fmt(p)} | {gap} | {_fmt(s1)} | {_fmt(quiet.get(key))} |")
    return [*out, ""]


def _write_data(t: Tour) -> None:
    load.save_json(t.results, t.out / "results.json")
    load.save_csv(t.results, t.out / "results.csv")
    (t.out / "queueing.json").write_text(json.dumps([c.as_dict() for c in t.comparisons], indent=1))
    (t.out / "checks.json").write_text(json.dumps([c.as_dict() for c in t.checks], indent=1))


def _headlines(t: Tour, meta: dict) -> list[str]:
    """The report's 'Headline ratios' bullets, from the facts this run measured."""
    f, L = t.facts, []
    if "fastapi_onnx_vs_pt_c16" in f:
        L.append(f"- FastAPI ONNX vs PyTorch throughput: {f['fastapi_onnx_vs_pt_sequential']:.2f}× sequential, "
                 f"{f['fastapi_onnx_vs_pt_c16']:.2f}× with 16 clients. PyTorch with 16 clients vs sequential: "
                 f"{f['fastapi_pt_c16_vs_seq']:.2f}× (16 clients, far from 16× the throughput: one server "
                 "process queues what it cannot overlap).")
    for c in t.cfg.concurrency:
        k = f"triton_py_2v1_throughput_c{c}"
        if k in f:
            L.append(f"- Triton Python model, 2 instances vs 1 at concurrency {c}: {f[k]:.2f}× throughput.")
    if "sweep_sustained" in f:
        sus, pred = f["sweep_sustained"], f["sweep_predicted"]
        L.append(f"- Triton ONNX, highest Poisson load held with p99 ≤ {f['sweep_bound_ms']:.0f} ms: "
                 f"{_fmt(sus.get('off'))} req/s without batching (model {_fmt(pred.get('off'))}), "
                 f"{_fmt(sus.get('on'))} req/s with dynamic batching (model {_fmt(pred.get('on'))}); "
                 f"one instance's unbatched capacity 1/S(1) = {f['onnx_capacity']:.1f} req/s.")
    if "flask" in meta:
        L.append(f"- Flask UI smoke test (`GET /test` through the FastAPI backend): {meta['flask']}.")
    return L


def write_report(t: Tour, meta: dict) -> Path:
    _plots(t)
    _write_data(t)
    L = [f"# ServeLab tour — {meta['started']}", "",
         f"Machine: {meta['machine']}. Weights: **{meta['weights']}**"
         + (" (untrained demo weights: labels are not meaningful; timings are)." if meta["weights"] == "demo" else "."),
         f"Triton 2.51 (nvidia-pytriton binary), local runner for the ONNX model. Tour took {meta['elapsed_s']:.0f} s. "
         "Every number below was measured in this run.", "",
         "## Summary", "", table.markdown(t.results), "",
         "Columns: requests sent, succeeded, failed; throughput of successful requests; client-side latency "
         "(open-loop runs from each request's *scheduled* send time); Triton's own per-request queue and "
         "compute time and average batch size for that run only (statistics before/after).", "",
         "## Headline ratios (this run)", "", *_headlines(t, meta)]
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
          "An instance running alone uses every core, busy instances share them (models_staging/food_classifier/1/core_share.py), "
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
          "### Load sweep: Poisson arrivals from a third to twice one instance's capacity", "",
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
