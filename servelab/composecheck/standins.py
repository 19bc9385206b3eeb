"""Stand-in base images for the compose check (docker/standin/README.md says what each one is).

Nothing can be pulled on the machine that runs the check, so each base image the kit's Dockerfiles
and Compose files name is built here from Debian's packages and PyPI, and tagged with that exact
name. Every stand-in carries the label ``org.servelab.standin``; ``report`` reads it back.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from servelab.core import paths

STANDIN_DIR = paths.REPO_ROOT / "docker" / "standin"
LABEL = "org.servelab.standin"
BASE_TAG = "servelab-standin/bookworm:base"
# One Debian 12 root file system for every stand-in: Python (with libpython for Triton's stub),
# the CA bundle, wget (the health checks), HAProxy 2.6 and Prometheus 2.42 (the scale stack).
BASE_PACKAGES = ("python3", "python3-pip", "python3-venv", "libpython3.11", "ca-certificates", "wget",
                 "haproxy", "prometheus", "procps")
# The tag the kit uses -> the stand-in's Dockerfile in docker/standin/, in build order.
STANDINS = {
    "python:3.11.13-slim-bookworm": "python.Dockerfile",
    "nvcr.io/nvidia/tritonserver:24.10-py3": "triton.Dockerfile",
    "nvcr.io/nvidia/tritonserver:24.10-py3-sdk": "sdk.Dockerfile",
    "haproxy:2.6-alpine": "haproxy.Dockerfile",
    "prom/prometheus:v2.42.0": "prometheus.Dockerfile",
}
# What the kit's own builds get here instead of what the node uses: environment variables that the
# Compose files read (every substitution is here and in docker/standin/README.md, nowhere else).
SUBSTITUTIONS = {
    # PyTorch's index cannot be reached here; PyPI's torch 2.7.1 is the same release (CUDA 12.6 build).
    "TORCH_INDEX_URL": "https://pypi.org/simple",
}
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def docker(*args: str, check: bool = True, capture: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], check=check, text=True,
                          capture_output=capture, **kw)


def image_exists(tag: str) -> bool:
    return docker("image", "inspect", tag, check=False).returncode == 0


def build_base(log: Callable[[str], None] = print, force: bool = False) -> bool:
    """mmdebstrap a minimal Debian 12 with BASE_PACKAGES into ``docker import``; False if it was there."""
    if image_exists(BASE_TAG) and not force:
        return False
    if shutil.which("mmdebstrap") is None:
        raise RuntimeError("mmdebstrap is missing: `make sysdeps` installs it (Debian package mmdebstrap)")
    log(f"building {BASE_TAG} with mmdebstrap (Debian 12 minbase + {', '.join(BASE_PACKAGES)})")
    strap = subprocess.Popen(["mmdebstrap", "--variant=minbase", "--include=" + ",".join(BASE_PACKAGES),
                              "bookworm", "-"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    imported = subprocess.run(["docker", "import", "-c", f'LABEL {LABEL}="Debian 12 minbase for the stand-ins"',
                               "-", BASE_TAG], stdin=strap.stdout, capture_output=True, text=True)
    strap.stdout.close()
    if strap.wait() != 0 or imported.returncode != 0:
        raise RuntimeError(f"mmdebstrap exited {strap.returncode}; docker import: {imported.stderr.strip()}")
    return True


def build_standins(log: Callable[[str], None] = print) -> dict[str, float]:
    """Build every stand-in (Docker's cache makes a second run quick); returns seconds per tag."""
    import time

    times = {}
    with tempfile.TemporaryDirectory(prefix="servelab-standin-") as ctx:
        context = Path(ctx)
        shutil.copy(HOST_CA_BUNDLE, context / "ca-certificates.crt")
        shutil.copy(STANDIN_DIR / "onnxruntime_backend.py", context / "onnxruntime_backend.py")
        for tag, dockerfile in STANDINS.items():
            start = time.monotonic()
            log(f"building stand-in {tag} ({dockerfile})")
            proc = docker("build", "-q", "-t", tag, "-f", str(STANDIN_DIR / dockerfile), str(context),
                          check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"stand-in {tag} did not build:\n{proc.stderr[-3000:]}")
            times[tag] = time.monotonic() - start
    return times


def report() -> list[str]:
    """One line per stand-in: its tag, size and label (every image the check uses that is not upstream)."""
    lines = []
    for tag in (BASE_TAG, *STANDINS):
        proc = docker("image", "inspect", "-f", "{{.Size}}\t{{index .Config.Labels \"" + LABEL + "\"}}", tag,
                      check=False)
        if proc.returncode != 0:
            lines.append(f"{tag}: missing")
            continue
        size, label = proc.stdout.strip().split("\t", 1)
        lines.append(f"{tag}: STAND-IN, {int(size) / 1e6:.0f} MB: {label}")
    return lines
