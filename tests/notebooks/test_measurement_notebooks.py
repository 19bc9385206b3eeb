"""4_fastapi and 6_triton executed end to end in a real kernel against real local
servers (the kit's local stack), at reduced request counts set through the
notebooks' environment variables; every cell succeeds and every check the
notebook prints for the learner passes.

The kernel is the Jupyter container's, not the kit's venv: a virtualenv with exactly
what docker/Dockerfile.jupyter installs (tests/images/imagekit.py), Python 3.11 for
notebook 4 (FastAPI stack) and 3.10 for notebook 6 (the 24.10 SDK image), with the
variables Compose sets. The kit's venv has every package those images have (and
more), so a notebook that passes here also runs in the local Jupyter."""

from __future__ import annotations

import re
import shutil
import warnings

import pytest

from servelab.course import lab, reference
from tests.images import imagekit

from .nbkit import (
    LAST_KERNEL_ARGV,
    LESSON_CHECKS,
    REPO_ROOT,
    base_kernel_env,
    cell_output,
    image_kernel_env,
    notebook_text,
    printed_statuses,
    run_notebook,
)

# quiet: the notebooks' lesson checks time runs and judge whether other work spoiled them
pytestmark = [pytest.mark.quiet, pytest.mark.e2e]

# One setting sizes both executions: the reduced scale of servelab/course/reference.py, which
# `servelab reference build --scale reduced` uses too. The lesson-scale runs are `make reference`.
REDUCED = reference.SCALES["reduced"]


def _checks(text: str) -> tuple[list[str], list[str], list[str]]:
    """(passed, honestly inconclusive, failed). A check whose runs were spoiled by a busy machine
    says so instead of passing or failing: it was not judged. A failed check comes with its
    measured line, so a CI log shows what missed."""
    passed = re.findall(rf"^{re.escape(lab.CHECK_PASS)}: (.*)$", text, re.M)
    inconclusive = re.findall(rf"^{re.escape(lab.CHECK_INCONCLUSIVE)}: (.*)$", text, re.M)
    failed = [" | ".join(filter(None, m))
              for m in re.findall(rf"^{re.escape(lab.CHECK_FAIL)}: (.*)$(?:\n *(measured: .*)$)?", text, re.M)]
    return passed, inconclusive, failed


def _no_failed_check(text: str) -> list[str]:
    """Assert no check failed; return the checks that passed or were inconclusive. The message
    leads with the failed checks (the notebook's whole text, which follows, is cut short in a CI
    log). How many were judged (passed or failed) and how many were not (inconclusive) is recorded
    for the session's summary (nbkit.LESSON_CHECKS, tests/notebooks/conftest.py)."""
    passed, inconclusive, failed = _checks(text)
    LESSON_CHECKS.append({"judged": len(passed) + len(failed), "passed": len(passed), "failed": len(failed),
                          "inconclusive": len(inconclusive)})
    assert not failed, "failed checks:\n" + "\n".join(failed) + "\n\n" + text
    return passed + inconclusive


def _reference_page(nb, name: str, tmp_path) -> str:
    """Keep this run as the site's reference run (build/reference/), and render it."""
    from servelab.course import site

    site.save_reference(nb, name)
    out = tmp_path / "site"
    site.build_site(out, reference_dir=site.REFERENCE_DIR)
    page = (out / f"{name}-reference.html").read_text()
    assert site.REFERENCE_NOTE in page and "Machine:" in page
    assert f'href="{name}-reference.html"' in (out / f"{name}.html").read_text()
    return page


def _run_with_one_retry(name: str, env: dict[str, str], **kw):
    """Run the notebook; if a timing check missed (a machine busy with other work), run it
    once more, as the notebook tells the learner to, with an empty results folder so the
    hand-in that is checked is the try whose figures are kept. The first try's misses are
    reported as a warning: a retry is evidence about the machine, not something to hide."""
    nb = run_notebook(name, env, timeout=600, **kw)
    missed = _checks(notebook_text(nb))[2]
    if missed:
        warnings.warn(f"{name}: first try missed {missed}; ran it again", stacklevel=2)
        LESSON_CHECKS.append({"first_try_missed": len(missed)})
        shutil.rmtree(env["SERVELAB_RESULTS_DIR"], ignore_errors=True)
        nb = run_notebook(name, env, timeout=600, **kw)
    return nb


def _handed_in(results, name: str) -> None:
    archives = list(results.glob(f"{name}-*.zip"))
    assert len(archives) == 1, archives
    import zipfile

    with zipfile.ZipFile(archives[0]) as z:
        assert any(n.endswith("/figures.json") for n in z.namelist())


