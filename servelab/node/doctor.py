"""`servelab doctor`: an instructor's pre-flight check of a Docker host.

Run it on the node (or a CPU-only Docker host with ``--cpu``) before class.
It prints one row per check -- PASS, WARN, FAIL or SKIP -- with the fix for
anything that is not a pass, and exits 1 when any check FAILs:

* Docker engine reachable, Compose v2 plugin recent enough for the overrides;
* NVIDIA container toolkit registered with Docker, Docker's cgroup driver
  (cgroupfs, against nvidia-container-toolkit issue 48), and a real
  ``docker run --rm --gpus all ubuntu:24.04 nvidia-smi -L``;
* GPUs visible (count, compute capability, driver branch and kernel module),
  and whether the versions this kit pins (Triton image, torch wheels,
  onnxruntime-gpu) support them -- the pins are read from the Dockerfiles and
  requirements files themselves;
* the stack's host ports free, disk space for the images;
* model artifacts built (and loadable by Triton 24.10's ONNX Runtime);
* the Triton image tags pinned and pulled; docker/.env holding the secrets;
* how far notebook 2's background builds and pulls got (``~/prepare-node.log``).

Every probe goes through a :class:`Host` (a PATH, a command runner, a root
for /proc files), so the tests drive each check both ways with stand-in
executables on a PATH. Standard library only: on the node it runs with the
system ``python3`` (``python3 -m servelab.node.doctor``), no virtual environment.

What a Pascal node (Tesla P100, compute capability 6.0) needs, and why:

* Triton <= 24.10: the server supports cc 6.0 up to 24.12, but its ONNX
  Runtime backend is built for sm_75+ from 24.11 on (25.01+: the server too).
* Driver branch 560-580 with the proprietary kernel module: R590+ and the open
  kernel modules do not support Pascal; Triton 24.10 needs >= 560 (or a
  data-center R525/R535/R545 branch through CUDA forward compatibility); the
  FastAPI images (CUDA 12.6 wheels, no forward-compat package) need >= 525.60.13.
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import sys
from pathlib import Path
from typing import Iterable, Sequence

from servelab.core import paths
from servelab.node import compose
from servelab.node.doctor_base import (  # noqa: F401 (re-exported: tests and notebooks use doctor.<name>)
    FAIL,
    LAST_P100_TRITON,
    ONNX_MAX_IR,
    ONNX_MAX_OPSET,
    PASS,
    SKIP,
    WARN,
    Gpu,
    Host,
    Pins,
    Result,
    driver_ok,
    driver_verdict,
    first_line,
    onnx_versions,
    pin_requirements,
    read_pins,
)

MIN_COMPOSE = (2, 24, 0)  # the CPU overrides use `!reset` (Compose 2.24+)
DEFAULT_MIN_FREE_GB = 40.0  # Triton + SDK images (24.06's server image: 15.5 GB, server issue 7474) + torch/ORT images
STACK_PORTS = {  # host ports each Compose stack publishes
    "fastapi": (80, 8000, 8888),
    "triton": (80, 8000, 8001, 8002, 8888),
}
PASCAL_DRIVER_FIX = ("install the proprietary driver of a 560-580 branch, e.g. sudo apt-get install -y "
                     "nvidia-driver-570 (not an -open package, not 590 or newer), then sudo reboot; or start "
                     "the server from CC-Ubuntu24.04-CUDA, which ships 560")
DOCKER_GROUP_FIX = ("add yourself to the docker group: sudo usermod -aG docker $USER, then log out and in "
                    "again (a new SSH session)")
CGROUPFS_FIX = ("jq '. + {\"exec-opts\": [\"native.cgroupdriver=cgroupfs\"]}' /etc/docker/daemon.json "
                "> /tmp/daemon.json && sudo mv /tmp/daemon.json /etc/docker/daemon.json "
                "&& sudo systemctl restart docker   (notebook 2 does this)")
SMOKE_IMAGE = "ubuntu:24.04"
NVML_LOST = "Failed to initialize NVML: Unknown Error"


# --------------------------------------------------------------------------
# Docker engine, Compose plugin, NVIDIA container toolkit
# --------------------------------------------------------------------------

def check_docker(host: Host) -> Result:
    name = "Docker engine"
    if host.which("docker") is None:
        return Result(name, FAIL, "docker CLI not found on PATH",
                      "install Docker Engine (notebook 2_create_server_nvidia does it on the node)")
    rc, out = host.run("docker", "info", "--format", "{{.ServerVersion}}")
    if rc != 0 and "permission denied" in out.lower():
        return Result(name, FAIL, f"no permission to use Docker: {first_line(out)}", DOCKER_GROUP_FIX)
    if rc != 0 or not out:
        return Result(name, FAIL, f"docker CLI found, engine not reachable: {first_line(out)}",
                      "sudo systemctl start docker; if it says permission denied: " + DOCKER_GROUP_FIX)
    return Result(name, PASS, f"engine {first_line(out)}")


def parse_version(text: str) -> tuple[int, ...] | None:
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(x) for x in m.groups()) if m else None


def check_compose(host: Host) -> Result:
    name = "Compose v2 plugin"
    need = ".".join(map(str, MIN_COMPOSE))
    fix = "install the docker-compose-plugin package (Docker's apt repository)"
    if host.which("docker") is None:
        return Result(name, FAIL, "needs the docker CLI (not found)", fix)
    rc, out = host.run("docker", "compose", "version")  # "Docker Compose version v2.40.3"
    version = parse_version(out) if rc == 0 else None
    if version is None:
        return Result(name, FAIL, f"`docker compose` does not run: {first_line(out)}", fix)
    if version < MIN_COMPOSE:
        return Result(name, FAIL, f"Compose {'.'.join(map(str, version))} < {need} "
                      "(the CPU overrides use `!reset`)", fix)
    return Result(name, PASS, f"Compose {'.'.join(map(str, version))}")


def check_nvidia_runtime(host: Host, cpu: bool = False) -> Result:
    name = "NVIDIA container toolkit"
    if cpu:
        return Result(name, SKIP, "not needed with the CPU override (--cpu)")
    fix = ("install nvidia-container-toolkit, then: sudo nvidia-ctk runtime configure --runtime=docker "
           "&& sudo systemctl restart docker")
    hook = host.which("nvidia-container-runtime-hook") or host.which("nvidia-ctk")
    if hook is None:
        return Result(name, FAIL, "nvidia-container-toolkit not installed (no nvidia-ctk on PATH)", fix)
    rc, out = host.run("docker", "info", "--format", "{{json .Runtimes}}")
    if rc != 0:
        return Result(name, WARN, "toolkit installed; Docker's runtimes unknown (engine not reachable)", fix)
    if '"nvidia"' not in out:
        return Result(name, WARN, "toolkit installed but not registered as a Docker runtime", fix)
    return Result(name, PASS, "nvidia runtime registered with Docker")


def check_cgroup_driver(host: Host, cpu: bool = False, engine_ok: bool = True) -> Result:
    """cgroupfs keeps GPUs attached across `systemctl daemon-reload` (nvidia-container-toolkit issue 48)."""
    name = "Docker cgroup driver"
    if cpu:
        return Result(name, SKIP, "only matters for GPU containers (--cpu)")
    if not engine_ok:
        return Result(name, SKIP, "needs the Docker engine (see above)")
    rc, out = host.run("docker", "info", "--format", "{{.CgroupDriver}}")
    driver = first_line(out) if rc == 0 else ""
    if driver == "cgroupfs":
        return Result(name, PASS, "cgroupfs (GPUs stay attached after a systemd daemon-reload)")
    if driver == "systemd":
        return Result(name, WARN, "systemd: a `systemctl daemon-reload` (apt can trigger one) detaches the GPUs "
                      f"from running containers ({NVML_LOST}; nvidia-container-toolkit issue 48)", CGROUPFS_FIX)
    return Result(name, WARN, f"cannot tell: {first_line(out) or 'no answer'}", CGROUPFS_FIX)


def check_gpu_container(host: Host, cpu: bool = False, engine_ok: bool = True, timeout: float = 300.0) -> Result:
    """The real thing: a container asks for every GPU and lists them."""
    name = "GPUs inside a container"
    cmd = ("docker", "run", "--rm", "--gpus", "all", SMOKE_IMAGE, "nvidia-smi", "-L")
    if cpu:
        return Result(name, SKIP, "not needed with the CPU override (--cpu)")
    if not engine_ok:
        return Result(name, SKIP, "needs the Docker engine (see above)")
    rc, out = host.run(*cmd, timeout=timeout)  # the first run pulls the small ubuntu image
    gpus = [line for line in out.splitlines() if line.startswith("GPU ")]
    shown = " ".join(cmd)
    if rc == 0 and gpus:
        return Result(name, PASS, f"`{shown}` lists {len(gpus)} GPU(s)")
    if NVML_LOST in out:
        return Result(name, FAIL, f"`{shown}`: {NVML_LOST}",
                      "the GPUs were detached from Docker (issue 48): switch to cgroupfs: " + CGROUPFS_FIX
                      + "; then recreate the stack: docker compose -f docker/docker-compose-<stack>.yaml up -d "
                      "--force-recreate")
    if "permission denied" in out.lower():
        return Result(name, FAIL, f"`{shown}`: {first_line(out)}", DOCKER_GROUP_FIX)
    if "could not select device driver" in out or "unknown runtime" in out:
        return Result(name, FAIL, f"`{shown}`: {first_line(out)}",
                      "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker")
    return Result(name, FAIL, f"`{shown}` exited {rc}: {first_line(out) or 'no output'}",
                  "check `nvidia-smi` on the node first, then the container toolkit (notebook 2)")


# --------------------------------------------------------------------------
# GPUs and the pinned versions' support for them
# --------------------------------------------------------------------------

def query_gpus(host: Host) -> tuple[list[Gpu] | None, str]:
    """GPUs from nvidia-smi, or (None, why) when it cannot tell."""
    rc, out = host.run("nvidia-smi", "--query-gpu=index,name,compute_cap,driver_version",
                       "--format=csv,noheader")
    if rc != 0:
        return None, first_line(out) or f"nvidia-smi exited {rc}"
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        major, _, minor = parts[2].partition(".")
        try:
            cap = (int(major), int(minor or 0))
        except ValueError:
            continue
        gpus.append(Gpu(int(parts[0]), parts[1], cap, parts[3]))
    return gpus, ""




def kernel_module(host: Host) -> str:
    """"open", "proprietary" or "" (unknown), from /proc/driver/nvidia/version."""
    text = host.read("/proc/driver/nvidia/version")
    if not text:
        return ""
    return "open" if "Open Kernel Module" in text else "proprietary"


def check_gpus(host: Host, pins: Pins, cpu: bool = False) -> list[Result]:
    """GPUs visible, and whether the pins and the driver support them."""
    if cpu:
        return [Result("NVIDIA GPUs", SKIP, "not needed with the CPU override (--cpu)")]
    gpus, why = query_gpus(host)
    fix_none = ("use a Chameleon gpu_p100 node with the CC-Ubuntu24.04-CUDA image; on a host "
                "without NVIDIA GPUs run `servelab doctor --cpu` and add the *.cpu.yaml override")
    if gpus is None:
        return [Result("NVIDIA GPUs", FAIL, f"no NVIDIA GPU visible: {why}", fix_none)]
    if not gpus:
        return [Result("NVIDIA GPUs", FAIL, "nvidia-smi lists no GPU", fix_none)]
    seen = ", ".join(f"{g.index}: {g.name} (cc {g.capability[0]}.{g.capability[1]})" for g in gpus)
    results = [Result("NVIDIA GPUs", PASS if len(gpus) >= 2 else WARN, f"{len(gpus)} GPU(s): {seen}",
                      "" if len(gpus) >= 2 else "the lab's multi-GPU instance-group steps expect 2 GPUs "
                      "(gpus: [0, 1]); with one, keep gpus: [0]")]
    return results + [_pins_support(pins, gpus), _driver_result(host, gpus)]


def _pins_support(pins: Pins, gpus: list[Gpu]) -> Result:
    bad = [(what, need) for what, need in pin_requirements(pins) if any(g.capability < need for g in gpus)]
    if not bad:
        what = ", ".join(w for w, _ in pin_requirements(pins)) or "no GPU pins found"
        return Result("Pins support these GPUs", PASS, what)
    lowest = min(g.capability for g in gpus)
    detail = "; ".join(f"{what} needs cc >= {need[0]}.{need[1]}" for what, need in bad)
    return Result("Pins support these GPUs", FAIL, f"{detail} (lowest here: {lowest[0]}.{lowest[1]})",
                  f"for a P100 keep Triton <= {LAST_P100_TRITON} (24.11+: the ONNX Runtime backend "
                  "has no sm_60), torch from the cu126 index, onnxruntime-gpu <= 1.26")


def _driver_result(host: Host, gpus: list[Gpu]) -> Result:
    driver = gpus[0].driver
    module = kernel_module(host)
    status, why = driver_verdict(driver, min(g.capability for g in gpus), open_module=module == "open")
    detail = f"{driver}{f' ({module} kernel module)' if module else ''}: {why}"
    return Result("NVIDIA driver", status, detail, "" if status == PASS else PASCAL_DRIVER_FIX)


# --------------------------------------------------------------------------
# Ports, disk, artifacts, images, secrets
# --------------------------------------------------------------------------

def port_in_use(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """True when something accepts connections on ``host:port``. Connecting
    (not binding) needs no privileges, so port 80 is checked as any other."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        return s.connect_ex((host, port)) == 0


