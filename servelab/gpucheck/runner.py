"""``servelab gpu-check``: the whole GPU run, one phase after another, each bounded.

Run on a lent GPU machine as ``make gpu-check`` (its python3; no ``make setup``,
no venv), with ``build/gpu-pack/`` carried (``make gpu-pack`` here). Phases,
each in its own process under its own time limit; a failure or a timeout is
recorded and the next phase starts; a phase with no time left says so:

1. ``probe``      GPU, driver, versions (nvidia-smi, torch, onnxruntime, the pack)
2. ``models``     food11.pth / food11.onnx built with that machine's torch
3. ``fastapi``    FastAPI PyTorch on CUDA: /health's device from inside the
                  service, then sequential and 16-client requests
4. ``triton``     food_classifier on KIND_GPU, 1 then 2 instances (reloaded):
                  perf_analyzer at concurrency 1, 8, 16 and ``-b 16``
5. ``tour``       the tour at reduced scale (FastAPI, Triton Python and ONNX parts)
6. ``cuda_tests`` ``pytest -m cuda`` on the test files that hold such tests
7. ``accel``      one forward pass in fp32, FP16 and torch.compile (where the GPU allows it),
                  with fidelity against fp32, and S(b), b = 1..16, in fp32 and FP16
                  (:mod:`servelab.gpucheck.accel`)
8. ``traces``     where each request's time goes (servelab.bench.breakdown)
9. ``decode``     food_pipeline with food_preprocess decoding on the CPU, then with nvJPEG on
                  the GPU: throughput, GPU use, stage shares (:mod:`servelab.gpucheck.decode`)
10. ``streaming`` the token-streaming decoder at GPT-2 small's shape, fp32 against FP16 (step cost,
                  tokens), then both token-streaming models in Triton (KIND_GPU, FP16) under load

nvidia-smi (GPU) and /proc/stat (CPU: the images are decoded there) are sampled
every 0.5 s throughout, each sample tagged with its phase.

Writes at most 8 files to ``--out`` (default ``$OUT``, else results/gpu-check):
``summary.md`` (phases, device, figures table), ``results.json``, ``log.txt``,
``samples.csv``, ``perf.txt``, ``tour-report.md``, ``pytest-cuda.txt``.
Exit status 0 when every phase passed, 1 otherwise.

``--device cpu --tiny`` is the dry run (tests/test_gpu_check.py): toy sizes on
this machine's venv, GPU hidden.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from servelab.core import paths
from servelab.gpucheck import pack as packmod

BUDGET_S = 450.0        # the whole run on the GPU machine: under the 8 minutes one device call may take
TINY_BUDGET_S = 240.0   # the dry run's ceiling (it needs far less on an idle machine)
MAX_FILES = 8           # what comes back from a device call's $OUT
LOG_TAIL = 60_000       # characters of each phase's output kept in log.txt
SAMPLE_EVERY_S = 0.5


@dataclass(frozen=True)
class Phase:
    name: str
    gpu_s: float    # time limit on the GPU machine
    tiny_s: float   # time limit in the dry run
    stub_numpy: bool = False  # numpy 1.26 first on the path (the Triton stub needs it)
    # The pack's protobuf 4 (pb/) before the machine's: tritonclient's gRPC needs protobuf < 5.
    # Not for `models`: the machine's onnx, which torch.onnx.export imports, needs its own newer one.
    protobuf4: bool = True

    @property
    def pack_dirs(self) -> tuple[str, ...]:
        """The pack's folders this phase puts on its path, in order."""
        return ("np",) * self.stub_numpy + ("pb",) * self.protobuf4 + ("site",)


PHASES = (
    Phase("probe", 45, 45),
    Phase("models", 90, 90, protobuf4=False),
    Phase("fastapi", 60, 90),
    Phase("triton", 150, 150, stub_numpy=True),
    Phase("tour", 120, 90, stub_numpy=True),
    Phase("cuda_tests", 60, 60, stub_numpy=True),  # tests/triton/test_cuda.py starts a Triton
    Phase("accel", 150, 120),  # fp32 / FP16 / torch.compile and S(b)
    Phase("traces", 90, 90, stub_numpy=True),  # where each request's time goes (issue 51)
    Phase("decode", 90, 90, stub_numpy=True),  # food_pipeline decoding on the CPU, then with nvJPEG (issue 51)
    Phase("streaming", 120, 90, stub_numpy=True),  # last, the newest: token streams in FP16 (issue 54)
)
PHASE_NAMES = tuple(p.name for p in PHASES)
OUT_FILES = ("summary.md", "results.json", "log.txt", "samples.csv", "perf.txt", "tour-report.md",
             "pytest-cuda.txt")
# The device call's own copy of the console (docs/gpu-reference.md: `... | tee $OUT/console.txt`).
OPTIONAL_FILES = ("console.txt",)
assert len(OUT_FILES) + len(OPTIONAL_FILES) <= MAX_FILES


# --------------------------------------------------------------------------
# The pack
# --------------------------------------------------------------------------

