"""Fixtures for the local-Triton tests: real tritonserver, real perf_analyzer.

Each test module that needs a server gets its own (module scope) on free
ports, so modules can run side by side with other test runs."""

from __future__ import annotations

import base64

import pytest

from servelab.core import food11, paths, procs
from tests.tiers import tier


@pytest.fixture(scope="session")
def artifacts() -> dict:
    """The model artifacts in models_staging/ (built once if missing)."""
    from servelab.serve import models

    if not models.artifacts_ready():
        models.build(log=lambda *a, **k: None)
    return {
        "pth": paths.MODELS_STAGING / "food_classifier" / "1" / "food11.pth",
        "onnx": paths.MODELS_STAGING / "food_classifier_onnx" / "1" / "model.onnx",
    }


@pytest.fixture(scope="session")
def sample_bytes() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in paths.sample_images()}


@pytest.fixture(scope="session")
def sample_b64(sample_bytes) -> dict[str, bytes]:
    return {name: base64.b64encode(data) for name, data in sample_bytes.items()}


@pytest.fixture(scope="session")
def reference(artifacts, sample_bytes) -> dict:
    """Labels, probabilities and logits computed straight from the artifacts
    (food11.pth with PyTorch, model.onnx with ONNX Runtime)."""
    import numpy as np
    import onnxruntime as ort
    import torch

    batch = food11.preprocess_batch(list(sample_bytes.values()))
    model = torch.load(artifacts["pth"], map_location="cpu", weights_only=False).eval()
    with torch.inference_mode():
        pt_logits = model(torch.from_numpy(batch)).numpy()
    session = ort.InferenceSession(str(artifacts["onnx"]), providers=["CPUExecutionProvider"])
    onnx_logits = session.run(["output"], {"input": batch})[0]
    names = list(sample_bytes)
    return {
        "names": names,
        "inputs": batch,
        "pt": dict(zip(names, food11.predict_from_logits(pt_logits))),
        "onnx_logits": dict(zip(names, np.asarray(onnx_logits))),
    }


@pytest.fixture(scope="session")
def input_json_dir(tmp_path_factory):
    """A folder holding perf_analyzer's input.json (the repository's, or one
    written by the kit if this checkout has none)."""
    if paths.INPUT_JSON.exists():
        return paths.INPUT_JSON.parent
    from servelab.serve import samples

    folder = tmp_path_factory.mktemp("inputjson")
    samples.write_input_json(folder / "input.json")
    return folder


@pytest.fixture(scope="session")
@tier("integration")
def start_triton(tmp_path_factory, artifacts):
    """``start_triton(**kwargs)`` → a running TritonServer on free ports
    (the caller stops it)."""
    from servelab import triton

    def _start(**kwargs):
        kwargs.setdefault("workdir", tmp_path_factory.mktemp("triton"))
        return triton.start(
            http_port=procs.free_port(), grpc_port=procs.free_port(), metrics_port=procs.free_port(), **kwargs,
        )

    return _start


@pytest.fixture(scope="session")
@tier("integration")
def lab_triton(start_triton):
    """One server with both models as the lab starts them, shared by the
    read-only modules (test_server, test_perf)."""
    server = start_triton()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def shell_env() -> dict[str, str]:
    """The environment of a user's venv shell: venv bin first on PATH and
    no library-path set-up of any kind."""
    env = procs.child_env()
    env.pop("LD_LIBRARY_PATH", None)
    return env


def logits(server, model: str, batch):
    """``model``'s output for ``batch`` (float32, NCHW), through ``server``'s HTTP client."""
    import tritonclient.http as httpclient

    inp = httpclient.InferInput("input", list(batch.shape), "FP32")
    inp.set_data_from_numpy(batch)
    return server.http_client().infer(model, [inp]).as_numpy("output")
