"""Every sentence about the earlier lab names where it comes from.

A sentence (or table row, or comment) that speaks of the earlier lab, in the
notebooks, README, CONTRIBUTING and docs, the Docker files, the lesson files
and servelab's code, must cite one of the earlier lab's published files that
the kit records (``answer_keys.EARLIER_LAB_FILES``), and every number in it
must be one of the figures the kit read from those files (``answer_keys.FIGURES``,
or derived only from them) or one of that lab's settings. Paragraphs outside
the answer keys that quote another system's figures (``answer_keys.PASSAGES``)
quote exactly their registered figures. The kit's record is the data: these
tests need neither the earlier lab's repository nor anything outside the kit.
"""

from __future__ import annotations

import pytest

from servelab.bench import batchcost
from servelab.course import answer_keys, notebooks

from .nbkit import REPO_ROOT

# Files whose prose a student or a maintainer reads, besides the notebooks.
TEXT_GLOBS = ("README.md", "CONTRIBUTING.md", "docs/*.md", "docker/*", "fastapi_*/*.py", "flask_app/*.py",
              "models_staging/*/1/*.py", "models_staging/*/config.pbtxt", "servelab/**/*.py", "Makefile")
SKIP = {"servelab/course/answer_keys.py"}  # the record itself: its sources describe the earlier lab


def _notebook_texts() -> list[tuple[str, str]]:
    out = []
    for item in notebooks.notebooks():
        nb = notebooks.build_notebook(item.source, item.name)
        for i, cell in enumerate(nb.cells):
            out.append((f"{item.name} cell {i}", cell.source))
    return out


def _file_texts() -> list[tuple[str, str]]:
    out = []
    for pattern in TEXT_GLOBS:
        for path in sorted(REPO_ROOT.glob(pattern)):
            rel = path.relative_to(REPO_ROOT).as_posix()
            if path.is_file() and rel not in SKIP:
                out.append((rel, path.read_text(errors="replace")))
    return out


TEXTS = _notebook_texts() + _file_texts()


def test_the_texts_are_read():
    names = {w for w, _ in TEXTS}
    assert any(w.startswith("6_triton cell") for w in names) and "README.md" in names
    assert "fastapi_pt/app.py" in names and "servelab/serve/harden.py" in names


def test_every_sentence_about_the_earlier_lab_is_sourced():
    problems = [p for where, text in TEXTS for p in answer_keys.provenance_problems(where, text)]
    assert problems == [], "\n".join(problems)


def test_a_planted_unsourced_claim_fails():
    where, text = next((w, t) for w, t in TEXTS if "Answer key: dynamic batching on the Python model" in t)
    assert answer_keys.provenance_problems(where, text) == []
    # no source file named
    planted = text + "\n\nThe earlier lab ran a request-rate sweep on a P100.\n"
    assert any("without its source file" in p for p in answer_keys.provenance_problems(where, planted))
    # a source named, but a number the record does not hold
    planted = text + "\n\nThe earlier lab (`workspace/triton.ipynb`) served 300 requests/s.\n"
    assert any("300 is attributed" in p for p in answer_keys.provenance_problems(where, planted))
    # a source named that is not one of the earlier lab's recorded files
    planted = text + "\n\nThe earlier lab (`workspace/sweep.ipynb`) served 78.6 infer/s.\n"
    assert any("without its source file" in p for p in answer_keys.provenance_problems(where, planted))
    # sourced and recorded: passes
    sourced = text + "\n\nThe earlier lab (`workspace/triton.ipynb`) served 78.6 infer/s.\n"
    assert answer_keys.provenance_problems(where, sourced) == []


def test_earlier_lab_sources_name_recorded_files():
    for name, src in answer_keys.SOURCES.items():
        assert set(src.files) <= set(answer_keys.EARLIER_LAB_FILES), name
        assert bool(src.files) == (src.lab == answer_keys.EARLIER_LAB), name
        assert "shared/" not in src.where, f"{name}: a source outside the kit"
    assert "workspace/fastapi.ipynb" in answer_keys.SOURCES["earlier-fastapi"].where


PASSAGES = answer_keys.PASSAGES


@pytest.mark.parametrize("key", PASSAGES, ids=[f"{k.notebook}:{k.summary[:30]}" for k in PASSAGES])
def test_passages_quote_their_registered_figures(key):
    item = next(i for i in notebooks.notebooks() if i.name == key.notebook)
    text = "\n\n".join(c.source for c in notebooks.build_notebook(item.source, item.name).cells
                       if c.cell_type == "markdown")
    para = answer_keys.paragraph(text, key.summary)
    assert para is not None, f"{key.notebook}: no paragraph starts with {key.summary!r}"
    assert answer_keys.problems(key, para) == []


def test_the_gpu_figures_are_the_kits_record():
    """The H100 figures the notebook quotes are batchcost.GPU_REFERENCE_MS, rounded."""
    assert answer_keys.FIGURES["h100_b1_ms"].value == round(batchcost.GPU_REFERENCE_MS[1], 1)
    assert answer_keys.FIGURES["h100_b16_ms"].value == round(batchcost.GPU_REFERENCE_MS[16], 1)
    assert "GPU_REFERENCE_MS" in answer_keys.SOURCES["kit-gpu-batchcost"].where
