"""Triton's response cache (issue 50, item 3), measured on the kit's ``food_classifier``.

The ``tritonserver`` 2.51 inside nvidia-pytriton 0.7.0 ships Triton's local cache
(``tritonserver/caches/local/libtritoncache_local.so``), so this runs locally as on the node.
The server needs ``--cache-config=local,size=N`` (``SERVER_ARGS``); a model opts in with
``response_cache { enable: true }``. Triton keys a cached response on the request's input
bytes: a second request with the same bytes is answered from the cache, without running the
model; the same photo saved again (here: with another JPEG comment, the pixels unchanged) is
new bytes, so it misses.

One run, one client, requests one after another:

1. the same sequence of requests twice, first with the cache off (the baseline), then on; and
   all of it again (``rounds``), with new bytes, so that a change of the machine's speed shows;
2. a share ``repeat`` of the requests repeat one of a few photos, the rest are new bytes;
3. per request: hit (its bytes were sent before) or miss, and its latency; Triton's own
   statistics count the hits and misses, which must match the sequence's.

    python -m servelab.bench.response_cache [--requests 200] [--repeat 0.5]
"""

from __future__ import annotations

import argparse
import io
import json
import random
import time
from pathlib import Path

import numpy as np

MODEL = "food_classifier"
CACHE_BYTES = 64 * 2**20      # room for every response of a run many times over (each is a few hundred bytes)
REPEATED_PHOTOS = 3           # the repeated share is spread over this many photos
DRIFT = 0.15                  # the cache-off rounds' means further apart than this: inconclusive
WARM_PAUSE_S, WARM_REQUESTS = 2.0, 10   # after each reload, before timing: both runs start alike


def server_args() -> list[str]:
    """tritonserver's flags for the local response cache (the folder with its library, its size)."""
    from servelab.triton.install import find_install

    return [f"--cache-directory={find_install().root / 'caches'}", f"--cache-config=local,size={CACHE_BYTES}"]


def photo_bytes(path: Path, tag: str) -> bytes:
    """The photo as a JPEG whose comment is ``tag``: same pixels, other bytes for every tag."""
    from PIL import Image

    out = io.BytesIO()
    Image.open(path).convert("RGB").save(out, "JPEG", quality=90, comment=tag.encode())
    return out.getvalue()


def workload(n: int, repeat: float, seed: int = 0, round_: int = 0) -> list[tuple[bytes, bool]]:
    """``n`` requests' images and whether each repeats bytes sent before (a hit once cached).
    Every ``round_`` has its own bytes (the same photos and order), so each round starts cold."""
    from servelab.core import paths

    rng = random.Random(seed)
    samples = paths.sample_images()
    popular = [photo_bytes(samples[i % len(samples)], f"round {round_} popular {i}") for i in range(REPEATED_PHOTOS)]
    seen: set[bytes] = set()
    out = []
    for i in range(n):
        if rng.random() < repeat:
            image = rng.choice(popular)
        else:
            image = photo_bytes(samples[i % len(samples)], f"round {round_} request {i}")
        out.append((image, image in seen))
        seen.add(image)
    return out


def _infer(client, image: bytes):
    import base64

    import tritonclient.http as httpclient

    inp = httpclient.InferInput("INPUT_IMAGE", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[base64.b64encode(image)]], dtype=object))
    t0 = time.perf_counter()
    r = client.infer(MODEL, [inp])
    ms = (time.perf_counter() - t0) * 1000
    return ms, (r.as_numpy("FOOD_LABEL")[0][0], float(r.as_numpy("PROBABILITY")[0][0]))


def _cache_counts(url: str, at_least: int = 0) -> tuple[int, int, int, int]:
    """Triton's cache hits and misses of the model, how many times it ran the model, and its
    successful requests, once Triton has finished counting (``stats.settled``)."""
    from servelab.triton import stats

    snap = stats.settled(url, MODEL, at_least=at_least)
    inf = snap["inference_stats"]
    return (int(inf["cache_hit"]["count"]), int(inf["cache_miss"]["count"]), int(snap["execution_count"]),
            stats.success(snap))


def run_sequence(url: str, requests: list[tuple[bytes, bool]]) -> dict:
    """Send every request once, in order; latency and answer of each, and Triton's hit/miss counts."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url)
    try:
        from servelab.core import paths

        time.sleep(WARM_PAUSE_S)               # the reload's old stub exits; then connection and model warm
        for i in range(WARM_REQUESTS):         # new bytes each, not counted
            _infer(client, photo_bytes(paths.sample_images()[0], f"warm {time.time_ns()} {i}"))
        hits0, misses0, runs0, ok0 = _cache_counts(url)
        rows = [(*_infer(client, image), repeat) for image, repeat in requests]
        hits1, misses1, runs1, _ = _cache_counts(url, ok0 + len(requests))
    finally:
        client.close()
    return {"ms": [r[0] for r in rows], "answers": [r[1] for r in rows], "repeat": [r[2] for r in rows],
            "triton_hits": hits1 - hits0, "triton_misses": misses1 - misses0, "executions": runs1 - runs0}


def measure(url: str, grpc_url: str, admin_key: str | None, n: int = 200, repeat: float = 0.5, seed: int = 0,
            rounds: int = 2, log=print) -> dict:
    """Cache off, then on, over the same photos, ``rounds`` times (each round its own bytes); the
    model's config is put back at the end."""
    from servelab.triton import control

    def reload(edit):
        control.reload_model(MODEL, edit, grpc_url=grpc_url, admin_key=admin_key, via="override", verbose=False)

    original = control.model_config(MODEL, grpc_url)
    pairs = []
    try:
        for k in range(rounds):
            requests = workload(n, repeat, seed, k)
            reload("response_cache { enable: false }")
            off = run_sequence(url, requests)
            reload("response_cache { enable: true }")
            pairs.append((off, run_sequence(url, requests)))
    finally:
        reload(lambda _: original)
    return summarize(pairs, repeat, log)


