"""Every ``benchmarks/*.py`` runs with ``--tiny`` (the skeleton's smallest
sizes) and prints every row and JSON field it promises.

The figures from tiny runs on a shared machine say nothing about their size,
so nothing here judges it (a benchmark's own PASS/FAIL verdict on its targets
may go either way; a traceback may not). What the figures must be whatever the
machine is checked (tests/bench/figures.py): finite and positive, counts that
add up, ratios that are the quotients of the figures they name, verdicts that
follow from their values, the printed table equal to the JSON. A new benchmark
must add its rows to ``EXPECTED`` (the test fails for a script it does not know)
and its figures' rules to ``figures.PROBLEMS``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import tiers
from tests.bench import figures

# Each benchmark's run is long and shares nothing with the others: `make test`'s workers take them one by
# one (tests/schedule.py).
pytestmark = pytest.mark.spread

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py"))


def _aiohttp() -> bool:
    try:
        import aiohttp  # noqa: F401  (only the harness's yardstick)
    except ImportError:
        return False
    return True


# script -> (extra arguments, exit codes allowed, lines that must be printed, JSON check)
EXPECTED = {
    "bench_fastapi.py": (
        [], {0},
        ["raw ONNX Runtime, batch 1, 1 thread(s)", "raw PyTorch, batch 1, 1 thread(s)",
         "FastAPI ONNX, sequential", "FastAPI ONNX, 2 concurrent", "FastAPI PyTorch, sequential",
         "FastAPI PyTorch, 2 concurrent", "FastAPI ONNX 2 conc / raw ORT batch-1",
         "FastAPI PyTorch 2 conc / its sequential", "FastAPI PyTorch 2 conc / raw PyTorch batch-1"],
        lambda d: (set(d) == {"results", "health", "ratios"} and len(d["ratios"]) == 3
                   and {"onnx_seq", "onnx_conc", "pt_seq", "pt_conc", "raw_onnx_t1", "raw_torch_t1"}
                   <= set(d["results"])
                   and all(r["count"] > 0 and r["throughput"] > 0 and "p99_ms" in r
                           for runs in d["results"].values() for r in runs)),
    ),
    "bench_naive.py": (
        [], {0},
        ["reference plain: shares nothing with the kit", "reference shared: the kit's decoding and preprocessing",
         "[1] Triton Python backend", "plain c1", "shared c1", "kit count1 c1", "plain c8", "shared c8",
         "kit count1 c8", "kit count2 c1", "kit count2 c8", "plain count2 default threads c8",
         "shared count2 default threads c8", "plain count2 1 thread c8", "shared count2 1 thread c8",
         "[2] Triton ONNX", "ONNX c16 http ", "ONNX c16 http+shm", "[3] FastAPI", "kit_onnx    seq",
         "plain_onnx  seq", "shared_onnx seq", "kit_pt      c16", "plain_pt    c16", "shared_pt   c16",
         "[4] idle CPU", "tritonserver", "Targets (issues 14, 36)",
         *(f"{row} / {ref}{tail}" for ref in ("plain", "shared")
           for row, tail in (("Triton food_classifier count 1", ", concurrency 1"),
                             ("Triton food_classifier count 1", ", concurrency 8"),
                             ("count 2", " count 2 (best thread setting), concurrency 8"),
                             ("FastAPI ONNX sequential", ""), ("FastAPI PyTorch sequential", ""),
                             ("FastAPI ONNX 16 clients", ""), ("FastAPI PyTorch 16 clients", ""))),
         "count 2 / count 1, concurrency 8", "count 2 / count 1, concurrency 1",
         "CPU of the busiest idle server process", "Triton ONNX + dynamic batching c16, HTTP / raw ORT b16",
         "Triton ONNX + dynamic batching c16, HTTP+shm / raw ORT b16"],
        lambda d: (len(d["rows"]) == 19 and all(r["verdict"] in ("PASS", "FAIL") or r["verdict"].startswith("INCONCLUSIVE")
                                                for r in d["rows"])
                   and len(d["idle_cpu_percent"]) >= 9),  # 6 uvicorns, tritonserver, >= 2 stubs
    ),
    "bench_harness.py": (
        [], {0, 1},  # 1: a target missed (tiny runs are too short to sustain a rate)
        [f"{kind:<10} {name}" for kind in ("raw", "uvicorn")
         for name in ("bench closed C=1 ", "bench closed C=16", "bench closed C=64",
                      "bench open 2000/s constant", "bench open 2000/s poisson")]
        + (["aiohttp closed C=16 (comparison)"] if _aiohttp() else [])
        + ["closed-loop capacity:", "open loop 2000/s constant on raw", "harness sustains >= 2,000 req/s"],
        lambda d: (len([r for r in d["runs"] if r["run"].startswith("bench")]) == 10
                   and all(r["errors"] == 0 for r in d["runs"] if "errors" in r)),
    ),
    "bench_triton.py": (
        [], {0},
        ["[1] ONNX Runtime batch 16 vs Triton", "preferred16/http ", "preferred16/grpc ",
         "preferred16/http+shm", "preferred8/http ", "preferred8/grpc ", "preferred8/http+shm",
         "=> Triton / raw ORT", "[2] food_classifier", "food_classifier count 1", "food_classifier count 2",
         "=> count 2 / count 1", "load average"],
        lambda d: (len(d["onnx"]["runs"]) == 6 and {"ratio", "count1_infer_per_s", "count2_infer_per_s"}
                   <= set(d["counts"])),
    ),
    "bench_streaming.py": (
        [], {0},
        ["decoder: a decoder with deterministic random weights", "tokens_request_level at 4/s",
         "tokens_iteration_level at 4/s", "request level", "iteration level", "model: a step costs the run's own TPOT p50",
         "identical tokens from both schedulers and the plain loop: yes", "verdict: PASS (0 failed)"],
        lambda d: (len(d["runs"]) == 2 and d["identical_tokens"] is True and d["failed"] == []
                   and {r["model"] for r in d["runs"]} == {"tokens_request_level", "tokens_iteration_level"}),
    ),
    "soak.py": (
        [], {0, 1},  # 1: RSS growth over 40 requests says nothing; failed requests are checked below
        ["=== soak summary ===", "fastapi_onnx: 40 sent, 40 ok, 0 failed",
         "triton_onnx (dynamic batching): 40 sent, 40 ok, 0 failed", "Triton: average batch", "verdict:"],
        lambda d: [r["sent"] for r in d["records"]] == [40, 40] and all("total" in r["growth"] for r in d["records"]),
    ),
    "lesson_stability.py": (
        [], {0},  # --tiny: one round of the tour's FastAPI part
        ["Lesson checks, idle: 1 round(s)", "fastapi_onnx_faster", "fastapi_queueing",
         "FastAPI PyTorch · sequential", "FastAPI ONNX · C=16", "valid runs:"],
        lambda d: (d["rounds"] == 1 and len(d["idle"]["rounds"][0]["checks"]) == 2
                   and all(c["status"] in ("pass", "fail", "inconclusive") for c in d["idle"]["rounds"][0]["checks"])
                   and len(d["idle"]["rounds"][0]["runs"]) == 4),
    ),
    "bench_model_analyzer.py": (
        [], {0},  # --tiny: Model Analyzer's default and one variant at one client
        ["S(b): b=1:", "model's ranking:", "tool's ranking:", "| configuration | tool rank | model rank |",
         "agreement:", "machine during the profile:"],
        lambda d: len(d["comparison"]["rows"]) == 2 and all(r["predicted_throughput"] for r in d["comparison"]["rows"]),
    ),
    "reload_under_load.py": (
        ["--model", "food_classifier_onnx"], {0},
        ["reload 1:", "reload 2:", "reload 3:", "latency: baseline", "verdict: PASS"],
        lambda d: len(d["reloads"]) == 3 and d["failed"] == 0 and d["requests"] > 0,
    ),
}


# Benchmarks whose --tiny run is another test's fixture (run once, checked there with run_tiny below).
ELSEWHERE = {"bench_model_analyzer.py": "tests/triton/test_analyzer.py"}   # its profile is that file's


def test_every_benchmark_has_a_smoke_check():
    assert set(SCRIPTS) == set(EXPECTED), "add the new benchmark's rows to EXPECTED"
    assert set(SCRIPTS) - set(ELSEWHERE) <= set(figures.PROBLEMS), "add the new benchmark's rules to figures.PROBLEMS"


def run_tiny(name: str, tmp_path: Path, *more: str) -> dict:
    """Run ``benchmarks/<name> --tiny`` and check what EXPECTED promises; return its JSON."""
    tiers.require("e2e", f"runs benchmarks/{name} --tiny")
    extra, codes, rows, json_ok = EXPECTED[name]
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / name), "--tiny", "--json", str(out),
                           *extra, *more], cwd=REPO, capture_output=True, text=True, timeout=300)
    log = f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    assert proc.returncode in codes, log
    assert "Traceback" not in proc.stderr, log
    missing = [row for row in rows if row not in proc.stdout]
    assert not missing, f"rows not printed: {missing}\n{log}"
    data = json.loads(out.read_text())
    assert json_ok(data), log
    if name in figures.PROBLEMS:
        problems = figures.PROBLEMS[name](data, proc.stdout, proc.returncode)
        assert not problems, "figures that contradict each other:\n" + "\n".join(problems) + "\n" + log
    return data


@pytest.mark.e2e
@pytest.mark.parametrize("name", [s for s in SCRIPTS if s not in ELSEWHERE])
def test_benchmark_runs_tiny(name, tmp_path):
    """Each benchmark end to end at --tiny sizes. bench_naive.py is the slowest: it starts the kit's
    and both references' Triton models and FastAPI servers and runs every configuration once."""
    if name not in EXPECTED:
        pytest.fail(f"{name}: no expected rows in EXPECTED")
    run_tiny(name, tmp_path)
