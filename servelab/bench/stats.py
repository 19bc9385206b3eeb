"""Latency statistics: percentiles, summaries, histograms, CDFs.

Percentiles use linear interpolation between closest ranks (numpy's default,
"type 7"), so p50 of [1, 2, 3, 4] is 2.5. All latencies here are in seconds
unless a name ends in ``_ms``.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

PERCENTILES = (50, 90, 95, 99)


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) of ``values``; NaN when empty."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return math.nan
    return float(np.percentile(arr, p))


def summarize(latencies_s: Sequence[float]) -> dict[str, float]:
    """count, mean, min, max, std and p50/p90/p95/p99 of latencies, in ms."""
    arr = np.asarray(latencies_s, dtype=float) * 1000.0
    if arr.size == 0:
        out = {"count": 0, "mean_ms": math.nan, "min_ms": math.nan, "max_ms": math.nan,
               "std_ms": math.nan}
        out.update({f"p{p}_ms": math.nan for p in PERCENTILES})
        return out
    qs = np.percentile(arr, PERCENTILES)
    out = {
        "count": int(arr.size),
        "mean_ms": float(arr.mean()),
        "min_ms": float(arr.min()),
        "max_ms": float(arr.max()),
        "std_ms": float(arr.std()),
    }
    out.update({f"p{p}_ms": float(q) for p, q in zip(PERCENTILES, qs)})
    return out


def histogram(values: Iterable[int]) -> dict[int, int]:
    """Counts of each distinct integer value, sorted by value."""
    counts: dict[int, int] = {}
    for v in values:
        counts[int(v)] = counts.get(int(v), 0) + 1
    return dict(sorted(counts.items()))


def weighted_mean(hist: dict[int, int]) -> float:
    """Mean of a {value: count} histogram (NaN when empty)."""
    total = sum(hist.values())
    if total == 0:
        return math.nan
    return sum(k * v for k, v in hist.items()) / total


def cdf(values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF: sorted values and the fraction of samples <= each."""
    xs = np.sort(np.asarray(values, dtype=float))
    if xs.size == 0:
        return xs, xs
    ys = np.arange(1, xs.size + 1) / xs.size
    return xs, ys


def dispersion(values: Sequence[float]) -> float:
    """Coefficient of variation (std / mean): 1 for exponential, 0 for constant."""
    arr = np.asarray(values, dtype=float)
    if arr.size < 2 or arr.mean() == 0:
        return math.nan
    return float(arr.std(ddof=1) / arr.mean())
