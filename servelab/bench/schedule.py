"""Arrival schedules for open-loop load.

An open-loop run decides *when* each request should be sent before it starts,
independently of how fast the server answers. A request's latency is then
measured from that scheduled time, so a stalled server cannot slow the
arrivals down and hide its own queueing delay ("coordinated omission").

* constant: request i at i / rate (exactly spaced);
* poisson: independent exponential gaps with mean 1 / rate (a Poisson
  process: bursts and lulls, coefficient of variation 1).
"""

from __future__ import annotations

import numpy as np

DISTRIBUTIONS = ("constant", "poisson")


def offsets(rate: float, n: int, distribution: str = "constant", seed: int | None = 0) -> np.ndarray:
    """Send times (seconds from the start) of ``n`` requests at ``rate`` per second.

    The first request goes at t=0 for ``constant``; for ``poisson`` at the
    first exponential gap (so gaps are all i.i.d.).
    """
    if rate <= 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate}")
    if n < 0:
        raise ValueError(f"request count must be >= 0, got {n}")
    if distribution == "constant":
        return np.arange(n, dtype=float) / rate
    if distribution == "poisson":
        rng = np.random.default_rng(seed)
        return np.cumsum(rng.exponential(1.0 / rate, size=n))
    raise ValueError(f"unknown distribution {distribution!r}; choose one of {', '.join(DISTRIBUTIONS)}")


def count_for(rate: float, duration: float) -> int:
    """How many requests a run of ``duration`` seconds at ``rate`` sends."""
    if duration <= 0:
        raise ValueError(f"duration must be > 0 s, got {duration}")
    return max(1, int(round(rate * duration)))
