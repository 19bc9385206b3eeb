"""The phases of ``servelab gpu-check``, one per process:
``python -m servelab.gpucheck.phases NAME --work DIR [--device cpu] [--tiny]``.

Each writes ``DIR/NAME.json``: ``status`` (ok | fail), ``reason`` when not ok,
``figures`` (rows for the summary's table) and what it saw. A phase that
measures writes its raw output beside it (``perf.txt``, ``tour-report.md``,
``pytest-cuda.txt``); the runner copies them to the result folder.
"""

from __future__ import annotations

import argparse
import base64
import json
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from servelab.core import paths

ONNX_ON_CPU = ("onnxruntime-gpu (235 MiB) does not fit the 64 MiB a device call carries: the ONNX runner and "
               "FastAPI ONNX use the machine's onnxruntime, on CPU")


class PhaseFailed(RuntimeError):
    """A phase ran but what it checks did not hold."""


def _want_gpu(args) -> bool:
    return args.device != "cpu"


# --------------------------------------------------------------------------
# probe
# --------------------------------------------------------------------------

def probe(args, work: Path) -> dict:
    info: dict = {"python": sys.version.split()[0], "executable": sys.executable, "machine": platform.machine(),
                  "cpus": _cpus()}
    smi = shutil.which("nvidia-smi")
    if smi:
        q = "name,driver_version,memory.total,compute_cap,pci.bus_id"
        out = subprocess.run([smi, f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30)
        info["nvidia_smi"] = out.stdout.strip() or out.stderr.strip()
    else:
        info["nvidia_smi"] = "nvidia-smi not found"
    try:  # a probe records what is missing rather than stop at it
        import numpy

        info["numpy"] = numpy.__version__
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
    except ImportError as err:
        info.setdefault("numpy", f"missing: {err}")
        info.update(torch=f"missing: {err}", torch_cuda=None, cuda_available=False)
    if info["cuda_available"]:
        info["gpus"] = [{"name": torch.cuda.get_device_name(i),
                         "capability": ".".join(map(str, torch.cuda.get_device_capability(i)))}
                        for i in range(torch.cuda.device_count())]
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
        info["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except ImportError as err:
        info["onnxruntime"] = f"not importable: {err}"
    info["onnx_note"] = ("ONNX Runtime's CUDA provider is available" if "CUDAExecutionProvider" in
                         info.get("onnxruntime_providers", []) else ONNX_ON_CPU)
    for mod in ("fastapi", "pydantic", "uvicorn", "google.protobuf", "grpc", "pytest"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            info[mod] = getattr(m, "__version__", "?")
        except ImportError as err:
            info[mod] = f"missing: {err}"
    from servelab import triton
    from servelab.triton import perf

    try:
        install = triton.find_install()
        info["tritonserver"] = str(install.server)
        info["triton_gpus"] = triton.gpu_count()
        info["stub_missing_libs"] = _missing_libs(install)
    except triton.TritonError as err:
        info["tritonserver"] = f"not found: {err}"
    try:
        info["perf_analyzer"] = f"{perf.real_binary()} ({perf.check()})"
    except perf.PerfAnalyzerError as err:
        info["perf_analyzer"] = f"not usable: {err}"
    device = info["gpus"][0]["name"] if info.get("gpus") else "CPU"
    res = {"status": "ok", "info": info, "device_name": device,
           "figures": [{"what": "device (torch)", "value": device},
                       {"what": "torch / CUDA", "value": f"{info['torch']} / {info['torch_cuda']}"},
                       {"what": "nvidia-smi", "value": info["nvidia_smi"]}]}
    problems = [k for k in ("tritonserver", "perf_analyzer") if str(info[k]).startswith(("not", "missing"))]
    problems += ["stub_missing_libs"] if info.get("stub_missing_libs") else []
    problems += [k for k in ("numpy", "torch", "fastapi", "pydantic", "uvicorn") if str(info[k]).startswith("missing")]
    if _want_gpu(args) and args.device == "cuda" and not info["cuda_available"]:
        problems.append("torch sees no GPU")
    if problems:
        res.update(status="fail", reason="; ".join(f"{p}: {info.get(p, p)}" for p in problems))
    return res


def _missing_libs(install) -> list[str]:
    """Libraries the server and this Python's stub cannot find in the environment Triton gets
    (the stub links libpython3.X.so: a Python built without it cannot run the Python backend)."""
    from servelab.triton.install import server_env

    ldd = shutil.which("ldd")
    if not ldd:
        return []
    missing = []
    for binary in (install.server, install.stub(), install.python_backend / "libtriton_python.so"):
        out = subprocess.run([ldd, str(binary)], capture_output=True, text=True, env=server_env(install), timeout=30)
        missing += [f"{binary.name}: {line.split()[0]}" for line in out.stdout.splitlines() if "not found" in line]
    return missing


def _cpus() -> int:
    from servelab.core import procs

    return procs.cpu_cores()


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------

def models(args, work: Path) -> dict:
    import torch

    from servelab.serve import models as m

    t0 = time.perf_counter()
    result = m.build(log=print)
    return {"status": "ok", "built_with_torch": torch.__version__, "seconds_build": round(time.perf_counter() - t0, 1),
            "result": str(result)[:500],
            "figures": [{"what": "models built", "value": f"torch {torch.__version__}, "
                                                          f"{time.perf_counter() - t0:.1f} s"}]}


# --------------------------------------------------------------------------
# fastapi
# --------------------------------------------------------------------------

def _sample_b64() -> str:
    return base64.b64encode(paths.sample_images()[0].read_bytes()).decode()


def _post(url: str, body: bytes, timeout: float = 60.0) -> float:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()
    return time.perf_counter() - t0


def _load(url: str, body: bytes, n: int, clients: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as ex:
        lat = sorted(ex.map(lambda _: _post(url, body), range(n)))
    wall = time.perf_counter() - t0
    return {"requests": n, "clients": clients, "throughput": round(n / wall, 1),
            "p50_ms": round(1000 * statistics.median(lat), 1),
            "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1),
            "t_start": time.time() - wall, "t_end": time.time()}


def fastapi(args, work: Path) -> dict:
    from servelab.local import stack

    seq, conc = (4, 8) if args.tiny else (100, 400)
    with stack.running(["fastapi_pt"], free_ports=True, log_dir=work / "fastapi-logs") as s:
        url = s.urls["fastapi_pt"]
        with urllib.request.urlopen(url + "/health", timeout=30) as r:
            health = json.loads(r.read())
        body = json.dumps({"image": _sample_b64()}).encode()
        req = urllib.request.Request(url + "/predict", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            answer = json.loads(r.read())
        runs = [dict(_load(url + "/predict", body, seq, 1), label="FastAPI PyTorch, sequential"),
                dict(_load(url + "/predict", body, conc, 16), label="FastAPI PyTorch, 16 clients")]
    device = str(health.get("device", ""))
    name = health.get("device_name") or device  # device_name: the GPU's name, where the service reports it
    res = {"status": "ok", "health": health, "prediction": answer, "device": device, "device_in_service": name,
           "runs": runs,
           "figures": [{"what": "FastAPI /health device", "value": name}]
           + [{"what": r["label"], "throughput": r["throughput"], "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"],
               "t_start": r["t_start"], "t_end": r["t_end"]} for r in runs]}
    if _want_gpu(args) and not device.startswith("cuda"):
        res.update(status="fail", reason=f"the service runs on {device!r}, not CUDA")
    if not _want_gpu(args) and device.startswith("cuda"):
        res.update(status="fail", reason=f"the service runs on {device!r} with the GPU hidden")
    return res


# --------------------------------------------------------------------------
# triton
# --------------------------------------------------------------------------

MODEL = "food_classifier"


# perf_analyzer averages 3 consecutive windows that agree within --stability-percentage. On the GPU:
# 2 s windows within 25 %, else (a run that never settles) 3 windows averaged as they come, said so.
# The dry run: 3 windows of 4 requests, never judged (it proves the plumbing, it measures nothing).
PERF_WINDOW = "--measurement-interval 2000 --stability-percentage 25 --max-trials 6"
PERF_UNJUDGED = "--measurement-interval 2000 --stability-percentage 999 --max-trials 3"
PERF_TINY = "--measurement-mode count_windows --measurement-request-count 4 --stability-percentage 999 --max-trials 3"


def triton_phase(args, work: Path) -> dict:
    from servelab import triton
    from servelab.core import procs
    from servelab.triton import perf

    gpu = _want_gpu(args) and triton.gpu_count() > 0
    kind = "KIND_GPU" if gpu else "KIND_CPU"
    batch = 2 if args.tiny else 16
    concurrencies = (1, 16) if args.tiny else (1, 8, 16)
    log = open(work / "perf.txt", "w")
    figures, runs, groups = [], [], {}
    failures = []
    with triton.running(models=[MODEL], http_port=procs.free_port(), grpc_port=procs.free_port(),
                        metrics_port=procs.free_port(), workdir=work / "triton", write_state=False,
                        install_perf_shim=False) as t:
        log.write(t.summary() + "\n\n")
        for count in (1, 2):
            if count > 1:
                group = {"count": count, "kind": kind, **({"gpus": [0]} if gpu else {})}
                t.reload_model(MODEL, {"instance_group": [group]})
            cfg = t.model_config(MODEL)
            groups[count] = cfg.get("instance_group")
            kinds = {g.get("kind") for g in cfg.get("instance_group") or []}
            if gpu and kinds != {"KIND_GPU"}:
                failures.append(f"{count} instance(s): the config Triton reports has {sorted(kinds)}, not KIND_GPU")
            for c, b in [*((c, 1) for c in concurrencies), (1, batch)]:
                base = f"-u {t.url} -m {MODEL} --input-data {paths.INPUT_JSON} -b {b} --concurrency-range {c}"
                fig = {"what": f"Triton {MODEL}, {count}x {kind}, c={c}, -b {b}", "instances": count,
                       "concurrency": c, "batch": b, "t_start": time.time()}
                for window in ([PERF_TINY] if args.tiny else [PERF_WINDOW, PERF_UNJUDGED]):
                    fig["t_start"] = time.time()
                    r = perf.run(f"{base} {window}", timeout=60, check=False)
                    fig["t_end"] = time.time()
                    log.write(f"=== {count} instance(s) {kind}: perf_analyzer {base} {window}\n{r.output}\n")
                    log.flush()
                    if r.ok or "stable" not in r.output:
                        break
                    fig["value"] = "not stable within 25 %: 3 windows averaged"
                if r.ok:
                    x = r.results[-1]
                    srv = x.get("server", {})
                    fig.update(throughput=x.get("throughput"), p50_ms=_ms(x.get("p50_latency_us")),
                               p99_ms=_ms(x.get("p99_latency_us")), queue_ms=_ms(srv.get("queue_us")),
                               infer_ms=_ms(srv.get("compute_infer_us")))
                else:
                    fig["error"] = f"perf_analyzer exited {r.returncode}"
                    failures.append(f"{fig['what']}: {fig['error']}")
                figures.append(fig)
                runs.append(fig)
                # Written as it goes: a phase stopped at its limit keeps the runs it finished.
                _write(work, "triton", {"status": "fail", "reason": f"stopped after {len(runs)} perf_analyzer runs",
                                        "kind": kind, "instance_groups": groups, "figures": figures})
        stubs = [s.__dict__ if hasattr(s, "__dict__") else str(s) for s in t.stub_processes(MODEL)]
        notes = list(t.notes)
    log.close()
    res = {"status": "ok", "kind": kind, "instance_groups": groups, "notes": notes, "stubs": str(stubs)[:2000],
           "figures": figures}
    if failures:
        res.update(status="fail", reason="; ".join(failures[:4]))
    return res


def _ms(us) -> float | None:
    return None if us is None else round(us / 1000, 2)


# --------------------------------------------------------------------------
# tour
# --------------------------------------------------------------------------

def tour(args, work: Path) -> dict:
    from servelab.measure import tour as tourmod

    out = work / "tour"
    if args.tiny:
        # The dry run proves the phase (the tour starts, measures, writes its report)
        # on the FastAPI part alone: the Triton parts would take minutes here. It repeats
        # no run a busy machine spoiled: its figures are not evidence anyway.
        components, scale, repeats = ("fastapi_pt", "fastapi_onnx"), 0.05, {"repeat_budget_s": 0, "run_repeat_budget_s": 0}
    else:
        components, scale, repeats = ("fastapi_pt", "fastapi_onnx", "triton"), 0.2, {}
    report = tourmod.run_tour(tourmod.TourConfig(scale=scale, out=out, **repeats), components=components)
    shutil.copy(report, work / "tour-report.md")
    from servelab.bench.load import Result

    rows = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else []
    figures = []
    for d in rows:
        r = Result.from_dict(d).row()
        figures.append({"what": f"tour: {r['label']}", "throughput": _round(r["throughput"]),
                        "p50_ms": _round(r["p50_ms"]), "p99_ms": _round(r["p99_ms"]),
                        "value": "" if r["valid"] != "no" else "invalid run (busy machine)"})
    return {"status": "ok", "scale": scale, "components": list(components), "report": str(report),
            "figures": figures[:24], "note": "tiny: the FastAPI part only" if args.tiny else ONNX_ON_CPU}


def _round(v):
    return round(v, 1) if isinstance(v, (int, float)) else v


# --------------------------------------------------------------------------
# cuda tests
# --------------------------------------------------------------------------

CUDA_MARK = re.compile(r"pytest\.mark\.cuda\b|pytestmark\s*=.*\bcuda\b")


def cuda_test_files(root: Path | None = None) -> list[Path]:
    """Test files that hold ``cuda``-marked tests (only those are collected: the
    others import packages a bare GPU machine lacks)."""
    root = root or paths.REPO_ROOT / "tests"
    return sorted(p for p in root.rglob("test_*.py") if CUDA_MARK.search(p.read_text(errors="replace")))


def cuda_tests(args, work: Path) -> dict:
    files = cuda_test_files()
    out_path = work / "pytest-cuda.txt"
    if not files:
        out_path.write_text("no test file holds a test marked cuda\n")
        return {"status": "fail", "reason": "no test is marked cuda (tests/ has none)", "figures": []}
    try:
        import pytest  # noqa: F401
    except ImportError:
        out_path.write_text("pytest is not installed on this machine\n")
        return {"status": "fail", "reason": "pytest is not installed here", "figures": []}
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider", "-o", "addopts=",
           *map(str, files)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(paths.REPO_ROOT))
    text = proc.stdout + proc.stderr
    out_path.write_text(" ".join(cmd) + "\n\n" + text)
    last = [line for line in text.strip().splitlines() if re.search(r"passed|failed|skipped|error|deselected", line)]
    tally = last[-1].strip("= ") if last else f"exit {proc.returncode}"
    res = {"status": "ok" if proc.returncode in (0, 5) else "fail", "files": [str(f) for f in files],
           "tally": tally, "figures": [{"what": "pytest -m cuda", "value": tally}]}
    if res["status"] != "ok":
        res["reason"] = f"pytest exited {proc.returncode}: {tally}"
    elif _want_gpu(args) and "passed" not in tally:
        res.update(status="fail", reason=f"no cuda test passed on the GPU: {tally}")
    return res


# --------------------------------------------------------------------------
# accel
# --------------------------------------------------------------------------

def accel(args, work: Path) -> dict:
    import torch

    from servelab.gpucheck import accel as acc

    gpu = _want_gpu(args)
    if gpu and not torch.cuda.is_available():
        return {"status": "fail", "reason": "a GPU was expected and torch sees none", "figures": []}
    res = acc.measure("cuda" if gpu else "cpu", tiny=args.tiny)
    return {"status": "ok", **res, "figures": acc.figures(res)}


# --------------------------------------------------------------------------
# traces
# --------------------------------------------------------------------------

TRACE_ENSEMBLE_STEPS = ("food_preprocess", "food_classifier_onnx", "food_postprocess")


def traces(args, work: Path) -> dict:
    """Where each request's time goes here (servelab.bench.breakdown): Triton's traces of the
    Python model, the ONNX model and the ensemble at 1 and 8 clients, each stage's p50 and its
    share of the client's p50, with the GPU's and the CPU's use during each row (the samples)."""
    from servelab import triton
    from servelab.bench import breakdown
    from servelab.core import procs

    models = ["food_classifier_onnx"] if args.tiny else list(breakdown.MODELS)
    load = sorted(set(models) | (set(TRACE_ENSEMBLE_STEPS) if "food_pipeline" in models else set()))
    n, warmup = (8, 2) if args.tiny else (100, 20)
    rows, summaries = [], []
    with triton.running(models=load, http_port=procs.free_port(), grpc_port=procs.free_port(),
                        metrics_port=procs.free_port(), workdir=work / "triton-traces", write_state=False,
                        install_perf_shim=False) as t:
        for model in models:
            for clients in (1, 8):
                t_start = time.time()
                s = breakdown.summary(breakdown.measure(t.url, t.admin_key, model, clients, n, warmup=warmup))
                summaries.append(s)
                client = s.get("client_p50")
                shares = ", ".join(f"{k} {v['p50'] / client:.0%}" for k, v in s["stages"].items()
                                   if client and v["p50"] / client >= 0.01)
                rows.append({"what": f"traces {model}, c={clients}", "concurrency": clients, "t_start": t_start,
                             "t_end": time.time(), "p50_ms": client, "p99_ms": s.get("client_p99"),
                             "requests": s["requests"], "stages_p50_ms": {k: v["p50"] for k, v in s["stages"].items()},
                             "steps_p50_ms": s["steps_p50"], "sum_ratio": s.get("sum_ratio"),
                             "value": f"shares of the client's p50: {shares}" if client else s.get("verdict")})
                _write(work, "traces", {"status": "fail", "reason": f"stopped after {len(rows)} rows", "figures": rows})
        notes = list(t.notes)
    res = {"status": "ok", "figures": rows, "notes": notes, "table": breakdown.table(summaries)}
    short = [f"{r['what']}: {r['requests']} of {n} traced" for r in rows if r["requests"] < n]
    if short:
        res.update(status="fail", reason="; ".join(short[:4]))
    return res


# --------------------------------------------------------------------------
# decode
# --------------------------------------------------------------------------

def decode(args, work: Path) -> dict:
    """food_pipeline with its images decoded on the CPU, then by nvJPEG on the GPU, in one run
    (servelab.gpucheck.decode): throughput, GPU use, stage shares, fidelity, bad images."""
    from servelab import triton
    from servelab.core import procs
    from servelab.gpucheck import decode as dec

    gpu = _want_gpu(args) and triton.gpu_count() > 0
    with triton.running(models=list(dec.MODELS), http_port=procs.free_port(), grpc_port=procs.free_port(),
                        metrics_port=procs.free_port(), workdir=work / "triton-decode", write_state=False,
                        install_perf_shim=False) as t:
        res = dec.measure(t, gpu, args.tiny, write=lambda partial: _write(work, "decode", partial))
        res["notes"] = list(t.notes)
    return res


# --------------------------------------------------------------------------
# streaming
# --------------------------------------------------------------------------

def _median_s(fn, repeats: int) -> float:
    fn()   # warm-up (CUDA kernels chosen, caches filled)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()   # each step ends in int() of its tokens: the GPU has finished when it returns
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def streaming_phase(args, work: Path) -> dict:
    """Token streams (issue 54, notebook 6f) at the size a GPU serves, GPT-2 small's shape
    (servelab.core.tinylm.SIZES["gpu"]): the decoder alone, a prefill and one step of 1 and 8 requests
    in fp32 and FP16, with FP16's greedy tokens against fp32's; then both token-streaming models in the
    kit's Triton (KIND_GPU: FP16) under the same Poisson arrivals, with TTFT, TPOT, tokens/s and how
    many requests got the same tokens from both. The dry run: the CPU's size, a few seconds of load."""
    import torch

    from servelab import triton
    from servelab.bench import streaming
    from servelab.core import paths, procs, tinylm

    gpu = _want_gpu(args)
    if gpu and not torch.cuda.is_available():
        return {"status": "fail", "reason": "a GPU was expected and torch sees none", "figures": []}
    device, size = ("cuda", tinylm.SIZES["gpu"]) if gpu else ("cpu", tinylm.SIZES["cpu"])
    repeats, n_tokens = (3, 8) if args.tiny else (20, 64)
    prompt = tinylm.encode("A plate of sushi")
    rows, tokens = [], {}
    for dtype in (torch.float32, torch.float16):
        name = str(dtype).split(".")[-1]
        decoder = tinylm.TinyDecoder(size, device=device, dtype=dtype)
        prefill = _median_s(lambda: decoder.prefill(prompt), repeats)
        caches, last = zip(*[decoder.prefill(prompt) for _ in range(8)])
        step = {b: _median_s(lambda b=b: decoder.step(list(caches[:b]), list(last[:b])), repeats) for b in (1, 8)}
        tokens[name] = decoder.generate(prompt, n_tokens)
        rows.append({"what": f"streaming decoder {name} on {device}", "p50_ms": round(1000 * step[1], 2),
                     "prefill_ms": round(1000 * prefill, 2), "step_ms": {b: round(1000 * v, 2) for b, v in step.items()},
                     "value": f"{tinylm.describe(decoder)}: prefill {1000 * prefill:.2f} ms, step b=1 "
                              f"{1000 * step[1]:.2f} ms, b=8 {1000 * step[8]:.2f} ms"})
        decoder = caches = last = None   # freed before the next precision's copy
        if gpu:
            torch.cuda.empty_cache()
    same = next((i for i, (a, b) in enumerate(zip(tokens["float32"], tokens["float16"])) if a != b), n_tokens)
    rows.append({"what": "streaming FP16 tokens against fp32", "same_prefix": same, "tokens": n_tokens,
                 "value": f"the first {same} of {n_tokens} greedy tokens identical"})
    rate, duration, lengths = (2.0, 4.0, (4, 16)) if args.tiny else (2.0, 20.0, (16, 256))
    runs = {}
    with triton.running(paths.MODELS_STREAMING, http_port=procs.free_port(), grpc_port=procs.free_port(),
                        metrics_port=procs.free_port(), workdir=work / "triton-streaming", write_state=False,
                        install_perf_shim=False) as t:
        for model in ("tokens_request_level", "tokens_iteration_level"):
            t_start = time.time()
            r = streaming.run(t.grpc_url, model, rate, duration, lengths, seed=54, ttft_bound_ms=500)
            runs[model] = r
            rows.append({"what": f"streaming {model}, {rate:g}/s", "t_start": t_start, "t_end": time.time(),
                         "p50_ms": r["ttft_p50_ms"], "p99_ms": r["ttft_p99_ms"],
                         "throughput": round(r["tokens_per_s"], 1), "requests": r["requests"],
                         "completed": r["completed"], "ttft_mean_ms": r["ttft_mean_ms"], "tpot_p50_ms": r["tpot_p50_ms"],
                         "valid": r["validity"]["valid"],
                         "value": f"TTFT p50/p99 (ms), tokens/s; TPOT p50 {r['tpot_p50_ms'] or 0:.2f} ms, "
                                  f"{r['completed']} of {r['requests']} completed"
                                  + ("" if r["validity"]["valid"] else "; spoiled: "
                                     + "; ".join(r["validity"]["reasons"]))})
        notes = list(t.notes)
    a, b = (runs[m]["streams"] for m in ("tokens_request_level", "tokens_iteration_level"))
    identical = sum(x.tokens == y.tokens for x, y in zip(a, b))
    rows.append({"what": "streaming: the same tokens from both schedulers", "identical": identical, "requests": len(a),
                 "value": f"{identical} of {len(a)} requests"})
    res = {"status": "ok", "figures": rows, "notes": notes}
    short = [f"{m}: {r['completed']} of {r['requests']} completed" for m, r in runs.items()
             if r["completed"] < r["requests"]]
    if short:
        res.update(status="fail", reason="; ".join(short))
    elif not gpu and identical < len(a):   # float64 on the CPU: a step does not depend on its batch
        res.update(status="fail", reason=f"on the CPU only {identical} of {len(a)} requests got the same tokens")
    return res


PHASES = {"probe": probe, "models": models, "fastapi": fastapi, "triton": triton_phase, "tour": tour,
          "cuda_tests": cuda_tests, "accel": accel, "traces": traces, "decode": decode,
          "streaming": streaming_phase}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m servelab.gpucheck.phases")
    ap.add_argument("phase", choices=sorted(PHASES))
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    # The runner stops a phase past its limit with SIGTERM: unwind like Ctrl-C, so the servers the
    # phase started (their own process groups) are stopped by its `with` blocks, not left running.
    signal.signal(signal.SIGTERM, _terminate)
    try:
        res = PHASES[args.phase](args, args.work)
    except Exception as err:  # recorded; the runner goes on to the next phase
        traceback.print_exc()
        res = {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:600], "figures": []}
    _write(args.work, args.phase, res)
    return 0 if res.get("status") == "ok" else 1


def _terminate(signum, frame):
    raise KeyboardInterrupt


def _write(work: Path, phase: str, res: dict) -> None:
    tmp = work / f".{phase}.json"
    tmp.write_text(json.dumps(res, indent=1, default=str))
    tmp.replace(work / f"{phase}.json")


if __name__ == "__main__":
    raise SystemExit(main())
