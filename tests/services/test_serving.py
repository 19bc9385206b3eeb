"""servelab.serve.serving on its own: device choice, thread sizing, the base64
pattern the OpenAPI schema documents, model metadata."""

from __future__ import annotations

import base64
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.core import food11, paths, procs
from servelab.serve import serving


@pytest.mark.parametrize("value,expected", [("", "auto"), ("cpu", "cpu"), ("CUDA", "cuda"), (" auto ", "auto")])
def test_requested_device(monkeypatch, value, expected):
    monkeypatch.setenv("SERVELAB_DEVICE", value)
    assert serving.requested_device() == expected


def test_requested_device_rejects_typos(monkeypatch):
    monkeypatch.setenv("SERVELAB_DEVICE", "gpu")
    with pytest.raises(ValueError, match="SERVELAB_DEVICE"):
        serving.requested_device()


def test_forced_cuda_without_gpu_falls_back_to_cpu_with_a_warning(monkeypatch, caplog):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the fallback cannot happen")
    monkeypatch.setenv("SERVELAB_DEVICE", "cuda")
    serving.log.propagate = True
    try:
        with caplog.at_level("INFO", logger="servelab"):
            assert serving.torch_device() == "cpu"
            assert serving.onnx_providers() == ["CPUExecutionProvider"]
    finally:
        serving.log.propagate = False
    assert "falling back to CPU" in caplog.text


def test_choose_logic():
    assert serving._choose("auto", True, "x") == "cuda"
    assert serving._choose("auto", False, "x") == "cpu"
    assert serving._choose("cpu", True, "x") == "cpu"
    assert serving._choose("cuda", True, "x") == "cuda"
    assert serving._choose("cuda", False, "x") == "cpu"


def test_cpu_threads_override_and_validation(monkeypatch):
    monkeypatch.setenv("SERVELAB_THREADS", "3")
    assert serving.cpu_threads() == 3
    monkeypatch.setenv("SERVELAB_THREADS", "0")
    with pytest.raises(ValueError):
        serving.cpu_threads()
    monkeypatch.delenv("SERVELAB_THREADS")
    assert 1 <= serving.cpu_threads() <= len(__import__("os").sched_getaffinity(0))


@pytest.mark.parametrize("text,expected", [("max 100000", None), ("150000 100000", 2), ("50000 100000", 1),
                                           ("400000 100000", 4), ("garbage", None)])
def test_cgroup_quota(tmp_path, text, expected):
    f = tmp_path / "cpu.max"
    f.write_text(text + "\n")
    assert procs.cgroup_cpu_quota(str(f)) == expected
    assert procs.cgroup_cpu_quota(str(tmp_path / "missing")) is None


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=300))
def test_every_base64_encoding_matches_the_documented_pattern(data):
    assert re.fullmatch(serving.BASE64_PATTERN, base64.b64encode(data).decode())


@settings(max_examples=300, deadline=None)
@given(st.from_regex(serving.BASE64_PATTERN, fullmatch=True).filter(lambda s: len(s) >= 4))
def test_strings_matching_the_pattern_decode(text):
    # What the schema calls valid base64, the server can decode: a
    # schema-driven client never gets `invalid_base64` for a conforming string.
    food11.decode_base64(text)


def test_limits_are_consistent():
    assert serving.MAX_BASE64_CHARS * 3 // 4 >= food11.MAX_IMAGE_BYTES
    assert serving.MAX_BODY_BYTES > serving.MAX_BASE64_CHARS


def test_model_info_reads_the_stamp(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"weights")
    info = food11.model_info(model)
    assert info.weights_kind == "unknown" and len(info.version) == 12  # no stamp: hash of the file
    (tmp_path / "m.onnx.json").write_text(json.dumps({"weights_kind": "demo", "sha256": "abcdef0123456789"}))
    info = food11.model_info(model)
    assert (info.weights_kind, info.version, info.note) == ("demo", "abcdef012345", food11.DEMO_WEIGHTS_NOTE)
    assert info.response_fields()["weights_kind"] == "demo"


def test_missing_model_file_gives_a_hint(tmp_path):
    with pytest.raises(SystemExit, match="make models"):
        serving.require_model_file(tmp_path / "nope.pth")


