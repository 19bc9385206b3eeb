"""bench_naive.py's references (benchmarks/naive/): the plain ones share nothing with the
kit, and every reference answers like the kit (same top-1, same probability) on the
sample images with the same weights, so a ratio to them compares like with like."""

from __future__ import annotations

import ast
import base64
import importlib.util
import os
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from servelab.core import food11, paths

REPO = Path(__file__).resolve().parents[2]
NAIVE = REPO / "benchmarks" / "naive"
PLAIN = [NAIVE / "fastapi_pt_plain.py", NAIVE / "fastapi_onnx_plain.py", NAIVE / "food_classifier_plain" / "1" / "model.py"]
# The samples without transparency: on a transparent one the plain code's convert("RGB") keeps
# the colours under the alpha channel, the kit composites on white (food11._to_rgb), so the two
# see different pictures (fried_egg.png: a different top-1 with the demo weights).
SAMPLES = [p for p in sorted(paths.SAMPLES_DIR.glob("*.*")) if "A" not in Image.open(p).mode]
PTH, ONNX = REPO / "fastapi_pt" / "food11.pth", REPO / "fastapi_onnx" / "food11.onnx"


def test_the_benchmark_photo_is_among_the_samples_compared():
    assert len(SAMPLES) >= 4 and paths.SAMPLES_DIR / "soup_bowl.jpg" in SAMPLES


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__"):
            names.add("<dynamic import>")
    return names


@pytest.mark.parametrize("path", PLAIN, ids=lambda p: p.parent.parent.name if p.name == "model.py" else p.name)
def test_plain_references_import_nothing_from_the_kit(path):
    names = imported_modules(path)
    assert not {n for n in names if n.split(".")[0] in ("servelab", "") or n == "<dynamic import>"}, names
    assert "sys" not in names and "importlib" not in names   # no path trick either


def test_the_import_check_sees_a_kit_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nif True:\n    from servelab.core import food11\n")
    assert "servelab.core" in imported_modules(bad)


