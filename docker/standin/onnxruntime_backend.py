"""The stand-in Triton image's ``onnxruntime`` backend (compose check only, never on the node).

tritonserver from nvidia-pytriton has no ONNX Runtime backend. Triton loads a Python-based
backend from ``backends/<name>/model.py``, so a model whose config says ``backend: "onnxruntime"``
runs the kit's runner (servelab/triton_runner/onnx_model.py, the one the local target uses),
which reads the model's ``1/model.onnx`` and honours its config. ``servelab`` is on PYTHONPATH
in the kit's Triton image (docker/Dockerfile.triton).
"""
from servelab.triton_runner.onnx_model import TritonPythonModel  # noqa: F401
