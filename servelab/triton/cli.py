"""Command line: ``servelab triton ACTION`` (or ``python -m servelab.triton ACTION``).

``start`` (foreground, Ctrl-C stops), ``stop``, ``status``, ``reload MODEL
[--count N --kind K --dynamic-batching --max-queue-delay-us N
--preferred-batch-size N.. --no-dynamic-batching --set PBTXT]``, ``config``,
``stats``, ``env`` (perf_analyzer exports), ``setup`` (perf_analyzer shim),
``perf -- ARGS`` (run perf_analyzer, print a table), ``analyzer-node-config``
(write Model Analyzer's profile config for the node, docker/analyzer/).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Sequence

from servelab.core import paths, procs
from servelab.triton import install, stats
from servelab.triton.config import apply_edit, describe_config, fragment_to_edit, set_instances
from servelab.triton.control import model_config, reload_model
from servelab.triton.process import stub_processes
from servelab.triton.server import start, stop_running
from servelab.triton.state import read_state


def add_parser(sub) -> None:
    p = sub.add_parser("triton", help="the real Triton 2.51 locally: start, reload, perf_analyzer",
                       description="Run the lab's Triton locally from the nvidia-pytriton binary.")
    tsub = p.add_subparsers(dest="triton_command", metavar="ACTION")
    tsub.required = True

    def ports(q, grpc=True):
        q.add_argument("--http-port", type=int, default=install.DEFAULT_HTTP_PORT)
        if grpc:
            q.add_argument("--grpc-port", type=int, default=install.DEFAULT_GRPC_PORT)

    s = tsub.add_parser("start", help="start Triton in the foreground (Ctrl-C stops it)")
    ports(s)
    s.add_argument("--metrics-port", type=int, default=install.DEFAULT_METRICS_PORT)
    s.add_argument("--host", default=install.DEFAULT_HOST, help="address to bind (default 127.0.0.1)")
    s.add_argument("--repo", type=Path, default=None, help=f"lab model repository (default {paths.MODELS_STAGING})")
    s.add_argument("--models", default="", help="comma-separated models to load (default: all)")
    s.add_argument("--workdir", type=Path, default=None,
                   help="where the runtime repository and log go (default build/triton/<http-port>)")
    s.add_argument("--exit-timeout", type=int, default=install.EXIT_TIMEOUT_S)
    s.add_argument("--log-verbose", type=int, default=0)
    s.set_defaults(func=_cmd_start)

    st = tsub.add_parser("stop", help="stop a local Triton started from another shell")
    ports(st, grpc=False)
    st.set_defaults(func=_cmd_stop)

    stat = tsub.add_parser("status", help="models, readiness, configs and stub processes of a local Triton")
    ports(stat, grpc=False)
    stat.set_defaults(func=_cmd_status)

    r = tsub.add_parser("reload", help="edit a model's config, reload it over gRPC, show what Triton reports",
                        description="With no edit options: re-read models_staging/<model>/ (config.pbtxt and "
                                    "model.py) and reload. Options edit the running config.")
    r.add_argument("model")
    r.add_argument("--grpc-url", default=None, help="host:port (default 127.0.0.1:8001)")
    r.add_argument("--admin-key", default=None, help=f"default ${install.ADMIN_KEY_ENV} or the local state file")
    r.add_argument("--count", type=int, help="instance_group count")
    r.add_argument("--kind", choices=["KIND_CPU", "KIND_GPU", "KIND_AUTO"], help="instance_group kind")
    r.add_argument("--gpus", default=None, help="instance_group gpus, e.g. 0,1")
    r.add_argument("--dynamic-batching", action="store_true", help="turn dynamic batching on")
    r.add_argument("--max-queue-delay-us", type=int, help="dynamic_batching max_queue_delay_microseconds")
    r.add_argument("--preferred-batch-size", type=int, nargs="+", help="dynamic_batching preferred_batch_size")
    r.add_argument("--no-dynamic-batching", action="store_true", help="turn dynamic batching off")
    r.add_argument("--set", dest="fragment", default=None,
                   help="a config.pbtxt fragment replacing top-level fields, e.g. 'max_batch_size: 8'")
    r.set_defaults(func=_cmd_reload)

    c = tsub.add_parser("config", help="print the config Triton reports for a model")
    c.add_argument("model")
    c.add_argument("--grpc-url", default=f"{install.DEFAULT_HOST}:{install.DEFAULT_GRPC_PORT}")
    c.set_defaults(func=_cmd_config)

    sts = tsub.add_parser("stats", help="print a model's cumulative statistics (batch sizes, queue, compute)")
    sts.add_argument("model")
    sts.add_argument("--url", default=f"http://{install.DEFAULT_HOST}:{install.DEFAULT_HTTP_PORT}")
    sts.set_defaults(func=_cmd_stats)

    e = tsub.add_parser("env", help="print shell exports that let perf_analyzer start "
                                    "(eval \"$(python -m servelab triton env)\")")
    e.set_defaults(func=_cmd_env)

    su = tsub.add_parser("setup", help="install the perf_analyzer shim in the venv and check the Triton binary")
    su.set_defaults(func=_cmd_setup)

    pa = tsub.add_parser("perf", help="run perf_analyzer and print its figures as a table",
                         description="Everything after `--` goes to perf_analyzer, e.g. "
                                     "servelab triton perf -- -m food_classifier --input-data input.json "
                                     "-b 1 --concurrency-range 8")
    pa.add_argument("--csv", type=Path, default=None, help="also write perf_analyzer's -f CSV here")
    pa.add_argument("--json", action="store_true", help="print the parsed figures as JSON")
    pa.add_argument("args", nargs="*", help="perf_analyzer arguments (after --)")
    pa.set_defaults(func=_cmd_perf)

    an = tsub.add_parser("analyzer-node-config",
                         help="write docker/analyzer/<model>.yaml and <model>.cpu.yaml, Model Analyzer's config on the node "
                              "and on a Docker host without a GPU (remote mode)")
    an.set_defaults(func=_cmd_analyzer_node_config)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _cmd_start(args) -> int:
    workdir = args.workdir or (paths.BUILD_DIR / "triton" / str(args.http_port))
    models = [m for m in args.models.split(",") if m] or None
    print("Starting the real Triton 2.51 (nvidia-pytriton) ...", flush=True)
    # SIGTERM (e.g. from `servelab down`) stops the server as cleanly as Ctrl-C.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        server = start(args.repo, models=models, host=args.host, http_port=args.http_port,
                       grpc_port=args.grpc_port, metrics_port=args.metrics_port, workdir=workdir,
                       exit_timeout=args.exit_timeout, log_verbose=args.log_verbose)
    except (install.TritonError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    try:
        print(server.summary())
        print(f"  admin key for the model-repository API: export {install.ADMIN_KEY_ENV}={server.admin_key}")
        print("Ready. Ctrl-C stops it.", flush=True)
        while server.alive():
            time.sleep(0.5)
        print(f"tritonserver exited with code {server.proc.returncode}:\n{server.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping Triton ...", flush=True)
        return 0
    finally:
        forced = server.stop()
        if forced:
            print("cleaned up: " + ", ".join(forced))
        print("stopped.", flush=True)


def _cmd_stop(args) -> int:
    if stop_running(args.http_port):
        print(f"stopped the local Triton on port {args.http_port}")
        return 0
    print(f"no local Triton started by servelab is running on port {args.http_port}")
    return 1


def _cmd_status(args) -> int:
    state = read_state(http_port=args.http_port)
    if state is None:
        print(f"no local Triton started by servelab on port {args.http_port}")
        return 1
    http = f"http://{state['host']}:{state['http_port']}"
    print(f"pid {state['pid']}  HTTP {http}  gRPC {state['host']}:{state['grpc_port']}  "
          f"metrics http://{state['host']}:{state['metrics_port']}/metrics")
    for name in state["models"]:
        ready = procs.http_status(f"{http}/v2/models/{name}/ready") == 200
        try:
            desc = describe_config(model_config(name, f"{state['host']}:{state['grpc_port']}"))
        except Exception as err:  # report it, keep going
            desc = f"{name}: {err}"
        stubs = [s for s in stub_processes(state["pid"], state["shm_prefix"]) if s.model == name]
        print(f"  {'READY' if ready else 'not ready'}  {desc}; {len(stubs)} stub process(es)")
    return 0


def _instance_group_edit(args):
    """An edit of the instance group, or None: what is not given (the kind,
    the GPUs, the count) stays as the model's config has it."""
    if args.count is None and not args.kind and args.gpus is None:
        return None
    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
    return set_instances(args.count, args.kind, gpus)


