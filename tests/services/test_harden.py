"""servelab.serve.harden on a plain FastAPI app, in-process: what the kit adds to a lesson's app from
outside its file (issue 47). The real lesson apps get the same under uvicorn: test_fastapi_services,
test_docs_offline, the fuzz tests."""

from __future__ import annotations

import base64

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from servelab.core import food11, paths
from servelab.serve import harden, serving


class PredictRequest(BaseModel):
    image: str


def _plain_app():
    """What a student writes: no limits, FastAPI's CDN docs, no error handlers."""
    app = FastAPI(title="plain")

    @app.post("/predict")
    def predict(request: PredictRequest):
        x = food11.preprocess_base64(request.image)
        return {"shape": list(x.shape)}

    return app


@pytest.fixture(scope="module")
def client():
    return TestClient(harden.harden(_plain_app()), raise_server_exceptions=False)


def test_without_the_kit_a_bad_image_is_a_500():
    plain = TestClient(_plain_app(), raise_server_exceptions=False)
    assert plain.post("/predict", json={"image": "not base64!"}).status_code == 500


def test_a_bad_image_is_a_json_400_and_the_app_keeps_serving(client):
    r = client.post("/predict", json={"image": "not base64!"})
    assert r.status_code == 400 and r.json()["error"] == "invalid_base64", r.text
    good = base64.b64encode(paths.sample_images()[0].read_bytes()).decode()
    r = client.post("/predict", json={"image": good})
    assert r.status_code == 200 and r.json() == {"shape": [3, food11.INPUT_SIZE, food11.INPUT_SIZE]}
    assert r.headers["Server-Timing"].startswith("app;dur=")


def test_a_body_over_the_limit_is_refused_unread(client):
    r = client.post("/predict", content=b"x" * (serving.MAX_BODY_BYTES + 1), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"


def test_wrong_content_type_and_missing_field(client):
    assert client.post("/predict", content=b"image=1", headers={"Content-Type": "text/plain"}).status_code == 415
    r = client.post("/predict", json={})
    assert r.status_code == 422 and r.json()["error"] == "invalid_request"


def test_docs_come_from_the_app_and_the_schema_states_the_contract(client):
    page = client.get("/docs")
    assert page.status_code == 200 and "cdn." not in page.text and serving.DOCS_STATIC_PATH in page.text
    assert client.get("/redoc").status_code == 200
    spec = client.get("/openapi.json").json()
    assert {"400", "413", "415", "422"} <= set(spec["paths"]["/predict"]["post"]["responses"])
    image = spec["components"]["schemas"]["PredictRequest"]["properties"]["image"]
    assert image["pattern"] == serving.BASE64_PATTERN and image["maxLength"] == serving.MAX_BASE64_CHARS


def test_only_the_lesson_apps_load():
    with pytest.raises(ValueError, match="no lesson app 'servelab'"):
        harden.load("servelab")
