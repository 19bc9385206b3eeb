"""A real local Triton with the lab's two models, as the lab starts them:
readiness, answers identical to the artifacts, bad input, the locked
repository API, loopback binding."""

from __future__ import annotations

import base64
import urllib.request

import numpy as np
import pytest

from servelab.core import food11, paths
from servelab.triton import (
    GRPC_ADMIN_HEADER,
    HTTP_ADMIN_HEADER,
    RUNNER_PARAMETER,
    config_to_dict,
    load_config,
    reload_model,
)
from tests.services.helpers import scan_bomb_jpeg, truncated_jpeg_with_end

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

TOL = 1e-4


@pytest.fixture(scope="module")
def triton(lab_triton):
    return lab_triton


def _image_input(module, images: list[bytes]):
    inp = module.InferInput("INPUT_IMAGE", [len(images), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[b] for b in images], dtype=object))
    return inp


def _tensor_input(module, array: np.ndarray, name="input", datatype="FP32"):
    inp = module.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


def test_both_models_ready_over_http_and_grpc(triton):
    http, grpc = triton.http_client(), triton.grpc_client()
    assert http.is_server_ready() and grpc.is_server_ready()
    for name in ("food_classifier", "food_classifier_onnx"):
        assert http.is_model_ready(name) and grpc.is_model_ready(name)
    assert len(triton.stub_processes("food_classifier")) == 1
    assert len(triton.stub_processes("food_classifier_onnx")) == 1
    # The local adaptations are said, not hidden.
    assert any("no onnxruntime backend" in n for n in triton.notes)