def _dynamic_batching_edit(args) -> dict | None:
    db: dict = {}
    if args.max_queue_delay_us is not None:
        db["max_queue_delay_microseconds"] = args.max_queue_delay_us
    if args.preferred_batch_size:
        db["preferred_batch_size"] = args.preferred_batch_size
    return db if (args.dynamic_batching or db) else None


def _edit_from_args(args):
    """The reload options as one edit (``--set`` fragment last): a dict, or a
    function of the current config when the instance group changes."""
    edit: dict = {}
    db = _dynamic_batching_edit(args)
    if db is not None:
        edit["dynamic_batching"] = db
    if args.no_dynamic_batching:
        edit["dynamic_batching"] = None
    if args.fragment:
        for key, value in fragment_to_edit(args.fragment, "--set").items():
            if value != {} or key not in edit:  # an empty block keeps the options' fields
                edit[key] = value
    group = _instance_group_edit(args)
    if group is None:
        return edit
    return lambda cfg: apply_edit(apply_edit(cfg, group), edit)


def _cmd_reload(args) -> int:
    try:
        edit = _edit_from_args(args)
        reported = reload_model(args.model, edit or None, grpc_url=args.grpc_url, admin_key=args.admin_key)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # tritonclient raises its own exception type
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(reported, indent=2))
    return 0


