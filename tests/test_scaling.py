"""The scale-out rule (servelab.core.scaling): the HorizontalPodAutoscaler's arithmetic."""

import pytest

from servelab.core import scaling


@pytest.mark.parametrize("current, metric, target, want", [
    (1, 100.0, 100.0, 1),    # on target
    (2, 105.0, 100.0, 2),    # within the 10 % tolerance: no change
    (2, 115.0, 100.0, 3),    # ceil(2 * 1.15) = 3
    (1, 350.0, 100.0, 4),    # ceil(3.5)
    (4, 20.0, 100.0, 1),     # ceil(0.8) = 1
    (3, 0.0, 100.0, 1),      # idle: down to the minimum
])
def test_desired_replicas_follows_the_hpa_formula(current, metric, target, want):
    assert scaling.desired_replicas(current, metric, target) == want


def test_desired_replicas_respects_bounds_and_rejects_nonsense():
    assert scaling.desired_replicas(1, 1000.0, 100.0, maximum=2) == 2
    assert scaling.desired_replicas(1, 0.0, 100.0, minimum=2) == 2
    with pytest.raises(ValueError):
        scaling.desired_replicas(0, 1.0, 1.0)
    with pytest.raises(ValueError):
        scaling.desired_replicas(1, 1.0, 0.0)


def test_promql_divides_queue_time_by_requests_over_the_window():
    q = scaling.promql("1m", by="instance")
    assert q == ("sum by (instance)(delta(nv_inference_queue_duration_us[1m])) / "
                 "sum by (instance)(delta(nv_inference_request_success[1m]))")
    assert scaling.promql().count(f"[{scaling.WINDOW}]") == 2


def test_promql_match_selects_the_same_series_on_both_counters():
    q = scaling.promql("10s", match='job="triton_replicas"')
    assert q.count('{job="triton_replicas"}[10s]') == 2
    assert scaling.QUEUE_COUNTER + '{job="triton_replicas"}' in q and scaling.SUCCESS_COUNTER + "{" in q
    assert "{" not in scaling.promql("10s")


def test_notebook_6c_waits_for_prometheus_first_scrape_and_no_longer(monkeypatch):
    """A Prometheus started a moment ago has no ``up`` series yet (a CI run read 0 targets and
    failed 6c's first check): scraped_targets waits for the replicas' targets, and gives up
    after its wait with what is there."""
    from servelab.course import scaleout

    answers = [[], [], [{"metric": {"job": "prometheus"}, "value": 1.0}]] + [
        [{"metric": {"job": scaleout.REPLICA_JOB, "instance": f"r{i}"}, "value": 1.0} for i in range(2)]]
    calls = []
    monkeypatch.setattr(scaleout.time, "sleep", lambda s: None)
    monkeypatch.setattr(scaleout.scaling, "query", lambda url, expr: calls.append(expr) or answers[min(len(calls), 4) - 1])
    targets = scaleout.scraped_targets("http://prometheus:9090", scaleout.REPLICA_JOB, 2, wait_s=30)
    assert len(calls) == 4 and [t["metric"]["instance"] for t in targets] == ["r0", "r1"]
    calls.clear()
    assert scaleout.scraped_targets("http://prometheus:9090", scaleout.REPLICA_JOB, 2, wait_s=0) == []
    assert len(calls) == 1
