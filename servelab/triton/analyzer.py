"""Triton Model Analyzer (``triton-model-analyzer==1.58.0``) run against the kit's
local tritonserver 2.51 and perf_analyzer 2.50, in local launch mode.

Model Analyzer starts a fresh tritonserver for every configuration it measures,
loads one variant of the model's ``config.pbtxt`` into it, drives it with
perf_analyzer at each concurrency, and keeps the best measurement that meets
the constraints (here a p99 budget). This module

* writes its YAML config (:func:`analyzer_config`): local launch mode, the kit's
  binaries, a runtime repository the local binary can serve (the ONNX model
  through the kit's Python-backend runner), the search space as
  ``model_config_parameters`` (a brute search over the listed values), and the
  traps of running it here (see below);
* runs ``model-analyzer profile`` then ``report`` (:func:`profile`), with all
  output under one folder in ``build/model-analyzer/``;
* parses ``export/results/metrics-model-inference.csv`` into rows, each with the
  variant's instance count, max batch size and queue delay read from the config
  Model Analyzer wrote (:func:`results`);
* cleans up after it (:class:`Leftovers`): every process it started (servers,
  stubs, perf_analyzer) is followed while it runs and stopped at the end; the
  shared-memory regions carry a prefix of this run, so exactly those are removed,
  with the core-share locks of its servers.

Traps (the issue-32 spike, and ``model_analyzer/triton/server/server_config.py``):
``triton_server_flags`` becomes ``--key=value`` and a false value is dropped, so
boolean flags cannot be passed (``--disable-auto-complete-config=True`` is refused)
and ``allow-gpu-metrics`` is given as the string ``"false"``; one value per key, so
only one ``backend-config`` (the shm prefix); ``triton_server_environment`` is
perf_analyzer's environment too, so it keeps ``LD_LIBRARY_PATH``.

Admin key: Model Analyzer's client sends no headers, so its server cannot key the
model-repository API (it loads every variant through it), and a keyless load may carry
a ``model.py`` that the server runs. Its private server listens on 127.0.0.1 only, with
shared-memory, logging and trace still behind a fresh key, and Model Analyzer runs in a
network namespace of its own (:mod:`servelab.triton.netns`) with everything it starts: that
127.0.0.1 is theirs alone, so no other process on the machine and no web page can reach
the open API. Where no namespace can be made (user namespaces disabled), :func:`profile`
refuses unless ``SERVELAB_ANALYZER_NO_NETNS=1`` says to run it unprotected. The kit's own
Triton keeps all four APIs keyed.

On the Chameleon node (:func:`node_config`, :func:`node_server_command`; the
``analyzer`` profile of ``docker/docker-compose-analyzer.yaml``): the Triton 24.10
SDK image's own Model Analyzer (1.45.0, the Jupyter image of the Triton stack) runs
in *remote* launch mode. The SDK image has no tritonserver, so local mode cannot run
there. Its server is a Triton of its own (``triton_analyzer``, the kit's Triton image)
that listens on 127.0.0.1 inside its container and publishes no port; the Model
Analyzer container shares that network namespace, so only the two reach it. The
same three APIs stay keyed; the model-repository API is open on that loopback only.
"""

from __future__ import annotations

import csv
import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from servelab.core import paths, procs
from servelab.serve.threads import remove_locks as remove_core_locks
from servelab.triton import netns
from servelab.triton.config import config_to_dict, load_config
from servelab.triton.install import HTTP_ADMIN_HEADER, find_install, server_env
from servelab.triton.process import stub_processes, terminate
from servelab.triton.repository import build_repository, prepare_backends

VERSION = "1.58.0"  # pyproject's `analyzer` extra; 1.45.0 (Triton 24.10's) is not on PyPI
OUTPUT_ROOT = paths.REPO_ROOT / "build" / "model-analyzer"
RESULTS_CSV = Path("export") / "results" / "metrics-model-inference.csv"
SUMMARY = Path("export") / "reports" / "summaries"
# What Model Analyzer's own server keeps behind the key (it cannot send one for the rest).
KEYED_APIS = ("shared-memory", "logging", "trace")
# Set to 1 to run the local profile without a network namespace of its own (docs/SECURITY.md).
NO_NETNS = "SERVELAB_ANALYZER_NO_NETNS"


class AnalyzerError(RuntimeError):
    """Model Analyzer is missing, failed, or left no results."""


