"""``servelab gpu-pack``: the folder a bare GPU machine needs, in one xz archive.

The lent machine has Python 3.12 with CUDA torch, torchvision, onnxruntime
(CPU), numpy 2, pytest, grpcio and the like, and no network. What the kit needs
beyond that comes from this venv's site-packages, or, for compiled packages,
as cp312 wheels fetched here with ``pip download``:

=================  ======================================================  ===========
folder in archive  what                                                    from
=================  ======================================================  ===========
``site/``          tritonserver 2.51, its Python backend, the 3.12 stub    this venv
                   and nvidia_pytriton.libs (less the bundled 3.13
                   libpython); an empty ``pytriton`` package in place
                   of pytriton's Python API (only its location is used)
``site/``          fastapi, starlette, pydantic, uvicorn, fastapi-offline, this venv
                   tritonclient (gRPC, for the model config)
``pb/``            protobuf 4, which tritonclient's gRPC needs (< 5); kept  this venv
                   apart because the machine's onnx needs its own newer
                   protobuf to export the model (``runner.Phase.protobuf4``)
``site/``          pydantic_core, python-rapidjson                          cp312 wheels
``np/``            numpy 1.26.4, for the Triton stub (the machine's numpy  cp312 wheel
                   2 stays for everything else)
``bin/``           perf_analyzer (its two libraries are in the libs)       this venv
=================  ======================================================  ===========

Left out: stubs for other Pythons, libpython 3.13, pytriton's Python API,
perf_client, test folders and bytecode. onnxruntime-gpu (235 MiB) does not fit
the 64 MiB a device call carries: there the ONNX runner uses the machine's
onnxruntime on CPU, and ``gpu-check`` says so.

The archive and the repository together must fit the carry limit; ``build``
measures both and prints them.
"""

from __future__ import annotations

import importlib.metadata as md
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from servelab.core import paths

DEFAULT_DIR = paths.BUILD_DIR / "gpu-pack"
ARCHIVE_NAME = "servelab-gpu-pack.tar.xz"
MANIFEST_NAME = "manifest.json"
CARRY_LIMIT = 64 * 1024 * 1024  # what one device call carries: working tree + carried folders
STUB_PYTHON = "3.12"  # the lent machine's python3 (/work/.library/device/KINDS.md: Python 3.12.3)

# Pure-Python distributions copied from this venv (the machine has anyio, click, h11, grpcio,
# packaging, urllib3, numpy, torch, onnxruntime, pytest of its own).
VENV_DISTS = ("fastapi", "starlette", "pydantic", "annotated-types", "typing-inspection", "typing-extensions",
              "annotated-doc", "fastapi-offline", "uvicorn", "python-multipart", "opentelemetry-api",
              "tritonclient", "protobuf")
# Distributions that get a folder of their own, put on a phase's path only where it needs them.
DIST_FOLDER = {"protobuf": "pb"}
# Compiled distributions fetched as cp312 wheels: name -> (version, folder in the archive).
# pydantic_core must be the version this venv's pydantic pins; numpy < 2 for the Triton stub.
WHEELS = {"pydantic-core": (None, "site"), "python-rapidjson": (None, "site"), "numpy": ("1.26.4", "np")}
# Parts of the tritonserver tree that stay (paths under pytriton/tritonserver/).
TRITON_KEEP = ("bin/tritonserver", "backends/python/", "caches/local/", f"python_backend_stubs/{STUB_PYTHON}/")
DROP_PARTS = ("__pycache__", "/tests/", "/testing/")
PYTRITON_INIT = '"""Stand-in for nvidia-pytriton\'s package (servelab gpu-pack): the kit only locates tritonserver/."""\n'


class PackError(RuntimeError):
    """The pack cannot be built, or does not fit."""


@dataclass
class Item:
    arc: str                      # path inside the archive
    size: int
    src: Path | None = None       # a file on disk
    data: bytes | None = None     # or bytes written as is (from a wheel, or made here)
    mode: int = 0o644


