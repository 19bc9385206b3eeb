"""Malformed inference requests against the real local Triton 2.51.

Each bad request gets an error for that request only (HTTP 4xx, or a gRPC
error), and afterwards: the server is ready, both models are ready, the stub
processes are the same PIDs (no stub crashed or restarted) and a good
request succeeds. Bad images inside the BYTES input are the model's own
error (``pb_utils.TritonError(..., INVALID_ARG)`` → 400), and they must not
fail good requests that Triton's dynamic batcher put in the same batch.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import json

import numpy as np
import pytest
import requests

from servelab.bench.targets import triton_infer_body
from servelab.core import food11

from .fuzzimages import FINDINGS, expected_status, png_with_size
from .relsupport import sample_bytes

PY = "food_classifier"          # Python backend: BYTES base64 image in, label + probability out
ONNX = "food_classifier_onnx"   # FP32 [3, 224, 224] in, 11 logits out
TIMEOUT = 60


@pytest.fixture(scope="module")
def t(triton):
    """The shared Triton, with the stub PIDs it has before any bad input."""
    before = {s.instance: s.pid for s in triton.stub_processes()}
    assert len(before) >= 2, before
    triton.extra_stubs_before = before  # type: ignore[attr-defined]
    return triton


def _post(t, model, body, headers, version=""):
    v = f"/versions/{version}" if version else ""
    return requests.post(f"{t.http_url}/v2/models/{model}{v}/infer", data=body, headers=headers, timeout=TIMEOUT)


def _image_request(items: list[bytes], shape=None):
    arr_shape = shape or [len(items), 1]
    return triton_infer_body([("INPUT_IMAGE", "BYTES", arr_shape, items)], ["FOOD_LABEL", "PROBABILITY"])


def _tensor_request(x: np.ndarray, dtype="FP32", name="input", shape=None):
    return triton_infer_body([(name, dtype, shape or list(x.shape), x)], ["output"])


def _good_py(t):
    body, headers = _image_request([base64.b64encode(sample_bytes()[0])])
    r = _post(t, PY, body, headers)
    assert r.status_code == 200, r.text[:300]


def _good_onnx(t):
    x = food11.preprocess(sample_bytes()[1])[None]
    body, headers = _tensor_request(x)
    r = _post(t, ONNX, body, headers)
    assert r.status_code == 200, r.text[:300]


def _assert_healthy(t):
    assert t.alive(), t.log_tail()
    assert requests.get(f"{t.http_url}/v2/health/ready", timeout=10).status_code == 200
    for m in (PY, ONNX):
        assert requests.get(f"{t.http_url}/v2/models/{m}/ready", timeout=10).status_code == 200, m
    now = {s.instance: s.pid for s in t.stub_processes()}
    assert now == t.extra_stubs_before, f"stub processes changed (crash/restart): {t.extra_stubs_before} → {now}"
    _good_py(t)
    _good_onnx(t)


def _x(n=1):
    return np.zeros((n, 3, 224, 224), np.float32)


# (id, model, body/headers builder, version)
def _raw(header: dict, blob: bytes = b""):
    head = json.dumps(header).encode()
    if not blob:
        return head, {"Content-Type": "application/json"}
    return head + blob, {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}


BAD_TENSOR = {
    "wrong-shape": lambda: _tensor_request(np.zeros((1, 3, 224, 225), np.float32)),
    "wrong-rank": lambda: _tensor_request(np.zeros((1, 3, 224), np.float32)),
    "no-batch-dim": lambda: _tensor_request(np.zeros((3, 224, 224), np.float32)),
    "wrong-dtype-fp64": lambda: _tensor_request(_x().astype(np.float64), "FP64"),
    "wrong-dtype-int32": lambda: _tensor_request(_x().astype(np.int32), "INT32"),
    "wrong-input-name": lambda: _tensor_request(_x(), name="image"),
    "missing-input": lambda: _raw({"inputs": []}),
    "extra-input": lambda: triton_infer_body([("input", "FP32", [1, 3, 224, 224], _x()),
                                              ("other", "FP32", [1, 1], np.zeros((1, 1), np.float32))]),
    "oversized-batch-17": lambda: _tensor_request(_x(17)),
    "negative-dim": lambda: _raw({"inputs": [{"name": "input", "shape": [-1, 3, 224, 224], "datatype": "FP32",
                                              "data": [0.0]}]}),
    "too-few-values-json": lambda: _raw({"inputs": [{"name": "input", "shape": [1, 3, 224, 224],
                                                     "datatype": "FP32", "data": [0.0, 1.0]}]}),
    "declared-larger-than-sent": lambda: _raw({"inputs": [{"name": "input", "shape": [16, 3, 224, 224],
                                                           "datatype": "FP32",
                                                           "parameters": {"binary_data_size": 16 * 602112}}]},
                                              b"\0" * 1024),
    "binary-size-mismatch": lambda: _raw({"inputs": [{"name": "input", "shape": [1, 3, 224, 224],
                                                      "datatype": "FP32", "parameters": {"binary_data_size": 8}}]},
                                         b"\0" * 8),
    "strings-as-floats": lambda: _raw({"inputs": [{"name": "input", "shape": [1, 3, 224, 224], "datatype": "FP32",
                                                   "data": ["x"] * 150528}]}),
    "unknown-output": lambda: triton_infer_body([("input", "FP32", [1, 3, 224, 224], _x())], ["logits"]),
    "not-json": lambda: (b"{not json", {"Content-Type": "application/json"}),
    "empty-body": lambda: (b"", {"Content-Type": "application/json"}),
    "bad-header-length": lambda: (b'{"inputs":[]}', {"Content-Type": "application/octet-stream",
                                                     "Inference-Header-Content-Length": "99999"}),
}

BAD_IMAGE = {
    "not-base64": lambda: _image_request([b"this is not base64!!"]),
    "base64-not-image": lambda: _image_request([base64.b64encode(b"hello world, not an image")]),
    "empty-element": lambda: _image_request([b""]),
    "truncated-jpeg": lambda: _image_request([base64.b64encode(sample_bytes()[0][:400])]),
    "decompression-bomb": lambda: _image_request([base64.b64encode(png_with_size(100_000, 100_000))]),
    "wrong-dtype": lambda: triton_infer_body([("INPUT_IMAGE", "FP32", [1, 1], np.zeros((1, 1), np.float32))]),
    "wrong-shape": lambda: _image_request([b"YQ==", b"YQ=="], shape=[1, 2]),
    "oversized-batch-17": lambda: _image_request([base64.b64encode(sample_bytes()[0])] * 17),
    "one-bad-in-a-batch-of-3": lambda: _image_request([base64.b64encode(sample_bytes()[0]), b"!!",
                                                       base64.b64encode(sample_bytes()[1])]),
    **{f"finding-{k}": (lambda v=v: _image_request([base64.b64encode(v)]))
       for k, v in FINDINGS.items() if expected_status(v) != 200},
}


# Triton 2.51's own HTTP frontend answers these JSON-parsing mistakes with
# HTTP 500 (e.g. "Unable to parse 'data': Shape does not match true shape of
# 'data' field"): the real server's behaviour, not the kit's. They are still
# errors for that request only: the server and its stubs carry on.
TRITON_FRONTEND_500 = {"negative-dim", "too-few-values-json", "strings-as-floats", "not-json"}


@pytest.mark.parametrize("case", list(BAD_TENSOR))
def test_bad_tensor_request(t, case):
    body, headers = BAD_TENSOR[case]()
    r = _post(t, ONNX, body, headers)
    if case in TRITON_FRONTEND_500:
        assert r.status_code in (400, 500), (r.status_code, r.text[:300])
    else:
        assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert r.json().get("error")
    _good_onnx(t)


@pytest.mark.parametrize("case", list(BAD_IMAGE))
def test_bad_image_request(t, case):
    body, headers = BAD_IMAGE[case]()
    r = _post(t, PY, body, headers)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.json().get("error")
    _good_py(t)


@pytest.mark.parametrize("model,version", [("no_such_model", ""), (ONNX, "7"), (PY, "0"), (ONNX, "-1"),
                                           ("../food_classifier", ""), (ONNX, "abc")])
def test_unknown_model_or_version(t, model, version):
    body, headers = _tensor_request(_x())
    r = _post(t, model, body, headers, version)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])


def test_grpc_bad_requests(t):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = t.grpc_client()
    try:
        cases = []
        inp = grpcclient.InferInput("input", [1, 3, 224, 225], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 3, 224, 225), np.float32))
        cases.append((ONNX, [inp]))
        inp = grpcclient.InferInput("input", [17, 3, 224, 224], "FP32")
        inp.set_data_from_numpy(_x(17))
        cases.append((ONNX, [inp]))
        inp = grpcclient.InferInput("INPUT_IMAGE", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[b"%%%not base64"]], dtype=object))
        cases.append((PY, [inp]))
        cases.append(("no_such_model", [inp]))
        for model, inputs in cases:
            with pytest.raises(InferenceServerException) as err:
                client.infer(model, inputs, client_timeout=TIMEOUT)
            assert "StatusCode.INTERNAL" not in str(err.value.status()), err.value
    finally:
        client.close()
    _assert_healthy(t)


def test_bad_requests_do_not_fail_good_ones_in_the_same_batch(t):
    """With dynamic batching on (added by the kit's reload helper, with a long
    queue delay so batches really form), good and bad requests sent together
    land in the same execute() call: every good one must succeed, every bad
    one get its own 400."""
    from servelab.triton import stats_delta

    before = t.snapshot(PY)
    t.reload_model(PY, {"dynamic_batching": {"max_queue_delay_microseconds": 100_000}}, verbose=False)
    try:
        good_body, good_headers = _image_request([base64.b64encode(sample_bytes()[2])])
        bad = [BAD_IMAGE[k]() for k in ("not-base64", "base64-not-image", "truncated-jpeg")] + \
              [BAD_IMAGE[f"finding-{k}"]() for k in FINDINGS if f"finding-{k}" in BAD_IMAGE]
        jobs = [("good", good_body, good_headers)] * 12 + [("bad", b, h) for b, h in bad] * 2
        with cf.ThreadPoolExecutor(len(jobs)) as pool:
            results = list(pool.map(lambda j: (j[0], _post(t, PY, j[1], j[2])), jobs))
        delta = stats_delta(before, t.snapshot(PY))
    finally:
        t.reload_model(PY, None, verbose=False)  # back to models_staging/food_classifier
        t.extra_stubs_before = {s.instance: s.pid for s in t.stub_processes()}
    print(f"\nmixed good/bad load: batch sizes {delta['batch_histogram']}")
    assert max(delta["batch_histogram"]) > 1, f"no batch formed, the test proves nothing: {delta}"
    good = [(r.status_code, r.text[:200]) for k, r in results if k == "good"]
    badst = [(r.status_code, r.text[:200]) for k, r in results if k == "bad"]
    assert all(code == 200 for code, _ in good), f"good requests failed beside bad ones: {good}"
    assert all(code == 400 for code, _ in badst), badst


def test_server_and_stubs_healthy_after_bad_input(t):
    _assert_healthy(t)
    assert "Stub process" not in t.log_tail(400) or "is not healthy" not in t.log_tail(400)


def test_flask_on_triton_reports_the_models_verdict(t):
    """The page checks only the header and lets Triton's Python model decode
    (issue 15: no double decode); a file the model refuses is still a 400
    with the model's sentence, not a 502, and the page keeps serving."""
    from .relsupport import start_flask

    flask = start_flask("http://127.0.0.1:9", env={"INFERENCE_BACKEND": "triton", "TRITON_SERVER_URL": t.url,
                                                   "FOOD11_MODEL_NAME": PY})
    try:
        jpeg = next(d for d in sample_bytes() if d[:2] == b"\xff\xd8")
        r = requests.post(f"{flask.url}/predict", files={"file": ("a.jpg", jpeg[: len(jpeg) * 2 // 3])}, timeout=60)
        assert r.status_code == 400, r.text[-500:]
        assert "truncated" in r.text
        r = requests.post(f"{flask.url}/predict", files={"file": ("a.jpg", jpeg)}, timeout=60)
        assert r.status_code == 200, r.text[-500:]
    finally:
        flask.stop()
