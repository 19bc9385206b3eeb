"""The response-cache benchmark's workload (servelab.bench.response_cache): which requests can hit."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from servelab.bench import response_cache
from servelab.core import paths


def test_a_request_repeats_only_bytes_sent_before():
    reqs = response_cache.workload(60, 0.5, seed=3)
    seen = set()
    for image, repeat in reqs:
        assert repeat == (image in seen)
        seen.add(image)
    repeats = sum(r for _, r in reqs)
    assert 0 < repeats < 60 and len(seen) == 60 - repeats
    assert response_cache.workload(60, 0.5, seed=3) == reqs                     # the same sequence for both runs
    assert not any(r for _, r in response_cache.workload(30, 0.0))               # no share: every request new
    assert sum(r for _, r in response_cache.workload(30, 1.0)) == 30 - response_cache.REPEATED_PHOTOS


def test_same_photo_other_bytes():
    sample = paths.sample_images()[0]
    a, b = response_cache.photo_bytes(sample, "one"), response_cache.photo_bytes(sample, "two")
    assert a != b
    pixels = [np.asarray(Image.open(io.BytesIO(x))) for x in (a, b)]
    assert np.array_equal(*pixels)


def test_server_args_name_the_shipped_local_cache():
    args = response_cache.server_args()
    folder = next(a.split("=", 1)[1] for a in args if a.startswith("--cache-directory="))
    assert (Path(folder) / "local" / "libtritoncache_local.so").is_file()
    assert any(a.startswith("--cache-config=local,size=") for a in args)


def test_same_answers_allows_the_last_digits_of_a_recomputed_probability():
    """A miss runs the model again, on 1 or on every core: its probability may differ in the last
    digits (1.8e-6 measured between 1 and 2 threads), never its label, and never by 1e-3."""
    base = [("Soup", 0.25), ("Rice", 0.5)]
    assert response_cache.same_answers(base, [("Soup", 0.25 + 2e-6), ("Rice", 0.5 - 2e-6)])
    assert not response_cache.same_answers(base, [("Soup", 0.25), ("Bread", 0.5)])
    assert not response_cache.same_answers(base, [("Soup", 0.25 + 1e-3), ("Rice", 0.5)])
    assert not response_cache.same_answers(base, base[:1])