def _cmd_config(args) -> int:
    print(json.dumps(model_config(args.model, args.grpc_url), indent=2))
    return 0


def _cmd_stats(args) -> int:
    snap = stats.snapshot(args.url, args.model)
    print(json.dumps(snap, indent=2))
    delta = stats.stats_delta({}, snap)
    print(f"\n{args.model}: {delta['inferences']} inferences in {delta['executions']} executions "
          f"(average batch {delta['avg_batch_size'] or 0:.2f}); batch sizes {delta['batch_histogram']}")
    return 0


def _cmd_env(args) -> int:
    from servelab.triton import perf

    try:
        print(perf.shell_exports(), end="")
    except perf.PerfAnalyzerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def _cmd_setup(args) -> int:
    from servelab.triton import perf

    found = install.find_install()
    print(f"tritonserver: {found.server}")
    print(f"Python-backend stub for Python {sys.version_info[0]}.{sys.version_info[1]}: {found.stub()}")
    try:
        changed = perf.install_shim()
        print("\n".join(changed) if changed else f"perf_analyzer shim already in place: {perf.venv_bin()}")
        print(f"perf_analyzer: {perf.check()}")
    except perf.PerfAnalyzerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print("Note: this Triton binary has no onnxruntime backend; ONNX models run through servelab's "
          "onnxruntime runner on the Python backend (same config.pbtxt).")
    return 0


def _cmd_perf(args) -> int:
    from servelab.triton import perf

    try:
        result = perf.run(args.args, csv_path=args.csv, check=False)
    except perf.PerfAnalyzerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"results": result.results, "csv": result.csv_rows}, indent=2))
        if not result.ok:   # stdout stays JSON; what perf_analyzer said goes to stderr
            print(f"perf_analyzer exited with {result.returncode}:\n{result.output[-3000:]}", file=sys.stderr)
    else:
        print(result.output)
        if result.results:
            print(result.table())
    return 0 if result.ok else (result.returncode or 1)


def _cmd_analyzer_node_config(args) -> int:
    from servelab.triton import analyzer

    print(analyzer.write_node_config())
    print(analyzer.write_node_config(analyzer.NODE_CONFIG_CPU, kind="KIND_CPU"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m servelab.triton ACTION ...`` (same as ``servelab triton ACTION ...``)."""
    from servelab import cli

    return cli.run_alone("servelab.triton", "triton", None if argv is None else list(argv))
