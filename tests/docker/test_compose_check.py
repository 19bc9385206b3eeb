"""The node commands the notebooks give, and the compose check's own pieces (no Docker engine needed).

``make compose-check`` runs every stack for real; these tests keep what it reads from the notebooks and
the files it runs correct on any machine, and fail on the defects its first run found."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import threading
import time
from pathlib import Path

import nbformat
import pytest

from servelab.composecheck import check, incontainer, standins
from servelab.node import compose

from .dockerkit import DOCKER, REPO, compose_env

NOTEBOOK_SOURCES = sorted((REPO / "notebooks" / "src").glob("*.md"))
KIT_PATH = re.compile(r"~/serve-system-chi/")


def node_compose_commands() -> list[tuple[str, str]]:
    """(notebook, command) for every `docker compose` line in a node block of every notebook."""
    found = []
    for src in NOTEBOOK_SOURCES:
        for block in check.NODE_BLOCK.findall(src.read_text()):
            for line in block.splitlines():
                if re.match(r"^(\w+=\S+ )*docker compose ", line):
                    found.append((src.stem, line))
    return found


@pytest.mark.parametrize("cpu", [False, True], ids=["as-written", "cpu-host"])
def test_every_compose_command_in_the_notebooks_loads_its_files(cpu, empty_env_file, tmp_path):
    """Each command's files (and profiles), as Compose itself reads them: an override used alone fails here
    (notebook 6c once started `docker-compose-scale.yaml` alone: 'depends on undefined service')."""
    commands = node_compose_commands()
    assert {nb for nb, _ in commands} >= {"3_fastapi_setup", "5_triton_setup", "6c_scale_out"}
    runner = check.Check.__new__(check.Check)
    runner.kit = REPO
    for notebook, line in commands:
        if cpu:
            line = runner.cpu_variant(line)
        words = shlex.split(KIT_PATH.sub(str(REPO) + "/", line))
        env = dict(w.split("=", 1) for w in words[:words.index("docker")])
        args = words[words.index("compose") + 1:]
        files = [args[i + 1] for i, a in enumerate(args) if a == "-f"]
        profiles = [x for i, a in enumerate(args) if a == "--profile" for x in ("--profile", args[i + 1])]
        result = compose.config(files, env=compose_env(**env), cwd=tmp_path,
                                extra_args=["--env-file", str(empty_env_file), *profiles])
        assert result.returncode == 0, f"{notebook}: {line}\n{result.stderr}"


def test_cpu_variant_adds_each_override_after_its_own_file():
    runner = check.Check.__new__(check.Check)
    runner.kit = REPO
    line = ("docker compose -f ~/serve-system-chi/docker/docker-compose-triton.yaml "
            "-f ~/serve-system-chi/docker/docker-compose-scale.yaml up -d")
    assert runner.cpu_variant(line) == (
        "docker compose -f ~/serve-system-chi/docker/docker-compose-triton.yaml "
        "-f ~/serve-system-chi/docker/docker-compose-triton.cpu.yaml "
        "-f ~/serve-system-chi/docker/docker-compose-scale.yaml "
        "-f ~/serve-system-chi/docker/docker-compose-scale.cpu.yaml up -d")
    models = "docker compose -f ~/serve-system-chi/docker/docker-compose-models.yaml run --rm models"
    assert runner.cpu_variant(models) == models  # no CPU override for the models job
    doctor = "python3 -m servelab.node.doctor --write-env --stack fastapi"
    assert runner.cpu_variant(doctor) == doctor + " --cpu"  # the doctor's own fix line on a host without GPUs
    assert runner.cpu_variant(doctor + " --cpu") == doctor + " --cpu"


def test_setup_notebooks_node_blocks_leave_out_nvtop_and_the_teardown():
    runner = check.Check.__new__(check.Check)
    blocks = runner.node_blocks("3_fastapi_setup")
    joined = "\n".join(blocks)
    assert "docker-compose-fastapi.yaml up -d --build" in joined
    assert "run --rm models" in joined and "servelab.node.doctor" in joined
    assert "nvtop" not in joined
    assert not any(re.search(r"docker-compose-fastapi\.yaml down", b) for b in blocks)
    assert any("docker-compose-triton.yaml up -d --build" in b for b in runner.node_blocks("5_triton_setup"))


def test_6c_starts_its_stack_before_its_first_cell():
    """The scale overlay recreates the Jupyter container (new variables): a notebook running in that
    container cannot start it halfway through, so 6c asks for it before its first cell."""
    runner = check.Check.__new__(check.Check)
    opening = "\n".join(runner.opening_blocks("6c_scale_out"))
    assert re.search(r"-f \S+docker-compose-triton\.yaml -f \S+docker-compose-scale\.yaml up -d", opening)
    source = (REPO / "notebooks" / "src" / "6c_scale_out.md").read_text()
    after = source[source.index("```{code-cell}"):]
    assert not re.search(r"docker-compose-scale\.yaml up", after)


def test_handoff_hook_waits_for_the_node_then_goes_on(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("Before:\n\n```bash\n# runs on node-serve-system\necho opening\n```\n"),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_markdown_cell("```bash\n# runs on node-serve-system\necho swap\n```\n"
                                      "```bash\n# runs inside the Jupyter container\necho not-node\n```\n"),
        nbformat.v4.new_code_cell("y = 2"),
    ])
    seen = []

    def node():  # the check's side: answer each request in turn
        for n in (1, 2):
            request = tmp_path / f"request-{n}.sh"
            while not request.exists():
                time.sleep(0.01)
            seen.append(request.read_text())
            (tmp_path / f"done-{n}").write_text("0")

    t = threading.Thread(target=node)
    t.start()
    hook = incontainer.handoff_hook(nb, tmp_path, timeout=10, log=lambda *a, **k: None)
    hook(cell=nb.cells[1], cell_index=1)
    hook(cell=nb.cells[3], cell_index=3)
    t.join(timeout=10)
    assert seen == ["# runs on node-serve-system\necho opening\n", "# runs on node-serve-system\necho swap\n"]

    # opened: the opening block already ran on the node; only the later one is asked for
    for f in tmp_path.iterdir():
        f.unlink()
    (tmp_path / "done-1").write_text("0")
    hook = incontainer.handoff_hook(nb, tmp_path, timeout=10, opened=True, log=lambda *a, **k: None)
    hook(cell=nb.cells[1], cell_index=1)
    assert not (tmp_path / "request-1.sh").exists()
    hook(cell=nb.cells[3], cell_index=3)
    assert "echo swap" in (tmp_path / "request-1.sh").read_text()


def test_handoff_hook_gives_up_when_the_node_never_answers(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("```bash\n# runs on node-serve-system\necho x\n```\n"),
        nbformat.v4.new_code_cell("x = 1")])
    hook = incontainer.handoff_hook(nb, tmp_path, timeout=0.5, log=lambda *a, **k: None)
    with pytest.raises(TimeoutError, match="request 1"):
        hook(cell=nb.cells[1], cell_index=1)


def _fake_docker(tmp_path: Path, pull_ok: bool, image_here: bool) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text(f"""#!/bin/sh
echo "docker $*" >> {tmp_path}/docker.log
case "$1 $2" in
  "pull "*) exit {0 if pull_ok else 1} ;;
  "image inspect") exit {0 if image_here else 1} ;;
