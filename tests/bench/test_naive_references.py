"""bench_naive.py's references (benchmarks/naive/): the plain ones share nothing with the
kit, and every reference answers like the kit (same top-1, same probability) on the
sample images with the same weights, so a ratio to them compares like with like."""

from __future__ import annotations

import ast
import base64
import importlib.util
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
