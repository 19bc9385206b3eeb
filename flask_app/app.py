"""Food-11 web page: upload a photo, see what the model server says and how long it took.

The page does no inference itself: it forwards the photo to the model server that
INFERENCE_BACKEND names, so the same app fronts every stage of the lab:

    fastapi          POST $FASTAPI_SERVER_URL/predict, the photo as base64 JSON (fastapi_pt/ or fastapi_onnx/)
    triton           Triton's Python model food_classifier: the photo as base64 text; Triton decodes it
    triton_onnx      Triton's ONNX model food_classifier_onnx: this page decodes the photo, Triton runs the network
    triton_pipeline  Triton's ensemble food_pipeline: the file's own bytes; its steps decode and classify

Triton is at $TRITON_SERVER_URL (host:port); $FOOD11_MODEL_NAME names another model of the same
kind. The calls to Triton are in triton_client.py, beside this file.

The kit serves this app hardened from outside the file (servelab/serve/flask_harden.py): uploads
kept in memory and bounded, security headers, /test, the weights' kind, and every failure as this
page with its status (400 not an image, 413 too large, 503 model server down, 502 its error):

    gunicorn --config python:servelab.serve.webserver servelab.serve.harden:flask_app
"""

import base64
import os
import time

import requests
import triton_client  # beside this file: the calls to Triton
import tritonclient.http as httpclient
from flask import Flask, abort, jsonify, render_template, request

from servelab.core import food11  # the image checks and preprocessing every part of the lab shares

BACKEND = os.environ.get("INFERENCE_BACKEND", "fastapi")
FASTAPI_URL = os.environ.get("FASTAPI_SERVER_URL", "http://127.0.0.1:8000")
TRITON_URL = os.environ.get("TRITON_SERVER_URL", "127.0.0.1:8000")
DEFAULT_MODELS = {"triton": "food_classifier", "triton_onnx": "food_classifier_onnx", "triton_pipeline": "food_pipeline"}
if BACKEND != "fastapi" and BACKEND not in DEFAULT_MODELS:
    raise SystemExit(f"INFERENCE_BACKEND must be fastapi, {', '.join(DEFAULT_MODELS)}; got {BACKEND!r}")
MODEL = os.environ.get("FOOD11_MODEL_NAME") or DEFAULT_MODELS.get(BACKEND, "")

app = Flask(__name__)


def triton():
    # A new client per call: Flask serves each request on its own thread, and a
    # tritonclient.http client belongs to the thread that made it.
    return httpclient.InferenceServerClient(TRITON_URL, connection_timeout=3.0, network_timeout=30.0)


def ask_model_server(data: bytes) -> dict:
    """One round trip: the model server's answer, {"prediction": label, "probability": p, ...}."""
    if BACKEND == "fastapi":
        r = requests.post(f"{FASTAPI_URL}/predict", json={"image": base64.b64encode(data).decode("ascii")},
                          timeout=(3, 30))
        r.raise_for_status()                       # 4xx: it refused the image; 5xx: it failed
        return r.json()                            # FastAPI also says which weights answered
    client = triton()
    try:
        if BACKEND == "triton":                    # base64 text; the Python model decodes it
            label, p = triton_client.classify_image(client, MODEL, base64.b64encode(data))
        elif BACKEND == "triton_pipeline":         # the file's own bytes; the ensemble decodes them
            label, p = triton_client.classify_image(client, MODEL, data, input_name="IMAGE_BYTES")
        else:                                      # triton_onnx: decode here, send the float tensor
            label, p = triton_client.classify_tensor(client, MODEL, food11.preprocess(data))
    finally:
        client.close()
    return {"prediction": label, "probability": p}


def classify(data: bytes) -> dict:
    """Check the upload, ask the model server, time the round trip."""
    if not data:
        abort(400, "The uploaded file is empty.")
    food11.check_image_header(data)                # the header only (not an image: 400, too big: 413);
    start = time.perf_counter()                    # the model server decodes the image itself
    result = ask_model_server(data)
    result["latency_ms"] = (time.perf_counter() - start) * 1000
    result["backend"] = BACKEND
    return result


@app.get("/")
def index():
    return render_template("index.html", backend=BACKEND, model=MODEL)


@app.post("/predict")
def predict():
    upload = request.files.get("file")
    if upload is None or not upload.filename:
        abort(400, "Choose an image file first.")
    data = upload.read()                           # bytes in memory, never saved under the user's name
    result = classify(data)
    kind, _ = food11.check_image_header(data)      # shown beside the result, if the browser can
    preview = None
    if kind in ("JPEG", "PNG", "GIF", "WEBP") and len(data) <= 2 * 1024 * 1024:
        preview = f"data:image/{kind.lower()};base64,{base64.b64encode(data).decode('ascii')}"
    return render_template("index.html", backend=BACKEND, model=MODEL, result=result, preview=preview)


@app.get("/health")
def health():
    """200 when the model server says it is ready."""
    if BACKEND == "fastapi":
        ready = requests.get(f"{FASTAPI_URL}/health", timeout=3).status_code == 200
    else:
        client = triton()
        try:
            ready = client.is_model_ready(MODEL)
        finally:
            client.close()
    return jsonify(status="ok" if ready else "backend_unavailable", backend=BACKEND), (200 if ready else 503)
