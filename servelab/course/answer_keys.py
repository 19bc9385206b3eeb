"""Every number the notebooks' answer keys cite, in one table, with where it came from.

The answer keys are the collapsed "Answer key: ..." cells of notebooks 4 and 6
(tagged ``answer-key``). Each key here lists:

* ``figures``: the measured (or derived) values the key quotes, each with
  its source: which lab, which hardware, what that lab's code did;
* ``settings``: numbers that are configuration, not results (concurrency
  levels, instance counts, batch sizes, GPU indices).

``tests/notebooks/test_answer_keys.py`` reads every answer-key cell and fails
if the cell quotes a number that is not in its entry here, if an entry's
figure is missing from its cell, or if a derived figure no longer follows from
the figures it is computed from: a key cannot drift from the data it cites.
``PASSAGES`` does the same for paragraphs outside the keys that quote another
system's figures.

The keys' "CPU reference run" figures are not typed in: ``PRINTED`` says where the
committed reference run (``docs/reference/``, ``make reference``) printed each one,
the table reads them from there, and the notebook sources name them as
``{{ref:NAME}}``, which ``servelab notebooks build`` fills in (``fill``). A figure
whose check in the reference run was inconclusive or failed is refused. After a new
reference run, ``make notebooks`` rewrites the keys; until then
``servelab notebooks check`` fails.

A sentence anywhere in the kit that speaks of the earlier lab must name one of
its published files recorded in ``EARLIER_LAB_FILES`` and quote only figures
read from them (``provenance_problems``; tests/notebooks/test_provenance.py).

    python -m servelab.course.answer_keys        # print the table
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from servelab.course import lab

# --------------------------------------------------------------------------
# Where figures come from
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    lab: str
    hardware: str
    where: str        # file, or how it was measured
    code: str         # what the code that produced it did
    files: tuple[str, ...] = ()  # the earlier lab's published files it was read from (EARLIER_LAB_FILES)


EARLIER_LAB = "earlier lab (teaching-on-testbeds/serve-system-chi)"
P100_NODE = "Chameleon gpu_p100 node: 2× Tesla P100"

# The earlier lab's published files this kit reads facts and figures from: a
# sentence about the earlier lab cites one of these by its path in that lab
# (tests/notebooks/test_provenance.py). This list is the kit's record: the
# tests never need the earlier lab itself.
EARLIER_LAB_FILES = {
    "workspace/fastapi.ipynb": "its FastAPI notebook; the printed outputs are kept in markdown comments",
    "workspace/triton.ipynb": "its Triton notebook; perf_analyzer outputs and one statistics document kept in "
                              "markdown comments",
    "models_staging/food_classifier/1/model.py": "its Python-backend model (decodes input [0, 0] of each request)",
    "models_staging/food_classifier_onnx/config.pbtxt": "its ONNX model configuration (input named `input`)",
    "snippets/intro.md": "its introduction: a 3-hour lease on the P100 node, started on the hour and ended at "
                         "`YY:55`, and all the material read ahead of the lease",
    "docker/Dockerfile.triton": "its Triton image: `COPY models /models`, started with "
                                "`tritonserver --model-repository=/models`",
    "fastapi_pt/food11.pth": "its trained Food-11 model (a pickled model, the same git blob as "
                             "models_staging/food_classifier/1/food11.pth), which the node downloads: "
                             "servelab.node.weights records the commit and the blob id",
}

SOURCES = {
    "earlier-fastapi": Source(
        EARLIER_LAB, P100_NODE,
        "workspace/fastapi.ipynb (outputs kept in its markdown comments)",
        "100 requests in sequence with `requests`, right after the notebook had the student send test requests "
        "through Swagger UI and the web page; throughput printed as requests / sum of latencies, i.e. exactly "
        "1 / mean latency; the 99th percentile printed in milliseconds labelled `seconds`; no 16-client "
        "figures published",
        files=("workspace/fastapi.ipynb",),
    ),
    "earlier-triton": Source(
        EARLIER_LAB, P100_NODE,
        "workspace/triton.ipynb (outputs kept in its markdown comments)",
        "perf_analyzer --concurrency-range runs (no request-rate runs) with its default stability search; the "
        "Python-backend model.py decoded only the first image of each request (so -b 16 ran one image per "
        "request while perf_analyzer counted 16) and reported sigmoid(max logit) as the probability",
        files=("workspace/triton.ipynb", "models_staging/food_classifier/1/model.py"),
    ),
    "kit-cpu-fastapi": Source(
        "this kit (ServeLab)", "CPU reference: the machine in docs/reference/manifest.json",
        "the committed reference run, docs/reference/4_fastapi.ipynb: notebook 4's own `requests` loops "
        "against the local stack, read from its printed output (PRINTED)",
        "the services as shipped: one single-threaded inference per core",
    ),
    "kit-cpu-triton": Source(
        "this kit (ServeLab)", "CPU reference: the machine in docs/reference/manifest.json",
        "the committed reference run, docs/reference/6_triton.ipynb: notebook 6's perf_analyzer cells (-b 1 "
        "and -b 16 at concurrency 1, count windows) against the local Triton 2.51, food_classifier with one "
        "instance, read from the check's printed line (PRINTED)",
        "models_staging/food_classifier/1/model.py as shipped: decodes every image of every request and "
        "runs them in one forward pass",
    ),
    "kit-gpu-batchcost": Source(
        "this kit (ServeLab)", "one NVIDIA H100 80GB, measured for this kit on 2026-11-26",
        "servelab/bench/batchcost.py, GPU_REFERENCE_MS and its comment (commits a8c48d3 and 22da4b4): the "
        "kit's record",
        "fastapi_pt/food11.pth in PyTorch 2.11 fp32, forward passes of batches of 1, 2, 4, 8 and 16 with the "
        "inputs already on the GPU, median of 100 runs after warm-up; copying inputs there and back "
        "added 0.0-0.3 ms at b=1 and 0.9 ms at b=16. The script that measured it is not in the kit",
    ),
    "kit-cpu-pipeline": Source(
        "this kit (ServeLab)", "CPU reference: the machine in docs/reference/manifest.json",
        "the committed reference run, docs/reference/6a_triton_pipeline.ipynb: notebook 6a against the local "
        "Triton 2.51, read from its checks' printed lines (PRINTED)",
        "models_staging as shipped: food_pipeline, food_classifier (1 copy), food_classifier_onnx (1 copy)",
    ),
    "kit-cpu-overload": Source(
        "this kit (ServeLab)", "CPU reference: the 2-core x86 machine the kit is tested on, no GPU, idle",
        "`python -m servelab.bench.overload --seconds 20` against the local Triton 2.51, 2026-11-29; the run "
        "is kept in docs/benchmark-runs/2026-11-29-overload-missed-handovers.txt",
        "food_classifier, one copy, max_batch_size 1, max_queue_size 8, Poisson arrivals for 20 s per factor",
    ),
    "kit-ma-spike": Source(
        "this kit (ServeLab)", "CPU reference: the 2-core x86 machine the kit is tested on, no GPU",
        "issue 32 of this kit (its spike, 2026-11-26): Model Analyzer 1.58.0's summary for food_classifier_onnx",
        "3 instance configurations x concurrency 1 and 2, local launch mode against the kit's tritonserver 2.51",
    ),
    "kit-cpu-traces": Source(
        "this kit (ServeLab)", "CPU reference: the 2-core x86 machine the kit is tested on, no GPU, idle",
        "`python -m servelab.bench.breakdown --requests 200` against the local Triton 2.51, 2026-11-27; the "
        "run is kept in docs/benchmark-runs/2026-11-27-breakdown.txt",
        "models_staging as shipped (one copy each, no dynamic batching); Triton's TIMESTAMPS traces of every "
        "request and the client's monotonic clock, p50 of each stage over 200 requests",
    ),
    "derived": Source("arithmetic on the figures above", "-", "the formula given with the figure", "-"),
}


@dataclass(frozen=True)
class Figure:
    name: str         # identifier, usable in other figures' formulas
    value: float
    unit: str
    what: str
    source: str       # key of SOURCES
    formula: str = ""  # for derived figures: an expression over other figures' names

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"{self.name}: unknown source {self.source!r}")
        if (self.source == "derived") != bool(self.formula):
            raise ValueError(f"{self.name}: a derived figure needs a formula, and only a derived one")


@dataclass(frozen=True)
class Key:
    notebook: str
    summary: str                       # the <summary> text after "Answer key: "
    figures: tuple[str, ...]           # names in FIGURES
    settings: tuple[float, ...] = field(default=())


def _fig(name, value, unit, what, source, formula=""):
    return Figure(name, value, unit, what, source, formula)


# --------------------------------------------------------------------------
# Figures read from the committed reference run
# --------------------------------------------------------------------------

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "docs" / "reference"
# what servelab.course.lab.check prints for a check that is not evidence
_SPOILED = (lab.CHECK_INCONCLUSIVE, lab.CHECK_FAIL)


@dataclass(frozen=True)
class Printed:
    notebook: str   # docs/reference/<notebook>.ipynb
    cell: str       # text in the source of the code cell that printed it
    pattern: str    # a regex on that cell's printed output; group 1 is the figure


PRINTED = {
    "kit_pt_seq_p50_ms": Printed("4_fastapi", 'report("PyTorch, sequential"', r"median ([\d.]+) ms"),
    "kit_pt_seq_rps": Printed("4_fastapi", 'report("PyTorch, sequential"', r"throughput ([\d.]+) requests/s"),
    "kit_onnx_seq_p50_ms": Printed("4_fastapi", 'report("ONNX, sequential"', r"median ([\d.]+) ms"),
    "kit_onnx_seq_rps": Printed("4_fastapi", 'report("ONNX, sequential"', r"throughput ([\d.]+) requests/s"),
    "kit_py_c1_ips": Printed("6_triton", "in batches of 16", r"measured: ([\d.]+) infer/s unbatched vs"),
    "kit_py_b16_ips": Printed("6_triton", "in batches of 16", r"unbatched vs ([\d.]+) in batches of 16"),
    # notebook 6a: its checks' "measured:" lines (and the lines the same cell printed)
    "pipe_kb_python": Printed("6a_triton_pipeline", "the JPEG's bytes are the smallest", r"\bpython ([\d.]+) KB"),
    "pipe_kb_onnx": Printed("6a_triton_pipeline", "the JPEG's bytes are the smallest", r"client\+onnx ([\d.]+) KB"),
    "pipe_kb_ensemble": Printed("6a_triton_pipeline", "the JPEG's bytes are the smallest", r"\bensemble ([\d.]+) KB"),
    "pipe_cpu_onnx_ms": Printed("6a_triton_pipeline", "the JPEG's bytes are the smallest",
                                r"measured: .*client\+onnx ([\d.]+) ms"),
    "pipe_c1_p50_ensemble": Printed("6a_triton_pipeline", "at 16 clients the ensemble", r"p50 ([\d.]+) ms \(ensemble\)"),
    "pipe_c1_p50_onnx": Printed("6a_triton_pipeline", "at 16 clients the ensemble", r"vs ([\d.]+) ms \(client\+onnx"),
    "pipe_c16_rps_ensemble": Printed("6a_triton_pipeline", "at 16 clients the ensemble",
                                     r"measured: ensemble ([\d.]+) req/s"),
    "pipe_c16_pred_ensemble": Printed("6a_triton_pipeline", "at 16 clients the ensemble",
                                      r"measured: ensemble [\d.]+ req/s \(predicted ([\d.]+)\)"),
    "pipe_c16_rps_python": Printed("6a_triton_pipeline", "at 16 clients the ensemble", r"Python model ([\d.]+) req/s"),
    "pipe_c16_pred_python": Printed("6a_triton_pipeline", "at 16 clients the ensemble",
                                    r"Python model [\d.]+ req/s \(predicted ([\d.]+)\)"),
    "warm_first_without_ms": Printed("6a_triton_pipeline", "first_request_after_load(",
                                     r"without model_warmup: first request +([\d.]+) ms"),
    "warm_steady_without_ms": Printed("6a_triton_pipeline", "first_request_after_load(",
                                      r"without model_warmup: first request +[\d.]+ ms, then +([\d.]+) ms"),
    "warm_first_with_ms": Printed("6a_triton_pipeline", "first_request_after_load(",
                                  r"\bwith +model_warmup: first request +([\d.]+) ms"),
    "rollout_ok": Printed("6a_triton_pipeline", "rollouts.rollout(", r"(\d+) answered, 0 failed at"),
    "rollout_rate": Printed("6a_triton_pipeline", "rollouts.rollout(", r"answered, 0 failed at ([\d.]+) requests/s"),
    "bls_c1_p50_ms": Printed("6a_triton_pipeline", "cascade_bench.measure(", r"measured: p50 ([\d.]+) ms \(cascade"),
    "bls_c1_p50_ensemble_ms": Printed("6a_triton_pipeline", "cascade_bench.measure(", r"vs ([\d.]+) ms \(ensemble\)"),
    "ov_reject_pct": Printed("6a_triton_pipeline", "overload.measure(", r"bounded [\d.]+x .*, rejected ([\d.]+)% \(M/M/1/K"),
    "ov_mm1k_pct": Printed("6a_triton_pipeline", "overload.measure(", r"bounded [\d.]+x .*\(M/M/1/K ([\d.]+)%"),
    "ov_miss_pct": Printed("6a_triton_pipeline", "overload.measure(", r"batcher missed (\d+)% of its hand-overs"),
    "ov_missed_pct": Printed("6a_triton_pipeline", "overload.measure(", r"missed hand-overs ([\d.]+)% \(busy"),
    "ov_busy_pct": Printed("6a_triton_pipeline", "overload.measure(", r"  bounded [\d.]+x .*served, goodput +[\d.]+/s, busy (\d+)%"),
    "bls_c1_escalated_pct": Printed("6a_triton_pipeline", "cascade_bench.measure(", r"\(cascade, (\d+)% escalated\)"),
}
# figures derived from them: name -> (formula over PRINTED names, decimals)
DERIVED_FROM_REFERENCE = {"kit_py_b16_gain": ("kit_py_b16_ips / kit_py_c1_ips", 2)}


def _joined(x) -> str:
    return "".join(x) if isinstance(x, list) else (x or "")


MISSING = "?"   # a figure the reference does not give (only while it is being made: the tests fail on one)


def reference_values(reference_dir: Path = REFERENCE_DIR, strict: bool = True) -> dict[str, str]:
    """Every ``PRINTED`` figure as the reference run in ``reference_dir`` printed it (its text), and
    the ``DERIVED_FROM_REFERENCE`` ones. Raises ValueError when one is missing, or when the cell
    that printed it also printed an inconclusive or failed check (not evidence); with
    ``strict=False`` such a figure reads ``MISSING`` instead (the table at import: a notebook new to
    the reference has none until ``make reference`` runs it)."""
    cells: dict[str, list] = {}
    values: dict[str, str] = {}
    for name, where in PRINTED.items():
        try:
            if where.notebook not in cells:
                path = reference_dir / f"{where.notebook}.ipynb"
                if not path.is_file():
                    raise ValueError(f"{name}: no {path} (run `make reference`)")
                cells[where.notebook] = json.loads(path.read_text(encoding="utf-8"))["cells"]
            found = [c for c in cells[where.notebook]
                     if c["cell_type"] == "code" and where.cell in _joined(c["source"])]
            if len(found) != 1:
                raise ValueError(f"{name}: {len(found)} code cells of {where.notebook} contain {where.cell!r}, not 1")
            printed = "\n".join(_joined(o.get("text")) for o in found[0].get("outputs", []))
            spoiled = [mark for mark in _SPOILED if mark in printed]
            if spoiled:
                raise ValueError(f"{name}: the reference run's cell printed {spoiled[0]!r}: not a figure for a key "
                                 "(run `make reference` again on a quiet machine)")
            m = re.search(where.pattern, printed)
            if not m:
                raise ValueError(f"{name}: {where.pattern!r} not in what the reference's cell printed")
            values[name] = m.group(1)
        except ValueError:
            if strict:
                raise
            values[name] = MISSING
    numbers = {k: float(v) for k, v in values.items() if v != MISSING}
    for name, (formula, decimals) in DERIVED_FROM_REFERENCE.items():
        try:
            values[name] = f"{eval(formula, {'__builtins__': {}}, numbers):.{decimals}f}"  # our own formula
        except NameError:
            values[name] = MISSING
    return values


PLACEHOLDER = re.compile(r"\{\{ref:(\w+)\}\}")


def fill(text: str, values: dict[str, str] | None = None) -> str:
    """``text`` with each ``{{ref:NAME}}`` replaced by the reference run's figure (``values``, or
    read from docs/reference/ when there is a placeholder and no values are given)."""
    if not PLACEHOLDER.search(text):
        return text
    values = reference_values(strict=False) if values is None else values
    unknown = sorted({m.group(1) for m in PLACEHOLDER.finditer(text)} - set(values))
    if unknown:
        raise ValueError(f"{{{{ref:...}}}} names no reference figure: {', '.join(unknown)} (see PRINTED)")
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


_REFERENCE = {name: float("nan" if text == MISSING else text)
              for name, text in reference_values(strict=False).items()}


_FIGURES = [
    # ---- earlier lab, FastAPI (workspace/fastapi.ipynb) ----
    _fig("pt_seq_p50_ms", 17.2, "ms", "FastAPI + PyTorch, sequential: median latency (printed 17.2018)", "earlier-fastapi"),
    _fig("pt_seq_rps", 57.2, "req/s", "FastAPI + PyTorch, sequential: throughput (printed 57.16)", "earlier-fastapi"),
    _fig("pt_seq_mean_ms", 17.5, "ms", "FastAPI + PyTorch, sequential: mean latency", "derived", "1000 / pt_seq_rps"),
    _fig("onnx_seq_p50_ms", 9.25, "ms", "FastAPI + ONNX, sequential: median latency (printed 9.2471)", "earlier-fastapi"),
    _fig("onnx_seq_p95_ms", 11.2, "ms", "FastAPI + ONNX, sequential: 95th percentile (printed 11.2387)", "earlier-fastapi"),
    _fig("onnx_seq_p99_ms", 16.1, "ms", "FastAPI + ONNX, sequential: 99th percentile (printed 16.1481)", "earlier-fastapi"),
    _fig("onnx_seq_rps", 80.66, "req/s", "FastAPI + ONNX, sequential: throughput", "earlier-fastapi"),
    _fig("onnx_seq_mean_ms", 12.4, "ms", "FastAPI + ONNX, sequential: mean latency", "derived", "1000 / onnx_seq_rps"),
    _fig("onnx_seq_slowest_ms", 207, "ms", "ONNX, sequential: least time the slowest request took, 207.1 from the printed values (numpy's "
         "percentiles: at most 50 requests <= median, 45 more <= p95, 4 more <= p99; the sum is 100 x mean)",
         "derived", "100 * 1000 / onnx_seq_rps - 50 * onnx_seq_p50_ms - 45 * onnx_seq_p95_ms - 4 * onnx_seq_p99_ms"),
    _fig("onnx_vs_pt_median", 1.9, "x", "ONNX vs PyTorch: median latency ratio", "derived",
         "pt_seq_p50_ms / onnx_seq_p50_ms"),
    _fig("onnx_vs_pt_rps", 1.4, "x", "ONNX vs PyTorch: throughput ratio", "derived", "onnx_seq_rps / 57.16"),
    # ---- this kit, FastAPI on the CPU reference ----
    _fig("kit_pt_seq_p50_ms", _REFERENCE["kit_pt_seq_p50_ms"], "ms", "FastAPI + PyTorch, sequential, CPU reference: "
         "median", "kit-cpu-fastapi"),
    _fig("kit_pt_seq_rps", _REFERENCE["kit_pt_seq_rps"], "req/s", "FastAPI + PyTorch, sequential, CPU reference",
         "kit-cpu-fastapi"),
    _fig("kit_onnx_seq_rps", _REFERENCE["kit_onnx_seq_rps"], "req/s", "FastAPI + ONNX, sequential, CPU reference",
         "kit-cpu-fastapi"),
    _fig("kit_onnx_seq_p50_ms", _REFERENCE["kit_onnx_seq_p50_ms"], "ms", "FastAPI + ONNX, sequential, CPU reference: "
         "median", "kit-cpu-fastapi"),
    # ---- earlier lab, Triton Python backend (workspace/triton.ipynb) ----
    _fig("py_c1_rps", 51.5, "infer/s", "Python backend, 1 instance, concurrency 1 (printed 51.549)", "earlier-triton"),
    _fig("py_c1_compute_ms", 18.6, "ms", "Python backend, concurrency 1: compute infer (18570 usec)", "earlier-triton"),
    _fig("py_c8_rps", 52.4, "infer/s", "Python backend, 1 instance, concurrency 8 (printed 52.3786)", "earlier-triton"),
    _fig("py_c8_latency_ms", 152, "ms", "Python backend, concurrency 8: client latency (151983 usec)", "earlier-triton"),
    _fig("py_c8_queue_ms", 132, "ms", "Python backend, concurrency 8: queue (132341 usec)", "earlier-triton"),
    _fig("py_c8_queue_model_ms", 130, "ms", "seven requests ahead, each computing 18.6 ms", "derived",
         "7 * py_c1_compute_ms"),
    _fig("py_b16_ips", 656.6, "infer/s", "Python backend, -b 16, concurrency 1 (printed 656.63); an artifact",
         "earlier-triton"),
    _fig("py_b16_vs_c1", 13, "x", "the apparent gain of -b 16", "derived", "py_b16_ips / py_c1_rps"),
    _fig("py_b16_rps", 41.0, "req/s", "-b 16: requests per second, each decoding one image", "derived",
         "py_b16_ips / 16"),
    _fig("py_b16_compute_ms", 20.9, "ms", "-b 16: compute infer per request (20921 usec)", "earlier-triton"),
    _fig("py_i2_rps", 192.8, "infer/s", "2 per GPU x 2 GPUs, concurrency 8 (printed 192.849)", "earlier-triton"),
    _fig("py_i2_latency_ms", 41, "ms", "2 per GPU x 2 GPUs, concurrency 8: latency (41374 usec)", "earlier-triton"),
    _fig("py_i2_compute_ms", 33.5, "ms", "2 per GPU x 2 GPUs: compute infer (33514 usec)", "earlier-triton"),
    _fig("py_i4_rps", 118.7, "infer/s", "4 per GPU x 2 GPUs, concurrency 8 (printed 118.688)", "earlier-triton"),
    _fig("py_i4_latency_ms", 67.6, "ms", "4 per GPU x 2 GPUs, concurrency 8: latency (67559 usec)", "earlier-triton"),
    _fig("py_i4_compute_ms", 66.1, "ms", "4 per GPU x 2 GPUs: compute infer (66118 usec)", "earlier-triton"),
    _fig("py_i4_queue_ms", 0.5, "ms", "4 per GPU x 2 GPUs: queue (466 usec)", "earlier-triton"),
    _fig("py_db_c8_rps", 78.6, "infer/s", "dynamic batching, 1 instance, concurrency 8 (printed 78.6276)",
         "earlier-triton"),
    _fig("py_db_c8_latency_ms", 100, "ms", "dynamic batching, concurrency 8: avg request latency (100423 usec)",
         "earlier-triton"),
    _fig("py_db_c8_queue_ms", 44.9, "ms", "dynamic batching, concurrency 8: queue (44892 usec)", "earlier-triton"),
    _fig("py_db_c8_compute_ms", 55.1, "ms", "dynamic batching, concurrency 8: compute infer (55111 usec)",
         "earlier-triton"),
    _fig("py_db_inferences", 1436, "", "dynamic batching run: inference_count in the model statistics",
         "earlier-triton"),
    _fig("py_db_executions", 386, "", "dynamic batching run: execution_count in the model statistics",
         "earlier-triton"),
    _fig("py_db_avg_batch", 3.7, "", "dynamic batching run: average batch", "derived",
         "py_db_inferences / py_db_executions"),
    _fig("py_db_max_batch", 7, "", "dynamic batching run: largest batch in batch_stats (sizes 1 to 7)",
         "earlier-triton"),
    # ---- this kit, Triton Python backend on the CPU reference ----
    _fig("kit_py_c1_ips", _REFERENCE["kit_py_c1_ips"], "infer/s", "food_classifier, 1 instance, -b 1, concurrency 1, "
         "CPU reference", "kit-cpu-triton"),
    _fig("kit_py_b16_ips", _REFERENCE["kit_py_b16_ips"], "infer/s", "food_classifier, 1 instance, -b 16, "
         "concurrency 1, CPU reference", "kit-cpu-triton"),
    _fig("kit_py_b16_gain", _REFERENCE["kit_py_b16_gain"], "x", "-b 16 vs -b 1 on the CPU reference", "derived",
         DERIVED_FROM_REFERENCE["kit_py_b16_gain"][0]),
    # ---- earlier lab, Triton ONNX backend ----
    _fig("onnx_c1_ips", 138.4, "infer/s", "ONNX backend, 1 instance, concurrency 1 (printed 138.444)", "earlier-triton"),
    _fig("onnx_c1_compute_ms", 4.57, "ms", "ONNX backend, concurrency 1: compute infer (4566 usec)", "earlier-triton"),
    _fig("onnx_db_rate", 109, "req/s", "the open-loop cells' rate, 0.5 / S(1), with the earlier lab's ONNX compute "
         "time as S(1)", "derived", "0.5 * 1000 / onnx_c1_compute_ms"),
    _fig("onnx_i2_c8_ips", 1182, "infer/s", "ONNX backend, 2 per GPU, concurrency 8 (printed 1182.39)",
         "earlier-triton"),
    _fig("onnx_i2_c16_ips", 1257, "infer/s", "ONNX backend, 2 per GPU, concurrency 16 (printed 1257.15)",
         "earlier-triton"),
    _fig("onnx_vs_py_best", 6, "x", "ONNX at 8 clients vs the Python backend's best (2 per GPU)", "derived",
         "onnx_i2_c8_ips / py_i2_rps"),
    # ---- this kit, the model on a GPU (servelab/bench/batchcost.py GPU_REFERENCE_MS) ----
    _fig("h100_b1_ms", 2.7, "ms", "PyTorch fp32 forward pass, batch of 1, NVIDIA H100 (GPU_REFERENCE_MS[1] = 2.71)",
         "kit-gpu-batchcost"),
    _fig("h100_b16_ms", 2.8, "ms", "PyTorch fp32 forward pass, batch of 16, NVIDIA H100 (GPU_REFERENCE_MS[16] = 2.80)",
         "kit-gpu-batchcost"),
]
# ---- this kit, notebook 6a (kit-cpu-pipeline): read from the committed reference run ----
_FIGURES += [
    _fig("pipe_kb_python", _REFERENCE["pipe_kb_python"], "KB", "Python model: request size (base64 JPEG)", "kit-cpu-pipeline"),
    _fig("pipe_kb_onnx", _REFERENCE["pipe_kb_onnx"], "KB", "client + ONNX: request size (float32 tensor)", "kit-cpu-pipeline"),
    _fig("pipe_kb_ensemble", _REFERENCE["pipe_kb_ensemble"], "KB", "ensemble: request size (JPEG bytes)", "kit-cpu-pipeline"),
    _fig("pipe_cpu_onnx_ms", _REFERENCE["pipe_cpu_onnx_ms"], "ms", "client + ONNX: client CPU per request", "kit-cpu-pipeline"),
    _fig("pipe_c1_p50_onnx", _REFERENCE["pipe_c1_p50_onnx"], "ms", "client + ONNX, 1 client: p50", "kit-cpu-pipeline"),
    _fig("pipe_c1_p50_ensemble", _REFERENCE["pipe_c1_p50_ensemble"], "ms", "ensemble, 1 client: p50", "kit-cpu-pipeline"),
    _fig("pipe_c16_rps_python", _REFERENCE["pipe_c16_rps_python"], "req/s", "Python model, 16 clients: throughput", "kit-cpu-pipeline"),
    _fig("pipe_c16_pred_python", _REFERENCE["pipe_c16_pred_python"], "req/s", "Python model: predicted throughput at 16 clients", "kit-cpu-pipeline"),
    _fig("pipe_c16_rps_ensemble", _REFERENCE["pipe_c16_rps_ensemble"], "req/s", "ensemble, 16 clients: throughput", "kit-cpu-pipeline"),
    _fig("pipe_c16_pred_ensemble", _REFERENCE["pipe_c16_pred_ensemble"], "req/s", "ensemble: predicted throughput at 16 clients", "kit-cpu-pipeline"),
    _fig("warm_first_without_ms", _REFERENCE["warm_first_without_ms"], "ms", "first request after a load, no model_warmup (median over loads)", "kit-cpu-pipeline"),
    _fig("warm_steady_without_ms", _REFERENCE["warm_steady_without_ms"], "ms", "the requests after the first, no model_warmup", "kit-cpu-pipeline"),
    _fig("warm_first_with_ms", _REFERENCE["warm_first_with_ms"], "ms", "first request after a load, with model_warmup (median over loads)", "kit-cpu-pipeline"),
    _fig("rollout_ok", _REFERENCE["rollout_ok"], "requests", "rollout: answered (0 failed)", "kit-cpu-pipeline"),
    _fig("rollout_rate", _REFERENCE["rollout_rate"], "req/s", "rollout: Poisson rate", "kit-cpu-pipeline"),
    # the kit's idle run of servelab.bench.overload (docs/benchmark-runs/2026-11-29-overload-missed-handovers.txt)
    _fig("ov_idle_1_2_pct", 69, "%", "bounded queue at 1.2x: turned away (printed 69.4%)", "kit-cpu-overload"),
    _fig("ov_idle_1_5_pct", 79, "%", "bounded queue at 1.5x: turned away (printed 79.0%)", "kit-cpu-overload"),
    _fig("ov_idle_1_2_mm1k_pct", 13, "%", "bounded queue at 1.2x: M/M/1/K (printed 13.2%)", "kit-cpu-overload"),
    _fig("ov_idle_1_5_mm1k_pct", 30, "%", "bounded queue at 1.5x: M/M/1/K (printed 29.5%)", "kit-cpu-overload"),
    _fig("ov_reject_pct", _REFERENCE["ov_reject_pct"], "%", "bounded queue: share turned away (measured)", "kit-cpu-pipeline"),
    _fig("ov_mm1k_pct", _REFERENCE["ov_mm1k_pct"], "%", "bounded queue: share turned away (M/M/1/K)", "kit-cpu-pipeline"),
    _fig("ov_miss_pct", _REFERENCE["ov_miss_pct"], "%", "hand-overs Triton's batcher missed (full queue, constant arrivals)",
         "kit-cpu-pipeline"),
    _fig("ov_missed_pct", _REFERENCE["ov_missed_pct"], "%", "bounded queue: share turned away (with the missed hand-overs)",
         "kit-cpu-pipeline"),
    _fig("ov_busy_pct", _REFERENCE["ov_busy_pct"], "%", "bounded queue: share of the run the copy computed", "kit-cpu-pipeline"),
    _fig("bls_c1_p50_ms", _REFERENCE["bls_c1_p50_ms"], "ms", "BLS cascade, 1 client: p50", "kit-cpu-pipeline"),
    _fig("bls_c1_p50_ensemble_ms", _REFERENCE["bls_c1_p50_ensemble_ms"], "ms", "ensemble beside it, 1 client: p50",
         "kit-cpu-pipeline"),
    _fig("bls_c1_escalated_pct", _REFERENCE["bls_c1_escalated_pct"], "%", "BLS cascade, 1 client: share escalated",
         "kit-cpu-pipeline"),
]

_FIGURES += [
    _fig("trace_py_c1_infer_ms", 34.8, "ms", "food_classifier, 1 client: compute infer p50 (34.77)", "kit-cpu-traces"),
    _fig("trace_py_c1_client_ms", 35.7, "ms", "food_classifier, 1 client: the client's p50 (35.67)", "kit-cpu-traces"),
    _fig("trace_py_c8_client_ms", 320.4, "ms", "food_classifier, 8 clients: the client's p50 (320.35)", "kit-cpu-traces"),
    _fig("trace_py_c8_queue_ms", 279.2, "ms", "food_classifier, 8 clients: queue p50 (279.19)", "kit-cpu-traces"),
    _fig("trace_onnx_c1_client_ms", 6.8, "ms", "food_classifier_onnx, 1 client: the client's p50 (6.83)",
         "kit-cpu-traces"),
    _fig("trace_onnx_c1_receive_ms", 0.4, "ms", "food_classifier_onnx, 1 client: receive p50 (0.43)", "kit-cpu-traces"),
    _fig("trace_pipe_c8_onnx_queue_ms", 68.9, "ms", "food_pipeline, 8 clients: the classifier step's queue p50 (68.89)",
         "kit-cpu-traces"),
    _fig("trace_pipe_c8_pre_queue_ms", 0.1, "ms", "food_pipeline, 8 clients: the preprocessing step's queue p50 (0.06)",
         "kit-cpu-traces"),
]
_FIGURES.append(_fig("ma_spike_default_ips", 203, "infer/s", "Model Analyzer's default configuration of "
                     "food_classifier_onnx, as its summary reported it (\"about 203 infer/s\")", "kit-ma-spike"))
FIGURES: dict[str, Figure] = {f.name: f for f in _FIGURES}
if len(FIGURES) != len(_FIGURES):
    raise ValueError("duplicate figure names")

KEYS: list[Key] = [
    Key("4_fastapi", "PyTorch, sequential",
        ("pt_seq_p50_ms", "pt_seq_rps", "pt_seq_mean_ms", "kit_pt_seq_p50_ms", "kit_pt_seq_rps"),
        settings=(2, 100, 1)),
    Key("4_fastapi", "ONNX, sequential",
        ("pt_seq_p50_ms", "pt_seq_rps", "pt_seq_mean_ms", "onnx_seq_p50_ms", "onnx_seq_p95_ms", "onnx_seq_p99_ms",
         "onnx_seq_rps", "onnx_seq_mean_ms", "onnx_seq_slowest_ms", "onnx_vs_pt_median", "onnx_vs_pt_rps", "kit_onnx_seq_rps",
         "kit_onnx_seq_p50_ms"),
        settings=(2, 1, 100, 99, 50, 45, 4)),
    Key("6_triton", "Python backend, one instance",
        ("py_c1_rps", "py_c1_compute_ms", "py_c8_rps", "py_c8_latency_ms", "py_c8_queue_ms", "py_c8_queue_model_ms"),
        settings=(2, 1, 8, 7, 16, 0)),
    Key("6_triton", "client batch of 16",
        ("py_b16_ips", "py_c1_rps", "py_b16_vs_c1", "py_b16_rps", "py_c1_compute_ms", "py_b16_compute_ms",
         "kit_py_c1_ips", "kit_py_b16_ips", "kit_py_b16_gain"),
        settings=(2, 16, 1)),
    Key("6_triton", "instance groups",
        ("py_c8_rps", "py_c8_latency_ms", "py_i2_rps", "py_i2_latency_ms", "py_i2_compute_ms", "py_i4_rps",
         "py_i4_latency_ms", "py_i4_compute_ms", "py_i4_queue_ms"),
        settings=(2, 8, 1, 0, 4)),
    Key("6_triton", "ONNX backend",
        ("onnx_c1_ips", "onnx_i2_c8_ips", "onnx_i2_c16_ips", "onnx_vs_py_best"),
        settings=(2, 1, 8, 16)),
    Key("6_triton", "dynamic batching on the Python model",
        ("py_db_c8_rps", "py_db_c8_latency_ms", "py_db_c8_queue_ms", "py_db_c8_compute_ms", "py_c8_rps",
         "py_c8_latency_ms", "py_c8_queue_ms", "py_db_inferences", "py_db_executions", "py_db_avg_batch",
         "py_db_max_batch"),
        settings=(2, 8, 1, 0, 4, 6, 10, 100, 16)),
    Key("6_triton", "dynamic batching, steady and bursty arrivals",
        ("onnx_c1_compute_ms", "onnx_db_rate"),
        settings=(2, 0.5, 1.0, 1, 16)),
    Key("6_triton", "where each request's time goes",
        ("trace_py_c1_infer_ms", "trace_py_c1_client_ms", "trace_py_c8_client_ms", "trace_py_c8_queue_ms",
         "trace_onnx_c1_client_ms", "trace_onnx_c1_receive_ms", "trace_pipe_c8_onnx_queue_ms",
         "trace_pipe_c8_pre_queue_ms"),
        settings=(2, 200, 1, 8, 3, 224)),
    # 6c quotes no figure of another system: its keys explain, the run measures.
    Key("6c_scale_out", "one queue vs a queue per replica", ()),
    Key("6c_scale_out", "the rule past saturation", ()),
    Key("6e_accelerate", "reading the table", (), settings=(1, 16)),
    Key("6e_accelerate", "the accelerator in Triton", (), settings=(1,)),
    Key("6e_accelerate", "FP16 in Triton", (), settings=(16,)),
    # 6f quotes no figure of another system: its keys explain, the run measures.
    Key("6f_token_streaming", "the two schedulers under load", (), settings=(16, 256, 8, 64)),
    Key("6f_token_streaming", "the model and the gap", (), settings=(256, 8)),
]

KEYS += [
    Key("6a_triton_pipeline", "the three ways",
        ("pipe_kb_python", "pipe_kb_onnx", "pipe_kb_ensemble", "pipe_cpu_onnx_ms", "pipe_c1_p50_onnx",
         "pipe_c1_p50_ensemble", "pipe_c16_rps_python", "pipe_c16_pred_python", "pipe_c16_rps_ensemble",
         "pipe_c16_pred_ensemble"),
        settings=(1, 8, 16, 0)),
    Key("6a_triton_pipeline", "warm-up and rollout",
        ("warm_first_without_ms", "warm_steady_without_ms", "warm_first_with_ms", "rollout_ok", "rollout_rate"),
        settings=(1, 2, 0)),
    Key("6a_triton_pipeline", "past capacity", ("ov_reject_pct", "ov_mm1k_pct", "ov_miss_pct",
                                                 "ov_missed_pct", "ov_busy_pct", "ov_idle_1_2_pct", "ov_idle_1_5_pct",
                                                 "ov_idle_1_2_mm1k_pct", "ov_idle_1_5_mm1k_pct"),
        settings=(2, 2.51, 1.2, 1.5)),
    Key("6a_triton_pipeline", "the cascade", ("bls_c1_p50_ms", "bls_c1_p50_ensemble_ms", "bls_c1_escalated_pct"),
        settings=(0.2, 0)),
    Key("6b_model_analyzer", "what the model predicts", ("h100_b1_ms", "h100_b16_ms"), settings=(2, 16, 1)),
    Key("6b_model_analyzer", "agreement", ("ma_spike_default_ips",), settings=(3, 32, 0, 1, 2, 1.5)),
]

# Paragraphs outside the answer keys that quote figures about another system
# (the earlier lab, a GPU): the same check as a key, on the paragraph that
# starts with ``summary``.
PASSAGES: list[Key] = [
    Key("6_triton", "Whether that helps depends on one fact about your hardware",
        ("h100_b1_ms", "h100_b16_ms"), settings=(16, 1)),
    Key("6_triton", "One copy without batching serves at most",
        ("onnx_c1_ips", "onnx_c1_compute_ms"), settings=(1, 32)),
]

# --------------------------------------------------------------------------
# Sentences about the earlier lab
# --------------------------------------------------------------------------

# What counts as a sentence about the earlier lab.
EARLIER_MENTION = re.compile(r"\bearlier (?:lab|version)\b|\bthat lab\b", re.I)

# Numbers a sentence about the earlier lab may carry besides its figures: the
# earlier lab's own settings, as its files set them (2 GPUs, GPU 0, 1/2/4 instances
# per GPU, 8 and 16 clients, 100 requests per loop, -b 16, max_batch_size 16,
# preferred batch sizes 4, 6, 8, 10, a queue delay of 100 µs).
EARLIER_LAB_SETTINGS = (0, 1, 2, 4, 6, 8, 10, 16, 100)


def _traces_to_earlier(name: str, seen: frozenset = frozenset()) -> bool:
    fig = FIGURES[name]
    if fig.source != "derived":
        return bool(SOURCES[fig.source].files)
    names = [n for n in re.findall(r"[A-Za-z_]\w*", fig.formula) if n in FIGURES and n not in seen]
    return bool(names) and all(_traces_to_earlier(n, seen | {name}) for n in names)


def earlier_figures() -> dict[str, Figure]:
    """Figures read from the earlier lab's published files, or derived only from such figures."""
    return {name: f for name, f in FIGURES.items() if _traces_to_earlier(name)}


