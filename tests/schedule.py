"""How `make test` spreads its tests over pytest-xdist workers: from the tests' marks and their recorded
durations (``tests/durations.json``), not from lists of paths. A pytest plugin that tests/conftest.py loads.

`make test` runs in two phases (the Makefile). Phase 1: every test not marked ``quiet``, on three workers
(``-n 3``). Phase 2: the ``quiet`` tests, alone in one process. A quiet test times something, or judges
whether other work spoiled its runs, so it never shares the machine with another test: a run on workers
that selects one stops (``QuietOnWorkers``). Plain `pytest` runs in one process, in file order.

On the workers the tests go out in *units*: a test file stays together, in its order (its module
fixtures, such as a running Triton, start once), except a test marked ``spread`` (its tests share no
fixture wider than a test), which is a unit by itself. The units go longest first (longest processing
time first): a unit's length is the sum of its tests' recorded seconds, and a test with none recorded
(a new one) counts ``DEFAULT_S`` of its tier. Equal lengths keep the collection's order. The workers
take the next unit as they run dry, so no worker is left with a long file at the end while the others
have nothing to do.

``pytest --record-durations ...`` (``make test-durations``: `make test` with it) writes each test's
setup + call + teardown seconds into the file; tests that did not run keep their entry."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import tiers

DURATIONS = Path(__file__).with_name("durations.json")
# The estimate for a test with no recorded duration, by tier (a guess on the long side of each tier's
# typical test: an unknown test goes out early rather than last).
DEFAULT_S = {"fast": 1.0, "integration": 20.0, "e2e": 120.0}
SHARED_SCOPES = ("class", "module", "package")   # a fixture of these scopes ties a spread test to its file
_PLAN_DIR = pytest.StashKey[str]()


class QuietOnWorkers(pytest.UsageError):
    pass


@dataclass(frozen=True)
class Case:
    nodeid: str
    tier: str = "fast"
    quiet: bool = False
    spread: bool = False


@dataclass(frozen=True)
class Unit:
    key: str            # the file, or the test's id for a spread test
    nodeids: tuple[str, ...]
    seconds: float      # recorded, or estimated for tests with no record


def estimate(test: Case, recorded: dict[str, float]) -> float:
    seconds = recorded.get(test.nodeid)
    return DEFAULT_S[test.tier] if seconds is None else seconds


def plan(tests: list[Case], recorded: dict[str, float]) -> list[Unit]:
    """The work units of a run on workers, longest first; every test in exactly one unit, a file's tests
    in their order. Refuses a quiet test: it runs alone (phase 2), never beside another test."""
    quiet = [t.nodeid for t in tests if t.quiet]
    if quiet:
        raise QuietOnWorkers(f"{len(quiet)} quiet test(s) selected for a run on workers, e.g. {quiet[0]}: a quiet "
                             "test runs alone. Run -m 'not quiet' on workers, then -m quiet without -n "
                             "(make test does: tests/schedule.py)")
    groups: dict[str, list[Case]] = {}
    for t in tests:
        groups.setdefault(t.nodeid if t.spread else t.nodeid.split("::")[0], []).append(t)
    units = [Unit(key, tuple(t.nodeid for t in group), sum(estimate(t, recorded) for t in group))
             for key, group in groups.items()]
    return sorted(units, key=lambda u: -u.seconds)   # stable: equal lengths keep the collection's order


ABOUT = ("Each test's seconds (setup + call + teardown), as the last run with --record-durations measured them (an "
         "entry no such run has replaced may be an estimate); tests/schedule.py sends the longest work to `make test`'s "
         "workers first. Refresh: make test-durations, or pytest --record-durations with the tests you ran. A test "
         "missing here counts its tier's default (schedule.DEFAULT_S).")


def load(path: Path | None = None) -> dict[str, float]:
    path = path or DURATIONS
    return json.loads(path.read_text())["tests"] if path.exists() else {}


def save(measured: dict[str, float], path: Path | None = None, root: Path | None = None) -> dict[str, float]:
    """Merge ``measured`` into the file; entries of test files that no longer exist are dropped."""
    path = path or DURATIONS
    root = root or path.parent.parent
    merged = {k: v for k, v in load(path).items() if (root / k.split("::")[0]).exists()}
    merged.update({k: round(v, 2) for k, v in measured.items()})
    path.write_text(json.dumps({"about": ABOUT, "tests": dict(sorted(merged.items()))}, indent=1) + "\n")
    return merged


def _on_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true", default=False,
                     help="write each test's seconds into tests/durations.json (tests/schedule.py)")


def pytest_configure(config):
    config.addinivalue_line("markers", "spread: its tests share no fixture wider than a test, so the workers of "
                                       "`make test` may take them one by one (tests/schedule.py)")
    if config.getoption("record_durations") and not _on_worker(config):
        config.pluginmanager.register(_Recorder(config), "servelab-record-durations")


@pytest.hookimpl(trylast=True)   # after -m and -k deselect: only the tests that run
def pytest_collection_modifyitems(config, items):
    """On a worker: the items in the plan's order (every worker sorts alike: xdist compares their lists),
    and the plan written where the controller's scheduler reads its units."""
    folder = _on_worker(config) and config.workerinput.get("servelab_plan")
    if not folder:
        return   # one process, in file order; or workers under a --dist the caller chose
    try:
        units = plan([_case(item) for item in items], load())
    except pytest.UsageError as e:
        _write(folder, config, {"error": str(e)})   # the controller stops the run with it
        items.clear()
        return
    rank = {nodeid: i for i, nodeid in enumerate(n for u in units for n in u.nodeids)}
    items.sort(key=lambda item: rank[item.nodeid])
    _write(folder, config, {"units": {n: u.key for u in units for n in u.nodeids}})


