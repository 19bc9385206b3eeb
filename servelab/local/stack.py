"""The local stack: the lab's services as plain processes from one venv.

``servelab up`` starts, each in its own process group and bound to
127.0.0.1 unless told otherwise:

=============  =====================================================  ============
component      what                                                   default port
=============  =====================================================  ============
fastapi_pt     FastAPI + PyTorch (``fastapi_pt/app.py``, uvicorn)      8010
fastapi_onnx   FastAPI + ONNX Runtime (``fastapi_onnx/app.py``)        8011
triton         the real Triton 2.51 with both lab models               8000/8001/8002
flask          the web UI (``flask_app/app.py``, gunicorn + gevent)   5000
jupyter        JupyterLab on the repository, token required          8888
=============  =====================================================  ============

then waits until each answers its health check, prints the URLs and the
environment variables a notebook needs, and returns; the processes keep
running. A state file (``build/stack/state.json``, owner-only: it holds the
Jupyter token) records every process group, so ``servelab down`` stops them
all, Triton's Python-backend stubs and shared memory included.

From Python (tests, the tour)::

    with stack.running(components=["fastapi_onnx", "triton"], free_ports=True) as s:
        s.urls["fastapi_onnx"], s.urls["triton_http"], s.env["TRITON_SERVER_URL"]

starts only what it is asked for, on free ports, and stops it on exit.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from servelab.core import paths, procs

COMPONENTS = ("fastapi_pt", "fastapi_onnx", "triton", "flask", "jupyter")
DEFAULT_PORTS = {
    "fastapi_pt": 8010, "fastapi_onnx": 8011,
    "triton_http": 8000, "triton_grpc": 8001, "triton_metrics": 8002,
    "flask": 5000, "jupyter": 8888,
}
FLASK_BACKENDS = ("fastapi", "triton", "triton_onnx")
# Where `servelab up` keeps its state file, env.sh and logs (tests relocate it).
STACK_DIR = Path(os.environ.get("SERVELAB_STACK_DIR", paths.BUILD_DIR / "stack"))
STATE_FILE = STACK_DIR / "state.json"
TIMEOUTS = {"fastapi_pt": 180.0, "fastapi_onnx": 120.0, "triton": 300.0, "flask": 60.0, "jupyter": 120.0}


class StackError(RuntimeError):
    pass


@dataclass
class Stack:
    """What is running: processes, ports, URLs and the env a notebook needs."""

    host: str
    ports: dict[str, int]
    servers: dict[str, procs.Server] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    jupyter_token: str | None = None
    log_dir: Path = STACK_DIR / "logs"
    state_file: Path | None = None

    @property
    def components(self) -> list[str]:
        return list(self.servers)

    def summary(self) -> str:
        lines = ["Local ServeLab stack:"]
        for name, s in self.servers.items():
            lines.append(f"  {name:<13} {self.urls.get(name, s.url):<48} pid {s.pid}  log {s.log_path}")
        if "triton" in self.servers:
            lines.append(f"  {'':<13} gRPC {self.urls['triton_grpc']}   metrics {self.urls['triton_metrics']}")
        if self.jupyter_token:
            lines.append(f"  Jupyter: open {self.urls['jupyter_login']}")
        lines.append("Environment for notebooks and scripts (also in build/stack/env.sh):")
        lines += [f"  export {k}={v}" for k, v in self.env.items()]
        return "\n".join(lines)

    def stop(self) -> None:
        stop(self)


# --------------------------------------------------------------------------
# Starting
# --------------------------------------------------------------------------

def _python() -> str:
    return sys.executable


def _base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Children import servelab from this checkout."""
    root = str(paths.REPO_ROOT)
    old = os.environ.get("PYTHONPATH")
    env = {"PYTHONPATH": root + (os.pathsep + old if old else "")}
    if extra:
        env.update(extra)
    return env


