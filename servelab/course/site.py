"""`servelab site`: the whole lab as a static HTML site, from the notebook sources.

    python -m servelab site [--out build/site]

One page per notebook plus an index. Code is highlighted with Pygments; each
code cell (and each shell block meant for the GPU host) carries a label saying
where it runs; answer keys stay collapsed in ``<details>``. Everything is
local: one stylesheet written beside the pages, no scripts, no fonts or assets
from the network, so the site builds and reads offline.

A **reference run** is added: notebooks executed against the kit's local
stack, rendered with their outputs and plots as ``<name>-reference.html``,
each labelled with the machine, the date, the kit's commit and "CPU reference:
your numbers will differ", plus the benchmark tour's report and plots
(``tour-reference.html``). It comes from, in this order:

1. ``docs/reference/``, the committed reference run (``servelab.course.reference``,
   ``make reference``): the published one, so a fresh clone's ``make site``
   shows outputs and plots without running anything. It wins whenever it is
   there, so the published site never changes with whatever test ran last on
   the machine that builds it;
2. ``build/reference/``, which the notebook tests write through
   :func:`save_reference`: a local preview, used only when nothing is committed
   (``--reference build/reference`` picks it explicitly).

Without either, the site builds the text alone and says so. When ``docs/reference-node/`` holds the
node's reference run (``python3 -m servelab.node.reference`` on node-serve-system, committed), each of its
notebooks becomes ``<name>-node-reference.html``, labelled with its GPU ("P100"), linked from the lesson's
page, from its CPU reference page and from the index. When
``docs/gpu-reference.md`` has a figures table (columns ``notebook``,
``figure`` and any others), its rows appear on the matching CPU reference
page, beside the CPU outputs, and the whole file becomes ``gpu-reference.html``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from servelab.core import paths, procs
from servelab.course import lessons, notebooks, reference

DEFAULT_OUT = paths.BUILD_DIR / "site"
REFERENCE_DIR = paths.BUILD_DIR / "reference"      # written by the notebook tests: a local preview
COMMITTED_REFERENCE = reference.COMMITTED_DIR       # docs/reference/: the published reference run
GPU_REFERENCE = paths.REPO_ROOT / "docs" / "gpu-reference.md"
NODE_REFERENCE = paths.NODE_REFERENCE_DIR           # docs/reference-node/: the node's run (servelab.node.reference)
# Benchmark outputs recorded in the kit (docs/benchmark-runs/): the newest Model Analyzer summary
# (<date>-model-analyzer-summary.html, from benchmarks/bench_model_analyzer.py) and that run's
# printed output (<date>-bench_model_analyzer-full.txt) are published beside lesson 6b.
BENCHMARK_RUNS = paths.REPO_ROOT / "docs" / "benchmark-runs"
ANALYZER_LESSON = "6b_model_analyzer"
REFERENCE_NOTE = reference.NOTE
SITE_TITLE = "ServeLab: system-level optimization of model serving"

# Label text and CSS class for each "# runs ..." comment (servelab/course/lessons.py).
WHERE = {p.label: (p.long, p.key) for p in lessons.PLACES.values()}
SHORT_WHERE = {p.label: p.short for p in lessons.PLACES.values()}

CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #d8dde6; --bg-code: #f6f8fa; --accent: #2b59c3; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #fff; line-height: 1.55;
       font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main, header.site, footer.site { max-width: 920px; margin: 0 auto; padding: 0 1.25rem; }
header.site { padding-top: 1rem; border-bottom: 1px solid var(--line); }
header.site a { color: var(--muted); text-decoration: none; }
footer.site { border-top: 1px solid var(--line); margin-top: 3rem; padding: 1rem 1.25rem 2rem; color: var(--muted); }
nav.pager { display: flex; justify-content: space-between; gap: 1rem; margin: 2rem 0 0; }
a { color: var(--accent); }
h1, h2, h3 { line-height: 1.25; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 0.92em; }
:not(pre) > code { background: var(--bg-code); padding: 0.1em 0.3em; border-radius: 4px; }
pre { background: var(--bg-code); border: 1px solid var(--line); border-radius: 6px; padding: 0.75rem 1rem;
      overflow-x: auto; margin: 0; white-space: pre-wrap; overflow-wrap: anywhere; }
code, a { overflow-wrap: anywhere; }
p, li { overflow-wrap: anywhere; }  /* a long path in running text still fits a phone's width */
img { max-width: 100%; height: auto; }
pre.output { background: #fff; border-style: dashed; font-size: 0.85rem; }
.outputs { margin: 0.3rem 0 0 0; }
.outputs img { display: block; margin: 0.4rem 0; border: 1px solid var(--line); }
.gpu-figures { border: 1px solid #6a4fb3; border-left: 4px solid #6a4fb3; background: #f7f5fc; border-radius: 6px;
                padding: 0.2rem 1rem; margin: 1rem 0; }
.reference-banner { border: 1px solid #c9a227; background: #fff8e1; border-radius: 6px; padding: 0.6rem 1rem; margin: 1rem 0; }
.hand-in { border: 1px solid #1f7a4d; border-left: 4px solid #1f7a4d; background: #f3faf6; border-radius: 6px;
           padding: 0.2rem 1rem; margin: 1rem 0; }
.cell { margin: 1.1rem 0; }
.runs { display: inline-block; font-size: 0.8rem; font-weight: 600; padding: 0.15rem 0.6rem;
        border-radius: 6px 6px 0 0; color: #fff; }
.runs + pre, .runs + .highlight pre { border-top-left-radius: 0; }
.runs.chameleon { background: #6a4fb3; }
.runs.node { background: #b35a1f; }
.runs.container { background: #1f7a4d; }
table { border-collapse: collapse; margin: 1rem 0; display: block; max-width: 100%; overflow-x: auto; }
th, td { border: 1px solid var(--line); padding: 0.35rem 0.6rem; text-align: left; vertical-align: top; }
details { border: 1px solid var(--line); border-left: 4px solid var(--accent); border-radius: 6px;
          padding: 0.5rem 1rem; margin: 1rem 0; background: #fbfcfe; }
summary { cursor: pointer; font-weight: 600; }
.where-list { color: var(--muted); font-size: 0.9rem; }
ul.notebooks { list-style: none; padding-left: 0; }
ul.notebooks li { margin: 0.6rem 0; }
ul.notebooks .num { display: inline-block; min-width: 2.2em; color: var(--muted); }
"""