def lab_ports(host: Host) -> set[int]:
    """Host ports the lab's own running containers publish (Compose projects named servelab-*)."""
    rc, out = host.run("docker", "ps", "--filter", "label=com.docker.compose.project", "--format",
                       '{{.Label "com.docker.compose.project"}}\t{{.Ports}}')
    held: set[int] = set()
    for line in out.splitlines() if rc == 0 else ():
        project, _, published = line.partition("\t")
        if project.startswith("servelab-"):
            for m in re.finditer(r":(\d+)(?:-(\d+))?->", published):  # 127.0.0.1:8000-8002->8000-8002/tcp
                held.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return held


def check_ports(ports: Iterable[int], held_by_lab: Iterable[int] = ()) -> Result:
    ports = sorted(set(ports))
    busy = [p for p in ports if port_in_use(p)]
    others = [p for p in busy if p not in set(held_by_lab)]
    if others:
        return Result("Host ports free", FAIL, f"in use: {', '.join(map(str, others))} (needed: "
                      f"{', '.join(map(str, ports))})",
                      "stop what listens there (sudo ss -ltnp); a stack already up? "
                      "docker compose -f docker/docker-compose-<stack>.yaml down")
    if busy:  # the doctor run beside a stack that is up: its own ports are not in the way
        return Result("Host ports free", PASS, f"{', '.join(map(str, ports))} (in use by the lab's own "
                      f"containers: {', '.join(map(str, busy))})")
    return Result("Host ports free", PASS, ", ".join(map(str, ports)))


