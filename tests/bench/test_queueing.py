"""The queueing model against values worked out by hand."""

import math

import pytest

from servelab.bench import queueing
from servelab.bench import queueing as q


def test_closed_loop_little_law():
    # one instance, 8 clients, 20 ms each: 8 x 20 ms latency, 50 req/s
    p = q.closed_loop(8, 0.020)
    assert p["latency_s"] == pytest.approx(0.160) and p["throughput"] == pytest.approx(50)
    # two instances halve the wait and double throughput (if they do not share cores)
    p2 = q.closed_loop(8, 0.020, instances=2)
    assert p2["latency_s"] == pytest.approx(0.080) and p2["throughput"] == pytest.approx(100)
    # fewer clients than instances: no queue
    assert q.closed_loop(1, 0.020, 2)["latency_s"] == pytest.approx(0.020)


def test_md1_known_values():
    # rho = 0.5, S = 1: Wq = 0.5 * 1 / (2 * 0.5) = 0.5
    assert q.md1_wait(0.5, 1.0) == pytest.approx(0.5)
    assert q.md1_response(0.5, 1.0) == pytest.approx(1.5)
    # rho = 0.8, S = 10 ms: Wq = 0.8 * 10 / 0.4 = 20 ms
    assert q.md1_wait(80, 0.010) == pytest.approx(0.020)
    # M/D/1 waits exactly half of M/M/1's rho*S/(1-rho)
    assert q.md1_wait(80, 0.010) == pytest.approx(0.5 * 0.8 * 0.010 / 0.2)
    assert math.isinf(q.md1_wait(100, 0.010))
    # constant arrivals below saturation: no wait at all
    assert q.dd1_wait(80, 0.010) == 0 and q.dd1_response(80, 0.010) == pytest.approx(0.010)
    assert math.isinf(q.dd1_wait(120, 0.010))


def test_batching_fit_and_prediction():
    # S(b) = 4 ms + 1 ms * b, observed exactly at b = 1, 2, 4
    a, c = q.fit_batch_service({1: (0.005, 10), 2: (0.006, 5), 4: (0.008, 2)})
    assert a == pytest.approx(0.004) and c == pytest.approx(0.001)
    # at 500 req/s: b* = 500 * 0.004 / (1 - 0.5) = 4, S(4) = 8 ms, busy all the time
    assert q.batched_batch_size(500, a, c) == pytest.approx(4.0)
    assert q.batched_response(500, a, c) == pytest.approx(0.004 + 0.008)  # half a batch + a batch
    # light load: batches of 1, busy fraction lam*S(1)
    assert q.batched_batch_size(50, a, c) == 1.0
    assert q.batched_response(50, a, c) == pytest.approx(0.25 * 0.005 / 2 + 0.005)
    # beyond what batching can absorb: capped at max_batch
    assert q.batched_batch_size(2000, a, c, max_batch=16) == 16
    # one batch size only: flat fit
    assert q.fit_batch_service({1: (0.003, 7)}) == (pytest.approx(0.003), 0.0)
    with pytest.raises(ValueError):
        q.fit_batch_service({})


def test_gap():
    assert q.gap_pct(10, 12) == pytest.approx(20)
    cmp = q.Comparison("C=8", "C*S(1)", 80.0, 72.0)
    assert cmp.gap_pct == pytest.approx(-10) and cmp.as_dict()["gap_pct"] == pytest.approx(-10)


def test_simulation_matches_md1_mean():
    cost = queueing.BatchCost({1: 0.010})
    for rate in (30, 60, 80):
        sim = queueing.simulated_percentiles(rate, cost, n=40000)
        assert sim["avg_batch"] == 1.0
        assert abs(sim["mean_s"] - queueing.md1_response(rate, 0.010)) / queueing.md1_response(rate, 0.010) < 0.08
        assert sim["p50_s"] <= sim["mean_s"] * 1.05 <= sim["p99_s"] * 1.05


