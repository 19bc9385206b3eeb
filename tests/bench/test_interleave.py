"""servelab.bench.interleave (lesson 6e's harness): rounds in a rotating order, the figures it
reports, and the pairs it says it cannot order. No timing is asserted: the verdicts are tested on
runs built by hand."""

from __future__ import annotations

import numpy as np

from servelab.bench import interleave


def _run(**round_p50s) -> interleave.Run:
    times = {}
    for name, p50s in round_p50s.items():
        t = interleave.Times(name, b1_ms=[x for p in p50s for x in (p, p)], round_p50_ms=list(p50s),
                             batch_ips=[16000 / (16 * p) for p in p50s])
        times[name] = t
    return interleave.Run(times, rounds=3, per_round=2, batch=16, load_before=0.1, load_after=0.2, cores=2)


def test_rounds_rotate_the_order_and_every_variant_runs_as_often():
    calls = []

    def variant(name):
        return lambda x: calls.append((name, len(x)))

    one, batch = np.zeros((1, 3)), np.zeros((16, 3))
    run = interleave.measure({n: variant(n) for n in "abc"}, one, batch, rounds=3, per_round=4, warmup=2)
    warm, timed = calls[:9], calls[9:]
    assert warm == [(n, s) for n in "abc" for s in (1, 1, 16)]
    firsts = [timed[i * 15][0] for i in range(3)]   # each round: 3 variants x (4 batch-1 + 1 batch-16)
    assert firsts == ["a", "b", "c"]
    for t in run.times.values():
        assert len(t.b1_ms) == 12 and len(t.round_p50_ms) == 3 and len(t.batch_ips) == 3


def test_overlapping_rounds_are_reported_as_indistinguishable():
    run = _run(fast=[5.0, 5.2, 5.1], close=[5.15, 5.4, 5.6], slow=[9.0, 9.5, 9.2])
    pairs = interleave.indistinguishable(run)
    assert pairs["batch 1"] == [("fast", "close")]
    assert pairs["batch 16"] == [("fast", "close")]
    text = interleave.summary(run)
    assert "cannot be told apart at batch 1 (per-round figures overlap): fast ~ close" in text
    assert "provisional" not in text
    busy = _run(a=[1.0], b=[2.0])
    busy.load_after = 5.0
    assert "busy" in interleave.summary(busy) and "none: every pair is ordered" in interleave.summary(busy)


def test_table_has_a_row_per_variant_with_the_ratio_and_extra_columns():
    run = _run(base=[10.0, 10.0, 10.0], half=[5.0, 5.0, 5.0])
    text = interleave.table(run, {"max abs Δlogit": {"half": "3.0e-05"}}, baseline="base")
    lines = text.splitlines()
    assert lines[0].startswith("| variant | batch-1 p50 ms | p99 ms |") and "p50 / base" in lines[0]
    assert lines[3].startswith("| half | 5.00 | 5.00 | 5.00–5.00 | 200 (200–200) | 0.50 | 3.0e-05 |")
    assert lines[2].endswith("| 1.00 | – |")
