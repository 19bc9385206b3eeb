"""Fixtures for the service tests: real uvicorn servers on free loopback
ports, started once per session and shared by the modules that need them."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import start_fastapi


@pytest.fixture(scope="session")
def service_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("service-logs")


@pytest.fixture(scope="session")
def onnx_server(built_models, service_logs):
    server = start_fastapi("fastapi_onnx", service_logs)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def pt_server(built_models, service_logs):
    server = start_fastapi("fastapi_pt", service_logs)
    yield server
    server.stop()


@pytest.fixture(scope="session", params=["fastapi_pt", "fastapi_onnx"])
def fastapi_server(request):
    """Each FastAPI service in turn (both are started once per session)."""
    return request.getfixturevalue("pt_server" if request.param == "fastapi_pt" else "onnx_server")


