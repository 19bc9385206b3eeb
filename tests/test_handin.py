"""servelab.course.handin packs the saved notebook and the measured figures for hand-in."""

from __future__ import annotations

import datetime as dt
import json
import zipfile

import numpy as np

from servelab.course import handin


def _notebook(path, outputs):
    cells = [{"cell_type": "code", "source": "1", "metadata": {}, "execution_count": None,
              "outputs": [{"output_type": "stream", "name": "stdout", "text": "x"}] * outputs}]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def test_save_packs_notebook_and_figures(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SERVELAB_RESULTS_DIR", str(tmp_path / "results"))
    _notebook(tmp_path / "6_triton.ipynb", outputs=2)
    figures = {"py_c1": {"throughput": np.float64(28.5), "server": {"queue_us": np.int64(30)}},
               "batches": np.array([1, 2])}
    archive = handin.save("6_triton", figures, notebook_dir=tmp_path,
                          now=dt.datetime(2026, 11, 23, 1, 2, 3, tzinfo=dt.timezone.utc))
    assert archive == tmp_path / "results" / "6_triton-20261123-010203.zip"
    with zipfile.ZipFile(archive) as z:
        names = sorted(z.namelist())
        assert names == ["6_triton-20261123-010203/6_triton.ipynb", "6_triton-20261123-010203/README.txt",
                         "6_triton-20261123-010203/figures.json"]
        saved = json.loads(z.read("6_triton-20261123-010203/figures.json"))
    assert saved == {"batches": [1, 2], "py_c1": {"server": {"queue_us": 30}, "throughput": 28.5}}
    out = capsys.readouterr().out
    assert "hand in:" in out and "2 cell output(s)" in out


def test_save_warns_when_the_notebook_was_not_saved(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SERVELAB_RESULTS_DIR", str(tmp_path / "results"))
    _notebook(tmp_path / "4_fastapi.ipynb", outputs=0)
    handin.save("4_fastapi", {}, notebook_dir=tmp_path)
    assert "no outputs yet: save the notebook" in capsys.readouterr().out
    handin.save("5_missing", {}, notebook_dir=tmp_path)
    assert "not found" in capsys.readouterr().out


def test_save_reads_the_notebook_where_servelab_notebook_dir_says(tmp_path, monkeypatch, capsys):
    """The reference run saves the executed notebook in a folder of its own before the hand-in cell
    (servelab.course.reference.run_notebook), as a student's Ctrl+S does; the cell reads it there."""
    monkeypatch.setenv("SERVELAB_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.chdir(tmp_path)
    _notebook(tmp_path / "6a_triton_pipeline.ipynb", outputs=0)   # the unexecuted copy beside the kernel
    saved = tmp_path / "saved"
    saved.mkdir()
    _notebook(saved / "6a_triton_pipeline.ipynb", outputs=3)
    monkeypatch.setenv("SERVELAB_NOTEBOOK_DIR", str(saved))
    handin.save("6a_triton_pipeline", {})
    out = capsys.readouterr().out
    assert "3 cell output(s)" in out and "no outputs yet" not in out


def test_save_says_how_to_fetch_the_zip_before_the_lease_ends(tmp_path, monkeypatch, capsys):
    """On the node (lease-end.txt in the kit's folder): the file-browser path, the node path, the copy cell
    of notebook 7 and the lease clock; locally, only the file-browser path."""
    from servelab.node import leaseclock

    kit = tmp_path / "serve-system-chi"
    monkeypatch.setenv("SERVELAB_RESULTS_DIR", str(kit / "results"))
    _notebook(tmp_path / "4_fastapi.ipynb", outputs=1)
    archive = handin.save("4_fastapi", {}, notebook_dir=tmp_path)
    lines = handin.where_to_fetch(archive, root=kit)
    assert lines == [f"download it now: in JupyterLab's file browser open results/, right-click {archive.name} > Download"]
    capsys.readouterr()

    end = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=25)
    (kit / leaseclock.LEASE_END_FILE).write_text(end.strftime(leaseclock.STAMP) + "\n")
    lines = handin.where_to_fetch(archive, root=kit)
    assert f"~/serve-system-chi/results/{archive.name}" in lines[1] and "Copy your work back" in lines[1]
    assert lines[2].lstrip().startswith("⚠ lease clock:")
    outside = handin.where_to_fetch(tmp_path / "elsewhere.zip", root=kit)
    assert outside == [f"download it now: {(tmp_path / 'elsewhere.zip').resolve()}"]


def test_collect_reads_a_class_of_zips_without_extracting_them(tmp_path, monkeypatch, capsys):
    """The instructor's side: one folder per student; checks and written answers per notebook; a broken
    zip, a zip without a notebook and a zip bomb are each listed with the reason, and nothing is unpacked."""
    from servelab.core import paths

    nb = json.loads((paths.REPO_ROOT / "notebooks" / "6_triton.ipynb").read_text())
    answers = [c for c in nb["cells"] if "answer" in c["metadata"].get("tags", [])]
    assert len(answers) == 5
    answers[0]["source"] = "Queue 260 ms, compute 40 ms: the requests waited."
    answers[3]["source"] = "Two copies overlapped."
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout",
                        "text": "✔ as expected: a\n✔ as expected: b\n? inconclusive: the machine was busy: c\n"}]
    work = tmp_path / "work"
    work.mkdir()
    (work / "6_triton.ipynb").write_text(json.dumps(nb))
    monkeypatch.setenv("SERVELAB_RESULTS_DIR", str(tmp_path / "class" / "alice"))
    handin.save("6_triton", {}, notebook_dir=work, now=dt.datetime(2026, 11, 28, 9, 0, 0, tzinfo=dt.timezone.utc))
    (tmp_path / "class" / "bob").mkdir()
    (tmp_path / "class" / "bob" / "broken.zip").write_bytes(b"PK\x03\x04 not a zip")
    with zipfile.ZipFile(tmp_path / "class" / "bob" / "empty.zip", "w") as z:
        z.writestr("x/README.txt", "nothing")
    with zipfile.ZipFile(tmp_path / "class" / "bob" / "bomb.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x/6_triton.ipynb", b"\0" * (handin.MAX_MEMBER_BYTES + 1))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    rows = handin.collect(tmp_path / "class")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before   # nothing extracted
    good = [r for r in rows if "error" not in r]
    assert len(good) == 1 and good[0]["zip"].startswith("alice/6_triton-20261128-090000")
    assert good[0]["checks"] == {"passed": 2, "failed": 0, "inconclusive": 1}
    assert good[0]["answers"] == 5 and good[0]["written"] == ["Queue 260 ms, compute 40 ms: the requests waited.",
                                                               "Two copies overlapped."]
    assert good[0]["saved"].startswith("6_triton, saved 2026-11-28T09:00:00")
    errors = {r["zip"]: r["error"] for r in rows if "error" in r}
    assert set(errors) == {"bob/broken.zip", "bob/empty.zip", "bob/bomb.zip"}
    assert "BadZipFile" in errors["bob/broken.zip"] and "no notebook" in errors["bob/empty.zip"]
    assert "more than" in errors["bob/bomb.zip"]
    page = handin.report(rows)
    assert "| 2 / 0 / 1 | 2 of 5 |" in page and "1. Queue 260 ms" in page and "2. Two copies overlapped." in page
    capsys.readouterr()
    assert handin.main(["collect", str(tmp_path / "class"), "--out", str(tmp_path / "grading.md")]) == 0
    assert (tmp_path / "grading.md").read_text() == page == capsys.readouterr().out
