"""Live reconfiguration under load (bounded version of
benchmarks/reload_under_load.py): while closed-loop clients keep sending to
a Python-backend model, the kit's reload helper changes ``instance_group``
and toggles ``dynamic_batching`` three times. No client request may fail,
and after each reload Triton reports the config asked for and runs that many
stub processes."""

from __future__ import annotations

import importlib.util
import sys

from .relsupport import REPO


def _script():
    spec = importlib.util.spec_from_file_location("reload_under_load", REPO / "benchmarks" / "reload_under_load.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


# Locally both lab models run on Triton's Python backend (the ONNX model through
# servelab's onnxruntime runner); the ONNX one restarts its stubs in a fraction
# of the time torch needs, which keeps this test short. The script
# (`python benchmarks/reload_under_load.py`) measures the PyTorch model too.
MODEL = "food_classifier_onnx"


def test_three_reloads_under_load_fail_nothing(triton):
    mod = _script()
    try:
        rec = mod.measure(triton, MODEL, concurrency=6, settle=1.0, log=None)
    finally:
        triton.reload_model(MODEL, None, verbose=False)  # back to models_staging/
    print("\n" + mod.report(rec))
    assert len(rec["reloads"]) == 3
    for r in rec["reloads"]:
        assert r["reported_instances"] == r["wanted_instances"], r
        assert r["stubs"] == r["wanted_instances"], r
        assert r["reported_dynamic_batching"] == r["wanted_dynamic_batching"], r
    assert rec["requests"] > 20, "the load did not run"
    assert rec["failed"] == 0, mod.report(rec)
