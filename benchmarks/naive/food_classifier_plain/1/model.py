"""Plain reference for bench_naive.py: shares nothing with the kit.

A Python-backend model.py as a student writes it from the lab's snippets:
PIL decode, torchvision Resize/CenterCrop/ToTensor/Normalize, model.eval(),
torch.no_grad(), torch's default threads, one forward pass per execute().
It imports nothing from servelab (tests/bench/test_naive_references.py checks).

The config parameter ``reference_threads`` (unset by default) is the one line a
student adds for several instances on a CPU: torch.set_num_threads(N)."""

import base64
import io
import json
import os

import numpy as np
import torch
import torchvision.transforms as transforms
import triton_python_backend_utils as pb_utils
from PIL import Image

CLASSES = ["Bread", "Dairy product", "Dessert", "Egg", "Fried food", "Meat",
           "Noodles/Pasta", "Rice", "Seafood", "Soup", "Vegetable/Fruit"]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        threads = (config.get("parameters", {}).get("reference_threads") or {}).get("string_value")
        if threads:
            torch.set_num_threads(int(threads))
        self.model = torch.load(os.path.join(os.path.dirname(__file__), "food11.pth"),
                                map_location="cpu", weights_only=False)
        self.model.eval()
        self.transform = transforms.Compose([
            transforms.Resize((224, 224)),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ])

    def preprocess(self, encoded):
        image = Image.open(io.BytesIO(base64.b64decode(encoded))).convert("RGB")
        return self.transform(image)

    def execute(self, requests):
        images, sizes = [], []
        for request in requests:
            encoded = pb_utils.get_input_tensor_by_name(request, "INPUT_IMAGE").as_numpy().reshape(-1)
            images += [self.preprocess(e) for e in encoded]
            sizes.append(len(encoded))
        with torch.no_grad():
            probabilities = torch.softmax(self.model(torch.stack(images)), dim=1)
        best, index = probabilities.max(dim=1)

        responses, start = [], 0
        for size in sizes:
            rows = range(start, start + size)
            start += size
            labels = np.array([[CLASSES[int(index[r])].encode()] for r in rows], dtype=object)
            probs = np.array([[float(best[r])] for r in rows], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("FOOD_LABEL", labels), pb_utils.Tensor("PROBABILITY", probs)]))
        return responses
