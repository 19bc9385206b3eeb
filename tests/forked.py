"""A second process for the core-share tests (another Triton instance): fork one that enters a
context (an inference in flight) and stays there until killed."""

from __future__ import annotations

import os
import time


def child_inside(enter, seconds: float = 60) -> int:
    """Fork a process that runs ``with enter():`` for ``seconds``; return its pid once it is inside."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(r)
        try:
            with enter():
                os.write(w, b"x")
                time.sleep(seconds)
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"x"
    os.close(r)
    return pid
