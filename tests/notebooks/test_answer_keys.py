"""Every answer key's numbers come from one table (servelab/course/answer_keys.py):
a key cannot quote a figure the table does not hold, leave out one it
should quote, or keep a derived figure its formula no longer gives."""

from __future__ import annotations

import re

import pytest

from servelab.course import answer_keys, notebooks


def _answer_key_cells():
    cells = []
    for item in notebooks.notebooks():
        nb = notebooks.build_notebook(item.source, item.name)
        for cell in nb.cells:
            if cell.cell_type == "markdown" and "answer-key" in cell.metadata.get("tags", []):
                m = re.search(r"<summary>(.*?)</summary>", cell.source, re.S)
                assert m, f"{item.name}: an answer-key cell without a <summary>"
                cells.append((item.name, m.group(1).strip(), cell.source))
    return cells


CELLS = _answer_key_cells()


def test_the_measurement_notebooks_have_answer_keys():
    names = {nb for nb, _, _ in CELLS}
    assert {"4_fastapi", "6_triton"} <= names


@pytest.mark.parametrize("notebook,summary,text", CELLS, ids=[f"{n}:{s}" for n, s, _ in CELLS])
def test_every_number_in_a_key_is_in_the_table(notebook, summary, text):
    key = answer_keys.key_for(notebook, summary)
    assert key is not None, f"{notebook}: answer key {summary!r} has no entry in servelab/course/answer_keys.py"
    assert answer_keys.problems(key, text) == []


def test_every_table_entry_has_its_key():
    present = {(nb, answer_keys.key_for(nb, s)) for nb, s, _ in CELLS}
    for key in answer_keys.KEYS:
        assert (key.notebook, key) in present, f"no answer-key cell for {key.notebook} / {key.summary}"


def test_derived_figures_follow_from_their_formulas():
    assert answer_keys.formula_problems() == []


def test_every_figure_is_cited_and_sourced():
    cited = {name for key in answer_keys.KEYS + answer_keys.PASSAGES for name in key.figures}
    assert cited == set(answer_keys.FIGURES), set(answer_keys.FIGURES) ^ cited
    for fig in answer_keys.FIGURES.values():
        src = answer_keys.SOURCES[fig.source]
        assert src.lab and src.hardware and src.where and src.code


def test_the_check_catches_drift():
    """The checker itself: a changed, a missing and an unregistered number are all reported."""
    key = next(k for k in answer_keys.KEYS if k.summary == "instance groups")
    notebook, summary, text = next(c for c in CELLS if c[1].startswith("Answer key: instance groups"))
    assert answer_keys.problems(key, text) == []
    assert any("192.9" in p for p in answer_keys.problems(key, text.replace("192.8", "192.9")))
    assert any("py_i4_latency_ms" in p for p in answer_keys.problems(key, text.replace("67.6 ms", "slow")))
    assert answer_keys.problems(key, text + "\nAbout 333 infer/s on a P100.")
    # Numbers inside names and versions are not quotes.
    assert answer_keys.numbers_in("Tesla P100, sm_60, Triton 2.51.0, food11, 1,182 and 13×") == [1182, 13]


def test_old_figures_the_issue_corrected_are_gone():
    text = "\n".join(t for _, _, t in CELLS)
    assert "worse than 2 per GPU" not in text
    assert "published no dynamic-batching figures" not in text
    assert "PyTorch, 16 clients" not in text
    assert "656.6" in text and "artifact" in text
