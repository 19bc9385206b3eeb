"""`servelab site`: the static site renders every notebook, labels where code
runs, keeps answer keys collapsed, and references nothing on the network."""

from __future__ import annotations

import argparse
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from servelab import lessons, notebooks, site


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
    pages = site.build_site(out)
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
        if runs == "chameleon":
            assert kinds == {"chameleon"}
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
