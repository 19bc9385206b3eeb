"""What the lab's notebooks import: ``from servelab.course.lab import check, ...``.

The measurement notebooks (4_fastapi, 6_triton) call these helpers. Stdlib
only at import time: they also run inside the lab's Jupyter containers, which
see the kit (``servelab/``) from the mounted clone. The notebooks are built
from their sources by :mod:`servelab.course.notebooks`.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

CHECK_PASS = "✔ as expected"
CHECK_FAIL = "✘ not what the lesson predicts"


CHECK_INCONCLUSIVE = "? inconclusive: the machine was busy"

# How far apart two runs of a lone request (concurrency 1) read on a shared 2-core VM,
# with nothing else on it: 24 back-to-back perf_analyzer runs of one copy read 21.6-31.9
# infer/s (x1.48; its compute time 30-45 ms), and 1 instance / 2 read x0.73-1.28 in median
# latency over 8 tours. The host's other tenants do this, unseen from inside the VM. A
# check that "a second copy buys nothing at one client" therefore allows no gain beyond
# this spread; the wrong lesson it guards against reads x2.
LONE_REQUEST_SPREAD = 1.5


def _validity(run) -> dict:
    """A bench ``Result``'s validity, or a perf_analyzer figures dict's (``show``)."""
    v = run.get("validity") if isinstance(run, dict) else getattr(run, "validity", None)
    return v or {}


def _valid(run) -> bool:
    return bool(_validity(run).get("valid", True))


def check(passed: bool, expected: str, measured: str, runs=()) -> None:
    """Tell the learner whether a measurement shows what it should (prints one ✔ or ✘ line).

    ``runs``: the ``servelab.bench`` results (or perf_analyzer figures from
    the notebook's ``show``) the check rests on; when one of
    them is invalid (the client missed its schedule, or other work took the
    CPU) the line says *inconclusive* instead: that run is not evidence."""
    bad = [r for r in runs if not _valid(r)]
    if bad:
        why = "; ".join(", ".join(_validity(r).get("reasons", [])) for r in bad[:2])
        print(f"{CHECK_INCONCLUSIVE}: {expected}\n    measured: {measured}\n    not evidence: {why}")
        print("    (run the cell again when the machine is quieter)")
        return
    mark = CHECK_PASS if passed else CHECK_FAIL
    print(f"{mark}: {expected}\n    measured: {measured}")
    if not passed:
        print("    (a busy machine or very few requests can do this: run the cell again, or compare with the answer key)")


def decode_seconds(image_b64: str, repeats: int = 5) -> float:
    """Median time (s) to decode and preprocess one base64 image the way the
    services do (``food11.preprocess_base64``), on this machine's CPU: the part
    of a request a GPU service runs outside its inference slot."""
    from servelab.core import food11

    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        food11.preprocess_base64(image_b64)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def client_batch_cap(single_throughput: float, input_json) -> float:
    """The most a client batch can gain on the Python-backend model, whatever
    the device: the model decodes every image of a batch on the CPU, one after
    another, so a request of ``b`` images costs at least ``b`` decodes. With
    ``S`` = 1 / ``single_throughput`` (one image per request, one in flight) and
    ``D`` one decode of the image in ``input_json`` (perf_analyzer's input
    file) measured here, images per second can grow at most ``S / D`` times."""
    with open(input_json, encoding="utf-8") as f:
        image = json.load(f)["data"][0]["INPUT_IMAGE"]["content"][0]
    return (1.0 / single_throughput) / decode_seconds(image)


def warm_copies(triton_url: str, model: str, config: dict) -> None:
    """Send a few unmeasured requests to every copy of a model Triton has just
    (re)loaded, ``config`` being what Triton reports: a new copy is slow on its
    first requests (it allocates, initializes its device, pages its weights in),
    and that is not what a measurement is meant to show."""
    from servelab import bench
    from servelab.triton.config import instance_count, warmed_sizes

    copies = instance_count(config)
    if 1 not in warmed_sizes(config):  # model_warmup in the config: Triton did it while loading
        bench.warm(bench.triton_target(triton_url, model), requests=2 * copies, concurrency=copies)
    warm_batches(triton_url, model, config)


def warm_batches(triton_url: str, model: str, config: dict) -> None:
    """Run, on every copy, each batch size larger than 1 that the dynamic
    batcher can form (``triton.config.batch_sizes_to_warm``: every size on a
    GPU, where the first batch of a new size pays for kernel selection; only
    the preferred sizes on the CPU). Each request carries a whole batch."""
    from servelab import bench
    from servelab.triton.config import batch_sizes_to_warm, instance_count, warmed_sizes

    copies = instance_count(config)
    for size in batch_sizes_to_warm(config):
        if size > 1 and size not in warmed_sizes(config):  # not what model_warmup already ran
            bench.warm(bench.triton_target(triton_url, model, batch=size), requests=2 * copies, concurrency=copies)


# How the learner makes the one FastAPI server on Chameleon serve each backend (notebook 4),
# typed on node-serve-system. The ONNX image is built ahead by docker/prepare-node.sh.
FASTAPI_STACK = "~/serve-system-chi/docker/docker-compose-fastapi.yaml"
SWAP_TO = {
    "pytorch": f"docker compose -f {FASTAPI_STACK} up -d fastapi_server",
    "onnxruntime": f"FASTAPI_APP=fastapi_onnx docker compose -f {FASTAPI_STACK} up -d --build fastapi_server",
}


def _health(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=5) as r:
            return json.load(r)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def wait_for_backend(url: str, backend: str, timeout_s: float = 300.0, poll_s: float = 5.0,
                     hint: str = "") -> dict:
    """Poll ``url``/health until the server reports ``backend``; return its health JSON.

    Used when the learner swaps the FastAPI container (PyTorch <-> ONNX) on the
    GPU host while the notebook waits. It says at once what it waits for and
    what the server serves now, with the command that swaps it; after
    ``timeout_s`` (5 minutes) it gives up with that command, instead of waiting
    silently.
    """
    deadline = time.monotonic() + timeout_s
    swap = f"On Chameleon, run on node-serve-system: {SWAP_TO[backend]}" if backend in SWAP_TO else ""
    hint = hint or swap
    told = None
    while True:
        last = _health(url)
        now = (last or {}).get("backend") or "no answer"
        if last and now == backend:
            if told is not None:
                print(f"{url} serves {backend} now.", flush=True)
            return last
        if now != told:  # say it again only when what the server answers changes
            print(f"waiting up to {timeout_s / 60:.0f} min for {url}/health to report backend {backend!r} "
                  f"(it says: {now}). {hint}".rstrip(), flush=True)
            told = now
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{url} did not serve {backend} within {timeout_s / 60:.0f} min (last answer: {now}). {hint} "
                "If the container is still building or loading its model (docker logs fastapi_server), "
                "run this cell again.".replace("  ", " "))
        time.sleep(poll_s)


def reload_from_files(model: str, grpc_url: str, admin_key: str | None = None) -> dict:
    """Ask Triton, through its model-repository API, to load ``model`` again
    from its (edited) config.pbtxt; return the config Triton now reports.

    In the lab's Compose stack Triton reads the mounted repository itself: an
    ``unload_model`` then a ``load_model`` call. Why the unload: a model last
    loaded with a config override (notebook 6a's rollout sends its version
    policies that way) keeps that override through a plain ``load_model``, so
    the file would not come back; unloading drops it (Triton 2.51, seen in the
    compose check and in tests/triton/test_reload.py). The model is unavailable
    between the two calls (a second or so). The kit's local Triton serves a
    prepared copy of the repository (GPU groups mapped to CPU, ONNX through a
    runner): there the copy is refreshed from the edited files first.
    """
    host, _, port = grpc_url.rpartition(":")
    if host in ("127.0.0.1", "localhost") and port.isdigit():
        from servelab import triton

        if triton.read_state(grpc_port=int(port)):
            return triton.reload_model(model, grpc_url=grpc_url, admin_key=admin_key, verbose=False)
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        headers = {"triton-grpc-protocol-admin-key": admin_key} if admin_key else None
        client.unload_model(model, headers=headers)  # drops a config override a plain load would keep
        client.load_model(model, headers=headers)
        return client.get_model_config(model, as_json=True)["config"]
    finally:
        client.close()


def _admin_headers(grpc_url: str, admin_key: str | None) -> dict | None:
    """The admin header for Triton's model-repository API: the given key, else a local Triton's."""
    host, _, port = grpc_url.rpartition(":")
    if not admin_key and host in ("127.0.0.1", "localhost") and port.isdigit():
        from servelab import triton

        state = triton.read_state(grpc_port=int(port))
        admin_key = state.get("admin_key") if state else None
    return {"triton-grpc-protocol-admin-key": admin_key} if admin_key else None


def models_in_repository(grpc_url: str, admin_key: str | None = None) -> dict[str, str]:
    """Every model in Triton's repository and its state (``READY``, ``UNAVAILABLE``, ...). The index
    has one entry per version Triton knows of: a model is READY when one of its versions is (a
    version taken out of service, as in notebook 6a's rollout, stays listed as UNAVAILABLE)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        index = client.get_model_repository_index(headers=_admin_headers(grpc_url, admin_key), as_json=True)
    finally:
        client.close()
    states: dict[str, str] = {}
    for m in index.get("models", []):
        if states.get(m["name"]) != "READY":
            states[m["name"]] = m.get("state", "")
    return states


def unload(model: str, grpc_url: str, admin_key: str | None = None, timeout_s: float = 60.0) -> None:
    """Ask Triton to take ``model`` out of service (an admin call); return once it is unloaded
    (``unload_model`` returns as soon as the unloading starts)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        client.unload_model(model, headers=_admin_headers(grpc_url, admin_key))
    finally:
        client.close()
    deadline = time.monotonic() + timeout_s
    while models_in_repository(grpc_url, admin_key).get(model) in ("READY", "UNLOADING"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{model} was not unloaded within {timeout_s:.0f} s")
        time.sleep(0.2)


def _local_triton(grpc_url: str) -> dict | None:
    """The state file of the kit's local Triton on ``grpc_url`` (None for any other Triton)."""
    host, _, port = grpc_url.rpartition(":")
    if host not in ("127.0.0.1", "localhost") or not port.isdigit():
        return None
    from servelab import triton

    return triton.read_state(grpc_port=int(port))


def triton_log_mark(grpc_url: str) -> tuple[str, int] | None:
    """Where Triton's log ends now, for :func:`triton_log_since`: the kit's local Triton
    (its state file names the log); None where this kernel cannot read the log (the
    Compose stack's Triton writes it in its own container)."""
    state = _local_triton(grpc_url)
    if not state or not state.get("log"):
        return None
    from pathlib import Path

    log = Path(state["log"])
    return str(log), log.stat().st_size if log.exists() else 0


def triton_log_since(mark: tuple[str, int] | None, model: str, container: str = "triton_server",
                     wait_for: str | None = None, timeout: float = 10.0) -> str:
    """Triton's log lines about ``model`` (and its errors) written since ``mark``; where
    the log is not readable from here, the command that shows them on the node (Triton's
    ``container`` there).

    A Python-backend model's own lines (``pb_utils.Logger``) reach Triton's log through a
    queue, a moment after the model is READY: ``wait_for`` waits up to ``timeout`` seconds
    for a line holding that text (and returns what there is when none comes)."""
    if mark is None:
        return (f"Triton's log is in its own container: on node-serve-system, "
                f"docker logs {container} 2>&1 | grep {model}")
    import time

    from servelab.triton.control import log_since

    deadline = time.monotonic() + timeout
    lines = log_since(mark[0], mark[1], model)
    while wait_for is not None and wait_for not in lines and time.monotonic() < deadline:
        time.sleep(0.1)
        lines = log_since(mark[0], mark[1], model)
    return lines or f"(Triton logged nothing about {model})"


def remove_model(model: str, repository, grpc_url: str, admin_key: str | None = None) -> None:
    """Take a model the learner added out of Triton's repository again: unload it (an admin
    call, :func:`unload`), then delete its folder ``repository/model``; for the kit's local
    Triton also its translated copy in the runtime repository, so that Triton's repository
    index no longer lists it. The kit's own models are refused (a typo must not delete them)."""
    import shutil
    from pathlib import Path

    from servelab.node import configs

    if not model or model in (".", "..") or "/" in model or "\\" in model:
        raise ValueError(f"{model!r} is not a model folder's name")
    if model in configs.models():
        raise ValueError(f"{model} is one of the kit's own models: it stays in the repository")
    if model in models_in_repository(grpc_url, admin_key):
        unload(model, grpc_url, admin_key)
    folder = Path(repository) / model
    if folder.is_dir():
        shutil.rmtree(folder)
    if _local_triton(grpc_url):
        from servelab.triton.control import forget_model

        forget_model(model, grpc_url)
