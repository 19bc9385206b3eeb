"""Notebook sources (notebooks/src/*.md) and the committed .ipynb files stay in step;
the build is byte-stable; every code cell says where it runs; answer keys are collapsed."""

from __future__ import annotations

import argparse
import json
import re
import shutil

import nbformat
import pytest

from servelab.course import lessons, notebooks

from .nbkit import NOTEBOOKS_DIR

LAB = lessons.slugs()  # the one list: servelab/course/lessons.py
WHERE_BY_NOTEBOOK = {les.slug: les.place.label for les in lessons.LESSONS if les.place}
SETUP = lessons.slugs("node")  # made of host commands
MEASURED = lessons.slugs("container")  # measurement notebooks, with answer keys
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def _built(name):
    return nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4)


@pytest.fixture()
def copy(tmp_path):
    """A private copy of the sources and notebooks to tamper with."""
    src = tmp_path / "src"
    shutil.copytree(notebooks.SOURCE_DIR, src)
    for nb in NOTEBOOKS_DIR.glob("*.ipynb"):
        shutil.copy(nb, tmp_path / nb.name)
    return tmp_path


def test_the_lab_has_its_notebooks_in_order():
    assert [nb.name for nb in notebooks.notebooks()] == LAB
    assert sorted(p.stem for p in notebooks.SOURCE_DIR.glob("*.md")) == sorted(LAB)
    assert LAB[0] == "0_intro" and len(LAB) >= 8
    assert {"4_fastapi", "6_triton"} <= set(MEASURED) and {"3_fastapi_setup", "5_triton_setup"} <= set(SETUP)


def test_lesson_numbers_order_inserted_lessons_between_their_neighbours():
    assert sorted(["7", "6b", "10", "6", "6a", "0"], key=lessons.order_key) == ["0", "6", "6a", "6b", "7", "10"]
    with pytest.raises(ValueError):
        lessons.order_key("6-b")
    with pytest.raises(ValueError, match="slug"):
        lessons.Lesson("6b", "6_b_more", "container", "x")
    with pytest.raises(ValueError, match="runs"):
        lessons.Lesson("6b", "6b_more", "laptop", "x")


def test_a_source_missing_from_the_registry_is_an_error(copy):
    (copy / "src" / "6b_more.md").write_text((copy / "src" / "0_intro.md").read_text())
    with pytest.raises(ValueError, match="6b_more.md.*servelab/course/lessons.py"):
        notebooks.notebooks(copy / "src", copy)
    assert "not in servelab/course/lessons.py" in notebooks.check_sources(copy / "src", copy)[0]


def test_lesson_tables_in_readme_and_intro_come_from_the_registry(copy):
    assert [p for p in notebooks.check_sources(readme=notebooks.README) if "lesson table" in p] == []
    readme = notebooks.README.read_text()
    for les in lessons.LESSONS:
        assert f"| {les.number} | [{les.slug}](notebooks/{les.slug}.ipynb) | {les.title} | {les.where} |" in readme
    intro = copy / "src" / "0_intro.md"
    intro.write_text(intro.read_text().replace("| [4_fastapi](4_fastapi.ipynb)", "| [4_fastapi](4_old.ipynb)"))
    assert any("0_intro.md: lesson table differs" in p for p in notebooks.check_sources(copy / "src", copy))
    notebooks.build(copy / "src", copy, quiet=True)
    assert notebooks.check_sources(copy / "src", copy) == []


def test_committed_notebooks_match_their_sources():
    assert notebooks.check_sources() == []


def test_build_is_byte_stable_and_clean(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        out.mkdir()
        notebooks.build(notebooks.SOURCE_DIR, out, quiet=True)
    for nb in notebooks.notebooks():
        a = (first / nb.ipynb.name).read_bytes()
        assert a == (second / nb.ipynb.name).read_bytes()
        assert a == nb.ipynb.read_bytes(), f"{nb.ipynb.name} is not the build of its source"
        data = json.loads(a)
        ids = [c["id"] for c in data["cells"]]
        assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids)
        assert all(c.get("outputs", []) == [] and c.get("execution_count") is None
                   for c in data["cells"] if c["cell_type"] == "code")
        assert data["metadata"]["kernelspec"]["name"] == "python3"
        assert "jupytext" not in data["metadata"]
        nbformat.validate(nbformat.reads(a.decode(), as_version=4))
    # A second build writes nothing.
    assert notebooks.build(notebooks.SOURCE_DIR, first, quiet=True) == []


def test_the_student_edition_is_every_notebook_without_its_answer_keys(tmp_path):
    notebooks.build(notebooks.SOURCE_DIR, tmp_path, quiet=True)
    keys_seen = 0
    for nb in notebooks.notebooks():
        full = nbformat.read(nb.ipynb, as_version=4)
        student = nbformat.read(tmp_path / "student-edition" / nb.ipynb.name, as_version=4)
        nbformat.validate(student)
        keys = [c for c in full.cells if "answer-key" in c.metadata.get("tags", [])]
        keys_seen += len(keys)
        assert not any("answer-key" in c.metadata.get("tags", []) for c in student.cells)
        assert not any("Answer key:" in c.source for c in student.cells), nb.name
        assert [c.id for c in student.cells] == [c.id for c in full.cells if c not in keys]
        assert [c.source for c in student.cells] == [c.source for c in full.cells if c not in keys]
    assert keys_seen >= 15   # the keys of notebooks 4, 6, 6a and 6b, all left out


