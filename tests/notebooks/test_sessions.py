"""The course plan (issue 52, item 1): every lesson belongs to a session whose minutes fit its limit,
the core's minutes are 0_intro's budget table, and each notebook's header says its session."""

from __future__ import annotations

import re

import pytest

from servelab.course import lessons, notebooks


def test_every_lesson_is_in_a_session_that_fits_its_limit():
    for les in lessons.LESSONS:
        assert les.session in lessons.SESSIONS
        assert les.minutes > 0 or les.slug == "0_intro", les.slug   # only the reading-ahead is off the clock
    for key, session in lessons.SESSIONS.items():
        assert lessons.session_minutes(key) <= session.limit, key
        assert any(les.session == key and les.minutes for les in lessons.LESSONS), key
    assert lessons.SESSIONS["core"].limit <= 180 and all(s.limit <= 180 for s in lessons.SESSIONS.values())


def test_the_core_minutes_are_0_intros_budget_table():
    text = (notebooks.SOURCE_DIR / "0_intro.md").read_text()
    total = int(re.search(r"^\| \*\*total\*\* \| \| \*\*(\d+)\*\*", text, re.M).group(1))
    assert lessons.session_minutes("core") == total


def test_minutes_need_a_source_and_a_session_must_exist():
    with pytest.raises(ValueError, match="source"):
        lessons.Lesson("9", "9_x", None, "t", minutes=5, source="a guess")
    with pytest.raises(ValueError, match="session"):
        lessons.Lesson("9", "9_x", None, "t", session="nowhere")


def test_each_notebook_and_the_tables_show_the_session_and_minutes():
    for item in notebooks.notebooks():
        first = notebooks.build_notebook(item.source, item.name).cells[0].source
        les = lessons.BY_SLUG[item.name]
        assert lessons.SESSIONS[les.session].title in first.splitlines()[2], item.name
        assert les.slug == "0_intro" or f"about {les.minutes} minutes" in first
    for path in (notebooks.README, notebooks.SOURCE_DIR / "0_intro.md"):
        text = path.read_text()
        assert lessons.session_table() in text and lessons.extension_sources() in text, path


def test_the_budgets_cite_the_nodes_measured_minutes_when_a_run_is_committed(tmp_path):
    """docs/reference-node/manifest.json (python3 -m servelab.node.reference): each notebook's minutes,
    cited "measured on <label>, <date>"; none committed, nothing changes."""
    import json

    assert lessons.measured_minutes(tmp_path) == {} and lessons.measured_table(tmp_path) == ""
    (tmp_path / "manifest.json").write_text(json.dumps({
        "label": "P100", "date": "2026-12-01T10:00:00+00:00", "errors": {"6b_model_analyzer": "TimeoutError"},
        "minutes": {"6_triton": 14.25, "4_fastapi": 6.5, "6b_model_analyzer": 1.0, "not_a_lesson": 3}}))
    assert lessons.measured_minutes(tmp_path) == {"4_fastapi": (6.5, "measured on P100, 2026-12-01"),
                                                  "6_triton": (14.25, "measured on P100, 2026-12-01")}
    table = lessons.measured_table(tmp_path).splitlines()
    assert table[0] == "| notebook | minutes budgeted | minutes run headless | source |"
    assert table[2].startswith("| 4_fastapi | 20 | 6.5 | measured on P100, 2026-12-01 (docs/reference-node/")
    assert table[3].startswith("| 6_triton | 45 | 14.25 | measured on P100, 2026-12-01")
    assert len(table) == 4    # a notebook that stopped on an error is not cited
