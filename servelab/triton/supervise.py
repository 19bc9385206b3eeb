"""Bring back a model whose Python-backend stub died (the local stack's
Triton wrapper, ``servelab.local.stack_triton``, runs this twice a second).

Each instance of a Python-backend model is a stub process, a child of
tritonserver. When a stub dies on its own (the OOM killer on a big batch, a
segfault in a native library), Triton 2.51 does not start it again: it keeps
the model READY and answers every request for that instance with 500 "Stub
process '<model>_0_0' is not healthy", and the dead stub stays a zombie.

``StubWatch.tick()`` notices such a model:

* a stub it saw before is now a zombie child of tritonserver that died of a
  signal or a non-zero exit (a stub Triton stops during a reload exits 0), or
* a stub it saw before is gone and, ``GONE_GRACE_S`` later, the model still
  runs fewer stubs than its config asks for (a reload in progress starts
  its new stubs first, so it never looks like that for long);

then unloads the model with the admin key (Triton answers "not ready" for it
at once) and loads it again from the runtime repository, logging both.
Triton reaps the zombie when the old instance is finished; when it never is
(a request was in flight at the crash), ``restart_reason`` is set after
``ZOMBIE_GRACE_S`` and the wrapper restarts tritonserver, which reaps it. A model that keeps dying is reloaded at most
``RELOADS`` times in a window, then left unloaded (not ready) with a log line.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from servelab.triton.control import instance_count
from servelab.triton.install import GRPC_ADMIN_HEADER
from servelab.triton.process import StubProcess, stub_processes

GONE_GRACE_S = 2.0
# After the reload, Triton reaps the dead stub when the old instance is
# finished. Without load that took ~1 s here; with a request in flight at the
# crash, the old instance never finished (a zombie for as long as tritonserver
# ran, 80 s+ measured). Past this grace the watch asks for a restart of
# tritonserver, the only way to reap it (restart_reason).
ZOMBIE_GRACE_S = 15.0
RELOADS = (5, 600.0)     # at most 5 reloads of one model in 600 s
LOAD_TIMEOUT_S = 180.0


def _state_and_parent(pid: int) -> tuple[str, int, int] | None:
    """(state letter, parent PID, exit status) from /proc, or None if the PID
    is gone. The exit status (the last field, waitpid's form: a signal in the
    low 7 bits, an exit code in the next 8) is set once the process has died."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1]), int(fields[-1])


