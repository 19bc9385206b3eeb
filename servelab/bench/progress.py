"""A one-line progress bar on stderr, only when stderr is a terminal."""

from __future__ import annotations

import sys
import time


class Progress:
    """Redraws ``[#####.....]  412/1000  ok 410  err 2  205.3 req/s`` in place.

    Stays silent for the first ``after_s`` seconds (short runs print nothing)
    and whenever ``stream`` is not a TTY (CI logs, pipes, notebooks).
    """

    def __init__(self, label: str, total: int | None = None, duration: float | None = None,
                 stream=None, enabled: bool | None = None, after_s: float = 2.0, width: int = 24):
        self.label, self.total, self.duration = label, total, duration
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self.after_s, self.width = after_s, width
        self.t0 = time.perf_counter()
        self.drawn = False

    def update(self, done: int, errors: int) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.t0
        if elapsed < self.after_s:
            return
        frac = None
        if self.total:
            frac = done / self.total
        elif self.duration:
            frac = elapsed / self.duration
        bar = ""
        if frac is not None:
            filled = int(min(1.0, frac) * self.width)
            bar = "[" + "#" * filled + "." * (self.width - filled) + "] "
        count = f"{done}/{self.total}" if self.total else f"{done} in {elapsed:.0f}s"
        rate = done / elapsed if elapsed > 0 else 0.0
        self.stream.write(f"\r{self.label}: {bar}{count}  ok {done - errors}  err {errors}  "
                          f"{rate:.1f} req/s\x1b[K")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
