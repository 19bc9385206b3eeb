"""Shared fixtures. Model artifacts are built once per session (a no-op when
`make test` already built them)."""

from __future__ import annotations

import sys

import pytest

# jsonschema (nbformat validates notebooks with it) imports rfc3987_syntax, when installed, only to
# check the "iri" string format; no schema the tests validate names a format (nbformat's schemas have
# none), and that import builds an Earley grammar: 10 of the 28 s plain `pytest` took to collect
# (2026-11-30). A None entry makes the import an ImportError, which jsonschema passes over
# (jsonschema/_format.py, `with suppress(ImportError)`). rfc3987-syntax is in the venv through
# jupyter-events' jsonschema[format-nongpl] (jupyterlab).
sys.modules.setdefault("rfc3987_syntax", None)

# The three tiers (fast, integration, e2e): tests/tiers.py. How `make test` runs them (two phases,
# the first on workers, longest work first, from tests/durations.json): tests/schedule.py.
pytest_plugins = ("tests.tiers", "tests.schedule")


def pytest_configure(config):
    """Each xdist worker (gw0, gw1, ...) takes its servers' ports from its own slice of
    procs.port_range(), so two workers never pick the same free port in the seconds before
    either binds it (a SERVELAB_PORT_RANGE the caller set is sliced the same way)."""
    import os

    from servelab.core import procs

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit() and os.environ.get("SERVELAB_PORT_SLICE") != worker:
        os.environ["SERVELAB_PORT_SLICE"] = worker   # once per worker process
        lo, hi = procs.port_range()
        width = max((hi - lo + 1) // 8, 1)
        first = min(lo + (int(worker[2:]) % 8) * width, hi)
        os.environ[procs.PORT_RANGE_ENV] = f"{first}-{min(first + width - 1, hi)}"


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
    """Tests marked ``cuda`` run only where PyTorch sees a CUDA device (a lent GPU machine:
    `pytest -m cuda`); elsewhere they are skipped with that reason."""
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


def pytest_terminal_summary(terminalreporter):
    """Say how many of the notebooks' lesson checks were judged: a check whose runs a busy machine
    spoiled prints *inconclusive* and is not evidence either way, so a test that passes with it
    has not judged it (tests/notebooks/conftest.py records them; a test run on a worker sends them
    in its report)."""
    per_test: dict[str, dict] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "teardown":
                continue
            for key, entry in getattr(report, "user_properties", ()):
                if key == "lesson_checks":
                    tally = per_test.setdefault(report.nodeid, {})
                    for k, v in entry.items():
                        tally[k] = tally.get(k, 0) + v
    if not per_test:
        return
    total = {k: sum(t.get(k, 0) for t in per_test.values()) for k in ("judged", "inconclusive")}
    terminalreporter.write_sep("-", f"lesson checks: {total['judged']} judged, {total['inconclusive']} inconclusive "
                                    "(a busy machine spoiled their runs: not evidence)")
    for nodeid, t in sorted(per_test.items()):
        again = f"; the first try missed {t['first_try_missed']}, so the notebook ran again" \
            if t.get("first_try_missed") else ""
        terminalreporter.write_line(f"{nodeid}: {t.get('judged', 0)} judged ({t.get('passed', 0)} passed, "
                                    f"{t.get('failed', 0)} failed), {t.get('inconclusive', 0)} inconclusive{again}")
