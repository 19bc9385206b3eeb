"""`servelab reference`: the committed reference run in ``docs/reference/``.

    python -m servelab reference build [--scale lesson|reduced]   # `make reference`
    python -m servelab reference check                            # stale? (exit 1)

One real run of the kit on this machine, kept in the repository so that a
learner with only a browser sees what the lab's measuring notebooks print and
plot (the published site renders it, ``servelab.course.site``):

* ``4_fastapi``, ``6_triton``, ``6a_triton_pipeline``, ``6e_accelerate`` and
  ``6f_token_streaming`` (``.ipynb``): the notebooks executed in a real kernel
  against the kit's local stack (FastAPI services; the real Triton and
  perf_analyzer), their outputs trimmed and their plots kept as PNG;
* ``tour/report.md`` and ``tour/*.png``: the benchmark tour's report and plots;
* ``manifest.json``: the machine, the date, the kit's commit, the scale, and the
  SHA-256 of every notebook source the run was made from. The staleness check
  compares those hashes with ``notebooks/src/`` today: an edited lesson makes
  the committed reference stale until it is regenerated.

``--scale lesson`` (the default) runs the notebooks with the request counts a
student's run uses and the tour at scale 1. ``--scale reduced`` uses the
notebook tests' smaller counts and the tour at scale 0.3: for a quick try of
the machinery, and labelled so on every page.

Each page says "CPU reference: your numbers will differ": this is one machine's
run without a GPU, not a target to hit.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servelab.core import paths, procs
from servelab.course import answer_keys, lab, notebooks

COMMITTED_DIR = paths.REPO_ROOT / "docs" / "reference"
MANIFEST = "manifest.json"
NOTE = "CPU reference: your numbers will differ"
NOTEBOOKS = ("4_fastapi", "6_triton", "6a_triton_pipeline", "6e_accelerate", "6f_token_streaming")

# Trimming: a stream output longer than this keeps its head and tail.
MAX_LINES, HEAD_LINES, TAIL_LINES = 80, 60, 15
KEPT_MIME = ("image/png", "text/markdown", "text/plain")   # text/markdown: the tables display(Markdown(...)) shows

# Environment per scale and notebook (the notebooks read these; unset = the lesson's own counts).
SCALES = {
    "lesson": {"tour": 1.0, "4_fastapi": {}, "6_triton": {}, "6a_triton_pipeline": {}, "6b_model_analyzer": {},
               "6c_scale_out": {}, "6e_accelerate": {}, "6f_token_streaming": {}},
    "reduced": {  # the notebook tests run at these sizes (tests/notebooks/test_measurement_notebooks.py)
        "tour": 0.3,
        "4_fastapi": {"SERVELAB_NB_SEQUENTIAL": "20", "SERVELAB_NB_CONCURRENT": "48", "SERVELAB_NB_SWEEP": "32"},
        "6_triton": {
            # Three windows of 16 requests, no stability search: bounded time. (--request-count
            # reports requests / whole seconds: 48 requests in 2.4 s read as 16.0 infer/s.)
            "SERVELAB_NB_PERF_ARGS": "--measurement-mode count_windows --measurement-request-count 16 "
                                     "--stability-percentage 100",
            # the -b 16 run: windows of 4 requests (64 images each; 16 requests took ~25 s on 2 cores)
            "SERVELAB_NB_BATCH_ARGS": "--measurement-mode count_windows --measurement-request-count 4 "
                                      "--stability-percentage 100",
            # request-rate runs: perf_analyzer refuses a count below the rate (0.5 / S(1), ~60-90/s here)
            # each arrival-pattern and knob run: 4 s (~250 requests at half the capacity; six runs)
            "SERVELAB_NB_RATE_ARGS": "--request-count 200", "SERVELAB_NB_RUN_SECONDS": "4",
            # the load sweep at reduced size: three points, short runs
            "SERVELAB_NB_SWEEP_SECONDS": "2", "SERVELAB_NB_SWEEP_FACTORS": "0.5,1.0,2.0",
            "SERVELAB_NB_BATCH_REQUESTS": "4",
            "SERVELAB_NB_TRACE_REQUESTS": "24",   # the traced requests per model and concurrency
        },
        # 6c (tests/notebooks/test_6c_scale_out.py): one load, a three-step ramp, short runs
        "6c_scale_out": {"SERVELAB_NB_SCALE_SECONDS": "4", "SERVELAB_NB_SCALE_RHOS": "0.6",
                         "SERVELAB_NB_RAMP_FACTORS": "0.3,0.6,1.3", "SERVELAB_NB_RAMP_SECONDS": "4",
                         "SERVELAB_NB_SCALE_ATTEMPTS": "1"},
        "6a_triton_pipeline": {  # tests/notebooks/test_6a_triton_pipeline.py
            "SERVELAB_NB6A_REQUESTS": "24", "SERVELAB_NB6A_SWEEP_SECONDS": "2", "SERVELAB_NB6A_SWEEP_FACTORS": "0.5,1.0",
            "SERVELAB_NB6A_WARMUP_ROUNDS": "2", "SERVELAB_NB6A_ROLLOUT_SECONDS": "8",
            "SERVELAB_NB6A_CASCADE_REQUESTS": "8",
            # past capacity: one factor, far enough past it that a busy machine's capacity reading still overloads
            "SERVELAB_NB6A_OVERLOAD_SECONDS": "3", "SERVELAB_NB6A_OVERLOAD_FACTORS": "2.0",
        },
        # 6e (tests/notebooks/test_6e_accelerate.py): no torch.compile (its compile alone is ~20-40 s on 2 cores),
        # 3 rounds of 5 requests after 2 warm-ups, one thread per variant (two threads of eager PyTorch took
        # 2 s a request beside other work), 32 generated images, perf_analyzer windows of 2 requests, one repeat
        "6e_accelerate": {
            "SERVELAB_NB6E_ROUNDS": "3", "SERVELAB_NB6E_PER_ROUND": "5", "SERVELAB_NB6E_GENERATED": "32",
            "SERVELAB_NB6E_COMPILE": "0", "SERVELAB_NB6E_REPEATS": "1", "SERVELAB_NB6E_WARMUP": "2",
            "SERVELAB_NB6E_THREADS": "1",
            "SERVELAB_NB6E_PERF_ARGS": "--measurement-mode count_windows --measurement-request-count 2 "
                                       "--stability-percentage 100",
            "SERVELAB_NB6E_BATCH_ARGS": "--measurement-mode count_windows --measurement-request-count 2 "
                                        "--stability-percentage 100",
        },
        # 6f (tests/notebooks/test_6f_token_streaming.py): the lesson's top rate for 12 s, short requests
        # shorter (with 96-token long ones at 6/s, most requests found the model idle: no wait to see)
        "6f_token_streaming": {"SERVELAB_NB6F_RATES": "2", "SERVELAB_NB6F_DURATION": "12",
                               "SERVELAB_NB6F_LENGTHS": "8,256"},
        # 6b: Model Analyzer on its smallest useful space (its default + one variant, 2 concurrencies)
        "6b_model_analyzer": {
            "SERVELAB_NB_MA_INSTANCES": "1", "SERVELAB_NB_MA_BATCH": "4", "SERVELAB_NB_MA_DELAYS": "0",
            "SERVELAB_NB_MA_CONCURRENCY": "1,2", "SERVELAB_NB_MA_WINDOW": "16",
            # the final sweep: 96 requests a point (~0.6 s; 24 once read x0.62 of the tool's figure, then x0.83)
            "SERVELAB_NB_BATCH_REQUESTS": "4", "SERVELAB_NB_VERIFY_REQUESTS": "96",
        },
    },
}


# --------------------------------------------------------------------------
# Source hashes and staleness


def source_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_hashes(source_dir: Path = notebooks.SOURCE_DIR, names=NOTEBOOKS) -> dict[str, str]:
    return {f"{name}.md": source_hash(source_dir / f"{name}.md") for name in names}


def read_manifest(reference_dir: Path = COMMITTED_DIR) -> dict | None:
    path = reference_dir / MANIFEST
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def stale(reference_dir: Path = COMMITTED_DIR, source_dir: Path = notebooks.SOURCE_DIR) -> list[str]:
    """Why the reference in ``reference_dir`` no longer matches the sources (empty: it matches)."""
    manifest = read_manifest(reference_dir)
    if manifest is None:
        return [f"no {MANIFEST} in {reference_dir}: run `make reference`"]
    problems = []
    recorded = manifest.get("sources", {})
    for name in NOTEBOOKS:
        key = f"{name}.md"
        if key not in recorded:
            problems.append(f"{key}: not in the reference's {MANIFEST}")
        elif recorded[key] != source_hash(source_dir / key):
            problems.append(f"{key} changed since the reference was run "
                            f"(recorded sha256 {recorded[key][:12]}, now {source_hash(source_dir / key)[:12]})")
        if not (reference_dir / f"{name}.ipynb").is_file():
            problems.append(f"{name}.ipynb missing from {reference_dir}")
    if not (reference_dir / "tour" / "report.md").is_file():
        problems.append(f"tour/report.md missing from {reference_dir}")
    return problems


def label(manifest: dict) -> str:
    """The one-line label every reference page carries."""
    scale = manifest.get("scale", "?")
    return (f"{NOTE}. Machine: {manifest.get('machine', 'unknown')}. Date: {manifest.get('date', 'unknown')}. "
            f"Kit commit: {manifest.get('commit', 'unknown')}. Scale: {scale}"
            + (" (smaller request counts than the lesson's)" if scale == "reduced" else "") + ".")


# --------------------------------------------------------------------------
# Trimming an executed notebook


def _shrink_png(data: bytes) -> bytes:
    """A plot as a 256-colour PNG when that is smaller (matplotlib's plots survive it unchanged to the eye)."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with the kit's torchvision
        return data
    img = Image.open(io.BytesIO(data)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue() if buf.tell() < len(data) else data


def _trim_text(text: str) -> str:
    lines = text.splitlines(keepends=True)
    if len(lines) <= MAX_LINES:
        return text
    cut = len(lines) - HEAD_LINES - TAIL_LINES
    return "".join(lines[:HEAD_LINES] + [f"... [{cut} lines trimmed in the reference run] ...\n"]
                   + lines[-TAIL_LINES:])


def trim(nb):
    """Outputs a reader needs, and no more: streams cut to their head and tail, results and
    displays reduced to a PNG or plain text, run-time metadata dropped."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if kind == "stream":
                out["text"] = _trim_text(out.get("text", ""))
            elif kind in ("execute_result", "display_data"):
                data = out.get("data", {})
                keep = {k: data[k] for k in KEPT_MIME if k in data}
                if "image/png" in keep:
                    png = _shrink_png(base64.b64decode(keep["image/png"]))
                    keep = {"image/png": base64.b64encode(png).decode(), "text/plain": keep.get("text/plain", "")}
                elif "text/markdown" in keep:   # a table: whole (a cut table reads wrong), without the object's repr
                    keep = {"text/markdown": keep["text/markdown"]}
                elif "text/plain" in keep:
                    keep["text/plain"] = _trim_text(keep["text/plain"])
                out["data"] = keep
                out["metadata"] = {}
            kept.append(out)
        cell.outputs = kept
    return nb


# --------------------------------------------------------------------------
# Running


def git_commit(repo: Path = paths.REPO_ROOT) -> str:
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "servelab", "notebooks"],
                               check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" + uncommitted changes" if dirty else "")


def kernel_env(**extra: str) -> dict[str, str]:
    """This process's environment for the notebook's kernel: the kit importable, this venv first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OS_")}
    env.pop("JUPYTER_PLATFORM_DIRS", None)
    env.pop("MPLBACKEND", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(paths.REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


# Where a reference run's notebooks write their results (their hand-in zips): under results/, so a
# hand-in cell prints the path a student's prints; removed when the build ends.
RESULTS_ROOT = paths.RESULTS_DIR / "reference"


def results_folder(name: str) -> Path:
    return RESULTS_ROOT / name


def run_notebook(name: str, env: dict[str, str], hooks: dict | None = None, timeout: int = 1800, nb=None):
    """Execute notebooks/<name>.ipynb (as committed) in a fresh python3 kernel started in notebooks/.
    Before the hand-in cell (``handin.save``) the notebook as executed so far is saved where that cell
    reads it (``SERVELAB_NOTEBOOK_DIR``), as the student saves it (Ctrl+S) before running the cell.
    ``nb``: that notebook already read, executed in place (its outputs so far stay when a cell raises)."""
    import nbformat

    from servelab.course import nbexec

    if nb is None:
        nb = nbformat.read(notebooks.NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4)
    hooks = dict(hooks or {})
    edit = hooks.pop("on_cell_execute", None)
    saved = Path(tempfile.mkdtemp(prefix=f"servelab-saved-{name}-"))

    def on_cell_execute(cell, cell_index, **kw):
        if edit:
            edit(cell=cell, cell_index=cell_index, **kw)
        if "handin.save(" in cell.source:
            (saved / f"{name}.ipynb").write_text(nbformat.writes(nb), encoding="utf-8")

    client = nbexec.NotebookClient(nb, kernel_name="python3", timeout=timeout, allow_errors=False,
                                     resources={"metadata": {"path": str(notebooks.NOTEBOOKS_DIR)}},
                                     on_cell_execute=on_cell_execute, **hooks)
    try:
        client.execute(env={**env, "SERVELAB_NOTEBOOK_DIR": str(saved)})
    finally:
        shutil.rmtree(saved, ignore_errors=True)
    return nb


def failed_checks(nb) -> list[str]:
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []) if o.get("output_type") == "stream")
    # each failed check with what was measured (servelab.course.lab.check prints it on the next line)
    return [what + (f" (measured: {measured})" if measured else "") for what, measured in
            re.findall(rf"^{re.escape(lab.CHECK_FAIL)}: (.*)$\n?(?:\s+measured: (.*)$)?", text, re.M)]


def _counts(nb) -> dict[str, int]:
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []) if o.get("output_type") == "stream")
    return {k: len(re.findall(rf"^{re.escape(v)}: ", text, re.M))
            for k, v in (("passed", lab.CHECK_PASS), ("inconclusive", lab.CHECK_INCONCLUSIVE),
                         ("failed", lab.CHECK_FAIL))}