@dataclass
class Page:
    name: str
    title: str
    filename: str
    where: list[str]
    answer_keys: int
    code_cells: int


def _md():
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": True}).enable("table")

    def fence(self, tokens, idx, options, env):
        token = tokens[idx]
        lang = token.info.strip().split()[0] if token.info.strip() else ""
        return code_block(token.content, lang or "text")

    def link_open(self, tokens, idx, options, env):
        token = tokens[idx]
        href = token.attrGet("href") or ""
        if href.endswith(".ipynb") and "://" not in href:
            token.attrSet("href", href[: -len(".ipynb")] + ".html")
        return self.renderToken(tokens, idx, options, env)

    md.add_render_rule("fence", fence)
    md.add_render_rule("link_open", link_open)
    return md


def _lexer(lang: str):
    from pygments.lexers import TextLexer, get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        return get_lexer_by_name(lang)
    except ClassNotFound:
        return TextLexer()


def code_block(source: str, lang: str) -> str:
    """Highlighted code, with a "runs ..." label when its first line is one."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter

    source = source.rstrip("\n")
    label = notebooks.runs_label(source)
    body = highlight(source, _lexer(lang), HtmlFormatter(cssclass="highlight"))
    if label is None:
        return f'<div class="cell code">{body}</div>\n'
    text, css = WHERE[label]
    return f'<div class="cell code where-{css}"><span class="runs {css}">{html.escape(text)}</span>{body}</div>\n'


def _title(nb, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#\s+(.+)$", cell.source, re.M)
            if m:
                return m.group(1).strip()
    return fallback


def _layout(title: str, body: str, nav: str = "") -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{html.escape(title)}</title>\n<link rel=\"stylesheet\" href=\"style.css\">\n</head>\n<body>\n"
        f"<header class=\"site\"><a href=\"index.html\">{html.escape(SITE_TITLE)}</a></header>\n"
        f"<main>\n{body}\n{nav}\n</main>\n"
        "<footer class=\"site\">Rendered from the notebook sources in <code>notebooks/src/</code> "
        "by <code>python -m servelab site</code>. Open the <code>.ipynb</code> files in Jupyter to run them.</footer>\n"
        "</body>\n</html>\n"
    )


def render_notebook(nb, md=None, outputs=None) -> tuple[str, list[str], int, int]:
    """Body HTML of one notebook; also where its code runs, answer keys and code cells counted.
    ``outputs(cell)``, when given, renders a code cell's outputs (reference pages)."""
    md = md or _md()
    parts, where, answer_keys, code_cells = [], [], 0, 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            rendered = md.render(cell.source)
            if "answer-key" in cell.metadata.get("tags", []):
                answer_keys += 1
                if not rendered.lstrip().startswith("<details"):
                    rendered = f"<details><summary>Answer key</summary>\n{rendered}</details>\n"
            for label in lessons.RUNS_LABELS:
                if f"<span class=\"runs {WHERE[label][1]}\">" in rendered and label not in where:
                    where.append(label)
            css = "cell markdown hand-in" if "hand-in" in cell.metadata.get("tags", []) else "cell markdown"
            parts.append(f'<div class="{css}">\n{rendered}</div>')
        elif cell.cell_type == "code":
            code_cells += 1
            label = notebooks.runs_label(cell.source)
            if label and label not in where:
                where.append(label)
            parts.append(code_block(cell.source, "ipython3"))
            if outputs is not None:
                parts.append(outputs(cell))
    return "\n".join(parts), where, answer_keys, code_cells


