"""Both FastAPI services fuzzed from their own OpenAPI contract (schemathesis)
and with hypothesis-generated hostile images, over real HTTP on loopback.

Properties, for every request: no 5xx, an answer within the client timeout
(no hang), a status the schema documents for that operation (200, 400, 413,
415, 422 for ``POST /predict``), error bodies ``{"error", "message"}``; after
the whole run the server is alive, ``/health`` is 200, a good request still
succeeds and the server log shows no unhandled exception.

One uvicorn per app (module-scoped, parametrized: the two apps run one after
the other). ``SERVELAB_FUZZ=long`` (``make fuzz``) runs twenty times more cases.
"""

from __future__ import annotations

import base64
import json

import pytest
import requests
import schemathesis
from hypothesis import given, note
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

from servelab.core import food11
from servelab.serve import serving

from .fuzzimages import COMMON_FORMATS, FINDINGS, expected_status, fuzz_settings, hostile_images, valid_images
from .relsupport import good_predict, log_has_traceback, predict_body, start_fastapi

pytestmark = [pytest.mark.filterwarnings("ignore:IM image format is deprecated:DeprecationWarning"), pytest.mark.integration]   # integration: fuzzes the real services

TIMEOUT = 30  # seconds; a request that takes longer is a hang
DOCUMENTED = {200, 400, 413, 415, 422}
CASES = {"schema": 0, "images": 0, "bodies": 0}


@pytest.fixture(scope="module", params=["onnx", "pt"])
def app_server(request, built_models):
    server = start_fastapi(request.param)
    session = requests.Session()
    server.extra["session"] = session
    try:
        yield server
    finally:
        session.close()
        alive = server.alive()
        tail = server.log_tail(60)
        server.stop()
        assert alive, f"the {request.param} service died during fuzzing:\n{tail}"


def _stats_line(kind: str) -> None:
    print(f"\nfuzz cases sent so far: {CASES}")


# --------------------------------------------------------------------------
# schemathesis: every operation in the app's own OpenAPI schema
# --------------------------------------------------------------------------

_ST_CONFIG = {
    "generation": {"mode": "all"},   # schema-valid and schema-violating requests
    "checks": {
        # A schema-valid base64 string is usually not an image: 400 (or 413) is
        # the documented answer, not a failure to accept valid data.
        "positive_data_acceptance": {"expected-statuses": ["2XX", 400, 413]},
    },
}


@pytest.fixture(scope="module")
def schema_cases(app_server):
    """Cases for every operation in the running app's /openapi.json, schema-
    valid and schema-violating. (Driven through hypothesis directly: the
    `@schema.parametrize()` pytest plugin of schemathesis 4.32.5 fails under
    pytest 9.2 with "'Function' object has no attribute '_nodeid'".)"""
    config = SchemathesisConfig.from_dict(_ST_CONFIG)
    schema = schemathesis.openapi.from_url(f"{app_server.url}/openapi.json", config=config, timeout=10)
    return st.one_of(schema.as_strategy(GenerationMode.POSITIVE), schema.as_strategy(GenerationMode.NEGATIVE))


@fuzz_settings(scale=0.4)
@given(data=st.data())
def test_openapi_contract(app_server, schema_cases, data):
    case = data.draw(schema_cases, label="case")
    CASES["schema"] += 1
    response = case.call_and_validate(session=app_server.extra["session"], timeout=TIMEOUT)
    note(f"{case.method} {case.path} → {response.status_code} {response.text[:200]!r}")
    assert response.status_code < 500
    if case.path == "/predict" and case.method.upper() == "POST":
        assert response.status_code in DOCUMENTED
        if response.status_code != 200:
            body = response.json()
            assert body.get("error") and body.get("message"), body


# --------------------------------------------------------------------------
# hypothesis: hostile images inside a well-formed request
# --------------------------------------------------------------------------

@fuzz_settings(scale=0.3)
@given(data=hostile_images())
def test_hostile_images_get_documented_answers(app_server, data):
    CASES["images"] += 1
    note(f"{len(data)} bytes, head {data[:16]!r}")
    r = app_server.extra["session"].post(f"{app_server.url}/predict", json=predict_body(data), timeout=TIMEOUT)
    assert r.status_code in (200, 400, 413), (r.status_code, r.text[:300])
    body = r.json()
    if r.status_code == 200:
        assert body["prediction"] in food11.LABELS and 0.0 <= body["probability"] <= 1.0
    else:
        assert body["error"] and body["message"]


