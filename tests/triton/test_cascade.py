"""The BLS cascade (models_bls/food_cascade, issue 50) on the real tritonserver 2.51: its answers
equal the food_pipeline ensemble's, PATH follows the threshold, a bad image fails only its own
request (400), an inner model that cannot answer fails only the requests that need it (503)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from servelab.bench import cascade
from servelab.core import paths
from servelab.triton import control
from servelab.triton.install import GRPC_ADMIN_HEADER

pytestmark = pytest.mark.integration
MODELS = ["food_cascade", "food_preprocess", "food_classifier_onnx", "food_classifier", "food_pipeline",
          "food_postprocess"]


@pytest.fixture(scope="module")
def server(start_triton, tmp_path_factory):
    s = start_triton(repo=cascade.repository(tmp_path_factory.mktemp("cascade") / "models"), models=MODELS)
    yield s
    s.stop()


def ask(url: str, model: str, image: bytes, outputs=("FOOD_LABEL", "PROBABILITY", "PATH")) -> list:
    client = httpclient.InferenceServerClient(url)
    try:
        inp = httpclient.InferInput("IMAGE_BYTES", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[image]], dtype=object))
        r = client.infer(model, [inp])
        return [r.as_numpy(o).reshape(-1)[0] for o in outputs]
    finally:
        client.close()


def set_threshold(server, value: str) -> None:
    control.reload_model("food_cascade", f'parameters {{ key: "threshold" value {{ string_value: "{value}" }} }}',
                         server=server, verbose=False)


def test_answers_equal_the_ensemble_and_path_follows_the_threshold(server):
    escalated = 0
    for sample in paths.sample_images():
        image = sample.read_bytes()
        label, probability, path = ask(server.url, "food_cascade", image)
        want_label, want_probability = ask(server.url, "food_pipeline", image, ("FOOD_LABEL", "PROBABILITY"))
        assert label == want_label, sample.name
        assert probability == pytest.approx(want_probability, abs=1e-4), sample.name
        assert path == (b"onnx" if want_probability >= 0.5 else b"onnx+pytorch"), (sample.name, want_probability)
        if path == b"onnx":
            assert probability == want_probability   # the same three steps as the ensemble: the same float
        escalated += path == b"onnx+pytorch"
    try:
        for threshold, want in (("0", b"onnx"), ("1.01", b"onnx+pytorch")):
            set_threshold(server, threshold)
            assert {ask(server.url, "food_cascade", s.read_bytes())[2] for s in paths.sample_images()} == {want}
    finally:
        control.reload_model("food_cascade", None, server=server, verbose=False)


def test_a_bad_image_fails_alone(server):
    good = [s.read_bytes() for s in paths.sample_images()]
    images = [*good, b"not an image", *good]

    def one(image):
        try:
            return ask(server.url, "food_cascade", image)[0]
        except InferenceServerException as e:
            return e

    with ThreadPoolExecutor(len(images)) as pool:   # together: some share the cascade's batches
        answers = list(pool.map(one, images))
    bad = answers[len(good)]
    assert isinstance(bad, InferenceServerException) and bad.status() == "400", bad
    assert "food_preprocess: not_an_image" in bad.message()
    assert all(isinstance(a, bytes) for i, a in enumerate(answers) if i != len(good)), answers


def test_an_inner_model_that_cannot_answer_fails_only_the_requests_that_need_it(server):
    image = paths.sample_images()[0].read_bytes()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.unload_model("food_classifier", headers={GRPC_ADMIN_HEADER: server.admin_key})
    try:
        set_threshold(server, "1.01")                 # every request needs food_classifier
        with pytest.raises(InferenceServerException) as err:
            ask(server.url, "food_cascade", image)
        assert err.value.status() == "503" and err.value.message().startswith("food_classifier: ")
        set_threshold(server, "0")                    # none does: served from the ONNX path
        assert ask(server.url, "food_cascade", image)[2] == b"onnx"
    finally:
        client.load_model("food_classifier", headers={GRPC_ADMIN_HEADER: server.admin_key})
        client.close()
        control.reload_model("food_cascade", None, server=server, verbose=False)
    assert ask(server.url, "food_cascade", image)[0]
