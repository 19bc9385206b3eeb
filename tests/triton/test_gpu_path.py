"""The GPU path's logic, checked here on the CPU: what a host with GPUs looks
like is a seam these tests set (a /dev folder with nvidia<N> files,
CUDA_VISIBLE_DEVICES, a config that Triton reports with KIND_GPU)."""

from __future__ import annotations

import argparse
import os

import pytest

from servelab import triton
from servelab.triton import cli as triton_cli
from servelab.triton import install


@pytest.fixture
def two_gpus(tmp_path, monkeypatch):
    """A host whose driver shows two GPUs (plus the control devices, which are not GPUs)."""
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        (tmp_path / name).write_text("")
    monkeypatch.setattr(install, "DEV_DIR", tmp_path, raising=False)  # the seam: where /dev/nvidia<N> are
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SERVELAB_DEVICE", raising=False)
    return tmp_path


GPU_CONFIG = {"name": "food_classifier", "backend": "python", "max_batch_size": 16,
              "instance_group": [{"count": 1, "kind": "KIND_GPU", "gpus": [0]}]}


@pytest.mark.parametrize("visible, expected", [
    (None, 2), ("0,1", 2), ("1", 1), ("", 0), ("-1", 0), ("0,7,1", 1), ("GPU-3f2a", 1), ("NoDevFiles", 0),
])
def test_gpu_count_honours_cuda_visible_devices(two_gpus, monkeypatch, visible, expected):
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert triton.gpu_count() == expected
    monkeypatch.setenv("SERVELAB_DEVICE", "cpu")
    assert triton.gpu_count() == 0


def test_hidden_gpus_make_the_local_repository_cpu(two_gpus, monkeypatch):
    """A hidden GPU must not keep KIND_GPU: the load would fail."""
    cfg = triton.dict_to_config(GPU_CONFIG)
    seen, _ = triton.localize_config(cfg)
    assert [g.kind for g in seen.instance_group] == [seen.instance_group[0].KIND_GPU]   # the GPUs are there
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    local, notes = triton.localize_config(cfg)
    assert [g.kind for g in local.instance_group] == [local.instance_group[0].KIND_CPU], notes


def test_server_env_keeps_a_system_lib_folder_off_the_library_path(tmp_path, monkeypatch):
    """A system Python's LIBDIR (/usr/lib/x86_64-linux-gnu) is searched anyway; listed
    on LD_LIBRARY_PATH it would shadow torch's own CUDA libraries in the stubs."""
    fake = install.TritonInstall(tmp_path / "site" / "pytriton" / "tritonserver")
    real = install.sysconfig.get_config_var
    system = "/usr/lib/" + (real("MULTIARCH") or "x86_64-linux-gnu")
    if not os.path.exists(os.path.join(system, "libc.so.6")):
        system = "/usr/lib"
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)

    def config_var(libdir, soname):
        return lambda name: {"LIBDIR": libdir, "INSTSONAME": soname}.get(name, real(name))

    monkeypatch.setattr(install.sysconfig, "get_config_var", config_var(system, "libc.so.6"))
    assert os.path.exists(os.path.join(system, "libc.so.6"))
    assert system not in install.server_env(fake)["LD_LIBRARY_PATH"].split(os.pathsep)

    # A private interpreter's folder (pyenv, conda) is needed: it comes after Triton's own.
    private = tmp_path / "pyenv" / "lib"
    private.mkdir(parents=True)
    (private / "libpython3.99.so.1.0").write_text("")
    monkeypatch.setattr(install.sysconfig, "get_config_var", config_var(str(private), "libpython3.99.so.1.0"))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/elsewhere")
    assert install.server_env(fake)["LD_LIBRARY_PATH"].split(os.pathsep) == \
        [str(fake.libs), str(private), "/opt/elsewhere"]


def test_instance_count_gpu_group_without_gpus_means_every_gpu(two_gpus):
    def groups(*gs):
        return {"instance_group": list(gs)}

    assert triton.instance_count(groups({"count": 2, "kind": "KIND_GPU"})) == 4          # 2 per GPU, 2 GPUs
    assert triton.instance_count(groups({"count": 2, "kind": "KIND_GPU", "gpus": [1]})) == 2
    assert triton.instance_count(groups({"count": 1, "kind": "KIND_GPU", "gpus": [0, 1]})) == 2
    assert triton.instance_count(groups({"count": 3, "kind": "KIND_CPU"})) == 3
    assert triton.instance_count(groups({"count": 1, "kind": "KIND_AUTO"})) == 2           # AUTO = GPU here
    assert triton.instance_count(groups({"count": 2, "kind": "KIND_GPU"}, {"count": 1, "kind": "KIND_CPU"})) == 5
    assert triton.instance_count(groups({"count": 2, "kind": "KIND_GPU"}), gpus=1) == 2
    assert triton.instance_count({}) == 2          # no group: Triton's default, one copy per GPU
    assert triton.instance_count({}, gpus=0) == 1


