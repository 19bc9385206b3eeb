"""Food-11 classifier served by FastAPI with ONNX Runtime.

The same service as ../fastapi_pt/app.py with one change: the model is the
ONNX export run by ONNX Runtime instead of PyTorch. Compare the two files;
the request, the response and the preprocessing are identical.

Run it:   uvicorn app:app --host 127.0.0.1 --port 8011     (from fastapi_onnx/)
Try it:   http://127.0.0.1:8011/docs

    POST /predict  {"image": "<base64 JPEG/PNG>"}  → {"prediction": ..., "probability": ...}
    GET  /health   → 200 once the model is loaded (model, backend, device)

The kit starts this file as `uvicorn servelab.serve.harden:fastapi_onnx` (see
../fastapi_pt/app.py and servelab/serve/harden.py).
"""

import contextlib
import os
import platform
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, Response
from pydantic import BaseModel, Field

from servelab.core import food11

MODEL_PATH = Path(os.environ.get("MODEL_PATH", Path(__file__).with_name("food11.onnx")))

# --- Load the model once, when the server starts ------------------------
# CUDA if ONNX Runtime has it (and SERVELAB_DEVICE is not "cpu"), with the CPU as
# the fallback for any operation the CUDA provider lacks.
providers = ["CPUExecutionProvider"]
if "CUDAExecutionProvider" in ort.get_available_providers() and os.environ.get("SERVELAB_DEVICE") != "cpu":
    providers.insert(0, "CUDAExecutionProvider")
if not MODEL_PATH.is_file():
    raise SystemExit(f"Model file not found: {MODEL_PATH}\nBuild it with `make models`, or set MODEL_PATH.")
info = food11.model_info(MODEL_PATH)


def new_session(threads, providers):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads                    # threads inside one inference
    options.inter_op_num_threads = 1                          # MobileNetV2 is one chain of layers
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # fuse conv+bn+relu etc.
    return ort.InferenceSession(str(MODEL_PATH), options, providers=providers)


# lesson: how many requests run the model at once, and on how many threads
# The rule of ../fastapi_pt/app.py: a lone request gets every core, requests in
# flight together split them, at most one pass per core at once (one on a GPU).
# A session's thread count is fixed when it is made, so there is one session
# per share a request can get (the model is 9 MB), and each request runs on
# the one that matches its share.
CORES = len(os.sched_getaffinity(0))
first = new_session(CORES, providers)
providers = first.get_providers()      # what ONNX Runtime really loaded (CUDA can fail to load)
device = "cuda" if providers[0] == "CUDAExecutionProvider" else "cpu"
WORKERS = max(1, int(os.environ.get("SERVELAB_INFERENCE_WORKERS") or (1 if device == "cuda" else CORES)))
print(f"device: {device} (ONNX Runtime providers {providers}); {CORES} core(s), up to {WORKERS} request(s) at once",
      flush=True)
shares = {max(1, CORES // n) for n in range(1, WORKERS + 1)} | {1}
sessions = {n: first if n == CORES else new_session(n, providers) for n in shares}
slots = threading.BoundedSemaphore(WORKERS)
in_flight = 0                          # requests waiting for a slot or running
count_lock = threading.Lock()


def runnable_now():
    # Threads ready to run on the whole machine at this instant: the 4th field of /proc/loadavg,
    # "running/total". (The load average itself trails the last minute: after a burst it stays
    # high on a machine that is idle again, and would cost a lone request its cores.)
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[0])


@contextlib.contextmanager
def a_share_of_the_cores():
    global in_flight
    with count_lock:
        in_flight += 1
    try:
        with slots:
            threads = max(1, CORES // min(in_flight, WORKERS))
            if runnable_now() > 3 * CORES:    # a machine busy with other programs: one thread
                threads = 1
            yield sessions[threads]
    finally:
        with count_lock:
            in_flight -= 1
# lesson: end

decode_slots = threading.BoundedSemaphore(CORES)   # a decoded photo can take 120 MB: one per core
input_name = first.get_inputs()[0].name             # "input"  [N, 3, 224, 224]

# Warm-up: the first run of each session allocates memory.
for session in sessions.values():
    session.run(None, {input_name: np.zeros((1, 3, food11.INPUT_SIZE, food11.INPUT_SIZE), np.float32)})

app = FastAPI(
    title="Food-11 classifier (ONNX Runtime)",
    description=f"MobileNetV2 exported to ONNX, 11 food classes. Weights: {info.weights_kind} ({info.note}).",
)


class PredictRequest(BaseModel):
    image: str = Field(description="the image file (JPEG or PNG), base64-encoded")


class PredictResponse(BaseModel):
    prediction: str = Field(description="predicted Food-11 class")
    probability: float = Field(ge=0, le=1, description="softmax probability of that class")
    model: str
    model_version: str
    weights_kind: str = Field(description="demo (untrained) or trained")
    note: str


# `def`, not `async def`: FastAPI runs it in its threadpool, so decoding the
# next request's image overlaps with this request's inference.
@app.post("/predict", response_model=PredictResponse)
def predict(request: PredictRequest, response: Response):
    t0 = time.perf_counter()
    with decode_slots:
        x = food11.preprocess_base64(request.image)           # bad input → 400/413 JSON
    batch = x[np.newaxis]                                     # [1, 3, 224, 224] float32
    t1 = time.perf_counter()

    with a_share_of_the_cores() as session:                   # waits for a free slot
        t2 = time.perf_counter()                              # the slot is ours: the wait ends here
        logits = session.run(None, {input_name: batch})[0]    # [1, 11]
    t3 = time.perf_counter()

    top = food11.predict_from_logits(logits)[0]               # softmax → label, probability
    response.headers["Server-Timing"] = ", ".join(            # where the time went, in ms
        f"{stage};dur={1000 * s:.3f}" for stage, s in (("decode", t1 - t0), ("wait", t2 - t1), ("infer", t3 - t2)))
    return {**top.as_dict(), **info.response_fields()}


@app.get("/health")
def health():
    name = f"CUDA device {first.get_provider_options()['CUDAExecutionProvider'].get('device_id', '0')}" \
        if device == "cuda" else platform.processor() or platform.machine()
    return {"status": "ok", "model": info.name, "model_version": info.version,
            "weights_kind": info.weights_kind, "backend": "onnxruntime",
            "device": device, "device_name": name, "providers": providers, "workers": WORKERS, "cores": CORES}
