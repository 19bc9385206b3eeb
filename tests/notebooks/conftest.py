"""Fixtures for the notebook tests; their helpers are in nbkit.py."""

from __future__ import annotations

import pytest

from .nbkit import ensure_kernelspec


@pytest.fixture(scope="session")
def kernel_name() -> str:
    return ensure_kernelspec()
