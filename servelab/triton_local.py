"""The real Triton 2.51 on a laptop: the binary inside nvidia-pytriton 0.7.0.

API summary
-----------
Start / stop (a real ``tritonserver`` process; ports default to the lab's)::

    with triton_local.running(models=None, http_port=8000, grpc_port=8001,
                              metrics_port=8002) as t:
        t.http_url      # "http://127.0.0.1:8000"
        t.url           # "127.0.0.1:8000"  (TRITON_SERVER_URL style, tritonclient.http)
        t.grpc_url      # "127.0.0.1:8001"  (tritonclient.grpc)
        t.metrics_url   # "http://127.0.0.1:8002/metrics"
        t.admin_key     # key for the model-repository API (random per run
                        #   unless TRITON_ADMIN_KEY is set)
        t.notes         # what was adapted locally (KIND_GPU -> KIND_CPU, ONNX runner)
        t.reload_model("food_classifier", {"instance_group": [{"count": 2, "kind": "KIND_CPU"}]})
        t.model_config(name), t.model_stats(name), t.stub_processes(name),
        t.wait_for_stubs(name, count), t.log_tail()

    t = triton_local.start(...); ...; t.stop()     # same thing without ``with``
    triton_local.stop_running(http_port=8000)       # stop one started elsewhere

Reload (explicit model control, over gRPC with the admin key)::

    reload_model(name, edit=None | dict | callable | "pbtxt fragment",
                 server=None, grpc_url=None, admin_key=None) -> reported config (dict)

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

Statistics are cumulative (they survive reloads): take
``before = t.model_stats(m)`` and ``stats_delta(before, t.model_stats(m))``.

Configs: ``load_config(path)``, ``config_to_dict``, ``describe_config``,
``localize_config`` (the local adaptations), ``build_repository`` (the
runtime repository), all on Triton's own ``ModelConfig`` protobuf schema
(``tritonclient.grpc.model_config_pb2``).

perf_analyzer: ``perf_analyzer_env()`` (and :mod:`servelab.perf`: ``install_shim``,
``run``, ``parse_output``, ``parse_csv``).

``start(repo=None, *, models=None, host="127.0.0.1", http_port, grpc_port,
metrics_port, admin_key=None, workdir=None, exit_timeout=3, timeout=240)``
builds a runtime repository under ``workdir`` (a temp folder by default,
removed at stop) from ``repo`` (default models_staging/), waits until every
model is READY and writes ``build/triton/run-<http_port>.json`` (mode 0600:
ports, PID, admin key) so ``servelab triton reload/status/stop`` in another
shell can find it. ``stop()`` unloads the models, SIGTERMs the server, then
reaps any stub process left (by PID) and the run's ``/dev/shm`` regions.
A server started from the main thread also stops when its owner dies.

Command line (``servelab triton ACTION`` or ``python -m servelab.triton_local ACTION``):
``start`` (foreground, Ctrl-C stops), ``stop``, ``status``, ``reload MODEL
[--count N --kind K --dynamic-batching --max-queue-delay-us N
--preferred-batch-size N.. --no-dynamic-batching --set PBTXT]``, ``config``,
``stats``, ``env`` (perf_analyzer exports), ``setup`` (perf_analyzer shim),
``perf -- ARGS`` (run perf_analyzer, print a table).

What "local" changes, said plainly in the output
------------------------------------------------
* ``KIND_GPU`` instance groups become ``KIND_CPU`` when the machine has no GPU.
* The binary has no onnxruntime backend: a model whose config says
  ``backend: "onnxruntime"`` runs on the Python backend through servelab's
  runner (``servelab/triton_runner/onnx_model.py``) built on onnxruntime,
  honouring the same IO names, ``max_batch_size``, ``instance_group`` and
  ``dynamic_batching``. models_staging/ keeps the onnxruntime config the
  container uses.
* The server's environment gets ``OMP_WAIT_POLICY=PASSIVE`` unless you set
  it: PyTorch's spinning OpenMP threads collapse on a few shared cores.
* Everything listens on 127.0.0.1; the model-repository API (load/unload)
  requires the admin key over HTTP (header ``admin-key``) and gRPC (header
  ``triton-grpc-protocol-admin-key``).
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence, Union

from servelab import food11, paths, procs

DEFAULT_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
DEFAULT_METRICS_PORT = 8002
# A short exit timeout: Triton otherwise waits 30 s for idle keep-alive clients.
EXIT_TIMEOUT_S = 3
ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
HTTP_ADMIN_HEADER = "admin-key"
GRPC_ADMIN_HEADER = "triton-grpc-protocol-admin-key"
RUNNER_PARAMETER = "servelab_runner"
ONNX_FILE_PARAMETER = "servelab_onnx_file"
RUNNER_NOTE = (
    "{name}: this Triton binary has no onnxruntime backend, so locally it runs on the Python backend "
    "through servelab's onnxruntime runner (same IO names, max_batch_size, instance_group, dynamic_batching); "
    "the lab's container uses the real onnxruntime backend with the same config.pbtxt."
)

Edit = Union[None, Mapping, str, Callable[[dict], Union[dict, None]]]


class TritonError(RuntimeError):
    """The local Triton could not be found, started or driven."""


# --------------------------------------------------------------------------
# The installed binary
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class TritonInstall:
    root: Path  # .../site-packages/pytriton/tritonserver

    @property
    def server(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def python_backend(self) -> Path:
        return self.root / "backends" / "python"

    @property
    def libs(self) -> Path:
        return self.root.parent.parent / "nvidia_pytriton.libs"

    def stub(self, version: tuple[int, int] | None = None) -> Path:
        major, minor = version or sys.version_info[:2]
        return self.root / "python_backend_stubs" / f"{major}.{minor}" / "triton_python_backend_stub"


def find_install() -> TritonInstall:
    """Locate tritonserver, the Python backend and the stub for this Python."""
    try:
        import pytriton
    except ImportError as err:
        raise TritonError("nvidia-pytriton is not installed: `pip install nvidia-pytriton==0.7.0`.") from err
    install = TritonInstall(Path(pytriton.__file__).resolve().parent / "tritonserver")
    for needed in (install.server, install.python_backend / "libtriton_python.so", install.libs):
        if not needed.exists():
            raise TritonError(f"{needed} is missing: reinstall nvidia-pytriton==0.7.0.")
    if not install.stub().exists():
        raise TritonError(
            f"no Python-backend stub for Python {sys.version_info[0]}.{sys.version_info[1]} in "
            f"{install.stub().parent.parent} (nvidia-pytriton 0.7.0 ships 3.8 to 3.13)."
        )
    return install


def gpu_count() -> int:
    """GPUs Triton could use here. ``SERVELAB_DEVICE=cpu`` forces 0."""
    if os.environ.get("SERVELAB_DEVICE", "").strip().lower() == "cpu":
        return 0
    return len([p for p in Path("/dev").glob("nvidia[0-9]*") if p.name[6:].isdigit()])


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def perf_analyzer_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment in which the venv's real perf_analyzer starts (see servelab.perf)."""
    from servelab import perf

    return perf.perf_analyzer_env(base)


