"""The whole lab run headless in the node's Jupyter container, written as a reference bundle.

    # runs on node-serve-system (after notebook 5: the Triton stack built)
    cd ~/serve-system-chi && python3 -m servelab.node.reference

It runs every notebook of the core lab that the Jupyter container runs (4 and 6) and each GPU-node
extension the container can run (6a, 6b, 6c, 6f), at lesson scale, the way the compose check runs them
(:mod:`servelab.node.labrun`: the notebooks' own node blocks, run on this host when a notebook reaches
them). The stacks switch with the notebooks' own blocks too: notebook 5's "When you are done" block and
notebook 3's blocks before 4, notebook 5's blocks before 6, 6c's and 6f's opening blocks for their
overlays. At the end the Triton stack runs with 6f's overlay, as a student's run of 6f leaves it.

Left out: 6d (Kubernetes: it runs on the node itself, not in the Jupyter container), 6e (the Triton stack's
Jupyter container has no PyTorch, ONNX Runtime or OpenVINO, so its first part needs the local kit) and the
benchmark tour (it runs on the local stack, ``make reference``).

The bundle (default ``results/reference-node/``, which notebook 7 copies back with ``results/``) has the
layout of ``docs/reference/`` (``make reference``): ``<notebook>.ipynb`` executed and trimmed the same
way, and ``manifest.json`` with the same keys where they apply, plus the label (``P100`` when
``nvidia-smi`` says so, else the GPU's name, ``CPU`` without one, ``CPU (stand-ins)`` in the compose
check), the minutes per notebook (wall time, its node commands included), the node doctor's report and
the GPUs ``nvidia-smi`` names. Committed as ``docs/reference-node/``, the site shows it beside the CPU
reference and the lesson tables cite its minutes. Standard library only (the node's ``python3``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import subprocess
import sys
from pathlib import Path

from servelab.core import paths, procs
from servelab.node import labrun

# The notebooks in the order they run, and the stack each needs (the others: the Triton stack).
LAB = ("4_fastapi", "6_triton", "6a_triton_pipeline", "6b_model_analyzer", "6c_scale_out", "6f_token_streaming")
STACK = {"4_fastapi": "fastapi"}
HAND_EDIT = {"6_triton": "/models"}   # notebook 6's edit of food_classifier's config, in the container
LEFT_OUT = {
    "6d_kubernetes": "runs on the node itself (k3s), not in the Jupyter container",
    "6e_accelerate": "the Triton stack's Jupyter container has no PyTorch, ONNX Runtime or OpenVINO, so its first "
                     "part needs the local kit (6e's 'Where it runs')",
    "tour": "the benchmark tour runs on the local stack (make reference), not on the node's Compose stacks",
}
DEFAULT_OUT = paths.RESULTS_DIR / "reference-node"   # notebook 7 copies results/ back
MANIFEST = "manifest.json"
HANDOFF = "node-reference"                          # <kit>/build/node-reference/<notebook>/
NVIDIA_SMI = ["nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"]
# manifest keys every bundle has (check_bundle); reference.build's, where they apply, and the node's own
KEYS = ("note", "label", "machine", "gpus", "date", "commit", "scale", "sources", "checks", "settings",
        "minutes", "seconds", "wall_s", "doctor", "notebooks", "errors", "tour", "left_out")


# --------------------------------------------------------------------------
# The machine and its label


def gpus(run=subprocess.run) -> list[str]:
    """One line per GPU from ``nvidia-smi`` (name, compute capability, driver); [] without one."""
    try:
        proc = run(NVIDIA_SMI, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    if proc.returncode != 0:
        return []
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


def label(gpu_lines: list[str], standins: bool = False) -> str:
    """"P100" when every GPU is a P100; else the GPUs' names; without a GPU "CPU", or "CPU (stand-ins)"
    for the compose check's stand-in images."""
    names = sorted({line.split(",")[0].strip() for line in gpu_lines})
    if names:
        return "P100" if all("P100" in n for n in names) else " + ".join(names)
    return "CPU (stand-ins)" if standins else "CPU"


def machine(gpu_lines: list[str]) -> str:
    """This host in one line (procs.machine_description), with each GPU nvidia-smi names."""
    text = procs.machine_description()
    if gpu_lines:
        text += "; GPUs: " + "; ".join(gpu_lines)
    return text


