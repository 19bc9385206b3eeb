"""Is a run evidence? What can spoil a measurement, recorded with every run.

A load test measures the server only if the client did what it promised and
nothing else took the machine. On a small machine where client and servers
share the cores, neither is a given. Every run records:

* **late sends** (open loop): requests sent later than ``late_after_ms``
  after their scheduled time *for the client's own reasons*. Sends held back
  because the in-flight cap was full are the server falling behind (a queue
  growing), not the client: they are counted apart (``held``).
* **loop lag**: a 10 ms ticker on the client's event loop; a tick later than
  ``late_after_ms`` (and than a tenth of the run's median latency: a lag
  that small cannot change what the run shows) means the client could not
  have sent or timed anything on time then (closed loops have no schedule,
  this is theirs).
* **client CPU**: CPU time of the event-loop thread over the run's wall
  time. Near 1.0 the client is saturated and measures itself.
* **server CPU** (when the server's processes are known: found by the
  target's listening port on this machine, children included) and the
  **host's** CPU; what is left is other work on the machine.

``assess`` turns those into a verdict with reasons: a run is *valid* when
the client kept its schedule (at most 1 % late sends or late ticks), its
loop thread stayed below 90 % of a core, and other work on the machine used
less than a quarter of a core. An invalid run is repeated a bounded number of
times (``load.run_checked``) and, if it never comes out valid, reported as
*inconclusive: the machine was busy*, never used silently as evidence.

The thresholds are fixed by what the measurement can tolerate, not by what a
busy machine achieves: do not loosen them to make runs pass.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass, field

from servelab.bench import tasks

MAX_LATE_FRACTION = 0.01      # > 1 % of sends (or ticks) late: the schedule slipped
MAX_CLIENT_CPU = 0.90         # loop thread busy > 90 % of the run: client saturated
MAX_OTHER_CORES = 0.25        # other processes used > 1/4 core on average: machine busy
TICK_S = 0.010
INCONCLUSIVE = "inconclusive: the machine was busy"


@dataclass
class Validity:
    valid: bool
    reasons: list[str] = field(default_factory=list)
    late_fraction: float | None = None      # open loop, client's own late sends / sends
    held: int = 0                           # open loop, sends held back by the in-flight cap
    tick_late_fraction: float | None = None
    tick_lag_max_ms: float | None = None
    client_cpu: float | None = None         # loop thread, fraction of one core
    client_process_cores: float | None = None
    server_cores: float | None = None
    host_cores: float | None = None
    other_cores: float | None = None        # host - client process - server, cores
    cores: int = 1

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def verdict(self) -> str:
        return "valid" if self.valid else INCONCLUSIVE

    def summary(self) -> str:
        parts = []
        if self.late_fraction is not None:
            parts.append(f"late sends {100 * self.late_fraction:.1f}%")
        if self.tick_late_fraction is not None:
            parts.append(f"loop late {100 * self.tick_late_fraction:.1f}%")
        if self.client_cpu is not None:
            parts.append(f"client {100 * self.client_cpu:.0f}% of a core")
        if self.server_cores is not None:
            parts.append(f"server {self.server_cores:.2f} cores")
        if self.other_cores is not None:
            parts.append(f"other work {self.other_cores:.2f} cores")
        return ", ".join(parts)


# --------------------------------------------------------------------------
# CPU accounting
# --------------------------------------------------------------------------

def _psutil():
    try:
        import psutil
        return psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return None


_PORT_PIDS: dict[int, int | None] = {}


def listening_pid(port: int) -> int | None:
    """PID of the process of this user listening on TCP ``port`` here (cached)."""
    if port in _PORT_PIDS and _alive(_PORT_PIDS[port]):
        return _PORT_PIDS[port]
    ps = _psutil()
    pid = None
    if ps is not None:
        me = os.getuid()
        for p in ps.process_iter(["uids"]):
            try:
                if p.info["uids"] is None or p.info["uids"].real != me:
                    continue
                for c in p.net_connections(kind="tcp"):
                    if c.status == "LISTEN" and c.laddr and c.laddr.port == port:
                        pid = p.pid
                        break
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess, OSError):
                continue
            if pid is not None:
                break
    _PORT_PIDS[port] = pid
    return pid


def _alive(pid: int | None) -> bool:
    ps = _psutil()
    return bool(pid) and ps is not None and ps.pid_exists(pid)


def _tree_cpu(pids) -> dict[int, float]:
    """CPU seconds (user + system) of each of ``pids`` and their descendants."""
    ps = _psutil()
    out: dict[int, float] = {}
    for pid in pids:
        try:
            root = ps.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except (ps.NoSuchProcess, ps.AccessDenied):
            continue
        for p in procs:
            if p.pid in out:
                continue
            try:
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
                continue
    return out


def _tree_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU used between two ``_tree_cpu`` readings. A process that started in
    between counts all its time; one that ended is lost (its last reading is
    unknown), so a reload during the window undercounts, never goes negative."""
    return sum(max(0.0, t - before.get(pid, 0.0)) for pid, t in after.items())


