"""The bounded-queue side of the queueing model (servelab.bench.queueing: mmck, simulate_bounded,
backlog_growth, simulate_priority, serve_priority) and how servelab.bench.overload judges a
prediction against a run (issue 50)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servelab.bench import overload, queueing


@pytest.mark.parametrize("rho", [0.5, 0.8, 1.2, 1.5])
def test_mm1k_matches_its_closed_form(rho):
    service, k = 0.04, 9
    got = queueing.mmck(1, rho / service, service, k)
    want = (1 - rho) * rho ** k / (1 - rho ** (k + 1))
    assert got["reject"] == pytest.approx(want, rel=1e-9)
    assert got["goodput"] == pytest.approx(rho / service * (1 - want), rel=1e-9)


def test_mmck_with_a_large_bound_is_the_unbounded_queue():
    service, rate = 0.04, 20.0                      # rho = 0.8
    got = queueing.mmck(1, rate, service, 400)
    assert got["reject"] < 1e-12
    assert got["mean_s"] == pytest.approx(1 / (1 / service - rate), rel=1e-6)   # M/M/1: 1/(mu - lambda)
    two = queueing.mmck(2, 2 * rate, service, 400)
    assert two["mean_s"] == pytest.approx(queueing.mmc_response(2, 2 * rate, service), rel=1e-3)


def test_mmck_refuses_a_bound_below_the_servers():
    with pytest.raises(ValueError, match="capacity"):
        queueing.mmck(2, 10.0, 0.04, 1)


def test_bounded_simulation_past_capacity_turns_away_the_excess():
    service = 0.04
    for rho in (1.2, 1.5, 2.0):
        sim = queueing.simulate_bounded(rho / service, service, 9, n=40000)
        assert sim["reject"] == pytest.approx(1 - 1 / rho, abs=0.015)   # what is served is the capacity
        assert sim["latencies"].max() <= 9 * service + 1e-9               # never more than K services
    free = queueing.simulate_bounded(1.5 / service, service, None, n=4000)
    assert free["reject"] == 0 and free["latencies"].max() > 50 * service  # no bound: the queue grows


def test_backlog_growth():
    g = queueing.backlog_growth(30.0, 0.04, 20.0)                   # capacity 25/s
    assert g["growth_per_s"] == pytest.approx(5.0)
    assert g["backlog"] == pytest.approx(100.0) and g["last_wait_s"] == pytest.approx(4.0)
    assert queueing.backlog_growth(20.0, 0.04, 20.0)["backlog"] == 0


def test_judge():
    assert overload.judge(0.30, 0.33, 100, busy=0.99, factor=1.5).startswith("within")
    assert overload.judge(0.10, 0.33, 100, busy=0.99, factor=1.5).startswith("outside")
    assert overload.judge(0.10, 0.01, 3, busy=0.99, factor=0.8).startswith("not judged (about 3")
    idle = overload.judge(0.70, 0.33, 100, busy=0.30, factor=1.5)
    assert idle.startswith("not judged") and "30%" in idle


def test_a_point_short_of_its_overload_runs_again_at_its_own_capacity():
    # CI, 2026-11-30: 4x a capacity read low beside other work was 8.7/s, and the run's own compute
    # was 107 ms a request: 0.93x of what the copy served then. Again at 4x that: 37.4/s
    assert overload.rerun_rate(4.0, 8.71, 106.8) == pytest.approx(4 * 1000 / 106.8)
    assert overload.rerun_rate(4.0, 8.71, 300.0) is None         # 2.6x: past the 2.5x half-way mark
    assert overload.rerun_rate(1.2, 10.0, 105.0) == pytest.approx(1.2 * 1000 / 105)  # 1.05x < 1.1x: again
    assert overload.rerun_rate(1.2, 10.0, 115.0) is None         # 1.15x: far enough past
    assert overload.rerun_rate(0.8, 1.0, 100.0) is None          # below capacity nothing is asked to queue
    assert overload.rerun_rate(4.0, 8.71, 0.0) is None           # a run Triton counted nothing of


def test_serve_priority_by_hand():
    """Service 1 s. A low request is in service when a second low and then a high one arrive: the
    high one goes next. With room for one waiting request per level, a third low one is turned
    away while the high level still has room."""
    got = queueing.serve_priority([0.0, 0.1, 0.2], ["low", "low", "high"], 1.0, queue_size=5)
    assert list(got["high"]["latencies"]) == pytest.approx([1.8])           # served 1-2
    assert list(got["low"]["latencies"]) == pytest.approx([1.0, 2.9])        # 0-1, then 2-3
    got = queueing.serve_priority([0.0, 0.1, 0.2, 0.3], ["low", "low", "low", "high"], 1.0, queue_size=1)
    assert got["low"]["reject"] == pytest.approx(1 / 3) and got["high"]["reject"] == 0
    assert list(got["high"]["latencies"]) == pytest.approx([1.7])


def test_simulated_priorities_past_capacity():
    """1.5x capacity, one request in four high: the server stays busy (served rate = capacity);
    the high level (0.375x) is never turned away and waits about one service; the low level gets
    what is left, 0.625 of 1.125: it loses about 44 %."""
    service, n = 0.03, 40000
    got = queueing.simulate_priority(1.5 / service, service, 8, every=4, n=n)
    duration = n * service / 1.5
    served = sum(len(v["latencies"]) for v in got.values())
    assert served / duration == pytest.approx(1 / service, rel=0.02)
    assert got["high"]["reject"] == 0
    assert got["low"]["reject"] == pytest.approx(1 - 0.625 / 1.125, abs=0.02)
    assert np.percentile(got["high"]["latencies"], 99) < 3 * service
    assert np.percentile(got["low"]["latencies"], 50) > 5 * service
    below = queueing.simulate_priority(0.5 / service, service, 8, every=4, n=n)
    assert below["high"]["reject"] == below["low"]["reject"] == 0
    with pytest.raises(ValueError):
        queueing.simulate_priority(10.0, service, 8, every=1)


def test_the_priority_mix_asks_level_1_for_one_request_in_every():
    """What PriorityMix sends: request i carries "parameters": {"priority": 1} when i % every == 0,
    2 otherwise (Triton's level 1 is served first), and the queue config declares both levels."""
    import json

    mix = overload.PriorityMix("127.0.0.1:9", every=4)
    levels = []
    for body, headers in mix.bodies:
        head = json.loads(body[:int(headers["Inference-Header-Content-Length"])])
        levels.append(head["parameters"]["priority"])
    assert levels == [1, 2, 2, 2]
    assert "priority_levels: 2" in overload.PRIORITY and "default_priority_level: 2" in overload.PRIORITY


# --------------------------------------------------------------------------
# Triton's missed hand-overs (queueing.simulate_missed_wakes, queueing.miss_share)


def test_no_missed_hand_over_is_the_plain_bounded_queue():
    service = 0.04
    for rho in (0.8, 1.5):
        plain = queueing.simulate_bounded(rho / service, service, 9)
        missed = queueing.simulate_missed_wakes(rho / service, service, 8, miss=0.0)
        assert missed["reject"] == plain["reject"]
        np.testing.assert_allclose(missed["latencies"], plain["latencies"])


def test_every_hand_over_missed_with_a_full_queue_serves_one_request_per_timer():
    service, rate = 0.04, 75.0                              # 3x capacity: the queue is always full
    sim = queueing.simulate_missed_wakes(rate, service, 8, miss=1.0, n=80000)  # edges: ~17 of 2,100 served
    served_per_s = (1 - sim["reject"]) * rate
    assert served_per_s == pytest.approx(1 / queueing.BATCHER_TIMER_S, rel=0.05)
    assert sim["busy"] == pytest.approx(service / queueing.BATCHER_TIMER_S, rel=0.05)


def test_missed_hand_overs_turn_away_more_and_idle_the_copy():
    service = 0.04
    shares = [queueing.simulate_missed_wakes(0.8 / service, service, 8, miss=m) for m in (0.0, 0.2, 0.5)]
    assert shares[0]["reject"] < shares[1]["reject"] < shares[2]["reject"]
    assert shares[0]["busy"] > shares[1]["busy"] > shares[2]["busy"]
    with pytest.raises(ValueError, match="probability"):
        queueing.simulate_missed_wakes(10.0, service, 8, miss=1.5)


@pytest.mark.parametrize("miss", [0.0, 0.1, 0.3, 1.0])
def test_miss_share_reads_the_full_queues_goodput(miss):
    service = 0.0415
    goodput = 1 / (service + miss * (queueing.BATCHER_TIMER_S - service))
    assert queueing.miss_share(goodput, service) == pytest.approx(miss, abs=1e-12)
    # and the simulation, fed that share at constant arrivals far past capacity, serves that goodput
    sim = queueing.simulate_missed_wakes(3 / service, service, 8, miss=miss, n=80000)
    assert (1 - sim["reject"]) * 3 / service == pytest.approx(goodput, rel=0.06)


def test_judge_with_the_idle_spells_in_the_model():
    assert overload.judge(0.70, 0.66, 100, busy=0.30, factor=1.5, idle_in_model=True).startswith("within")
    assert overload.judge(0.70, 0.40, 100, busy=0.30, factor=1.5, idle_in_model=True).startswith("outside")


def test_no_missed_hand_over_with_two_levels_is_serve_priority():
    service, rate = 0.04, 1.5 / 0.04
    from servelab.bench import schedule

    arr = schedule.offsets(rate, 5000, "poisson", 3)
    levels = ["high" if i % 4 == 0 else "low" for i in range(len(arr))]
    plain = queueing.serve_priority(arr, levels, service, 8)
    missed = queueing.serve_with_misses(arr, levels, service, 8, miss=0.0)
    for k in ("high", "low"):
        assert missed[k]["reject"] == plain[k]["reject"]
        np.testing.assert_allclose(missed[k]["latencies"], plain[k]["latencies"])
    worse = queueing.simulate_priority(rate, service, 8, 4, miss=0.4)     # the low level pays for the idle spells
    assert worse["low"]["reject"] > plain["low"]["reject"] and worse["high"]["reject"] < worse["low"]["reject"]


@pytest.mark.parametrize("priority", [-1, "high", 1.5, True])
def test_a_priority_triton_would_answer_with_a_500_is_never_built(priority):
    """Triton 2.51 answers a priority that is not an unsigned integer with 500 "Unable to parse
    'priority'" (seen on the kit's local Triton); the kit's request builder refuses it first."""
    from servelab.bench import targets

    with pytest.raises(ValueError, match="priority must be an unsigned integer"):
        targets.triton_infer_body([("INPUT_IMAGE", "BYTES", [1, 1], [b"x"])], parameters={"priority": priority})
    body, _ = targets.triton_infer_body([("INPUT_IMAGE", "BYTES", [1, 1], [b"x"])], parameters={"priority": 9})
    assert b'"parameters":{"priority":9}' in body       # a level the model lacks: Triton serves it


def test_a_prediction_that_one_standard_error_of_the_miss_share_moves_past_the_tolerance_is_inconclusive():
    # 0.8x the capacity: the shares 30 % and 40 % predict 10 % and 27 % rejected (one standard error
    # either side of 35 %: the band is wider than +-20 % of the prediction), whatever was measured
    band = (0.10, 0.27)
    got = overload.judge(0.20, 0.20, 100, busy=0.5, factor=0.8, idle_in_model=True, band=band)
    assert got.startswith("inconclusive: within one standard error") and "lies inside" in got, got
    assert "lies outside" in overload.judge(0.05, 0.20, 100, busy=0.5, factor=0.8, idle_in_model=True, band=band)
    # past capacity the same share moves the prediction little: judged
    assert overload.judge(0.66, 0.655, 100, busy=0.3, factor=1.2, idle_in_model=True,
                          band=(0.62, 0.69)).startswith("within")
    assert overload.judge(0.40, 0.655, 100, busy=0.3, factor=1.2, idle_in_model=True,
                          band=(0.62, 0.69)).startswith("outside")


def test_the_band_comes_from_the_calibrations_hand_overs_and_a_queue_not_kept_full_is_not_used():
    calib = {"miss": 0.35, "miss_se": math.sqrt(0.35 * 0.65 / 100), "kept_full": True, "valid": True}
    lo, hi = overload.miss_band(calib)
    assert lo == pytest.approx(0.35 - 0.0477, abs=1e-3) and hi == pytest.approx(0.35 + 0.0477, abs=1e-3)
    assert overload.miss_band(None) is None
    not_full = dict(calib, kept_full=False)
    got = overload.judge(0.66, 0.655, 100, busy=0.3, factor=1.2, idle_in_model=True, calibration=not_full)
    assert got == "inconclusive: the missed hand-overs' run does not give their share (its arrivals did not keep the queue full)"
    busy = dict(calib, valid=False)
    assert "(the machine was busy)" in overload.judge(0.66, 0.655, 100, busy=0.3, factor=1.2, idle_in_model=True,
                                                     calibration=busy)
    # the model itself: a few points of share move the prediction several-fold below capacity, little past it
    service = 0.0389
    below = [queueing.simulate_missed_wakes(0.8 / 0.0469, service, 8, m)["reject"] for m in (0.3, 0.4)]
    past = [queueing.simulate_missed_wakes(1.2 / 0.0469, service, 8, m)["reject"] for m in (0.3, 0.4)]
    assert below[1] / below[0] > 2 and past[1] / past[0] < 1.25, (below, past)


def test_traced_hand_overs_count_the_misses_per_queue_length_and_how_each_ended():
    ms = 1_000_000

    def req(q, c=None, e=None, model=overload.MODEL):
        ns = {"QUEUE_START": int(q * ms)} | ({"COMPUTE_START": int(c * ms), "COMPUTE_END": int(e * ms)} if c is not None else {})
        return {"model": model, "ns": ns}

    traces = {("f", 1): req(0, 0, 40),            # A
              ("f", 2): req(10, 40.1, 80),        # B: waiting when A ended, handed over at once
              ("f", 3): req(50, 130, 170),        # C: waiting with D when B ended; the copy idled 50 ms,
              ("f", 4): req(60, 600, 640),        # until E entered the queue; D: idled 430 ms (the timer)
              ("f", 5): req(129.5, 640.5, 680),   # E: waiting alone when D ended, handed over at once
              ("f", 6): req(65),                  # turned away (no compute): not a hand-over
              ("f", 7): req(20, 300, 310, model="other")}
    got = overload.traced_handovers(traces)
    assert got["by_waiting"] == {1: [2, 0], 2: [2, 2]}, got
    assert (got["handovers"], got["missed"], got["share"]) == (4, 2, 0.5)
    assert (got["ended_at_entry"], got["ended_later"]) == (1, 1)
    # a copy that always found nothing waiting hands nothing over
    alone = overload.traced_handovers({("f", 1): req(0, 0, 40), ("f", 2): req(100, 100, 140)})
    assert alone["handovers"] == 0 and math.isnan(alone["share"])
