"""The lab's notebooks run inside the Jupyter container, as a student runs them on the node.

One code path for two callers: ``make compose-check`` (:mod:`servelab.composecheck.check`, the Compose
stacks on stand-in images on a host without a GPU) and the node's reference run
(:mod:`servelab.node.reference`, on node-serve-system). Standard library only: on the node it runs
with the system ``python3``.

* Node commands come from the notebooks' own text: fenced ``bash`` blocks that start with
  ``# runs on node-serve-system``. On a host without an NVIDIA GPU each runs with the rule every
  Compose file's header gives: after ``-f …/docker-compose-X.yaml`` add ``-f
  …/docker-compose-X.cpu.yaml`` where that file exists, and ``--cpu`` to the doctor.
* A notebook runs as ``docker exec jupyter python3 -m servelab.composecheck.incontainer NAME`` (nbclient
  in the container's own Python). The node blocks between its cells come back to this side as
  ``request-N.sh`` files in a handoff folder of the mounted kit (``build/<handoff>/<notebook>/``); each
  runs here, and its exit code goes back as ``done-N``. The container leaves the executed notebook there
  (``NAME.ipynb``, and ``NAME.trimmed.ipynb`` as ``make reference`` trims it) and prints a ``SUMMARY``
  line (checks, seconds, scale, settings, the source's hash).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

from servelab.core import paths

KIT = paths.KIT_DIR_ON_NODE
INSIDE_KIT = f"/home/jovyan/{KIT}"   # where the Jupyter container mounts the kit (docker-compose-*.yaml)
NODE_BLOCK = re.compile(r"```bash\n# runs on node-serve-system\n(.*?)```", re.S)
SECTION = re.compile(r"^## (.*)$", re.M)
# Node blocks not run: the GPU tools on a host without a GPU, nvtop everywhere (it is interactive), and
# the "done for the day" teardown (the callers end or switch the stacks themselves).
GPU_TOOLS = re.compile(r"^\s*(nvtop|nvidia-smi)\b[^\n]*$", re.M)
INTERACTIVE = re.compile(r"^\s*nvtop\b[^\n]*$", re.M)
SKIP_SECTIONS = ("When you are done",)
COMPOSE_FILE = re.compile(r"-f (~/" + KIT + r"/docker/docker-compose-([a-z]+)\.yaml)")
DOCTOR = re.compile(r"python3 -m servelab\.node\.doctor[^\n]*")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A notebook's whole run, node commands included, may take this long (seconds) at each scale.
TIMEOUT = {"reduced": 1800, "lesson": 7200}


class LabFailed(RuntimeError):
    pass


def notebook_source(notebook: str) -> str:
    return (paths.REPO_ROOT / "notebooks" / "src" / f"{notebook}.md").read_text()


class LabRunner:
    """Runs node blocks on this host and notebooks in the Jupyter container; keeps each notebook's summary.

    ``cpu``: a host without an NVIDIA GPU (the CPU overrides, the doctor's ``--cpu``, no GPU tools).
    Subclasses (the compose check) hook in through :meth:`env`, :meth:`before_node_block`,
    :meth:`notebook_starting`, :meth:`serve_request` and :meth:`notebook_finished`."""

    cpu = True
    scale = "reduced"

    def __init__(self, kit: Path, log_path: Path, cpu: bool = True, scale: str = "reduced",
                 handoff: str = "compose-check"):
        self.kit = kit
        self.home = kit.parent
        self.cpu = cpu
        self.scale = scale
        self.handoff = handoff
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_file = log_path.open("a")
        self.notebooks: list[dict] = []

    # ---------------------------------------------------------------- plumbing
    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def env(self) -> dict:
        return dict(os.environ)

    def sh(self, script: str, check: bool = True, timeout: float = 3600) -> subprocess.CompletedProcess:
        proc = subprocess.run(["bash", "-c", script], cwd=self.home, env=self.env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        self.log_file.write(proc.stdout)
        self.log_file.flush()
        if check and proc.returncode != 0:
            raise LabFailed(f"exit {proc.returncode}: {script.strip()}\n{proc.stdout[-3000:]}")
        return proc

    # ---------------------------------------------------------------- the node's commands
    def cpu_variant(self, script: str) -> str:
        """Add each Compose file's CPU override after it, as its header tells a host without a GPU, and
        ``--cpu`` to the doctor, as its own fix line says there."""
        def add(m):
            cpu = self.kit / "docker" / f"docker-compose-{m.group(2)}.cpu.yaml"
            return m.group(0) + (f" -f ~/{KIT}/docker/{cpu.name}" if cpu.exists() else "")
        script = DOCTOR.sub(lambda m: m.group(0) if "--cpu" in m.group(0) else m.group(0) + " --cpu", script)
        return COMPOSE_FILE.sub(add, script)

    def skipped(self, script: str) -> bool:
        return bool((GPU_TOOLS if self.cpu else INTERACTIVE).search(script))

    def node_blocks(self, notebook: str, teardown: bool = False) -> list[str]:
        """A notebook's node blocks in order, less the skipped ones; ``teardown``: only those of its
        "When you are done" section (the blocks that stop its stack)."""
        text = notebook_source(notebook)
        blocks = []
        for m in NODE_BLOCK.finditer(text):
            headings = SECTION.findall(text[:m.start()])
            if bool(headings and headings[-1].startswith(SKIP_SECTIONS)) != teardown:
                continue
            if not self.skipped(m.group(1)):
                blocks.append(m.group(1))
        return blocks

    def opening_blocks(self, notebook: str) -> list[str]:
        """The node blocks a notebook asks for before its first code cell ("before you run any cell")."""
        text = notebook_source(notebook)
        head = text[:text.find("```{code-cell}")]
        return [m.group(1) for m in NODE_BLOCK.finditer(head)]

    def before_node_block(self) -> None:
        """Called before each node command runs (the compose check keeps memory peaks here)."""

    def run_node_block(self, script: str) -> int:
        if self.skipped(script):
            self.log("skipped (a GPU tool; no GPU here, or interactive): " + script.strip().replace("\n", "; "))
            return 0
        if self.cpu:
            script = self.cpu_variant(script)
        self.before_node_block()  # a command may recreate a container
        self.log("$ " + script.strip().replace("\n", "\n$ "))
        proc = self.sh(script, check=False)
        tail = "\n".join(proc.stdout.strip().splitlines()[-12:])
        self.log(f"exit {proc.returncode}" + (f"\n{tail}" if tail else ""))
        if re.search(r"docker compose .*\b(up|restart)\b", script):
            self.wait_healthy()
        return proc.returncode

    def wait_healthy(self, timeout: float = 600) -> None:
        """Every running lab container healthy (or without a health check); fail on one that exited."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.containers()
            waiting = {n: s for n, s in states.items() if s not in ("healthy", "running", "exited 0")}
            bad = {n: s for n, s in waiting.items() if s.startswith("exited") or s == "unhealthy"}
            if bad:
                raise LabFailed(f"containers failed: {bad}\n" + "\n".join(
                    self.sh(f"docker logs --tail 30 {n} 2>&1", check=False).stdout for n in bad))
            if not waiting:
                self.log("healthy: " + ", ".join(f"{n} ({s})" for n, s in sorted(states.items())))
                return
            if time.monotonic() > deadline:
                raise LabFailed(f"not healthy after {timeout:.0f} s: {waiting}")
            time.sleep(3)

    def containers(self) -> dict[str, str]:
        out = self.sh("docker ps -a --filter label=com.docker.compose.project --format '{{.Names}}'").stdout.split()
        states = {}
        for name in out:
            fmt = "{{.State.Status}} {{.State.ExitCode}} {{if .State.Health}}{{.State.Health.Status}}{{end}}"
            status, code, health = (self.sh(f"docker inspect -f '{fmt}' {name}").stdout.split() + [""])[:3]
            if name.endswith("_repository") or name == "triton_cpu_repository":
                continue  # one-shot copy of the model repository
            states[name] = health or (f"exited {code}" if status == "exited" else status)
        return states

    # ---------------------------------------------------------------- notebooks in the container
    def notebook_starting(self, name: str) -> None:
        """Called just before the notebook starts in the container (its opening blocks have run)."""

    def serve_request(self, script: str) -> int:
        """A node block the notebook asked for between its cells: run it, return its exit code."""
        return self.run_node_block(script)

    def notebook_finished(self, summary: dict) -> None:
        """Called with each notebook's summary before it is kept (and before an error is raised)."""
        self.log(f"notebook {summary['notebook']} in the Jupyter container (Python {summary['python']}): "
                 f"{summary['checks']}, {summary['seconds']} s in the kernel, {summary['wall_s']} s in all"
                 + (f"; ERROR {ANSI.sub('', summary['error'])}" if summary["error"] else ""))

    def docker_exec(self, name: str, inside: str, hand_edit: str | None, opened: bool) -> list[str]:
        cmd = ["docker", "exec", "jupyter", "python3", "-m", "servelab.composecheck.incontainer", name,
               "--handoff", inside, "--scale", self.scale]
        if hand_edit:
            cmd += ["--hand-edit", hand_edit]
        if opened:
            cmd.append("--opened")
        return cmd

    def notebook_in_jupyter(self, name: str, hand_edit: str | None = None, timeout: float | None = None) -> dict:
        """Run notebook ``name`` in the Jupyter container: its opening node blocks first, the others when
        it reaches them. Returns its summary (also kept in ``self.notebooks``) with ``wall_s``, the time
        from its first node block to its end, and ``handoff``, the folder holding the executed notebook.
        A notebook that raised: :class:`LabFailed` (its summary is kept first)."""
        timeout = timeout or TIMEOUT.get(self.scale, TIMEOUT["lesson"])
        started = time.monotonic()
        opening = self.opening_blocks(name)
        for block in opening:
            self.run_node_block(block)
        handoff = self.kit / "build" / self.handoff / name
        shutil.rmtree(handoff, ignore_errors=True)
        handoff.mkdir(parents=True)
        if os.geteuid() == 0:
            os.chown(handoff, 1000, 1000)   # the container runs as uid 1000, like cc on the node
        cmd = self.docker_exec(name, f"{INSIDE_KIT}/build/{self.handoff}/{name}", hand_edit, bool(opening))
        self.log("$ " + " ".join(cmd))
        self.notebook_starting(name)
        proc = subprocess.Popen(cmd, env=self.env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
        reader.start()
        served = 0
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            request = handoff / f"request-{served + 1}.sh"
            if request.exists():
                served += 1
                code = self.serve_request(request.read_text())
                write_whole(handoff / f"done-{served}", str(code))
            if time.monotonic() > deadline:
                proc.kill()
                raise LabFailed(f"notebook {name} ran past {timeout:.0f} s")
            time.sleep(0.5)
        reader.join(timeout=10)
        text = "".join(output)
        self.log_file.write(text)
        summary = next((json.loads(line[8:]) for line in text.splitlines() if line.startswith("SUMMARY ")), None)
        if summary is None:
            raise LabFailed(f"notebook {name} gave no summary (exit {proc.returncode}):\n{text[-3000:]}")
        summary.update(node_commands=served, wall_s=round(time.monotonic() - started, 1), handoff=str(handoff))
        self.notebook_finished(summary)
        self.notebooks.append(summary)
        if summary["error"]:
            raise LabFailed(f"notebook {name}: {ANSI.sub('', summary['error'])}")
        return summary


def write_whole(path: Path, text: str) -> None:
    """Write ``path`` so that whoever polls for it never sees it half-written (it appears by rename)."""
    part = path.with_name(f".{path.name}.part")
    part.write_text(text)
    os.replace(part, path)
