"""What only a GPU can show about the local Triton (run with `pytest -m cuda`
on a machine with CUDA; skipped elsewhere): a KIND_GPU copy of the PyTorch
model runs on cuda:N, and two copies land on the GPUs the config names."""

from __future__ import annotations

import re

import pytest

from servelab import triton

pytestmark = [pytest.mark.cuda, pytest.mark.integration]   # they start servers on the GPU

MODEL = "food_classifier"


def _devices(server) -> dict[str, str]:
    """{instance: device} of the copies running now, from each copy's own log line
    ("<instance>: on cuda:0, ..."; the latest line per name: a reload may keep a copy)."""
    logged = dict(re.findall(rf"({MODEL}_\d+_\d+): on (\S+?),", server.log_path.read_text(errors="replace")))
    return {s.instance: logged.get(s.instance, "?") for s in server.stub_processes(MODEL)}


@pytest.fixture(scope="module")
def gpu_triton(start_triton):
    server = start_triton(models=[MODEL])
    yield server
    server.stop()


def test_a_kind_gpu_copy_runs_on_cuda(gpu_triton):
    import torch

    reported = gpu_triton.model_config(MODEL)
    assert [g["kind"] for g in reported["instance_group"]] == ["KIND_GPU"]
    devices = _devices(gpu_triton)
    assert devices and all(d.startswith("cuda:") for d in devices.values()), devices
    assert all(int(d.split(":")[1]) < torch.cuda.device_count() for d in devices.values())
    # and it answers from there
    from servelab import bench

    result = bench.warm(bench.triton_target(gpu_triton.url, MODEL), requests=4)
    assert result.ok == 4 and not result.errors


def test_two_copies_land_on_the_gpus_the_config_names(gpu_triton):
    import torch

    gpus = [0, 1] if torch.cuda.device_count() >= 2 else [0]
    count = 2 // len(gpus)                       # two copies in all: one per GPU, or both on GPU 0
    reported = gpu_triton.reload_model(MODEL, triton.set_instances(count, "KIND_GPU", gpus))
    assert triton.instance_count(reported) == 2
    devices = _devices(gpu_triton)
    assert len(devices) == 2, devices
    assert sorted(int(d.split(":")[1]) for d in devices.values()) == sorted(g for g in gpus for _ in range(count))