def _hand_edit(repo: Path):
    """Notebook 6's hand edit, as the student makes it in JupyterLab's editor before the
    reload cell: food_classifier's instance_group count 1 -> 2, gpus [ 0 ] -> [ 0, 1 ]."""
    def hook(cell, cell_index, **_):
        if "hand-edit" not in cell.metadata.get("tags", []):
            return
        path = repo / "food_classifier" / "config.pbtxt"
        text = path.read_text()
        at = text.index("instance_group")
        path.write_text(text[:at] + text[at:].replace("count: 1", "count: 2", 1).replace("gpus: [ 0 ]", "gpus: [ 0, 1 ]", 1))
    return hook


def _with_retry(run, name: str, results: Path, log):
    """Run; when a check failed (a busy machine), run once more as the notebook tells the student."""
    nb = run()
    missed = failed_checks(nb)
    if missed:
        log(f"  {name}: {len(missed)} check(s) missed ({'; '.join(missed)}); running it once more")
        shutil.rmtree(results, ignore_errors=True)
        nb = run()
    return nb


def _spoiled_key_figures(nb, name: str, work: Path) -> list[str]:
    """The answer keys' figures (answer_keys.PRINTED) this executed notebook does not give cleanly."""
    import nbformat

    probe = work / "probe"
    probe.mkdir(exist_ok=True)
    (probe / f"{name}.ipynb").write_text(nbformat.writes(nb), encoding="utf-8")
    values = answer_keys.reference_values(probe, strict=False)
    return [k for k, p in answer_keys.PRINTED.items() if p.notebook == name and values[k] == answer_keys.MISSING]


