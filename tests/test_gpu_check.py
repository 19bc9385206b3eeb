"""`servelab gpu-check` and `gpu-pack` (servelab/gpucheck/), proven on CPU.

The dry run is the same script a lent GPU machine runs (`make gpu-check`), at toy
sizes with the GPU hidden: every phase runs or says why, at most 8 files, the
summary's figures table. The pack's selection and size budget are tested without
downloading anything."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import warnings
from pathlib import Path

import pytest

from servelab.core import paths
from servelab.gpucheck import pack, runner, summary
from tests.tiers import tier

REQUIRED_OK = ("probe", "models", "fastapi", "triton")


def _run_check(out: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT))
    env.pop("OUT", None)
    return subprocess.run([sys.executable, "-m", "servelab.gpucheck", "--out", str(out),
                           "--pack", str(out / "no-pack"), *extra],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=str(paths.REPO_ROOT))


@pytest.fixture(scope="module")
@tier("e2e")   # the gpu-check dry run
def dry_run(tmp_path_factory, built_models):
    out = tmp_path_factory.mktemp("gpu-check")
    # The script's own ceiling is 240 s for --tiny; a loaded test machine gets more.
    proc = _run_check(out, "--device", "cpu", "--tiny", "--budget", "420")
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    return out, proc


def test_dry_run_runs_every_phase_and_writes_at_most_8_files(dry_run, tmp_path):
    out, proc = dry_run
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir() if p.is_file())
    assert files == sorted(runner.OUT_FILES) and len(files) <= runner.MAX_FILES
    data = json.loads((out / "results.json").read_text())
    phases = {p["phase"]: p for p in data["phases"]}
    assert list(phases) == list(runner.PHASE_NAMES)
    for name, p in phases.items():
        if p["status"] != "ok":
            assert p.get("reason"), f"{name} is {p['status']} without a reason"
    # On a CPU every phase passes. cuda_tests too: its tests run and are skipped ("no CUDA device").
    # The phases that time forward passes (the tour's requests, accel's FP16 on a CPU) have short limits in the
    # dry run (runner.PHASES). On a machine loaded by other tests they can run past them: that is no verdict on
    # the phase. Each one that did is run again, alone, with time to finish (CI, 2026-11-30: accel past 120 s,
    # one fp32 forward pass at batch 1 taking 556 ms, where a whole request takes 40-55 ms on the idle host).
    timing = ("tour", "accel")
    wrong = {name: (p["status"], p.get("reason"), p.get("output", "")[-2000:]) for name, p in phases.items()
             if p["status"] != "ok" and not (name in timing and p["status"] == "timeout")}
    tally = phases["cuda_tests"].get("tally", "")
    if not (re.search(r"\b\d+ skipped\b", tally) and not re.search(r"passed|failed|error", tally)):
        wrong["cuda_tests tally"] = tally
    for name in timing:
        if phases[name]["status"] != "timeout":
            continue
        phase = next(p for p in runner.PHASES if p.name == name)
        again = runner.run_phase(phase, 300, runner.phase_env(None, phase, "cpu"), tmp_path, "cpu", tiny=True)
        if again["status"] == "ok":
            warnings.warn(f"gpu-check dry run: {name} {phases[name]['reason']}; alone it passed in "
                          f"{again['seconds']:.0f} s", stacklevel=1)
        else:
            wrong[name] = (f"{phases[name]['reason']}; alone, {again['status']}: {again.get('reason')}",
                           again["output"][-2000:])
    assert not wrong, (wrong, proc.stdout[-4000:])
    assert proc.returncode == (0 if all(p["status"] == "ok" for p in phases.values()) else 1)


def test_dry_run_hides_the_gpu_and_measures_through_triton(dry_run):
    out, _ = dry_run
    phases = {p["phase"]: p for p in json.loads((out / "results.json").read_text())["phases"]}
    assert phases["probe"]["info"]["cuda_available"] is False
    assert phases["fastapi"]["device"] == "cpu" and phases["fastapi"]["device_in_service"]
    assert phases["triton"]["kind"] == "KIND_CPU"
    counts = {c: g for c, g in phases["triton"]["instance_groups"].items()}
    assert [g[0]["count"] for g in counts.values()] == [1, 2]  # the reload took
    runs = [f for f in phases["triton"]["figures"] if "concurrency" in f]
    assert {(f["instances"], f["concurrency"], f["batch"]) for f in runs} >= {(1, 1, 1), (2, 16, 1), (2, 1, 2)}
    assert all(f.get("throughput", 0) > 0 for f in runs), runs
    assert "perf_analyzer -u" in (out / "perf.txt").read_text()
    # traces: every request of each row traced, its stages from Triton's traces and the client's clock
    traced = phases["traces"]["figures"]
    assert [f["what"] for f in traced] == ["traces food_classifier_onnx, c=1", "traces food_classifier_onnx, c=8"]
    for f in traced:
        assert f["requests"] == 8 and f["stages_p50_ms"]["compute infer"] > 0, f
        assert f["value"].startswith("shares of the client's p50: "), f
    # decode: the CPU path measured and traced, its tensors food11's own, its bad images refused;
    # the GPU path said not run (servelab/gpucheck/decode.py)
    dec = {f["what"]: f for f in phases["decode"]["figures"]}
    cpu = dec["decode=cpu: food_pipeline, c=8"]
    assert cpu["throughput"] > 0 and cpu["traced"] == 8 and cpu["value"].startswith("food_preprocess compute p50"), cpu
    assert dec["decode=cpu: food_preprocess tensors vs food11.preprocess"]["value"].startswith("max abs diff 0.0 ")
    assert dec["decode=cpu: bad images"]["value"] == "4 of 4 refused with food11's code"
    assert dec["decode=gpu: food_pipeline, c=8"]["value"] == "not run: no GPU"


def test_dry_run_summary_has_phases_and_figures_table(dry_run):
    out, proc = dry_run
    text = (out / "summary.md").read_text()
    assert "dry run" in text and summary.TABLE_HEADER in text
    for name in runner.PHASE_NAMES:
        assert f"| {name} |" in text
    table = text.split("## Figures", 1)[1]
    assert "| triton | Triton food_classifier, 2x KIND_CPU, c=16, -b 1 |" in table
    assert "| fastapi | FastAPI /health device |" in table
    assert "onnxruntime-gpu" in text  # the ONNX-on-CPU note
    samples = runner.read_samples(out / "samples.csv")
    assert samples and {s["phase"] for s in samples} >= {"triton"}
    assert "## Figures" in proc.stdout  # printed too: a device call's output tail shows it
    assert "## Where each request's time goes" in text and "food_classifier_onnx @ 8" in text
    assert "## Where the pipeline decodes" in text and "food_pipeline decode=cpu @ 8" in text


def test_no_time_left_skips_each_phase_with_its_reason(tmp_path):
    proc = _run_check(tmp_path, "--device", "cpu", "--tiny", "--budget", "10", timeout=120)
    assert proc.returncode == 1
    phases = json.loads((tmp_path / "results.json").read_text())["phases"]
    assert [p["status"] for p in phases] == ["skipped"] * len(runner.PHASE_NAMES)
    assert all("no time left" in p["reason"] for p in phases)
    assert len(list(tmp_path.iterdir())) <= runner.MAX_FILES


@pytest.mark.integration
def test_a_run_cut_off_after_a_phase_keeps_what_that_phase_found(tmp_path):
    """A device call past its own limit kills gpu-check mid-phase: the files written after the
    phases before it come back (a lent H200, 2026-11-27, lost four finished phases that way)."""
    env = dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT))
    env.pop("OUT", None)
    proc = subprocess.Popen([sys.executable, "-m", "servelab.gpucheck", "--out", str(tmp_path), "--pack",
                             str(tmp_path / "no-pack"), "--device", "cpu", "--tiny", "--phases", "probe,tour"],
                            cwd=str(paths.REPO_ROOT), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "results.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before the kill: nothing was cut off"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    res = json.loads((tmp_path / "results.json").read_text())
    assert not res["meta"]["complete"]
    assert [(p["phase"], p["status"]) for p in res["phases"][:1]] == [("probe", "ok")]
    assert "while the run went on" in (tmp_path / "summary.md").read_text()


def test_bad_arguments_are_refused(tmp_path):
    assert _run_check(tmp_path, "--phases", "probe,nonsense", timeout=60).returncode == 2
    assert _run_check(tmp_path, "--budget", "5", timeout=60).returncode == 2


def test_a_phase_past_its_limit_is_stopped_and_recorded(tmp_path):
    phase = runner.PHASES[0]  # the probe imports torch: well over a second
    res = runner.run_phase(phase, 1.0, runner.phase_env(None, phase, "cpu"), tmp_path, "cpu", tiny=True)
    assert res["status"] == "timeout" and "ran past its 1 s limit" in res["reason"]
    assert res["seconds"] < 30 and not (tmp_path / "probe.json").exists()


def test_a_phase_that_ignores_sigterm_is_killed_after_the_grace_it_was_given():
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    runner._kill_group(proc, grace=1)
    assert proc.poll() == -signal.SIGKILL and time.monotonic() - t0 < 10


def test_usage_counts_only_the_samples_inside_a_run():
    samples = [{"t_s": str(t), "gpu_util_pct": str(u), "cpu_pct": "50", "mem_used_mib": "100"}
               for t, u in ((1.0, 10), (2.0, 90), (3.0, 70), (9.0, 5))]
    use = runner.usage(samples, 1001.5, 1003.5, 1000.0)
    assert use["samples"] == 2 and use["gpu_util_mean"] == 80.0 and use["gpu_util_max"] == 90.0


# --------------------------------------------------------------------------
# gpu-pack
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def selection():
    return pack.select(wheels=None)  # no download: the wheel parts are noted, not counted


def test_pack_keeps_only_what_the_gpu_machine_needs(selection):
    arcs = {i.arc for i in selection.items}
    stubs = {a.split("/")[4] for a in arcs if "/python_backend_stubs/" in a}
    assert stubs == {pack.STUB_PYTHON}
    assert "site/pytriton/tritonserver/bin/tritonserver" in arcs
    assert "site/pytriton/tritonserver/backends/python/libtriton_python.so" in arcs
    assert "bin/perf_analyzer" in arcs and not any("perf_client" in a for a in arcs)
    assert not any(a.startswith("site/nvidia_pytriton.libs/libpython") for a in arcs)
    assert any(a.startswith("site/nvidia_pytriton.libs/libb64-") for a in arcs)
    assert any(a.startswith("site/nvidia_pytriton.libs/libcudart-") for a in arcs)
    assert not any(a.startswith(("site/pytriton/client/", "site/pytriton/triton.py", "site/tritonclient/http/"))
                   for a in arcs)
    assert not any("__pycache__" in a or a.endswith(".pyc") for a in arcs)
    for pkg in ("fastapi", "starlette", "pydantic", "uvicorn", "tritonclient/grpc"):
        assert any(a.startswith(f"site/{pkg}/") for a in arcs), pkg
    # protobuf 4 has a folder of its own: the models phase must not see it (see the prefix test)
    assert any(a.startswith("pb/google/protobuf/") for a in arcs)
    assert not any(a.startswith("site/google/protobuf/") for a in arcs)
    assert any("pydantic-core" in n and "not downloaded" in n for n in selection.notes)
    # pytriton's own package is a stand-in: importing it must not need pytriton's dependencies
    init = next(i for i in selection.items if i.arc == "site/pytriton/__init__.py")
    assert b"import" not in init.data


def test_packed_layout_is_what_the_kit_looks_for(selection, tmp_path):
    """The unpacked site/ folder, first on PYTHONPATH, gives find_install and perf their files."""
    site = tmp_path / "site"
    for item in selection.items:
        if not item.arc.startswith("site/pytriton/") and not item.arc.startswith("site/nvidia_pytriton.libs/"):
            continue
        dest = tmp_path / item.arc
        dest.parent.mkdir(parents=True, exist_ok=True)
        if item.data is not None:
            dest.write_bytes(item.data)
        else:
            dest.symlink_to(item.src)
    # find_install's own lookup (import pytriton, then tritonserver/ beside it), for the 3.12 stub
    # (this interpreter may be another Python: find_install would refuse it for the missing stub).
    code = ("from pathlib import Path; import pytriton; from servelab.triton import install; from servelab.triton import perf; "
            "i = install.TritonInstall(Path(pytriton.__file__).resolve().parent / 'tritonserver'); "
            "print(i.server if i.server.exists() else 'missing'); print(perf.pytriton_libs()); "
            "print((i.python_backend / 'libtriton_python.so').exists() and i.stub((3, 12)).exists())")
    env = dict(os.environ, PYTHONPATH=f"{paths.REPO_ROOT}{os.pathsep}{site}")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    server, libs, stub = proc.stdout.split()
    assert server.startswith(str(site)) and libs.startswith(str(site)) and stub == "True"


def test_size_budget(selection):
    assert pack.check_fits(40 * 2**20, 2 * 2**20).startswith("packed 40.0 MiB + repository 2.0 MiB")
    with pytest.raises(pack.PackError, match="too big"):
        pack.check_fits(60 * 2**20, 5 * 2**20)
    repo = pack.repository_bytes()
    assert 0 < repo < 16 * 2**20  # the repository leaves the pack most of the 64 MiB
    assert selection.total() > 100 * 2**20  # unpacked: it only fits compressed (xz)


def test_archive_round_trip_keeps_modes(tmp_path):
    sel = pack.Selection()
    exe = tmp_path / "tool"
    exe.write_bytes(b"#!/bin/sh\necho hi\n")
    exe.chmod(0o755)
    sel.add_file(exe, "bin/tool")
    sel.items.append(pack.Item("site/x/__init__.py", 3, data=b"x=1"))
    archive = tmp_path / "p" / pack.ARCHIVE_NAME
    pack.write_archive(sel, archive)
    with tarfile.open(archive, "r:xz") as t:
        members = {m.name: m for m in t.getmembers()}
        assert members["bin/tool"].mode & 0o111 and t.extractfile("site/x/__init__.py").read() == b"x=1"
    # The runner unpacks it only for the Python the pack was built for.
    root, note = runner.unpack(archive.parent, tmp_path / "u")
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == pack.STUB_PYTHON:
        assert root is not None and (root / "bin" / "tool").exists()
    else:
        assert root is None and "is for Python 3.12" in note


def test_find_wheel_matches_name_version_and_cp312(tmp_path):
    for name in ("numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                 "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl",
                 "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.whl"):
        (tmp_path / name).write_bytes(b"")
    assert pack.find_wheel(tmp_path, "numpy", "1.26.4").name.startswith("numpy-1.26.4-cp312")
    assert pack.find_wheel(tmp_path, "pydantic-core", "2.50.5") is not None
    assert pack.find_wheel(tmp_path, "numpy", "2.0.0") is None


def test_probe_names_a_library_the_stub_cannot_load(tmp_path):
    """A stub linked against a libpython this machine lacks (Python 3.8's, which no supported
    machine of the kit has) is reported before Triton tries to load a model."""
    from servelab import triton
    from servelab.gpucheck import phases

    real = triton.find_install()
    assert phases._missing_libs(real) == []
    other = "3.8"  # pyproject: requires-python >= 3.10
    fake = triton.TritonInstall(tmp_path / "pytriton" / "tritonserver")
    (fake.root / "bin").mkdir(parents=True)
    (fake.root / "bin" / "tritonserver").symlink_to(real.server)
    fake.python_backend.mkdir(parents=True)
    (fake.python_backend / "libtriton_python.so").symlink_to(real.python_backend / "libtriton_python.so")
    fake.stub().parent.mkdir(parents=True)
    fake.stub().symlink_to(real.root / "python_backend_stubs" / other / "triton_python_backend_stub")
    (tmp_path / "nvidia_pytriton.libs").symlink_to(real.libs)
    missing = phases._missing_libs(fake)
    assert missing == [f"triton_python_backend_stub: libpython{other}.so.1.0"]


def test_the_prefix_gives_an_isolated_interpreter_the_repository_and_site_packages(tmp_path):
    """Triton's stub runs an isolated interpreter (no PYTHONPATH) found as `python3` on PATH:
    through the prefix it still imports this repository's servelab, and torch from the venv."""
    pack_root = tmp_path / "pack"
    (pack_root / "np" / "marker_np").mkdir(parents=True)
    (pack_root / "site" / "marker_np").mkdir(parents=True)
    for d in ("np", "site"):
        (pack_root / d / "marker_np" / "__init__.py").write_text(f"WHERE = {d!r}\n")
    python = runner.make_prefix(tmp_path / "py", pack_root, ("np", "site"))
    code = "import sys, servelab, marker_np, torch; print(servelab.__file__, marker_np.WHERE, sys.prefix)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    where, marker, prefix = proc.stdout.split()
    assert where == str(paths.REPO_ROOT / "servelab" / "__init__.py")
    assert marker == "np" and prefix == str(tmp_path / "py")  # np/ comes before site/
    plain = runner.make_prefix(tmp_path / "py2", pack_root, ("site",))
    out = subprocess.run([str(plain), "-I", "-c", "import marker_np; print(marker_np.WHERE)"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.strip() == "site"


def test_only_the_models_phase_sees_the_machines_protobuf(tmp_path):
    """tritonclient's gRPC needs protobuf < 5 (the pack's pb/), but torch.onnx.export imports the
    machine's onnx, which needs the machine's newer protobuf. The first GPU run (H200, 2026-11-26)
    failed `models` with "cannot import name 'runtime_version' from 'google.protobuf'" when the
    pack's protobuf came first for every phase."""
    pack_root = tmp_path / "pack"
    fake = pack_root / "pb" / "google" / "protobuf"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = 'from-the-pack'\n")
    (pack_root / "site").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    seen = {}
    for phase in runner.PHASES:
        python = runner.make_prefix(tmp_path / f"py-{phase.name}", pack_root, phase.pack_dirs)
        proc = subprocess.run([str(python), "-I", "-c", "import google.protobuf as p; print(p.__version__)"],
                              capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        seen[phase.name] = proc.stdout.strip()
        in_path = str(fake.parent.parent) in runner.phase_env(pack_root, phase, "cpu")["PYTHONPATH"].split(os.pathsep)
        assert in_path == (phase.name != "models"), phase.name
    import google.protobuf

    assert seen.pop("models") == google.protobuf.__version__
    assert set(seen.values()) == {"from-the-pack"}
    # a Triton is started by these phases: its stub needs numpy 1.26 first
    assert {p.name for p in runner.PHASES if p.stub_numpy} == {"triton", "tour", "cuda_tests", "traces", "decode",
                                                              "streaming"}


def test_reap_kills_only_what_a_phase_left_under_its_work_folder(tmp_path):
    work = tmp_path / "work"
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"{work}/triton/stub"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"{tmp_path}/elsewhere"])
    try:
        assert runner.reap(work) == [left.pid]
        assert left.wait(timeout=10) != 0 and other.poll() is None
    finally:
        for p in (left, other):
            p.kill()
            p.wait()


def test_accel_judges_overlap_and_an_unsettled_baseline():
    """Two variants whose block medians overlap cannot be ordered; a baseline that drifts more than
    25 % between blocks makes the run unsettled (its ratios are not evidence)."""
    from servelab.gpucheck import accel

    unsettled, pairs = accel.judge({"fp32 eager": [10.0, 10.5, 10.2], "fp16 eager": [6.0, 6.1, 6.2],
                                    "fp32 torch.compile": [10.4, 11.0, 10.9]})
    assert not unsettled
    assert pairs == ["fp32 eager / fp32 torch.compile"]
    unsettled, pairs = accel.judge({"fp32 eager": [10.0, 13.0, 10.2], "fp16 eager": [6.0, 6.1, 6.2]})
    assert unsettled and pairs == []


def test_accel_measures_every_variant_with_fidelity_against_fp32(tmp_path):
    """The accel phase's measurement on a small stand-in model on the CPU: fp32 agrees with itself
    exactly, FP16 differs by a small nonzero amount, S(b) has every asked size with its raw samples,
    and torch.compile is skipped on the CPU with its reason."""
    import torch

    from servelab.gpucheck import accel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 8, stride=8), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(4, 11))
    path = tmp_path / "small.pth"
    torch.save(model, path)
    res = accel.measure("cpu", tiny=True, model_path=path, rounds=9, sb_repeats=2, generated=5, log=lambda *_: None)
    assert list(res["variants"]) == ["fp32 eager", "fp16 eager"]
    assert res["fidelity"]["fp32 eager"]["samples"]["max_abs_logit_diff"] == 0.0
    assert 0.0 < res["fidelity"]["fp16 eager"]["generated"]["max_abs_logit_diff"] < 0.1
    assert res["fidelity"]["fp16 eager"]["generated"]["n"] == 5
    assert all(len(v) == 9 for v in res["raw"]["b1_ms"].values())
    assert set(res["batch_cost_ms"]["fp16 eager"]) == {1, 2} and res["big_batch"] == 2
    assert all(len(xs) == 2 for xs in res["raw"]["sb_ms"]["fp32 eager"].values())
    assert "torch.compile" in res["skipped"]
    rows = accel.figures(res)
    assert any(r["what"].startswith("S(b) fp32 eager") for r in rows)
    assert res["variants"]["fp32 eager"]["b1_speedup_vs_fp32"] == 1.0


def test_the_committed_accel_runs_hold_their_raw_samples_and_the_documented_ratio():
    """docs/gpu-reference.md and batchcost.py cite S(16)/S(1) = 1.00 and 1.03 (fp32) from the two
    committed accel runs: recomputed here from their raw samples, not from the rounded summary."""
    import json
    import statistics

    from servelab.core import paths

    ratios = []
    for run in ("2026-11-27-h200-accel", "2026-11-27-h200-accel-2"):
        data = json.loads((paths.REPO_ROOT / "docs" / "gpu-runs" / run / "results.json").read_text())
        acc = next(p for p in data["phases"] if p["phase"] == "accel")
        raw = acc["raw"]["sb_ms"]["fp32 eager"]
        assert sorted(map(int, raw)) == list(range(1, 17)) and all(len(v) == acc["sb_repeats"] for v in raw.values())
        ratios.append(round(statistics.median(raw["16"]) / statistics.median(raw["1"]), 2))
    assert ratios == [1.00, 1.03]
