"""Shared-preprocessing reference for bench_naive.py (serving only): a minimal
FastAPI + ONNX Runtime service. Library defaults only (ORT picks
its own thread count), one model call per request, no thread settings.
Same decoding and preprocessing as the kit (servelab.core.food11), so only
serving differs; fastapi_onnx_plain.py shares nothing with the kit."""

import os

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI
from pydantic import BaseModel

from servelab.core import food11

session = ort.InferenceSession(os.environ["MODEL_PATH"], providers=["CPUExecutionProvider"])
app = FastAPI()


class PredictRequest(BaseModel):
    image: str


@app.post("/predict")
def predict(request: PredictRequest):
    x = food11.preprocess_base64(request.image)[np.newaxis]
    logits = session.run(None, {"input": x})[0]
    return food11.predict_from_logits(logits)[0].as_dict()
