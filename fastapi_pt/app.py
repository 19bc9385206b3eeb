"""Food-11 classifier served by FastAPI with PyTorch.

Run it:   uvicorn app:app --host 127.0.0.1 --port 8010     (from fastapi_pt/)
Try it:   http://127.0.0.1:8010/docs  (Swagger UI: POST /predict → "Try it out")

    POST /predict  {"image": "<base64 JPEG/PNG>"}
        → {"prediction": "Bread", "probability": 0.93, "model_version": ..., "weights_kind": ...}
    GET  /health   → 200 once the model is loaded (model, backend, device)

Decoding, preprocessing, labels and softmax come from servelab.core.food11, the
same code the ONNX service, Triton and the Flask app use, so every backend
gives the same answer for the same image.
"""

import os
import time
from pathlib import Path

import torch
from fastapi import FastAPI, Response
from pydantic import BaseModel, Field

from servelab.core import food11
from servelab.serve import serving

MODEL_PATH = Path(os.environ.get("MODEL_PATH", Path(__file__).with_name("food11.pth")))

# Device (GPU if present) and CPU threads per request: servelab/serve/serving.py, pytorch_service.
service = serving.pytorch_service()
device = service.device

# --- Load the model once, when the server starts ------------------------
# uvicorn opens its port only after this module is imported, so a client that
# can reach /health knows the model is loaded.
model = torch.load(serving.require_model_file(MODEL_PATH), map_location=device, weights_only=False)
model.eval()                             # inference mode for dropout / batch-norm
info = serving.model_info(MODEL_PATH)    # version and demo/trained weights, shown with every answer

# Warm-up: the first pass allocates memory and picks kernels.
service.warm_up(lambda: model(torch.zeros(1, 3, food11.INPUT_SIZE, food11.INPUT_SIZE, device=device)))

app = FastAPI(
    title="Food-11 classifier (PyTorch)",
    description=f"MobileNetV2, 11 food classes. Weights: {info.weights_kind} ({info.note}).",
    docs_url=None, redoc_url=None,       # /docs and /redoc come from the next line, without a CDN
)
serving.install_offline_docs(app)        # Swagger UI and ReDoc served by this app itself (works offline)
app.add_middleware(serving.BodySizeLimit, max_bytes=serving.MAX_BODY_BYTES)  # bigger bodies: 413, unread
serving.install_error_handlers(app)      # bad input → JSON 4xx with a readable message
app.add_middleware(serving.ServerTiming)  # Server-Timing: app;dur=<ms> on every answer (below: the stages)


# lesson: the request and the response (FastAPI checks every body against PredictRequest)
class PredictRequest(BaseModel):
    image: str = Field(**serving.IMAGE_FIELD_DOC)   # base64 JPEG/PNG


class PredictResponse(BaseModel):
    prediction: str = Field(description="predicted Food-11 class")
    probability: float = Field(ge=0, le=1, description="softmax probability of that class")
    model: str
    model_version: str
    weights_kind: str = Field(description="demo (untrained) or trained")
    note: str
# lesson: end


# A plain `def` endpoint: FastAPI runs it in its worker threadpool, so while
# one request runs its forward pass, others decode their images and then
# queue for a free slot.
@app.post("/predict", response_model=PredictResponse, responses=serving.ERROR_RESPONSES)
def predict(request: PredictRequest, response: Response):
    # base64 → image → float32 [3, 224, 224]. Bad input raises
    # food11.ImageDecodeError, which the error handlers turn into a 400/413.
    t0 = time.perf_counter()
    with service.decoding():                                    # at most one decode per core
        x = food11.preprocess_base64(request.image)
    batch = torch.from_numpy(x).unsqueeze(0).to(device)        # [1, 3, 224, 224]
    t1 = time.perf_counter()

    # lesson: the forward pass, the one line that runs the model
    with service.inference():          # waits for a free slot; all cores alone, a share beside others
        t2 = time.perf_counter()                                # the slot is ours: the wait ends here
        logits = model(batch)                                   # [1, 11]
    # lesson: end

    # Softmax turns logits into probabilities that sum to 1 over the classes.
    top = food11.predict_from_logits(logits.cpu().numpy())[0]
    # Where this request's time went, in the answer's Server-Timing header (milliseconds)
    response.headers["Server-Timing"] = serving.server_timing(decode=t1 - t0, wait=t2 - t1,
                                                             infer=time.perf_counter() - t2)
    return {**top.as_dict(), **info.response_fields()}


@app.get("/health")
def health():
    return {"status": "ok", "model": info.name, "model_version": info.version,
            "weights_kind": info.weights_kind, "backend": "pytorch",
            **service.health_fields()}   # device, its name, workers, cores
