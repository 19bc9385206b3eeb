"""Odd but plausible request bodies against a real FastAPI service (issue 15,
item 8): the contract says 422 ``invalid_request`` for a body that is not the
documented JSON, with a sentence that says what is wrong; base64 as users
really produce it is accepted; a body built to be expensive to parse is
refused before it is parsed (JSON parsing runs on the event loop, where it
would stall every other request, /health included)."""

from __future__ import annotations

import base64
import json
import textwrap

import pytest
import requests

from .relsupport import sample_bytes, start_fastapi

pytestmark = pytest.mark.integration   # real FastAPI servers


@pytest.fixture(scope="module")
def api(built_models):
    server = start_fastapi("onnx")
    try:
        yield server
    finally:
        server.stop()


def _post(api, body: bytes | str):
    if isinstance(body, str):
        body = body.encode()
    return requests.post(f"{api.url}/predict", data=body, headers={"Content-Type": "application/json"}, timeout=60)


def _assert_invalid_request(r, *words):
    assert r.status_code == 422, (r.status_code, r.text[:300])
    body = r.json()
    assert body["error"] == "invalid_request", body
    for w in words:
        assert w in body["message"], body["message"]
    assert requests.get(f"{api_url(r)}/health", timeout=30).status_code == 200


def api_url(r) -> str:
    return r.url.rsplit("/predict", 1)[0]


@pytest.mark.parametrize("depth", [100, 10_000, 100_000])
def test_deeply_nested_json_is_422(api, depth):
    _assert_invalid_request(_post(api, '{"image": ' + "[" * depth + "]" * depth + "}"), "nest")


def test_a_5000_digit_integer_is_422(api):
    _assert_invalid_request(_post(api, '{"image": ' + "7" * 5000 + "}"), "digits")


def test_a_million_keys_is_refused_before_parsing(api):
    body = "{" + ",".join(f'"{i:x}":0' for i in range(1_000_000)) + "}"
    assert len(body) < 12 * 2**20  # under the body-size limit: only the shape can refuse it
    _assert_invalid_request(_post(api, body), "items")


def test_base64_as_users_send_it_is_accepted(api):
    raw = next(d for d in sample_bytes() if len(d) % 3)
    std = base64.b64encode(raw).decode()
    for name, text in {
        "encodebytes": base64.encodebytes(raw).decode(),
        "base64 CLI (76 columns)": "\n".join(textwrap.wrap(std, 76)) + "\n",
        "URL-safe": base64.urlsafe_b64encode(raw).decode(),
        "unpadded": std.rstrip("="),
    }.items():
        r = _post(api, json.dumps({"image": text}))
        assert r.status_code == 200, (name, r.status_code, r.text[:300])


def test_mixed_base64_alphabets_say_what_is_wrong(api):
    std = base64.b64encode(sample_bytes()[0]).decode()
    r = _post(api, json.dumps({"image": std[:40] + "-_" + std[42:]}))
    assert r.status_code == 400 and r.json()["error"] == "invalid_base64"
    assert "alphabet" in r.json()["message"]
