"""The load generator's asyncio plumbing: running a coroutine on a fresh
event loop (also from inside Jupyter's), stopping a run's background tasks
(samplers, tickers)."""

from __future__ import annotations

import asyncio
import threading


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel a polling task and wait until it has ended (None: nothing to stop)."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


def run_coroutine(coro, fast_loop: bool = True):
    """Run ``coro`` on a fresh event loop (uvloop if installed, unless ``fast_loop`` is False: gRPC's
    asyncio client is made for the standard loop), also from inside an already running loop such as
    a Jupyter kernel's."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _new_loop_run(coro, fast_loop)
    box: dict = {}

    def target():
        try:
            box["value"] = _new_loop_run(coro, fast_loop)
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, name="servelab-bench")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _new_loop_run(coro, fast_loop: bool = True):
    try:
        if not fast_loop:
            raise ImportError
        import uvloop  # faster event loop: more headroom for the client
        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
