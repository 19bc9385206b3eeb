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


# `make test` runs in two phases: every test not marked ``quiet`` on two workers
# (pytest-xdist, ``--dist loadgroup``), then the ``quiet`` ones alone. A quiet test times
# something or judges whether other work spoiled its runs, so it must not share the machine
# with another test. Plain `pytest` runs everything in one process, in order.
#
# On the workers a test file stays together (its module fixtures, such as a running Triton,
# start once), except the files below, whose tests share nothing and are long.
SPREAD = {"tests/bench/test_benchmarks_smoke.py"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Group the tests for the workers (above); tests marked ``cuda`` run only where
    PyTorch sees a CUDA device (a lent GPU machine: `pytest -m cuda`); elsewhere they
    are skipped with that reason."""
    for item in items:
        if not item.get_closest_marker("xdist_group"):
            module = item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(item.nodeid if module in SPREAD else module))
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
