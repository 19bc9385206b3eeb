"""The notebook tests' readers of what a notebook printed (tests/notebooks/nbkit.py and
test_measurement_notebooks.py's ``_checks``), and the session summary of how many lesson checks
were judged (tests/conftest.py), tried on the committed reference run and on made-up output:
the notebook executions themselves are long (tests/notebooks/test_measurement_notebooks.py)."""

from __future__ import annotations

import types

import nbformat

from servelab.course import lab
from tests import conftest

from .nbkit import REPO_ROOT, cell_output, printed_statuses
from .test_measurement_notebooks import _checks

REFERENCE_4 = REPO_ROOT / "docs" / "reference" / "4_fastapi.ipynb"


def test_the_reference_run_refused_the_bad_request_with_400():
    """The committed reference run (what the site shows) printed the good request's 200 and the bad
    one's 400, in the cell that sends them."""
    nb = nbformat.read(REFERENCE_4, as_version=4)
    assert printed_statuses(cell_output(nb, "bad = requests.post(")) == [200, 400]


def test_printed_statuses_reads_status_lines_only():
    out = ("200 {'prediction': 'Rice'}\n"
           "p99 400 ms at 1400 requests\n"      # figures that hold "400" are not a status
           "422 {'detail': [{'msg': 'Field required'}]}\n"
           "    measured: 200 and 400\n")
    assert printed_statuses(out) == [200, 422]


def test_checks_tells_judged_from_inconclusive():
    text = "\n".join([
        f"{lab.CHECK_PASS}: a", "    measured: 1",
        f"{lab.CHECK_INCONCLUSIVE}: b", "    measured: 2", "    not evidence: load",
        f"{lab.CHECK_FAIL}: c", "    measured: 3",
        f"{lab.CHECK_PASS}: d",
    ])
    assert _checks(text) == (["a", "d"], ["b"], ["c | measured: 3"])


def test_the_session_summary_counts_judged_and_inconclusive_checks():
    def report(nodeid, when, *entries):
        return types.SimpleNamespace(nodeid=nodeid, when=when, user_properties=[("lesson_checks", e) for e in entries])

    lines = []
    reporter = types.SimpleNamespace(
        stats={"passed": [report("t.py::nb4", "call", {"judged": 9})],   # only the teardown report counts
               "": [report("t.py::nb4", "teardown", {"judged": 7, "passed": 7, "failed": 0, "inconclusive": 0}),
                    report("t.py::nb6", "teardown", {"first_try_missed": 1},
                           {"judged": 17, "passed": 17, "failed": 0, "inconclusive": 2})]},
        write_sep=lambda sep, title: lines.append(title), write_line=lines.append)
    conftest.pytest_terminal_summary(reporter)
    assert lines == [
        "lesson checks: 24 judged, 2 inconclusive (a busy machine spoiled their runs: not evidence)",
        "t.py::nb4: 7 judged (7 passed, 0 failed), 0 inconclusive",
        "t.py::nb6: 17 judged (17 passed, 0 failed), 2 inconclusive; the first try missed 1, so the notebook ran again",
    ]
    quiet = []
    conftest.pytest_terminal_summary(types.SimpleNamespace(stats={"passed": []}, write_sep=quiet.append,
                                                           write_line=quiet.append))
    assert quiet == []   # a session without notebook checks says nothing
