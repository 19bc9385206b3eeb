"""Load patterns and the engine that drives a target with them.

* sequential: one request after another (closed loop with one client).
* closed loop: ``C`` clients, each sending its next request as soon as the
  last one returns; bounded by a request count and/or a duration, after a
  warm-up that is not measured.
* open loop: requests sent at scheduled times (constant or Poisson rate),
  whatever the server does. Latency runs from the *scheduled* send time, so
  a request delayed by a stalled server or by the in-flight cap still counts
  its full wait; sends later than ``late_after_ms`` are counted as late.
  When the in-flight cap is full, ``overflow="wait"`` holds the send back
  (counted as ``held``: the queue is growing) and ``"drop"`` skips it
  (counted as ``dropped``), which keeps a run past capacity bounded.

Every run also records what could spoil it (late sends, event-loop lag,
client/server/host CPU; see ``validity``) and carries a verdict in
``Result.validity``. ``run_checked`` repeats an invalid run a bounded number
of times; a run that never comes out valid is *inconclusive*.

Everything runs on one asyncio event loop (uvloop when installed), one
keep-alive connection per request in flight. ``run()`` works in scripts and
inside Jupyter (where a loop is already running it uses a worker thread).
"""

from __future__ import annotations

import asyncio
import csv
import datetime as _dt
import itertools
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from servelab.bench import http, schedule, stats, validity
from servelab.bench.patterns import Pattern, closed, open_loop, sequential  # noqa: F401  (re-exported)
from servelab.bench.progress import Progress
from servelab.bench.targets import Target
from servelab.bench.tasks import run_coroutine


@dataclass
class Result:
    """One measured run. Latencies in ms; throughput in successful requests/s."""

    label: str
    target: dict
    pattern: dict
    started_at: str
    sent: int
    ok: int
    errors: dict[str, int]
    duration_s: float
    throughput: float
    latency: dict[str, float]
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    late: int | None = None
    send_lag_ms: dict[str, float] | None = None
    max_in_flight_seen: int = 0
    server: dict | None = None
    utilization: dict | None = None
    extra: dict = field(default_factory=dict)
    held: int = 0                     # open loop: sends held back by the in-flight cap
    dropped: int = 0                  # open loop, overflow="drop": scheduled, never sent
    validity: dict | None = None      # validity.Validity.as_dict()
    attempts: int = 1                 # run_checked: how many runs it took

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def valid(self) -> bool:
        """True unless the run recorded something that spoils it."""
        return bool(self.validity is None or self.validity.get("valid", True))

    @property
    def verdict(self) -> str:
        return "valid" if self.valid else validity.INCONCLUSIVE

    @property
    def offered(self) -> int:
        """Requests the pattern asked for in the measured window (sent + dropped)."""
        return self.sent + self.dropped

    def row(self) -> dict:
        """A flat summary (one CSV/table row)."""
        r = {"label": self.label, "target": self.target.get("name", ""), "pattern": self.pattern.get("label", ""),
             "sent": self.sent, "ok": self.ok, "errors": self.error_count,
             "throughput": round(self.throughput, 2)}
        for k in ("mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms"):
            r[k] = round(self.latency.get(k, math.nan), 3)
        r["late"] = self.late if self.late is not None else ""
        r["dropped"] = self.dropped
        r["valid"] = "" if self.validity is None else ("yes" if self.valid else "no")
        srv = (self.server or {}).get("per_request_ms", {})
        for k in ("queue", "compute_input", "compute_infer", "compute_output"):
            r[f"server_{k}_ms"] = round(srv[k], 3) if k in srv else ""
        r["avg_batch"] = round(self.server["avg_batch_size"], 2) if self.server and self.server.get("avg_batch_size") else ""
        return r

    def to_dict(self, latencies: bool = True) -> dict:
        d = asdict(self)
        if not latencies:
            d.pop("latencies_ms")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Result":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


def save_json(results: Sequence[Result], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([r.to_dict() for r in results], indent=1, default=_jsonable))
    return path


def load_json(path: str | Path) -> list[Result]:
    return [Result.from_dict(d) for d in json.loads(Path(path).read_text())]