def plan_ports(components: Sequence[str], ports: Mapping[str, int] | None = None,
               free_ports: bool = False, host: str = "127.0.0.1") -> dict[str, int]:
    """The ports each component will use: defaults, overrides, or fresh free ones."""
    wanted = []
    for c in components:
        wanted += ["triton_http", "triton_grpc", "triton_metrics"] if c == "triton" else [c]
    out = {}
    for key in wanted:
        if ports and key in ports:
            out[key] = int(ports[key])
        elif free_ports:
            p = procs.free_port(host)
            while p in out.values():
                p = procs.free_port(host)
            out[key] = p
        else:
            out[key] = DEFAULT_PORTS[key]
    busy = [f"{k}={p}" for k, p in out.items() if not procs.port_is_free(p, host)]
    if busy:
        raise StackError(f"port(s) in use on {host}: {', '.join(busy)}. Is a stack already up "
                         f"(`python -m servelab down`)? Or choose other ports (see `servelab up --help`).")
    return out


def _env_for(host: str, ports: Mapping[str, int], fastapi: str) -> dict[str, str]:
    """The lab's variable names (design.md) pointing at this stack."""
    env: dict[str, str] = {}
    fa = {"pt": "fastapi_pt", "onnx": "fastapi_onnx"}[fastapi]
    if fa in ports:
        env["FASTAPI_SERVER_URL"] = f"http://{host}:{ports[fa]}"
    elif "fastapi_pt" in ports or "fastapi_onnx" in ports:
        other = "fastapi_pt" if "fastapi_pt" in ports else "fastapi_onnx"
        env["FASTAPI_SERVER_URL"] = f"http://{host}:{ports[other]}"
    if "fastapi_pt" in ports:
        env["FASTAPI_PT_URL"] = f"http://{host}:{ports['fastapi_pt']}"
    if "fastapi_onnx" in ports:
        env["FASTAPI_ONNX_URL"] = f"http://{host}:{ports['fastapi_onnx']}"
    if "triton_http" in ports:
        env["TRITON_SERVER_URL"] = f"{host}:{ports['triton_http']}"
        env["TRITON_GRPC_URL"] = f"{host}:{ports['triton_grpc']}"
        env["TRITON_METRICS_URL"] = f"http://{host}:{ports['triton_metrics']}/metrics"
        env["FOOD11_MODEL_NAME"] = "food_classifier"
    if "flask" in ports:
        env["FLASK_URL"] = f"http://{host}:{ports['flask']}"
    return env


