"""Model Analyzer 1.58.0 against the kit's tritonserver (servelab.triton.analyzer): its config
as Model Analyzer renders it, one real profile at the smallest useful scale (its default
configuration and one variant, one concurrency, short windows), the private server's admin
key, and the cleanup: nothing left running, no shared-memory region, no core lock."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from servelab.bench import configsearch, queueing
from servelab.core import procs
from servelab.triton import analyzer, netns
from tests.bench.test_benchmarks_smoke import run_tiny
from tests.tiers import tier

SPACE = analyzer.Space(instances=(1,), max_batch_sizes=(4,), queue_delays_us=(0,), concurrency=(1,))


def test_flags_render_as_model_analyzer_passes_them(tmp_path):
    from model_analyzer.triton.server.server_config import TritonServerConfig

    cfg = analyzer.analyzer_config("food_classifier_onnx", tmp_path, tmp_path / "repo", tmp_path / "backends",
                                   SPACE, 250, (1, 2, 3), "KEY", "servelab_ma_x_")
    server = TritonServerConfig()
    server.update_config(cfg["triton_server_flags"])
    args = server.to_args_list()
    assert "--allow-gpu-metrics=false" in " ".join(args).replace(" ", "=") or "false" in args
    joined = " ".join(args)
    assert "shared-memory,logging,trace:admin-key=KEY" in joined and "model-repository" not in joined
    assert joined.count("backend-config") == 1 and "shm-region-prefix-name=servelab_ma_x_" in joined
    for flag in ("http-address", "grpc-address", "metrics-address"):
        assert f"--{flag}" in joined and "0.0.0.0" not in joined
    assert cfg["triton_http_endpoint"].startswith("127.0.0.1:")
    env = cfg["triton_server_environment"]
    assert "LD_LIBRARY_PATH" in env and "PYTHONPATH" in env and "PATH" in env   # perf_analyzer's too
    space = cfg["profile_models"]["food_classifier_onnx"]["model_config_parameters"]
    assert space["max_batch_size"] == [4] and space["dynamic_batching"] == {"max_queue_delay_microseconds": [0]}
    assert cfg["constraints"] == {"perf_latency_p99": {"max": 250.0}}


# Sent from the host namespace while the profile runs: a keyless load that carries its own
# model.py, as a web page could send it blind (text/plain, a foreign Origin). On a server it
# reaches, initialize() runs and writes MARKER (issue 48, finding 2).
PLANTED = """import pathlib
class TritonPythonModel:
    def initialize(self, args):
        pathlib.Path(MARKER).write_text("ran")
    def execute(self, requests):
        return []
"""


def _planted_load(base: str, marker: Path) -> int:
    body = json.dumps({"parameters": {
        "config": json.dumps({"backend": "python", "max_batch_size": 0,
                              "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
                              "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}]}),
        "file:1/model.py": base64.b64encode(PLANTED.replace("MARKER", repr(str(marker))).encode()).decode()}})
    req = urllib.request.Request(base + "/v2/repository/models/planted/load", data=body.encode(), method="POST",
                                 headers={"Content-Type": "text/plain", "Origin": "http://attacker.example"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def _connect(port: int) -> str:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return "connected"
    except OSError as err:
        return type(err).__name__


INSIDE = """import json, sys, urllib.error, urllib.request
base, key = sys.argv[1:]
def status(path, headers={}):
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0
print(json.dumps({"live": status("/v2/health/live"),
                  "shm without key": status("/v2/systemsharedmemory/status"),
                  "shm with key": status("/v2/systemsharedmemory/status", {"admin-key": key}),
                  "repository index": status("/v2/repository/index")}))