esac
exit 0
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


@pytest.mark.parametrize("image_here", [True, False])
def test_prepare_node_goes_on_past_a_failed_pull_only_when_the_image_is_here(tmp_path, image_here):
    """The compose check pulls nothing (stand-ins are tagged locally); on the node a registry hiccup with
    the image already pulled must not stop the builds either. Without the image, the script stops."""
    home = tmp_path / "home"
    kit = home / "serve-system-chi"
    (kit / "docker").mkdir(parents=True)
    (kit / "docker" / "prepare-node.sh").write_bytes((DOCKER / "prepare-node.sh").read_bytes())
    os.symlink(REPO / "servelab", kit / "servelab")
    bin_dir = _fake_docker(tmp_path, pull_ok=False, image_here=image_here)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(home)}
    proc = subprocess.run(["sh", str(kit / "docker" / "prepare-node.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    log = (tmp_path / "docker.log").read_text()
    assert "docker pull nvcr.io/nvidia/tritonserver:24.10-py3" in log
    if image_here:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Triton part ready" in proc.stdout
        assert "docker compose -f " + str(kit) + "/docker/docker-compose-triton.yaml build" in log
    else:
        assert proc.returncode != 0 and "Triton part ready" not in proc.stdout


def test_models_image_can_export_onnx():
    """torch.onnx.export imports onnx, which torch 2.7.1 does not install: the models job failed on the
    compose check's first run ('Module onnx is not installed!'). Its requirements must name it."""
    pins = (DOCKER / "requirements-models.txt").read_text()
    assert re.search(r"^onnx==\d", pins, re.M), pins


def test_every_standin_is_labelled_and_every_base_the_kit_names_has_one():
    """Each FROM/image the kit's Dockerfiles and Compose files use that is not the kit's own has a stand-in."""
    named = set()
    for f in list(REPO.glob("*/Dockerfile")) + list(DOCKER.glob("Dockerfile.*")):
        if f.suffix == ".dockerignore":
            continue
        for line in f.read_text().splitlines():
            m = re.match(r"(?:ARG BASE_IMAGE=|FROM )(\S+)", line)
            if m and not m.group(1).startswith("$"):
                named.add(m.group(1))
    for f in DOCKER.glob("docker-compose-*.yaml"):
        named |= set(re.findall(r"^\s+(?:image|BASE_IMAGE): (\S+)", f.read_text(), re.M))
    upstream = {n.split("  ")[0] for n in named if not n.startswith("servelab/")}
    assert upstream == set(standins.STANDINS), upstream ^ set(standins.STANDINS)
    for tag, dockerfile in standins.STANDINS.items():
        text = (standins.STANDIN_DIR / dockerfile).read_text()
        assert f'LABEL {standins.LABEL}="{tag} stand-in' in text, dockerfile


@pytest.mark.parametrize("stack", ["fastapi", "fastapi+cpu", "triton", "triton+cpu", "triton+scale",
                                   "triton+scale+cpu", "triton+streaming", "triton+streaming+cpu", "triton+analyzer"])
def test_every_service_has_a_memory_limit_and_no_cpu_cap_above_one_core(stack, rendered, rendered_models):
    """Issue 48, finding 5: no Compose service had a limit. Memory on every one (the CPU overrides keep
    them: they reset only the GPU reservation); a CPU cap only on the services the lab does not measure,
    at one core (Docker refuses a `cpus` above the host's core count)."""
    for config in (rendered[stack], rendered_models):
        for name, svc in config["services"].items():
            assert int(svc.get("mem_limit", 0)) >= 128 * 2**20, f"{stack}: {name} has no memory limit"
            if "cpus" in svc:
                assert float(svc["cpus"]) <= 1.0, (stack, name, svc["cpus"])
                assert name not in ("fastapi_server", "triton_server", "triton_0", "triton_1", "jupyter"), name


def test_diagnose_names_the_container_that_restarted_or_was_oom_killed_with_its_log(tmp_path, monkeypatch):
    """CI saw notebook 6b's gRPC calls refused by triton_server, and nothing in the console said why:
    the check now prints each lab container that restarted, was OOM-killed or failed, and its log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    states = {"aaa": "/triton_server running 1 true 0", "bbb": "/jupyter running 0 false 0",
              "ccc": "/triton_cpu_repository exited 0 false 0", "ddd": "/flask exited 0 false 137"}
    cases = "\n".join(f'  *{cid}) echo "{state}" ;;' for cid, state in states.items())
    script = bin_dir / "docker"
    script.write_text(f"""#!/bin/sh
case "$1" in
  ps) [ "$2" = "-aq" ] && echo "{' '.join(states)}" || echo "triton_server jupyter" ;;
  inspect) case "$*" in
{cases}
  esac ;;
  logs) echo "Killed: the stub of food_classifier_onnx_0 ($4)" ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    c = check.Check(tmp_path, tmp_path / "log.txt")
    c.home.mkdir()
    c.memory = {"triton_server": 11900}
    text = c.diagnose("after notebook 6b stopped on an error")
    assert text.splitlines()[0].startswith("after notebook 6b stopped on an error: host: ")
    assert "triton_server: running, restarts 1, OOM-killed true, exit code 0 (memory peak 11900 MB)" in text
    assert "flask: exited, restarts 0, OOM-killed false, exit code 137" in text
    assert "jupyter:" not in text and "triton_cpu_repository:" not in text
    assert "Killed: the stub of food_classifier_onnx_0 (triton_server)" in text
    assert "Killed: the stub of food_classifier_onnx_0 (flask)" in text


