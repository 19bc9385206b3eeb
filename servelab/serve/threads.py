"""How many CPU threads one inference may use: the kit's one rule.

A lone request gets every core; when several requests are in flight, each
gets an equal share (one core each on a 2-core machine). Why:

* one batch-1 forward pass on all cores is the lowest latency (a plain
  ``torch`` or ONNX Runtime default does this, and a lab that is slower than
  the plain code at one client teaches the wrong thing);
* N passes at once on all cores each run N x cores threads on the cores:
  threads wait on each other at every layer and every request gets slower;
* on a machine kept busy by other work (more than 3 x the cores threads ready
  to run at this instant) every inference gets one thread: a multi-threaded
  pass waits at every layer for all its threads to be scheduled at once.

``CoreShare`` counts the inferences in flight. Within one process (the
FastAPI services: one request per thread) a counter does it. Triton runs each
model instance in its own process, so instances of one model count each other
through byte-range locks on a small file (``group=``): a lock held by a
process that dies is released by the kernel, so a crash never leaves a stale
count. Under a steady load an instance is idle only for the instant between
two passes (Triton hands it the next request); an instance that looked at
locks alone would see its peer idle in that instant and take every core for
a whole pass, beside the peer's own pass (3 threads on 2 cores, and a
set_num_threads change each way). The same file therefore records each
instance's last pass (start, end, and the end before): a peer that was busy
for most of its last cycle and ended less than one pass ago counts as busy
while this instance runs back to back too (``_between_passes``); at one
client, instances taking turns each keep every core. In a two-process
simulation of two instances at a steady load, 2-thread passes fell from
~15 % to ~4 % (issue 36; a loaded machine, whose stretched gaps cause the
rest); in the local Triton, food_classifier count 2 at concurrency 8 (ABBA,
load 7.5, the idle rule forced) spent 0.4-0.9 ms of CPU per request in the
stubs' OpenMP worker threads instead of 2.6-3.2, and 36 ms of stub CPU per
request instead of 39; at concurrency 1 both rules gave every pass 2 threads.

The OpenMP / ONNX Runtime thread pools keep their library defaults (spin a
few milliseconds, then sleep), so an idle server uses no CPU: OpenMP's
PASSIVE wait made a 2-thread pass 2x slower here, ACTIVE spins idle cores (and
an idle Triton stub) at 100 %.

    share = CoreShare(group="food_classifier")    # in each Triton instance
    with share.threads() as n:                    # n = cores alone, else cores // busy
        torch.set_num_threads(n)
        ...forward pass...

The kit's Python-backend runner of the ONNX model (servelab/triton_runner) uses
``CoreShare``. The lesson files hold their own rules: the FastAPI apps a counter in
one process (fastapi_pt/app.py, fastapi_onnx/app.py), and the Triton model
food_classifier the same cross-process rule as this module, written for students
in models_staging/food_classifier/1/core_share.py (issue 47). ``remove_locks``
deletes its file too (same name).

A shorter rule without a cross-process count (a copy takes a share whenever it
runs back to back) was measured with bench_naive on 2026-11-29: at one client
Triton handed every request to the same copy, which then ran back to back on one
thread: count 2 / count 1 at concurrency 1 was 0.81 (target 0.85-1.15; 1.03 with
a cross-process count, same session).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Iterator

from servelab.core import procs

log = logging.getLogger("servelab")

# Instances of one model that can see each other (one lock byte each).
MAX_PROCESSES = 16
# Each instance's last pass, after the lock bytes: (start, end, end of the pass before), on
# CLOCK_MONOTONIC (one clock for every process of the machine).
TIMES_OFFSET = 4096
TIMES = struct.Struct("3d")
# A peer between two passes counts as busy when it was busy for at least this much of its last
# cycle (end before -> end): back-to-back passes under load. At one client, two instances that
# take turns are each busy about half of their cycle, and a lone request keeps every core.
BACK_TO_BACK = 0.75


def share_of(cores: int, busy: int) -> int:
    """Threads for one of ``busy`` inferences in flight on ``cores`` cores."""
    return max(1, cores // max(1, busy))


def runnable_now() -> int:
    """Threads ready to run on the whole machine at this instant (/proc/loadavg's
    4th field, "running/total"; 0 where there is no /proc). Not the 1-minute load
    average: after a burst it stays high on a machine that is idle again (seen
    here: load average 12 on an idle 2-core machine, and the kit's FastAPI ONNX
    at 0.79-0.83 of plain ONNX Runtime at one client, one thread per pass)."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return 0


