"""model_warmup in the configs: every batch size the dynamic batcher can form
on the GPU node, what the local CPU translation keeps, and a real Triton
running each warm-up before the model is READY (counted in its statistics)."""

from __future__ import annotations

import pytest

from servelab import triton
from servelab.core import paths
from servelab.triton.config import FULL_WARMUP_ENV, config_to_dict, localize_config, warmed_sizes

WARMED = ("food_classifier_onnx", "food_preprocess", "food_postprocess")


def _staged(name):
    return triton.load_config(paths.MODELS_STAGING / name)


@pytest.mark.parametrize("name", WARMED)
def test_configs_warm_every_batch_size(name):
    cfg = config_to_dict(_staged(name))
    assert warmed_sizes(cfg) == set(range(1, cfg["max_batch_size"] + 1))


def test_an_ensemble_carries_no_warmup_its_steps_do():
    cfg = config_to_dict(_staged("food_pipeline"))
    assert "model_warmup" not in cfg  # Triton refuses it on an ensemble
    steps = {s["model_name"] for s in cfg["ensemble_scheduling"]["step"]}
    assert steps == set(WARMED)


def test_local_translation_keeps_what_the_cpu_needs(monkeypatch):
    monkeypatch.delenv(FULL_WARMUP_ENV, raising=False)
    onnx = _staged("food_classifier_onnx")
    on_gpu, notes = localize_config(onnx, gpus=1)
    assert warmed_sizes(config_to_dict(on_gpu)) == set(range(1, 17)) and not any("model_warmup" in n for n in notes)
    on_cpu, notes = localize_config(onnx, gpus=0)
    assert warmed_sizes(config_to_dict(on_cpu)) == {1}
    assert any("model_warmup" in n and FULL_WARMUP_ENV in n for n in notes)
    assert localize_config(on_cpu, gpus=0)[0] == on_cpu  # idempotent
    # With preferred sizes, the CPU keeps those too (servelab.triton.config.batch_sizes_to_warm).
    edited = triton.dict_to_config({**config_to_dict(onnx), "dynamic_batching": {"preferred_batch_size": [4, 8]}})
    assert warmed_sizes(config_to_dict(localize_config(edited, gpus=0)[0])) == {1, 4, 8}
    monkeypatch.setenv(FULL_WARMUP_ENV, "1")
    assert warmed_sizes(config_to_dict(localize_config(onnx, gpus=0)[0])) == set(range(1, 17))


def test_triton_runs_every_warmup_size_on_every_instance_before_ready(start_triton, monkeypatch):
    """The GPU node's warm-up, every size 1..16, on the real local Triton: each
    size is one execution per instance in the statistics right after the load,
    before any client request."""
    monkeypatch.setenv(FULL_WARMUP_ENV, "1")
    server = start_triton(models=["food_pipeline", *WARMED])
    try:
        for name in WARMED:
            snap = server.snapshot(name)
            instances = triton.instance_count(server.model_config(name))
            executions = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in snap["batch_stats"]}
            assert executions == {size: instances for size in range(1, 17)}, (name, executions)
            assert snap["inference_stats"]["fail"]["count"] == 0
    finally:
        server.stop()
