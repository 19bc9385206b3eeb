"""Execute one lab notebook inside the running Jupyter container (the compose check's notebook step).

Run by the check as ``docker exec jupyter python3 -m servelab.composecheck.incontainer NAME``, with
the container's own Python and packages, the kit from the mounted clone, and the environment Compose
gave the container (service names as URLs). Standard library + what JupyterLab brings (nbclient).

A notebook tells the student to run some commands on the node between its cells (fenced ``bash``
blocks that start with ``# runs on node-serve-system``). Before the first code cell after such a
block, this runner writes the block to ``<handoff>/request-N.sh`` and waits for the check, on the
node, to run it and write ``<handoff>/done-N`` (its exit code). So those commands run as written,
where the student runs them, and the notebook goes on as it would for the student.

The notebook runs through ``servelab.course.reference.run_notebook``, as ``make reference`` runs it (saved
before its hand-in cell, as the student saves it). The executed notebook is left in the handoff folder,
whole (``NAME.ipynb``) and trimmed as ``make reference`` trims it (``NAME.trimmed.ipynb``): the node's
reference bundle (``servelab.node.reference``) is made of these.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from servelab.course import reference
from servelab.node.labrun import write_whole

NODE_BLOCK = re.compile(r"```bash\n(# runs on node-serve-system\n.*?)```", re.S)


def node_commands(markdown: str) -> list[str]:
    """The node-side bash blocks in a markdown cell, each as one script."""
    return [m.group(1) for m in NODE_BLOCK.finditer(markdown)]


def handoff_hook(nb, handoff: Path, timeout: float, opened: bool = False, log=print):
    """nbclient on_cell_execute hook: hand every pending node block to the check, wait for each.
    ``opened``: the blocks before the first code cell ("before you run any cell here") already ran."""
    first_code = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), 0)
    state = {"last": first_code - 1 if opened else -1, "n": 0}

    def hook(cell, cell_index, **_):
        pending = []
        for md in nb.cells[state["last"] + 1:cell_index]:
            if md.cell_type == "markdown":
                pending += node_commands(md.source)
        state["last"] = cell_index
        for script in pending:
            state["n"] += 1
            n = state["n"]
            write_whole(handoff / f"request-{n}.sh", script)
            log(f"[node] cell {cell_index}: waiting for the node to run:\n{script.rstrip()}", flush=True)
            done = handoff / f"done-{n}"
            deadline = time.monotonic() + timeout
            while not done.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the node did not run request {n} within {timeout:.0f} s")
                time.sleep(0.5)
            log(f"[node] request {n} exited {done.read_text().strip()}", flush=True)
    return hook


def main(argv=None) -> int:
    import nbformat

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="notebook name, e.g. 4_fastapi")
    parser.add_argument("--scale", default="reduced", choices=sorted(reference.SCALES))
    parser.add_argument("--handoff", type=Path, required=True, help="folder shared with the check")
    parser.add_argument("--hand-edit", metavar="REPO", type=Path,
                        help="make notebook 6's hand edit of REPO/food_classifier/config.pbtxt")
    parser.add_argument("--opened", action="store_true",
                        help="the node blocks before the first code cell were run before the notebook opened")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args(argv)

    nb = nbformat.read(reference.notebooks.NOTEBOOKS_DIR / f"{args.name}.ipynb", as_version=4)
    env = dict(os.environ)
    env.update(reference.SCALES[args.scale].get(args.name, {}))
    env["SERVELAB_RESULTS_DIR"] = str(args.handoff / "results")
    handoff = handoff_hook(nb, args.handoff, args.timeout, args.opened)
    edit = reference._hand_edit(args.hand_edit) if args.hand_edit else None

    def on_cell_execute(cell, cell_index, **kw):
        handoff(cell=cell, cell_index=cell_index)
        if edit:
            edit(cell=cell, cell_index=cell_index)

    started = time.monotonic()
    error = None
    try:
        reference.run_notebook(args.name, env, hooks={"on_cell_execute": on_cell_execute},
                               timeout=int(args.timeout), nb=nb)
    except Exception as err:  # a failing cell: report it with the checks so far
        error = f"{type(err).__name__}: {str(err)[-2000:]}"
    out = args.handoff / f"{args.name}.ipynb"
    nbformat.write(nb, out)
    trimmed = reference.trim(nbformat.reads(nbformat.writes(nb), as_version=4))   # a copy, as make reference keeps it
    nbformat.write(trimmed, args.handoff / f"{args.name}.trimmed.ipynb")
    summary = {"notebook": args.name, "seconds": round(time.monotonic() - started, 1),
               "checks": reference._counts(nb), "failed": reference.failed_checks(nb), "error": error,
               "python": sys.version.split()[0], "executed": str(out), "scale": args.scale,
               "settings": reference.SCALES[args.scale].get(args.name, {}),
               "source_sha256": reference.source_hash(reference.notebooks.SOURCE_DIR / f"{args.name}.md")}
    print("SUMMARY " + json.dumps(summary), flush=True)
    return 1 if error else 0


if __name__ == "__main__":
    raise SystemExit(main())
