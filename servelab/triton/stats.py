"""Triton's per-model statistics: one snapshot, one delta, one vocabulary.

Triton's ``/v2/models/<m>[/versions/<v>]/stats`` counters are cumulative
since the model loaded (and survive an identical-config reload), so one
run's figures come from the difference of two snapshots taken just before
and just after it::

    before = triton.snapshot(url, model)
    ...                                   # the run
    d = triton.stats_delta(before, triton.snapshot(url, model))
    d["avg_batch_size"], d["batch_histogram"], d["per_request_ms"]["queue"]

Per-request times divide each phase's nanoseconds by its count; the
batch-size histogram counts executions per batch size from ``batch_stats``.
``servelab.bench.triton`` takes the same snapshots asynchronously around a
load-generator run (``TritonObserver``) and puts the delta in ``Result.server``.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Mapping
from urllib.parse import urlsplit

PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def stats_path(model: str, version: str | int | None = None) -> str:
    v = f"/versions/{version}" if version not in (None, "") else ""
    return f"/v2/models/{model}{v}/stats"


def base_url(url: str) -> str:
    """``host:port``, ``http://host:port`` or a longer URL → ``http://host:port``."""
    parts = urlsplit(url if "://" in url else "http://" + url)
    return f"{parts.scheme}://{parts.netloc}"


def pick(doc: Mapping, model: str, version: str | int | None = None) -> dict:
    """The entry for ``model`` (and ``version``) in a ``/stats`` answer."""
    entries = [e for e in doc.get("model_stats", []) if e.get("name") == model]
    if version not in (None, ""):
        entries = [e for e in entries if str(e.get("version")) == str(version)] or entries
    if not entries:
        raise LookupError(f"no statistics for model {model!r} (is it loaded?)")
    return entries[0]


def snapshot(url: str, model: str, version: str | int | None = None, timeout: float = 10.0) -> dict:
    """The model's cumulative statistics now. ``url`` is Triton's HTTP
    address (``host:port`` or ``http://host:port``)."""
    with urllib.request.urlopen(base_url(url) + stats_path(model, version), timeout=timeout) as r:
        return pick(json.loads(r.read()), model, version)


def success(snap: Mapping) -> int:
    """The successful requests a snapshot counts."""
    return int(snap.get("inference_stats", {}).get("success", {}).get("count", 0))


def _counts(snap: Mapping) -> tuple[int, ...]:
    inf = snap.get("inference_stats", {})
    return (success(snap), int(snap.get("execution_count", 0)),
            *(int(inf.get(k, {}).get("count", 0)) for k in ("fail", "cache_hit", "cache_miss")))


def settled(url: str, model: str, version: str | int | None = None, at_least: int = 0,
            limit_s: float = 2.0) -> dict:
    """``snapshot``, once Triton has finished counting. Triton counts a request, and its
    execution, a moment *after* its response has left, so a snapshot taken at once can miss the
    last answers (CI, 2026-11-30: 15 executions read for 16 cache misses). Poll until no count
    moves between two reads and the successes number at least ``at_least`` (``limit_s`` at
    most: other clients, or failed requests, may keep them apart)."""
    deadline = time.perf_counter() + limit_s
    prev = snapshot(url, model, version)
    while time.perf_counter() < deadline:
        time.sleep(0.05)
        now = snapshot(url, model, version)
        if _counts(now) == _counts(prev) and success(now) >= at_least:
            return now
        prev = now
    return prev


def _d(after: Mapping, before: Mapping, *keys) -> int:
    a, b = after, before
    for k in keys:
        a, b = (a or {}).get(k, {}), (b or {}).get(k, {})
    return int(a or 0) - int(b or 0)


def _per_request_ms(ia: Mapping, ib: Mapping) -> dict:
    per_req = {}
    for ph in PHASES:
        n = _d(ia, ib, ph, "count")
        if n > 0:
            per_req[ph] = _d(ia, ib, ph, "ns") / n / 1e6
    n = _d(ia, ib, "success", "count")
    if n > 0:
        per_req["total"] = _d(ia, ib, "success", "ns") / n / 1e6
    return per_req


def _per_batch(before: Mapping, after: Mapping) -> tuple[dict, dict]:
    bb = {e["batch_size"]: e for e in before.get("batch_stats", [])}
    hist, per_batch = {}, {}
    for e in after.get("batch_stats", []):
        b = int(e["batch_size"])
        prev = bb.get(e["batch_size"], {})
        n = _d(e, prev, "compute_infer", "count")
        if n <= 0:
            continue
        hist[b] = n
        ns = sum(_d(e, prev, ph, "ns") for ph in ("compute_input", "compute_infer", "compute_output"))
        per_batch[b] = ns / n / 1e6
    return dict(sorted(hist.items())), dict(sorted(per_batch.items()))


def stats_delta(before: Mapping, after: Mapping) -> dict:
    """What happened between two snapshots of one model's statistics.

    Returns counts (``requests`` = successful requests, ``failures``,
    ``inferences`` = images, ``executions`` = batches run),
    ``avg_batch_size`` (None without executions), ``per_request_ms``
    (mean queue / compute_input / compute_infer / compute_output per
    request, and ``total`` = server time of a successful request; a phase
    nothing went through is absent), ``batch_histogram`` ({batch_size:
    executions}) and ``per_batch_ms`` ({batch_size: mean compute time of one
    execution, input+infer+output}).
    """
    ib, ia = before.get("inference_stats", {}), after.get("inference_stats", {})
    out = {
        "model": after.get("name"), "version": after.get("version"),
        "requests": _d(ia, ib, "success", "count"),
        "failures": _d(ia, ib, "fail", "count"),
        "inferences": _d(after, before, "inference_count"),
        "executions": _d(after, before, "execution_count"),
    }
    out["avg_batch_size"] = out["inferences"] / out["executions"] if out["executions"] else None
    out["per_request_ms"] = _per_request_ms(ia, ib)
    out["batch_histogram"], out["per_batch_ms"] = _per_batch(before, after)
    return out
