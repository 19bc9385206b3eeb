"""The kit's own Triton clients never send a request Triton answers with a
500 (issue 38, item 5; docs/SECURITY.md lists those upstream answers).

Each client checks its input before anything goes out: the load generator's
request builder (servelab.bench.targets.triton_infer_body, used by every
Triton target and benchmark). The Flask page's Triton calls (flask_app/) send
only inputs that pass the same check by construction; the last test runs the
check on what they send.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest

from servelab.bench import targets
from servelab.core.triton_inputs import BadTritonInput, check_input

GOOD = np.zeros((1, 3, 224, 224), np.float32)

# What Triton 2.51 answers with a 500 (or a bare NaN), as one input each.
BAD = [
    ("negative shape", ("input", "FP32", [-1, 3, 224, 224], GOOD)),
    ("strings in FP32 data", ("input", "FP32", [1, 2], np.array(["a", "b"]))),
    ("too few elements", ("input", "FP32", [1, 3, 224, 224], GOOD[:, :2])),
    ("too many elements", ("input", "FP32", [1, 3, 224, 223], GOOD)),
    ("NaN", ("input", "FP32", [1, 3, 224, 224], np.full(GOOD.shape, np.nan, np.float32))),
    ("infinity", ("input", "FP32", [1, 3, 224, 224], np.full(GOOD.shape, np.inf, np.float32))),
    ("unknown datatype", ("input", "FP8", [1], np.zeros(1))),
    ("BYTES count", ("INPUT_IMAGE", "BYTES", [1, 1], [b"a", b"b"])),
    ("BYTES of text", ("INPUT_IMAGE", "BYTES", [1, 1], ["not bytes"])),
    ("shape of floats", ("input", "FP32", [1.0, 2.0], np.zeros(2, np.float32))),
]


@pytest.mark.parametrize("case,inp", BAD, ids=[c[0] for c in BAD])
def test_load_generator_builds_no_bad_request(case, inp):
    with pytest.raises(BadTritonInput):
        targets.triton_infer_body([inp], ["output"])
    with pytest.raises(BadTritonInput):
        targets.triton_infer_body([inp], ["output"], binary=False)   # nor as JSON (where NaN would go bare)


def test_good_inputs_pass():
    check_input("input", "FP32", [1, 3, 224, 224], GOOD)
    check_input("INPUT_IMAGE", "BYTES", [1, 1], [base64.b64encode(b"x")])
    body, headers = targets.triton_infer_body([("input", "FP32", [1, 3, 224, 224], GOOD)], ["output"])
    assert len(body) > GOOD.nbytes and "Inference-Header-Content-Length" in headers


@pytest.mark.parametrize("backend", ["triton", "triton_onnx", "triton_pipeline"])
def test_the_flask_page_sends_only_inputs_that_pass_the_check(monkeypatch, backend):
    """The page (flask_app/app.py with triton_client.py beside it) sends the upload as one BYTES
    element, or food11.preprocess's tensor: what it hands tritonclient passes check_input, for
    every sample photo."""
    import tritonclient.http as httpclient

    from servelab.core import paths
    from servelab.serve import harden

    sent = []

    def infer(self, model, inputs, outputs=None, **kw):
        for i in inputs:
            sent.append((i.name(), i.datatype(), i.shape()))
            check_input(i.name(), i.datatype(), i.shape(), _elements(i))
        raise ConnectionRefusedError("no Triton here")   # stop before the network

    monkeypatch.setattr(httpclient.InferenceServerClient, "infer", infer)
    monkeypatch.setenv("INFERENCE_BACKEND", backend)
    monkeypatch.delenv("FOOD11_MODEL_NAME", raising=False)
    page = harden.load("flask_app").test_client()
    for photo in paths.sample_images():
        r = page.post("/predict", data={"file": (photo.open("rb"), photo.name)}, content_type="multipart/form-data")
        assert r.status_code == 503, r.get_data(as_text=True)[:300]
    want = {"triton": ("INPUT_IMAGE", "BYTES", [1, 1]), "triton_pipeline": ("IMAGE_BYTES", "BYTES", [1, 1]),
            "triton_onnx": ("input", "FP32", [1, 3, 224, 224])}[backend]
    assert sent == [want] * len(paths.sample_images())


def _elements(inp):
    """The elements an InferInput holds (set with binary_data: decoded back from its raw bytes)."""
    raw = inp._raw_data
    assert raw is not None, "the page sends its tensors as binary data"
    if inp.datatype() == "FP32":
        return np.frombuffer(raw, np.float32)
    from tritonclient.utils import deserialize_bytes_tensor

    return list(deserialize_bytes_tensor(raw))
