"""Both FastAPI services (fastapi_pt/, fastapi_onnx/) as real uvicorn servers
on loopback: the contract, the bad-input table, and that they keep serving."""

from __future__ import annotations

import concurrent.futures
import json
import os
import platform

import numpy as np
import pytest
import requests

from servelab.core import food11, paths
from servelab.serve import serving

from .helpers import b64, bomb_png, first_jpeg, post_good, scan_bomb_jpeg, truncated_jpeg, truncated_jpeg_with_end


def _cuda_here(service: str) -> bool:
    """Whether the service's library sees a CUDA device on this host (auto picks it)."""
    if service == "fastapi_pt":
        import torch

        return torch.cuda.is_available()
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def test_health_reports_model_backend_device(fastapi_server):
    r = requests.get(f"{fastapi_server.url}/health", timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok"
    assert body["model"] == "food11"
    assert body["backend"] == ("pytorch" if fastapi_server.name == "fastapi_pt" else "onnxruntime")
    # auto: the GPU where the library sees one, else the CPU (here: no GPU)
    device = "cuda" if _cuda_here(fastapi_server.name) else "cpu"
    assert body["device"] == device
    assert body["weights_kind"] in ("demo", "trained")
    # CPU: one inference per core at once (a lone one on every core); CUDA: one at a time.
    cores = len(os.sched_getaffinity(0))
    assert body["cores"] == cores
    assert body["workers"] == (1 if device == "cuda" else cores)
    # the choice is printed at start
    assert f"device: {device}" in fastapi_server.log_tail(200) and f"{cores} core(s)" in fastapi_server.log_tail(200)
    cpu = platform.processor() or platform.machine()
    if device == "cpu":
        assert body["device_name"] == cpu != ""
    else:  # the GPU's own name (PyTorch), or the CUDA device ONNX Runtime was given
        assert body["device_name"] and body["device_name"] != cpu


def test_predict_every_sample(fastapi_server):
    for path in paths.sample_images():
        r = requests.post(f"{fastapi_server.url}/predict", json={"image": b64(path.read_bytes())}, timeout=60)
        assert r.status_code == 200, (path.name, r.text)
        body = r.json()
        assert body["prediction"] in food11.LABELS
        assert 0.0 < body["probability"] <= 1.0
        assert body["weights_kind"] in ("demo", "trained")
        assert len(body["model_version"]) == 12
        if body["weights_kind"] == "demo":
            assert body["note"] == food11.DEMO_WEIGHTS_NOTE


def test_probability_is_softmax_and_pt_equals_onnx(pt_server, onnx_server):
    """The answer is the softmax probability of the top class, computed from
    the model's logits (checked against ONNX Runtime in this process: the 11
    probabilities sum to 1), and both services agree within 1e-4."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(paths.ONNX_TARGETS[0]), providers=["CPUExecutionProvider"])
    for path in paths.sample_images():
        data = path.read_bytes()
        probs = food11.softmax(session.run(None, {"input": food11.preprocess(data)[None]})[0])[0]
        assert probs.shape == (food11.NUM_CLASSES,)
        assert abs(probs.sum() - 1.0) < 1e-9
        answers = {}
        for server in (pt_server, onnx_server):
            r = requests.post(f"{server.url}/predict", json={"image": b64(data)}, timeout=60)
            assert r.status_code == 200, r.text
            answers[server.name] = r.json()
        pt, onnx = answers["fastapi_pt"], answers["fastapi_onnx"]
        assert pt["prediction"] == onnx["prediction"] == food11.LABELS[int(np.argmax(probs))], path.name
        assert abs(pt["probability"] - onnx["probability"]) < 1e-4, path.name
        assert abs(onnx["probability"] - float(probs.max())) < 1e-5, path.name


def test_data_url_is_accepted(fastapi_server):
    data = first_jpeg()
    r = requests.post(f"{fastapi_server.url}/predict",
                      json={"image": "data:image/jpeg;base64," + b64(data)}, timeout=60)
    assert r.status_code == 200, r.text


# --------------------------------------------------------------------------
# The bad-input table: (case, request kwargs, status, error code)
# --------------------------------------------------------------------------

def _huge_body(n: int) -> bytes:
    return b'{"image":"' + b"A" * n + b'"}'


def _chunked(n: int):
    yield b'{"image":"'
    for _ in range(n // (1 << 20) + 1):
        yield b"A" * (1 << 20)
    yield b'"}'


JSON = {"Content-Type": "application/json"}
OVER_BODY_LIMIT = serving.MAX_BODY_BYTES + 1024

BAD_INPUTS = [
    ("invalid base64", lambda: {"json": {"image": "this is not base64!"}}, 400, "invalid_base64"),
    ("base64 with bad padding", lambda: {"json": {"image": "abcde"}}, 400, "invalid_base64"),  # ("abc": unpadded, accepted)
    ("empty image string", lambda: {"json": {"image": ""}}, 400, "invalid_base64"),
    ("non-ascii image string", lambda: {"json": {"image": "données"}}, 400, "invalid_base64"),
    ("valid base64, not an image", lambda: {"json": {"image": b64(b"just some text, not a JPEG" * 10)}},
     400, "not_an_image"),
    ("truncated JPEG", lambda: {"json": {"image": b64(truncated_jpeg())}}, 400, "truncated_image"),
    ("truncated JPEG with its end marker", lambda: {"json": {"image": b64(truncated_jpeg_with_end())}},
     400, "truncated_image"),
    ("decompression bomb", lambda: {"json": {"image": b64(bomb_png())}}, 413, "image_too_large"),
    ("progressive JPEG scan bomb", lambda: {"json": {"image": b64(scan_bomb_jpeg())}}, 413, "image_too_large"),
    ("image bytes over the limit", lambda: {"json": {"image": "A" * (serving.MAX_BASE64_CHARS + 8)}},
     413, "image_too_large"),
    ("body over the limit", lambda: {"data": _huge_body(OVER_BODY_LIMIT), "headers": JSON}, 413, "body_too_large"),
    ("chunked body over the limit", lambda: {"data": _chunked(OVER_BODY_LIMIT), "headers": JSON},
     413, "body_too_large"),
    ("empty body", lambda: {"data": b"", "headers": JSON}, 422, "invalid_request"),
    ("empty body, no content type", lambda: {"data": b""}, 422, "invalid_request"),
    ("malformed JSON", lambda: {"data": b'{"image": ', "headers": JSON}, 422, "invalid_request"),
    ("missing field", lambda: {"json": {"picture": b64(first_jpeg())}}, 422, "invalid_request"),
    ("wrong type: number", lambda: {"json": {"image": 12345}}, 422, "invalid_request"),
    ("wrong type: null", lambda: {"json": {"image": None}}, 422, "invalid_request"),
    ("wrong type: list", lambda: {"json": {"image": [b64(first_jpeg())]}}, 422, "invalid_request"),
    ("JSON array body", lambda: {"json": [b64(first_jpeg())]}, 422, "invalid_request"),
    ("text/plain body", lambda: {"data": json.dumps({"image": b64(first_jpeg())}),
                                 "headers": {"Content-Type": "text/plain"}}, 415, "unsupported_media_type"),
    ("form-encoded body", lambda: {"data": {"image": b64(first_jpeg())}}, 415, "unsupported_media_type"),
    ("multipart file upload", lambda: {"files": {"image": ("food.jpg", first_jpeg(), "image/jpeg")}},
     415, "unsupported_media_type"),
    ("JSON without content type", lambda: {"data": json.dumps({"image": b64(first_jpeg())}).encode()},
     415, "unsupported_media_type"),
]


@pytest.mark.parametrize("case,make,status,code", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_then_good_request(fastapi_server, case, make, status, code):
    r = requests.post(f"{fastapi_server.url}/predict", timeout=60, **make())
    assert r.status_code == status, (case, r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["error"] == code
    assert isinstance(body["message"], str) and len(body["message"]) > 10
    assert "prediction" not in body
    assert len(r.content) < 10_000  # the input is never echoed back
    post_good(fastapi_server.url)   # and the service keeps serving
    assert fastapi_server.alive()


def test_wrong_method_and_unknown_path(fastapi_server):
    assert requests.get(f"{fastapi_server.url}/predict", timeout=10).status_code == 405
    assert requests.post(f"{fastapi_server.url}/nothing-here", json={}, timeout=10).status_code == 404
    post_good(fastapi_server.url)


def test_mixed_concurrent_clients(fastapi_server):
    """16 clients at once, half of them sending garbage: every good request
    gets its answer, every bad one its 4xx, no 5xx."""
    good = {"image": b64(first_jpeg())}
    bad = [{"image": "%%%"}, {"image": b64(truncated_jpeg())}, {"image": b64(bomb_png())}, {"img": 1}]
    payloads = [good if i % 2 == 0 else bad[(i // 2) % len(bad)] for i in range(32)]

    def send(p):
        return requests.post(f"{fastapi_server.url}/predict", json=p, timeout=120).status_code

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(send, payloads))
    for p, s in zip(payloads, statuses):
        assert s == 200 if p is good else 400 <= s < 500, (p if p is not good else "good", s)
    post_good(fastapi_server.url)


def test_openapi_documents_the_contract(fastapi_server):
    assert requests.get(f"{fastapi_server.url}/docs", timeout=10).status_code == 200
    spec = requests.get(f"{fastapi_server.url}/openapi.json", timeout=10).json()
    op = spec["paths"]["/predict"]["post"]
    assert {"200", "400", "413", "415", "422"} <= set(op["responses"])
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    image = spec["components"]["schemas"][ref]["properties"]["image"]
    assert image["type"] == "string"
    assert image["pattern"] == serving.BASE64_PATTERN
    assert spec["components"]["schemas"][ref]["required"] == ["image"]


@pytest.mark.integration   # real FastAPI servers
def test_env_knobs_device_and_workers(built_models, service_logs):
    """SERVELAB_DEVICE=cuda on a machine without a GPU (for ONNX Runtime) runs on the CPU
    and says so; SERVELAB_INFERENCE_WORKERS=1 gives one inference at a time."""
    from .helpers import start_fastapi

    server = start_fastapi("fastapi_onnx", service_logs,
                           env={"SERVELAB_DEVICE": "cuda", "SERVELAB_INFERENCE_WORKERS": "1"})
    try:
        health = requests.get(f"{server.url}/health", timeout=10).json()
        gpu = _cuda_here("fastapi_onnx")
        assert health["device"] == ("cuda" if gpu else "cpu")
        assert (health["workers"], health["cores"]) == (1, len(os.sched_getaffinity(0)))
        assert gpu or "device: cpu (ONNX Runtime providers ['CPUExecutionProvider'])" in server.log_tail(200)
        post_good(server.url)
    finally:
        server.stop()


def test_every_answer_says_where_its_time_went(fastapi_server):
    """Server-Timing (issue 51): the endpoint's decode, wait and infer, and the middleware's app time
    around them; a refused request carries the app time too. servelab.bench.breakdown's FastAPI
    run adds them up with the client's own clock."""
    from servelab.bench import breakdown

    r = requests.post(f"{fastapi_server.url}/predict", json={"image": b64(first_jpeg())}, timeout=60)
    assert r.status_code == 200
    stages = {k.strip(): float(v) for k, v in (p.split(";dur=") for p in r.headers["Server-Timing"].split(","))}
    assert list(stages) == ["decode", "wait", "infer", "app"], r.headers["Server-Timing"]
    assert stages["decode"] > 0 and stages["infer"] > 0 and stages["wait"] >= 0
    assert stages["app"] >= stages["decode"] + stages["wait"] + stages["infer"]
    bad = requests.post(f"{fastapi_server.url}/predict", json={"image": "not base64!"}, timeout=60)
    assert bad.status_code == 400 and bad.headers["Server-Timing"].startswith("app;dur=")
    run = breakdown.measure_fastapi(fastapi_server.url, concurrency=2, n=8, warmup=2, name=fastapi_server.name)
    assert run["answered"] == 8 and not run["errors"], run["errors"]
    for line, client in zip(run["timelines"], run["client_ms"]):
        assert [s for s, _m, _ms in line] == list(breakdown.FASTAPI_STAGES)
        assert abs(sum(ms for *_x, ms in line) - client) < 0.01
        assert all(ms >= 0 for *_x, ms in line), line    # the app's time fits in the client's, the stages in the app's
    s = breakdown.summary(run)
    assert s["stages"]["infer"]["p50"] > 0 and "client_p50" in s