# --------------------------------------------------------------------------
# Model configs, on Triton's own protobuf schema
# --------------------------------------------------------------------------

def _pb():
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2


def parse_config_text(text: str, where: str = "config.pbtxt"):
    """pbtxt text → ``ModelConfig`` (raises ValueError naming the problem)."""
    from google.protobuf import text_format

    cfg = _pb().ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as err:
        raise ValueError(f"{where}: {err}") from None
    return cfg


def load_config(path: str | os.PathLike):
    """A ``config.pbtxt`` (or its model folder) → ``ModelConfig``."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.pbtxt"
    return parse_config_text(path.read_text(), str(path))


def config_to_dict(cfg) -> dict:
    from google.protobuf import json_format

    return json_format.MessageToDict(cfg, preserving_proto_field_name=True)


def dict_to_config(data: Mapping, where: str = "config"):
    """A config dict (Triton's JSON form) → ``ModelConfig``; unknown fields
    or wrong types raise ValueError before anything reaches the server."""
    from google.protobuf import json_format

    cfg = _pb().ModelConfig()
    try:
        json_format.ParseDict(dict(data), cfg)
    except json_format.ParseError as err:
        raise ValueError(f"{where}: {err}") from None
    return cfg


def config_to_text(cfg, header: str = "") -> str:
    from google.protobuf import text_format

    lines = "".join(f"# {line}\n" for line in header.splitlines()) if header else ""
    return lines + text_format.MessageToString(cfg)


def apply_edit(config: Mapping, edit: Edit) -> dict:
    """Return a new config dict with ``edit`` applied (see module docstring)."""
    new = copy.deepcopy(dict(config))
    if edit is None:
        return new
    if callable(edit):
        result = edit(new)
        return dict(result if result is not None else new)
    if isinstance(edit, str):
        fragment = parse_config_text(edit, "edit")
        edit = config_to_dict(fragment)
        # An empty block such as "dynamic_batching { }" is present but has no fields.
        for desc, _ in fragment.ListFields():
            edit.setdefault(desc.name, {})
    for key, value in dict(edit).items():
        if value is None:
            new.pop(key, None)
        else:
            new[key] = copy.deepcopy(value)
    dict_to_config(new, "edited config")  # validate now, with a clear message
    return new


def is_onnx_config(cfg) -> bool:
    return cfg.backend == "onnxruntime" or cfg.platform == "onnxruntime_onnx"


def is_runner_config(cfg) -> bool:
    return RUNNER_PARAMETER in cfg.parameters


def instance_count(cfg) -> int:
    """Total instances a config asks for (count × listed GPUs per group)."""
    groups = list(cfg.instance_group) or [None]
    total = 0
    for g in groups:
        total += 1 if g is None else (g.count or 1) * max(1, len(g.gpus))
    return total


def localize_config(cfg, gpus: int | None = None, name: str | None = None):
    """Adapt a lab config to this machine; returns ``(new_cfg, notes)``.
    Idempotent: applying it to its own output changes nothing."""
    pb = _pb()
    gpus = gpu_count() if gpus is None else gpus
    new = pb.ModelConfig()
    new.CopyFrom(cfg)
    name = name or new.name or "model"
    notes: list[str] = []
    if is_onnx_config(new):
        new.backend = "python"
        new.platform = ""
        new.parameters[RUNNER_PARAMETER].string_value = "onnxruntime"
        # The Python backend wants default_model_filename to be model.py.
        new.parameters[ONNX_FILE_PARAMETER].string_value = new.default_model_filename or "model.onnx"
        new.default_model_filename = ""
        notes.append(RUNNER_NOTE.format(name=name))
    for group in new.instance_group:
        if group.kind == pb.ModelInstanceGroup.KIND_GPU:
            if gpus == 0:
                group.kind = pb.ModelInstanceGroup.KIND_CPU
                del group.gpus[:]
                notes.append(f"{name}: no GPU on this machine, instance_group KIND_GPU runs as KIND_CPU "
                             f"(count {group.count or 1}).")
            elif any(g >= gpus for g in group.gpus):
                keep = [g for g in group.gpus if g < gpus] or [0]
                notes.append(f"{name}: only {gpus} GPU(s) here, gpus {list(group.gpus)} -> {keep}.")
                del group.gpus[:]
                group.gpus.extend(keep)
    return new, notes


def describe_config(config) -> str:
    """One line a student can read: batching, instances, backend."""
    data = config if isinstance(config, Mapping) else config_to_dict(config)
    groups = data.get("instance_group") or []
    inst = ", ".join(
        f"{g.get('count', 1)} x {g.get('kind', 'KIND_AUTO')}" + (f" gpus {g['gpus']}" if g.get("gpus") else "")
        for g in groups
    ) or "default"
    db = data.get("dynamic_batching")
    if db is None:
        batching = "dynamic_batching off"
    else:
        delay = int(db.get("max_queue_delay_microseconds", 0))
        preferred = db.get("preferred_batch_size") or []
        batching = f"dynamic_batching on (max_queue_delay {delay} us, preferred {list(map(int, preferred))})"
    backend = data.get("backend") or data.get("platform") or "?"
    if RUNNER_PARAMETER in (data.get("parameters") or {}):
        backend += " (servelab onnxruntime runner)"
    return (f"{data.get('name', '?')}: backend {backend}; max_batch_size {data.get('max_batch_size', 0)}; "
            f"instance_group {inst}; {batching}")


# --------------------------------------------------------------------------
# The runtime model repository
# --------------------------------------------------------------------------

def source_models(source: Path) -> list[str]:
    return sorted(p.name for p in Path(source).iterdir() if (p / "config.pbtxt").is_file())


def missing_artifacts(source: Path, name: str) -> list[Path]:
    """Files a model needs that have not been built yet."""
    model_dir = Path(source) / name
    cfg = load_config(model_dir)
    missing = []
    versions = [p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    if not versions:
        return [model_dir / "1"]
    for version in versions:
        if is_onnx_config(cfg) or is_runner_config(cfg):
            onnx_file = cfg.parameters[ONNX_FILE_PARAMETER].string_value if is_runner_config(cfg) else ""
            wanted = version / (onnx_file or cfg.default_model_filename or "model.onnx")
            if not wanted.exists():
                missing.append(wanted)
        elif cfg.backend == "python" and not (version / "model.py").exists():
            missing.append(version / "model.py")
    # The lab's known artifacts (models build writes them).
    for target in (*paths.PTH_TARGETS, *paths.ONNX_TARGETS):
        try:
            target.relative_to(model_dir)
        except ValueError:
            continue
        if Path(source).resolve() == paths.MODELS_STAGING.resolve() and not target.exists():
            missing.append(target)
    return sorted(set(missing))


def _replace_link(link: Path, target: Path) -> None:
    if link.is_symlink() or link.exists():
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)
        else:
            link.unlink()
    link.symlink_to(target)


def sync_model_files(name: str, source: Path, repo: Path, runner: bool) -> None:
    """Mirror ``source/name/<version>/`` into ``repo/name/<version>/``:
    Python files are copied (so an edit to models_staging shows up only on
    reload, as in the container), big artifacts are symlinked."""
    from servelab.triton_runner import ONNX_RUNNER

    src, dst = Path(source) / name, Path(repo) / name
    dst.mkdir(parents=True, exist_ok=True)
    for version in sorted(p for p in src.iterdir() if p.is_dir() and p.name.isdigit()):
        out = dst / version.name
        out.mkdir(exist_ok=True)
        wanted = set()
        for item in version.iterdir():
            if item.name == "__pycache__":
                continue
            wanted.add(item.name)
            if item.suffix == ".py" and item.is_file():
                shutil.copy2(item, out / item.name)
            else:
                _replace_link(out / item.name, item.resolve())
        if runner:
            shutil.copy2(ONNX_RUNNER, out / "model.py")
            wanted.add("model.py")
        for stale in out.iterdir():
            if stale.name not in wanted and stale.name != "__pycache__":
                if stale.is_dir() and not stale.is_symlink():
                    shutil.rmtree(stale)
                else:
                    stale.unlink()


def write_runtime_config(name: str, cfg, repo: Path, source: Path | None, notes: Sequence[str]) -> Path:
    header = f"Generated by servelab from {Path(source) / name / 'config.pbtxt' if source else 'an edit'}."
    if notes:
        header += "\nLocal changes:\n" + "\n".join(f"- {n}" for n in notes)
    path = Path(repo) / name / "config.pbtxt"
    tmp = path.with_suffix(".pbtxt.tmp")
    tmp.write_text(config_to_text(cfg, header))
    os.replace(tmp, path)
    return path


def sync_model(name: str, source: Path, repo: Path, gpus: int | None = None, cfg=None) -> tuple:
    """(Re)build one model of the runtime repository; ``cfg`` overrides the
    source config. Returns ``(localized_cfg, notes)``."""
    base = load_config(Path(source) / name) if cfg is None else cfg
    if not base.name:
        base.name = name
    if base.name != name:
        raise ValueError(f"{source}/{name}/config.pbtxt says name: \"{base.name}\"; it must match its folder.")
    local, notes = localize_config(base, gpus, name)
    sync_model_files(name, source, repo, runner=is_runner_config(local))
    write_runtime_config(name, local, repo, source, notes)
    return local, notes


def build_repository(repo: Path, source: Path | None = None, models: Sequence[str] | None = None,
                     gpus: int | None = None) -> tuple[list[str], list[str]]:
    """Write the runtime repository ``repo`` from ``source`` (models_staging/).
    Returns ``(models, notes)``. Raises TritonError if artifacts are missing."""
    source = Path(source or paths.MODELS_STAGING)
    available = source_models(source)
    names = list(models) if models else available
    unknown = [n for n in names if n not in available]
    if unknown:
        raise TritonError(f"no model {unknown} in {source} (it has {available}).")
    missing = [p for n in names for p in missing_artifacts(source, n)]
    if missing:
        raise TritonError(
            "model artifacts are missing: " + ", ".join(str(p) for p in missing)
            + "\nBuild them with `python -m servelab models build` (or `make models`)."
        )
    Path(repo).mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    for name in names:
        notes += sync_model(name, source, Path(repo), gpus)[1]
    if any(food11.weights_kind(p) == "demo" for n in names for p in (source / n).glob("*/*")
           if p.suffix in (".pth", ".onnx")):
        notes.append(f"models use {food11.DEMO_WEIGHTS_NOTE}.")
    return names, notes


def prepare_backends(workdir: Path, install: TritonInstall | None = None) -> Path:
    """``workdir/backends/python`` with the backend library, its Python
    utilities and the stub matching this interpreter."""
    install = install or find_install()
    folder = Path(workdir) / "backends" / "python"
    folder.mkdir(parents=True, exist_ok=True)
    _replace_link(folder / "libtriton_python.so", install.python_backend / "libtriton_python.so")
    _replace_link(folder / "triton_python_backend_utils.py", install.python_backend / "triton_python_backend_utils.py")
    _replace_link(folder / "triton_python_backend_stub", install.stub())
    return folder.parent


# --------------------------------------------------------------------------
# Processes: stubs, shared memory, clean shutdown
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class StubProcess:
    pid: int
    model: str
    instance: str
    shm_region: str


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _stub_from(pid: int) -> StubProcess | None:
    argv = _cmdline(pid)
    if not argv or not argv[0].endswith("triton_python_backend_stub") or len(argv) < 9:
        return None
    # argv: stub model.py shm_region shm_size growth parent_pid lib_path ipc_handle instance_name ...
    model = Path(argv[1]).parent.parent.name
    return StubProcess(pid=pid, model=model, instance=argv[8], shm_region=argv[2])


def stub_processes(server_pid: int, shm_prefix: str | None = None) -> list[StubProcess]:
    """Stub processes of one server: its children, or (after it died)
    any stub whose shared-memory region carries this server's prefix."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stub = _stub_from(pid)
        if stub is None:
            continue
        if _ppid(pid) == server_pid or (shm_prefix and stub.shm_region.startswith(shm_prefix)):
            found.append(stub)
    return sorted(found, key=lambda s: s.instance)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = ""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        pass
    return state != "Z"


def _terminate(pid: int, shm_prefix: str, timeout: float, proc: subprocess.Popen | None = None) -> list[str]:
    """SIGTERM the server, wait, SIGKILL its group; reap its stubs by PID
    and remove its shared-memory regions. Returns what had to be forced."""
    forced = []
    stubs = {s.pid for s in stub_processes(pid, shm_prefix)}
    was_alive = _alive(pid)
    if was_alive:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None:
                if proc.poll() is not None:
                    break
            elif not _alive(pid):
                break
            time.sleep(0.05)
        else:
            forced.append(f"tritonserver {pid} (SIGKILL after {timeout:.0f} s)")
    # The server ran in its own process group: SIGKILL anything left in it
    # (only if it was still ours to signal: a dead PID may have been reused).
    if was_alive:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if proc is not None:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
    # Stubs that outlived the server (a hung stub ignores SIGTERM).
    stubs |= {s.pid for s in stub_processes(pid, shm_prefix)}
    for stub in stubs:
        if _alive(stub) and _stub_from(stub) is not None:
            try:
                os.kill(stub, signal.SIGKILL)
                forced.append(f"stub {stub}")
            except ProcessLookupError:
                pass
    for stub in stubs:
        for _ in range(50):
            if not _alive(stub):
                break
            time.sleep(0.02)
    if shm_prefix:
        for region in Path("/dev/shm").glob(f"{shm_prefix}*"):
            try:
                region.unlink()
                forced.append(f"shm {region.name}")
            except OSError:
                pass
    return forced


def _unload_all(grpc_url: str, admin_key: str | None, timeout: float = 30.0) -> None:
    """Unload every loaded model before SIGTERM. On SIGTERM Triton first
    waits (up to --exit-timeout-secs) for open client connections, and if
    that uses up the timeout it exits with Python models still loaded,
    leaving their stub processes behind. Unloaded models have no stubs."""
    try:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(grpc_url)
        headers = {GRPC_ADMIN_HEADER: admin_key} if admin_key else None
        try:
            index = client.get_model_repository_index(headers=headers, as_json=True).get("models", [])
            names = [m["name"] for m in index if m.get("state") == "READY"]
            threads = [threading.Thread(target=_quiet, args=(client.unload_model, name),
                                        kwargs={"headers": headers, "client_timeout": timeout}, daemon=True)
                       for name in names]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout)
            # unload_model returns when the unload starts: wait until the stubs are gone.
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                index = client.get_model_repository_index(headers=headers, as_json=True).get("models", [])
                if not any(m.get("state") in ("READY", "UNLOADING") for m in index):
                    break
                time.sleep(0.1)
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - best effort; _terminate does the rest
        pass


