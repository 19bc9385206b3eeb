"""The queueing model's prediction of a configuration search (servelab.bench.configsearch):
pure and fast, against closed forms and hand-checked cases."""

from __future__ import annotations

import math

import pytest

from servelab.bench import configsearch as cs
from servelab.bench import queueing

CPU = queueing.BatchCost({1: 0.030, 2: 0.058, 4: 0.115, 8: 0.23, 16: 0.46})    # S(b)/b flat
GPU = queueing.BatchCost({1: 0.010, 2: 0.0105, 4: 0.011, 8: 0.012, 16: 0.014})  # batches nearly free


@pytest.mark.parametrize("clients", [1, 2, 4, 8])
def test_closed_loop_without_batching_matches_littles_law(clients):
    sim = cs.simulate_closed(clients, CPU, instances=1, max_batch=1)
    closed = queueing.closed_loop(clients, CPU(1))
    assert sim["throughput"] == pytest.approx(closed["throughput"], rel=0.01)
    assert sim["p99_s"] == pytest.approx(closed["latency_s"], rel=0.01)


def test_copies_time_share_the_hardware_and_a_queue_delay_is_paid_alone():
    one, two = (cs.simulate_closed(4, CPU, instances=n, max_batch=1) for n in (1, 2))
    assert two["throughput"] == pytest.approx(one["throughput"], rel=0.02)   # parallel=1: no gain
    two_units = cs.simulate_closed(4, CPU, instances=2, max_batch=1, parallel=2)
    assert two_units["throughput"] == pytest.approx(2 * one["throughput"], rel=0.02)
    lone = cs.simulate_closed(1, GPU, instances=1, max_batch=8, queue_delay_s=0.002)
    assert lone["p50_s"] == pytest.approx(GPU(1) + 0.002, rel=0.01)         # waits for company that never comes


def test_batching_wins_where_batches_are_cheap_and_not_where_they_are_not():
    space = [{"instances": 1, "max_batch_size": b, "queue_delay_us": 0} for b in (1, 16)]
    gpu = cs.rank_predictions(space, GPU, budget_ms=100, concurrency=[1, 4, 16])
    assert gpu[0]["key"] == (1, 16, 0) and gpu[0]["throughput"] > 3 * gpu[1]["throughput"]
    cpu = cs.rank_predictions(space, CPU, budget_ms=1000, concurrency=[1, 4, 16])
    assert cpu[0]["throughput"] / cpu[1]["throughput"] < 1.1                 # a near-tie on a CPU


def test_the_budget_decides_the_concurrency_and_over_budget_ranks_last():
    # 30 ms of service + 30 ms outside the server: 2 clients fill the copy (60 ms each), 4 wait (120 ms)
    p = cs.predict({"instances": 1, "max_batch_size": 1}, CPU, budget_ms=100, concurrency=[1, 2, 4, 8],
                   overhead_s=0.030)
    assert p["concurrency"] == 2 and p["satisfies"] and p["p99_ms"] == pytest.approx(60, rel=0.01)
    assert p["throughput"] == pytest.approx(1 / CPU(1), rel=0.01)
    ranked = cs.rank_predictions([{"instances": 1, "max_batch_size": 1}, {"instances": 1, "max_batch_size": 16}],
                                 CPU, budget_ms=20, concurrency=[1])
    assert [r["satisfies"] for r in ranked] == [False, False] and [r["rank"] for r in ranked] == [1, 2]


def test_off_and_max_batch_one_are_the_same_configuration():
    assert cs.key({"instances": 1, "max_batch_size": 16, "batching": False, "queue_delay_us": 500}) == (1, 1, 0)
    assert cs.key({"instances": 2, "max_batch_size": 1, "queue_delay_us": 500}) == (2, 1, 0)
    assert cs.key({"instances": 2, "max_batch_size": 8, "queue_delay_us": 500}) == (2, 8, 500)
    ranked = cs.rank_predictions([{"instances": 1, "max_batch_size": 1}, {"instances": 1, "max_batch_size": 1,
                                  "queue_delay_us": 9}], CPU, 1000, [1])
    assert len(ranked) == 1


def test_side_by_side_counts_the_agreement_of_the_top_three():
    space = [{"instances": n, "max_batch_size": b, "queue_delay_us": 0} for n in (1, 2) for b in (1, 4, 16)]
    predicted = cs.rank_predictions(space, GPU, budget_ms=100, concurrency=[1, 4, 16])
    # a tool that measured the model's order exactly, then one that found it backwards
    def tool(order):
        rows = [{"config": f"c{i}", "instances": k[0], "max_batch_size": k[1], "queue_delay_us": k[2],
                 "batching": k[1] > 1, "throughput": 100.0 - i, "p99_ms": 10.0, "concurrency": 4, "satisfies": True}
                for i, k in enumerate(order)]
        return cs.measured_ranking(rows)
    same = cs.side_by_side(predicted, tool([p["key"] for p in predicted]))
    assert same["agreement"] == 3 and [r["model_rank"] for r in same["rows"]] == list(range(1, 7))
    backwards = cs.side_by_side(predicted, tool([p["key"] for p in predicted][::-1]))
    assert backwards["agreement"] == 0
    text = cs.table(same)
    assert text.count("\n") == 1 + 6 and "| 2 copies, batching to 16, delay 0 us |" in text
    assert not any(math.isnan(r["predicted_throughput"]) for r in same["rows"])
