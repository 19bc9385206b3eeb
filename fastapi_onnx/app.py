"""Food-11 classifier served by FastAPI with ONNX Runtime.

The same service as ../fastapi_pt/app.py with one change: the model is the
ONNX export run by ONNX Runtime instead of PyTorch. Compare the two files;
the request, the response and the preprocessing are identical.

Run it:   uvicorn app:app --host 127.0.0.1 --port 8011     (from fastapi_onnx/)
Try it:   http://127.0.0.1:8011/docs

    POST /predict  {"image": "<base64 JPEG/PNG>"}  → {"prediction": ..., "probability": ...}
    GET  /health   → 200 once the model is loaded (model, backend, device)
"""

import os
import time
from pathlib import Path

import numpy as np
from fastapi import FastAPI, Response
from pydantic import BaseModel, Field

from servelab.core import food11
from servelab.serve import serving

MODEL_PATH = Path(os.environ.get("MODEL_PATH", Path(__file__).with_name("food11.onnx")))

# --- Load the model once, when the server starts ------------------------
# ONNX Runtime sessions (CUDA if present, else CPU), one per CPU-thread share a
# request can get, fused graph: servelab/serve/serving.py, onnx_service.
service = serving.onnx_service(MODEL_PATH)
device = service.device
input_name = service.session.get_inputs()[0].name             # "input"  [N, 3, 224, 224]
info = serving.model_info(MODEL_PATH)

# Warm-up: the first run of each session allocates memory.
service.warm_up({input_name: np.zeros((1, 3, food11.INPUT_SIZE, food11.INPUT_SIZE), np.float32)})

app = FastAPI(
    title="Food-11 classifier (ONNX Runtime)",
    description=f"MobileNetV2 exported to ONNX, 11 food classes. Weights: {info.weights_kind} ({info.note}).",
    docs_url=None, redoc_url=None,       # /docs and /redoc come from the next line, without a CDN
)
serving.install_offline_docs(app)        # Swagger UI and ReDoc served by this app itself (works offline)
app.add_middleware(serving.BodySizeLimit, max_bytes=serving.MAX_BODY_BYTES)  # bigger bodies: 413, unread
serving.install_error_handlers(app)                           # bad input → JSON 4xx
app.add_middleware(serving.ServerTiming)                      # Server-Timing: app;dur=<ms>


class PredictRequest(BaseModel):
    image: str = Field(**serving.IMAGE_FIELD_DOC)   # base64 JPEG/PNG


class PredictResponse(BaseModel):
    prediction: str = Field(description="predicted Food-11 class")
    probability: float = Field(ge=0, le=1, description="softmax probability of that class")
    model: str
    model_version: str
    weights_kind: str = Field(description="demo (untrained) or trained")
    note: str


# `def`, not `async def`: FastAPI runs it in its threadpool, so decoding the
# next request's image overlaps with this request's inference.
@app.post("/predict", response_model=PredictResponse, responses=serving.ERROR_RESPONSES)
def predict(request: PredictRequest, response: Response):
    t0 = time.perf_counter()
    with service.decoding():                                  # at most one decode per core
        x = food11.preprocess_base64(request.image)           # bad input → 400/413 JSON
    batch = x[np.newaxis]                                     # [1, 3, 224, 224] float32
    t1 = time.perf_counter()

    with service.inference() as session:                      # waits for a free slot; the session for its share
        t2 = time.perf_counter()                              # the slot is ours: the wait ends here
        logits = session.run(None, {input_name: batch})[0]    # [1, 11]

    top = food11.predict_from_logits(logits)[0]               # softmax → label, probability
    response.headers["Server-Timing"] = serving.server_timing(decode=t1 - t0, wait=t2 - t1,   # ms per stage
                                                             infer=time.perf_counter() - t2)
    return {**top.as_dict(), **info.response_fields()}


@app.get("/health")
def health():
    return {"status": "ok", "model": info.name, "model_version": info.version,
            "weights_kind": info.weights_kind, "backend": "onnxruntime",
            **service.health_fields()}   # device, its name, providers, workers, cores
