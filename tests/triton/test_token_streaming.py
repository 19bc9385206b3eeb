"""The token-streaming models (models_streaming/) on the real Triton 2.51: both schedulers stream
the tokens of the plain one-request loop (servelab.core.tinylm), requests of different lengths
share batches, bad requests end their own stream with a clear error, and a client that
disconnects mid-stream stops its decoding."""

from __future__ import annotations

import asyncio
import time

import pytest

from servelab.bench import streaming
from servelab.core import paths, tinylm
from tests.tiers import tier

MODELS = ("tokens_request_level", "tokens_iteration_level")


@pytest.fixture(scope="module")
@tier("integration")
def triton(start_triton):
    server = start_triton(repo=paths.MODELS_STREAMING)
    yield server
    server.stop()


def _streams(triton, model, plan, cancel_after=None):
    """Send every Stream of ``plan`` at once (each on its own gRPC stream)."""
    import tritonclient.grpc.aio as aioclient

    async def go():
        client = aioclient.InferenceServerClient(triton.grpc_url)
        try:
            t0 = time.perf_counter()
            return await asyncio.gather(*(streaming.stream_one(client, model, s, t0, cancel_after) for s in plan))
        finally:
            await client.close()
    return asyncio.run(go())


def _executions(triton, model) -> tuple[int, int]:
    """(requests, executions) Triton counted for ``model`` so far."""
    stats = triton.http_client().get_inference_statistics(model)["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


@pytest.mark.parametrize("model", MODELS)
def test_streams_the_tokens_of_the_plain_loop_in_shared_batches(triton, model):
    reference = tinylm.TinyDecoder()
    plan = [streaming.Stream(0.0, p.encode(), n) for p, n in
            [("A plate of sushi", 40), ("x", 3), ("Pizza with extra cheese", 17), ("Ramen", 1),
             ("A bowl of fruit salad", 25), ("\u00e9clair \u00e0 la cr\u00e8me", 9)]]
    before = _executions(triton, model)
    done = _streams(triton, model, plan)
    for s in done:
        assert s.error is None, s.error
        assert s.tokens == reference.generate(list(s.prompt), s.max_tokens), s.prompt
        assert all(32 <= t < 127 for t in s.tokens)
    after = _executions(triton, model)
    steps = after[1] - before[1]
    if model == "tokens_iteration_level":
        # one execution per decoding step, shared: fewer than one per token, at least the longest's
        assert 40 <= steps < sum(s.max_tokens for s in plan), (before, after)
    else:
        # whole requests per execution: fewer executions than requests
        assert 1 <= steps < len(plan), (before, after)


@pytest.mark.parametrize("model", MODELS)
def test_a_bad_request_ends_its_own_stream_and_the_model_keeps_serving(triton, model):
    cases = [(b"", 5, "the prompt is empty"),
             (b"x" * 257, 5, "the prompt is 257 bytes; at most 256"),
             (b"soup", -1, "max_tokens is -1; it must be 1 to 512"),
             (b"soup", 0, "max_tokens is 0; it must be 1 to 512"),
             (b"soup", 513, "max_tokens is 513; it must be 1 to 512")]
    plan = [streaming.Stream(0.0, p, n) for p, n, _ in cases] + [streaming.Stream(0.0, b"soup", 4)]
    done = _streams(triton, model, plan)   # the bad ones batched beside a good one
    for s, (_, _, message) in zip(done, cases):
        assert s.error is not None and message in s.error and s.tokens == [], (s.error, message)
    good = done[-1]
    assert good.error is None and good.tokens == tinylm.TinyDecoder().generate(list(b"soup"), 4)


@pytest.mark.parametrize("model", MODELS)
def test_a_client_that_disconnects_mid_stream_stops_its_decoding(triton, model):
    """Request level: the model sees the request cancelled at its next step. Iteration level:
    Triton cancels the request while it waits to be rescheduled and never hands it back; the
    model frees that sequence's state at its first step after 5 s without one."""
    reference = tinylm.TinyDecoder()
    log_before = triton.log_path.read_text().count("cancelled by its client")
    s = _streams(triton, model, [streaming.Stream(0.0, b"A long story", 512)], cancel_after=3)[0]
    assert 3 <= len(s.tokens) < 512
    assert s.tokens == reference.generate(list(b"A long story"), len(s.tokens))
    deadline = time.monotonic() + 30
    while triton.log_path.read_text().count("cancelled by its client") == log_before:
        assert time.monotonic() < deadline, triton.log_tail(30)
        # the next clients are served whole meanwhile
        nxt = _streams(triton, model, [streaming.Stream(0.0, b"soup", 6)])[0]
        assert nxt.error is None and nxt.tokens == reference.generate(list(b"soup"), 6)
        time.sleep(1.0)
    line = [x for x in triton.log_path.read_text().splitlines() if "cancelled by its client" in x][-1]
    left = int(line.split("cancelled by its client with ")[1].split(" token")[0])
    assert left > 100, line   # stopped long before its 512 tokens
