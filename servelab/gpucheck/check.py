"""``gpu-check``'s run from start to end: unpack the pack, run each phase under its own limit
while the sampler records GPU and CPU use, then write the summary (:mod:`servelab.gpucheck.runner`
runs one phase; :mod:`servelab.gpucheck.summary` writes the files)."""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

from servelab.core import paths
from servelab.gpucheck import pack as packmod
from servelab.gpucheck import runner, summary


def main(out: Path | None = None, pack_dir: Path | None = packmod.DEFAULT_DIR, device: str = "auto",
         tiny: bool = False, budget: float | None = None, phases=runner.PHASE_NAMES) -> int:
    t_begin = time.time()
    budget = budget or (runner.TINY_BUDGET_S if tiny else runner.BUDGET_S)
    if device == "auto":  # a GPU machine is expected to use its GPU; elsewhere nothing is hidden or required
        device = "cuda" if shutil.which("nvidia-smi") or Path("/dev/nvidia0").exists() else "cpu"
    out = Path(out or os.environ.get("OUT") or paths.RESULTS_DIR / "gpu-check")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"servelab-gpu-check-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    print(f"gpu-check: device={device} tiny={tiny} budget={budget:.0f} s out={out}", flush=True)
    try:
        root, pack_note = runner.unpack(pack_dir, work / "pack")
    except (RuntimeError, OSError, tarfile.TarError) as err:
        root, pack_note = None, f"the pack could not be unpacked ({err}): using this interpreter's packages"
    print(f"  pack: {pack_note}", flush=True)
    pythons: dict[tuple[str, ...], Path] = {}  # one prefix per set of pack folders (Phase.pack_dirs)
    for dirs in dict.fromkeys(p.pack_dirs for p in runner.PHASES):
        try:
            pythons[dirs] = runner.make_prefix(work / f"py-{'-'.join(dirs)}", root, dirs)
        except OSError as err:
            pack_note += f"; no prefix ({err}): phases run on {sys.executable} with PYTHONPATH (stubs miss the pack)"
            break
    sampler = runner.Sampler(out / "samples.csv", use_gpu=device != "cpu")
    sampler.start()
    results: list[dict] = []

    def write(final: bool) -> list[str]:
        """The result files as they stand. Written after every phase too, so a device call cut off
        by its own limit still brings back what the finished phases measured (2026-11-27: one
        was cut in the last phase, and the summary, written only at the end, was lost)."""
        meta = {"device": device, "tiny": tiny, "budget_s": budget, "pack": pack_note, "sampler": sampler.note,
                "t0": sampler.t0, "elapsed_s": round(time.time() - t_begin, 1), "python": sys.version.split()[0],
                "argv": sys.argv, "complete": final}
        return summary.write_all(out, results, meta, runner.read_samples(out / "samples.csv"), work)

    try:
        for phase in runner.PHASES:
            if phase.name not in phases:
                results.append({"phase": phase.name, "status": "skipped", "reason": "not asked for (--phases)"})
                continue
            left = budget - (time.time() - t_begin) - 10  # 10 s kept for the summary
            limit = min(phase.tiny_s if tiny else phase.gpu_s, left)
            if limit < 5:
                results.append({"phase": phase.name, "status": "skipped",
                                "reason": f"no time left in the {budget:.0f} s budget"})
                print(f"[{phase.name}] skipped: no time left", flush=True)
                continue
            sampler.phase = phase.name
            print(f"[{phase.name}] started (limit {limit:.0f} s)", flush=True)
            python = pythons.get(phase.pack_dirs)
            res = runner.run_phase(phase, limit, runner.phase_env(root, phase, device), work, device, tiny, python,
                                   grace=max(2.0, min(30.0, left - limit)))  # a stop within the budget
            sampler.phase = "between"
            results.append(res)
            print(f"[{phase.name}] {res['status']} in {res['seconds']:.0f} s"
                  + (f": {res['reason']}" if res.get("reason") else ""), flush=True)
            write(final=False)
    finally:
        sampler.stop()
    files = write(final=True)
    print((out / "summary.md").read_text(), flush=True)
    print(f"gpu-check: {len(files)} files in {out}: {', '.join(sorted(files))}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["status"] == "ok" for r in results if r["phase"] in phases) else 1
