"""perf_analyzer for the local target: set-up, runner and output parser.

``tritonclient[all]==2.50.0`` installs the real ``perf_analyzer`` binary
into the venv's ``bin/``, but it cannot start on its own: it needs
``libb64.so.0d`` and ``libcudart.so.12``. nvidia-pytriton ships both under
hashed names in ``nvidia_pytriton.libs/``. This module

* makes a folder holding the two libraries under the names perf_analyzer
  asks for (symlinks) — :func:`lib_dir`;
* gives the environment that lets the binary start —
  :func:`perf_analyzer_env` (``servelab triton env`` prints it as
  ``export`` lines);
* installs a small shell shim as ``<venv>/bin/perf_analyzer`` that sets the
  library path and runs the real binary, so the lab's commands run
  verbatim in a venv shell, in ``make`` and in notebook ``!`` cells —
  :func:`install_shim` (``servelab triton setup``; ``servelab triton start``
  does it too). The real binary moves to ``<venv>/lib/servelab-perf-analyzer/``;
* runs perf_analyzer and parses what it prints (:func:`parse_output`) and
  its ``-f`` CSV (:func:`parse_csv`) into plain dicts.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from servelab.core.procs import venv_bin

# The two libraries perf_analyzer 2.50 links against, and the hashed file
# nvidia-pytriton 0.7.0 ships each one as.
NEEDED_LIBS = {
    "libb64.so.0d": "libb64-*.so.0d",
    "libcudart.so.12": "libcudart-*.so.12*",
}
BINARIES = ("perf_analyzer", "perf_client")
SHIM_MARKER = "# servelab perf_analyzer shim"


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer is missing, cannot start, or failed a run."""


# --------------------------------------------------------------------------
# Where things are
# --------------------------------------------------------------------------

def pytriton_libs() -> Path:
    """``site-packages/nvidia_pytriton.libs`` (next to ``pytriton/``)."""
    try:
        import pytriton  # only its location is needed
    except ImportError as err:  # pragma: no cover - depends on the install
        raise PerfAnalyzerError(
            "nvidia-pytriton is not installed; install it with `pip install nvidia-pytriton==0.7.0`."
        ) from err
    libs = Path(pytriton.__file__).resolve().parent.parent / "nvidia_pytriton.libs"
    if not libs.is_dir():
        raise PerfAnalyzerError(f"{libs} is missing: reinstall nvidia-pytriton==0.7.0.")
    return libs


def lib_dir(base: Path | None = None) -> Path:
    """A folder with ``libb64.so.0d`` and ``libcudart.so.12`` symlinked to
    nvidia-pytriton's copies; created on first use. ``base`` defaults to
    ``<venv>/lib/servelab-perf-analyzer`` (or a per-user cache folder when the
    venv is read-only)."""
    candidates = [base] if base is not None else [
        venv_bin().parent / "lib" / "servelab-perf-analyzer",
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "servelab" / "perf-analyzer",
    ]
    libs = pytriton_libs()
    last_err: Exception | None = None
    for folder in candidates:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for name, pattern in NEEDED_LIBS.items():
                matches = sorted(libs.glob(pattern))
                if not matches:
                    raise PerfAnalyzerError(f"no {pattern} in {libs}: reinstall nvidia-pytriton==0.7.0.")
                link = folder / name
                if link.is_symlink() and Path(os.readlink(link)) == matches[0]:
                    continue
                tmp = folder / f".{name}.{os.getpid()}"
                if tmp.is_symlink() or tmp.exists():
                    tmp.unlink()
                tmp.symlink_to(matches[0])
                os.replace(tmp, link)  # atomic: a concurrent user never sees it missing
            return folder
        except OSError as err:
            last_err = err
    raise PerfAnalyzerError(f"cannot create the perf_analyzer library folder: {last_err}")


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _is_shim(path: Path) -> bool:
    try:
        return SHIM_MARKER in path.read_text(errors="replace")[:400]
    except (OSError, UnicodeDecodeError):
        return False