def test_4_fastapi_runs_against_the_local_stack(tmp_path, jupyter_image_env):
    from servelab.local import stack

    with stack.running(["fastapi_pt", "fastapi_onnx", "flask"], free_ports=True) as st:
        env = image_kernel_env(jupyter_image_env, **st.env, **REDUCED["4_fastapi"],
                               SERVELAB_RESULTS_DIR=str(tmp_path / "results"))
        assert env["FASTAPI_ONNX_URL"] != env["FASTAPI_SERVER_URL"]
        nb = _run_with_one_retry("4_fastapi", env, python_env=jupyter_image_env)
        assert _kernel_is(jupyter_image_env)  # the image's Python, not the venv's
    text = notebook_text(nb)
    assert f"Python {imagekit.images()['jupyter'].python}" in _kernel_banner(nb)
    passed = _no_failed_check(text)
    assert len(passed) == 7, passed
    # the restored hands-on parts: the service's code read, the web page retested after the swap
    assert "# the request and the response" in text and "class PredictRequest(BaseModel):" in text
    # each marked region under its own title (a greedy title once swallowed both regions)
    assert re.search(r"^# the forward pass[^\n]*\nwith a_share_of_the_cores\(\), torch\.inference_mode\(\):[^\n]*\n"
                     r" *t2 = time\.perf_counter\(\)[^\n]*\n *logits = model\(batch\)", text, re.M), text
    assert "# lesson:" not in text.split("# the request and the response", 1)[1].split("# the forward pass")[0]
    # issue 47: the thread rule is a region of the file too, and the whole file is printed
    assert re.search(r"^# how many requests run the model at once, and on how many threads\n", text, re.M), text
    assert "def a_share_of_the_cores():" in text
    assert "the web page still classifies a photo" in text
    # The loops report what the lab asks for, with units, and count failures separately.
    sizes = REDUCED["4_fastapi"]
    assert re.search(rf"PyTorch, sequential: {sizes['SERVELAB_NB_SEQUENTIAL']} succeeded, 0 failed", text)
    assert re.search(rf"ONNX, 16 clients: {sizes['SERVELAB_NB_CONCURRENT']} succeeded, 0 failed", text)
    assert re.search(r"p99 [0-9.]+ ms", text)
    # the good request answered 200 and the bad one was refused with 400, as the lesson says
    assert printed_statuses(cell_output(nb, "bad = requests.post(")) == [200, 400], cell_output(nb, "bad = requests.post(")
    # The plots rendered as images.
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) >= 3
    _handed_in(tmp_path / "results", "4_fastapi")
    page = _reference_page(nb, "4_fastapi", tmp_path)
    assert '<img src="img/4_fastapi-' in page and "requests/s" in page


def _kernel_is(python_env) -> bool:
    """The last kernel ran ``python_env``'s interpreter (its folder compared resolved:
    build/image-envs may be a link to another checkout's, as the kernelspec then names it)."""
    import os

    return (os.path.realpath(os.path.dirname(LAST_KERNEL_ARGV[0])) == os.path.realpath(python_env / "bin")
            and os.path.basename(LAST_KERNEL_ARGV[0]) == "python")


def _kernel_banner(nb) -> str:
    """What the kernel said it was (nbclient records the kernel's language_info)."""
    info = nb.metadata.get("language_info", {})
    return f"Python {'.'.join(info.get('version', '').split('.')[:2])}"


def test_sdk_image_python_is_here():
    """Notebook 6 runs in the 24.10 SDK image's Python 3.10; without one here its test
    falls back to the kit's venv kernel (Python 3.11), and this says so."""
    if imagekit.find_python("3.10") is None:
        pytest.skip("no Python 3.10 on this machine (the Triton 24.10 SDK image's): notebook 6 ran in "
                    "the kit's venv kernel, not the SDK image's package set")


