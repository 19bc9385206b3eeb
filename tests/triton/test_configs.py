"""The lab's model repository: every config parses with Triton's own
ModelConfig schema and describes the real model; the local adaptations."""

from __future__ import annotations

import ast
import base64
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from servelab import triton
from servelab.core import food11, paths
from servelab.triton_runner import ONNX_RUNNER

from . import pbstub

pb = pytest.importorskip("tritonclient.grpc.model_config_pb2")
STAGING = paths.MODELS_STAGING
PIPELINE = ("food_pipeline", "food_preprocess", "food_postprocess")


def all_configs():
    return sorted(STAGING.glob("*/config.pbtxt"))


def test_the_bls_cascade_stands_apart_and_parses_with_tritons_schema():
    """models_bls/food_cascade is loaded by its lesson beside the lab's models, never with them."""
    cfg = triton.load_config(paths.MODELS_BLS / "food_cascade")
    assert cfg.name == "food_cascade" and cfg.backend == "python" and cfg.max_batch_size == 16
    assert [(g.count, g.kind) for g in cfg.instance_group] == [(1, pb.ModelInstanceGroup.KIND_CPU)]
    assert float(cfg.parameters["threshold"].string_value) == 0.5
    assert not (STAGING / "food_cascade").exists()


def test_every_config_parses_with_tritons_schema():
    configs = all_configs()
    assert {c.parent.name for c in configs} == {"food_classifier", "food_classifier_onnx", *PIPELINE}
    for path in configs:
        cfg = triton.load_config(path)
        assert isinstance(cfg, pb.ModelConfig)
        assert cfg.name == path.parent.name
        assert cfg.max_batch_size == 16
        if cfg.name in PIPELINE:
            continue  # the ensemble and its CPU steps: tests/triton/test_pipeline.py
        # As the lab starts: one instance on GPU 0.
        assert [(g.count, g.kind, list(g.gpus)) for g in cfg.instance_group] == [
            (1, pb.ModelInstanceGroup.KIND_GPU, [0])
        ]


def test_a_typo_in_a_config_is_caught_by_the_schema():
    with pytest.raises(ValueError, match="instance_groups"):
        triton.parse_config_text('name: "x"\ninstance_groups [{ count: 1 }]')


