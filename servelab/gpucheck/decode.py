"""gpu-check's ``decode`` phase (issue 51, item 5): where food_pipeline decodes its images.

One Triton serves the ensemble (food_preprocess -> food_classifier_onnx -> food_postprocess) twice,
one path after the other:

* ``cpu``: food_preprocess as shipped (2 copies, KIND_CPU, ``decode: auto``): servelab.core.food11
  decodes on the CPU;
* ``gpu``: food_preprocess reloaded with 2 copies on KIND_GPU and ``decode: gpu``: nvJPEG through
  ``torchvision.io.decode_jpeg(device="cuda")``, resize and normalisation on the GPU too. Each copy's
  log line must say so ("decoding on cuda:N with nvJPEG").

For each path: the ensemble's throughput at ``CLIENTS`` closed-loop clients sending the kit's JPEG
samples (servelab.bench.load; the summary adds the GPU's and the CPU's use during the run from the
runner's samples), each stage's share of the client's p50 and each step's compute from Triton's
traces (servelab.bench.breakdown, as the ``traces`` phase), food_preprocess's own tensors against
food11.preprocess (max |difference|, normalised units), and what food_preprocess answers to bad
images (each must fail its own request with food11's code). Without a GPU (the dry run) the CPU path
is measured and the GPU path is reported "not run: no GPU".

What the GPU path relies on, read (not run) on 2026-11-29:

* torchvision 0.22.1 (docker/requirements-triton.txt; PyPI's wheel is the +cu126 build, git
  59a3e1f9), ``torchvision/io/image.py``: ``decode_jpeg`` takes one uint8 CPU tensor or a list of
  them; with a CUDA ``device`` it calls ``torch.ops.image.decode_jpegs_cuda`` on the whole list, and
  "does not return partial results in case of an error"; ``apply_exif_orientation`` is "Only
  implemented for JPEG format on CPU" (so rotated JPEGs stay on the CPU: food11.plain_jpeg).
* pytorch/vision ``torchvision/csrc/io/image/cuda/decode_jpegs_cuda.cpp`` (a later commit; both of its
  messages "Failed to initialize nvjpeg with hardware backend" / "... with default backend" are in
  the 0.22.1 wheel's ``image.so``): nvJPEG's hardware backend first, its default backend when the GPU
  has no JPEG engine (NVJPEG_STATUS_ARCH_MISMATCH); one decoder per process, behind a mutex.
* The wheel bundles ``torchvision.libs/libnvjpeg.so.12`` (and links it from ``image.so``); the GPU code
  embedded in that library (its ``.nv_fatbin`` section) holds cubins for sm_50, 52, 60, 61, 70, 75,
  80, 86, 89 and 90, and PTX for 90: compute capability 6.0, the P100, is among them.
* Not verified: that it runs on a P100 (no P100 here), and what nvJPEG answers to a one-scan JPEG cut
  short and given its end marker back (food11 finds it while decoding; libjpeg through torchvision
  decodes it, filling the missing blocks): :func:`bad_inputs` sends it through the GPU path.
"""

from __future__ import annotations

import io
import json
import re
import struct
import time
import urllib.error
import urllib.request
import zlib

import numpy as np

from servelab.core import food11, paths

PIPELINE = "food_pipeline"
STEP = "food_preprocess"
MODELS = (PIPELINE, STEP, "food_classifier_onnx", "food_postprocess")
CLIENTS = 8
GPU_EDIT = {"instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}],
            "parameters": {"decode": {"string_value": "gpu"}}}
NO_GPU = "not run: no GPU"


def jpeg_samples() -> list[bytes]:
    """The kit's sample JPEGs (nvJPEG's share; the PNGs go to the CPU on either path)."""
    return [p.read_bytes() for p in paths.sample_images() if p.suffix.lower() in (".jpg", ".jpeg")]