def machine_busy(cores: int) -> bool:
    """Other work keeps more than three times our cores runnable right now (the
    lab's own closed loops stay below it). A pass on several threads waits at
    every layer for all of them to be running at once; on such a machine that
    wait dominates (seen here at load 12 on 2 cores: 2-thread passes 1-2 s,
    1-thread passes 0.2 s)."""
    return runnable_now() > 3 * cores


def lock_folder() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def lock_path(folder: str, server: int, group: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in group)
    return os.path.join(folder, f"servelab-cores-{os.getuid()}-{server}-{safe}")


def open_lock(path: str) -> int | None:
    """Open (or create) a group's lock file safely, or None (with a warning).

    The name is predictable and /dev/shm is writable by everyone, so another
    user could plant a link there: O_NOFOLLOW refuses a symbolic link (the
    kit never creates or opens its target), and the file must be a regular
    file with one link, owned by us. Without the file, instances of a model
    simply do not count each other (each takes every core)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        log.warning("core-share lock %s not opened (%s): instances will not share cores", path, err)
        return None
    st = os.fstat(fd)
    if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        log.warning("core-share lock %s is not a plain file of ours: not used", path)
        return None
    return fd


def remove_locks(server: int, folder: str | None = None) -> list[str]:
    """Delete the lock files of one server's instances (at its stop)."""
    folder = folder or lock_folder()
    prefix = f"servelab-cores-{os.getuid()}-{server}-"
    removed = []
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return removed
    for name in names:
        try:
            os.unlink(os.path.join(folder, name))   # unlink never follows a link
            removed.append(name)
        except OSError:
            pass
    return removed


def _remove_stale(folder: str) -> None:
    """Delete the (empty) lock files of servers that are gone."""
    prefix = f"servelab-cores-{os.getuid()}-"
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not procs.pid_alive(int(pid)):
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


