"""What each Compose image installs, read from its Dockerfile and the requirements files
it copies (so a test cannot drift from the image), a virtualenv built from exactly that
(once per requirements hash, under build/image-envs/), and a walk of the import graph
of every file that runs in an image or in a notebook's place.

No Docker engine here: the images' package sets are rebuilt as virtualenvs with the
image's Python (3.11 here; 3.10 where this machine has one)."""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
ENVS = REPO / "build" / "image-envs"

PY311_SLIM = "python:3.11.13-slim-bookworm"
TRITON = "nvcr.io/nvidia/tritonserver:24.10-py3"
TRITON_SDK = "nvcr.io/nvidia/tritonserver:24.10-py3-sdk"

# Python of each base image: python:3.11.13-slim is 3.11; the Triton 24.10 images are
# Ubuntu 22.04 with its Python 3.10 (docker/requirements-triton.txt and -jupyter.txt say so).
BASE_PYTHON = {PY311_SLIM: "3.11", TRITON: "3.10", TRITON_SDK: "3.10"}

# What a base image provides beyond the standard library, as import name -> distribution.
#   python:3.11.13-slim: nothing the kit imports (pip/setuptools only).
#   tritonserver:24.10-py3: the Python backend puts triton_python_backend_utils on the stub's
#     path (Triton's python_backend README: "import triton_python_backend_utils as pb_utils").
#   tritonserver:24.10-py3-sdk: tritonclient[all] and perf_analyzer (the SDK image's purpose; the
#     kit's Dockerfile.jupyter skips its own tritonclient install there). Its exact client version
#     is the 24.10 release's; the kit's local pin, 2.50.0, stands in for it here.
BASE_PROVIDES: dict[str, dict[str, str]] = {
    PY311_SLIM: {},
    TRITON: {"triton_python_backend_utils": "tritonserver (python backend)"},
    TRITON_SDK: {"tritonclient": "tritonclient"},
}
SDK_STAND_IN = ["tritonclient[http,grpc]==2.50.0"]  # [all] adds cuda-python, which no notebook uses

# Where the notebooks' other places run (issue 28): the node has only its system Python;
# Chameleon's Jupyter has python-chi (with fabric/invoke, which its server.execute uses, and
# python-blazarclient, which its chi/lease.py imports) and IPython, and no torch.
PLACE_PROVIDES = {
    "node": {},
    "chameleon": {"chi": "python-chi", "fabric": "fabric", "invoke": "invoke", "IPython": "ipython",
                  "paramiko": "paramiko", "blazarclient": "python-blazarclient"},
}


# --------------------------------------------------------------------------
# Dockerfiles
# --------------------------------------------------------------------------

def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    out, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not buf and not line):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def requirement_lines(path: Path) -> list[str]:
    """A requirements file's requirements (comments dropped, markers kept)."""
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


@dataclass
class Image:
    name: str
    dockerfile: Path | None           # None: a stock image Compose runs as is
    base: str                         # the FROM image (build arg resolved)
    runs: list[str]                   # files (repo-relative) or modules ("-m servelab.x") run inside
    pythonpath: list[str] = field(default_factory=list)  # repo-relative, as the image / Compose sets it

    @property
    def python(self) -> str:
        return BASE_PYTHON[self.base]

    def requirements(self) -> list[str]:
        """What the image's pip installs, in order, read from the Dockerfile: `-r FILE`
        of a COPYed file, and quoted requirements on the pip line. A `python3 -c "import X"
        || pip install ...` line installs only where the base image lacks X."""
        if self.dockerfile is None:
            return []
        copies: dict[str, Path] = {}
        reqs: list[str] = []
        for word, args in instructions(self.dockerfile):
            if word == "COPY":
                *srcs, dst = shlex.split(args)
                if len(srcs) == 1:
                    copies[dst] = REPO / srcs[0]
            if word != "RUN" or "pip install" not in args:
                continue
            guard = re.match(r'python3? -c "import (\w+)"[^|]*\|\|', args)
            if guard and guard.group(1) in BASE_PROVIDES[self.base]:
                continue
            words = shlex.split(args.split("||")[-1])
            for i, w in enumerate(words):
                if w == "-r":
                    reqs += requirement_lines(copies[words[i + 1]])
                elif re.match(r"^[A-Za-z0-9_.\-]+(\[[^\]]*\])?==", w):
                    reqs.append(w)
        return reqs

    def provides(self) -> dict[str, str]:
        return dict(BASE_PROVIDES[self.base])


