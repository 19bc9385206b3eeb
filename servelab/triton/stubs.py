"""Which Triton model instances run where: one process per Python-backend instance.

Triton starts every instance of a Python-backend model as its own process,
``triton_python_backend_stub``. After an ``instance_group`` change, counting
those processes per device shows what Triton really runs:

* on a GPU node, ``nvidia-smi`` lists the processes using each GPU (run it on
  the node: the Jupyter container neither sees the GPUs nor Triton's processes);
* on a machine without a GPU (the kit's local stack), the process list shows
  the stubs, all on the CPU.

    from servelab.triton import stubs
    stubs.show("food_classifier", grpc_url=TRITON_GRPC_URL)

The ONNX model on a real Triton runs inside the tritonserver process (the
ONNX Runtime backend, no stub); the kit's local stack serves it through a
Python-backend runner, so it has stubs there.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from servelab.core.procs import cmdline

STUB_NAME = "triton_python_backend_stub"


@dataclass(frozen=True)
class Stub:
    pid: int
    parent: int | None     # the tritonserver process that started it
    model: str
    instance: str          # e.g. food_classifier_0_1
    rss_mb: float




def stub_argv(pid: int, proc: Path = Path("/proc")) -> list[str] | None:
    """The argv of a Triton Python-backend stub, None for any other process:
    stub model.py shm_region shm_size growth parent_pid lib_path ipc_handle instance_name ...
    (``servelab.triton.process`` reads stubs through this too; this module never imports it)."""
    argv = cmdline(pid, proc)
    if not argv or not argv[0].endswith(STUB_NAME) or len(argv) < 9:
        return None
    return argv


def stub_model(argv: list[str]) -> str:
    """The model a stub serves: the folder above its ``<version>/model.py``."""
    return Path(argv[1]).parent.parent.name


def _status(pid: int, proc: Path = Path("/proc")) -> dict[str, str]:
    try:
        lines = (proc / str(pid) / "status").read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split(":", 1) for line in lines if ":" in line)


def stub_processes(proc: Path = Path("/proc")) -> list[Stub]:
    """Every Triton Python-backend stub this machine (or container) can see."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        argv = stub_argv(pid, proc)
        if argv is None:
            continue
        status = _status(pid, proc)
        try:
            parent = int(status.get("PPid", "").strip())
        except ValueError:
            parent = None
        rss_kb = status.get("VmRSS", "0 kB").split()[0]
        found.append(Stub(pid=pid, parent=parent, model=stub_model(argv),
                          instance=argv[8], rss_mb=int(rss_kb) / 1024 if rss_kb.isdigit() else 0.0))
    return sorted(found, key=lambda s: (s.model, s.instance))


def gpu_processes() -> dict[int, list[tuple[int, str, str]]] | None:
    """``{gpu index: [(pid, process name, memory used)]}`` from nvidia-smi, or
    None where nvidia-smi is missing or sees no GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        gpus = subprocess.run([smi, "--query-gpu=index,uuid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20, check=True).stdout
        apps = subprocess.run([smi, "--query-compute-apps=pid,gpu_uuid,process_name,used_memory",
                               "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    index = {}
    for line in gpus.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            index[parts[1]] = int(parts[0])
    if not index:
        return None
    out: dict[int, list[tuple[int, str, str]]] = {i: [] for i in sorted(index.values())}
    for line in apps.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit() and parts[1] in index:
            out[index[parts[1]]].append((int(parts[0]), parts[2], parts[3]))
    return out


def _server_pid(grpc_url: str | None) -> int | None:
    """The local tritonserver behind ``grpc_url``, when the kit started it."""
    if not grpc_url:
        return None
    host, _, port = grpc_url.rpartition(":")
    if host not in ("127.0.0.1", "localhost") or not port.isdigit():
        return None
    try:
        from servelab.triton.state import read_state
    except ImportError:  # pragma: no cover - the kit without its Triton helpers
        return None
    state = read_state(grpc_port=int(port))
    return int(state["pid"]) if state and "pid" in state else None


def per_device(model: str | None = None, grpc_url: str | None = None) -> dict[str, list[Stub]]:
    """Stubs grouped by device: ``{"GPU 0": [...], "GPU 1": [...]}`` where
    nvidia-smi sees the stubs, else ``{"CPU": [...]}``. With ``grpc_url`` of
    a local Triton, only that server's stubs (other servers may share the machine)."""
    stubs = stub_processes()
    server = _server_pid(grpc_url)
    if server is not None:
        stubs = [s for s in stubs if s.parent == server]
    if model:
        stubs = [s for s in stubs if s.model == model]
    gpus = gpu_processes()
    if gpus:
        return _by_gpu(stubs, gpus)
    return {"CPU": stubs} if stubs else {}


