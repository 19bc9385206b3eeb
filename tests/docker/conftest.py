"""Session fixtures for the Docker tests: each stack rendered once by the
real Compose v2 binary (helpers live in dockerkit.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.node import compose

from .dockerkit import MODELS_FILE, REPO, STACKS, compose_env, render


@pytest.fixture(scope="session")
def empty_env_file(tmp_path_factory) -> Path:
    """Passed as --env-file, so a developer's real docker/.env is not read."""
    p = tmp_path_factory.mktemp("compose") / "empty.env"
    p.write_text("")
    return p


@pytest.fixture(scope="session")
def rendered(empty_env_file) -> dict[str, dict]:
    """stack name -> the merged config Compose would run (default variables)."""
    return {name: render(name, empty_env_file) for name in STACKS}


@pytest.fixture(scope="session")
def rendered_onnx(empty_env_file) -> dict[str, dict]:
    """The FastAPI stacks with FASTAPI_APP=fastapi_onnx."""
    return {name: render(name, empty_env_file, FASTAPI_APP="fastapi_onnx")
            for name in ("fastapi", "fastapi+cpu")}


@pytest.fixture(scope="session")
def rendered_models(empty_env_file) -> dict:
    """docker/docker-compose-models.yaml as the real Compose binary reads it."""
    return compose.config_json([MODELS_FILE], env=compose_env(), cwd=REPO,
                               extra_args=["--env-file", str(empty_env_file)])