def test_a_notebook_that_stopped_on_an_error_runs_once_more_and_the_first_attempt_is_reported(tmp_path):
    c = check.Check(tmp_path, tmp_path / "log.txt")
    calls, waits = [], []
    outcomes = iter([check.CheckFailed("notebook 6b_model_analyzer: InferenceServerException: refused"),
                     {"notebook": "6b_model_analyzer"}])

    def attempt(name, **kw):
        calls.append(name)
        out = next(outcomes)
        if isinstance(out, Exception):
            raise out
        return out

    c.notebook_in_jupyter = attempt
    c.wait_healthy = lambda: waits.append(1)
    blocks = []
    c.run_node_block = lambda script: blocks.append(script) or 0
    assert c.notebook_with_retry("6b_model_analyzer") == {"notebook": "6b_model_analyzer"}
    assert calls == ["6b_model_analyzer"] * 2 and waits == [1]
    # before the second run, the Triton stack is back as shipped (a fresh CPU copy of the repository)
    assert blocks == [f"docker compose -f ~/{check.KIT}/docker/docker-compose-triton.yaml "
                      "up -d --force-recreate triton_cpu_repository triton_server"]
    assert c.findings == ["notebook 6b_model_analyzer stopped on an error and was run once more: "
                          "notebook 6b_model_analyzer: InferenceServerException: refused"]
    # a second error fails the step; a failure that is not the notebook's own error is not retried
    c.notebook_in_jupyter = lambda name, **kw: (_ for _ in ()).throw(check.CheckFailed(f"notebook {name}: again"))
    with pytest.raises(check.CheckFailed, match="again"):
        c.notebook_with_retry("6c_scale_out")
    assert len(blocks) == 1   # 6c runs on the scale overlay: no reset of the Triton stack
    c.run_node_block = lambda script: 1
    with pytest.raises(check.CheckFailed, match="did not come back as shipped"):
        c.notebook_with_retry("6a_triton_pipeline")
    c.notebook_in_jupyter = lambda name, **kw: (_ for _ in ()).throw(check.CheckFailed("containers failed"))
    with pytest.raises(check.CheckFailed, match="containers failed"):
        c.notebook_with_retry("6a_triton_pipeline")


