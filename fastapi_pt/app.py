"""Food-11 classifier served by FastAPI with PyTorch.

Run it:   uvicorn app:app --host 127.0.0.1 --port 8010     (from fastapi_pt/)
Try it:   http://127.0.0.1:8010/docs  (Swagger UI: POST /predict → "Try it out")

    POST /predict  {"image": "<base64 JPEG/PNG>"}
        → {"prediction": "Bread", "probability": 0.93, "model_version": ..., "weights_kind": ...}
    GET  /health   → 200 once the model is loaded (model, backend, device)

Decoding, preprocessing, labels and softmax come from servelab.core.food11, the
same code the ONNX service, Triton and the Flask app use, so every backend
gives the same answer for the same image.

The kit starts this file as `uvicorn servelab.serve.harden:fastapi_pt`: the same
app, plus what any public service needs and this lesson is not about (a limit
on the body's size, JSON errors for bad input, API docs that work offline, an
app;dur entry in Server-Timing). See servelab/serve/harden.py.
"""

import contextlib
import os
import platform
import threading
import time
from pathlib import Path

import torch
from fastapi import FastAPI, Response
from pydantic import BaseModel, Field

from servelab.core import food11

MODEL_PATH = Path(os.environ.get("MODEL_PATH", Path(__file__).with_name("food11.pth")))

# --- Load the model once, when the server starts ------------------------
# uvicorn opens its port only after this module is imported, so a client that
# can reach /health knows the model is loaded.
device = "cuda" if torch.cuda.is_available() and os.environ.get("SERVELAB_DEVICE") != "cpu" else "cpu"
if not MODEL_PATH.is_file():
    raise SystemExit(f"Model file not found: {MODEL_PATH}\nBuild it with `make models`, or set MODEL_PATH.")
model = torch.load(MODEL_PATH, map_location=device, weights_only=False)
model.eval()                              # inference mode for dropout / batch-norm
info = food11.model_info(MODEL_PATH)      # version and demo/trained weights, shown with every answer

# lesson: how many requests run the model at once, and on how many threads
# A lone request gets every core: one pass on all cores is the lowest latency.
# Requests that arrive together split the cores: N passes on all cores each
# would wait for each other at every layer. At most one pass per core runs at
# once; the rest wait for a free slot (so under load you measure a queue, not
# a pile-up). On a GPU, one pass at a time: the GPU runs them one after another.
CORES = len(os.sched_getaffinity(0))
WORKERS = max(1, int(os.environ.get("SERVELAB_INFERENCE_WORKERS") or (1 if device == "cuda" else CORES)))
slots = threading.BoundedSemaphore(WORKERS)
in_flight = 0                             # requests waiting for a slot or running
count_lock = threading.Lock()
torch.set_num_interop_threads(1)          # MobileNetV2 is one chain of layers
print(f"device: {device}; {CORES} core(s), up to {WORKERS} request(s) at once", flush=True)


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
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            yield threads
    finally:
        with count_lock:
            in_flight -= 1
# lesson: end

decode_slots = threading.BoundedSemaphore(CORES)   # a decoded photo can take 120 MB: one per core


def warm_up():
    # The first pass allocates memory and picks kernels. In a short-lived thread, as requests run:
    # one pass in the main thread made every later request ~35 % slower here (its own OpenMP team).
    with torch.inference_mode():
        model(torch.zeros(1, 3, food11.INPUT_SIZE, food11.INPUT_SIZE, device=device))


warm = threading.Thread(target=warm_up)
warm.start()
warm.join()

app = FastAPI(
    title="Food-11 classifier (PyTorch)",
    description=f"MobileNetV2, 11 food classes. Weights: {info.weights_kind} ({info.note}).",
)


# lesson: the request and the response (FastAPI checks every body against PredictRequest)
class PredictRequest(BaseModel):
    image: str = Field(description="the image file (JPEG or PNG), base64-encoded")


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
@app.post("/predict", response_model=PredictResponse)
def predict(request: PredictRequest, response: Response):
    # base64 → image → float32 [3, 224, 224]. Bad input raises food11.ImageDecodeError,
    # which the kit turns into a 400/413 with a readable message.
    t0 = time.perf_counter()
    with decode_slots:
        x = food11.preprocess_base64(request.image)
    batch = torch.from_numpy(x).unsqueeze(0).to(device)        # [1, 3, 224, 224]
    t1 = time.perf_counter()

    # lesson: the forward pass, the one line that runs the model
    with a_share_of_the_cores(), torch.inference_mode():      # waits for a free slot
        t2 = time.perf_counter()                                # the slot is ours: the wait ends here
        logits = model(batch)                                   # [1, 11]
    # lesson: end
    t3 = time.perf_counter()

    # Softmax turns logits into probabilities that sum to 1 over the classes.
    top = food11.predict_from_logits(logits.cpu().numpy())[0]
    # Where this request's time went, in the answer's Server-Timing header (milliseconds)
    response.headers["Server-Timing"] = ", ".join(
        f"{stage};dur={1000 * s:.3f}" for stage, s in (("decode", t1 - t0), ("wait", t2 - t1), ("infer", t3 - t2)))
    return {**top.as_dict(), **info.response_fields()}


@app.get("/health")
def health():
    name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or platform.machine()
    return {"status": "ok", "model": info.name, "model_version": info.version,
            "weights_kind": info.weights_kind, "backend": "pytorch",
            "device": device, "device_name": name, "workers": WORKERS, "cores": CORES}
