"""The skeleton every ``benchmarks/*.py`` shares: arguments, timing, JSON.

A benchmark is a script that prints figures (never a test). It uses::

    from servelab.bench import script

    def main(argv=None) -> int:
        ap = script.Parser(__doc__, rounds=3)                  # --rounds, --quick | --tiny, --json
        ap.sized("--requests", type=int, full=100, quick=30, tiny=4, help="...")
        args = ap.parse_args(argv)                             # args.size: "full" | "quick" | "tiny"
        lat = script.time_loop(fn, args.requests, warmup=10)   # script.summary(latencies_s, wall_s)
        script.write_json(args.json, {...})                    # no-op when --json was not given
        return 0

    if __name__ == "__main__":
        script.run(main)                                       # SIGTERM unwinds `finally` blocks

``--tiny`` is for the smoke test (tests/bench/test_benchmarks_smoke.py: every
benchmark runs in seconds and prints all its rows); ``--quick`` for a rough
look; neither gives figures worth quoting. A flag given explicitly wins over
the preset. Percentiles come from :mod:`servelab.bench.stats` only.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from servelab.bench import stats

SIZES = ("full", "quick", "tiny")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser with the common flags and size presets.

    ``doc`` is the module docstring: its first paragraph is the description.
    ``rounds`` (the full-size default) adds ``--rounds`` (at most 2 with --quick, 1 with --tiny); ``json_flag`` adds ``--json PATH``
    (``args.json`` is None without it).
    """

    def __init__(self, doc: str | None, *, rounds: int | None = None, json_flag: bool = True, **kw):
        super().__init__(description=(doc or "").strip().split("\n\n")[0], **kw)
        self._sized: dict[str, dict[str, Any]] = {}
        if rounds is not None:
            self.sized("--rounds", type=int, full=rounds, quick=min(rounds, 2), tiny=1,
                       help="repeat the measurements")
        size = self.add_mutually_exclusive_group()
        size.add_argument("--quick", dest="size", action="store_const", const="quick", default="full",
                          help="smaller sizes: a rough look, not figures to quote")
        size.add_argument("--tiny", dest="size", action="store_const", const="tiny",
                          help="the smallest sizes: checks the script runs (the smoke test)")
        if json_flag:
            self.add_argument("--json", type=Path, default=None, metavar="PATH",
                              help="also write the figures here as JSON")

    def sized(self, *flags: str, full: Any, quick: Any = None, tiny: Any = None, **kw) -> argparse.Action:
        """Add an option whose default depends on --quick/--tiny (``full`` otherwise)."""
        presets = {"full": full, "quick": full if quick is None else quick}
        presets["tiny"] = presets["quick"] if tiny is None else tiny
        help_ = kw.pop("help", "")
        kw["help"] = (help_ + " " if help_ else "") + "(default {full}; --quick {quick}; --tiny {tiny})".format(**presets)
        action = self.add_argument(*flags, default=None, **kw)
        self._sized[action.dest] = presets
        return action

    def parse_args(self, args: Sequence[str] | None = None, namespace=None):  # type: ignore[override]
        ns = super().parse_args(args, namespace)
        for dest, presets in self._sized.items():
            if getattr(ns, dest) is None:
                setattr(ns, dest, presets[ns.size])
        if getattr(ns, "rounds", 1) < 1:
            self.error("--rounds must be at least 1")
        return ns


def summary(latencies_s: Sequence[float], wall_s: float | None = None) -> dict[str, float]:
    """Latency summary in ms (:func:`stats.summarize`: count, mean, p50/p90/p95/p99, ...),
    plus ``throughput`` (count / ``wall_s``, per second) when ``wall_s`` is given."""
    out = stats.summarize(latencies_s)
    if wall_s is not None:
        out["throughput"] = out["count"] / wall_s if wall_s > 0 else math.nan
    return out


def time_loop(fn: Callable[[], Any], n: int, warmup: int = 10) -> dict[str, float]:
    """Call ``fn`` ``warmup`` times untimed, then ``n`` times, one after another;
    :func:`summary` of the ``n`` calls."""
    for _ in range(warmup):
        fn()
    lat = []
    start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t0)
    return summary(lat, time.perf_counter() - start)


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds`` (wall) and ``sw.cpu_seconds`` (this process)."""

    def __enter__(self) -> "Stopwatch":
        self._t0, self._c0 = time.perf_counter(), time.process_time()
        self.seconds = self.cpu_seconds = math.nan
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._t0
        self.cpu_seconds = time.process_time() - self._c0


def best(runs: Iterable[dict], key: str = "throughput") -> dict:
    """The run with the highest ``key``: other load on the machine can only slow a round down."""
    return max(runs, key=lambda r: r[key])


def write_json(path: Path | str | None, data: Any) -> Path | None:
    """Write ``data`` as indented JSON to ``path`` (parents created); nothing when ``path`` is None."""
    if path is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


def _unwind_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through `finally`, which stops the servers


def run(main: Callable[..., int | None]) -> None:
    """Entry point: SIGTERM unwinds like Ctrl-C (servers started in ``with``/``finally`` stop),
    then exit with ``main()``'s status."""
    signal.signal(signal.SIGTERM, _unwind_on_sigterm)
    sys.exit(main())