@dataclass(frozen=True)
class Space:
    """The configurations to measure: every combination of these values.
    A ``max_batch_size`` of 1 is dynamic batching off (no batch can form); the
    queue delays apply only to sizes above 1. Model Analyzer measures its
    default (the model's config as it is) beside them."""

    instances: Sequence[int] = (1, 2)
    max_batch_sizes: Sequence[int] = (1, 4, 16)
    queue_delays_us: Sequence[int] = (0, 2000)
    concurrency: Sequence[int] = (1, 2, 4, 8, 16)

    def configs(self) -> list[dict]:
        """The variants, as dicts {instances, max_batch_size, queue_delay_us}. Model Analyzer numbers
        its own (``<model>_config_N``) in an order of its choosing: match them by these values,
        which :func:`results` reads back from the configs it wrote."""
        out = []
        for n in self.instances:
            for b in self.max_batch_sizes:
                for d in (self.queue_delays_us if b > 1 else (0,)):
                    out.append({"instances": int(n), "max_batch_size": int(b), "queue_delay_us": int(d)})
        return out


def executable(name: str = "model-analyzer") -> Path:
    """``model-analyzer`` (or ``perf_analyzer``, the kit's shim) on the kit's PATH."""
    found = shutil.which(name, path=procs.child_env()["PATH"])
    if not found:
        raise AnalyzerError(f"{name} is not on the kit's PATH: install the kit's `analyzer` extra "
                            f"(triton-model-analyzer=={VERSION}; `make setup` does).")
    return Path(found)


def _server_environment() -> dict[str, str]:
    """What differs from this process's environment in the kit's tritonserver's:
    the library path (Triton's and perf_analyzer's libraries), PATH with the kit's
    Python first (the stubs' python3), PYTHONPATH to the kit (the ONNX runner)."""
    env = server_env(find_install())
    return {k: v for k, v in env.items() if os.environ.get(k) != v and "$" not in v}


def analyzer_config(model: str, run_dir: Path, repo: Path, backends: Path, space: Space, budget_ms: float,
                    ports: Sequence[int], admin_key: str, shm_prefix: str,
                    perf_flags: dict | None = None, kind: str = "KIND_CPU") -> dict:
    """Model Analyzer's profile config (a dict; JSON is YAML) for a brute search of ``space``."""
    http, grpc, metrics = ports
    restricted = restricted_apis(admin_key)
    return {
        "model_repository": str(repo),
        "output_model_repository_path": str(run_dir / "output_models"),
        "override_output_model_repository": True,
        "checkpoint_directory": str(run_dir / "checkpoints"),
        "export_path": str(run_dir / "export"),
        "triton_launch_mode": "local",
        "triton_server_path": str(find_install().server),
        "perf_analyzer_path": str(executable("perf_analyzer")),  # the kit's shim finds its libraries
        "triton_output_path": str(run_dir / "tritonserver.log"),
        "perf_output": True,
        "perf_output_path": str(run_dir / "perf_analyzer.log"),
        "triton_http_endpoint": f"127.0.0.1:{http}",
        "triton_grpc_endpoint": f"127.0.0.1:{grpc}",
        "triton_metrics_url": f"http://127.0.0.1:{metrics}/metrics",
        "client_protocol": "grpc",
        "triton_server_flags": {
            "backend-directory": str(backends),
            "http-address": "127.0.0.1", "grpc-address": "127.0.0.1", "metrics-address": "127.0.0.1",
            "http-restricted-api": restricted,
            "grpc-restricted-protocol": restricted,
            "backend-config": f"python,shm-region-prefix-name={shm_prefix}",  # one backend-config only
            "allow-gpu-metrics": "false",    # a string: a false value would be dropped
            "exit-timeout-secs": "3",
        },
        "triton_server_environment": _server_environment(),
        **_search(model, space, budget_ms,
                  NODE_CPU_PERF_FLAGS if perf_flags is None and kind == "KIND_CPU" else perf_flags, kind),
    }


def restricted_apis(admin_key: str) -> str:
    """The value of ``--http-restricted-api`` / ``--grpc-restricted-protocol`` for a server
    Model Analyzer talks to: the three APIs it never calls, behind ``admin_key``."""
    return f"{','.join(KEYED_APIS)}:{HTTP_ADMIN_HEADER}={admin_key}"


