"""The Jupyter images' package sets, built the way their Dockerfiles install them
(tests/images/imagekit.py): every package a Dockerfile pins is installed at that
version, and the interpreter is the image's. The notebook tests run their kernels
in these environments, so a pin pip could not honour shows here first."""

from __future__ import annotations

import json
import subprocess

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.images import imagekit

pytestmark = pytest.mark.integration   # builds the images' virtualenvs (minutes)


@pytest.mark.parametrize("name", ["jupyter", "jupyter-sdk"])
def test_jupyter_image_env_holds_exactly_the_dockerfiles_pins(name):
    image = imagekit.images()[name]
    if imagekit.find_python(image.python) is None:
        pytest.skip(f"no Python {image.python} on this machine ({name}'s); its notebooks run in the kit's venv")
    env = imagekit.image_env(name)
    python = imagekit.env_python(env)
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m, json, sys; "
                          "print(json.dumps([sys.version.split()[0], "
                          "[[d.metadata['Name'], d.version] for d in m.distributions()]]))"],
                         capture_output=True, text=True, check=True, timeout=120)
    version, dists = json.loads(out.stdout)
    assert version.startswith(image.python + "."), version
    installed = {canonicalize_name(n): v for n, v in dists}
    pins = [r for r in map(Requirement, imagekit.env_requirements(image))   # those for the image's Python
            if r.marker is None or r.marker.evaluate({"python_version": image.python})]
    assert pins, f"{name}: no pinned requirement read from its Dockerfile"
    wrong = {str(r): installed.get(canonicalize_name(r.name), "not installed") for r in pins
             if not r.specifier.contains(installed.get(canonicalize_name(r.name), "0"), prereleases=True)}
    assert not wrong, f"{name}: installed versions differ from the pins: {wrong}"