@pytest.mark.parametrize("tamper, expect", [
    (lambda nb: nb.cells[1].__setitem__("source", nb.cells[1].source + "\nedited in Jupyter"), "source differs"),
    (lambda nb: nb.cells.pop(), "cells"),
    (lambda nb: nb.cells[1].__setitem__("cell_type", "raw"), "type differs"),
])
def test_check_fails_when_a_notebook_drifts(copy, tamper, expect):
    target = copy / "2_create_server_nvidia.ipynb"
    nb = nbformat.read(target, as_version=4)
    tamper(nb)
    target.write_text(json.dumps(nb, indent=1))
    problems = notebooks.check_sources(copy / "src", copy)
    assert len(problems) == 1 and problems[0].startswith("2_create_server_nvidia.ipynb") and expect in problems[0]


def test_check_fails_on_changed_tags_outputs_strays_and_missing(copy):
    # Tags differ.
    target = copy / "6_triton.ipynb"
    nb = nbformat.read(target, as_version=4)
    tagged = next(c for c in nb.cells if c.metadata.get("tags"))
    tagged.metadata["tags"] = []
    nbformat.write(nb, target)
    # Outputs committed.
    target2 = copy / "4_fastapi.ipynb"
    nb2 = nbformat.read(target2, as_version=4)
    code = next(c for c in nb2.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\n")]
    code.execution_count = 3
    nbformat.write(nb2, target2)
    # A notebook without source, and a source without notebook.
    (copy / "9_extra.ipynb").write_text((copy / "0_intro.ipynb").read_text())
    (copy / "1_create_lease.ipynb").unlink()
    problems = "\n".join(notebooks.check_sources(copy / "src", copy))
    assert "6_triton.ipynb: differs" in problems and "tags differ" in problems
    assert "4_fastapi.ipynb: has outputs" in problems
    assert "9_extra.ipynb: no source" in problems
    assert "1_create_lease.ipynb: missing" in problems
    # Building repairs everything but the stray.
    notebooks.build(copy / "src", copy, quiet=True)
    assert [p for p in notebooks.check_sources(copy / "src", copy) if "9_extra" not in p] == []


def test_pull_brings_jupyter_edits_back_to_the_source(copy):
    target = copy / "4_fastapi.ipynb"
    nb = nbformat.read(target, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    cell.source += "\nprint('added in Jupyter')"
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="noise\n")]
    nbformat.write(nb, target)
    notebooks.pull("4_fastapi", copy / "src", copy)
    assert "print('added in Jupyter')" in (copy / "src" / "4_fastapi.md").read_text()
    notebooks.build(copy / "src", copy, quiet=True)
    assert notebooks.check_sources(copy / "src", copy) == []
    rebuilt = nbformat.read(target, as_version=4)
    assert notebooks.cell_summary(rebuilt)[:len(nb.cells)] == notebooks.cell_summary(nb)
    assert all(not c.get("outputs") for c in rebuilt.cells if c.cell_type == "code")


def test_unpulled_sources_are_untouched_by_pull(copy):
    before = {p.name: p.read_text() for p in (copy / "src").glob("*.md")}
    notebooks.pull("1_create_lease", copy / "src", copy)
    notebooks.build(copy / "src", copy, quiet=True)
    assert notebooks.check_sources(copy / "src", copy) == []
    after = {p.name: p.read_text() for p in (copy / "src").glob("*.md")}
    assert {k for k in before if before[k] != after[k]} <= {"1_create_lease.md"}


@pytest.mark.parametrize("name", LAB)
def test_every_code_cell_says_where_it_runs(name):
    nb = _built(name)
    expected = WHERE_BY_NOTEBOOK.get(name)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert notebooks.runs_label(cell.source) == expected, cell.source[:120]
        elif cell.cell_type == "markdown":
            for lang, body in FENCE.findall(cell.source):
                label = notebooks.runs_label(body)
                if name in SETUP and lang in ("bash", "sh", "shell"):
                    assert label == lessons.RUNS_NODE, body[:120]
                if label is not None and expected is not None and name not in SETUP:
                    assert label in lessons.RUNS_LABELS


@pytest.mark.parametrize("name", LAB)
def test_answer_keys_are_collapsed(name):
    nb = _built(name)
    keys = [c for c in nb.cells if "answer-key" in c.metadata.get("tags", [])]
    for cell in keys:
        assert cell.cell_type == "markdown"
        text = cell.source.strip()
        assert text.startswith("<details>") and text.endswith("</details>") and "<summary>" in text
    if name in MEASURED:
        assert len(keys) >= 2, "each measurement notebook carries answer keys"


def test_notebooks_link_each_other_in_order():
    intro = "\n".join(c.source for c in _built("0_intro").cells)
    positions = [intro.index(f"({name}.ipynb)") for name in LAB]
    assert positions == sorted(positions)


def test_cli_check_and_build(capsys):
    parser = argparse.ArgumentParser()
    notebooks.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["notebooks", "check"])
    assert args.func(args) == 0
    assert f"{len(LAB)} notebooks match" in capsys.readouterr().out
    args = parser.parse_args(["notebooks", "build"])
    assert args.func(args) == 0
    assert "up to date" in capsys.readouterr().out
    args = parser.parse_args(["notebooks", "pull", "no_such"])
    assert args.func(args) == 2
