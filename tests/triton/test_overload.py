"""Past capacity on the real tritonserver 2.51 (servelab.bench.overload, issue 50): without a queue
bound every request is served and the queue grows (the last ones wait at least the compute the run
asked for beyond its own length);
with ``max_queue_size`` Triton turns requests away (HTTP 503) and says why; with two priority levels
the low one is turned away first; the model's config is
put back afterwards. Short runs: the figures themselves come from the benchmark
(``python -m servelab.bench.overload``), not from here."""

from __future__ import annotations

import pytest

from servelab.bench import overload
from servelab.triton import control

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def one_model_triton(start_triton):
    server = start_triton(models=[overload.MODEL])
    yield server
    server.stop()


def test_past_capacity_unbounded_then_bounded(one_model_triton):
    s = one_model_triton
    before = control.model_config(overload.MODEL, s.grpc_url)
    lines: list[str] = []
    # 4x the capacity measured: overloaded for sure even when a busy machine (make test runs 3 workers)
    # made the capacity read half what the copy serves during the runs (a 1.5x run once got no rejection)
    # The missed hand-overs' run at 4x too: at 2x of a capacity read low beside other work the copy once
    # served 32 of 36 (CI load, 2026-11-29): a queue that was not kept full
    run = overload.measure(s.url, s.grpc_url, s.admin_key, seconds=3.0, factors=(4.0,), capacity_s=3.0,
                           calibrate_s=3.0, calibrate_factor=4.0, log=lines.append)
    unbounded, bounded, high, low = run["rows"]
    assert (unbounded["policy"], bounded["policy"]) == ("unbounded", "bounded")
    assert unbounded["ok"] == unbounded["sent"] > 0 and not unbounded["errors"], (unbounded["errors"], lines)
    # the queue grew, whatever the capacity read beforehand: one copy computes one request at a time, so
    # the run lasted at least the compute Triton counted (work_s), and the last answer went to a request
    # scheduled within the run's `seconds`: it waited at least the difference (latency counts from the
    # scheduled send). And Triton's own queue time per request exceeded a request's compute.
    # Half of it: Triton's per-request compute phases (input, infer, output) summed are not a wall-clock
    # account of the copy (CI, 2026-11-28: work_s 7.19 s, yet the longest wait 2,859 ms, not 3,190), and a
    # queue that never grew leaves the longest wait near one request's compute (~150 ms here).
    assert unbounded["max_ms"] >= 0.5 * 1000 * (unbounded["work_s"] - 3.0), unbounded
    assert unbounded["queue_ms"] > unbounded["compute_ms"] > 0, unbounded
    # bounded: some turned away with Triton's 503, nothing else went wrong, the rest served
    assert bounded["rejected"] > 0 and bounded["other_errors"] == 0 and bounded["ok"] > 0, lines
    assert 0 < bounded["fixed_reject"] < 1 and 0 < bounded["mm1k_reject"] < 1
    # no admitted request waited longer than the places ahead of it allow (each a service and a missed hand-over)
    assert bounded["max_ms"] <= bounded["wait_bound_ms"], bounded
    # the missed hand-overs' run filled the queue (some turned away, some served) and gave a share in [0, 1].
    # Not "most turned away": in a 3 s run the queue's 8 and the one in execution are still served after the
    # arrivals stop, and a capacity read low beside other work sends few (CI, 2026-11-30: 24 sent, 17 served).
    missed = run["missed_handovers"]
    assert missed["rejected"] > 0 and missed["ok"] > 0 and 0 <= missed["miss"] <= 1, missed
    assert missed["kept_full"] and 0 <= missed["miss_se"] <= 0.5, missed
    assert bounded["miss"] == missed["miss"] and bounded["fixed_reject"] <= bounded["missed_reject"] < 1
    assert any(line.startswith("missed hand-overs: bounded queue, constant arrivals") for line in lines), lines
    assert any("rejected" in line for line in lines) and lines[0].startswith("capacity:")
    # two priority levels, one request in four at level 1: the low level is turned away first, and the
    # high level's requests that were served waited less (at 4x the high level alone is 1x capacity)
    assert (high["level"], low["level"]) == ("high", "low") and high["sent"] > 0 and low["sent"] > 0
    assert high["other_errors"] == low["other_errors"] == 0, (high, low)
    assert low["reject_share"] > high["reject_share"], (high, low)
    assert high["ok"] > 0 and (low["ok"] == 0 or high["p50_ms"] < low["p50_ms"]), (high, low)
    assert 0 <= high["predicted_reject"] < low["predicted_reject"] < 1
    after = control.model_config(overload.MODEL, s.grpc_url)
    assert after["max_batch_size"] == before["max_batch_size"] == 16
    assert after.get("dynamic_batching") == before.get("dynamic_batching")
