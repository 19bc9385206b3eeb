"""`servelab site`: the static site renders every notebook, labels where code
runs, keeps answer keys collapsed, and references nothing on the network."""

from __future__ import annotations

import argparse
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from servelab.course import lessons, notebooks, site


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []  # (tag, attrs dict)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _parse(path: Path) -> _Collect:
    parser = _Collect()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("site") / "site"
    pages = site.build_site(out, reference_dir=None, gpu_reference=None)  # the lessons alone; reference runs: below
    return out, pages


def test_one_page_per_notebook_plus_index(built):
    out, pages = built
    names = [nb.name for nb in notebooks.notebooks()]
    assert [p.name for p in pages] == names
    assert sorted(p.name for p in out.glob("*.html")) == sorted([f"{n}.html" for n in names] + ["index.html"])
    index = (out / "index.html").read_text()
    for name in names:
        assert f'href="{name}.html"' in index
    positions = [index.index(f'href="{name}.html"') for name in lessons.slugs()]
    assert names == lessons.slugs() and positions == sorted(positions)
    assert f'<span class="num">{lessons.LESSONS[-1].number}</span>' in index


def test_code_cells_are_labelled_with_where_they_run(built):
    out, pages = built
    for page in pages:
        html = (out / page.filename).read_text()
        labels = re.findall(r'<span class="runs (\w+)">([^<]+)</span>', html)
        assert len(labels) >= page.code_cells
        nb = notebooks.build_notebook(notebooks.SOURCE_DIR / f"{page.name}.md")
        for cell in (c for c in nb.cells if c.cell_type == "code"):
            assert notebooks.runs_label(cell.source) is not None
        kinds = {kind for kind, _ in labels}
        runs = lessons.BY_SLUG[page.name].runs
        if runs == "chameleon":  # its markdown may show a command for the node, too
            assert "chameleon" in kinds and kinds <= {"chameleon", "node"}
            assert "Runs in the Chameleon Jupyter environment" in html
        if runs == "node":
            assert "node" in kinds and "Runs on node-serve-system" in html
        if runs == "container":
            assert "container" in kinds and "Runs inside the Jupyter container" in html
    index = (out / "index.html").read_text()
    assert "node-serve-system" in index and "Chameleon Jupyter environment" in index


def test_answer_keys_are_collapsed(built):
    out, pages = built
    for page in pages:
        html = (out / page.filename).read_text()
        details = html.count("<details>")
        assert details >= page.answer_keys
        assert "<details open" not in html
        assert details == html.count("</details>") == html.count("<summary>")
    measured = {p.name: p.answer_keys for p in pages}
    assert all(measured[name] >= 2 for name in lessons.slugs("container"))


def test_no_network_assets_and_links_resolve(built):
    out, _ = built
    for page in out.glob("*.html"):
        html = page.read_text()
        assert "<script" not in html
        for tag, attrs in _parse(page).tags:
            for key in ("src", "srcset", "data", "poster"):
                assert key not in attrs or not re.match(r"\s*(https?:)?//", attrs[key]), (page.name, tag, attrs)
            if tag == "link":
                assert not re.match(r"(https?:)?//", attrs.get("href", "")), (page.name, attrs)
            if tag == "a":
                href = attrs.get("href", "")
                if not re.match(r"(https?:|mailto:|#)", href):
                    target = href.split("#")[0]
                    assert (out / target).exists(), f"{page.name}: broken link {href}"
                    assert not target.endswith(".ipynb"), "notebook links point at the rendered pages"
    css = (out / "style.css").read_text()
    assert "@import" not in css and not re.search(r"url\(\s*['\"]?(https?:)?//", css)


def test_code_is_highlighted_locally(built):
    out, _ = built
    html = (out / "2_create_server_nvidia.html").read_text()
    assert 'class="highlight"' in html and "<span class=" in html
    assert ".highlight" in (out / "style.css").read_text()


def test_cli_writes_the_site(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    site.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["site", "--out", str(tmp_path / "s")])
    assert args.func(args) == 0
    assert (tmp_path / "s" / "index.html").exists()
    assert "pages and an index" in capsys.readouterr().out


# --------------------------------------------------------------------------
# The reference run: executed notebooks rendered with outputs and plots

LONG_COMMAND = ("perf_analyzer -u triton_server:8000 -m food_classifier --input-data input.json -b 1 "
                "--concurrency-range 8 --measurement-mode count_windows --measurement-request-count 100 "
                "--stability-percentage 20 --percentile 95 --verbose-csv -f results/this_is_a_long_file_name.csv")


