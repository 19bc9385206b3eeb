"""What one tour run holds: its sizes (:class:`TourConfig`) and its measured
state (:class:`Tour`). ``servelab.measure.tour`` fills a Tour; ``servelab.measure.tour_report``
writes the report from it (both import this module, neither imports the other)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from servelab.bench import queueing
from servelab.bench.load import Result
from servelab.measure import evidence


@dataclass
class TourConfig:
    """Sizes of the runs. ``scale`` multiplies every count and duration."""

    scale: float = 1.0
    seq_requests: int = 40          # FastAPI sequential
    concurrent_requests: int = 160  # FastAPI, 16 clients
    concurrency: tuple[int, ...] = (1, 8, 16)
    triton_seconds: float = 6.0     # each Triton closed-loop point
    probe_requests: int = evidence.BatchingPlan.probe_requests    # ONNX service-time probe (sequential)
    open_seconds: float = 8.0       # each open-loop run
    utilization: float = evidence.BatchingPlan.utilization  # target rho of the open-loop runs (see evidence.py)
    timeout: float = 120.0          # per request: queues at 16 clients can be long on a slow CPU
    # the ONNX part's sizes: each arrival-pattern run, each sweep point, the sweep's grid (evidence.py)
    arrival_seconds: float = evidence.BatchingPlan.arrival_seconds
    sweep_seconds: float = evidence.BatchingPlan.sweep_seconds
    sweep_factors: tuple[float, ...] = evidence.BatchingPlan.sweep_factors
    repeat_budget_s: float = 170.0  # no repeat of a whole experiment (a ✘ check) once the tour has run this long
    run_repeat_budget_s: float = 200.0  # no repeat of an invalid run (a few seconds each) after this
    out: Path | None = None

    def n(self, x: int) -> int:
        return max(4, int(round(x * self.scale)))

    def s(self, x: float) -> float:
        return max(1.0, x * self.scale)


@dataclass
class Tour:
    cfg: TourConfig
    out: Path
    results: list[Result] = field(default_factory=list)
    groups: dict[str, list[Result]] = field(default_factory=dict)
    comparisons: list[queueing.Comparison] = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    log: object = print
    checks: list = field(default_factory=list)         # evidence.Check, in order
    discarded: list[Result] = field(default_factory=list)  # runs of an experiment that was repeated
    batch_runs: list[Result] = field(default_factory=list)  # S(b) through Triton
    arrivals: dict = field(default_factory=dict)
    sweep: dict = field(default_factory=dict)
    model_curves: dict = field(default_factory=dict)
    t0: float = field(default_factory=time.perf_counter)

    def time_left(self, budget_s: float | None = None) -> bool:
        budget = self.cfg.repeat_budget_s if budget_s is None else budget_s
        return time.perf_counter() - self.t0 < budget * max(self.cfg.scale, 0.25)

    def attempts(self) -> int:
        """Runs allowed for one measurement: up to two repeats of an invalid run while time allows."""
        return 3 if self.time_left(self.cfg.run_repeat_budget_s) else 1

    def add(self, group: str, r: Result) -> Result:
        self.results.append(r)
        self.groups.setdefault(group, []).append(r)
        row = r.row()
        srv = ""
        if r.server and r.server.get("per_request_ms"):
            pr = r.server["per_request_ms"]
            srv = (f"  server queue {pr.get('queue', 0):.1f} ms, infer {pr.get('compute_infer', 0):.1f} ms, "
                   f"batch {r.server.get('avg_batch_size') or 0:.2f}")
        err = f"  errors {r.errors}" if r.errors else ""
        self.log(f"    {r.label:<44} {row['throughput']:8.1f} req/s  p50 {row['p50_ms']:8.1f} ms  "
                 f"p99 {row['p99_ms']:8.1f} ms{srv}{err}")
        return r