def _by_gpu(stubs: list[Stub], gpus: dict[int, list[tuple[int, str, str]]]) -> dict[str, list[Stub]]:
    by_pid = {s.pid: s for s in stubs}
    grouped: dict[str, list[Stub]] = defaultdict(list)
    placed = set()
    for gpu, apps in gpus.items():
        grouped[f"GPU {gpu}"] = [by_pid[pid] for pid, _, _ in apps if pid in by_pid]
        placed.update(pid for pid, _, _ in apps)
    rest = [s for s in stubs if s.pid not in placed]
    if rest:
        grouped["CPU"] = rest
    return dict(grouped)


def expected_instances(model: str, grpc_url: str) -> int | None:
    """How many copies Triton says ``model`` runs now (``triton.instance_count``), or None."""
    try:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(grpc_url)
        try:
            config = client.get_model_config(model, as_json=True)["config"]
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - no client library, no server: nothing to wait for
        return None
    from servelab.triton.config import instance_count

    return instance_count(config)


def show(model: str | None = None, grpc_url: str | None = None, settle_s: float = 20.0) -> dict[str, list[Stub]]:
    """Print the Triton stub processes per device; return them (see :func:`per_device`).

    Right after a reload the previous copies are still shutting down: with a
    model and ``grpc_url`` given, wait (up to ``settle_s``) until the processes
    match the number of copies Triton reports."""
    expected = expected_instances(model, grpc_url) if model and grpc_url else None
    grouped, count = _settled(model, grpc_url, expected, settle_s)
    what = f"model {model}" if model else "all models"
    if not any(grouped.values()):
        print(f"No Triton Python-backend process is visible from here ({what}).\n"
              "In the Compose stack Triton runs in its own container: run `nvidia-smi` on "
              "node-serve-system and count the triton_python_backend_stub processes on each GPU.")
        return grouped
    if gpu_processes() is None:
        print(f"No GPU here (no nvidia-smi): Triton runs every instance on the CPU. "
              f"Its Python-backend processes ({what}):")
    else:
        print(f"Triton Python-backend processes per GPU, from nvidia-smi ({what}):")
    for device, stubs in grouped.items():
        print(f"  {device}: {len(stubs)} process(es)")
        for s in stubs:
            print(f"    pid {s.pid:<8} {s.instance:<28} {s.rss_mb:7.0f} MB")
    if expected is not None and count != expected:
        print(f"  (Triton reports {expected} copies; the others are still starting or shutting down: run the cell again)")
    return grouped


def _settled(model: str | None, grpc_url: str | None, expected: int | None,
             settle_s: float) -> tuple[dict[str, list[Stub]], int]:
    """The stubs per device and their count, once the count is ``expected``
    (or nothing runs, or ``settle_s`` passed)."""
    deadline = time.monotonic() + settle_s
    while True:
        grouped = per_device(model, grpc_url)
        count = sum(len(v) for v in grouped.values())
        if not count or expected is None or count == expected or time.monotonic() > deadline:
            return grouped, count
        time.sleep(0.5)
