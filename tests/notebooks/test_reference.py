"""The committed reference run (docs/reference/, `make reference`): it matches the
notebook sources it was run from, it is labelled and small, the site shows it on
a fresh clone without running anything, GPU figures sit beside it, and the Pages
workflow publishes what `make site` builds."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from servelab.core import paths
from servelab.course import notebooks, reference, site

COMMITTED = reference.COMMITTED_DIR
BUDGET_BYTES = 3 * 1024 * 1024  # the whole committed reference: small enough to keep in git


def _outputs(nb) -> list[dict]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def _pngs(nb) -> list[bytes]:
    return [base64.b64decode(o["data"]["image/png"]) for o in _outputs(nb) if "image/png" in o.get("data", {})]


# --------------------------------------------------------------------------
# Staleness: by the source hashes the manifest recorded


def test_committed_reference_was_run_from_todays_notebook_sources():
    problems = reference.stale(COMMITTED)
    assert problems == [], ("the committed reference run is stale; regenerate it with `make reference` "
                            "and commit docs/reference/:\n" + "\n".join(problems))


def test_an_edited_source_makes_the_reference_stale_until_it_is_regenerated(tmp_path):
    sources = tmp_path / "src"
    shutil.copytree(notebooks.SOURCE_DIR, sources)
    ref = tmp_path / "reference"
    shutil.copytree(COMMITTED, ref)
    manifest = json.loads((ref / reference.MANIFEST).read_text())
    manifest["sources"] = reference.source_hashes(sources)   # what `reference build` records
    (ref / reference.MANIFEST).write_text(json.dumps(manifest))
    assert reference.stale(ref, sources) == []

    src = sources / "6_triton.md"
    src.write_text(src.read_text() + "\nOne more sentence for the learner.\n")
    problems = reference.stale(ref, sources)
    assert len(problems) == 1 and problems[0].startswith("6_triton.md changed since the reference was run")

    manifest["sources"] = reference.source_hashes(sources)   # regenerated from the edited source
    (ref / reference.MANIFEST).write_text(json.dumps(manifest))
    assert reference.stale(ref, sources) == []

    (ref / "4_fastapi.ipynb").unlink()
    assert reference.stale(ref, sources) == [f"4_fastapi.ipynb missing from {ref}"]
    assert reference.stale(tmp_path / "none", sources)[0].startswith("no manifest.json")


def test_check_command_exits_1_on_a_stale_reference(tmp_path, capsys):
    import argparse

    ref = tmp_path / "reference"
    shutil.copytree(COMMITTED, ref)
    manifest = json.loads((ref / reference.MANIFEST).read_text())
    manifest["sources"]["4_fastapi.md"] = "0" * 64
    (ref / reference.MANIFEST).write_text(json.dumps(manifest))
    parser = argparse.ArgumentParser()
    reference.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["reference", "check", "--dir", str(ref)])
    assert args.func(args) == 1
    err = capsys.readouterr().err
    assert "4_fastapi.md changed since the reference was run" in err and "make reference" in err


# --------------------------------------------------------------------------
# What is committed: labelled, with outputs and plots, small


def test_committed_reference_is_labelled_complete_and_small():
    import nbformat

    manifest = reference.read_manifest(COMMITTED)
    assert manifest is not None
    assert manifest["note"] == "CPU reference: your numbers will differ"
    assert manifest["machine"] and re.match(r"\d{4}-\d\d-\d\dT", manifest["date"])
    assert re.match(r"[0-9a-f]{12}", manifest["commit"]), manifest["commit"]
    assert manifest["scale"] in reference.SCALES
    for name in reference.NOTEBOOKS:
        nb = nbformat.read(COMMITTED / f"{name}.ipynb", as_version=4)
        label = nb.metadata["servelab_reference"]
        assert {label[k] for k in ("machine", "date", "commit")} == {manifest[k] for k in ("machine", "date", "commit")}
        assert manifest["checks"][name]["failed"] == 0 and manifest["checks"][name]["passed"] > 0
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.get("outputs") for c in code[:3]), f"{name}: its first cells have no outputs"
        for out in _outputs(nb):       # trimmed: plain text and PNG only, no stream past the limit
            assert set(out.get("data", {})) <= set(reference.KEPT_MIME)
            assert len(out.get("text", "").splitlines()) <= reference.MAX_LINES + 1
        pngs = _pngs(nb)
        # the plots each lesson draws (6a prints tables and draws none)
        assert len(pngs) >= {"4_fastapi": 3, "6_triton": 4, "6a_triton_pipeline": 0, "6e_accelerate": 0,
                             "6f_token_streaming": 0}[name], f"{name}: {len(pngs)} plots"
        # the tables a lesson displays (display(Markdown(...))) are kept as tables, not as their object's repr
        tables = [out["data"]["text/markdown"] for out in _outputs(nb) if "text/markdown" in out.get("data", {})]
        if name in ("6e_accelerate", "6f_token_streaming"):
            assert tables and all(t.lstrip().startswith("|") for t in tables), name
        assert not any("<IPython.core.display.Markdown object>" in out.get("data", {}).get("text/plain", "")
                       for out in _outputs(nb)), name
        assert all(p[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
        # the built notebook's cells, in order: the run is of this lesson
        built = notebooks.build_notebook(notebooks.SOURCE_DIR / f"{name}.md", name)
        assert [c.source for c in nb.cells] == [c.source for c in built.cells]
    tour = COMMITTED / "tour"
    assert (tour / "report.md").is_file() and sorted(p.name for p in tour.glob("*.png")) == manifest["tour"]["plots"]
    assert manifest["tour"]["plots"]
    size = reference.size_bytes(COMMITTED)
    assert size < BUDGET_BYTES, f"docs/reference/ is {size / 1024:.0f} KiB"


def test_committed_reference_is_tracked_not_ignored():
    if not (paths.REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout (a kit archive ships docs/reference/ as files)")
    ignored = subprocess.run(["git", "-C", str(paths.REPO_ROOT), "check-ignore", "docs/reference/manifest.json",
                              "docs/reference/6_triton.ipynb", "docs/reference/tour/report.md"],
                             capture_output=True, text=True)
    assert ignored.returncode == 1 and ignored.stdout == "", f"git-ignored: {ignored.stdout} (the site is built from it)"


def test_trim_keeps_plots_and_cuts_long_output():
    import matplotlib
    import nbformat

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([1, 2, 4, 8], [10, 12, 20, 45], marker="o")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    cell = nbformat.v4.new_code_cell("# runs inside the Jupyter container\nprint('x')")
    cell.metadata["execution"] = {"iopub.execute_input": "2026-01-01T00:00:00"}
    long = "".join(f"line {i}\n" for i in range(500))
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text=long),
        nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(buf.getvalue()).decode(),
                                                     "text/plain": "<Figure>", "text/html": "<b>x</b>"}),
    ]
    nb = reference.trim(nbformat.v4.new_notebook(cells=[cell]))
    text = nb.cells[0].outputs[0]["text"]
    assert text.startswith("line 0\n") and text.endswith("line 499\n") and "[425 lines trimmed" in text
    assert len(text.splitlines()) == reference.HEAD_LINES + reference.TAIL_LINES + 1
    data = nb.cells[0].outputs[1]["data"]
    assert set(data) == {"image/png", "text/plain"}
    png = base64.b64decode(data["image/png"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) <= len(buf.getvalue())
    assert "execution" not in nb.cells[0].metadata


# --------------------------------------------------------------------------
# The site on a fresh clone: built from the committed reference, nothing run


@pytest.fixture(scope="module")
def committed_site(tmp_path_factory):
    out = tmp_path_factory.mktemp("committed") / "site"
    ref, why = site.default_reference_dir()
    assert ref == COMMITTED, why
    pages = site.build_site(out, reference_dir=ref)
    return out, pages


def test_site_pages_show_the_committed_outputs_plots_and_label(committed_site):
    out, pages = committed_site
    manifest = reference.read_manifest(COMMITTED)
    names = [p.name for p in pages]
    for name in reference.NOTEBOOKS:
        assert f"{name}-reference" in names
        page = (out / f"{name}-reference.html").read_text()
        assert page.count(f"<strong>{reference.NOTE}.</strong> A reference run.") == 2
        assert f"Kit commit: <code>{manifest['commit']}</code>" in page and "Machine: " in page
        assert page.count('<pre class="output">') >= 5
        imgs = re.findall(r'<img src="(img/[^"]+)"', page)
        assert len(imgs) == len(_pngs(__import__("nbformat").read(COMMITTED / f"{name}.ipynb", as_version=4)))
        assert all((out / i).read_bytes()[:4] == b"\x89PNG" for i in imgs)
        assert f'href="{name}-reference.html"' in (out / f"{name}.html").read_text()
    tour = (out / "tour-reference.html").read_text()
    assert reference.NOTE in tour
    tour_imgs = re.findall(r'<img src="([^"]+)"', tour)
    assert sorted(Path(i).name for i in tour_imgs) == sorted(manifest["tour"]["plots"])
    assert all((out / i).is_file() for i in tour_imgs)
    index = (out / "index.html").read_text()
    assert 'href="tour-reference.html"' in index and 'href="6_triton-reference.html"' in index


def test_committed_reference_wins_over_a_local_test_run(tmp_path, monkeypatch):
    """Both exist: the committed run is the published one, so it is the default; a local
    preview of build/reference/ needs --reference."""
    local = tmp_path / "build-reference"
    local.mkdir()
    shutil.copy(COMMITTED / "6_triton.ipynb", local / "6_triton.ipynb")
    monkeypatch.setattr(site, "REFERENCE_DIR", local)
    assert site.default_reference_dir()[0] == COMMITTED
    monkeypatch.setattr(site, "COMMITTED_REFERENCE", tmp_path / "no-committed")
    assert site.default_reference_dir()[0] == local


def test_site_cli_says_which_reference_it_used(tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    site.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["site", "--out", str(tmp_path / "s")])
    assert args.func(args) == 0
    said = capsys.readouterr().out
    assert f"from {COMMITTED}: the committed reference run, the published one" in said
    assert reference.NOTE in said and "tour-reference" in said


# --------------------------------------------------------------------------
# GPU figures beside the CPU ones (docs/gpu-reference.md)

GPU_DOC = """# GPU reference