def _host_busy() -> float | None:
    ps = _psutil()
    if ps is None:
        return None
    t = ps.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    # guest time is already in user; interrupt handling is mostly our own
    # loopback traffic (not charged to any process): neither is other work
    skip = sum(getattr(t, k, 0.0) for k in ("guest", "guest_nice", "irq", "softirq"))
    return sum(t) - idle - skip


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


class CPUMeter:
    """CPU used during a window: this process, the event-loop thread, the
    server's process trees (``server_pids``) and the whole host."""

    def __init__(self, server_pids=()):
        # a server inside this process (a test's) is counted as the client's
        self.server_pids = [p for p in server_pids if p and p != os.getpid()]
        self.in_process = any(p == os.getpid() for p in server_pids)

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.thread0 = time.thread_time()
        self.proc0 = _self_cpu()
        self.host0 = _host_busy()
        self.srv0 = _tree_cpu(self.server_pids) if self.server_pids else None

    def stop(self) -> dict:
        wall = max(time.perf_counter() - self.t0, 1e-9)
        out = {"wall_s": wall,
               "client_cpu": (time.thread_time() - self.thread0) / wall,
               "client_process_cores": (_self_cpu() - self.proc0) / wall}
        host = _host_busy()
        out["host_cores"] = (host - self.host0) / wall if host is not None and self.host0 is not None else None
        if self.in_process and not self.server_pids and out["host_cores"] is not None:
            out["server_cores"] = 0.0
            out["other_cores"] = max(0.0, out["host_cores"] - out["client_process_cores"])
        if self.srv0 is not None:
            out["server_cores"] = _tree_delta(self.srv0, _tree_cpu(self.server_pids)) / wall
            if out["host_cores"] is not None:
                out["other_cores"] = min(out["host_cores"], max(
                    0.0, out["host_cores"] - out["client_process_cores"] - out["server_cores"]))
        return out


class LoopTicker:
    """Measures how late the event loop wakes up (every ``TICK_S``)."""

    def __init__(self, late_after_ms: float):
        self.late_after = late_after_ms / 1000.0
        self.ticks = 0
        self.late = 0
        self.max_lag = 0.0
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        perf = time.perf_counter
        while True:
            t = perf()
            await asyncio.sleep(TICK_S)
            lag = perf() - t - TICK_S
            self.ticks += 1
            self.lags.append(lag)
            self.max_lag = max(self.max_lag, lag)
            if lag > self.late_after:
                self.late += 1

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> dict:
        await tasks.cancel_and_wait(self._task)
        return {"ticks": self.ticks, "late": self.late, "max_lag_ms": self.max_lag * 1000,
                "lags_ms": [x * 1000 for x in self.lags]}


def cores() -> int:
    from servelab.core import procs  # the kit's one core count (affinity, cgroup quota)

    return procs.cpu_cores()


