"""The batch-cost curve S(b): what one execution of a batch of ``b`` costs.

Dynamic batching helps exactly as much as a batch is cheaper than its items
one by one, so this is the first fact to measure:

* ``raw_onnx``: ONNX Runtime in this process, no server, batch sizes
  1..16, with the same thread settings a single Triton instance uses;
* ``through_triton``: client-side batches of ``b`` sent by four clients at
  once to a model with ``max_batch_size >= b`` and batching off, so batches
  always wait while one runs: the instance is as busy as under load,
  and the client shares the cores with it as it does in a load test. S(b) is
  the time between completions (batches per second, inverted); Triton's
  per-batch statistics (``batch_stats``) are kept beside it. A batch-1
  request sent alone reads slower (threads wake up for it), which would
  understate what the instance serves when busy.

S(b)/b is the cost per image. On a GPU it falls steeply with ``b`` (a batch
of 16 costs little more than one image); on a small CPU it stays almost flat,
and then batching cannot add capacity: it only makes each request wait for
the others in its batch.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Sequence

import numpy as np

SIZES = (1, 2, 4, 8, 16)

# The same model on a GPU, for comparison (the tests never see one): measured
# once for this kit, fastapi_pt/food11.pth in PyTorch 2.11 fp32 on an NVIDIA
# H100 80GB, 2026-11-26, median of 100 runs after warm-up, inputs already on
# the GPU (copying them there and back added 0.0-0.3 ms at b=1, 0.9 ms at b=16).
# Raw output of the same measurement, every sample kept: gpu-check's accel phase on an
# NVIDIA H200, 2026-11-27, docs/gpu-runs/2026-11-27-h200-accel*/results.json: S(16)/S(1) =
# 1.00 and 1.03 in fp32 (docs/gpu-reference.md).
GPU_REFERENCE_MS = {1: 2.71, 2: 2.60, 4: 2.51, 8: 2.60, 16: 2.80}
GPU_REFERENCE = (f"the kit's MobileNetV2 on an NVIDIA H100 (PyTorch fp32, measured once for this kit) takes "
                 f"{GPU_REFERENCE_MS[1]:.2f} ms for one image and {GPU_REFERENCE_MS[16]:.2f} ms for 16, i.e. "
                 f"{GPU_REFERENCE_MS[16] / 16:.2f} ms per image in a batch of 16, "
                 f"{16 * GPU_REFERENCE_MS[1] / GPU_REFERENCE_MS[16]:.0f}x cheaper.")


def _images(b: int) -> np.ndarray:
    from servelab.bench import targets
    from servelab.core import food11
    imgs = [food11.preprocess(x) for x in targets.default_images()]
    return np.stack([imgs[i % len(imgs)] for i in range(b)]).astype(np.float32)


def onnxruntime_available() -> bool:
    """Whether :func:`raw_onnx` can run here: the local venv has ONNX Runtime,
    the Compose stack's Jupyter images do not (docker/requirements-jupyter.txt)."""
    import importlib.util
    return importlib.util.find_spec("onnxruntime") is not None


def raw_onnx(model_path: str | Path | None = None, sizes: Sequence[int] = SIZES, repeats: int = 5,
             threads: int | None = None, budget_s: float = 20.0) -> dict:
    """Median seconds per batch for each size, ONNX Runtime in this process.

    Returns ``{"seconds": {b: s}, "per_image_ms": {b: ms}, "threads": n}``.
    ``threads`` defaults to what one Triton instance gets here (all cores)."""
    import onnxruntime as ort

    from servelab.bench import validity
    from servelab.core import paths
    path = Path(model_path) if model_path else next(p for p in paths.ONNX_TARGETS if Path(p).exists())
    threads = threads or validity.cores()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    out: dict[int, float] = {}
    deadline = time.perf_counter() + budget_s
    for b in sizes:
        x = _images(b)
        sess.run(None, {name: x})          # warm this shape
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            sess.run(None, {name: x})
            times.append(time.perf_counter() - t)
            if time.perf_counter() > deadline and len(times) >= 2:
                break
        out[b] = statistics.median(times)
    return {"seconds": out, "per_image_ms": {b: 1000 * s / b for b, s in out.items()}, "threads": threads}


def triton_batch_target(url: str, model: str, b: int, timeout: float = 30.0):
    """A Triton HTTP target sending client batches of ``b`` preprocessed images."""
    from servelab.bench import targets
    body = targets.triton_infer_body([("input", "FP32", [b, 3, 224, 224], _images(b))], ("output",), True)
    return targets.TritonHTTPTarget(url, model, [body], None, timeout, protocol_note="binary")


def through_triton(url: str, model: str, sizes: Sequence[int] = SIZES, requests: int = 12,
                   warmup: int = 2, timeout: float = 60.0, concurrency: int = 4) -> dict:
    """S(b) of a busy instance: ``requests`` client batches of each size, from
    ``concurrency`` clients at once (model loaded with batching off). Returns
    ``{"seconds": {b: s}, "per_image_ms": {b: ms}, "server_s": {b: s},
    "runs": {b: Result}}``; ``server_s`` is Triton's own time per execution."""
    from servelab.bench import load
    from servelab.bench.triton import TritonObserver
    out, server, runs = {}, {}, {}
    for b in sizes:
        target = triton_batch_target(url, model, b, timeout)
        r = load.run(target, load.closed(concurrency, requests=max(requests, 2 * concurrency),
                                         warmup=max(warmup, concurrency), timeout=timeout),
                     [TritonObserver(url, model)], f"client batch {b}", progress=False)
        per_batch = {int(k): v for k, v in ((r.server or {}).get("per_batch_ms") or {}).items()}
        if r.throughput and not r.error_count:
            out[b] = 1.0 / r.throughput       # seconds between batch completions
        if b in per_batch:
            server[b] = per_batch[b] / 1000
        runs[b] = r
    return {"seconds": out, "per_image_ms": {b: 1000 * s / b for b, s in out.items()}, "server_s": server,
            "runs": runs}


def bounded_by_one_client(seconds: dict, alone_s: float) -> dict:
    """S(b) with S(1) no longer than one client's whole round trip ``alone_s``: one client alone
    keeps a copy busy part of the time, so the copy serves at least 1/alone_s per second and its
    S(1) cannot be longer. Four clients' own CPU on a small machine can make the busy measurement
    read longer (seen on the 2-core VM: 10.7 ms busy against 6.4 ms for one client's round trip)."""
    out = dict(seconds)
    if 1 in out and alone_s > 0:
        out[1] = min(out[1], alone_s)
    return out


def describe(seconds: dict) -> str:
    """One line: S(b) and S(b)/b for each size."""
    return ", ".join(f"b={b}: {1000 * s:.1f} ms ({1000 * s / b:.2f} ms/img)" for b, s in sorted(seconds.items()))