def _search(model: str, space: Space, budget_ms: float, perf_flags: dict | None, kind: str) -> dict:
    """The part of the profile config that is the same in every launch mode: a brute
    search of ``space`` under a p99 budget, ranked by throughput."""
    return {
        "perf_analyzer_flags": dict(perf_flags or {}),
        "run_config_search_disable": True,    # brute search over the listed values
        "collect_cpu_metrics": True,
        "skip_detailed_reports": False,
        "constraints": {"perf_latency_p99": {"max": float(budget_ms)}},
        "objectives": {"perf_throughput": 10},
        "profile_models": {
            model: {
                "model_config_parameters": {
                    "instance_group": [[{"kind": kind, "count": [int(n) for n in space.instances]}]],
                    "max_batch_size": sorted({c["max_batch_size"] for c in space.configs()}),
                    "dynamic_batching": {
                        "max_queue_delay_microseconds": sorted({int(d) for d in space.queue_delays_us})},
                    # No warm-up samples in the variants: the shipped ones go up to batch 16, and Triton
                    # refuses to load a variant with a smaller max_batch_size ("failed to run warmup
                    # sample 'batch 2'"); Model Analyzer warms each variant up with perf_analyzer.
                    "model_warmup": [[]],
                },
                "parameters": {"concurrency": [int(c) for c in space.concurrency]},
            },
        },
    }


# --------------------------------------------------------------------------
# On the Chameleon node: the SDK image's Model Analyzer, remote launch mode, a private Triton

NODE_MODEL = "food_classifier_onnx"
NODE_SPACE = Space(instances=(1, 2), max_batch_sizes=(1, 8), queue_delays_us=(0, 2000), concurrency=(1, 4, 16))
NODE_BUDGET_MS = 300.0
NODE_CLONE = "/home/jovyan/serve-system-chi"     # the clone inside the Jupyter image (docker-compose-triton.yaml)
NODE_MODELS = "/models"                          # models_staging, bind-mounted read-only
NODE_RUN_DIR = f"build/model-analyzer/node-{NODE_MODEL}"   # relative to the clone: results land in it
NODE_CONFIG = paths.REPO_ROOT / "docker" / "analyzer" / f"{NODE_MODEL}.yaml"
# A Docker host without a GPU (docker-compose-analyzer.cpu.yaml): the same search on KIND_CPU copies,
# measured in 1 s windows (Model Analyzer's default of request-count windows, which it keeps raising
# at 16 clients, took about 4 minutes per configuration on 2 busy cores: 2026-11-27, the compose check).
NODE_CONFIG_CPU = NODE_CONFIG.with_suffix(".cpu.yaml")
NODE_CPU_PERF_FLAGS = {"measurement-mode": "time_windows", "measurement-interval": 1000,
                       "stability-percentage": 25, "max-trials": 6}
NODE_PORTS = (8000, 8001, 8002)                  # inside triton_analyzer's own network namespace


def node_server_command(admin_key: str = "${TRITON_ADMIN_KEY}") -> list[str]:
    """The command of ``triton_analyzer``, the Triton that the SDK image's Model Analyzer
    profiles in remote mode: explicit model control (it loads each variant with a config
    override), nothing loaded at start, every endpoint on 127.0.0.1, the three APIs it
    never calls behind the stack's admin key. ``docker-compose-analyzer.yaml`` holds this
    list; a test keeps the two equal."""
    http, grpc, metrics = NODE_PORTS
    restricted = restricted_apis(admin_key)
    return [
        "tritonserver",
        f"--model-repository={NODE_MODELS}",
        "--model-control-mode=explicit",
        "--exit-on-error=false",
        "--strict-readiness=false",
        "--http-address=127.0.0.1", f"--http-port={http}",
        "--grpc-address=127.0.0.1", f"--grpc-port={grpc}",
        "--metrics-address=127.0.0.1", f"--metrics-port={metrics}",
        f"--http-restricted-api={restricted}",
        f"--grpc-restricted-protocol={restricted}",
        "--exit-timeout-secs=10",
    ]