@dataclass
class Selection:
    items: list[Item] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add_file(self, src: Path, arc: str) -> None:
        st = src.stat()
        self.items.append(Item(arc, st.st_size, src=src, mode=0o755 if st.st_mode & 0o111 else 0o644))

    def total(self, prefix: str = "") -> int:
        return sum(i.size for i in self.items if i.arc.startswith(prefix))

    def groups(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in self.items:
            parts = i.arc.split("/")
            key = "/".join(parts[:2]) if parts[0] in ("site", "np", "pb") and len(parts) > 2 else parts[0]
            if key.endswith(".dist-info"):
                key = parts[0] + "/*.dist-info"
            out[key] = out.get(key, 0) + i.size
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _dropped(path: str) -> bool:
    p = "/" + path
    return any(d in p for d in DROP_PARTS) or path.endswith((".pyc", ".pyo"))


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def triton_items(sel: Selection, site: Path) -> None:
    """tritonserver, the Python backend, the 3.12 stub and the libraries they load."""
    root = site / "pytriton" / "tritonserver"
    if not (root / "bin" / "tritonserver").exists():
        raise PackError(f"{root}/bin/tritonserver is missing: nvidia-pytriton==0.7.0 is not installed here")
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = f.relative_to(root).as_posix()
        if rel.startswith(TRITON_KEEP) and not _dropped(rel):
            sel.add_file(f, f"site/pytriton/tritonserver/{rel}")
    stub = f"site/pytriton/tritonserver/python_backend_stubs/{STUB_PYTHON}/triton_python_backend_stub"
    if not any(i.arc == stub for i in sel.items):
        raise PackError(f"no Python {STUB_PYTHON} stub under {root}/python_backend_stubs")
    sel.items.append(Item("site/pytriton/__init__.py", len(PYTRITON_INIT), data=PYTRITON_INIT.encode()))
    libs = site / "nvidia_pytriton.libs"
    for f in sorted(libs.iterdir()):
        if f.name.startswith("libpython"):
            sel.notes.append(f"left out {f.name} ({f.stat().st_size / 2**20:.1f} MiB): the stub uses the machine's")
            continue
        sel.add_file(f, f"site/nvidia_pytriton.libs/{f.name}")


def dist_items(sel: Selection, name: str) -> None:
    """One installed distribution's files (its RECORD), less scripts, bytecode and tests."""
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError as err:
        raise PackError(f"{name} is not installed in this venv") from err
    for f in dist.files or []:
        rel = f.as_posix()
        if rel.startswith("..") or _dropped(rel) or rel.endswith("/RECORD"):
            continue
        if name == "tritonclient" and rel.startswith("tritonclient/http/"):
            continue  # the kit's GPU run reaches Triton through perf_analyzer and gRPC only
        path = Path(dist.locate_file(f))
        if path.is_file():
            sel.add_file(path, f"{DIST_FOLDER.get(name, 'site')}/{rel}")


def perf_items(sel: Selection) -> None:
    from servelab.triton import perf

    try:
        sel.add_file(perf.real_binary("perf_analyzer"), "bin/perf_analyzer")
    except perf.PerfAnalyzerError as err:
        raise PackError(str(err)) from err


def wheel_version(name: str, pinned: str | None) -> str:
    if pinned:
        return pinned
    try:
        return md.version(name)
    except md.PackageNotFoundError as err:
        raise PackError(f"{name} is not installed here: cannot tell which version to fetch") from err


def wheel_items(sel: Selection, wheel: Path, folder: str) -> None:
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.is_dir() or _dropped(info.filename) or info.filename.endswith("/RECORD"):
                continue
            data = z.read(info)
            mode = (info.external_attr >> 16) & 0o777 or 0o644
            sel.items.append(Item(f"{folder}/{info.filename}", len(data), data=data, mode=mode))


def find_wheel(folder: Path, name: str, version: str) -> Path | None:
    stem = name.replace("-", "_").lower()
    for w in sorted(folder.glob("*.whl")):
        n, v = w.name.split("-")[:2]
        if n.lower() == stem and v == version and "cp312" in w.name:
            return w
    return None


def download_wheels(dest: Path) -> None:
    """``pip download`` the cp312 manylinux wheels of WHEELS (PyPI) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    want = [f"{n}=={wheel_version(n, v)}" for n, (v, _) in WHEELS.items()]
    missing = [w for w in want if find_wheel(dest, *w.split("==")) is None]
    if not missing:
        return
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", STUB_PYTHON, "--implementation", "cp",
           "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
           "--platform", "manylinux_2_28_x86_64", "-d", str(dest), *missing]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PackError(f"pip download failed ({' '.join(missing)}):\n{proc.stderr[-2000:]}")


def select(wheels: Path | None = None, site: Path | None = None) -> Selection:
    """Everything the archive holds. Without ``wheels`` (a folder of cp312
    wheels) the wheel parts are left out and a note says so (``--list``)."""
    site = site or site_packages()
    sel = Selection()
    triton_items(sel, site)
    perf_items(sel)
    for name in VENV_DISTS:
        dist_items(sel, name)
    for name, (version, folder) in WHEELS.items():
        version = wheel_version(name, version)
        wheel = find_wheel(wheels, name, version) if wheels else None
        if wheel is None:
            sel.notes.append(f"{name}=={version} (cp312 wheel) not counted: not downloaded yet")
            continue
        wheel_items(sel, wheel, folder)
    sel.items.append(_manifest_item(sel))
    return sel


def _manifest_item(sel: Selection) -> Item:
    data = json.dumps({
        "made": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "stub_python": STUB_PYTHON,
        "versions": {n: _version_or_none(n) for n in (*VENV_DISTS, "nvidia-pytriton")},
        "wheels": {n: wheel_version(n, v) for n, (v, _) in WHEELS.items()},
        "groups_bytes": sel.groups(),
        "notes": sel.notes,
    }, indent=1).encode()
    return Item(MANIFEST_NAME, len(data), data=data)


def _version_or_none(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def describe(sel: Selection) -> str:
    lines = [f"{'part':<44} {'MiB':>8}"]
    lines += [f"{k:<44} {v / 2**20:8.1f}" for k, v in sel.groups().items()]
    lines.append(f"{'total (unpacked)':<44} {sel.total() / 2**20:8.1f}")
    lines += [f"note: {n}" for n in sel.notes]
    return "\n".join(lines)


def repository_bytes(root: Path | None = None) -> int:
    """What a device call sends besides carried folders: tracked and untracked-not-ignored files."""
    root = root or paths.REPO_ROOT
    proc = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          capture_output=True)
    if proc.returncode != 0:
        raise PackError(f"git ls-files failed in {root}: {proc.stderr.decode(errors='replace')[-500:]}")
    total = 0
    for rel in proc.stdout.decode().split("\0"):
        p = root / rel
        if rel and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def check_fits(archive_bytes: int, repo_bytes: int, limit: int = CARRY_LIMIT) -> str:
    """One line with the sizes; PackError when archive and repository exceed the carry limit."""
    total = archive_bytes + repo_bytes
    line = (f"packed {archive_bytes / 2**20:.1f} MiB + repository {repo_bytes / 2**20:.1f} MiB = "
            f"{total / 2**20:.1f} MiB of the {limit / 2**20:.0f} MiB a device call carries")
    if total > limit:
        raise PackError(line + ": too big")
    return line


def write_archive(sel: Selection, archive: Path) -> None:
    """A tar of the selection, compressed with xz (the xz program when present: threads; else lzma)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(archive.name + ".part")
    xz = shutil.which("xz")
    with open(tmp, "wb") as out:
        if xz:
            proc = subprocess.Popen([xz, "-T0", "-6", "-c"], stdin=subprocess.PIPE, stdout=out)
            with tarfile.open(fileobj=proc.stdin, mode="w|") as tar:
                _add_all(tar, sel)
            proc.stdin.close()
            if proc.wait() != 0:
                raise PackError("xz failed")
        else:
            with tarfile.open(fileobj=out, mode="w:xz") as tar:
                _add_all(tar, sel)
    os.replace(tmp, archive)


def _add_all(tar: tarfile.TarFile, sel: Selection) -> None:
    for item in sel.items:
        info = tarfile.TarInfo(item.arc)
        info.size, info.mode, info.mtime = item.size, item.mode, int(time.time())
        if item.data is not None:
            tar.addfile(info, io.BytesIO(item.data))
        else:
            with open(item.src, "rb") as f:
                tar.addfile(info, f)


def build(out: Path = DEFAULT_DIR, wheels: Path | None = None) -> str:
    """Download the cp312 wheels (unless given), write ``out/ARCHIVE_NAME``; return a report."""
    out = Path(out)
    wheel_dir = Path(wheels) if wheels else out.parent / "gpu-pack-wheels"  # beside it: never carried
    if wheels is None:
        download_wheels(wheel_dir)
    sel = select(wheel_dir)
    if any("not downloaded" in n for n in sel.notes):
        raise PackError("; ".join(sel.notes))
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.iterdir():  # the folder is carried whole: only the archive goes in it
        if stale.is_file():
            stale.unlink()
    archive = out / ARCHIVE_NAME
    t0 = time.perf_counter()
    write_archive(sel, archive)
    line = check_fits(archive.stat().st_size, repository_bytes())
    return "\n".join([describe(sel), f"wrote {archive} in {time.perf_counter() - t0:.0f} s", line])