def run_4_fastapi(env_extra: dict, work: Path, log):
    from servelab.local import stack

    with stack.running(["fastapi_pt", "fastapi_onnx", "flask"], free_ports=True) as st:  # 4 retests the page
        env = kernel_env(**st.env, SERVELAB_RESULTS_DIR=str(results_folder("4_fastapi")), **env_extra)
        return _with_retry(lambda: run_notebook("4_fastapi", env), "4_fastapi", results_folder("4_fastapi"), log)


def _run_against_triton(name: str, env_extra: dict, work: Path, log, env_of, hooks_of=lambda repo: None,
                        models=None):
    """Run notebook ``name`` against the real local Triton serving a private copy of models_staging/
    (the notebooks edit configs); ``env_of(t, repo)`` is the kernel's Triton environment. A second
    call (a spoiled run again) starts from a fresh copy."""
    from servelab import triton

    repo = work / f"models-{name}"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(paths.REPO_ROOT / "models_staging", repo, ignore=shutil.ignore_patterns("__pycache__"))
    results = results_folder(name)
    with triton.running(repo, models=models, **triton.free_ports()) as t:
        env = kernel_env(**env_of(t, repo), SERVELAB_RESULTS_DIR=str(results), **env_extra)
        return _with_retry(lambda: run_notebook(name, env, hooks=hooks_of(repo)), name, results, log)


