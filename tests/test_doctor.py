"""`servelab doctor`: each check driven both ways with stand-in executables on
a PATH of their own (docker, nvidia-smi, nvidia-ctk), real sockets and real
files; and the honest verdict on this machine (no Docker engine, no GPU)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.core import paths
from servelab.node import compose, doctor
from servelab.node.doctor import FAIL, PASS, SKIP, WARN, Host

P100S = "0, Tesla P100-PCIE-16GB, 6.0, 560.35.03\n1, Tesla P100-PCIE-16GB, 6.0, 560.35.03"


SMOKE = {
    "ok": 'echo "GPU 0: Tesla P100-PCIE-16GB (UUID: GPU-1)"; echo "GPU 1: Tesla P100-PCIE-16GB (UUID: GPU-2)"',
    "nvml": 'echo "Failed to initialize NVML: Unknown Error"; exit 255',
    "denied": ('echo "docker: permission denied while trying to connect to the Docker daemon socket at '
               'unix:///var/run/docker.sock" >&2; exit 126'),
    "no-toolkit": ('echo \'docker: Error response from daemon: could not select device driver "" with capabilities: '
                   '[[gpu]].\' >&2; exit 125'),
}


def make_bin(tmp_path: Path, *, engine: bool = True, compose_version: str | None = "v2.40.3",
             nvidia_runtime: bool = True, images: bool = True, gpus: str | None = P100S,
             smi_error: str | None = None, ctk: bool = True, docker: bool = True,
             cgroup: str = "cgroupfs", smoke: str = "ok", denied: bool = False,
             module: str | None = "proprietary") -> Host:
    """A folder of small shell scripts standing in for the host's tools (and a /proc of its own)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "root" / "proc" / "driver" / "nvidia"
    proc.mkdir(parents=True, exist_ok=True)
    if module:
        kind = "Open Kernel Module for x86_64" if module == "open" else "x86_64 Kernel Module"
        (proc / "version").write_text(f"NVRM version: NVIDIA UNIX {kind}  560.35.03  Release Build\n")

    def script(name: str, body: str) -> None:
        p = bindir / name
        p.write_text("#!/bin/sh\n" + body)
        p.chmod(0o755)

    if docker:
        runtimes = '{"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}}' if nvidia_runtime \
            else '{"runc":{"path":"runc"}}'
        down = 'echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." >&2; exit 1'
        if denied:
            down = SMOKE["denied"]
            engine = False
        compose_line = (f'echo "Docker Compose version {compose_version}"' if compose_version
                        else 'echo "docker: unknown command: docker compose" >&2; exit 1')
        script("docker", f"""case "$*" in
  "compose version") {compose_line} ;;
  "info --format {{{{.ServerVersion}}}}") {"echo 28.2.2" if engine else down} ;;
  "info --format {{{{json .Runtimes}}}}") {f"echo '{runtimes}'" if engine else down} ;;
  "info --format {{{{.DockerRootDir}}}}") {f"echo {tmp_path}" if engine else down} ;;
  "info --format {{{{.CgroupDriver}}}}") {f"echo {cgroup}" if engine else down} ;;
  "run --rm --gpus all ubuntu:24.04 nvidia-smi -L") {SMOKE[smoke] if engine else down} ;;
  "image inspect "*) {"exit 0" if images else 'echo "No such image" >&2; exit 1'} ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
""")
    if smi_error is not None:
        script("nvidia-smi", f'echo "{smi_error}"; exit 9\n')
    elif gpus is not None:
        lines = " ".join(f"'{line}'" for line in gpus.splitlines())
        script("nvidia-smi", f"printf '%s\\n' {lines}\n")  # shell builtins only: PATH is this folder
    if ctk:
        script("nvidia-ctk", "exit 0\n")
    return Host(path=str(bindir), root=tmp_path / "root")


def by_name(results) -> dict[str, doctor.Result]:
    return {r.name: r for r in results}


# --------------------------------------------------------------------------
# Docker, Compose, NVIDIA toolkit
# --------------------------------------------------------------------------

