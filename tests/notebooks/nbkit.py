"""Helpers for the notebook tests (imported as ``from .nbkit import ...``): run a
built notebook in a real Jupyter kernel (nbclient) with a chosen environment,
and collect its output."""

from __future__ import annotations

import os
import re
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


def image_kernel(python_env: Path):
    """A kernel manager whose kernel is ``python_env``'s interpreter (a virtualenv
    with ipykernel, e.g. a Jupyter image's package set from tests/images/imagekit.py).
    Its kernelspec is written into the environment once, naming that interpreter."""
    import subprocess

    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    prefix = python_env / "kernelspec"
    kernels = prefix / "share" / "jupyter" / "kernels"
    if not (kernels / "servelab-image" / "kernel.json").exists():
        subprocess.run([str(python_env / "bin" / "python"), "-m", "ipykernel", "install", "--prefix", str(prefix),
                        "--name", "servelab-image"], check=True, capture_output=True, timeout=120)
    return KernelManager(kernel_name="servelab-image", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))


def image_kernel_env(python_env: Path, tools: Path | None = None, **extra: str) -> dict[str, str]:
    """The kernel's environment as the Jupyter container has it: Compose's PYTHONPATH and
    SERVELAB_ROOT (the clone), the image's Python first on PATH (``tools`` before it: what
    the base image adds), the kit's venv off PATH; plus ``extra``."""
    env = base_kernel_env(**extra)
    env.pop("VIRTUAL_ENV", None)
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["SERVELAB_ROOT"] = str(REPO_ROOT)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # Dockerfile.jupyter's ENV
    kit_bin = str(Path(sys.executable).parent)
    path = [p for p in env["PATH"].split(os.pathsep) if p and p != kit_bin]
    env["PATH"] = os.pathsep.join([*([str(tools)] if tools else []), str(python_env / "bin"), *path])
    return env


def run_notebook(name: str, env: dict[str, str], timeout: int = 300, hooks: dict | None = None,
                 python_env: Path | None = None):
    """Execute notebooks/<name>.ipynb as committed; return the executed notebook.

    The kernel starts in notebooks/ (as Jupyter does) with exactly ``env``, served by
    this interpreter, or by ``python_env``'s (see :func:`image_kernel`).
    A failing cell raises nbclient's CellExecutionError with the traceback.
    ``hooks`` are nbclient's (e.g. ``on_cell_execute=fn(cell, cell_index)``, called
    just before a cell runs): how a test does what the student does between cells.
    """
    import nbformat

    from servelab.course import nbexec
    from tests import tiers

    tiers.require("e2e", f"executes notebook {name}")
    nb = nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4)
    kw = {"km": image_kernel(python_env)} if python_env else {"kernel_name": ensure_kernelspec()}
    client = nbexec.NotebookClient(
        nb, timeout=timeout, allow_errors=False, **kw,
        resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}, **(hooks or {}),
    )
    client.execute(env=env)
    if python_env:  # the kernel manager we made; nbclient drops one it made itself after the run
        LAST_KERNEL_ARGV[:] = kw["km"].kernel_spec.argv
    else:
        from jupyter_client.kernelspec import KernelSpecManager

        LAST_KERNEL_ARGV[:] = KernelSpecManager().get_kernel_spec(kw["kernel_name"]).argv
    return nb


LAST_KERNEL_ARGV: list[str] = []  # the command of the last kernel run_notebook started


def cell_text(cell) -> str:
    """Everything a code cell printed (stdout, stderr, text results)."""
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif out.get("output_type") in ("execute_result", "display_data"):
            text = out.get("data", {}).get("text/plain", "")   # a result ends its line: what follows starts one
            parts.append(text if not text or text.endswith("\n") else text + "\n")
        elif out.get("output_type") == "error":
            parts.append("\n".join(out.get("traceback", [])))
    return "".join(parts)


def cell_output(nb, source_marker: str) -> str:
    """What the one code cell whose source holds ``source_marker`` printed."""
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and source_marker in c.source]
    return cell_text(cell)


def printed_statuses(output: str) -> list[int]:
    """The HTTP statuses a cell printed as ``print(r.status_code, r.json())`` does: a line that
    starts with a three-digit status and then the JSON body's dict."""
    return [int(s) for s in re.findall(r"^([1-5][0-9]{2}) \{", output, re.M)]


# What each notebook test's lesson checks came to: how many were judged (passed or failed), how many
# were inconclusive (a busy machine spoiled their runs), and whether a first try missed and the
# notebook ran again. tests/notebooks/conftest.py hands them to the session's summary.
LESSON_CHECKS: list[dict] = []


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