class StubWatch:
    """Watches one TritonServer's stubs; ``tick()`` recovers dead ones."""

    def __init__(self, server, log: Callable[[str], None] = print):
        self.server = server
        self.log = log
        self.known: dict[int, StubProcess] = {}
        self.zombies: set[int] = set()          # seen as zombies once (confirmed on the next tick)
        self.gone: dict[str, float] = {}        # model -> when one of its stubs vanished
        self.reloads: dict[str, list[float]] = {}
        self.given_up: set[str] = set()
        self.recovered: list[dict] = []         # what tick() did (for tests and the log)
        self.unreaped: dict[int, tuple[str, float]] = {}   # dead stub -> (model, when it was reloaded)
        self.restart_reason: str | None = None  # set when only a restart of tritonserver can help

    def tick(self) -> list[str]:
        """Look once; reload every model with a dead stub. Returns their names."""
        server_pid = self.server.pid
        live = {s.pid: s for s in stub_processes(server_pid)}
        dead: dict[str, str] = {}
        dead_pids: dict[str, list[int]] = {}
        for pid, stub in list(self.known.items()):
            if pid in live:
                continue
            info = _state_and_parent(pid)
            if info is not None and info[0] == "Z" and info[1] == server_pid:
                if info[2] != 0:
                    # Killed by a signal or failed: not a stub Triton stopped (those exit 0).
                    how = f"signal {info[2] & 0x7F}" if info[2] & 0x7F else f"exit code {info[2] >> 8}"
                    dead[stub.model] = f"stub {stub.instance} (pid {pid}) died ({how}) and is a zombie"
                    dead_pids.setdefault(stub.model, []).append(pid)
                    del self.known[pid]
                elif pid in self.zombies:
                    del self.known[pid]     # exited cleanly (a reload): Triton reaps it
                else:
                    self.zombies.add(pid)
                continue
            if info is not None and info[1] == server_pid:
                # Still dying: a killed process drops its memory (so its argv reads
                # empty and it is no stub to stub_processes) before it becomes a
                # zombie; on a busy machine that took up to 0.9 s here. Look again.
                continue
            self.zombies.discard(pid)
            del self.known[pid]
            # Gone, or reaped and its PID already reused by another process.
            self.gone.setdefault(stub.model, time.monotonic())
        self.known.update(live)
        for model, since in list(self.gone.items()):
            if time.monotonic() - since < GONE_GRACE_S:
                continue
            del self.gone[model]
            missing = self._missing_stubs(model, live)
            if missing:
                dead.setdefault(model, f"{missing} of its stubs are gone")
        for model, why in dead.items():
            if self._recover(model, why):
                self.unreaped.update({pid: (model, time.monotonic()) for pid in dead_pids.get(model, ())})
        for pid, (model, since) in list(self.unreaped.items()):
            info = _state_and_parent(pid)
            if info is None or info[0] != "Z" or info[1] != server_pid:
                del self.unreaped[pid]          # Triton reaped it
            elif time.monotonic() - since > ZOMBIE_GRACE_S:
                self.restart_reason = (f"Triton has not reaped the dead stub of {model} (pid {pid}, a zombie) "
                                       f"{ZOMBIE_GRACE_S:.0f} s after the reload: its old instance never finished")
        return list(dead)

    def _missing_stubs(self, model: str, live: dict[int, StubProcess]) -> int:
        """How many stubs ``model`` lacks while Triton reports it READY (0 if unsure)."""
        try:
            client = self.server.grpc_client()
            try:
                if not client.is_model_ready(model, client_timeout=10):
                    return 0
                config = client.get_model_config(model, as_json=True, client_timeout=10)["config"]
                wanted = instance_count(config)
            finally:
                client.close()
        except Exception:
            return 0
        return max(0, wanted - sum(1 for s in live.values() if s.model == model))

    def _allowed(self, model: str) -> bool:
        now = time.monotonic()
        recent = [t for t in self.reloads.get(model, []) if now - t < RELOADS[1]] + [now]
        self.reloads[model] = recent
        return len(recent) <= RELOADS[0]

    def _recover(self, model: str, why: str) -> bool:
        """Reload ``model``; False when it was left alone."""
        if model in self.given_up:
            return False
        stamp = time.strftime("%H:%M:%S")
        if not self._allowed(model):
            self.given_up.add(model)
            self.log(f"{stamp} {model}: {why}; it was reloaded {RELOADS[0]} times in {RELOADS[1]:.0f} s "
                     f"already, so it stays unloaded (not ready). Fix the cause, then "
                     f"`python -m servelab triton reload {model}`.")
            self._unload(model)
            return False
        t0 = time.monotonic()
        record = {"model": model, "why": why, "ok": False}
        try:
            client = self.server.grpc_client()
            headers = {GRPC_ADMIN_HEADER: self.server.admin_key}
            try:
                if not client.is_model_ready(model, client_timeout=10):
                    # Someone unloads it (Triton kills a stub that does not stop in time): leave it.
                    self.log(f"{stamp} {model}: {why}, but it is being unloaded: not reloading it")
                    return False
                self.log(f"{stamp} {model}: {why}; unloading it (not ready) and loading it again "
                         "with the admin key")
                client.unload_model(model, headers=headers, client_timeout=30)   # "not ready" from here on
                client.load_model(model, headers=headers, client_timeout=LOAD_TIMEOUT_S)
            finally:
                client.close()
            record["ok"] = True
            self.log(f"{time.strftime('%H:%M:%S')} {model}: ready again after {time.monotonic() - t0:.1f} s")
        except Exception as err:
            self.log(f"{time.strftime('%H:%M:%S')} {model}: reload failed ({err}); it stays not ready. "
                     f"Try `python -m servelab triton reload {model}`; Triton's log: {self.server.log_path}")
        record["seconds"] = round(time.monotonic() - t0, 2)
        self.recovered.append(record)
        return True

    def _unload(self, model: str) -> None:
        try:
            client = self.server.grpc_client()
            try:
                client.unload_model(model, headers={GRPC_ADMIN_HEADER: self.server.admin_key})
            finally:
                client.close()
        except Exception:
            pass
