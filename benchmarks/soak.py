"""Soak: many requests at steady concurrency, large images among them; nothing
may fail and every server process's memory must plateau.

    .venv/bin/python benchmarks/soak.py [--requests 50000] [--concurrency 16]
                                        [--targets fastapi_onnx,triton_onnx,triton_python]
                                        [--checkpoint 5000] [--large-every 16]
                                        [--quick | --tiny] [--json PATH]

For each target, on free loopback ports, with servelab.bench's closed-loop
load generator (the lab's own measuring tool):

* ``fastapi_onnx``: fastapi_onnx/app.py under uvicorn (the local stack's way);
* ``triton_onnx``: the real local Triton 2.51 serving ``food_classifier_onnx``
  with ``dynamic_batching`` switched on through the kit's reload helper
  (tensors are preprocessed here, so image size does not reach the server);
* ``triton_python``: the same Triton serving ``food_classifier`` (Python
  backend: the stub decodes every image itself).

Every ``--large-every``-th request carries one of the largest images the
servers accept (a 12 MP JPEG, a flat 4 MP PNG, a 9 MP PNG at the
pixels-per-byte limit), generated here: the decodes that leave the most freed
memory behind (issue 15: 32 concurrent 40 MP PNGs took fastapi_onnx from
203 MB to 1.9 GB for good before the kit capped malloc arenas).

``--requests`` are sent in chunks of ``--chunk``; after each chunk the resident
memory (RSS, psutil) of every server process is sampled -- tritonserver and
each Python-backend stub separately -- and printed as a curve at the end.
Passes when no request failed and every process is flat after warm-up: the
median RSS of the second half of the samples from ``--checkpoint`` on is
within ``--max-growth`` (10 %) of the median of the first half (memory a
burst of large decodes leaves behind comes and goes between samples -- the
curve and the ``spread`` column show how much -- but a leak raises the level). Prints the curves, a table per target and a
verdict; writes ``results/soak/soak-<time>.json`` (or ``--json``). Exit 1 on a
failed request or a process that is not flat. A benchmark, not a test: the
default 50,000 requests per target take tens of minutes (``make soak``).
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import numpy as np
import psutil

from servelab import bench
from servelab.bench import script
from servelab.core import paths, procs

TARGETS = ("fastapi_onnx", "triton_onnx", "triton_python")
DEFAULT_TARGETS = ("fastapi_onnx", "triton_onnx")


def large_images() -> dict[str, bytes]:
    """The largest images the servers accept, of the kinds that cost the most
    memory to decode; each is checked against servelab.core.food11's limits."""
    from PIL import Image

    from servelab.core import food11

    def encode(img, fmt, **kw) -> bytes:
        buf = io.BytesIO()
        img.save(buf, fmt, **kw)
        return buf.getvalue()

    rng = np.random.default_rng(15)
    y, x = np.mgrid[0:3000, 0:4000]
    photo = np.stack([x * 255 // 4000, y * 255 // 3000, (x + y) % 256], axis=-1).astype(np.uint8)
    photo = np.clip(photo.astype(np.int16) + rng.integers(-12, 12, photo.shape), 0, 255).astype(np.uint8)
    side = int(food11.RATIO_FREE_PIXELS ** 0.5)
    at_limit = np.full((3000, 3000, 3), 180, np.uint8)
    band = (3000 * 3000) // food11.MAX_PIXELS_PER_BYTE // 3000 + 2     # rows of noise: 1 byte per 64 pixels
    at_limit[:band] = rng.integers(0, 255, (band, 3000, 3), dtype=np.uint8)
    images = {
        "12 MP JPEG": encode(Image.fromarray(photo, "RGB"), "JPEG", quality=85),
        f"flat {side * side / 1e6:.0f} MP PNG": encode(Image.new("RGB", (side, side), (200, 180, 40)), "PNG"),
        "9 MP PNG at the pixels-per-byte limit": encode(Image.fromarray(at_limit, "RGB"), "PNG"),
    }
    for name, data in images.items():
        food11.check_image_header(data)  # raises if the servers would refuse it
    return images


def image_mix(large_every: int) -> tuple[list[bytes], str]:
    """The bundled samples, with one large image every ``large_every`` requests
    (the load generator sends the list round-robin)."""
    from servelab.bench.targets import default_images

    small = default_images()
    if large_every <= 0:
        return small, "bundled samples only"
    large = large_images()
    mix: list[bytes] = []
    for i, data in enumerate(large.values()):
        mix += [small[(i * (large_every - 1) + k) % len(small)] for k in range(large_every - 1)] + [data]
    sizes = ", ".join(f"{n} ({len(d) / 1e3:.0f} kB)" for n, d in large.items())
    return mix, f"1 request in {large_every} is large: {sizes}"


def _rss_by_process(pid: int) -> dict[str, int]:
    """RSS of a server and its descendants, keyed 'name pid'."""
    out = {}
    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in members:
        try:
            name = p.name()
            if name.startswith("python"):
                name = "uvicorn" if "uvicorn" in " ".join(p.cmdline()) else name
            elif name.startswith("triton_python_b"):
                name = "stub"  # triton_python_backend_stub: one per model instance
            out[f"{name} {p.pid}"] = p.memory_info().rss
        except psutil.Error:
            continue
    return out


def soak(target, server_pid: int, requests: int, concurrency: int, chunk: int, label: str) -> dict:
    """Run ``requests`` in chunks; sample RSS after each; return the record."""
    # Warm-up (not counted): connections, allocators, first batches.
    bench.run(target, bench.closed(concurrency, requests=concurrency * 4, warmup=0), progress=False)
    samples = [{"requests": 0, "rss": _rss_by_process(server_pid)}]
    chunks, sent, ok, errors = [], 0, 0, {}
    t0 = time.perf_counter()
    while sent < requests:
        n = min(chunk, requests - sent)
        r = bench.run(target, bench.closed(concurrency, requests=n, warmup=0), progress=False)
        sent += r.sent
        ok += r.ok
        for k, v in r.errors.items():
            errors[k] = errors.get(k, 0) + v
        chunks.append({"requests": sent, "throughput": r.throughput, "p50_ms": r.latency.get("p50_ms"),
                       "p99_ms": r.latency.get("p99_ms"), "errors": r.error_count})
        samples.append({"requests": sent, "rss": _rss_by_process(server_pid)})
        print(f"  {label}: {sent:>6} requests, {r.throughput:6.1f} req/s, p50 {r.latency.get('p50_ms', 0):6.1f} ms, "
              f"p99 {r.latency.get('p99_ms', 0):6.1f} ms, errors {r.error_count}, "
              f"RSS {sum(samples[-1]['rss'].values()) / 2**20:7.1f} MiB", flush=True)
    return {"label": label, "sent": sent, "ok": ok, "errors": errors, "wall_s": time.perf_counter() - t0,
            "chunks": chunks, "samples": samples}


def growth(record: dict, checkpoint: int) -> dict[str, dict]:
    """Per process (and in total): RSS at the checkpoint and at the end, and
    its plateau after warm-up: ``spread`` = highest / lowest RSS over every
    sample from the checkpoint on, minus 1 (a leak shows as a spread that
    keeps growing with the run; a plateau stays within a few %)."""
    after = [s for s in record["samples"] if s["requests"] >= checkpoint]
    at, end = after[0], record["samples"][-1]
    out = {}
    for proc, rss_at in at["rss"].items():
        series = [s["rss"][proc] for s in after if proc in s["rss"]]
        if rss_at and proc in end["rss"]:
            out[proc] = _plateau(series, at["requests"], end["requests"])
    totals = [sum(s["rss"].values()) for s in after]
    out["total"] = _plateau(totals, at["requests"], end["requests"])
    return out


def _plateau(series: list[int], checkpoint: int, end: int) -> dict:
    """``trend``: the median RSS of the second half of the post-warm-up
    samples over the median of the first half, minus 1. Memory a burst of
    large decodes leaves behind comes and goes between samples (``spread``,
    and the curve, show how much); a leak raises the level run after run, a
    plateau does not."""
    import statistics

    lo, hi = min(series), max(series)
    half = max(1, len(series) // 2)
    first, second = series[:half], series[half:] or series[-1:]
    m1, m2 = statistics.median(first), statistics.median(second)
    return {"at_checkpoint": series[0], "at_end": series[-1], "growth": series[-1] / series[0] - 1.0,
            "min_after": lo, "max_after": hi, "spread": hi / lo - 1.0,
            "median_first_half": m1, "median_second_half": m2,
            "trend": m2 / m1 - 1.0, "checkpoint": checkpoint, "end": end}


def print_curve(rec: dict, checkpoint: int) -> None:
    """RSS of every server process after each chunk, in MiB."""
    procs_ = list(rec["samples"][-1]["rss"])
    print(f"\n{rec['label']}: RSS curve (MiB; warm-up ends at request {checkpoint})")
    print("  " + f"{'requests':>9}" + "".join(f" {p[:24]:>24}" for p in procs_) + f" {'total':>9}")
    for s in rec["samples"]:
        mark = "*" if s["requests"] >= checkpoint else " "
        cells = "".join(f" {s['rss'][p] / 2**20:>24.1f}" if p in s["rss"] else f" {'-':>24}" for p in procs_)
        print(f"  {s['requests']:>8}{mark}" + cells + f" {sum(s['rss'].values()) / 2**20:>9.1f}")


def run_fastapi_onnx(args) -> dict:
    from servelab.local import stack

    with stack.running(["fastapi_onnx"], free_ports=True) as st:
        server = st.servers["fastapi_onnx"]
        target = bench.FastAPITarget(st.urls["fastapi_onnx"], images=args.images)
        return soak(target, server.pid, args.requests, args.concurrency, args.chunk, "fastapi_onnx")


def run_triton_onnx(args) -> dict:
    from servelab import triton

    with triton.running(models=["food_classifier_onnx"], http_port=procs.free_port(),
                        grpc_port=procs.free_port(), metrics_port=procs.free_port(),
                        write_state=False) as t:
        cfg = t.reload_model("food_classifier_onnx", {"dynamic_batching": {}}, verbose=False)
        assert "dynamic_batching" in cfg, cfg
        before = t.snapshot("food_classifier_onnx")
        target = bench.triton_tensor_target(t.url, "food_classifier_onnx")
        record = soak(target, t.pid, args.requests, args.concurrency, args.chunk, "triton_onnx (dynamic batching)")
        delta = triton.stats_delta(before, t.snapshot("food_classifier_onnx"))
        record["triton_stats"] = {k: delta[k] for k in ("avg_batch_size", "batch_histogram", "failures", "requests")}
        record["stubs"] = [s.pid for s in t.stub_processes()]
        return record


def run_triton_python(args) -> dict:
    from servelab import triton
    from servelab.bench.targets import triton_image_target

    with triton.running(models=["food_classifier"], http_port=procs.free_port(),
                        grpc_port=procs.free_port(), metrics_port=procs.free_port(),
                        write_state=False) as t:
        target = triton_image_target(t.url, "food_classifier", images=args.images)
        record = soak(target, t.pid, args.requests, args.concurrency, args.chunk, "triton_python (food_classifier)")
        record["stubs"] = [s.pid for s in t.stub_processes()]
        return record


RUNNERS = {"fastapi_onnx": run_fastapi_onnx, "triton_onnx": run_triton_onnx, "triton_python": run_triton_python}


def main(argv=None) -> int:
    ap = script.Parser(__doc__)
    ap.sized("--requests", type=int, full=50_000, quick=5_000, tiny=40, help="per target")
    ap.sized("--concurrency", type=int, full=16, tiny=4)
    ap.sized("--checkpoint", type=int, full=5_000, quick=1_000, tiny=20,
             help="warm-up: the plateau is judged from this request on")
    ap.sized("--chunk", type=int, full=2_500, quick=500, tiny=10, help="requests between memory samples")
    ap.add_argument("--large-every", type=int, default=16,
                    help="one large image every N requests (0: bundled samples only; default 16)")
    ap.add_argument("--max-growth", type=float, default=0.10, help="largest growth of the median RSS after warm-up (0.10 = 10 %%)")
    ap.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help=f"comma-separated: {', '.join(TARGETS)}")
    ap.add_argument("--out", dest="json", type=Path, help=argparse.SUPPRESS)  # the old name of --json
    args = ap.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    for t in targets:
        if t not in TARGETS:
            ap.error(f"unknown target {t!r}; choose from {', '.join(TARGETS)}")
    if args.checkpoint >= args.requests:
        ap.error("--checkpoint must be below --requests")

    args.images, mix_note = image_mix(args.large_every)
    print(f"soak: {args.requests} requests at concurrency {args.concurrency} per target; {mix_note}; "
          f"every process's median RSS must stay within {args.max_growth:.0%} from request {args.checkpoint} on",
          flush=True)
    records, failed = [], False
    for name in targets:
        rec = RUNNERS[name](args)
        rec["growth"] = growth(rec, args.checkpoint)
        rec["images"] = mix_note
        records.append(rec)

    print("\n=== soak summary ===")
    for rec in records:
        n_err = sum(rec["errors"].values())
        print(f"{rec['label']}: {rec['sent']} sent, {rec['ok']} ok, {n_err} failed {rec['errors'] or ''}, "
              f"{rec['sent'] / rec['wall_s']:.1f} req/s over {rec['wall_s']:.0f} s")
        if "triton_stats" in rec:
            ts = rec["triton_stats"]
            print(f"  Triton: average batch {ts['avg_batch_size'] or 0:.2f}, batch sizes {ts['batch_histogram']}, "
                  f"server-side failures {ts['failures']}")
        print_curve(rec, args.checkpoint)
        print(f"  {'process':<28} {'RSS @' + str(rec['growth']['total']['checkpoint']):>12} "
              f"{'RSS @' + str(rec['growth']['total']['end']):>12} {'min..max after warm-up':>24} {'spread':>7} "
              f"{'median, 1st half -> 2nd half':>30} {'trend':>7}")
        for proc, g in rec["growth"].items():
            verdict = "flat" if g["trend"] < args.max_growth else "GROWING"
            span = f"{g['min_after'] / 2**20:.1f}..{g['max_after'] / 2**20:.1f} MiB"
            medians = f"{g['median_first_half'] / 2**20:.1f} -> {g['median_second_half'] / 2**20:.1f} MiB"
            print(f"  {proc:<28} {g['at_checkpoint'] / 2**20:>9.1f} MiB {g['at_end'] / 2**20:>9.1f} MiB "
                  f"{span:>24} {g['spread']:>+7.1%} {medians:>30} {g['trend']:>+7.1%}  {verdict}")
            if proc != "total" and g["trend"] >= args.max_growth:
                failed = True
        if n_err or rec["ok"] != rec["sent"] or rec["sent"] != args.requests:
            failed = True

    out = args.json or paths.REPO_ROOT / "results" / "soak" / f"soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    script.write_json(out, {"args": {k: v for k, v in vars(args).items() if k != "images"} | {"json": str(out)},
                            "records": records})
    print(f"\nverdict: {'FAIL' if failed else 'PASS'} (0 failed requests and every process's median RSS flat "
          f"within {args.max_growth:.0%} after warm-up required)   figures: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    script.run(main)
