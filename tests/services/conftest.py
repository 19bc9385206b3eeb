"""Fixtures for the service tests: real uvicorn servers on free loopback
ports, started once per session and shared by the modules that need them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tiers import tier

from .helpers import start_fastapi

CHROMIUM = os.environ.get("SERVELAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def service_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("service-logs")


@pytest.fixture(scope="session")
@tier("integration")
def onnx_server(built_models, service_logs):
    server = start_fastapi("fastapi_onnx", service_logs)
    yield server
    server.stop()


@pytest.fixture(scope="session")
@tier("integration")
def pt_server(built_models, service_logs):
    server = start_fastapi("fastapi_pt", service_logs)
    yield server
    server.stop()


@pytest.fixture(scope="session", params=["fastapi_pt", "fastapi_onnx"])
@tier("integration")
def fastapi_server(request):
    """Each FastAPI service in turn (both are started once per session)."""
    return request.getfixturevalue("pt_server" if request.param == "fastapi_pt" else "onnx_server")


@pytest.fixture(scope="module")
@tier("integration")
def browser():
    """Debian's headless Chromium driven by Playwright (no browser is ever downloaded)."""
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (`make sysdeps`); "
                    "no browser is downloaded", pytrace=False)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()
