"""A real headless Chromium drives the Flask page: choose a sample image,
see the preview, click Classify, read the label and probability shown.

Backends: the FastAPI ONNX service, and the real local Triton (its Python
model `food_classifier` and its ONNX model `food_classifier_onnx`), each a
real server on a free loopback port. The page must load nothing from outside
the app: every request the browser makes is checked."""

from __future__ import annotations

import base64

import pytest
import requests

from servelab.core import food11, paths, procs

from .helpers import start_flask, truncated_jpeg


@pytest.fixture(scope="module")
def flask_on_onnx(onnx_server, service_logs):
    server = start_flask(service_logs, {"INFERENCE_BACKEND": "fastapi", "FASTAPI_SERVER_URL": onnx_server.url})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def triton(built_models, tmp_path_factory):
    from servelab.triton import start

    server = start(
        models=["food_classifier", "food_classifier_onnx"],
        http_port=procs.free_port(), grpc_port=procs.free_port(), metrics_port=procs.free_port(),
        workdir=tmp_path_factory.mktemp("triton"), write_state=False,
    )
    yield server
    server.stop()


def classify_in_browser(browser, base_url: str, image_path) -> dict:
    page = browser.new_page()
    outside = []
    page.on("request", lambda req: outside.append(req.url)
            if not req.url.startswith((base_url, "data:", "blob:")) else None)
    try:
        page.goto(base_url + "/")
        page.set_input_files("#file", str(image_path))
        page.wait_for_selector("#preview:not([hidden])")          # the preview appears before upload
        assert page.get_attribute("#preview", "src").startswith("blob:")
        page.click("#submit")
        page.wait_for_selector("#result", timeout=60_000)
        shown = {
            "label": page.inner_text("#label").strip(),
            "probability": float(page.inner_text("#probability")),
            "answered_by": page.inner_text("#answered-by"),
            "latency": page.inner_text("#latency"),
            "note": page.inner_text("#note"),
            "weights": page.inner_text("#weights"),
        }
    finally:
        page.close()
    assert outside == [], f"the page loaded resources from outside the app: {outside}"
    return shown


def check_shown(shown: dict, backend: str, weights_kind: str):
    assert shown["label"] in food11.LABELS
    assert 0.0 < shown["probability"] <= 1.0
    assert shown["answered_by"].startswith(backend)
    assert shown["latency"].endswith("ms") and float(shown["latency"].split()[0]) > 0
    if weights_kind == "demo":
        assert food11.DEMO_WEIGHTS_NOTE in shown["note"]


def expected_from_fastapi(url: str, image_path) -> dict:
    r = requests.post(f"{url}/predict", json={"image": base64.b64encode(image_path.read_bytes()).decode()},
                      timeout=60)
    assert r.status_code == 200
    return r.json()


def test_browser_fastapi_onnx(browser, flask_on_onnx, onnx_server):
    sample = next(p for p in paths.sample_images() if p.suffix == ".jpg")
    shown = classify_in_browser(browser, flask_on_onnx.url, sample)
    check_shown(shown, "fastapi", food11.weights_kind(paths.ONNX_TARGETS[0]))
    expected = expected_from_fastapi(onnx_server.url, sample)
    assert shown["label"] == expected["prediction"]
    assert abs(shown["probability"] - expected["probability"]) < 1e-4  # the page shows 4 decimals


def test_browser_shows_a_clear_error_for_a_broken_image(browser, flask_on_onnx, tmp_path):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(truncated_jpeg())
    page = browser.new_page()
    try:
        response = None

        def remember(resp):
            nonlocal response
            if resp.url.endswith("/predict"):
                response = resp

        page.on("response", remember)
        page.goto(flask_on_onnx.url + "/")
        page.set_input_files("#file", str(broken))
        page.click("#submit")
        page.wait_for_selector("#error-message")
        assert "truncated" in page.inner_text("#error-message")
        assert response is not None and response.status == 400
    finally:
        page.close()


@pytest.mark.parametrize("backend,model", [("triton", "food_classifier"), ("triton_onnx", "food_classifier_onnx")])
def test_browser_triton(browser, triton, onnx_server, service_logs, backend, model):
    flask = start_flask(service_logs, {"INFERENCE_BACKEND": backend, "TRITON_SERVER_URL": triton.url,
                                       "FOOD11_MODEL_NAME": model})
    try:
        sample = next(p for p in paths.sample_images() if p.suffix == ".jpg")
        shown = classify_in_browser(browser, flask.url, sample)
        check_shown(shown, backend, food11.weights_kind(paths.ONNX_TARGETS[0]))
        assert model in shown["answered_by"]
        # Same image, same weights: Triton agrees with the FastAPI ONNX service.
        expected = expected_from_fastapi(onnx_server.url, sample)
        assert shown["label"] == expected["prediction"]
        assert abs(shown["probability"] - expected["probability"]) < 1e-4
    finally:
        flask.stop()