def unpack(pack_dir: Path | None, dest: Path) -> tuple[Path | None, str]:
    """Unpack ``pack_dir/ARCHIVE_NAME`` into ``dest``; (root or None, what happened)."""
    archive = Path(pack_dir) / packmod.ARCHIVE_NAME if pack_dir else None
    if archive is None or not archive.exists():
        return None, f"no {archive or 'pack'}: using this interpreter's packages ({sys.executable})"
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if here != packmod.STUB_PYTHON:
        return None, (f"{archive} is for Python {packmod.STUB_PYTHON} (cp312 wheels, the 3.12 stub), this is {here}: "
                      f"using this interpreter's packages ({sys.executable})")
    t0 = time.perf_counter()
    dest.mkdir(parents=True, exist_ok=True)
    tar = shutil.which("tar")
    if tar and shutil.which("xz"):
        proc = subprocess.run([tar, "-xJf", str(archive), "-C", str(dest)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"unpacking {archive} failed: {proc.stderr[-500:]}")
    else:
        with tarfile.open(archive, "r:xz") as t:
            t.extractall(dest, filter="data")
    size = archive.stat().st_size / 2**20
    return dest, f"unpacked {archive} ({size:.1f} MiB) in {time.perf_counter() - t0:.1f} s"


def make_prefix(dest: Path, root: Path | None, dirs: tuple[str, ...] = ("pb", "site")) -> Path:
    """A minimal virtual environment (``pyvenv.cfg``, ``bin/python3``) whose one ``.pth`` file
    puts, in order: the pack's folders ``dirs`` (``Phase.pack_dirs``: numpy 1.26, protobuf 4,
    the rest), the repository, then this interpreter's own site-packages (torch and the rest).
    Returns its python.

    Why not PYTHONPATH: Triton's Python-backend stub starts an isolated interpreter that ignores
    the environment's PYTHONPATH; it takes ``python3`` from PATH and that interpreter's
    site-packages. The phases run on this prefix's python, whose bin/ the kit puts first on the
    servers' PATH (procs.child_env), so the stubs see exactly what the phase sees."""
    import site
    import sysconfig

    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    base = Path(getattr(sys, "_base_executable", None) or sys.executable).resolve()
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    for name in ("python3", "python", f"python{version}"):
        link = dest / "bin" / name
        if not link.is_symlink():
            link.symlink_to(base)
    (dest / "pyvenv.cfg").write_text(f"home = {base.parent}\ninclude-system-site-packages = false\n"
                                     f"version = {'.'.join(map(str, sys.version_info[:3]))}\n")
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(dest), "platbase": str(dest)}))
    purelib.mkdir(parents=True, exist_ok=True)
    lines = []
    if root is not None:
        lines += [str(root / d) for d in dirs]
    lines.append(str(paths.REPO_ROOT))
    for sp in dict.fromkeys([*site.getsitepackages(), sysconfig.get_path("purelib")]):
        if Path(sp).is_dir() and Path(sp) != purelib:
            lines.append(f"import site; site.addsitedir({sp!r})")
    (purelib / "servelab-gpu-check.pth").write_text("\n".join(lines) + "\n")
    return dest / "bin" / "python3"


def phase_env(root: Path | None, phase: Phase, device: str) -> dict[str, str]:
    """The environment of one phase's process (the prefix's .pth does the paths; PYTHONPATH too,
    for what reads it)."""
    env = dict(os.environ)
    extra = [str(paths.REPO_ROOT)]
    if root is not None:
        extra = [str(root / d) for d in phase.pack_dirs] + extra
        env["PATH"] = os.pathsep.join([str(root / "bin"), env.get("PATH", "")])
    else:  # this venv's perf_analyzer (the real binary: the phases run on another bin/)
        from servelab.triton import perf

        try:
            env["PATH"] = os.pathsep.join([str(perf.real_binary().parent), env.get("PATH", "")])
        except perf.PerfAnalyzerError:
            pass
    if env.get("PYTHONPATH"):
        extra.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(extra)
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""   # torch sees no GPU
        env["SERVELAB_DEVICE"] = "cpu"     # nor does the kit's Triton set-up
    return env


# --------------------------------------------------------------------------
# Sampling: nvidia-smi and /proc/stat, tagged with the running phase
# --------------------------------------------------------------------------

SAMPLE_FIELDS = ("index", "name", "utilization.gpu", "utilization.memory", "memory.used", "power.draw")
SAMPLE_HEADER = "t_s,phase,cpu_pct,gpu,gpu_name,gpu_util_pct,mem_util_pct,mem_used_mib,power_w"


def _cpu_times() -> tuple[int, int] | None:
    try:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals), idle


