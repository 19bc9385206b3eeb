"""The lab's notebooks: text sources in ``notebooks/src/*.md`` (jupytext MyST
markdown), built into the committed ``notebooks/*.ipynb``.

    python -m servelab notebooks build          # write every .ipynb from its source
    python -m servelab notebooks check          # exit 1 if a committed .ipynb differs
    python -m servelab notebooks pull NAME      # copy edits made in Jupyter back to the source

Why our own builder: jupytext gives every cell a random id on each build, so
two builds of the same source differ byte for byte, and ``jupytext --diff``
exits 0 even when files differ. Here cell ids come from a hash of the
notebook name, the cell's position and its content; notebook metadata is
reduced to the kernelspec, and outputs are never written. Building twice gives
the same bytes, and ``check_sources`` compares what matters (cell type,
source, tags) itself.

This module builds the notebooks; what the notebooks themselves import lives
in :mod:`servelab.course.lab`, and the list of lessons in :mod:`servelab.course.lessons`.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

from servelab.core import paths
from servelab.course import lessons

NOTEBOOKS_DIR = paths.REPO_ROOT / "notebooks"
SOURCE_DIR = NOTEBOOKS_DIR / "src"
SOURCE_FORMAT = "md:myst"

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}

README = paths.REPO_ROOT / "README.md"

# The student edition: every notebook without its answer-key cells (not committed; an instructor
# hands these out, e.g. as a Trovi artifact, and keeps the keys: docs/instructor-guide.md).
STUDENT_DIR = paths.REPO_ROOT / "dist" / "student-edition"
ANSWER_KEY_TAG = "answer-key"

# Only cell metadata worth keeping in the .ipynb.
KEPT_CELL_METADATA = ("tags",)



@dataclass(frozen=True)
class Notebook:
    """One lab notebook: its text source and its built .ipynb."""

    name: str  # e.g. "1_create_lease"
    source: Path
    ipynb: Path

    @property
    def lesson(self) -> lessons.Lesson:
        return lessons.BY_SLUG[self.name]

    @property
    def number(self) -> str:
        return self.lesson.number


def notebooks(source_dir: Path = SOURCE_DIR, out_dir: Path | None = None) -> list[Notebook]:
    """Every lab notebook, in lab order (servelab/course/lessons.py); every source must be listed there."""
    out_dir = out_dir or source_dir.parent
    unlisted = sorted(src.name for src in source_dir.glob("*.md") if src.stem not in lessons.BY_SLUG)
    if unlisted:
        raise ValueError(f"{', '.join(unlisted)} in {source_dir}: not in servelab/course/lessons.py (add a Lesson line)")
    missing = [f"{les.slug}.md" for les in lessons.LESSONS if not (source_dir / f"{les.slug}.md").exists()]
    if len(missing) == len(lessons.LESSONS):
        return []  # no sources here at all
    if missing:
        raise ValueError(f"{', '.join(missing)}: listed in servelab/course/lessons.py but not in {source_dir}")
    return [Notebook(les.slug, source_dir / f"{les.slug}.md", out_dir / f"{les.slug}.ipynb")
            for les in lessons.LESSONS]


def _cell_id(name: str, index: int, cell_type: str, source: str) -> str:
    digest = hashlib.sha256(f"{name}\0{index}\0{cell_type}\0{source}".encode()).hexdigest()
    return digest[:16]


def build_notebook(source: Path, name: str | None = None, figures: dict[str, str] | None = None):
    """Read one MyST source and return a clean, deterministic nbformat v4.5 notebook. Its
    ``{{ref:NAME}}`` placeholders (answer keys) get the reference run's figures: ``figures``, or
    those docs/reference/ printed (servelab.course.answer_keys.fill)."""
    import jupytext
    import nbformat

    from servelab.course import answer_keys

    name = name or source.stem
    nb = jupytext.reads(answer_keys.fill(source.read_text(encoding="utf-8"), figures), fmt=SOURCE_FORMAT)
    lesson = lessons.BY_SLUG.get(name)
    first = nb.cells[0] if nb.cells else None
    if lesson is not None and first is not None and first.cell_type == "markdown" and first.source.startswith("# "):
        title, _, rest = first.source.partition("\n")
        first.source = f"{title}\n\n{lessons.header(lesson)}\n{rest}"   # its session and minutes
    nb.nbformat, nb.nbformat_minor = 4, 5
    nb.metadata = nbformat.from_dict({"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}})
    for index, cell in enumerate(nb.cells):
        cell.source = cell.source.strip("\n")
        cell.metadata = nbformat.from_dict(
            {k: cell.metadata[k] for k in KEPT_CELL_METADATA if cell.metadata.get(k)})
        cell.id = _cell_id(name, index, cell.cell_type, cell.source)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.pop("attachments", None)
    nbformat.validate(nb)
    return nb


def student_edition(nb):
    """A copy of a built notebook without its answer-key cells (their ids are kept: a cell's id
    names the same cell in both editions)."""
    import copy

    out = copy.deepcopy(nb)
    out.cells = [c for c in out.cells if ANSWER_KEY_TAG not in c.get("metadata", {}).get("tags", [])]
    return out


def render(nb) -> str:
    """The exact text written to disk (nbformat's JSON layout plus a newline)."""
    import nbformat

    text = nbformat.writes(nb, version=4)
    return text if text.endswith("\n") else text + "\n"


def _tables(source_dir: Path, readme: Path | None) -> list[tuple[Path, str, str]]:
    """(file, text now, text with the lesson table from servelab/course/lessons.py) for every file with markers."""
    out = [(src, src.read_text(encoding="utf-8")) for src in sorted(source_dir.glob("*.md"))]
    out = [(path, text, lessons.with_table(text)) for path, text in out if lessons.TABLE_START in text]
    if readme is not None:
        text = readme.read_text(encoding="utf-8")
        out.append((readme, text, lessons.with_table(text, "notebooks/", numbered=True)))
    return out


def build(source_dir: Path = SOURCE_DIR, out_dir: Path | None = None, quiet: bool = False,
          readme: Path | None = None, student_dir: Path | None = None) -> list[Path]:
    """Write the lesson tables (in the sources, and ``readme`` when given), then every
    notebook whose bytes would change, and the student edition of each (``student_dir``: by
    default dist/student-edition/, or <out_dir>/student-edition/ beside notebooks built
    elsewhere); return the committed paths written."""
    student_dir = student_dir or (STUDENT_DIR if out_dir is None else out_dir / "student-edition")
    written = []
    for path, old, new in _tables(source_dir, readme):
        if new != old:
            path.write_text(new, encoding="utf-8")
            written.append(path)
            if not quiet:
                print(f"wrote the lesson table in {path.name}")
    student_dir.mkdir(parents=True, exist_ok=True)
    for item in notebooks(source_dir, out_dir):
        nb = build_notebook(item.source, item.name)
        text = render(nb)
        (student_dir / item.ipynb.name).write_text(render(student_edition(nb)), encoding="utf-8")
        old = item.ipynb.read_text(encoding="utf-8") if item.ipynb.exists() else None
        if old != text:
            item.ipynb.write_text(text, encoding="utf-8")
            written.append(item.ipynb)
            if not quiet:
                print(f"built {item.ipynb.relative_to(item.ipynb.parent.parent)}")
    return written


def cell_summary(nb) -> list[tuple[str, str, tuple[str, ...]]]:
    """What must match between source and .ipynb: (cell type, source, tags) per cell."""
    return [(c.cell_type, c.source.strip("\n"), tuple(c.metadata.get("tags", ()))) for c in nb.cells]


def check_sources(source_dir: Path = SOURCE_DIR, out_dir: Path | None = None,
                  readme: Path | None = None) -> list[str]:
    """Problems found (empty when every committed .ipynb matches its source and
    every lesson table, ``readme``'s too when given, matches servelab/course/lessons.py)."""

    try:
        items = notebooks(source_dir, out_dir)
    except ValueError as err:
        return [str(err)]
    if not items:
        return [f"no notebook sources in {source_dir}"]
    problems = [f"{path.name}: lesson table differs from servelab/course/lessons.py; run `python -m servelab notebooks build`"
                for path, old, new in _tables(source_dir, readme) if new != old]
    out_dir = out_dir or source_dir.parent
    known = {item.ipynb.name for item in items}
    for stray in sorted(out_dir.glob("*.ipynb")):
        if stray.name not in known:
            problems.append(f"{stray.name}: no source {stray.stem}.md in {source_dir.name}/ (add one or delete it)")
    for item in items:
        problems += _check_notebook(item)
    return problems


def _check_notebook(item) -> list[str]:
    """One committed .ipynb against its source: present, same cells, no outputs, the kit's kernel."""
    import nbformat

    if not item.ipynb.exists():
        return [f"{item.ipynb.name}: missing; run `python -m servelab notebooks build`"]
    problems = []
    committed = nbformat.read(item.ipynb, as_version=4)
    built = build_notebook(item.source, item.name)
    want, have = cell_summary(built), cell_summary(committed)
    if want != have:
        problems.append(f"{item.ipynb.name}: differs from {item.source.name}: {_first_difference(want, have)}")
    for cell in committed.cells:
        if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count") is not None):
            problems.append(f"{item.ipynb.name}: has outputs (cell {cell.get('id')}); commit notebooks without outputs")
            break
    if committed.metadata.get("kernelspec", {}).get("name") != KERNELSPEC["name"]:
        problems.append(f"{item.ipynb.name}: kernelspec is not {KERNELSPEC['name']!r}")
    return problems


def _first_difference(want, have) -> str:
    for i, (w, h) in enumerate(zip(want, have)):
        if w != h:
            field = "type" if w[0] != h[0] else "source" if w[1] != h[1] else "tags"
            return f"cell {i} {field} differs (source: {w[1][:60]!r}... notebook: {h[1][:60]!r}...)"
    return f"source has {len(want)} cells, notebook has {len(have)}"


def pull(name: str, source_dir: Path = SOURCE_DIR, out_dir: Path | None = None) -> Path:
    """Write the cells of a .ipynb edited in Jupyter back into its MyST source."""
    import jupytext
    import nbformat

    item = next((nb for nb in notebooks(source_dir, out_dir) if nb.name == name), None)
    if item is None:
        raise ValueError(f"no notebook named {name!r}")
    nb = nbformat.read(item.ipynb, as_version=4)
    # a cell as built from the source keeps the source's text: its {{ref:...}} placeholders stay
    template = jupytext.reads(item.source.read_text(encoding="utf-8"), fmt=SOURCE_FORMAT).cells
    built = build_notebook(item.source, item.name).cells
    for i, cell in enumerate(nb.cells):
        if i < len(built) and cell.cell_type == built[i].cell_type and cell.source == built[i].source:
            cell.source = template[i].source.strip("\n")
    for cell in nb.cells:
        keep = {k: cell.metadata[k] for k in KEPT_CELL_METADATA if cell.metadata.get(k)}
        cell.metadata = nbformat.from_dict(keep)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata = nbformat.from_dict({"kernelspec": dict(KERNELSPEC)})
    item.source.write_text(jupytext.writes(nb, fmt=SOURCE_FORMAT), encoding="utf-8")
    return item.source


def runs_label(source: str) -> str | None:
    """The "# runs ..." label a code block starts with, or None."""
    first = source.lstrip("\n").split("\n", 1)[0].strip()
    return first if first in lessons.RUNS_LABELS else None


# --------------------------------------------------------------------------
# Command line


def add_parser(sub) -> None:
    p = sub.add_parser("notebooks", help="build the lab notebooks (.ipynb) from their text sources, or check them")
    nsub = p.add_subparsers(dest="notebooks_command", metavar="ACTION")
    nsub.required = True
    b = nsub.add_parser("build", help="write notebooks/*.ipynb from notebooks/src/*.md")
    b.set_defaults(func=_cmd_build)
    c = nsub.add_parser("check", help="fail if a committed notebook differs from its source or has outputs")
    c.set_defaults(func=_cmd_check)
    pl = nsub.add_parser("pull", help="copy a notebook edited in Jupyter back into its source")
    pl.add_argument("name", help="notebook name, e.g. 4_fastapi")
    pl.set_defaults(func=_cmd_pull)


def _cmd_build(args) -> int:
    written = build(readme=README)
    if not written:
        print("notebooks are up to date")
    print(f"student edition (no answer keys): {STUDENT_DIR.relative_to(paths.REPO_ROOT)}/")
    return 0


def _cmd_check(args) -> int:
    problems = check_sources(readme=README)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        print("run `python -m servelab notebooks build` and commit the result", file=sys.stderr)
        return 1
    print(f"{len(notebooks())} notebooks match their sources")
    return 0


def _cmd_pull(args) -> int:
    try:
        src = pull(args.name)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {src}; review it with `git diff`, then run `python -m servelab notebooks build`")
    return 0
