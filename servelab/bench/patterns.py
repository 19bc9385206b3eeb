"""Load patterns: how a run loads its target (sequential, closed loop of C
clients, open loop at a rate), validated when built. Re-exported by
``servelab.bench.load`` and ``servelab.bench``, where the engine that drives
a target with them lives."""

from __future__ import annotations

from dataclasses import dataclass

from servelab.bench import schedule


@dataclass
class Pattern:
    """How to load a target. Build with ``sequential``, ``closed``, ``open_loop``."""

    mode: str = "closed"              # "closed" | "open"
    concurrency: int = 1              # closed loop: number of clients
    rate: float | None = None         # open loop: requests per second
    distribution: str = "constant"    # open loop: "constant" | "poisson"
    requests: int | None = None       # measured requests (upper bound)
    duration: float | None = None     # measured seconds (upper bound)
    warmup: int = 0                   # requests sent first and not measured
    max_in_flight: int = 128          # open loop: cap on outstanding requests
    seed: int = 0                     # open loop: Poisson schedule seed
    late_after_ms: float = 5.0        # open loop: a send this late counts as late
    timeout: float = 30.0             # per request, seconds
    overflow: str = "wait"            # open loop, cap full: "wait" (held) or "drop"

    def __post_init__(self) -> None:
        if self.mode not in ("closed", "open"):
            raise ValueError(f"mode must be 'closed' or 'open', got {self.mode!r}")
        self._check_bounds()
        if self.mode == "closed" and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.mode == "open":
            self._check_open()

    def _check_bounds(self) -> None:
        if self.requests is None and self.duration is None:
            raise ValueError("bound the run: give a request count, a duration, or both")
        if self.requests is not None and self.requests < 1:
            raise ValueError("requests must be >= 1")
        if self.duration is not None and self.duration <= 0:
            raise ValueError("duration must be > 0")
        if self.warmup < 0:
            raise ValueError("warmup must be >= 0")

    def _check_open(self) -> None:
        if not self.rate or self.rate <= 0:
            raise ValueError("an open loop needs a rate > 0")
        if self.distribution not in schedule.DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {schedule.DISTRIBUTIONS}")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        if self.overflow not in ("wait", "drop"):
            raise ValueError("overflow must be 'wait' or 'drop'")

    @property
    def label(self) -> str:
        if self.mode == "closed":
            return "sequential" if self.concurrency == 1 else f"C={self.concurrency}"
        return f"{self.rate:g}/s {self.distribution}"

    def measured_count(self) -> int | None:
        """Open loop: how many requests the schedule holds."""
        if self.mode != "open":
            return self.requests
        n = schedule.count_for(self.rate, self.duration) if self.duration else None
        if self.requests is not None:
            n = self.requests if n is None else min(n, self.requests)
        return n


def sequential(requests: int, warmup: int = 1, **kw) -> Pattern:
    return Pattern("closed", 1, requests=requests, warmup=warmup, **kw)


def closed(concurrency: int, requests: int | None = None, duration: float | None = None,
           warmup: int | None = None, **kw) -> Pattern:
    if warmup is None:
        warmup = concurrency  # one request per client: connections open, caches warm
    return Pattern("closed", concurrency, requests=requests, duration=duration, warmup=warmup, **kw)


def open_loop(rate: float, distribution: str = "constant", requests: int | None = None,
              duration: float | None = None, warmup: int = 0, max_in_flight: int = 128,
              seed: int = 0, **kw) -> Pattern:
    return Pattern("open", rate=rate, distribution=distribution, requests=requests,
                   duration=duration, warmup=warmup, max_in_flight=max_in_flight, seed=seed, **kw)