def real_binary(name: str = "perf_analyzer") -> Path:
    """The real ELF binary: moved beside the libraries when the shim is
    installed, else where pip put it."""
    moved = venv_bin().parent / "lib" / "servelab-perf-analyzer" / name
    if _is_elf(moved):
        return moved
    for folder in [venv_bin(), *map(Path, os.environ.get("PATH", "").split(os.pathsep))]:
        candidate = folder / name
        if _is_elf(candidate):
            return candidate
    raise PerfAnalyzerError(
        f"{name} not found: it comes with `pip install 'tritonclient[all]==2.50.0'` (the manylinux wheel)."
    )


def perf_analyzer_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the venv's bin
    first on PATH and the library folder first on LD_LIBRARY_PATH."""
    env = dict(os.environ if base is None else base)
    libs = str(lib_dir())
    old = env.get("LD_LIBRARY_PATH", "")
    parts = [p for p in old.split(os.pathsep) if p and p != libs]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([libs, *parts])
    path_parts = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != str(venv_bin())]
    env["PATH"] = os.pathsep.join([str(venv_bin()), *path_parts])
    return env


def shell_exports() -> str:
    """``export`` lines for ``eval "$(python -m servelab triton env)"``."""
    libs = lib_dir()
    return (
        f"export LD_LIBRARY_PATH={shlex.quote(str(libs))}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n"
        f"export PATH={shlex.quote(str(venv_bin()))}:$PATH\n"
    )


# --------------------------------------------------------------------------
# The shim
# --------------------------------------------------------------------------

def _shim_text(real: Path, libs: Path) -> str:
    return (
        "#!/bin/sh\n"
        f"{SHIM_MARKER} (written by `servelab triton setup`).\n"
        "# perf_analyzer from tritonclient 2.50 needs libb64.so.0d and libcudart.so.12;\n"
        "# nvidia-pytriton ships both, linked into the folder below. The real binary\n"
        "# lives there too. Re-run `python -m servelab triton setup` after reinstalling tritonclient.\n"
        f"LD_LIBRARY_PATH={shlex.quote(str(libs))}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n"
        "export LD_LIBRARY_PATH\n"
        f"exec {shlex.quote(str(real))} \"$@\"\n"
    )


def shim_installed(name: str = "perf_analyzer") -> bool:
    """True if ``<venv>/bin/<name>`` is the shim and its real binary exists."""
    path = venv_bin() / name
    return _is_shim(path) and _is_elf(venv_bin().parent / "lib" / "servelab-perf-analyzer" / name)


def install_shim(names: Sequence[str] = BINARIES) -> list[str]:
    """Make ``perf_analyzer`` (and ``perf_client``) on the venv's PATH start
    without any environment set-up. Idempotent; returns what it changed."""
    libs = lib_dir(venv_bin().parent / "lib" / "servelab-perf-analyzer")
    changed = []
    for name in names:
        path = venv_bin() / name
        real = libs / name
        if _is_elf(path):
            # Copy first, then swap the shim in atomically: a concurrent run
            # of perf_analyzer finds either the binary or the shim, never nothing.
            tmp_real = libs / f".{name}.{os.getpid()}"
            if tmp_real.exists():
                tmp_real.unlink()
            try:
                os.link(path, tmp_real)  # same file system: no second 20 MB copy
            except OSError:
                shutil.copy2(path, tmp_real)
            if _is_elf(tmp_real):  # a concurrent setup may have swapped the shim in meanwhile
                os.replace(tmp_real, real)
            else:
                tmp_real.unlink()
        elif not _is_elf(real):
            continue  # this binary is not installed at all (e.g. perf_client)
        text = _shim_text(real, libs)
        if _is_shim(path) and path.read_text() == text:
            continue
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{name}.")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        changed.append(f"{path} -> shim running {real}")
    return changed


def check() -> str:
    """Run ``perf_analyzer --version``-like probe; returns the first line of
    its help text, or raises :class:`PerfAnalyzerError` with the loader error."""
    proc = subprocess.run(
        [str(real_binary()), "--help"], env=perf_analyzer_env(), capture_output=True, text=True, timeout=30,
    )
    text = (proc.stdout + proc.stderr).strip()
    if "error while loading shared libraries" in text:
        raise PerfAnalyzerError(text)
    return text.splitlines()[0] if text else ""


# --------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------

_NUM = r"([0-9]+(?:\.[0-9]+)?)"


@dataclass
class PerfRun:
    """One perf_analyzer invocation: its command, output and parsed figures."""

    command: list[str]
    returncode: int
    output: str
    results: list[dict] = field(default_factory=list)
    csv_rows: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.results)

    def table(self) -> str:
        return format_table(self.results)


def _usec_fields(text: str) -> dict:
    out = {}
    for key, pattern in {
        "avg_latency_us": r"Avg latency: " + _NUM + r" usec",
        "latency_std_us": r"standard deviation " + _NUM + r" usec",
        "p50_latency_us": r"p50 latency: " + _NUM + r" usec",
        "p90_latency_us": r"p90 latency: " + _NUM + r" usec",
        "p95_latency_us": r"p95 latency: " + _NUM + r" usec",
        "p99_latency_us": r"p99 latency: " + _NUM + r" usec",
    }.items():
        m = re.search(pattern, text)
        if m:
            out[key] = float(m.group(1))
    return out


def _parse_block(header_kind: str, header_value: float, block: str) -> dict:
    entry: dict = {header_kind: header_value}
    client, _, server = block.partition("Server:")
    m = re.search(r"Request count: ([0-9]+)", client)
    if m:
        entry["request_count"] = int(m.group(1))
    m = re.search(r"Avg send request rate: " + _NUM + r" infer/sec", client)
    if m:
        entry["send_rate"] = float(m.group(1))
    entry["delayed_warning"] = "was not able to keep up" in client
    m = re.search(r"Throughput: " + _NUM + r" infer/sec", client)
    if m:
        entry["throughput"] = float(m.group(1))
    entry.update(_usec_fields(client))
    m = re.search(r"Avg (HTTP|gRPC) time: " + _NUM + r" usec \((.*?)\)", client)
    if m:
        entry["protocol"] = m.group(1)
        entry["avg_client_time_us"] = float(m.group(2))
        for part, key in (("send/recv", "client_send_recv_us"), ("response wait", "client_response_wait_us"),
                          ("marshal", "client_marshal_us"), ("unmarshal", "client_unmarshal_us")):
            mm = re.search(re.escape(part) + r" " + _NUM + r" usec", m.group(3))
            if mm:
                entry[key] = float(mm.group(1))
    if server:
        srv: dict = {}
        for key, label in (("inference_count", "Inference count"), ("execution_count", "Execution count"),
                           ("success_count", "Successful request count")):
            mm = re.search(label + r": ([0-9]+)", server)
            if mm:
                srv[key] = int(mm.group(1))
        mm = re.search(r"Avg request latency: " + _NUM + r" usec \((.*?)\)", server)
        if mm:
            srv["avg_request_latency_us"] = float(mm.group(1))
            for part, key in (("overhead", "overhead_us"), ("queue", "queue_us"),
                              ("compute input", "compute_input_us"), ("compute infer", "compute_infer_us"),
                              ("compute output", "compute_output_us")):
                pm = re.search(r"(?:^|\+ )" + re.escape(part) + r" " + _NUM + r" usec", mm.group(2))
                if pm:
                    srv[key] = float(pm.group(1))
        if srv.get("execution_count"):
            srv["avg_batch"] = srv.get("inference_count", 0) / srv["execution_count"]
        entry["server"] = srv
    return entry


def parse_output(text: str) -> list[dict]:
    """perf_analyzer's printed report → one dict per measured load level:
    ``concurrency`` or ``request_rate``, ``throughput`` (infer/s),
    ``avg_latency_us``, ``p50/p90/p95/p99_latency_us``, ``request_count``,
    client time split, and ``server`` (counts, ``queue_us``,
    ``compute_input_us``, ``compute_infer_us``, ``compute_output_us``,
    ``avg_batch``). Also reads ``batch_size`` from the settings header."""
    batch = re.search(r"Batch size: ([0-9]+)", text)
    heads = list(re.finditer(
        r"^Request (concurrency|Rate): " + _NUM + r"(?: inference requests per seconds?)?\s*$", text, re.M))
    results = []
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        block = text[head.end():end]
        # The closing summary ("Inferences/Second vs. ...") is not part of the last block.
        block = block.split("Inferences/Second vs.")[0]
        kind = "concurrency" if head.group(1) == "concurrency" else "request_rate"
        value = float(head.group(2))
        entry = _parse_block(kind, int(value) if value.is_integer() else value, block)
        if batch:
            entry["batch_size"] = int(batch.group(1))
        if "throughput" in entry:
            results.append(entry)
    return results


def _csv_value(v: str):
    v = v.strip()
    try:
        f = float(v)
    except ValueError:
        return v
    return int(f) if f.is_integer() and "." not in v else f


# CSV header → short key (times are microseconds).
CSV_KEYS = {
    "Concurrency": "concurrency",
    "Request Rate": "request_rate",
    "Inferences/Second": "throughput",
    "Client Send": "client_send_us",
    "Network+Server Send/Recv": "network_server_us",
    "Server Queue": "queue_us",
    "Server Compute Input": "compute_input_us",
    "Server Compute Infer": "compute_infer_us",
    "Server Compute Output": "compute_output_us",
    "Client Recv": "client_recv_us",
    "p50 latency": "p50_latency_us",
    "p90 latency": "p90_latency_us",
    "p95 latency": "p95_latency_us",
    "p99 latency": "p99_latency_us",
    "Avg latency": "avg_latency_us",
}


def parse_csv(source: str | os.PathLike) -> list[dict]:
    """perf_analyzer ``-f out.csv`` (a path, or the CSV text) → one dict per
    row, keys shortened as in :data:`CSV_KEYS` (unknown columns keep their
    header). Only the first table is read (``--collect-metrics`` appends more)."""
    text = source if isinstance(source, str) and "\n" in source else Path(source).read_text()
    table = text.strip().split("\n\n")[0]
    rows = []
    for row in csv.DictReader(io.StringIO(table)):
        rows.append({CSV_KEYS.get(k.strip(), k.strip()): _csv_value(v or "") for k, v in row.items() if k})
    return rows


def format_table(results: Sequence[dict]) -> str:
    """A small fixed-width table of parsed results (one row per load level)."""
    cols = [("load", None), ("infer/s", "throughput"), ("p50 ms", "p50_latency_us"), ("p99 ms", "p99_latency_us"),
            ("avg ms", "avg_latency_us"), ("queue ms", "queue_us"), ("infer ms", "compute_infer_us"),
            ("avg batch", "avg_batch")]
    lines = ["  ".join(f"{c:>10}" for c, _ in cols)]
    for r in results:
        srv = r.get("server", {})
        cells = []
        for name, key in cols:
            if key is None:
                cells.append(f"c={r['concurrency']}" if "concurrency" in r else f"rate={r.get('request_rate')}")
                continue
            v = r.get(key, srv.get(key))
            if v is None:
                cells.append("-")
            elif key.endswith("_us"):
                cells.append(f"{v / 1000:.1f}")
            else:
                cells.append(f"{v:.2f}" if isinstance(v, float) else str(v))
        lines.append("  ".join(f"{c:>10}" for c in cells))
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------

def run(args: Sequence[str] | str, timeout: float = 300.0, csv_path: str | os.PathLike | None = None,
        cwd: str | os.PathLike | None = None, check: bool = True) -> PerfRun:
    """Run perf_analyzer with ``args`` (a list, or the part of a command line
    after ``perf_analyzer``) and parse its output; with ``csv_path`` also
    passes ``-f csv_path`` and parses the CSV. Raises PerfAnalyzerError on a
    non-zero exit when ``check``."""
    argv = shlex.split(args) if isinstance(args, str) else list(args)
    if argv and Path(argv[0]).name in BINARIES:
        argv = argv[1:]
    if csv_path is not None:
        argv += ["-f", str(csv_path)]
    cmd = [str(real_binary()), *argv]
    try:
        proc = subprocess.run(cmd, env=perf_analyzer_env(), capture_output=True, text=True,
                              timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired as err:
        raise PerfAnalyzerError(f"perf_analyzer ran past {timeout:.0f} s: {' '.join(argv)}") from err
    output = proc.stdout + (("\n" + proc.stderr) if proc.stderr else "")
    result = PerfRun(["perf_analyzer", *argv], proc.returncode, output, parse_output(proc.stdout))
    if csv_path is not None and Path(csv_path).exists():
        result.csv_rows = parse_csv(csv_path)
    if check and not result.ok:
        raise PerfAnalyzerError(
            f"perf_analyzer {' '.join(argv)} exited with {proc.returncode}:\n{output[-3000:]}"
        )
    return result