def test_onnx_config_matches_the_real_onnx_model(artifacts):
    import onnx

    cfg = triton.load_config(STAGING / "food_classifier_onnx")
    assert cfg.backend == "onnxruntime"
    model = onnx.load(str(artifacts["onnx"]), load_external_data=False)
    onnx_to_triton = {onnx.TensorProto.FLOAT: pb.TYPE_FP32}

    def shape(value_info):
        return [d.dim_value if d.HasField("dim_value") else -1 for d in value_info.type.tensor_type.shape.dim]

    real_inputs = [i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    for configured, real in ((cfg.input, real_inputs), (cfg.output, list(model.graph.output))):
        assert [c.name for c in configured] == [r.name for r in real]
        for c, r in zip(configured, real):
            assert onnx_to_triton[r.type.tensor_type.elem_type] == c.data_type
            dims = shape(r)
            # max_batch_size > 0: Triton adds the batch dimension, which must be dynamic.
            assert dims[0] == -1, f"{r.name} needs a dynamic batch dimension, has {dims}"
            assert dims[1:] == list(c.dims)
    assert list(cfg.output[0].dims) == [food11.NUM_CLASSES]


def test_python_model_config_matches_model_py_and_the_weights(artifacts):
    import torch

    cfg = triton.load_config(STAGING / "food_classifier")
    assert cfg.backend == "python"
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("INPUT_IMAGE", pb.TYPE_STRING, [1])]
    assert [(o.name, o.data_type, list(o.dims)) for o in cfg.output] == [
        ("FOOD_LABEL", pb.TYPE_STRING, [1]), ("PROBABILITY", pb.TYPE_FP32, [1]),
    ]
    # model.py reads and writes exactly the tensors the config declares.
    source = (STAGING / "food_classifier" / "1" / "model.py").read_text()
    strings = {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for name in ("INPUT_IMAGE", "FOOD_LABEL", "PROBABILITY"):
        assert name in strings
    # The weights it loads answer with one logit per Food-11 label.
    model = torch.load(artifacts["pth"], map_location="cpu", weights_only=False).eval()
    with torch.inference_mode():
        assert tuple(model(torch.zeros(2, 3, 224, 224)).shape) == (2, food11.NUM_CLASSES)


@pytest.mark.parametrize("path, version", [
    (STAGING / "food_classifier" / "1" / "model.py", (3, 10)),  # the container's Python
    (STAGING / "food_classifier" / "1" / "core_share.py", (3, 10)),
    (STAGING / "food_preprocess" / "1" / "model.py", (3, 10)),
    (STAGING / "food_postprocess" / "1" / "model.py", (3, 10)),
    (paths.MODELS_BLS / "food_cascade" / "1" / "model.py", (3, 10)),
    (ONNX_RUNNER, (3, 8)),
    (ONNX_RUNNER.parent / "accelerators.py", (3, 8)),  # the runner imports it inside Triton's stub
])
def test_model_code_parses_on_older_pythons(path, version, tmp_path):
    ast.parse(path.read_text(), filename=str(path), feature_version=version)
    compile(path.read_text(), str(path), "exec")
    # Where a real interpreter of that version is installed, let it compile the file too.
    name = f"python{version[0]}.{version[1]}"
    candidates = [*sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version[0]}.{version[1]}*/bin/{name}"))),
                  shutil.which(name)]
    older = next((c for c in candidates if c and subprocess.run(
        [c, "-c", "pass"], capture_output=True, timeout=30).returncode == 0), None)
    if older:
        out = tmp_path / "model.pyc"
        proc = subprocess.run([older, "-c", "import py_compile, sys; py_compile.compile(sys.argv[1], sys.argv[2], doraise=True)",
                               str(path), str(out)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr




def _food_classifier_model_py(monkeypatch):
    import importlib.util

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pbstub.stand_in())
    monkeypatch.syspath_prepend(str(STAGING / "food_classifier" / "1"))   # the stub puts the version folder on it
    monkeypatch.delitem(sys.modules, "core_share", raising=False)
    spec = importlib.util.spec_from_file_location("food_classifier_model_py", STAGING / "food_classifier" / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_model_py_refuses_a_precision_it_does_not_know(artifacts, monkeypatch):
    """Issue 49: config.pbtxt's parameter precision is fp32 or fp16; anything else stops the load with
    the parameter's name, never a silent fp32."""
    module = _food_classifier_model_py(monkeypatch)
    with pytest.raises(ValueError, match='parameter precision is "int8": use "fp32" or "fp16"'):
        module.TritonPythonModel().initialize({
            "model_instance_kind": "CPU", "model_instance_device_id": "0", "model_name": "x", "model_instance_name": "x_0",
            "model_config": json.dumps({"parameters": {"precision": {"string_value": "int8"}}})})


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_model_py_answers_each_request_with_the_softmax_top1(artifacts, sample_paths, monkeypatch, precision):
    """food_classifier's model.py run as Triton's Python backend runs it (initialize, then execute with
    a list of requests), with a stand-in for the backend's utilities: each request gets its own rows,
    the label of the largest logit and its softmax probability (not a sigmoid's), and a bad image
    fails only its own request. With precision fp16 (issue 49: the config parameter a GPU copy would
    use; torch computes FP16 on the CPU too) the labels are the same and the probabilities within 0.05 (0.017 at most on the samples, 2026-11-29)."""
    import torch

    module = _food_classifier_model_py(monkeypatch)
    group = f"test_model_py_{os.getpid()}"
    before = torch.get_num_threads()
    model = module.TritonPythonModel()
    try:
        config = {"parameters": {"precision": {"string_value": precision}}} if precision == "fp16" else {}
        model.initialize({"model_instance_kind": "CPU", "model_instance_device_id": "0", "model_name": group,
                          "model_instance_name": f"{group}_0", "model_config": json.dumps(config)})
        assert model.dtype == (torch.float16 if precision == "fp16" else torch.float32)
        images = [base64.b64encode(p.read_bytes()) for p in sample_paths[:4]]
        responses = model.execute([
            {"INPUT_IMAGE": np.array([[images[0]]], dtype=object)},
            {"INPUT_IMAGE": np.array([[base64.b64encode(b"text, not an image")]], dtype=object)},
            {"INPUT_IMAGE": np.array([[images[1]], [images[2]], [images[3]]], dtype=object)},  # -b 3
        ])
    finally:
        torch.set_num_threads(before)
        if hasattr(model, "cores"):
            model.finalize()
        for name in glob.glob(f"/dev/shm/servelab-cores-{os.getuid()}-{os.getppid()}-{group}"):
            os.unlink(name)
    # What the answers should be, from the weights directly: softmax over the 11 logits, then top-1.
    weights = torch.load(artifacts["pth"], map_location="cpu", weights_only=False).eval()
    with torch.inference_mode():
        batch = torch.from_numpy(np.stack([food11.preprocess_base64(i) for i in images]))
        probs = torch.softmax(weights(batch).double(), dim=1)
    expected = [(food11.LABELS[int(p.argmax())], float(p.max())) for p in probs]

    assert len(responses) == 3 and set(responses[1]) == {"error"}
    assert responses[1]["error"].code == pbstub.TritonError.INVALID_ARG and "not_an_image" in str(responses[1]["error"])
    got = []
    for r, rows in ((responses[0], 1), (responses[2], 3)):
        assert r["FOOD_LABEL"].shape == (rows, 1) and r["PROBABILITY"].shape == (rows, 1), r
        assert r["PROBABILITY"].dtype == np.float32
        got += [(label[0].decode(), float(prob[0])) for label, prob in zip(r["FOOD_LABEL"], r["PROBABILITY"])]
    assert [label for label, _ in got] == [label for label, _ in expected]
    assert [prob for _, prob in got] == pytest.approx([prob for _, prob in expected],
                                                      abs=0.05 if precision == "fp16" else 1e-5)


def test_localize_maps_gpu_to_cpu_and_onnx_to_the_runner():
    onnx_cfg = triton.load_config(STAGING / "food_classifier_onnx")
    local, notes = triton.localize_config(onnx_cfg, gpus=0)
    assert local.backend == "python" and triton.is_runner_config(local)
    assert local.parameters[triton.ONNX_FILE_PARAMETER].string_value == "model.onnx"
    assert [(g.kind, list(g.gpus)) for g in local.instance_group] == [(pb.ModelInstanceGroup.KIND_CPU, [])]
    assert any("no onnxruntime backend" in n for n in notes)
    assert any("KIND_CPU" in n for n in notes)
    # IO, batching and instance count are untouched.
    for field in ("input", "output", "max_batch_size"):
        assert getattr(local, field) == getattr(onnx_cfg, field)
    # Idempotent, and the source is not modified.
    again, _ = triton.localize_config(local, gpus=0)
    assert again == local
    assert onnx_cfg.backend == "onnxruntime"
    # With GPUs present KIND_GPU stays; out-of-range GPU ids are dropped.
    two = triton.apply_edit(triton.config_to_dict(onnx_cfg),
                                  {"instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1, 3]}]})
    gpu_local, _ = triton.localize_config(triton.dict_to_config(two), gpus=2)
    assert [(g.kind, list(g.gpus)) for g in gpu_local.instance_group] == [(pb.ModelInstanceGroup.KIND_GPU, [0, 1])]


def test_apply_edit_forms():
    base = triton.config_to_dict(triton.load_config(STAGING / "food_classifier"))
    on = triton.apply_edit(base, "dynamic_batching { }")
    assert "dynamic_batching" in on and "dynamic_batching" not in base
    delay = triton.apply_edit(base, {"dynamic_batching": {"max_queue_delay_microseconds": 2000}})
    assert int(delay["dynamic_batching"]["max_queue_delay_microseconds"]) == 2000
    off = triton.apply_edit(delay, {"dynamic_batching": None})
    assert "dynamic_batching" not in off

    def two_instances(cfg):
        cfg["instance_group"][0]["count"] = 2

    assert triton.apply_edit(base, two_instances)["instance_group"][0]["count"] == 2
    with pytest.raises(ValueError, match="instance_groups"):
        triton.apply_edit(base, {"instance_groups": [{"count": 2}]})
    with pytest.raises(ValueError):
        triton.apply_edit(base, {"max_batch_size": "sixteen"})


def test_runtime_repository_layout(tmp_path, artifacts):
    names, notes = triton.build_repository(tmp_path, gpus=0)
    assert names == ["food_classifier", "food_classifier_onnx", "food_pipeline", "food_postprocess", "food_preprocess"]
    onnx_version = tmp_path / "food_classifier_onnx" / "1"
    assert (onnx_version / "model.py").read_text() == ONNX_RUNNER.read_text()
    assert (onnx_version / "model.onnx").resolve() == artifacts["onnx"].resolve()
    py_version = tmp_path / "food_classifier" / "1"
    for lesson in ("model.py", "core_share.py"):   # and the files model.py imports from beside it
        assert (py_version / lesson).read_text() == (STAGING / "food_classifier" / "1" / lesson).read_text()
    assert (py_version / "food11.pth").resolve() == artifacts["pth"].resolve()
    # The generated config is valid for Triton and says what changed.
    text = (tmp_path / "food_classifier_onnx" / "config.pbtxt").read_text()
    assert "no onnxruntime backend" in text
    assert triton.load_config(tmp_path / "food_classifier_onnx").backend == "python"


def test_missing_artifacts_are_reported_with_the_build_command(tmp_path):
    src = tmp_path / "lab"
    (src / "food_classifier_onnx" / "1").mkdir(parents=True)
    (src / "food_classifier_onnx" / "config.pbtxt").write_text(
        (STAGING / "food_classifier_onnx" / "config.pbtxt").read_text())
    with pytest.raises(triton.TritonError, match="servelab models build"):
        triton.build_repository(tmp_path / "out", src, gpus=0)


def test_stub_for_this_python_exists():
    install = triton.find_install()
    assert install.server.is_file()
    assert install.stub().is_file(), f"no stub for Python {sys.version_info[:2]}"
