"""Live reconfiguration through Triton's repository API: instance count,
dynamic batching (observable in the statistics), the sticky override, the
CLI; then a clean shutdown."""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from servelab.core import procs
from servelab.triton import (
    ADMIN_KEY_ENV,
    GRPC_ADMIN_HEADER,
    batch_sizes_to_warm,
    gpu_count,
    instance_count,
    load_config,
    perf,
    reload_model,
    stats,
    stats_delta,
    warmed_sizes,
)
from servelab.triton.process import _stub_from

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module")
def triton(start_triton):
    server = start_triton()
    yield server
    server.stop()


def test_instance_count_reload_shows_in_config_and_processes(triton):
    assert len(triton.stub_processes("food_classifier")) == 1
    reported = triton.reload_model("food_classifier", {"instance_group": [{"count": 2, "kind": "KIND_GPU"}]})
    # Without a GPU KIND_GPU is mapped to KIND_CPU, count kept; with GPUs it stays,
    # two copies on each (no `gpus` listed: every GPU).
    gpus = gpu_count()
    assert [(g["count"], g["kind"]) for g in reported["instance_group"]] == [(2, "KIND_GPU" if gpus else "KIND_CPU")]
    copies = instance_count(reported)
    assert copies == 2 * max(1, gpus)
    # The reload returns once the replaced instance has exited (Triton answers as
    # soon as the new ones are READY; an old stub exiting during a timed run slows it).
    stubs = triton.stub_processes("food_classifier")
    assert len(stubs) == copies
    assert sorted(s.instance for s in stubs) == [f"food_classifier_0_{i}" for i in range(copies)]
    # The runtime file says the same as Triton.
    on_disk = load_config(triton.repo / "food_classifier")
    assert on_disk.instance_group[0].count == 2
    assert triton.http_client().is_model_ready("food_classifier")


def _infer_images(url, images, errors, results, index):
    client = httpclient.InferenceServerClient(url)
    inp = httpclient.InferInput("INPUT_IMAGE", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[images[index]]], dtype=object))
    try:
        result = client.infer("food_classifier", [inp])
        results[index] = result.as_numpy("FOOD_LABEL").reshape(-1)[0].decode()
    except InferenceServerException as err:
        errors[index] = err