def _quiet(fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except Exception:  # noqa: BLE001
        pass


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """preexec_fn: SIGTERM the server if the process that started it dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# --------------------------------------------------------------------------
# State file: lets `servelab triton reload/stop` find a server started elsewhere
# --------------------------------------------------------------------------

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
        if _alive(state.get("pid", -1)) and "tritonserver" in " ".join(_cmdline(state["pid"])):
            return state
    return None


def _write_state(path: Path, state: dict) -> bool:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{path}.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the admin key
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=2)
        os.replace(f"{path}.tmp", path)
        return True
    except OSError:
        return False


# --------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------

@dataclass(eq=False)
class TritonServer:
    """A running local Triton. Use as a context manager or call ``stop()``."""

    proc: subprocess.Popen
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    admin_key: str
    workdir: Path
    repo: Path          # the runtime repository Triton reads
    source: Path        # models_staging/ (or another lab repository)
    log_path: Path
    shm_prefix: str
    gpus: int
    models: list[str]
    notes: list[str] = field(default_factory=list)
    exit_timeout: int = EXIT_TIMEOUT_S
    state_file: Path | None = None
    _own_workdir: bool = False
    _stopped: bool = False

    # ---- addresses
    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        """host:port for tritonclient.http (the TRITON_SERVER_URL form)."""
        return f"{self.host}:{self.http_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    # ---- state
    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self) -> bool:
        return procs.http_status(f"{self.http_url}/v2/health/ready") == 200

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stub_processes(self, model: str | None = None) -> list[StubProcess]:
        stubs = stub_processes(self.pid, self.shm_prefix) if self.alive() else []
        return [s for s in stubs if model is None or s.model == model]

    def wait_for_stubs(self, model: str, count: int, timeout: float = 90.0) -> list[StubProcess]:
        """After a reload the old instances exit a little later than the new
        ones are READY: wait until ``model`` has exactly ``count`` stubs."""
        deadline = time.monotonic() + timeout
        while True:
            stubs = self.stub_processes(model)
            if len(stubs) == count or time.monotonic() > deadline:
                return stubs
            time.sleep(0.2)

    # ---- clients
    def http_client(self, **kwargs):
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(self.url, **kwargs)

    def grpc_client(self, **kwargs):
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(self.grpc_url, **kwargs)

    # ---- models
    def model_config(self, name: str) -> dict:
        return model_config(name, grpc_url=self.grpc_url)

    def model_stats(self, name: str) -> dict:
        return model_stats(name, self.http_url)

    def reload_model(self, name: str, edit: Edit = None, timeout: float = 180.0, verbose: bool = False) -> dict:
        return reload_model(name, edit, server=self, timeout=timeout, verbose=verbose)

    def summary(self) -> str:
        lines = [
            f"Triton 2.51 (nvidia-pytriton) pid {self.pid}, models: {', '.join(self.models)}",
            f"  HTTP     {self.http_url}   (TRITON_SERVER_URL={self.url})",
            f"  gRPC     {self.grpc_url}",
            f"  metrics  {self.metrics_url}",
            f"  repository {self.repo} (from {self.source})",
            f"  log      {self.log_path}",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    # ---- shutdown
    def stop(self, timeout: float | None = None) -> list[str]:
        """Stop the server, reap its stubs and shared memory; idempotent.
        Returns what had to be forced (empty on a clean shutdown)."""
        if self._stopped:
            return []
        self._stopped = True
        if self.alive():
            _unload_all(self.grpc_url, self.admin_key)
        forced = _terminate(self.pid, self.shm_prefix, timeout or (self.exit_timeout + 20), self.proc)
        if self.state_file is not None:
            try:
                if json.loads(self.state_file.read_text()).get("pid") == self.pid:
                    self.state_file.unlink()
            except (OSError, ValueError):
                pass
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return forced

    def __enter__(self) -> "TritonServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_LIVE: "weakref.WeakSet[TritonServer]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:  # pragma: no cover - interpreter exit
    for server in list(_LIVE):
        server.stop()


def _server_env(install: TritonInstall) -> dict[str, str]:
    lib_path = [str(install.libs)]
    # The stub embeds libpython: prefer the one that belongs to this
    # interpreter (pyenv/conda builds) over a system copy of the same soname.
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if libdir and soname and (Path(libdir) / soname).exists():
        lib_path.insert(0, libdir)
    env = procs.child_env()
    # OpenMP threads that wait by spinning stall a whole PyTorch forward pass
    # whenever another process (perf_analyzer, Triton's own threads, a
    # browser) takes one of the few cores: seen here under load, count 1 with
    # 2 threads served 0.7 infer/s spinning vs 21.8 infer/s with PASSIVE.
    # Export OMP_WAIT_POLICY yourself to choose otherwise.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_path + ([old] if old else []))
    # model.py imports servelab (food11): make the package importable in the stub.
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def start(repo: str | os.PathLike | None = None, *, models: Sequence[str] | None = None,
          host: str = DEFAULT_HOST, http_port: int = DEFAULT_HTTP_PORT, grpc_port: int = DEFAULT_GRPC_PORT,
          metrics_port: int = DEFAULT_METRICS_PORT, admin_key: str | None = None,
          workdir: str | os.PathLike | None = None, exit_timeout: int = EXIT_TIMEOUT_S,
          timeout: float = 240.0, log_verbose: int = 0, write_state: bool = True,
          extra_args: Sequence[str] = (), quiet: bool = True, install_perf_shim: bool = True) -> TritonServer:
    """Start the real tritonserver on ``repo`` (default models_staging/) and
    wait until every model in ``models`` (default: all) is READY."""
    install = find_install()
    source = Path(repo or paths.MODELS_STAGING).resolve()
    if state_path(http_port).exists() and read_state(http_port=http_port) is None:
        stop_running(http_port)  # a previous owner died: reap its stubs and shared memory
    for what, port in (("HTTP", http_port), ("gRPC", grpc_port), ("metrics", metrics_port)):
        if not procs.port_is_free(port, host):
            raise TritonError(
                f"{what} port {port} on {host} is in use (another Triton? `python -m servelab triton stop "
                f"--http-port {http_port}`, or pick other ports)."
            )
    own = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="servelab-triton-")) if own else Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    runtime_repo = workdir / "models"
    if runtime_repo.exists():
        shutil.rmtree(runtime_repo)
    gpus = gpu_count()
    try:
        names, notes = build_repository(runtime_repo, source, models, gpus)
        backends = prepare_backends(workdir, install)
    except BaseException:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    if install_perf_shim:
        try:
            from servelab import perf

            perf.install_shim()
        except Exception as err:  # perf_analyzer is optional for the server itself
            notes.append(f"perf_analyzer shim not installed: {err}")

    admin_key = admin_key or os.environ.get(ADMIN_KEY_ENV) or secrets.token_urlsafe(18)
    shm_prefix = f"servelab_{os.getpid()}_{http_port}_{secrets.token_hex(3)}_"
    log_path = workdir / "tritonserver.log"
    cmd = [
        str(install.server),
        f"--model-repository={runtime_repo}",
        f"--backend-directory={backends}",
        "--model-control-mode=explicit",
        *[f"--load-model={n}" for n in names],
        f"--http-address={host}", f"--http-port={http_port}",
        f"--grpc-address={host}", f"--grpc-port={grpc_port}",
        f"--metrics-address={host}", f"--metrics-port={metrics_port}",
        f"--http-restricted-api=model-repository:{HTTP_ADMIN_HEADER}={admin_key}",
        f"--grpc-restricted-protocol=model-repository:{HTTP_ADMIN_HEADER}={admin_key}",
        f"--exit-timeout-secs={exit_timeout}",
        f"--log-verbose={log_verbose}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        # Batches of 16 ONNX inputs are ~10 MB: grow shared memory in big steps.
        "--backend-config=python,shm-growth-byte-size=16777216",
        *(["--allow-gpu-metrics=false"] if gpus == 0 else []),
        *extra_args,
    ]
    in_main_thread = threading.current_thread() is threading.main_thread()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_server_env(install),
            cwd=workdir, start_new_session=True,
            # Only from the main thread: PDEATHSIG fires when the *thread* that forked exits.
            preexec_fn=_die_with_parent if in_main_thread else None,
        )
    server = TritonServer(
        proc=proc, host=host, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
        admin_key=admin_key, workdir=workdir, repo=runtime_repo, source=source, log_path=log_path,
        shm_prefix=shm_prefix, gpus=gpus, models=names, notes=notes, exit_timeout=exit_timeout,
        _own_workdir=own,
    )
    _LIVE.add(server)
    try:
        _wait_ready(server, timeout)
    except BaseException:
        server.stop()
        raise
    if write_state:
        path = state_path(http_port)
        state = {
            "pid": proc.pid, "host": host, "http_port": http_port, "grpc_port": grpc_port,
            "metrics_port": metrics_port, "admin_key": admin_key, "repo": str(runtime_repo),
            "source": str(source), "workdir": str(workdir), "log": str(log_path), "shm_prefix": shm_prefix,
            "gpus": gpus, "models": names, "started": time.time(),
        }
        if _write_state(path, state):
            server.state_file = path
    if not quiet:
        print(server.summary(), flush=True)
    return server


def _wait_ready(server: TritonServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.alive():
            tail = server.log_tail(60)
            hint = ""
            if "food11.pth" in tail or "model.onnx" in tail:
                hint = "\nAre the model artifacts built? `python -m servelab models build`"
            raise TritonError(
                f"tritonserver exited with code {server.proc.returncode} before it was ready "
                f"(log: {server.log_path}):\n{tail}{hint}"
            )
        if server.ready():
            not_ready = [m for m in server.models
                         if procs.http_status(f"{server.http_url}/v2/models/{m}/ready") != 200]
            if not not_ready:
                return
        time.sleep(0.25)
    raise TritonError(f"Triton was not ready within {timeout:.0f} s (log: {server.log_path}):\n{server.log_tail()}")


@contextmanager
def running(repo: str | os.PathLike | None = None, **kwargs) -> Iterator[TritonServer]:
    """``with running(...) as t:`` — start, yield, always stop."""
    server = start(repo, **kwargs)
    try:
        yield server
    finally:
        server.stop()


def stop_running(http_port: int = DEFAULT_HTTP_PORT, timeout: float = 30.0) -> bool:
    """Stop a local Triton started by another process (found by its state
    file). Returns False if none was running on that port."""
    state = read_state(http_port=http_port)
    if state is None:
        # The server is gone; its stubs and shared memory may not be.
        try:
            stale = json.loads(state_path(http_port).read_text())
            _terminate(stale["pid"], stale["shm_prefix"], 1.0) if not _alive(stale["pid"]) else None
            state_path(http_port).unlink()
        except (OSError, ValueError, KeyError):
            pass
        return False
    _terminate(state["pid"], state["shm_prefix"], timeout)
    try:
        state_path(http_port).unlink()
    except OSError:
        pass
    return True


# --------------------------------------------------------------------------
# Model control, configs and statistics
# --------------------------------------------------------------------------

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


def reload_model(name: str, edit: Edit = None, *, server: TritonServer | None = None,
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
    log_path = None
    if server is not None:
        grpc_url, admin_key = server.grpc_url, admin_key or server.admin_key
        repo, source, gpus = server.repo, server.source, server.gpus
        log_path = server.log_path
    else:
        grpc_url = grpc_url or os.environ.get("TRITON_GRPC_URL") or f"{DEFAULT_HOST}:{DEFAULT_GRPC_PORT}"
        try:
            port = int(grpc_url.rsplit(":", 1)[1])
        except (IndexError, ValueError):
            port = None
        state = read_state(grpc_port=port) if port and grpc_url.split(":")[0] in ("127.0.0.1", "localhost") else None
        if state:
            admin_key = admin_key or state["admin_key"]
            repo = repo or state["repo"]
            source = source or state["source"]
            gpus = state["gpus"] if gpus is None else gpus
            log_path = Path(state["log"])
        admin_key = admin_key or os.environ.get(ADMIN_KEY_ENV)
    if via == "override":
        repo = None
    elif via == "file" and repo is None:
        raise ValueError("via='file' needs the runtime repository (server= or repo=)")
    headers = {GRPC_ADMIN_HEADER: admin_key} if admin_key else None
    client = _grpc(grpc_url)
    log_size = log_path.stat().st_size if log_path is not None and log_path.exists() else 0
    try:
        if repo is not None:
            repo, source = Path(repo), Path(source or paths.MODELS_STAGING)
            config_file = repo / name / "config.pbtxt"
            previous = config_file.read_text() if config_file.exists() else None
            if edit is None:
                cfg, notes = sync_model(name, source, repo, gpus)  # back to models_staging/<name>
            else:
                current = config_to_dict(load_config(repo / name))
                edited = dict_to_config(apply_edit(current, edit), f"{name} edit")
                cfg, notes = sync_model(name, source, repo, gpus, cfg=edited)
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
        else:
            current = client.get_model_config(name, as_json=True)["config"]
            new = apply_edit(current, edit)
            client.load_model(name, headers=headers, config=json.dumps(new), client_timeout=timeout)
        reported = client.get_model_config(name, as_json=True)["config"]
    except Exception:
        # Triton's answer can be terse ("failed to poll from model repository"):
        # its log says why. Show what it wrote during this reload.
        if verbose and log_path is not None:
            lines = _log_since(log_path, log_size, name)
            if lines:
                print(f"Triton's log during the reload of {name}:\n{lines}", file=sys.stderr)
        raise
    finally:
        client.close()
    if verbose:
        print(f"reloaded {describe_config(reported)}")
    return reported


def _log_since(log_path: Path, offset: int, name: str, limit: int = 20) -> str:
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read(1_000_000).decode(errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if name in ln or ln.startswith("E")]
    return "\n".join(lines[-limit:])


def model_stats(name: str, http_url: str = f"http://{DEFAULT_HOST}:{DEFAULT_HTTP_PORT}", version: str = "") -> dict:
    """Triton's cumulative statistics for one model (``/v2/models/<m>/stats``)."""
    url = f"{http_url}/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        data = json.load(r)
    stats = data.get("model_stats") or []
    return stats[0] if len(stats) == 1 else {"model_stats": stats}


def _ns(d: Mapping, key: str) -> tuple[int, int]:
    v = d.get(key) or {}
    return int(v.get("count", 0)), int(v.get("ns", 0))


def stats_delta(before: Mapping, after: Mapping) -> dict:
    """What happened between two ``model_stats`` snapshots: requests,
    executions, images, average batch, batch-size histogram, and mean
    queue / compute times per request in ms."""
    bi, ai = before.get("inference_stats", {}), after.get("inference_stats", {})
    out: dict = {
        "inference_count": int(after.get("inference_count", 0)) - int(before.get("inference_count", 0)),
        "execution_count": int(after.get("execution_count", 0)) - int(before.get("execution_count", 0)),
    }
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
        c = _ns(ai, key)[0] - _ns(bi, key)[0]
        ns = _ns(ai, key)[1] - _ns(bi, key)[1]
        out[f"{key}_count"] = c
        if key not in ("success", "fail"):
            out[f"{key}_ms"] = ns / c / 1e6 if c else 0.0
    old = {int(b["batch_size"]): _ns(b, "compute_infer")[0] for b in before.get("batch_stats", [])}
    hist = {}
    for b in after.get("batch_stats", []):
        size = int(b["batch_size"])
        n = _ns(b, "compute_infer")[0] - old.get(size, 0)
        if n:
            hist[size] = n
    out["batch_sizes"] = dict(sorted(hist.items()))
    out["avg_batch"] = out["inference_count"] / out["execution_count"] if out["execution_count"] else 0.0
    return out


# --------------------------------------------------------------------------
# Command line: `servelab triton ...`
# --------------------------------------------------------------------------

def add_parser(sub) -> None:
    p = sub.add_parser("triton", help="the real Triton 2.51 locally: start, reload, perf_analyzer",
                       description="Run the lab's Triton locally from the nvidia-pytriton binary.")
    tsub = p.add_subparsers(dest="triton_command", metavar="ACTION")
    tsub.required = True

    def ports(q, grpc=True):
        q.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT)
        if grpc:
            q.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)

    s = tsub.add_parser("start", help="start Triton in the foreground (Ctrl-C stops it)")
    ports(s)
    s.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT)
    s.add_argument("--host", default=DEFAULT_HOST, help="address to bind (default 127.0.0.1)")
    s.add_argument("--repo", type=Path, default=None, help=f"lab model repository (default {paths.MODELS_STAGING})")
    s.add_argument("--models", default="", help="comma-separated models to load (default: all)")
    s.add_argument("--workdir", type=Path, default=None,
                   help="where the runtime repository and log go (default build/triton/<http-port>)")
    s.add_argument("--exit-timeout", type=int, default=EXIT_TIMEOUT_S)
    s.add_argument("--log-verbose", type=int, default=0)
    s.set_defaults(func=_cmd_start)

    st = tsub.add_parser("stop", help="stop a local Triton started from another shell")
    ports(st, grpc=False)
    st.set_defaults(func=_cmd_stop)

    stat = tsub.add_parser("status", help="models, readiness, configs and stub processes of a local Triton")
    ports(stat, grpc=False)
    stat.set_defaults(func=_cmd_status)

    r = tsub.add_parser("reload", help="edit a model's config, reload it over gRPC, show what Triton reports",
                        description="With no edit options: re-read models_staging/<model>/ (config.pbtxt and "
                                    "model.py) and reload. Options edit the running config.")
    r.add_argument("model")
    r.add_argument("--grpc-url", default=None, help="host:port (default 127.0.0.1:8001)")
    r.add_argument("--admin-key", default=None, help=f"default ${ADMIN_KEY_ENV} or the local state file")
    r.add_argument("--count", type=int, help="instance_group count")
    r.add_argument("--kind", choices=["KIND_CPU", "KIND_GPU", "KIND_AUTO"], help="instance_group kind")
    r.add_argument("--gpus", default=None, help="instance_group gpus, e.g. 0,1")
    r.add_argument("--dynamic-batching", action="store_true", help="turn dynamic batching on")
    r.add_argument("--max-queue-delay-us", type=int, help="dynamic_batching max_queue_delay_microseconds")
    r.add_argument("--preferred-batch-size", type=int, nargs="+", help="dynamic_batching preferred_batch_size")
    r.add_argument("--no-dynamic-batching", action="store_true", help="turn dynamic batching off")
    r.add_argument("--set", dest="fragment", default=None,
                   help="a config.pbtxt fragment replacing top-level fields, e.g. 'max_batch_size: 8'")
    r.set_defaults(func=_cmd_reload)

    c = tsub.add_parser("config", help="print the config Triton reports for a model")
    c.add_argument("model")
    c.add_argument("--grpc-url", default=f"{DEFAULT_HOST}:{DEFAULT_GRPC_PORT}")
    c.set_defaults(func=lambda a: (print(json.dumps(model_config(a.model, a.grpc_url), indent=2)), 0)[1])

    sts = tsub.add_parser("stats", help="print a model's cumulative statistics (batch sizes, queue, compute)")
    sts.add_argument("model")
    sts.add_argument("--url", default=f"http://{DEFAULT_HOST}:{DEFAULT_HTTP_PORT}")
    sts.set_defaults(func=_cmd_stats)

    e = tsub.add_parser("env", help="print shell exports that let perf_analyzer start "
                                    "(eval \"$(python -m servelab triton env)\")")
    e.set_defaults(func=_cmd_env)

    su = tsub.add_parser("setup", help="install the perf_analyzer shim in the venv and check the Triton binary")
    su.set_defaults(func=_cmd_setup)

    pa = tsub.add_parser("perf", help="run perf_analyzer and print its figures as a table",
                         description="Everything after `--` goes to perf_analyzer, e.g. "
                                     "servelab triton perf -- -m food_classifier --input-data input.json "
                                     "-b 1 --concurrency-range 8")
    pa.add_argument("--csv", type=Path, default=None, help="also write perf_analyzer's -f CSV here")
    pa.add_argument("--json", action="store_true", help="print the parsed figures as JSON")
    pa.add_argument("args", nargs="*", help="perf_analyzer arguments (after --)")
    pa.set_defaults(func=_cmd_perf)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _cmd_start(args) -> int:
    workdir = args.workdir or (paths.BUILD_DIR / "triton" / str(args.http_port))
    models = [m for m in args.models.split(",") if m] or None
    print("Starting the real Triton 2.51 (nvidia-pytriton) ...", flush=True)
    # SIGTERM (e.g. from `servelab down`) stops the server as cleanly as Ctrl-C.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        server = start(args.repo, models=models, host=args.host, http_port=args.http_port,
                       grpc_port=args.grpc_port, metrics_port=args.metrics_port, workdir=workdir,
                       exit_timeout=args.exit_timeout, log_verbose=args.log_verbose)
    except (TritonError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    try:
        print(server.summary())
        print(f"  admin key for the model-repository API: export {ADMIN_KEY_ENV}={server.admin_key}")
        print("Ready. Ctrl-C stops it.", flush=True)
        while server.alive():
            time.sleep(0.5)
        print(f"tritonserver exited with code {server.proc.returncode}:\n{server.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping Triton ...", flush=True)
        return 0
    finally:
        forced = server.stop()
        if forced:
            print("cleaned up: " + ", ".join(forced))
        print("stopped.", flush=True)


def _cmd_stop(args) -> int:
    if stop_running(args.http_port):
        print(f"stopped the local Triton on port {args.http_port}")
        return 0
    print(f"no local Triton started by servelab is running on port {args.http_port}")
    return 1


def _cmd_status(args) -> int:
    state = read_state(http_port=args.http_port)
    if state is None:
        print(f"no local Triton started by servelab on port {args.http_port}")
        return 1
    http = f"http://{state['host']}:{state['http_port']}"
    print(f"pid {state['pid']}  HTTP {http}  gRPC {state['host']}:{state['grpc_port']}  "
          f"metrics http://{state['host']}:{state['metrics_port']}/metrics")
    for name in state["models"]:
        ready = procs.http_status(f"{http}/v2/models/{name}/ready") == 200
        try:
            desc = describe_config(model_config(name, f"{state['host']}:{state['grpc_port']}"))
        except Exception as err:  # noqa: BLE001 - report, keep going
            desc = f"{name}: {err}"
        stubs = [s for s in stub_processes(state["pid"], state["shm_prefix"]) if s.model == name]
        print(f"  {'READY' if ready else 'not ready'}  {desc}; {len(stubs)} stub process(es)")
    return 0


def _cmd_reload(args) -> int:
    edit: dict = {}
    if args.count is not None or args.kind or args.gpus is not None:
        group: dict = {"count": args.count or 1, "kind": args.kind or "KIND_CPU"}
        if args.gpus:
            group["gpus"] = [int(g) for g in args.gpus.split(",")]
        edit["instance_group"] = [group]
    if args.dynamic_batching or args.max_queue_delay_us is not None or args.preferred_batch_size:
        db: dict = {}
        if args.max_queue_delay_us is not None:
            db["max_queue_delay_microseconds"] = args.max_queue_delay_us
        if args.preferred_batch_size:
            db["preferred_batch_size"] = args.preferred_batch_size
        edit["dynamic_batching"] = db
    if args.no_dynamic_batching:
        edit["dynamic_batching"] = None
    try:
        if args.fragment:
            fragment = parse_config_text(args.fragment, "--set")
            edit.update(config_to_dict(fragment))
            for desc, _ in fragment.ListFields():
                edit.setdefault(desc.name, {})
        reported = reload_model(args.model, edit or None, grpc_url=args.grpc_url, admin_key=args.admin_key)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # tritonclient raises its own exception type
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(reported, indent=2))
    return 0


