"""Food-11 web UI: upload a photo, see what the model says and how long it took.

The page does no inference itself; it forwards the image to a model server,
chosen by environment variable, so the same app fronts every stage of the lab:

    INFERENCE_BACKEND=fastapi      FASTAPI_SERVER_URL=http://fastapi_server:8000
    INFERENCE_BACKEND=triton       TRITON_SERVER_URL=triton_server:8000  FOOD11_MODEL_NAME=food_classifier
    INFERENCE_BACKEND=triton_onnx  TRITON_SERVER_URL=triton_server:8000  (model food_classifier_onnx)
    INFERENCE_BACKEND=triton_pipeline  TRITON_SERVER_URL=triton_server:8000  (ensemble food_pipeline: JPEG bytes in)

Run it:   python app.py          (from flask_app/; PORT and HOST env, default 127.0.0.1:5000)
Routes:   GET /  page · POST /predict  form upload · GET /test  classify a bundled
          sample (smoke test, JSON) · GET /health  200 when the backend is ready
"""

import os
import time

from flask import Flask, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

from servelab.core import paths
from servelab.serve import flask_backends

app = Flask(__name__)
# Uploads stay in memory (never saved under the user's file name), and a body
# larger than this is refused with 413 before it is read.
app.request_class = flask_backends.InMemoryRequest
app.config["MAX_CONTENT_LENGTH"] = flask_backends.MAX_UPLOAD_BYTES
app.after_request(flask_backends.add_security_headers)   # no CDN: the page loads only this app's files

backend = flask_backends.from_env()   # which model server answers (see the docstring)


def classify(data: bytes):
    """Check the upload, send it to the backend, time the round trip."""
    flask_backends.check_image(data)      # header only: not an image → 400, too big → 413
    start = time.perf_counter()
    result = backend.classify(data)       # one round trip; the image is decoded once, by the model server
    result.latency_ms = (time.perf_counter() - start) * 1000   # (triton_onnx: decoding here included)
    return result


@app.get("/")
def index():
    return render_template("index.html", backend=backend)


@app.post("/predict")
def predict():
    upload = request.files.get("file")
    if upload is None or not upload.filename:
        raise flask_backends.BadUpload("Choose an image file first.")
    data = upload.read()                                 # bytes in memory
    result = classify(data)
    return render_template("index.html", backend=backend, result=result,
                           preview=flask_backends.preview_data_url(data))


@app.get("/test")
def test():
    sample = paths.sample_images()[0]
    try:
        result = classify(sample.read_bytes())
    except flask_backends.ClassifyError as err:
        return jsonify(error=err.code, message=err.message, backend=backend.name), err.status
    return jsonify(sample=sample.name, **result.as_dict())


@app.get("/health")
def health():
    ready, detail = backend.ready()   # public: names the backend, never its internal address
    return jsonify(status="ok" if ready else "backend_unavailable", backend=backend.name,
                   detail=detail), (200 if ready else 503)


# Errors become the same page with a message and the right status:
# 400 not an image, 413 too large, 503 backend down, 502 backend error.
@app.errorhandler(flask_backends.ClassifyError)
def classify_error(err):
    return render_template("index.html", backend=backend, error=err.message), err.status


@app.errorhandler(HTTPException)
def http_error(err):
    message = flask_backends.http_error_message(err, request)   # e.g. which limit a 413 hit
    return render_template("index.html", backend=backend, error=message), err.code


if __name__ == "__main__":
    app.run(host=os.environ.get("HOST", "127.0.0.1"), port=int(os.environ.get("PORT", "5000")), threaded=True)