def run_6_triton(env_extra: dict, work: Path, log):
    return _run_against_triton(
        "6_triton", env_extra, work, log,
        lambda t, repo: dict(TRITON_SERVER_URL=t.url, TRITON_GRPC_URL=t.grpc_url, TRITON_METRICS_URL=t.metrics_url,
                             TRITON_MODEL_REPOSITORY=str(repo)),
        lambda repo: {"on_cell_execute": _hand_edit(repo)})


def run_6a_triton_pipeline(env_extra: dict, work: Path, log):
    # 6a reloads models with the admin key, adds a version policy and puts it back
    return _run_against_triton(
        "6a_triton_pipeline", env_extra, work, log,
        lambda t, repo: dict(TRITON_SERVER_URL=t.url, TRITON_GRPC_URL=t.grpc_url, TRITON_ADMIN_KEY=t.admin_key,
                             TRITON_MODEL_REPOSITORY=str(repo)))


def run_6e_accelerate(env_extra: dict, work: Path, log):
    # 6e times the model in its own kernel, then food_classifier_onnx in Triton with and without OpenVINO
    return _run_against_triton(
        "6e_accelerate", env_extra, work, log,
        lambda t, repo: dict(TRITON_SERVER_URL=t.url, TRITON_GRPC_URL=t.grpc_url, TRITON_ADMIN_KEY=t.admin_key,
                             TRITON_MODEL_REPOSITORY=str(repo)), models=["food_classifier_onnx"])