def save_csv(results: Sequence[Result], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [r.row() for r in results]
    with path.open("w", newline="") as f:
        if rows:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return path


def _jsonable(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


class Observer:
    """Hooks around the measured window (e.g. Triton statistics, metrics)."""

    async def before(self) -> None:  # after warm-up, just before measuring
        pass

    async def after(self, result: Result) -> None:  # fills in result.server etc.
        pass


class _Recorder:
    __slots__ = ("sched", "send", "done", "kinds", "errors", "t0")

    def __init__(self, t0: float):
        self.t0 = t0
        self.sched: list[float] = []
        self.send: list[float] = []
        self.done: list[float] = []
        self.kinds: list[str | None] = []
        self.errors = 0

    def add(self, sched: float, send: float, done: float, kind: str | None) -> None:
        self.sched.append(sched)
        self.send.append(send)
        self.done.append(done)
        self.kinds.append(kind)
        if kind is not None:
            self.errors += 1


async def _call(target: Target, session, i: int) -> str | None:
    try:
        return await target.call(session, i)
    except http.HTTPError as e:
        return e.kind
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a target bug or an unexpected transport error
        return type(e).__name__


class _Engine:
    def __init__(self, target: Target, pattern: Pattern, progress: bool | None, label: str):
        self.target, self.pattern, self.label = target, pattern, label
        self.progress_enabled = progress
        self.sessions: list = []   # every session opened, closed at the end
        self.server_pids = server_pids_of(target)
        self.idle: list = []       # open loop: sessions free for the next request

    async def _open_session(self):
        s = await self.target.open()
        self.sessions.append(s)
        return s

    # -- closed loop --------------------------------------------------------
    async def _closed_phase(self, workers: list, count: int | None, duration: float | None,
                            rec: _Recorder | None, prog: Progress | None) -> float:
        counter = iter(range(count)) if count is not None else itertools.count()
        deadline = (time.perf_counter() + duration) if duration else None
        perf = time.perf_counter

        async def worker(session):
            i = 0
            for i in counter:
                if deadline is not None and perf() >= deadline:
                    return
                ts = perf()
                kind = await _call(self.target, session, i)
                if rec is not None:
                    rec.add(ts, ts, perf(), kind)

        ticker = asyncio.ensure_future(self._tick(rec, prog)) if prog else None
        await asyncio.gather(*(worker(s) for s in workers))
        if ticker:
            ticker.cancel()
        return perf()

    # -- open loop ----------------------------------------------------------
    async def _open_phase(self, n: int, seed: int, rec: _Recorder | None, prog: Progress | None) -> tuple[float, int, int, int, int]:
        pat = self.pattern
        offs = schedule.offsets(pat.rate, n, pat.distribution, seed)
        loop = asyncio.get_running_loop()
        perf = time.perf_counter
        state = {"in_flight": 0, "max": 0}
        slot = asyncio.Event()
        tasks: set[asyncio.Task] = set()
        late_after = pat.late_after_ms / 1000.0
        late = held = dropped = 0

        async def one(session, i, t_sched, t_send):
            kind = await _call(self.target, session, i)
            t_done = perf()
            if rec is not None:
                rec.add(t_sched, t_send, t_done, kind)
            self.idle.append(session)
            state["in_flight"] -= 1
            slot.set()

        ticker = asyncio.ensure_future(self._tick(rec, prog)) if prog else None
        t0 = perf() + 0.005
        for i in range(n):
            t_sched = t0 + offs[i]
            delay = t_sched - perf()
            if delay > 0:
                await asyncio.sleep(delay)
            was_held = False
            if state["in_flight"] >= pat.max_in_flight:
                if pat.overflow == "drop":
                    dropped += 1
                    continue
                was_held = True
                while state["in_flight"] >= pat.max_in_flight:
                    slot.clear()
                    await slot.wait()
            session = self.idle.pop() if self.idle else await self._open_session()
            t_send = perf()
            if t_send - t_sched > late_after:
                late += 1
                held += was_held
            state["in_flight"] += 1
            state["max"] = max(state["max"], state["in_flight"])
            task = loop.create_task(one(session, i, t_sched, t_send))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
        if ticker:
            ticker.cancel()
        return perf(), late, state["max"], held, dropped

    async def _tick(self, rec: _Recorder | None, prog: Progress) -> None:
        while True:
            await asyncio.sleep(0.25)
            if rec is not None:
                prog.update(len(rec.kinds), rec.errors)

    # -- a whole run -----------------------------------------------------------
    async def run(self, observers: Sequence[Observer]) -> Result:
        pat = self.pattern
        started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        ticker = validity.LoopTicker(pat.late_after_ms)
        meter = validity.CPUMeter(self.server_pids)
        try:
            measure = self._measure_closed if pat.mode == "closed" else self._measure_open
            prog, rec, t0, t_end, late, max_seen, held, dropped = await measure(observers, meter, ticker)
            tick = await ticker.stop()
            cpu = meter.stop()
            prog.close()
        finally:
            await self._release(ticker)
        result = self._result(started, rec, t0, t_end, late, max_seen, held, dropped)
        result.validity = validity.assess(mode=pat.mode, sent=result.sent, late=late, held=held,
                                          ticker=tick, cpu=cpu, late_after_ms=pat.late_after_ms,
                                          p50_ms=result.latency.get("p50_ms")).as_dict()
        for o in observers:
            await o.after(result)
        return result

    async def _measure_closed(self, observers: Sequence[Observer], meter, ticker) -> tuple:
        pat = self.pattern
        workers = [await self._open_session() for _ in range(pat.concurrency)]
        if pat.warmup:
            await self._closed_phase(workers, pat.warmup, None, None, None)
        for o in observers:
            await o.before()
        prog = Progress(self.label, total=pat.requests, duration=pat.duration,
                        enabled=self.progress_enabled)
        meter.start()
        ticker.start()
        t0 = time.perf_counter()
        rec = _Recorder(t0)
        t_end = await self._closed_phase(workers, pat.requests, pat.duration, rec, prog)
        return prog, rec, t0, t_end, None, pat.concurrency, 0, 0

    async def _measure_open(self, observers: Sequence[Observer], meter, ticker) -> tuple:
        pat = self.pattern
        n = pat.measured_count()
        for _ in range(min(pat.max_in_flight, 4)):  # a few connections ready
            self.idle.append(await self._open_session())
        if pat.warmup:
            await self._open_phase(pat.warmup, pat.seed + 1, None, None)
        for o in observers:
            await o.before()
        prog = Progress(self.label, total=n, enabled=self.progress_enabled)
        meter.start()
        ticker.start()
        t0 = time.perf_counter()
        rec = _Recorder(t0)
        t_end, late, max_seen, held, dropped = await self._open_phase(n, pat.seed, rec, prog)
        return prog, rec, t0, t_end, late, max_seen, held, dropped

    async def _release(self, ticker) -> None:
        """Stop the loop ticker if still running and close every session."""
        if ticker._task is not None and not ticker._task.done():
            ticker._task.cancel()
        for s in self.sessions:
            try:
                await self.target.close(s)
            except Exception:
                pass

    def _result(self, started: str, rec: _Recorder, t0: float, t_end: float, late, max_seen: int,
                held: int, dropped: int) -> Result:
        pat = self.pattern
        # The measured window: from the first scheduled send to the last answer.
        first = min(rec.sched) if rec.sched else t0
        duration = max(t_end - first, 1e-9)
        ok_lat = [d - s for s, d, k in zip(rec.sched, rec.done, rec.kinds) if k is None]
        errors: dict[str, int] = {}
        for k in rec.kinds:
            if k is not None:
                errors[k] = errors.get(k, 0) + 1
        send_lag = None
        if pat.mode == "open" and rec.send:
            lags = [(b - a) * 1000 for a, b in zip(rec.sched, rec.send)]
            send_lag = {"mean_ms": sum(lags) / len(lags), "max_ms": max(lags)}
        pdict = asdict(pat)
        pdict["label"] = pat.label
        return Result(
            label=self.label, target=self.target.describe(), pattern=pdict, started_at=started,
            sent=len(rec.kinds), ok=len(ok_lat), errors=dict(sorted(errors.items())),
            duration_s=duration, throughput=len(ok_lat) / duration,
            latency=stats.summarize(ok_lat), latencies_ms=[x * 1000 for x in ok_lat],
            late=late, send_lag_ms=send_lag, max_in_flight_seen=max_seen, held=held, dropped=dropped,
        )


LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def server_pids_of(target: Target) -> list[int]:
    """The server's process, when it runs on this machine (found by the port it
    listens on); ``target.server_pids`` overrides. Empty when unknown (then
    other work on the machine cannot be told from the server's)."""
    pids = getattr(target, "server_pids", None)
    if pids is not None:
        return list(pids)
    url = (target.describe() or {}).get("url") or ""
    try:
        host, port, _ = http.split_url(url)
    except Exception:
        return []
    if host not in LOOPBACK:
        return []
    pid = validity.listening_pid(port)
    return [pid] if pid else []


async def arun(target: Target, pattern: Pattern, observers: Sequence[Observer] = (),
               label: str | None = None, progress: bool | None = None) -> Result:
    """Run one pattern against one target (coroutine).

    A duration-bounded run also gets a watchdog: duration plus two request
    timeouts plus a minute. Past that something stalled (client or server),
    and the run fails with a clear error instead of hanging the caller."""
    run = _Engine(target, pattern, progress, label or pattern.label).run(list(observers))
    if pattern.duration is None:
        return await run
    limit = pattern.duration + 2 * float(getattr(target, "timeout", 30.0)) + 60.0
    try:
        return await asyncio.wait_for(run, limit)
    except asyncio.TimeoutError:
        raise RuntimeError(
            f"{label or pattern.label}: no result within {limit:.0f} s for a {pattern.duration:g} s run; "
            "the client or the server stalled") from None


def run(target: Target, pattern: Pattern, observers: Sequence[Observer] = (),
        label: str | None = None, progress: bool | None = None) -> Result:
    """Run one pattern against one target and return its ``Result``.

    ``progress=None`` shows a progress bar on stderr when it is a terminal.
    """
    return run_coroutine(arun(target, pattern, observers, label, progress))


def run_checked(target: Target, pattern: Pattern, observers_factory=None, label: str | None = None,
                progress: bool | None = None, attempts: int = 3, pause_s: float = 1.0,
                log=None) -> Result:
    """Run, and repeat while the run is invalid (at most ``attempts`` runs).

    Returns the first valid run, or the last one: then ``result.valid`` is
    False and its verdict reads "inconclusive: the machine was busy".
    ``result.attempts`` says how many runs it took; the reasons of the
    earlier invalid runs are kept in ``result.extra["invalid_attempts"]``."""
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    earlier: list[dict] = []
    for i in range(attempts):
        obs = observers_factory() if observers_factory else ()
        r = run(target, pattern, obs, label, progress)
        r.attempts = i + 1
        if earlier:
            r.extra["invalid_attempts"] = earlier
        if r.valid:
            return r
        earlier = earlier + [{"reasons": r.validity.get("reasons", []), "p50_ms": r.latency.get("p50_ms"),
                              "mean_ms": r.latency.get("mean_ms")}]
        if log is not None:
            log(f"    {r.label}: invalid run ({'; '.join(r.validity.get('reasons', []))})"
                + (", repeating" if i + 1 < attempts else f"; {validity.INCONCLUSIVE}"))
        if i + 1 < attempts:
            time.sleep(pause_s)
    return r


def warm(target: Target, requests: int = 8, concurrency: int = 1, timeout: float | None = None) -> Result:
    """Send unmeasured requests: after a start or a reload, so that each model
    instance has run (and allocated, compiled, paged in) before anything is
    timed. Use ``concurrency`` >= the number of instances so every instance
    gets work. Returns the warm-up run (its latencies show the cold start)."""
    pat = Pattern("closed", max(1, concurrency), requests=max(requests, concurrency), warmup=0,
                  timeout=timeout or float(getattr(target, "timeout", 30.0)))
    return run(target, pat, (), "warm-up", progress=False)


def sweep(target: Target, patterns: Iterable[Pattern], observers_factory=None,
          progress: bool | None = None, label_prefix: str = "") -> list[Result]:
    """Run several patterns one after another (e.g. concurrency 1, 8, 16)."""
    out = []
    for p in patterns:
        obs = observers_factory() if observers_factory else ()
        out.append(run(target, p, obs, f"{label_prefix}{p.label}", progress))
    return out