@pytest.mark.parametrize("data", [pytest.param(v, id=k) for k, v in FINDINGS.items()])
def test_fuzzer_findings_get_400_not_500(app_server, data):
    """Uploads the fuzzer found to break servelab.core.food11 (see test_image_fuzz)."""
    r = app_server.extra["session"].post(f"{app_server.url}/predict", json=predict_body(data), timeout=TIMEOUT)
    assert r.status_code == expected_status(data), (r.status_code, r.text[:300])
    if r.status_code == 400:
        assert r.json()["error"] == "not_an_image"
    else:  # decodable after all (its broken later frames are never read): a real answer
        assert r.json()["prediction"] in food11.LABELS


@fuzz_settings(scale=0.15)
@given(data=valid_images(max_side=64, formats=COMMON_FORMATS))
def test_real_images_in_any_mode_are_classified(app_server, data):
    CASES["images"] += 1
    r = app_server.extra["session"].post(f"{app_server.url}/predict", json=predict_body(data), timeout=TIMEOUT)
    assert r.status_code == 200, (r.status_code, r.text[:300])


# --------------------------------------------------------------------------
# hypothesis: malformed requests (bodies, content types, JSON shapes)
# --------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)

_bodies = st.one_of(
    st.binary(max_size=512),
    st.builds(lambda v: json.dumps(v).encode(), _json_values),
    st.builds(lambda v: json.dumps({"image": v}).encode(), _json_values),
    st.builds(lambda s: json.dumps({"image": s}).encode(), st.text(max_size=200)),
    st.builds(lambda b, extra: json.dumps({"image": base64.b64encode(b).decode(), **extra}).encode(),
              valid_images(max_side=16), st.dictionaries(st.text(max_size=8), _json_values, max_size=2)),
    st.builds(lambda b: b'{"image": "' + b + b'"}', st.binary(max_size=100)),   # invalid UTF-8 / escapes
)
_content_types = st.sampled_from([None, "application/json", "application/json; charset=utf-8", "text/plain",
                                  "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                  "application/octet-stream", "image/jpeg", "application/problem+json",
                                  "application/json; charset=latin-1", "", "*/*"])


@fuzz_settings(scale=0.3)
@given(body=_bodies, content_type=_content_types,
       method=st.sampled_from(["POST", "POST", "POST", "PUT", "GET", "DELETE", "PATCH", "OPTIONS"]),
       path=st.sampled_from(["/predict", "/predict", "/predict/", "/health", "/docs", "/openapi.json",
                             "/%2e%2e/etc/passwd", "/predict?image=x"]))
def test_malformed_requests_never_5xx(app_server, body, content_type, method, path):
    CASES["bodies"] += 1
    headers = {} if content_type is None else {"Content-Type": content_type}
    r = app_server.extra["session"].request(method, f"{app_server.url}{path}", data=body, headers=headers,
                                            timeout=TIMEOUT)
    note(f"{method} {path} {content_type!r} → {r.status_code} {r.text[:200]!r}")
    assert r.status_code < 500, r.text[:300]
    if path.startswith("/predict") and method == "POST" and r.status_code != 307:
        assert r.status_code in DOCUMENTED | {404}


# --------------------------------------------------------------------------
# Size limits and the state after the storm
# --------------------------------------------------------------------------

def test_body_size_limit_declared_and_chunked(app_server):
    limit = serving.MAX_BODY_BYTES
    big = b'{"image": "' + b"A" * (limit + 10) + b'"}'
    r = requests.post(f"{app_server.url}/predict", data=big, headers={"Content-Type": "application/json"},
                      timeout=TIMEOUT)
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"

    def chunks():  # no Content-Length: the server must count as it reads
        yield b'{"image": "'
        for _ in range(limit // (1 << 20) + 2):
            yield b"A" * (1 << 20)
        yield b'"}'

    r = requests.post(f"{app_server.url}/predict", data=chunks(), headers={"Content-Type": "application/json"},
                      timeout=TIMEOUT)
    assert r.status_code == 413


def test_service_healthy_after_fuzzing(app_server):
    """Runs after the fuzz tests of the same app (module order)."""
    assert app_server.alive()
    assert requests.get(f"{app_server.url}/health", timeout=10).status_code == 200
    good_predict(app_server.url)
    unhandled = log_has_traceback(app_server)
    _stats_line(app_server.name)
    assert not unhandled, f"unhandled errors in {app_server.name}'s log:\n{unhandled}"