def test_6_triton_runs_against_a_local_triton(tmp_path, jupyter_sdk_image_env):
    """The real Triton 2.51 (servelab.triton, as `servelab up` runs it) and the real
    perf_analyzer. The notebook edits config.pbtxt files, so Triton serves a private copy
    of models_staging/ here: the repository's own files are never touched by the test.
    Over 120 s (172 to 182 s idle): the whole lesson at the reduced scale, 21 checks that each rest
    on runs of their own, with model reloads between the parts."""
    from servelab import triton

    repo = tmp_path / "models"
    shutil.copytree(REPO_ROOT / "models_staging", repo)
    originals = {p: p.read_text() for p in repo.glob("*/config.pbtxt")}
    staged = {p: p.read_text() for p in (REPO_ROOT / "models_staging").glob("*/config.pbtxt")}
    hand_edits = []

    def hand_edit(cell, cell_index, **_):
        """What the student does in JupyterLab's editor before running the reload cell:
        count: 1 -> 2 and gpus: [ 0 ] -> [ 0, 1 ] in food_classifier's instance_group."""
        if "hand-edit" not in cell.metadata.get("tags", []):
            return
        path = repo / "food_classifier" / "config.pbtxt"
        text = path.read_text()
        at = text.index("instance_group")
        block = text[at:].replace("count: 1", "count: 2", 1).replace("gpus: [ 0 ]", "gpus: [ 0, 1 ]", 1)
        assert block != text[at:], "food_classifier does not start from the lab's instance_group"
        path.write_text(text[:at] + block)
        hand_edits.append(cell_index)

    sdk = jupyter_sdk_image_env
    with triton.running(repo, **triton.free_ports()) as t:
        kernel_env = (lambda **kw: image_kernel_env(sdk, imagekit.sdk_tools(), **kw)) if sdk else base_kernel_env
        env = kernel_env(
            TRITON_SERVER_URL=t.url, TRITON_GRPC_URL=t.grpc_url, TRITON_METRICS_URL=t.metrics_url,
            TRITON_MODEL_REPOSITORY=str(repo),
            SERVELAB_RESULTS_DIR=str(tmp_path / "results"), **REDUCED["6_triton"],
        )
        nb = _run_with_one_retry("6_triton", env, hooks={"on_cell_execute": hand_edit}, python_env=sdk)
        assert not sdk or _kernel_is(sdk)
        final = {m: t.model_config(m) for m in ("food_classifier", "food_classifier_onnx")}
    text = notebook_text(nb)
    if sdk:
        assert _kernel_banner(nb) == "Python 3.10"
        assert "raw ONNX Runtime:" not in text  # the image has no onnxruntime: only the curve through Triton
    passed = _no_failed_check(text)
    assert len(passed) == 21, passed
    # the restored hands-on parts: the ONNX model added to the running server, dynamic batching
    # on the Python model at 8 clients with its batch-size histogram, an answer cell per question
    # the learner's own model folder: built, loaded through the kit's translation (the ONNX
    # runner: no onnxruntime backend here), logged, answering, then unloaded and deleted
    mine = "my_food_classifier_onnx"
    assert re.search(rf"^{mine}/1/model.onnx \([0-9,]+ bytes\)$", text, re.M), text
    assert f"{mine}: backend python (servelab onnxruntime runner)" in text
    assert f"'{mine}': 'READY'" in text and f"successfully loaded '{mine}'" in text
    assert re.search(rf"^{re.escape(lab.CHECK_PASS)}: the model you built loads beside the others", text, re.M)
    assert "models in the repository: {'food_classifier': 'READY', 'food_classifier_onnx': 'READY'" in text  # then the ensemble and its steps (notebook 6a)
    assert not (repo / mine).exists()
    assert re.search(r"dynamic batching on : [0-9.]+ infer/s, queue [0-9.]+ ms, compute [0-9.]+ ms per request; "
                     r"executions per batch size \{", text)
    questions = [c for c in nb.cells if "hand-in" in c.metadata.get("tags", [])]
    answers = [c for c in nb.cells if "answer" in c.metadata.get("tags", [])]
    assert len(questions) == len(answers) == 5 and all("*Answer format:*" in c.source for c in questions)
    # The notebook reconfigured Triton through its files and put them back.
    assert "food_classifier: instances 4 x KIND_CPU" in text or "food_classifier: instances 4 x KIND_GPU" in text
    assert "dynamic batching on" in text
    # the dynamic-batching part: S(b), perf_analyzer request-rate runs, raw statistics, the sweep
    sources = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "--request-rate-range {rate} --request-distribution constant" in sources
    assert "--request-distribution poisson" in sources
    assert '"batch_stats"' in text and "through Triton:" in text
    assert re.search(r"batching off +[0-9.]+/s offered", text) and re.search(r"batching on +[0-9.]+/s offered", text)
    assert "Usage:" not in text   # no perf_analyzer command was refused (one once printed its usage text)
    assert "sustained load (p99 <=" in text
    # the traces: refused without the key, one request's stamps, the breakdown of each model
    assert "without the key: 403" in text and "the client has the answer" in text
    assert re.search(r"^ *[0-9.]+ ms  COMPUTE_INPUT_END$", text, re.M), text
    assert re.search(r"^food_pipeline @ 8 .*%$", text, re.M) and "food_pipeline @ 8, per step" in text
    assert {p: p.read_text() for p in repo.glob("*/config.pbtxt")} == originals
    # The first instance-group change was made by hand (the hook above), and Triton picked it up;
    # the stub-process cells show the copies as processes (on the CPU here).
    assert hand_edits, "the hand-edit cell did not run"
    assert re.search(r"Triton now runs food_classifier with instances 2 x KIND_(CPU|GPU)", text), text
    assert "Still one copy" not in text
    assert "CPU: 2 process(es)" in text and "CPU: 4 process(es)" in text
    anatomy = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert 'print(config_path("food_classifier").read_text())' in anatomy
    assert 'backend: "python"' in text and 'backend: "onnxruntime"' in text
    assert "def execute(self, requests):" in text and "def classify_image(client, model, payload" in text
    assert 'class_count=classes' in text  # the lesson file the page runs, shown whole
    assert {p: p.read_text() for p in (REPO_ROOT / "models_staging").glob("*/config.pbtxt")} == staged
    for cfg in final.values():
        assert [g.get("count") for g in cfg["instance_group"]] == [1] and "dynamic_batching" not in cfg
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) >= 4
    _handed_in(tmp_path / "results", "6_triton")
    page = _reference_page(nb, "6_triton", tmp_path)
    assert '<img src="img/6_triton-' in page
    assert re.search(r"Concurrency: \d+, throughput: [0-9.]+ infer/sec", page)  # perf_analyzer's own report
