"""The CPU override's model repository: every instance group moved to the CPU,
checked with Triton's own ModelConfig protobuf schema (shipped in tritonclient)."""

from __future__ import annotations

import hashlib
import stat
import subprocess
import sys

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from servelab.node import compose

from .dockerkit import REPO

STAGING = REPO / "models_staging"


def parse(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def kinds(cfg: model_config_pb2.ModelConfig) -> list[int]:
    return [g.kind for g in cfg.instance_group]


@pytest.mark.parametrize("text", [
    "instance_group [{count: 1, kind: KIND_GPU, gpus: [0]}]",
    "instance_group [ { count: 2\n kind: KIND_GPU\n gpus: [ 0, 1 ] } ]",
    "instance_group [{kind: KIND_GPU; gpus: [1]; count: 4}, {count: 1 kind: KIND_CPU}]",
    "instance_group [\n  {\n    count: 2\n    kind: KIND_GPU\n    gpus: [ 0 ]\n  },\n"
    "  {\n    count: 2\n    kind: KIND_GPU\n    gpus: [ 1 ]\n  }\n]",
])
def test_to_cpu_config_moves_every_group_to_the_cpu(text):
    before = parse("name: 'm'\nbackend: 'python'\nmax_batch_size: 16\n" + text)
    after = parse(compose.to_cpu_config("name: 'm'\nbackend: 'python'\nmax_batch_size: 16\n" + text))
    assert model_config_pb2.ModelInstanceGroup.KIND_GPU in kinds(before)
    assert set(kinds(after)) == {model_config_pb2.ModelInstanceGroup.KIND_CPU}
    assert all(len(g.gpus) == 0 for g in after.instance_group)
    assert [g.count for g in after.instance_group] == [g.count for g in before.instance_group]


def _digest(root):
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def test_cpu_repository_of_the_lab_models(tmp_path):
    configs = sorted(STAGING.glob("*/config.pbtxt"))
    assert configs, "models_staging/ has no model"
    source_before = _digest(STAGING)
    dst = tmp_path / "models"
    (dst / "stale_model").mkdir(parents=True)  # left from an earlier run: must go
    out = subprocess.run([sys.executable, "-m", "servelab.node.compose", "cpu-repository", str(STAGING), str(dst),
                          "--world-writable"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert _digest(STAGING) == source_before  # the lab's files are never edited
    assert not (dst / "stale_model").exists()
    copied = _digest(dst)
    for rel, digest in source_before.items():
        if rel.endswith("config.pbtxt"):
            continue
        assert copied.get(rel) == digest, f"{rel} not copied as is"
    for cfg_path in configs:
        original = parse(cfg_path.read_text())
        rewritten = parse((dst / cfg_path.parent.name / "config.pbtxt").read_text())
        # (an ensemble, food_pipeline, has no instance group of its own)
        assert set(kinds(rewritten)) == ({model_config_pb2.ModelInstanceGroup.KIND_CPU}
                                         if original.instance_group else set())
        assert all(len(g.gpus) == 0 for g in rewritten.instance_group)
        # Everything but the instance groups is unchanged.
        original.ClearField("instance_group")
        rewritten.ClearField("instance_group")
        assert original == rewritten
        assert f"KIND_CPU: {dst / cfg_path.parent.name / 'config.pbtxt'}" in out.stdout
    # The non-root Jupyter container can edit the copy.
    for p in [dst, *dst.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode & 0o006 == 0o006 if p.is_file() else mode == 0o777, (p, oct(mode))


def test_cpu_repository_rejects_a_missing_source(tmp_path):
    with pytest.raises(FileNotFoundError):
        compose.cpu_repository(tmp_path / "nope", tmp_path / "dst")


def test_compose_module_runs_on_the_standard_library_alone():
    """The CPU override runs it in a bare python:3.11-slim container with only servelab/ mounted."""
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); sys.modules['numpy'] = None; sys.modules['PIL'] = None; "
            "import servelab.node.compose as c; print(c.to_cpu_config('kind: KIND_GPU gpus: [0]'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["kind:", "KIND_CPU"]