Run on a gpu_p100 node.

| notebook | figure | value | source |
|---|---|---|---|
| 6_triton | Python backend, 1 client | 123.4 infer/s | results/p100/6_triton.zip |
| `4` | ONNX, 16 clients | 987.6 requests/s | results/p100/4_fastapi.zip |

| other | table |
|---|---|
| not | figures |
"""


def test_gpu_figures_table_is_read():
    columns, rows = site.gpu_figures(GPU_DOC)
    assert columns == ["notebook", "figure", "value", "source"]
    assert [r["figure"] for r in rows] == ["Python backend, 1 client", "ONNX, 16 clients"]


def test_gpu_figures_appear_beside_the_cpu_reference(tmp_path):
    doc = tmp_path / "gpu-reference.md"
    doc.write_text(GPU_DOC)
    out = tmp_path / "site"
    pages = site.build_site(out, reference_dir=COMMITTED, gpu_reference=doc)
    assert "gpu-reference" in [p.name for p in pages]
    six = (out / "6_triton-reference.html").read_text()
    four = (out / "4_fastapi-reference.html").read_text()
    assert '<div class="gpu-figures">' in six and "123.4 infer/s" in six and "987.6 requests/s" not in six
    assert "987.6 requests/s" in four and "123.4 infer/s" not in four
    assert six.index("123.4 infer/s") < six.index('<pre class="output">')   # at the top, before the CPU outputs
    gpu_page = (out / "gpu-reference.html").read_text()
    assert "gpu_p100" in gpu_page and 'href="gpu-reference.html"' in (out / "index.html").read_text()


@pytest.mark.parametrize("text", [None, "# GPU reference\n\nNo run yet: figures come after the P100 session.\n"])
def test_no_gpu_figures_yet_is_said_plainly(tmp_path, text):
    doc = tmp_path / "gpu-reference.md"
    if text is not None:
        doc.write_text(text)
    out = tmp_path / "site"
    site.build_site(out, reference_dir=COMMITTED, gpu_reference=doc)
    six = (out / "6_triton-reference.html").read_text()
    if text is None:
        assert "No GPU reference run is published yet" in six and not (out / "gpu-reference.html").exists()
    else:
        assert "No GPU reference figures for this notebook yet" in six
        assert "No figures table yet" in (out / "gpu-reference.html").read_text()


# --------------------------------------------------------------------------
# Publishing: the Pages workflow runs `make site` and uploads build/site/


def test_pages_workflow_builds_with_make_site_and_publishes_build_site():
    import yaml

    wf = yaml.safe_load((paths.REPO_ROOT / ".github" / "workflows" / "pages.yml").read_text())
    triggers = wf.get("on", wf.get(True))            # YAML 1.1 reads a bare `on` as true
    assert "push" in triggers
    assert wf["permissions"]["pages"] == "write" and wf["permissions"]["id-token"] == "write"
    steps = {name: job["steps"] for name, job in wf["jobs"].items()}
    build = next(name for name, s in steps.items() if any(st.get("run", "").strip() == "make site" for st in s))
    runs = [st.get("run", "").strip() for st in steps[build]]
    uses = [st.get("uses", "") for st in steps[build]]
    upload = next(st for st in steps[build] if st.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"].rstrip("/") == "build/site"
    assert uses.index(upload["uses"]) > runs.index("make site")            # uploads what make site built
    assert uses[0].startswith("actions/checkout@")
    deploy = next(name for name, s in steps.items() if any(st.get("uses", "").startswith("actions/deploy-pages@")
                                                           for st in s))
    assert build in ([wf["jobs"][deploy]["needs"]] if isinstance(wf["jobs"][deploy]["needs"], str)
                     else wf["jobs"][deploy]["needs"])
    assert wf["jobs"][deploy]["environment"]["name"] == "github-pages"
    # and `make site` builds into build/site/ from the committed reference
    make = (paths.REPO_ROOT / "Makefile").read_text()
    assert re.search(r"^site: .*\n\t\$\(PY\) -m servelab site\n", make, re.M)
    assert site.DEFAULT_OUT == paths.BUILD_DIR / "site"


def test_failed_checks_carry_what_was_measured():
    """A failed check reported from elsewhere (the compose check's summary, all CI shows) says what
    was measured, not only what the lesson expected."""
    import nbformat

    from servelab.course import lab

    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=(
        f"{lab.CHECK_FAIL}: no request fails\n    measured: 3 failed of 90\n"
        f"{lab.CHECK_PASS}: it answers\n    measured: 200\n{lab.CHECK_FAIL}: a bare one\n"))]
    nb = nbformat.v4.new_notebook(cells=[cell])
    assert reference.failed_checks(nb) == ["no request fails (measured: 3 failed of 90)", "a bare one"]


# --------------------------------------------------------------------------
# The node's reference run (docs/reference-node/, python3 -m servelab.node.reference) beside the CPU one


def _node_bundle(tmp_path: Path, names=("6_triton", "6f_token_streaming")) -> Path:
    """A tiny bundle, written by the node command's own writer from fake executed notebooks."""
    import nbformat

    from servelab.node import reference as node_reference

    summaries = []
    for name in names:
        handoff = tmp_path / "handoff" / name
        handoff.mkdir(parents=True)
        cell = nbformat.v4.new_code_cell("# runs inside the Jupyter container\nprint(1)",
                                         outputs=[nbformat.v4.new_output("stream", text="P100 says 1182 infer/s\n")])
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {name}"), cell]),
                       handoff / f"{name}.trimmed.ipynb")
        summaries.append({"notebook": name, "seconds": 600, "wall_s": 660, "handoff": str(handoff), "error": None,
                          "checks": {"passed": 5, "inconclusive": 0, "failed": 0}, "settings": {},
                          "source_sha256": reference.source_hash(notebooks.SOURCE_DIR / f"{name}.md")})
    out = tmp_path / "reference-node"
    node_reference.write_bundle(out, summaries, label="P100", machine="node-serve-system: 2 GPUs",
                                gpus=["Tesla P100-PCIE-16GB, 6.0, 560.35.03"] * 2, doctor="PASS  GPUs visible: 2",
                                scale="lesson", commit="0123abcd", date="2026-12-01T10:00:00+00:00")
    return out