def check_disk(path: Path, min_free_gb: float) -> Result:
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 1e9
    detail = f"{free_gb:.1f} GB free at {probe} (need {min_free_gb:.0f} GB)"
    if free_gb < min_free_gb:
        return Result("Disk space", FAIL, detail, "free space or move Docker's data-root to a bigger disk "
                      "(docker system prune removes unused images)")
    return Result("Disk space", PASS, detail)


def docker_root(host: Host) -> Path:
    rc, out = host.run("docker", "info", "--format", "{{.DockerRootDir}}")
    return Path(out.strip()) if rc == 0 and out.strip().startswith("/") else Path("/var/lib/docker")


def artifact_paths(repo: Path, stacks: Sequence[str]) -> list[Path]:
    wanted = []
    for target in (*paths.PTH_TARGETS, *paths.ONNX_TARGETS):
        rel = target.relative_to(paths.REPO_ROOT)
        in_staging = rel.parts[0] == "models_staging"
        if ("triton" in stacks and in_staging) or ("fastapi" in stacks and not in_staging):
            wanted.append(repo / rel)
    return wanted


def check_artifacts(repo: Path, stacks: Sequence[str]) -> Result:
    wanted = artifact_paths(repo, stacks)
    missing = [str(p.relative_to(repo)) for p in wanted if not p.is_file()]
    if missing:
        return Result("Model artifacts", FAIL, f"missing: {', '.join(missing)}",
                      "on the node: docker compose -f docker/docker-compose-models.yaml run --rm models; "
                      "locally: make models")
    return Result("Model artifacts", PASS, f"{len(wanted)} built")