def commit(kit: Path = paths.REPO_ROOT) -> str:
    """The kit's git commit, when the kit is a clone (notebook 2 uploads its tracked files without git)."""
    try:
        head = subprocess.run(["git", "-C", str(kit), "rev-parse", "--short=12", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head


def doctor_report(runner: labrun.LabRunner) -> str:
    """``python3 -m servelab.node.doctor --stack triton`` (``--cpu`` on a host without a GPU), its text."""
    script = f"cd ~/{labrun.KIT} && python3 -m servelab.node.doctor --stack triton"
    if runner.cpu:
        script = runner.cpu_variant(script)
    return labrun.ANSI.sub("", runner.sh(script, check=False).stdout).strip()


# --------------------------------------------------------------------------
# The bundle


def write_bundle(out: Path, summaries: list[dict], *, label: str, machine: str, gpus: list[str], doctor: str,
                 scale: str, commit: str, date: str | None = None, left_out: dict | None = None) -> dict:
    """Write the bundle of the notebooks in ``summaries`` (LabRunner's, one per run: the last run of a
    notebook counts) into ``out``, replaced whole. Each summary's ``handoff`` folder holds the executed
    notebook trimmed (``<name>.trimmed.ipynb``). Returns the manifest."""
    latest: dict[str, dict] = {}
    for s in summaries:
        latest[s["notebook"]] = s
    manifest = {
        "note": f"{label} reference: your numbers will differ", "label": label, "machine": machine, "gpus": gpus,
        "date": date or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
        "scale": scale, "sources": {}, "checks": {}, "settings": {}, "minutes": {}, "seconds": {}, "errors": {},
        "notebooks": [], "doctor": doctor, "tour": None, "left_out": dict(LEFT_OUT if left_out is None else left_out),
        "wall_s": round(sum(s.get("wall_s", 0) for s in latest.values())),
    }
    stamp = {k: manifest[k] for k in ("note", "label", "machine", "date", "commit", "scale")}
    staged = out.with_name(out.name + ".part")
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    for name, s in latest.items():
        if s.get("error"):
            manifest["errors"][name] = labrun.ANSI.sub("", s["error"])[-500:]
        executed = Path(s["handoff"]) / f"{name}.trimmed.ipynb" if s.get("handoff") else None
        if executed is None or not executed.is_file():
            manifest["errors"].setdefault(name, f"no executed notebook came back ({executed})")
            continue
        nb = json.loads(executed.read_text(encoding="utf-8"))
        nb.setdefault("metadata", {})["servelab_reference"] = stamp
        (staged / f"{name}.ipynb").write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                                              encoding="utf-8")
        manifest["notebooks"].append(name)
        manifest["sources"][f"{name}.md"] = s.get("source_sha256", "")
        manifest["checks"][name] = s["checks"]
        manifest["settings"][name] = s.get("settings", {})
        manifest["minutes"][name] = round(s["wall_s"] / 60, 2)
        manifest["seconds"][name] = s["seconds"]
    (staged / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    staged.rename(out)
    return manifest


def check_bundle(out: Path, expect: tuple[str, ...] | list[str] = ()) -> list[str]:
    """What is wrong with the bundle in ``out`` (empty: nothing): its manifest's keys, each notebook's file
    with outputs, its minutes, the doctor's report; ``expect``: notebooks that must be in it."""
    path = out / MANIFEST
    if not path.is_file():
        return [f"no {MANIFEST} in {out}"]
    manifest = json.loads(path.read_text(encoding="utf-8"))
    problems = [f"{MANIFEST} has no {k!r}" for k in KEYS if k not in manifest]
    names = manifest.get("notebooks", [])
    problems += [f"{n} is not in the bundle" for n in expect if n not in names]
    for name in names:
        nb_path = out / f"{name}.ipynb"
        if not nb_path.is_file():
            problems.append(f"{name}.ipynb missing")
            continue
        cells = json.loads(nb_path.read_text(encoding="utf-8")).get("cells", [])
        if not any(c.get("outputs") for c in cells if c.get("cell_type") == "code"):
            problems.append(f"{name}.ipynb has no outputs")
        if not manifest.get("minutes", {}).get(name, 0) > 0:
            problems.append(f"{name}: no minutes")
        if name not in manifest.get("checks", {}):
            problems.append(f"{name}: no checks counted")
    if not str(manifest.get("doctor", "")).strip():
        problems.append("no doctor's report")
    problems += [f"{n} stopped on an error: {e}" for n, e in manifest.get("errors", {}).items()]
    return problems


# --------------------------------------------------------------------------
# The run


def run_lab(runner: labrun.LabRunner, names=LAB, stack: str = "triton") -> str:
    """Run ``names`` (in the lab's order) in the Jupyter container, switching stacks with the notebooks'
    own node blocks; ``stack``: the one running now. A notebook that stops on an error is kept (its
    summary says so) and the next one runs. Returns the stack left running."""
    for name in [n for n in LAB if n in names]:
        want = STACK.get(name, "triton")
        try:
            if want != stack:
                if want == "fastapi":   # notebook 5's own teardown, then notebook 3's blocks
                    blocks = runner.node_blocks("5_triton_setup", teardown=True) + runner.node_blocks("3_fastapi_setup")
                else:                   # notebook 5's blocks (they start with the FastAPI stack's `down`)
                    blocks = runner.node_blocks("5_triton_setup")
                runner.log(f"== the {want} stack, with notebook {'3' if want == 'fastapi' else '5'}'s node commands")
                for block in blocks:
                    runner.run_node_block(block)
                runner.wait_healthy()
                stack = want
            runner.log(f"== notebook {name} inside the Jupyter container ({runner.scale} scale)")
            runner.notebook_in_jupyter(name, hand_edit=HAND_EDIT.get(name))
        except labrun.LabFailed as err:
            runner.log(f"notebook {name} FAILED: {str(err)[:2000]}")
            if not any(s["notebook"] == name for s in runner.notebooks):
                runner.notebooks.append({"notebook": name, "error": str(err), "checks": {}, "seconds": 0,
                                         "wall_s": 0, "handoff": ""})
    return stack


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m servelab.node.reference",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the bundle's folder (default {DEFAULT_OUT})")
    parser.add_argument("--scale", choices=("lesson", "reduced"), default="lesson",
                        help="lesson: the lessons' own sizes (default); reduced: the notebook tests' sizes, a quick try")
    parser.add_argument("--notebooks", nargs="+", choices=LAB, default=list(LAB), metavar="NAME",
                        help=f"run only these (default: all of {', '.join(LAB)})")
    parser.add_argument("--cpu", action="store_true",
                        help="a host without an NVIDIA GPU: each Compose file's .cpu.yaml override, the doctor's --cpu")
    args = parser.parse_args(argv)
    kit = paths.REPO_ROOT
    if kit != (Path.home() / labrun.KIT).resolve():
        print(f"error: the notebooks' node commands act on ~/{labrun.KIT}; this kit is {kit}. "
              f"Run it from ~/{labrun.KIT} on the node.", file=sys.stderr)
        return 2
    runner = labrun.LabRunner(kit, kit / "build" / HANDOFF / "run.log", cpu=args.cpu, scale=args.scale,
                              handoff=HANDOFF)
    gpu_lines = gpus()
    if not gpu_lines and not args.cpu:
        print("error: nvidia-smi names no GPU here; on a host without one, add --cpu", file=sys.stderr)
        return 2
    name = label(gpu_lines)
    runner.log(f"reference run on {name}: {', '.join(n for n in LAB if n in args.notebooks)} at {args.scale} scale")
    run_lab(runner, args.notebooks)
    doctor = doctor_report(runner)
    manifest = write_bundle(args.out, runner.notebooks, label=name, machine=machine(gpu_lines), gpus=gpu_lines,
                            doctor=doctor, scale=args.scale, commit=commit(kit))
    for nb in manifest["notebooks"]:
        checks = manifest["checks"][nb]
        runner.log(f"{nb}: {manifest['minutes'][nb]} min, checks {checks.get('passed', 0)} passed, "
                   f"{checks.get('inconclusive', 0)} inconclusive, {checks.get('failed', 0)} failed")
    problems = check_bundle(args.out, [n for n in LAB if n in args.notebooks])
    for problem in problems:
        runner.log(f"problem: {problem}")
    runner.log(f"wrote {args.out}/ ({manifest['label']}, {manifest['wall_s'] / 60:.0f} min in all). Send it back: "
               "notebook 7 copies results/ to the Chameleon Jupyter environment; commit it as docs/reference-node/. "
               "The model configs are as the notebooks left them: `python3 -m servelab.node.configs restore` "
               "puts the shipped ones back.")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
