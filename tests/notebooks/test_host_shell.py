"""The shell steps the notebooks give for the GPU host (`# runs on node-serve-system`)
name files, services, containers, variables, make targets and kit commands that
exist; and the in-container notebooks' default URLs are the ones the Compose
stacks give the Jupyter container."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import nbformat
import pytest
import yaml

from servelab.course import lessons, notebooks

from .nbkit import NOTEBOOKS_DIR, REPO_ROOT

KIT_ON_NODE = "~/serve-system-chi"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
SHELL_NOTEBOOKS = tuple(les.slug for les in lessons.LESSONS if les.runs in ("node", "container"))


def node_blocks(name: str) -> list[str]:
    """Shell blocks meant for the GPU host, from markdown cells."""
    nb = nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4)
    blocks = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for _lang, body in FENCE.findall(cell.source):
                if notebooks.runs_label(body) == lessons.RUNS_NODE:
                    blocks.append(body)
    return blocks


def node_commands(name: str) -> list[list[str]]:
    """Each command line of those blocks, split like a shell would (one level of && / ; / |)."""
    commands = []
    for block in node_blocks(name):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            argv: list[str] = []
            for token in lexer:
                if token in ("&&", "||", "|", ";"):
                    commands.append(argv)
                    argv = []
                else:
                    argv.append(token)
            commands.append(argv)
    return [c for c in commands if c]


def compose_file(path_on_node: str) -> Path:
    assert path_on_node.startswith(KIT_ON_NODE + "/"), f"{path_on_node}: give paths inside the kit's clone"
    return REPO_ROOT / path_on_node[len(KIT_ON_NODE) + 1:]


class _ComposeLoader(yaml.SafeLoader):
    """YAML with Compose's own tags (!reset, !override) read as plain values."""


_ComposeLoader.add_multi_constructor(
    "!", lambda loader, suffix, node: (loader.construct_mapping(node) if isinstance(node, yaml.MappingNode)
                                       else loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode)
                                       else loader.construct_scalar(node)))


def load_compose(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=_ComposeLoader)


def _container_names(files: list[Path]) -> set[str]:
    names = set()
    for f in files:
        for svc in (load_compose(f).get("services") or {}).values():
            if svc.get("container_name"):
                names.add(svc["container_name"])
    return names


def _make_targets() -> set[str]:
    text = (REPO_ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+):", text, re.M))


def _servelab_parser():
    from servelab import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, sub


def _check_servelab_command(module: str, args: list[str]) -> None:
    """`python3 -m servelab.<sub>.<cmd> ARGS` parses as `python -m servelab <cmd> ARGS` with the kit's
    CLI (or the module's own parser while it is not registered in servelab/cli.py)."""
    argv = [module.rsplit(".", 1)[1], *args]
    parser, sub = _servelab_parser()
    if argv[0] not in sub.choices:
        parser = argparse.ArgumentParser(prog="servelab")
        importlib.import_module(module).add_parser(parser.add_subparsers(dest="command"))
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"`python3 -m {module} {' '.join(args)}` does not parse") from exc


def _check_compose_command(argv: list[str], env_vars: list[str]) -> list[Path]:
    """`docker compose -f FILE... VERB [SERVICES]`: files, variables, verb and services exist; the files."""
    files = [compose_file(argv[i + 1]) for i, a in enumerate(argv) if a == "-f"]
    assert files, f"{' '.join(argv)}: say which stack with -f"
    for f in files:
        assert f.is_file(), f"{f} does not exist"
    specs = [load_compose(f) for f in files]
    services = set().union(*[(s.get("services") or {}).keys() for s in specs])
    text = "\n".join(f.read_text() for f in files)
    for var in env_vars:
        assert re.search(r"\$\{" + var + r"[:}\-?]", text), f"{var} is not a variable of {files}"
    valued = {i + 1 for i, a in enumerate(argv) if a in ("--profile", "--env-file")}  # options with a value
    rest = [a for i, a in enumerate(argv) if i >= 2 and i not in valued and a not in ("-f",)
            and not a.startswith("-") and not a.startswith(KIT_ON_NODE)]
    for i in valued:
        assert argv[i - 1] != "--profile" or any(f"- {argv[i]}" in f.read_text() or f'"{argv[i]}"' in f.read_text()
                                                 for f in files), f"no service in profile {argv[i]}"
    verb, targets = rest[0], rest[1:]
    assert verb in ("up", "down", "ps", "logs", "build", "restart", "config", "stop", "pull", "run", "rm"), verb
    if verb == "run":  # `run --rm SERVICE [ARGS...]`: the service, then its command's arguments
        assert "--rm" in argv, "one-shot containers are removed after the run"
        targets = targets[:1]
    for svc in targets:
        assert svc in services, f"{svc} is not a service of {files}"
    return files


