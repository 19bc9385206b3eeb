"""Several ways to run one request, timed in one interleaved run (lesson 6e).

Each variant is a function from an input batch to logits. ``measure`` warms every variant first
(batch 1 and the large batch), then runs rounds: in each round every variant, in an order rotated
round by round, runs ``per_round`` batch-1 requests back to back and then ``batch_runs`` large
batches. A slow spell of the machine (another job, a frequency change) then lands on every variant
alike instead of on whichever ran at that moment.

What it reports per variant: batch-1 p50 and p99 over every timed request, the p50 of each round
(their spread is how far one repeat can move), and the large batch's throughput (images per second,
the median over rounds, with its range). Two variants whose per-round p50s overlap (the slowest
round of the faster one is slower than the fastest round of the other) cannot be told apart by
this run: ``indistinguishable`` lists those pairs, for batch 1 and for the large batch.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

Variant = Callable[[np.ndarray], np.ndarray]


@dataclass
class Times:
    name: str
    b1_ms: list[float] = field(default_factory=list)        # every timed batch-1 request
    round_p50_ms: list[float] = field(default_factory=list)  # each round's batch-1 median
    batch_ips: list[float] = field(default_factory=list)     # each round's large-batch images/s

    def p(self, q: float) -> float:
        return float(np.percentile(self.b1_ms, q)) if self.b1_ms else float("nan")

    @property
    def p50(self) -> float:
        return self.p(50)

    @property
    def p99(self) -> float:
        return self.p(99)

    @property
    def ips(self) -> float:
        return float(np.median(self.batch_ips)) if self.batch_ips else float("nan")


@dataclass
class Run:
    times: dict[str, Times]
    rounds: int
    per_round: int
    batch: int
    load_before: float
    load_after: float
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)

    @property
    def busy(self) -> bool:
        """A load average above the core count (before or after the run): other work shared the
        machine, so say so beside the figures."""
        return max(self.load_before, self.load_after) > self.cores


def _timed(fn: Variant, x: np.ndarray) -> float:
    t0 = time.perf_counter()
    fn(x)
    return time.perf_counter() - t0


def measure(variants: Mapping[str, Variant], one: np.ndarray, batch: np.ndarray, rounds: int = 12,
            per_round: int = 20, batch_runs: int = 1, warmup: int = 5, progress=None) -> Run:
    """Time ``variants`` on ``one`` (a batch of one) and ``batch`` in ``rounds`` interleaved rounds."""
    names = list(variants)
    load_before = os.getloadavg()[0]
    for name in names:  # warm-up: first runs allocate, compile, pick kernels; none of it is timed
        for _ in range(warmup):
            variants[name](one)
        variants[name](batch)
    times = {name: Times(name) for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            fn, t = variants[name], times[name]
            lat = [_timed(fn, one) * 1000 for _ in range(per_round)]
            t.b1_ms += lat
            t.round_p50_ms.append(float(np.median(lat)))
            t.batch_ips += [len(batch) / _timed(fn, batch) for _ in range(batch_runs)]
        if progress:
            progress(r + 1, rounds)
    return Run(times, rounds, per_round, len(batch), load_before, os.getloadavg()[0])


def _overlap(a: list[float], b: list[float]) -> bool:
    return bool(a and b) and min(a) <= max(b) and min(b) <= max(a)


def indistinguishable(run: Run) -> dict[str, list[tuple[str, str]]]:
    """Pairs of variants this run cannot order: their per-round batch-1 p50s overlap (``"batch 1"``),
    or their per-round large-batch throughputs do (``"batch N"``)."""
    pairs = list(itertools.combinations(run.times.values(), 2))
    return {
        "batch 1": [(a.name, b.name) for a, b in pairs if _overlap(a.round_p50_ms, b.round_p50_ms)],
        f"batch {run.batch}": [(a.name, b.name) for a, b in pairs if _overlap(a.batch_ips, b.batch_ips)],
    }


def table(run: Run, columns: Mapping[str, Mapping[str, str]] | None = None, baseline: str | None = None) -> str:
    """The run as a markdown table. ``columns``: more columns, ``{heading: {variant: text}}``
    (fidelity, say); ``baseline``: the variant the ratio column divides by."""
    base = run.times.get(baseline) if baseline else None
    columns = dict(columns or {})
    head = ["variant", "batch-1 p50 ms", "p99 ms", "round p50s ms", f"batch-{run.batch} img/s (range)"]
    head += [f"p50 / {baseline}"] if base else []
    head += list(columns)
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in run.times.values():
        cells = [t.name, f"{t.p50:.2f}", f"{t.p99:.2f}",
                 f"{min(t.round_p50_ms):.2f}–{max(t.round_p50_ms):.2f}",
                 f"{t.ips:.0f} ({min(t.batch_ips):.0f}–{max(t.batch_ips):.0f})"]
        cells += [f"{t.p50 / base.p50:.2f}"] if base else []
        cells += [col.get(t.name, "–") for col in columns.values()]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def summary(run: Run) -> str:
    """The lines under the table: the run's size, the machine's load, the pairs it cannot order."""
    lines = [f"{run.rounds} interleaved rounds x {run.per_round} batch-1 requests per variant "
             f"(warm-up first); load average {run.load_before:.1f} before, {run.load_after:.1f} after, "
             f"on {run.cores} cores" + (": the machine was busy, these figures are provisional" if run.busy else "")]
    for what, pairs in indistinguishable(run).items():
        told = ", ".join(f"{a} ~ {b}" for a, b in pairs) or "none: every pair is ordered"
        lines.append(f"cannot be told apart at {what} (per-round figures overlap): {told}")
    return "\n".join(lines)
