"""Helpers for the notebook tests (imported as ``from .nbkit import ...``): run a
built notebook in a real Jupyter kernel (nbclient) with a chosen environment,
and collect its output."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"


def ensure_kernelspec() -> str:
    """The kernel the notebooks name (python3), served by this interpreter.

    ipykernel's wheel ships a python3 kernelspec in the venv; if it is missing
    (another install layout), install one with `python -m ipykernel install
    --sys-prefix`, exactly what the Makefile does.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        import subprocess

        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix"], check=True,
                       capture_output=True)
    return "python3"


def run_notebook(name: str, env: dict[str, str], timeout: int = 300, hooks: dict | None = None):
    """Execute notebooks/<name>.ipynb as committed; return the executed notebook.

    The kernel starts in notebooks/ (as Jupyter does) with exactly ``env``.
    A failing cell raises nbclient's CellExecutionError with the traceback.
    ``hooks`` are nbclient's (e.g. ``on_cell_execute=fn(cell, cell_index)``, called
    just before a cell runs): how a test does what the student does between cells.
    """
    import nbclient
    import nbformat

    nb = nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        nb, kernel_name=ensure_kernelspec(), timeout=timeout, allow_errors=False,
        resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}, **(hooks or {}),
    )
    client.execute(env=env)
    return nb


def cell_text(cell) -> str:
    """Everything a code cell printed (stdout, stderr, text results)."""
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif out.get("output_type") in ("execute_result", "display_data"):
            parts.append(out.get("data", {}).get("text/plain", ""))
        elif out.get("output_type") == "error":
            parts.append("\n".join(out.get("traceback", [])))
    return "".join(parts)


def notebook_text(nb) -> str:
    return "\n".join(cell_text(c) for c in nb.cells if c.cell_type == "code")


def base_kernel_env(**extra: str) -> dict[str, str]:
    """The test process's environment without OpenStack settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OS_")}
    env.pop("JUPYTER_PLATFORM_DIRS", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("MPLBACKEND", None)
    env.update(extra)
    return env
