"""servelab.serve.models: demo weights, export parity, trained weights, idempotent builds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from servelab.core import food11, paths
from servelab.serve import models


def test_artifacts_placed_with_stamps(built_models):
    for target in (*paths.PTH_TARGETS, *paths.ONNX_TARGETS):
        assert target.is_file(), target
        stamp = json.loads(target.with_name(target.name + ".json").read_text())
        assert stamp["weights_kind"] == "demo"
        assert food11.weights_kind(target) == "demo"


def test_onnx_io_contract(built_models):
    import onnx

    m = onnx.load(str(paths.ONNX_TARGETS[1]))
    (inp,), (out,) = m.graph.input, m.graph.output
    assert inp.name == "input" and out.name == "output"
    dims = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa: E731
    assert dims(inp)[1:] == [3, 224, 224] and isinstance(dims(inp)[0], str)  # dynamic batch
    assert dims(out)[1:] == [11] and isinstance(dims(out)[0], str)
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_export_parity_recomputed(built_models):
    import torch

    model = torch.load(paths.PTH_TARGETS[0], weights_only=False)
    model.eval()
    diff = models.parity(model, paths.ONNX_TARGETS[0], batch=4, seed=5)
    print(f"ORT vs PyTorch max abs diff: {diff:.2e}")
    assert diff <= models.PARITY_TOLERANCE
    assert built_models.parity_max_abs_diff <= models.PARITY_TOLERANCE


def test_demo_predictions_differ_across_samples(built_models, sample_paths):
    labels = {models.predict_each(p)["food11.onnx (ONNX Runtime)"].label for p in sample_paths}
    assert len(labels) >= 3, f"demo weights label everything alike: {labels}"


def test_second_build_does_no_work(built_models):
    lines = []
    result = models.build(log=lines.append)
    assert result.skipped and result.copied == []
    assert any("nothing to rebuild" in line for line in lines)


@pytest.mark.integration   # builds both ONNX files from the given weights: ~30-40 s, too long for the fast tier
def test_trained_weights_in_both_formats(tmp_path):
    import torch

    torch.manual_seed(0)
    net = models.new_mobilenet_v2().eval()
    full, state = tmp_path / "full.pth", tmp_path / "state.pth"
    torch.save(net, full)
    torch.save({"state_dict": {f"module.{k}": v for k, v in net.state_dict().items()}}, state)
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(2, 3, 224, 224)).astype(np.float32))
    with torch.no_grad():
        ref = net(x)
    for src in (full, state, state.as_uri()):
        loaded = models.load_trained(str(src))
        with torch.no_grad():
            assert torch.allclose(loaded(x), ref)
    out = tmp_path / "out"
    res = models.build(weights=str(state), out_dir=out, place=False, log=lambda *a: None)
    assert res.weights_kind == "trained" and not res.skipped
    assert json.loads((out / "build.json").read_text())["weights_kind"] == "trained"
    assert models.build(weights=str(state), out_dir=out, place=False, log=lambda *a: None).skipped


def test_wrong_head_gives_a_clear_error(tmp_path):
    import torch
    import torchvision

    imagenet = torchvision.models.mobilenet_v2(weights=None)  # 1000 classes
    sd, full = tmp_path / "imagenet_sd.pth", tmp_path / "imagenet_full.pth"
    torch.save(imagenet.state_dict(), sd)
    torch.save(imagenet, full)
    with pytest.raises(models.WeightsError, match=r"Linear\(1280, 11\).*classifier\.1\.weight: got \(1000, 1280\)"):
        models.load_trained(str(sd))
    with pytest.raises(models.WeightsError, match=r"outputs shape \(1, 1000\)"):
        models.load_trained(str(full))
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(models.WeightsError, match="not a PyTorch checkpoint"):
        models.load_trained(str(junk))
    with pytest.raises(models.WeightsError, match="no such file"):
        models.load_trained(str(tmp_path / "missing.pth"))


def test_cli_build_reports_wrong_weights(tmp_path, capsys):
    from servelab.cli import main

    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"nope")
    assert main(["models", "build", "--weights", str(junk)]) == 2
    assert "not a PyTorch checkpoint" in capsys.readouterr().err


def test_a_pickled_model_that_is_not_mobilenet_v2_is_refused(tmp_path):
    import torch

    other = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(3, 11))
    torch.save(other, tmp_path / "other.pth")
    with pytest.raises(models.WeightsError, match=r"a pickled Sequential, not MobileNetV2"):
        models.load_trained(str(tmp_path / "other.pth"))


def test_the_nodes_build_prefers_trained_weights_else_demo_in_one_line(tmp_path, monkeypatch):
    """`build --prefer-weights PATH` (the models container's command): PATH when it builds, else the demo weights."""
    calls, lines = [], []

    def fake_build(weights=None, **kw):
        calls.append(weights)
        if weights and "bad" in weights:
            raise models.WeightsError(f"{weights}: a pickled Sequential, not {models.EXPECTED_HEAD}.")
        return weights

    monkeypatch.setattr(models, "build", fake_build)
    assert models.build_preferring(tmp_path / "absent.pth", log=lines.append) is None
    good, bad = tmp_path / "good.pth", tmp_path / "bad.pth"
    good.write_bytes(b"x")
    bad.write_bytes(b"x")
    assert models.build_preferring(good, log=lines.append) == str(good)
    assert models.build_preferring(bad, log=lines.append) is None
    assert calls == [None, str(good), str(bad), None]
    assert len(lines) == 2
    assert lines[0].startswith("trained weights: none at ") and lines[0].endswith("building the demo weights")
    assert lines[1].startswith("trained weights refused (") and "not MobileNetV2" in lines[1]


def test_the_nodes_build_of_a_file_that_is_not_the_model_is_demo(tmp_path, built_models):
    """A real refusal: the file is not a checkpoint; the build goes on with the demo weights (already built)."""
    junk = tmp_path / "food11.pth"
    junk.write_bytes(b"not a checkpoint")
    lines = []
    res = models.build_preferring(junk, place=False, log=lines.append)
    assert res.weights_kind == "demo" and res.pth == built_models.pth
    assert json.loads((paths.MODELS_BUILD_DIR / "build.json").read_text())["weights_kind"] == "demo"
    assert any(x.startswith("trained weights refused (") and "not a PyTorch checkpoint" in x for x in lines)


def test_cli_refuses_both_weights_options(capsys):
    from servelab.cli import main

    assert main(["models", "build", "--weights", "a.pth", "--prefer-weights", "b.pth"]) == 2
    assert "not both" in capsys.readouterr().err
