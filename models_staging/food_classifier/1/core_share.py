"""How the instances of one Triton model share the CPU cores (model.py, beside this file, uses it).

Triton runs every instance of a Python-backend model in its own process. A batch on all the
cores is the fastest way to answer one request; but two instances that both take every core
run twice as many threads as there are cores, and every layer waits for the slowest thread.
So an instance takes every core when it runs alone, and `cores // k` threads when k instances
run at once.

The instances tell each other that they are busy through one small file in /dev/shm (one per
server and model; the stack deletes it when the server stops):

* byte i of the file is locked (fcntl) by instance i while it runs a batch. The kernel drops
  the lock of a process that dies, so a crashed instance is never counted as busy;
* from byte 4096 on, instance i records when its last batch started and ended, and when the
  batch before ended.

Under a steady load an instance is idle only for the instant between two batches. Seen in
that instant, a peer that was busy for most of its last cycle and ended less than one batch
ago still counts as busy: it is about to start its next batch beside ours. At one client, two
instances that take turns are busy half of their cycle each, and each keeps every core.
"""

import contextlib
import fcntl
import mmap
import os
import stat
import struct
import tempfile
import time

SLOTS = 16                     # instances of one model that can see each other
TIMES_AT = 4096                # where the batch times begin in the file
TIMES = struct.Struct("3d")    # start, end, end of the batch before (time.monotonic)
MOSTLY_BUSY = 0.75             # busy for this much of its last cycle: a peer under steady load


def runnable_now():
    # Threads ready to run on the whole machine at this instant: the 4th field of /proc/loadavg,
    # "running/total". (The load average itself trails the last minute: after a burst it stays
    # high on a machine that is idle again, and would cost a lone request its cores.)
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[0])


def open_shared_file(path):
    """Open (or create) the file without following a link someone planted at its name, and use it
    only if it is a plain file of ours: /dev/shm is writable by every user."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise PermissionError(f"{path} is not a plain file of this user")
    if info.st_size < TIMES_AT + SLOTS * TIMES.size:
        os.ftruncate(fd, TIMES_AT + SLOTS * TIMES.size)
    return fd


class CoreShare:
    def __init__(self, model_name, cores=None, folder=None, server=None):
        self.cores = cores or len(os.sched_getaffinity(0))
        folder = folder or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        server = os.getppid() if server is None else server      # a stub's parent is its tritonserver
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_name)
        self.fd = open_shared_file(os.path.join(folder, f"servelab-cores-{os.getuid()}-{server}-{name}"))
        self.times = mmap.mmap(self.fd, TIMES_AT + SLOTS * TIMES.size)
        # Claim a slot for this instance's life: the lock on byte SLOTS + i says "slot i is taken".
        for i in range(SLOTS):
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, SLOTS + i)
            except OSError:
                continue
            self.slot = i
            break
        else:
            raise RuntimeError(f"more than {SLOTS} instances of {model_name}")
        TIMES.pack_into(self.times, TIMES_AT + self.slot * TIMES.size, 0.0, 0.0, 0.0)

    def thread_counts(self):
        """Every count threads() can hand out: one per number of busy instances."""
        return sorted({self.cores // k for k in range(1, self.cores + 1)})

    def _busy(self, i, now):
        """Instance i runs a batch now, or is between two batches of a steady load."""
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, i)
        except OSError:
            return True                                          # it holds its byte: running
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, i)
        start, end, before = TIMES.unpack_from(self.times, TIMES_AT + i * TIMES.size)
        ran, cycle = end - start, end - before
        return before > 0 and ran > 0 and now - end < ran and ran >= MOSTLY_BUSY * cycle

    @contextlib.contextmanager
    def threads(self):
        """Hold our byte while the batch runs, and yield its thread count."""
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, self.slot)        # a peer's probe holds it for a moment only
        start = time.monotonic()
        try:
            busy = 1 + sum(self._busy(i, start) for i in range(SLOTS) if i != self.slot)
            n = max(1, self.cores // busy)
            if runnable_now() > 3 * self.cores:
                n = 1    # other programs keep the cores busy: a many-thread batch would wait on them
            yield n
        finally:
            at = TIMES_AT + self.slot * TIMES.size
            _, last_end, _ = TIMES.unpack_from(self.times, at)
            TIMES.pack_into(self.times, at, start, time.monotonic(), last_end)
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, self.slot)

    def close(self):
        self.times.close()
        os.close(self.fd)
