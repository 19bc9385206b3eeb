"""What only a GPU can show about the FastAPI services (run with `pytest -m
cuda` on a machine with CUDA; skipped elsewhere): the PyTorch service runs on
the GPU and reports its name; the ONNX service's provider is the CUDA one
when onnxruntime-gpu is installed."""

from __future__ import annotations

import pytest
import requests

from .helpers import post_good, start_fastapi

pytestmark = [pytest.mark.cuda, pytest.mark.integration]   # they start servers on the GPU


def test_fastapi_pytorch_reports_the_gpus_name(built_models, service_logs):
    import torch

    server = start_fastapi("fastapi_pt", service_logs)
    try:
        health = requests.get(f"{server.url}/health", timeout=10).json()
        assert health["device"] == "cuda"
        assert health["device_name"] == torch.cuda.get_device_name(0)
        assert health["workers"] == 1          # one pass at a time on the GPU
        post_good(server.url)
    finally:
        server.stop()


def test_onnx_provider_is_cuda_when_its_wheel_is_there(built_models, service_logs):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime without its CUDA provider (onnxruntime-gpu is not installed here)")
    server = start_fastapi("fastapi_onnx", service_logs)
    try:
        health = requests.get(f"{server.url}/health", timeout=10).json()
        assert health["providers"][0] == "CUDAExecutionProvider"
        assert (health["device"], health["workers"]) == ("cuda", 1)
        post_good(server.url)
    finally:
        server.stop()
