"""Model files servelab copies into the local Triton's runtime repository.

``onnx_model.py`` becomes ``<model>/1/model.py`` for every model whose
config in ``models_staging/`` says ``backend: "onnxruntime"``: the Triton
binary inside nvidia-pytriton has no onnxruntime backend, so locally such a
model runs on the Python backend through this runner, which reads the same
``config.pbtxt`` (IO names, dtypes, ``max_batch_size``, ``instance_group``,
``dynamic_batching`` — Triton itself does the batching and the instances).
"""

from pathlib import Path

ONNX_RUNNER = Path(__file__).resolve().parent / "onnx_model.py"
