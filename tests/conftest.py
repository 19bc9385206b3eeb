"""Shared fixtures. Model artifacts are built once per session (a no-op when
`make test` already built them)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def built_models():
    """Ensure the Food-11 artifacts exist where every lesson folder expects them."""
    from servelab import models

    return models.build(log=lambda *a, **k: None)


@pytest.fixture(scope="session")
def sample_paths():
    from servelab import paths

    found = paths.sample_images()
    assert len(found) >= 5, "the kit's sample images are missing from servelab/samples/"
    return found