def bad_images() -> list[tuple[str, str, bytes]]:
    """(what, the code food11 answers, bytes): refused by the header guards, or found while decoding."""
    rice = (paths.SAMPLES_DIR / "rice_plate.jpg").read_bytes()
    small = io.BytesIO()
    from PIL import Image

    Image.new("L", (8, 8)).save(small, format="PNG")
    png = bytearray(small.getvalue())   # its IHDR declares 4x the pixel limit: a decompression bomb
    side = int((food11.MAX_IMAGE_PIXELS * 4) ** 0.5)
    png[16:24] = struct.pack(">II", side, side)
    png[29:33] = struct.pack(">I", zlib.crc32(bytes(png[12:29])) & 0xFFFFFFFF)
    return [("text", "not_an_image", b"plain text, not a photo"),
            ("JPEG cut in half", "truncated_image", rice[:len(rice) // 2]),
            ("JPEG cut short, end marker put back (issue 48)", "truncated_image", rice[:1000] + b"\xff\xd9"),
            ("PNG declaring 160 MP", "image_too_large", bytes(png))]


def _infer_step(url: str, images: list[bytes]) -> tuple[int, np.ndarray | str]:
    """One request of ``images`` to food_preprocess: (HTTP status, its tensor or its error)."""
    from servelab.bench import http
    from servelab.bench.targets import parse_infer_response, triton_infer_body

    body, headers = triton_infer_body([("IMAGE_BYTES", "BYTES", [len(images), 1], images)], ["IMAGE_TENSOR"])
    req = urllib.request.Request(f"http://{url}/v2/models/{STEP}/infer", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            resp = http.Response(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}").get("error", "")
    return resp.status, parse_infer_response(resp)["IMAGE_TENSOR"]


def fidelity(url: str) -> dict:
    """food_preprocess's tensors for the sample JPEGs (one request) against food11.preprocess."""
    jpegs = jpeg_samples()
    status, got = _infer_step(url, jpegs)
    if status != 200:
        return {"error": f"HTTP {status}: {got}"}
    diffs = [float(np.abs(g - food11.preprocess(j)).max()) for g, j in zip(got, jpegs)]
    means = [float(np.abs(g - food11.preprocess(j)).mean()) for g, j in zip(got, jpegs)]
    return {"images": len(jpegs), "max_abs_diff": round(max(diffs), 4), "mean_abs_diff": round(max(means), 5)}


def bad_inputs(url: str) -> dict:
    """Each bad image alone, then all of them in one request beside a good one: each refusal must
    carry food11's code (HTTP 400) and leave the next request served."""
    outcomes, wrong = [], []
    good = jpeg_samples()[0]
    for what, code, data in bad_images():
        status, answer = _infer_step(url, [data])
        ok = status == 400 and isinstance(answer, str) and f"{code}: " in answer
        outcomes.append({"what": what, "expected": code, "status": status,
                         "answer": answer[:160] if isinstance(answer, str) else "a tensor"})
        if not ok:
            wrong.append(f"{what}: HTTP {status} ({outcomes[-1]['answer']})")
    status, _ = _infer_step(url, [good])
    if status != 200:
        wrong.append(f"a good JPEG after them: HTTP {status}")
    return {"outcomes": outcomes, "wrong": wrong}


def _shares(s: dict) -> str:
    client = s.get("client_p50")
    if not client:
        return s.get("verdict", "")
    return ", ".join(f"{k} {v['p50'] / client:.0%}" for k, v in s["stages"].items() if v["p50"] / client >= 0.01)


def run_path(t, path: str, tiny: bool) -> tuple[dict, dict]:
    """Throughput, then traces, of food_pipeline as food_preprocess now stands: (figure row, traces summary)."""
    from servelab.bench import breakdown, load, patterns
    from servelab.bench.targets import triton_image_target

    jpegs = jpeg_samples()
    target = triton_image_target(t.url, PIPELINE, jpegs, input_name="IMAGE_BYTES", raw=True)
    load.warm(target, requests=2 * CLIENTS, concurrency=CLIENTS)
    t_start = time.time()
    r = load.run(target, patterns.closed(CLIENTS, duration=1.0 if tiny else 5.0), label=f"decode={path}",
                 progress=False)
    t_end = time.time()
    n, warmup = (8, 2) if tiny else (100, 20)
    s = breakdown.summary(breakdown.measure(t.url, t.admin_key, PIPELINE, CLIENTS, n, warmup=warmup, images=jpegs))
    s["model"] = f"{PIPELINE} decode={path}"
    step = s["steps_p50"].get(STEP, {})
    row = {"what": f"decode={path}: {PIPELINE}, c={CLIENTS}", "path": path, "concurrency": CLIENTS,
           "throughput": round(r.throughput, 1), "p50_ms": round(r.latency.get("p50_ms", 0.0), 2),
           "p99_ms": round(r.latency.get("p99_ms", 0.0), 2), "ok": r.ok, "errors": r.errors,
           "t_start": t_start, "t_end": t_end, "traced": s["requests"],
           "stages_p50_ms": {k: round(v["p50"], 3) for k, v in s["stages"].items()},
           "steps_p50_ms": s["steps_p50"], "preprocess_compute_p50_ms": step.get("compute"),
           "value": f"{STEP} compute p50 {step.get('compute', 0.0):.2f} ms; shares of the client's p50: {_shares(s)}"}
    return row, s


def decoders_logged(log_path, since: int) -> list[str]:
    """What each food_preprocess copy said it decodes with, from Triton's log after ``since`` bytes."""
    try:
        with open(log_path, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return re.findall(rf"{STEP}_\d+(?:_\d+)?: (decoding [^\"\n]*)", text)


def measure(t, gpu: bool, tiny: bool, write=None) -> dict:
    """Both paths on the running Triton ``t``; ``write(res)`` after each, so a phase stopped at its
    limit keeps what it measured."""
    rows, summaries, failures = [], [], []
    paths_seen: dict[str, dict] = {}
    for path in ("cpu", "gpu"):
        if path == "gpu":
            if not gpu:
                rows.append({"what": f"decode=gpu: {PIPELINE}, c={CLIENTS}", "path": "gpu", "value": NO_GPU})
                break
            size = t.log_path.stat().st_size if t.log_path.exists() else 0
            t.reload_model(STEP, GPU_EDIT)
            said = decoders_logged(t.log_path, size)
            paths_seen["gpu_log"] = {"lines": said}
            if not said or not all("with nvJPEG" in line for line in said):
                failures.append(f"{STEP} on KIND_GPU did not say it decodes with nvJPEG: {said[:2]}")
        row, s = run_path(t, path, tiny)
        rows.append(row)
        summaries.append(s)
        fid = fidelity(t.url)
        bad = bad_inputs(t.url)
        paths_seen[path] = {"fidelity": fid, "bad_inputs": bad}
        rows.append({"what": f"decode={path}: {STEP} tensors vs food11.preprocess", "path": path,
                     "value": fid.get("error") or f"max abs diff {fid['max_abs_diff']} (mean up to "
                                                  f"{fid['mean_abs_diff']}) over {fid['images']} JPEGs"})
        rows.append({"what": f"decode={path}: bad images", "path": path,
                     "value": (f"{len(bad['outcomes'])} of {len(bad['outcomes'])} refused with food11's code"
                               if not bad["wrong"] else "not refused: " + "; ".join(bad["wrong"]))})
        if row["ok"] == 0 or row["traced"] == 0:
            failures.append(f"decode={path}: {row['ok']} answered, {row['traced']} traced")
        if fid.get("error"):
            failures.append(f"decode={path}: tensors: {fid['error']}")
        elif path == "cpu" and fid["max_abs_diff"] != 0.0:
            failures.append(f"decode=cpu: {STEP} differs from food11.preprocess by {fid['max_abs_diff']}")
        failures += [f"decode={path}: {w}" for w in bad["wrong"]]
        if write:
            write({"status": "fail", "reason": f"stopped after decode={path}", "figures": rows})
    timed = [r for r in rows if "throughput" in r]
    if len(timed) == 2 and timed[0]["throughput"] and summaries[0].get("client_p50") and summaries[1].get("client_p50"):
        rows.append({"what": "decode=gpu against decode=cpu", "value": (
            f"throughput x{timed[1]['throughput'] / timed[0]['throughput']:.2f}, client p50 "
            f"x{summaries[1]['client_p50'] / summaries[0]['client_p50']:.2f} (the same run, one after the other)")})
    from servelab.bench import breakdown

    res = {"status": "ok", "figures": rows, "paths": paths_seen, "table": breakdown.table(summaries),
           "gpu_edit": GPU_EDIT}
    if failures:
        res.update(status="fail", reason="; ".join(failures[:4]))
    return res
