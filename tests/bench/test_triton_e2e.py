"""servelab.bench against the real local Triton 2.51 (both lab models), and
its agreement with the real perf_analyzer on the same endpoint."""

from __future__ import annotations

import json

import pytest

from servelab import bench
from servelab.bench import http, targets
from servelab.bench.triton import TritonObserver
from servelab.core import procs
from servelab.triton import snapshot

# quiet: the kit's client and perf_analyzer must agree on the same server's throughput
pytestmark = [pytest.mark.quiet, pytest.mark.integration]   # integration: a real Triton


@pytest.fixture(scope="module")
def triton(built_models, tmp_path_factory):
    from servelab.triton import running

    with running(http_port=procs.free_port(), grpc_port=procs.free_port(),
                 metrics_port=procs.free_port(), workdir=tmp_path_factory.mktemp("triton"),
                 write_state=False, extra_args=["--metrics-interval-ms=500"]) as t:
        yield t


def _counts_add_up(r: bench.Result, server_side: bool = True):
    assert r.sent == r.ok + r.error_count
    assert len(r.latencies_ms) == r.ok
    if server_side:
        # Triton saw exactly the successful requests of this run (warm-up excluded)
        assert r.server["requests"] == r.ok
        hist = r.server["batch_histogram"]
        assert sum(b * n for b, n in hist.items()) == r.server["inferences"] == r.ok
        assert sum(hist.values()) == r.server["executions"]


def test_image_model_closed_loop_with_server_stats(triton):
    t = bench.triton_target(triton.url, "food_classifier")
    assert t.describe()["encoding"] == "binary"
    obs = TritonObserver(triton.url, "food_classifier", metrics_url=triton.metrics_url, interval=0.25)
    r = bench.run(t, bench.closed(2, requests=16), observers=[obs])
    _counts_add_up(r)
    assert r.ok == 16 and r.errors == {}
    per = r.server["per_request_ms"]
    assert per["compute_infer"] > 0 and per["queue"] >= 0
    # what the client waited covers what the server spent
    assert r.latency["mean_ms"] >= per["compute_infer"]
    # CPU utilization sampled from Triton's metrics endpoint (no GPU here)
    assert r.utilization["t"] and all(0 <= v <= 1 for v in r.utilization["series"]["CPU"])


def test_image_model_answers_are_real(triton):
    async def one():
        t = bench.triton_target(triton.url, "food_classifier", binary=True)
        host, port, _ = http.split_url(triton.url)
        conn = http.Connection(host, port)
        try:
            return targets.parse_infer_response(await conn.request(t.requests[0]))
        finally:
            conn.close()
    from servelab.bench.load import run_coroutine
    from servelab.core import food11
    out = run_coroutine(one())
    assert out["FOOD_LABEL"][0].decode() in food11.LABELS
    assert 0 < float(out["PROBABILITY"].ravel()[0]) <= 1


def test_json_encoding_and_grpc(triton):
    r = bench.run(bench.triton_target(triton.url, "food_classifier", binary=False), bench.sequential(3))
    assert r.ok == 3, r.errors
    g = targets.grpc_target(triton.grpc_url, "food_classifier_onnx")
    r = bench.run(g, bench.closed(2, requests=6),
                  observers=[TritonObserver(triton.url, "food_classifier_onnx")])
    _counts_add_up(r)
    assert r.ok == 6, r.errors


def test_tensor_model_open_loop(triton):
    t = bench.triton_target(triton.url, "food_classifier_onnx")
    r = bench.run(t, bench.open_loop(20, "poisson", requests=20, seed=1),
                  observers=[TritonObserver(triton.url, "food_classifier_onnx")])
    _counts_add_up(r)
    assert r.ok == 20 and r.late is not None


