"""What a student hands in: the executed notebook and the figures it measured.

The last cell of notebooks 4, 6, 6a, 6b and 6c calls :func:`save`:

    from servelab.course import handin
    handin.save("6_triton", figures={"python_c1": py_c1, ...})

It writes ``results/<notebook>-<time>/`` with

* ``<notebook>.ipynb``: the notebook as last saved by Jupyter (save it first,
  Ctrl+S, so the file holds your outputs and plots);
* ``figures.json``: the measurements the notebook's variables hold;
* ``README.txt``: when, where (host, Triton/FastAPI URLs) and what is inside;

and packs that folder into ``results/<notebook>-<time>.zip`` to upload, then says
how to get the zip off the machine now (:func:`where_to_fetch`): on Chameleon
the node's disk goes with the lease.
``SERVELAB_RESULTS_DIR`` moves ``results/`` elsewhere.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import zipfile
from pathlib import Path

from servelab.core import paths
from servelab.course import lab


def results_dir() -> Path:
    return Path(os.environ.get("SERVELAB_RESULTS_DIR") or paths.RESULTS_DIR)


def _jsonable(value):
    """Figures as JSON: numpy numbers and arrays, nested dicts, objects with as_dict()."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):          # numpy scalars and arrays
        return value.tolist()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def _output_count(ipynb: Path) -> int:
    try:
        nb = json.loads(ipynb.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    return sum(len(c.get("outputs", [])) for c in nb.get("cells", []) if c.get("cell_type") == "code")


def save(notebook: str, figures: dict | None = None, notebook_dir: Path | None = None,
         now: _dt.datetime | None = None) -> Path:
    """Copy the saved notebook and the figures into results/, zip them; return the zip's path."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    stamp = now.strftime("%Y%m%d-%H%M%S")
    out = results_dir() / f"{notebook}-{stamp}"
    n = 1
    while out.exists():                    # run twice within a second: keep both
        n += 1
        out = results_dir() / f"{notebook}-{stamp}-{n}"
    out.mkdir(parents=True)
    # the notebook's own folder (the kernel's); SERVELAB_NOTEBOOK_DIR where it is saved elsewhere
    source = Path(notebook_dir or os.environ.get("SERVELAB_NOTEBOOK_DIR") or Path.cwd()) / f"{notebook}.ipynb"
    outputs = 0
    if source.is_file():
        shutil.copy2(source, out / source.name)
        outputs = _output_count(source)
    (out / "figures.json").write_text(json.dumps(_jsonable(figures or {}), indent=2, sort_keys=True) + "\n",
                                      encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if k in ("TRITON_SERVER_URL", "FASTAPI_SERVER_URL", "FASTAPI_ONNX_URL")}
    (out / "README.txt").write_text(
        f"{notebook}, saved {now.isoformat(timespec='seconds')}\n"
        f"machine: {platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs, {platform.system()})\n"
        f"servers: {json.dumps(env)}\n"
        f"files: {notebook}.ipynb (the notebook as Jupyter last saved it), figures.json (measurements)\n",
        encoding="utf-8")
    archive = out.with_suffix(".zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(out.iterdir()):
            z.write(path, f"{out.name}/{path.name}")
    print(f"hand in: {archive}  ({archive.stat().st_size / 1024:.0f} KB)")
    print(f"  {out.name}/figures.json: {len(figures or {})} measurement(s)")
    if not source.is_file():
        print(f"  ✘ {source} not found: open the notebook from its folder, or copy it in by hand")
    elif outputs == 0:
        print(f"  ✘ {source.name} on disk has no outputs yet: save the notebook (Ctrl+S), then run this cell again")
    else:
        print(f"  {source.name}: {outputs} cell output(s), as saved {_dt.datetime.fromtimestamp(source.stat().st_mtime):%H:%M:%S}")
    for line in where_to_fetch(archive):
        print(line)
    return archive


def where_to_fetch(archive: Path, root: Path | None = None) -> list[str]:
    """How to get the zip off this machine now, with its exact path.

    On Chameleon the Jupyter container's file browser starts at the kit's folder
    (mounted from ``~/serve-system-chi`` on the node), and the node's disk goes
    with the lease: the student downloads the zip at once, or copies results/ to
    Chameleon Jupyter with 7_delete_resources' copy cell, which deletes nothing."""
    from servelab.node import leaseclock

    root = Path(root or paths.REPO_ROOT).resolve()
    try:
        rel = Path(archive).resolve().relative_to(root)
    except ValueError:
        return [f"download it now: {Path(archive).resolve()}"]
    lines = [f"download it now: in JupyterLab's file browser open {rel.parent.as_posix()}/, "
             f"right-click {rel.name} > Download"]
    try:
        clock, left = leaseclock.message(root)
    except ValueError:
        clock, left = "", None
    if left is not None:  # on the lease's node
        lines.append(f"  on node-serve-system: ~/{paths.KIT_DIR_ON_NODE}/{rel.as_posix()}. It goes with the node when the "
                     "lease ends; in Chameleon Jupyter, 7_delete_resources' first two cells ('Copy your work back') "
                     "copy every results/ zip there, any time, and delete nothing.")
        lines.append("  " + clock)
    return lines


# --------------------------------------------------------------------------
# Collecting a class's zips (the instructor's side: docs/instructor-guide.md)
#
#     python -m servelab.course.handin collect FOLDER [--out grading.md]

# What a zip may hold before it is refused unread: students upload these files, so nothing in one is
# extracted to disk, and no member is read past this size (a zip bomb stops here).
MAX_MEMBER_BYTES = 64 * 1024 * 1024
CHECK_MARKS = {"passed": lab.CHECK_PASS, "failed": lab.CHECK_FAIL, "inconclusive": lab.CHECK_INCONCLUSIVE}
UNWRITTEN = "double-click here and write it"   # the text an answer cell starts with (notebooks/src)


def _read_member(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    if info.file_size > MAX_MEMBER_BYTES:
        raise ValueError(f"{info.filename}: {info.file_size} bytes unpacked, more than {MAX_MEMBER_BYTES}")
    with z.open(info) as f:
        data = f.read(MAX_MEMBER_BYTES + 1)   # the header's size may lie: never read past the limit
    if len(data) > MAX_MEMBER_BYTES:
        raise ValueError(f"{info.filename}: more than {MAX_MEMBER_BYTES} bytes unpacked")
    return data


def _text(x) -> str:
    return "".join(x) if isinstance(x, list) else (x or "")


def summarize(nb: dict) -> dict:
    """One saved notebook: its checks as printed (✔ / ✘ / ?) and its answer cells, written or not."""
    printed = "\n".join(_text(o.get("text")) for c in nb.get("cells", []) if c.get("cell_type") == "code"
                        for o in c.get("outputs", []))
    checks = {k: printed.count(mark) for k, mark in CHECK_MARKS.items()}
    answers = [_text(c.get("source")).strip() for c in nb.get("cells", [])
               if c.get("cell_type") == "markdown" and "answer" in (c.get("metadata", {}).get("tags") or [])]
    written = [a for a in answers if UNWRITTEN not in a]
    outputs = sum(len(c.get("outputs", [])) for c in nb.get("cells", []) if c.get("cell_type") == "code")
    return {"checks": checks, "answers": len(answers), "written": written, "outputs": outputs}


def collect(folder: Path) -> list[dict]:
    """Every hand-in zip under ``folder`` (any depth, e.g. one folder per student), read without
    extracting: per zip and notebook, when it was saved, its checks and its written answers. A zip
    that cannot be read is listed with the reason."""
    rows = []
    for archive in sorted(Path(folder).rglob("*.zip")):
        rel = archive.relative_to(folder).as_posix()
        try:
            with zipfile.ZipFile(archive) as z:
                members = {i.filename: i for i in z.infolist() if not i.is_dir()}
                found = False
                for name, info in sorted(members.items()):
                    if not name.endswith(".ipynb"):
                        continue
                    found = True
                    nb = json.loads(_read_member(z, info).decode("utf-8"))
                    readme = members.get(name.rsplit("/", 1)[0] + "/README.txt") if "/" in name else None
                    saved = _read_member(z, readme).decode("utf-8", "replace").splitlines()[0] if readme else ""
                    rows.append({"zip": rel, "notebook": Path(name).stem, "saved": saved, **summarize(nb)})
                if not found:
                    rows.append({"zip": rel, "error": "no notebook (.ipynb) in it"})
        except (zipfile.BadZipFile, ValueError, UnicodeDecodeError, OSError) as err:
            rows.append({"zip": rel, "error": f"{type(err).__name__}: {err}"[:300]})
    return rows


def report(rows: list[dict]) -> str:
    """A grader's page: one table row per notebook handed in, then each one's written answers."""
    out = ["| zip | notebook | checks ✔ / ✘ / ? | answers written | cell outputs |", "|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['zip']} | (unreadable: {r['error']}) | | | |")
            continue
        c = r["checks"]
        out.append(f"| {r['zip']} | {r['notebook']} | {c['passed']} / {c['failed']} / {c['inconclusive']} | "
                   f"{len(r['written'])} of {r['answers']} | {r['outputs']} |")
    for r in rows:
        if r.get("written"):
            out += ["", f"## {r['zip']}: {r['notebook']}", ""]
            out += [f"{i}. {a}" for i, a in enumerate(r["written"], 1)]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m servelab.course.handin",
                                description="Read a class's hand-in zips: checks and written answers per notebook.")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="summarize every .zip under FOLDER (nothing is extracted)")
    c.add_argument("folder", type=Path)
    c.add_argument("--out", type=Path, help="write the page here too (markdown)")
    args = p.parse_args(argv)
    if not args.folder.is_dir():
        p.error(f"{args.folder}: not a folder")
    page = report(collect(args.folder))
    print(page, end="")
    if args.out:
        args.out.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
