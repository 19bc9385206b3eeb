"""The rules of tests/bench/figures.py, on saved ``--tiny`` runs of each benchmark (tests/bench/tiny/:
its JSON, what it printed, its exit status; recorded 2026-11-27 on a shared 2-core machine,
bench_naive's again 2026-11-29 when its sequential figures began to pool their rounds, and again
when its rows began to be judged by pairs of runs) and on copies with one figure changed: a rule
that passes a contradiction would let the smoke test (tests/bench/test_benchmarks_smoke.py,
~3 minutes of runs) pass one too."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.bench import figures

SAVED = Path(__file__).resolve().parent / "tiny"


def saved(name: str) -> tuple[dict, str, int]:
    stem = SAVED / name.removesuffix(".py")
    return (json.loads(stem.with_suffix(".json").read_text()), stem.with_suffix(".out").read_text(),
            int(stem.with_suffix(".rc").read_text()))


@pytest.mark.parametrize("name", sorted(figures.PROBLEMS))
def test_saved_runs_have_consistent_figures(name):
    data, stdout, rc = saved(name)
    assert figures.PROBLEMS[name](data, stdout, rc) == []


def _first_fastapi_ratio(d):
    name = next(iter(d["ratios"]))
    d["ratios"][name] *= 1.5
    return name


# (benchmark, what is changed, a word the problem must name)
PLANTS = [
    ("bench_fastapi.py", _first_fastapi_ratio, "ratio"),
    ("bench_fastapi.py", lambda d: d["results"]["pt_seq"][0].update(p99_ms=d["results"]["pt_seq"][0]["p50_ms"] / 2),
     "out of order"),
    ("bench_fastapi.py", lambda d: d["results"]["onnx_conc"][0].update(throughput=float("nan")), "throughput"),
    ("bench_harness.py", lambda d: d.update(closed_best_rps=d["closed_best_rps"] * 2), "closed_best_rps"),
    ("bench_harness.py", lambda d: d.update(**{"pass": not d["pass"]}), "printed"),
    ("bench_triton.py", lambda d: d["counts"].update(ratio=d["counts"]["ratio"] + 0.5), "count ratio"),
    ("bench_triton.py", lambda d: d["onnx"]["runs"]["preferred8/grpc"].update(infer_per_s=0.0), "infer_per_s"),
    ("soak.py", lambda d: d["records"][0].update(ok=d["records"][0]["ok"] - 1), "sent"),
    ("lesson_stability.py", lambda d: next(iter(d["idle"]["checks"].values())).update(inconclusive=5), "rounds"),
    ("reload_under_load.py", lambda d: d["reloads"][1].update(duration_s=d["reloads"][1]["duration_s"] + 1), "reload 2"),
    ("reload_under_load.py", lambda d: d.update(failed=d["failed"] + 1), "verdict"),
    ("bench_streaming.py", lambda d: d["runs"][0].update(completed=d["runs"][0]["requests"] + 1), "completed"),
    ("bench_streaming.py", lambda d: d["runs"][1].update(ttft_p99_ms=d["runs"][1]["ttft_p50_ms"] / 2), "TTFT"),
    ("bench_streaming.py", lambda d: d["failed"].append("a planted failure"), "verdict"),
    ("bench_streaming.py", lambda d: d["ratios"][0].update(ttft_mean=d["ratios"][0]["ttft_mean"] * 2), "quotient"),
    ("bench_naive.py", lambda d: d["rows"][0].update(value=d["rows"][0]["value"] * 2), "its figures give"),
    ("bench_naive.py", lambda d: d["fastapi"]["kit_pt/seq"].update(throughput=d["fastapi"]["kit_pt/seq"]["throughput"] / 2),
     "summed latency"),
    ("bench_naive.py", lambda d: d["fastapi"]["kit_pt/c16"].update(throughput=d["fastapi"]["kit_pt/c16"]["throughput"] / 2),
     "best of its runs"),
    ("bench_naive.py", lambda d: d["rows"][-1].update(verdict="PASS" if d["rows"][-1]["verdict"] != "PASS" else "FAIL"),
     "says"),
]


@pytest.mark.parametrize("name, plant, word", PLANTS, ids=[f"{n}-{w}" for n, _, w in PLANTS])
def test_a_contradiction_is_named(name, plant, word):
    data, stdout, rc = saved(name)
    changed = copy.deepcopy(data)
    plant(changed)
    problems = figures.PROBLEMS[name](changed, stdout, rc)
    assert any(word in p for p in problems), problems


def test_a_printed_figure_that_differs_from_the_json_is_named():
    data, stdout, rc = saved("bench_triton.py")
    c = data["counts"]
    printed = f"= {c['count2_infer_per_s']:.1f} / {c['count1_infer_per_s']:.1f} = {c['ratio']:.2f}"
    assert printed in stdout
    problems = figures.bench_triton(data, stdout.replace(printed, f"= {c['count2_infer_per_s'] + 1:.1f} / "
                                                                 f"{c['count1_infer_per_s']:.1f} = {c['ratio']:.2f}"), rc)
    assert any("printed count line" in p for p in problems), problems


@pytest.mark.parametrize("value, target, verdict", [
    (0.96, ">= 0.95", "PASS"), (0.94, ">= 0.95", "FAIL"), (1.5, "<= 2", "PASS"), (2.5, "<= 2", "FAIL"),
    (1.2, "0.85 - 1.15", "FAIL"), (1.0, "0.85 - 1.15", "PASS"), (float("nan"), ">= 1.0", "INCONCLUSIVE"),
])
def test_verdict_for_reads_the_targets_as_printed(value, target, verdict):
    assert figures.verdict_for(value, target) == verdict
