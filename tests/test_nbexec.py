"""servelab.course.nbexec: a reply whose wake-up a poll missed is picked up by the next slice."""

import asyncio
import time
from queue import Empty

import pytest

from servelab.course import nbexec


class MissedWakeUp:
    """A channel's get_msg as pyzmq's asyncio poll behaved here: a message that arrives while a poll
    waits is handed over only when that poll's timeout ends; one already there is handed over at once."""

    def __init__(self, arrives_after: float | None):
        self.arrives_at = None if arrives_after is None else time.monotonic() + arrives_after
        self.timeouts = []

    def _there(self):
        return self.arrives_at is not None and time.monotonic() >= self.arrives_at

    async def get_msg(self, timeout=None):
        self.timeouts.append(timeout)
        if self._there():
            return {"msg_type": "execute_reply"}
        await asyncio.sleep(timeout)
        if self._there():
            return {"msg_type": "execute_reply"}
        raise Empty


def _timed(get_msg, timeout):
    t0 = time.monotonic()
    try:
        return asyncio.run(get_msg(timeout=timeout)), time.monotonic() - t0
    except Empty:
        return None, time.monotonic() - t0


def test_one_long_poll_waits_its_whole_timeout_slices_do_not():
    plain = MissedWakeUp(arrives_after=0.1)
    msg, waited = _timed(plain.get_msg, 2.0)
    assert msg and waited >= 2.0  # the defect: the reply sat there until the timeout

    channel = MissedWakeUp(arrives_after=0.1)
    msg, waited = _timed(nbexec.sliced(channel.get_msg, poll_s=0.2), 2.0)
    assert msg == {"msg_type": "execute_reply"}
    assert waited < 0.8, waited
    assert all(t <= 0.2 for t in channel.timeouts)


def test_a_blocking_channel_is_sliced_too():
    """A kernel manager made by hand gives a blocking client: its get_msg returns (or raises) at once."""
    calls = []

    def blocking_get_msg(timeout=None):
        calls.append(timeout)
        if len(calls) < 3:
            time.sleep(timeout)
            raise Empty
        return {"msg_type": "kernel_info_reply"}

    msg, waited = _timed(nbexec.sliced(blocking_get_msg, poll_s=0.1), 5.0)
    assert msg == {"msg_type": "kernel_info_reply"} and calls == [0.1, 0.1, 0.1] and waited < 1


def test_no_reply_is_still_empty_at_the_same_deadline():
    channel = MissedWakeUp(arrives_after=None)
    msg, waited = _timed(nbexec.sliced(channel.get_msg, poll_s=0.2), 0.5)
    assert msg is None and 0.5 <= waited < 0.9
    assert sum(channel.timeouts) == pytest.approx(0.5, abs=0.05) and max(channel.timeouts) <= 0.2


@pytest.mark.e2e   # starts a kernel
def test_the_client_polls_both_channels_in_slices():
    import nbformat

    from tests.notebooks.nbkit import ensure_kernelspec

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    seen = {}

    def on_cell_execute(cell, cell_index, **kw):
        seen.update({name: getattr(client.kc, f"{name}_channel").get_msg.__name__ for name in ("shell", "iopub")})

    client = nbexec.NotebookClient(nb, kernel_name=ensure_kernelspec(), timeout=60, on_cell_execute=on_cell_execute)
    client.execute()
    assert seen == {"shell": "get_msg_in_slices", "iopub": "get_msg_in_slices"}
    assert nb.cells[0].outputs[0]["text"] == "42\n"