def default_reference_dir() -> tuple[Path, str]:
    """Which reference run the site shows by default, and why."""
    if reference.read_manifest(COMMITTED_REFERENCE) is not None:
        return COMMITTED_REFERENCE, "the committed reference run, the published one"
    return REFERENCE_DIR, "no committed reference run; the notebook tests' local one, if any"


def build_site(out_dir: Path = DEFAULT_OUT, source_dir: Path = notebooks.SOURCE_DIR,
               reference_dir: Path | None = REFERENCE_DIR, gpu_reference: Path | None = GPU_REFERENCE,
               benchmark_runs: Path | None = BENCHMARK_RUNS, node_reference: Path | None = NODE_REFERENCE) -> list[Page]:
    from pygments.formatters import HtmlFormatter

    items = notebooks.notebooks(source_dir)
    if not items:
        raise FileNotFoundError(f"no notebook sources in {source_dir}")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    (out_dir / "style.css").write_text(CSS + HtmlFormatter(style="default").get_style_defs(".highlight"),
                                       encoding="utf-8")
    md = _md()
    built = [(item, notebooks.build_notebook(item.source, item.name)) for item in items]
    gpu = _gpu_reference(gpu_reference, out_dir, md)
    analyzer_banner = _analyzer_report(benchmark_runs, out_dir)
    manifest = reference.read_manifest(reference_dir) if reference_dir else None
    stale = reference.stale(reference_dir, source_dir) if manifest else []
    node = reference.read_manifest(node_reference) if node_reference else None
    pages = []
    for i, (item, nb) in enumerate(built):
        body, where, answer_keys, code_cells = render_notebook(nb, md)
        title = _title(nb, item.name)
        prev_link = (f'<a href="{built[i - 1][0].name}.html">&larr; {html.escape(built[i - 1][0].name)}</a>'
                     if i > 0 else '<a href="index.html">&larr; Index</a>')
        next_link = (f'<a href="{built[i + 1][0].name}.html">{html.escape(built[i + 1][0].name)} &rarr;</a>'
                     if i + 1 < len(built) else '<a href="index.html">Index &rarr;</a>')
        nav = f'<nav class="pager">{prev_link}{next_link}</nav>'
        filename = f"{item.name}.html"
        node_page = _node_reference_page(item.name, title, node_reference, out_dir, md, node, source_dir,
                                         cpu_page=reference_dir is not None
                                         and (reference_dir / f"{item.name}.ipynb").is_file()) if node else None
        node_link = (f'<p class="reference-banner">And <a href="{node_page.filename}">a reference run on '
                     f'{html.escape(str(node.get("label", "GPU")))}</a>, the GPU node ({html.escape(str(node.get("note", "")))}).</p>\n'
                     if node_page else "")
        ref_page = _reference_page(item.name, title, reference_dir, out_dir, md, manifest, stale, gpu, node_link)
        if node_page:
            body = node_link + body
        if ref_page:
            body = (f'<p class="reference-banner">See <a href="{ref_page.filename}">a reference run of this '
                    f'notebook</a> with its outputs and plots ({html.escape(REFERENCE_NOTE)}).</p>\n' + body)
        if item.name == ANALYZER_LESSON and analyzer_banner:
            body = analyzer_banner + body
        (out_dir / filename).write_text(_layout(title, body, nav), encoding="utf-8")
        pages.append(Page(item.name, title, filename, where, answer_keys, code_cells))
        if ref_page:
            pages.append(ref_page)
        if node_page:
            pages.append(node_page)
    tour = _tour_page(reference_dir, out_dir, md, manifest) if reference_dir else None
    if tour:
        pages.append(tour)
    if gpu.page:
        pages.append(gpu.page)
    (out_dir / "index.html").write_text(_index(pages, node), encoding="utf-8")
    return pages