def check_onnx_compat(repo: Path, stacks: Sequence[str]) -> Result:
    name = "ONNX model IR/opset"
    onnx_files = [p for p in artifact_paths(repo, stacks) if p.suffix == ".onnx" and p.is_file()]
    if not onnx_files:
        return Result(name, SKIP, "no ONNX artifact built yet (see Model artifacts)")
    problems = []
    for p in onnx_files:
        ir, opset = onnx_versions(p.read_bytes())
        if ir is None or ir > ONNX_MAX_IR or (opset is not None and opset > ONNX_MAX_OPSET):
            problems.append(f"{p.relative_to(repo)}: IR {ir}, opset {opset}")
    if problems:
        limits = f"Triton 24.10's ONNX Runtime 1.19 reads IR <= {ONNX_MAX_IR}, opset <= {ONNX_MAX_OPSET}"
        return Result(name, FAIL, "; ".join(problems) + f" ({limits})",
                      "re-export with a lower opset (servelab models build), or lower the file's ir_version")
    ir, opset = onnx_versions(onnx_files[0].read_bytes())
    return Result(name, PASS, f"IR {ir}, opset {opset}")


def check_images(host: Host, pins: Pins, engine_ok: bool, stacks: Sequence[str] = ("triton",)) -> Result:
    name = "Triton image tags"
    if "triton" not in stacks:
        return Result(name, SKIP, "the FastAPI stack does not use them")
    if not pins.triton_tag or not pins.sdk_tag:
        return Result(name, FAIL, "no pinned nvcr.io/nvidia/tritonserver:YY.MM-py3 tag found in docker/",
                      "restore docker/Dockerfile.triton and docker/docker-compose-triton.yaml")
    if pins.triton_tag != pins.sdk_tag:
        return Result(name, FAIL, f"server {pins.triton_tag} and SDK {pins.sdk_tag} differ",
                      "use the same release for tritonserver:*-py3 and *-py3-sdk")
    images = [f"nvcr.io/nvidia/tritonserver:{pins.triton_tag}-py3",
              f"nvcr.io/nvidia/tritonserver:{pins.sdk_tag}-py3-sdk"]
    if not engine_ok:
        return Result(name, WARN, f"{', '.join(images)}; cannot tell if pulled (no Docker engine)",
                      "once Docker runs, pull before class: " + " && ".join(f"docker pull {i}" for i in images))
    missing = [i for i in images if host.run("docker", "image", "inspect", i)[0] != 0]
    if missing:
        return Result(name, WARN, f"not pulled yet: {', '.join(missing)} (notebook 2 pulls them in the background: tail ~/prepare-node.log; else the first `up` does)",
                      " && ".join(f"docker pull {i}" for i in missing))
    return Result(name, PASS, ", ".join(images) + " pulled")


