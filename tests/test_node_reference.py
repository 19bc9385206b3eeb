"""The node's reference run (`python3 -m servelab.node.reference`, issue 52 item 5) without a node or Docker:
its label, the bundle it writes and checks, the order it runs the notebooks and switches the stacks in,
and one notebook through the real handoff with a stand-in `docker` on PATH."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from servelab.core import paths
from servelab.course import reference as cpu_reference
from servelab.node import labrun
from servelab.node import reference as node_reference

P100 = "Tesla P100-PCIE-16GB, 6.0, 560.35.03"


@pytest.mark.parametrize("lines, standins, want", [
    ([P100, P100], False, "P100"),
    (["NVIDIA H200, 9.0, 580.95.05"], False, "NVIDIA H200"),
    ([P100, "Tesla V100-SXM2-16GB, 7.0, 560.35.03"], False, "Tesla P100-PCIE-16GB + Tesla V100-SXM2-16GB"),
    ([], False, "CPU"),
    ([], True, "CPU (stand-ins)"),
])
def test_label_says_p100_only_when_nvidia_smi_does(lines, standins, want):
    assert node_reference.label(lines, standins=standins) == want


def test_gpus_reads_nvidia_smis_query_and_none_without_it():
    def smi(cmd, **kw):
        assert cmd == node_reference.NVIDIA_SMI
        return subprocess.CompletedProcess(cmd, 0, stdout=f"{P100}\n{P100}\n\n", stderr="")

    assert node_reference.gpus(run=smi) == [P100, P100]
    assert node_reference.gpus(run=lambda cmd, **kw: subprocess.CompletedProcess(cmd, 9, "", "NVML")) == []

    def missing(cmd, **kw):
        raise FileNotFoundError(cmd[0])

    assert node_reference.gpus(run=missing) == []
    assert node_reference.machine([P100]).endswith(f"; GPUs: {P100}")


def _executed(handoff: Path, name: str, text: str = "PASS: fine\n") -> None:
    """What the in-container runner leaves: the notebook, trimmed."""
    handoff.mkdir(parents=True, exist_ok=True)
    cell = nbformat.v4.new_code_cell("print('x')", outputs=[nbformat.v4.new_output("stream", text=text)])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {name}"), cell])
    nbformat.write(nb, handoff / f"{name}.trimmed.ipynb")


def _summary(tmp_path: Path, name: str, wall_s: float = 90.0, **kw) -> dict:
    handoff = tmp_path / "handoff" / name
    _executed(handoff, name)
    return {"notebook": name, "seconds": wall_s - 10, "wall_s": wall_s, "handoff": str(handoff), "error": None,
            "checks": {"passed": 3, "inconclusive": 1, "failed": 0}, "settings": {"SERVELAB_NB_X": "1"},
            "source_sha256": "ab" * 32, "scale": "lesson", **kw}


def test_the_bundle_has_make_references_layout_and_the_nodes_own_keys(tmp_path):
    first = _summary(tmp_path, "6_triton", wall_s=30, error="CellExecutionError: once")
    summaries = [_summary(tmp_path, "4_fastapi", wall_s=600), first, _summary(tmp_path, "6_triton", wall_s=1500)]
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "old.ipynb").write_text("{}")   # a previous bundle is replaced whole
    manifest = node_reference.write_bundle(out, summaries, label="P100", machine="node: 2 GPUs", gpus=[P100, P100],
                                           doctor="PASS docker\nPASS gpus", scale="lesson", commit="abc123",
                                           date="2026-12-01T10:00:00+00:00")
    assert sorted(p.name for p in out.iterdir()) == ["4_fastapi.ipynb", "6_triton.ipynb", "manifest.json"]
    assert json.loads((out / "manifest.json").read_text()) == manifest
    # make reference's keys, where they apply (no tour on the node), and the node's own
    assert set(manifest) >= {"note", "machine", "date", "commit", "scale", "sources", "checks", "settings", "wall_s",
                             "tour"} | set(node_reference.KEYS)
    assert manifest["note"] == "P100 reference: your numbers will differ" and manifest["tour"] is None
    assert manifest["minutes"] == {"4_fastapi": 10.0, "6_triton": 25.0}     # the last run of a notebook counts
    assert manifest["wall_s"] == 2100 and manifest["errors"] == {}
    assert manifest["sources"] == {"4_fastapi.md": "ab" * 32, "6_triton.md": "ab" * 32}
    assert manifest["doctor"].startswith("PASS docker") and manifest["gpus"] == [P100, P100]
    assert set(manifest["left_out"]) == {"6d_kubernetes", "6e_accelerate", "tour"}
    nb = nbformat.read(out / "6_triton.ipynb", as_version=4)
    assert nb.metadata["servelab_reference"]["label"] == "P100"
    assert nb.cells[1].outputs[0]["text"] == "PASS: fine\n"
    assert node_reference.check_bundle(out, ["4_fastapi", "6_triton"]) == []
    assert node_reference.check_bundle(out, node_reference.LAB) == [
        f"{n} is not in the bundle" for n in node_reference.LAB if n not in ("4_fastapi", "6_triton")]


def test_check_bundle_names_what_is_missing(tmp_path):
    out = tmp_path / "bundle"
    assert node_reference.check_bundle(out) == [f"no manifest.json in {out}"]
    broken = _summary(tmp_path, "6a_triton_pipeline", wall_s=0)
    gone = _summary(tmp_path, "6b_model_analyzer", error="TimeoutError: the node did not run request 1")
    (Path(gone["handoff"]) / "6b_model_analyzer.trimmed.ipynb").unlink()
    node_reference.write_bundle(out, [_summary(tmp_path, "4_fastapi"), broken, gone], label="CPU (stand-ins)",
                                machine="m", gpus=[], doctor=" ", scale="reduced", commit="c")
    nb = json.loads((out / "4_fastapi.ipynb").read_text())
    nb["cells"][1]["outputs"] = []
    (out / "4_fastapi.ipynb").write_text(json.dumps(nb))
    problems = node_reference.check_bundle(out)
    assert "4_fastapi.ipynb has no outputs" in problems
    assert "6a_triton_pipeline: no minutes" in problems and "no doctor's report" in problems
    assert "6b_model_analyzer stopped on an error: TimeoutError: the node did not run request 1" in problems


class FakeRunner(labrun.LabRunner):
    """Records what the reference run asks for; runs nothing."""

    def __init__(self, tmp_path: Path, fail: tuple[str, ...] = ()):
        super().__init__(tmp_path / "kit", tmp_path / "run.log", cpu=False, scale="lesson", handoff="node-reference")
        self.did: list[str] = []
        self.fail = fail

    def run_node_block(self, script: str) -> int:
        self.did.append("node: " + script.strip().splitlines()[-1])
        return 0

    def wait_healthy(self, timeout: float = 600) -> None:
        self.did.append("healthy")

    def notebook_in_jupyter(self, name, hand_edit=None, timeout=None):
        self.did.append(f"notebook {name}" + (f" {hand_edit}" if hand_edit else ""))
        summary = {"notebook": name, "error": "boom" if name in self.fail else None}
        self.notebooks.append(summary)
        if name in self.fail:
            raise labrun.LabFailed(f"notebook {name}: boom")
        return summary


def test_the_run_switches_stacks_with_the_notebooks_own_blocks(tmp_path):
    runner = FakeRunner(tmp_path, fail=("6a_triton_pipeline",))
    assert node_reference.run_lab(runner, node_reference.LAB) == "triton"
    notebooks = [d for d in runner.did if d.startswith("notebook ")]
    assert notebooks == ["notebook 4_fastapi", "notebook 6_triton /models", "notebook 6a_triton_pipeline",
                         "notebook 6b_model_analyzer", "notebook 6c_scale_out", "notebook 6f_token_streaming"]
    before_4 = runner.did[:runner.did.index("notebook 4_fastapi")]
    # after notebook 5: its own teardown first, then notebook 3's blocks, the FastAPI stack healthy
    assert before_4[0] == "node: docker compose -f ~/serve-system-chi/docker/docker-compose-triton.yaml down"
    assert "node: docker compose -f ~/serve-system-chi/docker/docker-compose-fastapi.yaml up -d --build" in before_4
    assert before_4[-1] == "healthy" and not any("nvtop" in d for d in runner.did)
    between = runner.did[runner.did.index("notebook 4_fastapi") + 1:runner.did.index("notebook 6_triton /models")]
    down = between.index("node: docker compose -f ~/serve-system-chi/docker/docker-compose-fastapi.yaml down")
    up = between.index("node: docker compose -f ~/serve-system-chi/docker/docker-compose-triton.yaml up -d --build")
    assert down < up and between[-1] == "healthy"
    # 6a stopped on an error: kept, and the run went on
    assert [s["notebook"] for s in runner.notebooks][-4:] == ["6a_triton_pipeline", "6b_model_analyzer",
                                                              "6c_scale_out", "6f_token_streaming"]
    # only Triton notebooks, after notebook 5: no switch at all
    runner = FakeRunner(tmp_path)
    node_reference.run_lab(runner, ["6f_token_streaming", "6_triton"])
    assert runner.did == ["notebook 6_triton /models", "notebook 6f_token_streaming"]


def test_the_command_runs_only_from_the_kit_the_node_blocks_name(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert node_reference.main(["--cpu"]) == 2
    assert "act on ~/serve-system-chi" in capsys.readouterr().err


FAKE_DOCKER = r'''#!{python}
"""Stand-in for `docker exec jupyter python3 -m servelab.composecheck.incontainer NAME --handoff INSIDE ...`:
asks the host to run one node block, then leaves the executed notebook and prints the SUMMARY line."""
import json, os, sys, time
from pathlib import Path
args = sys.argv[1:]
if args[0] != "exec":
    sys.exit(0)
name = args[5]
handoff = Path(args[args.index("--handoff") + 1].replace({inside!r}, os.environ["FAKE_KIT"]))
(handoff / "request-1.sh").write_text("# runs on node-serve-system\necho swapped > swapped.txt\n")
while not (handoff / "done-1").exists():
    time.sleep(0.05)
nb = {{"cells": [{{"cell_type": "code", "execution_count": 1, "id": "a", "metadata": {{}}, "source": "1",
        "outputs": [{{"name": "stdout", "output_type": "stream", "text": "done " + (handoff / "done-1").read_text()}}]}}],
      "metadata": {{}}, "nbformat": 4, "nbformat_minor": 5}}
(handoff / f"{{name}}.trimmed.ipynb").write_text(json.dumps(nb))
print("SUMMARY " + json.dumps({{"notebook": name, "seconds": 0.2, "checks": {{"passed": 1, "inconclusive": 0,
      "failed": 0}}, "failed": [], "error": None, "python": "3.10", "scale": args[args.index("--scale") + 1],
      "settings": {{}}, "source_sha256": "00", "argv": args}}))
'''


def test_one_notebook_through_the_real_handoff_into_a_bundle(tmp_path, monkeypatch):
    """LabRunner's own loop (the compose check's and the node's): the container's request runs on this
    side, its exit code goes back, and the executed notebook becomes the bundle's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER.format(python=sys.executable, inside=labrun.INSIDE_KIT))
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    kit = tmp_path / "home" / labrun.KIT
    kit.mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KIT", str(kit))
    runner = labrun.LabRunner(kit, tmp_path / "run.log", cpu=True, scale="lesson", handoff="node-reference")
    summary = runner.notebook_in_jupyter("6a_triton_pipeline", timeout=60)   # 6a opens with no node block
    assert summary["argv"][-2:] == ["--scale", "lesson"] and "--opened" not in summary["argv"]
    assert summary["node_commands"] == 1 and summary["wall_s"] > 0
    assert (runner.home / "swapped.txt").read_text() == "swapped\n"      # ran in the node user's home
    assert summary["handoff"] == str(kit / "build" / "node-reference" / "6a_triton_pipeline")
    out = tmp_path / "bundle"
    node_reference.write_bundle(out, runner.notebooks, label="CPU", machine="m", gpus=[], doctor="PASS",
                                scale="lesson", commit="c")
    assert node_reference.check_bundle(out, ["6a_triton_pipeline"]) == []
    nb = json.loads((out / "6a_triton_pipeline.ipynb").read_text())
    assert nb["cells"][0]["outputs"][0]["text"] == "done 0"


def test_the_node_and_the_cpu_reference_share_the_scales_and_the_site_path():
    assert set(node_reference.LAB) <= set(cpu_reference.SCALES["lesson"]) & set(cpu_reference.SCALES["reduced"])
    assert node_reference.DEFAULT_OUT == paths.RESULTS_DIR / "reference-node"   # notebook 7 copies results/ back
    assert paths.NODE_REFERENCE_DIR == paths.REPO_ROOT / "docs" / "reference-node"


def test_the_guides_estimate_is_the_lessons_budgets():
    """docs/instructor-guide.md's minutes for the reference run come from servelab/course/lessons.py."""
    from servelab.course import lessons

    text = " ".join((paths.REPO_ROOT / "docs" / "instructor-guide.md").read_text().split())
    notebooks = sum(lessons.BY_SLUG[n].minutes for n in node_reference.LAB)
    switches = lessons.BY_SLUG["3_fastapi_setup"].minutes + lessons.BY_SLUG["5_triton_setup"].minutes
    assert f"at most about {notebooks + switches} minutes (estimate)" in text
    assert f"add up to {notebooks} minutes and notebooks 3 and 5 (the two stack switches) to {switches} more" in text
    assert "cd ~/serve-system-chi && python3 -m servelab.node.reference" in text
