"""The bounded-queue side of the queueing model (servelab.bench.queueing: mmck, simulate_bounded,
backlog_growth) and how servelab.bench.overload judges a prediction against a run (issue 50)."""

from __future__ import annotations

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