def test_reported_configs_keep_the_labs_io(triton):
    for name in ("food_classifier", "food_classifier_onnx"):
        source = config_to_dict(load_config(paths.MODELS_STAGING / name))
        reported = triton.model_config(name)
        for key in ("input", "output"):
            assert [(t["name"], t["data_type"], t["dims"]) for t in reported[key]] == \
                   [(t["name"], t["data_type"], t["dims"]) for t in source[key]]
        assert reported["max_batch_size"] == 16
    onnx_cfg = triton.model_config("food_classifier_onnx")
    assert onnx_cfg["parameters"][RUNNER_PARAMETER]["string_value"] == "onnxruntime"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_python_model_matches_pytorch_on_the_artifact(triton, reference, sample_b64, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = triton.http_client() if protocol == "http" else triton.grpc_client()
    names = reference["names"]
    # One image per request ...
    for name in names:
        result = client.infer("food_classifier", [_image_input(module, [sample_b64[name]])])
        label = result.as_numpy("FOOD_LABEL").reshape(-1)[0].decode()
        prob = float(result.as_numpy("PROBABILITY").reshape(-1)[0])
        assert label == reference["pt"][name].label
        assert abs(prob - reference["pt"][name].probability) < TOL
    # ... and all of them in one request (a client-side batch).
    result = client.infer("food_classifier", [_image_input(module, [sample_b64[n] for n in names])])
    labels = [x.decode() for x in result.as_numpy("FOOD_LABEL").reshape(-1)]
    probs = result.as_numpy("PROBABILITY").reshape(-1)
    assert result.as_numpy("PROBABILITY").shape == (len(names), 1)
    assert labels == [reference["pt"][n].label for n in names]
    assert np.allclose(probs, [reference["pt"][n].probability for n in names], atol=TOL)
    # Softmax probabilities: at least 1/11 for a top-1 label, at most 1.
    assert all(1 / food11.NUM_CLASSES - TOL <= p <= 1 + TOL for p in probs)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_onnx_model_matches_onnxruntime_on_the_artifact(triton, reference, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = triton.http_client() if protocol == "http" else triton.grpc_client()
    batch = reference["inputs"]
    result = client.infer("food_classifier_onnx", [_tensor_input(module, batch)])
    logits = result.as_numpy("output")
    assert logits.shape == (len(batch), food11.NUM_CLASSES)
    expected = np.stack([reference["onnx_logits"][n] for n in reference["names"]])
    assert np.abs(logits - expected).max() < TOL
    # Client-side softmax gives the same answer as the PyTorch model.
    for pred, name in zip(food11.predict_from_logits(logits), reference["names"]):
        assert pred.label == reference["pt"][name].label
        assert abs(pred.probability - reference["pt"][name].probability) < TOL


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_onnx_model_serves_its_labels_through_the_classification_extension(triton, reference, protocol):
    """Triton's conventions, as a stock image client expects them (issue 47): the input's layout in the
    config, and the label names served by Triton (label_filename), top k through the classification
    extension: each entry "score:index:label", best first."""
    module = httpclient if protocol == "http" else grpcclient
    client = triton.http_client() if protocol == "http" else triton.grpc_client()
    cfg = triton.model_config("food_classifier_onnx")
    assert cfg["input"][0]["format"] == "FORMAT_NCHW" and cfg["output"][0]["label_filename"] == "labels.txt"
    result = client.infer("food_classifier_onnx", [_tensor_input(module, reference["inputs"])],
                          outputs=[module.InferRequestedOutput("output", class_count=3)])
    top = result.as_numpy("output")
    assert top.shape == (len(reference["names"]), 3)
    for row, name in zip(top, reference["names"]):
        logits = reference["onnx_logits"][name]
        best = list(np.argsort(-logits)[:3])
        entries = [x.decode().split(":", 2) for x in row]
        assert [int(i) for _, i, _ in entries] == best
        assert [label for _, _, label in entries] == [food11.LABELS[i] for i in best]
        assert np.allclose([float(score) for score, _, _ in entries], logits[best], atol=TOL)
        assert entries[0][2] == reference["pt"][name].label  # the same answer as the kit's own client


def _error_of(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def _still_serving(triton, sample_b64):
    assert triton.ready()
    result = triton.http_client().infer(
        "food_classifier", [_image_input(httpclient, [next(iter(sample_b64.values()))])])
    assert result.as_numpy("FOOD_LABEL").shape == (1, 1)


def test_wrong_shape_and_dtype_get_clear_400s(triton, sample_b64):
    http, grpc = triton.http_client(), triton.grpc_client()
    bad_shape = np.zeros((1, 3, 224, 225), np.float32)
    err = _error_of(lambda: http.infer("food_classifier_onnx", [_tensor_input(httpclient, bad_shape)]))
    assert err.status() == "400" and "unexpected shape" in err.message()
    err = _error_of(lambda: grpc.infer("food_classifier_onnx", [_tensor_input(grpcclient, bad_shape)]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "unexpected shape" in err.message()
    err = _error_of(lambda: http.infer(
        "food_classifier_onnx", [_tensor_input(httpclient, np.zeros((1, 3, 224, 224), np.float64), datatype="FP64")]))
    assert err.status() == "400" and "FP64" in err.message()
    err = _error_of(lambda: http.infer(
        "food_classifier", [_tensor_input(httpclient, np.zeros((1, 1), np.int32), "INPUT_IMAGE", "INT32")]))
    assert err.status() == "400" and "BYTES" in err.message()
    # More than max_batch_size in one request: the runner's config is honoured.
    err = _error_of(lambda: http.infer(
        "food_classifier_onnx", [_tensor_input(httpclient, np.zeros((17, 3, 224, 224), np.float32))]))
    assert err.status() == "400" and "batch-size must be <= 16" in err.message()
    _still_serving(triton, sample_b64)


def test_bad_images_get_their_own_error(triton, sample_b64):
    http, grpc = triton.http_client(), triton.grpc_client()
    cases = {
        base64.b64encode(b"this is not an image at all"): "not_an_image",
        b"@@not base64@@": "invalid_base64",
        base64.b64encode(base64.b64decode(sample_b64["soup_bowl.jpg"])[:600]): "truncated_image",
        base64.b64encode(truncated_jpeg_with_end()): "truncated_image",
        base64.b64encode(scan_bomb_jpeg()): "image_too_large",
    }
    for payload, code in cases.items():
        err = _error_of(lambda: http.infer("food_classifier", [_image_input(httpclient, [payload])]))
        assert err.status() == "400" and code in err.message(), err
        err = _error_of(lambda: grpc.infer("food_classifier", [_image_input(grpcclient, [payload])]))
        assert err.status() == "StatusCode.INVALID_ARGUMENT" and code in err.message()
    _still_serving(triton, sample_b64)


def test_unknown_model_is_a_client_error(triton, sample_b64):
    err = _error_of(lambda: triton.http_client().infer(
        "no_such_model", [_image_input(httpclient, [next(iter(sample_b64.values()))])]))
    assert err.status() in ("400", "404") and "no_such_model" in err.message()
    _still_serving(triton, sample_b64)


def test_repository_api_needs_the_admin_key(triton):
    http, grpc = triton.http_client(), triton.grpc_client()
    for headers in (None, {HTTP_ADMIN_HEADER: "wrong-key"}):
        err = _error_of(lambda: http.load_model("food_classifier_onnx", headers=headers))
        assert err.status() == "403" and "restricted" in err.message()
        err = _error_of(lambda: http.unload_model("food_classifier_onnx", headers=headers))
        assert err.status() == "403"
    for headers in (None, {GRPC_ADMIN_HEADER: "wrong-key"}):
        err = _error_of(lambda: grpc.load_model("food_classifier_onnx", headers=headers))
        assert "restricted" in err.message() or "PERMISSION" in str(err.status()) or "UNAVAILABLE" in str(err.status())
    # The kit's helper without the key is refused too, and nothing changed.
    with pytest.raises(InferenceServerException):
        reload_model("food_classifier_onnx", {"max_batch_size": 8}, grpc_url=triton.grpc_url,
                     admin_key="wrong-key", via="override", verbose=False)
    assert triton.model_config("food_classifier_onnx")["max_batch_size"] == 16
    # Inference and config reads stay open.
    assert http.is_model_ready("food_classifier_onnx")
    assert len(triton.admin_key) >= 16


def test_listens_on_loopback_only(triton):
    import psutil

    listening = [c for c in psutil.Process(triton.pid).net_connections(kind="inet") if c.status == "LISTEN"]
    ports = {c.laddr.port: c.laddr.ip for c in listening}
    assert {triton.http_port, triton.grpc_port, triton.metrics_port} <= set(ports)
    for ip in ports.values():
        assert ip in ("127.0.0.1", "::ffff:127.0.0.1"), ports
    with urllib.request.urlopen(triton.metrics_url, timeout=10) as r:
        assert b"nv_inference_request_success" in r.read()