def run_6f_token_streaming(env_extra: dict, work: Path, log):
    # 6f: the kit's Triton serving models_streaming/ (nothing edits it), as the notebook's terminal line starts it
    from servelab import triton

    results = results_folder("6f_token_streaming")
    with triton.running(paths.MODELS_STREAMING, **triton.free_ports(),
                        workdir=work / "triton-6f") as t:
        env = kernel_env(TRITON_STREAMING_URL=t.url, TRITON_STREAMING_GRPC_URL=t.grpc_url,
                         SERVELAB_RESULTS_DIR=str(results), **env_extra)
        return _with_retry(lambda: run_notebook("6f_token_streaming", env), "6f_token_streaming", results, log)


def run_tour_into(dest: Path, scale: float, work: Path, log) -> dict:
    # `servelab tour` in its own process: the tour stands above the lab's text in the kit's layers
    # (CONTRIBUTING.md), so this module runs it by command rather than importing it.
    out = work / "tour"
    cmd = [sys.executable, "-m", "servelab", "tour", "--scale", str(scale), "--out", str(out)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=procs.child_env({"PYTHONPATH": str(paths.REPO_ROOT)})) as proc:
        for line in proc.stdout:
            log(f"  tour: {line.rstrip()}")
    if proc.returncode != 0 or not (out / "report.md").exists():
        raise RuntimeError(f"the tour failed (exit {proc.returncode}); its output is above")
    dest.mkdir(parents=True, exist_ok=True)
    for png in sorted(out.glob("*.png")):
        (dest / png.name).write_bytes(_shrink_png(png.read_bytes()))
    shutil.copy2(out / "report.md", dest / "report.md")
    return {"plots": sorted(p.name for p in dest.glob("*.png"))}