def node_config(model: str = NODE_MODEL, space: Space = NODE_SPACE, budget_ms: float = NODE_BUDGET_MS,
                perf_flags: dict | None = None, kind: str = "KIND_GPU") -> dict:
    """Model Analyzer's profile config on the node (remote launch mode, paths inside the
    ``model_analyzer`` container). No ``triton_server_flags``: in remote mode Model Analyzer
    starts no server, so the flags are ``triton_analyzer``'s command (:func:`node_server_command`)."""
    http, grpc, metrics = NODE_PORTS
    run_dir = f"{NODE_CLONE}/{NODE_RUN_DIR}"
    return {
        "model_repository": NODE_MODELS,
        "output_model_repository_path": f"{run_dir}/output_models",
        "override_output_model_repository": True,
        "checkpoint_directory": f"{run_dir}/checkpoints",
        "export_path": f"{run_dir}/export",
        "triton_launch_mode": "remote",
        "triton_http_endpoint": f"127.0.0.1:{http}",
        "triton_grpc_endpoint": f"127.0.0.1:{grpc}",
        "triton_metrics_url": f"http://127.0.0.1:{metrics}/metrics",
        "client_protocol": "grpc",
        "perf_output": True,
        "perf_output_path": f"{run_dir}/perf_analyzer.log",
        **_search(model, space, budget_ms,
                  NODE_CPU_PERF_FLAGS if perf_flags is None and kind == "KIND_CPU" else perf_flags, kind),
    }


def write_node_config(path: Path = NODE_CONFIG, kind: str = "KIND_GPU") -> Path:
    """Write :func:`node_config` as the YAML file the ``model_analyzer`` service reads
    (JSON is YAML). It holds no key: the server's key stays in ``docker/.env``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    where = "the node" if kind == "KIND_GPU" else "a Docker host without a GPU (docker-compose-analyzer.cpu.yaml)"
    path.write_text("# Written by `python -m servelab triton analyzer-node-config` (servelab/triton/analyzer.py,\n"
                    f"# node_config): Model Analyzer's profile config on {where}, remote launch mode.\n"
                    + json.dumps(node_config(kind=kind), indent=1) + "\n")
    return path


def launches_locally() -> bool:
    """Whether Model Analyzer can start its own tritonserver here (local launch mode): the kit's
    venv has both. In the node's Jupyter container (the SDK image) it has neither, and notebook 6b
    reads what the node's ``model_analyzer`` service measured (:func:`node_run`)."""
    try:
        executable()
        find_install()
    except Exception:  # no model-analyzer on the kit's PATH, or no tritonserver (pytriton) here
        return False
    return True


def node_run(root: Path | None = None, model: str = NODE_MODEL) -> AnalyzerRun:
    """The results the node's ``model_analyzer`` service wrote (docker-compose-analyzer.yaml), read
    from the clone: ``build/model-analyzer/node-<model>/``. ``seconds`` spans its files' times."""
    run_dir = (root or paths.REPO_ROOT) / NODE_RUN_DIR
    run = AnalyzerRun(model, run_dir, NODE_SPACE, NODE_BUDGET_MS, 0.0, [], run_dir / "perf_analyzer.log")
    if not run.results_csv.is_file():
        raise AnalyzerError(f"no results in {run_dir}: run the node command above first (docker compose ... "
                            "--profile analyzer run --rm model_analyzer), on node-serve-system")
    times = [f.stat().st_mtime for f in run_dir.rglob("*") if f.is_file()]
    run.seconds = max(times) - min(times)
    return run


# --------------------------------------------------------------------------
# Processes it starts, followed while it runs


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


@dataclass
class Leftovers:
    """Every descendant of Model Analyzer (servers, stubs, perf_analyzer), noted while it runs
    (they start in sessions of their own, out of reach of its process group), then stopped."""

    root: int
    shm_prefix: str
    seen: dict[int, tuple[str, str]] = field(default_factory=dict)   # pid -> (start time, argv[0])
    _stop: threading.Event = field(default_factory=threading.Event)

    def scan(self) -> None:
        family = {self.root, *self.seen}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid in family and pid not in self.seen:
                argv = procs.cmdline(pid)
                self.seen[pid] = (_start_time(pid) or "", Path(argv[0]).name if argv else "?")
                family.add(pid)

    def follow(self, every_s: float = 0.3) -> threading.Thread:
        def loop():
            while not self._stop.is_set():
                self.scan()
                self._stop.wait(every_s)
        thread = threading.Thread(target=loop, name=f"analyzer-follow-{self.root}", daemon=True)
        thread.start()
        return thread

    def servers(self) -> list[int]:
        return [p for p, (_, name) in self.seen.items() if name == "tritonserver"]

    def alive(self) -> list[int]:
        return [p for p, (start, _) in self.seen.items() if procs.pid_alive(p) and _start_time(p) == start]

    def regions(self) -> list[Path]:
        return sorted(Path("/dev/shm").glob(f"{self.shm_prefix}*"))

    def stop(self) -> list[str]:
        """Stop what is still running, remove this run's shm regions and core locks;
        returns what had to be stopped or removed."""
        self._stop.set()
        self.scan()
        done = []
        alive = self.alive()
        for pid in self.servers():   # the server, its stubs (by prefix), its regions and core locks
            if pid in alive:
                done += [f"tritonserver {pid}", *terminate(pid, self.shm_prefix, 10.0)]
            else:                    # gone (its pid may be someone else's now): only its files
                done += [f"lock {name}" for name in remove_core_locks(pid)]
        for pid in self.alive():     # perf_analyzer or a stub that outlived everything
            try:
                os.kill(pid, signal.SIGKILL)
                done.append(f"{self.seen[pid][1]} {pid}")
            except ProcessLookupError:
                pass
        for stub in stub_processes(0, self.shm_prefix):
            try:
                os.kill(stub.pid, signal.SIGKILL)
                done.append(f"stub {stub.pid}")
            except ProcessLookupError:
                pass
        for region in self.regions():
            region.unlink(missing_ok=True)
            done.append(f"shm {region.name}")
        return done