def _from(dockerfile: Path, arg: str | None = None) -> str:
    """The FROM image, with an ARG default (or ``arg``) substituted."""
    args, image = {}, None
    for word, rest in instructions(dockerfile):
        if word == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            args[k] = v
        if word == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest.split()[0])
            break
    return arg or image


def images() -> dict[str, Image]:
    """Every image of the Compose stacks; the Jupyter image twice (its two bases, as
    the Compose files set BASE_IMAGE)."""
    d = REPO / "docker"
    jup = d / "Dockerfile.jupyter"
    nb = ["PYTHONPATH=."]
    return {i.name: i for i in (
        Image("fastapi_pt", REPO / "fastapi_pt/Dockerfile", _from(REPO / "fastapi_pt/Dockerfile"),
              ["fastapi_pt/app.py"]),
        Image("fastapi_onnx", REPO / "fastapi_onnx/Dockerfile", _from(REPO / "fastapi_onnx/Dockerfile"),
              ["fastapi_onnx/app.py"]),
        Image("flask", REPO / "flask_app/Dockerfile", _from(REPO / "flask_app/Dockerfile"),
              ["flask_app/app.py", "-m servelab.serve.webserver", "-m servelab.serve.harden",
               "servelab/serve/flask_harden.py"]),   # CMD: gunicorn ... servelab.serve.harden:flask_app
        Image("models", d / "Dockerfile.models", _from(d / "Dockerfile.models"),
              ["-m servelab", "servelab/serve/models.py"]),   # `python -m servelab models build`
        Image("triton", d / "Dockerfile.triton", _from(d / "Dockerfile.triton"),
              [str(p.relative_to(REPO)) for p in sorted(REPO.glob("models_staging/*/1/model.py"))]),
        Image("triton_cpu_repository", None, PY311_SLIM, ["-m servelab.node.compose"]),
        Image("jupyter", jup, _from(jup, PY311_SLIM), ["notebook:4_fastapi"], nb),
        Image("jupyter-sdk", jup, _from(jup, TRITON_SDK), ["notebook:6_triton", "notebook:6a_triton_pipeline"], nb),
    )}


# --------------------------------------------------------------------------
# Virtualenvs with exactly an image's packages
# --------------------------------------------------------------------------

