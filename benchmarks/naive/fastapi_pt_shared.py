"""Shared-preprocessing reference for bench_naive.py (serving only): a minimal
FastAPI + PyTorch service. torch defaults (its own thread count, its
own OpenMP wait policy), one forward pass per request, no thread settings.
Same decoding and preprocessing as the kit (servelab.core.food11), so only
serving differs; fastapi_pt_plain.py shares nothing with the kit."""

import os

import torch
from fastapi import FastAPI
from pydantic import BaseModel

from servelab.core import food11

model = torch.load(os.environ["MODEL_PATH"], weights_only=False)
model.eval()
app = FastAPI()


class PredictRequest(BaseModel):
    image: str


@app.post("/predict")
def predict(request: PredictRequest):
    x = torch.from_numpy(food11.preprocess_base64(request.image)).unsqueeze(0)
    with torch.no_grad():
        logits = model(x)
    return food11.predict_from_logits(logits.numpy())[0].as_dict()