# --------------------------------------------------------------------------
# A run


@dataclass
class AnalyzerRun:
    model: str
    run_dir: Path
    space: Space
    budget_ms: float
    seconds: float
    cleaned: list[str]
    log: Path
    shm_prefix: str = ""
    servers: list[int] = field(default_factory=list)   # PIDs of the tritonservers it started
    isolated: bool = True     # in a network namespace of its own (False: SERVELAB_ANALYZER_NO_NETNS=1)

    @property
    def results_csv(self) -> Path:
        return self.run_dir / RESULTS_CSV

    @property
    def summary_html(self) -> Path:
        return self.run_dir / SUMMARY / self.model / "result_summary.html"

    def plots(self) -> list[Path]:
        return sorted((self.run_dir / "export" / "plots").rglob("*.png"))

    def rows(self) -> list[dict]:
        return results(self.run_dir, self.model)


def isolation() -> bool:
    """Whether the local profile runs in a network namespace of its own: True, unless
    ``SERVELAB_ANALYZER_NO_NETNS=1``; raises (one line) if none can be made here."""
    if os.environ.get(NO_NETNS) == "1":
        return False
    why = netns.unavailable()
    if why:
        raise AnalyzerError(
            f"Model Analyzer's local profile runs in a network namespace of its own, so that no other "
            f"local process or web page can reach its keyless server, and this machine cannot make one "
            f"({why}): enable unprivileged user namespaces (user.max_user_namespaces > 0; on Ubuntu 24.04 "
            f"kernel.apparmor_restrict_unprivileged_userns=0), or set {NO_NETNS}=1 to run it unprotected "
            f"(docs/SECURITY.md).")
    return True


def _run(cmd: list[str], log: Path, timeout: float, shm_prefix: str, servers: list[int] | None = None,
         isolate: bool = True) -> list[str]:
    """Run one model-analyzer command in its own session (and, if ``isolate``, in a network
    namespace of its own); stop everything it started (the PIDs of the tritonservers it
    started are added to ``servers``)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(netns.command(cmd) if isolate else cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=procs.child_env(), cwd=log.parent, start_new_session=True)
    left = Leftovers(proc.pid, shm_prefix)
    left.follow()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        procs.stop_group(proc.pid, 10.0, proc=proc)
        raise AnalyzerError(f"{cmd[1]} ran past {timeout:.0f} s (log: {log})") from None
    except BaseException:
        procs.stop_group(proc.pid, 10.0, proc=proc)
        raise
    finally:
        cleaned = left.stop()
        if servers is not None:
            servers += left.servers()
    if proc.returncode:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise AnalyzerError(f"model-analyzer {cmd[1]} exited with {proc.returncode} (log: {log}):\n{tail}")
    return cleaned


def _fresh_dir(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3``, ...: a new folder that no other run started in the same second."""
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path.resolve()
    raise RuntimeError(f"no free run folder beside {base}")


