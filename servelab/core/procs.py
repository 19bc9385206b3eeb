"""Small process helpers shared by the local stack, Triton launcher and tests:
free ports, starting a server in its own process group, waiting for an HTTP
health endpoint, and stopping the whole group without leaving orphans."""

from __future__ import annotations

import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

PORT_RANGE_ENV = "SERVELAB_PORT_RANGE"   # "LO-HI": where free_port() looks (tests give each worker its own)
_handed_out: set[int] = set()
_handed_lock = threading.Lock()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768   # Linux's default


def port_range() -> tuple[int, int]:
    """Where free_port() looks: $SERVELAB_PORT_RANGE, else 20000 up to the kernel's ephemeral range.
    Below that range on purpose: a port taken from it (bind to port 0) can be handed to some
    process's outgoing connection in the seconds before our server binds it (Triton binds gRPC
    only after loading its models)."""
    env = os.environ.get(PORT_RANGE_ENV, "").strip()
    if env:
        try:
            lo, hi = (int(x) for x in env.split("-"))
        except ValueError:
            raise ValueError(f"{PORT_RANGE_ENV}={env!r}: expected LO-HI, e.g. 20000-21999") from None
        if not 1024 <= lo <= hi <= 65535:
            raise ValueError(f"{PORT_RANGE_ENV}={env!r}: expected 1024 <= LO <= HI <= 65535")
        return lo, hi
    hi = min(_ephemeral_low(), 65536) - 1
    return (20000, hi) if hi - 20000 >= 1000 else (hi - 1000, hi)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, from port_range(), never the same one twice in
    this process (a port handed out may not be bound yet)."""
    lo, hi = port_range()
    with _handed_lock:
        start = random.randint(lo, hi)
        for i in range(hi - lo + 1):
            port = lo + (start - lo + i) % (hi - lo + 1)
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:   # no SO_REUSEADDR: a port in TIME_WAIT counts as taken
                    s.bind((host, port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    raise OSError(f"no free TCP port in {lo}-{hi} on {host} ({PORT_RANGE_ENV})")


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def venv_bin() -> Path:
    """The bin/ folder of the interpreter running the kit (not resolved:
    the venv's python is a symlink to the base interpreter)."""
    return Path(sys.executable).parent


# Set in every server process the kit starts (and in every Dockerfile).
ALLOCATOR_ENV = {"MALLOC_ARENA_MAX": "2"}


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a child process: the venv's bin first on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{venv_bin()}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("PYTHONUNBUFFERED", "1")
    # glibc gives each thread that allocates its own malloc arena (up to 8 per
    # core) and keeps freed memory in them: a burst of big decodes on many
    # threads left FastAPI at 1.9 GB RSS for good. Two arenas bound it
    # (issue 15: 134 -> 454 MB instead of 203 MB -> 1.9 GB). Every launcher of
    # the kit (servelab up, Triton and its stubs, benchmarks) goes through here.
    env.setdefault("MALLOC_ARENA_MAX", ALLOCATOR_ENV["MALLOC_ARENA_MAX"])
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def positive_int_env(name: str) -> int | None:
    """The environment variable ``name`` as a positive integer, None when it
    is unset or empty; ValueError (naming it) for anything else."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}")
    return n


def cpu_cores() -> int:
    """CPU cores this process may use, the kit's one core count:
    ``SERVELAB_THREADS`` if set, else the affinity mask (taskset, Docker
    ``--cpuset-cpus``) capped by a cgroup v2 CPU quota (Docker ``--cpus``).
    ``os.cpu_count()`` would report every core of the host even inside a
    container limited to two."""
    forced = positive_int_env("SERVELAB_THREADS")
    if forced is not None:
        return forced
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        n = min(n, quota)
    return max(1, n)


def cpu_model(default: str = "", cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name from /proc/cpuinfo, or ``default`` where there is none."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return default


def machine_description() -> str:
    """This machine in one line: host, CPU model, cores, GPU or none."""
    cpu = cpu_model(default=platform.processor() or platform.machine())
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    gpu = "no GPU" if shutil.which("nvidia-smi") is None else "nvidia-smi present"
    return f"{platform.node()}: {cpu}, {cores} cores, {gpu}, {platform.system()} {platform.release()}"


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu_percent(pids: Mapping[str, int], seconds: float) -> dict[str, float]:
    """Percent of one core each process used over the next ``seconds``
    (call it while no request is in flight: an idle server should use ~0)."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {name: 100.0 * (cpu_seconds(pid) - before[name]) / seconds for name, pid in pids.items()}


def cgroup_cpu_quota(path: str = "/sys/fs/cgroup/cpu.max") -> int | None:
    """Cores allowed by a cgroup v2 ``cpu.max`` quota (rounded up), or None."""
    try:
        text = Path(path).read_text().split()
    except OSError:
        return None
    if len(text) != 2 or text[0] == "max":
        return None
    try:
        return max(1, -(-int(text[0]) // int(text[1])))
    except (ValueError, ZeroDivisionError):
        return None


@dataclass
class Server:
    """A server process started in its own session (process group)."""

    name: str
    proc: subprocess.Popen
    url: str
    log_path: Path | None = None
    extra: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self, timeout: float = 10.0) -> None:
        stop_group(self.pid, timeout, proc=self.proc)


def start(name: str, cmd: Sequence[str], url: str, log_path: Path | None = None,
          env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None) -> Server:
    """Start ``cmd`` in a new session so the whole tree can be signalled."""
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(log_path, "ab")
    else:
        out = subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            list(cmd), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=child_env(env), cwd=cwd, start_new_session=True,
        )
    finally:
        if log_path is not None:
            out.close()
    return Server(name=name, proc=proc, url=url, log_path=log_path)


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """GET ``url`` and return its status, or None if nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError, TimeoutError):
        return None


def wait_http_ok(url: str, timeout: float = 60.0, server: Server | None = None) -> None:
    """Poll ``url`` until it answers 200; fail early if ``server`` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server is not None and not server.alive():
            raise RuntimeError(
                f"{server.name} exited with code {server.proc.returncode} before it was ready.\n"
                f"{server.log_tail()}"
            )
        if http_status(url) == 200:
            return
        time.sleep(0.2)
    tail = server.log_tail() if server else ""
    raise TimeoutError(f"{url} did not answer 200 within {timeout:.0f} s.\n{tail}")


def cmdline(pid: int, proc: Path = Path("/proc")) -> list[str]:
    """A process's argv ([] when it is gone or not readable)."""
    try:
        return (proc / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def pid_alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie (an exited child nobody reaped)."""
    if pid <= 0:
        return False
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


def stop_group(pgid: int, timeout: float = 10.0, *, proc: subprocess.Popen | None = None,
               leader_only: bool = False, wait_for_group: bool = False) -> bool:
    """The kit's one way to stop a process tree: SIGTERM, wait, SIGKILL.

    ``pgid`` is a process started in its own session (its PID is its group's
    ID); ``proc`` is its Popen when it is our child (polled and reaped).
    SIGTERM goes to the whole group, or to the leader alone with
    ``leader_only`` (a server that stops its own children, like Triton).
    Waits up to ``timeout`` for the leader to exit (and, with
    ``wait_for_group``, for the group to empty), then SIGKILLs what is left
    of the group. Returns True if something outlived the timeout.

    A caller that passes no ``proc`` has checked that ``pgid`` is still the
    process it started."""
    def running() -> bool:
        return proc.poll() is None if proc is not None else pid_alive(pgid)

    def done() -> bool:
        return not running() and not (wait_for_group and group_pids(pgid))

    forced = False
    if not done():
        if leader_only:
            _signal(pgid, signal.SIGTERM)
        else:
            _kill_group(pgid, signal.SIGTERM)
        forced = not _wait(done, timeout)
    if running() or _orphans_left(pgid):
        _kill_group(pgid, signal.SIGKILL)
    if proc is not None:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
            pass
    return forced


def _orphans_left(pgid: int) -> bool:
    """The leader has exited: SIGKILL its group only if processes remain in
    it. While any does, the kernel does not reuse the number; a live process
    *with* PID ``pgid`` is someone else's (PID reuse), so leave it alone."""
    return not pid_alive(pgid) and bool(group_pids(pgid))


def _wait(condition, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_pids(pgid: int) -> list[int]:
    """PIDs still alive in process group ``pgid`` (Linux /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) == pgid:
                pids.append(int(entry.name))
        except (ProcessLookupError, PermissionError):
            continue
    return pids