def test_errors_counted_on_triton(triton):
    import numpy as np

    # wrong shape for the tensor model -> 400 from Triton, every time
    bad = targets.triton_tensor_target(triton.url, "food_classifier_onnx",
                                       tensors=[np.zeros((3, 10, 10), np.float32)])
    before = snapshot(triton.url, "food_classifier_onnx")
    r = bench.run(bad, bench.closed(2, requests=6, warmup=0))
    assert r.sent == 6 and r.ok == 0 and r.errors == {"HTTP 400": 6}
    # bytes that are not an image -> the model rejects that request
    junk = targets.triton_image_target(triton.url, "food_classifier", images=[b"not an image at all"])
    r = bench.run(junk, bench.closed(1, requests=3, warmup=0))
    assert r.sent == 3 and r.ok == 0 and sum(r.errors.values()) == 3
    assert all(k.startswith("HTTP 4") or k.startswith("HTTP 5") for k in r.errors)
    # unknown model
    ghost = targets.TritonHTTPTarget(triton.url, "no_such_model", [(b"{}", {"Content-Type": "application/json"})])
    r = bench.run(ghost, bench.sequential(2, warmup=0))
    assert r.ok == 0 and r.error_count == 2
    # the server kept serving
    good = bench.run(bench.triton_target(triton.url, "food_classifier_onnx"), bench.sequential(2))
    assert good.ok == 2
    assert snapshot(triton.url, "food_classifier_onnx")["inference_stats"]["success"]["count"] \
        >= before["inference_stats"]["success"]["count"] + 2


def test_agrees_with_perf_analyzer(triton, tmp_path):
    """Same endpoint, same model, same concurrency: throughput and p50 within
    15 % of perf_analyzer's.

    Not closer: perf_analyzer's own client costs more per request than the
    kit's. Side by side on the 2-core machine (2026-11-28, concurrency 4):
    perf_analyzer 159 and 177 req/s, p50 25.2 and 22.1 ms, using 0.10-0.13
    of a core; the kit's client 183 and 194 req/s, p50 22.5 and 20.1 ms,
    using 0.05-0.06. A 10 % bound failed CI when all seven pairs of one
    run read 10-20 % apart; a client that miscounted (warm-up counted, a
    request counted twice, the wrong clock) is still far outside 15 %.

    Other work on a shared 2-core machine moves both tools' figures by tens
    of percent from one 10-second stretch to the next, so runs alternate
    PA, bench, PA, bench, PA ... and each bench run is compared with the
    perf_analyzer runs just before and just after it; the first agreeing
    pair ends the test (on a quiet machine, the first one)."""
    from servelab.triton import perf

    model, conc = "food_classifier_onnx", 4

    def pa_run():
        # 2 s windows until three agree; a busy shared machine can keep perf_analyzer from ever
        # calling a run "stable": that run measured nothing, so it is repeated (at most 3 times).
        for _ in range(3):
            pa = perf.run(["-u", triton.url, "-m", model, "-b", "1", "--shape", "input:3,224,224",
                           "--concurrency-range", str(conc), "-p", "2000",
                           "-s", "100", "--max-trials", "6"], timeout=120, check=False)
            if pa.results:
                return pa.results[-1]
        raise AssertionError(pa.output[-2000:])

    def agree(b, pa):
        thr = b.throughput / pa["throughput"]
        p50 = b.latency["p50_ms"] * 1000 / pa["p50_latency_us"]
        pairs.append({"pa_throughput": pa["throughput"], "bench_throughput": b.throughput,
                      "pa_p50_ms": pa["p50_latency_us"] / 1000, "bench_p50_ms": b.latency["p50_ms"],
                      "throughput_ratio": thr, "p50_ratio": p50})
        return abs(thr - 1) <= 0.15 and abs(p50 - 1) <= 0.15

    pairs: list[dict] = []
    ok = False
    pa_before = pa_run()
    for _ in range(3):
        b = bench.run(bench.triton_target(triton.url, model),
                      bench.closed(conc, duration=6.0, warmup=2 * conc), progress=False)
        assert b.errors == {} and b.sent == b.ok
        if agree(b, pa_before):
            ok = True
            break
        pa_after = pa_run()
        if agree(b, pa_after):
            ok = True
            break
        pa_before = pa_after
    (tmp_path / "agreement.json").write_text(json.dumps(pairs, indent=1))
    assert ok, pairs
