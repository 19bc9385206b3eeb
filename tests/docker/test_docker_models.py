"""The one-shot `models` service (docker/docker-compose-models.yaml): on the
node, `docker compose -f .../docker-compose-models.yaml run --rm models` is how
the model files are built -- no Python environment on the host. Checked with
the real Compose v2 binary (no engine here), against the FastAPI PyTorch image
it shares its torch layer with, and by running the kit's CLI with only the
image's packages importable."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from servelab.core import paths
from servelab.node import compose
from tests.images import imagekit

from .dockerkit import (
    DOCKER,
    MODELS_FILE,
    REPO,
    compose_env,
    dockerfile_instructions,
    requirement_pins,
)


def test_models_file_validates_from_any_directory(tmp_path, empty_env_file):
    result = compose.config([MODELS_FILE], env=compose_env(), cwd=tmp_path,
                            extra_args=["--env-file", str(empty_env_file)])
    assert result.returncode == 0, result.stderr
    assert str(REPO) in result.stdout  # the bind mount resolves to the clone, wherever the shell is


def test_models_service_writes_into_the_bind_mounted_kit(rendered_models):
    (name,) = rendered_models["services"]
    assert name == "models"
    svc = rendered_models["services"]["models"]
    (mount,) = svc["volumes"]
    assert (mount["type"], mount["source"], mount["target"]) == ("bind", str(REPO), "/kit")
    assert not mount.get("read_only"), "the build writes build/models/, fastapi_*/ and models_staging/"
    assert svc["working_dir"] == "/kit" and svc["environment"]["PYTHONPATH"] == "/kit"
    assert svc["environment"]["SERVELAB_ROOT"] == "/kit"
    # Files it writes belong to cc (uid 1000 on Chameleon images), not root.
    assert svc["user"] == "1000:1000"
    assert svc["entrypoint"] == ["python", "-m", "servelab", "models"]
    # the trained model notebook 2 fetched (servelab.node.weights), if it is there and loads; else the demo weights
    assert svc["command"] == ["build", "--prefer-weights", paths.TRAINED_WEIGHTS.relative_to(paths.REPO_ROOT).as_posix()]
    # A one-shot job: nothing published, no GPU, no restart loop, no network.
    assert "ports" not in svc and "deploy" not in svc and "restart" not in svc
    assert svc["network_mode"] == "none"
    assert svc["image"] == "servelab/models:0.1.0"


def test_uid_can_be_overridden_for_another_host(empty_env_file):
    cfg = compose.config_json([MODELS_FILE], env=compose_env(SERVELAB_UID="1234", SERVELAB_GID="99"), cwd=REPO,
                              extra_args=["--env-file", str(empty_env_file)])
    assert cfg["services"]["models"]["user"] == "1234:99"


def test_models_image_shares_the_fastapi_torch_layer():
    """Same first instructions as fastapi_pt/Dockerfile: BuildKit builds torch once for both images."""
    models = dockerfile_instructions(DOCKER / "Dockerfile.models")
    fastapi = dockerfile_instructions(REPO / "fastapi_pt" / "Dockerfile")
    shared = [i for i in fastapi if i[0] in ("FROM", "ARG", "ENV", "COPY", "RUN")][:5]
    assert [w for w, _ in shared] == ["FROM", "ARG", "ENV", "COPY", "RUN"]
    assert models[:5] == shared
    assert ("COPY", "docker/requirements-models.txt /tmp/requirements-models.txt") in models


def test_models_image_pins_what_the_build_imports():
    pins = requirement_pins(DOCKER / "requirements-models.txt")
    assert pins["onnxruntime"] == ["1.22.0"]  # CPU build: the parity check; same line as onnxruntime-gpu
    served = requirement_pins(REPO / "fastapi_pt" / "requirements.txt")
    # The pickled food11.pth is built by the torch that serves it (fastapi_pt, and Triton's model.py).
    assert served["torch"] == requirement_pins(DOCKER / "requirements-triton.txt")["torch"] == ["2.7.1"]


# The packages the models image has, by import name: read from Dockerfile.models and the
# requirements files it copies, with their dependencies (tests/images/imagekit.py).
_MODELS = imagekit.images()["models"]
IMAGE_PACKAGES = imagekit.import_names(imagekit.closure(_MODELS.requirements(), _MODELS.python))

BLOCKER = textwrap.dedent("""
    import importlib.abc, runpy, sys
    allowed = set({allowed!r}) | set(sys.stdlib_module_names) | {{"servelab"}}
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] not in allowed:
                raise ModuleNotFoundError(f"not in the models image: {{name}}", name=name)
            return None
    sys.meta_path.insert(0, Block())
    sys.argv = ["servelab", "models", "build", "--help"]
    runpy.run_module("servelab", run_name="__main__", alter_sys=True)
""")


def test_the_cli_starts_with_only_the_images_packages():
    """`python -m servelab models build` (the service's entrypoint) must not need a package the image lacks."""
    out = subprocess.run([sys.executable, "-c", BLOCKER.format(allowed=sorted(IMAGE_PACKAGES))],
                         capture_output=True, text=True, timeout=120, cwd=paths.REPO_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "--weights" in out.stdout


def test_the_blocker_would_notice_a_missing_package():
    """Control: with no third-party package allowed, the CLI cannot start (servelab.serve.models needs numpy)."""
    out = subprocess.run([sys.executable, "-c", BLOCKER.format(allowed=[])], capture_output=True, text=True,
                         timeout=120, cwd=paths.REPO_ROOT)
    assert out.returncode != 0 and "not in the models image" in out.stderr
