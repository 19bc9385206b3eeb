"""Processes around a local Triton: its Python-backend stubs, their shared
memory, a clean shutdown, and the state file that lets
``servelab triton reload/stop`` find a server started in another shell."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from servelab.core import procs
from servelab.serve.threads import remove_locks as remove_core_locks
from servelab.triton.install import GRPC_ADMIN_HEADER
from servelab.triton.stubs import stub_argv, stub_model


@dataclass(frozen=True)
class StubProcess:
    pid: int
    model: str
    instance: str
    shm_region: str


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _stub_from(pid: int) -> StubProcess | None:
    argv = stub_argv(pid)
    if argv is None:
        return None
    return StubProcess(pid=pid, model=stub_model(argv), instance=argv[8], shm_region=argv[2])


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


# --------------------------------------------------------------------------
# Clean shutdown
# --------------------------------------------------------------------------

def terminate(pid: int, shm_prefix: str, timeout: float, proc: subprocess.Popen | None = None) -> list[str]:
    """Stop a server: SIGTERM, wait, SIGKILL (procs.stop_group), then reap
    its stubs by PID and remove its shared-memory regions. Returns what
    had to be forced."""
    forced = []
    stubs = {s.pid for s in stub_processes(pid, shm_prefix)}
    # SIGTERM goes to the server alone: it stops its own stubs.
    if procs.stop_group(pid, timeout, proc=proc, leader_only=True):
        forced.append(f"tritonserver {pid} (SIGKILL after {timeout:.0f} s)")
    code = proc.returncode if proc is not None else None
    if code is not None and code < 0 and -code not in (signal.SIGTERM, signal.SIGKILL):
        # Triton died of a signal the kit did not send (CI, 2026-11-28: tritonserver 2.51 got SIGSEGV while
        # stopping): what it had not stopped itself, the kit reaps below, and says so here
        forced.append(f"tritonserver {pid} crashed ({signal.Signals(-code).name}) while stopping")
    # Stubs that outlived the server (a hung stub ignores SIGTERM).
    stubs |= {s.pid for s in stub_processes(pid, shm_prefix)}
    forced += _kill_stubs(stubs)
    forced += _remove_shm(shm_prefix)
    remove_core_locks(pid)   # its instances' core-share lock files (servelab.serve.threads)
    return forced


def _kill_stubs(stubs: set[int]) -> list[str]:
    killed = []
    for stub in stubs:
        if procs.pid_alive(stub) and _stub_from(stub) is not None:
            try:
                os.kill(stub, signal.SIGKILL)
                killed.append(f"stub {stub}")
            except ProcessLookupError:
                pass
    for stub in stubs:
        for _ in range(50):
            if not procs.pid_alive(stub):
                break
            time.sleep(0.02)
    return killed


def _remove_shm(shm_prefix: str) -> list[str]:
    removed = []
    if shm_prefix:
        for region in Path("/dev/shm").glob(f"{shm_prefix}*"):
            try:
                region.unlink()
                removed.append(f"shm {region.name}")
            except OSError:
                pass
    return removed


def unload_all(grpc_url: str, admin_key: str | None, timeout: float = 30.0) -> None:
    """Unload every loaded model before SIGTERM. On SIGTERM Triton first
    waits (up to --exit-timeout-secs) for open client connections, and if
    that uses up the timeout it exits with Python models still loaded,
    leaving their stub processes behind. Unloaded models have no stubs."""
    try:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(grpc_url)
        headers = {GRPC_ADMIN_HEADER: admin_key} if admin_key else None
        try:
            _unload_models(client, headers, timeout)
        finally:
            client.close()
    except Exception:  # best effort; terminate() does the rest
        pass


def _unload_models(client, headers: dict | None, timeout: float) -> None:
    end = time.monotonic() + 2 * timeout   # all of it: a stop must end even if Triton stops answering

    def index() -> list[dict]:
        left = max(1.0, end - time.monotonic())   # no call without a timeout: it could wait forever
        return client.get_model_repository_index(headers=headers, as_json=True,
                                                 client_timeout=left).get("models", [])

    names = [m["name"] for m in index() if m.get("state") == "READY"]
    refused: list[str] = []

    def unload(name):
        try:
            client.unload_model(name, headers=headers, client_timeout=timeout)
        except Exception:  # best effort
            refused.append(name)

    threads = [threading.Thread(target=unload, args=(name,), daemon=True) for name in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if names and len(refused) == len(names):
        return  # none will unload (POLL mode refuses the calls): SIGTERM does it
    # unload_model returns when the unload starts: wait until the stubs are gone.
    deadline = min(time.monotonic() + timeout, end)
    while time.monotonic() < deadline:
        if not any(m.get("state") in ("READY", "UNLOADING") for m in index()):
            break
        time.sleep(0.1)


def die_with_parent() -> None:  # pragma: no cover - runs in the child
    """preexec_fn: SIGTERM the server if the process that started it dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# --------------------------------------------------------------------------
# State file: lets `servelab triton reload/stop` find a server started elsewhere
# --------------------------------------------------------------------------


def wait_for_stubs(server_pid: int, model: str, count: int, shm_prefix: str | None = None,
                   timeout: float = 90.0) -> list[StubProcess]:
    """Triton answers a reload as soon as the new instances are READY; the
    old ones finish and exit a little later, and freeing a model takes CPU
    from whatever runs meanwhile (a run timed right after a reload read its
    first seconds 1.2-1.7x slower). Wait until ``model`` has exactly
    ``count`` stubs (at most ``timeout`` s); returns them."""
    deadline = time.monotonic() + timeout
    while True:
        stubs = [s for s in stub_processes(server_pid, shm_prefix) if s.model == model]
        if len(stubs) == count or time.monotonic() > deadline:
            return stubs
        time.sleep(0.1)