def profile(model: str, space: Space, budget_ms: float, *, source: Path | None = None,
            run_dir: Path | None = None, perf_flags: dict | None = None, timeout: float = 1800.0,
            report: bool = True) -> AnalyzerRun:
    """``model-analyzer profile`` (a brute search of ``space`` under a p99 budget), then
    ``report``; everything under ``run_dir`` (default ``build/model-analyzer/<model>-<time>``).
    Both run in a network namespace of its own (:func:`isolation`)."""
    exe = executable()
    isolate = isolation()
    if run_dir is None:
        run_dir = _fresh_dir(OUTPUT_ROOT / f"{model}-{time.strftime('%Y%m%d-%H%M%S')}")
    else:   # a folder the caller named is started afresh
        run_dir = Path(run_dir).resolve()
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
    # The runtime repository this binary can serve (the kit's local translation of the config).
    repo = run_dir / "repository"
    build_repository(repo, source or paths.MODELS_STAGING, [model], gpus=0)
    backends = prepare_backends(run_dir)
    ports = [procs.free_port() for _ in range(3)]
    shm_prefix = f"servelab_ma_{os.getpid()}_{secrets.token_hex(3)}_"
    cfg = analyzer_config(model, run_dir, repo, backends, space, budget_ms, ports,
                          secrets.token_urlsafe(18), shm_prefix, perf_flags)
    config_file = run_dir / "profile.yaml"
    config_file.write_text(json.dumps(cfg, indent=1))
    config_file.chmod(0o600)   # it holds the private server's admin key
    log = run_dir / "model-analyzer.log"
    t0 = time.monotonic()
    servers: list[int] = []
    cleaned = _run([str(exe), "profile", "-f", str(config_file)], log, timeout, shm_prefix, servers, isolate)
    if report:
        report_cfg = run_dir / "report.yaml"
        report_cfg.write_text(json.dumps({
            "checkpoint_directory": cfg["checkpoint_directory"], "export_path": cfg["export_path"],
            "report_model_configs": config_names(run_dir, model)[:3]}, indent=1))
        cleaned += _run([str(exe), "report", "-f", str(report_cfg)], log, timeout, shm_prefix, servers, isolate)
    return AnalyzerRun(model, run_dir, space, budget_ms, time.monotonic() - t0, cleaned, log, shm_prefix, servers,
                       isolate)


# --------------------------------------------------------------------------
# Results


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def variant(run_dir: Path, config_name: str) -> dict:
    """{instances, max_batch_size, queue_delay_us, batching} of one configuration Model Analyzer
    wrote (``output_models/<config_name>/config.pbtxt``)."""
    cfg = config_to_dict(load_config(Path(run_dir) / "output_models" / config_name))
    groups = cfg.get("instance_group") or [{"count": 1}]
    batching = "dynamic_batching" in cfg
    max_batch = int(cfg.get("max_batch_size", 0))
    delay = int((cfg.get("dynamic_batching") or {}).get("max_queue_delay_microseconds", 0))
    return {"instances": sum(int(g.get("count", 1)) for g in groups), "max_batch_size": max_batch,
            "queue_delay_us": delay if batching else 0, "batching": batching and max_batch > 1}


def results(run_dir: Path, model: str) -> list[dict]:
    """The rows of ``metrics-model-inference.csv``: one per configuration and concurrency,
    {config, concurrency, throughput, p99_ms, satisfies, instances, max_batch_size,
    queue_delay_us, batching}."""
    path = Path(run_dir) / RESULTS_CSV
    if not path.is_file():
        raise AnalyzerError(f"no {RESULTS_CSV} in {run_dir}: the profile measured nothing")
    rows = []
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            name = rec.get("Model Config Path") or rec.get("Model Config") or ""
            if not name.startswith(model):
                continue
            rows.append({
                "config": name,
                "concurrency": int(float(rec.get("Concurrency") or 0)),
                "throughput": _number(rec.get("Throughput (infer/sec)")),
                "p99_ms": _number(rec.get("p99 Latency (ms)")),
                "satisfies": (rec.get("Satisfies Constraints") or "").strip().lower() in ("yes", "true"),
                **variant(run_dir, name),
            })
    return rows


def config_names(run_dir: Path, model: str) -> list[str]:
    """The configurations measured, best first (Model Analyzer's ranking: highest throughput
    among the measurements that meet the budget)."""
    try:
        return [r["config"] for r in best_per_config(results(run_dir, model))]
    except AnalyzerError:
        return []


def best_per_config(rows: Sequence[dict]) -> list[dict]:
    """Per configuration its best measurement within the budget (or, if none is, its lowest p99),
    ranked as Model Analyzer ranks them: within-budget first, then by throughput."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["config"], []).append(r)
    best = []
    for name, rs in by.items():
        ok = [r for r in rs if r["satisfies"] and r["throughput"] is not None]
        pick = max(ok, key=lambda r: r["throughput"]) if ok else min(rs, key=lambda r: r["p99_ms"] or float("inf"))
        best.append({**pick, "satisfies": bool(ok)})
    return sorted(best, key=lambda r: (not r["satisfies"], -(r["throughput"] or 0.0)))