def test_batch_cost_interpolates_and_capacity():
    cost = queueing.BatchCost({1: 0.010, 4: 0.016, 16: 0.040})
    assert cost(1) == 0.010 and cost(4) == 0.016 and abs(cost(2) - 0.012) < 1e-12
    assert abs(cost.capacity(1) - 100) < 1e-9 and abs(cost.capacity(16) - 400) < 1e-9


def test_batching_helps_only_when_batches_are_cheap():
    flat = queueing.BatchCost({1: 0.010, 16: 0.160})      # a CPU: cost grows linearly
    cheap = queueing.BatchCost({1: 0.010, 16: 0.020})     # a GPU: a batch costs little more
    rates = [50, 80, 100, 140, 200, 300, 400]
    off = queueing.predicted_crossing(rates, queueing.BatchCost({1: 0.010}), 1, 0.1, 3.0)
    assert 50 <= off < 100
    assert queueing.predicted_crossing(rates, flat, 16, 0.1, 3.0) < 1.2 * off
    assert queueing.predicted_crossing(rates, cheap, 16, 0.1, 3.0) > 3 * off
    # with cheap batches, batches grow with load
    lo = queueing.simulated_percentiles(50, cheap, 16)["avg_batch"]
    hi = queueing.simulated_percentiles(300, cheap, 16)["avg_batch"]
    assert hi > lo >= 1


def test_crossing():
    pts = [(10, 5.0), (20, 8.0), (30, 20.0), (40, float("inf"))]
    assert queueing.crossing(pts, 14.0) == 25.0
    assert queueing.crossing(pts, 100.0) == 30
    assert queueing.crossing(pts, 4.0) is None
    assert queueing.crossing([(10, 1.0), (20, 2.0)], 5.0) == 20
    # A point back within the bound above the first one past it does not move the crossing up:
    # a short run past capacity can stay within the bound by chance (a tour saw 101/s past it and
    # 121/s within it while serving 110/s of 121: its queue was growing), so the first rise counts.
    back = [(10, 5.0), (20, 30.0), (30, 8.0), (40, 20.0)]
    assert queueing.crossing(back, 14.0) == pytest.approx(10 + 10 * 9 / 25)


def test_measured_points_count_a_run_that_lost_requests_as_past_the_bound():
    """A run's p99 covers only the requests that came back: one that dropped sends or got
    errors reads as past any bound (the tour and notebook 6 read their sweeps this way)."""
    from servelab import bench

    def run(rate, p99_ms, dropped=0, errors=None):
        return bench.Result(label="", target={}, pattern={"rate": rate}, started_at="", sent=10, ok=10,
                            errors=errors or {}, duration_s=1.0, throughput=10.0,
                            latency={"p99_ms": p99_ms}, dropped=dropped)

    runs = [run(20.0, 30.0), run(40.0, 50.0, errors={"HTTP 503": 1}), run(60.0, 40.0, dropped=3)]
    assert queueing.measured_points(runs) == [(20.0, 0.03), (40.0, math.inf), (60.0, math.inf)]
    assert queueing.crossing(queueing.measured_points(runs), 0.1) == 20.0


def test_refine_rates_brackets_each_knee_within_the_step():
    """A run past capacity that dropped requests reads as the rate before it, so on a coarse grid
    a measured and a predicted knee in the same wide gap can read a whole step apart (a tour:
    measured 64.9 = the 0.5x point, model 103.8 = the 0.8x point). The sweep adds the geometric
    midpoint of every knee gap wider than the step it allows, for either curve."""
    inf = float("inf")
    measured = [(50.0, 0.02), (80.0, inf), (90.0, inf)]
    model = [(50.0, 0.02), (80.0, 0.05), (90.0, inf)]
    assert queueing.knee(measured, 0.1) == ((50.0, 0.02), (80.0, inf))
    assert queueing.knee(model, 0.1) == ((80.0, 0.05), (90.0, inf))
    assert queueing.knee([(50.0, 0.2)], 0.1) is None and queueing.knee(model[:2], 1.0) is None
    # the measured knee's gap (x1.6) is wider than x1.15; the model's (x1.125) is not
    assert queueing.refine_rates([measured, model], 0.1, 1.15) == [round((50 * 80) ** 0.5, 1)]
    assert queueing.refine_rates([measured, model], 0.1, 1.7) == []
    # once the midpoint is measured the knee is bracketed finely and crossing() reads it there
    measured.append((63.2, 0.03))
    assert queueing.crossing(measured, 0.1) == 63.2
    assert queueing.refine_rates([measured], 0.1, 1.15) == [round((63.2 * 80) ** 0.5, 1)]