def summarize(pairs: list[tuple[dict, dict]], repeat: float, log=print) -> dict:
    """Each round's figures, and the speed-up of the mean latency as the median over the rounds.
    The cache-off runs must agree (their means within ``DRIFT``): otherwise the machine's speed
    changed during the run and the speed-up is inconclusive."""
    rounds = [_round(off, on) for off, on in pairs]
    offs = [r["off_mean_ms"] for r in rounds]
    drift = max(offs) / min(offs) - 1
    out = {"repeat_share": repeat, "rounds": rounds, "drift": drift,
           "speedup": float(np.median([r["off_over_on"] for r in rounds])),
           "verdict": "valid" if drift <= DRIFT else
                      f"inconclusive: the cache-off runs' means differ by {drift:.0%} (the machine's speed changed)"}
    for k, r in enumerate(rounds, 1):
        log(f"round {k}: {r['requests']} requests, each repeating one of {REPEATED_PHOTOS} photos with probability "
            f"{repeat:.0%}: Triton counted {r['triton_hits']} hits ({r['hit_ratio']:.0%}; the sequence repeats "
            f"{r['expected_hits']}) and {r['triton_misses']} misses; with the cache off {r['off_triton_hits']} hits")
        log(f"  p50 per request: hit {r['hit_p50_ms']:.2f} ms, miss {r['miss_p50_ms']:.2f} ms ({r['miss_over_hit']:.0f}x); "
            f"mean of all requests {r['on_mean_ms']:.2f} ms with the cache, {r['off_mean_ms']:.2f} ms without it "
            f"({r['off_over_on']:.2f}x; the hit ratio alone gives {r['expected_speedup']:.2f}x, misses costing what a "
            f"request costs without the cache: p50 {r['miss_p50_ms']:.2f} against {r['off_p50_ms']:.2f} ms); answers "
            + ("the same" if r["same_answers"] else "DIFFERENT"))
    log(f"speed-up of the mean latency with the cache, median of {len(rounds)} rounds: {out['speedup']:.2f}x"
        + ("" if out["verdict"] == "valid" else f"; {out['verdict']}"))
    return out


SAME_PROBABILITY = 1e-4   # one image twice: float sums on 1 or on 2 threads differed by 1.8e-6 here


def same_answers(a: list, b: list) -> bool:
    """The same label for every image, and the same probability to within ``SAME_PROBABILITY``:
    a miss runs the model again, on one thread or on every core depending on the machine's
    load at that moment (core_share.py), and float sums taken in another order differ in their
    last digits. A hit returns the cached bytes themselves."""
    return len(a) == len(b) and all(la == lb and abs(pa - pb) <= SAME_PROBABILITY for (la, pa), (lb, pb) in zip(a, b))


def _round(off: dict, on: dict) -> dict:
    rep = np.array(on["repeat"])
    on_ms, off_ms = np.array(on["ms"]), np.array(off["ms"])
    r = {
        "requests": len(rep), "expected_hits": int(rep.sum()),
        "triton_hits": on["triton_hits"], "triton_misses": on["triton_misses"], "executions": on["executions"],
        "hit_ratio": on["triton_hits"] / len(rep), "off_triton_hits": off["triton_hits"],
        "off_mean_ms": float(off_ms.mean()), "on_mean_ms": float(on_ms.mean()),
        "off_p50_ms": float(np.median(off_ms)), "on_p50_ms": float(np.median(on_ms)),
        "hit_p50_ms": float(np.median(on_ms[rep])) if rep.any() else float("nan"),
        "miss_p50_ms": float(np.median(on_ms[~rep])) if (~rep).any() else float("nan"),
        "same_answers": same_answers(on["answers"], off["answers"]),
    }
    r["miss_over_hit"] = r["miss_p50_ms"] / r["hit_p50_ms"]
    r["off_over_on"] = r["off_mean_ms"] / r["on_mean_ms"]
    # what the hit ratio alone gives if a miss costs what a request costs with the cache off
    h = r["hit_ratio"]
    r["expected_speedup"] = 1 / ((1 - h) + h * r["hit_p50_ms"] / r["off_mean_ms"])
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m servelab.bench.response_cache", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--repeat", type=float, default=0.5, help="share of requests that repeat a photo's bytes")
    p.add_argument("--rounds", type=int, default=2, help="cache off then on, this many times")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    if not 0 <= a.repeat <= 1:
        p.error("--repeat is a share: 0 to 1")
    from servelab import triton

    print("starting a local Triton with the response cache ...", flush=True)
    server = triton.start(models=[MODEL], **triton.free_ports(),
                          write_state=False, extra_args=server_args())
    try:
        out = measure(server.url, server.grpc_url, server.admin_key, a.requests, a.repeat, rounds=a.rounds)
    finally:
        server.stop()
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    ok = all(r["same_answers"] and r["triton_hits"] == r["expected_hits"] for r in out["rounds"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
