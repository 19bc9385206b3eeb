"""Statistics: percentiles, summaries, histograms, Triton stats deltas, metrics parsing."""

import math

import pytest

from servelab.bench import stats
from servelab.bench.triton import parse_prometheus, utilization_sample
from servelab.triton import stats_delta


def test_percentile_interpolates_between_ranks():
    assert stats.percentile([1, 2, 3, 4], 50) == 2.5
    assert stats.percentile([10], 99) == 10
    assert stats.percentile(list(range(101)), 90) == 90
    assert stats.percentile([3, 1, 2], 0) == 1 and stats.percentile([3, 1, 2], 100) == 3
    assert math.isnan(stats.percentile([], 50))
    with pytest.raises(ValueError):
        stats.percentile([1], 101)


def test_summarize_in_ms():
    s = stats.summarize([0.001 * x for x in range(1, 101)])  # 1..100 ms
    assert s["count"] == 100
    assert s["mean_ms"] == pytest.approx(50.5)
    assert s["p50_ms"] == pytest.approx(50.5)
    assert s["p90_ms"] == pytest.approx(90.1)
    assert s["p99_ms"] == pytest.approx(99.01)
    assert s["min_ms"] == pytest.approx(1) and s["max_ms"] == pytest.approx(100)
    empty = stats.summarize([])
    assert empty["count"] == 0 and math.isnan(empty["p50_ms"])


def test_histogram_cdf_dispersion():
    assert stats.histogram([2, 1, 2, 4, 2]) == {1: 1, 2: 3, 4: 1}
    assert list(stats.histogram([3, 1])) == [1, 3]  # sorted
    assert stats.weighted_mean({1: 2, 4: 2}) == 2.5
    xs, ys = stats.cdf([3, 1, 2, 2])
    assert list(xs) == [1, 2, 2, 3] and list(ys) == [0.25, 0.5, 0.75, 1.0]
    assert stats.dispersion([5, 5, 5]) == 0


def _snap(success, queue_ns, infer_ns, inf, execs, batches):
    def c(n, ns):
        return {"count": n, "ns": ns}
    return {
        "name": "m", "version": "1", "inference_count": inf, "execution_count": execs,
        "inference_stats": {"success": c(success, success * 1_000_000 + queue_ns + infer_ns),
                            "fail": c(0, 0), "queue": c(success, queue_ns),
                            "compute_input": c(success, success * 10_000),
                            "compute_infer": c(success, infer_ns),
                            "compute_output": c(success, success * 20_000)},
        "batch_stats": [{"batch_size": b, "compute_input": c(n, n * 10_000),
                         "compute_infer": c(n, n * ms * 1_000_000), "compute_output": c(n, 0)}
                        for b, (n, ms) in batches.items()],
    }


def test_stats_delta_is_the_run_only():
    before = _snap(100, 500_000_000, 300_000_000, 100, 100, {1: (100, 3)})
    # the run: 60 requests in 20 executions of 1 (x10 at 3 ms) and 5 (x10 at 8 ms)
    after = _snap(160, 500_000_000 + 60 * 2_000_000, 300_000_000 + 60 * 4_000_000, 160, 120,
                  {1: (110, 3), 5: (10, 8)})
    d = stats_delta(before, after)
    assert d["requests"] == 60 and d["inferences"] == 60 and d["executions"] == 20
    assert d["avg_batch_size"] == pytest.approx(3.0)
    assert d["per_request_ms"]["queue"] == pytest.approx(2.0)
    assert d["per_request_ms"]["compute_infer"] == pytest.approx(4.0)
    assert d["per_request_ms"]["compute_input"] == pytest.approx(0.01)
    assert d["batch_histogram"] == {1: 10, 5: 10}
    assert d["per_batch_ms"][5] == pytest.approx(8.01)
    # nothing happened: empty histogram, no averages
    still = stats_delta(after, after)
    assert still["requests"] == 0 and still["batch_histogram"] == {} and still["avg_batch_size"] is None


def test_prometheus_parsing_and_utilization_series():
    text = """# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0.75
nv_gpu_utilization{gpu_uuid="GPU-1234567890abcdef"} 0.5
nv_inference_pending_request_count{model="food_classifier",version="1"} 3
nv_inference_pending_request_count{model="other",version="1"} 9
"""
    rows = parse_prometheus(text)
    assert ("nv_cpu_utilization", {}, 0.75) in rows
    s = utilization_sample(text, "food_classifier")
    assert s["CPU"] == 0.75
    assert s["pending requests"] == 3
    assert s["GPU GPU-12345678"] == 0.5
