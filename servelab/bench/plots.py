"""PNG plots of bench results (matplotlib, no display needed).

Each function takes results, draws one figure, saves it when ``path`` is
given and returns the ``Figure`` (a notebook displays it inline). Figures
are built with ``matplotlib.figure.Figure`` directly, never ``pyplot``, so
nothing depends on a GUI backend and nothing is left open.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

from matplotlib.figure import Figure

from servelab.bench import stats
from servelab.bench.load import Result

PHASE_COLORS = {"queue": "#d62728", "compute_input": "#9467bd", "compute_infer": "#1f77b4",
                "compute_output": "#17becf", "client + network": "#bbbbbb"}


def _finish(fig: Figure, path: str | Path | None) -> Figure:
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    return fig


def _concurrency(r: Result) -> int:
    return int(r.pattern.get("concurrency", 1))


def latency_vs_concurrency(series: Mapping[str, Sequence[Result]], path=None,
                           percentiles=(50, 95, 99), title="Latency vs concurrency") -> Figure:
    """One line per (configuration, percentile); x = closed-loop clients."""
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    styles = {50: "-o", 90: "-.^", 95: "--s", 99: ":x"}
    for i, (name, results) in enumerate(series.items()):
        rs = sorted(results, key=_concurrency)
        xs = [_concurrency(r) for r in rs]
        for p in percentiles:
            ax.plot(xs, [r.latency[f"p{p}_ms"] for r in rs], styles.get(p, "-o"), color=f"C{i}",
                    label=f"{name} p{p}")
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _finish(fig, path)


def throughput_vs_concurrency(series: Mapping[str, Sequence[Result]], path=None,
                              title="Throughput vs concurrency") -> Figure:
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    for i, (name, results) in enumerate(series.items()):
        rs = sorted(results, key=_concurrency)
        ax.plot([_concurrency(r) for r in rs], [r.throughput for r in rs], "-o", color=f"C{i}", label=name)
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("requests / s")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _finish(fig, path)


def latency_cdf(results: Sequence[Result], path=None, title="Latency CDF", log_x: bool = False) -> Figure:
    """Empirical CDFs of successful-request latency, overlaid."""
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    for i, r in enumerate(results):
        xs, ys = stats.cdf(r.latencies_ms)
        if len(xs):
            ax.step(xs, ys, where="post", color=f"C{i % 10}", label=r.label)
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of requests")
    if log_x:
        ax.set_xscale("log")
    ax.set_ylim(0, 1.01)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _finish(fig, path)


def queue_vs_compute(results: Sequence[Result], path=None, title="Where a request's time goes") -> Figure:
    """Stacked bars per run: Triton queue, compute input/infer/output, and the
    rest of the client's mean latency (HTTP, network, client)."""
    rs = [r for r in results if r.server and r.server.get("per_request_ms")]
    fig = Figure(figsize=(max(6, 0.9 * len(rs) + 2), 4.4))
    ax = fig.add_subplot()
    xs = range(len(rs))
    bottoms = [0.0] * len(rs)
    for phase in ("queue", "compute_input", "compute_infer", "compute_output", "client + network"):
        vals = []
        for r in rs:
            pr = r.server["per_request_ms"]
            if phase == "client + network":
                server = sum(pr.get(p, 0.0) for p in ("queue", "compute_input", "compute_infer", "compute_output"))
                vals.append(max(0.0, r.latency["mean_ms"] - server))
            else:
                vals.append(pr.get(phase, 0.0))
        ax.bar(xs, vals, bottom=bottoms, color=PHASE_COLORS[phase], label=phase)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r.label for r in rs], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("mean time per request (ms)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    return _finish(fig, path)


def batch_histogram(results: Sequence[Result], path=None, title="Batch sizes Triton executed") -> Figure:
    """Grouped bars: executions per batch size, one colour per run."""
    rs = [r for r in results if r.server and r.server.get("batch_histogram")]
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    sizes = sorted({int(b) for r in rs for b in r.server["batch_histogram"]}) or [1]
    width = 0.8 / max(1, len(rs))
    for i, r in enumerate(rs):
        h = {int(k): v for k, v in r.server["batch_histogram"].items()}
        total = sum(h.values()) or 1
        ax.bar([b + (i - (len(rs) - 1) / 2) * width for b in sizes],
               [h.get(b, 0) / total for b in sizes], width=width, color=f"C{i % 10}",
               label=f"{r.label} (mean {stats.weighted_mean(h):.2f})")
    ax.set_xticks(sizes)
    ax.set_xlabel("batch size")
    ax.set_ylabel("fraction of executions")
    ax.set_title(title)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    return _finish(fig, path)


def utilization(results: Sequence[Result], path=None, series: str | Sequence[str] = "CPU",
                title: str | None = None) -> Figure:
    """Utilization over each run's time (CPU and/or GPU from Triton's metrics).

    ``series`` names one series or several (``("CPU", "GPU")``: the host's
    CPU, solid, beside every GPU, dashed); ``"GPU"`` means every GPU series.
    """
    wanted = [series] if isinstance(series, str) else list(series)
    styles = {w: "-" if k == 0 else "--" for k, w in enumerate(wanted)}
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    for i, r in enumerate(results):
        u = r.utilization or {}
        for name, vals in (u.get("series") or {}).items():
            match = next((w for w in wanted if name == w or (w == "GPU" and name.startswith("GPU"))), None)
            if match is None:
                continue
            named = len(wanted) > 1 or match == "GPU"
            ax.plot(u["t"], [v * 100 for v in vals], styles[match], color=f"C{i % 10}",
                    label=f"{r.label}" + (f" {name}" if named else ""))
    what = " and ".join(wanted)
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel(f"{what} utilization (%)")
    ax.set_ylim(0, 105)
    ax.set_title(title or f"{what} utilization during each run")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _finish(fig, path)


def predicted_vs_measured(comparisons: Sequence, path=None, title="Queueing model vs measurement") -> Figure:
    """Paired bars per case with the gap printed above; takes ``queueing.Comparison``."""
    fig = Figure(figsize=(max(6, 1.0 * len(comparisons) + 2), 4.4))
    ax = fig.add_subplot()
    xs = list(range(len(comparisons)))
    ax.bar([x - 0.2 for x in xs], [c.predicted_ms for c in comparisons], 0.4, color="#aaaaaa", label="predicted")
    ax.bar([x + 0.2 for x in xs], [c.measured_ms for c in comparisons], 0.4, color="C0", label="measured")
    for x, c in zip(xs, comparisons):
        g = c.gap_pct
        if not math.isnan(g):
            ax.annotate(f"{g:+.0f}%", (x, max(c.predicted_ms, c.measured_ms)), ha="center",
                        va="bottom", fontsize=8)
    ax.set_xticks(xs)
    ax.set_xticklabels([c.case for c in comparisons], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("mean latency (ms)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _finish(fig, path)


def _offered(r: Result) -> float:
    return float(r.pattern.get("rate") or 0.0)


def _sweep_points(ax, name: str, rs: Sequence[Result], color: str) -> None:
    """One configuration's measured p50 and p99, invalid runs hollow, dropping runs marked x."""
    for p, style in ((50, "-o"), (99, "-s")):
        xs = [_offered(r) for r in rs]
        ys = [r.latency[f"p{p}_ms"] for r in rs]
        if xs:
            ax.plot(xs, ys, style, color=color, label=f"{name} p{p}", alpha=0.9 if p == 50 else 0.6,
                    markerfacecolor=color)
        for r, x, y in zip(rs, xs, ys):
            if not r.valid:
                ax.plot([x], [y], "o", markersize=11, markerfacecolor="none", markeredgecolor="k")
            if r.dropped or r.error_count:
                ax.plot([x], [y], "x", markersize=10, color="k")


def load_sweep(series: Mapping[str, Sequence[Result]], path=None, model: Mapping[str, dict] | None = None,
               bound_ms: float | None = None, title="Latency vs offered load") -> Figure:
    """p50 and p99 latency vs offered load (open loop), one colour per
    configuration; ``model`` adds the queueing model's curves as
    ``{name: {"rates": [...], "p50_ms": [...], "p99_ms": [...]}}`` (dashed),
    coloured like the series of the same name. Invalid runs are drawn hollow,
    runs that dropped requests or timed out are marked with an x."""
    fig = Figure(figsize=(7.5, 4.6))
    ax = fig.add_subplot()
    names = list(series) + [n for n in (model or {}) if n not in series]
    for i, name in enumerate(names):
        color = f"C{i}"
        _sweep_points(ax, name, sorted(series.get(name, []), key=_offered), color)
        m = (model or {}).get(name)
        if m:
            ax.plot(m["rates"], m["p50_ms"], "--", color=color, linewidth=1, label=f"{name} model p50")
            ax.plot(m["rates"], m["p99_ms"], ":", color=color, linewidth=1.5, label=f"{name} model p99")
    if bound_ms:
        ax.axhline(bound_ms, color="grey", linewidth=0.8)
        ax.annotate(f"p99 bound {bound_ms:.0f} ms", (ax.get_xlim()[0], bound_ms), fontsize=7, va="bottom")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests / s, Poisson)")
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, ncol=2)
    return _finish(fig, path)


def throughput_vs_offered(series: Mapping[str, Sequence[Result]], path=None,
                          title="Throughput vs offered load") -> Figure:
    """Completed requests/s vs offered requests/s; the diagonal is 'keeps up'."""
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    top = 0.0
    for i, (name, results) in enumerate(series.items()):
        rs = sorted(results, key=_offered)
        xs = [_offered(r) for r in rs]
        top = max([top, *xs])
        ax.plot(xs, [r.throughput for r in rs], "-o", color=f"C{i}", label=name)
    ax.plot([0, top], [0, top], ":", color="grey", label="served = offered")
    ax.set_xlabel("offered load (requests / s)")
    ax.set_ylabel("completed requests / s")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _finish(fig, path)


def batch_cost(curves: Mapping[str, Mapping[int, float]], path=None,
               title="Batch cost: time per image, S(b)/b") -> Figure:
    """S(b)/b (ms per image) vs batch size, one line per source
    (``{name: {b: seconds per batch}}``). Flat: batching buys nothing."""
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    for i, (name, pts) in enumerate(curves.items()):
        bs = sorted(int(b) for b in pts)
        ax.plot(bs, [1000 * pts[b] / b for b in bs], "-o", color=f"C{i}", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size b")
    ax.set_ylabel("ms per image, S(b) / b")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _finish(fig, path)