def test_bad_image_in_a_dynamic_batch_fails_alone(triton, sample_b64, reference):
    # Two instances from the previous test, now with dynamic batching (which
    # waits up to 200 ms to group requests, so concurrent ones share a batch).
    triton.reload_model("food_classifier", "dynamic_batching { max_queue_delay_microseconds: 200000 }")
    names = reference["names"]
    images = [sample_b64[n] for n in names]
    bad_at = 2
    images.insert(bad_at, base64.b64encode(b"GIF89a but not really an image"))
    before = triton.snapshot("food_classifier")
    errors, results = [None] * len(images), [None] * len(images)
    threads = [threading.Thread(target=_infer_images, args=(triton.url, images, errors, results, i))
               for i in range(len(images))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    # Triton counts a request a moment after its response left: read once the counts stand still
    after = stats.settled(triton.url, "food_classifier", at_least=stats.success(before) + len(images) - 1)
    delta = stats_delta(before, after)
    assert errors[bad_at] is not None and errors[bad_at].status() == "400"
    assert "not_an_image" in errors[bad_at].message()
    good = [r for i, r in enumerate(results) if i != bad_at]
    assert good == [reference["pt"][n].label for n in names]
    assert all(e is None for i, e in enumerate(errors) if i != bad_at)
    # The requests really were served together (the bad one included).
    assert max(delta["batch_histogram"]) > 1, delta
    # model.py logs through pb_utils.Logger, which can reach the log after the responses (CI, 2026-11-30)
    triton.wait_for_log("served a batch of")


def test_dynamic_batching_under_poisson_load_with_perf_analyzer(triton):
    model = "food_classifier_onnx"
    assert "dynamic_batching" not in triton.model_config(model)
    reported = triton.reload_model(model, {"dynamic_batching": {"max_queue_delay_microseconds": 20000}})
    assert int(reported["dynamic_batching"]["max_queue_delay_microseconds"]) == 20000
    before = triton.snapshot(model)
    run = perf.run(
        f"-u {triton.url} -m {model} -b 1 --shape input:3,224,224 --request-rate-range 80 "
        "--request-distribution poisson --measurement-mode count_windows --measurement-request-count 40 "
        "--stability-percentage 999 --max-trials 3", timeout=180)
    delta = stats_delta(before, triton.snapshot(model))
    assert run.ok
    assert delta["failures"] == 0
    assert max(delta["batch_histogram"]) > 1, delta
    assert delta["avg_batch_size"] > 1.0
    assert run.results[0]["server"]["avg_batch"] > 1.0


def test_an_override_sticks_until_the_files_change(triton):
    model = "food_classifier_onnx"
    # Like the lab's container: send the config with load_model (no file access).
    edit = {"max_batch_size": 8, "dynamic_batching": {"preferred_batch_size": [8]}}
    reported = reload_model(model, edit, grpc_url=triton.grpc_url,
                            admin_key=triton.admin_key, via="override", verbose=False)
    assert reported["max_batch_size"] == 8
    # A plain load_model does not go back to the file ...
    client = triton.grpc_client()
    client.load_model(model, headers={GRPC_ADMIN_HEADER: triton.admin_key})
    assert triton.model_config(model)["max_batch_size"] == 8
    # ... the helper's re-sync from models_staging/ does (it rewrites the file).
    reported = triton.reload_model(model)
    assert reported["max_batch_size"] == 16
    assert "dynamic_batching" not in reported  # models_staging has none


def test_reload_from_files_on_a_server_it_did_not_start_drops_a_sticky_override(triton, monkeypatch):
    """The compose check (2026-11-27): after notebook 6a's rollout (version policies sent as
    overrides), the Jupyter container's reload_from_files, a plain load_model, kept the override:
    6a's "put the policy back" printed versions [1, 2] and 6b's last check found the model changed."""
    import servelab.triton as local_triton
    from servelab.course import lab

    model = "food_classifier_onnx"
    reload_model(model, {"max_batch_size": 8}, grpc_url=triton.grpc_url, admin_key=triton.admin_key,
                 via="override", verbose=False)
    assert triton.model_config(model)["max_batch_size"] == 8
    # as in the container: a server this process knows nothing about (no local state to re-sync from)
    monkeypatch.setattr(local_triton, "read_state", lambda **kw: None)
    reported = lab.reload_from_files(model, triton.grpc_url, triton.admin_key)
    assert reported["max_batch_size"] == 16 and triton.model_config(model)["max_batch_size"] == 16


def test_warm_copies_runs_the_preferred_batch_sizes(triton):
    """The kit's warm-up (lab.warm_copies) sends each batch size the batcher aims for
    (every size on a GPU; on the CPU the preferred ones), as whole client batches."""
    from servelab.course import lab

    model = "food_classifier_onnx"
    reported = triton.reload_model(model, {"dynamic_batching": {"preferred_batch_size": [3]}})
    before = triton.snapshot(model)
    lab.warm_copies(triton.url, model, reported)
    delta = stats_delta(before, triton.snapshot(model))
    assert delta["failures"] == 0
    # Batch 1 is the config's model_warmup (Triton ran it while loading): not sent again.
    assert warmed_sizes(reported) == {1} and 1 not in delta["batch_histogram"], delta
    assert set(batch_sizes_to_warm(reported)) <= set(delta["batch_histogram"]) | warmed_sizes(reported), delta
    assert 3 in delta["batch_histogram"]
    triton.reload_model(model)  # back to models_staging/ (no batching)


def test_a_refused_reload_leaves_the_file_as_it_was(triton):
    model = "food_classifier_onnx"
    before = (triton.repo / model / "config.pbtxt").read_text()
    with pytest.raises(InferenceServerException):
        reload_model(model, {"max_batch_size": 4}, grpc_url=triton.grpc_url, admin_key="nope",
                     repo=triton.repo, source=triton.source, gpus=0, via="file", verbose=False)
    assert (triton.repo / model / "config.pbtxt").read_text() == before
    assert triton.model_config(model)["max_batch_size"] == 16


def test_precision_fp16_is_a_reload_away_and_an_unknown_one_is_refused(triton, sample_b64, reference):
    """Issue 49: food_classifier's config parameter precision. fp16 (what a GPU copy on the node would
    use; torch computes FP16 on the CPU too) reloads, Triton's log names it, and the labels stay the
    same; a value model.py does not know fails the load with the parameter's name, and the copies
    already loaded keep serving."""
    names = reference["names"]

    def labels(names):
        images = [sample_b64[n] for n in names]
        errors, results = [None] * len(images), [None] * len(images)
        for i in range(len(images)):
            _infer_images(triton.url, images, errors, results, i)
        assert errors == [None] * len(images), errors
        return results

    try:
        triton.reload_model("food_classifier", {"parameters": {"precision": {"string_value": "fp16"}}})
        triton.wait_for_log("food_classifier_0_0: fp16 on cpu")
        assert labels(names) == [reference["pt"][n].label for n in names]
        with pytest.raises(Exception, match='parameter precision is "int8": use "fp32" or "fp16"'):
            triton.reload_model("food_classifier", {"parameters": {"precision": {"string_value": "int8"}}})
        # still served, by the fp16 copies (one photo: an FP16 pass on a CPU is slow)
        assert labels(names[:1]) == [reference["pt"][names[0]].label]
    finally:
        triton.reload_model("food_classifier", {"parameters": {"precision": {"string_value": "fp32"}}})


def test_reload_cli_finds_the_server_and_its_key(triton):
    """`servelab triton reload` from another process: the key comes from the
    state file the server wrote (mode 0600)."""
    assert triton.state_file is not None and oct(triton.state_file.stat().st_mode & 0o777) == "0o600"
    cmd = [str(procs.venv_bin() / "python"), "-m", "servelab.triton", "reload", "food_classifier_onnx",
           "--grpc-url", triton.grpc_url, "--dynamic-batching", "--preferred-batch-size", "4", "8"]
    env = procs.child_env()
    env.pop(ADMIN_KEY_ENV, None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "dynamic_batching on" in proc.stdout
    reported = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert [int(x) for x in reported["dynamic_batching"]["preferred_batch_size"]] == [4, 8]
    status = subprocess.run([*cmd[:3], "status", "--http-port", str(triton.http_port)],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "READY" in status.stdout and "2 stub process(es)" in status.stdout
    # A typo is caught by the schema before anything reaches the server.
    bad = subprocess.run([*cmd[:5], "--grpc-url", triton.grpc_url, "--set", "max_batch_sise: 4"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "max_batch_sise" in bad.stderr


def test_stop_is_clean(triton):
    stubs = triton.stub_processes()
    assert stubs
    pid, prefix, state = triton.pid, triton.shm_prefix, triton.state_file
    assert list(Path("/dev/shm").glob(f"{prefix}*"))
    t0 = time.monotonic()
    forced = triton.stop()
    assert time.monotonic() - t0 < 30
    # nothing had to be killed or removed by force, unless tritonserver itself crashed while stopping
    # (SIGSEGV once in CI, 2026-11-28): then the kit reaped what it left, and stop() says so
    crashed = [f for f in forced if f.startswith(f"tritonserver {pid} crashed (")]
    assert forced == [] or (crashed and all(f.startswith(("stub ", "shm ")) for f in forced if f not in crashed)), forced
    assert not Path(f"/proc/{pid}").exists()
    for stub in stubs:
        assert not Path(f"/proc/{stub.pid}").exists() or _stub_from(stub.pid) is None
    assert not list(Path("/dev/shm").glob(f"{prefix}*"))
    assert not state.exists()
    for port in (triton.http_port, triton.grpc_port, triton.metrics_port):
        assert procs.port_is_free(port)
