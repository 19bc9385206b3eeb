"""An idle Triton uses ~0 CPU after serving: the server and every stub of the
lab's two models (issue 14). A stub whose OpenMP threads spin while waiting
(OMP_WAIT_POLICY=ACTIVE) shows up here at ~100 % of a core."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from servelab.core import procs

httpclient = pytest.importorskip("tritonclient.http")

IDLE_SECONDS = 4.0
LIMIT_PERCENT = 3.0  # issue 14's target is 2 % over 10 s; a shorter window, a little slack


def test_idle_server_and_stubs_use_no_cpu(lab_triton, sample_bytes):
    client = lab_triton.http_client()
    image = base64.b64encode(next(iter(sample_bytes.values())))
    inp = httpclient.InferInput("INPUT_IMAGE", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[image]], dtype=object))
    tensor = httpclient.InferInput("input", [1, 3, 224, 224], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))
    for _ in range(3):
        client.infer("food_classifier", [inp])
        client.infer("food_classifier_onnx", [tensor])
    watched = {"tritonserver": lab_triton.pid}
    watched |= {f"stub {s.model} ({s.pid})": s.pid for s in lab_triton.stub_processes()}
    assert len(watched) >= 3, watched  # the server and a stub per model
    procs.idle_cpu_percent(watched, 1.0)  # thread pools end their short spin
    used = procs.idle_cpu_percent(watched, IDLE_SECONDS)
    busy = {name: round(pct, 1) for name, pct in used.items() if pct > LIMIT_PERCENT}
    assert not busy, f"idle processes using CPU (% of a core): {busy}"


def test_stubs_stop_spinning_soon_after_a_pass(lab_triton):
    """Every stub inherits the short OpenMP spin (servelab/triton/install.py): with
    libgomp's default, a copy that has just finished keeps spinning for milliseconds
    into the next copy's pass, and passes alternating between two copies ran 1.2-1.3x slower."""
    import psutil

    from servelab.triton.install import GOMP_SPINCOUNT

    stubs = lab_triton.stub_processes()
    assert stubs and GOMP_SPINCOUNT == "10000"
    for stub in stubs:
        assert psutil.Process(stub.pid).environ().get("GOMP_SPINCOUNT") == GOMP_SPINCOUNT, stub.model
