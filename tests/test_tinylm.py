"""servelab.core.tinylm, the token-streaming lesson's decoder: the same tokens whatever shares
the batch, readable output that depends on the prompt, and the request limits both Triton
models enforce."""

from __future__ import annotations

import torch

from servelab.core import tinylm


def test_a_batched_step_matches_each_request_alone():
    m = tinylm.TinyDecoder()
    prompts = [tinylm.encode(p) for p in ("A plate of sushi", "x", "Pizza with extra cheese and olives")]
    alone = [m.generate(p, 30) for p in prompts]
    # all three in one batch from their first step, with caches of three lengths
    started = [m.prefill(p) for p in prompts]
    caches, tokens = [c for c, _ in started], [t for _, t in started]
    out = [[t] for t in tokens]
    for _ in range(29):
        caches, tokens = m.step(caches, tokens)
        for o, t in zip(out, tokens):
            o.append(t)
    assert out == alone
    # a request that joins a batch already under way gets its own tokens too
    c0, t0 = m.prefill(prompts[0])
    for _ in range(10):
        (c0,), (t0,) = m.step([c0], [t0])
    c1, t1 = m.prefill(prompts[1])
    late = [t1]
    for _ in range(5):
        (c0, c1), (t0, t1) = m.step([c0, c1], [t0, t1])
        late.append(t1)
    assert late == alone[1][:6]


def test_output_is_printable_and_depends_on_the_prompt():
    m = tinylm.TinyDecoder()
    a, b = (m.generate(tinylm.encode(p), 40) for p in ("soup", "cake"))
    assert a != b
    assert all(32 <= t < 127 for t in a + b)
    assert len(set(a)) > 5    # not one token repeated
    assert tinylm.decode(a) == bytes(a).decode("ascii")
    # the same seed, the same weights: another process gets the same text
    assert tinylm.TinyDecoder().generate(tinylm.encode("soup"), 40) == a


def test_request_limits():
    size = tinylm.Size()
    assert tinylm.check_request(b"soup", 1) is None
    assert tinylm.check_request(b"x" * size.max_prompt, size.max_new_tokens) is None
    assert tinylm.check_request(b"", 5) == "the prompt is empty"
    assert "at most 256" in tinylm.check_request(b"x" * 257, 5)
    for bad in (0, -1, size.max_new_tokens + 1):
        assert tinylm.check_request(b"soup", bad) == f"max_tokens is {bad}; it must be 1 to 512"


def test_each_model_instance_gets_the_decoder_of_its_kind(monkeypatch):
    """models_streaming/*/1/model.py: tinylm.for_instance(args["model_instance_kind"], device id). A CPU
    instance decodes the small size in float64 (tokens independent of the batch); a GPU instance GPT-2
    small's shape in FP16 on its own GPU."""
    cpu = tinylm.for_instance("CPU")
    assert (cpu.size, cpu.dtype, cpu.device.type) == (tinylm.SIZES["cpu"], torch.float64, "cpu")
    assert tinylm.describe(cpu) == "4 layers, 128 wide, 4 heads, float64 on cpu"
    made = []
    monkeypatch.setattr(tinylm, "TinyDecoder", lambda *a, **kw: made.append((a, kw)))
    tinylm.for_instance("GPU", 1)
    assert made == [((tinylm.SIZES["gpu"],), {"device": "cuda:1", "dtype": torch.float16})]
    assert (tinylm.SIZES["gpu"].n_layers, tinylm.SIZES["gpu"].d_model, tinylm.SIZES["gpu"].n_heads) == (12, 768, 12)