@lru_cache(maxsize=None)
def find_python(version: str) -> str | None:
    """An interpreter of that minor version on this machine (never downloaded)."""
    candidates = [shutil.which(f"python{version}"), f"/usr/bin/python{version}",
                  *sorted(str(p) for p in Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python{version}"))]
    for c in filter(None, candidates):
        try:
            out = subprocess.run([c, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return c
    return None


def env_key(python: str, reqs: list[str]) -> str:
    return hashlib.sha256(json.dumps([python, reqs]).encode()).hexdigest()[:12]


def build_env(name: str, python: str, reqs: list[str], timeout: int = 1500) -> Path:
    """A virtualenv under build/image-envs/<name>-<hash>/ with ``reqs`` installed by
    ``python``'s pip; built once per (python, requirements) hash, then reused. The
    build's own time is kept in its ``.built`` stamp."""
    exe = find_python(python)
    if exe is None:
        raise FileNotFoundError(f"no Python {python} on this machine")
    root = ENVS / f"{name}-{env_key(python, reqs)}"
    stamp = root / ".built"
    if stamp.exists():
        return root
    ENVS.mkdir(parents=True, exist_ok=True)
    with open(ENVS / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # a second test process waits for the first build
        if stamp.exists():
            return root
        shutil.rmtree(root, ignore_errors=True)   # an interrupted build: start over
        t0 = time.monotonic()
        subprocess.run([exe, "-m", "venv", str(root)], check=True, capture_output=True, timeout=300)
        (root / "requirements.txt").write_text("\n".join(reqs) + "\n")
        cpu0 = _child_cpu()
        # uv (the kit venv's, pinned in pyproject.toml) installs the image's pins into this Python's venv:
        # the same package set as the image's pip (compared for the Jupyter image: 116 packages, equal
        # `pip freeze`), in a tenth of the time. No .pyc files written, as pip --no-compile did (the
        # kernels run with PYTHONDONTWRITEBYTECODE=1, as the image sets it).
        out = subprocess.run([str(Path(sys.executable).parent / "uv"), "pip", "install", "-q",
                              "--python", str(root / "bin" / "python"), "-r", str(root / "requirements.txt")],
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"uv could not install {name}'s requirements:\n{out.stderr[-3000:]}")
        stamp.write_text(json.dumps({"python": python, "requirements": reqs,
                                     "seconds": round(time.monotonic() - t0, 1),
                                     "cpu_seconds": round(_child_cpu() - cpu0, 1)}) + "\n")
    return root


def _child_cpu() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def env_python(root: Path) -> Path:
    return root / "bin" / "python"


# --------------------------------------------------------------------------
# The import graph
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Use:
    module: str      # the imported module (full dotted name)
    source: str      # repo-relative file or notebook cell
    line: int
    lazy: bool       # inside a function: runs when the function is called
    guarded: bool = False      # inside `try: ... except ImportError`: optional by design
    owner: str | None = None   # the top-level function or class it is in (None: module level)


def _source_of_cells(cells: list[str]) -> str:
    """Notebook code cells as Python: IPython magics and shell lines (`%`, `!`,
    `x = !cmd`) dropped."""
    keep = []
    for cell in cells:
        for line in cell.splitlines():
            s = line.strip()
            if s.startswith(("%", "!")) or re.match(r"^\w+\s*=\s*!", s):
                keep.append("")
            else:
                keep.append(line)
        keep.append("")
    return "\n".join(keep)


@dataclass
class Parsed:
    uses: list[Use]
    refs: dict[str | None, set[str]]   # owner -> names its code mentions (None: module level)


def _names(node) -> set[str]:
    """Bare names, and `module.name` for an attribute of a plain name (perf.run)."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            out.add(f"{n.value.id}.{n.attr}")
        elif isinstance(n, ast.ImportFrom) and n.module:
            out.update(f"{n.module.rpartition('.')[2]}.{a.name}" for a in n.names)
    return out


def imports_in(text: str, source: str, package: str = "") -> Parsed:
    """Every absolute (or resolved relative) import in ``text``, with the top-level
    function or class it is in, and the names each top-level function or class (and
    the module level) mentions; ``if TYPE_CHECKING`` blocks skipped."""
    tree = ast.parse(text)
    uses: list[Use] = []
    refs: dict[str | None, set[str]] = {None: set()}

    def visit(node, lazy: bool, owner: str | None, guarded: bool = False):
        if isinstance(node, ast.Try) and any(
                h.type is not None and {"ImportError", "ModuleNotFoundError"} & _names(h.type) for h in node.handlers):
            guarded = True
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            own = owner
            if owner is None and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own = child.name
                refs.setdefault(own, set()).update(_names(child))
                for d in child.decorator_list:
                    refs[None].update(_names(d))
            if isinstance(child, ast.Import):
                uses.extend(Use(a.name, source, child.lineno, lazy, guarded, own) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(filter(None, [*parts, base]))
                uses.append(Use(base, source, child.lineno, lazy, guarded, own))
                for a in child.names:   # `from servelab.core import food11` imports a submodule
                    uses.append(Use(f"{base}.{a.name}", source, child.lineno, lazy, guarded, own))
            elif own is None and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                refs[None].update(_names(child))
            visit(child, inner, own, guarded)

    visit(tree, False, None)
    return Parsed(uses, refs)


def module_file(name: str) -> Path | None:
    """The kit's own file for a dotted module name (servelab.* only), else None."""
    if name.split(".")[0] != "servelab":
        return None
    base = REPO.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def notebook_cells(slug: str, label: str) -> list[str]:
    """The code cells of notebooks/<slug>.ipynb that start with ``label``."""
    nb = json.loads((REPO / "notebooks" / f"{slug}.ipynb").read_text())
    cells = []
    for c in nb["cells"]:
        src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        if c["cell_type"] == "code" and src.lstrip().startswith(label):
            cells.append(src)
    return cells


def walk(roots: list[str], cells: list[tuple[str, str]] = ()) -> tuple[set[str], list[Use]]:
    """Follow the kit's own imports from ``roots`` (repo-relative files, or
    "-m servelab.x") and from notebook ``cells`` ((name, source)). An import inside a
    function counts when that function can run here: the roots' and cells' code all
    can, and so can any function or class whose name reachable code mentions (by name
    only, so this errs towards counting). Returns (the kit's files reached, every
    third-party or stdlib import that can run)."""
    parsed: dict[str, Parsed] = {}
    root_sources: set[str] = set()
    todo: list[tuple[Path, str]] = []
    for r in roots:
        if r.startswith("-m "):
            mod = r[3:]
            parts = mod.split(".")
            todo += [(module_file(".".join(parts[:i])), ".".join(parts[:i])) for i in range(1, len(parts) + 1)]
            main = module_file(mod).parent / "__main__.py"
            if module_file(mod).name == "__init__.py" and main.is_file():   # `python -m package`
                todo.append((main, mod + ".__main__"))
        else:
            todo.append((REPO / r, ""))
            root_sources.add(r)
    for name, src in cells:
        parsed[name] = imports_in(_source_of_cells([src]), name)
        root_sources.add(name)
        todo += _kit_modules(parsed[name].uses)
    siblings: dict[str, set[str]] = {}   # a lesson file's imports of the files beside it
    while todo:
        path, mod = todo.pop()
        rel = str(path.relative_to(REPO))
        if rel in parsed:
            continue
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        parsed[rel] = imports_in(path.read_text(), rel, pkg)
        todo += _kit_modules(parsed[rel].uses)
        if not mod and not (path.parent / "__init__.py").exists():
            # A script's own folder is on its import path (Triton's Python backend puts a
            # model's version folder there; `gunicorn`/servelab.serve.harden the app's folder).
            beside = {u.module.split(".")[0] for u in parsed[rel].uses
                      if (path.parent / f"{u.module.split('.')[0]}.py").is_file()}
            siblings[rel] = beside
            todo += [(path.parent / f"{name}.py", "") for name in sorted(beside)]
    # What can run: everything in the roots and at module level everywhere, then every
    # top-level function or class that running code names, bare within its own module
    # or as `module.name` (or `from module import name`) elsewhere.
    local: dict[str, set[str]] = {}
    for src, p in parsed.items():
        local[src] = set().union(*p.refs.values()) if src in root_sources else set(p.refs[None])
    grew = True
    while grew:
        grew = False
        qualified = set().union(*local.values())
        for src, p in parsed.items():
            base = Path(src).parent.name if src.endswith("__init__.py") else Path(src).stem
            for owner, names in p.refs.items():
                if owner is not None and (owner in local[src] or f"{base}.{owner}" in qualified) \
                        and not names | {owner} <= local[src]:
                    local[src] |= names | {owner}
                    grew = True
    external = [u for src, p in parsed.items() for u in p.uses
                if u.module.split(".")[0] not in ("servelab", "", *siblings.get(src, ()))
                and (u.owner is None or u.owner in local[src])]
    return {s for s in parsed if s not in dict(cells)}, external


def _kit_modules(uses: list[Use]) -> list[tuple[Path, str]]:
    out = []
    for u in uses:
        parts = u.module.split(".")
        if parts[0] == "servelab":
            for i in range(1, len(parts) + 1):
                f = module_file(".".join(parts[:i]))
                if f is not None:
                    out.append((f, ".".join(parts[:i])))
    return out


@lru_cache(maxsize=None)
def stdlib_names(python: str) -> frozenset[str]:
    """sys.stdlib_module_names of that Python (asked of the interpreter itself when
    this machine has it, else this one's)."""
    exe = find_python(python) or sys.executable
    out = subprocess.run([exe, "-c", "import sys; print('\\n'.join(sorted(sys.stdlib_module_names)))"],
                         capture_output=True, text=True, timeout=30, check=True)
    return frozenset(out.stdout.split())


# Import names a distribution this venv lacks also provides: onnxruntime-gpu installs the
# same `onnxruntime` package as onnxruntime (its wheel's only top-level package).
OTHER_OWNERS = {"onnxruntime": ["onnxruntime-gpu"]}


@lru_cache(maxsize=None)
def _dists_of_module() -> dict[str, list[str]]:
    """import name -> distributions (from this venv, which has every package the kit uses)."""
    owners = {k: [d.lower() for d in v] for k, v in metadata.packages_distributions().items()}
    for k, v in OTHER_OWNERS.items():
        owners[k] = owners.get(k, []) + v
    return owners


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(reqs: list[str], python: str) -> set[str]:
    """The distributions ``reqs`` install, their dependencies included (read from this
    venv's metadata, markers evaluated for ``python``; extras followed)."""
    env = {"python_version": python, "python_full_version": python + ".0", "extra": ""}
    out: set[str] = set()
    todo = [Requirement(r) for r in reqs]
    while todo:
        r = todo.pop()
        if r.marker and not r.marker.evaluate(env):
            continue
        key = (_norm(r.name), tuple(sorted(r.extras)))
        if key in out:
            continue
        out.add(key)
        try:
            requires = metadata.requires(r.name) or []
        except metadata.PackageNotFoundError:
            continue
        for dep in requires:
            d = Requirement(dep)
            if d.marker:
                if not any(d.marker.evaluate({**env, "extra": e}) for e in ("", *r.extras)):
                    continue
                d.marker = Marker('python_version >= "0"')
            todo.append(d)
    return {name for name, _ in out}


def unresolved(external: list[Use], python: str, dists: set[str], provided: dict[str, str]) -> list[Use]:
    """The imports that resolve neither to the standard library of ``python``, nor to a
    module the place provides, nor to one of ``dists``."""
    std = stdlib_names(python)
    owners = _dists_of_module()
    bad = []
    for u in external:
        top = u.module.split(".")[0]
        if top in std or top in provided or top == "__future__":
            continue
        if any(_norm(d) in dists for d in owners.get(top, [])):
            continue
        bad.append(u)
    return bad


def env_requirements(image: Image) -> list[str]:
    """What a virtualenv needs to stand in for the image: its own pip installs, plus
    the SDK base's tritonclient (the SDK image ships it; see BASE_PROVIDES)."""
    return image.requirements() + (SDK_STAND_IN if image.base == TRITON_SDK else [])


def image_env(name: str) -> Path:
    """The virtualenv standing in for Compose image ``name`` (built once per hash)."""
    image = images()[name]
    return build_env(name, image.python, env_requirements(image))


def sdk_tools() -> Path:
    """A folder holding what the SDK image has on its PATH beyond Python packages:
    perf_analyzer (here the kit venv's, tritonclient 2.50.0's binary behind its shim)."""
    target = Path(sys.executable).parent / "perf_analyzer"
    # one folder per interpreter: checkouts sharing build/image-envs never repoint each other's link
    tools = ENVS / "sdk-tools" / hashlib.sha256(str(target).encode()).hexdigest()[:12]
    tools.mkdir(parents=True, exist_ok=True)
    link = tools / "perf_analyzer"
    if not link.is_symlink() or Path(os.readlink(link)) != target:
        tmp = tools / f".perf_analyzer.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, link)
    return tools


def cpu_stand_in(reqs: list[str]) -> list[str]:
    """An image's requirements as they can install and run on this CPU-only machine:
    onnxruntime-gpu==V becomes onnxruntime==V (the same release, CPU build: the GPU
    wheel and its CUDA libraries are about 3 GB, and the CPU override never uses CUDA),
    the nvidia-* CUDA runtime wheels are left out. Everything else as pinned."""
    out = []
    for r in reqs:
        name = Requirement(r).name.lower()
        if name.startswith("nvidia-"):
            continue
        out.append(re.sub(r"^onnxruntime-gpu==", "onnxruntime==", r))
    return out


def service_env(name: str) -> Path:
    """The virtualenv standing in for service image ``name`` (see :func:`cpu_stand_in`)."""
    image = images()[name]
    reqs = env_requirements(image)
    cpu = cpu_stand_in(reqs)
    return build_env(name if cpu == reqs else name + "-cpu", image.python, cpu)


def import_names(dists: set[str]) -> set[str]:
    """The top-level import names ``dists`` provide (as this venv's metadata says)."""
    return {mod for mod, owners in _dists_of_module().items() if any(_norm(d) in dists for d in owners)}