def test_the_nodes_run_appears_beside_the_cpu_reference_labelled_with_its_gpu(tmp_path):
    bundle = _node_bundle(tmp_path)
    out = tmp_path / "site"
    pages = site.build_site(out, reference_dir=COMMITTED, gpu_reference=None, benchmark_runs=None,
                            node_reference=bundle)
    names = [p.name for p in pages]
    assert "6_triton-node-reference" in names and "6f_token_streaming-node-reference" in names
    assert "4_fastapi-node-reference" not in names                 # not in this bundle
    page = (out / "6_triton-node-reference.html").read_text()
    assert page.count("<strong>P100 reference: your numbers will differ.</strong>") == 2
    assert "P100 says 1182 infer/s" in page and "It took 11.0 minutes" in page and "older version" not in page
    assert 'href="6_triton-reference.html"' in page                 # the CPU reference, beside it
    link = 'href="6_triton-node-reference.html"'
    assert link in (out / "6_triton.html").read_text() and link in (out / "6_triton-reference.html").read_text()
    assert 'href="6f_token_streaming-node-reference.html"' in (out / "6f_token_streaming.html").read_text()
    index = (out / "index.html").read_text()
    assert "<h2>Reference runs on P100</h2>" in index and link in index and "PASS  GPUs visible: 2" in index
    assert "6e_accelerate" in index                                  # what the run left out, and why
    cpu_list = index[index.index("<h2>Reference runs</h2>"):index.index("<h2>Reference runs on P100</h2>")]
    assert "node-reference" not in cpu_list
    # without a bundle: no node page, no section
    plain = site.build_site(tmp_path / "plain", reference_dir=COMMITTED, gpu_reference=None, benchmark_runs=None,
                            node_reference=tmp_path / "none")
    assert not any(p.name.endswith("-node-reference") for p in plain)
    assert "Reference runs on" not in (tmp_path / "plain" / "index.html").read_text()
