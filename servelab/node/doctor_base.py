"""What `servelab doctor`'s checks build on, standard library only (the doctor
runs with the node's bare ``python3``): the result row, the :class:`Host`
every probe goes through, and the version facts it judges -- the pins read
from the kit's Dockerfiles and requirements, which driver branches run them
on which GPUs, and an ONNX file's IR version and opset read without the onnx
package."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


@dataclass
class Result:
    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass
class Gpu:
    index: int
    name: str
    capability: tuple[int, int]
    driver: str


class Host:
    """Where the checks look: a PATH for executables and a command runner."""

    def __init__(self, path: str | None = None, timeout: float = 20.0, root: str | os.PathLike = "/"):
        self.path = os.environ.get("PATH", "") if path is None else path
        self.timeout = timeout
        self.root = Path(root)  # where /proc/... is read (a folder of stand-in files in the tests)

    def read(self, path: str) -> str:
        """A system file's text ("" when missing or unreadable)."""
        try:
            return (self.root / path.lstrip("/")).read_text()
        except OSError:
            return ""

    def which(self, exe: str) -> str | None:
        return shutil.which(exe, path=self.path)

    def run(self, *cmd: str, timeout: float | None = None) -> tuple[int, str]:
        """(exit code, stdout+stderr); 127 when the program is missing."""
        exe = self.which(cmd[0])
        if exe is None:
            return 127, f"{cmd[0]}: not found"
        env = dict(os.environ, PATH=self.path)
        timeout = timeout or self.timeout
        try:
            p = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True,
                               timeout=timeout, env=env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return 124, f"{' '.join(cmd)}: no answer within {timeout:.0f} s"
        return p.returncode, (p.stdout + p.stderr).strip()


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


# ONNX Runtime 1.19.2 (inside Triton 24.10) reads ONNX IR <= 10, default-domain opset <= 21.
ONNX_MAX_IR, ONNX_MAX_OPSET = 10, 21
# Data-center driver branches that run the Triton 24.10 (CUDA 12.6) containers through forward
# compatibility. (R470 too, but the FastAPI images need >= 525.60.13, so it is below the floor.)
DATACENTER_COMPAT_BRANCHES = (525, 535, 545)
TRITON_MIN_DRIVER = 560
FASTAPI_MIN_DRIVER = (525, 60, 13)  # CUDA 12.x wheels in the FastAPI images: minor-version compatibility
LAST_PASCAL_BRANCH = 580            # R590+ dropped Maxwell, Pascal and Volta
LAST_P100_TRITON = "24.10"          # 24.11+: the ONNX Runtime backend has no sm_60 kernels


@dataclass
class Pins:
    triton_tag: str | None = None       # e.g. "24.10" from docker/Dockerfile.triton
    sdk_tag: str | None = None          # e.g. "24.10" from docker-compose-triton.yaml
    torch_indexes: tuple[str, ...] = ()  # TORCH_INDEX_URL defaults of the torch images
    ort_gpu: str | None = None          # onnxruntime-gpu pin of fastapi_onnx


