"""Fixtures for the notebook tests; their helpers are in nbkit.py."""

from __future__ import annotations

import pytest

from . import nbkit
from .nbkit import ensure_kernelspec


@pytest.fixture(autouse=True)
def _lesson_checks_reported(request):
    """Hand what this test's lesson checks came to (nbkit.LESSON_CHECKS) to its report, so the
    session's summary says how many were judged (tests/conftest.py, pytest_terminal_summary)."""
    start = len(nbkit.LESSON_CHECKS)
    yield
    for entry in nbkit.LESSON_CHECKS[start:]:
        request.node.user_properties.append(("lesson_checks", entry))


@pytest.fixture(scope="session")
def kernel_name() -> str:
    return ensure_kernelspec()


@pytest.fixture(scope="session")
def jupyter_image_env():
    """The FastAPI stack's Jupyter image as a virtualenv (Python 3.11, exactly what
    docker/Dockerfile.jupyter installs); built once per requirements hash under build/."""
    from tests.images import imagekit

    return imagekit.image_env("jupyter")


@pytest.fixture(scope="session")
def jupyter_sdk_image_env():
    """The Triton stack's Jupyter image (24.10 SDK base, Python 3.10) as a virtualenv, or
    None where this machine has no Python 3.10 (see test_sdk_image_python_is_here)."""
    from tests.images import imagekit

    if imagekit.find_python("3.10") is None:
        return None
    return imagekit.image_env("jupyter-sdk")
