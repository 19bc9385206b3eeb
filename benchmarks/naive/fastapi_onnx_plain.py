"""Plain reference for bench_naive.py: shares nothing with the kit.

The FastAPI + ONNX Runtime service as a student writes it from the lab's
snippets, without torch: PIL decode and resize, numpy ToTensor/Normalize, a
default InferenceSession (ONNX Runtime picks its threads), no middleware, no
input checks. It imports nothing from servelab (tests/bench/test_naive_references.py checks).

    MODEL_PATH=fastapi_onnx/food11.onnx uvicorn fastapi_onnx_plain:app   (from benchmarks/naive/)
"""

import base64
import io
import os

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI
from PIL import Image
from pydantic import BaseModel

CLASSES = ["Bread", "Dairy product", "Dessert", "Egg", "Fried food", "Meat",
           "Noodles/Pasta", "Rice", "Seafood", "Soup", "Vegetable/Fruit"]
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

session = ort.InferenceSession(os.environ.get("MODEL_PATH", "food11.onnx"), providers=["CPUExecutionProvider"])
input_name = session.get_inputs()[0].name

app = FastAPI()


class ImageRequest(BaseModel):
    image: str  # base64 JPEG/PNG


class PredictionResponse(BaseModel):
    prediction: str
    probability: float


def preprocess(image):
    image = image.resize((224, 224), Image.BILINEAR)          # what torchvision's Resize((224, 224)) does
    x = np.asarray(image, dtype=np.float32) / 255.0            # HWC in [0, 1]
    x = (x - MEAN) / STD
    return x.transpose(2, 0, 1)[np.newaxis]                    # [1, 3, 224, 224]


@app.post("/predict")
def predict(request: ImageRequest):
    image = Image.open(io.BytesIO(base64.b64decode(request.image))).convert("RGB")
    logits = session.run(None, {input_name: preprocess(image)})[0]
    probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    index = int(probabilities.argmax())
    return PredictionResponse(prediction=CLASSES[index], probability=float(probabilities[0, index]))
