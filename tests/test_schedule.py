"""`make test`'s scheduling (tests/schedule.py): every selected test runs once, the longest recorded work goes
to the workers first, a test with no record is estimated by its tier, and a quiet test never runs beside
another. The plan is tried as a function, then on a throw-away suite run by a real pytest on two workers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import schedule
from tests.schedule import Case

REPO = Path(__file__).resolve().parents[1]


def _order(units):
    return [n for u in units for n in u.nodeids]


def test_plan_keeps_every_test_once_and_each_files_order():
    tests = [Case("a.py::t1"), Case("a.py::t2", "integration"), Case("b.py::t1", "e2e"), Case("a.py::t3"),
             Case("c.py::t1", spread=True), Case("c.py::t2", spread=True), Case("new.py::t1")]
    recorded = {"a.py::t1": 5.0, "b.py::t1": 1.0, "c.py::t2": 40.0}   # new.py and some others: no record
    order = _order(schedule.plan(tests, recorded))
    assert sorted(order) == sorted(t.nodeid for t in tests) and len(order) == len(tests)
    assert [n for n in order if n.startswith("a.py")] == ["a.py::t1", "a.py::t2", "a.py::t3"]
    units = {u.key: u.nodeids for u in schedule.plan(tests, recorded)}
    assert units["a.py"] == ("a.py::t1", "a.py::t2", "a.py::t3")         # a file stays together
    assert units["c.py::t1"] == ("c.py::t1",) and units["c.py::t2"] == ("c.py::t2",)   # spread: one by one


def test_plan_sends_the_longest_recorded_work_first():
    many_short = [Case(f"many.py::t{i}") for i in range(10)]
    tests = many_short + [Case("one_long.py::t"), Case("middle.py::t1"), Case("middle.py::t2")]
    recorded = {t.nodeid: 0.5 for t in many_short} | {"one_long.py::t": 300.0, "middle.py::t1": 3.0,
                                                      "middle.py::t2": 4.0}
    assert [u.key for u in schedule.plan(tests, recorded)] == ["one_long.py", "middle.py", "many.py"]
    recorded["one_long.py::t"] = 1.0   # the record, not the test count or the collection order, decides
    assert [u.key for u in schedule.plan(tests, recorded)] == ["middle.py", "many.py", "one_long.py"]
    assert [u.seconds for u in schedule.plan(tests, recorded)] == [7.0, 5.0, 1.0]


def test_a_test_with_no_record_counts_its_tiers_default():
    tests = [Case("old.py::t"), Case("new_fast.py::t"), Case("new_e2e.py::t", "e2e")]
    units = schedule.plan(tests, {"old.py::t": schedule.DEFAULT_S["e2e"] - 1})
    assert [(u.key, u.seconds) for u in units] == [
        ("new_e2e.py", schedule.DEFAULT_S["e2e"]), ("old.py", schedule.DEFAULT_S["e2e"] - 1),
        ("new_fast.py", schedule.DEFAULT_S["fast"])]
    assert schedule.DEFAULT_S["fast"] < schedule.DEFAULT_S["integration"] < schedule.DEFAULT_S["e2e"]


def test_a_quiet_test_is_never_planned_for_workers():
    with pytest.raises(schedule.QuietOnWorkers, match="a quiet test runs alone"):
        schedule.plan([Case("a.py::t"), Case("b.py::timed", quiet=True)], {})


def test_make_test_runs_the_quiet_tests_alone_after_the_others():
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M).group(1)
    commands = re.findall(r"pytest [^|;]*", recipe)
    assert len(commands) == 2, commands
    workers, alone = commands
    assert re.search(r' -m "not quiet"(\s|$)', workers) and " -n " in workers, workers
    assert re.search(r" -m quiet(\s|$)", alone) and " -n" not in alone and "--dist" not in alone, alone


def test_the_recorded_durations_file():
    data = json.loads(schedule.DURATIONS.read_text())
    assert set(data) == {"about", "tests"} and "make test-durations" in data["about"]
    assert all(re.fullmatch(r"tests/\S+\.py::\S.*", k) and v >= 0 for k, v in data["tests"].items())
    assert list(data["tests"]) == sorted(data["tests"])


def test_save_merges_and_drops_the_tests_of_files_gone(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_here.py").write_text("")
    path = tmp_path / "tests" / "durations.json"
    schedule.save({"tests/test_here.py::a": 1.234, "tests/test_gone.py::b": 2.0}, path, tmp_path)
    merged = schedule.save({"tests/test_here.py::c": 3.0}, path, tmp_path)
    assert merged == {"tests/test_here.py::a": 1.23, "tests/test_here.py::c": 3.0}
    assert schedule.load(path) == merged


# A throw-away suite with the real plugins. Each test writes its worker and id as it starts; the recorded
# durations say which units are long (the tests themselves take no time).
CONFTEST = '''
from pathlib import Path

from tests import schedule

pytest_plugins = ("tests.tiers", "tests.schedule")
schedule.DURATIONS = Path(__file__).with_name("durations.json")
'''
LOG = '''
import os
from pathlib import Path

import pytest


def started(request):
    with open(Path(__file__).with_name("started.log"), "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + " " + request.node.nodeid + "\\n")
'''
FILES = {
    "test_a.py": LOG + "".join(f"\n\ndef test_{i}(request):\n    started(request)\n" for i in range(3)),
    "test_b.py": LOG + "\n\ndef test_long(request):\n    started(request)\n",
    "test_c.py": LOG + "\n\npytestmark = pytest.mark.spread\n" + "".join(
        f"\n\ndef test_{i}(request):\n    started(request)\n" for i in range(2)),
    "test_new.py": LOG + "\n\n@pytest.mark.e2e\ndef test_unrecorded(request):\n    started(request)\n",
}
RECORDED = {"test_a.py::test_0": 1.0, "test_a.py::test_1": 1.0, "test_a.py::test_2": 1.0,
            "test_b.py::test_long": 50.0, "test_c.py::test_0": 30.0, "test_c.py::test_1": 30.0,
            "test_gone.py::test_x": 99.0}
# test_new.py's e2e test has no record: 120 s (DEFAULT_S), the longest; then test_b; then test_c's tests one
# by one; test_a's three tests (3 s) last
PLANNED = ["test_new.py::test_unrecorded", "test_b.py::test_long", "test_c.py::test_0", "test_c.py::test_1",
           "test_a.py::test_0", "test_a.py::test_1", "test_a.py::test_2"]


def _suite(tmp_path: Path) -> Path:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "durations.json").write_text(json.dumps({"about": "", "tests": RECORDED}))
    return tmp_path


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.pop("PYTEST_XDIST_WORKER", None)
    # without the suite's heavy plugins (each worker would import them): seconds off each run
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                           "-p", "no:schemathesis", "-W", "ignore::pytest.PytestAssertRewriteWarning", "-q", *args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def test_workers_run_every_test_once_longest_recorded_first(tmp_path):
    folder = _suite(tmp_path)
    run = _pytest(folder, "-n", "2", "--record-durations")
    assert run.returncode == 0, run.stdout + run.stderr
    started = [line.split() for line in (folder / "started.log").read_text().splitlines()]
    assert sorted(n for _, n in started) == sorted(PLANNED), started                  # each test once
    per_worker = {w: [n for v, n in started if v == w] for w, _ in started}
    assert len(per_worker) == 2, per_worker
    # each worker's first test is one of the two longest units; each worker goes down the plan
    assert {tests[0] for tests in per_worker.values()} == set(PLANNED[:2]), per_worker
    for tests in per_worker.values():
        assert tests == sorted(tests, key=PLANNED.index), per_worker
    # --record-durations: every test's seconds replace the record; the gone file's entry is dropped
    assert set(schedule.load(folder / "durations.json")) == set(PLANNED)


def test_a_quiet_test_runs_alone_and_never_on_workers(tmp_path):
    folder = _suite(tmp_path)
    # a quiet mark however it is written (no file is searched for its text)
    (folder / "test_timed.py").write_text(LOG + "\n\nquiet = getattr(pytest.mark, 'qu' + 'iet')\n\n\n"
                                                "@quiet\ndef test_timed(request):\n    started(request)\n")
    on_workers = _pytest(folder, "-n", "2")
    assert on_workers.returncode == pytest.ExitCode.USAGE_ERROR, on_workers.stdout + on_workers.stderr
    assert "a quiet test runs alone" in on_workers.stdout + on_workers.stderr
    assert not (folder / "started.log").exists()                  # nothing ran
    alone = _pytest(folder, "-m", "quiet")
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert (folder / "started.log").read_text() == "main test_timed.py::test_timed\n"


def _item(nodeid: str, marks: set[str], fixture_scopes: dict[str, str]):
    defs = {name: [SimpleNamespace(scope=scope, func=lambda: None)] for name, scope in fixture_scopes.items()}
    return SimpleNamespace(nodeid=nodeid, iter_markers=lambda: [SimpleNamespace(name=m) for m in marks],
                           get_closest_marker=lambda name: name if name in marks else None,
                           _fixtureinfo=SimpleNamespace(name2fixturedefs=defs))


def test_spread_is_refused_for_a_test_that_shares_a_wider_fixture():
    case = schedule._case(_item("c.py::t", {"spread", "e2e"}, {"tmp_path": "function", "kernel": "session"}))
    assert case == Case("c.py::t", "e2e", quiet=False, spread=True)
    with pytest.raises(pytest.UsageError, match=r"c.py::t is marked spread but uses \['triton'\]"):
        schedule._case(_item("c.py::t", {"spread"}, {"tmp_path": "function", "triton": "module"}))
    assert schedule._case(_item("d.py::t", {"quiet"}, {"triton": "module"})) == Case("d.py::t", quiet=True)
