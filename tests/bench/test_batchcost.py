"""servelab.bench.batchcost.raw_onnx (notebook 6's raw S(b) curve): the measurement
notebook tests run notebook 6 in the Jupyter image's package set, which has no ONNX
Runtime, so the raw curve is tested here, in the kit's venv where it runs."""

from __future__ import annotations

import sys

from servelab.bench import batchcost


def test_raw_onnx_times_each_batch_size(built_models):
    out = batchcost.raw_onnx(sizes=(1, 4), repeats=2, threads=1)
    assert sorted(out["seconds"]) == [1, 4] and all(s > 0 for s in out["seconds"].values())
    assert out["per_image_ms"][4] == 1000 * out["seconds"][4] / 4 and out["threads"] == 1


def test_onnxruntime_available_follows_the_import(monkeypatch):
    assert batchcost.onnxruntime_available()          # the kit's venv has it
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as in the Jupyter image: not importable
    assert not batchcost.onnxruntime_available()