def build(reference_dir: Path = COMMITTED_DIR, scale: str = "lesson", log=print) -> dict:
    """Run the notebooks and the tour, and write the reference into ``reference_dir`` (replaced whole
    only when every part succeeded)."""
    import nbformat

    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r} (one of {', '.join(SCALES)})")
    problems = [p for p in notebooks.check_sources() if p.split(":")[0].split(".")[0] in NOTEBOOKS]
    if problems:
        raise RuntimeError("; ".join(problems) + " (run `python -m servelab notebooks build` first)")
    settings = SCALES[scale]
    started = time.perf_counter()
    manifest = {
        "note": NOTE, "machine": procs.machine_description(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(), "scale": scale, "tour_scale": settings["tour"],
        "sources": source_hashes(), "checks": {}, "settings": {n: settings[n] for n in NOTEBOOKS},
    }
    with tempfile.TemporaryDirectory(prefix="servelab-reference-") as tmp:
        work = Path(tmp)
        staged = work / "staged"
        staged.mkdir()
        runners = {"4_fastapi": run_4_fastapi, "6_triton": run_6_triton,
                   "6a_triton_pipeline": run_6a_triton_pipeline, "6e_accelerate": run_6e_accelerate,
                   "6f_token_streaming": run_6f_token_streaming}
        for name in NOTEBOOKS:
            t0 = time.perf_counter()
            log(f"running {name} against the local stack ({scale} scale) ...")
            nb = runners[name](settings[name], work, log)
            spoiled = _spoiled_key_figures(nb, name, work)
            if spoiled:   # the answer keys quote this run: a busy spell under one of their figures, run it again
                log(f"  {name}: the answer keys' figures {', '.join(spoiled)} came from a spoiled check; once more")
                nb = runners[name](settings[name], work, log)
            counts = _counts(nb)
            manifest["checks"][name] = counts
            if counts["failed"]:
                raise RuntimeError(f"{name}: {counts['failed']} check(s) failed twice: {failed_checks(nb)}; "
                                   "the committed reference is left as it was (a busy machine? run it again)")
            if counts["inconclusive"] > counts["passed"]:
                log(f"  warning: {name}: most checks were inconclusive (the machine was busy); this run shows "
                    "a learner little: regenerate it on a quiet machine before committing it")
            nb = trim(nb)
            nb.metadata["servelab_reference"] = {k: manifest[k] for k in ("note", "machine", "date", "commit", "scale")}
            (staged / f"{name}.ipynb").write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
            log(f"  {name}: {counts['passed']} checks passed, {counts['inconclusive']} inconclusive, "
                f"{time.perf_counter() - t0:.0f} s")
        # The answer keys quote this run's figures: its markdown cells get them now (the run executed
        # the notebooks with the previous reference's figures in their keys)
        figures = answer_keys.reference_values(staged)
        for name in NOTEBOOKS:
            path = staged / f"{name}.ipynb"
            nb = nbformat.read(path, as_version=4)
            fresh = notebooks.build_notebook(notebooks.SOURCE_DIR / f"{name}.md", name, figures).cells
            if [c.cell_type for c in fresh] != [c.cell_type for c in nb.cells]:
                raise RuntimeError(f"{name}: the executed notebook's cells differ from its source's")
            for cell, new in zip(nb.cells, fresh):
                if cell.cell_type == "markdown":
                    cell.source = new.source
            path.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
        t0 = time.perf_counter()
        log(f"running the benchmark tour (scale {settings['tour']}) ...")
        manifest["tour"] = run_tour_into(staged / "tour", settings["tour"], work, log)
        log(f"  tour: {time.perf_counter() - t0:.0f} s")
        manifest["wall_s"] = round(time.perf_counter() - started)
        (staged / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if reference_dir.exists():
            shutil.rmtree(reference_dir)
        reference_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staged, reference_dir)
    shutil.rmtree(RESULTS_ROOT, ignore_errors=True)   # the runs' hand-in zips
    if reference_dir == COMMITTED_DIR:
        for path in notebooks.build(quiet=True):  # the lab's answer keys now quote this run
            log(f"rebuilt {path.relative_to(paths.REPO_ROOT)} (its answer keys quote the new reference)")
    return manifest


def size_bytes(reference_dir: Path = COMMITTED_DIR) -> int:
    return sum(p.stat().st_size for p in reference_dir.rglob("*") if p.is_file())


# --------------------------------------------------------------------------
# Command line


def add_parser(sub) -> None:
    p = sub.add_parser("reference", help="regenerate or check the committed reference run (docs/reference/)")
    rsub = p.add_subparsers(dest="reference_command", metavar="ACTION")
    rsub.required = True
    b = rsub.add_parser("build", help="run notebooks 4, 6, 6a, 6e and 6f and the tour on the local stack; write docs/reference/")
    b.add_argument("--scale", choices=sorted(SCALES), default="lesson",
                   help="lesson: the lesson's own request counts, tour at scale 1 (default); "
                        "reduced: the notebook tests' counts, tour at 0.3")
    b.add_argument("--out", type=Path, default=COMMITTED_DIR, help=f"reference folder (default {COMMITTED_DIR})")
    b.set_defaults(func=_cmd_build)
    c = rsub.add_parser("check", help="exit 1 when the reference was run from older notebook sources")
    c.add_argument("--dir", type=Path, default=COMMITTED_DIR)
    c.set_defaults(func=_cmd_check)


def _cmd_build(args) -> int:
    t0 = time.perf_counter()
    try:
        manifest = build(args.out, args.scale)
    except (RuntimeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote the reference run to {args.out}/ ({size_bytes(args.out) / 1024:.0f} KiB) "
          f"in {time.perf_counter() - t0:.0f} s; commit it. {label(manifest)}")
    return 0


def _cmd_check(args) -> int:
    problems = stale(args.dir)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        print("the committed reference is stale: run `make reference` and commit docs/reference/", file=sys.stderr)
        return 1
    manifest = read_manifest(args.dir)
    print(f"the reference in {args.dir} matches the notebook sources ({manifest['date']}, {manifest['commit']})")
    return 0