def test_predicted_crossing_reads_the_model_like_the_sweep():
    """The model's sustained load comes from its p99 at the sweep's own rates, run length and
    in-flight cap: past capacity the backlog outgrows the cap (inf, like a run that dropped),
    below it the p99 is finite, and the crossing lies between the two."""
    s = queueing.BatchCost({1: 0.010})                       # 100 requests/s at most
    assert queueing.simulated_run_p99(200, s, 1, 3.0, max_in_flight=32) == float("inf")
    low = queueing.simulated_run_p99(30, s, 1, 3.0, max_in_flight=32)
    assert 0.010 <= low < 0.060
    got = queueing.predicted_crossing([50, 80, 100, 140, 200], s, 1, 0.100, 3.0, 32)
    assert got is not None and 50 <= got < 100
    # a bound no run can meet: no sustained load at all
    assert queueing.predicted_crossing([50, 80], s, 1, 0.005, 3.0, 32) is None
    # batching with a cheap batch holds more load than without
    cheap = queueing.BatchCost({1: 0.010, 16: 0.020})
    assert queueing.predicted_crossing([50, 80, 100, 140, 200], cheap, 16, 0.100, 3.0, 32) > got


def test_cost_seen_fits_what_the_server_timed_per_batch():
    """S(b) from Triton's per-batch statistics of the runs themselves: a line weighted by
    executions; one size seen gives a per-image cost; too little data keeps the fallback."""
    quiet = queueing.BatchCost({1: 0.006, 16: 0.090})
    runs = [{"batch_histogram": {1: 80, 2: 20}, "per_batch_ms": {1: 10.0, 2: 18.0}},
            {"batch_histogram": {4: 10, 16: 5}, "per_batch_ms": {4: 34.0, 16: 130.0}}]
    seen = queueing.cost_seen(runs, quiet)
    assert abs(seen(1) - 0.010) < 0.0015 and abs(seen(16) - 0.130) < 0.005
    off = queueing.cost_seen([{"batch_histogram": {1: 50}, "per_batch_ms": {1: 10.3}}], quiet)
    assert abs(off(1) - 0.0103) < 1e-9
    assert queueing.cost_seen([{"batch_histogram": {1: 3}, "per_batch_ms": {1: 10.3}}, None], quiet) is quiet
    # a slower server under load predicts a lower sustained load
    rates = [30, 50, 80, 100, 140, 200]
    assert queueing.predicted_crossing(rates, off, 1, 0.06, 3.0) < queueing.predicted_crossing(
        rates, queueing.BatchCost({1: 0.0066}), 1, 0.06, 3.0)


def test_sustained_bound_leaves_room_for_two_full_batches():
    cpu = q.BatchCost({1: 0.004, 16: 0.064})       # a CPU: S(b) grows with b
    assert q.sustained_bound(0.004, cpu) == pytest.approx(0.128)       # 2 S(16) > 10 x 4 ms
    assert q.sustained_bound(0.020, cpu) == pytest.approx(0.200)       # 10 x unloaded when larger
    # Why: a batched server that keeps up (Poisson at 0.8 of its capacity) still shows a p99
    # past 10 x the unloaded latency, because bursts form batches that cost nearly b x S(1);
    # the bound must not call such a run overloaded.
    rate = 0.8 * cpu.capacity(16)
    p99 = q.simulated_run_p99(rate, cpu, 16, duration_s=3.0, seeds=(7,))
    assert 10 * 0.004 < p99 <= q.sustained_bound(0.004, cpu)


