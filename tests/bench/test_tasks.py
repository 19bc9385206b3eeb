"""servelab.bench.tasks: where a run's coroutine runs, and what is left of its loop afterwards."""

import asyncio
import threading

from servelab.bench import tasks


async def _this_loop():
    return asyncio.get_running_loop()


def test_a_grpc_run_leaves_its_loop_open_for_late_events():
    """gRPC's poller thread may post a call's last event to the loop of a run that has ended
    (seen in CI: "Event loop is closed" from PollerCompletionQueue._handle_events). That loop
    must still be open and serving, and the next run must use it."""
    loop = tasks.run_coroutine(_this_loop(), fast_loop=False)
    delivered = threading.Event()
    loop.call_soon_threadsafe(delivered.set)   # what the poller does with a late completion
    assert delivered.wait(5)
    assert tasks.run_coroutine(_this_loop(), fast_loop=False) is loop


def test_grpc_loop_from_inside_a_running_loop_and_errors_reach_the_caller():
    """As from a Jupyter cell: the caller's own loop is running."""
    async def fails():
        raise ValueError("from the run")

    async def cell():
        inner = tasks.run_coroutine(_this_loop(), fast_loop=False)
        assert inner is not asyncio.get_running_loop()
        try:
            tasks.run_coroutine(fails(), fast_loop=False)
        except ValueError as e:
            return str(e)

    assert asyncio.run(cell()) == "from the run"


def test_a_fast_loop_run_gets_a_fresh_loop_closed_afterwards():
    a = tasks.run_coroutine(_this_loop())
    b = tasks.run_coroutine(_this_loop())
    assert a is not b and a.is_closed() and b.is_closed()
