"""``optimization { execution_accelerators { ... } }`` in the local ONNX runner
(servelab/triton_runner/accelerators.py): the names and parameters Triton 24.10's onnxruntime
backend accepts, OpenVINO on the CPU honoured, everything else refused when the model loads with a
message naming the accelerator; then a real Triton loading, serving and logging it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from servelab import triton
from servelab.core import paths
from servelab.course import lab
from servelab.triton_runner import accelerators as acc
from tests.tiers import tier
from tests.triton.conftest import logits

OPENVINO = 'optimization { execution_accelerators { cpu_execution_accelerator : [ { name : "openvino" } ] } }'
OV_MODEL = "food_classifier_onnx_openvino"
PLANTED = "food_classifier_onnx_openvinox"


def _config(cpu=(), gpu=()):
    eas = {}
    if cpu:
        eas[acc.CPU_FIELD] = [dict(e) for e in cpu]
    if gpu:
        eas[acc.GPU_FIELD] = [dict(e) for e in gpu]
    return {"optimization": {"execution_accelerators": eas}}


def test_no_accelerator_runs_onnx_runtime_as_before():
    assert acc.plan({}, "m") == acc.Plan(None, None)
    assert acc.plan({"optimization": {"priority": "PRIORITY_MAX"}}, "m") == acc.Plan(None, None)


def test_the_lessons_block_parses_with_tritons_schema_and_asks_for_openvino():
    cfg = triton.config_to_dict(triton.parse_config_text(f'name: "m"\n{OPENVINO}'))
    assert acc.requested(cfg) == [(acc.CPU_FIELD, "openvino", {})]
    assert acc.plan(cfg, "m", openvino_version="2026.4.1") == acc.Plan("openvino", None)
    # the kit's local translation keeps the block (the runner reads it from the config Triton hands it)
    local, _ = triton.localize_config(triton.parse_config_text(
        (paths.MODELS_STAGING / "food_classifier_onnx" / "config.pbtxt").read_text() + OPENVINO), gpus=0)
    assert acc.requested(triton.config_to_dict(local)) == [(acc.CPU_FIELD, "openvino", {})]


@pytest.mark.parametrize("config, on_gpu, words", [
    (_config(cpu=[{"name": "openvinox"}]), False, ["unknown Execution Accelerator 'openvinox'", "'openvino'"]),
    (_config(cpu=[{"name": "tensorrt"}]), False, ["unknown Execution Accelerator 'tensorrt'", acc.CPU_FIELD]),
    (_config(gpu=[{"name": "openvino"}]), True, ["unknown Execution Accelerator 'openvino'", acc.GPU_FIELD]),
    (_config(gpu=[{"name": "tensorrt"}]), False, ["'tensorrt' needs a GPU instance", "refuses it"]),
    (_config(gpu=[{"name": "cuda"}]), False, ["'cuda' needs a GPU instance"]),
    (_config(gpu=[{"name": "tensorrt"}]), True, ["'tensorrt'", "no TensorRT provider"]),
    (_config(cpu=[{"name": "openvino", "parameters": {"device_type": "GPU"}}]), False,
     ["'openvino' takes no parameters", "device_type"]),
    (_config(cpu=[{"name": "openvino"}]), True, ["'openvino' on a GPU instance"]),
])
def test_what_the_runner_cannot_honour_is_refused_by_name(config, on_gpu, words):
    with pytest.raises(acc.AcceleratorError) as err:
        acc.plan(config, "food_classifier_onnx", on_gpu, "2026.4.1", ["CUDAExecutionProvider", "CPUExecutionProvider"])
    message = str(err.value)
    assert message.startswith("food_classifier_onnx: ")
    for word in words:
        assert word in message, message


def test_openvino_missing_is_refused_with_the_pin():
    with pytest.raises(acc.AcceleratorError, match=r"'openvino' is requested but OpenVINO is not installed.*"
                                                   + acc.OPENVINO_PIN.replace(".", r"\.")):
        acc.plan(_config(cpu=[{"name": "openvino"}]), "m", openvino_version=None)


def test_gpu_accelerators_on_a_gpu_instance_map_to_onnx_runtime_providers():
    trt = [{"name": "tensorrt", "parameters": {"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824",
                                               "trt_engine_cache_enable": "1"}}]
    providers = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert acc.plan(_config(gpu=trt), "m", True, providers=providers).gpu == ("TensorrtExecutionProvider", {
        "trt_fp16_enable": "True", "trt_max_workspace_size": "1073741824", "trt_engine_cache_enable": "1"})
    assert acc.plan(_config(gpu=[{"name": "cuda"}]), "m", True).gpu == ("CUDAExecutionProvider", {})
    for params, words in (({"precision_mode": "FP8"}, "unsupported precision mode 'FP8'"),
                          ({"workspace": "1"}, "unknown parameter 'workspace'")):
        with pytest.raises(acc.AcceleratorError, match=words):
            acc.plan(_config(gpu=[{"name": "tensorrt", "parameters": params}]), "m", True, providers=providers)


def test_openvino_session_answers_as_onnx_runtime(artifacts, reference):
    import onnxruntime as ort

    assert acc.openvino_version() is not None, f"OpenVINO is pinned in the kit's onnx extra ({acc.OPENVINO_PIN})"
    batch = np.concatenate([reference["inputs"], np.random.default_rng(0).standard_normal(
        (10, 3, 224, 224)).astype(np.float32)])
    session = acc.OpenVINOSession(str(artifacts["onnx"]), threads=1)
    assert [i.name for i in session.get_inputs()] == ["input"] and [o.name for o in session.get_outputs()] == ["output"]
    want = ort.InferenceSession(str(artifacts["onnx"]), providers=["CPUExecutionProvider"]).run(["output"], {"input": batch})[0]
    got = session.run(["output"], {"input": batch})[0]
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-3, rtol=0)
    np.testing.assert_allclose(session.run(["output"], {"input": batch[:1]})[0], want[:1], atol=1e-3, rtol=0)


# --------------------------------------------------------------------------
# A real Triton


def _variant(source, name: str, block: str) -> None:
    """A copy of the kit's ONNX model under ``name``, on the CPU, with ``block`` added (the lesson's recipe)."""
    folder = source / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "food_classifier_onnx" / "1" / "model.onnx", folder / "1" / "model.onnx")
    shutil.copy(source / "food_classifier_onnx" / "labels.txt", folder / "labels.txt")  # its label_filename
    text = (source / "food_classifier_onnx" / "config.pbtxt").read_text()
    text = text.replace('name: "food_classifier_onnx"', f'name: "{name}"')
    text = text.replace("kind: KIND_GPU\n    gpus: [ 0 ]", "kind: KIND_CPU")
    (folder / "config.pbtxt").write_text(text + "\n" + block + "\n")


@pytest.fixture(scope="module")
@tier("integration")
def ov_triton(start_triton, tmp_path_factory, artifacts):
    """Triton on a private repository: the kit's ONNX model and its OpenVINO variant."""
    assert acc.openvino_version() is not None, f"OpenVINO is pinned in the kit's onnx extra ({acc.OPENVINO_PIN})"
    source = tmp_path_factory.mktemp("repo") / "models"
    (source / "food_classifier_onnx" / "1").mkdir(parents=True)
    shutil.copy(artifacts["onnx"], source / "food_classifier_onnx" / "1" / "model.onnx")
    for name in ("config.pbtxt", "labels.txt"):
        shutil.copy(paths.MODELS_STAGING / "food_classifier_onnx" / name, source / "food_classifier_onnx")
    _variant(source, OV_MODEL, OPENVINO)
    server = start_triton(repo=source, models=["food_classifier_onnx", OV_MODEL])
    yield server
    server.stop()


