"""The kit's own Triton clients never send a request Triton answers with a
500 (issue 38, item 5; docs/SECURITY.md lists those upstream answers).

Each client checks its input before anything goes out: the load generator's
request builder (servelab.bench.targets.triton_infer_body, used by every
Triton target and benchmark) and the Flask UI's two Triton backends. The
checks here count the connections a client makes: none for a bad input.
"""

from __future__ import annotations

import base64
import socket
import threading

import numpy as np
import pytest

from servelab.bench import targets
from servelab.core.triton_inputs import BadTritonInput, check_input
from servelab.serve import flask_backends

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


class _Listener:
    """A loopback socket that counts connections (and answers none)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.integration   # a real server
def test_flask_onnx_backend_sends_no_bad_tensor(value):
    listener = _Listener()
    backend = flask_backends.TritonOnnxBackend(listener.url, "food_classifier_onnx", timeout=3)
    backend._config = {"max_batch_size": 16}   # known already: no config request either
    with pytest.raises(flask_backends.ClassifyError) as caught:
        backend.classify(b"", tensor=np.full((3, 224, 224), value, np.float32))
    assert caught.value.code == "invalid_model_input" and caught.value.status == 500
    assert listener.connections == 0, "the backend sent the bad tensor to Triton"
    listener.sock.close()


@pytest.mark.integration   # a real server
def test_flask_backends_check_before_sending(monkeypatch):
    """Both Triton backends call the check on the exact array they send."""
    seen = []

    def spy(name, datatype, shape, data):
        seen.append((name, datatype, tuple(shape)))
        raise BadTritonInput("stop here")

    import servelab.core.triton_inputs as ti

    monkeypatch.setattr(ti, "check_input", spy)
    listener = _Listener()
    for cls, model in ((flask_backends.TritonBackend, "food_classifier"),
                       (flask_backends.TritonOnnxBackend, "food_classifier_onnx")):
        backend = cls(listener.url, model, timeout=3)
        backend._config = {"max_batch_size": 16}
        with pytest.raises(flask_backends.ClassifyError):
            backend.classify(b"\xff\xd8 not decoded here", tensor=GOOD[0])
    assert seen == [("INPUT_IMAGE", "BYTES", (1, 1)), ("input", "FP32", (1, 3, 224, 224))]
    assert listener.connections == 0