def test_notebook_6_past_its_limit_runs_once_more_from_the_shipped_repository(tmp_path):
    """A hung run (perf_analyzer once sat 14 minutes with Triton idle) is stopped at the step's limit and
    run again from the shipped model repository, with notebook 6's hand edit and its limit both times."""
    c = check.Check(tmp_path, tmp_path / "log.txt")
    calls = []
    outcomes = iter([check.CheckFailed("notebook 6_triton ran past 900 s"), {"notebook": "6_triton"}])

    def attempt(name, **kw):
        calls.append((name, kw))
        out = next(outcomes)
        if isinstance(out, Exception):
            raise out
        return out

    c.notebook_in_jupyter = attempt
    c.wait_healthy = lambda: None
    blocks = []
    c.run_node_block = lambda script: blocks.append(script) or 0
    kw = {"hand_edit": "/models", "timeout": c.NOTEBOOK_6_LIMIT_S}
    assert c.notebook_with_retry("6_triton", **kw) == {"notebook": "6_triton"}
    assert calls == [("6_triton", kw)] * 2 and len(blocks) == 1 and "--force-recreate triton_cpu_repository" in blocks[0]
    assert c.findings == ["notebook 6_triton stopped on an error and was run once more: notebook 6_triton ran past 900 s"]


def test_the_in_container_runner_leaves_the_notebook_whole_and_trimmed(tmp_path, monkeypatch, capsys):
    """The node's reference bundle is made of what the container leaves: the executed notebook trimmed as
    `make reference` trims it, and a summary with the scale, its settings and the source's hash."""
    from servelab.course import reference

    seen = {}

    def run_notebook(name, env, hooks=None, timeout=1800, nb=None):   # the kernel's part, stood in for
        seen.update(name=name, results=env["SERVELAB_RESULTS_DIR"], timeout=timeout)
        code = next(c for c in nb.cells if c.cell_type == "code")
        code.outputs = [nbformat.v4.new_output("stream", text="".join(f"line {i}\n" for i in range(200)))]
        raise RuntimeError("CellExecutionError: the next cell")

    monkeypatch.setattr(reference, "run_notebook", run_notebook)
    assert incontainer.main(["4_fastapi", "--handoff", str(tmp_path), "--scale", "lesson"]) == 1
    summary = json.loads(next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("SUMMARY "))[8:])
    assert seen == {"name": "4_fastapi", "results": str(tmp_path / "results"), "timeout": 1800}
    assert summary["error"] == "RuntimeError: CellExecutionError: the next cell"   # outputs so far are kept
    assert summary["scale"] == "lesson" and summary["settings"] == reference.SCALES["lesson"]["4_fastapi"]
    assert summary["source_sha256"] == reference.source_hash(REPO / "notebooks" / "src" / "4_fastapi.md")
    whole = nbformat.read(tmp_path / "4_fastapi.ipynb", as_version=4)
    trimmed = nbformat.read(tmp_path / "4_fastapi.trimmed.ipynb", as_version=4)
    first = [c for c in whole.cells if c.cell_type == "code"][0].outputs[0]["text"]
    cut = [c for c in trimmed.cells if c.cell_type == "code"][0].outputs[0]["text"]
    assert first.count("\n") == 200 and "lines trimmed in the reference run" in cut