def test_triton_serves_openvino_and_its_log_names_it(ov_triton, reference):
    start = (str(ov_triton.log_path), 0)  # the runner's own lines reach the log a moment after READY
    log = lab.triton_log_since(start, OV_MODEL, wait_for=f"{OV_MODEL}: cpu_execution_accelerator openvino (OpenVINO ")
    line = next((x for x in log.splitlines() if f"{OV_MODEL}: cpu_execution_accelerator openvino (OpenVINO " in x),
                None)
    assert line is not None, ov_triton.log_tail()
    assert f"OpenVINO {acc.openvino_version()})" in line
    # the default model still runs ONNX Runtime
    assert "food_classifier_onnx_0_0: onnxruntime" in lab.triton_log_since(start, "food_classifier_onnx_0_0",
                                                                          wait_for="onnxruntime")
    batch = np.concatenate([reference["inputs"], np.random.default_rng(1).standard_normal(
        (4, 3, 224, 224)).astype(np.float32)])
    np.testing.assert_allclose(logits(ov_triton, OV_MODEL, batch), logits(ov_triton, "food_classifier_onnx", batch),
                               atol=1e-3, rtol=0)


def test_a_planted_unknown_name_fails_the_load_with_its_name(ov_triton):
    _variant(ov_triton.source, PLANTED, OPENVINO.replace('"openvino"', '"openvinox"'))
    mark = lab.triton_log_mark(ov_triton.grpc_url)
    try:
        with pytest.raises(Exception, match="unknown Execution Accelerator 'openvinox' is requested"):
            lab.reload_from_files(PLANTED, ov_triton.grpc_url, ov_triton.admin_key)
        assert lab.models_in_repository(ov_triton.grpc_url, ov_triton.admin_key).get(PLANTED) == "UNAVAILABLE"
        assert "unknown Execution Accelerator 'openvinox'" in lab.triton_log_since(mark, PLANTED)
        assert ov_triton.http_client().is_model_ready(OV_MODEL)  # the others serve on
    finally:
        lab.remove_model(PLANTED, ov_triton.source, ov_triton.grpc_url, ov_triton.admin_key)
