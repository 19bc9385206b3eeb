"""The real Triton 2.51 on a laptop: the binary inside nvidia-pytriton 0.7.0.

API summary (``from servelab import triton``)
---------------------------------------------
Start / stop (a real ``tritonserver`` process; ports default to the lab's)::

    with triton.running(models=None, http_port=8000, grpc_port=8001,
                        metrics_port=8002) as t:
        t.http_url      # "http://127.0.0.1:8000"
        t.url           # "127.0.0.1:8000"  (TRITON_SERVER_URL style, tritonclient.http)
        t.grpc_url      # "127.0.0.1:8001"  (tritonclient.grpc)
        t.metrics_url   # "http://127.0.0.1:8002/metrics"
        t.admin_key     # key for the model-repository API (random per run
                        #   unless TRITON_ADMIN_KEY is set)
        t.notes         # what was adapted locally (KIND_GPU -> KIND_CPU, ONNX runner)
        t.reload_model("food_classifier", triton.set_instances(2))   # 2 copies, kind kept
        t.model_config(name), t.snapshot(name), t.stub_processes(name),
        t.wait_for_stubs(name, count), t.log_tail()

    t = triton.start(...); ...; t.stop()      # same thing without ``with``
    triton.stop_running(http_port=8000)        # stop one started elsewhere

Reload (explicit model control, over gRPC with the admin key):
``triton.reload_model(name, edit, server=None, grpc_url=None, admin_key=None)``
returns the config Triton now reports (see :mod:`servelab.triton.control`).

Statistics are cumulative (they survive reloads)::

    before = triton.snapshot(t.url, m)          # or t.snapshot(m)
    d = triton.stats_delta(before, triton.snapshot(t.url, m))
    d["requests"], d["inferences"], d["executions"], d["avg_batch_size"],
    d["batch_histogram"], d["per_request_ms"]["queue"], d["per_batch_ms"]

(:mod:`servelab.triton.stats`; the load generator's ``TritonObserver`` puts
the same delta in ``Result.server``.)

Configs: ``load_config(path)``, ``config_to_dict``, ``describe_config``,
``localize_config`` (the local adaptations), ``build_repository`` (the
runtime repository), all on Triton's own ``ModelConfig`` protobuf schema.

perf_analyzer: :mod:`servelab.triton.perf` (``perf_analyzer_env``, ``install_shim``, ``run``).

``start(repo=None, *, models=None, host="127.0.0.1", http_port, grpc_port,
metrics_port, admin_key=None, workdir=None, exit_timeout=3, timeout=240)``
builds a runtime repository under ``workdir`` (a temp folder by default,
removed at stop) from ``repo`` (default models_staging/), waits until every
model is READY and writes ``build/triton/run-<http_port>.json`` (mode 0600:
ports, PID, admin key) so ``servelab triton reload/status/stop`` in another
shell can find it. ``stop()`` unloads the models, SIGTERMs the server, then
reaps any stub process left (by PID) and the run's ``/dev/shm`` regions.
A server started from the main thread also stops when its owner dies.

Modules: ``install`` (the binary, defaults), ``config``, ``repository``,
``process`` (stubs, shutdown, state files), ``server``, ``control``
(reload), ``stats``, ``cli`` (``servelab triton ACTION``).

What "local" changes, said plainly in the output
------------------------------------------------
* ``KIND_GPU`` instance groups become ``KIND_CPU`` when the machine has no GPU.
* The binary has no onnxruntime backend: a model whose config says
  ``backend: "onnxruntime"`` runs on the Python backend through servelab's
  runner (``servelab/triton_runner/onnx_model.py``) built on onnxruntime,
  honouring the same IO names, ``max_batch_size``, ``instance_group`` and
  ``dynamic_batching``. models_staging/ keeps the onnxruntime config the
  container uses.
* No OpenMP wait policy is set (library default: spin briefly, then sleep);
  a model instance alone uses every core, busy instances share them
  (``models_staging/food_classifier/1/core_share.py``; the ONNX runner's: ``servelab/serve/threads.py``).
* Everything listens on 127.0.0.1; the model-repository API (load/unload)
  requires the admin key over HTTP (header ``admin-key``) and gRPC (header
  ``triton-grpc-protocol-admin-key``).
"""

from servelab.triton.cli import add_parser
from servelab.triton.config import (
    ONNX_FILE_PARAMETER,
    RUNNER_PARAMETER,
    Edit,
    apply_edit,
    batch_sizes_to_warm,
    config_to_dict,
    config_to_text,
    describe_config,
    dict_to_config,
    is_onnx_config,
    is_runner_config,
    load_config,
    localize_config,
    parse_config_text,
    set_instances,
    warmed_sizes,
)
from servelab.triton.control import instance_count, model_config, reload_model
from servelab.triton.install import (
    ADMIN_KEY_ENV,
    DEFAULT_GRPC_PORT,
    DEFAULT_HOST,
    DEFAULT_HTTP_PORT,
    DEFAULT_METRICS_PORT,
    EXIT_TIMEOUT_S,
    GRPC_ADMIN_HEADER,
    HTTP_ADMIN_HEADER,
    TritonError,
    TritonInstall,
    find_install,
    gpu_count,
)
from servelab.triton.process import StubProcess, stub_processes
from servelab.triton.repository import build_repository, prepare_backends, sync_model
from servelab.triton.server import TritonServer, free_ports, running, start, stop_running
from servelab.triton.state import read_state, state_path
from servelab.triton.stats import snapshot, stats_delta

__all__ = [
    "ADMIN_KEY_ENV", "DEFAULT_GRPC_PORT", "DEFAULT_HOST", "DEFAULT_HTTP_PORT", "DEFAULT_METRICS_PORT",
    "EXIT_TIMEOUT_S", "GRPC_ADMIN_HEADER", "HTTP_ADMIN_HEADER", "ONNX_FILE_PARAMETER", "RUNNER_PARAMETER",
    "Edit", "StubProcess", "TritonError", "TritonInstall", "TritonServer", "add_parser", "apply_edit",
    "batch_sizes_to_warm", "build_repository", "config_to_dict", "config_to_text", "describe_config", "dict_to_config",
    "find_install", "gpu_count", "is_onnx_config", "is_runner_config", "load_config", "localize_config",
    "instance_count", "model_config", "parse_config_text", "prepare_backends", "read_state", "reload_model",
    "free_ports", "running", "set_instances", "snapshot", "start", "state_path", "stats_delta", "stop_running", "stub_processes", "sync_model",
    "warmed_sizes",
]
