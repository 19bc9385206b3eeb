"""A model folder the learner builds while Triton runs (notebook 6, "Add a model to the
repository"): the layout, a load over the model-repository API with the admin key, the log
lines of that load, one inference, then the model taken out again so the repository is as
the kit shipped it. Locally the ONNX config goes through the kit's translation (the
onnxruntime runner on the Python backend)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from servelab.course import lab
from servelab.triton.control import forget_model
from tests.triton.conftest import logits

MINE = "my_food_classifier_onnx"
CONFIG = f'''name: "{MINE}"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ {{ name: "input" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }} ]
output [ {{ name: "output" data_type: TYPE_FP32 dims: [ 11 ] }} ]
instance_group [ {{ count: 1 kind: KIND_GPU gpus: [ 0 ] }} ]
'''


@pytest.fixture(scope="module")
def onnx_triton(start_triton, tmp_path_factory, artifacts):
    """Triton on a private copy of the repository (the test adds a folder to it), serving
    only the kit's ONNX model: the one the new folder copies."""
    source = tmp_path_factory.mktemp("repo") / "models"
    shutil.copytree(artifacts["onnx"].parents[1], source / "food_classifier_onnx")
    server = start_triton(repo=source, models=["food_classifier_onnx"])
    yield server
    server.stop()


def test_a_folder_built_by_hand_loads_answers_and_leaves(onnx_triton, reference):
    t = onnx_triton
    folder = t.source / MINE
    (folder / "1").mkdir(parents=True)
    shutil.copy(t.source / "food_classifier_onnx" / "1" / "model.onnx", folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(CONFIG)
    assert MINE not in lab.models_in_repository(t.grpc_url)

    mark = lab.triton_log_mark(t.grpc_url)
    assert mark is not None and mark[0] == str(t.log_path)
    reported = lab.reload_from_files(MINE, t.grpc_url, t.admin_key)
    # the kit's translation: platform onnxruntime_onnx runs on the Python backend's ONNX runner
    assert reported["backend"] == "python" and "servelab_runner" in reported["parameters"]
    assert [g["kind"] for g in reported["instance_group"]] in (["KIND_CPU"], ["KIND_GPU"])
    assert lab.models_in_repository(t.grpc_url) == {"food_classifier_onnx": "READY", MINE: "READY"}
    log = lab.triton_log_since(mark, MINE, wait_for="onnxruntime")  # the runner's line comes a moment later
    assert f"successfully loaded '{MINE}'" in log and "onnxruntime" in log
    assert all(MINE in line for line in log.splitlines()), log  # this load's lines, no others
    # the same file answers as the kit's model does
    batch = reference["inputs"][:2]
    np.testing.assert_allclose(logits(t, MINE, batch), logits(t, "food_classifier_onnx", batch), rtol=1e-5,
                               atol=1e-5)

    lab.remove_model(MINE, t.source, t.grpc_url, t.admin_key)
    assert lab.models_in_repository(t.grpc_url) == {"food_classifier_onnx": "READY"}
    assert not folder.exists() and not (t.repo / MINE).exists()
    assert t.http_client().is_model_ready("food_classifier_onnx")
    lab.remove_model(MINE, t.source, t.grpc_url, t.admin_key)  # again: nothing left to remove, no error


def test_the_runtime_copy_goes_only_after_its_source(onnx_triton):
    with pytest.raises(ValueError, match="delete that folder first"):
        forget_model("food_classifier_onnx", onnx_triton.grpc_url)
    assert (onnx_triton.repo / "food_classifier_onnx" / "config.pbtxt").is_file()
    assert forget_model("never_added", onnx_triton.grpc_url) is False


@pytest.mark.parametrize("name", ["food_classifier", "food_classifier_onnx", "", "..", "a/b", "../models"])
def test_remove_model_refuses_the_kits_models_and_paths(tmp_path, name):
    (tmp_path / "food_classifier").mkdir()
    with pytest.raises(ValueError):
        lab.remove_model(name, tmp_path, "127.0.0.1:1")  # refused before anything is sent
    assert (tmp_path / "food_classifier").is_dir()


def test_a_remote_triton_log_is_read_on_the_node():
    assert lab.triton_log_mark("triton_server:8001") is None
    assert "docker logs triton_server" in lab.triton_log_since(None, MINE)
    assert forget_model(MINE, "triton_server:8001") is False
    with pytest.raises(ValueError):
        forget_model("../x", "triton_server:8001")
