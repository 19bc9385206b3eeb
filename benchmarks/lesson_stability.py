"""Lesson stability: run the tour's experiments K times back to back and print, for every lesson check, how often it passed, and for every run whether it was valid.

On an idle machine every check should pass K of K. With ``--hog`` a second set
of K rounds runs while this script keeps one core busy (a spinning process
pinned to CPU 0): then no check may report a wrong conclusion as ✔ - each is
either right or marked inconclusive (its runs invalid: the machine was busy).

    python benchmarks/lesson_stability.py                 # 5 rounds, full tour each (~4 min a round)
    python benchmarks/lesson_stability.py --rounds 3 --hog
    python benchmarks/lesson_stability.py --rounds 3 --hog-only  # the hog rounds alone
    python benchmarks/lesson_stability.py --quick         # 2 rounds at scale 0.3
    python benchmarks/lesson_stability.py --tiny          # 1 round, FastAPI part only, tiny scale
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from pathlib import Path

from servelab.bench import load, script
from servelab.measure import evidence, tour

FULL = ("fastapi_pt", "fastapi_onnx", "triton", "flask")


def _spin(seconds: float) -> None:  # pragma: no cover - runs in the hog process
    try:
        os.sched_setaffinity(0, {0})
    except (AttributeError, OSError):
        pass
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _tour(scale: float, out: str, components, quiet: bool) -> None:  # pragma: no cover - child process
    lines: list[str] = []
    tour.run_tour(tour.TourConfig(scale=scale, out=Path(out)), log=lines.append if quiet else print,
                  components=components)


def one_round(scale: float, components, hog: bool, quiet: bool = True) -> dict:
    """One tour in a fresh interpreter, as `make demo` runs it: the client's
    figures must not depend on what earlier rounds left in this process (in
    one process the rate the tour picks fell round after round)."""
    proc = None
    if hog:
        proc = multiprocessing.Process(target=_spin, args=(3600,), daemon=True)
        proc.start()
    try:
        with tempfile.TemporaryDirectory(prefix="servelab-stability-") as d:
            child = multiprocessing.get_context("spawn").Process(target=_tour, args=(scale, d, components, quiet))
            child.start()
            child.join()
            if child.exitcode != 0:
                raise RuntimeError(f"the tour failed (exit code {child.exitcode})")
            import json
            checks = json.loads((Path(d) / "checks.json").read_text())
            results = load.load_json(Path(d) / "results.json")
    finally:
        if proc is not None:
            proc.terminate()
            proc.join(5)
    return {"checks": checks,
            "runs": [{"label": r.label, "valid": r.valid, "attempts": r.attempts,
                      "reasons": (r.validity or {}).get("reasons", [])} for r in results]}


def summarize(rounds: list[dict], title: str) -> dict:
    k = len(rounds)
    print(f"\n{title}: {k} round(s)")
    table: dict[str, dict] = {}
    for rd in rounds:
        for c in rd["checks"]:
            row = table.setdefault(c["key"], {"expect": c["expect"], "pass": 0, "fail": 0, "inconclusive": 0,
                                              "pass_with_invalid_runs": 0})
            row[c["status"]] += 1
    print(f"  {'check':<22} {'pass/K':>7} {'✘':>3} {'inconcl.':>8}  lesson")
    for key, row in table.items():
        print(f"  {key:<22} {row['pass']:>3}/{k:<3} {row['fail']:>3} {row['inconclusive']:>8}  {row['expect'][:90]}")
    print(f"\n  {'run':<52} " + " ".join(f"r{i + 1:<3}" for i in range(k)))
    labels = list(dict.fromkeys(r["label"] for rd in rounds for r in rd["runs"]))
    for label in labels:
        cells = []
        for rd in rounds:
            r = next((x for x in rd["runs"] if x["label"] == label), None)
            cells.append("-   " if r is None else ("ok  " if r["valid"] else "inv "))
        print(f"  {label[:52]:<52} " + " ".join(cells))
    n_runs = sum(len(rd["runs"]) for rd in rounds)
    n_valid = sum(r["valid"] for rd in rounds for r in rd["runs"])
    print(f"  valid runs: {n_valid} of {n_runs}")
    return table


def main(argv=None) -> int:
    ap = script.Parser(__doc__, rounds=5)
    ap.sized("--scale", type=float, full=1.0, quick=0.3, tiny=0.05, help="tour scale of each round")
    ap.add_argument("--hog", action="store_true", help="also run the rounds with one core kept busy")
    ap.add_argument("--hog-only", action="store_true", help="only the rounds with one core kept busy")
    ap.add_argument("--verbose", action="store_true", help="print the tours' own output")
    args = ap.parse_args(argv)
    components = ("fastapi_pt", "fastapi_onnx") if args.size == "tiny" else FULL
    out: dict = {"scale": args.scale, "rounds": args.rounds, "components": list(components)}
    sets = ([] if args.hog_only else [("idle", False)]) + \
        ([("cpu hog on one core", True)] if args.hog or args.hog_only else [])
    verdict = 0
    for name, hog in sets:
        rounds = []
        for i in range(args.rounds):
            print(f"[{name}] round {i + 1}/{args.rounds} ...", flush=True)
            rounds.append(one_round(args.scale, components, hog, quiet=not args.verbose))
        table = summarize(rounds, f"Lesson checks, {name}")
        out[name] = {"rounds": rounds, "checks": table}
        if hog:
            # a ✘ under the hog is a wrong conclusion shown as measured (a ✔ needs valid runs by construction)
            wrong = sum(row["fail"] for row in table.values())
            print(f"  with the hog: {wrong} check result(s) ✘ rather than right or inconclusive")
        else:
            short = [k for k, row in table.items() if row["pass"] < args.rounds]
            print("  every check passed every round" if not short else
                  f"  checks short of {args.rounds}/{args.rounds}: {', '.join(short)} "
                  f"(see inconclusive counts: a busy machine shows as inconclusive)")
    script.write_json(args.json, out)
    print(f"\n{evidence.SYMBOL[evidence.PASS]} = passed; inconclusive = a run it rests on was invalid "
          "(late sends, saturated client, or other work on the machine)")
    return verdict


if __name__ == "__main__":
    script.run(main)
