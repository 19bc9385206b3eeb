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
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI
from pydantic import BaseModel, Field

from servelab.core import food11
from servelab.serve import serving

MODEL_PATH = Path(os.environ.get("MODEL_PATH", Path(__file__).with_name("food11.onnx")))

# --- Device and CPU threads: the lesson of this file ---------------------
# CUDAExecutionProvider on a GPU, else CPU (SERVELAB_DEVICE forces one).
providers = serving.onnx_providers()
# Decoding is bounded too: a photo at the pixel limit is ~120 MB once
# decoded, so at most one decode per core runs at once, whatever the load.
decode_slots = threading.BoundedSemaphore(serving.cpu_threads())


def session_with(threads, providers):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads                    # threads inside one inference
    options.inter_op_num_threads = 1                          # no parallel branches to run
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL  # run nodes one after another
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # fuse conv+bn+relu etc.
    return ort.InferenceSession(str(serving.require_model_file(MODEL_PATH)), options, providers=providers)


# --- Load the model once, when the server starts ------------------------
# The same thread rule as the PyTorch service: a lone request gets every
# core, concurrent ones an equal share (one each at full load, or when other
# programs keep the machine busy). A session's thread count is fixed when it
# is created, so we create one session per thread count (the model is 9 MB)
# and each request runs on the one that matches its share. The rule follows
# the device the first session really got: if the CUDA provider fails to
# load, ONNX Runtime runs on the CPU, and so do the thread counts. ONNX
# Runtime keeps its default wait (spin briefly, then sleep).
cores, sessions = serving.onnx_sessions(session_with, providers)  # on 2 CPU cores: {1: ..., 2: ...}
session = sessions[cores.cores]
device = serving.onnx_device(session)
input_name = session.get_inputs()[0].name                     # "input"  [N, 3, 224, 224]
info = serving.model_info(MODEL_PATH)

for warm in sessions.values():  # warm-up: the first run allocates memory
    warm.run(None, {input_name: np.zeros((1, 3, food11.INPUT_SIZE, food11.INPUT_SIZE), np.float32)})

app = FastAPI(
    title="Food-11 classifier (ONNX Runtime)",
    description=f"MobileNetV2 exported to ONNX, 11 food classes. Weights: {info.weights_kind} ({info.note}).",
    docs_url=None, redoc_url=None,       # /docs and /redoc come from the next line, without a CDN
)
serving.install_offline_docs(app)        # Swagger UI and ReDoc served by this app itself (works offline)
app.add_middleware(serving.BodySizeLimit, max_bytes=serving.MAX_BODY_BYTES)  # bigger bodies: 413, unread
serving.install_error_handlers(app)                           # bad input → JSON 4xx


class PredictRequest(BaseModel):
    image: str = Field(**serving.IMAGE_FIELD_DOC)   # base64 JPEG/PNG


class PredictResponse(BaseModel):
    prediction: str = Field(description="predicted Food-11 class")
    probability: float = Field(ge=0, le=1, description="softmax probability of that class")
    model: str
    model_version: str
    weights_kind: str = Field(description="demo (untrained) or trained")
    note: str


@app.get("/health")
def health():
    return {"status": "ok", "model": info.name, "model_version": info.version,
            "weights_kind": info.weights_kind, "backend": "onnxruntime", "device": device,
            "device_name": serving.onnx_device_name(session), "providers": session.get_providers(),
            "workers": cores.workers, "cores": cores.cores}


# `def`, not `async def`: FastAPI runs it in its threadpool, so decoding the
# next request's image overlaps with this request's inference.
@app.post("/predict", response_model=PredictResponse, responses=serving.ERROR_RESPONSES)
def predict(request: PredictRequest):
    with decode_slots:
        x = food11.preprocess_base64(request.image)           # bad input → 400/413 JSON
    batch = x[np.newaxis]                                     # [1, 3, 224, 224] float32

    with cores.threads() as n:                                # waits for a free slot
        logits = sessions[n].run(None, {input_name: batch})[0]  # [1, 11] on n threads

    top = food11.predict_from_logits(logits)[0]               # softmax → label, probability
    return {**top.as_dict(), **info.response_fields()}
