"""Sample images and input.json are made by the kit and stay in sync."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from servelab.core import food11, paths
from servelab.serve import samples


def test_committed_input_json_equals_generator():
    assert paths.INPUT_JSON.read_text() == samples.input_json_text(), (
        "input.json is stale: run `python -m servelab samples input-json`"
    )


def test_input_json_shape_for_perf_analyzer():
    doc = json.loads(paths.INPUT_JSON.read_text())
    (entry,) = doc["data"]
    assert entry["INPUT_IMAGE"]["shape"] == [1]
    (b64,) = entry["INPUT_IMAGE"]["content"]
    img = food11.load_image(food11.decode_base64(b64))
    # the picture perf_analyzer sends is the kit's soup sample, as the model decodes it
    sample = food11.load_image((paths.SAMPLES_DIR / samples.INPUT_JSON_SAMPLE).read_bytes())
    assert img.size == sample.size and img.mode == "RGB"
    assert np.array_equal(np.asarray(img), np.asarray(sample))
    assert food11.decode_base64(b64)[:2] == b"\xff\xd8"  # a JPEG


def test_samples_are_varied_and_redrawn_identically(tmp_path):
    committed = {p.name: p for p in paths.sample_images()}
    redrawn = {p.name: p for p in samples.build_samples(tmp_path, log=lambda *a: None)}
    assert committed.keys() == redrawn.keys()
    assert {p.suffix for p in committed.values()} == {".jpg", ".png"}
    assert len({Image.open(p).size for p in committed.values()}) == len(committed)
    for name, path in committed.items():
        a = np.asarray(Image.open(path).convert("RGB"), dtype=np.int16)
        b = np.asarray(Image.open(redrawn[name]).convert("RGB"), dtype=np.int16)
        assert a.shape == b.shape
        assert np.abs(a - b).mean() < 1.0, name  # JPEG encoders may differ by a rounding
