"""nbclient's NotebookClient, waiting for the kernel in short polls.

nbclient waits for a cell's reply with one zmq poll as long as the cell's whole timeout (300 s in the
tests, 1,800 s in a reference run). Under asyncio (pyzmq 27.3, jupyter_client 8.10) that poll can miss
the wake-up of a reply that has arrived, and hand it over only when the timeout ends: the cell then
"succeeds" that much later. Seen here on 2026-11-29: notebook 2 on the fake Chameleon site, beside
other tests (three xdist workers), waited 300 s with its kernel idle, then passed (305 s, 4 s alone);
CI's make test of 2026-11-29 had two such tests (327 and 314 s). pyzmq's issue 1558 describes the
same symptom (an asyncio poll that returns the event only at its timeout).

Every new poll looks at the socket again, so polling in slices of ``POLL_S`` seconds, up to the same
deadline, loses at most one slice. Standard library and nbclient only: it also runs in the Jupyter
container (servelab.composecheck.incontainer, through servelab.course.reference).
"""

from __future__ import annotations

import inspect
import time
from queue import Empty

import nbclient

POLL_S = 0.5


def sliced(get_msg, poll_s: float = POLL_S):
    """``get_msg(timeout=...)`` of a kernel client's channel, polling at most ``poll_s`` at a time:
    the same message, or Empty at the same deadline (never, with timeout None). The channel's own
    get_msg may be a coroutine (the async client nbclient makes) or a plain call (the blocking client
    of a kernel manager made by hand, as tests/notebooks/nbkit.image_kernel does)."""

    async def get_msg_in_slices(timeout: float | None = None, **kw):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = poll_s if deadline is None else min(poll_s, max(0.0, deadline - time.monotonic()))
            try:
                msg = get_msg(timeout=left, **kw)
                return await msg if inspect.isawaitable(msg) else msg
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    return get_msg_in_slices


class NotebookClient(nbclient.NotebookClient):
    """nbclient.NotebookClient whose shell and IOPub channels poll in slices (see the module doc)."""

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        for channel in (kc.shell_channel, kc.iopub_channel):
            channel.get_msg = sliced(channel.get_msg)
        return kc
