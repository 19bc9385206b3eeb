"""Food-11 classifier for Triton's Python backend.

Triton loads this file once per model instance (each instance is its own
process) and calls:
  initialize(args)   once, to load the model;
  execute(requests)  with a *list* of requests: one, or several when
                     dynamic batching grouped them; we must answer each one;
  finalize()         at unload.
"""

import json
import os

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from core_share import CoreShare  # beside this file: how instances share the CPU cores

from servelab.core import food11  # images, labels, softmax


class TritonPythonModel:
    def initialize(self, args):
        # Triton tells each instance where it should run (instance_group).
        if args["model_instance_kind"] == "GPU" and torch.cuda.is_available():
            self.device = torch.device(f"cuda:{args['model_instance_device_id']}")
        else:
            self.device = torch.device("cpu")

        # food11.pth sits next to this file: a whole pickled MobileNetV2.
        weights = os.path.join(os.path.dirname(os.path.abspath(__file__)), "food11.pth")
        self.model = torch.load(weights, map_location=self.device, weights_only=False)
        self.model.eval()
        # Precision: config.pbtxt's parameter "precision", fp32 (default) or fp16. FP16 halves the
        # weights and the arithmetic; on a GPU with fast FP16 it can pay, on a CPU it is usually slower.
        parameters = json.loads(args["model_config"]).get("parameters", {})
        precision = parameters.get("precision", {}).get("string_value", "fp32")
        if precision not in ("fp32", "fp16"):
            raise ValueError(f'parameter precision is "{precision}": use "fp32" or "fp16"')
        self.dtype = torch.float16 if precision == "fp16" else torch.float32
        self.model = self.model.to(self.dtype)

        # Instances of this model share the CPU cores: alone, one gets every core; when
        # others are busy, each an equal share (core_share.py, beside this file).
        self.cores = CoreShare(args["model_name"])
        # Warm-up: the first passes allocate memory and pick kernels, on each thread count.
        zeros = torch.zeros((1, 3, food11.INPUT_SIZE, food11.INPUT_SIZE), device=self.device, dtype=self.dtype)
        with torch.inference_mode():
            for n in self.cores.thread_counts() * 3:
                torch.set_num_threads(n)
                self.model(zeros)
        pb_utils.Logger.log_info(
            f"{args['model_instance_name']}: {precision} on {self.device}, up to {self.cores.cores} CPU thread(s)"
        )

    def execute(self, requests):
        # This instance is busy from here to the return (decoding uses a core
        # too), so other instances see it and take a share, and so do we.
        with self.cores.threads() as n:  # all cores alone, a share beside others
            if torch.get_num_threads() != n:  # only on a change: setting it costs time
                torch.set_num_threads(n)
            return self.run(requests)

    def run(self, requests):
        responses = [None] * len(requests)
        images, owners = [], []  # preprocessed images, and which request each came from

        # 1. Decode every request. A bad image fails only its own request.
        for i, request in enumerate(requests):
            # Shape [n, 1]: a client may send n images in one request (-b 16).
            encoded = pb_utils.get_input_tensor_by_name(request, "INPUT_IMAGE").as_numpy().reshape(-1)
            try:
                tensors = [food11.preprocess_base64(item) for item in encoded]
            except food11.ImageDecodeError as err:
                error = pb_utils.TritonError(f"{err.code}: {err.message}", pb_utils.TritonError.INVALID_ARG)
                responses[i] = pb_utils.InferenceResponse(error=error)
                continue
            images.extend(tensors)
            owners.extend([i] * len(tensors))

        # 2. ONE forward pass for all the good images of all the requests.
        predictions = []
        if images:
            batch = torch.from_numpy(np.stack(images)).to(self.device, self.dtype)
            with torch.inference_mode():
                logits = self.model(batch).float().cpu().numpy()
            predictions = food11.predict_from_logits(logits)  # softmax, then top-1
            pb_utils.Logger.log_info(f"served a batch of {len(images)} image(s) from {len(requests)} request(s)")

        # 3. Hand each request back its own rows, in the shape it asked for.
        for i in range(len(requests)):
            if responses[i] is not None:
                continue
            mine = [p for p, owner in zip(predictions, owners) if owner == i]
            labels = np.array([[p.label.encode()] for p in mine], dtype=object)
            probabilities = np.array([[p.probability] for p in mine], dtype=np.float32)
            responses[i] = pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("FOOD_LABEL", labels),
                pb_utils.Tensor("PROBABILITY", probabilities),
            ])
        return responses

    def finalize(self):
        self.cores.close()
        self.model = None