def test_servers_counts_what_the_service_runs_at_once_on_its_device():
    """Notebook 4 and the tour predict 16 clients' latency as max(1, 16/k) x S. On the CPU
    k is one inference per core; on CUDA the service runs one inference at a time but
    decodes outside that slot (on the CPU, one per core): k follows the slower stage.
    The device is what the service's /health reports (a dict here)."""
    from servelab.bench import queueing

    cpu = {"device": "cpu", "workers": 2, "cores": 2}
    assert queueing.servers(cpu, 0.030, 0.005) == 2
    gpu = {"device": "cuda", "workers": 1, "cores": 2}
    # S = 10 ms of which D = 6 ms decoding: the GPU slot (4 ms) or the decoders (6/2 = 3 ms) bound it
    assert queueing.servers(gpu, 0.010, 0.006) == pytest.approx(2.5)
    # decoding that dominates: the two decoders are the bottleneck
    assert queueing.servers({**gpu, "cores": 2}, 0.010, 0.009) == pytest.approx(10 / 4.5)
    assert queueing.servers(gpu, 0.010, 0.0) == 1            # nothing outside the slot: one at a time
    # a prediction with it: 16 clients wait 16 / 2.5 service times, not 16
    assert queueing.closed_loop(16, 0.010, queueing.servers(gpu, 0.010, 0.006))["latency_s"] == pytest.approx(0.064)


def test_client_batch_cap_is_one_request_over_one_decode(monkeypatch):
    """Notebook 6's `-b 16` check on a GPU: the model still decodes all 16 images on the
    CPU, so images/s can grow at most S / D. D is measured on the perf_analyzer input image."""
    from servelab.core import paths
    from servelab.course import lab

    seen = []
    monkeypatch.setattr(lab, "decode_seconds", lambda image, repeats=5: seen.append(image) or 0.005)
    assert lab.client_batch_cap(50.0, paths.INPUT_JSON) == pytest.approx(4.0)   # S = 20 ms, D = 5 ms
    assert seen and len(seen[0]) > 1000                                          # the base64 image itself


def test_decode_seconds_times_the_services_preprocessing():
    import base64

    from servelab.core import paths
    from servelab.course import lab

    image = base64.b64encode(paths.sample_images()[0].read_bytes()).decode("ascii")
    assert 0 < lab.decode_seconds(image, repeats=3) < 5


# --- (d) scale-out: one shared queue vs a queue per replica -------------------------------

def test_mmc_with_one_server_is_mm1_and_erlang_c_matches_the_textbook_value():
    assert q.mmc_response(1, 50, 0.01) == pytest.approx(1 / (100 - 50))
    assert q.mmc_response(1, 50, 0.01, 0.99) == pytest.approx(math.log(100) / 50, rel=1e-6)
    # c = 2, a = 1.4 (rho = 0.7): C = (a^2/2/(1-rho)) / (1 + a + a^2/2/(1-rho)) = 0.5765
    assert q.erlang_c(2, 100, 0.014) == pytest.approx(0.98 / 0.3 / (2.4 + 0.98 / 0.3))
    assert q.erlang_c(2, 200, 0.01) == 1.0 and q.mmc_response(2, 200, 0.01) == math.inf


def test_round_robin_with_one_server_is_mm1_and_the_setups_rank_as_theory_says():
    assert q.round_robin_sigma(1, 50, 0.01) == pytest.approx(0.5)
    pred = q.scale_out_predictions(2, 140, 0.01)
    mmc, rr, rnd = (pred[k] for k in pred)
    for key in ("mean_s", "p50_s", "p99_s"):
        assert mmc[key] < rr[key] < rnd[key]
    # the quantile really is one: P(T > p99) = 1 % for the exponential random split
    assert rnd["p99_s"] == pytest.approx(math.log(100) / (100 - 70))
