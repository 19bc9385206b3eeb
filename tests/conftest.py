"""Shared fixtures. Model artifacts are built once per session (a no-op when
`make test` already built them)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def built_models():
    """Ensure the Food-11 artifacts exist where every lesson folder expects them."""
    from servelab.serve import models

    return models.build(log=lambda *a, **k: None)


@pytest.fixture(scope="session")
def sample_paths():
    from servelab.core import paths

    found = paths.sample_images()
    assert len(found) >= 5, "the kit's sample images are missing from servelab/samples/"
    return found


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` run only where PyTorch sees a CUDA device (a lent GPU
    machine: `pytest -m cuda`); elsewhere they are skipped with that reason."""
    marked = [item for item in items if item.get_closest_marker("cuda")]
    if not marked:
        return
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if not cuda:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason="no CUDA device"))