def _command(name: str, host: str, ports: Mapping[str, int], triton_workdir: Path | None,
             token: str | None) -> tuple[list[str], str, str, Path]:
    """(command, health URL, public URL, cwd) for one component."""
    py = _python()
    root = paths.REPO_ROOT
    if name in ("fastapi_pt", "fastapi_onnx"):
        port = ports[name]
        # the lesson's app.py, hardened from outside its file (servelab/serve/harden.py)
        cmd = [py, "-m", "uvicorn", f"servelab.serve.harden:{name}", "--host", host,
               "--port", str(port), "--no-access-log"]
        base = f"http://{host}:{port}"
        return cmd, base + "/health", base, root
    if name == "triton":
        cmd = [py, "-m", "servelab.local.stack_triton", "--host", host,  # the wrapper restarts a dead server
               "--http-port", str(ports["triton_http"]), "--grpc-port", str(ports["triton_grpc"]),
               "--metrics-port", str(ports["triton_metrics"])]
        if triton_workdir is not None:  # else a temporary folder, removed when Triton stops
            cmd += ["--workdir", str(triton_workdir)]
        base = f"http://{host}:{ports['triton_http']}"
        return cmd, base + "/v2/health/ready", base, root
    if name == "flask":
        # The web server the Flask image runs (gunicorn + gevent, with header,
        # idle and request deadlines: servelab.serve.webserver), not Werkzeug's
        # development server; HOST and PORT come from the environment. The lesson's
        # flask_app/app.py, hardened from outside its file (servelab/serve/flask_harden.py).
        cmd = [py, "-m", "gunicorn", "--config", "python:servelab.serve.webserver", "servelab.serve.harden:flask_app"]
        base = f"http://{host}:{ports['flask']}"
        return cmd, base + "/", base, root / "flask_app"
    if name == "jupyter":
        port = ports["jupyter"]
        cmd = [py, "-m", "jupyterlab", "--no-browser", f"--ServerApp.ip={host}", f"--ServerApp.port={port}",
               "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root}",  # notebooks/ and models_staging/ (edited by hand in 6)
               # The token is NOT an argument: /proc/<pid>/cmdline is world-readable, the
               # environment (/proc/<pid>/environ) is owner-only. Jupyter reads JUPYTER_TOKEN,
               # which start() puts in this process's environment.
               "--ServerApp.open_browser=False",
               "--ServerApp.allow_remote_access=False"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # containers and lab VMs often run as root
        base = f"http://{host}:{port}"
        return cmd, base + "/api", base, root
    raise StackError(f"unknown component {name!r}; choose from {', '.join(COMPONENTS)}")


def start(components: Iterable[str] | None = None, *, host: str = "127.0.0.1",
          ports: Mapping[str, int] | None = None, free_ports: bool = False,
          flask_backend: str = "fastapi", fastapi: str = "pt", jupyter_token: str | None = None,
          log_dir: Path | None = None, state_file: Path | None = None,
          triton_workdir: Path | None = None,
          timeouts: Mapping[str, float] | None = None, log=print) -> Stack:
    """Start ``components`` (default: all), wait for health, return the Stack.

    ``flask_backend``: what the Flask UI calls (fastapi | triton |
    triton_onnx); ``fastapi``: which service answers on FASTAPI_SERVER_URL
    (pt | onnx). ``state_file=None`` writes none (tests); ``servelab up``
    writes ``build/stack/state.json``. ``triton_workdir``: where Triton's
    runtime repository and log go (default: a temporary folder).
    """
    comps = _components(components, flask_backend, fastapi)
    planned = plan_ports(comps, ports, free_ports, host)
    if jupyter_token is None and "jupyter" in comps:
        jupyter_token = os.environ.get("JUPYTER_TOKEN") or secrets.token_urlsafe(24)
    log_dir = Path(log_dir or (STACK_DIR / "logs"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = _env_for(host, planned, fastapi)
    st = Stack(host=host, ports=planned, env=env, jupyter_token=jupyter_token, log_dir=log_dir,
               state_file=state_file)
    timeouts = {**TIMEOUTS, **(timeouts or {})}
    pending = []
    try:
        for name in comps:
            cmd, health, url, cwd = _command(name, host, planned, triton_workdir, jupyter_token)
            child_env = _child_env(name, env, host, planned, flask_backend, jupyter_token)
            log_path = log_dir / f"{name}.log"
            log_path.write_text("")
            server = procs.start(name, cmd, url, log_path=log_path, env=child_env, cwd=cwd)
            st.servers[name] = server
            st.urls[name] = url
            pending.append((name, health, server))
            _write_state(st)  # record each process as soon as it exists
        for name, health, server in pending:
            procs.wait_http_ok(health, timeout=timeouts[name], server=server)
            if log:
                log(f"  {name} ready at {st.urls[name]}")
    except BaseException:
        stop(st)
        raise
    if "triton" in st.servers:
        st.urls["triton_grpc"] = f"{host}:{planned['triton_grpc']}"
        st.urls["triton_metrics"] = f"http://{host}:{planned['triton_metrics']}/metrics"
    if jupyter_token:
        st.urls["jupyter_login"] = f"{st.urls['jupyter']}/lab?token={jupyter_token}"
    _write_state(st)
    return st


def _components(components: Iterable[str] | None, flask_backend: str, fastapi: str) -> list[str]:
    """The components asked for, checked, in an order that lets dependants find their backends."""
    comps = list(dict.fromkeys(components or COMPONENTS))
    for c in comps:
        if c not in COMPONENTS:
            raise StackError(f"unknown component {c!r}; choose from {', '.join(COMPONENTS)}")
    if flask_backend not in FLASK_BACKENDS:
        raise StackError(f"flask backend must be one of {', '.join(FLASK_BACKENDS)}")
    if fastapi not in ("pt", "onnx"):
        raise StackError("fastapi must be 'pt' or 'onnx'")
    return sorted(comps, key=COMPONENTS.index)


def _child_env(name: str, env: Mapping[str, str], host: str, ports: Mapping[str, int], flask_backend: str,
               jupyter_token: str | None) -> dict[str, str]:
    child_env = _base_env(env)
    if name == "flask":
        child_env.update(HOST=host, PORT=str(ports["flask"]), INFERENCE_BACKEND=flask_backend)
        if flask_backend == "triton_onnx":
            child_env["FOOD11_MODEL_NAME"] = "food_classifier_onnx"
    if name == "jupyter":
        # Kernels started from this Jupyter inherit the stack's URLs.
        child_env.update(JUPYTER_TOKEN=jupyter_token)
    return child_env


def _write_state(st: Stack) -> None:
    if st.state_file is None:
        return
    st.state_file.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "host": st.host, "ports": st.ports, "urls": st.urls, "env": st.env,
        "jupyter_token": st.jupyter_token, "started": time.time(),
        "processes": {n: {"pid": s.pid, "pgid": s.pid, "url": s.url, "log": str(s.log_path),
                          "cmd": list(s.proc.args)} for n, s in st.servers.items()},
    }
    tmp = st.state_file.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the Jupyter token
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, st.state_file)
    env_sh = st.state_file.parent / "env.sh"
    env_sh.write_text("".join(f"export {k}={v}\n" for k, v in st.env.items()))


# --------------------------------------------------------------------------
# Stopping
# --------------------------------------------------------------------------

def stop(st: Stack, timeout: float = 40.0) -> None:
    """Stop every process of ``st`` (reverse start order), then forget the state file."""
    for name in reversed(list(st.servers)):
        server = st.servers[name]
        # Triton's wrapper needs time to stop the server and reap its stubs.
        server.stop(timeout=timeout if name == "triton" else 15.0)
        if name == "triton":
            _triton_cleanup(st.ports["triton_http"])
    if st.state_file is not None:
        try:
            data = json.loads(st.state_file.read_text())
            if {p["pid"] for p in data.get("processes", {}).values()} <= {s.pid for s in st.servers.values()}:
                st.state_file.unlink()
        except (OSError, ValueError):
            pass


def _triton_cleanup(http_port: int) -> None:
    """If Triton's wrapper died before it could stop Triton, stop it by its state."""
    try:
        from servelab import triton
    except ImportError:
        return
    try:
        triton.stop_running(http_port)
    except Exception:
        pass


def down(state_file: Path = STATE_FILE, timeout: float = 40.0, log=print) -> bool:
    """Stop a stack started by ``servelab up`` (from its state file)."""
    try:
        data = json.loads(Path(state_file).read_text())
    except FileNotFoundError:
        log("no local stack is recorded as running (nothing in build/stack/state.json)")
        return False
    procs_ = data.get("processes", {})
    for name in reversed(list(procs_)):
        info = procs_[name]
        pgid = int(info["pgid"])
        if not _is_ours(info):
            log(f"  {name}: pid {pgid} is gone")
        else:
            forced = procs.stop_group(pgid, timeout if name == "triton" else 15.0, wait_for_group=True)
            log(f"  {name}: stopped (process group {pgid}{', forced' if forced else ''})")
        if name == "triton":
            _triton_cleanup(int(data["ports"]["triton_http"]))
    Path(state_file).unlink(missing_ok=True)
    (Path(state_file).parent / "env.sh").unlink(missing_ok=True)
    return True


def _is_ours(info: Mapping) -> bool:
    """The recorded PID still runs the command we started (PIDs get reused)."""
    pid = int(info["pid"])
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return bool(procs.group_pids(int(info["pgid"])))  # leader gone, group may remain
    want = [c.encode() for c in info.get("cmd", [])]
    return not want or cmdline[:len(want)] == want


def status(state_file: Path = STATE_FILE) -> dict | None:
    try:
        return json.loads(Path(state_file).read_text())
    except (FileNotFoundError, ValueError):
        return None


@contextmanager
def running(components: Iterable[str] | None = None, **kwargs) -> Iterator[Stack]:
    """``with running(["fastapi_onnx"], free_ports=True) as s:`` start, yield, always stop.

    Logs go to a temporary folder (removed afterwards) unless ``log_dir`` is given.
    """
    import shutil
    import tempfile

    kwargs.setdefault("log", None)
    tmp = None
    if kwargs.get("log_dir") is None:
        tmp = kwargs["log_dir"] = Path(tempfile.mkdtemp(prefix="servelab-stack-")) / "logs"
    try:
        st = start(components, **kwargs)
        try:
            yield st
        finally:
            stop(st)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp.parent, ignore_errors=True)