# What the node's own python3 runs (standard library only; see test_node_modules_need_only_the_standard_library).
NODE_MODULES = ("servelab.node.doctor", "servelab.node.leaseclock", "servelab.node.configs", "servelab.node.kube",
                "servelab.node.weights", "servelab.node.reference")


@pytest.mark.parametrize("module", NODE_MODULES)
def test_node_modules_need_only_the_standard_library(module, tmp_path):
    """Run as on the node: `python3 -S` (no site-packages), no PYTHONPATH, from the kit's folder."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SERVELAB_ROOT")}
    out = subprocess.run([sys.executable, "-S", "-m", module, "--help"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]


def test_prepare_node_script_runs_the_notebooks_own_commands():
    """docker/prepare-node.sh (started by notebook 2) names compose files, services and images that exist."""
    text = (REPO_ROOT / "docker" / "prepare-node.sh").read_text()
    pins = (REPO_ROOT / "docker" / "Dockerfile.triton").read_text()
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        pulled = None
        parts = line.split(" || ") if line.startswith("docker pull ") else [line]
        for part in parts:  # `docker pull X || docker image inspect X`: go on if X is here
            argv = shlex.split(part)
            env_vars = []
            while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]):
                env_vars.append(argv.pop(0).split("=", 1)[0])
            if argv[:2] == ["docker", "compose"]:
                _check_compose_command(argv, env_vars)
            elif argv[:2] == ["docker", "pull"]:
                assert argv[2].startswith("nvcr.io/nvidia/tritonserver:24.10-py3"), argv
                assert argv[2].split("-sdk")[0] in pins
                pulled = argv[2]
            elif argv[:3] == ["docker", "image", "inspect"]:
                assert pulled and argv[3] == pulled and argv[4:] == [">", "/dev/null"], line
            elif argv[:2] == ["python3", "-m"]:
                assert argv[2] == "servelab.node.compose" and argv[3] == "write-env", argv
            else:
                assert argv[0] in ("set", "trap", "cd", "echo"), line
    assert MODELS_RUN_TEXT in text


@pytest.mark.parametrize("name", SHELL_NOTEBOOKS)
def test_host_commands_name_things_that_exist(name):
    commands = node_commands(name)
    if name in lessons.slugs("node"):
        assert commands, "setup notebooks are made of host commands"
    files_used: list[Path] = []
    for argv in commands:
        env_vars = []
        while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]):
            env_vars.append(argv.pop(0).split("=", 1)[0])
        if not argv:
            continue
        if argv[:2] == ["docker", "compose"]:
            files_used += _check_compose_command(argv, env_vars)
        elif argv[0] == "docker" and argv[1] in ("exec", "logs", "restart", "stats"):
            container = next(a for a in argv[2:] if not a.startswith("-"))
            known = _container_names(list((REPO_ROOT / "docker").glob("docker-compose-*.yaml")))
            assert container in known, f"docker {argv[1]} {container}: no such container_name in docker/"
        elif argv[0] == "cd":
            assert argv[1] == KIT_ON_NODE
        elif argv[0] == "make":
            for target in argv[1:]:
                assert target in _make_targets(), f"make {target}: no such target"
        elif "python" in argv[0] and "-m" in argv[:3]:
            # No venv on the node: only the kit's standard-library modules run on the node's own python3.
            assert argv[:2] == ["python3", "-m"] and argv[2] in NODE_MODULES, " ".join(argv)
            _check_servelab_command(argv[2], argv[3:])
    if name in ("3_fastapi_setup", "5_triton_setup"):
        stack = "fastapi" if name.startswith("3") else "triton"
        assert compose_file(f"{KIT_ON_NODE}/docker/docker-compose-{stack}.yaml") in files_used


NODE_NOTEBOOKS = ("2_create_server_nvidia", "3_fastapi_setup", "4_fastapi", "5_triton_setup", "6_triton")
MODELS_RUN = ["docker", "compose", "-f", f"{KIT_ON_NODE}/docker/docker-compose-models.yaml", "run", "--rm", "models"]
MODELS_RUN_TEXT = " ".join(MODELS_RUN)


def test_models_are_built_only_by_the_models_container():
    """Notebooks 3 and 5 build the model files with `docker compose ... run --rm models`; nothing on the
    node makes a Python environment (no venv, no make models, no pip)."""
    for name in ("3_fastapi_setup", "5_triton_setup"):
        assert MODELS_RUN in node_commands(name), name
    for name in NODE_NOTEBOOKS:
        for argv in node_commands(name):
            line = " ".join(argv)
            assert ".venv" not in line and "venv" not in argv and "virtualenv" not in line, (name, line)
            assert argv[:1] != ["make"], (name, line)
            assert "pip" not in argv and "pip3" not in argv and "python3-venv" not in line, (name, line)
            if "models" in argv and "build" in argv and argv[:2] != ["docker", "compose"]:
                raise AssertionError(f"{name}: models built outside the container: {line}")
        nb = nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        assert ".venv" not in code and "make models" not in code, name


def test_the_node_runs_the_doctor_with_its_system_python():
    cmds = [c for n in ("3_fastapi_setup", "5_triton_setup") for c in node_commands(n) if "servelab.node.doctor" in c]
    assert cmds and all(c[0] == "python3" for c in cmds)


def test_setup_notebooks_use_the_stacks_published_ports():
    """Notebook 3 sends students to :8000/docs, :80 and :8888; the FastAPI stack publishes them."""
    spec = load_compose(REPO_ROOT / "docker" / "docker-compose-fastapi.yaml")
    published = {svc: [str(p) for p in s.get("ports", [])] for svc, s in spec["services"].items()}
    assert any(p.endswith("8000:8000") for p in published["fastapi_server"])
    assert any(p.endswith("80:5000") for p in published["flask"])
    assert any(p.endswith("8888:8888") for p in published["jupyter"])
    text = "\n".join(c.source for c in nbformat.read(NOTEBOOKS_DIR / "3_fastapi_setup.ipynb", as_version=4).cells)
    for url in ("http://<floating IP>:8000/docs", "http://<floating IP>/", "http://<floating IP>:8888/"):
        assert url in text


@pytest.mark.parametrize("stack, service, container", [
    ("fastapi", "fastapi_server", "fastapi_server"), ("fastapi", "flask", "flask"), ("fastapi", "jupyter", "jupyter"),
    ("triton", "triton_server", "triton_server"), ("triton", "flask", "flask"), ("triton", "jupyter", "jupyter"),
])
def test_stacks_have_the_container_names_the_notebooks_use(stack, service, container):
    spec = load_compose(REPO_ROOT / "docker" / f"docker-compose-{stack}.yaml")
    assert spec["services"][service]["container_name"] == container


def _notebook_default(name: str, var: str) -> str:
    """The value a notebook falls back to when environment variable ``var`` is unset."""
    code = "\n".join(c.source for c in nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4).cells
                     if c.cell_type == "code")
    m = re.search(r'os\.environ\.get\(\s*"' + var + r'"\s*,\s*"([^"]+)"\s*\)', code)
    assert m, f"{name} does not read {var} with a default"
    return m.group(1)


@pytest.mark.parametrize("notebook, stack, var", [
    ("4_fastapi", "fastapi", "FASTAPI_SERVER_URL"),
    ("6_triton", "triton", "TRITON_SERVER_URL"),
    ("6_triton", "triton", "TRITON_MODEL_REPOSITORY"),
])
def test_in_container_defaults_match_the_stack(notebook, stack, var):
    """Unchanged on Chameleon: a notebook's fallback equals what Compose gives the Jupyter container
    (and the URL names a service of that stack)."""
    spec = load_compose(REPO_ROOT / "docker" / f"docker-compose-{stack}.yaml")
    env = spec["services"]["jupyter"].get("environment") or {}
    default = _notebook_default(notebook, var)
    if var in env:
        assert str(env[var]) == default
    host = re.sub(r"^https?://", "", default).split(":")[0]
    if var.endswith("_URL"):
        assert host in spec["services"], f"{default}: {host} is not a service of the {stack} stack"


def test_parser_sees_every_block():
    """The checks above would notice a missing file: the block parser finds the commands."""
    cmds = node_commands("3_fastapi_setup")
    assert ["docker", "exec", "jupyter", "jupyter", "server", "list"] in cmds
    assert any(c[:3] == ["docker", "compose", "-f"] and "up" in c for c in cmds)
    with pytest.raises(AssertionError):
        compose_file("/home/cc/serve-system-chi/docker/docker-compose-fastapi.yaml")


# --------------------------------------------------------------------------
# Notebook 4 on Chameleon: one server, swapped from PyTorch to ONNX half-way


def _code_cells(name: str) -> list[str]:
    return [c.source for c in nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4).cells
            if c.cell_type == "code"]


def test_notebook_4_measures_pytorch_before_the_swap():
    """Without FASTAPI_ONNX_URL (Chameleon), both URLs are one server: every measurement of
    FASTAPI_URL comes before the cell that waits for ONNX, every ONNX one after it, each sweep
    checks /health first."""
    cells = _code_cells("4_fastapi")
    settings = next(c for c in cells if "FASTAPI_ONNX_URL =" in c)
    assert 'os.environ.get("FASTAPI_ONNX_URL") or FASTAPI_URL' in settings
    swap = next(i for i, c in enumerate(cells) if 'wait_for_backend(FASTAPI_ONNX_URL, "onnxruntime"' in c)
    measures = re.compile(r"(time_sequential|time_concurrent|warm_up|sweep_of|FastAPITarget)\((\w+)")
    seen = {"FASTAPI_URL": [], "FASTAPI_ONNX_URL": []}
    for i, cell in enumerate(cells):
        for _fn, url in measures.findall(cell):
            if url in seen:
                seen[url].append(i)
    assert seen["FASTAPI_URL"] and all(i < swap for i in seen["FASTAPI_URL"]), (swap, seen)
    assert seen["FASTAPI_ONNX_URL"] and all(i > swap for i in seen["FASTAPI_ONNX_URL"]), (swap, seen)
    assert any('sweep_of(FASTAPI_URL, "pytorch")' in c for c in cells[:swap])
    assert any('sweep_of(FASTAPI_ONNX_URL, "onnxruntime")' in c for c in cells[swap:])


@pytest.mark.integration   # a real server
def test_notebook_4_refuses_to_label_another_backends_data():
    """The notebook's own `serves` check, against a server whose /health names the other backend."""
    import ast
    import http.server
    import threading

    settings = next(c for c in _code_cells("4_fastapi") if "def serves(" in c)
    python = "\n".join(line for line in settings.splitlines() if not line.startswith(("%", "!")))  # IPython magics
    func = next(n for n in ast.parse(python).body if isinstance(n, ast.FunctionDef) and n.name == "serves")
    import requests

    namespace = {"requests": requests}
    exec(compile(ast.Module([func], []), "4_fastapi", "exec"), namespace)  # the notebook's own code

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # http.server's method name
            body = b'{"status": "ok", "backend": "onnxruntime"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        namespace["serves"](url, "onnxruntime")  # the right label: no complaint
        with pytest.raises(RuntimeError, match="serves onnxruntime, not pytorch"):
            namespace["serves"](url, "pytorch")
    finally:
        server.shutdown()
        server.server_close()
