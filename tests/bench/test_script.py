"""servelab.bench.script: the benchmarks' shared arguments, timing and JSON."""

from __future__ import annotations

import json
import math

import pytest

from servelab.bench import script


def _parser():
    ap = script.Parser("First paragraph.\n\nMore.", rounds=3)
    ap.sized("--requests", type=int, full=100, quick=30, tiny=4)
    ap.sized("--duration", type=float, full=3.0, tiny=0.5)  # quick falls back to full
    return ap


def test_presets_pick_the_defaults():
    ap = _parser()
    assert ap.description == "First paragraph."
    full, quick, tiny = ap.parse_args([]), ap.parse_args(["--quick"]), ap.parse_args(["--tiny"])
    assert (full.size, full.requests, full.duration, full.rounds, full.json) == ("full", 100, 3.0, 3, None)
    assert (quick.size, quick.requests, quick.duration, quick.rounds) == ("quick", 30, 3.0, 2)
    assert (tiny.size, tiny.requests, tiny.duration, tiny.rounds) == ("tiny", 4, 0.5, 1)


def test_explicit_flags_win_over_presets(tmp_path):
    args = _parser().parse_args(["--tiny", "--requests", "7", "--rounds", "5", "--json", str(tmp_path / "x.json")])
    assert (args.requests, args.rounds, args.json) == (7, 5, tmp_path / "x.json")


@pytest.mark.parametrize("argv", [["--quick", "--tiny"], ["--rounds", "0"]])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(argv)
    assert e.value.code == 2


def test_time_loop_counts_calls_and_summarises():
    calls = []
    s = script.time_loop(lambda: calls.append(1), 5, warmup=2)
    assert len(calls) == 7 and s["count"] == 5 and s["throughput"] > 0
    assert s["min_ms"] <= s["p50_ms"] <= s["p99_ms"] <= s["max_ms"]


def test_summary_uses_bench_stats_percentiles():
    s = script.summary([0.001, 0.002, 0.003, 0.004], wall_s=2.0)
    assert s["p50_ms"] == pytest.approx(2.5) and s["throughput"] == pytest.approx(2.0)
    assert math.isnan(script.summary([])["p50_ms"])


def test_best_and_write_json(tmp_path):
    runs = [{"throughput": 1.0}, {"throughput": 3.0}, {"throughput": 2.0}]
    assert script.best(runs) is runs[1]
    assert script.write_json(None, runs) is None
    path = script.write_json(tmp_path / "a" / "b.json", {"runs": runs, "path": tmp_path})
    assert json.loads(path.read_text())["runs"] == runs
