"""Notebook 6b on the node (docker/docker-compose-analyzer.yaml): the SDK image's Model Analyzer
in remote launch mode against a Triton of its own. The admin-key rule: that Triton keeps
shared-memory, logging and trace behind the stack's key, and its open model-repository API is
reachable only on the loopback of a network namespace that nothing but Model Analyzer shares."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from servelab.core import procs
from servelab.triton import analyzer

from .dockerkit import DOCKER, REPO, SECRETS, STACKS, compose_env, gpu_devices, mounts, published, render, services

STACK = "triton+analyzer"
KEY = SECRETS["TRITON_ADMIN_KEY"]


@pytest.fixture(scope="module")
def svcs(rendered) -> dict:
    return services(rendered[STACK])


def flag_values(command: list[str], flag: str) -> list[str]:
    return [a.split("=", 1)[1] for a in command if a.startswith(f"--{flag}=")]


def test_the_analyzer_services_start_only_with_their_profile(svcs, empty_env_file):
    assert {"triton_analyzer", "model_analyzer"} <= set(svcs)
    for name in ("triton_analyzer", "model_analyzer"):
        assert svcs[name]["profiles"] == ["analyzer"]
    plain = services(compose_plain(empty_env_file))
    assert not {"triton_analyzer", "model_analyzer"} & set(plain)


def compose_plain(env_file):
    from servelab.node import compose
    return compose.config_json(STACKS[STACK], env=compose_env(), cwd=REPO, extra_args=["--env-file", str(env_file)])


def test_its_triton_runs_the_command_analyzer_py_writes(svcs):
    assert svcs["triton_analyzer"]["command"] == analyzer.node_server_command(KEY)


def test_its_triton_keeps_three_apis_keyed_and_listens_on_loopback_only(svcs):
    cmd = svcs["triton_analyzer"]["command"]
    for flag in ("http-restricted-api", "grpc-restricted-protocol"):
        (value,) = flag_values(cmd, flag)
        apis, _, key = value.partition(":")
        assert set(apis.split(",")) == set(analyzer.KEYED_APIS) == {"shared-memory", "logging", "trace"}
        assert key == f"admin-key={KEY}"
    for flag in ("http-address", "grpc-address", "metrics-address"):
        assert flag_values(cmd, flag) == ["127.0.0.1"], flag
    assert flag_values(cmd, "model-control-mode") == ["explicit"]   # Model Analyzer loads the variants
    assert not flag_values(cmd, "load-model")                       # nothing loaded at start
    # nothing published, and only Model Analyzer shares its network namespace
    assert not published(svcs["triton_analyzer"])
    sharing = [n for n, s in svcs.items() if s.get("network_mode") == "service:triton_analyzer"]
    assert sharing == ["model_analyzer"]
    assert not published(svcs["model_analyzer"])


def test_the_stack_triton_still_keys_all_four(svcs):
    cmd = svcs["triton_server"]["command"]
    for flag in ("http-restricted-api", "grpc-restricted-protocol"):
        keyed = {v.split(":", 1)[0] for v in flag_values(cmd, flag)}
        assert keyed == {"model-repository", *analyzer.KEYED_APIS}, flag


def test_no_docker_socket_and_model_analyzer_runs_the_sdk_image(svcs):
    for name in ("triton_analyzer", "model_analyzer"):
        for m in svcs[name].get("volumes", []):
            assert "docker.sock" not in m["source"], name
    assert svcs["model_analyzer"]["image"] == svcs["jupyter"]["image"] == "servelab/jupyter-sdk:24.10"
    assert svcs["jupyter"]["build"]["args"]["BASE_IMAGE"] == "nvcr.io/nvidia/tritonserver:24.10-py3-sdk"
    assert svcs["triton_analyzer"]["image"] == svcs["triton_server"]["image"]
    assert "gpu" in str(svcs["triton_analyzer"]["deploy"]) and "deploy" not in svcs["model_analyzer"]


def test_model_analyzer_reads_the_committed_config_at_the_paths_it_names(svcs):
    ma = svcs["model_analyzer"]
    where = mounts(ma)
    assert where[analyzer.NODE_CLONE]["source"] == str(REPO)
    assert where[analyzer.NODE_MODELS]["source"] == str(REPO / "models_staging")
    assert ma["working_dir"] == analyzer.NODE_CLONE
    script = ma["command"][-1]
    assert f"rm -rf {analyzer.NODE_RUN_DIR} " in script
    assert script.endswith(f"model-analyzer profile -f {analyzer.NODE_CONFIG.relative_to(REPO)}")
    cfg = analyzer.node_config()
    assert cfg["triton_launch_mode"] == "remote"
    assert "triton_server_flags" not in cfg and not cfg.get("reload_model_disable")   # it loads every variant
    http, grpc, metrics = (flag_values(svcs["triton_analyzer"]["command"], f"{p}-port")[0]
                           for p in ("http", "grpc", "metrics"))
    assert cfg["triton_http_endpoint"] == f"127.0.0.1:{http}"
    assert cfg["triton_grpc_endpoint"] == f"127.0.0.1:{grpc}"
    assert cfg["triton_metrics_url"] == f"http://127.0.0.1:{metrics}/metrics"
    for key in ("output_model_repository_path", "checkpoint_directory", "export_path"):
        assert cfg[key].startswith(f"{analyzer.NODE_CLONE}/{analyzer.NODE_RUN_DIR}/"), key


def test_committed_config_is_what_analyzer_py_writes(tmp_path):
    out = analyzer.write_node_config(tmp_path / "node.yaml")
    assert analyzer.NODE_CONFIG.read_text() == out.read_text()
    body = "\n".join(line for line in out.read_text().splitlines() if not line.startswith("#"))
    assert json.loads(body) == analyzer.node_config()
    assert KEY not in out.read_text() and "admin-key" not in out.read_text()


PARSE = """
import sys
from model_analyzer.cli.cli import CLI
from model_analyzer.config.input.config_command_profile import ConfigCommandProfile
config = ConfigCommandProfile()
cli = CLI()
cli.add_subcommand(cmd="profile", help="", config=config)
sys.argv = ["model-analyzer", "profile", "-f", sys.argv[1]]
_, cfg = cli.parse()
print(cfg.triton_launch_mode, cfg.triton_grpc_endpoint, cfg.reload_model_disable,
      ",".join(m.model_name() for m in cfg.profile_models))