def test_docker_engine(tmp_path):
    assert doctor.check_docker(Host(path=str(tmp_path))).status == FAIL  # empty PATH: no CLI
    assert "not found" in doctor.check_docker(Host(path=str(tmp_path))).detail
    down = doctor.check_docker(make_bin(tmp_path / "a", engine=False))
    assert down.status == FAIL and "Cannot connect" in down.detail and "systemctl start docker" in down.fix
    up = doctor.check_docker(make_bin(tmp_path / "b"))
    assert up.status == PASS and "28.2.2" in up.detail
    denied = doctor.check_docker(make_bin(tmp_path / "c", denied=True))
    assert denied.status == FAIL and "permission denied" in denied.detail
    assert denied.fix.startswith("add yourself to the docker group: sudo usermod -aG docker $USER")


@pytest.mark.parametrize("driver, status", [("cgroupfs", PASS), ("systemd", WARN)])
def test_cgroup_driver(tmp_path, driver, status):
    r = doctor.check_cgroup_driver(make_bin(tmp_path, cgroup=driver))
    assert r.status == status, r
    if status == WARN:
        assert "issue 48" in r.detail and "native.cgroupdriver=cgroupfs" in r.fix and "restart docker" in r.fix
    assert doctor.check_cgroup_driver(make_bin(tmp_path / "x"), cpu=True).status == SKIP
    assert doctor.check_cgroup_driver(make_bin(tmp_path / "y"), engine_ok=False).status == SKIP


@pytest.mark.parametrize("smoke, status, fix", [
    ("ok", PASS, ""),
    ("nvml", FAIL, "native.cgroupdriver=cgroupfs"),
    ("denied", FAIL, "sudo usermod -aG docker $USER"),
    ("no-toolkit", FAIL, "nvidia-ctk runtime configure --runtime=docker"),
])
def test_gpus_inside_a_container(tmp_path, smoke, status, fix):
    """The real `docker run --rm --gpus all ubuntu:24.04 nvidia-smi -L`, through a stand-in docker."""
    r = doctor.check_gpu_container(make_bin(tmp_path, smoke=smoke))
    assert r.status == status, r
    assert fix in r.fix
    if smoke == "ok":
        assert "lists 2 GPU(s)" in r.detail
    if smoke == "nvml":
        assert "Failed to initialize NVML: Unknown Error" in r.detail and "--force-recreate" in r.fix


@pytest.mark.parametrize("version, status", [("v2.40.3", PASS), ("v2.24.0", PASS), ("v2.20.2", FAIL),
                                             (None, FAIL)])
def test_compose_plugin(tmp_path, version, status):
    r = doctor.check_compose(make_bin(tmp_path, compose_version=version))
    assert r.status == status, r
    if status == FAIL:
        assert "docker-compose-plugin" in r.fix


def test_nvidia_container_toolkit(tmp_path):
    assert doctor.check_nvidia_runtime(make_bin(tmp_path / "a"), cpu=True).status == SKIP
    assert doctor.check_nvidia_runtime(make_bin(tmp_path / "b")).status == PASS
    missing = doctor.check_nvidia_runtime(make_bin(tmp_path / "c", ctk=False))
    assert missing.status == FAIL and "nvidia-ctk runtime configure" in missing.fix
    assert doctor.check_nvidia_runtime(make_bin(tmp_path / "d", nvidia_runtime=False)).status == WARN
    assert doctor.check_nvidia_runtime(make_bin(tmp_path / "e", engine=False)).status == WARN


# --------------------------------------------------------------------------
# GPUs vs the pins read from the repository's files
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pins():
    return doctor.read_pins(paths.REPO_ROOT)


def test_pins_are_read_from_the_files(pins):
    assert pins.triton_tag == "24.10" and pins.sdk_tag == "24.10"
    assert pins.torch_indexes == ("https://download.pytorch.org/whl/cu126",) * 2
    assert pins.ort_gpu == "1.22.0"


def test_two_p100s_pass(tmp_path, pins):
    results = by_name(doctor.check_gpus(make_bin(tmp_path), pins))
    assert results["NVIDIA GPUs"].status == PASS and "2 GPU(s)" in results["NVIDIA GPUs"].detail
    assert results["Pins support these GPUs"].status == PASS
    assert results["NVIDIA driver"].status == PASS


