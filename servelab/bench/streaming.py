"""Load generator for the token-streaming models (models_streaming/): one gRPC stream per request.

Requests arrive as a Poisson process at ``rate`` per second, each asking for one of ``lengths``
output tokens (drawn with a fixed seed, so both schedulers see the same arrivals, prompts and
lengths). For every request it records when it was due, when it was sent, and when each token
arrived; ``summarize`` turns that into the figures of a streaming service:

- time to first token (TTFT): from the request's due time to its first token (mean, p50, p99; the
  mean is the steadier figure when some requests find the model idle and others wait out a batch,
  and the median can fall on either side);
- time per output token (TPOT): (last token - first token) / (tokens - 1), per request;
- output tokens per second over the run;
- goodput: requests per second that completed with TTFT within ``ttft_bound_ms``.

Each run also records what can spoil it (servelab.bench.validity): late sends, a late event
loop, a saturated client, other work on the machine. A spoiled run says so.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from servelab.bench import stats, tasks, validity

PROMPTS = ("A plate of sushi", "Pizza with extra cheese", "Ramen, rich broth", "A bowl of fruit salad",
           "Grilled fish with rice", "Chocolate cake for dessert")
LATE_AFTER_MS = 20.0   # a send this much after its due time is late (the client's fault)


@dataclass
class Stream:
    due: float                     # seconds from the run's start
    prompt: bytes
    max_tokens: int
    sent: float | None = None
    token_times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.due if self.token_times else None

    @property
    def tpot(self) -> float | None:
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else None


def inputs(prompt: bytes, max_tokens: int):
    import tritonclient.grpc as grpcclient

    p = grpcclient.InferInput("PROMPT", [1, 1], "BYTES")
    p.set_data_from_numpy(np.array([[prompt]], dtype=np.object_))
    n = grpcclient.InferInput("MAX_TOKENS", [1, 1], "INT32")
    n.set_data_from_numpy(np.array([[max_tokens]], dtype=np.int32))
    return [p, n]


async def stream_one(client, model: str, s: Stream, t0: float, cancel_after: int | None = None) -> Stream:
    """Send one request on its own stream and record each token's arrival (seconds from ``t0``).
    ``cancel_after``: close the stream after that many tokens, as a client that disconnects."""
    async def one_request():
        yield {"model_name": model, "inputs": inputs(s.prompt, s.max_tokens), "enable_empty_final_response": True}

    s.sent = time.perf_counter() - t0
    responses = client.stream_infer(one_request())
    try:
        async for result, error in responses:
            if error is not None:
                s.error = str(error)
                break
            token = result.as_numpy("TOKEN")
            if token is not None:
                s.token_times.append(time.perf_counter() - t0)
                s.tokens.append(int(token.reshape(-1)[0]))
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            if cancel_after is not None and len(s.tokens) >= cancel_after:
                responses.cancel()
                break
    except Exception as err:   # the stream broke (server gone, cancelled): recorded, not raised
        s.error = s.error or f"{type(err).__name__}: {err}"
    return s


def arrivals(rate: float, duration_s: float, lengths: Sequence[int], seed: int = 0) -> list[Stream]:
    """Poisson arrivals over ``duration_s``; each asks for one of ``lengths`` (equally likely)."""
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < duration_s:
        out.append(Stream(due=t, prompt=rng.choice(PROMPTS).encode(), max_tokens=rng.choice(list(lengths))))
        t += rng.expovariate(rate)
    return out


async def _run(grpc_url: str, model: str, plan: list[Stream], server_pids: Sequence[int]) -> dict:
    import tritonclient.grpc.aio as aioclient

    client = aioclient.InferenceServerClient(grpc_url)
    meter, ticker = validity.CPUMeter(server_pids), validity.LoopTicker(LATE_AFTER_MS)
    try:
        meter.start()
        ticker.start()
        t0 = time.perf_counter()
        tasks = []
        for s in plan:
            delay = s.due - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(stream_one(client, model, s, t0)))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
        tick = await ticker.stop()
        cpu = meter.stop()
    finally:
        await client.close()
    late = sum(1 for s in plan if s.sent is not None and (s.sent - s.due) * 1000 > LATE_AFTER_MS)
    verdict = validity.assess(mode="open", sent=len(plan), late=late, held=0, ticker=tick, cpu=cpu,
                              late_after_ms=LATE_AFTER_MS)
    return {"wall_s": wall, "validity": verdict.as_dict()}


def run(grpc_url: str, model: str, rate: float, duration_s: float, lengths: Sequence[int] = (16, 256),
        seed: int = 0, ttft_bound_ms: float = 1000.0, server_pids: Sequence[int] = (),
        http_url: str | None = None) -> dict:
    """One open-loop run; returns ``summarize``'s figures plus the run's validity. With Triton's
    ``http_url``, also what Triton counted for the model during the run (``server``:
    servelab.triton.stats.stats_delta)."""
    from servelab.triton import stats as triton_stats

    before = triton_stats.snapshot(http_url, model) if http_url else None
    plan = arrivals(rate, duration_s, lengths, seed)
    if not plan:
        raise ValueError(f"no request arrives in {duration_s} s at {rate}/s: run longer or faster")
    host, _, port = grpc_url.rpartition(":")
    if not server_pids and host in ("127.0.0.1", "localhost") and port.isdigit():
        # a server on this machine (found by its port): its CPU is the server's, not other work
        server_pids = [p for p in (validity.listening_pid(int(port)),) if p]
    meta = tasks.run_coroutine(_run(grpc_url, model, plan, server_pids), fast_loop=False)   # also from Jupyter
    out = summarize(plan, meta["wall_s"], ttft_bound_ms)
    out.update(model=model, rate=rate, duration_s=duration_s, lengths=list(lengths), validity=meta["validity"],
               streams=plan)
    if before is not None:
        out["server"] = triton_stats.stats_delta(before, triton_stats.snapshot(http_url, model))
    return out


def step_cost(server_deltas: Sequence[dict]) -> tuple[float, float]:
    """``(a, c)``: one execution of ``b`` requests costs ``a + c * b`` seconds, fitted (least squares,
    weighted by executions) to Triton's statistics of iteration-level runs (``run``'s ``server``),
    where every execution is one decoding step and the tokens it sends."""
    from servelab.bench import queueing

    points: dict[int, tuple[int, float]] = {}
    for d in server_deltas:
        for b, n in d["batch_histogram"].items():
            count, total_s = points.get(b, (0, 0.0))
            points[b] = (count + n, total_s + n * d["per_batch_ms"][b] / 1000)
    return queueing.fit_batch_service({b: (total_s / n, n) for b, (n, total_s) in points.items()})


def _ms(values: Sequence[float], p: float) -> float | None:
    return 1000 * stats.percentile(values, p) if values else None


def mean_ms(values: Sequence[float]) -> float | None:
    return 1000 * sum(values) / len(values) if values else None


def summarize(plan: Sequence[Stream], wall_s: float, ttft_bound_ms: float) -> dict:
    done = [s for s in plan if s.error is None and len(s.tokens) == s.max_tokens]
    ttft = [s.ttft for s in done]
    tpot = [s.tpot for s in done if s.tpot is not None]
    tokens = sum(len(s.tokens) for s in plan)
    good = [s for s in done if s.ttft * 1000 <= ttft_bound_ms]
    by_length = {}
    for n in sorted({s.max_tokens for s in plan}):
        mine = [s.ttft for s in done if s.max_tokens == n]
        by_length[n] = {"requests": len(mine), "ttft_p50_ms": _ms(mine, 50), "ttft_mean_ms": mean_ms(mine)}
    return {
        "requests": len(plan), "completed": len(done), "errors": sum(s.error is not None for s in plan),
        "ttft_mean_ms": mean_ms(ttft), "ttft_p50_ms": _ms(ttft, 50), "ttft_p99_ms": _ms(ttft, 99),
        "tpot_p50_ms": _ms(tpot, 50),
        "tokens_per_s": tokens / wall_s, "goodput_per_s": len(good) / wall_s, "ttft_bound_ms": ttft_bound_ms,
        "by_length": by_length, "wall_s": wall_s,
    }