class Sampler(threading.Thread):
    def __init__(self, path: Path, use_gpu: bool):
        super().__init__(daemon=True)
        self.path, self.phase, self.t0 = path, "start", time.time()
        self.smi = shutil.which("nvidia-smi") if use_gpu else None
        self.note = "" if self.smi else ("nvidia-smi not found: CPU samples only" if use_gpu
                                         else "GPU hidden (--device cpu): CPU samples only")
        self.stop_event = threading.Event()
        self.rows = 0

    def run(self) -> None:
        last = _cpu_times()
        with open(self.path, "w") as f:
            f.write(SAMPLE_HEADER + "\n")
            while not self.stop_event.wait(SAMPLE_EVERY_S):
                now = _cpu_times()
                cpu = ""
                if now and last and now[0] > last[0]:
                    cpu = f"{100.0 * (1 - (now[1] - last[1]) / (now[0] - last[0])):.0f}"
                last = now
                t = f"{time.time() - self.t0:.1f}"
                gpus = self._gpus()
                for g in gpus or [["", "", "", "", "", ""]]:
                    f.write(",".join([t, self.phase, cpu, *g]) + "\n")
                    self.rows += 1
                f.flush()

    def _gpus(self) -> list[list[str]]:
        if not self.smi:
            return []
        try:
            out = subprocess.run([self.smi, f"--query-gpu={','.join(SAMPLE_FIELDS)}", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.TimeoutExpired):
            return []
        return [[c.strip().replace(",", " ") for c in line.split(",")] for line in out.strip().splitlines() if line]

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)


def read_samples(path: Path) -> list[dict]:
    rows = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return rows
    keys = lines[0].split(",") if lines else []
    for line in lines[1:]:
        vals = line.split(",")
        if len(vals) == len(keys):
            rows.append(dict(zip(keys, vals)))
    return rows


def _num(v) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def usage(samples: list[dict], t_from: float, t_to: float, t0: float) -> dict:
    """Mean/max GPU and CPU utilisation of the samples taken between two wall-clock times."""
    sel = [s for s in samples if t_from - t0 <= (_num(s["t_s"]) or -1) <= t_to - t0]
    out = {"samples": len(sel)}
    for key, col in (("gpu_util", "gpu_util_pct"), ("cpu", "cpu_pct"), ("gpu_mem_mib", "mem_used_mib")):
        vals = [v for v in (_num(s.get(col)) for s in sel) if v is not None]
        if vals:
            out[key + "_mean"] = round(sum(vals) / len(vals), 1)
            out[key + "_max"] = max(vals)
    return out


# --------------------------------------------------------------------------
# Running the phases
# --------------------------------------------------------------------------

def run_phase(phase: Phase, limit: float, env: dict, work: Path, device: str, tiny: bool,
              python: Path | str | None = None, grace: float = 30) -> dict:
    """Run one phase in its own process group under ``limit`` seconds; past it, SIGTERM, ``grace``
    seconds to unwind, then SIGKILL."""
    cmd = [str(python or sys.executable), "-m", "servelab.gpucheck.phases", phase.name, "--work", str(work), "--device", device]
    if tiny:
        cmd.append("--tiny")
    result_file = work / f"{phase.name}.json"
    result_file.unlink(missing_ok=True)
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=str(paths.REPO_ROOT), start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=limit)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(proc, grace)
        output, _ = proc.communicate()
        timed_out = True
        left = reap(work)
        if left:
            output += f"\n[gpu-check] killed {len(left)} process(es) the phase left running: {left}\n"
    res: dict = {}
    if result_file.exists():
        try:
            res = json.loads(result_file.read_text())
        except ValueError as err:
            res = {"status": "fail", "reason": f"unreadable result file: {err}"}
    if timed_out:
        res["status"] = "timeout"
        res["reason"] = f"ran past its {limit:.0f} s limit" + (f"; {res['reason']}" if res.get("reason") else "")
    elif not res:
        res = {"status": "fail", "reason": f"exited with {proc.returncode} and wrote no result"}
    elif proc.returncode != 0 and res.get("status") == "ok":
        res["status"] = "fail"
        res["reason"] = f"exited with {proc.returncode}"
    res.update(phase=phase.name, seconds=round(time.time() - t0, 1), limit_s=limit, t_start=t0, t_end=time.time())
    res["output"] = (output or "")[-LOG_TAIL:]
    return res


def reap(work: Path) -> list[int]:
    """Kill what a stopped phase left running under this run's work folder (a Triton stub whose
    server was killed mid-shutdown, say): every process whose command line names that folder."""
    import signal

    marker, killed = str(work) + os.sep, []
    me = _start_ticks(os.getpid())
    mine = _ancestors()
    for entry in Path("/proc").iterdir():
        # only processes started after this run began (its phases' leftovers), never one of ours
        if not entry.name.isdigit() or int(entry.name) in mine or (_start_ticks(int(entry.name)) or -1) < me:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in argv:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except OSError:
                pass
    return killed


def _start_ticks(pid: int) -> int | None:
    """A process's start time (clock ticks since boot), from /proc/PID/stat."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def _kill_group(proc: subprocess.Popen, grace: float = 30) -> None:
    import signal

    # SIGTERM unwinds the phase (its servers stop: a Triton stop can take 20 s on a busy host), then
    # SIGKILL. The caller shortens ``grace`` when the run's budget has less left (a phase compiling
    # with torch.compile ignored SIGTERM for the whole 30 s on a lent H200, 2026-11-27).
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