def read_pins(repo: Path) -> Pins:
    pins = Pins()
    tri = _read(repo / "docker" / "Dockerfile.triton")
    m = re.search(r"^FROM\s+nvcr\.io/nvidia/tritonserver:(\d\d\.\d\d)-py3\s*$", tri, re.M)
    pins.triton_tag = m.group(1) if m else None
    m = re.search(r"tritonserver:(\d\d\.\d\d)-py3-sdk", _read(repo / "docker" / "docker-compose-triton.yaml"))
    pins.sdk_tag = m.group(1) if m else None
    indexes = []
    for dockerfile in (repo / "docker" / "Dockerfile.triton", repo / "fastapi_pt" / "Dockerfile"):
        m = re.search(r"^ARG\s+TORCH_INDEX_URL=(\S+)", _read(dockerfile), re.M)
        if m:
            indexes.append(m.group(1))
    pins.torch_indexes = tuple(indexes)
    m = re.search(r"^onnxruntime-gpu==([\d.]+)", _read(repo / "fastapi_onnx" / "requirements.txt"), re.M)
    pins.ort_gpu = m.group(1) if m else None
    return pins


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def pin_requirements(pins: Pins) -> list[tuple[str, tuple[int, int]]]:
    """(pinned thing, lowest compute capability it runs on), from the facts
    gathered for this kit (wheel and container release notes)."""
    reqs: list[tuple[str, tuple[int, int]]] = []
    if pins.triton_tag:  # the server runs on cc 6.0 up to 24.12, but its ONNX backend only up to 24.10
        if pins.triton_tag <= LAST_P100_TRITON:
            reqs.append((f"Triton {pins.triton_tag}", (6, 0)))
        elif pins.triton_tag <= "24.12":
            reqs.append((f"Triton {pins.triton_tag}'s ONNX Runtime backend", (7, 5)))
        else:
            reqs.append((f"Triton {pins.triton_tag}", (7, 5)))
    for url in pins.torch_indexes:
        flavour = url.rstrip("/").rsplit("/", 1)[-1]
        if flavour == "cpu":
            continue
        cuda = {"cu118": (3, 7), "cu121": (5, 0), "cu124": (5, 0), "cu126": (5, 0)}
        reqs.append((f"torch wheels {flavour}", cuda.get(flavour, (7, 5))))  # cu128/cu130: sm_75+
    if pins.ort_gpu:  # 1.19-1.26: CUDA 12 with sm_60; 1.27+: CUDA 13, sm_75+
        reqs.append((f"onnxruntime-gpu {pins.ort_gpu}", (6, 0) if _vtuple(pins.ort_gpu) < (1, 27) else (7, 5)))
    return reqs


def driver_verdict(driver: str, capability: tuple[int, int] = (6, 0), open_module: bool = False) -> tuple[str, str]:
    """(status, why) for a driver version on a GPU of this compute capability."""
    version = _vtuple(driver)
    if not version:
        return FAIL, f"driver version {driver!r} not understood"
    branch = version[0]
    old_gpu = capability < (7, 5)  # Maxwell, Pascal, Volta
    if old_gpu and open_module:
        return FAIL, "the open kernel module does not support this GPU (Turing and newer only)"
    if old_gpu and branch > LAST_PASCAL_BRANCH:
        return FAIL, f"R{branch} no longer supports this GPU (R{LAST_PASCAL_BRANCH} is the last branch for Pascal)"
    if version < FASTAPI_MIN_DRIVER:
        return FAIL, "too old: the FastAPI images' CUDA 12.6 libraries need >= 525.60.13"
    if branch >= TRITON_MIN_DRIVER:
        return PASS, f"R{branch}: Triton 24.10 needs >= {TRITON_MIN_DRIVER}; FastAPI images >= 525.60.13"
    if branch in DATACENTER_COMPAT_BRANCHES:
        return WARN, (f"R{branch} runs Triton 24.10 only through CUDA forward compatibility (data-center "
                      f"GPUs); the lab is planned for {TRITON_MIN_DRIVER}-{LAST_PASCAL_BRANCH}")
    return FAIL, f"R{branch}: Triton 24.10 needs >= {TRITON_MIN_DRIVER} (or data-center R525/R535/R545)"


def driver_ok(driver: str) -> bool:
    return driver_verdict(driver)[0] != FAIL


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def onnx_versions(data: bytes) -> tuple[int | None, int | None]:
    """(IR version, default-domain opset) of a serialized ONNX ModelProto,
    read from its top-level fields without the onnx package."""
    ir = opset = None
    i = 0
    try:
        while i < len(data):
            key, i = _varint(data, i)
            field, wire = key >> 3, key & 7
            if wire == 0:
                value, i = _varint(data, i)
                if field == 1:
                    ir = value
            elif wire == 2:
                size, i = _varint(data, i)
                if field == 8:  # OperatorSetIdProto {1: domain, 2: version}
                    domain, version = _opset_entry(data[i:i + size])
                    if domain in ("", "ai.onnx"):
                        opset = version
                i += size
            elif wire == 1:
                i += 8
            elif wire == 5:
                i += 4
            else:
                break
    except IndexError:
        pass
    return ir, opset


def _opset_entry(buf: bytes) -> tuple[str, int | None]:
    domain, version, i = "", None, 0
    while i < len(buf):
        key, i = _varint(buf, i)
        if key & 7 == 2:
            size, i = _varint(buf, i)
            if key >> 3 == 1:
                domain = buf[i:i + size].decode(errors="replace")
            i += size
        elif key & 7 == 0:
            value, i = _varint(buf, i)
            if key >> 3 == 2:
                version = value
        else:
            break
    return domain, version
