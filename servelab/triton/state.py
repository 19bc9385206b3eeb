"""The state file of a local Triton (``build/triton/run-<http port>.json``): how
``servelab triton reload/stop``, the stubs view and the stack find a server that
another shell started. It holds the admin key, so it is written 0600."""

from __future__ import annotations

import json
import os
from pathlib import Path

from servelab.core import paths, procs


def state_path(http_port: int) -> Path:
    return paths.BUILD_DIR / "triton" / f"run-{http_port}.json"


def read_state(http_port: int | None = None, grpc_port: int | None = None) -> dict | None:
    """The state of a running local Triton, by HTTP or gRPC port."""
    folder = paths.BUILD_DIR / "triton"
    candidates = [state_path(http_port)] if http_port else sorted(folder.glob("run-*.json"))
    for path in candidates:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if grpc_port and state.get("grpc_port") != grpc_port:
            continue
        if procs.pid_alive(state.get("pid", -1)) and "tritonserver" in " ".join(procs.cmdline(state["pid"])):
            return state
    return None


def write_state(path: Path, state: dict) -> bool:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{path}.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the admin key
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=2)
        os.replace(f"{path}.tmp", path)
        return True
    except OSError:
        return False
