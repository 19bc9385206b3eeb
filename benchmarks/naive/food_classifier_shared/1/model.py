"""Shared-preprocessing reference for bench_naive.py (serving only): a
Python-backend model.py with torch defaults (no thread or OpenMP wait
settings), one forward pass per request.
Same inputs, outputs and preprocessing (servelab.core.food11) as
models_staging/food_classifier; food_classifier_plain shares nothing with the kit.

The config parameter ``reference_threads`` (unset by default) lets the benchmark
try what a student would add for several instances: torch.set_num_threads(N)."""

import json
import os

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from servelab.core import food11


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        threads = (config.get("parameters", {}).get("reference_threads") or {}).get("string_value")
        if threads:
            torch.set_num_threads(int(threads))
        self.model = torch.load(os.path.join(os.path.dirname(__file__), "food11.pth"), weights_only=False)
        self.model.eval()

    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "INPUT_IMAGE").as_numpy().reshape(-1)
            x = torch.from_numpy(np.stack([food11.preprocess_base64(i) for i in images]))
            with torch.no_grad():
                predictions = food11.predict_from_logits(self.model(x).numpy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("FOOD_LABEL", np.array([[p.label.encode()] for p in predictions], dtype=object)),
                pb_utils.Tensor("PROBABILITY", np.array([[p.probability] for p in predictions], dtype=np.float32)),
            ]))
        return responses