PREPARE_LOG = "prepare-node.log"  # in the cc user's home: docker/prepare-node.sh's progress (notebook 2)
PREPARE_READY = {"fastapi": "FastAPI part ready", "triton": "Triton part ready"}
PREPARE_FAILED = "stopped with an error"


def check_preparation(log: Path, stacks: Sequence[str]) -> Result:
    """How far notebook 2's background builds and pulls (docker/prepare-node.sh) got for these stacks."""
    name = "Background builds (notebook 2)"
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return Result(name, SKIP, f"no {log}: notebook 2 did not start them here; the stack's own commands "
                                  "build and pull everything")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if PREPARE_FAILED in text:
        return Result(name, WARN, lines[-1][:160],
                      f"the notebooks' own commands redo the step that failed; its error: tail -n 20 {log}")
    missing = [PREPARE_READY[s] for s in stacks if PREPARE_READY[s] not in text]
    if not missing:
        return Result(name, PASS, ", ".join(PREPARE_READY[s] for s in stacks))
    return Result(name, WARN, f"still running: {lines[-1][:120] if lines else 'just started'}",
                  f"wait for '{missing[0]}' (tail -f {log}); the commands below would download the same "
                  "files again in parallel")


def check_env_file(env_file: Path) -> Result:
    missing = compose.missing_secrets(env_file)
    if missing:
        return Result("Secrets in docker/.env", FAIL, f"missing or placeholder: {', '.join(missing)}",
                      "python3 -m servelab.node.doctor --write-env   (random values, file mode 0600, git-ignored)")
    mode = env_file.stat().st_mode & 0o777
    if mode & 0o077:
        return Result("Secrets in docker/.env", WARN, f"readable by others (mode {mode:o})", f"chmod 600 {env_file}")
    return Result("Secrets in docker/.env", PASS, ", ".join(compose.SECRET_NAMES) + " set")


