"""servelab.triton.stubs finds Triton's Python-backend processes in the process list
and groups them per device (CPU here: no GPU, no nvidia-smi)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from servelab.triton import stubs


@pytest.fixture
def fake_stubs(tmp_path):
    """Two processes whose command line looks like Triton's stubs for one model."""
    model_py = tmp_path / "food_classifier" / "1" / "model.py"
    model_py.parent.mkdir(parents=True)
    model_py.write_text("import time\ntime.sleep(60)\n")
    started = []
    for i in range(2):
        argv = [str(tmp_path / stubs.STUB_NAME), str(model_py), f"shm_region_{i}", "1048576", "1048576",
                "4242", "/lib", "ipc", f"food_classifier_0_{i}"]
        started.append(subprocess.Popen(argv, executable=sys.executable))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len([s for s in stubs.stub_processes()
                                               if s.pid in {p.pid for p in started}]) < 2:
        time.sleep(0.05)
    yield started
    for p in started:
        p.terminate()
        p.wait(timeout=10)


def test_stub_processes_are_found_with_model_and_instance(fake_stubs):
    mine = [s for s in stubs.stub_processes() if s.pid in {p.pid for p in fake_stubs}]
    assert [(s.model, s.instance) for s in mine] == [("food_classifier", "food_classifier_0_0"),
                                                     ("food_classifier", "food_classifier_0_1")]
    assert all(s.rss_mb > 0 for s in mine)


def test_show_groups_them_on_the_cpu_without_a_gpu(fake_stubs, capsys, monkeypatch):
    monkeypatch.setattr(stubs, "gpu_processes", lambda: None)
    grouped = stubs.show("food_classifier")
    out = capsys.readouterr().out
    pids = {p.pid for p in fake_stubs}
    assert set(grouped) == {"CPU"} and pids <= {s.pid for s in grouped["CPU"]}
    assert "No GPU here" in out and "food_classifier_0_1" in out


def test_show_groups_them_per_gpu_from_nvidia_smi(fake_stubs, capsys, monkeypatch):
    a, b = (p.pid for p in fake_stubs)
    monkeypatch.setattr(stubs, "gpu_processes", lambda: {0: [(a, "stub", "300 MiB")], 1: [(b, "stub", "300 MiB")]})
    grouped = stubs.show("food_classifier")
    assert [s.pid for s in grouped["GPU 0"]] == [a] and [s.pid for s in grouped["GPU 1"]] == [b]
    assert "per GPU, from nvidia-smi" in capsys.readouterr().out


def test_show_says_where_to_look_when_nothing_is_visible(capsys, monkeypatch):
    monkeypatch.setattr(stubs, "gpu_processes", lambda: None)
    assert stubs.show("no_such_model") == {}
    assert "nvidia-smi" in capsys.readouterr().out