"""


def _inside(pid: int, base: str, key: str) -> dict:
    """The private server's APIs probed from inside its network namespace (nsenter: root, or the
    user who owns the namespace, can enter it)."""
    enter = ["nsenter", f"--target={pid}", "--net"]
    if os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user"):
        enter[2:2] = ["--user", "--preserve-credentials"]
    out = subprocess.run([*enter, sys.executable, "-c", INSIDE, base, key], capture_output=True, text=True,
                         timeout=20)
    return json.loads(out.stdout) if out.returncode == 0 else {"nsenter": out.stderr.strip()}


def _server_pid(run_dir: Path) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            argv = procs.cmdline(int(entry.name))
            if argv and argv[0].endswith("tritonserver") and str(run_dir) in " ".join(argv):
                return int(entry.name)
    return None


@pytest.fixture(scope="module")
@tier("e2e")   # a benchmark's --tiny run: Model Analyzer profiles with its own tritonservers
def profiled(tmp_path_factory):
    """One real profile: `benchmarks/bench_model_analyzer.py --tiny` (its smoke test too: the
    rows and JSON it promises), on SPACE. Meanwhile, once one of its servers answers (seen from
    inside its namespace), its ports are tried from this (the host's) namespace, a planted
    keyless load included, and its keyed and open APIs are probed from inside."""
    work = tmp_path_factory.mktemp("ma")
    run_dir = work / "run"
    marker = work / "planted-model-ran"
    probes: dict = {}
    done = threading.Event()

    def probe():
        cfg_file = run_dir / "profile.yaml"
        while not done.is_set() and "host load" not in probes:
            time.sleep(0.2)
            pid = _server_pid(run_dir)
            try:
                cfg = json.loads(cfg_file.read_text())
            except (OSError, ValueError):
                continue
            if pid is None:
                continue
            base = "http://" + cfg["triton_http_endpoint"]
            inside = _inside(pid, base, cfg["triton_server_flags"]["http-restricted-api"].rsplit("=", 1)[1])
            if inside.get("live") != 200:
                continue
            probes["inside"] = inside
            probes["host http"] = _connect(int(cfg["triton_http_endpoint"].rsplit(":", 1)[1]))
            probes["host grpc"] = _connect(int(cfg["triton_grpc_endpoint"].rsplit(":", 1)[1]))
            probes["host load"] = _planted_load(base, marker)
            probes["server still up"] = procs.pid_alive(pid)

    watcher = threading.Thread(target=probe, daemon=True)
    watcher.start()
    try:
        data = run_tiny("bench_model_analyzer.py", work, "--run-dir", str(run_dir), "--budget-ms", "1000")
    finally:
        done.set()
        watcher.join(30)
    probes["planted model ran"] = marker.exists()
    r = data["run"]
    run = analyzer.AnalyzerRun("food_classifier_onnx", Path(r["dir"]), SPACE, 1000, data["seconds"], r["cleaned"],
                               Path(r["log"]), r["shm_prefix"], r["servers"])
    return run, probes


def test_the_benchmarks_tiny_space_is_this_files(profiled):
    """What the tests below assert of the profile holds for this space: the benchmark's --tiny one."""
    run, _ = profiled
    cfg = json.loads((run.run_dir / "profile.yaml").read_text())
    mine = analyzer.analyzer_config("food_classifier_onnx", run.run_dir, run.run_dir, run.run_dir, SPACE, 1000,
                                    (1, 2, 3), "K", "p_")
    assert cfg["profile_models"] == mine["profile_models"] and cfg["constraints"] == mine["constraints"]
    assert cfg["perf_analyzer_flags"] == {"measurement-request-count": 10, "stability-percentage": 100}


def test_a_profile_fills_the_comparison_from_its_report(profiled):
    run, _ = profiled
    assert run.results_csv.is_file() and run.summary_html.is_file()
    assert "food_classifier_onnx" in run.summary_html.read_text()
    assert any(p.name == "throughput_v_latency.png" for p in run.plots())
    assert str(run.run_dir).startswith(str(Path(run.run_dir).parent))
    rows = run.rows()
    assert {(r["max_batch_size"], r["batching"]) for r in rows} == {(16, False), (4, True)}   # default + variant
    assert all(r["throughput"] > 0 and r["p99_ms"] > 0 and r["concurrency"] == 1 for r in rows)
    measured = configsearch.measured_ranking(analyzer.best_per_config(rows))
    cost = queueing.BatchCost({1: 0.03, 16: 0.45})
    predicted = configsearch.rank_predictions([{"instances": 1, "max_batch_size": 1}, *SPACE.configs()],
                                              cost, 1000, SPACE.concurrency)
    comparison = configsearch.side_by_side(predicted, measured)
    assert len(comparison["rows"]) == 2
    for r in comparison["rows"]:   # each row: the tool's figures from the CSV, the model's beside them
        assert r["measured_throughput"] in {x["throughput"] for x in rows} and r["predicted_throughput"] > 0
        assert r["tool_rank"] and r["model_rank"]
    assert 0 <= comparison["agreement"] <= 2


def test_its_private_server_keeps_shared_memory_keyed_and_the_repository_open_in_its_namespace(profiled):
    _, probes = profiled
    inside = probes.get("inside", {})
    assert inside.get("shm with key") == 200, probes
    assert inside.get("shm without key") in (400, 401, 403), probes
    assert inside.get("repository index") in (200, 405), probes   # open: Model Analyzer loads through it


def test_its_private_server_cannot_be_reached_from_the_host_namespace(profiled):
    """Issue 48, finding 2: while the profile runs, another local process (or a web page) that
    finds the private server's ports gets nothing; its keyless load with a model.py never arrives."""
    _, probes = profiled
    assert probes.get("server still up"), probes
    seen = {k: probes[k] for k in ("host http", "host grpc", "host load", "planted model ran")}
    assert seen == {"host http": "ConnectionRefusedError", "host grpc": "ConnectionRefusedError",
                    "host load": 0, "planted model ran": False}   # load 0: no answer at all


def test_nothing_is_left_behind(profiled):
    run, _ = profiled
    assert run.servers, "no tritonserver was seen"
    for pid in run.servers:
        assert not procs.pid_alive(pid) or "tritonserver" not in " ".join(procs.cmdline(pid))
    assert not list(Path("/dev/shm").glob(f"{run.shm_prefix}*"))
    assert not [n for n in os.listdir("/dev/shm") for pid in run.servers
                if n.startswith(f"servelab-cores-{os.getuid()}-{pid}-")]
    for entry in Path("/proc").iterdir():     # no process of this run: server, stub or perf_analyzer
        if entry.name.isdigit():
            assert str(run.run_dir) not in " ".join(procs.cmdline(int(entry.name))), procs.cmdline(int(entry.name))


def test_leftovers_stops_what_escaped_its_group_and_removes_only_its_regions(tmp_path):
    """A stand-in for Model Analyzer whose child starts a session of its own (as its
    tritonserver and perf_analyzer do), and one region of this run beside another's."""
    prefix = f"servelab_ma_test_{os.getpid()}_"
    mine, other = Path(f"/dev/shm/{prefix}region"), Path(f"/dev/shm/servelab_other_{os.getpid()}")
    mine.write_bytes(b"x")
    other.write_bytes(b"x")
    root = subprocess.Popen(["sh", "-c", "setsid sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        escaped = int(root.stdout.readline())
        for _ in range(100):                          # until it has left the group (setsid ran)
            if os.getpgid(escaped) != root.pid:
                break
            time.sleep(0.02)
        left = analyzer.Leftovers(root.pid, prefix)
        left.scan()
        assert escaped in left.seen
        procs.stop_group(root.pid, 5.0, proc=root)     # the tool exits; its escaped child does not
        assert procs.pid_alive(escaped) and os.getpgid(escaped) != root.pid
        done = left.stop()
        assert any(str(escaped) in d for d in done)
        for _ in range(50):
            if not procs.pid_alive(escaped):
                break
            time.sleep(0.02)
        assert not procs.pid_alive(escaped)
        assert not mine.exists() and other.exists()
    finally:
        other.unlink(missing_ok=True)
        mine.unlink(missing_ok=True)
        if root.poll() is None:
            root.kill()


def test_two_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    """The default run folder is named by the second it starts in: a second run in that
    second (another test worker, another terminal) gets ``-2`` instead of deleting the first."""
    base = tmp_path / "model-analyzer" / "food_classifier_onnx-20261126-170725"
    first = analyzer._fresh_dir(base)
    (first / "checkpoints").mkdir()
    second = analyzer._fresh_dir(base)
    assert first == base.resolve() and second.name == base.name + "-2"
    assert (first / "checkpoints").is_dir() and not any(second.iterdir())


@pytest.mark.integration
def test_the_namespace_has_a_loopback_of_its_own():
    """What the profile runs in (servelab.triton.netns): a server inside answers on its 127.0.0.1,
    the same port on the host's is refused, and the user and PIDs are this process's own."""
    assert not (why := netns.unavailable()), why  # the profile refuses without it: no skip
    inside = ("import os, socket, sys\n"
              "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
              "socket.create_connection(s.getsockname(), timeout=2).close()\n"
              "print(s.getsockname()[1], os.getuid(), os.getppid(), os.readlink('/proc/self/ns/net'), flush=True)\n"
              "sys.stdin.read()\n")
    proc = subprocess.Popen(netns.command([sys.executable, "-c", inside]), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        port, uid, ppid, net = proc.stdout.readline().split()
        assert int(uid) == os.getuid() and int(ppid) == os.getpid()
        assert net != os.readlink("/proc/self/ns/net")
        assert _connect(int(port)) == "ConnectionRefusedError"
    finally:
        proc.stdin.close()
        proc.wait(10)


def test_the_wrapper_says_why_where_no_namespace_can_be_made():
    """Where neither kind of unshare is allowed (here: a user namespace that may make no other
    and has no capabilities; or this machine itself), ``--check`` fails with one line why."""
    if subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True).returncode:
        why = netns.unavailable()   # this machine makes none: the real thing
    else:
        script = (f"echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --bounding-set=-all "
                  f"--inh-caps=-all {sys.executable} -I {netns.__file__} --check")
        proc = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == netns.FAILED, proc
        why = proc.stderr.strip()
    assert why and "\n" not in why and why.startswith("netns: no network namespace of its own: unshare("), why


def test_the_profile_refuses_in_one_line_without_a_namespace_unless_told(monkeypatch):
    monkeypatch.delenv(analyzer.NO_NETNS, raising=False)
    why = "netns: no network namespace of its own: unshare(CLONE_NEWUSER|CLONE_NEWNET) as uid 1000: No space left"
    monkeypatch.setattr(analyzer.netns, "unavailable", lambda: why)
    monkeypatch.setattr(analyzer, "executable", lambda *a: Path("model-analyzer"))
    monkeypatch.setattr(analyzer, "build_repository", lambda *a, **k: pytest.fail("built before refusing"))
    with pytest.raises(analyzer.AnalyzerError) as err:
        analyzer.profile("food_classifier_onnx", SPACE, 1000)
    message = str(err.value)
    assert "\n" not in message and why in message and f"{analyzer.NO_NETNS}=1" in message, message
    assert "docs/SECURITY.md" in message
    monkeypatch.setenv(analyzer.NO_NETNS, "1")      # the opt-in: run unprotected, nothing probed
    monkeypatch.setattr(analyzer.netns, "unavailable", lambda: pytest.fail("probed"))
    assert analyzer.isolation() is False
