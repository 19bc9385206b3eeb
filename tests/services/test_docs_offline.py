"""FastAPI's /docs (Swagger UI) and /redoc work with no network: the apps serve
the pages' JavaScript and CSS themselves (from the pinned fastapi-offline
package), so a node or laptop without a CDN still shows the API.

Both real services (fastapi_pt, fastapi_onnx) run on a loopback port; a real
headless Chromium loads the pages while every request that does not go to
that port is aborted, and must still find the `predict` operation."""

from __future__ import annotations

import re

import requests

from servelab.serve import serving


def _offline_page(browser, base_url: str):
    """A page whose every request outside ``base_url`` is aborted (and recorded)."""
    page = browser.new_page()
    blocked, failed = [], []

    def route(r):
        url = r.request.url
        if url.startswith((base_url, "data:", "blob:")):
            r.continue_()
        else:
            blocked.append(url)
            r.abort()

    page.route("**/*", route)
    page.on("requestfailed", lambda req: failed.append(req.url))
    return page, blocked, failed


def test_docs_pages_reference_only_the_app(fastapi_server):
    for path in ("/docs", "/redoc"):
        r = requests.get(fastapi_server.url + path, timeout=10)
        assert r.status_code == 200, path
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", r.text), (path, r.text)
        for asset in re.findall(r"""(?:src|href)=["']?([^"' >]+)""", r.text) + re.findall(r"url: '([^']+)'", r.text):
            if asset.startswith("/"):
                got = requests.get(fastapi_server.url + asset, timeout=10)
                assert got.status_code == 200, asset
    js = requests.get(fastapi_server.url + serving.DOCS_STATIC_PATH + "/swagger-ui-bundle.js", timeout=10)
    assert js.status_code == 200 and len(js.content) > 100_000
    # The docs routes are not part of the API description.
    paths = requests.get(fastapi_server.url + "/openapi.json", timeout=10).json()["paths"]
    assert "/predict" in paths and "/docs" not in paths and not any(p.startswith("/docs-static") for p in paths)


def test_swagger_ui_finds_predict_with_the_network_blocked(browser, fastapi_server):
    base = fastapi_server.url
    page, blocked, failed = _offline_page(browser, base)
    try:
        page.goto(base + "/docs")
        op = page.wait_for_selector(".opblock-post .opblock-summary-path[data-path='/predict']", timeout=30_000)
        op.click()                                              # expand POST /predict
        page.wait_for_selector("button.try-out__btn", timeout=10_000).click()
        body = page.wait_for_selector("textarea.body-param__text", timeout=10_000)
        assert '"image"' in body.input_value()                  # the request schema rendered
        title = page.inner_text(".info .title")
    finally:
        page.close()
    assert "Food-11 classifier" in title
    assert blocked == [], f"/docs tried to reach the network: {blocked}"
    assert failed == [], f"requests failed: {failed}"


def test_redoc_shows_predict_with_the_network_blocked(browser, fastapi_server):
    base = fastapi_server.url
    page, blocked, failed = _offline_page(browser, base)
    try:
        page.goto(base + "/redoc")
        page.wait_for_selector("text=/predict", timeout=30_000)
        text = page.inner_text("body")
    finally:
        page.close()
    assert "Predict" in text and "image" in text
    assert blocked == [], f"/redoc tried to reach the network: {blocked}"
    # ReDoc's sidebar names its vendor's logo by URL; the page's Content-Security-Policy
    # stops the browser before any request leaves (so it fails here, and never reaches the route).
    assert [u for u in failed if u.startswith(base)] == [], failed
