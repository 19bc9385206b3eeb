"""The food_pipeline ensemble on the real local Triton: JPEG bytes in, label
and probability out, through food_preprocess -> food_classifier_onnx ->
food_postprocess. A bad image in a batch gets its own error, the rest of the
batch is served, and the server keeps serving; the Flask UI's
``triton_pipeline`` backend end to end."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.core import food11
from tests.services.helpers import bomb_png, scan_bomb_jpeg, truncated_jpeg, truncated_jpeg_with_end

PIPELINE_MODELS = ["food_pipeline", "food_preprocess", "food_classifier_onnx", "food_postprocess"]


@pytest.fixture(scope="module")
def pipeline_triton(start_triton):
    server = start_triton(models=PIPELINE_MODELS)
    yield server
    server.stop()


def _infer(client, data: bytes):
    import tritonclient.http as httpclient

    inp = httpclient.InferInput("IMAGE_BYTES", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[data]], dtype=object))
    return client.async_infer("food_pipeline", [inp])


def _outcome(future):
    from tritonclient.utils import InferenceServerException

    try:
        r = future.get_result()
    except InferenceServerException as err:
        return ("error", str(err.status()), err.message())
    label = r.as_numpy("FOOD_LABEL").reshape(-1)[0].decode()
    return ("ok", label, float(r.as_numpy("PROBABILITY").reshape(-1)[0]))


def test_pipeline_answers_what_the_onnx_model_says(pipeline_triton, sample_bytes, reference):
    client = pipeline_triton.http_client()
    try:
        for name, data in sample_bytes.items():
            kind, label, prob = _outcome(_infer(client, data))
            expected = food11.predict_from_logits(reference["onnx_logits"][name][None])[0]
            assert (kind, label) == ("ok", expected.label), name
            assert prob == pytest.approx(expected.probability, abs=1e-4)
    finally:
        client.close()


def test_bad_images_in_a_batch_get_their_own_errors(pipeline_triton, sample_bytes):
    """Preprocessing waits 200 ms to gather a batch, one copy: good and bad
    images sent together land in the same execute() call."""
    pipeline_triton.reload_model("food_preprocess", {
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "dynamic_batching": {"max_queue_delay_microseconds": 200000},
    })
    good = list(sample_bytes.values())
    bad = [("not_an_image", b"plain text, not a photo"), ("truncated_image", truncated_jpeg()),
           ("truncated_image", truncated_jpeg_with_end()), ("image_too_large", bomb_png()),
           ("image_too_large", scan_bomb_jpeg())]
    sent = [("ok", g) for g in good[:3]] + bad + [("ok", good[0])]
    before = pipeline_triton.snapshot("food_preprocess")
    client = pipeline_triton.http_client(concurrency=len(sent))
    try:
        outcomes = [_outcome(f) for f in [_infer(client, data) for _, data in sent]]
        for (expected, _), got in zip(sent, outcomes):
            if expected == "ok":
                assert got[0] == "ok" and got[1] in food11.LABELS, got
            else:
                # Each bad image: a 400 naming its own problem, as the Python model answers.
                assert got[:2] == ("error", "400") and f"{expected}: " in got[2], (expected, got)
        # They really shared executions: fewer batches than requests.
        from servelab.triton.stats import stats_delta

        delta = stats_delta(before, pipeline_triton.snapshot("food_preprocess"))
        assert max(delta["batch_histogram"]) > 1, delta
        # And the server keeps serving.
        assert _outcome(_infer(client, good[1]))[0] == "ok"
    finally:
        client.close()
        pipeline_triton.reload_model("food_preprocess")  # back to models_staging's config


def test_flask_page_on_the_pipeline(pipeline_triton, sample_bytes, monkeypatch):
    """flask_app/app.py with INFERENCE_BACKEND=triton_pipeline, as the kit serves it: an upload is
    classified by the ensemble, with the weights' kind from the steps' build stamps; a refused one is
    the page's 400/413, with the decoder's reason."""
    import io

    from servelab.serve import harden

    monkeypatch.setenv("INFERENCE_BACKEND", "triton_pipeline")
    monkeypatch.setenv("TRITON_SERVER_URL", pipeline_triton.url)
    monkeypatch.delenv("FOOD11_MODEL_NAME", raising=False)
    page = harden.load("flask_app").test_client()

    def upload(data):
        return page.post("/predict", data={"file": (io.BytesIO(data), "food.jpg")}, content_type="multipart/form-data")

    r = upload(next(iter(sample_bytes.values())))
    assert r.status_code == 200, r.get_data(as_text=True)[:300]
    assert "triton_pipeline" in r.get_data(as_text=True)
    smoke = page.get("/test").get_json()
    assert smoke["backend"] == "triton_pipeline" and smoke["prediction"] in food11.LABELS
    assert 0 < smoke["probability"] <= 1 and smoke["weights_kind"] in ("demo", "trained")
    for cut_short in (truncated_jpeg(), truncated_jpeg_with_end()):   # passes the header check:
        r = upload(cut_short)                                          # found by Triton's decoder
        assert r.status_code == 400 and "truncated" in r.get_data(as_text=True).lower()
    assert upload(bomb_png()).status_code == 413         # refused by the page's header check
    assert upload(scan_bomb_jpeg()).status_code == 413
    assert page.get("/health").status_code == 200


def test_first_request_after_load_with_and_without_warmup(pipeline_triton):
    """servelab.bench.warmup reloads the model without, then with, its
    model_warmup and times the first request after each load (figures: the
    notebook 6a and its answer key; here only that it measures and leaves the
    model as its config asks)."""
    from servelab.bench.warmup import first_request_after_load

    result = first_request_after_load(pipeline_triton.url, "food_classifier_onnx", rounds=1, steady=2)
    for arm in ("without", "with"):
        assert len(result[arm]["first_ms"]) == 1 and result[arm]["first_median"] > 0
        assert result[arm]["steady_median"] > 0
    assert result["warmup_sizes"] == [1]  # the local CPU translation of 1..16
    assert pipeline_triton.model_config("food_classifier_onnx").get("model_warmup")


def test_preprocessing_says_where_it_decodes_and_refuses_a_gpu_it_cannot_have(pipeline_triton, sample_bytes):
    """The shipped food_preprocess (KIND_CPU, decode: auto) decodes on the CPU and says so; asked
    for decode=gpu on this GPU-less machine, the new copies refuse to load with the reason, and the
    copies already loaded keep serving (models_staging/food_preprocess/1/model.py)."""
    from servelab.gpucheck import decode

    said = decode.decoders_logged(pipeline_triton.log_path, 0)
    assert said and set(said) == {"decoding on the CPU: the instance is KIND_CPU"}, said
    with pytest.raises(Exception, match="decode=gpu asked, but this instance is KIND_CPU"):
        pipeline_triton.reload_model("food_preprocess", {"parameters": {"decode": {"string_value": "gpu"}}})
    client = pipeline_triton.http_client()
    try:
        name, data = next(iter(sample_bytes.items()))
        assert _outcome(_infer(client, data))[0] == "ok", name
    finally:
        client.close()
        pipeline_triton.reload_model("food_preprocess")  # back to models_staging's config
