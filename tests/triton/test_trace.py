"""Triton's trace API through the kit (servelab.triton.trace, servelab.bench.breakdown),
against the real tritonserver 2.51: refused without the admin key, and every traced
request's stages add up to what its client measured (issue 51)."""

from __future__ import annotations

import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from servelab.bench import breakdown
from servelab.triton import trace
from servelab.triton.install import GRPC_ADMIN_HEADER, HTTP_ADMIN_HEADER

pytestmark = pytest.mark.integration


def test_trace_api_needs_the_admin_key(lab_triton):
    base = lab_triton.http_url
    for headers in ({}, {HTTP_ADMIN_HEADER: "wrong-key"}):
        r = requests.get(f"{base}/v2/trace/setting", headers=headers, timeout=10)
        assert r.status_code == 403 and "restricted" in r.text, r.text
        r = requests.post(f"{base}/v2/trace/setting", json={"trace_level": ["TIMESTAMPS"]}, headers=headers, timeout=10)
        assert r.status_code == 403, r.text
        r = requests.post(f"{base}/v2/models/food_classifier_onnx/trace/setting",
                          json={"trace_level": ["TIMESTAMPS"]}, headers=headers, timeout=10)
        assert r.status_code == 403, r.text
    client = grpcclient.InferenceServerClient(lab_triton.grpc_url)
    try:
        for headers in (None, {GRPC_ADMIN_HEADER: "wrong-key"}):
            for call in (lambda: client.get_trace_settings(headers=headers),
                         lambda: client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]},
                                                              headers=headers)):
                with pytest.raises(InferenceServerException) as err:
                    call()
                assert "restricted" in err.value.message() or "PERMISSION" in str(err.value.status())
        now = client.get_trace_settings(headers={GRPC_ADMIN_HEADER: lab_triton.admin_key}, as_json=True)
    finally:
        client.close()
    # Nothing the refused calls asked for happened; the file is the kit's, and tracing is off.
    assert now["settings"]["trace_level"]["value"] == ["OFF"], now
    assert now["settings"]["trace_file"]["value"] == [str(lab_triton.workdir / "traces" / "trace.json")]
    with pytest.raises(trace.TraceError, match="403"):
        trace.settings(lab_triton.url, "wrong-key")
    r = requests.post(f"{base}/v2/trace/setting", json={"trace_file": "/tmp/elsewhere.json"},
                      headers={HTTP_ADMIN_HEADER: lab_triton.admin_key}, timeout=10)
    assert r.status_code >= 400 and "can not be updated" in r.text   # even with the key (Triton 2.51)


def _check_adds_up(run: dict) -> None:
    assert run["answered"] == run["sent"] and not run["errors"], run["errors"]
    assert run["traced"] == run["sent"], f"{run['traced']} of {run['sent']} requests traced"
    for line, client in zip(run["timelines"], run["client_ms"]):
        total = sum(ms for _s, _m, ms in line)
        assert abs(total - client) < 0.01, (total, client, line)     # one chain of instants
        assert all(ms > -0.05 for _s, _m, ms in line), line           # the same clock on both sides
        assert any(s == "compute infer" and ms > 0 for s, _m, ms in line), line


def test_every_request_of_a_model_has_a_timeline_that_adds_up(lab_triton):
    run = breakdown.measure(lab_triton.url, lab_triton.admin_key, "food_classifier_onnx", concurrency=2, n=24, warmup=4)
    _check_adds_up(run)
    assert [s for s, _m, _ms in run["timelines"][0]] == list(s for s in trace.STAGES if s != "handoff")
    assert trace.settings(lab_triton.url, lab_triton.admin_key)["trace_level"] == ["OFF"]


@pytest.mark.quiet   # judges p50s: it runs alone (make test's phase 2)
def test_the_stage_p50s_add_up_to_the_clients_on_one_client(lab_triton):
    """The sum check on one client, where one stage carries the request (as notebook 6 judges it). At 2
    clients the queue's skew moved the p50s' sum past 10 % once, on a machine busy with other tests; on
    one client beside phase 1's other tests it failed once too (CI of 2026-11-29), so it runs alone."""
    alone = breakdown.measure(lab_triton.url, lab_triton.admin_key, "food_classifier_onnx", concurrency=1, n=24, warmup=4)
    _check_adds_up(alone)
    s = breakdown.summary(alone)
    assert s["sum_ok"], s
    assert s["stages"]["compute infer"]["p50"] > s["stages"]["parse"]["p50"]   # the model outweighs parsing
    assert trace.settings(lab_triton.url, lab_triton.admin_key)["trace_level"] == ["OFF"]


def test_an_ensemble_request_has_each_step(lab_triton):
    run = breakdown.measure(lab_triton.url, lab_triton.admin_key, "food_pipeline", concurrency=1, n=6, warmup=2)
    _check_adds_up(run)
    for line in run["timelines"]:
        steps = [m for s, m, _ms in line if s == "queue"]
        assert steps == ["food_preprocess", "food_classifier_onnx", "food_postprocess"], line
    s = breakdown.summary(run)
    assert set(s["steps_p50"]) == {"food_preprocess", "food_classifier_onnx", "food_postprocess"}
