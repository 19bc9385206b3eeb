"""The lab's perf_analyzer commands, run as a user types them in the venv:
the real binary (via the kit's shim), against the real local Triton, and
their figures parsed."""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest

from servelab.core import procs
from servelab.triton import perf, stats_delta

# The commands from the lab, verbatim (the port is swapped for the test server's).
LAB_COMMANDS = [
    "perf_analyzer -u localhost:8000 -m food_classifier --input-data input.json -b 1 --concurrency-range 8",
    "perf_analyzer -u localhost:8000 -m food_classifier --input-data input.json -b 16 --concurrency-range 1",
    "perf_analyzer -u localhost:8000 -m food_classifier_onnx -b 1 --shape input:3,224,224 --concurrency-range 8",
    "perf_analyzer -u localhost:8000 -m food_classifier_onnx -b 1 --shape input:3,224,224 "
    "--request-rate-range 120 --request-distribution poisson",
]
# Only for the test's time budget on a shared 2-core machine: windows of a
# few requests and a loose stability criterion (perf_analyzer's defaults of
# 5 s windows until 3 agree within 10 % can take minutes here).
BUDGET = "--measurement-mode count_windows --measurement-request-count {n} --stability-percentage 999 --max-trials 3"


def budget(command: str) -> str:
    return BUDGET.format(n=2 if "-b 16" in command else 16)


@pytest.fixture(scope="module")
def triton(lab_triton):
    assert perf.shim_installed(), "start() installs the perf_analyzer shim"
    return lab_triton


def run_in_shell(command: str, triton, cwd, env, timeout=180) -> subprocess.CompletedProcess:
    command = command.replace("localhost:8000", f"localhost:{triton.http_port}")
    return subprocess.run(["bash", "-c", f"{command} {budget(command)}"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def parse_one(proc) -> dict:
    assert "error while loading shared libraries" not in proc.stderr
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = perf.parse_output(proc.stdout)
    assert len(results) == 1, proc.stdout
    return results[0]


@pytest.mark.parametrize("command", LAB_COMMANDS, ids=["py-b1-c8", "py-b16", "onnx-c8", "onnx-poisson"])
def test_lab_command_runs_verbatim_and_parses(command, triton, input_json_dir, shell_env):
    model = re.search(r"-m (\S+)", command).group(1)
    batch = int(re.search(r"-b (\d+)", command).group(1))
    before = triton.snapshot(model)
    result = parse_one(run_in_shell(command, triton, input_json_dir, shell_env))
    delta = stats_delta(before, triton.snapshot(model))

    if "--concurrency-range" in command:
        assert result["concurrency"] == int(re.search(r"--concurrency-range (\d+)", command).group(1))
    else:
        assert result["request_rate"] == 120
    assert result["batch_size"] == batch
    assert result["throughput"] > 0 and result["request_count"] > 0
    assert 0 < result["p50_latency_us"] <= result["p99_latency_us"]
    server = result["server"]
    assert server["inference_count"] > 0 and server["compute_infer_us"] > 0
    # The server's own counters agree with what perf_analyzer parsed:
    # perf_analyzer reports a subset (its measurement windows) of the total.
    assert delta["inferences"] >= server["inference_count"]
    # A client batch of 16 is 16 inferences per execution on the server.
    # (perf_analyzer reads the inference and execution counters at slightly
    # different moments at window edges, so allow a stray count or two.)
    assert server["avg_batch"] == pytest.approx(batch, rel=0.02)
    assert delta["failures"] == 0


def test_csv_output_parses_and_agrees_with_stdout(triton, tmp_path, shell_env, input_json_dir):
    csv_path = tmp_path / "out.csv"
    command = f"{LAB_COMMANDS[2]} -f {shlex.quote(str(csv_path))}"
    result = parse_one(run_in_shell(command, triton, input_json_dir, shell_env))
    rows = perf.parse_csv(csv_path)
    assert len(rows) == 1
    row = rows[0]
    assert row["concurrency"] == 8
    assert row["throughput"] == pytest.approx(result["throughput"], rel=1e-3)
    assert row["p99_latency_us"] == pytest.approx(result["p99_latency_us"], rel=1e-3)
    for key in ("queue_us", "compute_input_us", "compute_infer_us", "compute_output_us", "client_send_us"):
        assert isinstance(row[key], (int, float)) and row[key] >= 0
    assert perf.parse_csv(csv_path.read_text()) == rows  # text works as well as a path


def test_python_api_and_cli_runner(triton, shell_env):
    args = f"-u {triton.url} -m food_classifier_onnx -b 1 --shape input:3,224,224 --concurrency-range 1:2"
    run = perf.run(f"{args} {budget('')}")
    assert run.ok and [r["concurrency"] for r in run.results] == [1, 2]
    assert "c=1" in run.table() and "c=2" in run.table()
    proc = subprocess.run([str(procs.venv_bin() / "python"), "-m", "servelab.triton", "perf", "--json", "--",
                           *shlex.split(args.replace("--concurrency-range 1:2", "--concurrency-range 1")), *shlex.split(budget(""))],
                          env=shell_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    parsed = json.loads(proc.stdout)
    assert parsed["results"][0]["concurrency"] == 1 and parsed["results"][0]["throughput"] > 0


def test_env_exports_let_the_real_binary_start(shell_env):
    real = perf.real_binary()
    bare = subprocess.run([str(real), "--help"], env=shell_env, capture_output=True, text=True, timeout=60)
    # Without the set-up the binary cannot start (unless the system has libb64/CUDA itself).
    needs_setup = "error while loading shared libraries" in bare.stderr
    exports = subprocess.run([str(procs.venv_bin() / "python"), "-m", "servelab.triton", "env"],
                             env=shell_env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "LD_LIBRARY_PATH" in exports
    after = subprocess.run(["bash", "-c", f'eval "$1"; {shlex.quote(str(real))} --help', "_", exports],
                           env=shell_env, capture_output=True, text=True, timeout=60)
    assert "error while loading shared libraries" not in after.stderr
    assert "perf_analyzer" in after.stdout + after.stderr
    assert needs_setup or "perf_analyzer" in bare.stdout + bare.stderr


def test_setup_command_is_idempotent(shell_env):
    for _ in range(2):
        proc = subprocess.run([str(procs.venv_bin() / "python"), "-m", "servelab.triton", "setup"],
                              env=shell_env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    assert perf.shim_installed()
    assert "no onnxruntime backend" in proc.stdout