def _reload_args(*argv):
    parser = argparse.ArgumentParser()
    triton_cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["triton", "reload", "food_classifier", *argv])


def test_reload_count_alone_keeps_the_configs_kind_and_gpus():
    """`servelab triton reload --count 2` on a GPU model: two GPU copies, not two CPU ones."""
    new = triton.apply_edit(GPU_CONFIG, triton_cli._edit_from_args(_reload_args("--count", "2")))
    assert new["instance_group"] == [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}]
    # what is given replaces what the config has; a CPU group lists no GPUs
    new = triton.apply_edit(GPU_CONFIG, triton_cli._edit_from_args(_reload_args("--kind", "KIND_CPU")))
    assert new["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]
    new = triton.apply_edit(GPU_CONFIG, triton_cli._edit_from_args(
        _reload_args("--count", "2", "--gpus", "0,1", "--dynamic-batching")))
    assert new["instance_group"] == [{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}]
    assert "dynamic_batching" in new
    # a --set fragment still has the last word
    new = triton.apply_edit(GPU_CONFIG, triton_cli._edit_from_args(
        _reload_args("--count", "2", "--set", "instance_group [ { count: 3 kind: KIND_CPU } ]")))
    assert new["instance_group"] == [{"count": 3, "kind": "KIND_CPU"}]


def test_batch_sizes_to_warm_every_size_on_a_gpu_few_on_the_cpu():
    gpu = {**GPU_CONFIG, "dynamic_batching": {}}
    assert triton.batch_sizes_to_warm(gpu, gpus=1) == list(range(1, 17))
    cpu = {**gpu, "instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    assert triton.batch_sizes_to_warm(cpu, gpus=0) == [1]
    assert triton.batch_sizes_to_warm({**cpu, "dynamic_batching": {"preferred_batch_size": [4, 8]}}, gpus=0) == [1, 4, 8]
    assert triton.batch_sizes_to_warm(GPU_CONFIG, gpus=1) == [1]          # no batcher: clients send batch 1
    assert triton.batch_sizes_to_warm({**gpu, "max_batch_size": 0}, gpus=1) == [1]


def test_warm_copies_runs_every_batch_size_the_batcher_can_form(two_gpus, monkeypatch):
    """lab.warm_copies (notebook 6, after each reload) on a GPU model with dynamic batching:
    each size 1..max_batch_size runs on every copy before anything is timed."""
    from servelab import bench
    from servelab.course import lab

    sent = []
    monkeypatch.setattr(bench, "triton_target", lambda url, model, batch=1, **kw: batch)
    monkeypatch.setattr(bench, "warm", lambda target, requests=8, concurrency=1, **kw: sent.append(
        (target, requests, concurrency)))
    config = {**GPU_CONFIG, "instance_group": [{"count": 1, "kind": "KIND_GPU"}], "dynamic_batching": {}}
    lab.warm_copies("http://127.0.0.1:1", "food_classifier", config)
    assert sorted({size for size, _, _ in sent}) == list(range(1, 17))
    assert all(concurrency == 2 and requests >= 2 for _, requests, concurrency in sent)  # 2 GPUs: 2 copies


def test_a_batch_target_sends_whole_batches():
    import json

    import numpy as np

    from servelab.bench import targets

    image = targets.triton_image_target("http://127.0.0.1:1", images=[b"\xff\xd8jpeg"], batch=3)
    tensor = targets.triton_tensor_target("http://127.0.0.1:1", tensors=[np.zeros((3, 4, 4))],
                                          batch=5)
    for target, shape in ((image, [3, 1]), (tensor, [5, 3, 4, 4])):
        raw = target.requests[0]
        head = raw.split(b"\r\n\r\n", 1)[1]
        length = int(raw.split(b"Inference-Header-Content-Length: ", 1)[1].split(b"\r\n", 1)[0])
        assert json.loads(head[:length])["inputs"][0]["shape"] == shape
