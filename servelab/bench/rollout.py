"""A version rollout under load: ``v1 -> v1 + v2 -> v2`` while a Poisson
stream of requests runs, counting what each version served.

``rollout(url, model, rate=..., seconds=...)`` starts an open-loop Poisson
load on ``model`` (no version named: Triton sends each request to the highest
version it serves). A third of the way in it loads version ``new`` beside
``old`` (``version_policy { specific { versions: [old, new] } }``); two thirds
of the way in it unloads ``old`` (``versions: [new]``). Triton keeps serving
from the loaded version until the new one is ready and lets the old one
finish its requests before it unloads it, so no request should fail.

Two counts per version:

* ``per_version``: every successful answer names the version that computed
  it (``model_version`` in Triton's response): the client's tally;
* ``stats_per_version``: Triton's per-version statistics
  (``/v2/models/<m>/versions/<v>/stats``), as differences of snapshots taken
  around each switch. A config edit reloads *every* version it keeps, and a
  reloaded version's statistics start again from zero, so what a version
  served while its own reload ran is in no snapshot: ``unseen_by_stats``.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

from servelab.bench.load import run
from servelab.bench.patterns import open_loop
from servelab.bench.targets import triton_target
from servelab.bench.warmup import _grpc_url


def _policy(*versions: int) -> dict:
    return {"version_policy": {"specific": {"versions": [int(v) for v in versions]}}}


def _success(url: str, model: str, version: int) -> int:
    from servelab.triton.stats import snapshot

    return int(snapshot(url, model, version)["inference_stats"]["success"]["count"])


def set_versions(model: str, *versions: int, grpc_url: str, admin_key: str | None = None,
                 timeout: float = 180.0) -> dict:
    """Serve exactly ``versions`` of ``model`` (a config edit and a load); returns the new config."""
    from servelab.triton import control

    return control.reload_model(model, _policy(*versions), grpc_url=grpc_url, admin_key=admin_key,
                                timeout=timeout, verbose=False)


class _VersionTally:
    """A load-generator check that counts the ``model_version`` of every answer."""

    def __init__(self):
        self.counts: Counter = Counter()
        self.lock = threading.Lock()

    def __call__(self, resp) -> bool:
        n = int(resp.headers.get("inference-header-content-length", len(resp.body)))
        try:
            version = int(json.loads(resp.body[:n])["model_version"])
        except (ValueError, KeyError):
            return False
        with self.lock:
            self.counts[version] += 1
        return True


class _StatsPoller:
    """Polls each version's ``success`` count (every ``every_s``) and adds up
    what each lifetime of it served: when a count drops, the version was
    reloaded and its statistics started again, from its warm-up requests."""

    def __init__(self, url: str, model: str, versions, warmup: int, every_s: float = 0.05):
        self.url, self.model, self.versions, self.warmup, self.every_s = url, model, versions, warmup, every_s
        self.total: Counter = Counter()
        self.last: dict[int, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="rollout-stats", daemon=True)

    def _counts(self) -> dict[int, int]:
        counts = {}
        for v in self.versions:
            try:
                counts[v] = _success(self.url, self.model, v)
            except Exception:  # not loaded now
                pass
        return counts

    def poll(self) -> None:
        for v, count in self._counts().items():
            last = self.last.get(v)
            if last is None or count < last:  # loaded since the last poll, or reloaded: a new lifetime
                last = self.warmup
            self.total[v] += max(0, count - last)
            self.last[v] = count

    def _loop(self):
        while not self.stop.is_set():
            self.poll()
            time.sleep(self.every_s)

    def __enter__(self):
        self.last = self._counts()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.poll()


def _warmup_requests(config: dict) -> int:
    """Successful requests a (re)load's model_warmup adds to a version's statistics."""
    from servelab.triton.config import instance_count

    per_instance = sum(max(1, int(w.get("batch_size", 0) or 0)) * max(1, int(w.get("count", 0) or 0))
                       for w in config.get("model_warmup") or [])
    return per_instance * instance_count(config)


def rollout(url: str, model: str = "food_classifier_onnx", *, rate: float = 20.0, seconds: float = 12.0,
            old: int = 1, new: int = 2, grpc_url: str | None = None, admin_key: str | None = None,
            seed: int = 7, limit_s: float = 300.0) -> dict:
    """Returns ``results`` (the load's bench Results: the run, then any extension), ``sent``,
    ``failed``, ``ok``, ``per_version`` (client tally), ``stats_per_version`` (Triton's statistics),
    ``unseen_by_stats``, ``events`` (what happened when, in seconds) and ``seconds`` (how long the
    load ran).

    The load runs ``seconds``, and goes on in segments of ``seconds / 4`` while the switches are still
    running and until the new version has served alone for ``seconds / 4``: a slow load of the new
    version (a busy machine; at the reduced scale it took 4.6 s of an 8 s run in the compose check,
    2026-11-27) must not end the run before that version answered. At most ``limit_s`` in all."""
    grpc_url = _grpc_url(url, grpc_url)
    config = set_versions(model, old, grpc_url=grpc_url, admin_key=admin_key)  # the old version alone
    target = triton_target(url, model)
    tally = _VersionTally()
    target.check = tally
    events: list[tuple[str, float]] = []
    failures: list[BaseException] = []
    gone: list[float] = []
    t0 = time.perf_counter()

    def at(label):
        events.append((label, round(time.perf_counter() - t0, 2)))

    def switch():
        try:
            time.sleep(seconds / 4)
            at(f"load v{new} beside v{old}")
            set_versions(model, old, new, grpc_url=grpc_url, admin_key=admin_key)
            at(f"v{new} ready: it takes the requests")
            time.sleep(seconds / 4)
            at(f"unload v{old}")
            set_versions(model, new, grpc_url=grpc_url, admin_key=admin_key)
            at(f"v{old} gone")
            gone.append(time.perf_counter())
        except BaseException as err:  # reported after the load ends
            failures.append(err)

    def going_on() -> bool:
        if failures or time.perf_counter() - t0 > limit_s:
            return False
        return thread.is_alive() or (bool(gone) and time.perf_counter() - gone[0] < seconds / 4)

    label = f"rollout v{old} -> v{new}"
    with _StatsPoller(url, model, (old, new), _warmup_requests(config)) as stats:
        thread = threading.Thread(target=switch, name="rollout", daemon=True)
        thread.start()
        results = [run(target, open_loop(rate, "poisson", duration=seconds, seed=seed), label=label, progress=False)]
        while going_on():
            results.append(run(target, open_loop(rate, "poisson", duration=seconds / 4, seed=seed + len(results)),
                               label=label, progress=False))
        at("Poisson load ends" + (f" (run {len(results) - 1} time(s) longer, until v{new} served alone)"
                                  if len(results) > 1 else ""))
        thread.join(timeout=limit_s)
    if failures:
        raise failures[0]
    per_version = dict(sorted(tally.counts.items()))
    stats_per_version = {v: stats.total[v] for v in (old, new)}
    ok = sum(r.ok for r in results)
    return {"results": results, "sent": sum(r.sent for r in results), "failed": sum(r.error_count for r in results),
            "ok": ok, "per_version": per_version, "stats_per_version": stats_per_version,
            "unseen_by_stats": sum(per_version.values()) - sum(stats_per_version.values()), "events": events,
            "seconds": events[-1][1]}