# --------------------------------------------------------------------------
# Command line: `servelab up`, `servelab down`
# --------------------------------------------------------------------------

def add_parser(subparsers) -> None:
    up = subparsers.add_parser(
        "up", help="start the local stack (FastAPI, Triton, Flask UI, Jupyter) and keep it running",
        description="Start the lab's services as local processes, wait until each is healthy, print the "
                    "URLs and the environment a notebook needs. `servelab down` stops them.")
    up.add_argument("--only", default="", help=f"comma-separated components (default all: {','.join(COMPONENTS)})")
    up.add_argument("--skip", default="", help="comma-separated components to leave out")
    up.add_argument("--host", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1; 0.0.0.0 exposes the services to your network)")
    for key, port in DEFAULT_PORTS.items():
        up.add_argument(f"--{key.replace('_', '-')}-port", dest=f"port_{key}", type=int, default=None,
                        help=f"default {port}")
    up.add_argument("--flask-backend", choices=FLASK_BACKENDS, default="fastapi",
                    help="what the web UI calls (default fastapi)")
    up.add_argument("--fastapi", choices=("pt", "onnx"), default="pt",
                    help="which FastAPI service answers on FASTAPI_SERVER_URL (default pt)")
    up.set_defaults(func=_cmd_up)
    dn = subparsers.add_parser("down", help="stop the local stack started by `servelab up`")
    dn.set_defaults(func=_cmd_down)


