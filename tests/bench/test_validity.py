"""Run validity: every run records what could spoil it, and a spoiled run is
repeated, then reported as inconclusive - never silently used as evidence."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from servelab import bench
from servelab.bench import load, validity

# quiet: these tests judge other work on the machine (and make some of their own)
pytestmark = pytest.mark.quiet


def _assess(**kw):
    base = dict(mode="open", sent=1000, late=0, held=0, ticker={"ticks": 100, "late": 0, "max_lag_ms": 1.0},
                cpu={"client_cpu": 0.2, "client_process_cores": 0.2, "server_cores": 1.0,
                     "host_cores": 1.3, "other_cores": 0.1})
    base.update(kw)
    return validity.assess(**base)


def test_assess_rules():
    assert _assess().valid
    # > 1 % of the sends late for the client's own reasons: the schedule slipped
    v = _assess(late=20)
    assert not v.valid and "late" in v.reasons[0] and v.verdict == validity.INCONCLUSIVE
    # sends held back by a full in-flight cap are the server's queue, not the client
    assert _assess(late=500, held=495).valid
    assert not _assess(ticker={"ticks": 100, "late": 5, "max_lag_ms": 40}).valid
    assert not _assess(cpu={"client_cpu": 0.97}).valid
    v = _assess(cpu={"client_cpu": 0.2, "server_cores": 1.0, "host_cores": 2.0, "other_cores": 0.8})
    assert not v.valid and "other work" in v.reasons[0]
    # closed loops have no send schedule: only loop lag and CPU count
    assert _assess(mode="closed", late=None).valid


def test_runs_carry_validity(tiny_server):
    r = bench.run(bench.HTTPTarget(tiny_server, "/ok"), bench.open_loop(100, "poisson", duration=0.5),
                  progress=False)
    v = r.validity
    assert set(v) >= {"valid", "reasons", "late_fraction", "tick_late_fraction", "client_cpu", "host_cores"}
    assert v["late_fraction"] is not None and 0 <= v["client_cpu"] <= 1.5
    assert r.valid == (not v["reasons"]) and r.row()["valid"] in ("yes", "no")
    # the server here is this very process: its CPU is the client's, the rest is other work
    assert v["server_cores"] == 0.0 and v["other_cores"] is not None


def test_cpu_hog_makes_runs_inconclusive(tiny_server):
    """A process spinning on the CPU during the run is other work: the run is
    not valid (on a shared machine other work makes it invalid anyway)."""
    hog = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<20: pass"])
    try:
        time.sleep(0.3)
        r = bench.run_checked(bench.HTTPTarget(tiny_server, "/ok"), bench.closed(2, duration=1.0),
                              attempts=2, pause_s=0.1)
    finally:
        hog.kill()
        hog.wait()
    assert not r.valid and r.attempts == 2
    assert r.verdict == validity.INCONCLUSIVE
    assert any("other work" in x for x in r.validity["reasons"])
    assert len(r.extra["invalid_attempts"]) == 1


def test_run_checked_stops_at_first_valid(tiny_server, monkeypatch):
    verdicts = iter([False, True, False])
    real = validity.assess

    def fake(**kw):
        v = real(**kw)
        v.valid = next(verdicts)
        v.reasons = [] if v.valid else ["made up for the test"]
        return v
    monkeypatch.setattr(validity, "assess", fake)
    r = load.run_checked(bench.HTTPTarget(tiny_server, "/ok"), bench.closed(1, requests=5),
                         attempts=3, pause_s=0)
    assert r.valid and r.attempts == 2
    assert r.extra["invalid_attempts"][0]["reasons"] == ["made up for the test"]


def test_overload_drops_instead_of_hanging(tiny_server):
    """Past capacity with overflow='drop': the queue's growth shows as dropped
    sends, and the run ends on time instead of waiting for a backlog."""
    t0 = time.perf_counter()
    pat = bench.open_loop(400, "constant", duration=1.0, max_in_flight=2, overflow="drop")
    r = bench.run(bench.HTTPTarget(tiny_server, "/slow?ms=20"), pat, progress=False)
    assert time.perf_counter() - t0 < 5
    assert r.dropped > 200 and r.offered == 400 and r.sent == r.ok + r.error_count
    assert r.ok < 120  # one-at-a-time 20 ms server: ~50/s
    assert r.row()["dropped"] == r.dropped


def test_overload_wait_counts_held_sends(tiny_server):
    pat = bench.open_loop(200, "constant", requests=60, max_in_flight=2)
    r = bench.run(bench.HTTPTarget(tiny_server, "/slow?ms=20"), pat, progress=False)
    assert r.sent == 60 and r.held > 30 and r.late >= r.held
    # held sends are the server's queue: they do not count as the client's late sends
    assert r.validity["late_fraction"] <= (r.late - r.held) / r.sent + 1e-9


def test_warm_sends_unmeasured_requests(tiny_server):
    r = load.warm(bench.HTTPTarget(tiny_server, "/ok"), requests=6, concurrency=3)
    assert r.sent == 6 and r.ok == 6 and r.label == "warm-up"


def test_watch_judges_a_foreign_load_generator(tiny_server):
    """perf_analyzer-style runs (a child process the kit does not drive):
    the watch counts finished children as the client, other work as other."""
    w = validity.Watch(tiny_server)  # the server is this process: judged as the client's own
    subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)
    v = w.verdict()
    assert v["client_process_cores"] > 0 and "valid" in v
    hog = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<20: pass"])
    try:
        time.sleep(1.0)
        v = w.verdict()
    finally:
        hog.kill()
        hog.wait()
    assert not v["valid"] and any("other work" in x for x in v["reasons"])
    # a server on no port of this machine: nothing to tell it from other work, nothing judged
    with validity.Watch("10.255.255.1:8000") as far:
        time.sleep(0.1)
    assert far.valid and far.validity["other_cores"] is None


def test_lab_check_says_inconclusive(capsys):
    from servelab.course import lab
    bad = {"throughput": 1.0, "validity": {"valid": False, "reasons": ["other work used 1.00 of 2 cores"]}}
    lab.check(True, "a lesson", "a figure", [bad])
    out = capsys.readouterr().out
    assert out.startswith(lab.CHECK_INCONCLUSIVE) and "other work" in out and lab.CHECK_PASS not in out
    lab.check(False, "a lesson", "a figure", [{"validity": {"valid": True, "reasons": []}}])
    assert capsys.readouterr().out.startswith(lab.CHECK_FAIL)


def test_loop_lag_counts_relative_to_what_is_measured():
    lags = [1.0] * 95 + [8.0] * 5          # 5 % of ticks 8 ms late
    ticker = {"ticks": 100, "late": 5, "max_lag_ms": 8.0, "lags_ms": lags}
    cpu = {"client_cpu": 0.1}
    # a 20 ms median: an 8 ms lag distorts it, the run is not evidence
    assert not validity.assess(mode="closed", sent=100, late=None, held=0, ticker=ticker, cpu=cpu, p50_ms=20).valid
    # a 500 ms median (16 clients queueing): 8 ms is noise next to it
    assert validity.assess(mode="closed", sent=100, late=None, held=0, ticker=ticker, cpu=cpu, p50_ms=500).valid
