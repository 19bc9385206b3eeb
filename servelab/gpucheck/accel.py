"""``gpu-check``'s ``accel`` phase: what one forward pass of the kit's MobileNetV2 costs on the
machine's GPU in fp32, in FP16, and through ``torch.compile``, with the fidelity of each against
fp32, and the batch-cost curve S(b), b = 1..16, in fp32 and FP16.

How it measures (every figure is from this one run):

* the model is the kit's ``food11.pth`` (the ``models`` phase builds it); inputs are the kit's
  sample photos, preprocessed as every service does, already on the GPU: the figures are the
  forward pass alone; the copies to and from the GPU are measured beside them;
* warm-up first (``torch.compile`` compiles there, and its compile time is reported);
* batch 1: the variants take turns, one forward pass each, for ``rounds`` rounds, the order
  rotated every round, each pass bracketed by ``torch.cuda.synchronize()``; the rounds are
  split into 3 blocks, and two variants whose block medians overlap are reported as pairs
  this run cannot tell apart; a fp32 baseline whose block medians differ by more than 25 %
  makes the run *unsettled*, and its ratios are not evidence;
* batch 16: images/s from the median time of a batch of 16, variants interleaved as above;
* S(b): the median of ``sb_repeats`` forward passes at each b = 1..16, in fp32 and FP16 eager,
  the sizes interleaved; every sample is kept (``raw``) so the committed run can be re-read;
* fidelity against fp32 eager: the largest |logit difference| and the share of inputs whose
  top-1 class agrees, over the sample photos and ``generated`` seeded random images.

``torch.compile`` runs only where its GPU code generator can: PyTorch's Inductor compiles
through Triton, which needs CUDA compute capability 7.0 or more (torch 2.14.1,
``torch/_inductor/exc.py``, the message it raises for older GPUs). On a P100 (6.0) it is
skipped and the result says why. On the CPU dry run (``--device cpu --tiny``) it is skipped
too: compiling takes tens of seconds on two cores and the dry run measures nothing.
"""

from __future__ import annotations

import copy
import statistics
import time

import numpy as np

BATCH_SIZES = tuple(range(1, 17))
COMPILE_MIN_CAPABILITY = (7, 0)
UNSETTLED = 0.25  # fp32 baseline's block medians further apart than this: the run is unsettled


def _inputs(generated: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(samples, generated): the kit's sample photos and seeded random images, preprocessed."""
    from PIL import Image

    from servelab.core import food11, paths

    photos = np.stack([food11.preprocess(p.read_bytes()) for p in paths.sample_images()])
    rng = np.random.default_rng(seed)
    noise = [food11.preprocess_image(Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)))
             for _ in range(generated)]
    return photos.astype(np.float32), np.stack(noise).astype(np.float32) if noise else photos[:0]


