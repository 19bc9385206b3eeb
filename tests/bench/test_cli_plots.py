"""`servelab bench` end to end against our tiny server, and the plots."""

from __future__ import annotations

import argparse
import json

import pytest

from servelab import bench
from servelab.bench import cli, plots, queueing


def _run_cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="servelab")
    cli.add_parser(p.add_subparsers(dest="command"))
    args = p.parse_args(argv)
    return args.func(args)


def test_cli_closed_sweep_writes_files(tiny_server, tmp_path, capsys):
    rc = _run_cli(["bench", "http", tiny_server + "/ok", "-c", "1,4", "-n", "30", "--out", str(tmp_path),
                   "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "sequential" in out and "C=4" in out
    data = json.loads((tmp_path / "results.json").read_text())
    assert [d["sent"] for d in data] == [30, 30] and all(d["ok"] == 30 for d in data)
    for f in ("results.csv", "latency_vs_concurrency.png", "throughput_vs_concurrency.png", "latency_cdf.png",
              "utilization.png"):
        assert (tmp_path / f).stat().st_size > 0, f


def test_cli_open_loop_and_errors(tiny_server, capsys):
    rc = _run_cli(["bench", "fastapi", tiny_server, "--rate", "100", "--distribution", "poisson", "-n", "20"])
    assert rc == 0
    assert "100/s poisson" in capsys.readouterr().out
    rc = _run_cli(["bench", "http", tiny_server + "/status/500", "-c", "2", "-n", "6"])
    out = capsys.readouterr().out
    assert rc == 1 and "HTTP 500 x6" in out


def test_cli_rejects_bad_numbers(capsys):
    with pytest.raises(SystemExit):
        _run_cli(["bench", "http", "http://127.0.0.1:1/", "-c", "0"])
    with pytest.raises(SystemExit):
        _run_cli(["bench", "http", "http://127.0.0.1:1/", "-c", "1", "--rate", "5"])


def _fake(label, conc, lat_ms, server=True):
    r = bench.Result(label=label, target={"name": "t"}, pattern={"concurrency": conc, "label": label},
                     started_at="", sent=len(lat_ms), ok=len(lat_ms), errors={}, duration_s=1.0,
                     throughput=len(lat_ms), latency=bench.load.stats.summarize([x / 1000 for x in lat_ms]),
                     latencies_ms=lat_ms)
    if server:
        r.server = {"per_request_ms": {"queue": 1.0 * conc, "compute_input": 0.1, "compute_infer": 2.0,
                                       "compute_output": 0.1},
                    "batch_histogram": {1: 5, 2: 3 * conc}, "avg_batch_size": 1.5}
        r.utilization = {"t": [0, 0.5, 1.0], "series": {"CPU": [0.2, 0.9, 0.8]}}
    return r


def test_every_plot_renders(tmp_path):
    a = [_fake("a C=1", 1, [1, 2, 3, 4]), _fake("a C=8", 8, [15, 16, 19, 22])]
    b = [_fake("b C=1", 1, [1, 1, 2, 2]), _fake("b C=8", 8, [3, 4, 4, 5])]
    made = [
        plots.latency_vs_concurrency({"a": a, "b": b}, tmp_path / "lat.png"),
        plots.throughput_vs_concurrency({"a": a, "b": b}, tmp_path / "thr.png"),
        plots.latency_cdf(a + b, tmp_path / "cdf.png"),
        plots.queue_vs_compute(a + b, tmp_path / "qc.png"),
        plots.batch_histogram(a + b, tmp_path / "bh.png"),
        plots.utilization(a + b, tmp_path / "util.png"),
        plots.predicted_vs_measured([queueing.Comparison("C=8", "C*S", 16.0, 12.0)], tmp_path / "pm.png"),
    ]
    assert all(m is not None for m in made)
    for f in ("lat", "thr", "cdf", "qc", "bh", "util", "pm"):
        assert (tmp_path / f"{f}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the stacked bars add up to the client's mean latency (server parts + the rest)
    ax = made[3].axes[0]
    heights = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        heights[x] = heights.get(x, 0) + patch.get_height()
    assert heights[1] == pytest.approx(a[1].latency["mean_ms"])


def test_tour_utilization_plot_shows_the_cpu_beside_the_gpus(tmp_path):
    """On a GPU host the CPU still decodes every image (a likely bottleneck): the
    tour's utilization plot shows both. GPU presence is the series the runs carry."""
    from servelab.measure import tour, tour_report

    runs = [_fake("Triton Python · 1 instance · C=1", 1, [1, 2, 3]), _fake("Triton Python · 1 instance · C=8", 8, [4, 5])]
    for r in runs:
        r.utilization = {"t": [0, 0.5, 1.0], "series": {"CPU": [0.9, 1.0, 0.95], "GPU GPU-12345678": [0.2, 0.3, 0.2]}}
    t = tour.Tour(tour.TourConfig(), tmp_path)
    t.groups = {"Triton Python · 1 instance": runs}
    figs = {}
    tour_report._python_plots(t, plots, lambda name, fn, *a, **kw: figs.__setitem__(name, fn(*a, **kw)))
    labels = [line.get_label() for line in figs["triton_python_utilization.png"].axes[0].get_lines()]
    assert sum(label.endswith(" CPU") for label in labels) == 2, labels
    assert sum(label.endswith(" GPU GPU-12345678") for label in labels) == 2, labels
