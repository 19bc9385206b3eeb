"""The test tiers' rules (tests/tiers.py), proven on a throw-away suite run by a real pytest: a test's
tier comes from its marks and its fixtures'; the fast tier's tests carry its timeout and start no
server; notebook and benchmark runs refuse a lower tier; plain `pytest` here runs the fast tier and
`make test` still runs every tier."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests import tiers

REPO = Path(__file__).resolve().parents[1]

SUITE = '''
import time

import pytest

from servelab.core import procs
from tests import tiers
from tests.tiers import tier


@pytest.fixture
@tier("integration")
def server():
    return procs.free_port()


@pytest.fixture
def uses_server(server):
    return server


def test_pure(request):
    assert request.node.get_closest_marker("timeout").args == (tiers.FAST_TIMEOUT_S,)


@pytest.mark.timeout(600)
def test_own_longer_timeout_does_not_lift_the_tiers(request):
    assert request.node.get_closest_marker("timeout").args == (tiers.FAST_TIMEOUT_S,)


def test_binds_a_port():
    procs.free_port()


@pytest.mark.integration
def test_marked_integration_binds(request):
    procs.free_port()
    assert request.node.get_closest_marker("timeout") is None


def test_through_a_fixture_of_a_fixture(uses_server):
    assert uses_server > 0


def test_runs_a_notebook():
    tiers.require("e2e", "executes notebook x")


@pytest.mark.e2e
def test_marked_e2e_runs_a_notebook():
    tiers.require("e2e", "executes notebook x")


def test_hangs():
    time.sleep(30)
'''


def _run(folder: Path, *args: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    # without the suite's heavy plugins, as tests/test_schedule.py: seconds off each run
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                           "-p", "no:schemathesis", "-rA", "-q", *args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    outcomes = re.findall(r"^(PASSED|FAILED|ERROR) test_suite\.py::(\w+)", proc.stdout, re.M)
    return {name: outcome for outcome, name in outcomes} | {"": proc.stdout + proc.stderr}


def _suite(tmp_path: Path) -> Path:
    # the same plugin as the real suite, with a 2 s fast-tier timeout so that the hanging test is quick
    (tmp_path / "conftest.py").write_text('pytest_plugins = ("tests.tiers",)\n\nfrom tests import tiers\n\n'
                                          "tiers.FAST_TIMEOUT_S = 2\n")
    (tmp_path / "test_suite.py").write_text(SUITE)
    return tmp_path


def test_tiers_from_marks_and_fixtures_and_the_fast_tiers_rules(tmp_path):
    got = _run(_suite(tmp_path))
    log = got.pop("")
    assert got == {
        "test_pure": "PASSED",
        "test_own_longer_timeout_does_not_lift_the_tiers": "PASSED",
        "test_binds_a_port": "FAILED",                   # a fast test may not bind a port
        "test_marked_integration_binds": "PASSED",
        "test_through_a_fixture_of_a_fixture": "PASSED",  # integration, through the fixture's fixture
        "test_runs_a_notebook": "FAILED",                 # a notebook run belongs in e2e
        "test_marked_e2e_runs_a_notebook": "PASSED",
        "test_hangs": "FAILED",                           # the fast tier's timeout
    }, log
    assert re.search(r"test_binds_a_port binds \('127\.0\.0\.1', \d+\): a fast test starts no server", log), log
    assert "test_runs_a_notebook (fast tier) executes notebook x" in log, log
    assert "Timeout" in log, log


def test_the_fast_expression_leaves_out_what_a_fixture_puts_in_a_tier(tmp_path):
    """-m selects on the marks the plugin adds (its hook runs before pytest's own selection)."""
    got = _run(_suite(tmp_path), "-m", tiers.FAST, "-k", "not hangs and not binds and not runs_a_notebook")
    got.pop("")
    assert got == {"test_pure": "PASSED", "test_own_longer_timeout_does_not_lift_the_tiers": "PASSED"}
    got = _run(_suite(tmp_path), "-m", "integration")
    got.pop("")
    assert got == {"test_marked_integration_binds": "PASSED", "test_through_a_fixture_of_a_fixture": "PASSED"}


def test_plain_pytest_runs_the_fast_tier_and_make_test_every_tier():
    addopts = re.search(r"^addopts = \"(.*)\"$", (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert f"-m '{tiers.FAST}'" in addopts
    # make test's pytest commands each name their own -m (it replaces addopts' one): every tier runs
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M).group(1)
    commands = re.findall(r"pytest [^|;]*", recipe)
    assert len(commands) == 2 and all(re.search(r" -m (\"not quiet\"|quiet)(\s|$)", c) for c in commands), commands
    check = re.search(r"^check:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M).group(1)
    assert re.findall(r"pytest.*", check) == ["pytest -q"], check   # no -m of its own: addopts' one, the fast tier