def _cmd_stats(args) -> int:
    stats = model_stats(args.model, args.url)
    empty: dict = {}
    print(json.dumps(stats, indent=2))
    delta = stats_delta(empty, stats)
    print(f"\n{args.model}: {delta['inference_count']} inferences in {delta['execution_count']} executions "
          f"(average batch {delta['avg_batch']:.2f}); batch sizes {delta['batch_sizes']}")
    return 0


def _cmd_env(args) -> int:
    from servelab import perf

    try:
        print(perf.shell_exports(), end="")
    except perf.PerfAnalyzerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def _cmd_setup(args) -> int:
    from servelab import perf

    install = find_install()
    print(f"tritonserver: {install.server}")
    print(f"Python-backend stub for Python {sys.version_info[0]}.{sys.version_info[1]}: {install.stub()}")
    try:
        changed = perf.install_shim()
        print("\n".join(changed) if changed else f"perf_analyzer shim already in place: {perf.venv_bin()}")
        print(f"perf_analyzer: {perf.check()}")
    except perf.PerfAnalyzerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print("Note: this Triton binary has no onnxruntime backend; ONNX models run through servelab's "
          "onnxruntime runner on the Python backend (same config.pbtxt).")
    return 0


def _cmd_perf(args) -> int:
    from servelab import perf

    try:
        result = perf.run(args.args, csv_path=args.csv, check=False)
    except perf.PerfAnalyzerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"results": result.results, "csv": result.csv_rows}, indent=2))
    else:
        print(result.output)
        if result.results:
            print(result.table())
    return 0 if result.ok else (result.returncode or 1)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m servelab.triton_local ACTION ...`` (same as ``servelab triton``)."""
    import argparse

    parser = argparse.ArgumentParser(prog="servelab")
    sub = parser.add_subparsers(dest="command")
    add_parser(sub)
    args = parser.parse_args(["triton", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
