"""The installed binary: tritonserver 2.51 and its Python backend from
nvidia-pytriton 0.7.0, the environment it runs in, and the lab's defaults
for reaching it (ports, admin key headers)."""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from servelab.core import procs

DEFAULT_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
DEFAULT_METRICS_PORT = 8002
# A short exit timeout: Triton otherwise waits 30 s for idle keep-alive clients.
EXIT_TIMEOUT_S = 3
ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
HTTP_ADMIN_HEADER = "admin-key"
GRPC_ADMIN_HEADER = "triton-grpc-protocol-admin-key"
GOMP_SPINCOUNT = "10000"  # rounds an idle OpenMP thread spins before it sleeps (see server_env)


class TritonError(RuntimeError):
    """The local Triton could not be found, started or driven."""


@dataclass(frozen=True)
class TritonInstall:
    root: Path  # .../site-packages/pytriton/tritonserver

    @property
    def server(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def python_backend(self) -> Path:
        return self.root / "backends" / "python"

    @property
    def libs(self) -> Path:
        return self.root.parent.parent / "nvidia_pytriton.libs"

    def stub(self, version: tuple[int, int] | None = None) -> Path:
        major, minor = version or sys.version_info[:2]
        return self.root / "python_backend_stubs" / f"{major}.{minor}" / "triton_python_backend_stub"


def find_install() -> TritonInstall:
    """Locate tritonserver, the Python backend and the stub for this Python."""
    try:
        import pytriton
    except ImportError as err:
        raise TritonError("nvidia-pytriton is not installed: `pip install nvidia-pytriton==0.7.0`.") from err
    install = TritonInstall(Path(pytriton.__file__).resolve().parent / "tritonserver")
    for needed in (install.server, install.python_backend / "libtriton_python.so", install.libs):
        if not needed.exists():
            raise TritonError(f"{needed} is missing: reinstall nvidia-pytriton==0.7.0.")
    if not install.stub().exists():
        raise TritonError(
            f"no Python-backend stub for Python {sys.version_info[0]}.{sys.version_info[1]} in "
            f"{install.stub().parent.parent} (nvidia-pytriton 0.7.0 ships 3.8 to 3.13)."
        )
    return install


DEV_DIR = Path("/dev")  # where the driver's device files are (a test points it elsewhere)


def gpu_count() -> int:
    """GPUs Triton could use here: the ``/dev/nvidia<N>`` devices, less those
    ``CUDA_VISIBLE_DEVICES`` hides. ``SERVELAB_DEVICE=cpu`` forces 0."""
    if os.environ.get("SERVELAB_DEVICE", "").strip().lower() == "cpu":
        return 0
    present = len([p for p in DEV_DIR.glob("nvidia[0-9]*") if p.name[6:].isdigit()])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    # CUDA's rule: the listed devices in order, up to the first entry that names
    # none (so "" and "-1" hide every GPU); an entry is an index or a GPU-/MIG- UUID.
    seen = 0
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit() and int(entry) < present or entry.startswith(("GPU-", "MIG-")):
            seen += 1
        else:
            break
    return min(seen, present)


def system_lib_dirs() -> set[str]:
    """Folders the dynamic linker searches anyway: a libpython there needs no LD_LIBRARY_PATH entry.
    (Read when a server starts, not at import: the CLI imports this module in images without Triton.)"""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    return {"/lib", "/usr/lib", "/lib64", "/usr/lib64"} | (
        {f"/lib/{multiarch}", f"/usr/lib/{multiarch}"} if multiarch else set())


def server_env(install: TritonInstall) -> dict[str, str]:
    """The environment tritonserver (and its Python-backend stubs) run in."""
    lib_path = [str(install.libs)]
    # The stub embeds libpython: prefer the one that belongs to this
    # interpreter (pyenv/conda builds) over a system copy of the same soname.
    # Only such a private folder is added, after Triton's own: a system
    # Python's (/usr/lib/x86_64-linux-gnu) is searched anyway, and listing it
    # would put its libraries (a system CUDA or cuDNN) before torch's own in the stubs.
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if libdir and soname and (Path(libdir) / soname).exists() and \
            os.path.normpath(libdir) not in system_lib_dirs():
        lib_path.append(libdir)
    env = procs.child_env()
    # OpenMP threads (torch's) wait for the next layer by spinning, then sleep.
    # PASSIVE (sleep at once) made a 2-thread forward pass 2x slower (13.5 vs
    # 30 infer/s); ACTIVE spins idle stubs at 100 %. libgomp's default spin
    # (300000 rounds: milliseconds) outlasts a pass's end: the copy that finished keeps
    # a core busy while the next copy's pass starts (passes alternating between
    # two processes took 1.2-1.3x as long). 10000 rounds cover the gap between
    # layers, not between requests: alternating passes as fast as one process's.
    env.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_path + ([old] if old else []))
    # model.py imports servelab (food11): make the package importable in the stub.
    package_root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env
