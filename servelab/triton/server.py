"""The server: ``start`` a real tritonserver on a runtime repository, the
``TritonServer`` handle, ``running`` (a context manager) and
``stop_running`` (stop one started by another process)."""

from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from servelab.core import paths, procs
from servelab.triton import control, install, stats
from servelab.triton.config import Edit
from servelab.triton.install import (
    DEFAULT_GRPC_PORT,
    DEFAULT_HOST,
    DEFAULT_HTTP_PORT,
    DEFAULT_METRICS_PORT,
    EXIT_TIMEOUT_S,
    HTTP_ADMIN_HEADER,
    TritonError,
    TritonInstall,
    find_install,
    gpu_count,
    server_env,
)
from servelab.triton.process import (
    StubProcess,
    die_with_parent,
    stub_processes,
    terminate,
    unload_all,
    wait_for_stubs,
)
from servelab.triton.repository import build_repository, prepare_backends
from servelab.triton.state import read_state, state_path
from servelab.triton.state import write_state as write_state_file
from servelab.triton.trace import server_args as trace_server_args


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

    def wait_for_log(self, pattern: str, count: int = 1, timeout: float = 10.0) -> str:
        """The log once ``pattern`` (a regular expression) occurs ``count`` times in it; TimeoutError
        with the log's tail after ``timeout`` s. A model's ``pb_utils.Logger`` line reaches the log a
        moment after the stub sent it: its responses may have left first (CI, 2026-11-30)."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.log_path.read_text(errors="replace")
            if len(re.findall(pattern, text)) >= count:
                return text
            if time.monotonic() > deadline:
                raise TimeoutError(f"{pattern!r} not {count} time(s) in {self.log_path} after {timeout:.0f} s; its "
                                   f"end:\n{text[-2000:]}")
            time.sleep(0.1)

    def stub_processes(self, model: str | None = None) -> list[StubProcess]:
        stubs = stub_processes(self.pid, self.shm_prefix) if self.alive() else []
        return [s for s in stubs if model is None or s.model == model]

    def wait_for_stubs(self, model: str, count: int, timeout: float = 90.0) -> list[StubProcess]:
        """Wait until ``model`` has exactly ``count`` stubs (old instances gone after a reload)."""
        return wait_for_stubs(self.pid, model, count, self.shm_prefix, timeout) if self.alive() else []

    # ---- clients
    def http_client(self, **kwargs):
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(self.url, **kwargs)

    def grpc_client(self, **kwargs):
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(self.grpc_url, **kwargs)

    # ---- models
    def model_config(self, name: str) -> dict:
        return control.model_config(name, grpc_url=self.grpc_url)

    def snapshot(self, name: str) -> dict:
        """``stats.snapshot`` of one model of this server (cumulative counters)."""
        return stats.snapshot(self.http_url, name)

    def reload_model(self, name: str, edit: Edit = None, timeout: float = 180.0, verbose: bool = False) -> dict:
        return control.reload_model(name, edit, server=self, timeout=timeout, verbose=verbose)

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
            unload_all(self.grpc_url, self.admin_key)
        forced = terminate(self.pid, self.shm_prefix, timeout or (self.exit_timeout + 20), self.proc)
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


# --------------------------------------------------------------------------
# start(), in steps
# --------------------------------------------------------------------------

def _check_ports(host: str, http_port: int, grpc_port: int, metrics_port: int) -> None:
    if state_path(http_port).exists() and read_state(http_port=http_port) is None:
        stop_running(http_port)  # a previous owner died: reap its stubs and shared memory
    for what, port in (("HTTP", http_port), ("gRPC", grpc_port), ("metrics", metrics_port)):
        if not procs.port_is_free(port, host):
            raise TritonError(
                f"{what} port {port} on {host} is in use (another Triton? `python -m servelab triton stop "
                f"--http-port {http_port}`, or pick other ports)."
            )


def _prepare(source: Path, workdir: Path, own: bool, models, gpus: int, binary: TritonInstall) -> tuple:
    """Runtime repository and backends under ``workdir``; returns ``(repo, backends, names, notes)``."""
    workdir.mkdir(parents=True, exist_ok=True)
    runtime_repo = workdir / "models"
    if runtime_repo.exists():
        shutil.rmtree(runtime_repo)
    try:
        names, notes = build_repository(runtime_repo, source, models, gpus)
        backends = prepare_backends(workdir, binary)
    except BaseException:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    return runtime_repo, backends, names, notes


def _install_perf_shim(notes: list[str]) -> None:
    try:
        from servelab.triton import perf

        perf.install_shim()
    except Exception as err:  # perf_analyzer is optional for the server itself
        notes.append(f"perf_analyzer shim not installed: {err}")


# Triton's admin APIs, all behind the admin key: loading/unloading models; registering shared
# memory (a client could point Triton at any /dev/shm object it may open, a Python-backend
# stub's own region included, and crash it); log verbosity and trace settings (which a web page
# could otherwise change blind, as text/plain from a foreign Origin). Inference, health,
# metadata and statistics stay open.
RESTRICTED_APIS = ("model-repository", "shared-memory", "logging", "trace")


def _command(binary: TritonInstall, repo: Path, backends: Path, names: Sequence[str], *, host: str,
             http_port: int, grpc_port: int, metrics_port: int, admin_key: str, exit_timeout: int,
             log_verbose: int, shm_prefix: str, gpus: int, extra_args: Sequence[str],
             poll_secs: float | None = None) -> list[str]:
    # EXPLICIT: models load at start and on a (keyed) load call. POLL (poll_secs, notebook 6a's
    # short demonstration only): Triton re-reads the repository every poll_secs and loads
    # whatever changed there, and refuses load/unload calls.
    control = (["--model-control-mode=poll", f"--repository-poll-secs={poll_secs:g}"] if poll_secs
               else ["--model-control-mode=explicit", *[f"--load-model={n}" for n in names]])
    return [
        str(binary.server),
        f"--model-repository={repo}",
        f"--backend-directory={backends}",
        *control,
        # The configs are complete: without this, every (re)load of a Python-backend model first
        # starts a stub just to ask model.py for a config (importing torch: ~5 s of a reload here).
        "--disable-auto-complete-config",
        f"--http-address={host}", f"--http-port={http_port}",
        f"--grpc-address={host}", f"--grpc-port={grpc_port}",
        f"--metrics-address={host}", f"--metrics-port={metrics_port}",
        # Every admin API needs the key: one flag per category (checked against tritonserver 2.51).
        *[f"--http-restricted-api={api}:{HTTP_ADMIN_HEADER}={admin_key}" for api in RESTRICTED_APIS],
        *[f"--grpc-restricted-protocol={api}:{HTTP_ADMIN_HEADER}={admin_key}" for api in RESTRICTED_APIS],
        f"--exit-timeout-secs={exit_timeout}",
        f"--log-verbose={log_verbose}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        # Batches of 16 ONNX inputs are ~10 MB: grow shared memory in big steps.
        "--backend-config=python,shm-growth-byte-size=16777216",
        *(["--allow-gpu-metrics=false"] if gpus == 0 else []),
        *extra_args,
    ]


def _guard_shm(proc: subprocess.Popen, shm_prefix: str, every_s: float = 0.2) -> threading.Thread:
    """Keep the Python backend's shared-memory regions (``/dev/shm/<prefix>*``:
    every tensor a stub receives or returns) owner-only. The backend creates
    them mode 0644 whatever the umask, and more appear when a model (re)loads,
    so a daemon thread narrows them to 0600 for as long as tritonserver runs."""
    def guard():
        while proc.poll() is None:
            for region in Path("/dev/shm").glob(f"{shm_prefix}*"):
                try:
                    if region.stat().st_mode & 0o077:
                        os.chmod(region, 0o600)
                except OSError:  # removed meanwhile
                    pass
            time.sleep(every_s)

    thread = threading.Thread(target=guard, name=f"shm-guard-{proc.pid}", daemon=True)
    thread.start()
    return thread


def _spawn(cmd: Sequence[str], binary: TritonInstall, workdir: Path, log_path: Path) -> subprocess.Popen:
    in_main_thread = threading.current_thread() is threading.main_thread()
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=server_env(binary),
            cwd=workdir, start_new_session=True,
            # Only from the main thread: PDEATHSIG fires when the *thread* that forked exits.
            preexec_fn=die_with_parent if in_main_thread else None,
        )


def _record_state(server: TritonServer) -> None:
    """``build/triton/run-<http_port>.json`` (0600: it holds the admin key)."""
    path = state_path(server.http_port)
    state = {
        "pid": server.pid, "host": server.host, "http_port": server.http_port, "grpc_port": server.grpc_port,
        "metrics_port": server.metrics_port, "admin_key": server.admin_key, "repo": str(server.repo),
        "source": str(server.source), "workdir": str(server.workdir), "log": str(server.log_path),
        "shm_prefix": server.shm_prefix, "gpus": server.gpus, "models": server.models, "started": time.time(),
    }
    if write_state_file(path, state):
        server.state_file = path


def start(repo: str | os.PathLike | None = None, *, models: Sequence[str] | None = None,
          host: str = DEFAULT_HOST, http_port: int = DEFAULT_HTTP_PORT, grpc_port: int = DEFAULT_GRPC_PORT,
          metrics_port: int = DEFAULT_METRICS_PORT, admin_key: str | None = None,
          workdir: str | os.PathLike | None = None, exit_timeout: int = EXIT_TIMEOUT_S,
          timeout: float = 240.0, log_verbose: int = 0, write_state: bool = True,
          extra_args: Sequence[str] = (), quiet: bool = True, install_perf_shim: bool = True,
          poll_secs: float | None = None) -> TritonServer:
    """Start the real tritonserver on ``repo`` (default models_staging/) and
    wait until every model in ``models`` (default: all) is READY.
    ``poll_secs``: POLL model control instead of EXPLICIT (see ``_command``)."""
    binary = find_install()
    source = Path(repo or paths.MODELS_STAGING).resolve()
    _check_ports(host, http_port, grpc_port, metrics_port)
    own = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="servelab-triton-")) if own else Path(workdir).resolve()
    gpus = gpu_count()
    runtime_repo, backends, names, notes = _prepare(source, workdir, own, models, gpus, binary)
    if install_perf_shim:
        _install_perf_shim(notes)
    admin_key = admin_key or os.environ.get(install.ADMIN_KEY_ENV) or secrets.token_urlsafe(18)
    shm_prefix = f"servelab_{os.getpid()}_{http_port}_{secrets.token_hex(3)}_"
    log_path = workdir / "tritonserver.log"
    cmd = _command(binary, runtime_repo, backends, names, host=host, http_port=http_port, grpc_port=grpc_port,
                   metrics_port=metrics_port, admin_key=admin_key, exit_timeout=exit_timeout,
                   log_verbose=log_verbose, shm_prefix=shm_prefix, gpus=gpus,
                   extra_args=[*trace_server_args(workdir), *extra_args],   # traces: off until asked (servelab.triton.trace)
                   poll_secs=poll_secs)
    server = TritonServer(
        proc=_spawn(cmd, binary, workdir, log_path), host=host, http_port=http_port, grpc_port=grpc_port,
        metrics_port=metrics_port, admin_key=admin_key, workdir=workdir, repo=runtime_repo, source=source,
        log_path=log_path, shm_prefix=shm_prefix, gpus=gpus, models=names, notes=notes,
        exit_timeout=exit_timeout, _own_workdir=own,
    )
    _LIVE.add(server)
    _guard_shm(server.proc, shm_prefix)
    try:
        _wait_ready(server, timeout)
    except BaseException:
        server.stop()
        raise
    if write_state:
        _record_state(server)
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


def free_ports() -> dict[str, int]:
    """Three free loopback ports, as ``start``'s keywords: a private server beside the lab's own
    (``triton.start(models=[...], **free_ports())``)."""
    return {name: procs.free_port() for name in ("http_port", "grpc_port", "metrics_port")}


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
            if not procs.pid_alive(stale["pid"]):
                terminate(stale["pid"], stale["shm_prefix"], 1.0)
            state_path(http_port).unlink()
        except (OSError, ValueError, KeyError):
            pass
        return False
    terminate(state["pid"], state["shm_prefix"], timeout)
    try:
        state_path(http_port).unlink()
    except OSError:
        pass
    return True
