"""Triton's response cache on the real tritonserver 2.51 from nvidia-pytriton (its local cache ships
with it): hits are exactly the requests whose bytes were sent before, none with the cache off, the
answers are the same either way, a hit skips the model, and the config is put back (issue 50)."""

from __future__ import annotations

import pytest

from servelab.bench import response_cache
from servelab.triton import control

pytestmark = pytest.mark.integration


def test_hits_are_the_repeated_bytes_and_answers_do_not_change(start_triton):
    server = start_triton(models=[response_cache.MODEL], extra_args=response_cache.server_args())
    try:
        before = control.model_config(response_cache.MODEL, server.grpc_url)
        lines: list[str] = []
        run = response_cache.measure(server.url, server.grpc_url, server.admin_key, n=24, repeat=0.5, seed=1,
                                     rounds=1, log=lines.append)
        out = run["rounds"][0]
        assert out["triton_hits"] == out["expected_hits"] > 0
        assert out["triton_misses"] == out["requests"] - out["expected_hits"]
        assert out["off_triton_hits"] == 0 and out["same_answers"]
        # A hit does not run MobileNetV2: Triton ran the model once per miss (one request at a time).
        # (How much faster a hit is, is the benchmark's figure, not a test's: this one runs beside others.)
        assert out["executions"] == out["triton_misses"]
        assert lines[1].endswith("answers the same") and lines[-1].startswith("speed-up of the mean latency")
        after = control.model_config(response_cache.MODEL, server.grpc_url)
        assert not after.get("response_cache", {}).get("enable") and after == before
    finally:
        server.stop()