def _timed(fn, sync) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t0) * 1000.0


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _blocks(xs: list[float], n: int = 3) -> list[float]:
    k = max(1, len(xs) // n)
    return [statistics.median(xs[i * k:(i + 1) * k]) for i in range(n) if xs[i * k:(i + 1) * k]]


def judge(blocks: dict[str, list[float]], baseline: str = "fp32 eager") -> tuple[bool, list[str]]:
    """(unsettled, pairs): whether the baseline's block medians lie more than ``UNSETTLED`` apart,
    and the pairs of variants whose block medians overlap (this run cannot order them)."""
    fb = blocks[baseline]
    unsettled = (max(fb) - min(fb)) / min(fb) > UNSETTLED
    labels = list(blocks)
    pairs = [f"{a} / {b}" for i, a in enumerate(labels) for b in labels[i + 1:]
             if not (max(blocks[a]) < min(blocks[b]) or max(blocks[b]) < min(blocks[a]))]
    return unsettled, pairs


def _variants(base, on_gpu: bool, capability, compile_models: bool | None) -> tuple[dict, dict]:
    """{label: (model, dtype)} and {what: why skipped}."""
    import torch

    models = {"fp32 eager": (base, torch.float32), "fp16 eager": (copy.deepcopy(base).half(), torch.float16)}
    skipped: dict[str, str] = {}
    if compile_models is None:
        compile_models = on_gpu and capability >= COMPILE_MIN_CAPABILITY
    if compile_models:
        models["fp32 torch.compile"] = (torch.compile(base), torch.float32)
        models["fp16 torch.compile"] = (torch.compile(models["fp16 eager"][0]), torch.float16)
    elif on_gpu:
        skipped["torch.compile"] = (f"compute capability {capability[0]}.{capability[1]}: torch.compile's GPU code "
                                    "generator (Inductor through Triton) needs 7.0 or more (torch/_inductor/exc.py)")
    else:
        skipped["torch.compile"] = "CPU dry run: compiling takes tens of seconds here, and the dry run measures nothing"
    return models, skipped


def _warm(models: dict, xin: dict, sync, skipped: dict, passes: int = 3) -> dict[str, float]:
    """Warm-up: compiles, picks cuDNN kernels, fills the caching allocator for both sizes.
    A compile that fails is reported in ``skipped``; the other variants go on."""
    compile_s: dict[str, float] = {}
    for label, (m, dt) in list(models.items()):
        t0 = time.perf_counter()
        try:
            for x in xin[dt]:
                for _ in range(passes):
                    m(x)
            sync()
        except Exception as err:
            if "compile" not in label:
                raise
            del models[label]
            skipped[label] = f"failed to compile: {type(err).__name__}: {err}"[:300]
            continue
        if "compile" in label:
            compile_s[label] = round(time.perf_counter() - t0, 1)
    return compile_s


def _interleaved(models: dict, xin: dict, rounds: int, sync) -> tuple[dict, dict]:
    """Batch-1 and batch-16 times (ms) per variant, the variants taking turns, order rotated."""
    b1: dict[str, list[float]] = {k: [] for k in models}
    b16: dict[str, list[float]] = {k: [] for k in models}
    order = list(models)
    for r in range(rounds):
        turn = order[r % len(order):] + order[:r % len(order)]
        for label in turn:
            m, dt = models[label]
            b1[label].append(_timed(lambda: m(xin[dt][0]), sync))
        if r % 4 == 0:
            for label in turn:
                m, dt = models[label]
                b16[label].append(_timed(lambda: m(xin[dt][1]), sync))
    return b1, b16


def _batch_cost(models: dict, batches: dict, repeats: int, sync) -> dict[str, dict[int, list[float]]]:
    """S(b) samples (ms) in fp32 and FP16 eager, the sizes interleaved."""
    raw: dict[str, dict[int, list[float]]] = {k: {b: [] for b in batches} for k in ("fp32 eager", "fp16 eager")}
    for _ in range(repeats):
        for b, batch in batches.items():
            for label in raw:
                m, dt = models[label]
                x = batch.to(dt)
                raw[label][b].append(_timed(lambda: m(x), sync))
    return raw


def _fidelity(models: dict, base, sets: dict, dev) -> dict:
    """Largest |logit difference| and top-1 agreement of each variant against fp32 eager."""
    import torch

    sets = {k: v for k, v in sets.items() if len(v)}
    ref = {k: base(torch.from_numpy(v).to(dev)).float().cpu().numpy() for k, v in sets.items()}
    fidelity = {}
    for label, (m, dt) in models.items():
        fidelity[label] = {}
        for k, v in sets.items():
            out = m(torch.from_numpy(v).to(dev).to(dt)).float().cpu().numpy()
            fidelity[label][k] = {"n": len(v), "max_abs_logit_diff": float(np.abs(out - ref[k]).max()),
                                  "top1_agreement": float((out.argmax(1) == ref[k].argmax(1)).mean())}
    return fidelity


def _summary(b1: dict, b16: dict, big: int = 16) -> dict:
    variants = {}
    for label in b1:
        variants[label] = {"b1_p50_ms": round(statistics.median(b1[label]), 3),
                           "b1_p99_ms": round(_pct(b1[label], 0.99), 3),
                           "b1_block_p50_ms": [round(x, 3) for x in _blocks(b1[label])],
                           "b16_median_ms": round(statistics.median(b16[label]), 3),
                           "b16_images_per_s": round(big * 1000.0 / statistics.median(b16[label]), 1)}
    base = variants["fp32 eager"]
    for v in variants.values():
        v["b1_speedup_vs_fp32"] = round(base["b1_p50_ms"] / v["b1_p50_ms"], 2)
        v["b16_speedup_vs_fp32"] = round(v["b16_images_per_s"] / base["b16_images_per_s"], 2)
    return variants


def measure(device: str = "cuda", tiny: bool = False, model_path=None, rounds: int | None = None,
            sb_repeats: int | None = None, generated: int | None = None, compile_models: bool | None = None,
            log=print) -> dict:
    import torch

    from servelab.core import paths

    rounds = rounds or (3 if tiny else 300)
    sb_repeats = sb_repeats or (1 if tiny else 40)  # the dry run: one pass per size (FP16 on a CPU is slow)
    generated = generated if generated is not None else (2 if tiny else 256)
    sizes = (1, 2) if tiny else BATCH_SIZES
    big = 2 if tiny else 16  # the throughput batch (the dry run keeps it small: FP16 on a CPU is slow)
    on_gpu = device.startswith("cuda")
    dev = torch.device(device)
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    capability = torch.cuda.get_device_capability(dev) if on_gpu else None

    base = torch.load(model_path or paths.PTH_TARGETS[0], map_location=dev, weights_only=False).eval()
    models, skipped = _variants(base, on_gpu, capability, compile_models)
    photos, noise = _inputs(generated)

    def batch(b: int):
        return torch.from_numpy(np.stack([photos[i % len(photos)] for i in range(b)]))

    x1, x16 = batch(1).to(dev), batch(big).to(dev)
    xin = {torch.float32: (x1, x16), torch.float16: (x1.half(), x16.half())}
    with torch.inference_mode():
        compile_s = _warm(models, xin, sync, skipped, passes=1 if tiny else 3)
        log(f"accel: warm ({', '.join(models)}); compile s: {compile_s or '-'}")
        b1, b16 = _interleaved(models, xin, rounds, sync)
        sb_raw = _batch_cost(models, {b: batch(b).to(dev) for b in sizes}, sb_repeats, sync)
        copies = {}  # to and from the device, which the figures above leave out
        for b in (1, big):
            host = batch(b)
            ms = [_timed(lambda: base(host.to(dev)).cpu(), sync) for _ in range(max(3, sb_repeats // 2))]
            # a difference of two medians: on a CPU (nothing to copy) it is noise and may be negative
            copies[b] = round(statistics.median(ms) - statistics.median(sb_raw["fp32 eager"][b]), 3)
        fidelity = _fidelity(models, base, {"samples": photos, "generated": noise}, dev)

    variants = _summary(b1, b16, big)
    unsettled, apart = judge({k: v["b1_block_p50_ms"] for k, v in variants.items()})
    batch_cost = {label: {b: round(statistics.median(xs), 3) for b, xs in per_b.items()}
                  for label, per_b in sb_raw.items()}
    return {"device_name": torch.cuda.get_device_name(dev) if on_gpu else "cpu",
            "capability": ".".join(map(str, capability)) if capability else None,
            "torch": torch.__version__, "rounds": rounds, "sb_repeats": sb_repeats, "big_batch": big,
            "variants": variants, "compile_s": compile_s, "skipped": skipped, "fidelity": fidelity,
            "unsettled": unsettled, "cannot_tell_apart": apart,
            "batch_cost_ms": batch_cost, "copy_ms": copies,
            "raw": {"b1_ms": {k: [round(x, 4) for x in v] for k, v in b1.items()},
                    "b16_ms": {k: [round(x, 4) for x in v] for k, v in b16.items()},
                    "sb_ms": {k: {b: [round(x, 4) for x in xs] for b, xs in v.items()} for k, v in sb_raw.items()}}}


def figures(res: dict) -> list[dict]:
    """The rows ``summary.md``'s figures table shows."""
    rows = []
    verdict = "unsettled: not evidence" if res["unsettled"] else ""
    for label, v in res["variants"].items():
        fid = res["fidelity"].get(label, {})
        worst = max((f["max_abs_logit_diff"] for f in fid.values()), default=0.0)
        agree = min((f["top1_agreement"] for f in fid.values()), default=1.0)
        rows.append({"what": f"forward pass {label}, batch 1 (×{v['b1_speedup_vs_fp32']} vs fp32)",
                     "throughput": round(1000.0 / v["b1_p50_ms"], 1), "p50_ms": v["b1_p50_ms"],
                     "p99_ms": v["b1_p99_ms"],
                     "value": f"largest logit difference {worst:.2g}, top-1 agree {100 * agree:.1f} % {verdict}".strip()})
        rows.append({"what": f"forward pass {label}, batch {res.get('big_batch', 16)} (×{v['b16_speedup_vs_fp32']} vs fp32)",
                     "throughput": v["b16_images_per_s"], "p50_ms": v["b16_median_ms"], "p99_ms": None,
                     "value": verdict or None})
    for label, curve in res["batch_cost_ms"].items():
        b_max = max(curve)
        rows.append({"what": f"S(b) {label}, b = {', '.join(map(str, curve))} (ms)",
                     "value": " ".join(f"{curve[b]:.2f}" for b in curve)
                     + f"; S({b_max})/S(1) = {curve[b_max] / curve[1]:.2f}"})
    if res["cannot_tell_apart"]:
        rows.append({"what": "batch-1 pairs this run cannot tell apart", "value": "; ".join(res["cannot_tell_apart"])})
    for k, why in res["skipped"].items():
        rows.append({"what": f"{k} skipped", "value": why})
    return rows