def _case(item) -> Case:
    spread = item.get_closest_marker("spread") is not None
    info = getattr(item, "_fixtureinfo", None)
    shared = sorted(name for name, defs in (info.name2fixturedefs.items() if info else ())
                    if any(d.scope in SHARED_SCOPES for d in defs))
    if spread and shared:
        raise pytest.UsageError(f"{item.nodeid} is marked spread but uses {shared}, fixtures wider than a test: "
                                "its file's tests must stay together (tests/schedule.py)")
    return Case(item.nodeid, tiers.tier_of(item), item.get_closest_marker("quiet") is not None, spread)


def _write(folder: str, config, plan: dict) -> None:
    target = Path(folder) / f"{config.workerinput['workerid']}.json"
    target.with_suffix(".tmp").write_text(json.dumps(plan))
    target.with_suffix(".tmp").replace(target)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Controller: a folder where each worker leaves its plan (the controller collects no test), for the
    scheduler below; with another --dist, none (the workers then keep xdist's own order and rules)."""
    config = node.config
    if config.getvalue("dist") != "load":
        return
    if _PLAN_DIR not in config.stash:
        config.stash[_PLAN_DIR] = tempfile.mkdtemp(prefix="servelab-plan-")
    node.workerinput["servelab_plan"] = config.stash[_PLAN_DIR]


def pytest_unconfigure(config):
    if _PLAN_DIR in config.stash:
        shutil.rmtree(config.stash[_PLAN_DIR], ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """The workers' scheduler for `-n N` (xdist's default ``--dist load``): the plan's units, in its order."""
    if config.getvalue("dist") != "load":
        return None   # a --dist the caller chose
    from xdist.scheduler import LoadScopeScheduling

    class ByPlan(LoadScopeScheduling):
        unit_of: dict[str, str] = {}

        def schedule(self):
            if self.collection is None and self.collection_is_completed:
                node = next(iter(self.registered_collections))
                path = Path(config.stash[_PLAN_DIR]) / f"{node.gateway.id}.json"
                written = json.loads(path.read_text()) if path.exists() else {}
                if "error" in written:
                    pytest.exit(written["error"], returncode=pytest.ExitCode.USAGE_ERROR)
                self.unit_of = written.get("units", {})
                # the workers sent their items in the plan's order: keep it (xdist would sort by test count)
                config.option.loadscopereorder = False
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return self.unit_of.get(nodeid) or nodeid.split("::")[0]   # no plan for it: its file

    return ByPlan(config, log)


class _Recorder:
    """``--record-durations``: each test's seconds, from the reports (on workers, the controller gets them)."""

    def __init__(self, config):
        self.config = config
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session):
        if self.seconds:
            merged = save(self.seconds, root=self.config.rootpath)
            self.said = f"recorded the seconds of {len(self.seconds)} tests in {DURATIONS} ({len(merged)} in all)"

    def pytest_terminal_summary(self, terminalreporter):
        if getattr(self, "said", None):
            terminalreporter.write_line(self.said)