"""


def parse_with_model_analyzer(text: str, tmp_path) -> subprocess.CompletedProcess:
    """Model Analyzer's own config parser (the kit's 1.58.0, standing in for the SDK image's
    1.45.0) on the node config, its container paths moved under tmp_path (it checks they exist)."""
    clone = tmp_path / "clone"
    (clone / analyzer.NODE_RUN_DIR).mkdir(parents=True)
    text = text.replace(analyzer.NODE_CLONE, str(clone))
    text = text.replace(f'"{analyzer.NODE_MODELS}"', json.dumps(str(REPO / "models_staging")))
    cfg = tmp_path / "profile.yaml"
    cfg.write_text(text)
    env = procs.child_env()   # perf_analyzer on PATH, as in the SDK image
    return subprocess.run([sys.executable, "-c", PARSE, str(cfg)], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=120)


@pytest.mark.parametrize("config", [analyzer.NODE_CONFIG, analyzer.NODE_CONFIG_CPU], ids=["gpu", "cpu"])
def test_model_analyzer_accepts_the_node_config(tmp_path, config):
    result = parse_with_model_analyzer(config.read_text(), tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["remote", "127.0.0.1:8001", "False", analyzer.NODE_MODEL]


def test_model_analyzer_rejects_a_broken_node_config(tmp_path):
    broken = analyzer.NODE_CONFIG.read_text().replace('"client_protocol"', '"client_protocl"')
    result = parse_with_model_analyzer(broken, tmp_path)
    assert result.returncode != 0


def test_docs_name_the_override():
    readme = (DOCKER / "README.md").read_text()
    assert "docker-compose-analyzer.yaml" in readme and "remote" in readme


def test_the_cpu_override_searches_kind_cpu_copies_on_the_cpu_repository(tmp_path):
    """A Docker host without a GPU (the compose check): the committed CPU config is what analyzer.py
    writes, KIND_CPU in place of KIND_GPU and 1 s windows, nothing else changed; the override runs it, reads the
    KIND_CPU copy of the repository read-only, and reserves no GPU."""
    out = analyzer.write_node_config(tmp_path / "cpu.yaml", kind="KIND_CPU")
    assert analyzer.NODE_CONFIG_CPU.read_text() == out.read_text()
    gpu, cpu = analyzer.node_config(), analyzer.node_config(kind="KIND_CPU")
    assert cpu.pop("perf_analyzer_flags") == analyzer.NODE_CPU_PERF_FLAGS and gpu.pop("perf_analyzer_flags") == {}
    assert json.dumps(cpu) == json.dumps(gpu).replace('"KIND_GPU"', '"KIND_CPU"') != json.dumps(gpu)
    env_file = tmp_path / ".env"
    env_file.write_text("")
    svcs = services(render("triton+analyzer+cpu", env_file))
    script = svcs["model_analyzer"]["command"][-1]
    cfg = analyzer.NODE_CONFIG_CPU.relative_to(REPO)
    assert script.endswith(f"model-analyzer profile -f {cfg}") and f"cp {cfg} {analyzer.NODE_RUN_DIR}/profile.yaml" in script
    for name in ("triton_analyzer", "model_analyzer"):
        models = mounts(svcs[name])[analyzer.NODE_MODELS]
        assert (models["source"], models.get("read_only")) == ("triton_cpu_models", True), name
    assert not gpu_devices(svcs["triton_analyzer"])


def test_node_run_reads_the_node_results_or_names_the_command(tmp_path):
    """In the node's Jupyter container notebook 6b reads what the node command wrote; before it ran,
    the error names the command to run."""
    with pytest.raises(analyzer.AnalyzerError, match="--profile analyzer run --rm model_analyzer"):
        analyzer.node_run(tmp_path)
    run_dir = tmp_path / analyzer.NODE_RUN_DIR
    csv = run_dir / analyzer.RESULTS_CSV
    csv.parent.mkdir(parents=True)
    csv.write_text("Model,Batch\n")
    (run_dir / "profile.yaml").write_text("{}")
    run = analyzer.node_run(tmp_path)
    assert run.results_csv == csv and run.model == analyzer.NODE_MODEL and run.space == analyzer.NODE_SPACE