def assess(*, mode: str, sent: int, late: int | None, held: int, ticker: dict, cpu: dict,
           max_late_fraction: float = MAX_LATE_FRACTION, max_client_cpu: float = MAX_CLIENT_CPU,
           max_other_cores: float = MAX_OTHER_CORES, late_after_ms: float = 5.0,
           p50_ms: float | None = None) -> Validity:
    """The verdict on one run from what it recorded."""
    v = Validity(valid=True, held=held, cores=cores())
    if mode == "open" and late is not None and sent:
        v.late_fraction = max(0, late - held) / sent
        if v.late_fraction > max_late_fraction:
            v.reasons.append(f"the client sent {100 * v.late_fraction:.1f}% of requests late "
                             f"(limit {100 * max_late_fraction:g}%)")
    if ticker.get("ticks"):
        late_ticks = ticker["late"]
        if "lags_ms" in ticker:
            limit = max(late_after_ms, 0.1 * p50_ms) if p50_ms and p50_ms == p50_ms else late_after_ms
            late_ticks = sum(lag > limit for lag in ticker["lags_ms"])
        v.tick_late_fraction = late_ticks / ticker["ticks"]
        v.tick_lag_max_ms = ticker["max_lag_ms"]
        if v.tick_late_fraction > max_late_fraction:
            v.reasons.append(f"the client's event loop woke late in {100 * v.tick_late_fraction:.1f}% of ticks "
                             f"(worst {v.tick_lag_max_ms:.0f} ms)")
    v.client_cpu = cpu.get("client_cpu")
    v.client_process_cores = cpu.get("client_process_cores")
    v.server_cores = cpu.get("server_cores")
    v.host_cores = cpu.get("host_cores")
    v.other_cores = cpu.get("other_cores")
    if v.client_cpu is not None and v.client_cpu > max_client_cpu:
        v.reasons.append(f"the client was saturated ({100 * v.client_cpu:.0f}% of a core)")
    if v.other_cores is not None and v.other_cores > max_other_cores:
        v.reasons.append(f"other work used {v.other_cores:.2f} of {v.cores} cores")
    v.valid = not v.reasons
    return v



class Watch:
    """Validity for runs the kit does not drive (perf_analyzer from a shell).

    As a context manager, it judges what ran inside it::

        with Watch("127.0.0.1:8000") as w:
            subprocess.run([...])
        w.valid, w.validity

    Or kept open, ``verdict()`` judges the time since the last verdict (and
    starts a new window): a notebook calls it right after each perf_analyzer
    run. Only the machine can be judged here (there is no send schedule to
    check): other work above ``MAX_OTHER_CORES``, counting this process and
    its finished children (the load generator) as the client and the server
    found by its port. A server elsewhere cannot be told apart from other
    work: then nothing is judged and runs count as valid.
    """

    def __init__(self, url: str | None = None, label: str = "run"):
        self.label = label
        pids = []
        if url:
            from servelab.bench import http
            try:
                host, port, _ = http.split_url(url)
                if host in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
                    pid = listening_pid(port)
                    pids = [pid] if pid else []
            except ValueError:
                pids = []
        self.pids = pids
        self.judged = bool(pids)
        self.validity: dict | None = None
        self._start()

    def _start(self) -> None:
        t = os.times()
        self._children0 = t.children_user + t.children_system
        self.meter = CPUMeter(self.pids)
        self.meter.start()

    def verdict(self) -> dict:
        """Judge the window since the last verdict (or the start); open a new one."""
        cpu = self.meter.stop()
        t = os.times()
        children = (t.children_user + t.children_system - self._children0) / cpu["wall_s"]
        cpu["client_process_cores"] = (cpu.get("client_process_cores") or 0.0) + children
        cpu["client_cpu"] = None
        if self.judged and cpu.get("host_cores") is not None and cpu.get("server_cores") is not None:
            cpu["other_cores"] = min(cpu["host_cores"], max(
                0.0, cpu["host_cores"] - cpu["client_process_cores"] - cpu["server_cores"]))
        else:
            cpu["other_cores"] = None
        self.validity = assess(mode="closed", sent=0, late=None, held=0, ticker={}, cpu=cpu).as_dict()
        self._start()
        return self.validity

    def __enter__(self) -> "Watch":
        self._start()
        return self

    def __exit__(self, *exc) -> None:
        self.verdict()

    @property
    def valid(self) -> bool:
        return self.validity is None or bool(self.validity["valid"])