# --------------------------------------------------------------------------
# The whole run
# --------------------------------------------------------------------------

def run_checks(host: Host | None = None, repo: Path | None = None, cpu: bool = False,
               stacks: Sequence[str] = ("fastapi", "triton"), min_free_gb: float = DEFAULT_MIN_FREE_GB,
               env_file: Path | None = None, ports: Iterable[int] | None = None,
               prepare_log: Path | None = None) -> list[Result]:
    host = host or Host()
    repo = Path(repo or paths.REPO_ROOT)
    env_file = env_file or repo / "docker" / ".env"
    pins = read_pins(repo)
    results = [check_docker(host), check_compose(host), check_nvidia_runtime(host, cpu=cpu)]
    engine_ok = results[0].status == PASS
    results.append(check_cgroup_driver(host, cpu=cpu, engine_ok=engine_ok))
    results += check_gpus(host, pins, cpu=cpu)
    results.append(check_gpu_container(host, cpu=cpu, engine_ok=engine_ok))
    results.append(check_ports(ports if ports is not None else [p for s in stacks for p in STACK_PORTS[s]],
                               lab_ports(host) if engine_ok else ()))
    results.append(check_disk(docker_root(host) if engine_ok else Path("/var/lib/docker"), min_free_gb))
    results.append(check_artifacts(repo, stacks))
    results.append(check_onnx_compat(repo, stacks))
    results.append(check_images(host, pins, engine_ok, stacks))
    results.append(check_env_file(env_file))
    if prepare_log is not None:
        results.append(check_preparation(prepare_log, stacks))
    return results