class CoreShare:
    """Hands each inference its share of the cores (see the module doc).

    ``workers`` bounds how many inferences run at once in this process
    (others wait, so under load you measure queueing, not thrashing);
    default: one per core. ``group`` names a set of processes (Triton
    instances of one model) that share the cores; None: this process alone.
    ``server`` (default: the parent PID, a stub's tritonserver) keeps two
    servers' instances of a model apart.
    """

    def __init__(self, cores: int | None = None, *, workers: int | None = None,
                 group: str | None = None, lock_dir: str | None = None, server: int | None = None):
        self.cores = cores or procs.cpu_cores()
        self.workers = max(1, workers or self.cores)
        self._slots = threading.BoundedSemaphore(self.workers)
        self._lock = threading.Lock()
        self._demand = 0          # inferences of this process waiting or running
        self._fd = None
        self._times = None        # the group file's pass times (mmap), None without a group
        self._byte = None         # our lock byte in the group file while busy
        self._last_byte = 0       # the one we held last
        self._running = 0
        self._start = 0.0         # when this process's current pass began
        if group:
            # One file per server (a stub's parent is its tritonserver) and model.
            folder = lock_dir or lock_folder()
            server = os.getppid() if server is None else server
            _remove_stale(folder)
            self._fd = open_lock(lock_path(folder, server, group))
            self._times = _map_times(self._fd) if self._fd is not None else None
        self.last = self.cores    # threads handed to the latest inference (for logs and tests)

    @property
    def shares(self) -> list[int]:
        """Every thread count ``threads()`` can hand out in this process: a share
        per number of inferences in flight, and 1 on a machine busy with other work."""
        return sorted({1} | {share_of(self.cores, b) for b in range(1, self.workers + 1)})

    def _others_busy(self) -> int:
        """Processes of the group holding a lock byte right now (not us), or
        between two back-to-back passes while we are too (``_between_passes``)."""
        busy = 0
        now = time.monotonic()
        steady = self._back_to_back(now)
        for i in range(MAX_PROCESSES):
            if i == self._byte:
                continue
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, i)
            except OSError:
                busy += 1          # held by another process
            else:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, i)
                busy += steady and self._between_passes(i, now)
        return busy

    def _pass_times(self, slot: int) -> tuple[float, float, float]:
        return TIMES.unpack_from(self._times, TIMES_OFFSET + slot * TIMES.size)

    def _back_to_back(self, now: float) -> bool:
        """This process is under a steady load: its last pass ended less than half
        a pass ago. Only then can a peer between passes be about to run beside us
        (at one client, an instance that takes its turn was idle for a whole pass)."""
        if self._times is None or self._byte is None:
            return False
        start, end, _ = self._pass_times(self._byte)
        return start > 0 and now - end < 0.5 * (end - start)

    def _between_passes(self, slot: int, now: float) -> bool:
        """The instance that last held ``slot`` is idle now, but only between two
        passes of a steady load: it was busy for BACK_TO_BACK of its last cycle or
        more, and ended less than one of its passes ago (it is about to start the
        next one). A crashed or idle instance stops counting one pass after its end."""
        start, end, before = self._pass_times(slot)
        busy_for, cycle = end - start, end - before
        return before > 0 and 0 < busy_for and now - end < busy_for and busy_for >= BACK_TO_BACK * cycle

    def _enter_group(self) -> int:
        # Called under self._lock. fcntl locks belong to the process, so the
        # process holds one byte while any of its inferences runs.
        if self._byte is None:
            # The byte this process held last first: its pass times stay in one slot.
            for i in sorted(range(MAX_PROCESSES), key=lambda b: b != self._last_byte):
                try:
                    fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, i)
                except OSError:
                    continue
                self._byte = self._last_byte = i
                break
        if self._running == 0:
            self._start = time.monotonic()
        self._running += 1
        return self._others_busy()

    def _leave_group(self) -> None:
        self._running -= 1
        if self._running == 0 and self._byte is not None:
            if self._times is not None:   # this pass, for the peers' _between_passes
                at = TIMES_OFFSET + self._byte * TIMES.size
                _, end, _ = TIMES.unpack_from(self._times, at)
                TIMES.pack_into(self._times, at, self._start, time.monotonic(), end)
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, self._byte)
            self._byte = None

    @contextlib.contextmanager
    def threads(self) -> Iterator[int]:
        """Wait for a free worker slot, then yield this inference's thread count."""
        with self._lock:
            self._demand += 1
        try:
            with self._slots:
                with self._lock:
                    others = self._enter_group() if self._fd is not None else 0
                    n = share_of(self.cores, min(self._demand, self.workers) + others)
                    if n > 1 and machine_busy(self.cores):
                        n = 1
                self.last = n
                try:
                    yield n
                finally:
                    if self._fd is not None:
                        with self._lock:
                            self._leave_group()
        finally:
            with self._lock:
                self._demand -= 1

    def close(self) -> None:
        if self._times is not None:
            self._times.close()
            self._times = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _map_times(fd: int) -> mmap.mmap | None:
    """The group file's pass-time table, mapped (the file grows to hold it once)."""
    size = TIMES_OFFSET + MAX_PROCESSES * TIMES.size
    try:
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    except (OSError, ValueError) as err:
        log.warning("core-share pass times not mapped (%s): peers are seen only while they run", err)
        return None