def _onnx_app(monkeypatch, cores: int, workers: str | None = None, cuda_fails_to_load: bool = False):
    """fastapi_onnx/app.py imported on ``cores`` cores (its affinity mask), with
    SERVELAB_INFERENCE_WORKERS=``workers``; optionally a CUDA provider that is
    listed but fails to load (ONNX Runtime then runs the session on the CPU)."""
    import importlib.util
    import os

    import onnxruntime as ort

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.delenv("SERVELAB_DEVICE", raising=False)
    if workers is None:
        monkeypatch.delenv("SERVELAB_INFERENCE_WORKERS", raising=False)
    else:
        monkeypatch.setenv("SERVELAB_INFERENCE_WORKERS", workers)
    if cuda_fails_to_load:
        real = ort.InferenceSession

        def session(path, options=None, providers=None, **kw):
            return real(path, options, providers=[p for p in providers or [] if p != "CUDAExecutionProvider"], **kw)

        monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
        monkeypatch.setattr(ort, "InferenceSession", session)
    spec = importlib.util.spec_from_file_location("fastapi_onnx_app", paths.REPO_ROOT / "fastapi_onnx" / "app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    return app


@pytest.mark.parametrize("cores,workers,expected", [
    (2, None, (2, [1, 2])), (4, None, (4, [1, 2, 4])), (2, "1", (1, [1, 2])), (4, "2", (2, [1, 2, 4])),
    (2, "8", (8, [1, 2])), (3, "2", (2, [1, 3])), (2, "0", (1, [1, 2])),
])
def test_the_onnx_app_has_a_session_for_every_share_it_hands_out(built_models, monkeypatch, cores, workers, expected):
    """fastapi_onnx/app.py's thread rule (issue 47: in the file): one session per thread count a request
    can get, and every count a request is handed on any load is one of them (a count without its
    session was a 500 at SERVELAB_INFERENCE_WORKERS=1 on a busy machine)."""
    app = _onnx_app(monkeypatch, cores, workers)
    assert (app.WORKERS, sorted(app.sessions)) == expected
    assert (app.CORES, app.device) == (cores, "cpu")
    assert app.runnable_now() >= 1   # at least the thread that reads it
    for runnable in (1, 3 * cores, 3 * cores + 1):   # idle; at the limit; busy with other programs
        monkeypatch.setattr(app, "runnable_now", lambda: runnable)
        with app.a_share_of_the_cores() as session:
            assert session is app.sessions[1 if runnable > 3 * cores else cores]


def test_the_pt_app_gives_a_lone_request_every_core_a_pair_a_share_and_a_busy_machine_one(built_models):
    """fastapi_pt/app.py's thread rule, in a fresh interpreter (torch fixes its inter-op threads once
    per process): on 4 cores a lone request gets 4 threads, the second of two in flight 2, and on a
    machine where other programs keep more than 3 x 4 threads ready to run, one."""
    import subprocess
    import sys

    code = (
        "import importlib.util, os, sys\n"
        "os.sched_getaffinity = lambda pid: {0, 1, 2, 3}\n"
        "spec = importlib.util.spec_from_file_location('app', sys.argv[1])\n"
        "app = importlib.util.module_from_spec(spec); spec.loader.exec_module(app)\n"
        "assert app.runnable_now() >= 1\n"
        "out = []\n"
        "for runnable in (1, 12, 13):\n"
        "    app.runnable_now = lambda: runnable\n"
        "    with app.a_share_of_the_cores() as n:\n"
        "        out.append((n, app.torch.get_num_threads()))\n"
        "app.runnable_now = lambda: 1\n"
        "with app.a_share_of_the_cores() as a:\n"
        "    with app.a_share_of_the_cores() as b:\n"
        "        out.append((a, b))\n"
        "print(out)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("SERVELAB_DEVICE", "SERVELAB_INFERENCE_WORKERS")}
    proc = subprocess.run([sys.executable, "-c", code, str(paths.REPO_ROOT / "fastapi_pt" / "app.py")],
                          env={**env, "SERVELAB_DEVICE": "cpu"}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[(4, 4), (4, 4), (1, 1), (4, 2)]", proc.stdout


def test_the_onnx_app_refuses_a_workers_count_that_is_not_a_number(built_models, monkeypatch):
    with pytest.raises(ValueError):
        _onnx_app(monkeypatch, 2, "zero")


def test_the_onnx_app_sizes_threads_for_the_device_its_session_got(built_models, monkeypatch):
    """CUDA listed, the CUDA provider failed to load (ONNX Runtime then runs on the CPU): the app
    must size its threads for the CPU, one inference per core, not one at a time as on a GPU."""
    app = _onnx_app(monkeypatch, 2, cuda_fails_to_load=True)
    assert app.device == "cpu"
    assert (app.WORKERS, app.CORES) == (2, 2)
    assert sorted(app.sessions) == [1, 2]
    assert all(s.get_providers() == ["CPUExecutionProvider"] for s in app.sessions.values())


@pytest.mark.parametrize("kind", ["demo", "trained"])
def test_responses_say_trained_only_for_a_trained_build(tmp_path, kind):
    """The stamp `servelab models build` places beside each model file decides what every response says."""
    from servelab.serve import models

    src, dest = tmp_path / "food11.onnx", tmp_path / "placed" / "food11.onnx"
    src.write_bytes(b"model")
    info = {"weights_kind": kind, "sha256": {"food11.onnx": models._sha256(src)}, "built_at": "now",
            "fingerprint": {"weights": {"kind": kind} if kind == "demo" else {"kind": kind, "source": "x.pth"}}}
    assert models._place(src, dest, info)
    fields = food11.model_info(dest).response_fields()
    assert fields["weights_kind"] == kind
    assert bool(re.search(r"\btrained\b", fields["note"])) == (kind == "trained")