def format_table(results: Sequence[Result]) -> str:
    width = max(len(r.name) for r in results)
    lines = []
    for r in results:
        lines.append(f"{r.status:4}  {r.name:<{width}}  {r.detail}")
        if r.fix and r.status != PASS:
            lines.append(f"{'':4}  {'':<{width}}  fix: {r.fix}")
    fails = sum(r.status == FAIL for r in results)
    warns = sum(r.status == WARN for r in results)
    lines.append("")
    lines.append(f"{fails} failed, {warns} warning(s): "
                 + ("this host is NOT ready for the lab." if fails else "ready for the lab."))
    return "\n".join(lines)


def process_list_note(mounts: Path = Path("/proc/mounts")) -> str:
    """Triton takes its admin key only as a command-line argument
    (``--http-restricted-api=...:admin-key=KEY``), and any local user reads
    every process's command line unless /proc is mounted with hidepid=2.
    '' when /proc hides other users' processes, else the advice."""
    try:
        for line in mounts.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "/proc" and parts[2] == "proc":
                opts = dict((o.split("=", 1) + [""])[:2] for o in parts[3].split(","))
                if opts.get("hidepid") in ("2", "invisible"):
                    return ""
    except OSError:
        pass
    return ("note: TRITON_ADMIN_KEY is an argument of tritonserver, so any user of this host can read it "
            "in /proc/<pid>/cmdline (Jupyter's token is not: it travels in the environment). On a host "
            "shared with other users, remount /proc with hidepid=2 (`sudo mount -o remount,hidepid=2 "
            "/proc`) or run the lab on a host or account of its own. See docs/SECURITY.md.")


def _cmd_doctor(args: argparse.Namespace) -> int:
    env_file = Path(args.env_file) if args.env_file else None
    if args.write_env:
        target = env_file or Path(args.repo or paths.REPO_ROOT) / "docker" / ".env"
        made = compose.write_env_file(target)
        print(f"{target}: " + (f"generated {', '.join(made)}" if made else "secrets already set"))
    stacks = ("fastapi", "triton") if args.stack == "all" else (args.stack,)
    results = run_checks(repo=Path(args.repo) if args.repo else None, cpu=args.cpu, stacks=stacks,
                         min_free_gb=args.min_free_gb, env_file=env_file, prepare_log=Path.home() / PREPARE_LOG)
    mode = "CPU-only Docker host" if args.cpu else "GPU node"
    print(f"servelab doctor: pre-flight for the Compose stacks ({mode}, stack: {args.stack})\n")
    print(format_table(results))
    if process_list_note():
        print("\n" + process_list_note())
    return 1 if any(r.status == FAIL for r in results) else 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "doctor", help="pre-flight check of a Docker host before class",
        description="Check a host for the lab's Docker Compose stacks: Docker, Compose, NVIDIA toolkit, "
                    "GPUs vs pinned versions, ports, disk, model artifacts, Triton images, secrets. "
                    "Exits 1 if any check fails.")
    p.add_argument("--cpu", action="store_true",
                   help="the host has no NVIDIA GPU and will use the *.cpu.yaml overrides")
    p.add_argument("--stack", choices=("fastapi", "triton", "all"), default="all",
                   help="which stack's ports and artifacts to check (default: all)")
    p.add_argument("--min-free-gb", type=float, default=DEFAULT_MIN_FREE_GB,
                   help=f"disk space the images need (default: {DEFAULT_MIN_FREE_GB:.0f})")
    p.add_argument("--write-env", action="store_true",
                   help="first create docker/.env with random JUPYTER_TOKEN and TRITON_ADMIN_KEY "
                        "(keeps values already set)")
    p.add_argument("--env-file", help=argparse.SUPPRESS)
    p.add_argument("--repo", help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_doctor)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # servelab.cli.run_alone's shape, kept here: doctor runs on a node's bare system python3.
    parser = argparse.ArgumentParser(prog="python -m servelab.node.doctor")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["doctor", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