def units(text: str) -> list[str]:
    """A text cut into sentences; a table row is one unit, a comment's lines are joined."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        chunks: list[list[str]] = [[]]
        for raw in para.splitlines():
            line = re.sub(r"^\s*(?:#+|//|>)?\s?", "", raw)
            if line.lstrip().startswith("|"):
                out.append(line)                      # a table row
                continue
            if re.match(r"\s*(?:[*-]|\d+\.)\s", line):  # a list item starts a new unit
                chunks.append([])
            chunks[-1].append(line.strip())
        for chunk in chunks:
            prose = " ".join(chunk)
            out += [u for u in re.split(r"(?<=[.!?])\s+(?=[A-Z*(`])", prose) if u.strip()]
    return out


def provenance_problems(where: str, text: str) -> list[str]:
    """Sentences of ``text`` about the earlier lab that name none of its recorded files, or
    quote a number that is neither one of its figures (FIGURES) nor one of its settings."""
    allowed = {f.value for f in earlier_figures().values()} | set(EARLIER_LAB_SETTINGS)
    out = []
    for unit in units(text):
        if not EARLIER_MENTION.search(unit):
            continue
        short = unit.strip()[:160]
        if not any(path in unit for path in EARLIER_LAB_FILES):
            out.append(f"{where}: about the earlier lab, without its source file: {short!r}")
        for v in numbers_in(unit):
            if v not in allowed:
                out.append(f"{where}: {v:g} is attributed to the earlier lab but is none of its recorded "
                           f"figures or settings: {short!r}")
    return out


def paragraph(text: str, start: str) -> str | None:
    """The paragraph of ``text`` that starts with ``start`` (for PASSAGES)."""
    for para in re.split(r"\n\s*\n", text):
        if para.strip().startswith(start):
            return para
    return None


# --------------------------------------------------------------------------
# Checking a key's text against its entry
# --------------------------------------------------------------------------

# A number standing on its own: not part of a word or identifier (P100,
# sm_60, food11), not a version (2.51.0); thousands may be written 1,182.
_NUMBER = re.compile(r"(?<![\w.\-/])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?![\w.]\d|[\w])")


def numbers_in(text: str) -> list[float]:
    """Every stand-alone number in a key's text (HTML tags and the summary's words included)."""
    text = re.sub(r"<[^>]+>", " ", text)
    return [float(m.group(1).replace(",", "")) for m in _NUMBER.finditer(text)]


def key_for(notebook: str, summary: str) -> Key | None:
    """The entry for an answer-key cell, by notebook and <summary> text."""
    summary = summary.removeprefix("Answer key:").strip()
    for key in KEYS:
        if key.notebook == notebook and summary.lower().startswith(key.summary.lower()):
            return key
    return None


def _close(a: float, b: float) -> bool:
    # Figures are quoted rounded: 1.9 for 1.86, 13 for 12.75, 41.0 for 41.04.
    digits = len(f"{b:g}".split(".")[1]) if "." in f"{b:g}" else 0
    return abs(a - b) <= 0.5 * 10 ** -digits + 1e-9 or abs(a - b) <= 0.03 * abs(b)


def problems(key: Key, text: str) -> list[str]:
    """What is wrong between one key's text and its entry (empty when they agree)."""
    found = numbers_in(text)
    allowed = {FIGURES[n].value for n in key.figures} | set(key.settings)
    out = [f"{key.notebook} / {key.summary}: quotes {v:g}, which is in neither its figures nor its settings"
           for v in found if v not in allowed]
    for name in key.figures:
        if FIGURES[name].value not in found:
            out.append(f"{key.notebook} / {key.summary}: figure {name} = {FIGURES[name].value:g} is not quoted")
    return out


def formula_problems() -> list[str]:
    """Derived figures whose formula no longer gives their value."""
    values = {name: f.value for name, f in FIGURES.items()}
    out = []
    for f in FIGURES.values():
        if f.formula:
            got = eval(f.formula, {"__builtins__": {}}, values)  # eval of our own constant table, no builtins
            if not _close(got, f.value):
                out.append(f"{f.name}: {f.formula} = {got:.4g}, but the table says {f.value:g}")
    return out


def table() -> str:
    """The whole table as plain text."""
    rows = []
    for f in FIGURES.values():
        src = SOURCES[f.source]
        origin = f.formula if f.formula else f"{src.lab}; {src.hardware}; {src.where}"
        rows.append(f"{f.name:22} {f.value:>9g} {f.unit:8} {f.what}\n{'':41}from: {origin}")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    print(table())
    for name, src in SOURCES.items():
        print(f"\n[{name}] {src.lab}; {src.hardware}\n  where: {src.where}\n  code: {src.code}")
