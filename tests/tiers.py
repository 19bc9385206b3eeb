"""The three test tiers (CONTRIBUTING.md, "Tests and the time they take"); a pytest plugin that
tests/conftest.py loads.

- fast: pure and in-process tests. Plain ``pytest`` and ``make check`` run only these. Each runs
  under a timeout of ``FAST_TIMEOUT_S`` (pytest-timeout) and may start no server: a fast test that
  binds a network socket (a server, or ``procs.free_port()`` to find a port for one) fails with
  ``ServerInFastTier``.
- integration (``pytest -m integration``): real servers on loopback.
- e2e (``pytest -m e2e``): notebook executions, benchmark ``--tiny`` runs, the tour, the gpu-check
  dry run. ``nbkit.run_notebook`` and the smoke test's ``run_tiny`` refuse to run in a lower tier
  (``require``).

A test's tier is the highest of its own marks (``pytest.mark.integration`` / ``pytest.mark.e2e`` on
the test or its module) and of the fixtures it uses: a fixture that starts a server says so where it
is defined, with ``@tier("integration")`` under its ``@pytest.fixture``, and every test that uses it
(directly or through another fixture) is in that tier. Everything else is fast.
``make test`` runs every tier (its two phases select by ``quiet`` only)."""

from __future__ import annotations

import socket
import sys

import pytest

TIERS = ("fast", "integration", "e2e")   # lowest first
# A hang guard, not a budget (the tier's budget is a few minutes in all): the slowest fast test,
# test_models' export of trained weights, read 19 s alone and 61 s beside three workers on a loaded
# 2-core machine (2026-11-27); `make test` runs the fast tests on three workers too.
FAST_TIMEOUT_S = 120
FAST = "not integration and not e2e"     # pyproject's addopts: what plain `pytest` runs
_TIER_KEY = pytest.StashKey[str]()


class ServerInFastTier(RuntimeError):
    pass


def tier(name: str):
    """Put a fixture (and so every test that uses it) in tier ``name``: ``@pytest.fixture`` above it."""
    assert name in TIERS, name

    def mark(fn):
        fn.servelab_tier = name
        return fn

    return mark


def tier_of(item) -> str:
    """The tier of a collected test: its marks and its fixtures', the highest."""
    found = {m.name for m in item.iter_markers() if m.name in TIERS}
    info = getattr(item, "_fixtureinfo", None)   # a doctest item has none
    for defs in info.name2fixturedefs.values() if info else ():
        found |= {getattr(d.func, "servelab_tier", "fast") for d in defs}
    return max(found, key=TIERS.index, default="fast")


class TierError(RuntimeError):
    pass


# The test running now, and its tier (a stack: empty between tests).
_running: list[tuple[str, str]] = []


def require(needed: str, what: str) -> None:
    """Refuse ``what`` (a notebook execution, a benchmark run) inside a test of a lower tier than
    ``needed``: such a test belongs in that tier. Outside a test (a script, a REPL) it is allowed."""
    if _running and TIERS.index(_running[-1][1]) < TIERS.index(needed):
        nodeid, tier_now = _running[-1]
        raise TierError(f"{nodeid} ({tier_now} tier) {what}: that is the {needed} tier's work. Mark it "
                        f"pytest.mark.{needed}, or use a fixture marked @tier({needed!r}) (tests/tiers.py)")


def _audit(event: str, args: tuple) -> None:
    if event == "socket.bind" and _running and _running[-1][1] == "fast" and len(args) == 2:
        sock, address = args
        if getattr(sock, "family", None) in (socket.AF_INET, socket.AF_INET6):
            raise ServerInFastTier(
                f"{_running[-1][0]} binds {address!r}: a fast test starts no server. Mark it "
                "pytest.mark.integration, or use a fixture marked @tier('integration') (tests/tiers.py)")


_hook_added = []


def pytest_configure(config):
    for name, what in (("integration", "starts real servers on loopback (tier 2: `pytest -m integration`)"),
                       ("e2e", "runs a notebook, a benchmark --tiny, the tour or the gpu-check dry run "
                               "(tier 3: `pytest -m e2e`)")):
        config.addinivalue_line("markers", f"{name}: {what}; tests/tiers.py")
    if not config.pluginmanager.hasplugin("timeout"):   # -p no:timeout (make fuzz): its mark stays known
        config.addinivalue_line("markers", "timeout(seconds): pytest-timeout's (not loaded in this run)")
    if not _hook_added:   # an audit hook cannot be removed: one per process, idle outside fast tests
        sys.addaudithook(_audit)
        _hook_added.append(True)


@pytest.hookimpl(tryfirst=True)   # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        name = tier_of(item)
        item.stash[_TIER_KEY] = name
        if name == "fast":
            # first among its timeout marks: a test's own longer timeout does not lift the tier's
            item.add_marker(pytest.mark.timeout(FAST_TIMEOUT_S), append=False)
        elif not item.get_closest_marker(name):
            item.add_marker(getattr(pytest.mark, name))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running.append((item.nodeid, item.stash.get(_TIER_KEY, "fast")))
    try:
        yield
    finally:
        _running.pop()


# Each tier's time in this run: the sum of its tests' seconds (setup, call and teardown, as the
# reports give them; on workers the controller receives them). A sum, not wall time: `make test`
# runs phase 1 on three workers at once.
_tier_seconds: dict[str, list[float]] = {}


def _report_tier(report) -> str:
    keywords = getattr(report, "keywords", {}) or {}
    return next((t for t in reversed(TIERS[1:]) if t in keywords), "fast")


def pytest_runtest_logreport(report):
    entry = _tier_seconds.setdefault(_report_tier(report), [0.0, 0])
    entry[0] += report.duration
    entry[1] += report.when == "call" or (report.when == "setup" and report.skipped)


def pytest_terminal_summary(terminalreporter):
    if _tier_seconds:
        terminalreporter.write_sep("-", "tier time: " + ", ".join(
            f"{t} {_tier_seconds[t][0]:.0f} s over {_tier_seconds[t][1]} tests" for t in TIERS if t in _tier_seconds)
            + " (sum of test durations)")
