"""Shared fixtures. Model artifacts are built once per session (a no-op when
`make test` already built them)."""

from __future__ import annotations

import os

import pytest

# The three tiers (fast, integration, e2e): tests/tiers.py.
pytest_plugins = ("tests.tiers",)


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


# `make test` runs in two phases: every test not marked ``quiet`` on three workers
# (pytest-xdist, `-n 3`, the Makefile's WORKERS), then the ``quiet`` ones alone. A quiet test times something or
# judges whether other work spoiled its runs, so it must not share the machine with another
# test. Plain `pytest` runs the fast tier (tests/tiers.py) in one process, in order.
#
# On the workers a test file stays together, in its order (its module fixtures, such as a
# running Triton, start once), except the files below, whose tests share nothing and are long.
SPREAD = {"tests/bench/test_benchmarks_smoke.py"}
# The longest files go to the workers first (measured 2026-11-26, in this order), so that no worker
# is left with one of them at the end while the other has nothing to do. In-file order is kept.
FIRST = ["tests/bench/test_benchmarks_smoke.py", "tests/bench/test_tour.py", "tests/test_gpu_check.py",
         "tests/triton/test_analyzer.py", "tests/reliability/test_stub_recovery.py",
         "tests/reliability/test_stack_lifecycle.py", "tests/triton/test_reload.py", "tests/notebooks/test_site.py",
         "tests/notebooks/test_chameleon_notebooks.py",
         "tests/images/test_image_envs.py", "tests/test_scale.py",
         "tests/triton/test_perf.py", "tests/images/test_image_services.py"]


def pytest_xdist_make_scheduler(config, log):
    """The workers' scheduler for `-n N` (xdist's default ``--dist load``): by file, as above."""
    if config.getvalue("dist") != "load":
        return None   # a --dist the caller chose
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return nodeid if module in SPREAD else module

    return ByFile(config, log)


# The quiet phase (`-m quiet`) collects only the files that say this (~10 s of collecting
# every file saved); the other phase, which collects them all, refuses a quiet test elsewhere.
QUIET_MARK = "pytest.mark.quiet"


def pytest_ignore_collect(collection_path, config):
    if (config.getoption("markexpr") == "quiet" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and QUIET_MARK not in collection_path.read_text()):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    """On a worker, the FIRST files first (above). Tests marked ``cuda`` run only where PyTorch
    sees a CUDA device (a lent GPU machine: `pytest -m cuda`); elsewhere they are skipped with
    that reason. A test marked quiet in a file without QUIET_MARK stops the run."""
    quiet_files = {item.path for item in items if item.get_closest_marker("quiet")}
    elsewhere = sorted(str(path) for path in quiet_files if QUIET_MARK not in path.read_text())
    if elsewhere:
        raise pytest.UsageError(f"quiet tests in files without {QUIET_MARK!r} (the quiet phase skips "
                                f"those files): {elsewhere}")
    if os.environ.get("PYTEST_XDIST_WORKER"):   # every worker sorts alike: xdist compares their lists
        rank = {m: i for i, m in enumerate(FIRST)}
        items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(FIRST)))
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
