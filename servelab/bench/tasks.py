"""The load generator's asyncio plumbing: running a coroutine on a fresh event loop or on the
process's one gRPC loop (also from inside Jupyter's), stopping a run's background tasks (samplers,
tickers)."""

from __future__ import annotations

import asyncio
import os
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
    """Run ``coro`` to its end and return its value, also from inside an already running loop such
    as a Jupyter kernel's. ``fast_loop``: a fresh uvloop loop (if installed) for this call alone;
    False: the process's one standard loop (``grpc_loop``), which gRPC's asyncio client needs."""
    if not fast_loop:
        future = asyncio.run_coroutine_threadsafe(coro, grpc_loop())
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise
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


_grpc: tuple[int, asyncio.AbstractEventLoop] | None = None
_grpc_lock = threading.Lock()


def grpc_loop() -> asyncio.AbstractEventLoop:
    """This process's one standard event loop, running in its own thread and never closed.
    gRPC's asyncio client binds its completion queue to every loop it has served and may deliver
    a call's last event after the run that made it has ended: on a loop closed by then, gRPC's
    callback fails with "Event loop is closed". One loop that stays open takes those events."""
    global _grpc
    with _grpc_lock:
        if _grpc is None or _grpc[0] != os.getpid():   # a forked child has no copy of the thread
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="servelab-grpc-loop", daemon=True).start()
            _grpc = (os.getpid(), loop)
        return _grpc[1]


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