# --------------------------------------------------------------------------
# Reference run: executed notebooks with their outputs


def save_reference(nb, name: str, reference_dir: Path = REFERENCE_DIR, machine: str | None = None) -> Path:
    """Keep an executed notebook as the site's reference run for ``name``."""
    import nbformat

    reference_dir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))  # a copy
    nb.metadata["servelab_reference"] = {
        "machine": machine or procs.machine_description(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": reference.git_commit(),
        "note": REFERENCE_NOTE,
    }
    path = reference_dir / f"{name}.ipynb"
    tmp = path.with_suffix(".ipynb.tmp")
    tmp.write_text(nbformat.writes(nb), encoding="utf-8")
    tmp.replace(path)
    return path


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _output_renderer(name: str, out_dir: Path):
    images = out_dir / "img"
    counter = [0]

    def render(cell) -> str:
        parts = []
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if kind == "stream":
                parts.append(f'<pre class="output">{html.escape(_ANSI.sub("", out.get("text", "")))}</pre>')
            elif kind in ("execute_result", "display_data"):
                data = out.get("data", {})
                if "image/png" in data:
                    counter[0] += 1
                    images.mkdir(exist_ok=True)
                    png = f"{name}-{counter[0]}.png"
                    (images / png).write_bytes(base64.b64decode(data["image/png"]))
                    parts.append(f'<img src="img/{png}" alt="plot {counter[0]} of {html.escape(name)}">')
                elif "text/markdown" in data:   # a table the notebook displayed (the kit's own run wrote it)
                    parts.append(f'<div class="output markdown">{_md().render(data["text/markdown"])}</div>')
                elif "text/plain" in data:
                    parts.append(f'<pre class="output">{html.escape(_ANSI.sub("", data["text/plain"]))}</pre>')
            elif kind == "error":
                text = _ANSI.sub("", "\n".join(out.get("traceback", [])))
                parts.append(f'<pre class="output error">{html.escape(text)}</pre>')
        return f'<div class="outputs">{"".join(parts)}</div>' if parts else ""

    return render


def _banner(info: dict, manifest: dict | None, stale: list[str], lesson_link: str, name: str = "") -> str:
    """The label every reference page carries, at its top and its bottom."""
    how = ("Executed against the kit's local stack by <code>make reference</code> (committed in "
           "<code>docs/reference/</code>)" if manifest else "Executed against the kit's local stack by the notebook tests")
    scale = ""
    if manifest and manifest.get("scale") == "reduced":
        scale = " Scale: reduced (smaller request counts than the lesson's, so noisier figures)."
    checks = (manifest or {}).get("checks", {}).get(name) if name else None
    if checks:
        scale += (f" Lesson checks in this run: {checks['passed']} passed, {checks['inconclusive']} inconclusive"
                  + (" (the machine was busy: a check that cannot trust its timing says so rather than pass)"
                     if checks["inconclusive"] else "") + ".")
    warn = ""
    if stale:
        warn = (" <strong>This run was made from an older version of the notebook sources</strong> "
                f"({html.escape('; '.join(stale))}); run <code>make reference</code>.")
    return (f'<p class="reference-banner"><strong>{html.escape(REFERENCE_NOTE)}.</strong> A reference run. '
            f'Machine: {html.escape(str(info.get("machine", "unknown")))}. '
            f'Date: {html.escape(str(info.get("date", "unknown")))}. '
            f'Kit commit: <code>{html.escape(str(info.get("commit", "unknown")))}</code>.{scale} '
            f'{how}; {lesson_link}.{warn}</p>\n')


def _reference_page(name: str, title: str, reference_dir: Path | None, out_dir: Path, md,
                    manifest: dict | None = None, stale: list[str] = (), gpu=None, extra: str = "") -> Page | None:
    """Render <reference_dir>/<name>.ipynb, if there is one, as <name>-reference.html."""
    import nbformat

    path = (reference_dir / f"{name}.ipynb") if reference_dir else None
    if path is None or not path.is_file():
        return None
    nb = nbformat.read(path, as_version=4)
    info = {**(manifest or {}), **nb.metadata.get("servelab_reference", {})}
    body, where, answer_keys, code_cells = render_notebook(nb, md, outputs=_output_renderer(name, out_dir))
    mine = [s for s in stale if s.startswith(f"{name}.")]
    banner = _banner(info, manifest, mine, f'<a href="{name}.html">the lesson page</a> has the text alone', name)
    if gpu is not None:
        banner += gpu.beside(name)
    banner += extra
    filename = f"{name}-reference.html"
    nav = f'<nav class="pager"><a href="{name}.html">&larr; {html.escape(name)}</a><a href="index.html">Index &rarr;</a></nav>'
    (out_dir / filename).write_text(_layout(f"{title} (reference run)", banner + body + banner, nav),
                                    encoding="utf-8")
    return Page(f"{name}-reference", f"{title}: reference run", filename, where, answer_keys, code_cells)


def _node_reference_page(name: str, title: str, node_dir: Path, out_dir: Path, md, manifest: dict,
                         source_dir: Path = notebooks.SOURCE_DIR, cpu_page: bool = False) -> Page | None:
    """<node_dir>/<name>.ipynb, the node's reference run (servelab.node.reference), as
    <name>-node-reference.html, labelled with its GPU."""
    import nbformat

    path = node_dir / f"{name}.ipynb"
    if not path.is_file():
        return None
    nb = nbformat.read(path, as_version=4)
    info = {**manifest, **nb.metadata.get("servelab_reference", {})}
    body, where, answer_keys, code_cells = render_notebook(nb, md, outputs=_output_renderer(f"{name}-node", out_dir))
    checks = manifest.get("checks", {}).get(name, {})
    source = source_dir / f"{name}.md"
    recorded = manifest.get("sources", {}).get(f"{name}.md")
    older = bool(recorded) and source.is_file() and recorded != reference.source_hash(source)
    label = html.escape(str(info.get("label", "GPU")))
    links = f'<a href="{name}.html">the lesson page</a> has the text alone' + (
        f'; <a href="{name}-reference.html">the CPU reference</a> runs it on a laptop-sized CPU' if cpu_page else "")
    banner = (f'<p class="reference-banner"><strong>{html.escape(str(info.get("note", "")))}.</strong> A reference run '
              f'on {label}: executed headless inside the node\'s Jupyter container by '
              '<code>python3 -m servelab.node.reference</code> (committed in <code>docs/reference-node/</code>). '
              f'Machine: {html.escape(str(info.get("machine", "unknown")))}. '
              f'Date: {html.escape(str(info.get("date", "unknown")))}. '
              f'Kit commit: <code>{html.escape(str(info.get("commit", "unknown")))}</code>. '
              f'Scale: {html.escape(str(info.get("scale", "?")))}. '
              f'It took {manifest.get("minutes", {}).get(name, "?")} minutes, its node commands included and no '
              'reading time'
              + (f'. Lesson checks: {checks.get("passed", 0)} passed, {checks.get("inconclusive", 0)} inconclusive, '
                 f'{checks.get("failed", 0)} failed' if checks else "")
              + f'; {links}.'
              + (" <strong>This run was made from an older version of the notebook's source.</strong>" if older else "")
              + "</p>\n")
    filename = f"{name}-node-reference.html"
    nav = f'<nav class="pager"><a href="{name}.html">&larr; {html.escape(name)}</a><a href="index.html">Index &rarr;</a></nav>'
    (out_dir / filename).write_text(_layout(f"{title} (reference run on {info.get('label', 'GPU')})",
                                            banner + body + banner, nav), encoding="utf-8")
    return Page(f"{name}-node-reference", f"{title}: reference run on {info.get('label', 'GPU')}", filename,
                where, answer_keys, code_cells)


def _node_section(pages: list[Page], node: dict | None) -> str:
    """The index's list of the node's reference pages, its doctor's report and what it left out."""
    mine = [p for p in pages if p.name.endswith("-node-reference")]
    if not node or not mine:
        return ""
    left = "".join(f"<li><code>{html.escape(k)}</code>: {html.escape(v)}</li>"
                   for k, v in (node.get("left_out") or {}).items())
    return (f'\n<h2>Reference runs on {html.escape(str(node.get("label", "GPU")))}</h2>\n<p>The same notebooks on the GPU node, '
            f'executed headless in its Jupyter container ({html.escape(str(node.get("note", "")))}; '
            f'{html.escape(str(node.get("machine", "")))}, {html.escape(str(node.get("date", "")))}):</p>\n<ul>\n'
            + "\n".join(f'<li><a href="{p.filename}">{html.escape(p.title)}</a> '
                         f'({node.get("minutes", {}).get(p.name.removesuffix("-node-reference"), "?")} min)</li>'
                         for p in mine) + "\n</ul>\n"
            + (f"<p>Not in this run:</p><ul>{left}</ul>\n" if left else "")
            + "<details><summary>The node doctor's report from that run</summary>\n"
            + f'<pre class="output">{html.escape(str(node.get("doctor", "")))}</pre></details>')


def _index(pages: list[Page], node: dict | None = None) -> str:
    rows = []
    references = [p for p in pages if p.name not in lessons.BY_SLUG and p.name != "gpu-reference"
                  and not p.name.endswith("-node-reference")]
    gpu = [p for p in pages if p.name == "gpu-reference"]
    for page in pages:
        if page.name not in lessons.BY_SLUG:
            continue
        where = ", ".join(SHORT_WHERE[w] for w in page.where) or "reading only"
        rows.append(
            f'<li><span class="num">{html.escape(lessons.BY_SLUG[page.name].number)}</span>'
            f'<a href="{page.filename}">{html.escape(page.name)}</a>: {html.escape(page.title)}'
            f'<div class="where-list">runs: {html.escape(where)}</div></li>'
        )
    body = (
        f"<h1>{html.escape(SITE_TITLE)}</h1>\n"
        "<p>Serve a Food-11 image classifier with FastAPI, ONNX Runtime and NVIDIA Triton, and measure each step. "
        "Follow the notebooks in order. Each code block is labelled with where it runs: the Chameleon Jupyter "
        "environment, a terminal on the GPU server (<code>node-serve-system</code>), or the Jupyter server next to "
        "the model servers (a container on Chameleon, or the local Jupyter that <code>make up</code> starts).</p>\n"
        "<p>Without a GPU or Docker, run <code>make demo</code>, then <code>make up</code> and notebooks 4 and 6 "
        "in the local Jupyter.</p>\n"
        '<ul class="notebooks">\n' + "\n".join(rows) + "\n</ul>"
    )
    if references:
        body += ("\n<h2>Reference runs</h2>\n<p>What to expect: notebooks executed against the kit's local "
                 f"stack, with their outputs and plots ({html.escape(REFERENCE_NOTE)}).</p>\n<ul>\n"
                 + "\n".join(f'<li><a href="{p.filename}">{html.escape(p.title)}</a></li>' for p in references)
                 + "\n</ul>")
        if gpu:
            body += (f'\n<p>And one run on a GPU, to read beside them: <a href="{gpu[0].filename}">'
                     f'{html.escape(gpu[0].title)}</a>.</p>')
    else:
        body += ("\n<p class=\"where-list\">No reference run is included: none was found in "
                 "<code>docs/reference/</code> (<code>make reference</code> writes it) or "
                 "<code>build/reference/</code> (the notebook tests write one); "
                 "run <code>make site</code> again afterwards.</p>")
    body += _node_section(pages, node)
    return _layout(SITE_TITLE, body)


# --------------------------------------------------------------------------
# Command line


def add_parser(sub) -> None:
    p = sub.add_parser("site", help="render the lab notebooks into a static HTML site (offline)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})")
    p.add_argument("--reference", type=Path, default=None,
                   help=f"folder of executed notebooks to show as the reference run (default: {COMMITTED_REFERENCE} "
                        f"when committed, else {REFERENCE_DIR})")
    p.set_defaults(func=_cmd_site)


def _cmd_site(args) -> int:
    try:
        ref_dir, why = (args.reference, "given with --reference") if args.reference else default_reference_dir()
        pages = build_site(args.out, reference_dir=ref_dir)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    refs = [p.name for p in pages if p.name not in lessons.BY_SLUG and p.name != "gpu-reference"
            and not p.name.endswith("-node-reference")]
    node = [p.name for p in pages if p.name.endswith("-node-reference")]
    print(f"wrote {len(pages)} pages and an index to {args.out}/ (open {args.out / 'index.html'})")
    if refs:
        print(f"reference runs included: {', '.join(refs)} (from {ref_dir}: {why})")
        manifest = reference.read_manifest(ref_dir)
        if manifest:
            print(f"  {reference.label(manifest)}")
            for problem in reference.stale(ref_dir):
                print(f"  warning: stale reference: {problem}")
    else:
        print(f"no reference run in {ref_dir}: the site shows the lessons' text and code only "
              "(`make reference` writes the committed one)")
    if node:
        print(f"the node's reference run from {NODE_REFERENCE}: {', '.join(node)}")
    return 0


# --------------------------------------------------------------------------
# Model Analyzer's summary report, from the kit's recorded benchmark run


def _analyzer_report(runs_dir: Path | None, out_dir: Path) -> str:
    """Copy the newest recorded Model Analyzer summary (and its run's output) into
    ``reports/`` and return the banner for lesson 6b's page ("" when none is recorded).
    The summary is Model Analyzer's own page, kept whole in a folder of its own."""
    summaries = sorted(runs_dir.glob("*-model-analyzer-summary.html")) if runs_dir and runs_dir.is_dir() else []
    if not summaries:
        return ""
    summary = summaries[-1]
    date = summary.name.removesuffix("-model-analyzer-summary.html")
    reports = out_dir / "reports"
    reports.mkdir(exist_ok=True)
    shutil.copy2(summary, reports / "model-analyzer-summary.html")
    run = runs_dir / f"{date}-bench_model_analyzer-full.txt"
    how = ""
    if run.is_file():
        shutil.copy2(run, reports / "model-analyzer-run.txt")
        how = (' (<a href="reports/model-analyzer-run.txt">its run</a>: <code>benchmarks/bench_model_analyzer.py</code>, '
               "both rankings and their agreement)")
    return (f'<p class="reference-banner">Model Analyzer\'s own <a href="reports/model-analyzer-summary.html">summary '
            f"report</a> from the kit's full-size run of {html.escape(date)}{how}, recorded in "
            "<code>docs/benchmark-runs/</code>. Your run will differ.</p>\n")


# --------------------------------------------------------------------------
# The tour's report, and the GPU reference beside the CPU one


def _tour_page(reference_dir: Path, out_dir: Path, md, manifest: dict | None) -> Page | None:
    """<reference_dir>/tour/report.md and its plots as tour-reference.html."""
    report = reference_dir / "tour" / "report.md"
    if not report.is_file():
        return None
    images = out_dir / "img" / "tour"
    images.mkdir(parents=True, exist_ok=True)
    for png in sorted(report.parent.glob("*.png")):
        shutil.copy2(png, images / png.name)
    body = md.render(report.read_text(encoding="utf-8"))
    # the report names its plots beside it: point them at the copies
    body = re.sub(r'(<img src=")(?![a-z]+:|/)([^"]+\.png")', r"\1img/tour/\2", body)
    banner = _banner(manifest or {}, manifest, [], 'the same experiments on your machine: <code>make demo</code>')
    (out_dir / "tour-reference.html").write_text(
        _layout("Benchmark tour (reference run)", banner + body + banner,
                '<nav class="pager"><a href="index.html">&larr; Index</a><span></span></nav>'), encoding="utf-8")
    return Page("tour-reference", "Benchmark tour: reference run (report and plots)", "tour-reference.html", [], 0, 0)


@dataclass
class GpuReference:
    """docs/gpu-reference.md, read for the site: its figures table rows by notebook, and its page."""

    path: Path | None
    rows: list[dict]
    columns: list[str]
    page: Page | None

    def beside(self, name: str) -> str:
        """The GPU figures for notebook ``name``, to show beside its CPU reference run."""
        number = name.split("_", 1)[0]
        mine = [r for r in self.rows if _notebook_key(r.get("notebook", "")) in (name, number)]
        if self.page is None:
            return ('<div class="gpu-figures"><p>No GPU reference run is published yet '
                    '(<code>docs/gpu-reference.md</code>).</p></div>\n')
        if not mine:
            return ('<div class="gpu-figures"><p>No GPU reference figures for this notebook yet: see '
                    '<a href="gpu-reference.html">the GPU reference</a>.</p></div>\n')
        cols = [c for c in self.columns if c != "notebook"]
        head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(r.get(c, ''))}</td>" for c in cols) + "</tr>"
                       for r in mine)
        return ('<div class="gpu-figures"><p><strong>GPU reference, beside this CPU run</strong> '
                '(from <a href="gpu-reference.html">docs/gpu-reference.md</a>):</p>'
                f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>\n")


def _notebook_key(value: str) -> str:
    """"4", "4_fastapi", "notebook 4", "`6_triton`" -> "4" / "4_fastapi" / "4" / "6_triton"."""
    value = value.strip().strip("`").strip()
    m = re.fullmatch(r"(?:notebook\s+)?(\d+)", value, re.I)
    return m.group(1) if m else value


def gpu_figures(text: str) -> tuple[list[str], list[dict]]:
    """Rows of every markdown table in ``text`` whose header has ``notebook`` and ``figure`` columns
    (case-insensitive), as dicts keyed by the lower-cased header. Other tables are left alone."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    columns, rows, table, cell, row = [], [], None, None, None
    for tok in tokens:
        if tok.type == "table_open":
            table = {"head": [], "rows": []}
        elif tok.type == "tr_open":
            row = []
        elif tok.type in ("th_open", "td_open"):
            cell = ""
        elif tok.type == "inline" and cell is not None:
            cell = tok.content.strip()
        elif tok.type in ("th_close", "td_close"):
            row.append(cell)
            cell = None
        elif tok.type == "tr_close" and table is not None:
            if table["head"]:
                table["rows"].append(row)
            else:
                table["head"] = row
        elif tok.type == "table_close" and table is not None:
            head = [h.lower() for h in table["head"]]
            if "notebook" in head and "figure" in head:
                columns += [h for h in head if h not in columns]
                rows += [dict(zip(head, r)) for r in table["rows"]]
            table = None
    return columns, rows


def _gpu_reference(path: Path | None, out_dir: Path, md) -> GpuReference:
    """Read docs/gpu-reference.md when there is one, and render it as gpu-reference.html."""
    if path is None or not path.is_file():
        return GpuReference(None, [], [], None)
    text = path.read_text(encoding="utf-8")
    columns, rows = gpu_figures(text)
    body = md.render(text)
    # its relative links name files of the repository, not pages of this site: keep their text only
    body = re.sub(r'<a href="(?![a-z]+:|#)([^"]*)">(.*?)</a>',
                  lambda m: m.group(0) if (out_dir / m.group(1).split("#")[0]).exists() else m.group(2), body)
    body = re.sub(r'<img src="(?![a-z]+:)[^"]*" alt="([^"]*)"[^>]*>', r"[image: \1]", body)
    note = ("" if rows else '<p class="where-list">No figures table yet (a markdown table with '
            '<code>notebook</code> and <code>figure</code> columns): the CPU reference pages say so.</p>\n')
    (out_dir / "gpu-reference.html").write_text(
        _layout("GPU reference", note + body, '<nav class="pager"><a href="index.html">&larr; Index</a><span></span></nav>'),
        encoding="utf-8")
    return GpuReference(path, rows, columns, Page("gpu-reference", "GPU reference run (docs/gpu-reference.md)",
                                                  "gpu-reference.html", [], 0, 0))