def load(path: Path, name: str, monkeypatch, **env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kit_answers():
    """The kit's answer for every sample: its decoding and preprocessing, the same weights."""
    model = torch.load(PTH, map_location="cpu", weights_only=False).eval()
    with torch.inference_mode():
        x = torch.from_numpy(food11.preprocess_batch([p.read_bytes() for p in SAMPLES]))
        return food11.predict_from_logits(model(x).numpy())


@pytest.mark.parametrize("app, model", [("fastapi_pt_plain", PTH), ("fastapi_onnx_plain", ONNX),
                                        ("fastapi_pt_shared", PTH), ("fastapi_onnx_shared", ONNX)])
def test_fastapi_references_answer_like_the_kit(app, model, kit_answers, monkeypatch):
    module = load(NAIVE / f"{app}.py", f"ref_{app}", monkeypatch, MODEL_PATH=str(model))
    for sample, kit in zip(SAMPLES, kit_answers):
        request = getattr(module, "ImageRequest", None) or module.PredictRequest   # plain / shared
        answer = module.predict(request(image=base64.b64encode(sample.read_bytes()).decode()))
        answer = answer if isinstance(answer, dict) else answer.model_dump()
        assert answer["prediction"] == kit.label, sample.name
        assert answer["probability"] == pytest.approx(kit.probability, abs=2e-3), sample.name


class FakeTensor:
    def __init__(self, name, array):
        self.name, self.array = name, array

    def as_numpy(self):
        return self.array


def fake_pb_utils() -> types.ModuleType:
    """The three names of triton_python_backend_utils a plain model.py uses."""
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor = FakeTensor
    pb.get_input_tensor_by_name = lambda request, name: FakeTensor(name, request[name])
    pb.InferenceResponse = lambda output_tensors: {t.name: t.array for t in output_tensors}
    return pb


@pytest.mark.parametrize("threads", ["", "1"])
def test_plain_triton_model_answers_like_the_kit(threads, kit_answers, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_pb_utils())
    folder = tmp_path / "food_classifier_plain" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_bytes((PLAIN[2]).read_bytes())
    (folder / "food11.pth").symlink_to(PTH)
    module = load(folder / "model.py", "plain_triton_model", monkeypatch)
    before = torch.get_num_threads()
    try:
        model = module.TritonPythonModel()
        config = '{"parameters": {"reference_threads": {"string_value": "%s"}}}' % threads
        model.initialize({"model_config": config})
        encoded = [base64.b64encode(p.read_bytes()) for p in SAMPLES]
        # one request per image, then the images two to a request (-b 2): each gets its own rows back
        single = model.execute([{"INPUT_IMAGE": np.array([[e]], dtype=object)} for e in encoded])
        paired = model.execute([{"INPUT_IMAGE": np.array([[a], [b]], dtype=object)}
                                for a, b in zip(encoded[::2], encoded[1::2])])
    finally:
        torch.set_num_threads(before)
    assert [r["FOOD_LABEL"].shape for r in single] == [(1, 1)] * len(SAMPLES)
    assert [r["FOOD_LABEL"].shape for r in paired] == [(2, 1)] * (len(SAMPLES) // 2)
    rows = [(label[0].decode(), prob[0]) for r in single for label, prob in zip(r["FOOD_LABEL"], r["PROBABILITY"])]
    paired_rows = [(label[0].decode(), prob[0]) for r in paired
                   for label, prob in zip(r["FOOD_LABEL"], r["PROBABILITY"])]
    for (label, prob), kit in zip(rows, kit_answers):
        assert label == kit.label and prob == pytest.approx(kit.probability, abs=2e-3)
    assert [label for label, _ in paired_rows] == [label for label, _ in rows[:len(paired_rows)]]


def _bench_naive():
    spec = importlib.util.spec_from_file_location("bench_naive_under_test", REPO / "benchmarks" / "bench_naive.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sequential_sides_take_turns_so_a_drifting_host_weighs_on_each_alike(monkeypatch):
    """Three equally fast sides on a host that slows down 3x during the run: taken in turns of
    ten, their throughputs agree; whole runs one after another would differ ~2x."""
    bench = _bench_naive()
    calls = []

    def post_once(url, payload):
        calls.append(url)
        return 0.010 * (1 + 2 * len(calls) / 330)   # 10 ms at the start, 30 ms at the end

    monkeypatch.setattr(bench, "post_once", post_once)
    out = bench.interleaved_sequential({"kit": "k", "plain": "p", "shared": "s"}, {}, 100)
    assert [calls.count(u) for u in "kps"] == [110, 110, 110]   # 10 turns: 10 timed + 1 untimed each
    assert "".join(calls[:33]) + calls[33] == "k" * 11 + "p" * 11 + "s" * 11 + "p"   # the first side rotates
    rates = [out[k]["throughput"] for k in ("kit", "plain", "shared")]
    assert max(rates) / min(rates) < 1.02, rates
    assert all(out[k]["count"] == 100 and out[k]["failed"] == 0 for k in out)


def test_a_sides_first_request_after_another_side_is_not_timed(monkeypatch):
    """The server answered just before keeps its inference threads spinning for a moment: the
    first request after a switch pays for it (here 3x), and is not part of any side's figure."""
    bench = _bench_naive()
    last = [None]

    def post_once(url, payload):
        switched, last[0] = last[0] != url, url
        return 0.030 if switched else 0.010

    monkeypatch.setattr(bench, "post_once", post_once)
    out = bench.interleaved_sequential({"kit": "k", "plain": "p"}, {}, 25, block=10)
    assert [out[k]["count"] for k in out] == [25, 25]   # turns of 10, 10 and 5
    assert all(out[k]["throughput"] == pytest.approx(100.0) for k in out), out


def test_sequential_figures_pool_every_round_of_a_side():
    """A side's sequential figure is every round's requests over their summed latency (the kit and
    the references interleaved request by request), not the best round picked apart from the others'."""
    bench = _bench_naive()
    rounds = [bench.loop_result([0.010] * 4), bench.loop_result([0.030, 0.030, None, 0.030, 0.030])]
    assert [r["throughput"] for r in rounds] == pytest.approx([100.0, 100 / 3])
    both = bench.pooled(rounds)
    assert (both["count"], both["failed"]) == (8, 1)
    assert both["throughput"] == pytest.approx(8 / 0.16)   # not the best round's 100/s


# --------------------------------------------------------------------------
# How a row is judged: ratios of runs taken side by side, and their sign-test interval
# --------------------------------------------------------------------------

def test_the_interval_of_eight_pairs_leaves_out_the_most_extreme_pair_on_each_side():
    """Eight pairs (four rounds, two passes): the interval from the 2nd to the 7th holds the
    median with 93 % confidence, so one pair spoiled by a slow moment does not decide the row."""
    bench = _bench_naive()
    value, low, high, conf = bench.spread([1.02, 0.60, 1.00, 0.99, 1.04, 1.01, 1.40, 0.98])
    assert (value, low, high) == pytest.approx((1.005, 0.98, 1.04))
    assert conf == pytest.approx(1 - 2 * 9 / 256)
    assert bench.judge([1.02, 0.60, 1.00, 0.99, 1.04, 1.01, 1.40, 0.98], 0.95)["verdict"] == "PASS"


def test_with_few_pairs_the_interval_is_their_whole_range_and_says_how_sure_it_is():
    bench = _bench_naive()
    assert bench.spread([1.0, 0.9, 1.1, 1.2]) == pytest.approx((1.05, 0.9, 1.2, 1 - 2 / 16))
    assert bench.spread([0.8, 1.0]) == pytest.approx((0.9, 0.8, 1.0, 0.5))
    forty = bench.spread([1 + (i - 20) / 100 for i in range(40)])   # 0.80 ... 1.19
    assert forty[3] >= 0.9 and 0.88 < forty[1] < forty[2] < 1.12


@pytest.mark.parametrize("pairs, target, said", [
    ([0.96, 0.97, 1.0, 1.1], (0.95,), "PASS"),
    ([0.80, 0.90, 0.93, 0.94], (0.95,), "FAIL"),
    ([0.90, 0.97, 1.0, 1.1], (0.95,), "INCONCLUSIVE (0.90 - 1.10 spans the target)"),
    ([0.90, 1.0, 1.1, 1.12], (0.85, 1.15), "PASS"),
    ([1.16, 1.2, 1.3, 1.4], (0.85, 1.15), "FAIL"),
    ([1.0, 1.1, 1.2, 1.3], (0.85, 1.15), "INCONCLUSIVE (1.00 - 1.30 spans the target)"),
    ([float("nan")], (0.95,), "INCONCLUSIVE (no measurement)"),
    ([1.2], (0.95,), "INCONCLUSIVE (one pair: no interval)"),
])
def test_a_row_is_judged_only_when_its_whole_interval_lies_on_one_side(pairs, target, said):
    assert _bench_naive().judge(pairs, *target)["verdict"] == said


def test_sequential_pairs_are_turns_of_ten_requests_taken_side_by_side():
    """A host twice as slow in the second turn: each turn's ratio is still 1.25, where the
    rounds' whole figures would mix the two speeds."""
    bench = _bench_naive()
    kit = bench.loop_result([0.008] * 10 + [0.016] * 10)
    ref = bench.loop_result([0.010] * 10 + [0.020] * 5 + [None] + [0.020] * 4)
    assert bench.turn_pairs([kit], [ref]) == pytest.approx([1.25, 1.25])
    assert bench.turn_pairs([{"throughput": 50.0}], [{"throughput": 40.0}]) == [1.25]   # a saved log's round


def test_count_2_meets_the_reference_setting_that_was_better_in_each_round():
    bench = _bench_naive()

    def runs(*rates):
        return [{"throughput": r} for r in rates]

    kit = runs(60, 62, 50, 52)                  # two rounds of two passes
    one_thread = runs(50, 52, 40, 40)
    default = runs(30, 55)                      # once a round: worse in round 1, better in round 2
    assert bench.best_setting_pairs(kit, one_thread, default, 2) == pytest.approx([1.2, 62 / 52, 50 / 55, 52 / 55])
    assert bench.best_setting_pairs(kit, one_thread, [], 2) == pytest.approx([1.2, 62 / 52, 1.25, 1.3])


def test_a_saved_runs_printout_is_judged_again_and_a_drop_beyond_both_intervals_is_named():
    """An earlier run kept only what it printed (docs/benchmark-runs/): its rows come back with
    two passes a round; a row counts as dropped only when the two runs' intervals do not meet."""
    bench = _bench_naive()
    before = bench.load_run(REPO / "docs" / "benchmark-runs" / "2026-11-29-bench_naive-before-47.txt")
    rows = {r["figure"]: r for r in bench.table(before["fastapi"], before["triton_pt"], before["triton_onnx"],
                                                 before["idle_cpu_percent"], before["rounds"])}
    assert len(rows) == 19 and before["rounds"] == 2
    c8 = rows["Triton food_classifier count 1 / plain, concurrency 8"]
    assert len(c8["pairs"]) == 4 and c8["pairs"][:2] == pytest.approx([23.6 / 25.8, 24.5 / 26.9])
    assert len(rows["FastAPI ONNX sequential / plain"]["pairs"]) == 2   # no latencies kept: a pair a round
    assert rows["CPU of the busiest idle server process (% of a core)"]["value"] == pytest.approx(0.2)

    after = [dict(r) for r in rows.values()]
    moved = {"Triton food_classifier count 1 / plain, concurrency 8": 0.5,      # far below
             "count 2 / count 1, concurrency 8": 0.95}                           # inside the spread
    for r in after:
        if r["figure"] in moved:
            r.update({k: r[k] * moved[r["figure"]] for k in ("value", "low", "high")})
    said = {line.split("  ")[1].strip(): line for line in bench.compare(before, after)[1:]}
    assert said["Triton food_classifier count 1 / plain, concurrency 8"].endswith("DROPPED beyond both runs' spread")
    assert said["count 2 / count 1, concurrency 8"].endswith("within the spread")
    assert said["FastAPI ONNX sequential / plain"].endswith("within the spread")
    # one idle-CPU reading a run: no spread, so no verdict on a change, whatever the two values
    cpu = "CPU of the busiest idle server process (% of a core)"
    assert said[cpu].endswith("no spread to judge a change by")
    after = [r | ({"value": 0.4, "low": 0.4, "high": 0.4, "pairs": [0.4]} if r["figure"] == cpu else {}) for r in after]
    said = {line.split("  ")[1].strip(): line for line in bench.compare(before, after)[1:]}
    assert said[cpu].endswith("no spread to judge a change by") and " 0.40 (0.40-0.40)" in said[cpu]


def test_pooled_runs_are_judged_on_all_their_pairs_and_runs_of_two_sizes_are_refused(capsys):
    """--pool: the same runs twice give every row twice the pairs (and the same median); a run
    with another number of runs a round cannot be paired with the first, and is refused."""
    import copy

    bench = _bench_naive()
    run = bench.load_run(REPO / "docs" / "benchmark-runs" / "2026-11-29-bench_naive-before-47.txt")
    one = {r["figure"]: r for r in bench.table(run["fastapi"], run["triton_pt"], run["triton_onnx"],
                                                run["idle_cpu_percent"], run["rounds"])}
    both = bench.pool([run, copy.deepcopy(run)])
    assert both["rounds"] == 2 * run["rounds"]
    two = {r["figure"]: r for r in bench.table(both["fastapi"], both["triton_pt"], both["triton_onnx"],
                                                both["idle_cpu_percent"], both["rounds"])}
    c8 = "Triton food_classifier count 1 / plain, concurrency 8"
    assert len(two[c8]["pairs"]) == 2 * len(one[c8]["pairs"]) == 8
    assert two[c8]["value"] == pytest.approx(one[c8]["value"])
    assert len(two["count 2 / plain count 2 (best thread setting), concurrency 8"]["pairs"]) == 8
    bigger = copy.deepcopy(run)
    bigger["triton_pt"]["runs"]["kit count1 c8"].append({"throughput": 1.0})
    with pytest.raises(ValueError, match="not the size of run 1"):
        bench.pool([run, bigger])
    # the command: measures nothing, prints the pooled table, and the comparison with --before
    saved = REPO / "docs" / "benchmark-runs" / "2026-11-29-bench_naive-before-47.txt"
    assert bench.main(["--pool", str(saved), str(saved), "--before", str(saved)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 runs pooled") and "4 rounds" in out and f"{c8}  " in out
    assert "Before (2026-11-29-bench_naive-before-47.txt) and after (these runs pooled)" in out


@pytest.mark.e2e
@pytest.mark.parametrize("which", ["kit", "plain"])
def test_the_request_profile_runs_on_the_lesson_file_and_the_plain_reference(which):
    """benchmarks/naive/profile_pt_request.py, the diagnostic behind issue 36's profile: every
    stage timed, none failing (the kit's predict() takes the Response it writes Server-Timing on)."""
    import subprocess

    proc = subprocess.run([sys.executable, str(NAIVE / "profile_pt_request.py"), which, "--requests", "3"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    walls = [float(w) for w in re.findall(r"wall\s+([\d.]+) ms", proc.stdout)]
    assert len(walls) == (6 if which == "kit" else 5) and all(w > 0 for w in walls), proc.stdout
    stages = dict(re.findall(r"^  (.+?)\s+wall\s+([\d.]+) ms", proc.stdout, re.M))
    assert float(stages["predict() in a worker thread"]) > float(stages["  decode + preprocess (servelab.core.food11)"
                                                                         if which == "kit" else
                                                                         "  decode + preprocess (PIL + torchvision)"]), \
        proc.stdout