def _fake_check(tmp_path, monkeypatch, bundle_ok=True):
    """A Check whose every Docker-facing piece is stood in for: what run() does, in order, and nothing else."""
    from servelab.node import reference as node_reference

    c = check.Check(tmp_path, tmp_path / "log.txt")
    c.home.mkdir(parents=True)
    (c.home / "prepare-node.log").write_text("== Triton part ready\n")
    did = []
    monkeypatch.setattr(standins, "build_base", lambda log: False)
    monkeypatch.setattr(standins, "build_standins", lambda log: {})
    monkeypatch.setattr(standins, "report", lambda: [])
    monkeypatch.setattr(node_reference, "gpus", lambda: [])
    c.prepare_kit = lambda: did.append("kit")
    c.sh = lambda script, check=True, timeout=3600: subprocess.CompletedProcess(
        script, 0, stdout="PASS  docker engine\n" if "servelab.node.doctor" in script else "")
    c.run_node_block = lambda script: did.append("node block") or 0
    c.wait_healthy = lambda timeout=600: None
    c.ports = c.memory_peaks = lambda *a, **k: {}
    c.restart_under_load = lambda *a, **k: did.append("restart")
    c.down_all = lambda: did.append("down -v")
    c.leftovers = lambda: []

    def notebook(name, hand_edit=None, timeout=None):
        handoff = tmp_path / "handoff" / name
        handoff.mkdir(parents=True)
        cell = nbformat.v4.new_code_cell("1", outputs=[nbformat.v4.new_output("stream", text="ok\n")])
        if bundle_ok or name != "6f_token_streaming":
            nbformat.write(nbformat.v4.new_notebook(cells=[cell]), handoff / f"{name}.trimmed.ipynb")
        summary = {"notebook": name, "seconds": 20.0, "wall_s": 30.0, "handoff": str(handoff), "error": None,
                   "checks": {"passed": 1, "inconclusive": 0, "failed": 0}, "failed": [], "node_commands": 1,
                   "settings": {}, "source_sha256": "00", "host_other_cores": 0.0, "judged": True}
        c.notebooks.append(summary)
        did.append(name)
        return summary

    c.notebook_in_jupyter = notebook
    return c, did


def test_the_check_writes_the_reference_bundle_after_the_doctor_and_before_down(tmp_path, monkeypatch):
    from servelab.node import reference as node_reference

    c, did = _fake_check(tmp_path, monkeypatch)
    assert c.run() == 0
    steps = [s["step"] for s in c.steps]
    assert steps[-3:] == ["the node doctor beside the running stack",
                          "the reference bundle of these notebooks (servelab.node.reference's)",
                          "down -v: nothing of the lab left"]
    assert [d for d in did if "_" in d] == list(node_reference.LAB)   # the node command's notebooks, in its order
    bundle = tmp_path / check.BUNDLE
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["label"] == "CPU (stand-ins)" and manifest["scale"] == "reduced"
    assert manifest["doctor"] == "PASS  docker engine" and manifest["minutes"]["6_triton"] == 0.5
    assert node_reference.check_bundle(bundle, node_reference.LAB) == []


def test_a_bad_bundle_fails_its_step_and_the_stacks_still_go_down(tmp_path, monkeypatch):
    c, did = _fake_check(tmp_path, monkeypatch, bundle_ok=False)
    assert c.run() == 1
    failed = [s["step"] for s in c.steps if not s["ok"]]
    assert failed == ["the reference bundle of these notebooks (servelab.node.reference's)"]
    assert did[-1] == "down -v" and c.steps[-1]["ok"]
