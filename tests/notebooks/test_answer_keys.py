"""Every answer key's numbers come from one table (servelab/course/answer_keys.py):
a key cannot quote a figure the table does not hold, leave out one it
should quote, or keep a derived figure its formula no longer gives."""

from __future__ import annotations

import re
import shutil

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


# ---- the CPU reference run's figures: read from docs/reference/, never typed in ----

def _reference_copy(tmp_path):
    dest = tmp_path / "reference"
    shutil.copytree(answer_keys.REFERENCE_DIR, dest, ignore=shutil.ignore_patterns("tour"))
    return dest


def _edit_printed(reference, notebook, old, new):
    path = reference / f"{notebook}.ipynb"
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_the_keys_quote_what_the_committed_reference_printed():
    values = answer_keys.reference_values()
    assert set(values) == set(answer_keys.PRINTED) | set(answer_keys.DERIVED_FROM_REFERENCE)
    keys = "\n".join(text for _, _, text in CELLS)
    for name, text in values.items():
        assert answer_keys.FIGURES[name].value == float(text)
        assert re.search(rf"(?<![\d.]){re.escape(text)}(?![\d])", keys), name
    sources = "".join(item.source.read_text() for item in notebooks.notebooks())
    assert set(answer_keys.PLACEHOLDER.findall(sources)) == set(values)   # each figure quoted, none typed in


def test_a_new_reference_changes_the_key_and_the_committed_notebook_no_longer_matches(tmp_path):
    reference = _reference_copy(tmp_path)
    pt_rps = answer_keys.reference_values()["kit_pt_seq_rps"]
    _edit_printed(reference, "4_fastapi", f"throughput {pt_rps} requests/s", "throughput 123.4 requests/s")
    values = answer_keys.reference_values(reference)
    assert values["kit_pt_seq_rps"] == "123.4"
    item = next(i for i in notebooks.notebooks() if i.name == "4_fastapi")
    rebuilt = notebooks.render(notebooks.build_notebook(item.source, item.name, values))
    assert "| 123.4 requests/s |" in rebuilt and rebuilt != item.ipynb.read_text(encoding="utf-8")


def test_a_figure_from_an_inconclusive_or_failed_check_is_refused(tmp_path):
    reference = _reference_copy(tmp_path)
    _edit_printed(reference, "6_triton", "✔ as expected: on a CPU a batch of 16",
                  "? inconclusive: the machine was busy: on a CPU a batch of 16")
    with pytest.raises(ValueError, match="kit_py_c1_ips: .*inconclusive"):
        answer_keys.reference_values(reference)
    with pytest.raises(ValueError, match="no .*6_triton.ipynb"):
        (reference / "6_triton.ipynb").unlink()
        answer_keys.reference_values(reference)


def test_an_unknown_placeholder_is_an_error():
    with pytest.raises(ValueError, match="kit_nothing"):
        answer_keys.fill("| {{ref:kit_nothing}} ms |", {"kit_pt_seq_rps": "1.0"})
    assert answer_keys.fill("no placeholder", {}) == "no placeholder"


def test_pull_keeps_the_placeholders(tmp_path):
    src, out = tmp_path / "src", tmp_path
    shutil.copytree(notebooks.SOURCE_DIR, src)
    for item in notebooks.notebooks():
        shutil.copy(item.ipynb, out / item.ipynb.name)
    notebooks.pull("4_fastapi", source_dir=src, out_dir=out)
    pulled = (src / "4_fastapi.md").read_text()
    assert "{{ref:kit_pt_seq_rps}}" in pulled and "{{ref:kit_onnx_seq_p50_ms}}" in pulled
