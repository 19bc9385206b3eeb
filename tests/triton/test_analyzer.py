"""Model Analyzer 1.58.0 against the kit's tritonserver (servelab.triton.analyzer): its config
as Model Analyzer renders it, one real profile at the smallest useful scale (its default
configuration and one variant, one concurrency, short windows), the private server's admin
key, and the cleanup: nothing left running, no shared-memory region, no core lock."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from servelab.bench import configsearch, queueing
from servelab.core import procs
from servelab.triton import analyzer
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


def _status(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


@pytest.fixture(scope="module")
@tier("e2e")   # a benchmark's --tiny run: Model Analyzer profiles with its own tritonservers
def profiled(tmp_path_factory):
    """One real profile: `benchmarks/bench_model_analyzer.py --tiny` (its smoke test too: the
    rows and JSON it promises), on SPACE; meanwhile, the private server's keyed and open APIs
    are probed."""
    work = tmp_path_factory.mktemp("ma")
    run_dir = work / "run"
    probes: dict[str, int] = {}
    done = threading.Event()

    def probe():
        cfg_file = run_dir / "profile.yaml"
        while not done.is_set() and len(probes) < 3:
            if cfg_file.is_file():
                try:
                    cfg = json.loads(cfg_file.read_text())
                except ValueError:
                    continue
                base = "http://" + cfg["triton_http_endpoint"]
                key = cfg["triton_server_flags"]["http-restricted-api"].rsplit("=", 1)[1]
                if _status(base + "/v2/health/live") == 200:
                    probes["shm without key"] = _status(base + "/v2/systemsharedmemory/status")
                    probes["shm with key"] = _status(base + "/v2/systemsharedmemory/status", {"admin-key": key})
                    probes["repository index"] = _status(base + "/v2/repository/index")
            time.sleep(0.2)

    watcher = threading.Thread(target=probe, daemon=True)
    watcher.start()
    try:
        data = run_tiny("bench_model_analyzer.py", work, "--run-dir", str(run_dir), "--budget-ms", "1000")
    finally:
        done.set()
        watcher.join(5)
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


def test_its_private_server_keeps_shared_memory_keyed_and_the_repository_open_on_loopback(profiled):
    _, probes = profiled
    assert probes.get("shm with key") == 200, probes
    assert probes.get("shm without key") in (400, 401, 403), probes
    assert probes.get("repository index") in (200, 405), probes   # open: Model Analyzer loads through it


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