def _split(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _cmd_up(args) -> int:
    comps = _split(args.only) or list(COMPONENTS)
    comps = [c for c in comps if c not in _split(args.skip)]
    existing = status()
    if existing and any(_is_ours(p) for p in existing.get("processes", {}).values()):
        print("a local stack is already up (build/stack/state.json); `python -m servelab down` first.",
              file=sys.stderr)
        return 1
    if "flask" in comps:
        needs = {"fastapi": ("fastapi_pt", "fastapi_onnx"), "triton": ("triton",),
                 "triton_onnx": ("triton",)}[args.flask_backend]
        if not any(n in comps for n in needs):
            print(f"note: the Flask UI calls {args.flask_backend}, which this stack does not start.")
    ports = {k: getattr(args, f"port_{k}") for k in DEFAULT_PORTS if getattr(args, f"port_{k}") is not None}
    print(f"Starting {', '.join(comps)} (this takes a minute: models load, Triton starts its stubs) ...",
          flush=True)
    try:
        st = start(comps, host=args.host, ports=ports, flask_backend=args.flask_backend,
                   fastapi=args.fastapi, state_file=STATE_FILE, triton_workdir=STACK_DIR / "triton")
    except (StackError, RuntimeError, TimeoutError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(st.summary())
    print("Stop everything with: python -m servelab down   (or: make down)")
    return 0


def _cmd_down(args) -> int:
    from servelab.local import scale

    down()
    scale.down()  # the scale-out lab too (`servelab scale up`), when one runs
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m servelab.local.stack")
    sub = ap.add_subparsers(dest="command", required=True)
    add_parser(sub)
    ns = ap.parse_args()
    raise SystemExit(ns.func(ns))