def _executed(name: str):
    """notebooks/<name> with outputs like an execution leaves: text, a long line, a real PNG plot."""
    import base64
    import io

    import matplotlib
    import nbformat

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([1, 8, 16], [30, 31, 30], marker="o")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    png = base64.b64encode(buf.getvalue()).decode()
    nb = notebooks.build_notebook(notebooks.SOURCE_DIR / f"{name}.md", name)
    code = [c for c in nb.cells if c.cell_type == "code"]
    code[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=LONG_COMMAND + "\n" + "x" * 400 + "\n")]
    code[1].outputs = [nbformat.v4.new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"})]
    return nb


@pytest.fixture(scope="module")
def with_reference(tmp_path_factory):
    base = tmp_path_factory.mktemp("ref")
    ref = base / "reference"
    site.save_reference(_executed("6_triton"), "6_triton", reference_dir=ref, machine="testhost: 2 cores, no GPU")
    out = base / "site"
    pages = site.build_site(out, reference_dir=ref)
    return out, pages


def test_reference_page_shows_outputs_plots_and_its_label(with_reference):
    out, pages = with_reference
    assert "6_triton-reference" in [p.name for p in pages]
    page = (out / "6_triton-reference.html").read_text()
    assert page.count(site.REFERENCE_NOTE) >= 2                      # banner at the top and the bottom
    assert "Machine: testhost: 2 cores, no GPU" in page and re.search(r"Date: \d{4}-\d\d-\d\dT", page)
    assert '<pre class="output">' in page and LONG_COMMAND in page
    imgs = [a["src"] for t, a in _parse(out / "6_triton-reference.html").tags if t == "img"]
    assert imgs == ["img/6_triton-1.png"]
    assert (out / imgs[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 'href="6_triton-reference.html"' in (out / "6_triton.html").read_text()
    assert 'href="6_triton-reference.html"' in (out / "index.html").read_text()
    assert not (out / "4_fastapi-reference.html").exists()           # no reference for it: no page


def test_no_reference_run_is_said_so(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    site.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["site", "--out", str(tmp_path / "s"), "--reference", str(tmp_path / "none")])
    assert args.func(args) == 0
    assert "no reference run in" in capsys.readouterr().out
    assert "No reference run is included" in (tmp_path / "s" / "index.html").read_text()
    # no notebook or tour reference page; docs/gpu-reference.md, when the kit has one, is still published
    assert [p.name for p in (tmp_path / "s").glob("*-reference.html")] in ([], ["gpu-reference.html"])


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.fixture(scope="module")
def committed_site(tmp_path_factory):
    """The site as a fresh clone's `make site` builds it: from the committed reference run."""
    ref, why = site.default_reference_dir()
    assert ref == site.COMMITTED_REFERENCE, f"no committed reference run ({why}): run `make reference`"
    out = tmp_path_factory.mktemp("published") / "site"
    pages = site.build_site(out, reference_dir=ref)
    return out, pages


@pytest.mark.integration   # drives headless Chromium
def test_pages_fit_1280_and_390_px_without_hidden_code(committed_site):
    """Chromium opens the site built from the committed reference run, every page at 1280 and
    390 px: no page is wider than the window, no code or output block hides text behind a
    scrollbar, every reference page shows its outputs, and every plot on them is loaded and drawn.
    Full-page screenshots of the index and the reference pages, and one per figure of notebook 6's
    reference page, go to build/site/screenshots/; with $SERVELAB_SCREENSHOTS (a folder) every
    page's go there, for a look by eye (a full-page screenshot of every page, 58 files, made this
    test 214 s on an idle 2-core machine, 74 s with 22, 2026-11-30; the width a screenshot showed
    is the page's own scrollWidth, checked on every page)."""
    import os

    from playwright.sync_api import sync_playwright

    from servelab.core import paths

    chromium = os.environ.get("SERVELAB_CHROMIUM", "/usr/bin/chromium")
    if not os.path.exists(chromium):
        pytest.fail(f"{chromium} is missing: install Debian's chromium (`make sysdeps`)", pytrace=False)
    out, pages = committed_site
    every_page = bool(os.environ.get("SERVELAB_SCREENSHOTS"))
    shots = Path(os.environ.get("SERVELAB_SCREENSHOTS") or paths.BUILD_DIR / "site" / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    reference_pages = [f"{n}-reference.html" for n in ("4_fastapi", "6_triton")] + ["tour-reference.html"]
    assert all((out / name).exists() for name in reference_pages)
    figures = {}
    problems = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True,
                                    args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            for width in (1280, 390):
                page = browser.new_page(viewport={"width": width, "height": 900})
                # Playwright's 30 s default: one full-page screenshot took longer beside make test's
                # three workers (2026-11-29); a hang guard, not a budget
                page.set_default_timeout(120_000)
                for html_file in sorted(out.glob("*.html")):
                    page.goto(html_file.as_uri())
                    page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
                    metrics = page.evaluate("""() => ({
                        doc: document.documentElement.scrollWidth, win: window.innerWidth,
                        hidden: [...document.querySelectorAll('pre')]
                            .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent.slice(0, 60))})""")
                    shot = None
                    if every_page or html_file.name in reference_pages or html_file.name == "index.html":
                        shot = shots / f"{html_file.stem}-{width}.png"
                        page.screenshot(path=str(shot), full_page=True)
                    if html_file.name in reference_pages:
                        seen = page.evaluate("""() => ({
                            outputs: [...document.querySelectorAll('pre.output')].filter(e => e.offsetHeight > 0).length,
                            imgs: [...document.images].map(i => [i.complete && i.naturalWidth > 0, i.width])})""")
                        if seen["outputs"] == 0 and html_file.name != "tour-reference.html":
                            problems.append(f"{html_file.name} at {width}px: no outputs shown")
                        if not seen["imgs"] or not all(ok and w > 0 for ok, w in seen["imgs"]):
                            problems.append(f"{html_file.name} at {width}px: plots missing {seen['imgs']}")
                        if html_file.name == "6_triton-reference.html":
                            figures[width] = []
                            for i, img in enumerate(page.locator("div.outputs img").all(), 1):
                                fig = shots / f"6_triton-reference-figure{i}-{width}.png"
                                img.scroll_into_view_if_needed()
                                img.screenshot(path=str(fig))
                                figures[width].append(fig)
                    shot_width = _png_size(shot)[0] if shot else metrics["doc"]
                    if metrics["doc"] > metrics["win"] or shot_width > width:
                        problems.append(f"{html_file.name} at {width}px: page {metrics['doc']}px wide, "
                                        f"screenshot {shot_width}px")
                    if metrics["hidden"]:
                        problems.append(f"{html_file.name} at {width}px: text hidden in {metrics['hidden']}")
                page.close()
        finally:
            browser.close()
    assert problems == []
    assert (shots / "6_triton-reference-390.png").exists() and (shots / "index-1280.png").exists()
    assert len(figures[1280]) == len(figures[390]) >= 4, figures
    for width, figs in figures.items():
        assert all(0 < _png_size(f)[0] <= width for f in figs)


def test_lesson_6b_links_model_analyzers_recorded_summary(built, tmp_path):
    """Model Analyzer's summary report is on the site: the newest one recorded in docs/benchmark-runs/,
    in a folder of its own (its page is the tool's, not the site's), with the run that made it."""
    out, _ = built
    page = (out / "6b_model_analyzer.html").read_text()
    assert 'href="reports/model-analyzer-summary.html"' in page and 'href="reports/model-analyzer-run.txt"' in page
    assert "food_classifier_onnx" in (out / "reports" / "model-analyzer-summary.html").read_text()
    assert "tool's ranking:" in (out / "reports" / "model-analyzer-run.txt").read_text()
    assert "model-analyzer" not in (out / "6_triton.html").read_text()
    # the newest of several; none recorded: no banner, no folder
    runs = tmp_path / "runs"
    runs.mkdir()
    for date in ("2026-01-02", "2026-03-04"):
        (runs / f"{date}-model-analyzer-summary.html").write_text(f"<html>{date}</html>")
    site.build_site(tmp_path / "a", reference_dir=None, gpu_reference=None, benchmark_runs=runs)
    assert (tmp_path / "a" / "reports" / "model-analyzer-summary.html").read_text() == "<html>2026-03-04</html>"
    assert "its run" not in (tmp_path / "a" / "6b_model_analyzer.html").read_text()
    site.build_site(tmp_path / "b", reference_dir=None, gpu_reference=None, benchmark_runs=tmp_path / "none")
    assert not (tmp_path / "b" / "reports").exists()
    assert "reports/model-analyzer-summary.html" not in (tmp_path / "b" / "6b_model_analyzer.html").read_text()