def test_one_gpu_warns(tmp_path, pins):
    results = by_name(doctor.check_gpus(make_bin(tmp_path, gpus=P100S.splitlines()[0]), pins))
    assert results["NVIDIA GPUs"].status == WARN and "gpus: [0]" in results["NVIDIA GPUs"].fix


def test_maxwell_gpu_fails_on_the_triton_pin(tmp_path, pins):
    results = by_name(doctor.check_gpus(make_bin(tmp_path, gpus="0, Tesla M40, 5.2, 560.35.03"), pins))
    r = results["Pins support these GPUs"]
    assert r.status == FAIL
    assert "Triton 24.10 needs cc >= 6.0" in r.detail and "onnxruntime-gpu 1.22.0" in r.detail
    assert "torch" not in r.detail  # cu126 wheels still run on 5.x


def test_newer_pins_are_warned_about_on_a_p100(tmp_path):
    """Same P100s, but a repository pinning Triton 25.01, torch cu128 and onnxruntime-gpu 1.27."""
    repo = tmp_path / "repo"
    for rel in ("docker/Dockerfile.triton", "docker/docker-compose-triton.yaml", "fastapi_pt/Dockerfile",
                "fastapi_onnx/requirements.txt"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        text = (paths.REPO_ROOT / rel).read_text()
        text = text.replace("24.10", "25.01").replace("whl/cu126", "whl/cu128")
        text = text.replace("onnxruntime-gpu==1.22.0", "onnxruntime-gpu==1.27.0")
        (repo / rel).write_text(text)
    newer = doctor.read_pins(repo)
    assert newer.triton_tag == "25.01" and newer.ort_gpu == "1.27.0"
    r = by_name(doctor.check_gpus(make_bin(tmp_path), newer))["Pins support these GPUs"]
    assert r.status == FAIL and "cu126" in r.fix and "Triton <= 24.10" in r.fix
    for what in ("Triton 25.01", "torch wheels cu128", "onnxruntime-gpu 1.27.0"):
        assert what in r.detail


# The verdicts the issue asks for (P100 = compute capability 6.0), plus the edges around them.
DRIVER_VERDICTS = [
    ("535.183.01", "proprietary", WARN),  # data-center R535: Triton 24.10 only via forward compatibility
    ("560.35.03", "proprietary", PASS),   # CC-Ubuntu24.04-CUDA's driver
    ("580.95.05", "proprietary", PASS),   # the last branch with Pascal
    ("590.44.01", "proprietary", FAIL),   # R590+ dropped Pascal
    ("570.195.03", "open", FAIL),         # open kernel modules: Turing and newer only
    ("550.54.15", "proprietary", FAIL),   # not a forward-compatible branch for the 24.10 containers
    ("525.60.13", "proprietary", WARN),   # the FastAPI images' floor, R525 forward compatibility for Triton
    ("525.60.11", "proprietary", FAIL),   # below the FastAPI images' floor
    ("470.256.02", "proprietary", FAIL),  # too old for the FastAPI images' CUDA 12.6 libraries
]


@pytest.mark.parametrize("driver, module, status", DRIVER_VERDICTS)
def test_driver_verdicts_on_a_p100(tmp_path, pins, driver, module, status):
    host = make_bin(tmp_path, gpus=f"0, Tesla P100-PCIE-16GB, 6.0, {driver}", module=module)
    r = by_name(doctor.check_gpus(host, pins))["NVIDIA driver"]
    assert r.status == status, r
    assert f"({module} kernel module)" in r.detail
    if status != PASS:
        assert "nvidia-driver-570" in r.fix and "not an -open package" in r.fix and "not 590" in r.fix


def test_r590_is_fine_on_a_newer_gpu(tmp_path, pins):
    host = make_bin(tmp_path, gpus="0, Tesla T4, 7.5, 590.44.01", module="open")
    assert by_name(doctor.check_gpus(host, pins))["NVIDIA driver"].status == PASS


@pytest.mark.parametrize("tag, status", [("24.10", PASS), ("24.11", FAIL), ("24.12", FAIL), ("25.01", FAIL)])
def test_triton_image_verdicts_on_a_p100(tmp_path, tag, status):
    """24.10 is the last Triton whose ONNX Runtime backend has sm_60 kernels."""
    repo = tmp_path / "repo"
    for rel in ("docker/Dockerfile.triton", "docker/docker-compose-triton.yaml", "fastapi_pt/Dockerfile",
                "fastapi_onnx/requirements.txt"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text((paths.REPO_ROOT / rel).read_text().replace("24.10", tag))
    pins = doctor.read_pins(repo)
    assert pins.triton_tag == tag
    r = by_name(doctor.check_gpus(make_bin(tmp_path), pins))["Pins support these GPUs"]
    assert r.status == status, r
    if status == FAIL:
        assert f"Triton {tag}" in r.detail and "needs cc >= 7.5" in r.detail
        if tag < "25.01":
            assert "ONNX Runtime backend" in r.detail


def test_no_gpu(tmp_path, pins):
    missing = doctor.check_gpus(make_bin(tmp_path / "a", gpus=None), pins)
    assert [r.status for r in missing] == [FAIL] and "nvidia-smi: not found" in missing[0].detail
    broken = doctor.check_gpus(make_bin(tmp_path / "b", smi_error="NVIDIA-SMI has failed because it "
                                        "couldn't communicate with the NVIDIA driver"), pins)
    assert broken[0].status == FAIL and "couldn't communicate" in broken[0].detail
    assert "--cpu" in broken[0].fix
    assert [r.status for r in doctor.check_gpus(make_bin(tmp_path / "c", gpus=None), pins, cpu=True)] == [SKIP]


# --------------------------------------------------------------------------
# Ports, disk, artifacts, ONNX versions, images, secrets
# --------------------------------------------------------------------------

@pytest.mark.integration   # holds a port busy
def test_ports_free_and_busy():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        busy = doctor.check_ports([port])
        assert busy.status == FAIL and str(port) in busy.detail
    finally:
        listener.close()
    assert doctor.check_ports([port]).status == PASS


@pytest.mark.integration   # holds a port busy
def test_ports_held_by_the_labs_own_containers_are_not_in_the_way(tmp_path):
    """The compose check runs the doctor beside the running stack: its own ports read FAIL before."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text("#!/bin/sh\nprintf 'servelab-triton\\t127.0.0.1:8000-8002->8000-8002/tcp\\n"
                                   "servelab-triton\\t0.0.0.0:80->5000/tcp, [::]:80->5000/tcp\\n"
                                   "other\\t0.0.0.0:9999->9999/tcp\\n'\n")
    (bindir / "docker").chmod(0o755)
    assert doctor.lab_ports(Host(path=str(bindir))) == {80, 8000, 8001, 8002}
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        mine = doctor.check_ports([port], held_by_lab={port})
        assert mine.status == PASS and "lab's own" in mine.detail
        assert doctor.check_ports([port], held_by_lab={port + 1}).status == FAIL
    finally:
        listener.close()


def test_disk_space(tmp_path):
    assert doctor.check_disk(tmp_path, 0).status == PASS
    r = doctor.check_disk(tmp_path / "not" / "yet", 10 ** 9)  # nearest existing folder is measured
    assert r.status == FAIL and str(tmp_path) in r.detail


def test_artifacts(tmp_path):
    r = doctor.check_artifacts(tmp_path, ("fastapi", "triton"))
    assert r.status == FAIL and "fastapi_pt/food11.pth" in r.detail and "make models" in r.fix
    assert "models_staging" not in doctor.check_artifacts(tmp_path, ("fastapi",)).detail
    for p in doctor.artifact_paths(tmp_path, ("fastapi", "triton")):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    assert doctor.check_artifacts(tmp_path, ("fastapi", "triton")).status == PASS


def _tiny_onnx(ir_version: int, opset: int) -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid("com.example", 99)])
    model.ir_version = ir_version
    return model.SerializeToString()


@pytest.mark.parametrize("ir, opset", [(8, 17), (10, 21), (11, 23)])
def test_onnx_versions_are_read_without_the_onnx_package(ir, opset):
    assert doctor.onnx_versions(_tiny_onnx(ir, opset)) == (ir, opset)


def test_onnx_versions_of_the_built_model(built_models):
    import onnx

    path = paths.ONNX_TARGETS[0]
    model = onnx.load(str(path), load_external_data=False)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    assert doctor.onnx_versions(path.read_bytes()) == (model.ir_version, opset)


def test_onnx_compat(tmp_path):
    assert doctor.check_onnx_compat(tmp_path, ("triton",)).status == SKIP
    target = doctor.artifact_paths(tmp_path, ("triton",))
    onnx_path = next(p for p in target if p.suffix == ".onnx")
    onnx_path.parent.mkdir(parents=True)
    onnx_path.write_bytes(_tiny_onnx(8, 17))
    assert doctor.check_onnx_compat(tmp_path, ("triton",)).status == PASS
    onnx_path.write_bytes(_tiny_onnx(11, 17))  # what a newer exporter may write: ORT 1.19 refuses it
    r = doctor.check_onnx_compat(tmp_path, ("triton",))
    assert r.status == FAIL and "IR 11" in r.detail
    onnx_path.write_bytes(_tiny_onnx(10, 22))
    assert doctor.check_onnx_compat(tmp_path, ("triton",)).status == FAIL


def test_triton_images(tmp_path, pins):
    assert doctor.check_images(make_bin(tmp_path / "a"), pins, engine_ok=False).status == WARN
    missing = doctor.check_images(make_bin(tmp_path / "b", images=False), pins, engine_ok=True)
    assert missing.status == WARN and "docker pull nvcr.io/nvidia/tritonserver:24.10-py3" in missing.fix
    assert doctor.check_images(make_bin(tmp_path / "c"), pins, engine_ok=True).status == PASS
    mixed = doctor.Pins(triton_tag="24.10", sdk_tag="24.12")
    assert doctor.check_images(make_bin(tmp_path / "d"), mixed, engine_ok=True).status == FAIL
    assert doctor.check_images(make_bin(tmp_path / "e"), doctor.Pins(), engine_ok=True).status == FAIL
    assert doctor.check_images(make_bin(tmp_path / "f"), pins, engine_ok=True, stacks=("fastapi",)).status == SKIP


def test_env_file_secrets(tmp_path):
    env = tmp_path / ".env"
    r = doctor.check_env_file(env)
    assert r.status == FAIL and "--write-env" in r.fix
    env.write_text("JUPYTER_TOKEN=change-me\nTRITON_ADMIN_KEY=\n")  # .env.example copied unchanged
    assert doctor.check_env_file(env).status == FAIL
    env.write_text("# mine\nJUPYTER_TOKEN=kept-by-the-instructor\n")
    assert compose.write_env_file(env) == ["TRITON_ADMIN_KEY"]
    values = compose.read_env_file(env)
    assert values["JUPYTER_TOKEN"] == "kept-by-the-instructor"
    assert len(values["TRITON_ADMIN_KEY"]) >= 32
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    assert doctor.check_env_file(env).status == PASS
    assert compose.write_env_file(env) == []  # nothing to do the second time
    env.chmod(0o644)
    assert doctor.check_env_file(env).status == WARN
    other = tmp_path / "other.env"
    compose.write_env_file(other)
    assert compose.read_env_file(other)["TRITON_ADMIN_KEY"] != values["TRITON_ADMIN_KEY"]


# --------------------------------------------------------------------------
# Whole runs
# --------------------------------------------------------------------------

def test_a_ready_gpu_node_passes_everything(tmp_path, built_models):
    env = tmp_path / ".env"
    compose.write_env_file(env)
    results = doctor.run_checks(host=make_bin(tmp_path), repo=paths.REPO_ROOT, min_free_gb=0, env_file=env,
                                ports=[])
    assert {r.name: r.status for r in results if r.status != PASS} == {}
    names = [r.name for r in results]
    assert "Docker cgroup driver" in names and "GPUs inside a container" in names
    table = doctor.format_table(results)
    assert "0 failed" in table and "ready for the lab" in table


def test_a_cpu_host_skips_the_gpu_checks(tmp_path, built_models):
    env = tmp_path / ".env"
    compose.write_env_file(env)
    results = by_name(doctor.run_checks(host=make_bin(tmp_path, gpus=None, ctk=False), cpu=True,
                                        min_free_gb=0, env_file=env, ports=[]))
    assert results["NVIDIA GPUs"].status == SKIP and results["NVIDIA container toolkit"].status == SKIP
    assert results["GPUs inside a container"].status == SKIP and results["Docker cgroup driver"].status == SKIP
    assert all(r.status in (PASS, SKIP) for r in results.values())


def _docker_engine_here() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True, timeout=30).returncode == 0


def test_doctor_on_this_machine_reports_what_is_missing_and_fails(tmp_path):
    engine = _docker_engine_here()  # a running dockerd (make compose-check starts one) passes that row
    out = subprocess.run([sys.executable, "-m", "servelab.node.doctor", "--env-file", str(tmp_path / "none.env")],
                         capture_output=True, text=True, timeout=120, cwd=paths.REPO_ROOT)
    assert out.returncode == 1, out.stdout + out.stderr
    rows = {line[6:].split("  ")[0]: line[:4] for line in out.stdout.splitlines()
            if line[:4] in (PASS, WARN, FAIL, SKIP)}
    assert rows["Docker engine"] == (PASS if engine else FAIL)
    assert rows["NVIDIA GPUs"] == (FAIL if shutil.which("nvidia-smi") is None else rows["NVIDIA GPUs"])
    assert rows["Secrets in docker/.env"] == FAIL
    assert "fix: " in out.stdout and "NOT ready" in out.stdout


def test_write_env_from_the_command_line(tmp_path):
    env = tmp_path / "docker.env"
    out = subprocess.run([sys.executable, "-m", "servelab.node.doctor", "--write-env", "--env-file", str(env),
                          "--cpu"], capture_output=True, text=True, timeout=120, cwd=paths.REPO_ROOT)
    assert "generated JUPYTER_TOKEN, TRITON_ADMIN_KEY" in out.stdout
    assert compose.missing_secrets(env) == []
    assert "PASS  Secrets in docker/.env" in out.stdout


def test_servelab_doctor_is_a_cli_subcommand():
    out = subprocess.run([sys.executable, "-m", "servelab", "doctor", "--help"], capture_output=True,
                         text=True, timeout=60, cwd=paths.REPO_ROOT, env={**os.environ, "COLUMNS": "100"})
    assert out.returncode == 0, out.stderr
    assert "--cpu" in out.stdout and "--write-env" in out.stdout


def test_doctor_runs_on_the_standard_library_alone(tmp_path):
    """On the node it runs with the system python3 (no venv): no site-packages at all here (-S -E)."""
    out = subprocess.run([sys.executable, "-S", "-E", "-m", "servelab.node.doctor", "--cpu", "--write-env",
                          "--env-file", str(tmp_path / "x.env"), "--min-free-gb", "0"],
                         capture_output=True, text=True, timeout=120, cwd=paths.REPO_ROOT)
    assert "Traceback" not in out.stderr, out.stderr
    assert "PASS  Secrets in docker/.env" in out.stdout
    assert out.returncode in (0, 1)  # 1 here: no Docker engine on this machine


def test_verdict_table_for_a_p100(tmp_path, pins, capsys):
    """The table quoted in the closing note (printed with -s)."""
    rows = []
    for driver, module, status in DRIVER_VERDICTS[:5]:
        host = make_bin(tmp_path / driver, gpus=f"0, Tesla P100-PCIE-16GB, 6.0, {driver}", module=module)
        r = by_name(doctor.check_gpus(host, pins))["NVIDIA driver"]
        rows.append((f"driver {driver} ({module})", r.status, r.detail.split(": ", 1)[1]))
    for tag in ("24.10", "24.11"):
        repo = tmp_path / f"repo{tag}"
        for rel in ("docker/Dockerfile.triton", "docker/docker-compose-triton.yaml"):
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / rel).write_text((paths.REPO_ROOT / rel).read_text().replace("24.10", tag))
        r = by_name(doctor.check_gpus(make_bin(tmp_path / tag), doctor.read_pins(repo)))["Pins support these GPUs"]
        rows.append((f"image tritonserver:{tag}-py3", r.status, r.detail))
    print("\n| case (2x Tesla P100, cc 6.0) | verdict | why |\n|---|---|---|")
    for case, status, why in rows:
        print(f"| {case} | {status} | {why} |")
    assert [r[1] for r in rows] == [WARN, PASS, PASS, FAIL, FAIL, PASS, FAIL]
