"""Model control over gRPC with the admin key: the config Triton reports,
and ``reload_model`` (edit a config, load the model again).

``reload_model(name, edit=None | dict | callable | "pbtxt fragment", server=None,
grpc_url=None, admin_key=None) -> reported config (dict)``

* local server (``server=`` or a state file for that gRPC port): the edit is
  written into the runtime repository's ``config.pbtxt`` and the model is
  loaded again (``edit=None`` re-reads ``models_staging/<name>/``, config and
  ``model.py``); the result is the config Triton now reports;
* remote server (e.g. the lab's container): ``load_model(name, config=json)``.
  An override *sticks*: a later plain ``load_model(name)`` changes nothing
  until the files change.
* ``dict`` edits replace top-level fields (``None`` removes one); a pbtxt
  fragment such as ``'dynamic_batching { max_queue_delay_microseconds: 2000 }'``
  does the same; a callable gets the config dict and returns the new one.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from servelab.core import paths
from servelab.triton.config import (  # noqa: F401 (instance_count: re-exported)
    Edit,
    apply_edit,
    config_to_dict,
    describe_config,
    dict_to_config,
    instance_count,
    load_config,
)
from servelab.triton.install import ADMIN_KEY_ENV, DEFAULT_GRPC_PORT, DEFAULT_HOST, GRPC_ADMIN_HEADER
from servelab.triton.process import stub_processes, wait_for_stubs
from servelab.triton.repository import sync_model
from servelab.triton.state import read_state


class LocalServer(Protocol):
    """What a reload needs of a local server (``servelab.triton.server.TritonServer`` has it;
    a protocol, so this module never imports the server that calls it)."""

    grpc_url: str
    admin_key: str
    repo: Path
    source: Path
    gpus: int
    log_path: Path
    pid: int | None


def _grpc(grpc_url: str):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(grpc_url)


def model_config(name: str, grpc_url: str = f"{DEFAULT_HOST}:{DEFAULT_GRPC_PORT}") -> dict:
    """The config Triton reports for ``name`` (what it is really running)."""
    client = _grpc(grpc_url)
    try:
        return client.get_model_config(name, as_json=True)["config"]
    finally:
        client.close()


@dataclass
class _Target:
    """Where a reload goes: the server's address and key, and (for a local
    server) its runtime repository, source and log."""

    grpc_url: str
    admin_key: str | None = None
    repo: str | os.PathLike | None = None
    source: str | os.PathLike | None = None
    gpus: int | None = None
    log_path: Path | None = None
    pid: int | None = None        # a local server's process: its stubs can be watched


def _local_state(grpc_url: str) -> dict | None:
    """The state file of a local Triton listening on ``grpc_url``, if any."""
    try:
        port = int(grpc_url.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None
    if grpc_url.split(":")[0] not in ("127.0.0.1", "localhost"):
        return None
    return read_state(grpc_port=port)


def _target(server: LocalServer | None, grpc_url, admin_key, repo, source, gpus) -> _Target:
    if server is not None:
        return _Target(server.grpc_url, admin_key or server.admin_key, server.repo, server.source,
                       server.gpus, server.log_path, server.pid)
    target = _Target(grpc_url or os.environ.get("TRITON_GRPC_URL") or f"{DEFAULT_HOST}:{DEFAULT_GRPC_PORT}",
                     admin_key, repo, source, gpus)
    state = _local_state(target.grpc_url)
    if state:
        target.admin_key = target.admin_key or state["admin_key"]
        target.repo = target.repo or state["repo"]
        target.source = target.source or state["source"]
        target.gpus = state["gpus"] if gpus is None else gpus
        target.log_path = Path(state["log"])
        target.pid = state.get("pid")
    target.admin_key = target.admin_key or os.environ.get(ADMIN_KEY_ENV)
    return target


def admin_key(grpc_url: str | None = None) -> str | None:
    """The admin key of the Triton at ``grpc_url``: ``$TRITON_ADMIN_KEY`` (the Compose stack sets it in
    the Jupyter container), or the state file of a local server the kit started."""
    return _target(None, grpc_url, None, None, None, None).admin_key


def _apply_via(target: _Target, via: str) -> None:
    if via == "override":
        target.repo = None
    elif via == "file" and target.repo is None:
        raise ValueError("via='file' needs the runtime repository (server= or repo=)")


def _rewrite_config(name: str, edit: Edit, repo: Path, source: Path, gpus: int | None) -> tuple:
    """The runtime repository's copy of ``name`` with ``edit`` applied
    (``None``: back to ``source/<name>``). Returns ``(cfg, notes)``."""
    if edit is None:
        return sync_model(name, source, repo, gpus)
    current = config_to_dict(load_config(repo / name))
    edited = dict_to_config(apply_edit(current, edit), f"{name} edit")
    return sync_model(name, source, repo, gpus, cfg=edited)


def _reload_from_files(client, name: str, edit: Edit, target: _Target, headers, timeout: float,
                       verbose: bool) -> None:
    repo, source = Path(target.repo), Path(target.source or paths.MODELS_STAGING)
    config_file = repo / name / "config.pbtxt"
    previous = config_file.read_text() if config_file.exists() else None
    _, notes = _rewrite_config(name, edit, repo, source, target.gpus)
    if verbose:
        for note in notes:
            print(f"note: {note}")
    try:
        client.load_model(name, headers=headers, client_timeout=timeout)
    except Exception:
        # Refused (no key) or failed: keep the file in step with what runs.
        if previous is not None:
            config_file.write_text(previous)
        raise


def _reload_with_override(client, name: str, edit: Edit, headers, timeout: float) -> None:
    current = client.get_model_config(name, as_json=True)["config"]
    new = apply_edit(current, edit)
    client.load_model(name, headers=headers, config=json.dumps(new), client_timeout=timeout)


def reload_model(name: str, edit: Edit = None, *, server: LocalServer | None = None,
                 grpc_url: str | None = None, admin_key: str | None = None, repo: str | os.PathLike | None = None,
                 source: str | os.PathLike | None = None, gpus: int | None = None, via: str = "auto",
                 timeout: float = 180.0, verbose: bool = True) -> dict:
    """Edit a model's config, load it again over gRPC, return the config
    Triton now reports. See the module docstring for ``edit``.

    ``via="file"`` rewrites the runtime repository's config.pbtxt (local
    servers; the default when the repository is known), ``via="override"``
    sends the config with ``load_model`` (any server; it sticks)."""
    if via not in ("auto", "file", "override"):
        raise ValueError(f"via must be 'auto', 'file' or 'override', not {via!r}")
    target = _target(server, grpc_url, admin_key, repo, source, gpus)
    _apply_via(target, via)
    headers = {GRPC_ADMIN_HEADER: target.admin_key} if target.admin_key else None
    client = _grpc(target.grpc_url)
    log_size = _log_size(target.log_path)
    try:
        if target.repo is not None:
            _reload_from_files(client, name, edit, target, headers, timeout, verbose)
        else:
            _reload_with_override(client, name, edit, headers, timeout)
        reported = client.get_model_config(name, as_json=True)["config"]
    except Exception:
        # Triton's answer can be terse ("failed to poll from model repository"):
        # its log says why. Show what it wrote during this reload.
        if verbose and target.log_path is not None:
            lines = log_since(target.log_path, log_size, name)
            if lines:
                print(f"Triton's log during the reload of {name}:\n{lines}", file=sys.stderr)
        raise
    finally:
        client.close()
    if target.pid is not None and any(s.model == name for s in stub_processes(target.pid)):
        # Python-backend instances: let the old ones exit before anything is timed
        # (one set of instances per version served: version_policy).
        versions = _ready_versions(target.grpc_url, name, Path(target.repo) / name if target.repo else None)
        wait_for_stubs(target.pid, name, instance_count(reported) * max(1, versions), timeout=60.0)
    if verbose:
        print(f"reloaded {describe_config(reported)}")
    return reported


def forget_model(name: str, grpc_url: str) -> bool:
    """Delete ``name``'s translated copy from a local Triton's runtime repository, once the
    model is unloaded and its folder in the source repository is gone: Triton's repository
    index then lists it no more, as on a server that reads the source itself. Returns whether
    there was a copy; a Triton this machine did not start has none."""
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"{name!r} is not a model folder's name")
    state = _local_state(grpc_url)
    if not state:
        return False
    if (Path(state["source"]) / name).is_dir():
        raise ValueError(f"{name} is still in {state['source']}: delete that folder first")
    folder = Path(state["repo"]) / name
    if not folder.is_dir():
        return False
    shutil.rmtree(folder)
    return True


def _ready_versions(grpc_url: str, name: str, model_dir: Path | None) -> int:
    """How many versions of ``name`` Triton serves now (of the version folders in ``model_dir``)."""
    if model_dir is None or not model_dir.is_dir():
        return 1
    client = _grpc(grpc_url)
    try:
        return sum(1 for v in model_dir.iterdir() if v.is_dir() and v.name.isdigit()
                   and client.is_model_ready(name, v.name))
    except Exception:
        return 1
    finally:
        client.close()


def _log_size(log_path: Path | None) -> int:
    return log_path.stat().st_size if log_path is not None and log_path.exists() else 0


def log_since(log_path: Path, offset: int, name: str, limit: int = 20) -> str:
    """Lines of Triton's log after ``offset`` that mention ``name`` or are errors."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read(1_000_000).decode(errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if name in ln or ln.startswith("E")]
    return "\n".join(lines[-limit:])


def edit_for_poll(server: LocalServer, name: str, edit: Edit, check, timeout: float = 60.0) -> tuple[dict, float]:
    """POLL mode (a server started with ``poll_secs``): write ``edit`` into the
    runtime repository's config and make NO load call; wait until the config
    Triton reports passes ``check(config)``. Returns ``(config, seconds)``:
    how long Triton took to notice the file by itself."""
    import time

    _rewrite_config(name, edit, Path(server.repo), Path(server.source), server.gpus)
    t0 = time.monotonic()
    while True:
        try:
            reported = model_config(name, grpc_url=server.grpc_url)
            if check(reported):
                return reported, time.monotonic() - t0
        except Exception:  # unavailable while it reloads
            pass
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"Triton did not pick up the edit of {name} within {timeout:.0f} s (POLL mode?)")
        time.sleep(0.2)
